"""Pad: constant (with its value), reflect, edge and wrap, on every axis or the `axes` input's
(opset 18); a negative pad crops, as the operator defines, before the positive ones pad."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, opset_attr_or_input, register

#: ONNX mode -> numpy.pad mode
MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@register("Pad")
def pad(node, inputs, opset):
    x = inputs[0]
    pads = opset_attr_or_input(node, inputs, 1, "pads")
    axes = opset_attr_or_input(node, inputs, 3, "axes")
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    begin, end = [0] * x.ndim, [0] * x.ndim
    for axis, before, after in zip(axes, pads[:len(axes)], pads[len(axes):]):
        begin[axis], end[axis] = before, after
    x = x[tuple(slice(max(-b, 0), size - max(-e, 0)) for b, e, size in zip(begin, end, x.shape))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if mode != "constant":
        return [np.pad(x, widths, mode=MODES[mode])]
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attr(node, "value", 0.0)
    return [np.pad(x, widths, constant_values=np.asarray(value, x.dtype).reshape(()))]
