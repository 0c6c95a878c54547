"""--auto-float16 COSINE: the fewest NPU steps to compute in float16 so that an int8 plan's
outputs reach COSINE against the planned graph in float32 (accuracy analysis's reference) on
every calibration sample (every --val sample when given: rkcompile/compiler/validation.py); on
a sample where the all-float16 plan's cosine is lower, that cosine (float16 has its own
rounding: a random-weight network, or one odd sample, can be ill-conditioned enough to miss
0.999 in float16). Each sample keeps its own target: one sample float16 itself cannot bring to
COSINE lowers the bar for that sample only, not for the others.

Candidates are the int8 tensors `--float16` accepts: every int8 output of an NPU step and every
model input's NPU copy. Two searches (docs/quantization.md compares them):

- **sensitivity** (the default): each candidate's cost to the output when it alone is rounded
  to its int8 grid in a float32 run of the planned graph (the first calibration sample): in a
  network whose error grows with depth, an early tensor's small rounding costs more at the
  output than its own step's drop shows. The candidates in that order, the shortest prefix that
  reaches the target is found by bisection over real int8 plans, then each chosen step is
  dropped again, least sensitive first, while the target still holds.
- **worst_drop** (the simple baseline): accuracy analysis, float16 for the step with the
  largest drop (the cosine the step itself loses), plan again, repeat until the target holds.

Every candidate set is judged by planning it and running it on the calibration samples (on the
runtime the compile was given: rkcompile/compiler/context.py). The passes before quantize (the
pipeline's front half, run once by `pipeline.compile_model`), the calibration run, the float32
reference outputs and the sensitivity ranking are computed once per search and shared by every
candidate plan (`Planner`). The report lists the chosen tensors with each step's extra time under the cost model
(rkcompile/plan/cost_model.py), float16 against int8.
"""
from __future__ import annotations

import collections.abc
import contextlib
import copy
import dataclasses
import functools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np

from rkcompile.collector import cyclic_collector_paused
from rkcompile.compiler.context import CompileContext, FloatGraph, Runtime
from rkcompile.options import INT8_SETTINGS
from rkcompile.plan.aliases import with_views
from rkcompile.plan.cost_model import StepWork, hardware_for, step_seconds
from rkcompile.plan.plain_nodes import Constant, Node, Variable
from rkcompile.passes.quantize import idle_techniques
from rkcompile.plan.schema import Int8Technique, PlanRecord
from rkcompile.quantization.params import KeptDraws, dequantize, quantize, samples_for
from rkcompile.targets import get_target

STRATEGIES = ("sensitivity", "worst_drop")
#: The pipeline's back half (`pipeline.finish_plan`): a context after the passes before quantize
#: -> quantize and every pass after it run on it, and the plan assembled (passed in: the pipeline
#: calls this stage)
Finish = Callable[[CompileContext], PlanRecord]
#: Chosen tensors tried again without, at most, after the bisection (each try is one plan).
PRUNE_TRIES = 24
#: Weights of the plans a Judge keeps at once (`Judge.keep`): every int8 candidate of a model
#: of up to 64 MiB of int8 weights
KEPT_WEIGHT_BYTES = 512 << 20
#: QuantizeLinear's and DequantizeLinear's first opset (`rounded_reference` writes them)
ROUNDING_OPSET = 10


@dataclass
class Search:
    """What a search found: the chosen tensors, the plan with them in float16 (and its compile
    context), its worst calibration cosine, and how many plans it judged. Per calibration
    sample, in the calibration set's order: the chosen plan's cosine, the all-float16 plan's,
    and the target, min(wanted, the all-float16 plan's)."""
    chosen: tuple[str, ...]
    plan: Any  # rkcompile.api.Plan
    cosine: float
    wanted: float
    cosines: tuple[float, ...]
    targets: tuple[float, ...]
    all_float16_cosines: tuple[float, ...]
    plans_judged: int = 0
    start_cosine: float = 1.0
    technique: Int8Technique | None = None
    context: CompileContext | None = None


def candidates(record: PlanRecord) -> list[str]:
    """Tensors `--float16` accepts in this plan, in step order: int8 outputs of NPU steps and
    the int8 NPU copies of model inputs (host conversions of a model input)."""
    inputs = {spec.name for spec in record.model.inputs}
    found = []
    for step in record.steps:
        if step.device == "npu" or (step.device == "host" and step.inputs and step.inputs[0] in inputs):
            found += [name for name in step.outputs if record.tensors[name].dtype == "int8" and name not in found]
    return found


class Planner:
    """Plans one model again and again with different float16 tensors or int8 settings. Neither
    changes the passes before quantize, so those ran once (`before_quantize`, the pipeline's
    front half) and each plan starts from a copy of the graph quantize receives, which `finish`
    plans; and the quantize pass's float32 calibration run depends on none of them
    (passes/quantize.py `_reuse_calibration`), so the first plan's (the first without extra
    float16 tensors: every later plan's int8 tensors are among its) serves every later one.
    `options` holds the settings a plan not given its own uses."""

    def __init__(self, before_quantize: CompileContext, finish: Finish):
        self.options = dataclasses.replace(before_quantize.options, auto_float16=None)
        self.before_quantize, self.finish = before_quantize, finish
        self.calibration = None  # the quantize pass's `Calibration` the plans share
        self.kept_draws = KeptDraws()  # the observers' kept positions, drawn once for every calibration

    @functools.cached_property
    def samples(self) -> list[dict[str, np.ndarray]]:
        """The calibration inputs every plan calibrates on and a Judge judges on, read once (a
        folder of images decoded once, the warning for seeded random ones given once)."""
        return samples_for(self.options, self.inputs)

    @property
    def inputs(self):
        return self.before_quantize.model_info.inputs

    def idle_techniques(self) -> set[str]:
        """The int8 techniques that would change nothing in this model's plans (passes/quantize.py)."""
        return idle_techniques(self.before_quantize)

    def __call__(self, tensors: Sequence[str], settings: Mapping[str, Any] | None = None,
                 ) -> tuple[PlanRecord, CompileContext]:
        """The plan with `tensors` in float16 too, under `settings` (Options fields) if given."""
        start = self.before_quantize
        options = dataclasses.replace(
            self.options, float16_tensors=tuple(dict.fromkeys((*self.options.float16_tensors, *tensors))),
            **(settings or {}))
        with cyclic_collector_paused():
            # gs.Graph has its own copy (deepcopy trips over its attribute lookup); the copy's
            # constants share their arrays, which the quantize pass replaces and never writes to
            ctx = copy.deepcopy(start, {id(start.target): start.target, id(start.graph): start.graph.copy(),
                                        id(start.runtime): start.runtime})
            ctx.options = options
            ctx.calibration = self.calibration
            ctx.calibration_samples = self.samples
            ctx.kept_draws = self.kept_draws
            record = self.finish(ctx)
        if not tensors:
            self.calibration = ctx.calibration
        return record, ctx


class Judge:
    """Plans a set of float16 tensors (under given int8 settings, or the planner's) and measures
    its worst output cosine over the calibration samples against the float32 planned graph
    (computed once: neither float16 choices nor int8 settings change it). Keeps each plan's
    cosine and only the latest plan (a plan holds the model's weights).

    Asked whether a set reaches a `goal` (one for all samples, or one per sample: `reaches`), it
    stops at the first sample below its goal: the answer is the same, and the cosine it keeps is
    then that sample's, an upper bound of the worst (the samples go worst first, in the order of
    the first plan's cosines)."""

    def __init__(self, planner: Planner, runtime: Runtime, samples: list[dict[str, np.ndarray]],
                 judged_on: str = "calibration"):
        self.planner, self.runtime, self.judged_on = planner, runtime, judged_on
        self.given_samples = samples  # in the calibration set's order
        self.order = list(range(len(samples)))  # the given indices in judging order (worst first, once known)
        self.plans_judged = 0
        self.cosines: dict[tuple, tuple[float, bool]] = {}  # plan's key -> cosine, whether every sample ran
        self.sample_cosines: dict[tuple, dict[int, float]] = {}  # plan's key -> given index -> cosine, of those run
        self.latest: tuple[tuple, Any, CompileContext] | None = None
        self.kept: dict[tuple, tuple[Any, CompileContext]] = {}  # plans `keep` asked for, by key
        self.expected: Sequence[dict[str, np.ndarray]] | None = None  # per given sample
        self.ahead: dict[tuple, Any] = {}  # (plan's key, given index) -> its outputs' Future (`run_ahead`)

    def on(self, validation: list[dict[str, np.ndarray]]) -> "Judge":
        """A Judge of the same planner's plans on the --val samples instead (the plans still
        calibrate on the calibration samples), starting from this one's latest plan."""
        judge = Judge(self.planner, self.runtime, validation, judged_on="validation")
        judge.latest = self.latest
        return judge

    def planned(self, tensors: Sequence[str], settings: Mapping[str, Any] | None = None) -> tuple[Any, CompileContext]:
        """The plan (rkcompile.api.Plan) with `tensors` in float16 under `settings`, and its compile context."""
        key = self.key(tensors, settings)
        if self.latest is None or self.latest[0] != key:
            if key in self.kept:
                self.latest = (key, *self.kept[key])
            else:
                record, ctx = self.planner(tensors, settings)
                self.latest = (key, self.runtime.runnable(record, ctx), ctx)
        return self.latest[1], self.latest[2]

    def keep(self, tensors: Sequence[str], settings: Mapping[str, Any] | None = None) -> None:
        """Hold on to the plan once made, while the plans kept hold at most KEPT_WEIGHT_BYTES
        of weights (judging that alternates between plans would otherwise plan them again at
        each switch); `release` lets go of all."""
        plan, ctx = self.planned(tensors, settings)
        held = sum(kept.record.memory.weight_bytes for kept, _ in self.kept.values())
        if held + plan.record.memory.weight_bytes <= KEPT_WEIGHT_BYTES:
            self.kept[self.key(tensors, settings)] = (plan, ctx)

    def release(self) -> None:
        self.kept, self.ahead = {}, {}

    def two_at_a_time(self) -> ContextManager:
        """The runtime's context for runs made two at a time (`Runtime.two_at_a_time`, optional)."""
        context = getattr(self.runtime, "two_at_a_time", None)
        return contextlib.nullcontext() if context is None else context()

    def run_ahead(self, tensors: Sequence[str], settings: Mapping[str, Any] | None, index: int,
                  here: bool = False) -> None:
        """Run the plan on given sample `index` before it is asked for, for `sample_cosine` to
        take up when it is: started on the runtime's other runner, a thread or a process (when
        it has one: `Runtime.run_ahead`), or with `here`, run on this thread now (while the other
        runner runs another sample)."""
        key = self.key(tensors, settings)
        run_ahead = getattr(self.runtime, "run_ahead", None)
        if run_ahead is None or index in self.sample_cosines.get(key, {}) or (key, index) in self.ahead:
            return
        plan, _ = self.planned(tensors, settings)
        if here:
            self.ahead[(key, index)] = done = Future()
            done.set_result(self.runtime.run(plan, self.given_samples[index]))
        else:
            self.ahead[(key, index)] = run_ahead(plan, self.given_samples[index])

    def in_flight(self, tensors: Sequence[str], settings: Mapping[str, Any] | None, index: int) -> bool:
        """Whether the other runner is running the plan on sample `index` (`run_ahead`)."""
        found = self.ahead.get((self.key(tensors, settings), index))
        return found is not None and not found.done()

    def __call__(self, tensors: Sequence[str], goal: float | None = None,
                 settings: Mapping[str, Any] | None = None) -> float:
        """The worst cosine over the samples; with `goal`, possibly a larger one below `goal`."""
        key = self.key(tensors, settings)
        known, complete = self.cosines.get(key, (None, False))
        if known is not None and (complete or (goal is not None and known < goal)):
            return known
        self._judge(tensors, settings, lambda index, cosine: goal is not None and cosine < goal)
        return self.cosines[key][0]

    def reaches(self, tensors: Sequence[str], goals: Sequence[float]) -> bool:
        """Whether the plan's cosine reaches each sample's own goal (`goals` in the calibration
        set's order) on every sample."""
        known = self.sample_cosines.get(self.key(tensors), {})
        if any(cosine < goals[index] for index, cosine in known.items()):
            return False
        if len(known) < len(self.order):
            self._judge(tensors, None, lambda index, cosine: cosine < goals[index])
            known = self.sample_cosines[self.key(tensors)]
        return len(known) == len(self.order) and all(cosine >= goals[index] for index, cosine in known.items())

    def per_sample(self, tensors: Sequence[str]) -> tuple[float, ...]:
        """The plan's cosine on each sample, in the calibration set's order."""
        self(tensors)
        known = self.sample_cosines[self.key(tensors)]
        return tuple(known[index] for index in range(len(self.order)))

    def _judge(self, tensors: Sequence[str], settings: Mapping[str, Any] | None,
               below: Callable[[int, float], bool], count: int | None = None) -> None:
        """Plan and run the set on the samples in judging order (the first `count` of them, if
        given), until `below(given index, cosine)`. A sample this plan already ran is not run
        again: the same plan gives the same outputs."""
        for index in self.order[:count]:
            if below(index, self.sample_cosine(tensors, settings, index)):
                break

    def sample_cosine(self, tensors: Sequence[str], settings: Mapping[str, Any] | None, index: int) -> float:
        """The plan's cosine on given sample `index`, run once. The first plan to have run every
        sample sets the judging order from then on: its worst samples first."""
        key = self.key(tensors, settings)
        per_sample = self.sample_cosines.get(key)
        if per_sample is None:
            per_sample = self.sample_cosines[key] = {}
            self.plans_judged += 1
        if index in per_sample:
            return per_sample[index]
        plan, _ = self.planned(tensors, settings)
        expected = self.expected_outputs(plan)[index]
        ahead = self.ahead.pop((key, index), None)
        outputs = ahead.result() if ahead is not None else self.runtime.run(plan, self.given_samples[index])
        per_sample[index] = min(self.runtime.cosine(name, outputs[name], value) for name, value in expected.items())
        complete = len(per_sample) == len(self.order)
        if complete and not any(done for _, done in self.cosines.values()):
            self.order = sorted(self.order, key=per_sample.__getitem__)
        self.cosines[key] = (min(per_sample.values()), complete)
        return per_sample[index]

    def hardest_first(self, plan) -> list[int] | None:
        """The given samples' indices, the hardest for `plan` first: by its cosine run as
        `rounded_reference` (float32 with its int8 tensors rounded to their grids, a float run's
        cost), the lowest first; None for a plan of an opset before QuantizeLinear (10). For the
        judging order (`order`): only the order moves, each cosine recorded is still a plan's
        own run, and a first plan to run every sample sets the order by its own cosines."""
        if plan.record.model.opset < ROUNDING_OPSET:
            return None
        rounded = rounded_reference(plan, self.runtime)
        expected = self.expected_outputs(plan)
        cosines = [min(self.runtime.cosine(name, outputs[name], value) for name, value in expected[index].items())
                   for index, outputs in enumerate(map(rounded.run, self.given_samples))]
        return sorted(range(len(cosines)), key=cosines.__getitem__)

    def expected_outputs(self, plan) -> Sequence[dict[str, np.ndarray]]:
        """The float32 reference outputs of every given sample (`plan`'s graph with the model's
        constants: the same for every plan of the model), computed once: taken from a
        calibration run that ran the same computation on these samples (`calibrated_outputs`),
        else computed on a thread of their own in the samples' order while candidates run (an
        item waits for its sample's)."""
        if self.expected is None:
            reference = float_reference(plan, self.runtime)
            self.expected = self.calibrated_outputs(reference) or InBackground(reference.run, self.given_samples)
        return self.expected

    def calibrated_outputs(self, reference: FloatGraph) -> Sequence[dict[str, np.ndarray]] | None:
        """The graph outputs a calibration run of the planner kept, when it ran on the samples
        judged here and its float32 graph gives `reference`'s outputs bit for bit on each
        (`FloatGraph.same_outputs`, optional: a runtime without it computes the reference)."""
        same_outputs = getattr(reference, "same_outputs", None)
        if same_outputs is None or self.given_samples is not self.planner.samples:
            return None
        calibration = self.planner.calibration
        if calibration is not None and calibration.outputs is not None and all(
                same_outputs(calibration.graph, sample) for sample in self.given_samples):
            return calibration.outputs
        return None

    def key(self, tensors: Sequence[str], settings: Mapping[str, Any] | None = None) -> tuple:
        """A plan's key: its float16 tensors and the int8 settings it is planned with (`settings`
        over the planner's), so a plan is judged once however it is named."""
        settings = settings or {}
        return frozenset(tensors), tuple(settings.get(name, getattr(self.planner.options, name)) for name in INT8_SETTINGS)

    def complete(self, tensors: Sequence[str], settings: Mapping[str, Any] | None = None) -> bool:
        """Whether the judged plan's cosine is over every sample (not stopped below a goal)."""
        return self.cosines[self.key(tensors, settings)][1]


class InBackground(collections.abc.Sequence):
    """function(item) for each of `items`, computed one after another on a thread of their own
    (numpy and onnxruntime let go of the interpreter while they compute); indexing waits for
    that item's result and raises what its call raised."""

    def __init__(self, function: Callable[[Any], Any], items: Sequence):
        worker = ThreadPoolExecutor(1)
        self.results = [worker.submit(function, item) for item in items]
        worker.shutdown(wait=False)  # the thread ends once it has computed them all

    def __getitem__(self, index):
        return self.results[index].result()

    def __len__(self) -> int:
        return len(self.results)


def judge_for(before_quantize: CompileContext, finish: Finish) -> Judge:
    """A Judge of the plans `finish` makes from `before_quantize` (a context after the pipeline's
    front half, with its options and runtime), on its calibration samples."""
    planner = Planner(before_quantize, finish)
    return Judge(planner, before_quantize.runtime, planner.samples)


def rounded_reference(plan, runtime: Runtime) -> FloatGraph:
    """The runtime's float32 run of `plan`'s own steps (the weights it stores: int8 weights and
    corrected biases, dequantized), each int8 activation a step writes rounded to its grid by a
    QuantizeLinear and DequantizeLinear pair: the plan's int8 arithmetic approximated at a float
    run's cost (mobilenet_v2: a Spearman rank correlation of 0.87 with the plan's own cosines
    over 32 calibration samples), for ordering samples, never for a cosine a plan records."""
    record = plan.record
    activations = {name: quant for name, quant in record.quantization.items()  # a fused step's inner ones aside
                   if name in record.tensors and record.tensors[name].region != "weight"
                   and quant.dtype == "int8" and quant.axis is None}
    nodes, devices = [], []
    for node, device in zip(*with_views(record, plan.step_nodes())):
        rounded = [tensor.name for tensor in node.outputs if tensor.name in activations]
        renamed = {name: f"{name}/float32" for name in rounded}
        nodes.append(dataclasses.replace(node, outputs=[
            Variable(renamed[t.name]) if t.name in renamed else t for t in node.outputs]))
        devices.append(device)
        for name in rounded:
            quant = activations[name]
            grid = [Constant(f"{name}/scale", np.array(quant.scales[0], np.float32)),
                    Constant(f"{name}/zero_point", np.array(quant.zero_points[0], np.int8))]
            nodes += [Node("QuantizeLinear", f"{name}/quantize", {}, [Variable(renamed[name]), *grid],
                           [Variable(f"{name}/int8")]),
                      Node("DequantizeLinear", f"{name}/dequantize", {}, [Variable(f"{name}/int8"), *grid],
                           [Variable(name)])]
            devices += [device, device]
    return runtime.float_graph(nodes, devices, record.model.opset, [spec.name for spec in record.model.outputs], ())


def float_reference(plan, runtime: Runtime) -> FloatGraph:
    """The runtime's float32 run of `plan`'s graph with the model's constants (the reference
    every candidate is judged against)."""
    record = plan.record
    return runtime.float_graph(*with_views(record, plan.reference_nodes), record.model.opset,
                               [spec.name for spec in record.model.outputs])


def sensitivities(plan, tensors: Sequence[str], sample: dict[str, np.ndarray], runtime: Runtime) -> dict[str, float]:
    """Per tensor, the output cosine lost when it alone is rounded to its int8 grid."""
    reference = float_reference(plan, runtime)
    expected = reference.run(sample)
    losses = {}
    for name in tensors:
        quant = plan.record.quantization[name]

        def rounded(tensor: str, value: np.ndarray, name=name, quant=quant) -> np.ndarray | None:
            return dequantize(quantize(value, quant), quant) if tensor == name else None

        produced = reference.run(sample, adjust=rounded)
        losses[name] = 1.0 - min(runtime.cosine(out, produced[out], value) for out, value in expected.items())
    return losses


def choose(judge: Judge, wanted: float, strategy: str = "sensitivity",
           progress: Callable[[str], None] | None = None) -> Search:
    """The search of `strategy` for `wanted` (see the module docstring) with the int8 settings
    `judge`'s planner holds (each given a value), planned and judged by `judge`."""
    say = progress or (lambda text: None)
    samples = judge.given_samples
    start = judge(())
    int8, _ = judge.planned(())
    pool = candidates(int8.record)
    all_float16 = judge.per_sample(pool)
    goals = tuple(min(wanted, cosine) for cosine in all_float16)
    say(f"int8 cosine {start:.6f}, all {len(pool)} candidates in float16 {min(all_float16):.6f}: "
        f"{targets_note(wanted, goals)}")
    chosen: list[str] = []
    if not judge.reaches((), goals):
        chosen = (_by_sensitivity if strategy == "sensitivity" else _by_worst_drop)(judge, int8, pool, goals, samples, say)
    plan, ctx = judge.planned(chosen)
    search = Search(tuple(chosen), plan, judge(chosen), wanted, judge.per_sample(chosen), goals, all_float16,
                    judge.plans_judged, start_cosine=start, context=ctx)
    search.technique = report(search, int8.record, judge.judged_on)
    return search


def _by_sensitivity(judge: Judge, plan, pool: list[str], goals: Sequence[float], samples, say) -> list[str]:
    losses = sensitivities(plan, pool, samples[0], judge.runtime)
    ranked = sorted(pool, key=lambda name: -losses[name])
    low, high = 0, len(ranked)  # ranked[:low] misses the goals (or low is 0); ranked[:high] meets them
    while high - low > 1:
        middle = (low + high) // 2
        reached = judge.reaches(ranked[:middle], goals)
        say(f"  first {middle} by sensitivity: {_shown(judge, ranked[:middle], reached)}")
        low, high = (low, middle) if reached else (middle, high)
    chosen = ranked[:high]
    for name in sorted(chosen, key=lambda name: losses[name])[:PRUNE_TRIES]:
        if len(chosen) == 1:
            break
        without = [other for other in chosen if other != name]
        if judge.reaches(without, goals):
            say(f"  without {name}: {_shown(judge, without, True)}, dropped")
            chosen = without
    return chosen


def _by_worst_drop(judge: Judge, plan, pool: list[str], goals: Sequence[float], samples, say) -> list[str]:
    chosen: list[str] = []
    while len(chosen) < len(pool):
        drops = {name: drop for name, drop in judge.runtime.step_drops(plan, samples[0]).items()
                 if name in pool and name not in chosen}
        if not drops:
            break
        chosen.append(max(drops, key=drops.get))
        reached = judge.reaches(chosen, goals)
        plan, _ = judge.planned(chosen)
        say(f"  + {chosen[-1]} (drop {drops[chosen[-1]]:.6f}): {_shown(judge, chosen, reached)}")
        if reached:
            break
    return chosen


def _shown(judge: Judge, tensors: Sequence[str], reached: bool) -> str:
    cosine = judge.cosines[judge.key(tensors)][0]
    return f"{cosine:.6f}" if reached else f"{cosine:.6f} (a sample below its target; judging stopped there)"


def targets_note(wanted: float, goals: Sequence[float]) -> str:
    """Which target holds on which calibration samples (1-based, in the calibration set's
    order): `wanted`, or, where it is lower, the all-float16 plan's cosine, with each such
    sample's."""
    lowered = [f"sample {index + 1} {goal:.6f}" for index, goal in enumerate(goals) if goal < wanted]
    if not lowered:
        return f"target {wanted:.6f} on all {len(goals)} samples"
    return (f"target {wanted:.6f} on {len(goals) - len(lowered)} of {len(goals)} samples, the all-float16 plan's "
            f"cosine on the rest: {', '.join(lowered)}")


def report(search: Search, int8: PlanRecord, judged_on: str = "calibration") -> Int8Technique:
    """The `auto_float16` entry of the chosen plan: each tensor with its step's extra time under
    the cost model, float16 against int8; its cosines are over the `judged_on` samples."""
    costs = step_costs(int8, search.plan.record, search.chosen)
    applied = tuple(f"{name} (+{costs[name] * 1e3:.4f} ms)" for name in search.chosen)
    missed = [str(index + 1) for index, (cosine, goal) in enumerate(zip(search.cosines, search.targets))
              if cosine < goal]
    reached = (f"missed {targets_note(search.wanted, search.targets)}; below its target: sample "
               f"{', '.join(missed)}" if missed else f"reached {targets_note(search.wanted, search.targets)}")
    note = (f"{len(search.chosen)} of {len(candidates(int8))} int8 tensors in float16, worst {judged_on} "
            f"cosine {search.start_cosine:.6f} -> {search.cosine:.6f} ({reached}), "
            f"+{sum(costs.values()) * 1e3:.4f} ms estimated; {search.plans_judged} plans judged")
    return Int8Technique("auto_float16", applied, (), note)


def step_costs(int8: PlanRecord, hybrid: PlanRecord, tensors: Sequence[str]) -> dict[str, float]:
    """Per tensor, its writing step's estimated seconds in `hybrid` minus in `int8`."""
    hardware = hardware_for(get_target(int8.target))

    def seconds(record: PlanRecord, name: str) -> float:
        step = next(s for s in record.steps if name in s.outputs)
        sizes = {t: record.tensors[t] for t in (*step.inputs, *step.outputs) if t in record.tensors}
        work = StepWork(step.device, step.macs,
                        sum(t.bytes for n, t in sizes.items() if n in step.inputs and t.region == "weight"),
                        sum(t.bytes for n, t in sizes.items() if n in step.inputs and t.region != "weight"),
                        sum(t.bytes for n, t in sizes.items() if n in step.outputs))
        dtype = "float16" if record.tensors[name].dtype == "float16" else "int8"
        return step_seconds(work, hardware, dtype)

    return {name: seconds(hybrid, name) - seconds(int8, name) for name in tensors}
