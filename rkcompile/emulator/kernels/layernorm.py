"""LayerNormalization (the oplist's exNorm) and inference BatchNormalization, in float32:
mean and variance over the normalised axes, then scale and bias."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


@register("LayerNormalization")
def layer_normalization(node, inputs, opset):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = int(attr(node, "axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    centred = x - mean
    inv_std = 1 / np.sqrt((centred * centred).mean(axis=axes, keepdims=True) + np.float32(attr(node, "epsilon", 1e-5)))
    y = centred * inv_std * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inv_std][:len(node.outputs)]


@register("BatchNormalization")
def batch_normalization(node, inputs, opset):
    x, scale, bias, mean, var = inputs[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)
    factor = scale / np.sqrt(var + np.float32(attr(node, "epsilon", 1e-5)))
    return [x * factor.reshape(shape) + (bias - mean * factor).reshape(shape)]
