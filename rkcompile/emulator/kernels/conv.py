"""Conv (the oplist's Convolution and Depthwise Convolution) and ConvTranspose in float32.

Conv is computed channels-last
(the order `Storage.read` decodes NC1HWC2 into, so moving channels last is a free view): im2col
on a strided window view, copied so each row's taps are runs of consecutive channels, plus one
BLAS matmul per group; a 1x1 stride-1 conv is the matmul alone, and a depthwise conv sums its
kernel taps over the whole map. float32 accumulation, as the NPU accumulates float16 products
in a wider register (docs/emulator.md).

ConvTranspose is the adjoint: one matmul per group spreads every input pixel over its kernel
window, and the windows are summed into the output one kernel tap at a time."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register
from rkcompile.emulator.kernels._windows import (auto_pad_of, moveaxis, output_sizes, spatial_pads,
    tap_spans, windows)

#: elements of a depthwise output block (1 MiB of float32): the block and its product scratch
#: stay in cache across the taps, and there are few blocks, each tap of each block a few numpy
#: calls of Python; mobilenet_v2's 17 depthwise convs took 17.2 ms in 1 MiB blocks against 22.4
#: in 256 KiB ones and 20.8 unblocked (medians of 6 interleaved rounds on the 2-core test
#: machine, 1 MiB L2 per core, 32 MiB L3). Blocks split output rows only: every output sums
#: the same taps in the same order whatever the size
CACHE_BLOCK_ELEMENTS = 1 << 18


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
    channels_last = moveaxis(x, 1, -1)
    in_per_group = weight.shape[1]
    out_sizes = output_sizes(x.shape[2:], kernel, strides, dilations, begin, end)
    geometry = (kernel, strides, dilations, begin, out_sizes)
    if group == channels and in_per_group == 1:
        y = _depthwise(channels_last, weight, *geometry)
        return moveaxis(y, -1, 1)
    if all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(begin + end) and group == 1:
        y = channels_last.reshape(-1, channels) @ weight.reshape(out_channels, channels).T
        return moveaxis(y.reshape(channels_last.shape[:-1] + (out_channels,)), -1, 1)
    out_per_group = out_channels // group
    columns = _columns(channels_last, group, kernel, strides, dilations, begin, end)  # (group, rows, taps)
    # (group, M/group, *kernel, C/group) flattened like a row of the columns
    w = moveaxis(weight.reshape((group, out_per_group, in_per_group) + tuple(kernel)), 2, -1).reshape(
        group, out_per_group, -1)
    y = (columns @ w.transpose(0, 2, 1)).transpose(1, 0, 2)  # (rows, group, M/group)
    return moveaxis(y.reshape((batch,) + tuple(out_sizes) + (out_channels,)), -1, 1)


def tap_means(node, x: np.ndarray, kernel) -> np.ndarray:
    """(N, C, *spatial) -> (C, *kernel) in float64: per input channel and kernel tap, the mean
    over the batch and `node`'s output positions of the input value that tap reads (padding
    reads zero). A convolution is linear, so the mean of its output is these means contracted
    with its weights: a mean shift costs a few strided sums instead of a convolution. A tap's
    window positions are a product of one range per spatial axis, so the axes are summed one
    at a time, last first (`_span_sums`)."""
    rank = x.ndim - 2
    kernel = list(kernel)
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    begin, end = spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    out_sizes = output_sizes(x.shape[2:], kernel, strides, dilations, begin, end)
    count = x.shape[0] * int(np.prod(out_sizes))
    sums = x
    for axis in reversed(range(rank)):  # (N, C, *spatial[:axis + 1], *kernel[axis + 1:]) -> one axis fewer
        place = 2 + axis
        spans = []
        for tap in range(kernel[axis]):
            found = tap_spans([x.shape[place]], [out_sizes[axis]], [tap], [strides[axis]], [dilations[axis]],
                              [begin[axis]])
            spans.append(found[1][0] if found is not None and count else None)
        sums = np.stack(_span_sums(sums, place, spans), place)
    return sums.sum(0) / max(count, 1)


def _span_sums(values: np.ndarray, place: int, spans: list[slice | None]) -> list[np.ndarray]:
    """Per span (a strided slice of axis `place`; None: no position), the float64 sum of `values`
    over it, that axis dropped. A kernel's taps read nearly the same positions of an axis (the
    whole axis, less a few at either end, on the stride's grid), so each grid (a residue of the
    stride) is summed whole once and a tap's sum is that less its few positions outside the span:
    one pass over the input, not one per tap. Float32 inputs sum exactly in float64 (each sum
    needs fewer than 53 significant bits unless one axis holds values 2^25 times apart), so the
    differences are the direct sums."""
    def summed(span: slice) -> np.ndarray:
        return values[(slice(None),) * place + (span,)].sum(place, np.float64)

    length = values.shape[place]
    grids: dict[int, np.ndarray] = {}
    found = []
    for span in spans:
        if span is None:
            found.append(np.zeros(values.shape[:place] + values.shape[place + 1:], np.float64))
            continue
        start, stop, step = span.indices(length)
        grid = start % step
        if grid not in grids:
            grids[grid] = summed(slice(grid, None, step))
        past = start + len(range(start, stop, step)) * step  # the grid's first position after the span
        total = grids[grid]
        if start > grid:
            total = total - summed(slice(grid, start, step))
        if past < length:
            total = total - summed(slice(past, None, step))
        found.append(total)
    return found


def _columns(channels_last: np.ndarray, group: int, kernel, strides, dilations, begin, end) -> np.ndarray:
    """im2col of a channels-last (N, *spatial, C) input, per group: (group, one row per output
    position, taps ordered (*kernel, C/group)), copied from the padded input's window view in
    one pass, so each copy moves a run of whole kernel rows of channels (a tap-by-tap copy moves
    one pixel's channels at a time, and was slower on narrow layers). The matmul then runs one
    BLAS product per group, each on a contiguous matrix as a product of that group alone would:
    a grouped conv of 46 groups took 4 ms in a Python loop over the groups, most of it the
    loop's own calls."""
    rank = len(kernel)
    view = windows(channels_last, kernel, strides, dilations, begin, end, first_spatial_axis=1)  # (N, *out, C, *kernel)
    channels = channels_last.shape[-1]
    view = view.reshape(view.shape[:1 + rank] + (group, channels // group) + view.shape[2 + rank:])
    # (N, *out, group, C/group, *kernel) -> (group, N, *out, *kernel, C/group)
    order = (1 + rank,) + tuple(range(1 + rank)) + tuple(range(3 + rank, 3 + 2 * rank)) + (2 + rank,)
    return view.transpose(order).reshape(group, -1, int(np.prod(kernel)) * (channels // group))


def _depthwise(channels_last: np.ndarray, weight: np.ndarray, kernel, strides, dilations, begin,
               out_sizes) -> np.ndarray:
    """Each output channel m reads input channel m // multiplier: one multiply-add per kernel
    tap over the channels-last map, taps in row-major kernel order, each tap over the output
    positions where it reads real input (`tap_spans`; elsewhere it adds a product with the
    padding's zero, which changes no sum), so the padded input is never made. Each tap's
    weights are tiled along an output row, so numpy runs whole rows in one inner loop rather
    than one pixel's channels, and the map goes in blocks of rows that stay in cache across the
    taps."""
    multiplier = weight.shape[0] // channels_last.shape[-1]
    if multiplier > 1:
        channels_last = np.repeat(channels_last, multiplier, axis=-1)
    in_sizes = channels_last.shape[1:-1]
    y = np.zeros((channels_last.shape[0],) + tuple(out_sizes) + (weight.shape[0],), np.float32)
    if not y.size:
        return y
    row = y.shape[2:]  # (*out[1:], M)
    taps = weight.reshape(weight.shape[0], -1).T  # (kernel taps, M)
    per_tap = np.broadcast_to(taps.reshape((len(taps),) + (1,) * (len(row) - 1) + (-1,)), (len(taps),) + row).copy()
    spans = [tap_spans(in_sizes, out_sizes, tap, strides, dilations, begin) for tap in np.ndindex(*kernel)]
    # never more rows than the map has: the scratch is (batch, rows_per_block, *row)
    rows_per_block = max(1, min(y.shape[1], CACHE_BLOCK_ELEMENTS // int(np.prod(row))))
    product = np.empty((y.shape[0], rows_per_block) + row, np.float32)
    every, stride = (slice(None),), strides[0]
    for start in range(0, y.shape[1], rows_per_block):
        stop = min(start + rows_per_block, y.shape[1])
        for weights, found in zip(per_tap, spans):
            if found is None:
                continue
            (rows, *rest), (in_rows, *in_rest) = found
            low, high = max(rows.start, start), min(rows.stop, stop)
            if high <= low:
                continue
            first = in_rows.start + (low - rows.start) * stride
            source = channels_last[every + (slice(first, first + (high - low - 1) * stride + 1, stride),)
                                   + tuple(in_rest)]
            block = y[every + (slice(low, high),) + tuple(rest)]
            scratch = product[every + (slice(0, high - low),) + tuple(slice(0, s.stop - s.start) for s in rest)]
            block += np.multiply(source, weights[tuple(rest)], out=scratch)
    return y


@register("ConvTranspose")
def conv_transpose(node, inputs, opset):
    """ONNX ConvTranspose: x (N, C, *in), weight (C, M/group, *kernel), bias (M,). The full
    output of each axis, (in - 1) * stride + (kernel - 1) * dilation + 1 + output_padding, is
    cropped by the begin and end pads (from `pads`, or from `output_shape` / `auto_pad` as the
    operator's definition derives them)."""
    x, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = x.ndim - 2
    group = int(attr(node, "group", 1))
    kernel = list(weight.shape[2:])
    strides = list(attr(node, "strides", [1] * rank))
    dilations = list(attr(node, "dilations", [1] * rank))
    output_padding = list(attr(node, "output_padding", [0] * rank))
    in_sizes = x.shape[2:]
    full = [(size - 1) * s + (k - 1) * d + 1 + p
            for size, s, k, d, p in zip(in_sizes, strides, kernel, dilations, output_padding)]
    begin, end = _transpose_pads(node, in_sizes, strides, full)
    batch, channels = x.shape[:2]
    in_per_group, out_per_group = channels // group, weight.shape[1]
    # (N, *in, C) @ (C_g, M_g * taps) per group -> (N, *in, group, M_g, *kernel)
    channels_last = moveaxis(x, 1, -1)
    spread = np.stack([
        channels_last[..., g * in_per_group:(g + 1) * in_per_group]
        @ weight[g * in_per_group:(g + 1) * in_per_group].reshape(in_per_group, -1)
        for g in range(group)], axis=-2).reshape(x.shape[:1] + tuple(in_sizes) + (group * out_per_group,) + tuple(kernel))
    y = np.zeros((batch, group * out_per_group) + tuple(full), np.float32)
    # the output element each input element's tap lands on: tap * dilation + position * stride
    spread = moveaxis(spread, 1 + rank, 1)  # (N, M, *in, *kernel)
    for tap in np.ndindex(*kernel):
        target = tuple(slice(t * d, t * d + (size - 1) * s + 1, s)
                       for t, d, s, size in zip(tap, dilations, strides, in_sizes))
        y[(slice(None), slice(None)) + target] += spread[(Ellipsis,) + tap]
    # a negative pad (an output_shape past the full output) extends the output with zeros
    y = np.pad(y, [(0, 0), (0, 0)] + [(max(-b, 0), max(-e, 0)) for b, e in zip(begin, end)])
    y = y[(slice(None), slice(None)) + tuple(slice(max(b, 0), size - max(e, 0))
                                             for b, e, size in zip(begin, end, y.shape[2:]))]
    if bias is not None:
        y += bias.reshape((1, -1) + (1,) * rank)
    return [y]


def _transpose_pads(node, in_sizes, strides, full) -> tuple[list[int], list[int]]:
    """ConvTranspose's (begin, end) crops: explicit `pads`, or from the total padding an
    `output_shape` (or SAME auto_pad's input size x stride) implies, split as the operator
    definition says (the larger half at the end for SAME_UPPER, else at the start)."""
    rank = len(in_sizes)
    auto_pad = auto_pad_of(node)
    output_shape = attr(node, "output_shape")
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = list(attr(node, "pads", [0] * 2 * rank)) if auto_pad in ("NOTSET", "") else [0] * 2 * rank
        return pads[:rank], pads[rank:]
    wanted = list(output_shape)[-rank:] if output_shape is not None else [s * t for s, t in zip(in_sizes, strides)]
    begin, end = [], []
    for total in (f - w for f, w in zip(full, wanted)):
        if total < 0:  # an output_shape past the full output: onnxruntime appends the zeros at the end
            begin.append(0)
            end.append(total)
            continue
        begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        end.append(total - begin[-1])
    return begin, end
