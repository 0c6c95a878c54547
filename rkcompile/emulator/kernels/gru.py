"""GRU (the oplist's GRU / exGRU): gates z, r, h in ONNX order, with either reset rule
(`linear_before_reset`), float32 throughout."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register
from rkcompile.emulator.kernels._recurrent import check_plain, run_directions
from rkcompile.emulator.kernels.activation import sigmoid


@register("GRU")
def gru(node, inputs, opset):
    check_plain(node)
    w, r = inputs[1], inputs[2]
    hidden = r.shape[-1]
    bias = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros((w.shape[0], 6 * hidden), np.float32)
    linear_before_reset = bool(attr(node, "linear_before_reset", 0))

    # per direction, made once: each gate's weights as the transposed views the time steps multiply by
    w_t = [[part.T for part in np.split(w[d], 3)] for d in range(w.shape[0])]
    r_t = [[part.T for part in np.split(r[d], 3)] for d in range(r.shape[0])]
    biases = [np.split(bias[d], 6) for d in range(bias.shape[0])]

    def step(x_t, state, d):
        (h,) = state
        (w_z, w_r, w_h), (r_z, r_r, r_h) = w_t[d], r_t[d]
        wb_z, wb_r, wb_h, rb_z, rb_r, rb_h = biases[d]
        z = sigmoid(x_t @ w_z + h @ r_z + wb_z + rb_z)
        reset = sigmoid(x_t @ w_r + h @ r_r + wb_r + rb_r)
        if linear_before_reset:
            candidate = np.tanh(x_t @ w_h + reset * (h @ r_h + rb_h) + wb_h)
        else:
            candidate = np.tanh(x_t @ w_h + (reset * h) @ r_h + rb_h + wb_h)
        return [(1 - z) * candidate + z * h]

    return run_directions(node, inputs, step, states=1)
