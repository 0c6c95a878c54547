"""ReduceMean/Sum/Max/Min/Prod/L2/SumSquare: fused norms (exNorm) and pooled attention use them.
Axes are an attribute before opset 18 (ReduceSum: 13) and an input after."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, opset_attr_or_input, register

REDUCTIONS = {
    "ReduceMean": lambda x, axes, keep: x.mean(axis=axes, keepdims=keep),
    "ReduceSum": lambda x, axes, keep: x.sum(axis=axes, keepdims=keep),
    "ReduceMax": lambda x, axes, keep: x.max(axis=axes, keepdims=keep),
    "ReduceMin": lambda x, axes, keep: x.min(axis=axes, keepdims=keep),
    "ReduceProd": lambda x, axes, keep: x.prod(axis=axes, keepdims=keep),
    "ReduceSumSquare": lambda x, axes, keep: (x * x).sum(axis=axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: np.sqrt((x * x).sum(axis=axes, keepdims=keep)),
}


def _reduce(node, inputs, opset):
    x = inputs[0]
    axes = opset_attr_or_input(node, inputs, 1, "axes")
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.ndim))
    keep = bool(attr(node, "keepdims", 1))
    return [np.asarray(REDUCTIONS[node.op](x, tuple(a % x.ndim for a in axes), keep), dtype=x.dtype)]


register(*REDUCTIONS)(_reduce)
