"""Softmax, LogSoftmax and Hardmax in float32, max-subtracted. Before opset 13 the input is
flattened to 2-D at `axis` (default 1) and normalised over the whole second part; from 13 over
the one axis (default -1)."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


def _over_axis(node, x, opset, reduce_rows):
    if opset < 13:
        axis = int(attr(node, "axis", 1)) % max(x.ndim, 1)
        rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return reduce_rows(rows, -1).reshape(x.shape)
    return reduce_rows(x, int(attr(node, "axis", -1)))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _hardmax(x, axis):
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, first, 1, axis=axis)
    return y


@register("Softmax")
def softmax(node, inputs, opset):
    return [_over_axis(node, inputs[0], opset, _softmax)]


@register("LogSoftmax")
def log_softmax(node, inputs, opset):
    return [_over_axis(node, inputs[0], opset, _log_softmax)]


@register("Hardmax")
def hardmax(node, inputs, opset):
    return [_over_axis(node, inputs[0], opset, _hardmax)]
