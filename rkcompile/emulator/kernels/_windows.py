"""Sliding windows shared by convolution and pooling: ONNX padding rules and strided views."""
from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rkcompile.emulator.registry import attr


def moveaxis(array: np.ndarray, source: int, destination: int) -> np.ndarray:
    """np.moveaxis(array, source, destination) for one axis, as one transpose with the order
    worked out once per (rank, source, destination): numpy's normalises its axes in Python on
    every call (5.7 against 0.5 us), and a conv moves axes two or three times."""
    return array.transpose(_moved_order(array.ndim, source, destination))


@functools.lru_cache(maxsize=None)
def _moved_order(rank: int, source: int, destination: int) -> tuple[int, ...]:
    source, destination = source % rank, destination % rank
    order = [axis for axis in range(rank) if axis != source]
    order.insert(destination, source)
    return tuple(order)


def auto_pad_of(node) -> str:
    auto_pad = attr(node, "auto_pad", "NOTSET")
    return auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad


def spatial_pads(node, in_sizes, kernel, strides, dilations, ceil_mode=False) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) per spatial axis from `pads` or `auto_pad`; with `ceil_mode` the end
    pads grow so the last partial window exists, unless it would start in the end padding."""
    rank = len(in_sizes)
    auto_pad = auto_pad_of(node)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, extent, stride in zip(in_sizes, extents, strides):
            total = max((math.ceil(size / stride) - 1) * stride + extent - size, 0)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return begin, end
    pads = list(attr(node, "pads", [0] * 2 * rank)) if auto_pad in ("NOTSET", "") else [0] * 2 * rank
    begin, end = pads[:rank], pads[rank:]
    if ceil_mode:
        for axis, (size, extent, stride) in enumerate(zip(in_sizes, extents, strides)):
            span = size + begin[axis] + end[axis] - extent
            count = math.ceil(span / stride) + 1
            if (count - 1) * stride >= size + begin[axis]:
                count -= 1
            end[axis] += max((count - 1) * stride + extent - (size + begin[axis] + end[axis]), 0)
    return begin, end


def windows(x: np.ndarray, kernel, strides, dilations, begin, end, fill: float = 0.0,
            first_spatial_axis: int = 2) -> np.ndarray:
    """A view of the padded input's windows, no copy beyond the padding: (N, C, *out, *kernel)
    for an (N, C, *spatial) input, and (N, *out, C, *kernel) for a channels-last (N, *spatial, C)
    one with `first_spatial_axis=1`."""
    rank = len(kernel)
    spatial = range(first_spatial_axis, first_spatial_axis + rank)
    if any(begin + end):
        x = padded(x, dict(zip(spatial, zip(begin, end))), fill)
    extents = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if any(x.shape[axis] < extent for axis, extent in zip(spatial, extents)):
        # a window larger than the padded input: no output position along that axis (onnx
        # defines the size as 0), and sliding_window_view refuses it
        shape = list(x.shape) + list(kernel)
        for axis, extent, stride in zip(spatial, extents, strides):
            shape[axis] = max(0, (x.shape[axis] - extent) // stride + 1)
        return np.empty(shape, x.dtype)
    view = sliding_window_view(x, extents, axis=tuple(spatial))
    index = [slice(None)] * view.ndim
    for axis, stride in zip(spatial, strides):
        index[axis] = slice(None, None, stride)
    for axis, dilation in zip(range(x.ndim, x.ndim + rank), dilations):
        index[axis] = slice(None, None, dilation)
    return view[tuple(index)]


def padded(x: np.ndarray, widths: dict[int, tuple[int, int]], fill: float) -> np.ndarray:
    """`x` padded with `fill` by (before, after) elements along each axis of `widths`: the
    input copied once into the middle and only the border strips filled (np.pad's general
    machinery cost more than the copy on small maps)."""
    shape = list(x.shape)
    for axis, (before, after) in widths.items():
        shape[axis] += before + after
    result = np.empty(shape, x.dtype)
    inside = [slice(None)] * x.ndim
    for axis, (before, after) in widths.items():
        inside[axis] = slice(before, before + x.shape[axis])
        strip = [slice(None)] * x.ndim
        strip[axis] = slice(0, before)
        result[tuple(strip)] = fill
        strip[axis] = slice(before + x.shape[axis], shape[axis])
        result[tuple(strip)] = fill
    result[tuple(inside)] = x
    return result


def output_sizes(in_sizes, kernel, strides, dilations, begin, end) -> list[int]:
    """The output size along each spatial axis: the windows that fit the padded input (none
    when a window is larger than it)."""
    return [max(0, (size + b + e - ((k - 1) * d + 1)) // s + 1) if size + b + e >= (k - 1) * d + 1 else 0
            for size, k, s, d, b, e in zip(in_sizes, kernel, strides, dilations, begin, end)]


def tap_spans(in_sizes, out_sizes, tap, strides, dilations, begin) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Where one kernel tap reads real input, without padding anything: (the output positions,
    the input elements they read there), a slice per spatial axis; the other output positions
    read padding. None when the tap reads only padding. Output position i reads input
    i * stride + tap * dilation - begin."""
    outs, ins = [], []
    for size, out, t, s, d, b in zip(in_sizes, out_sizes, tap, strides, dilations, begin):
        shift = t * d - b
        low = max(0, -(shift // s))  # the first i with i * s + shift >= 0
        high = min(out, (size - shift + s - 1) // s)  # past the last i with i * s + shift < size
        if high <= low:
            return None
        outs.append(slice(low, high))
        ins.append(slice(low * s + shift, (high - 1) * s + shift + 1, s))
    return tuple(outs), tuple(ins)


def fold_taps(view: np.ndarray, rank: int, combine: np.ufunc) -> np.ndarray:
    """`combine` over the trailing `rank` kernel axes of a window view, one whole-map operation
    per tap: numpy's own reduction over those short, strided axes is many times slower."""
    taps = np.ndindex(*view.shape[-rank:])
    result = np.array(view[(Ellipsis,) + next(taps)])
    for tap in taps:
        combine(result, view[(Ellipsis,) + tap], out=result)
    return result
