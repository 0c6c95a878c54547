"""LSTM (the oplist's LSTM, and exLSTM once fused with its layout ops): gates i, o, f, c in
ONNX order, optional peepholes, float32 throughout."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import Unsupported, attr, register
from rkcompile.emulator.kernels._recurrent import check_plain, run_directions
from rkcompile.emulator.kernels.activation import sigmoid


@register("LSTM")
def lstm(node, inputs, opset):
    check_plain(node)
    if attr(node, "input_forget", 0):
        raise Unsupported("LSTM input_forget")
    w, r = inputs[1], inputs[2]
    hidden = r.shape[-1]
    bias = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros((w.shape[0], 8 * hidden), np.float32)
    peephole = inputs[7] if len(inputs) > 7 and inputs[7] is not None else None
    combined_bias = bias[:, :4 * hidden] + bias[:, 4 * hidden:]
    # per direction, made once: the transposed views the time steps multiply by
    w_t, r_t = [w[d].T for d in range(w.shape[0])], [r[d].T for d in range(r.shape[0])]

    def step(x_t, state, d):
        h, c = state
        gates = x_t @ w_t[d] + h @ r_t[d] + combined_bias[d]
        g = gates[:, 3 * hidden:]
        if peephole is None:
            # without peepholes i, o and f read nothing but the gates: one sigmoid for the three
            ios = sigmoid(gates[:, :3 * hidden])
            i, o, f = ios[:, :hidden], ios[:, hidden:2 * hidden], ios[:, 2 * hidden:]
            c = f * c + i * np.tanh(g)
            return [o * np.tanh(c), c]
        i, o, f = gates[:, :hidden], gates[:, hidden:2 * hidden], gates[:, 2 * hidden:3 * hidden]
        p_i, p_o, p_f = np.split(peephole[d], 3)
        i = sigmoid(i + p_i * c)
        f = sigmoid(f + p_f * c)
        c = f * c + i * np.tanh(g)
        o = sigmoid(o + p_o * c)
        return [o * np.tanh(c), c]

    return run_directions(node, inputs, step, states=2)
