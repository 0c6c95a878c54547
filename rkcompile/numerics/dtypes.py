"""Dtype names and element counts: what the compiler, the plan layer and the emulator all say
about a tensor's elements, without any graph library."""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import onnx

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})


def dtype_name(dtype) -> str | None:
    """numpy or ONNX dtype -> a plain name ('float32', 'int64', ...), None when unknown.

    Remembered per dtype: a plan asks about every tensor in several passes (33,000 times for a
    2,000-node detector), and numpy's `dtype.name` is computed in Python on every read."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = _dtype_name(dtype)
        return name
    except TypeError:  # an unhashable dtype-like
        return _dtype_name(dtype)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)):
        return onnx.helper.tensor_dtype_to_np_dtype(int(dtype)).name if dtype else None
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def itemsize(dtype: str) -> int:
    if dtype == "bfloat16":
        return 2
    return np.dtype(dtype).itemsize


def element_count(shape: Iterable[int]) -> int:
    """Python-int product, so huge shapes never overflow or allocate."""
    return math.prod(int(d) for d in shape)
