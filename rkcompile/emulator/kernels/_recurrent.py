"""What LSTM and GRU share: the ONNX operand layout and the direction loop. Each time step is
one float32 matmul over the batch; Python loops only over time and directions."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import Unsupported, attr


def check_plain(node) -> None:
    """The kernels implement the default activations and no clipping; anything else goes to
    the reference fallback."""
    if attr(node, "activations") is not None or attr(node, "clip") is not None:
        raise Unsupported(f"{node.op} with custom activations or clip")


def run_directions(node, inputs, step, states: int):
    """Apply `step(x_t, hidden_states, direction)` over time for each direction; returns ONNX's
    (Y, Y_h[, Y_c]) in the node's layout. inputs follow ONNX: X, W, R, B, sequence_lens,
    initial_h[, initial_c]."""
    x = inputs[0]
    layout = int(attr(node, "layout", 0))
    if layout:
        x = np.swapaxes(x, 0, 1)
    if len(inputs) > 4 and inputs[4] is not None and np.any(inputs[4] != x.shape[0]):
        raise Unsupported(f"{node.op} with sequence_lens shorter than the sequence")
    direction = attr(node, "direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    directions = 2 if direction == "bidirectional" else 1
    hidden = int(attr(node, "hidden_size") or inputs[2].shape[-1])
    seq, batch = x.shape[0], x.shape[1]
    initial = [inputs[i] if len(inputs) > i and inputs[i] is not None else None for i in (5, 6)][:states]
    if layout:
        initial = [None if s is None else np.swapaxes(s, 0, 1) for s in initial]
    ys, finals = [], []
    for d in range(directions):
        state = [np.zeros((batch, hidden), np.float32) if s is None else s[d] for s in initial]
        reverse = direction == "reverse" or d == 1
        outputs = [None] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            state = step(x[t], state, d)
            outputs[t] = state[0]
        ys.append(np.stack(outputs))
        finals.append(state)
    y = np.stack(ys, axis=1)  # (seq, directions, batch, hidden)
    results = [y] + [np.stack([f[i] for f in finals]) for i in range(states)]
    if layout:
        results = [np.transpose(y, (2, 0, 1, 3))] + [np.swapaxes(r, 0, 1) for r in results[1:]]
    return results[:len(node.outputs)]
