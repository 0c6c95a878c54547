"""--auto-float16 COSINE: the fewest NPU steps to compute in float16 so that an int8 plan's
outputs reach COSINE against the planned graph in float32 (accuracy analysis's reference) on
every calibration sample; or the all-float16 plan's cosine when that is lower (float16 has its
own rounding: a random-weight network can be ill-conditioned enough to miss 0.999 in float16).

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

Every candidate set is judged by planning it and emulating it on all calibration samples; the
report lists the chosen tensors with each step's extra time under the cost model
(rkcompile/cost_model.py), float16 against int8.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .context import CompileContext, Options
from .cost_model import StepWork, hardware_for, step_seconds
from .emulator import agreement
from .emulator.accuracy import analyse
from .emulator.float_reference import FloatReference
from .emulator.session import emulate
from .errors import CompileError
from .pipeline import compile_model
from .plan import Int8Technique, Plan as PlanRecord
from .quantize import ImagePreprocessing, calibration_samples, dequantize, quantize
from .targets import get_target

STRATEGIES = ("sensitivity", "worst_drop")
#: rkcompile.compile (passed in: the API calls this module)
CompilePlan = Callable[..., Any]
#: Chosen tensors tried again without, at most, after the bisection (each try is one plan).
PRUNE_TRIES = 24


@dataclass
class Search:
    """What a search found: the chosen tensors, the plan with them in float16, its worst
    calibration cosine, the target it met, and how many plans it judged."""
    chosen: tuple[str, ...]
    plan: Any  # rkcompile.api.Plan
    cosine: float
    wanted: float
    target: float
    all_float16_cosine: float
    plans_judged: int = 0
    start_cosine: float = 1.0
    technique: Int8Technique | None = None


def candidates(record: PlanRecord) -> list[str]:
    """Tensors `--float16` accepts in this plan, in step order: int8 outputs of NPU steps and
    the int8 NPU copies of model inputs (host conversions of a model input)."""
    inputs = {spec.name for spec in record.model.inputs}
    found = []
    for step in record.steps:
        if step.device == "npu" or (step.device == "host" and step.inputs and step.inputs[0] in inputs):
            found += [name for name in step.outputs if record.tensors[name].dtype == "int8" and name not in found]
    return found


class Judge:
    """Plans a set of float16 tensors and measures its worst output cosine over the calibration
    samples against the float32 planned graph (computed once: float16 choices do not change it)."""

    def __init__(self, model, target: str, options: Options, samples: list[dict[str, np.ndarray]],
                 compile_plan: CompilePlan):
        self.model, self.target, self.samples, self.compile_plan = model, target, samples, compile_plan
        self.options = dataclasses.replace(options, auto_float16=None)
        self.plans_judged = 0
        self.cache: dict[frozenset, tuple[float, Any]] = {}
        self.expected: list[dict[str, np.ndarray]] | None = None

    def plan(self, tensors: Sequence[str]):
        chosen = tuple(dict.fromkeys((*self.options.float16_tensors, *tensors)))
        return self.compile_plan(self.model, self.target, dataclasses.replace(self.options, float16_tensors=chosen))

    def __call__(self, tensors: Sequence[str]) -> tuple[float, Any]:
        key = frozenset(tensors)
        if key not in self.cache:
            plan = self.plan(tensors)
            self.plans_judged += 1
            if self.expected is None:
                self.expected = [reference_outputs(plan, sample) for sample in self.samples]
            cosine = min(agreement(name, emulate(plan.prepared(), sample).outputs[name], value).cosine
                         for sample, expected in zip(self.samples, self.expected) for name, value in expected.items())
            self.cache[key] = (cosine, plan)
        return self.cache[key]


def reference_outputs(plan, sample: dict[str, np.ndarray], adjust=None) -> dict[str, np.ndarray]:
    record = plan.record
    reference = FloatReference(plan.reference_nodes, [s.device for s in record.steps], record.model.opset,
                               [spec.name for spec in record.model.outputs])
    return reference.run(sample, adjust=adjust)


def sensitivities(plan, tensors: Sequence[str], sample: dict[str, np.ndarray]) -> dict[str, float]:
    """Per tensor, the output cosine lost when it alone is rounded to its int8 grid."""
    expected = reference_outputs(plan, sample)
    losses = {}
    for name in tensors:
        quant = plan.record.quantization[name]

        def rounded(tensor: str, value: np.ndarray, name=name, quant=quant) -> np.ndarray | None:
            return dequantize(quantize(value, quant), quant) if tensor == name else None

        produced = reference_outputs(plan, sample, rounded)
        losses[name] = 1.0 - min(agreement(out, produced[out], value).cosine for out, value in expected.items())
    return losses


def choose(model, target: str, options: Options, wanted: float, compile_plan: CompilePlan,
           strategy: str = "sensitivity", progress: Callable[[str], None] | None = None) -> Search:
    """The search of `strategy` for `wanted` (see the module docstring)."""
    say = progress or (lambda text: None)
    judge = Judge(model, target, options, [], compile_plan)
    plan = judge.plan(())
    specs = plan.record.model.inputs
    judge.samples = calibration_samples(options.calibration, specs, ImagePreprocessing(
        options.mean_values, options.std_values, options.channel_order))
    samples = judge.samples
    start, plan = judge(())
    pool = candidates(plan.record)
    all_float16, _ = judge(pool)
    goal = min(wanted, all_float16)
    say(f"int8 cosine {start:.6f}, all {len(pool)} candidates in float16 {all_float16:.6f}: target {goal:.6f}")
    search = Search((), plan, start, wanted, goal, all_float16, start_cosine=start)
    if start < goal:
        chosen = (_by_sensitivity if strategy == "sensitivity" else _by_worst_drop)(judge, plan, pool, goal, samples, say)
        cosine, plan = judge(chosen)
        search = Search(tuple(chosen), plan, cosine, wanted, goal, all_float16, start_cosine=start)
    search.plans_judged = judge.plans_judged
    search.technique = report(search, judge(())[1].record)
    return search


def compile_with_choice(model, target: str, options: Options,
                        compile_plan: CompilePlan) -> tuple[PlanRecord, CompileContext]:
    """`pipeline.compile_model`, with --auto-float16 resolved first and reported in the plan."""
    if options.auto_float16 is None:
        return compile_model(model, target, options)
    options, technique = resolve(model, target, options, compile_plan)
    record, ctx = compile_model(model, target, options)
    ctx.int8_techniques.append(technique)
    return dataclasses.replace(record, int8_techniques=tuple(ctx.int8_techniques)), ctx


def resolve(model, target: str, options: Options, compile_plan: CompilePlan) -> tuple[Options, Int8Technique]:
    """`options` with --auto-float16's choice added to its float16 tensors (and the search
    switched off), and the report the plan records (`Plan.int8_techniques`)."""
    wanted = options.auto_float16
    if options.dtype != "int8":
        raise CompileError("--auto-float16 chooses float16 steps of an int8 plan; add --dtype int8")
    if not 0 < wanted <= 1:
        raise CompileError(f"--auto-float16 {wanted}: a cosine in (0, 1]")
    search = choose(model, target, options, wanted, compile_plan)
    chosen = tuple(dict.fromkeys((*options.float16_tensors, *search.chosen)))
    return dataclasses.replace(options, auto_float16=None, float16_tensors=chosen), search.technique


def _by_sensitivity(judge: Judge, plan, pool: list[str], goal: float, samples, say) -> list[str]:
    losses = sensitivities(plan, pool, samples[0])
    ranked = sorted(pool, key=lambda name: -losses[name])
    low, high = 0, len(ranked)  # ranked[:low] misses the goal (or low is 0); ranked[:high] meets it
    while high - low > 1:
        middle = (low + high) // 2
        cosine, _ = judge(ranked[:middle])
        say(f"  first {middle} by sensitivity: {cosine:.6f}")
        low, high = (low, middle) if cosine >= goal else (middle, high)
    chosen = ranked[:high]
    for name in sorted(chosen, key=lambda name: losses[name])[:PRUNE_TRIES]:
        if len(chosen) == 1:
            break
        without = [other for other in chosen if other != name]
        cosine, _ = judge(without)
        if cosine >= goal:
            say(f"  without {name}: {cosine:.6f}, dropped")
            chosen = without
    return chosen


def _by_worst_drop(judge: Judge, plan, pool: list[str], goal: float, samples, say) -> list[str]:
    chosen: list[str] = []
    while len(chosen) < len(pool):
        rows, _ = analyse(plan.prepared(), samples[0])
        drops = {row.output: row.drop for row in rows if row.output in pool and row.output not in chosen}
        if not drops:
            break
        chosen.append(max(drops, key=drops.get))
        cosine, plan = judge(chosen)
        say(f"  + {chosen[-1]} (drop {drops[chosen[-1]]:.6f}): {cosine:.6f}")
        if cosine >= goal:
            break
    return chosen


def report(search: Search, int8: PlanRecord) -> Int8Technique:
    """The `auto_float16` entry of the chosen plan: each tensor with its step's extra time under
    the cost model, float16 against int8."""
    costs = step_costs(int8, search.plan.record, search.chosen)
    applied = tuple(f"{name} (+{costs[name] * 1e3:.4f} ms)" for name in search.chosen)
    reached = "reached" if search.cosine >= search.target else "missed"
    lowered = (f": {search.wanted} asked, the all-float16 plan reaches only {search.all_float16_cosine:.6f}"
               if search.target < search.wanted else "")
    note = (f"{len(search.chosen)} of {len(candidates(int8))} int8 tensors in float16, worst calibration "
            f"cosine {search.start_cosine:.6f} -> {search.cosine:.6f} ({reached} target {search.target:.6f}{lowered}), "
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
