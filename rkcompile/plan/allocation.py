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

from dataclasses import dataclass
import heapq
import random
from typing import Iterable, Mapping, Sequence

import numpy as np



@dataclass(frozen=True)
class Buffer:
    """A block of bytes live from step `first` to step `last`, both inclusive."""

    first: int
    last: int
    size: int


@dataclass(frozen=True)
class Allocation:
    """Arena offset per buffer, the arena's size, and the lower bound of any placement."""

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


def conflicts(buffers: Sequence[Buffer]) -> list[np.ndarray]:
    """For each buffer, the indices of the buffers whose live ranges overlap it, in no set order.

    In order of start step, a buffer overlaps exactly the buffers starting after it (or with it,
    later in that order) no later than its last step: a run of that order, found by one binary
    search. The pairs are listed from those runs, and each under both its buffers, in numpy,
    as a model with long-lived tensors has hundreds of thousands of pairs (an SSD head's 2,114
    buffers: 315,000). The cost is O(n log n + pairs) in C.
    """
    count = len(buffers)
    first = np.fromiter((b.first for b in buffers), dtype=np.int64, count=count)
    last = np.fromiter((b.last for b in buffers), dtype=np.int64, count=count)
    order = np.argsort(first, kind="stable")
    ends = np.searchsorted(first[order], last[order], side="right")  # one past each run
    later = ends - np.arange(1, count + 1)  # a buffer starts no later than it ends: never negative
    starts = np.cumsum(later) - later
    owner = np.repeat(np.arange(count), later)
    partner = np.arange(len(owner)) - np.repeat(starts, later) + owner + 1
    owner, partner = order[owner], order[partner]
    owners = np.concatenate([owner, partner])
    # grouped by owner with numpy's radix sort, which it uses for 16-bit keys
    keys = owners.astype(np.uint16) if count <= 1 << 16 else owners
    others = np.concatenate([partner, owner])[np.argsort(keys, kind="stable")]
    return np.split(others, np.cumsum(np.bincount(owners, minlength=count))[:-1])


#: A buffer with at least this many conflicting buffers is fitted with numpy; below it, Python's
#: per-call overhead is the smaller cost.
VECTOR_DEGREE = 48


class _Placement:
    """Buffers placed in an order, each at `_fit`'s offset among the conflicting buffers placed
    before it. Ranks and offsets are kept as Python lists and as numpy mirrors, for the two
    ways `_fit` reads them; an unplaced buffer has offset -1."""

    def __init__(self, order: Sequence[int]):
        count = len(order)
        self.order = list(order)
        self.rank = [0] * count
        for position, index in enumerate(self.order):
            self.rank[index] = position
        self.rank_array = np.array(self.rank, dtype=np.int64)
        self.offsets = [-1] * count
        self.offset_array = np.full(count, -1, dtype=np.int64)

    def place(self, index: int, offset: int) -> None:
        self.offsets[index] = offset
        self.offset_array[index] = offset

    def moved(self, at: int, to: int) -> "_Placement":
        """A copy with the buffer at position `at` moved to position `to`, offsets kept."""
        copy = object.__new__(_Placement)
        copy.order = list(self.order)
        copy.order.insert(to, copy.order.pop(at))
        copy.rank, copy.rank_array = list(self.rank), self.rank_array.copy()
        low, high = min(at, to), max(at, to)
        for position in range(low, high + 1):
            copy.rank[copy.order[position]] = position
        copy.rank_array[copy.order[low:high + 1]] = np.arange(low, high + 1)
        copy.offsets, copy.offset_array = list(self.offsets), self.offset_array.copy()
        return copy


class _Conflicts:
    """Sizes and conflict lists in the two forms `_fit` reads: numpy arrays (`arrays`, read so
    for the buffers with at least VECTOR_DEGREE conflicts), and Python lists (`listed`)."""

    def __init__(self, sizes: Sequence[int], neighbours: Sequence[np.ndarray]):
        self.sizes = list(sizes)
        self.size_array = np.array(self.sizes, dtype=np.int64)
        self.arrays = neighbours
        self._lists: list[list[int] | None] = [None] * len(neighbours)

    def listed(self, index: int) -> list[int]:
        """Buffer `index`'s conflicts as a Python list, made when first read: greedy placement
        reads only the buffers under VECTOR_DEGREE so, and most pairs belong to the others
        (tv_ssdlite320: 315,000 pairs), which only a hill climb reads as lists."""
        found = self._lists[index]
        if found is None:
            found = self._lists[index] = self.arrays[index].tolist()
        return found


def place_in_order(order: Sequence[int], buffers: _Conflicts) -> tuple[_Placement, int]:
    """Place buffers one by one in `order`, each into the smallest gap among its already
    placed neighbours that fits it, else on top of them; returns the placement and the arena size."""
    placement = _Placement(order)
    arena = 0
    for index in order:
        offset = _fit(index, placement, buffers, smallest_gap=True)
        placement.place(index, offset)
        arena = max(arena, offset + buffers.sizes[index])
    return placement, arena


def _fit(index: int, placement: _Placement, buffers: _Conflicts, smallest_gap: bool) -> int:
    """An offset for buffer `index` clear of its neighbours placed before it: the smallest gap
    that fits (the lowest of equal ones), or the lowest gap that fits; above all of them when
    no gap fits. Gaps are read bottom up over the neighbours sorted by (offset, end)."""
    size = buffers.sizes[index]
    own_rank = placement.rank[index]
    others = buffers.arrays[index]
    if len(others) >= VECTOR_DEGREE:
        earlier = others[placement.rank_array[others] < own_rank]
        if not len(earlier):
            return 0
        lows = placement.offset_array[earlier]
        highs = lows + buffers.size_array[earlier]
        by_offset = np.lexsort((highs, lows))
        lows, highs = lows[by_offset], highs[by_offset]
        tops = np.maximum.accumulate(highs)
        below = np.concatenate(([0], tops[:-1]))  # the top of everything under each neighbour
        gaps = lows - below
        fitting = np.flatnonzero(gaps >= size)
        if not len(fitting):
            return int(tops[-1])
        chosen = fitting[np.argmin(gaps[fitting])] if smallest_gap else fitting[0]
        return int(below[chosen])
    rank, offsets, sizes = placement.rank, placement.offsets, buffers.sizes
    chosen, chosen_gap, top = -1, 0, 0
    for low, high in sorted((offsets[o], offsets[o] + sizes[o]) for o in buffers.listed(index) if rank[o] < own_rank):
        gap = low - top
        if gap >= size and (chosen < 0 or gap < chosen_gap):
            chosen, chosen_gap = top, gap
            if not smallest_gap:
                break
        top = max(top, high)
    return top if chosen < 0 else chosen


def plan_arena(buffers: Mapping[str, Buffer], slack: float = 0.0, exact_limit: int = 8,
               work_budget: int = 8_000_000) -> Allocation:
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
    conflicting = _Conflicts(sizes, neighbours)
    target = bound * (1 + slack)
    lifetime = [b.last - b.first + 1 for b in items]
    orders = (
        list(range(len(items))),
        sorted(range(len(items)), key=lambda i: (-lifetime[i], -sizes[i], i)),
        sorted(range(len(items)), key=lambda i: (-sizes[i] * lifetime[i], i)),
    )
    arena, best = None, None
    for candidate in orders:
        placement, candidate_arena = place_in_order(candidate, conflicting)
        if arena is None or candidate_arena < arena:
            arena, best = candidate_arena, placement
        if arena <= target:
            break
    if arena > target:
        if len(items) <= exact_limit:
            offsets, arena = _exact(conflicting, bound, arena, best.offsets)
            return Allocation(dict(zip(names, offsets)), arena, bound)
        pairs = sum(len(n) for n in neighbours) // 2
        moves = max(20, work_budget // (len(items) + pairs + 1))
        best, arena = _hill_climb(best, conflicting, arena, target, moves)
    return Allocation(dict(zip(names, best.offsets if best else [])), arena or 0, bound)


def _exact(buffers: _Conflicts, bound: int, best_arena: int, best_offsets: list[int]) -> tuple[list[int], int]:
    """Branch and bound over placement orders with lowest-fit placement.

    Placing the buffers of an optimal solution in increasing offset order, each at the
    lowest offset free of its placed neighbours, lands every buffer at or below its optimal
    offset; so some order reaches the optimum and searching orders is exact. An unplaced
    buffer ranks after every placed one, so `_fit` sees the placed ones only.
    """
    count = len(buffers.sizes)
    placement = _Placement(range(count))
    placement.rank = [count] * count
    best = [best_arena, list(best_offsets)]

    def search(placed: int, arena: int) -> bool:
        if placed == count:
            best[0], best[1] = arena, list(placement.offsets)
            return arena <= bound
        for index in range(count):
            if placement.offsets[index] >= 0:
                continue
            placement.rank[index] = placed
            offset = _fit(index, placement, buffers, smallest_gap=False)
            if offset + buffers.sizes[index] < best[0]:
                placement.place(index, offset)
                if search(placed + 1, max(arena, offset + buffers.sizes[index])):
                    return True
                placement.place(index, -1)
            placement.rank[index] = count
        return False

    search(0, 0)
    return best[1], best[0]


def _hill_climb(placement: _Placement, buffers: _Conflicts, arena: int, target: float,
                moves: int) -> tuple[_Placement, int]:
    """Move one buffer to another place in the placement order, re-place, and keep the order
    when the arena does not grow (ties are kept too, so the climb can cross plateaus).

    Half the moves take a buffer that reaches the arena's top, the rest any buffer; the random
    source is seeded, so plans are reproducible. A candidate is dropped as soon as a buffer
    grows past the current arena.
    """
    rng = random.Random(0)
    count = len(placement.order)
    sizes = buffers.sizes
    for _ in range(moves):
        if arena <= target:
            break
        if rng.random() < 0.5:
            offsets = placement.offsets
            at = rng.choice([rank for rank, i in enumerate(placement.order) if offsets[i] + sizes[i] == arena])
        else:
            at = rng.randrange(count)
        to = rng.randrange(count)
        candidate = placement.moved(at, to)
        if _replace_after_move(candidate, placement.order[at], min(at, to), max(at, to), buffers, arena):
            placement = candidate
            arena = int((placement.offset_array + buffers.size_array).max())
    return placement, arena


def _replace_after_move(placement: _Placement, moved: int, low: int, high: int, buffers: _Conflicts,
                        arena: int) -> bool:
    """Bring `placement`'s offsets, still those of the order before `moved` moved between
    positions `low` and `high`, up to date; False as soon as a buffer ends above `arena`.

    The result is what placing every buffer again in the new order gives, re-fitting only the
    buffers whose fit can differ: the moved one, its neighbours it passed (they gained or lost
    it below them), and, in order, the later neighbours of every buffer whose offset changed.
    A buffer none of that touches sees the same neighbours at the same offsets as before.
    """
    rank = placement.rank
    pending = [(rank[moved], moved)]
    pending += [(rank[other], other) for other in buffers.listed(moved) if low <= rank[other] <= high]
    heapq.heapify(pending)
    done: set[int] = set()
    while pending:
        position, index = heapq.heappop(pending)
        if index in done:
            continue
        done.add(index)
        offset = _fit(index, placement, buffers, smallest_gap=True)
        if offset + buffers.sizes[index] > arena:
            return False
        if offset != placement.offsets[index]:
            placement.place(index, offset)
            for other in buffers.listed(index):
                if rank[other] > position:
                    heapq.heappush(pending, (rank[other], other))
    return True


def verify_allocation(plan) -> list[str]:
    """Every way the arena placement of `plan` (a `rkcompile.plan.schema.PlanRecord`) is wrong; empty when sound.

    Checks the arena and, alike, the `cpu` region (the CPU steps' tensors in host memory,
    `memory.cpu_arena_bytes`), each on its own: every tensor's live range is rebuilt from the
    steps (a read of an alias is a read of the tensor whose bytes it is, on which the alias must
    lie), then offsets are aligned and in bounds, the region's size covers every tensor, live
    tensors never share a byte (except a declared in-place reuse, where the reader's last step
    is the writer's first and both start at the same offset), and the arena's recorded lower
    bound is its live-bytes peak.
    """
    memory = plan.memory
    problems, peak = _region_problems(plan, "arena", "arena", memory.arena_bytes)
    problems += _region_problems(plan, "cpu", "cpu region", memory.cpu_arena_bytes)[0]
    if peak != memory.lower_bound_bytes:
        problems.append(f"lower bound {memory.lower_bound_bytes} is not the live-bytes peak {peak}")
    if memory.lower_bound_bytes > memory.arena_bytes:
        problems.append("arena smaller than the lower bound")
    return problems


def _region_problems(plan, region: str, called: str, size: int) -> tuple[list[str], int]:
    """What is wrong with the placement of `region`'s tensors in its `size` bytes (`called` in
    the messages), and the most bytes its tensors hold live at one step."""
    alignment = plan.memory.alignment
    placed = {name: t for name, t in plan.tensors.items() if t.region == region and t.aliases is None}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step in plan.steps:
        for name in (*step.inputs, *step.outputs):
            aliased = plan.tensors.get(name)
            name = aliased.aliases if aliased is not None and aliased.aliases is not None else name
            if name in placed:
                first.setdefault(name, step.id)
                last[name] = step.id
    problems = []
    for name, tensor in plan.tensors.items():
        if tensor.region != region or tensor.aliases is None:
            continue
        source = placed.get(tensor.aliases)
        if source is None or source.offset != tensor.offset or source.bytes != tensor.bytes:
            problems.append(f"{region} tensor {name} aliases {tensor.aliases} but does not lie on its bytes")
    for name, tensor in placed.items():
        if tensor.offset < 0 or tensor.offset + tensor.bytes > size:
            problems.append(f"{region} tensor {name} at [{tensor.offset}, {tensor.offset + tensor.bytes}) "
                            f"is outside the {size}-byte {called}")
        if tensor.offset % alignment:
            problems.append(f"{region} tensor {name} offset {tensor.offset} is not {alignment}-byte aligned")
        reused = tensor.reuses
        if reused is not None:
            source = placed.get(reused)
            if (source is None or source.offset != tensor.offset or tensor.bytes > source.bytes
                    or last.get(reused) != first.get(name)):
                problems.append(f"{region} tensor {name} reuses {reused} but does not start where and when it ends")
    live: list[str] = []
    for name in sorted(first, key=first.get):
        live = [other for other in live if last[other] >= first[name]]
        low, high = placed[name].offset, placed[name].offset + placed[name].bytes
        for other in live:
            if placed[other].offset < high and low < placed[other].offset + placed[other].bytes:
                in_place = placed[name].reuses == other and last[other] == first[name]
                if not in_place:
                    problems.append(f"{region} tensors {other} and {name} are live together and overlap")
        live.append(name)
    # An in-place pair shares its bytes at the one step where both are live: count them once.
    padded = {name: -(-placed[name].bytes // alignment) * alignment for name in first}
    delta: dict[int, int] = {}
    for name in first:
        delta[first[name]] = delta.get(first[name], 0) + padded[name]
        delta[last[name] + 1] = delta.get(last[name] + 1, 0) - padded[name]
        reused = placed[name].reuses
        if reused in first and last[reused] == first[name]:
            shared = min(padded[name], padded[reused])
            delta[first[name]] -= shared
            delta[first[name] + 1] = delta.get(first[name] + 1, 0) + shared
    peak = running = 0
    for step in sorted(delta):
        running += delta[step]
        peak = max(peak, running)
    return problems, peak
