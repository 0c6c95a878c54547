"""Arena allocation: live ranges, the lower bound, the offset planner, and an independent check.

The problem is dynamic storage allocation: each buffer is live over a closed range of steps
and needs `size` contiguous bytes; buffers whose ranges overlap must not share bytes. The
lower bound is the largest total size live at one step. Offsets come from greedy-by-size
(Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020: largest
buffer first, into the smallest gap that fits among the already placed buffers it conflicts
with). When that misses the target, an improvement phase follows: an exact branch-and-bound
on small problems, and a hill climb over the placement order on large ones.

`verify_allocation` checks a finished plan from its steps and tensors alone; it shares no code
with the planner, so a planner bug cannot hide itself.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Buffer:
    """A block of bytes live from step `first` to step `last`, both inclusive."""

    first: int
    last: int
    size: int


@dataclass(frozen=True)
class Allocation:
    offsets: dict[str, int]
    arena_bytes: int
    lower_bound_bytes: int


def live_ranges(steps: Sequence[tuple[Iterable[str], Iterable[str]]], names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(first, last) step index for each of `names` that the `(inputs, outputs)` steps touch.

    A buffer is live from the first step that touches it (its writer) to the last one (its
    last reader); a buffer written and never read is live only at its writer.
    """
    wanted = set(names)
    ranges: dict[str, list[int]] = {}
    for index, (inputs, outputs) in enumerate(steps):
        for name in (*inputs, *outputs):
            if name in wanted:
                ranges.setdefault(name, [index, index])[1] = index
    return {name: (first, last) for name, (first, last) in ranges.items()}


def lower_bound(buffers: Iterable[Buffer]) -> int:
    """The largest total size of buffers live at one step; no placement can use less."""
    delta: dict[int, int] = {}
    for buffer in buffers:
        delta[buffer.first] = delta.get(buffer.first, 0) + buffer.size
        delta[buffer.last + 1] = delta.get(buffer.last + 1, 0) - buffer.size
    peak = live = 0
    for step in sorted(delta):
        live += delta[step]
        peak = max(peak, live)
    return peak


def conflicts(buffers: Sequence[Buffer]) -> list[list[int]]:
    """For each buffer, the indices of the buffers whose live ranges overlap it.

    A sweep over start steps: each overlapping pair is found once, when the later of the two
    starts, so the cost is O(n log n + pairs) rather than O(n^2).
    """
    neighbours: list[list[int]] = [[] for _ in buffers]
    by_start = sorted(range(len(buffers)), key=lambda i: buffers[i].first)
    ends: list[tuple[int, int]] = []
    active: set[int] = set()
    for index in by_start:
        first = buffers[index].first
        while ends and ends[0][0] < first:
            active.discard(heapq.heappop(ends)[1])
        for other in active:
            neighbours[index].append(other)
            neighbours[other].append(index)
        active.add(index)
        heapq.heappush(ends, (buffers[index].last, index))
    return neighbours


def place_in_order(order: Sequence[int], sizes: Sequence[int],
                   neighbours: Sequence[Sequence[int]]) -> tuple[list[int], int]:
    """Place buffers one by one in `order`, each into the smallest gap among its already
    placed neighbours that fits it, else on top of them; returns offsets and the arena size."""
    offsets = [-1] * len(sizes)
    arena = 0
    for index in order:
        offsets[index] = _fit(index, offsets, sizes, neighbours, smallest_gap=True)
        arena = max(arena, offsets[index] + sizes[index])
    return offsets, arena


def _fit(index: int, offsets: Sequence[int], sizes: Sequence[int], neighbours: Sequence[Sequence[int]],
         smallest_gap: bool) -> int:
    """An offset for buffer `index` clear of its placed neighbours (offset -1 is unplaced): the
    smallest gap that fits, or the lowest one; above all of them when no gap fits."""
    size = sizes[index]
    chosen, chosen_gap, top = -1, 0, 0
    for low, high in sorted((offsets[o], offsets[o] + sizes[o]) for o in neighbours[index] if offsets[o] >= 0):
        gap = low - top
        if gap >= size and (chosen < 0 or gap < chosen_gap):
            chosen, chosen_gap = top, gap
            if not smallest_gap:
                break
        top = max(top, high)
    return top if chosen < 0 else chosen


def plan_arena(buffers: Mapping[str, Buffer], slack: float = 0.0, exact_limit: int = 8,
               work_budget: int = 1_000_000) -> Allocation:
    """Offsets for `buffers`, stopping as soon as the arena is within `slack` of the lower bound.

    Greedy placement in a few orders (by size, the paper's rule; by lifetime then size; by
    size x lifetime), keeping the best. If that misses, exact search for at most
    `exact_limit` buffers, else a hill climb whose moves are capped so that moves x (buffers +
    conflicting pairs) stays under `work_budget`: deterministic, and bounded on huge graphs.
    """
    names = sorted(buffers, key=lambda n: (-buffers[n].size, buffers[n].first, n))
    items = [buffers[n] for n in names]
    sizes = [b.size for b in items]
    bound = lower_bound(items)
    neighbours = conflicts(items)
    target = bound * (1 + slack)
    lifetime = [b.last - b.first + 1 for b in items]
    orders = (
        list(range(len(items))),
        sorted(range(len(items)), key=lambda i: (-lifetime[i], -sizes[i], i)),
        sorted(range(len(items)), key=lambda i: (-sizes[i] * lifetime[i], i)),
    )
    arena, offsets, order = None, [], orders[0]
    for candidate in orders:
        candidate_offsets, candidate_arena = place_in_order(candidate, sizes, neighbours)
        if arena is None or candidate_arena < arena:
            arena, offsets, order = candidate_arena, candidate_offsets, candidate
        if arena <= target:
            break
    if arena > target:
        if len(items) <= exact_limit:
            offsets, arena = _exact(sizes, neighbours, bound, arena, offsets)
        else:
            pairs = sum(len(n) for n in neighbours) // 2
            moves = max(20, work_budget // (len(items) + pairs + 1))
            offsets, arena = _hill_climb(order, sizes, neighbours, offsets, arena, target, moves)
    return Allocation(dict(zip(names, offsets)), arena or 0, bound)


def _exact(sizes: Sequence[int], neighbours: Sequence[Sequence[int]], bound: int,
           best_arena: int, best_offsets: list[int]) -> tuple[list[int], int]:
    """Branch and bound over placement orders with lowest-fit placement.

    Placing the buffers of an optimal solution in increasing offset order, each at the
    lowest offset free of its placed neighbours, lands every buffer at or below its optimal
    offset; so some order reaches the optimum and searching orders is exact.
    """
    count = len(sizes)
    offsets = [-1] * count
    best = [best_arena, list(best_offsets)]

    def search(placed: int, arena: int) -> bool:
        if placed == count:
            best[0], best[1] = arena, list(offsets)
            return arena <= bound
        for index in range(count):
            if offsets[index] >= 0:
                continue
            offset = _fit(index, offsets, sizes, neighbours, smallest_gap=False)
            if offset + sizes[index] >= best[0]:
                continue
            offsets[index] = offset
            if search(placed + 1, max(arena, offset + sizes[index])):
                return True
            offsets[index] = -1
        return False

    search(0, 0)
    return best[1], best[0]


def _hill_climb(order: list[int], sizes: Sequence[int], neighbours: Sequence[Sequence[int]],
                offsets: list[int], arena: int, target: float, moves: int) -> tuple[list[int], int]:
    """Move one buffer to another place in the placement order, re-place, and keep the order
    when the arena does not grow (ties are kept too, so the climb can cross plateaus).

    Half the moves take a buffer that reaches the arena's top, the rest any buffer; the random
    source is seeded, so plans are reproducible. Buffers ahead of the move keep their offsets,
    and a candidate is dropped as soon as it grows past the current arena.
    """
    rng = random.Random(0)
    count = len(order)
    for _ in range(moves):
        if arena <= target:
            break
        if rng.random() < 0.5:
            at = rng.choice([rank for rank, i in enumerate(order) if offsets[i] + sizes[i] == arena])
        else:
            at = rng.randrange(count)
        to = rng.randrange(count)
        candidate = list(order)
        candidate.insert(to, candidate.pop(at))
        start = min(at, to)
        candidate_offsets = list(offsets)
        for index in candidate[start:]:
            candidate_offsets[index] = -1
        for index in candidate[start:]:
            candidate_offsets[index] = _fit(index, candidate_offsets, sizes, neighbours, smallest_gap=True)
            if candidate_offsets[index] + sizes[index] > arena:
                break
        else:
            order, offsets = candidate, candidate_offsets
            arena = max(offsets[i] + sizes[i] for i in order)
    return offsets, arena


def verify_allocation(plan) -> list[str]:
    """Every way the arena placement of `plan` (a `rkcompile.plan.Plan`) is wrong; empty when sound.

    Rebuilds each arena tensor's live range from the steps, then checks: offsets are aligned
    and in bounds, `arena_bytes` covers every tensor, live tensors never share a byte (except
    a declared in-place reuse, where the reader's last step is the writer's first and both
    start at the same offset), and the recorded lower bound is the live-bytes peak.
    """
    memory = plan.memory
    alignment = memory.alignment
    arena = {name: t for name, t in plan.tensors.items() if t.region == "arena"}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step in plan.steps:
        for name in (*step.inputs, *step.outputs):
            if name in arena:
                first.setdefault(name, step.id)
                last[name] = step.id
    problems = []
    for name, tensor in arena.items():
        if tensor.offset < 0 or tensor.offset + tensor.bytes > memory.arena_bytes:
            problems.append(f"arena tensor {name} at [{tensor.offset}, {tensor.offset + tensor.bytes}) "
                            f"is outside the {memory.arena_bytes}-byte arena")
        if tensor.offset % alignment:
            problems.append(f"arena tensor {name} offset {tensor.offset} is not {alignment}-byte aligned")
        reused = tensor.reuses
        if reused is not None:
            source = arena.get(reused)
            if (source is None or source.offset != tensor.offset or tensor.bytes > source.bytes
                    or last.get(reused) != first.get(name)):
                problems.append(f"arena tensor {name} reuses {reused} but does not start where and when it ends")
    live: list[str] = []
    for name in sorted(first, key=first.get):
        live = [other for other in live if last[other] >= first[name]]
        low, high = arena[name].offset, arena[name].offset + arena[name].bytes
        for other in live:
            if arena[other].offset < high and low < arena[other].offset + arena[other].bytes:
                in_place = arena[name].reuses == other and last[other] == first[name]
                if not in_place:
                    problems.append(f"arena tensors {other} and {name} are live together and overlap")
        live.append(name)
    # An in-place pair shares its bytes at the one step where both are live: count them once.
    padded = {name: -(-arena[name].bytes // alignment) * alignment for name in first}
    delta: dict[int, int] = {}
    for name in first:
        delta[first[name]] = delta.get(first[name], 0) + padded[name]
        delta[last[name] + 1] = delta.get(last[name] + 1, 0) - padded[name]
        reused = arena[name].reuses
        if reused in first and last[reused] == first[name]:
            shared = min(padded[name], padded[reused])
            delta[first[name]] -= shared
            delta[first[name] + 1] = delta.get(first[name] + 1, 0) + shared
    peak = running = 0
    for step in sorted(delta):
        running += delta[step]
        peak = max(peak, running)
    if peak != memory.lower_bound_bytes:
        problems.append(f"lower bound {memory.lower_bound_bytes} is not the live-bytes peak {peak}")
    if memory.lower_bound_bytes > memory.arena_bytes:
        problems.append("arena smaller than the lower bound")
    return problems
