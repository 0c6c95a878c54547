"""NC1HWC2 arithmetic: how an NPU tensor's ONNX shape maps to the 5-D block layout it is stored
in (seed 003, 3.1.2 and table 3-1). The layout pass decides which tensors use it; the emulator
and plan readers decode it with the same functions, so this module needs nothing but the shape."""
from __future__ import annotations

import numpy as np

from rkcompile.numerics.dtypes import element_count


def as_nchw(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The 4-D feature map an NPU tensor of rank <= 4 is stored as: ONNX keeps channels on
    axis 1 and the missing spatial axes are 1, so (C,) -> (1,C,1,1), (N,C) -> (N,C,1,1) and
    (N,C,L) -> (N,C,1,L); a scalar is one channel."""
    match tuple(shape):
        case ():
            return 1, 1, 1, 1
        case (c,):
            return 1, c, 1, 1
        case (n, c):
            return n, c, 1, 1
        case (n, c, length):
            return n, c, 1, length
        case (n, c, h, w):
            return n, c, h, w
    raise ValueError(f"the NPU stores tensors of rank 4 or less, not {shape}")


def nc1hwc2_shape(shape: tuple[int, ...], c2: int) -> tuple[int, int, int, int, int]:
    """(N, C, H, W) -> (N, C1, H, W, C2) with C1 = ceil(C / C2); seed 003's example: (1,13,4,4)
    int8 on RK3568 (C2 = 8) is (1,2,4,4,8)."""
    n, c, h, w = shape
    return n, -(-c // c2), h, w, c2


def nc1hwc2_bytes(shape: tuple[int, ...], c2: int, element_bytes: int) -> int:
    return element_count(nc1hwc2_shape(shape, c2)) * element_bytes


def stored_positions(shape: tuple[int, ...], layout: str, c2: int | None) -> np.ndarray:
    """Where each element of a tensor of `shape` sits in its stored array, counted in elements:
    an int64 array of `shape`. NC1HWC2 (`as_nchw`'s 4-D map, channel c in block c // C2 at lane
    c % C2, with `c2` the target's C2 for the stored dtype) and NHWC place elements by their
    axes; every other layout is row-major. Two tensors of one dtype and size whose elements
    correspond one to one hold the same bytes exactly when these agree element for element (the
    padding lanes are then the same bytes too, as what is left)."""
    if layout == "NC1HWC2":
        n, c, h, w = as_nchw(shape)
        blocks = -(-c // c2)
        batch, channel, row, column = np.ogrid[:n, :c, :h, :w]
        positions = (((batch * blocks + channel // c2) * h + row) * w + column) * c2 + channel % c2
        return positions.astype(np.int64).reshape(shape)
    if layout == "NHWC":
        n, c, h, w = shape
        batch, channel, row, column = np.ogrid[:n, :c, :h, :w]
        return (((batch * h + row) * w + column) * c + channel).astype(np.int64)
    return np.arange(element_count(shape), dtype=np.int64).reshape(shape)
