"""Sliding windows shared by convolution and pooling: ONNX padding rules and strided views."""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..registry import attr


def spatial_pads(node, in_sizes, kernel, strides, dilations, ceil_mode=False) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) per spatial axis from `pads` or `auto_pad`; with `ceil_mode` the end
    pads grow so the last partial window exists, unless it would start in the end padding."""
    rank = len(in_sizes)
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
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


def windows(x: np.ndarray, kernel, strides, dilations, begin, end, fill: float = 0.0) -> np.ndarray:
    """(N, C, *out, *kernel) view of the padded input's windows, no copy beyond the padding."""
    rank = len(kernel)
    padded = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=fill) if any(begin + end) else x
    extents = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    view = sliding_window_view(padded, extents, axis=tuple(range(2, 2 + rank)))
    index = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) \
        + tuple(slice(None, None, d) for d in dilations)
    return view[index]
