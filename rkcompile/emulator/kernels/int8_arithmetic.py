"""The accumulating int8 kernels: integer operands with their zero points subtracted, exact
integer sums, and the real scale of the result (rkcompile/emulator/int8.py requantizes it).

The sums are formed with float64 BLAS on integer-valued arrays: every product of two int8
differences is below 2^16 and every sum below 2^53, so the float64 result is the exact integer
an int32 accumulator holds (saturated to int32 if it ever left it). Padding is real zero, which
after the zero-point subtraction is the integer 0, so borders are exact too.
"""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.int8 import Accumulator, QTensor, exact_integers, register_int8, saturate_int32
from rkcompile.emulator.kernels.conv import convolve

#: Add/Sub align both operands to a common scale of max(scale) / 2^ALIGN_BITS, integer
#: multipliers of at most 2^16, before adding.
ALIGN_BITS = 16


def _bias_integers(bias: QTensor | None, scale: np.ndarray, channels: int, ndim: int) -> np.ndarray | int:
    """The int32 bias on the accumulator's scale (the plan gives it exactly that scale; a bias
    shared by convolutions of different input scales is rescaled, rounding half to even)."""
    if bias is None:
        return 0
    values = bias.centered().reshape(-1)
    stored = np.broadcast_to(np.asarray(bias.quant.scales, np.float64), values.shape)
    wanted = np.broadcast_to(scale.reshape(-1), (channels,))
    if not np.allclose(stored, wanted, rtol=1e-12, atol=0):
        values = np.rint(values * stored / wanted).astype(np.int64)
    return values.reshape((1, -1) + (1,) * (ndim - 2))


@register_int8("Conv")
def conv(node, inputs, opset) -> Accumulator:
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    values = exact_integers(convolve(node, x.centered().astype(np.float64), weight.centered().astype(np.float64)))
    scale = x.quant.scales[0] * weight.scales(values.ndim, axis=1)
    if weight.quant.axis is None:
        scale = np.full((1, values.shape[1]) + (1,) * (values.ndim - 2), scale)
    return Accumulator(saturate_int32(values + _bias_integers(bias, scale, values.shape[1], values.ndim)), scale)


@register_int8("MatMul")
def matmul(node, inputs, opset) -> Accumulator:
    a, b = inputs
    values = exact_integers(a.centered().astype(np.float64) @ b.centered().astype(np.float64))
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
