"""Transpose: a permutation of the axes (reversed when `perm` is absent)."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


@register("Transpose")
def transpose(node, inputs, opset):
    x = inputs[0]
    perm = attr(node, "perm")
    return [np.transpose(x, None if perm is None else [int(p) for p in perm])]
