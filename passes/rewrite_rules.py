"""The legalizing rewrites: one named function per rewrite, from a matched node to candidates.

A rule never edits the graph. It yields `Replacement`s: new nodes wired from the matched node's
inputs to its outputs, most preferred first. The rewrite pass keeps the first candidate whose
every node is legal on the target and discards the rest. Each docstring says why the result
computes the same thing and which constraint it works around.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir import FLOAT_DTYPES, constant_value, dtype_name, element_count, static_shape
from rkcompile.targets.model import Target

from .legalize import check_node

#: Largest K one exMatMul takes before B is split into T = ceil(K / limit) segments: seed 002,
#: 4.1.1.4.1 ("For RK3588: When K > 8192 ...", "For RK3576/RV1126B: When K > 4096 ...").
MATMUL_K_LIMIT = {"rk3588": 8192, "rk3576": 4096, "rv1126b": 4096}
#: exMatMul, every platform: "A: shape [b,k,1,n], k ∈ (0, 8192]" (oplist V2.3.2, exMatMul).
DEFAULT_MATMUL_K_LIMIT = 8192
#: MaxPool/AveragePool kernel_h, kernel_w ∈ (0, 7] (seed 000, MaxPool and AveragePool).
POOL_KERNEL_LIMIT = 7
#: The one HardSigmoid the NPU computes: alpha = 1/6, beta = 0.5 (seed 001, HardSigmoid).
NATIVE_HARDSIGMOID = (1 / 6, 0.5)
RESHAPE_LIKE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where", "Relu", "LeakyRelu", "PRelu", "Sigmoid",
    "Tanh", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Gelu", "Mish", "Clip",
})


@dataclass(frozen=True)
class Replacement:
    """`old` nodes leave the graph, `new` nodes take their place; consumers of each tensor in
    `aliases`' first position read the second instead (a removed relabel)."""

    old: tuple[gs.Node, ...]
    new: tuple[gs.Node, ...]
    aliases: tuple[tuple[gs.Tensor, gs.Tensor], ...] = ()

    def discard(self) -> None:
        for node in self.new:
            node.inputs.clear()
            node.outputs.clear()


class Site:
    """What rules may read: the graph, the target, the opset, the compile's facts for the
    target's rules (legalize.compile_facts), and fresh unique names."""

    def __init__(self, graph: gs.Graph, target: Target, opset: int, facts: dict[str, object]):
        self.graph, self.target, self.opset, self.facts = graph, target, opset, facts
        self.graph_outputs = {t.name for t in graph.outputs}
        self._taken = {n.name for n in graph.nodes} | set(graph.tensors())

    def fresh(self, base: str) -> str:
        name, index = base, 0
        while name in self._taken:
            index += 1
            name = f"{base}_{index}"
        self._taken.add(name)
        return name

    def transpose_legal(self, node: gs.Node, input_shape: list[int]) -> bool:
        """Whether the Transpose `node`, reading a tensor of `input_shape` instead, passes the
        target's rules; judged on a detached probe that touches no graph tensor."""
        perm = [int(p) for p in node.attrs.get("perm", range(len(input_shape) - 1, -1, -1))]
        probe = gs.Node("Transpose", attrs=dict(node.attrs),
                        inputs=[gs.Variable("probe_in", node.inputs[0].dtype, list(input_shape))],
                        outputs=[gs.Variable("probe_out", node.outputs[0].dtype, [input_shape[p] for p in perm])])
        return not check_node(probe, self.target, **self.facts)

    def builder(self, node: gs.Node) -> "Builder":
        return Builder(self, node)


class Builder:
    """Makes the nodes and tensors of one replacement of `node`, named after it."""

    def __init__(self, site: Site, node: gs.Node):
        self.site, self.node, self.nodes = site, node, []

    def const(self, values, hint: str = "const") -> gs.Constant:
        return gs.Constant(self.site.fresh(f"{self.node.name}/{hint}"), np.ascontiguousarray(values))

    def op(self, op: str, inputs: list, shape=None, dtype=None, out: gs.Tensor | None = None,
           **attrs) -> gs.Tensor:
        """Append an `op` node; it writes `out`, or a new tensor of `shape` and `dtype`."""
        if out is None:
            out = gs.Variable(self.site.fresh(f"{self.node.name}/{op.lower()}_out"), dtype=dtype,
                              shape=list(shape))
        name = self.site.fresh(f"{self.node.name}/{op.lower()}")
        self.nodes.append(gs.Node(op, name, attrs=attrs, inputs=list(inputs), outputs=[out]))
        return out

    def reshape(self, tensor: gs.Tensor, shape, out: gs.Tensor | None = None) -> gs.Tensor:
        target_shape = self.const(np.array(shape, dtype=np.int64), "shape")
        return self.op("Reshape", [tensor, target_shape], shape, tensor.dtype, out)

    def finish(self, *old: gs.Node, aliases=()) -> Replacement:
        return Replacement(old or (self.node,), tuple(self.nodes), tuple(aliases))


@dataclass(frozen=True)
class RewriteRule:
    """`build` yields candidate replacements for a node of one of `ops`. An `always` rule fires
    even when the node is legal as it stands, because its result is what the NPU runs best. A
    `late` rule runs after fusion (passes/rewrite_late.py): its result would hide a pattern."""

    build: Callable[[gs.Node, Site], Iterator[Replacement]]
    ops: frozenset[str]
    always: bool = False
    late: bool = False

    @property
    def name(self) -> str:
        return self.build.__name__


def _float_constant(tensor: gs.Tensor) -> np.ndarray | None:
    value = constant_value(tensor)
    if value is None or value.dtype.name not in FLOAT_DTYPES:
        return None
    return value


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def _split_node(builder: Builder, tensor: gs.Tensor, axis: int, sizes: list[int]) -> list[gs.Tensor]:
    """A Split of `tensor` along `axis` into `sizes`; its split sizes are an input from opset 13."""
    shape = static_shape(tensor)
    outs = []
    for size in sizes:
        part = list(shape)
        part[axis] = size
        outs.append(gs.Variable(builder.site.fresh(f"{builder.node.name}/split_out"), tensor.dtype, part))
    split = np.array(sizes, dtype=np.int64)
    if builder.site.opset >= 13:
        inputs, attrs = [tensor, builder.const(split, "split")], {"axis": axis}
    else:
        inputs, attrs = [tensor], {"axis": axis, "split": split.tolist()}
    builder.nodes.append(gs.Node("Split", builder.site.fresh(f"{builder.node.name}/split"), attrs=attrs,
                                 inputs=inputs, outputs=outs))
    return outs


# --- element-wise ------------------------------------------------------------------------------

def pow_to_mul_chain(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """x^n for an integer n >= 4 as square-and-multiply Muls (at most 2*log2(n) of them): the NPU's
    Pow takes only the exponents 0, 1, 2, 3, 0.5 and -0.5 (seed 000, Pow)."""
    base, exponent = node.inputs[0], node.inputs[1]
    value = constant_value(exponent)
    shape = static_shape(node.outputs[0])
    if value is None or value.size != 1 or shape is None or static_shape(base) != shape:
        return
    power = float(value.reshape(-1)[0])
    if power != int(power) or power < 4:
        return
    # values[0] is x; each step multiplies two earlier values. The top bit of n is always set,
    # so the last step is the one that completes x^n.
    steps: list[tuple[int, int]] = []

    def multiply(left: int, right: int) -> int:
        steps.append((left, right))
        return len(steps)

    n, square, result = int(power), 0, None
    while n:
        if n & 1:
            result = square if result is None else multiply(result, square)
        n >>= 1
        if n:
            square = multiply(square, square)
    builder = site.builder(node)
    values = [base]
    for index, (left, right) in enumerate(steps):
        last = index == len(steps) - 1
        values.append(builder.op("Mul", [values[left], values[right]], shape, base.dtype,
                                 out=node.outputs[0] if last else None))
    yield builder.finish()


def sub_constant_to_add(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """x - c as x + (-c): Add broadcasts like Expand and runs on several cores, while Sub takes only
    [b,c,1,1] or scalar operands and no multi-core (oplist V2.3.2, RK3588, Sub and Add)."""
    value = _float_constant(node.inputs[1])
    if value is None or constant_value(node.inputs[0]) is not None:
        return
    builder = site.builder(node)
    builder.op("Add", [node.inputs[0], builder.const(-value)], out=node.outputs[0])
    yield builder.finish()


def div_constant_to_mul(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """x / c as x * (1/c): the NPU's Div computes in float16 only (seed 000, Div), its Mul in int8
    and float16 and on several cores (oplist V2.3.2, Mul)."""
    value = _float_constant(node.inputs[1])
    if value is None or constant_value(node.inputs[0]) is not None or not np.all(value != 0):
        return
    reciprocal = (1 / value).astype(value.dtype)
    if not np.all(np.isfinite(reciprocal)):
        return
    builder = site.builder(node)
    builder.op("Mul", [node.inputs[0], builder.const(reciprocal, "reciprocal")], out=node.outputs[0])
    yield builder.finish()


def _scalar(builder: Builder, value: float, like: gs.Tensor) -> gs.Constant:
    return builder.const(np.array([value], dtype=dtype_name(like.dtype)))


def hardsigmoid_to_native(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """HardSigmoid(x; a, b) = clip(a*x + b, 0, 1) with other a, b than the NPU's 1/6 and 0.5
    (seed 001, HardSigmoid): first as the native HardSigmoid of 6a*x + 6b - 3, else as
    Clip(6a*x + 6b, 0, 6) / 6, the ReLU6 form of oplist V2.3.2 Clip/ReLU6."""
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    if np.allclose((alpha, beta), NATIVE_HARDSIGMOID, rtol=1e-6, atol=0):
        return
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None:
        return
    native = site.builder(node)
    scaled = native.op("Mul", [x, _scalar(native, 6 * alpha, x)], shape, x.dtype)
    shifted = native.op("Add", [scaled, _scalar(native, 6 * beta - 3, x)], shape, x.dtype)
    native.op("HardSigmoid", [shifted], out=y, alpha=float(np.float32(1 / 6)), beta=0.5)
    yield native.finish()
    relu6 = site.builder(node)
    scaled = relu6.op("Mul", [x, _scalar(relu6, 6 * alpha, x)], shape, x.dtype)
    shifted = relu6.op("Add", [scaled, _scalar(relu6, 6 * beta, x)], shape, x.dtype)
    clipped = _clip(relu6, shifted, 0.0, 6.0, shape)
    relu6.op("Mul", [clipped, _scalar(relu6, 1 / 6, x)], out=y)
    yield relu6.finish()


def _clip(builder: Builder, x: gs.Tensor, low: float, high: float, shape) -> gs.Tensor:
    """Clip's bounds are inputs from opset 11, attributes before."""
    if builder.site.opset >= 11:
        dtype = dtype_name(x.dtype)
        bounds = [builder.const(np.array(low, dtype=dtype), "min"), builder.const(np.array(high, dtype=dtype), "max")]
        return builder.op("Clip", [x, *bounds], shape, x.dtype)
    return builder.op("Clip", [x], shape, x.dtype, min=low, max=high)


def elu_to_native(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """Elu with alpha a != 1 as a*Elu1(x) + (1-a)*Relu(x): both terms are x for x >= 0, and for
    x < 0 the sum is a*(exp(x)-1). The NPU's Elu has alpha = 1 only (seed 001, Elu)."""
    alpha = float(node.attrs.get("alpha", 1.0))
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if alpha == 1.0 or shape is None:
        return
    builder = site.builder(node)
    elu = builder.op("Elu", [x], shape, x.dtype, alpha=1.0)
    relu = builder.op("Relu", [x], shape, x.dtype)
    scaled_elu = builder.op("Mul", [elu, _scalar(builder, alpha, x)], shape, x.dtype)
    scaled_relu = builder.op("Mul", [relu, _scalar(builder, 1 - alpha, x)], shape, x.dtype)
    builder.op("Add", [scaled_elu, scaled_relu], out=y)
    yield builder.finish()


# --- BatchNormalization ------------------------------------------------------------------------

def _batchnorm_affine(node: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) with BN(x) = scale*x + shift per channel, when the statistics are constant."""
    if node.attrs.get("training_mode", 0) or len([t for t in node.outputs if t.name]) != 1:
        return None
    params = [constant_value(t) for t in node.inputs[1:5]]
    if any(p is None for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    return scale, beta - mean * scale


def fold_batchnorm_into_conv(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A BatchNormalization after a Conv whose output it alone reads, folded into that Conv's
    weights and bias: one Convolution kernel instead of two passes over the feature map, as
    rknn-toolkit2 does."""
    affine = _batchnorm_affine(node)
    conv = _producer(node.inputs[0])
    if affine is None or conv is None or conv.op != "Conv" or len(node.inputs[0].outputs) != 1:
        return
    if node.inputs[0].name in site.graph_outputs:
        return
    weight = constant_value(conv.inputs[1])
    bias = constant_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2].name else None
    if weight is None or (len(conv.inputs) > 2 and conv.inputs[2].name and bias is None):
        return
    scale, shift = affine
    bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
    builder = site.builder(node)
    folded_weight = (weight * scale.reshape(-1, *[1] * (weight.ndim - 1))).astype(weight.dtype)
    folded_bias = (bias * scale + shift).astype(weight.dtype)
    builder.op("Conv", [conv.inputs[0], builder.const(folded_weight, "weight"),
                        builder.const(folded_bias, "bias")], out=node.outputs[0], **conv.attrs)
    yield builder.finish(conv, node)


def batchnorm_to_mul_add(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A BatchNormalization that stays on its own, as x*scale + shift with per-channel constants
    of shape [1,C,1,1]: Mul and Add broadcast [b,c,1,1] operands (Expand patterns, seed 000)."""
    affine = _batchnorm_affine(node)
    x = node.inputs[0]
    shape = static_shape(x)
    if affine is None or shape is None or len(shape) < 2:
        return
    channel_shape = [1, shape[1]] + [1] * (len(shape) - 2)
    dtype = dtype_name(x.dtype)
    scale, shift = (a.astype(dtype).reshape(channel_shape) for a in affine)
    builder = site.builder(node)
    scaled = builder.op("Mul", [x, builder.const(scale, "scale")], shape, x.dtype)
    builder.op("Add", [scaled, builder.const(shift, "shift")], out=node.outputs[0])
    yield builder.finish()


# --- pooling -----------------------------------------------------------------------------------

def maxpool_ceil_to_pads(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """MaxPool with ceil_mode = 1 as floor mode with the extra end padding that yields the same
    output size; padding never wins a max. The NPU does not support ceil_mode (seed 000, MaxPool)."""
    if not node.attrs.get("ceil_mode", 0) or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return
    if len([t for t in node.outputs if t.name]) != 1:
        return
    in_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if in_shape is None or out_shape is None:
        return
    kernel = list(node.attrs["kernel_shape"])
    spatial = len(kernel)
    strides = list(node.attrs.get("strides", [1] * spatial))
    dilations = list(node.attrs.get("dilations", [1] * spatial))
    pads = list(node.attrs.get("pads", [0] * 2 * spatial))
    for axis in range(spatial):
        covered = (out_shape[axis + 2] - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1
        missing = covered - (in_shape[axis + 2] + pads[axis] + pads[axis + spatial])
        pads[axis + spatial] += max(0, missing)
    builder = site.builder(node)
    builder.op("MaxPool", list(node.inputs), out=node.outputs[0], **{**node.attrs, "ceil_mode": 0, "pads": pads})
    yield builder.finish()


def average_pool_excluding_pads(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """AveragePool with pads and count_include_pad = 0 (ONNX's default) as the NPU's pooling,
    which counts the pads (oplist V2.3.2, AveragePool), times a constant map of
    window size / valid elements per output position: near the border the NPU divides by the
    whole window, ONNX by the elements inside the image."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = static_shape(x), static_shape(y)
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ())]
    if in_shape is None or out_shape is None or len(in_shape) != 4 or len(kernel) != 2:
        return
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET" or any(int(d) != 1 for d in node.attrs.get("dilations", [1, 1])):
        return
    pads = [int(p) for p in node.attrs.get("pads", [0, 0, 0, 0])]
    if int(node.attrs.get("count_include_pad", 0)) or not any(pads):
        return
    strides = [int(v) for v in node.attrs.get("strides", [1, 1])]
    valid = []
    for axis in range(2):
        starts = np.arange(out_shape[axis + 2]) * strides[axis] - pads[axis]
        valid.append(np.minimum(starts + kernel[axis], in_shape[axis + 2]) - np.maximum(starts, 0))
    counts = np.outer(valid[0], valid[1]).astype(np.float64)
    correction = (kernel[0] * kernel[1] / counts).astype(dtype_name(x.dtype) or "float32")
    builder = site.builder(node)
    pooled = builder.op("AveragePool", [x], out_shape, x.dtype, **{**node.attrs, "count_include_pad": 1})
    # Full-sized: the NPU's Mul broadcasts [1, 1, h, w] to [1, c, h, w] by none of its Expand patterns.
    border = np.broadcast_to(correction, (1, out_shape[1], *counts.shape))
    builder.op("Mul", [pooled, builder.const(border, "border")], out=y)
    yield builder.finish()


#: x^-beta as NPU Pows (exponents from seed 000, Pow: {0, 1, 2, 3, 0.5, -0.5}) and Muls: the
#: exponents to apply in turn, each to the previous result, and whether to multiply the last
#: two results (x^-0.75 = x^-0.5 * (x^-0.5)^0.5).
INVERSE_POWERS = {0.5: ((-0.5,), False), 0.75: ((-0.5, 0.5), True), 1.0: ((-0.5, 2.0), False)}


def lrn_to_conv_and_pows(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """LRN (no NPU kernel in oplist V2.3.2) as NPU ops: the squares summed over each channel's
    window by a 1x1 Conv with a constant band matrix (alpha / size folded into its weights, bias
    into its bias), raised to -beta by Pows of allowed exponents, times x. ONNX's window for
    channel c runs from c - floor((size - 1) / 2) to c + ceil((size - 1) / 2)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    beta = float(node.attrs.get("beta", 0.75))
    if shape is None or len(shape) != 4 or beta not in INVERSE_POWERS:
        return
    size = int(node.attrs["size"])
    alpha, bias = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("bias", 1.0))
    channels = shape[1]
    dtype = dtype_name(x.dtype) or "float32"
    offsets = np.arange(channels)[None, :] - np.arange(channels)[:, None]  # input c' minus output c
    band = ((offsets >= -((size - 1) // 2)) & (offsets <= -(-(size - 1) // 2))).astype(dtype) * (alpha / size)
    builder = site.builder(node)
    squares = builder.op("Mul", [x, x], shape, x.dtype)
    summed = _conv_1x1(builder, squares, band, np.full(channels, bias, dtype), list(shape))
    exponents, multiply_last_two = INVERSE_POWERS[beta]
    powers = [summed]
    for exponent in exponents:
        powers.append(builder.op("Pow", [powers[-1], _scalar(builder, exponent, x)], shape, x.dtype))
    scale = builder.op("Mul", powers[-2:], shape, x.dtype) if multiply_last_two else powers[-1]
    builder.op("Mul", [x, scale], out=y)
    yield builder.finish()


def sum_to_adds(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """Sum of several inputs (opset 8 exporters' residual adds) as a chain of Adds: the NPU has
    Add, not Sum (oplist V2.3.2 lists Add only)."""
    operands = [t for t in node.inputs if t.name]
    if len(operands) < 2 or static_shape(node.outputs[0]) is None:
        return
    builder = site.builder(node)
    total = operands[0]
    for index, operand in enumerate(operands[1:], start=2):
        last = index == len(operands)
        total = builder.op("Add", [total, operand], static_shape(node.outputs[0]), node.outputs[0].dtype,
                           out=node.outputs[0] if last else None)
    yield builder.finish()


def pool_stage_kernels(size: int, limit: int = POOL_KERNEL_LIMIT) -> list[int]:
    """Kernels (each its own stride) whose stages reduce `size` to 1 in the fewest stages,
    preferring exact divisors, else the kernel that needs the least end padding."""
    kernels = []
    while size > 1:
        stages = 1
        while limit ** stages < size:
            stages += 1
        reach = limit ** (stages - 1)
        fitting = [k for k in range(limit, 1, -1) if -(-size // k) <= reach]
        kernel = min(fitting, key=lambda k: (-(-size // k) * k - size, -k))
        kernels.append(kernel)
        size = -(-size // kernel)
    return kernels


def global_pool_to_stages(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """GlobalAveragePool/GlobalMaxPool over more than 7x7 (seed 000: height, width ∈ (0,7]) as
    pools with kernel = stride <= 7 that tile the map. Averages pad with zeros and count them
    (count_include_pad = 1, seed 000), so a final Mul rescales by padded area / true area."""
    x = node.inputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) != 4:
        return
    stages_h, stages_w = pool_stage_kernels(shape[2]), pool_stage_kernels(shape[3])
    count = max(len(stages_h), len(stages_w))
    if count == 0:
        return
    stages_h += [1] * (count - len(stages_h))
    stages_w += [1] * (count - len(stages_w))
    average = node.op == "GlobalAveragePool"
    correction = math.prod(stages_h) * math.prod(stages_w) / (shape[2] * shape[3])
    builder = site.builder(node)
    current, (height, width) = x, shape[2:]
    for index, kernel in enumerate(zip(stages_h, stages_w)):
        out_h, out_w = -(-height // kernel[0]), -(-width // kernel[1])
        pads = [0, 0, out_h * kernel[0] - height, out_w * kernel[1] - width]
        last = index == count - 1 and (not average or correction == 1)
        attrs = {"kernel_shape": list(kernel), "strides": list(kernel), "pads": pads}
        if average:
            attrs["count_include_pad"] = 1
        current = builder.op("AveragePool" if average else "MaxPool", [current], [*shape[:2], out_h, out_w],
                             x.dtype, out=node.outputs[0] if last else None, **attrs)
        height, width = out_h, out_w
    if average and correction != 1:
        builder.op("Mul", [current, _scalar(builder, correction, x)], out=node.outputs[0])
    yield builder.finish()


def reducemean_to_global_pool(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """ReduceMean over height and width of a 4-D tensor as GlobalAveragePool (then a Reshape
    when keepdims = 0): the oplist V2.3.2 has no ReduceMean kernel, it has GlobalAveragePool;
    torch exports adaptive_avg_pool2d(1) as this ReduceMean (mobilenet_v2 in the zoo)."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    axes = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1].name:
        axes = constant_value(node.inputs[1])
    if shape is None or y_shape is None or len(shape) != 4 or axes is None:
        return
    if sorted(int(a) % 4 for a in np.ravel(axes)) != [2, 3]:
        return
    builder = site.builder(node)
    keep = node.attrs.get("keepdims", 1)
    pooled = builder.op("GlobalAveragePool", [x], [*shape[:2], 1, 1], x.dtype, out=y if keep else None)
    if not keep:
        builder.reshape(pooled, y_shape, out=y)
    yield builder.finish()


# --- matrix products ---------------------------------------------------------------------------

def _conv_1x1(builder: Builder, x4: gs.Tensor, weight: np.ndarray, bias: np.ndarray | None,
              out_shape) -> gs.Tensor:
    inputs = [x4, builder.const(weight[:, :, None, None], "weight")]
    if bias is not None:
        inputs.append(builder.const(bias, "bias"))
    return builder.op("Conv", inputs, out_shape, x4.dtype, kernel_shape=[1, 1])


def gemm_to_conv(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """Gemm with constant B (and C) as Reshape [M,K,1,1] -> 1x1 Conv -> Reshape [M,N]: the oplist
    has no Gemm kernel, fully connected layers run as Convolution (oplist V2.3.2, Convolution;
    rknn-toolkit2's layer tables show Conv for every Gemm). alpha, beta and transB fold into
    the weights; transA is left alone."""
    a, y = node.inputs[0], node.outputs[0]
    b = constant_value(node.inputs[1])
    a_shape, y_shape = static_shape(a), static_shape(y)
    if b is None or node.attrs.get("transA", 0) or a_shape is None or y_shape is None or len(a_shape) != 2:
        return
    weight = b if node.attrs.get("transB", 0) else b.T  # [N, K]
    weight = (weight * node.attrs.get("alpha", 1.0)).astype(b.dtype)
    bias = None
    if len(node.inputs) > 2 and node.inputs[2].name:
        c = constant_value(node.inputs[2])
        n = weight.shape[0]
        if c is None or np.broadcast_shapes(c.shape, (1, n)) != (1, n):
            return
        bias = (np.broadcast_to(c, (1, n)).reshape(n) * node.attrs.get("beta", 1.0)).astype(b.dtype)
    m, n = y_shape
    builder = site.builder(node)
    conv = _conv_1x1(builder, builder.reshape(a, [m, a_shape[1], 1, 1]), weight, bias, [m, n, 1, 1])
    builder.reshape(conv, y_shape, out=y)
    yield builder.finish()


def matmul_constant_to_conv(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """MatMul with one constant 2-D operand as a 1x1 Conv whose weights are that operand, as
    rknn-toolkit2 runs it (its bert layer table shows Conv for MatMul by weights): Convolution
    runs on several cores and takes per-channel weights, exMatMul neither (oplist V2.3.2).
    x[..., M, K] @ W[K, N] reads x as [L, K, 1, 1]; W[M, K] @ x[..., K, N] reads x as [L, K, 1, N].
    A constant bias Add that alone reads x @ W becomes the Conv's bias, and a residual Add after
    it is done on the Conv's output layout, so the two fuse as ConvAdd."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    y_shape = static_shape(y)
    if y_shape is None:
        return
    right, left = constant_value(b), constant_value(a)
    builder = site.builder(node)
    absorbed = ()
    if right is not None and left is None and right.ndim == 2 and static_shape(a) and len(static_shape(a)) >= 2:
        k, n = right.shape
        rows = element_count(static_shape(a)[:-1])
        bias_add, bias = _bias_add(y, n, site)
        if bias_add is not None:
            absorbed, y = (bias_add,), bias_add.outputs[0]
        conv = _conv_1x1(builder, builder.reshape(a, [rows, k, 1, 1]), right.T, bias, [rows, n, 1, 1])
        residual_add, residual = _residual_add(y, site)
        if residual_add is not None:
            absorbed, y = absorbed + (residual_add,), residual_add.outputs[0]
            conv = builder.op("Add", [conv, builder.reshape(residual, [rows, n, 1, 1])], [rows, n, 1, 1], y.dtype)
    elif left is not None and right is None and left.ndim == 2 and static_shape(b) and len(static_shape(b)) >= 2:
        m, k = left.shape
        batch = element_count(static_shape(b)[:-2])
        n = static_shape(b)[-1]
        conv = _conv_1x1(builder, builder.reshape(b, [batch, k, 1, n]), left, None, [batch, m, 1, n])
    else:
        return
    builder.reshape(conv, y_shape, out=y)
    yield builder.finish(node, *absorbed)


def _residual_add(y: gs.Tensor, site: Site) -> tuple[gs.Node | None, gs.Tensor | None]:
    """The Add of a computed tensor of y's own shape (a residual connection) that alone reads
    `y`: done on the Conv's [L, N, 1, 1] output, Conv and Add become one ConvAdd kernel (oplist
    V2.3.2, ConvolutionAdd), as rknn-toolkit2 runs transformer blocks."""
    if len(y.outputs) != 1 or y.name in site.graph_outputs:
        return None, None
    add = y.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return None, None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if isinstance(other, gs.Constant) or static_shape(other) != static_shape(y):
        return None, None
    return add, other


def _bias_add(y: gs.Tensor, n: int, site: Site) -> tuple[gs.Node | None, np.ndarray | None]:
    """The Add of a constant [N] (or [1, ..., N]) bias that alone reads the MatMul's result `y`:
    it becomes the Conv's bias, which the NPU adds in the same kernel (rknn-toolkit2's ConvAdd)."""
    if len(y.outputs) != 1 or y.name in site.graph_outputs:
        return None, None
    add = y.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or static_shape(add.outputs[0]) != static_shape(y):
        return None, None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    bias = _float_constant(other)
    if bias is None or bias.size != n or bias.shape[-1] != n:
        return None, None
    return add, bias.reshape(n)


def matmul_k_split(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """MatMul with K over the target's limit as T = ceil(K / limit) MatMuls over K segments, summed:
    A·B = Σ A[:, seg] · B[seg, :]. Seed 002, 4.1.1.4.1: B is split into T segments when K > 8192
    on RK3588 and K > 4096 on RK3576/RV1126B."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a_shape, b_shape, y_shape = static_shape(a), static_shape(b), static_shape(y)
    if a_shape is None or b_shape is None or y_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return
    limit = MATMUL_K_LIMIT.get(site.target.name, DEFAULT_MATMUL_K_LIMIT)
    k = a_shape[-1]
    if k <= limit:
        return
    segments = -(-k // limit)
    sizes = [limit] * (segments - 1) + [k - limit * (segments - 1)]
    builder = site.builder(node)
    a_parts = _split_node(builder, a, len(a_shape) - 1, sizes)
    b_value = constant_value(b)
    if b_value is None:
        b_parts = _split_node(builder, b, len(b_shape) - 2, sizes)
    else:
        bounds = np.cumsum([0] + sizes)
        b_parts = [builder.const(b_value[..., start:end, :], "weight") for start, end in zip(bounds, bounds[1:])]
    partials = [builder.op("MatMul", [pa, pb], y_shape, y.dtype) for pa, pb in zip(a_parts, b_parts)]
    total = partials[0]
    for index, partial in enumerate(partials[1:], start=2):
        total = builder.op("Add", [total, partial], y_shape, y.dtype, out=y if index == segments else None)
    yield builder.finish()


# --- normalization and softmax -----------------------------------------------------------------

def layernorm_to_channel_axis(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """LayerNormalization over the trailing axes of [..., C] as one over the channels of
    [L, C, 1, 1]: exNorm normalizes axes [1] or [1,2,3] only (seed 001, exNorm), and with
    H = W = 1 the two are the same reduction. Scale and bias become [C, 1, 1]."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len([t for t in node.outputs if t.name]) != 1:
        return
    axis = node.attrs.get("axis", -1) % len(shape)
    rows, channels = element_count(shape[:axis]), element_count(shape[axis:])
    params = [constant_value(t) for t in node.inputs[1:] if t.name]
    if any(p is None for p in params):
        return
    builder = site.builder(node)
    x4 = builder.reshape(x, [rows, channels, 1, 1])
    consts = [builder.const(np.broadcast_to(p, shape[axis:]).reshape(channels, 1, 1), "param") for p in params]
    normed = builder.op("LayerNormalization", [x4, *consts], [rows, channels, 1, 1], x.dtype,
                        **{**node.attrs, "axis": 1})
    builder.reshape(normed, shape, out=y)
    yield builder.finish()


def softmax_to_supported_axis(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """Softmax on an axis other than 1 or 3 (oplist V2.3.2, Softmax: "axis 1, 3, channel and
    width") moved onto one: first a Transpose swapping it with axis 3 and back; else relabels
    to [1, outer, 1, D] (axis 3) when nothing follows the axis, or to [outer, D, inner, 1] (axis 1).
    Before opset 13 Softmax normalizes every axis from `axis` on, so D covers them all."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or not shape:
        return
    axis = node.attrs.get("axis", -1 if site.opset >= 13 else 1) % len(shape)
    flattening = site.opset < 13
    outer = element_count(shape[:axis])
    depth = element_count(shape[axis:]) if flattening else shape[axis]
    inner = 1 if flattening else element_count(shape[axis + 1:])
    if len(shape) == 4 and not flattening and axis in (0, 2):
        builder = site.builder(node)
        perm = list(range(4))
        perm[axis], perm[3] = 3, axis
        swapped = builder.op("Transpose", [x], [shape[p] for p in perm], x.dtype, perm=perm)
        normed = builder.op("Softmax", [swapped], [shape[p] for p in perm], x.dtype, axis=3)
        builder.op("Transpose", [normed], out=y, perm=perm)
        yield builder.finish()
    layouts = ([([1, outer, 1, depth], 3)] if inner == 1 else []) + ([] if flattening else [([outer, depth, inner, 1], 1)])
    for layout, new_axis in layouts:
        builder = site.builder(node)
        normed = builder.op("Softmax", [builder.reshape(x, layout)], layout, x.dtype, axis=new_axis)
        builder.reshape(normed, shape, out=y)
        yield builder.finish()


# --- layout: ranks and relabels ----------------------------------------------------------------

def lift_to_4d(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """An element-wise op on tensors of rank 1 to 3 run on 4-D tensors: every operand gets leading
    1s up to [1, ..., dims] (which never changes NumPy broadcasting), the result is relabelled
    back. The NPU's operators take [batch, channel, height, width] only (oplist V2.3.2)."""
    shapes = [static_shape(t) for t in node.inputs if t.name] + [static_shape(t) for t in node.outputs]
    if any(s is None for s in shapes) or not 1 <= max(len(s) for s in shapes) <= 3:
        return
    builder = site.builder(node)
    inputs = []
    for tensor in node.inputs:
        shape = static_shape(tensor) if tensor.name else None
        value = constant_value(tensor)
        if not tensor.name or (value is not None and value.ndim == 0):
            inputs.append(tensor)
        elif value is not None:
            inputs.append(builder.const(value.reshape([1] * (4 - value.ndim) + list(value.shape)), "const4d"))
        else:
            inputs.append(builder.reshape(tensor, [1] * (4 - len(shape)) + list(shape)))
    out_shape = static_shape(node.outputs[0])
    lifted = builder.op(node.op, inputs, [1] * (4 - len(out_shape)) + list(out_shape), node.outputs[0].dtype,
                        **node.attrs)
    builder.reshape(lifted, out_shape, out=node.outputs[0])
    yield builder.finish()


def transpose_to_4d(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A Transpose of rank above 4 (exporters' channel shuffles and attention head splits) moves
    the same data as a Transpose of the tensor with its size-1 axes dropped and every run of
    neighbouring axes that the perm keeps together merged into one: so Reshape to that merged
    shape, Transpose it (or, if the NPU refuses that perm, Split/relabel/Concat it), Reshape
    back. The relabels that made the tensor rank 5 on either side are absorbed, so no rank-5
    tensor is left. The NPU's operators take [batch, channel, height, width] only (oplist
    V2.3.2, every operator's shape list)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) <= 4 or static_shape(y) is None:
        return
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    kept = [axis for axis in perm if shape[axis] != 1]
    runs: list[list[int]] = []
    for axis in kept:
        if runs and axis == _next_kept_axis(runs[-1][-1], shape):
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if not runs or len(runs) > 4:
        return
    by_input_order = sorted(runs)
    merged_shape = [element_count(shape[a] for a in run) for run in by_input_order]
    merged_perm = [by_input_order.index(run) for run in runs]
    source, dest, absorbed = x, y, []
    before = _producer(x)
    if before is not None and before.op in RESHAPE_LIKE and len(x.outputs) == 1 and x.name not in site.graph_outputs:
        source, absorbed = before.inputs[0], [before]
    after = y.outputs[0] if len(y.outputs) == 1 else None
    if (after is not None and after.op in RESHAPE_LIKE and y.name not in site.graph_outputs
            and static_shape(after.outputs[0]) is not None):
        dest, absorbed = after.outputs[0], absorbed + [after]
    for as_concat in (False, True):
        if as_concat and _moved_axis(merged_shape, merged_perm) is None:
            return
        builder = site.builder(node)
        merged = builder.reshape(source, merged_shape)
        if as_concat:
            moved = _moved_axis_as_concat(builder, merged, merged_perm)
        else:
            moved = builder.op("Transpose", [merged], [merged_shape[p] for p in merged_perm], x.dtype,
                               perm=merged_perm)
        builder.reshape(moved, static_shape(dest), out=dest)
        yield builder.finish(node, *absorbed)


#: Largest axis _moved_axis_as_concat splits into slices.
MOVED_AXIS_SLICES = 16


def _moved_axis_as_concat(builder: Builder, x: gs.Tensor, perm: list[int],
                          out: gs.Tensor | None = None) -> gs.Tensor | None:
    """When `perm` moves one small axis and keeps the others in order, the Transpose is a Split
    along that axis, a relabel of each slice (moving a size-1 axis keeps the data order) and a
    Concat at the axis' new place; None when `perm` is not of that kind."""
    shape = static_shape(x)
    axis = _moved_axis(shape, perm)
    if axis is not None:
        position = perm.index(axis)
        piece_shape = [1 if p == axis else shape[p] for p in perm]
        slices = _split_node(builder, x, axis, [1] * shape[axis])
        relabelled = [builder.reshape(piece, piece_shape) for piece in slices]
        if out is None:
            return builder.op("Concat", relabelled, [shape[p] for p in perm], x.dtype, axis=position)
        return builder.op("Concat", relabelled, out=out, axis=position)
    return None


def _moved_axis(shape, perm: list[int]) -> int | None:
    """The one axis of 2 to 16 that `perm` moves while keeping the others in order, if any."""
    for axis in range(len(perm)):
        rest = [p for p in perm if p != axis]
        if rest == sorted(rest) and 1 < shape[axis] <= MOVED_AXIS_SLICES:
            return axis
    return None


def transpose_small_axis_as_concat(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A Transpose the NPU refuses (oplist V2.3.2, Transpose: the perm table and its limits) that
    moves one axis of at most 16 and keeps the rest in order (a q/k/v or head split): Split that
    axis into slices, relabel each, Concat them where the axis goes, as rknn-toolkit2 does for
    attention's q/k/v Transpose."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) > 4:
        return
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    builder = site.builder(node)
    if _moved_axis_as_concat(builder, x, perm, out=y) is not None:
        yield builder.finish()


def _next_kept_axis(axis: int, shape: tuple[int, ...]) -> int | None:
    return next((a for a in range(axis + 1, len(shape)) if shape[a] != 1), None)


#: How many slices transpose_in_slices tries, fewest first.
TRANSPOSE_SLICES = (2, 4, 8, 16, 32, 64)


def transpose_in_slices(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A Transpose over its perm's size limits (oplist V2.3.2, Transpose: products of dims below
    p and q) done in slices along an axis the perm leaves in place: each slice is a smaller
    Transpose of the same perm, and a Concat along that axis puts the slices back in order."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) > 4:
        return
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    for axis in (a for a in reversed(range(len(shape))) if perm[a] == a and shape[a] > 1):
        for parts in (n for n in TRANSPOSE_SLICES if shape[axis] % n == 0):
            piece = [shape[axis] // parts if a == axis else d for a, d in enumerate(shape)]
            if not site.transpose_legal(node, piece):
                continue  # a slice would be refused too: building the candidate is wasted work
            builder = site.builder(node)
            slices = _split_node(builder, x, axis, [shape[axis] // parts] * parts)
            moved = [builder.op("Transpose", [piece], [static_shape(piece)[p] for p in perm], x.dtype, perm=perm)
                     for piece in slices]
            builder.op("Concat", moved, out=y, axis=axis)
            yield builder.finish()


def gather_scalar_to_slice(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A Gather of one constant scalar index (x[:, i] in exporters' code) is a Slice of width one
    along its axis followed by a relabel that drops that axis: the NPU's Gather takes rank-1
    indices only (oplist V2.3.2, Gather: "Indices ... rank = 1")."""
    x, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape, index = static_shape(x), constant_value(indices)
    if shape is None or index is None or index.ndim != 0 or site.opset < 10:
        return
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    start = int(index) % shape[axis]
    builder = site.builder(node)
    sliced_shape = [1 if a == axis else d for a, d in enumerate(shape)]
    bounds = [builder.const(np.array([v], dtype=np.int64), hint) for v, hint in
              ((start, "starts"), (start + 1, "ends"), (axis, "axes"))]
    sliced = builder.op("Slice", [x, *bounds], sliced_shape, x.dtype)
    builder.reshape(sliced, static_shape(y), out=y)
    yield builder.finish()


#: Most copies broadcast_by_concat makes of one operand along one axis.
BROADCAST_COPIES = 64
BINARY_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def broadcast_by_concat(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A binary element-wise op whose broadcast is none of the NPU's Expand patterns (oplist
    V2.3.2, Expand; Add/Mul/Div/Max inherit them), with both operands made full-sized first: a
    constant operand is stored broadcast, a computed one is repeated by a Concat along each
    broadcast axis (as many copies as that axis has, at most 64). Equal shapes need no broadcast."""
    out_shape = static_shape(node.outputs[0])
    operands = [t for t in node.inputs if t.name]
    if out_shape is None or len(operands) != 2 or any(static_shape(t) is None for t in operands):
        return
    builder = site.builder(node)
    full = []
    for operand in operands:
        shape = list(static_shape(operand))
        shape = [1] * (len(out_shape) - len(shape)) + shape
        value = constant_value(operand)
        if value is not None:
            full.append(operand if value.size == 1 else builder.const(np.broadcast_to(value, out_shape), "full"))
            continue
        tensor = operand if len(shape) == len(static_shape(operand)) else builder.reshape(operand, shape)
        for axis, (have, want) in enumerate(zip(shape, out_shape)):
            if have == want:
                continue
            if have != 1 or want > BROADCAST_COPIES:
                return
            shape[axis] = want
            tensor = builder.op("Concat", [tensor] * want, list(shape), operand.dtype, axis=axis)
        full.append(tensor)
    builder.op(node.op, full, out=node.outputs[0], **node.attrs)
    yield builder.finish()


def transpose_of_unit_axes_to_reshape(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """A Transpose that moves only axes of size 1 keeps every element where it was in a
    row-major tensor: it is a relabel, and runs (and collapses with its neighbours) as a Reshape."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    if shape is None or y_shape is None:
        return
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    moved = [axis for axis in perm if shape[axis] != 1]
    if moved != sorted(moved):
        return
    builder = site.builder(node)
    builder.reshape(x, y_shape, out=y)
    yield builder.finish()


#: Activations the NPU fuses after a convolution (oplist V2.3.2: ConvolutionRelu, ...Clip,
#: ...Sigmoid, ...Tanh, ...HardSigmoid, ...HardSwish, ...LeakyRelu, ...Elu, ...Softplus).
CONV_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu",
                              "Elu", "Softplus"})


def elementwise_in_conv_layout(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """An activation of a relabelled Conv output, or an Add of one and a tensor of the same
    shape (a residual), done in the Conv's own [L, C, 1, 1] layout and relabelled after, so the
    Conv and the op run as one kernel (oplist V2.3.2: ConvolutionAdd, ConvolutionTanh, ...), as
    rknn-toolkit2 runs fully connected and transformer layers. Element-wise ops commute with
    relabelling every operand alike; constants of one element need no relabel."""
    y_shape = static_shape(node.outputs[0])
    operands = [t for t in node.inputs if t.name]
    for position, relabelled in enumerate(operands):
        relabel = _producer(relabelled)
        if (relabel is None or relabel.op not in RESHAPE_LIKE or len(relabelled.outputs) != 1
                or relabelled.name in site.graph_outputs or static_shape(relabelled) != y_shape):
            continue
        source = relabel.inputs[0]
        conv = _producer(source)
        if conv is None or conv.op != "Conv":
            continue
        others = operands[:position] + operands[position + 1:]
        builder = site.builder(node)
        inputs = []
        for operand in node.inputs:
            if operand is relabelled:
                inputs.append(source)
            elif not operand.name or (isinstance(operand, gs.Constant) and constant_value(operand).size == 1):
                inputs.append(operand)
            elif node.op == "Add" and not isinstance(operand, gs.Constant) and static_shape(operand) == y_shape:
                inputs.append(builder.reshape(operand, static_shape(source)))
            else:
                return
        if node.op == "Add" and not others:
            return
        result = builder.op(node.op, inputs, static_shape(source), source.dtype, **node.attrs)
        builder.reshape(result, y_shape, out=node.outputs[0])
        yield builder.finish(node, relabel)
        return


def collapse_relabels(node: gs.Node, site: Site) -> Iterator[Replacement]:
    """Squeeze/Unsqueeze/Flatten/Reshape only relabel a row-major tensor, so a relabel of a
    relabel is one Reshape from the first input, and one whose output shape equals that input's
    is no node at all: its readers read the input (the node is 'removed' in the plan). The first
    relabel goes with it when this was its only reader, and a relabel nobody reads any more
    goes too. Rewrites leave such pairs behind wherever they wrap an op in relabels."""
    y = node.outputs[0]
    y_shape = static_shape(y)
    if y_shape is None:
        return
    source = node.inputs[0]
    earlier = _producer(source)
    relabelled = earlier is not None and earlier.op in RESHAPE_LIKE and static_shape(earlier.inputs[0]) is not None
    only_reader = relabelled and len(source.outputs) == 1 and source.name not in site.graph_outputs
    replaced = (earlier, node) if only_reader else (node,)
    origin = earlier.inputs[0] if relabelled else source
    builder = site.builder(node)
    if not y.outputs and y.name not in site.graph_outputs:
        yield builder.finish(*replaced)
    elif static_shape(origin) == y_shape and y.name not in site.graph_outputs:
        yield builder.finish(*replaced, aliases=((y, origin),))
    elif relabelled:
        builder.reshape(origin, y_shape, out=y)
        yield builder.finish(*replaced)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(fold_batchnorm_into_conv, frozenset({"BatchNormalization"}), always=True),
    RewriteRule(batchnorm_to_mul_add, frozenset({"BatchNormalization"})),
    RewriteRule(sub_constant_to_add, frozenset({"Sub"}), always=True),
    RewriteRule(div_constant_to_mul, frozenset({"Div"}), always=True),
    RewriteRule(gemm_to_conv, frozenset({"Gemm"}), always=True),
    RewriteRule(matmul_constant_to_conv, frozenset({"MatMul"}), always=True),
    RewriteRule(matmul_k_split, frozenset({"MatMul"})),
    RewriteRule(pow_to_mul_chain, frozenset({"Pow"})),
    RewriteRule(hardsigmoid_to_native, frozenset({"HardSigmoid"})),
    RewriteRule(elu_to_native, frozenset({"Elu"})),
    RewriteRule(maxpool_ceil_to_pads, frozenset({"MaxPool"})),
    RewriteRule(average_pool_excluding_pads, frozenset({"AveragePool"})),
    RewriteRule(sum_to_adds, frozenset({"Sum"})),
    RewriteRule(lrn_to_conv_and_pows, frozenset({"LRN"})),
    RewriteRule(global_pool_to_stages, frozenset({"GlobalAveragePool", "GlobalMaxPool"})),
    RewriteRule(reducemean_to_global_pool, frozenset({"ReduceMean"})),
    RewriteRule(layernorm_to_channel_axis, frozenset({"LayerNormalization"})),
    RewriteRule(softmax_to_supported_axis, frozenset({"Softmax"})),
    RewriteRule(lift_to_4d, ELEMENTWISE),
    RewriteRule(transpose_to_4d, frozenset({"Transpose"})),
    RewriteRule(transpose_in_slices, frozenset({"Transpose"})),
    RewriteRule(transpose_small_axis_as_concat, frozenset({"Transpose"})),
    RewriteRule(gather_scalar_to_slice, frozenset({"Gather"})),
    RewriteRule(broadcast_by_concat, BINARY_ELEMENTWISE, late=True),
    RewriteRule(transpose_of_unit_axes_to_reshape, frozenset({"Transpose"}), always=True),
    RewriteRule(elementwise_in_conv_layout, frozenset({"Add"}) | CONV_ACTIVATIONS, always=True),
    RewriteRule(collapse_relabels, RESHAPE_LIKE, always=True),
)
