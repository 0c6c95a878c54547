"""The arena planner and verify_allocation: allocator cases with known totals, in-place reuse,
every zoo and light plan verified and within 2% of its lower bound, and big graphs stay fast."""
from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import replace

import numpy as np
import pytest
from conftest import PRIMARY_TARGETS, light_models, make_model, needs_zoo, value_info, weight, zoo_models
from onnx import helper

from rkcompile.plan.allocation import (Buffer, conflicts, live_ranges, lower_bound, plan_arena,
    verify_allocation)
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import PlanRecord, contract_violations


def buffers_of(tuples):
    return {f"t{i}": Buffer(start, end, size) for i, (start, end, size) in enumerate(tuples)}


def assert_sound(allocation, buffers):
    """No two buffers live at the same step share a byte, and the arena holds them all."""
    for (a, x), (b, y) in itertools.combinations(buffers.items(), 2):
        if x.first <= y.last and y.first <= x.last:
            ox, oy = allocation.offsets[a], allocation.offsets[b]
            assert ox + x.size <= oy or oy + y.size <= ox, f"{a} and {b} overlap"
    assert all(allocation.offsets[n] + b.size <= allocation.arena_bytes for n, b in buffers.items())


@pytest.mark.parametrize("tuples,lower,arena", [
    ([(0, 1, 10), (1, 2, 10), (2, 3, 10)], 20, 20),           # a chain: two live at a time
    ([(0, 0, 5), (1, 1, 7)], 7, 7),                           # disjoint lives share everything
    ([(0, 5, 3), (0, 5, 4), (0, 5, 5)], 12, 12),              # all live together: stacked
    ([(0, 2, 8), (1, 1, 4), (3, 4, 12), (2, 3, 4)], 16, 16),  # a gap under a long-lived buffer is reused
    # Greedy-by-size alone needs 7 here (the 3-byte buffer goes first and pushes a 2-byte one
    # up); the exact search finds the lower bound.
    ([(0, 3, 2), (4, 4, 4), (3, 3, 3), (2, 2, 2), (2, 2, 2)], 6, 6),
    ([], 0, 0),
])
def test_allocator_totals(tuples, lower, arena):
    buffers = buffers_of(tuples)
    allocation = plan_arena(buffers)
    assert (allocation.lower_bound_bytes, allocation.arena_bytes) == (lower, arena)
    assert_sound(allocation, buffers)


def test_live_ranges_run_from_writer_to_last_reader():
    steps = [((), ("a",)), (("a",), ("b",)), (("a", "b"), ("c",)), (("x",), ("d",))]
    assert live_ranges(steps, {"a", "b", "c", "d"}) == {"a": (0, 2), "b": (1, 2), "c": (2, 2), "d": (3, 3)}


def test_conflicts_are_exactly_the_overlapping_pairs():
    items = [Buffer(0, 2, 1), Buffer(2, 3, 1), Buffer(4, 4, 1), Buffer(1, 1, 1)]
    found = {frozenset((i, j)) for i, others in enumerate(conflicts(items)) for j in others}
    assert found == {frozenset(p) for p in [(0, 1), (0, 3)]}


def test_greedy_placement_reads_a_long_conflict_list_as_an_array_only():
    """One long-lived buffer beside 60 short ones: greedy placement fits it with numpy (60
    conflicts, over VECTOR_DEGREE) and never makes its Python list; the short ones' lists are
    made, and are their conflicts."""
    from rkcompile.plan.allocation import VECTOR_DEGREE, _Conflicts, place_in_order

    items = [Buffer(0, 100, 64)] + [Buffer(step, step, 64) for step in range(60)]
    assert len(items) - 1 >= VECTOR_DEGREE
    conflicting = _Conflicts([b.size for b in items], conflicts(items))
    _, arena = place_in_order(range(len(items)), conflicting)
    assert arena == lower_bound(items) == 128
    assert conflicting._lists[0] is None
    assert all(conflicting._lists[index] == [0] for index in range(1, len(items)))
    assert sorted(conflicting.listed(0)) == list(range(1, len(items)))  # conflict lists are in no set order


def test_conflicts_match_every_pair_checked_on_random_and_wide_sets():
    """Random live ranges (tied starts and ends, one-step ranges) against a check of every
    pair; and 70,000 buffers, more than 16-bit indices hold, each overlapping the two before
    and the two after it."""
    rng = random.Random(7)
    for _ in range(30):
        items = [Buffer(first, first + rng.choice([0, 0, 1, 3, 20]), 1)
                 for first in (rng.randrange(40) for _ in range(rng.randrange(1, 300)))]
        expected = [{j for j, other in enumerate(items)
                     if j != i and other.first <= item.last and item.first <= other.last}
                    for i, item in enumerate(items)]
        found = conflicts(items)
        assert [sorted(others.tolist()) for others in found] == [sorted(others) for others in expected]
    count = 70_000
    found = conflicts([Buffer(i, i + 2, 1) for i in range(count)])
    assert all(sorted(others.tolist()) == [j for j in range(i - 2, i + 3) if j != i and 0 <= j < count]
               for i, others in enumerate(found))


def test_big_graph_plans_fast_and_at_the_bound():
    """20,000 buffers, a chain with skip connections: the sweep keeps the planner near-linear."""
    count = 20_000
    buffers = {f"t{i}": Buffer(i, i + 1 + 2 * (i % 3 == 0), 1024 * (1 + i % 7)) for i in range(count)}
    started = time.perf_counter()
    allocation = plan_arena(buffers)
    elapsed = time.perf_counter() - started
    assert allocation.arena_bytes <= 1.02 * allocation.lower_bound_bytes
    assert elapsed < 10, f"planning 20,000 buffers took {elapsed:.1f}s"
    assert lower_bound(buffers.values()) == allocation.lower_bound_bytes


def _first_fit_offsets(buffers, slack=0.0, exact_limit=8, work_budget=1_000_000):
    """The planner as first written, kept here as the oracle: every fit sorts all placed
    neighbours in Python, and every hill-climb move re-places the whole suffix of the order."""
    import random
    names = sorted(buffers, key=lambda n: (-buffers[n].size, buffers[n].first, n))
    items = [buffers[n] for n in names]
    count, sizes = len(items), [b.size for b in items]
    neighbours = [[j for j in range(count) if j != i and items[i].first <= items[j].last
                   and items[j].first <= items[i].last] for i in range(count)]

    def fit(index, offsets, smallest_gap=True):
        chosen, chosen_gap, top = -1, 0, 0
        for low, high in sorted((offsets[o], offsets[o] + sizes[o]) for o in neighbours[index] if offsets[o] >= 0):
            gap = low - top
            if gap >= sizes[index] and (chosen < 0 or gap < chosen_gap):
                chosen, chosen_gap = top, gap
                if not smallest_gap:
                    break
            top = max(top, high)
        return top if chosen < 0 else chosen

    def place(order):
        offsets = [-1] * count
        for index in order:
            offsets[index] = fit(index, offsets)
        return offsets, max((offsets[i] + sizes[i] for i in order), default=0)

    bound = lower_bound(items)
    target = bound * (1 + slack)
    lifetime = [b.last - b.first + 1 for b in items]
    arena = None
    for candidate in (list(range(count)), sorted(range(count), key=lambda i: (-lifetime[i], -sizes[i], i)),
                      sorted(range(count), key=lambda i: (-sizes[i] * lifetime[i], i))):
        candidate_offsets, candidate_arena = place(candidate)
        if arena is None or candidate_arena < arena:
            arena, offsets, order = candidate_arena, candidate_offsets, candidate
        if arena <= target:
            break
    if arena > target and count <= exact_limit:
        best = [arena, list(offsets)]
        trial = [-1] * count

        def search(placed, reached):
            if placed == count:
                best[:] = [reached, list(trial)]
                return reached <= bound
            for index in (i for i in range(count) if trial[i] < 0):
                offset = fit(index, trial, smallest_gap=False)
                if offset + sizes[index] < best[0]:
                    trial[index] = offset
                    if search(placed + 1, max(reached, offset + sizes[index])):
                        return True
                    trial[index] = -1
            return False
        search(0, 0)
        arena, offsets = best
    elif arena > target:
        rng = random.Random(0)
        moves = max(20, work_budget // (count + sum(map(len, neighbours)) // 2 + 1))
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
            candidate_offsets = list(offsets)
            for index in candidate[min(at, to):]:
                candidate_offsets[index] = -1
            for index in candidate[min(at, to):]:
                candidate_offsets[index] = fit(index, candidate_offsets)
                if candidate_offsets[index] + sizes[index] > arena:
                    break
            else:
                order, offsets = candidate, candidate_offsets
                arena = max(offsets[i] + sizes[i] for i in order)
    return dict(zip(names, offsets)), arena


@pytest.mark.parametrize("seed", range(40))
def test_planner_places_as_the_plain_first_fit_does(seed):
    """The planner's fast paths (numpy fits for buffers with many conflicts, hill-climb moves
    that re-fit only the buffers a move can affect) give exactly the offsets of the plain
    algorithm, on random interval sets of every kind: few buffers (exact search), many
    short-lived ones, long-lived ones conflicting with most others (the numpy fit), and
    repeated and zero sizes (ties between gaps)."""
    rng = np.random.default_rng(seed)
    count = int(rng.choice([5, 8, 30, 120, 200]))
    steps = int(rng.integers(4, 3 * count))
    firsts = rng.integers(0, steps, count)
    spans = rng.integers(0, steps // (1 if seed % 3 == 0 else 8) + 1, count)
    sizes = rng.choice([0, 64, 128, 192, 320, 1024], count) if seed % 2 else rng.integers(1, 40, count) * 64
    buffers = {f"t{i}": Buffer(int(f), int(f + s), int(z)) for i, (f, s, z) in enumerate(zip(firsts, spans, sizes))}
    budget = 20_000  # a few hundred hill-climb moves on these sizes
    expected_offsets, expected_arena = _first_fit_offsets(buffers, work_budget=budget)
    allocation = plan_arena(buffers, work_budget=budget)
    assert (allocation.offsets, allocation.arena_bytes) == (expected_offsets, expected_arena)
    assert_sound(allocation, buffers)


def test_planner_searches_tiny_sets_as_the_plain_first_fit_does():
    """Sets of at most 8 buffers that greedy placement leaves above the lower bound go to the
    exact search (about 1 random set in 70 here): its offsets match the plain algorithm's too."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        count, steps = int(rng.integers(4, 9)), int(rng.integers(3, 8))
        firsts, spans = rng.integers(0, steps, count), rng.integers(0, steps, count)
        sizes = rng.integers(1, 9, count) * 64
        buffers = {f"t{i}": Buffer(int(f), int(f + s), int(z)) for i, (f, s, z) in enumerate(zip(firsts, spans, sizes))}
        allocation = plan_arena(buffers)
        assert (allocation.offsets, allocation.arena_bytes) == _first_fit_offsets(buffers)


def _elementwise_model(channels: int = 29, side: int = 64):
    """conv -> relu -> add(relu, conv) -> sigmoid -> conv -> add(conv, conv): relu, add and
    sigmoid stream, but only add and sigmoid hold the last use of an input they may overwrite;
    the first conv's output is read again at the end. Big enough to stay on the NPU."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "c"], ["a"], name="add"),
        helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
        helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "y"], ["out"], name="final"),
    ]
    return make_model(nodes, [value_info("x", [1, 13, side, side])], [value_info("out", [1, channels, side, side])],
                      [weight("w", np.full((channels, 13, 3, 3), 0.1, np.float32)),
                       weight("w2", np.full((channels, channels, 3, 3), 0.2, np.float32))])


def test_in_place_reuse_is_stated_and_sound(save):
    plan, _ = compile_model(save(_elementwise_model()), "rk3588")
    assert verify_allocation(plan) == []
    reused = {name: t.reuses for name, t in plan.tensors.items() if t.reuses}
    # relu may not overwrite c (read again later); add takes relu's bytes, sigmoid add's.
    assert reused == {"a": "r", "s": "a"}
    writer = {out: step for step in plan.steps for out in step.outputs}
    for name, source in reused.items():
        assert source in writer[name].inputs
        assert plan.tensors[name].offset == plan.tensors[source].offset
    assert all(plan.tensors[o].reuses is None for s in plan.steps if "Conv" in s.kernel for o in s.outputs)


def test_plan_json_keeps_reuses_and_alignment_and_old_plans_load(save):
    plan, _ = compile_model(save(_elementwise_model()), "rk3588")
    again = PlanRecord.from_dict(json.loads(plan.to_json()))
    assert again == plan
    data = json.loads(plan.to_json())
    del data["memory"]["alignment"]
    for tensor in data["tensors"].values():
        del tensor["reuses"]
    older = PlanRecord.from_dict(data)
    assert older.memory.alignment == 1 and all(t.reuses is None for t in older.tensors.values())


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory") / "model.onnx"
    import onnx
    onnx.save(_elementwise_model(), str(path))
    return compile_model(path, "rk3588")[0]


def _arena_names(plan):
    return [n for n, t in plan.tensors.items() if t.region == "arena" and t.bytes]


def test_verify_catches_overlapping_live_tensors(small_plan):
    live_together = None
    for step in small_plan.steps:
        names = [n for n in (*step.inputs, *step.outputs) if small_plan.tensors[n].region == "arena"
                 and small_plan.tensors[n].reuses is None]
        if len(names) >= 2:
            live_together = names[:2]
            break
    assert live_together
    a, b = live_together
    tensors = dict(small_plan.tensors)
    tensors[b] = replace(tensors[b], offset=tensors[a].offset)
    problems = verify_allocation(replace(small_plan, tensors=tensors))
    assert any(f"{a} and {b}" in p or f"{b} and {a}" in p for p in problems)


def test_verify_catches_out_of_bounds_misaligned_and_wrong_bound(small_plan):
    name = _arena_names(small_plan)[0]
    tensors = dict(small_plan.tensors)
    tensors[name] = replace(tensors[name], offset=small_plan.memory.arena_bytes)
    assert any("outside" in p for p in verify_allocation(replace(small_plan, tensors=tensors)))
    tensors[name] = replace(small_plan.tensors[name], offset=small_plan.tensors[name].offset + 1)
    assert any("aligned" in p for p in verify_allocation(replace(small_plan, tensors=tensors)))
    memory = replace(small_plan.memory, lower_bound_bytes=small_plan.memory.lower_bound_bytes - 16)
    assert any("lower bound" in p for p in verify_allocation(replace(small_plan, memory=memory)))


def test_verify_rejects_an_unfounded_reuse(small_plan):
    first_step = small_plan.steps[0]
    source = next(n for n in first_step.outputs if small_plan.tensors[n].region == "arena")
    later = next(n for s in small_plan.steps[2:] for n in s.outputs if small_plan.tensors[n].region == "arena")
    tensors = dict(small_plan.tensors)
    tensors[later] = replace(tensors[later], reuses=source, offset=tensors[source].offset)
    assert any("reuses" in p for p in verify_allocation(replace(small_plan, tensors=tensors)))


def test_cpu_step_tensors_live_in_host_memory_outside_the_arena(mixed_model):
    # Conv -> Erf (CPU) -> Conv: the Erf's converted input and its output only the CPU side
    # touches; they take the cpu region, planned apart, and the NPU's arena holds neither
    plan, _ = compile_model(mixed_model, "rk3588")
    erf = next(s for s in plan.steps if s.device == "cpu")
    held = {*erf.inputs, *erf.outputs}
    assert {n for n, t in plan.tensors.items() if t.region == "cpu"} == held
    assert all(plan.tensors[n].region == "arena" for s in plan.steps if s.device == "npu"
               for n in (*s.inputs, *s.outputs) if plan.tensors[n].region not in ("weight", "input", "output"))
    assert plan.memory.cpu_arena_bytes == max(plan.tensors[n].offset + plan.tensors[n].bytes for n in held)
    assert verify_allocation(plan) == [] and contract_violations(plan) == []
    assert plan.memory_totals().total_bytes == (plan.memory.weight_bytes + plan.memory.arena_bytes
                                                + plan.memory.cpu_arena_bytes + plan.memory_totals().input_bytes
                                                + plan.memory_totals().output_bytes)


def test_verify_catches_overlap_in_the_cpu_region_and_npu_steps_reading_it(mixed_model):
    plan, _ = compile_model(mixed_model, "rk3588")
    erf = next(s for s in plan.steps if s.device == "cpu")
    source, result = erf.inputs[0], erf.outputs[0]
    tensors = dict(plan.tensors)
    if tensors[result].reuses:  # an in-place pair may share its bytes: make it claim bytes of its own
        tensors[result] = replace(tensors[result], reuses=None)
    tensors[result] = replace(tensors[result], offset=tensors[source].offset)
    assert any(f"cpu tensors {source} and {result}" in p for p in verify_allocation(replace(plan, tensors=tensors)))
    npu_read = next(n for s in plan.steps if s.device == "npu" for n in s.inputs if plan.tensors[n].region == "arena")
    tensors = dict(plan.tensors, **{npu_read: replace(plan.tensors[npu_read], region="cpu")})
    assert any(f"the NPU step touches {npu_read}" in p for p in contract_violations(replace(plan, tensors=tensors)))


def test_plan_json_states_the_cpu_region_only_when_it_holds_bytes(mixed_model, small_plan):
    mixed, _ = compile_model(mixed_model, "rk3588")
    data = json.loads(mixed.to_json())
    assert data["memory"]["cpu_arena_bytes"] == mixed.memory.cpu_arena_bytes > 0
    assert PlanRecord.from_dict(data) == mixed
    assert "cpu_arena_bytes" not in json.loads(small_plan.to_json())["memory"]
    del data["memory"]["cpu_arena_bytes"]  # a plan written before the region existed
    assert PlanRecord.from_dict(data).memory.cpu_arena_bytes == 0


ALL_MODELS = [*zoo_models(), *light_models()]


@needs_zoo
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("model", ALL_MODELS, ids=[p.stem for p in ALL_MODELS])
def test_every_plan_verifies_and_is_within_two_percent(model, target):
    plan, _ = compile_model(model, target)
    assert verify_allocation(plan) == []
    assert plan.memory.arena_bytes <= 1.02 * plan.memory.lower_bound_bytes
