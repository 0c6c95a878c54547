"""Slice with starts/ends/axes/steps (inputs from opset 10, attributes before), clamped the
ONNX way, as one numpy basic-indexing view."""
from __future__ import annotations

from ..registry import opset_attr_or_input, register


@register("Slice")
def slice_(node, inputs, opset):
    x = inputs[0]
    starts = opset_attr_or_input(node, inputs, 1, "starts")
    ends = opset_attr_or_input(node, inputs, 2, "ends")
    axes = opset_attr_or_input(node, inputs, 3, "axes") or list(range(len(starts)))
    steps = opset_attr_or_input(node, inputs, 4, "steps") or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        # numpy's slice clamps out-of-range bounds exactly as ONNX specifies
        index[axis % x.ndim] = slice(start, end, step)
    return [x[tuple(index)]]
