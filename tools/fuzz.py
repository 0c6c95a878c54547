"""Differential fuzzing: random valid ONNX graphs, planned, checked and emulated, against onnxruntime.

    python tools/fuzz.py [--examples 3000] [--chunk 200] [--seed 0] [--save tests/regressions]

`graphs()` is a hypothesis strategy over small float32 graphs of ops the planner knows (and a
few it leaves on the CPU): conv blocks, activations, binary ops against tensors and constants
of every broadcastable shape, branches joined by Concat, splits, slices, transposes, reshapes
(rank 5 too), pools, softmax, matmuls, resize, pad, normalizations, where. Dimensions mix small
values with ones just past the C2 alignment and the rules' limits, so both sides of a
constraint come up. `plan_settings()` picks the target, and sometimes a batch of 2 or 3 (seed 004 contexts) or a
core mask (steps split across cores). `check()` says what is wrong with one graph, or None: the plan must keep
every contract invariant and `verify_allocation`, and the float16 emulation must match
onnxruntime's float32 outputs (cosine >= 0.999, or max |error| within 1% of the output's range),
unless the float32 reference run with every tensor rounded to float16 misses that bar too
(LayerNormalization over two nearly equal values, say): no float16 plan can match such a graph,
so it is reported as ill-conditioned and counted apart.

The runner draws examples in chunks of hypothesis runs. When one fails with a new kind of
failure, hypothesis shrinks it, the shrunk model is saved under --save, and that kind is then
counted rather than raised, so one bug does not hide the others.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, seed, settings
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
#: Small sizes, plus sizes on either side of the float16 C2 (8, 16) and of powers of two.
DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 32, 33)
#: Most weight elements one MatMul or Gemm may draw, to keep examples quick.
MAX_WEIGHTS = 200_000
UNARY = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Softplus",
         "Clip", "Sin", "Cos", "Abs", "Neg")
BINARY = ("Add", "Sub", "Mul", "Max", "Min", "Div")


class GraphBuilder:
    """Nodes, constants and the known shape of every float tensor made so far."""

    def __init__(self, draw):
        self.draw = draw
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.consumed: set[str] = set()
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

    def weights(self, shape: tuple[int, ...], fan_in: int) -> str:
        return self.constant((self.rng.standard_normal(shape) / math.sqrt(max(fan_in, 1))).astype(np.float32))

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...] | None, **attrs) -> str:
        """Append `op`; its one output has `shape` (None: an integer or bool tensor, not offered
        as a float operand)."""
        output = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"{op}_{len(self.nodes)}", **attrs))
        self.consumed.update(inputs)
        if shape is not None:
            self.shapes[output] = tuple(shape)
        return output

    def pick(self, predicate=lambda shape: True) -> str | None:
        names = [n for n, s in self.shapes.items() if predicate(s)]
        return self.draw(st.sampled_from(names)) if names else None


def _conv_extent(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def add_conv(b: GraphBuilder, x: str) -> str | None:
    n, c, h, w = b.shapes[x]
    draw = b.draw
    depthwise = draw(st.booleans()) and c > 1
    kernel = draw(st.sampled_from((1, 3, 5, 7)))
    stride = draw(st.sampled_from((1, 1, 2, 3)))
    dilation = draw(st.sampled_from((1, 1, 1, 2)))
    pad = draw(st.integers(0, kernel // 2 * dilation))
    out_h, out_w = (_conv_extent(s, kernel, stride, pad, dilation) for s in (h, w))
    if min(out_h, out_w) < 1:
        return None
    out_c = c * draw(st.sampled_from((1, 1, 2))) if depthwise else draw(st.sampled_from(DIMS))
    group = c if depthwise else 1
    inputs = [x, b.weights((out_c, c // group, kernel, kernel), c // group * kernel * kernel)]
    if draw(st.booleans()):
        inputs.append(b.weights((out_c,), 4))
    y = b.node("Conv", inputs, (n, out_c, out_h, out_w), kernel_shape=[kernel, kernel], strides=[stride, stride],
               pads=[pad] * 4, dilations=[dilation, dilation], group=group)
    if draw(st.booleans()):  # the fusions the NPU has
        y = add_unary(b, y)
    return y


def add_unary(b: GraphBuilder, x: str) -> str:
    op = b.draw(st.sampled_from(UNARY))
    shape = b.shapes[x]
    if op == "Clip":
        low = b.constant(np.float32(b.draw(st.sampled_from((-1.0, 0.0)))), "low")
        high = b.constant(np.float32(b.draw(st.sampled_from((1.0, 6.0)))), "high")
        return b.node("Clip", [x, low, high], shape)
    attrs = {"alpha": b.draw(st.sampled_from((0.01, 0.1, 0.2)))} if op in ("LeakyRelu", "HardSigmoid") else {}
    return b.node(op, [x], shape, **attrs)


def broadcast_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes that broadcast to `shape` without changing it."""
    rank = len(shape)
    options = [shape, (1,), (shape[-1],), tuple(1 if i != rank - 1 else shape[-1] for i in range(rank))]
    if rank >= 3:
        options += [(shape[-3], 1, 1), (shape[-2], shape[-1]), tuple(1 if i != rank - 2 else shape[-2] for i in range(rank))]
    if rank == 4:
        options += [(1, shape[1], 1, 1), (shape[0], shape[1], 1, 1)]
    return options


def add_binary(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    op = b.draw(st.sampled_from(BINARY))
    partner_kind = b.draw(st.sampled_from(("tensor", "constant", "pooled", "flipped")))
    if op == "Div":  # a divisor bounded away from zero keeps float16 honest
        value = b.rng.uniform(0.5, 2.0, b.draw(st.sampled_from(broadcast_shapes(shape)))) * b.rng.choice([-1, 1])
        return b.node("Div", [x, b.constant(value.astype(np.float32))], shape)
    if partner_kind == "pooled" and len(shape) == 4:
        other = b.node(b.draw(st.sampled_from(("GlobalAveragePool", "GlobalMaxPool"))), [x], shape[:2] + (1, 1))
        other = b.node("Sigmoid", [other], shape[:2] + (1, 1))
        return b.node(op, [x, other], shape)
    if partner_kind == "tensor":
        other = b.pick(lambda s: s == shape)
        if other is not None:
            return b.node(op, [x, other], shape)
    constant = b.rng.standard_normal(b.draw(st.sampled_from(broadcast_shapes(shape)))).astype(np.float32)
    operands = [b.constant(constant, "c"), x] if partner_kind == "flipped" else [x, b.constant(constant, "c")]
    return b.node(op, operands, shape)


def add_concat(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    axis = b.draw(st.integers(-len(shape), len(shape) - 1))
    axis %= len(shape)

    def fits(s):
        return len(s) == len(shape) and all(a == c for i, (a, c) in enumerate(zip(s, shape)) if i != axis)

    parts = [x, b.pick(fits) or add_unary(b, x)]
    if b.draw(st.booleans()):
        parts.append(add_unary(b, x))  # a branch off the same tensor
    size = sum(b.shapes[p][axis] for p in parts)
    return b.node("Concat", parts, shape[:axis] + (size,) + shape[axis + 1:], axis=axis)


def add_split(b: GraphBuilder, x: str) -> str | None:
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    if shape[axis] < 2:
        return None
    first = b.draw(st.integers(1, shape[axis] - 1))
    sizes = b.constant(np.array([first, shape[axis] - first], np.int64), "split")
    outputs = [b.name("split_a"), b.name("split_b")]
    b.nodes.append(helper.make_node("Split", [x, sizes], outputs, name=f"Split_{len(b.nodes)}", axis=axis))
    for out, size in zip(outputs, (first, shape[axis] - first)):
        b.shapes[out] = shape[:axis] + (size,) + shape[axis + 1:]
    b.consumed.add(x)
    return b.draw(st.sampled_from(outputs))


def add_slice(b: GraphBuilder, x: str) -> str | None:
    shape = b.shapes[x]
    axis = b.draw(st.integers(0, len(shape) - 1))
    if shape[axis] < 2:
        return None
    start = b.draw(st.integers(0, shape[axis] - 1))
    end = b.draw(st.integers(start + 1, shape[axis]))
    step = b.draw(st.sampled_from((1, 1, 2)))
    size = len(range(start, end, step))
    inputs = [x] + [b.constant(np.array([v], np.int64), "s") for v in (start, end, axis, step)]
    return b.node("Slice", inputs, shape[:axis] + (size,) + shape[axis + 1:])


def add_transpose(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    perm = b.draw(st.permutations(range(len(shape))))
    return b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))


def add_reshape(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    total = math.prod(shape)
    choices = [(shape[0], total // shape[0]), (total,)]
    if len(shape) == 4:
        n, c, h, w = shape
        # a single long row takes matmuls past the NPU's K limit (8192 on RK3588)
        choices += [(n, c, h * w), (n, c * h, w), (n, c, h, w, 1), (n, 1, c, h, w), (n * c, h, w), (1, 1, 1, total)]
    if len(shape) in (2, 3):
        choices += [(1,) * (4 - len(shape)) + shape]
    target = b.draw(st.sampled_from(choices))
    return b.node("Reshape", [x, b.constant(np.array(target, np.int64), "shape")], target)


def add_pool(b: GraphBuilder, x: str) -> str | None:
    n, c, h, w = b.shapes[x]
    op = b.draw(st.sampled_from(("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")))
    if op.startswith("Global"):
        return b.node(op, [x], (n, c, 1, 1))
    kernel = b.draw(st.sampled_from((2, 3)))
    stride = b.draw(st.sampled_from((1, 2)))
    pad = b.draw(st.integers(0, kernel // 2))
    out_h, out_w = (_conv_extent(s, kernel, stride, pad, 1) for s in (h, w))
    if min(out_h, out_w) < 1:
        return None
    attrs = {"count_include_pad": b.draw(st.sampled_from((0, 1)))} if op == "AveragePool" else {}
    return b.node(op, [x], (n, c, out_h, out_w), kernel_shape=[kernel, kernel], strides=[stride, stride],
                  pads=[pad] * 4, **attrs)


def add_softmax(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    return b.node("Softmax", [x], shape, axis=b.draw(st.integers(-len(shape), len(shape) - 1)))


def add_matmul(b: GraphBuilder, x: str) -> str | None:
    shape = b.shapes[x]
    k = shape[-1]
    if len(shape) >= 2 and b.draw(st.booleans()):  # attention-like: x times its own transpose
        perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
        xt = b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=perm)
        return b.node("MatMul", [x, xt], shape[:-1] + (shape[-2],))
    n_out = min(b.draw(st.sampled_from(DIMS)), MAX_WEIGHTS // k)
    if n_out < 1:
        return None
    return b.node("MatMul", [x, b.weights((k, n_out), k)], shape[:-1] + (n_out,))


def add_resize(b: GraphBuilder, x: str) -> str:
    n, c, h, w = b.shapes[x]
    mode = b.draw(st.sampled_from(("nearest", "linear")))
    scales = b.constant(np.array([1, 1, 2, 2], np.float32), "scales")
    return b.node("Resize", [x, "", scales], (n, c, 2 * h, 2 * w), mode=mode)


def add_pad(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    pads = [0, 0] + [b.draw(st.integers(0, 2)) for _ in range(len(shape) - 2)]
    pads += [0, 0] + [b.draw(st.integers(0, 2)) for _ in range(len(shape) - 2)]
    rank = len(shape)
    out = tuple(s + pads[i] + pads[i + rank] for i, s in enumerate(shape))
    return b.node("Pad", [x, b.constant(np.array(pads, np.int64), "pads")], out, mode="constant")


def add_normalization(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) == 4 and b.draw(st.booleans()):
        c = shape[1]
        params = [b.constant(b.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn"),
                  b.constant(b.rng.standard_normal(c).astype(np.float32), "bn"),
                  b.constant(b.rng.standard_normal(c).astype(np.float32), "bn"),
                  b.constant(b.rng.uniform(0.5, 1.5, c).astype(np.float32), "bn")]
        return b.node("BatchNormalization", [x, *params], shape)
    width = shape[-1]
    scale = b.constant(b.rng.uniform(0.5, 1.5, width).astype(np.float32), "ln")
    bias = b.constant(b.rng.standard_normal(width).astype(np.float32), "ln")
    return b.node("LayerNormalization", [x, scale, bias], shape, axis=-1)


def add_where(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    other = b.pick(lambda s: s == shape) or add_unary(b, x)
    condition = b.node("Greater", [x, other], None)
    return b.node("Where", [condition, x, other], shape)


def add_gemm(b: GraphBuilder, x: str) -> str:
    shape = b.shapes[x]
    flat = b.node("Flatten", [x], (shape[0], math.prod(shape[1:])), axis=1)
    k = math.prod(shape[1:])
    n_out = max(1, min(b.draw(st.sampled_from(DIMS)), MAX_WEIGHTS // k))
    return b.node("Gemm", [flat, b.weights((n_out, k), k), b.weights((n_out,), 4)], (shape[0], n_out), transB=1)


#: step -> the ranks of the operand it takes
STEPS = {
    add_conv: (4,), add_unary: (2, 3, 4, 5), add_binary: (2, 3, 4, 5), add_concat: (2, 3, 4, 5),
    add_split: (2, 3, 4), add_slice: (2, 3, 4), add_transpose: (2, 3, 4, 5), add_reshape: (2, 3, 4),
    add_pool: (4,), add_softmax: (2, 3, 4), add_matmul: (2, 3, 4), add_resize: (4,), add_pad: (4,),
    add_normalization: (2, 3, 4), add_where: (2, 3, 4), add_gemm: (2, 4),
}
# ordered for hypothesis: it shrinks towards the first entries, the plainest steps
STEP_ORDER = (add_unary, add_binary, add_conv, add_concat, add_slice, add_split, add_transpose, add_reshape,
              add_pool, add_softmax, add_matmul, add_normalization, add_pad, add_resize, add_where, add_gemm)


@st.composite
def graphs(draw, max_steps: int = 12) -> onnx.ModelProto:
    b = GraphBuilder(draw)
    batch = draw(st.sampled_from((1, 1, 1, 2)))
    shape = (batch, draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS[:12])), draw(st.sampled_from(DIMS[:12])))
    if draw(st.integers(0, 3)) == 0:  # a sequence, [batch, tokens, features], as transformers take
        shape = shape[:1] + shape[2:3] + shape[1:2]
    x = b.input(shape)
    if draw(st.booleans()):
        b.input(shape)  # a second input, used when a step picks an operand of the same shape
    for _ in range(draw(st.integers(1, max_steps))):
        step = draw(st.sampled_from(STEP_ORDER))
        if len(b.shapes[x]) not in STEPS[step]:
            continue
        y = step(b, x)
        if y is not None and 0 < math.prod(b.shapes[y]) <= 100_000:
            x = y
        elif draw(st.booleans()):
            x = b.pick(lambda s: 0 < math.prod(s) <= 100_000) or x
    leaves = [n for n in b.shapes if n not in b.consumed and not n.startswith("input")]
    outputs = leaves if draw(st.booleans()) else [x]
    if x not in outputs or not b.nodes:
        outputs = [x]
    if not b.nodes:  # keep the graph non-trivial
        outputs = [add_unary(b, x)]
    graph = helper.make_graph(
        b.nodes, "fuzz", b.inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, b.shapes[o]) for o in outputs], b.initializers)
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
    from rkcompile.context import Options

    target, *pairs = setting.split("@")
    values = dict(pair.split("=", 1) for pair in pairs)
    return target, Options(batch=int(values.get("batch", 1)), core_mask=values.get("core_mask", "auto"))


def check(model: onnx.ModelProto, setting: str, folder: Path) -> str | None:
    """What is wrong with `model` planned as `setting` says (a target, maybe with options), or None."""
    from rkcompile.allocation import verify_allocation
    from rkcompile.emulator.compare import onnxruntime_outputs
    from rkcompile.emulator.session import Prepared, emulate, make_inputs
    from rkcompile.pipeline import compile_model
    from rkcompile.plan import contract_violations

    path = folder / "fuzz.onnx"
    onnx.save(model, str(path))
    try:
        plan, ctx = compile_model(path, *parse_setting(setting))
    except Exception as exc:
        return f"plan raised {type(exc).__name__}: {exc}"
    problems = contract_violations(plan, [n.name for n in model.graph.node]) + verify_allocation(plan)
    if problems:
        return f"unsound plan: {problems[0]}"
    inputs = make_inputs(plan, {}, seed=0)
    try:
        outputs = emulate(Prepared(plan, ctx.graph, list(ctx.order)), inputs).outputs
    except Exception as exc:
        return f"emulator raised {type(exc).__name__}: {exc}"
    try:
        expected = onnxruntime_outputs(path, inputs)
    except Exception as exc:  # onnxruntime's own limits, e.g. linear Resize after its layout rewrites
        return f"{REFERENCE_REFUSED}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    floor = FLOAT16_RESOLUTION * max((float(np.abs(v).max(initial=0)) for v in inputs.values()), default=0.0)
    problem = mismatch(outputs, expected, floor)
    if problem is not None and mismatch(float16_rounded_reference(model, inputs), expected, floor) is not None:
        return f"{ILL_CONDITIONED}: {problem}"
    return problem


def mismatch(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray], floor: float = 0.0) -> str | None:
    """The first output that disagrees; an error below `floor` (float16's resolution at the
    inputs' magnitude) never does, since an output that cancels to zero keeps that much of a
    float16 operand's rounding."""
    from rkcompile.emulator.compare import agreement

    for name, value in outputs.items():
        a = agreement(name, value, expected[name])
        scale = float(np.abs(expected[name]).max(initial=0))
        if a.cosine < MIN_COSINE and a.max_abs > max(MAX_ABS_OF_RANGE * max(scale, 1e-3), floor):
            return f"mismatch on {name}: cosine {a.cosine:.6f}, max abs {a.max_abs:.3g} of range {scale:.3g}"
    return None


def float16_rounded_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model run node by node by onnx.reference in float32, with the inputs, the weights and
    every node's outputs rounded to float16, as a float16 plan stores them."""
    from onnx.reference import ReferenceEvaluator

    def rounded(value: np.ndarray) -> np.ndarray:
        value = np.asarray(value)
        return value.astype(np.float16).astype(value.dtype) if value.dtype == np.float32 else value

    values = {name: rounded(value) for name, value in inputs.items()}
    values.update({t.name: rounded(numpy_helper.to_array(t)) for t in model.graph.initializer})
    for node in model.graph.node:  # the strategy appends nodes in execution order
        results = ReferenceEvaluator(node, opsets={"": OPSET}).run(None, {n: values[n] for n in node.input if n})
        values.update({name: rounded(result) for name, result in zip(node.output, results)})
    return {o.name: values[o.name] for o in model.graph.output}


def signature(problem: str, model: onnx.ModelProto) -> str:
    """A failure's kind: its message without numbers and names, and for a mismatch the op
    that produced the output."""
    if problem.startswith("mismatch"):
        name = problem.split()[2].rstrip(":")
        producer = next((n.op_type for n in model.graph.node if name in n.output), "?")
        return f"mismatch after {producer}"
    return re.sub(r"[\w.]*\d[\w.]*", "#", problem)[:120]


class Failure(AssertionError):
    pass


def fuzz(examples: int, chunk: int, first_seed: int, save: Path | None, log=print) -> Counter:
    """Run `examples` graphs; returns the counts of clean runs and of each failure kind."""
    counts: Counter = Counter()
    known: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        last_failing: list[onnx.ModelProto] = []

        def one(model: onnx.ModelProto, setting: str) -> None:
            problem = check(model, setting, folder)
            if problem is None:
                counts["clean"] += 1
                return
            excused = next((kind for kind in NOT_FAILURES if problem.startswith(kind)), None)
            if excused:
                counts[excused] += 1
                return
            kind = signature(problem, model)
            if kind in known:
                counts[kind] += 1
                return
            last_failing[:] = [model]
            raise Failure(f"{setting}: {problem}")

        done, chunk_seed = 0, first_seed
        while done < examples:
            size = min(chunk, examples - done)
            before = sum(counts.values())
            test = settings(max_examples=size, database=None, deadline=None, print_blob=False,
                            suppress_health_check=list(HealthCheck))(
                given(graphs(), plan_settings())(one))
            try:
                seed(chunk_seed)(test)()
            except Failure as failure:
                model = last_failing[0]  # hypothesis replays the shrunk example last
                kind = signature(str(failure).split(": ", 1)[1], model)
                known[kind] = str(failure)
                counts[kind] += 1
                log(f"new failure ({kind}): {failure}")
                if save is not None:
                    save.mkdir(parents=True, exist_ok=True)
                    setting = str(failure).split(": ", 1)[0]
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
        print(f"  {count:5d} x {kind}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
