"""Element-wise activations and unary math in float32, vectorised over the whole tensor.

Erf uses Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, far under float16's
resolution) so the emulator needs nothing beyond numpy."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import IN_PLACE, attr, register


#: elements per block of erf's float64 arithmetic: its three float64 buffers (192 KiB) stay in
#: the core's cache, where the whole-map temporaries (about twenty, most of 8 bytes an element)
#: went to memory
ERF_BLOCK = 8192
#: A&S 7.1.26's p, and its coefficients a5 ... a1 in Horner's order
ERF_P = 0.3275911
ERF_COEFFICIENTS = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def erf(x: np.ndarray) -> np.ndarray:
    """sign(x) * (1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-x^2)), t = 1 / (1 + p |x|),
    in float64, rounded once to x's dtype. Computed over blocks of ERF_BLOCK elements in x's
    memory order, in buffers reused from block to block: each element sees the same operations
    in the same order as the whole-array expression, so the bits are that expression's (a NaN
    stays a NaN; its sign bit, which numpy's loops never kept alike, is not kept either). The
    result has x's memory order, as numpy's element-wise ops give it."""
    out = np.empty_like(x)
    source, target = _in_memory_order(x), _in_memory_order(out)
    if source is None or target is None:
        out = np.empty(x.shape, x.dtype)
        source, target = np.ascontiguousarray(x).reshape(-1), out.reshape(-1)
    size = min(source.size, ERF_BLOCK)
    magnitude, t, poly, sign = np.empty(size), np.empty(size), np.empty(size), np.empty(size, x.dtype)
    for start in range(0, source.size, ERF_BLOCK):
        block = source[start:start + ERF_BLOCK]
        n = block.size
        a, tb, pb, sb = magnitude[:n], t[:n], poly[:n], sign[:n]
        np.abs(block, out=a)
        np.multiply(a, ERF_P, out=tb)
        tb += 1.0
        np.divide(1.0, tb, out=tb)
        np.multiply(tb, ERF_COEFFICIENTS[0], out=pb)
        for coefficient in ERF_COEFFICIENTS[1:]:
            pb += coefficient
            np.multiply(tb, pb, out=pb)
        np.multiply(a, a, out=a)
        np.negative(a, out=a)
        np.exp(a, out=a)
        np.multiply(pb, a, out=pb)
        np.subtract(1.0, pb, out=pb)
        np.multiply(np.sign(block, out=sb), pb, out=pb)
        target[start:start + n] = pb
    return out


def _in_memory_order(values: np.ndarray) -> np.ndarray | None:
    """`values`' elements as one flat view in the order they lie in memory; None when they do
    not lie in one dense run."""
    axes = sorted(range(values.ndim), key=lambda axis: values.strides[axis], reverse=True)
    ordered = values.transpose(axes)
    return ordered.reshape(-1) if ordered.flags.c_contiguous else None


def sigmoid(x: np.ndarray) -> np.ndarray:
    # 1 / (1 + e) for x >= 0 and e / (1 + e) below, with e = exp(-|x|) in both (below 0, -|x| is
    # x): exp of non-positive numbers only, so large |x| cannot overflow; one exp per element
    # (exp(min(x, 0)) for the numerator was a second, of the same values below 0); and the
    # numerator max(e, x >= 0) is 1 for x >= 0 (e <= 1 there) and e below without np.where,
    # whose data-dependent selection costs more than an exp on a whole map; -|x| as
    # negative(abs(x)), two sign-bit passes numpy vectorises (copysign(x, -1), the same bits
    # NaN included, has no vectorised loop: 1.0 against 0.36 ms on a 1.2M-element map)
    e = np.abs(x)
    np.negative(e, out=e)
    np.exp(e, out=e)
    denominator = e + 1
    return np.divide(np.maximum(e, x >= 0, out=e), denominator, out=e)


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.maximum(x, 0), bit for bit on every float32 but a signaling NaN, which this quiets (no
    arithmetic makes one, nor onnxruntime's float16 conversion; only an input holding one, read
    through numpy's conversion of a small tensor, could bring one), as clip(x, 0, inf) + 0: numpy's clip is 3-4x
    faster than its maximum against a scalar (0.23 against 0.8-1 ms on a 1.2M-element map),
    and the + 0 turns clip's -0.0 into maximum's +0.0."""
    if x.dtype != np.float32:
        return np.maximum(x, 0, out=out)
    result = np.clip(x, np.float32(0), np.float32(np.inf), out=out)
    return np.add(result, np.float32(0), out=result)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _hard_sigmoid(node, x):
    return np.clip(np.float32(attr(node, "alpha", 0.2)) * x + np.float32(attr(node, "beta", 0.5)), 0, 1)


def _gelu(node, x):
    if attr(node, "approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x ** 3)))
    return 0.5 * x * (1 + erf(x / np.float32(np.sqrt(2))))


UNARY = {
    "Relu": lambda node, x: relu(x),
    "LeakyRelu": lambda node, x: np.where(x >= 0, x, np.float32(attr(node, "alpha", 0.01)) * x),
    "Sigmoid": lambda node, x: sigmoid(x),
    "Tanh": lambda node, x: np.tanh(x),
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda node, x: x * np.clip(x / 6 + np.float32(0.5), 0, 1),
    "Elu": lambda node, x: np.where(x >= 0, x, np.float32(attr(node, "alpha", 1.0)) * np.expm1(x)),
    "Selu": lambda node, x: np.float32(attr(node, "gamma", 1.0507009873554805)) * np.where(
        x > 0, x, np.float32(attr(node, "alpha", 1.6732632423543772)) * np.expm1(x)),
    "Softplus": lambda node, x: softplus(x),
    "Softsign": lambda node, x: x / (1 + np.abs(x)),
    "Mish": lambda node, x: x * np.tanh(softplus(x)),
    "Gelu": _gelu,
    "Erf": lambda node, x: erf(x),
    "Exp": lambda node, x: np.exp(x),
    "Log": lambda node, x: np.log(x),
    "Sqrt": lambda node, x: np.sqrt(x),
    "Reciprocal": lambda node, x: 1 / x,
    "Abs": lambda node, x: np.abs(x),
    "Neg": lambda node, x: -x,
    "Sin": lambda node, x: np.sin(x),
    "Cos": lambda node, x: np.cos(x),
    "Floor": lambda node, x: np.floor(x),
    "Ceil": lambda node, x: np.ceil(x),
    "Sign": lambda node, x: np.sign(x),
}


def _unary(node, inputs, opset):
    return [UNARY[node.op](node, inputs[0])]


register(*UNARY)(_unary)


@register("PRelu")
def prelu(node, inputs, opset):
    x, slope = inputs[0], inputs[1]
    if slope.ndim == 1 and slope.size > 1 and slope.size != x.shape[-1] and x.ndim > 1 \
            and x.shape[1] == slope.size:
        # a per-channel slope from opset < 7 exporters, which onnx.reference also accepts
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return [np.where(x >= 0, x, x * slope)]


@register("Clip")
def clip(node, inputs, opset):
    x = inputs[0]
    low, high = _clip_bounds(node, inputs, opset)
    return [np.clip(x, low, high).astype(x.dtype, copy=False)]


def _clip_bounds(node, inputs, opset):
    if opset < 11:
        return attr(node, "min", -np.inf), attr(node, "max", np.inf)
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else -np.inf
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.inf
    return low, high


@register("Clip", "Relu", table=IN_PLACE)
def clip_or_relu_in_place(node, inputs, opset, spent):
    """Clip and Relu into their spent float32 input: the same values (a float64 bound computes
    in float64 and rounds into the float32 result, as `clip`'s astype does)."""
    x = inputs[0]
    if 0 not in spent or x.dtype != np.float32:
        return None
    if node.op == "Relu":
        return [relu(x, out=x)]
    low, high = _clip_bounds(node, inputs, opset)
    return [np.clip(x, low, high, out=x)]
