"""Memory: place arena tensors at offsets so that tensors alive at the same time never overlap.

A tensor is live from the step that writes it to the last step that reads it. The lower bound is
the largest total of bytes live at any one step; offsets come from greedy-by-size (largest tensor
first, lowest offset that fits beside the already placed tensors whose lives overlap). Weights,
inputs and outputs live in their own regions, laid out one after another.
"""
from __future__ import annotations

from dataclasses import replace

from rkcompile.context import CompileContext
from rkcompile.ir import present_inputs
from rkcompile.plan import Memory

NAME = "memory"


def run(ctx: CompileContext) -> None:
    nodes = {node.name: node for node in ctx.graph.nodes}
    live: dict[str, list[int]] = {}
    for index, name in enumerate(ctx.order):
        node = nodes[name]
        for tensor in node.outputs:
            if ctx.tensors.get(tensor.name) is not None and ctx.tensors[tensor.name].region == "arena":
                live.setdefault(tensor.name, [index, index])
        for tensor in present_inputs(node):
            if tensor.name in live:
                live[tensor.name][1] = index
    intervals = {name: (start, end, ctx.tensors[name].bytes) for name, (start, end) in live.items()}
    offsets, arena = greedy_by_size(intervals)
    region_ends = {"weight": 0, "input": 0, "output": 0}
    tensors = {}
    for name, tensor in ctx.tensors.items():
        if tensor.region == "arena":
            offset = offsets.get(name, 0)
        else:
            offset = region_ends[tensor.region]
            region_ends[tensor.region] += tensor.bytes
        tensors[name] = replace(tensor, offset=offset)
    ctx.tensors = tensors
    ctx.memory = Memory(arena_bytes=arena, lower_bound_bytes=lower_bound(intervals),
                        weight_bytes=region_ends["weight"])


def lower_bound(intervals: dict[str, tuple[int, int, int]]) -> int:
    """Largest sum of sizes of tensors live at the same step (start and end inclusive)."""
    events: dict[int, int] = {}
    for start, end, size in intervals.values():
        events[start] = events.get(start, 0) + size
        events[end + 1] = events.get(end + 1, 0) - size
    peak = current = 0
    for step in sorted(events):
        current += events[step]
        peak = max(peak, current)
    return peak


def greedy_by_size(intervals: dict[str, tuple[int, int, int]]) -> tuple[dict[str, int], int]:
    """Offsets for `{name: (first_step, last_step, bytes)}` and the arena size they need."""
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size)
    offsets: dict[str, int] = {}
    arena = 0
    for name, (start, end, size) in sorted(intervals.items(), key=lambda kv: (-kv[1][2], kv[1][0], kv[0])):
        busy = sorted((off, off + sz) for s, e, off, sz in placed if s <= end and start <= e)
        offset = 0
        for low, high in busy:
            if offset + size <= low:
                break
            offset = max(offset, high)
        offsets[name] = offset
        placed.append((start, end, offset, size))
        arena = max(arena, offset + size)
    return offsets, arena
