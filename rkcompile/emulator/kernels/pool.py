"""MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool on strided window views."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import Unsupported, attr, register
from rkcompile.emulator.kernels._windows import fold_taps, moveaxis, spatial_pads, windows


def _geometry(node, x):
    rank = x.ndim - 2
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    begin, end = spatial_pads(node, x.shape[2:], kernel, strides, dilations, bool(attr(node, "ceil_mode", 0)))
    return rank, kernel, strides, dilations, begin, end


@register("MaxPool")
def max_pool(node, inputs, opset):
    x = inputs[0]
    if len(node.outputs) > 1 and node.outputs[1].name:
        raise Unsupported("MaxPool Indices output")
    rank, kernel, strides, dilations, begin, end = _geometry(node, x)
    return [_fold_windows(x, kernel, strides, dilations, begin, end, np.maximum, fill=-np.inf)]


@register("AveragePool")
def average_pool(node, inputs, opset):
    x = inputs[0]
    rank, kernel, strides, dilations, begin, end = _geometry(node, x)
    total = _fold_windows(x, kernel, strides, dilations, begin, end, np.add)
    # The divisor counts the input cells of each window, plus the explicit pads when
    # count_include_pad; never the cells ceil_mode adds past the end.
    if not any(begin + end):
        # every window holds its whole kernel: the count folded below would be this number in
        # every cell (a sum of ones, exact in float32), and dividing by it is the same division
        return [total / np.float32(np.prod(kernel))]
    ones = np.ones((1, 1) + x.shape[2:], np.float32)
    if attr(node, "count_include_pad", 0):
        explicit = list(attr(node, "pads", [0] * 2 * rank))
        ones = np.pad(ones, [(0, 0), (0, 0)] + list(zip(explicit[:rank], explicit[rank:])), constant_values=1)
        begin = [b - p for b, p in zip(begin, explicit[:rank])]
        end = [e - p for e, p in zip(end, explicit[rank:])]
    counts = fold_taps(windows(ones, kernel, strides, dilations, begin, end), rank, np.add)
    return [total / counts]


def _fold_windows(x, kernel, strides, dilations, begin, end, combine: np.ufunc, fill: float = 0.0) -> np.ndarray:
    """`combine` over each window's taps (`fold_taps`), on a channels-last view when `x`'s
    channels are innermost in memory (as Storage.read hands NC1HWC2 tensors over, a slice of
    whole C2 blocks when the channels do not fill them): each tap then moves runs of whole
    pixels, where a channels-first view of that memory strides across it element by element
    (7x7 pools 3-10x slower). The same taps in the same order, so the same values either way;
    the result comes back channels-last too."""
    rank = len(kernel)
    channels_last = moveaxis(x, 1, -1)
    if x.strides[1] == x.itemsize:
        view = windows(channels_last, kernel, strides, dilations, begin, end, fill, first_spatial_axis=1)
        return moveaxis(fold_taps(view, rank, combine), -1, 1)
    return fold_taps(windows(x, kernel, strides, dilations, begin, end, fill), rank, combine)


@register("GlobalAveragePool")
def global_average_pool(node, inputs, opset):
    x = inputs[0]
    return [x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float32)]


@register("GlobalMaxPool")
def global_max_pool(node, inputs, opset):
    x = inputs[0]
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]
