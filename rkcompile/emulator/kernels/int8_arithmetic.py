"""The accumulating int8 kernels: integer operands with their zero points subtracted, exact
integer sums, and the real scale of the result (rkcompile/emulator/int8.py requantizes it).

The sums are formed with BLAS on integer-valued arrays: every product of two int8 differences
is below 2^16, and a float type holds every integer up to 2^(its mantissa bits + 1) exactly, so
a sum whose every partial sum stays below that is the exact integer an int32 accumulator holds
(saturated to int32 if it ever left it), in whatever order BLAS adds. float32 (2^24) is twice
as fast as float64 (2^53) and serves when the largest |operand| times the largest sum of
|weights| of one output is below 2^24 (`exact_float`): the bound of every partial sum, in any
order. Padding is real zero, which after the zero-point subtraction is the integer 0, so
borders are exact too.
"""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.int8 import Accumulator, QTensor, register_int8, saturate_int32
from rkcompile.quantization.params import INT32
from rkcompile.emulator.kernels.conv import convolve

#: float32 holds every integer of magnitude up to 2^24 exactly (24-bit significand).
FLOAT32_EXACT = 2 ** 24

#: Add/Sub align both operands to a common scale of max(scale) / 2^ALIGN_BITS, integer
#: multipliers of at most 2^16, before adding.
ALIGN_BITS = 16


def _bias_integers(bias: QTensor, scale: np.ndarray, channels: int, ndim: int) -> tuple[np.ndarray, float]:
    """The int32 bias on the accumulator's scale, as float64 (the plan gives it exactly that
    scale; a bias shared by convolutions of different input scales is rescaled, rounding half to
    even), and its largest magnitude; made once per bias and scale."""
    wanted = np.broadcast_to(scale.reshape(-1), (channels,))

    def make(bias: QTensor) -> tuple[np.ndarray, float]:
        values = bias.centered().reshape(-1)
        stored = np.broadcast_to(np.asarray(bias.quant.scales, np.float64), values.shape)
        if not np.allclose(stored, wanted, rtol=1e-12, atol=0):
            values = np.rint(values * stored / wanted)
        return values.astype(np.float64).reshape((1, -1) + (1,) * (ndim - 2)), float(np.abs(values).max(initial=0))
    return bias.derived(f"bias at {wanted.tobytes().hex()} {ndim}", make)


def exact_float(largest_data: int, weight_sums: np.ndarray) -> type:
    """The float type whose BLAS sums of products of data at most `largest_data` in magnitude
    with weights are exact integers: float32 when that times the largest sum of |weights| one
    output adds (`weight_sums`) bounds every partial sum below FLOAT32_EXACT, else float64
    (exact below 2^53: int32 range sums of products below 2^16)."""
    if not weight_sums.size:
        return np.float64
    return np.float32 if largest_data * float(weight_sums.max()) < FLOAT32_EXACT else np.float64


def integer_sums(sums: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """A BLAS product of integers (`exact_float`) as float64 integers, which hold an int32 and
    a bias added to it exactly, and requantize in fewer passes than int64 (`requantize`), plus
    `bias` (float64 integers) when given: float32's are below 2^24, within int32 already, and
    convert to float64 inside the addition (one pass); float64's are saturated to int32 first."""
    if sums.dtype == np.float32:
        return sums.astype(np.float64) if bias is None else np.add(sums, bias, dtype=np.float64)
    np.clip(sums, *INT32, out=sums)
    if bias is not None:
        sums += bias
    return sums


def _taps(weight: QTensor, axis: int | tuple[int, ...], largest_data: int) -> np.ndarray:
    """A weight's integers less their zero points in the float type `exact_float` picks for data
    at most `largest_data` in magnitude. The sums of |integers| along `axis` (what one output
    adds) and the float32 form are made once per QTensor (a weight's: once per plan), the sums
    from the float32 form (which holds the integers exactly; summed in float64, exactly too):
    half the bytes of an int64 pass; a float64 form, rarely needed, each time."""
    def weight_sums(weight: QTensor) -> np.ndarray:
        taps = np.abs(float32(weight))
        return taps.sum(axis=axis, dtype=np.float64) if taps.ndim > 1 else taps.sum(keepdims=True, dtype=np.float64)

    def float32(weight: QTensor) -> np.ndarray:
        return weight.derived("float32", lambda weight: weight.centered(np.float32))

    exact = exact_float(largest_data, weight.derived(f"sums along {axis}", weight_sums))
    return float32(weight) if exact is np.float32 else weight.centered(exact)


@register_int8("Conv")
def conv(node, inputs, opset) -> Accumulator:
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    taps = _taps(weight, tuple(range(1, weight.values.ndim)), x.largest_centered())
    sums = convolve(node, x.centered(taps.dtype.type), taps)
    scale = x.quant.scales[0] * weight.scales(sums.ndim, axis=1)
    if weight.quant.axis is None:
        scale = np.full((1, sums.shape[1]) + (1,) * (sums.ndim - 2), scale)
    if bias is None:
        return Accumulator(integer_sums(sums), scale)
    integers, largest = _bias_integers(bias, scale, sums.shape[1], sums.ndim)
    values = integer_sums(sums, integers)
    # float32 sums are below 2^24: with a bias that leaves int32 room for them, no sum leaves it
    if taps.dtype != np.float32 or largest > INT32[1] - FLOAT32_EXACT:
        np.clip(values, *INT32, out=values)
    return Accumulator(values, scale)


@register_int8("MatMul")
def matmul(node, inputs, opset) -> Accumulator:
    a, b = inputs
    right = _taps(b, -2, a.largest_centered())
    values = integer_sums(a.centered(right.dtype.type) @ right)
    return Accumulator(values, np.float64(a.quant.scales[0] * b.quant.scales[0]))


@register_int8("Mul")
def mul(node, inputs, opset) -> Accumulator:
    a, b = inputs
    return Accumulator(saturate_int32(a.centered() * b.centered()),
                       a.scales(max(a.values.ndim, b.values.ndim)) * b.scales(max(a.values.ndim, b.values.ndim)))


def _aligned(a: QTensor, b: QTensor) -> tuple[np.ndarray, np.ndarray, float]:
    common = max(max(a.quant.scales), max(b.quant.scales)) / 2 ** ALIGN_BITS
    scale_a = np.rint(a.scales(a.values.ndim) / common).astype(np.int64)
    scale_b = np.rint(b.scales(b.values.ndim) / common).astype(np.int64)
    return a.centered() * scale_a, b.centered() * scale_b, common


@register_int8("Add")
def add(node, inputs, opset) -> Accumulator:
    a, b, common = _aligned(*inputs)
    return Accumulator(saturate_int32(a + b), np.float64(common))


@register_int8("Sub")
def sub(node, inputs, opset) -> Accumulator:
    a, b, common = _aligned(*inputs)
    return Accumulator(saturate_int32(a - b), np.float64(common))


@register_int8("GlobalAveragePool")
def global_average_pool(node, inputs, opset) -> Accumulator:
    (x,) = inputs
    axes = tuple(range(2, x.values.ndim))
    count = int(np.prod([x.values.shape[a] for a in axes]))
    values = x.centered().sum(axis=axes, keepdims=True)
    return Accumulator(saturate_int32(values), np.float64(x.quant.scales[0] / count))
