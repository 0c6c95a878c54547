"""Split: explicit sizes (attribute before opset 13, input after), else equal parts with the
last one smaller (opset 18's num_outputs rule)."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, opset_attr_or_input, register


@register("Split")
def split(node, inputs, opset):
    x = inputs[0]
    axis = int(attr(node, "axis", 0)) % x.ndim
    sizes = opset_attr_or_input(node, inputs, 1, "split")
    if sizes is None:
        count = len(node.outputs)
        part = -(-x.shape[axis] // count)
        sizes = [min(part, x.shape[axis] - i * part) for i in range(count)]
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)
