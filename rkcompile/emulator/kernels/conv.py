"""Conv (the oplist's Convolution and Depthwise Convolution) in float32, computed channels-last
(the order `Storage.read` decodes NC1HWC2 into, so moving channels last is a free view): im2col
on a strided window view, copied so each row's taps are runs of consecutive channels, plus one
BLAS matmul per group; a 1x1 stride-1 conv is the matmul alone, and a depthwise conv sums its
kernel taps over the whole map. float32 accumulation, as the NPU accumulates float16 products
in a wider register (docs/emulator.md)."""
from __future__ import annotations

import numpy as np

from ..registry import attr, register
from ._windows import spatial_pads, windows

#: elements of a depthwise output block: 256 KiB of float32, which stays in L2 across the taps
CACHE_BLOCK_ELEMENTS = 1 << 16


@register("Conv")
def conv(node, inputs, opset):
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    y = convolve(node, x, weight)
    if bias is not None:
        y += bias.reshape((1, -1) + (1,) * (y.ndim - 2))
    return [y]


def convolve(node, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(N, C, *spatial) -> (N, M, *out), the result channels-last in memory."""
    rank = x.ndim - 2
    kernel = list(weight.shape[2:])
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    group = int(attr(node, "group", 1))
    begin, end = spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    batch, channels, out_channels = x.shape[0], x.shape[1], weight.shape[0]
    channels_last = np.moveaxis(x, 1, -1)
    in_per_group = weight.shape[1]
    if group == channels and in_per_group == 1:
        y = _depthwise(channels_last, weight, strides, dilations, begin, end)
        return np.moveaxis(y, -1, 1)
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin + end) and group == 1:
        y = channels_last.reshape(-1, channels) @ weight.reshape(out_channels, channels).T
        return np.moveaxis(y.reshape(channels_last.shape[:-1] + (out_channels,)), -1, 1)
    # (N, *out, C, *kernel)
    view = windows(channels_last, kernel, strides, dilations, begin, end, first_spatial_axis=1)
    out_sizes = view.shape[1:1 + rank]
    out_per_group = out_channels // group
    taps = in_per_group * int(np.prod(kernel))
    results = []
    for g in range(group):
        part = view[(slice(None),) * (1 + rank) + (slice(g * in_per_group, (g + 1) * in_per_group),)]
        # rows of one window each, taps ordered (*kernel, C_g) so the copy moves channel runs
        columns = np.moveaxis(part, 1 + rank, -1).reshape(-1, taps)
        w = np.moveaxis(weight[g * out_per_group:(g + 1) * out_per_group], 1, -1).reshape(out_per_group, taps)
        results.append(columns @ w.T)
    y = np.concatenate(results, axis=-1) if group > 1 else results[0]
    return np.moveaxis(y.reshape((batch,) + tuple(out_sizes) + (out_channels,)), -1, 1)


def _depthwise(channels_last: np.ndarray, weight: np.ndarray, strides, dilations, begin, end) -> np.ndarray:
    """Each output channel m reads input channel m // multiplier: one multiply-add per kernel
    tap over the channels-last map. Each tap's weights are tiled along an output row, so numpy
    runs whole rows in one inner loop rather than one pixel's channels, and the map goes in
    blocks of rows that stay in cache across the taps."""
    multiplier = weight.shape[0] // channels_last.shape[-1]
    if multiplier > 1:
        channels_last = np.repeat(channels_last, multiplier, axis=-1)
    kernel = weight.shape[2:]
    view = windows(channels_last, kernel, strides, dilations, begin, end, first_spatial_axis=1)
    y = np.empty(view.shape[:-len(kernel)], np.float32)
    row = y.shape[2:]  # (*out[1:], M)
    taps = weight.reshape(weight.shape[0], -1).T  # (kernel taps, M)
    per_tap = np.broadcast_to(taps.reshape((len(taps),) + (1,) * (len(row) - 1) + (-1,)), (len(taps),) + row).copy()
    rows_per_block = max(1, CACHE_BLOCK_ELEMENTS // int(np.prod(row)))
    product = np.empty((y.shape[0], rows_per_block) + row, np.float32)
    for start in range(0, y.shape[1], rows_per_block):
        block = y[:, start:start + rows_per_block]
        windows_block = view[:, start:start + rows_per_block]
        scratch = product[:, :block.shape[1]]
        for index, tap in enumerate(np.ndindex(*kernel)):
            if index == 0:
                np.multiply(windows_block[(Ellipsis,) + tap], per_tap[index], out=block)
            else:
                block += np.multiply(windows_block[(Ellipsis,) + tap], per_tap[index], out=scratch)
    return y
