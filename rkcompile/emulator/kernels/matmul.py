"""Gemm and MatMul (the oplist's Convolution-as-FC and exMatMul): BLAS matmul on float32,
which is the float32 accumulation the NPU does for float16 products."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


@register("MatMul")
def matmul(node, inputs, opset):
    return [np.matmul(inputs[0], inputs[1])]


@register("Gemm")
def gemm(node, inputs, opset):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attr(node, "transA", 0):
        a = a.T
    if attr(node, "transB", 0):
        b = b.T
    y = np.float32(attr(node, "alpha", 1.0)) * np.matmul(a, b)
    if c is not None:
        y = y + np.float32(attr(node, "beta", 1.0)) * c
    return [y]
