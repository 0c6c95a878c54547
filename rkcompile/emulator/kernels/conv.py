"""Conv (the oplist's Convolution and Depthwise Convolution) in float32: im2col on a strided
view plus one BLAS matmul per group; a 1x1 stride-1 conv is the matmul alone, and a depthwise
conv sums its kernel taps over the whole map. float32 accumulation, as the NPU accumulates
float16 products in a wider register (docs/emulator.md)."""
from __future__ import annotations

import numpy as np

from ..registry import attr, register
from ._windows import spatial_pads, windows


@register("Conv")
def conv(node, inputs, opset):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    y = convolve(node, x, weight)
    if bias is not None:
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    return [y]


def convolve(node, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    rank = x.ndim - 2
    kernel = list(weight.shape[2:])
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    group = int(attr(node, "group", 1))
    begin, end = spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    batch, out_channels = x.shape[0], weight.shape[0]
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin + end) and group == 1:
        # one 2-D GEMM per image: numpy's broadcasting matmul is about twice as slow
        w = weight.reshape(out_channels, -1)
        y = np.stack([w @ image.reshape(x.shape[1], -1) for image in x])
        return y.reshape((batch, out_channels) + x.shape[2:])
    view = windows(x, kernel, strides, dilations, begin, end)
    out_sizes = view.shape[2:2 + rank]
    in_per_group = weight.shape[1]
    if group == x.shape[1] and in_per_group == 1:
        return _depthwise(view, weight, group, rank)
    out_per_group = out_channels // group
    taps = in_per_group * int(np.prod(kernel))
    results = []
    for g in range(group):
        part = view[:, g * in_per_group:(g + 1) * in_per_group]
        # (N, *out, C_g, *kernel) -> rows of one window each
        columns = np.moveaxis(part, 1, 1 + rank).reshape(-1, taps)
        w = weight[g * out_per_group:(g + 1) * out_per_group].reshape(out_per_group, taps)
        results.append(columns @ w.T)
    y = np.concatenate(results, axis=-1) if group > 1 else results[0]
    return np.moveaxis(y.reshape((batch,) + tuple(out_sizes) + (out_channels,)), -1, 1)


def _depthwise(view: np.ndarray, weight: np.ndarray, group: int, rank: int) -> np.ndarray:
    """Each output channel m reads input channel m // multiplier: one multiply-add per tap."""
    multiplier = weight.shape[0] // group
    channels = np.repeat(np.arange(group), multiplier)
    source = view if multiplier == 1 else view[:, channels]
    y = np.zeros(source.shape[:2 + rank], np.float32)
    for tap in np.ndindex(*weight.shape[2:]):
        w = weight[(slice(None), 0) + tap].reshape((1, -1) + (1,) * rank)
        y += source[(Ellipsis,) + tap] * w
    return y
