"""Differential fuzzing: random valid ONNX graphs, planned, checked and emulated, against onnxruntime.

    python tools/fuzz.py [--examples 3000] [--chunk 200] [--seed 0] [--save tests/regressions]

`graphs()` is a hypothesis strategy over small float32 graphs shaped like real exports, from
rank-1 to rank-5 tensors: convolutions (strided, dilated, grouped, depthwise, large, over 1-3
axes) and ConvTranspose (grouped, strided, output_padding), attention (Q/K/V projections, heads,
transposed keys, scaled scores, masks), decomposed and fused normalizations, GELU in its erf and
tanh forms, reductions over any axes, Slice/Split/Gather/Pad/Resize, pools with ceil_mode,
shape arithmetic feeding Reshape/Expand/Tile, float16 stretches between Casts, activations,
binary ops against tensors and constants of every broadcastable shape, and quantization
arithmetic (DynamicQuantizeLinear, written out or not, QuantizeLinear, x/scale with Round,
Clip and Cast, Floor and Ceil) whose integer outputs must match exactly. Dimensions mix small
values with ones just past the C2 alignment and the rules' limits, so both sides of a
constraint come up. `plan_settings()` picks the target, and sometimes a batch of 2 or 3 (seed
004 contexts) or a core mask (steps split across cores). `check()` says what is wrong with one
graph, or None: planning must finish within time and memory bounds, the plan must keep every
contract invariant and `verify_allocation`, and the float16 emulation must match onnxruntime's
float32 outputs (cosine >= 0.999, or max |error| within 1% of the output's range; integer
outputs exactly), unless, for the float outputs, onnxruntime with every tensor rounded to
float16 misses that bar too (LayerNormalization over
two nearly equal values, say): no float16 plan can match such a graph, so it is reported as
ill-conditioned and counted apart. A failure names the plan step or the file it happened in.

The runner draws examples in chunks of hypothesis runs. When one fails with a new kind of
failure, hypothesis shrinks it, the shrunk model is saved under --save, and that kind is then
counted rather than raised, so one bug does not hide the others. Kinds known to be owned
elsewhere (`ELSEWHERE`) are counted without shrinking.
"""
from __future__ import annotations

import argparse
import math
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
TARGETS = ("rk3588", "rk3576", "rk3562", "rv1106")
MIN_COSINE = 0.999
MAX_ABS_OF_RANGE = 0.01
#: Spacing of float16 values just above 1: the relative error of storing a value as float16.
FLOAT16_RESOLUTION = 2.0 ** -10
#: What `check` says of a graph whose outputs change beyond the tolerance when its tensors are
#: merely rounded to float16: no float16 plan can match it, so it is no failure.
ILL_CONDITIONED = "ill-conditioned"
#: What `check` says when onnxruntime cannot run the graph: there is nothing to compare with.
REFERENCE_REFUSED = "onnxruntime refused"
#: Outcomes that are counted but are no failure of the compiler.
NOT_FAILURES = ("clean", ILL_CONDITIONED, REFERENCE_REFUSED)


@dataclass(frozen=True)
class Known:
    """A failure kind found, minimized and saved as `tests/regressions/<regression>.onnx`, whose
    root cause lies in code another engineer owns (listed in /work/wt/fuzz_findings.md). Its
    replay is a strict xfail, so fixing it turns the suite red until this entry goes."""
    regression: str
    reason: str


#: signature (see `signature`) -> the known failure. Runs count these apart instead of
#: shrinking them again; the CI sample tolerates them.
ELSEWHERE: dict[str, Known] = {}
#: Longest one graph may take to plan, and to run: a rewrite that repeats without bound is a
#: failure, not a hang of the whole run.
SECONDS_PER_GRAPH = 120
#: Most address space planning or emulating one graph may add (the machine is shared).
MEMORY_PER_GRAPH = 1 << 30
#: Small sizes, plus sizes on either side of the float16 C2 (8, 16) and of powers of two.
DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 32, 33)
#: Channel counts past the rules' small limits, for the occasional large Conv.
LARGE_CHANNELS = (64, 96, 128)
#: Most weight elements one MatMul, Gemm or convolution may draw, to keep examples quick.
MAX_WEIGHTS = 200_000
#: Most elements any tensor the strategy keeps may have.
MAX_ELEMENTS = 100_000
UNARY = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Softplus",
         "Clip", "Sin", "Cos", "Abs", "Neg")
BINARY = ("Add", "Sub", "Mul", "Max", "Min", "Div")
#: Unary ops run in float16 between two Casts: the ones onnxruntime's CPU provider has in float16.
FLOAT16_UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "LeakyRelu")


class GraphBuilder:
    """Nodes, constants and the known shape of every float32 tensor made so far."""

    def __init__(self, draw):
        self.draw = draw
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.consumed: set[str] = set()
        #: outputs besides the float32 tensors of `shapes`: quantized integers (compared exactly)
        #: and the float values they are rounded from
        self.extra_outputs: list[onnx.ValueInfoProto] = []
        self.rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def name(self, prefix: str) -> str:
        return f"{prefix}_{len(self.nodes) + len(self.initializers) + len(self.inputs)}"

    def input(self, shape: tuple[int, ...]) -> str:
        name = self.name("input")
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        self.shapes[name] = shape
        return name

    def constant(self, array: np.ndarray, prefix: str = "w") -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values, prefix: str = "i") -> str:
        return self.constant(np.array(values, np.int64), prefix)

    def weights(self, shape: tuple[int, ...], fan_in: int) -> str:
        return self.constant((self.rng.standard_normal(shape) / math.sqrt(max(fan_in, 1))).astype(np.float32))

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...] | None, **attrs) -> str:
        """Append `op`; its one output has `shape` (None: not a float32 tensor, so not offered
        as an operand)."""
        return self.multi(op, inputs, [shape], **attrs)[0]

    def multi(self, op: str, inputs: list[str], shapes: list[tuple[int, ...] | None], **attrs) -> list[str]:
        """Append `op` with one output per entry of `shapes`."""
        outputs = [self.name(f"{op.lower()}{i or ''}") for i in range(len(shapes))]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(self.nodes)}", **attrs))
        self.consumed.update(inputs)
        for output, shape in zip(outputs, shapes):
            if shape is not None:
                self.shapes[output] = tuple(shape)
        return outputs

    def pick(self, predicate=lambda shape: True) -> str | None:
        names = [n for n, s in self.shapes.items() if predicate(s)]
        return self.draw(st.sampled_from(names)) if names else None

    def choice(self, options):
        return self.draw(st.sampled_from(tuple(options)))

    def axes(self, rank: int, first: int = 0) -> list[int]:
        """A non-empty sorted set of axes in [first, rank), each spelled positive or negative."""
        chosen = sorted(self.draw(st.sets(st.integers(first, rank - 1), min_size=1)))
        return [a - rank if self.draw(st.booleans()) else a for a in chosen]


def _window_extent(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil: bool = False) -> int:
    """Output size of a convolution or pool window along one axis (`pad` both sides summed)."""
    span = size + pad - dilation * (kernel - 1) - 1
    if span < 0:
        return 0
    if not ceil:
        return span // stride + 1
    return -(-span // stride) + 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def add_conv(b: GraphBuilder, x: str) -> str | None:
    """Conv over 1-3 spatial axes: strided, dilated, asymmetric pads, plain, grouped or
    depthwise (with a channel multiplier), sometimes large (kernels and channels past the NPU's
    limits), maybe followed by an activation the NPU fuses."""
    shape = b.shapes[x]
    c, spatial = shape[1], shape[2:]
    draw, rank = b.draw, len(shape) - 2
    large = draw(st.integers(0, 5)) == 0
    kind = b.choice(("plain", "depthwise", "grouped"))
    kernel = [draw(st.sampled_from((1, 3, 5, 7, 9, 11) if large else (1, 2, 3, 5)))] * rank
    if draw(st.booleans()):  # a rectangular kernel
        kernel = [draw(st.sampled_from((1, 2, 3, 5))) for _ in range(rank)]
    strides = [draw(st.sampled_from((1, 1, 2, 3, 4))) for _ in range(rank)]
    dilations = [draw(st.sampled_from((1, 1, 1, 2, 3))) for _ in range(rank)]
    pads = [draw(st.integers(0, (k - 1) * d)) for _ in range(2) for k, d in zip(kernel, dilations)]
    out = [_window_extent(s, k, t, pads[i] + pads[i + rank], d)
           for i, (s, k, t, d) in enumerate(zip(spatial, kernel, strides, dilations))]
    if min(out) < 1:
        return None
    if kind == "depthwise" and c > 1:
        group, out_c = c, c * b.choice((1, 1, 2))
    elif kind == "grouped" and len(_divisors(c)) > 2:
        group = b.choice(_divisors(c)[1:-1])
        out_c = group * b.choice((1, 2, 3))
    else:
        group, out_c = 1, b.choice(LARGE_CHANNELS if large else DIMS)
    fan_in = c // group * math.prod(kernel)
    if out_c * fan_in > MAX_WEIGHTS:
        return None
    inputs = [x, b.weights((out_c, c // group, *kernel), fan_in)]
    if draw(st.booleans()):
        inputs.append(b.weights((out_c,), 4))
    y = b.node("Conv", inputs, (shape[0], out_c, *out), kernel_shape=kernel, strides=strides,
               pads=pads, dilations=dilations, group=group)
    if draw(st.booleans()):  # the fusions the NPU has
        y = add_unary(b, y)
    return y


def add_conv_transpose(b: GraphBuilder, x: str) -> str | None:
    """ConvTranspose over 1-2 spatial axes: grouped (1, a divisor, or one group per channel),
    strided, dilated, padded, with output_padding and maybe a bias."""
    shape = b.shapes[x]
    c, spatial, rank = shape[1], shape[2:], len(shape) - 2
    draw = b.draw
    group = b.choice(sorted({1, c, *_divisors(c)[1:-1]}))
    out_per_group = b.choice((1, 2, 3, 4))
    kernel = [draw(st.sampled_from((1, 2, 3, 4, 5))) for _ in range(rank)]
    strides = [draw(st.sampled_from((1, 2, 2, 3, 4))) for _ in range(rank)]
    dilations = [draw(st.sampled_from((1, 1, 1, 2))) for _ in range(rank)]
    # output_padding must be smaller than the stride or the dilation (the operator's definition)
    output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilations)]
    full = [(n - 1) * s + (k - 1) * d + 1 + p for n, s, k, d, p in zip(spatial, strides, kernel, dilations, output_padding)]
    pads = [draw(st.integers(0, (k - 1) * d)) for _ in range(2) for k, d in zip(kernel, dilations)]
    out = [f - pads[i] - pads[i + rank] for i, f in enumerate(full)]
    if min(out) < 1 or c * out_per_group * math.prod(kernel) > MAX_WEIGHTS:
        return None
    inputs = [x, b.weights((c, out_per_group, *kernel), c // group * math.prod(kernel))]
    if draw(st.booleans()):
        inputs.append(b.weights((group * out_per_group,), 4))
    return b.node("ConvTranspose", inputs, (shape[0], group * out_per_group, *out), kernel_shape=kernel,
                  strides=strides, dilations=dilations, pads=pads, output_padding=output_padding, group=group)


def add_unary(b: GraphBuilder, x: str) -> str:
    op = b.choice(UNARY)
    shape = b.shapes[x]
    if op == "Clip":
        low = b.constant(np.float32(b.choice((-1.0, 0.0))), "low")
        high = b.constant(np.float32(b.choice((1.0, 6.0))), "high")
        return b.node("Clip", [x, low, high], shape)
    attrs = {"alpha": b.choice((0.01, 0.1, 0.2))} if op in ("LeakyRelu", "HardSigmoid") else {}
    return b.node(op, [x], shape, **attrs)


def broadcast_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes that broadcast to `shape` without changing it."""
    rank = len(shape)
    options = [shape, (1,), (shape[-1],), tuple(1 if i != rank - 1 else shape[-1] for i in range(rank))]
    if rank >= 3:
        options += [(shape[-3], 1, 1), (shape[-2], shape[-1]), tuple(1 if i != rank - 2 else shape[-2] for i in range(rank))]
    if rank >= 4:
        options += [(1, shape[1]) + (1,) * (rank - 2), (shape[0], shape[1]) + (1,) * (rank - 2)]
    return options


def add_binary(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    op = b.choice(BINARY)
    partner_kind = b.choice(("tensor", "constant", "pooled", "flipped", "outer"))
    if op == "Div":  # a divisor bounded away from zero keeps float16 honest
        value = b.rng.uniform(0.5, 2.0, b.choice(broadcast_shapes(shape))) * b.rng.choice([-1, 1])
        return b.node("Div", [x, b.constant(value.astype(np.float32))], shape)
    if partner_kind == "pooled" and len(shape) >= 3:
        pooled = shape[:2] + (1,) * (len(shape) - 2)
        other = b.node(b.choice(("GlobalAveragePool", "GlobalMaxPool")), [x], pooled)
        other = b.node("Sigmoid", [other], pooled)
        return b.node(op, [x, other], shape)
    if partner_kind == "tensor":
        other = b.pick(lambda s: s == shape)
        if other is not None:
            return b.node(op, [x, other], shape)
    if partner_kind == "outer" and len(shape) >= 2 and shape[-1] > 1:
        # both operands broadcast: x reduced to one column against x's last row
        column = b.node("ReduceMean", [x], shape[:-1] + (1,), axes=[-1], keepdims=1)
        row = b.node("Slice", [x, b.ints([0]), b.ints([1]), b.ints([-2])], shape[:-2] + (1, shape[-1])) \
            if shape[-2] > 1 else x
        return b.node(op, [column, row], shape)
    constant = b.rng.standard_normal(b.choice(broadcast_shapes(shape))).astype(np.float32)
    operands = [b.constant(constant, "c"), x] if partner_kind == "flipped" else [x, b.constant(constant, "c")]
    return b.node(op, operands, shape)


def add_concat(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    axis = b.draw(st.integers(-len(shape), len(shape) - 1))
    positive = axis % len(shape)

    def fits(s):
        return len(s) == len(shape) and all(a == c for i, (a, c) in enumerate(zip(s, shape)) if i != positive)

    parts = [x, b.pick(fits) or add_unary(b, x)]
    if b.draw(st.booleans()):
        parts.append(add_unary(b, x))  # a branch off the same tensor
    size = sum(b.shapes[p][positive] for p in parts)
    return b.node("Concat", parts, shape[:positive] + (size,) + shape[positive + 1:], axis=axis)


def add_split(b: GraphBuilder, x: str) -> str | None:
    """Split in 2-4 parts, given sizes or equal; one part goes on, or the parts are joined again
    in another order."""
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    parts = b.draw(st.integers(2, 4))
    if shape[axis] < parts:
        return None
    if b.draw(st.booleans()) and shape[axis] % parts == 0:
        sizes, inputs = [shape[axis] // parts] * parts, [x]
    else:
        cuts = sorted(b.draw(st.sets(st.integers(1, shape[axis] - 1), min_size=parts - 1, max_size=parts - 1)))
        sizes = [end - begin for begin, end in zip([0] + cuts, cuts + [shape[axis]])]
        inputs = [x, b.ints(sizes, "split")]
    outputs = b.multi("Split", inputs, [shape[:axis] + (n,) + shape[axis + 1:] for n in sizes],
                      axis=axis - len(shape) if b.draw(st.booleans()) else axis)
    if b.draw(st.booleans()):
        order = b.draw(st.permutations(outputs))
        return b.node("Concat", list(order), shape, axis=axis)
    return b.choice(outputs)


def add_slice(b: GraphBuilder, x: str) -> str | None:
    """Slice on 1-3 axes: negative and out-of-range starts and ends, steps of 1, 2, 3 and -1, -2."""
    shape = b.shapes[x]
    axes = b.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=3, unique=True))
    starts, ends, steps, out = [], [], [], list(shape)
    for axis in axes:
        size = shape[axis]
        step = b.choice((1, 1, 2, 3, -1, -2))
        start = b.draw(st.integers(-size - 2, size + 2))
        end = b.draw(st.integers(-size - 2, size + 2)) if b.draw(st.booleans()) else \
            (2**62 if step > 0 else -2**62)
        length = len(range(*slice(start, end, step).indices(size)))
        if length < 1:
            return None
        starts.append(start), ends.append(end), steps.append(step)
        out[axis] = length
    inputs = [x, b.ints(starts), b.ints(ends), b.ints([a - len(shape) if b.draw(st.booleans()) else a for a in axes])]
    if any(step != 1 for step in steps) or b.draw(st.booleans()):
        inputs.append(b.ints(steps))
    return b.node("Slice", inputs, tuple(out))


def add_gather(b: GraphBuilder, x: str) -> str | None:
    """Gather along any axis with constant indices: a scalar (the axis goes), a list (repeats and
    negatives allowed) or a matrix (the axis becomes two)."""
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    size = shape[axis]
    kind = b.choice(("scalar", "list", "matrix"))
    index = st.integers(-size, size - 1)
    if kind == "scalar":
        if len(shape) == 1:
            return None
        indices, dims = np.array(b.draw(index), np.int64), ()
    elif kind == "list":
        count = b.draw(st.integers(1, 6))
        indices, dims = np.array(b.draw(st.lists(index, min_size=count, max_size=count)), np.int64), (count,)
    else:
        indices, dims = np.array(b.draw(st.lists(index, min_size=4, max_size=4)), np.int64).reshape(2, 2), (2, 2)
    return b.node("Gather", [x, b.constant(indices, "idx")], shape[:axis] + dims + shape[axis + 1:],
                  axis=axis - len(shape) if b.draw(st.booleans()) else axis)


def add_transpose(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    perm = b.draw(st.permutations(range(len(shape))))
    return b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))


def add_reshape(b: GraphBuilder, x: str) -> str:
    """Reshape to ranks 1-5, with 0 (copy a dim) and -1 (infer one) in the shape sometimes."""
    shape = b.shapes[x]
    total = math.prod(shape)
    choices = [(shape[0], total // shape[0]), (total,), (1, 1, 1, total)]
    if len(shape) >= 3:
        choices += [shape[:2] + (math.prod(shape[2:]),), (shape[0], math.prod(shape[1:-1]), shape[-1]),
                    shape[:-1] + (1, shape[-1]), (shape[0], 1) + shape[1:]]
    if len(shape) == 4:
        n, c, h, w = shape
        # a single long row takes matmuls past the NPU's K limit (8192 on RK3588)
        choices += [(n, c * h, w), (n, c, h, w, 1), (n, 1, c, h, w), (n * c, h, w)]
    if len(shape) == 5:
        choices += [(shape[0], shape[1] * shape[2], shape[3], shape[4])]
    if len(shape) in (2, 3):
        choices += [(1,) * (4 - len(shape)) + shape]
    target = b.choice(choices)
    spelled = list(target)
    if len(target) > 1 and b.draw(st.booleans()):
        spelled[b.draw(st.integers(0, len(target) - 1))] = -1
    if len(target) <= len(shape) and b.draw(st.booleans()):
        spelled = [0 if i < len(shape) and d == shape[i] and s != -1 else s
                   for i, (d, s) in enumerate(zip(target, spelled))]
    return b.node("Reshape", [x, b.ints(spelled, "shape")], target)


def add_shape_arithmetic(b: GraphBuilder, x: str) -> str:
    """Shapes computed from the graph, as exporters write them: Shape, Gather, Slice, Mul, Div,
    Unsqueeze, Concat feeding a Reshape, Expand or Tile (constant folding has to see through
    them), and Flatten, Squeeze and Unsqueeze with any axis."""
    shape = b.shapes[x]
    rank = len(shape)
    kind = b.choice(("merge_last", "split_last", "flatten", "unsqueeze", "squeeze", "expand", "tile"))
    if kind in ("merge_last", "split_last", "expand"):
        dims = b.node("Shape", [x], None)
    if kind == "merge_last" and rank >= 2:  # [*lead, a, b] -> [*lead, a*b], lead from Shape[:-2]
        lead = b.node("Slice", [dims, b.ints([0]), b.ints([-2])], None)
        a = b.node("Gather", [dims, b.ints(rank - 2)], None, axis=0)
        c = b.node("Gather", [dims, b.ints(rank - 1)], None, axis=0)
        merged = b.node("Unsqueeze", [b.node("Mul", [a, c], None), b.ints([0])], None)
        target = b.node("Concat", [lead, merged], None, axis=0)
        return b.node("Reshape", [x, target], shape[:-2] + (shape[-2] * shape[-1],))
    if kind == "split_last" and shape[-1] % 2 == 0:  # [.., 2k] -> [.., 2, k] through Div
        half = b.node("Div", [b.node("Gather", [dims, b.ints([rank - 1])], None, axis=0), b.ints([2])], None)
        lead = b.node("Slice", [dims, b.ints([0]), b.ints([rank - 1])], None)
        target = b.node("Concat", [lead, b.ints([2]), half], None, axis=0)
        return b.node("Reshape", [x, target], shape[:-1] + (2, shape[-1] // 2))
    if kind == "flatten":
        axis = b.draw(st.integers(-rank, rank))
        at = axis % (rank + 1) if axis >= 0 else axis + rank
        return b.node("Flatten", [x], (math.prod(shape[:at]), math.prod(shape[at:])), axis=axis)
    if kind == "unsqueeze" and rank < 5:
        axis = b.draw(st.integers(-rank - 1, rank))
        at = axis if axis >= 0 else axis + rank + 1
        return b.node("Unsqueeze", [x, b.ints([axis])], shape[:at] + (1,) + shape[at:])
    ones = [i for i, d in enumerate(shape) if d == 1]
    if kind == "squeeze" and ones and rank > 1:
        axis = b.choice(ones)
        return b.node("Squeeze", [x, b.ints([axis - rank if b.draw(st.booleans()) else axis])],
                      shape[:axis] + shape[axis + 1:])
    if kind == "expand":  # grow each size-1 axis, the sizes read from Shape and patched
        grown = tuple(b.choice((2, 3)) if d == 1 else d for d in shape)
        if math.prod(grown) <= MAX_ELEMENTS:
            return b.node("Expand", [x, b.node("Max", [dims, b.ints(grown)], None)], grown)
    repeats = [b.choice((1, 1, 2)) for _ in shape]
    if math.prod(shape) * math.prod(repeats) <= MAX_ELEMENTS:
        return b.node("Tile", [x, b.ints(repeats)], tuple(d * r for d, r in zip(shape, repeats)))
    return add_unary(b, x)


def add_pool(b: GraphBuilder, x: str) -> str | None:
    """Max and average pools over 1-3 spatial axes (ceil_mode, pads, dilations for MaxPool,
    count_include_pad for AveragePool) and the global pools."""
    shape = b.shapes[x]
    spatial, rank = shape[2:], len(shape) - 2
    op = b.choice(("MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"))
    if op.startswith("Global"):
        return b.node(op, [x], shape[:2] + (1,) * rank)
    kernel = [b.choice((1, 2, 3, 5)) for _ in range(rank)]
    strides = [b.choice((1, 2, 3)) for _ in range(rank)]
    dilations = [b.choice((1, 1, 2)) if op == "MaxPool" else 1 for _ in range(rank)]
    pads = [b.draw(st.integers(0, k // 2)) for k in kernel] + [b.draw(st.integers(0, k // 2)) for k in kernel]
    ceil = b.draw(st.booleans())
    out = []
    for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
        n = _window_extent(size, k, s, pads[i] + pads[i + rank], d, ceil)
        if ceil and n > 1 and (n - 1) * s >= size + pads[i]:
            # a last window starting in the end padding: onnxruntime drops it, onnx's shape
            # inference (opset 17) keeps it, so the model has no one meaning
            return None
        out.append(n)
    if min(out) < 1:
        return None
    attrs = {"count_include_pad": b.choice((0, 1))} if op == "AveragePool" else {"dilations": dilations}
    return b.node(op, [x], shape[:2] + tuple(out), kernel_shape=kernel, strides=strides, pads=pads,
                  ceil_mode=int(ceil), **attrs)


def add_softmax(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    return b.node(b.choice(("Softmax", "Softmax", "LogSoftmax")), [x], shape,
                  axis=b.draw(st.integers(-len(shape), len(shape) - 1)))


def add_matmul(b: GraphBuilder, x: str) -> str | None:
    shape = b.shapes[x]
    k = shape[-1]
    if len(shape) >= 2 and b.draw(st.booleans()):  # attention-like: x times its own transpose
        perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
        xt = b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=perm)
        return b.node("MatMul", [x, xt], shape[:-1] + (shape[-2],))
    n_out = min(b.choice(DIMS), MAX_WEIGHTS // k)
    if n_out < 1:
        return None
    if len(shape) >= 3 and b.draw(st.integers(0, 3)) == 0:  # a batched weight, broadcast over the lead axes
        return b.node("MatMul", [x, b.weights((shape[-3], k, n_out), k)], shape[:-1] + (n_out,))
    y = b.node("MatMul", [x, b.weights((k, n_out), k)], shape[:-1] + (n_out,))
    if b.draw(st.booleans()):  # a Linear layer's bias
        y = b.node("Add", [y, b.weights((n_out,), 4)] if b.draw(st.booleans()) else [b.weights((n_out,), 4), y],
                   shape[:-1] + (n_out,))
    return y


def add_attention(b: GraphBuilder, x: str) -> str | None:
    """Self-attention over [batch, tokens, features] as exporters write it: Q, K, V projections,
    heads split by Reshape and Transpose, keys transposed (by their own Transpose or by the heads'
    permutation), scores scaled (Mul or Div, before or after the MatMul), maybe a causal mask,
    Softmax, the weighted sum, heads merged, an output projection."""
    batch, tokens, features = b.shapes[x]
    heads = b.choice([h for h in (1, 2, 4, 8) if features % h == 0])
    width = features // heads
    if 4 * features * features > MAX_WEIGHTS:
        return None

    def project(name: str) -> str:
        y = b.node("MatMul", [x, b.weights((features, features), features)], (batch, tokens, features))
        return b.node("Add", [y, b.weights((features,), 4)], (batch, tokens, features)) if b.draw(st.booleans()) else y

    q, k, v = project("q"), project("k"), project("v")
    split = (batch, tokens, heads, width)
    heads_first = (batch, heads, tokens, width)
    q = b.node("Transpose", [b.node("Reshape", [q, b.ints(split)], split)], heads_first, perm=[0, 2, 1, 3])
    v = b.node("Transpose", [b.node("Reshape", [v, b.ints(split)], split)], heads_first, perm=[0, 2, 1, 3])
    k = b.node("Reshape", [k, b.ints(split)], split)
    if b.draw(st.booleans()):
        k = b.node("Transpose", [k], (batch, heads, width, tokens), perm=[0, 2, 3, 1])
    else:
        k = b.node("Transpose", [b.node("Transpose", [k], heads_first, perm=[0, 2, 1, 3])],
                   (batch, heads, width, tokens), perm=[0, 1, 3, 2])
    scale = np.float32(1 / math.sqrt(width))
    scores_shape = (batch, heads, tokens, tokens)
    where = b.choice(("query", "scores_mul", "scores_div"))
    if where == "query":
        q = b.node("Mul", [q, b.constant(scale, "scale")], heads_first)
    scores = b.node("MatMul", [q, k], scores_shape)
    if where == "scores_mul":
        scores = b.node("Mul", [b.constant(scale, "scale"), scores], scores_shape)
    elif where == "scores_div":
        scores = b.node("Div", [scores, b.constant(np.float32(math.sqrt(width)), "scale")], scores_shape)
    if b.draw(st.booleans()):
        mask = np.triu(np.full((tokens, tokens), -10000.0, np.float32), 1)
        scores = b.node("Add", [scores, b.constant(mask, "mask")], scores_shape)
    probs = b.node("Softmax", [scores], scores_shape, axis=-1)
    context = b.node("MatMul", [probs, v], heads_first)
    context = b.node("Transpose", [context], split, perm=[0, 2, 1, 3])
    context = b.node("Reshape", [context, b.ints([batch, tokens, features])], (batch, tokens, features))
    return b.node("MatMul", [context, b.weights((features, features), features)], (batch, tokens, features))


def add_resize(b: GraphBuilder, x: str) -> str | None:
    """Resize of the spatial axes by scales or sizes, every mode and coordinate mapping onnxruntime
    runs."""
    shape = b.shapes[x]
    rank = len(shape) - 2
    mode = b.choice(("nearest", "nearest", "linear", "cubic") if rank == 2 else ("nearest", "linear"))
    attrs = {"mode": mode, "coordinate_transformation_mode":
             b.choice(("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"))}
    if mode == "nearest":
        attrs["nearest_mode"] = b.choice(("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))
    factors = [b.choice((0.5, 1.5, 2.0, 2.0, 3.0)) for _ in range(rank)]
    out = tuple(int(math.floor(s * f)) for s, f in zip(shape[2:], factors))
    if min(out) < 1 or math.prod(shape[:2] + out) > MAX_ELEMENTS:
        return None
    if b.draw(st.booleans()):
        inputs = [x, "", b.constant(np.array([1, 1, *factors], np.float32), "scales")]
    else:
        inputs = [x, "", "", b.ints(shape[:2] + out, "sizes")]
    return b.node("Resize", inputs, shape[:2] + out, **attrs)


def add_pad(b: GraphBuilder, x: str) -> str | None:
    """Pad any axes, crops (negative pads) too, in constant (with a value), reflect or edge mode."""
    shape = b.shapes[x]
    rank = len(shape)
    mode = b.choice(("constant", "constant", "reflect", "edge"))
    limits = [s - 1 if mode == "reflect" else 3 for s in shape]
    pads = [b.draw(st.integers(-1 if mode == "constant" else 0, limit)) if b.draw(st.booleans()) else 0
            for _ in range(2) for limit in limits]
    out = tuple(s + pads[i] + pads[i + rank] for i, s in enumerate(shape))
    if min(out) < 1 or math.prod(out) > MAX_ELEMENTS:
        return None
    inputs = [x, b.ints(pads, "pads")]
    if mode == "constant" and b.draw(st.booleans()):
        inputs.append(b.constant(np.float32(b.choice((0.5, -1.0, 3.0))), "value"))
    return b.node("Pad", inputs, out, mode=mode)


def add_reduce(b: GraphBuilder, x: str) -> str | None:
    """A reduction over any set of axes, kept or dropped."""
    shape = b.shapes[x]
    op = b.choice(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare"))
    axes = b.axes(len(shape))
    positive = {a % len(shape) for a in axes}
    keepdims = b.choice((0, 1)) if len(positive) < len(shape) else 1
    out = tuple(1 if i in positive else d for i, d in enumerate(shape) if keepdims or i not in positive)
    if op == "ReduceSum":  # its axes became an input at opset 13
        return b.node(op, [x, b.ints(axes, "axes")], out, keepdims=keepdims)
    return b.node(op, [x], out, axes=axes, keepdims=keepdims)


def add_normalization(b: GraphBuilder, x: str) -> str:
    """BatchNormalization, InstanceNormalization, LayerNormalization over the trailing axes from
    any axis, or a LayerNorm decomposed as exporters write it."""
    shape = b.shapes[x]
    kind = b.choice(("batch", "instance", "layer", "decomposed", "decomposed"))
    if kind in ("batch", "instance") and len(shape) >= 3:
        c = shape[1]
        scale = b.constant(b.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn")
        bias = b.constant(b.rng.standard_normal(c).astype(np.float32), "bn")
        if kind == "instance":
            return b.node("InstanceNormalization", [x, scale, bias], shape, epsilon=1e-5)
        return b.node("BatchNormalization", [x, scale, bias, b.constant(b.rng.standard_normal(c).astype(np.float32), "bn"),
                                             b.constant(b.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn")], shape)
    axis = b.draw(st.integers(1, len(shape) - 1)) if len(shape) > 2 and b.draw(st.booleans()) else len(shape) - 1
    normalized = shape[axis:]
    if math.prod(normalized) < 2:
        return add_unary(b, x)
    scale = b.constant(b.rng.uniform(0.5, 1.5, normalized).astype(np.float32), "ln")
    bias = b.constant(b.rng.standard_normal(normalized).astype(np.float32), "ln")
    if kind == "layer":
        return b.node("LayerNormalization", [x, scale, bias], shape,
                      axis=axis - len(shape) if b.draw(st.booleans()) else axis, epsilon=b.choice((1e-5, 1e-6, 1e-3)))
    axes = list(range(axis, len(shape)))
    if b.draw(st.booleans()):
        axes = [a - len(shape) for a in axes]
    kept = tuple(1 if i >= axis else d for i, d in enumerate(shape))
    centred = b.node("Sub", [x, b.node("ReduceMean", [x], kept, axes=axes, keepdims=1)], shape)
    if b.draw(st.booleans()):
        squared = b.node("Pow", [centred, b.constant(np.float32(2.0), "two")], shape)
    else:
        squared = b.node("Mul", [centred, centred], shape)
    variance = b.node("ReduceMean", [squared], kept, axes=axes, keepdims=1)
    epsilon = b.constant(np.float32(b.choice((1e-5, 1e-6, 1e-12))), "eps")
    std = b.node("Sqrt", [b.node("Add", b.draw(st.permutations([variance, epsilon])), kept)], kept)
    if b.draw(st.booleans()):
        y = b.node("Div", [centred, std], shape)
    else:
        y = b.node("Mul", b.draw(st.permutations([centred, b.node("Reciprocal", [std], kept)])), shape)
    y = b.node("Mul", b.draw(st.permutations([y, scale])), shape)
    return b.node("Add", b.draw(st.permutations([y, bias])), shape)


def add_gelu(b: GraphBuilder, x: str) -> str:
    """GELU as exporters decompose it, in either form and every operand order:
    0.5 * x * (1 + erf(x / sqrt 2)) and 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))."""
    shape = b.shapes[x]

    def mul(a, c):
        return b.node("Mul", b.draw(st.permutations([a, c])), shape)

    def add(a, c):
        return b.node("Add", b.draw(st.permutations([a, c])), shape)

    def const(value, prefix="k"):
        return b.constant(np.float32(value), prefix)

    if b.draw(st.booleans()):
        scaled = b.node("Div", [x, const(math.sqrt(2))], shape) if b.draw(st.booleans()) \
            else mul(x, const(1 / math.sqrt(2)))
        inner = b.node("Erf", [scaled], shape)
    else:
        cube = b.node("Pow", [x, const(3.0)], shape) if b.draw(st.booleans()) else mul(mul(x, x), x)
        inner = b.node("Tanh", [mul(const(math.sqrt(2 / math.pi)), add(x, mul(cube, const(0.044715))))], shape)
    one_plus = add(inner, const(1.0))
    order = b.choice(("half_x_first", "half_last", "half_of_sum"))
    if order == "half_x_first":
        return mul(mul(x, const(0.5)), one_plus)
    if order == "half_last":
        return mul(mul(x, one_plus), const(0.5))
    return mul(x, mul(one_plus, const(0.5)))


def add_float16(b: GraphBuilder, x: str) -> str:
    """A stretch in float16 between two Casts, as mixed-precision exports have: maybe an op in
    float16 on the way."""
    shape = b.shapes[x]
    half = b.node("Cast", [x], None, to=TensorProto.FLOAT16)
    step = b.choice(("none", "unary", "binary"))
    if step == "unary":
        op = b.choice(FLOAT16_UNARY)
        half = b.node(op, [half], None, **({"alpha": 0.1} if op == "LeakyRelu" else {}))
    elif step == "binary":
        other = b.constant(b.rng.standard_normal(b.choice(broadcast_shapes(shape))).astype(np.float16), "h")
        half = b.node(b.choice(("Add", "Mul", "Sub")), b.draw(st.permutations([half, other])), None)
    return b.node("Cast", [half], shape, to=TensorProto.FLOAT)


def add_where(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    other = b.pick(lambda s: s == shape) or add_unary(b, x)
    condition = b.node("Greater", [x, other], None)
    return b.node("Where", [condition, x, other], shape)


#: integer types quantization arithmetic writes: name -> (ONNX type, lowest, highest)
QUANTIZED_TYPES = {"uint8": (TensorProto.UINT8, 0, 255), "int8": (TensorProto.INT8, -128, 127),
                   "int32": (TensorProto.INT32, -(2**31), 2**31 - 1)}


def add_quantization(b: GraphBuilder, x: str) -> str:
    """Quantization arithmetic as models write it, on a tensor computed from the first graph
    input by exact arithmetic and data movement only, so its integers have one right answer:
    DynamicQuantizeLinear, its function body written out (ranges from ReduceMin/ReduceMax, the
    scale and zero point by Sub, Div, Clip, Round and Cast), QuantizeLinear with a constant
    per-tensor or per-axis scale, a symmetric quantization by the largest magnitude (Abs,
    ReduceMax, Div, Round, Clip, Cast or QuantizeLinear), a fake quantization (x/scale by Div or
    Mul, a zero point, Round, Clip, data movement on the way) and Floor or Ceil of a product.
    The integers are graph outputs, compared exactly, and sometimes the scale or x/scale too (a
    float output keeps an NPU island from moving to the CPU); the dequantized float tensor goes on
    (`x` is left as it is)."""
    source = b.inputs[0].name
    shape = b.shapes[source]
    rank = len(shape)
    prefix = b.choice(("none", "mul", "add", "transpose", "flatten"))
    if prefix == "mul":
        source = b.node("Mul", [source, b.constant(np.float32(b.choice((3.0, 0.37, 25.5))), "k")], shape)
    elif prefix == "add":
        offset = b.rng.standard_normal(b.choice(broadcast_shapes(shape))).astype(np.float32)
        source = b.node("Add", [source, b.constant(offset, "c")], shape)
    elif prefix == "transpose" and rank >= 2:
        shape = shape[::-1]
        source = b.node("Transpose", [source], shape, perm=list(range(rank))[::-1])
    elif prefix == "flatten" and rank >= 2:
        shape = (shape[0], math.prod(shape[1:]))
        source = b.node("Flatten", [source], shape, axis=1)
    rank = len(shape)
    kind = b.choice(("dynamic", "dynamic_written_out", "static", "symmetric", "fake", "floor_or_ceil"))

    def output(name: str, type_name: str) -> None:
        b.extra_outputs.append(helper.make_tensor_value_info(name, QUANTIZED_TYPES[type_name][0], shape))

    def maybe_output(name: str, float_shape: tuple[int, ...]) -> None:
        if b.draw(st.booleans()):
            b.extra_outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, float_shape))

    def scalar(value: float, prefix: str = "q") -> str:
        return b.constant(np.float32(value), prefix)

    if kind == "dynamic":
        y, scale, zero = b.multi("DynamicQuantizeLinear", [source], [None, None, None])
        output(y, "uint8")
        return b.node("DequantizeLinear", [y, scale, zero], shape)
    if kind == "dynamic_written_out":  # onnx's function body of DynamicQuantizeLinear
        low = b.node("Min", [b.node("ReduceMin", [source], None, keepdims=0), scalar(0.0)], None)
        high = b.node("Max", [b.node("ReduceMax", [source], None, keepdims=0), scalar(0.0)], None)
        scale = b.node("Div", [b.node("Sub", [high, low], None), scalar(255.0)], None)
        maybe_output(scale, ())
        zero = b.node("Sub", [scalar(0.0), b.node("Div", [low, scale], None)], None)
        zero = b.node("Round", [b.node("Clip", [zero, scalar(0.0), scalar(255.0)], None)], None)
        zero = b.node("Cast", [zero], None, to=TensorProto.UINT8)
        y = b.node("QuantizeLinear", [source, scale, zero], None)
        output(y, "uint8")
        return b.node("DequantizeLinear", [y, scale, zero], shape)
    type_name = b.choice(("uint8", "int8"))
    _, lowest, highest = QUANTIZED_TYPES[type_name]
    if kind == "static":
        axis = b.draw(st.integers(0, rank - 1)) if b.draw(st.booleans()) else None
        count = () if axis is None else (shape[axis],)
        scale = b.constant(b.rng.uniform(0.004, 0.05, count).astype(np.float32), "scale")
        zero = b.constant(b.rng.integers(lowest, highest + 1, count).astype(type_name), "zero")
        attrs = {} if axis is None else {"axis": axis - rank if b.draw(st.booleans()) else axis}
        y = b.node("QuantizeLinear", [source, scale, zero], None, **attrs)
        output(y, type_name)
        return b.node("DequantizeLinear", [y, scale, zero], shape, **attrs)
    if kind == "symmetric":
        largest = b.node("ReduceMax", [b.node("Abs", [source], None)], None, keepdims=0)
        scale = b.node("Div", [largest, scalar(127.0)], None)
        maybe_output(scale, ())
        if b.draw(st.booleans()):
            zero = b.constant(np.array(0, np.int8), "zero")
            y = b.node("QuantizeLinear", [source, scale, zero], None)
            output(y, "int8")
            return b.node("DequantizeLinear", [y, scale, zero], shape)
        q = b.node("Clip", [b.node("Round", [b.node("Div", [source, scale], None)], None), scalar(-127.0),
                            scalar(127.0)], None)
        output(b.node("Cast", [q], None, to=TensorProto.INT8), "int8")
        return b.node("Mul", [q, scale], shape)
    if kind == "fake":
        step = b.rng.uniform(0.004, 0.05, b.choice(broadcast_shapes(shape))).astype(np.float32)
        if b.draw(st.booleans()):
            q = b.node("Div", [source, b.constant(step, "scale")], None)
        else:
            q = b.node("Mul", [source, b.constant((1 / step).astype(np.float32), "inverse")], None)
        offset = float(b.rng.integers(lowest, highest + 1)) if b.draw(st.booleans()) else 0.0
        if offset:
            q = b.node("Add", [q, scalar(offset)], None)
        maybe_output(q, shape)
        if rank >= 2 and b.draw(st.booleans()):  # data movement inside the chain, undone after
            flipped = list(range(rank))[::-1]
            q = b.node("Transpose", [b.node("Round", [b.node("Transpose", [q], None, perm=flipped)], None)], None,
                       perm=flipped)
        else:
            q = b.node("Round", [q], None)
        q = b.node("Clip", [q, scalar(lowest), scalar(highest)], None)
        cast = b.choice((type_name, "int32"))
        output(b.node("Cast", [q], None, to=QUANTIZED_TYPES[cast][0]), cast)
        return b.node("Mul", [b.node("Sub", [q, scalar(offset)], None), b.constant(step, "scale")], shape)
    factor = b.choice((3.0, 10.0, 0.7))
    product = b.node("Mul", [source, scalar(factor)], None)
    maybe_output(product, shape)
    rounded = b.node(b.choice(("Floor", "Ceil")), [product], None)
    output(b.node("Cast", [rounded], None, to=TensorProto.INT32), "int32")
    return b.node("Div", [rounded, scalar(factor)], shape)


def add_gemm(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    flat = b.node("Flatten", [x], (shape[0], math.prod(shape[1:])), axis=1)
    k = math.prod(shape[1:])
    n_out = max(1, min(b.choice(DIMS), MAX_WEIGHTS // k))
    return b.node("Gemm", [flat, b.weights((n_out, k), k), b.weights((n_out,), 4)], (shape[0], n_out), transB=1)


#: step -> the ranks of the operand it takes
STEPS = {
    add_conv: (3, 4, 5), add_conv_transpose: (3, 4), add_unary: (1, 2, 3, 4, 5), add_binary: (1, 2, 3, 4, 5),
    add_concat: (1, 2, 3, 4, 5), add_split: (1, 2, 3, 4, 5), add_slice: (1, 2, 3, 4, 5), add_gather: (1, 2, 3, 4, 5),
    add_transpose: (2, 3, 4, 5), add_reshape: (2, 3, 4, 5), add_shape_arithmetic: (1, 2, 3, 4, 5),
    add_pool: (3, 4, 5), add_softmax: (1, 2, 3, 4, 5), add_matmul: (2, 3, 4, 5), add_attention: (3,),
    add_resize: (3, 4, 5), add_pad: (1, 2, 3, 4, 5), add_reduce: (2, 3, 4, 5), add_normalization: (2, 3, 4, 5),
    add_gelu: (1, 2, 3, 4, 5), add_float16: (1, 2, 3, 4, 5), add_where: (1, 2, 3, 4, 5), add_gemm: (2, 3, 4),
    add_quantization: (1, 2, 3, 4, 5),
}
# ordered for hypothesis: it shrinks towards the first entries, the plainest steps
STEP_ORDER = (add_unary, add_binary, add_conv, add_concat, add_slice, add_split, add_transpose, add_reshape,
              add_pool, add_softmax, add_matmul, add_normalization, add_reduce, add_gelu, add_attention, add_pad,
              add_gather, add_shape_arithmetic, add_conv_transpose, add_resize, add_float16, add_where, add_gemm,
              add_quantization)


def input_shape(draw) -> tuple[int, ...]:
    """A graph input: an image [N, C, H, W] (most often), a sequence [batch, tokens, features]
    as transformers take, a volume [N, C, D, H, W], or a matrix [batch, features]."""
    batch = draw(st.sampled_from((1, 1, 1, 2)))
    kind = draw(st.sampled_from(("image", "image", "sequence", "volume", "matrix")))
    if kind == "volume":
        return (batch, draw(st.sampled_from(DIMS[:10])), *(draw(st.sampled_from(DIMS[:9])) for _ in range(3)))
    if kind == "matrix":
        return (batch, draw(st.sampled_from(DIMS)))
    channels, height, width = draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS[:12])), draw(st.sampled_from(DIMS[:12]))
    return (batch, height, channels) if kind == "sequence" else (batch, channels, height, width)


@st.composite
def graphs(draw, max_steps: int = 12) -> onnx.ModelProto:
    b = GraphBuilder(draw)
    shape = input_shape(draw)
    x = b.input(shape)
    if draw(st.booleans()):
        b.input(shape)  # a second input, used when a step picks an operand of the same shape
    for _ in range(draw(st.integers(1, max_steps))):
        step = draw(st.sampled_from(STEP_ORDER))
        if len(b.shapes[x]) not in STEPS[step]:
            continue
        y = step(b, x)
        if y is not None and 0 < math.prod(b.shapes[y]) <= MAX_ELEMENTS:
            x = y
        elif draw(st.booleans()):
            x = b.pick(lambda s: 0 < math.prod(s) <= MAX_ELEMENTS) or x
    leaves = [n for n in b.shapes if n not in b.consumed and not n.startswith("input")]
    outputs = leaves if draw(st.booleans()) else [x]
    if x not in outputs or not b.nodes:
        outputs = [x]
    if not b.nodes:  # keep the graph non-trivial
        outputs = [add_unary(b, x)]
    graph = helper.make_graph(
        b.nodes, "fuzz", b.inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, b.shapes[o]) for o in outputs] + b.extra_outputs,
        b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def plan_settings() -> st.SearchStrategy[str]:
    """How a graph is planned: 'TARGET', 'TARGET@batch=N' (seed 004 batch contexts) or
    'TARGET@core_mask=M' (steps split across the target's cores)."""
    from rkcompile.targets import get_target

    def variants(target: str) -> st.SearchStrategy[str]:
        cores = get_target(target).npu_cores
        masks = [mask for mask in ("0_1", "0_1_2") if mask.count("_") < cores]
        return st.sampled_from([target, f"{target}@batch=2", f"{target}@batch=3",
                                *(f"{target}@core_mask={mask}" for mask in masks)])

    return st.sampled_from(TARGETS).flatmap(variants)


def parse_setting(setting: str):
    """The target and the planning options a `plan_settings` string names."""
    from rkcompile.options import Options

    target, *pairs = setting.split("@")
    values = dict(pair.split("=", 1) for pair in pairs)
    return target, Options(batch=int(values.get("batch", 1)), core_mask=values.get("core_mask", "auto"),
                           verify_passes=True)


class TimeLimit(Exception):
    pass


@contextmanager
def resource_limits(seconds: float, extra_bytes: int):
    """Raise TimeLimit in the block after `seconds` (a SIGALRM timer: the main thread only), and
    MemoryError once it grows the address space by more than `extra_bytes`: a plan that grows
    without bound must fail, not hang or take the shared machine."""
    def expire(signum, frame):
        raise TimeLimit(f"took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    in_use = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    ceiling = in_use + extra_bytes
    if limits[1] != resource.RLIM_INFINITY:
        ceiling = min(ceiling, limits[1])
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, limits[1]))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, limits)


def check(model: onnx.ModelProto, setting: str, folder: Path) -> str | None:
    """What is wrong with `model` planned as `setting` says (a target, maybe with options), or
    None. A failure names where it happened: the rkcompile file a planning exception came from,
    or the plan step (device and kernel) the emulator raised in or first went wrong at."""
    from rkcompile.plan.allocation import verify_allocation
    from rkcompile.api import Plan, weight_region
    from rkcompile.emulator.session import emulate, make_inputs
    from rkcompile.compiler.pipeline import compile_model
    from rkcompile.plan.schema import contract_violations

    path = folder / "fuzz.onnx"
    onnx.save(model, str(path))
    try:
        with resource_limits(SECONDS_PER_GRAPH, MEMORY_PER_GRAPH):
            plan, ctx = compile_model(path, *parse_setting(setting))
    except (MemoryError, TimeLimit) as exc:  # where it ran out says nothing
        return f"plan raised {type(exc).__name__}: {exc}"
    except Exception as exc:
        return f"plan raised {type(exc).__name__} in {_raising_file(exc)}: {exc}"
    problems = contract_violations(plan, [n.name for n in model.graph.node]) + verify_allocation(plan)
    if problems:
        return f"unsound plan: {problems[0]}"
    inputs = make_inputs(plan, {}, seed=0)
    observed: dict[int, dict[str, np.ndarray]] = {}
    try:
        with resource_limits(SECONDS_PER_GRAPH, MEMORY_PER_GRAPH):
            prepared = Plan(plan, weight_region(plan, ctx.graph, ctx.target)).prepared()
            outputs = emulate(prepared, inputs, lambda step, values: observed.__setitem__(step, values)).outputs
    except Exception as exc:
        refused = reference(path, inputs)
        if isinstance(refused, str):  # the emulator runs CPU steps on onnxruntime
            return refused
        failing = plan.steps[len(observed)] if len(observed) < len(plan.steps) else None
        where = f"at a {failing.device} {failing.kernel} step" if failing else f"in {_raising_file(exc)}"
        return f"emulator raised {type(exc).__name__} {where}: {exc}"
    expected = reference(path, inputs)
    if isinstance(expected, str):
        return expected
    floor = FLOAT16_RESOLUTION * max((float(np.abs(v).max(initial=0)) for v in inputs.values()), default=0.0)
    exact = {name for name, value in expected.items() if value.dtype.kind in "biu"}
    # integers have one right answer: a float16 plan computes what they are rounded from in float32
    problem = mismatch({name: outputs[name] for name in exact}, expected)
    if problem is None:
        floats = {name: value for name, value in outputs.items() if name not in exact}
        problem = mismatch(floats, expected, floor)
        if problem is None:
            return None
        rounded = float16_rounded_reference(model, inputs)
        if mismatch({name: rounded[name] for name in floats}, expected, floor) is not None:
            return f"{ILL_CONDITIONED}: {problem}"
    first = first_divergence(model, plan, observed, inputs, floor)
    return f"mismatch at a {first.device} {first.kernel} step: {problem}" if first else problem


def reference(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | str:
    """onnxruntime's outputs, or why it cannot run the model (its own limits: linear Resize after
    its layout rewrites, ConvTranspose with an output_padding past the stride whatever the
    dilation): then there is nothing to compare with."""
    from rkcompile.emulator.closeness import onnxruntime_outputs

    try:
        return onnxruntime_outputs(path, inputs)
    except Exception as exc:
        return f"{REFERENCE_REFUSED}: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def _raising_file(exc: BaseException) -> str:
    """The innermost rkcompile source file in the exception's traceback."""
    files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    ours = [f for f in files if "rkcompile" in Path(f).parts or "passes" in Path(f).parts]
    path = Path(ours[-1] if ours else files[-1] if files else "?")
    parts = path.parts
    return "/".join(parts[parts.index("rkcompile"):] if "rkcompile" in parts else parts[-2:])


def first_divergence(model: onnx.ModelProto, plan, observed: dict[int, dict[str, np.ndarray]],
                     inputs: dict[str, np.ndarray], floor: float):
    """The first plan step one of whose outputs, under the name it has in the model, misses
    onnxruntime's value of that tensor; None when no intermediate tensor can be compared."""
    import onnxruntime

    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    floats = {v.name for v in onnx.shape_inference.infer_shapes(model).graph.value_info
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    known = {o.name for o in probed.graph.output}
    probed.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                               for name in sorted(floats - known))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(probed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    reference = dict(zip(names, session.run(names, inputs)))
    for step in plan.steps:
        values = {name: value for name, value in observed.get(step.id, {}).items() if name in reference}
        if values and mismatch(values, reference, floor) is not None:
            return step
    return None


def mismatch(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray], floor: float = 0.0) -> str | None:
    """The first output that disagrees: an integer or bool output in any value, a float output
    beyond the tolerance; an error below `floor` (float16's resolution at the inputs' magnitude)
    never does, since an output that cancels to zero keeps that much of a float16 operand's
    rounding."""
    from rkcompile.emulator.closeness import agreement

    for name, value in outputs.items():
        if expected[name].dtype.kind in "biu":
            if value.shape != expected[name].shape or not np.array_equal(value, expected[name]):
                differ = int(np.sum(value != expected[name])) if value.shape == expected[name].shape else "all"
                return f"mismatch on {name}: {differ} of {expected[name].size} {expected[name].dtype} values differ"
            continue
        a = agreement(name, value, expected[name])
        scale = float(np.abs(expected[name]).max(initial=0))
        if a.cosine < MIN_COSINE and a.max_abs > max(MAX_ABS_OF_RANGE * max(scale, 1e-3), floor):
            return f"mismatch on {name}: cosine {a.cosine:.6f}, max abs {a.max_abs:.3g} of range {scale:.3g}"
    return None


def float16_rounded_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model run by onnxruntime in float32 (no graph optimizations) with the inputs, the
    weights and every node's float32 outputs rounded to float16, as a float16 plan stores them:
    each such tensor passes through a Cast to float16 and back."""
    import onnxruntime

    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    graph = rounded.graph
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32), tensor.name))
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*onnx.shape_inference.infer_shapes(model).graph.value_info, *graph.input, *graph.output)}
    nodes, feeds = [], {}
    for value in graph.input:
        feeds[f"{value.name}_unrounded"] = inputs[value.name]
        if types.get(value.name) == TensorProto.FLOAT:
            nodes += _float16_round_trip(f"{value.name}_unrounded", value.name)
            value.name = f"{value.name}_unrounded"
        else:
            nodes.append(helper.make_node("Identity", [value.name + "_unrounded"], [value.name]))
            value.name = f"{value.name}_unrounded"
    for node in graph.node:
        nodes.append(node)
        for i, output in enumerate(node.output):
            if output and types.get(output) == TensorProto.FLOAT:
                node.output[i] = f"{output}_unrounded"
                nodes += _float16_round_trip(node.output[i], output)
    del graph.node[:]
    graph.node.extend(nodes)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(rounded.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in graph.output]
    return dict(zip(names, session.run(names, feeds)))


def _float16_round_trip(source: str, target: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Cast", [source], [f"{target}_float16"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", [f"{target}_float16"], [target], to=TensorProto.FLOAT)]


def signature(problem: str, model: onnx.ModelProto) -> str:
    """A failure's kind: where it happened (a step's device and kernel, or a file) and what was
    raised, without the message; for a mismatch no step explains, the op that produced the
    output; for an unsound plan, the first violation without numbers and names."""
    if problem.startswith("mismatch on"):
        name = problem.split()[2].rstrip(":")
        producer = next((n.op_type for n in model.graph.node if name in n.output), "?")
        return f"mismatch after {producer}"
    if problem.startswith(("mismatch at", "plan raised", "emulator raised")):
        return problem.split(": ", 1)[0]
    return re.sub(r"[\w.]*\d[\w.]*", "#", problem)[:120]


class Failure(AssertionError):
    pass


def fuzz(examples: int, chunk: int, first_seed: int, save: Path | None, log=print) -> Counter:
    """Run `examples` graphs; returns the counts of clean runs and of each failure kind.

    Chunks only generate, so every graph counted was drawn, not made while shrinking. A new kind
    of failure ends its chunk; the chunk's seed is then drawn again, uncounted, with shrinking
    on, raising for that kind alone, and the smallest such graph is saved."""
    counts: Counter = Counter()
    known: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        last_failing: list[onnx.ModelProto] = []

        def kind_of(model: onnx.ModelProto, setting: str) -> tuple[str, str]:
            """(outcome or failure kind, the problem)."""
            problem = check(model, setting, folder)
            if problem is None:
                return "clean", ""
            excused = next((kind for kind in NOT_FAILURES if problem.startswith(kind)), None)
            return excused or signature(problem, model), problem

        new_kind: list[str] = []  # the kind this chunk found, raised again when hypothesis replays it

        def counted(model: onnx.ModelProto, setting: str) -> None:
            kind, problem = kind_of(model, setting)
            if new_kind and kind == new_kind[0]:
                raise Failure(kind)
            counts[kind] += 1
            if kind in NOT_FAILURES or kind in known or kind in ELSEWHERE:
                return
            known[kind] = f"{setting}: {problem}"
            new_kind[:] = [kind]
            raise Failure(kind)

        def shrinking(kind: str):
            def one(model: onnx.ModelProto, setting: str) -> None:
                if kind_of(model, setting)[0] == kind:
                    last_failing[:] = [model, setting]
                    raise Failure(kind)
            return one

        def run(chunk_seed: int, size: int, test, phases) -> None:
            seed(chunk_seed)(settings(max_examples=size, database=None, deadline=None, print_blob=False,
                                      phases=phases, suppress_health_check=list(HealthCheck))(
                given(graphs(), plan_settings())(test)))()

        done, chunk_seed = 0, first_seed
        while done < examples:
            size = min(chunk, examples - done)
            before = sum(counts.values())
            new_kind.clear()
            try:
                run(chunk_seed, size, counted, (Phase.generate,))
            except Failure as failure:
                kind = str(failure)
                log(f"new failure ({kind}): {known[kind]}")
                try:
                    run(chunk_seed, size, shrinking(kind), (Phase.generate, Phase.shrink))
                except Failure:
                    model, setting = last_failing  # hypothesis replays the shrunk example last
                    if save is not None:
                        save.mkdir(parents=True, exist_ok=True)
                        path = save / f"fuzz_{chunk_seed}_{len(known)}@{setting}.onnx"
                        onnx.save(model, str(path))
                        log(f"  saved the shrunk model as {path}")
            done += max(sum(counts.values()) - before, 1)
            chunk_seed += 1
            log(f"{done} graphs: " + ", ".join(f"{counts[kind]} {kind}" for kind in NOT_FAILURES)
                + f", {sum(counts.values()) - sum(counts[kind] for kind in NOT_FAILURES)} failing")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "regressions")
    args = parser.parse_args()
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # what it refuses is counted, not logged
    started = time.perf_counter()
    counts = fuzz(args.examples, args.chunk, args.seed, args.save)
    total = sum(counts.values())
    print(f"ran {total} graphs in {time.perf_counter() - started:.0f}s: {counts['clean']} clean, "
          f"{counts[ILL_CONDITIONED]} ill-conditioned (rounding every tensor to float16 alone breaks the "
          f"tolerance), {counts[REFERENCE_REFUSED]} that onnxruntime refused to run")
    failures = {kind: count for kind, count in counts.items() if kind not in NOT_FAILURES}
    for kind, count in sorted(failures.items(), key=lambda kv: -kv[1]):
        owner = f" (known: {ELSEWHERE[kind].regression})" if kind in ELSEWHERE else ""
        print(f"  {count:5d} x {kind}{owner}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
