"""Reshape, Flatten, Squeeze and Unsqueeze: the same elements under another shape."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, opset_attr_or_input, register


@register("Reshape")
def reshape(node, inputs, opset):
    x, shape = inputs[0], [int(d) for d in inputs[1]]
    if not attr(node, "allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@register("Flatten")
def flatten(node, inputs, opset):
    x = inputs[0]
    axis = int(attr(node, "axis", 1))
    axis += x.ndim if axis < 0 else 0  # axis is in [-rank, rank]: -1 keeps the last axis apart
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


@register("Squeeze")
def squeeze(node, inputs, opset):
    x = inputs[0]
    axes = opset_attr_or_input(node, inputs, 1, "axes")
    return [np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


@register("Unsqueeze")
def unsqueeze(node, inputs, opset):
    x = inputs[0]
    axes = opset_attr_or_input(node, inputs, 1, "axes")
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]
