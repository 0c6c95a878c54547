"""Element-wise rewrites: constants folded into the cheaper op, exponents and activation
parameters the NPU lacks expressed with those it has, ranks lifted to 4-D, and broadcasts the
NPU's Expand patterns do not cover made explicit."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape

from rkcompile.passes.rewrites.base import (Candidates, RewriteRule, Site, clip, conv_1x1, float_constant, producer,
    scalar)


ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where", "Relu", "LeakyRelu", "PRelu", "Sigmoid",
    "Tanh", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Gelu", "Mish", "Clip",
})


def pow_to_mul_chain(node: gs.Node, site: Site) -> Candidates:
    """x^n for an integer n >= 4 as square-and-multiply Muls (at most 2*log2(n) of them): the NPU's
    Pow takes only the exponents 0, 1, 2, 3, 0.5 and -0.5 (seed 000, Pow)."""
    base, exponent = node.inputs[0], node.inputs[1]
    value = constant_value(exponent)
    shape = static_shape(node.outputs[0])
    if value is None or value.size != 1 or shape is None or static_shape(base) != shape:
        return "the exponent is not one constant, or the shapes are unknown or broadcast"
    power = float(value.reshape(-1)[0])
    if power != int(power) or power < 4:
        return f"exponent {power:g} is not an integer of at least 4"
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


def sub_constant_to_add(node: gs.Node, site: Site) -> Candidates:
    """x - c as x + (-c): Add broadcasts like Expand and runs on several cores, while Sub takes only
    [b,c,1,1] or scalar operands and no multi-core (oplist V2.3.2, RK3588, Sub and Add)."""
    value = float_constant(node.inputs[1])
    if value is None or constant_value(node.inputs[0]) is not None:
        return "the subtrahend is not a float constant, or both operands are constant"
    builder = site.builder(node)
    builder.op("Add", [node.inputs[0], builder.const(-value)], out=node.outputs[0])
    yield builder.finish()


def div_constant_to_mul(node: gs.Node, site: Site) -> Candidates:
    """x / c as x * (1/c): the NPU's Div computes in float16 only (seed 000, Div), its Mul in int8
    and float16 and on several cores (oplist V2.3.2, Mul)."""
    value = float_constant(node.inputs[1])
    if value is None or constant_value(node.inputs[0]) is not None or not np.all(value != 0):
        return "the divisor is not a nonzero float constant, or both operands are constant"
    reciprocal = (1 / value).astype(value.dtype)
    if not np.all(np.isfinite(reciprocal)):
        return "the reciprocal of the divisor overflows"
    builder = site.builder(node)
    builder.op("Mul", [node.inputs[0], builder.const(reciprocal, "reciprocal")], out=node.outputs[0])
    yield builder.finish()


def constant_operands_as_one(node: gs.Node, site: Site) -> Candidates:
    """(x + a) + b or (x * a) * b, a and b float constants and the inner result read by the
    outer op alone, as x + (a + b) or x * (a * b): one op fewer. An attention's scores take a
    relative position bias and then a shifted window's mask this way (Swin's shifted blocks),
    and exSDPAttention takes one mask (seed 001, exSDPAttention: mask), so the two addends as
    one let the attention fuse; a rotary embedding's rotation as a Gather and its signs
    (signed_moves) takes sin as a second factor. Kept where a + b (a * b) is no larger than the
    result (it broadcasts into it)."""
    inner = producer(node.inputs[0]) if node.inputs else None
    outer_operand = float_constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if inner is None or inner.op != node.op or outer_operand is None or len(node.inputs[0].outputs) != 1 \
            or node.inputs[0].name in site.graph_outputs:
        return f"not a {node.op} of a constant to the {node.op} of a tensor and a constant read by it alone"
    x, inner_operand = inner.inputs[0], float_constant(inner.inputs[1])
    shape = static_shape(node.outputs[0])
    if inner_operand is None or constant_value(x) is not None or shape is None \
            or inner_operand.dtype != outer_operand.dtype:
        return (f"the inner {node.op}'s second operand is not a float constant of the same type, "
                "or its first is constant")
    joined = inner_operand + outer_operand if node.op == "Add" else inner_operand * outer_operand
    if np.broadcast_shapes(static_shape(x), joined.shape) != tuple(shape) or joined.ndim > len(shape):
        return f"the constants' {node.op} {list(joined.shape)} does not broadcast into {shape}"
    builder = site.builder(node)
    builder.op(node.op, [x, builder.const(joined, "operands")], out=node.outputs[0])
    yield builder.finish(inner, node)


def neg_to_mul(node: gs.Node, site: Site) -> Candidates:
    """-x as x * -1, exact in every float format (only the sign bit changes): Neg is not on the
    NPU (oplist V2.3.2, RKNNToolKit2_OP_Support: Neg "Not Supported"), Mul is. Rotary
    embeddings' rotate_half negates half of every query and key."""
    x = node.inputs[0]
    if dtype_name(x.dtype) not in FLOAT_DTYPES:
        return f"the input is {dtype_name(x.dtype)}, not floating point"
    builder = site.builder(node)
    builder.op("Mul", [x, scalar(builder, -1.0, x)], out=node.outputs[0])
    yield builder.finish()


def hardsigmoid_to_native(node: gs.Node, site: Site) -> Candidates:
    """HardSigmoid(x; a, b) = clip(a*x + b, 0, 1) with other a, b than the NPU's 1/6 and 0.5
    (seed 001, HardSigmoid): first as the native HardSigmoid of 6a*x + 6b - 3, else as
    Clip(6a*x + 6b, 0, 6) / 6, the ReLU6 form of oplist V2.3.2 Clip/ReLU6."""
    alpha, beta = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
    native_alpha = site.target.rule_parameter("HardSigmoid", "hard_sigmoid_constants", "alpha")
    native_beta = site.target.rule_parameter("HardSigmoid", "hard_sigmoid_constants", "beta")
    if native_alpha is None:
        return f"{site.target.name} has no HardSigmoid kernel to rewrite onto"
    if np.allclose((alpha, beta), (native_alpha, native_beta), rtol=1e-6, atol=0):
        return "alpha and beta are already the NPU's own"
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None:
        return "the input shape is unknown"
    native = site.builder(node)
    # native_alpha * (s*x + t) + native_beta = alpha*x + beta
    scale, shift = alpha / native_alpha, (beta - native_beta) / native_alpha
    scaled = native.op("Mul", [x, scalar(native, scale, x)], shape, x.dtype)
    shifted = native.op("Add", [scaled, scalar(native, shift, x)], shape, x.dtype)
    native.op("HardSigmoid", [shifted], out=y, alpha=float(np.float32(native_alpha)), beta=float(native_beta))
    yield native.finish()
    relu6 = site.builder(node)
    scaled = relu6.op("Mul", [x, scalar(relu6, 6 * alpha, x)], shape, x.dtype)
    shifted = relu6.op("Add", [scaled, scalar(relu6, 6 * beta, x)], shape, x.dtype)
    clipped = clip(relu6, shifted, 0.0, 6.0, shape)
    relu6.op("Mul", [clipped, scalar(relu6, 1 / 6, x)], out=y)
    yield relu6.finish()


def elu_to_native(node: gs.Node, site: Site) -> Candidates:
    """Elu with alpha a != 1 as a*Elu1(x) + (1-a)*Relu(x): both terms are x for x >= 0, and for
    x < 0 the sum is a*(exp(x)-1). The NPU's Elu has alpha = 1 only (seed 001, Elu)."""
    alpha = float(node.attrs.get("alpha", 1.0))
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if alpha == 1.0 or shape is None:
        return "alpha is already 1" if alpha == 1.0 else "the input shape is unknown"
    builder = site.builder(node)
    elu = builder.op("Elu", [x], shape, x.dtype, alpha=1.0)
    relu = builder.op("Relu", [x], shape, x.dtype)
    scaled_elu = builder.op("Mul", [elu, scalar(builder, alpha, x)], shape, x.dtype)
    scaled_relu = builder.op("Mul", [relu, scalar(builder, 1 - alpha, x)], shape, x.dtype)
    builder.op("Add", [scaled_elu, scaled_relu], out=y)
    yield builder.finish()


def _bounded_by_scalar(node: gs.Node) -> tuple[gs.Tensor, float] | None:
    """(x, c) when `node` is a two-input Min or Max of x and a one-value float constant c."""
    if len(node.inputs) != 2:
        return None
    values = [float_constant(t) for t in node.inputs]
    for x, value in ((node.inputs[0], values[1]), (node.inputs[1], values[0])):
        if value is not None and value.size == 1 and constant_value(x) is None:
            return x, float(value.reshape(-1)[0])
    return None


def min_max_to_clip(node: gs.Node, site: Site) -> Candidates:
    """Min(Max(x, lo), hi) and Max(Min(x, hi), lo) with constant bounds lo <= hi as Clip(x, lo,
    hi), and Max(x, 0) as Relu: how tf2onnx and paddle2onnx write ReLU6 and ReLU, and the forms
    the NPU fuses with a Conv before them (oplist V2.3.2, ConvolutionClip, ConvolutionRelu). A
    Max(x, 0) visited first is a Relu by the time its Min is, so Min(Relu(x), hi) counts too."""
    bounded = _bounded_by_scalar(node)
    if bounded is None:
        return "not a Min or Max of a tensor and one constant value"
    inner_tensor, bound = bounded
    inner = inner_tensor.inputs[0] if len(inner_tensor.inputs) == 1 else None
    sole = inner is not None and len(inner_tensor.outputs) == 1 and inner_tensor.name not in site.graph_outputs
    opposite = {"Min": "Max", "Max": "Min"}[node.op]
    inner_bounded = _bounded_by_scalar(inner) if sole and inner.op == opposite else None
    if sole and node.op == "Min" and inner.op == "Relu":
        inner_bounded = (inner.inputs[0], 0.0)
    shape = static_shape(node.outputs[0])
    if inner_bounded is not None and shape is not None and static_shape(inner_bounded[0]) == shape:
        x, other = inner_bounded
        low, high = (other, bound) if node.op == "Min" else (bound, other)
        if low <= high:
            builder = site.builder(node)
            clip(builder, x, low, high, shape, out=node.outputs[0])
            yield builder.finish(inner, node)
            return None
    if node.op == "Max" and bound == 0.0 and shape is not None and static_shape(inner_tensor) == shape:
        builder = site.builder(node)
        builder.op("Relu", [inner_tensor], out=node.outputs[0])
        yield builder.finish()
        return None
    return "not a Min of a Max (or the reverse) by constant bounds lo <= hi, nor a Max with 0"


def sum_to_adds(node: gs.Node, site: Site) -> Candidates:
    """Sum of several inputs (opset 8 exporters' residual adds) as a chain of Adds: the NPU has
    Add, not Sum (oplist V2.3.2 lists Add only)."""
    operands = [t for t in node.inputs if t.name]
    if len(operands) < 2 or static_shape(node.outputs[0]) is None:
        return "fewer than two operands, or the output shape is unknown"
    builder = site.builder(node)
    total = operands[0]
    for index, operand in enumerate(operands[1:], start=2):
        last = index == len(operands)
        total = builder.op("Add", [total, operand], static_shape(node.outputs[0]), node.outputs[0].dtype,
                           out=node.outputs[0] if last else None)
    yield builder.finish()


def lift_to_4d(node: gs.Node, site: Site) -> Candidates:
    """An element-wise op on tensors of rank 1 to 3 run on 4-D tensors: every operand gets leading
    1s up to [1, ..., dims] (which never changes NumPy broadcasting), the result is relabelled
    back. The NPU's operators take [batch, channel, height, width] only (oplist V2.3.2)."""
    shapes = [static_shape(t) for t in node.inputs if t.name] + [static_shape(t) for t in node.outputs]
    if any(s is None for s in shapes) or not 1 <= max(len(s) for s in shapes) <= 3:
        return "a shape is unknown, or the op is not of rank 1 to 3"
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


#: Most copies broadcast_by_concat makes of one operand along one axis.
BROADCAST_COPIES = 64


BINARY_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def broadcast_by_concat(node: gs.Node, site: Site) -> Candidates:
    """A binary element-wise op whose broadcast is none of the NPU's Expand patterns (oplist
    V2.3.2, Expand; Add/Mul/Div/Max inherit them), with operands made full-sized first: a
    constant operand is stored broadcast, a computed one is repeated by a Concat along each
    broadcast axis (as many copies as that axis has, at most 64), or along the channel axis of a
    float operand by a 1x1 Conv of ones from its one channel to all of them (x * 1, exact;
    rknn-toolkit2 broadcasts a LayerNorm's mean over 512 channels so): always at rank 4, where a
    one-channel tensor fills a whole C2 block of NC1HWC2 and a Concat of k copies reads k blocks
    where the Conv reads one; at rank 2 or 3, whose 4-D view costs two relabels, only to more
    channels than a Concat copies. Where both operands broadcast, one made full-sized may be
    enough, the other broadcast as the NPU does (FocalNet's [1, C, 1, 1] context times its
    [1, 1, H, W] gate: the gate repeated over the channels, the context per channel): those
    candidates come first, the one of fewer repeating steps first, then both full-sized. Equal
    shapes need no broadcast."""
    out_shape = static_shape(node.outputs[0])
    operands = [t for t in node.inputs if t.name]
    if out_shape is None or len(operands) != 2 or any(static_shape(t) is None for t in operands):
        return "not two operands of known shape"
    broadcast = [t for t in operands if _with_leading_ones(static_shape(t), out_shape) != list(out_shape)]
    problems = {id(t): _repeat_problem(t, out_shape) for t in broadcast}
    repeatable = [t for t in broadcast if not problems[id(t)]]
    alone = sorted(repeatable, key=lambda t: _repeat_steps(t, out_shape)) if len(broadcast) == 2 else []
    choices = [[t] for t in alone]
    choices += [broadcast] if len(repeatable) == len(broadcast) else []
    for repeated in choices:
        builder = site.builder(node)
        full = [_repeated(builder, t, out_shape) if any(t is r for r in repeated) else t for t in operands]
        builder.op(node.op, full, out=node.outputs[0], **node.attrs)
        yield builder.finish()
    return next((problem for problem in problems.values() if problem), None)


def _with_leading_ones(shape, out_shape) -> list[int]:
    return [1] * (len(out_shape) - len(shape)) + list(shape)


def _by_conv(operand: gs.Tensor, shape: list[int], out_shape, axis: int) -> bool:
    """Whether `_repeated` repeats `operand` (of `shape`, its rank lifted) along `axis` by a 1x1
    Conv of ones: its one channel to many, at rank 4 or to more channels than a Concat copies."""
    return (axis == 1 and shape[1] == 1 and (len(shape) == 4 or out_shape[1] > BROADCAST_COPIES)
            and 2 <= len(shape) <= 4 and dtype_name(operand.dtype) in FLOAT_DTYPES)


def _repeat_problem(operand: gs.Tensor, out_shape) -> str | None:
    """Why `_repeated` cannot make `operand` full-sized, None when it can."""
    if constant_value(operand) is not None:
        return None
    shape = _with_leading_ones(static_shape(operand), out_shape)
    for axis, (have, want) in enumerate(zip(shape, out_shape)):
        if have != want and not _by_conv(operand, shape, out_shape, axis) and (have != 1 or want > BROADCAST_COPIES):
            return (f"operand {operand.name} broadcasts axis {axis} from {have} to {want}: not from 1, or over "
                    f"{BROADCAST_COPIES} copies")
    return None


def _repeat_steps(operand: gs.Tensor, out_shape) -> int:
    """The steps `_repeated` makes: one per broadcast axis of a computed operand, none for a constant."""
    if constant_value(operand) is not None:
        return 0
    shape = _with_leading_ones(static_shape(operand), out_shape)
    return sum(have != want for have, want in zip(shape, out_shape))


def _repeated(builder, operand: gs.Tensor, out_shape) -> gs.Tensor:
    """`operand` made `out_shape`-sized (`_repeat_problem` says it can be): a constant stored
    broadcast, a computed tensor repeated along each broadcast axis."""
    value = constant_value(operand)
    if value is not None:
        return operand if value.size == 1 else builder.const(np.broadcast_to(value, out_shape), "full")
    shape = _with_leading_ones(static_shape(operand), out_shape)
    tensor = operand if len(shape) == len(static_shape(operand)) else builder.reshape(operand, shape)
    for axis, want in enumerate(out_shape):
        if shape[axis] == want:
            continue
        by_conv = _by_conv(operand, shape, out_shape, axis)
        shape[axis] = want
        tensor = (_channels_by_conv(builder, tensor, list(shape)) if by_conv
                  else builder.op("Concat", [tensor] * want, list(shape), operand.dtype, axis=axis))
    return tensor


def _channels_by_conv(builder, x: gs.Tensor, shape: list[int]) -> gs.Tensor:
    """`x`, of one channel, repeated to `shape`'s channels by a 1x1 Conv of ones on its 4-D view
    (N, 1, H, W); a tensor of rank 2 or 3 is viewed and relabelled back as the NPU stores it."""
    spatial = shape[2:] + [1] * (4 - len(shape))
    view = x if len(shape) == 4 else builder.reshape(x, [shape[0], 1, *spatial])
    ones = np.ones((shape[1], 1), dtype_name(x.dtype))
    repeated = conv_1x1(builder, view, ones, None, [shape[0], shape[1], *spatial])
    return repeated if len(shape) == 4 else builder.reshape(repeated, shape)


def expand_into_broadcast(node: gs.Node, site: Site) -> Candidates:
    """An Expand read only by binary element-wise ops whose other operand has the expanded shape
    already: each reads the Expand's input instead and broadcasts it itself, to the same result
    (ONNX's broadcasting is the Expand's). timm's SwiftFormer normalizes each token's weight by
    one norm written `x / norm.expand_as(x)`: an Expand step and a Div of two full tensors,
    which rknn-toolkit2 runs on its CPU where it runs the broadcast Div on its NPU. A reader
    the NPU cannot broadcast so makes the candidate fail, and the Expand stays."""
    source, expanded = node.inputs[0], node.outputs[0]
    shape = static_shape(expanded)
    readers = list(expanded.outputs)
    if shape is None or static_shape(source) is None or not readers or expanded.name in site.graph_outputs:
        return "its shapes are unknown, it is a model output or nothing reads it"
    for reader in readers:
        others = [t for t in reader.inputs if t is not expanded]
        if (reader.op not in BINARY_ELEMENTWISE or len(reader.inputs) != 2 or len(others) != 1
                or static_shape(others[0]) != shape):
            return f"{reader.op} {reader.name} is not a binary element-wise op whose other operand has its shape"
    builder = site.builder(node)
    for reader in readers:
        inputs = [source if t is expanded else t for t in reader.inputs]
        builder.op(reader.op, inputs, out=reader.outputs[0], **reader.attrs)
    yield builder.finish(node, *readers)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(sub_constant_to_add, frozenset({"Sub"}), always=True),
    RewriteRule(div_constant_to_mul, frozenset({"Div"}), always=True),
    RewriteRule(constant_operands_as_one, frozenset({"Add", "Mul"}), always=True),
    RewriteRule(neg_to_mul, frozenset({"Neg"})),
    RewriteRule(pow_to_mul_chain, frozenset({"Pow"})),
    RewriteRule(hardsigmoid_to_native, frozenset({"HardSigmoid"})),
    RewriteRule(elu_to_native, frozenset({"Elu"})),
    RewriteRule(sum_to_adds, frozenset({"Sum"})),
    RewriteRule(min_max_to_clip, frozenset({"Min", "Max"}), always=True),
    RewriteRule(expand_into_broadcast, frozenset({"Expand"}), always=True),
    RewriteRule(lift_to_4d, ELEMENTWISE),
    RewriteRule(broadcast_by_concat, BINARY_ELEMENTWISE, late=True),
    # again once broadcast_by_concat has made a product legal that broadcasts its constant over
    # heads (a rotary embedding's sin, which its rotation's signs then join)
    RewriteRule(constant_operands_as_one, frozenset({"Mul"}), always=True, late=True),
)
