"""Slice with starts/ends/axes/steps (inputs from opset 10, attributes before), clamped the
ONNX way, as one numpy basic-indexing view."""
from __future__ import annotations

from rkcompile.emulator.registry import opset_attr_or_input, register


@register("Slice")
def slice_(node, inputs, opset):
    x = inputs[0]
    starts = opset_attr_or_input(node, inputs, 1, "starts")
    ends = opset_attr_or_input(node, inputs, 2, "ends")
    axes = opset_attr_or_input(node, inputs, 3, "axes") or list(range(len(starts)))
    steps = opset_attr_or_input(node, inputs, 4, "steps") or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % x.ndim] = onnx_slice(start, end, step, x.shape[axis % x.ndim])
    return [x[tuple(index)]]


def onnx_slice(start: int, end: int, step: int, size: int) -> slice:
    """The numpy slice of ONNX's bounds: negative ones count from the end, then with a positive
    step both clamp to [0, size], with a negative step start to [0, size - 1] and end to
    [-1, size - 1], -1 meaning before the first element. numpy's own clamping differs for a
    negative step: it empties a start before the first element, which ONNX clamps to 0."""
    start += size if start < 0 else 0
    end += size if end < 0 else 0
    if step > 0:
        return slice(min(max(start, 0), size), min(max(end, 0), size), step)
    start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return slice(start, None if end < 0 else end, step)
