"""Gather, Expand, Tile and Where: elements selected or repeated, never computed with, so the
result is exact whatever the arithmetic. Each is onnx.reference's own numpy expression (the
emulator ran them through onnx.reference until building its evaluator for every step cost a
millisecond or more per step); tests/test_emulator_kernels.py checks them against it."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


@register("Gather")
def gather(node, inputs, opset):
    return [np.take(inputs[0], inputs[1], axis=int(attr(node, "axis", 0)))]


@register("Expand")
def expand(node, inputs, opset):
    x, shape = inputs[0], [int(d) for d in np.asarray(inputs[1]).reshape(-1)]
    return [x * np.ones(shape, x.dtype)]  # multidirectional broadcasting; x * 1 keeps every value


@register("Tile")
def tile(node, inputs, opset):
    return [np.tile(inputs[0], [int(r) for r in np.asarray(inputs[1]).reshape(-1)])]


@register("Where")
def where(node, inputs, opset):
    condition, x, y = inputs
    return [np.where(condition, x, y).astype(x.dtype)]
