"""A fused kernel (a node whose `body` attribute holds its members, passes/fuse.py) run as one:
shared by the executor, the int8 path and the float32 reference."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from .storage import EmulationError

RunNode = Callable[[gs.Node, Sequence["np.ndarray | None"]], list]


def run_fused(node: gs.Node, values: Sequence[np.ndarray | None], run_member: RunNode) -> list:
    """A fused node as one kernel: its `body` members run in order on unrounded intermediate
    values, so only the fused node's outputs are rounded, when they are stored.

    The body's graph inputs are the fused node's non-constant inputs in order (a boundary may
    have renamed them since fusion); constants keep their names, and their values come from
    the weight region like every other operand."""
    body: gs.Graph = node.attrs["body"]
    env: dict[str, np.ndarray] = {}
    variables = [(t, v) for t, v in zip(node.inputs, values) if t.name and not isinstance(t, gs.Constant)]
    if len(variables) != len(body.inputs):
        raise EmulationError(f"fused node {node.name}: {len(variables)} runtime inputs, body takes {len(body.inputs)}")
    env.update((inner.name, value) for inner, (_, value) in zip(body.inputs, variables))
    env.update((t.name, v) for t, v in zip(node.inputs, values) if isinstance(t, gs.Constant))
    for member in body.nodes:
        operands = [None if not t.name else env[t.name] if t.name in env else np.asarray(t.values)
                    for t in member.inputs]
        env.update((t.name, v) for t, v in zip(member.outputs, run_member(member, operands)) if t.name)
    return [env[t.name] for t in body.outputs]
