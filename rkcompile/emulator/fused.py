"""A fused kernel (a node whose `body` attribute holds its members, passes/fuse.py) run as one:
shared by the executor, the int8 path and the float32 reference."""
from __future__ import annotations

from typing import Callable, Collection, Sequence

import numpy as np
from rkcompile.emulator.storage import EmulationError
from rkcompile.plan.plain_nodes import Constant, Graph, Node

RunNode = Callable[[Node, Sequence["np.ndarray | None"]], list]
#: in_place(member, operands, spent) -> the member's outputs computed into one of the operands
#: at the positions in `spent`, or None (registry.IN_PLACE)
InPlace = Callable[[Node, Sequence["np.ndarray | None"], Sequence[int]], "list | None"]


def run_fused(node: Node, values: Sequence[np.ndarray | None], run_member: RunNode,
              in_place: InPlace | None = None, rounded: Collection[str] = (),
              round_value: Callable[[str, np.ndarray], np.ndarray] | None = None) -> list:
    """A fused node as one kernel: its `body` members run in order on unrounded intermediate
    values, so only the fused node's outputs are rounded, when they are stored.

    The body's graph inputs are the fused node's non-constant inputs in order (a boundary may
    have renamed them since fusion); constants keep their names, and their values come from
    the weight region like every other operand.

    With `in_place`, a member may write its result into an operand that an earlier member
    computed, when no later member and no output of the body reads it and its memory is no
    other live intermediate's (a view of one, a Reshape's, is not): the values are the same,
    without a new array per member.

    The intermediates named in `rounded` are passed through `round_value` with their names as
    they are made (the executor's accumulator results, which leave the NPU's convolution core
    rounded; an int8 plan's quantized intermediates, rounded to their grids)."""
    body: Graph = node.attrs["body"]
    env: dict[str, np.ndarray] = {}
    variables = [(t, v) for t, v in zip(node.inputs, values) if t.name and not isinstance(t, Constant)]
    if len(variables) != len(body.inputs):
        raise EmulationError(f"fused node {node.name}: {len(variables)} runtime inputs, body takes {len(body.inputs)}")
    env.update((inner.name, value) for inner, (_, value) in zip(body.inputs, variables))
    env.update((t.name, v) for t, v in zip(node.inputs, values) if isinstance(t, Constant))
    last_reader = {t.name: index for index, member in enumerate(body.nodes) for t in member.inputs if t.name}
    last_reader.update((t.name, len(body.nodes)) for t in body.outputs)
    produced: set[str] = set()
    for index, member in enumerate(body.nodes):
        operands = [None if not t.name else env[t.name] if t.name in env else np.asarray(t.values)
                    for t in member.inputs]
        results = None
        if in_place is not None:
            spent = [position for position, t in enumerate(member.inputs)
                     if t.name in produced and last_reader[t.name] == index
                     and _unshared(operands[position], t.name, env, last_reader, index)]
            if spent:
                results = in_place(member, operands, spent)
        if results is None:
            results = run_member(member, operands)
        if rounded:
            results = [round_value(t.name, v) if t.name in rounded else v for t, v in zip(member.outputs, results)]
        env.update((t.name, v) for t, v in zip(member.outputs, results) if t.name)
        produced.update(t.name for t in member.outputs if t.name)
    return [env[t.name] for t in body.outputs]


def _unshared(value, name: str, env: dict, last_reader: dict[str, int], index: int) -> bool:
    """Whether `value` (intermediate `name`) shares no memory with an intermediate read after
    member `index`."""
    return isinstance(value, np.ndarray) and value.flags.writeable and not any(
        np.may_share_memory(value, other) for other_name, other in env.items()
        if other_name != name and last_reader.get(other_name, -1) > index and isinstance(other, np.ndarray))
