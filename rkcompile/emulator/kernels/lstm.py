"""LSTM (the oplist's LSTM, and exLSTM once fused with its layout ops): gates i, o, f, c in
ONNX order, optional peepholes, float32 throughout."""
from __future__ import annotations

import numpy as np

from ..registry import Unsupported, attr, register
from ._recurrent import check_plain, run_directions
from .activation import sigmoid


@register("LSTM")
def lstm(node, inputs, opset):
    check_plain(node)
    if attr(node, "input_forget", 0):
        raise Unsupported("LSTM input_forget")
    w, r = inputs[1], inputs[2]
    hidden = r.shape[-1]
    bias = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros((w.shape[0], 8 * hidden), np.float32)
    peephole = inputs[7] if len(inputs) > 7 and inputs[7] is not None else np.zeros((w.shape[0], 3 * hidden), np.float32)
    combined_bias = bias[:, :4 * hidden] + bias[:, 4 * hidden:]

    def step(x_t, state, d):
        h, c = state
        gates = x_t @ w[d].T + h @ r[d].T + combined_bias[d]
        i, o, f, g = np.split(gates, 4, axis=-1)
        p_i, p_o, p_f = np.split(peephole[d], 3)
        i = sigmoid(i + p_i * c)
        f = sigmoid(f + p_f * c)
        c = f * c + i * np.tanh(g)
        o = sigmoid(o + p_o * c)
        return [o * np.tanh(c), c]

    return run_directions(node, inputs, step, states=2)
