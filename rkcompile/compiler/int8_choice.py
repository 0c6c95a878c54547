"""int8 settings chosen per model on the calibration data, as AIMET's AutoQuant does: each of the
calibration method (minmax, mmse), bias correction (on, off) and equalization (off, on) that the
user leaves to the compiler (`Options` value CHOOSE, the default) is searched; every combination
of the searched candidates is planned and judged by the accuracy analysis's measure, the worst
output cosine over the calibration samples against the float32 planned graph
(rkcompile/compiler/auto_float16.py `Judge`), and the best is kept; a tie keeps the candidate listed
first in `INT8_SETTINGS` (the defaults before the settings were chosen). A value the user gives
fixes its setting. No one setting wins on every network (docs/quantization.md, "int8 settings
chosen per model"): these networks answer a range change anywhere with a cosine change of about
+-0.001 in either direction, which only planning and measuring shows.

This is a stage of the pipeline (`pipeline.compile_model`) after its shared front half, entered
by an int8 plan that leaves a setting to choose or asks --auto-float16, never by a float16 plan.
What the candidates share (`auto_float16.Planner`): the passes before quantize ran once; the
float32 calibration run, once per equalization setting (its ranges serve both methods: the mmse
observer keeps the minimum and maximum too; bias correction's shifts are measured in the same
run and applied after it), and the float32 reference outputs once. Equalization is searched only
when it would equalize a Conv pair, bias correction only when a Conv's bias would be corrected
(otherwise the plans are the same). A candidate is judged sample by sample, worst sample first,
and dropped at the first sample below the best worst cosine so far (it cannot win; its recorded
cosine is then that sample's, an upper bound, marked as such). The first candidate runs every
sample, then each other runs the worst of them, and they are judged on best first
(`probed_order`): the winner is then usually the best so far early, and the others stop at
their first sample.

`--auto-float16` then searches float16 steps on top of the chosen settings, with the same
planner and judge.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from rkcompile.compiler.context import CompileContext

from rkcompile.options import CHOOSE, INT8_SETTINGS, Options, settings_label
from rkcompile.plan.schema import Int8Technique, PlanRecord
from rkcompile.progress import bar
from rkcompile.compiler.auto_float16 import Finish, Judge, Planner, choose, judge_for


#: Samples (the first candidate's worst) every other candidate runs before any is judged on all
PROBE_SAMPLES = 1


@dataclass(frozen=True)
class Judged:
    """One candidate: its settings, its worst calibration cosine, and whether every sample ran
    (False: judging stopped at a sample below the best so far; the cosine is that sample's)."""
    settings: dict[str, Any]
    cosine: float
    complete: bool


def searched(options: Options, planner: Planner) -> dict[str, tuple]:
    """Per int8 setting, the values to try: the user's value alone, or INT8_SETTINGS' candidates
    when it is left to choose, less a technique that would change nothing in this graph."""
    idle = planner.idle_techniques()
    return {name: (candidates[:1] if name in idle else candidates) if getattr(options, name) == CHOOSE
            else (getattr(options, name),) for name, candidates in INT8_SETTINGS.items()}


def candidates(values: dict[str, tuple]) -> list[dict[str, Any]]:
    """Every combination, in order of preference (the first of each setting first)."""
    names = list(values)
    return [dict(zip(names, combination)) for combination in itertools.product(*values.values())]


def judging_order(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates grouped by equalization (one calibration run each), and in each group the
    one whose calibration serves the others first: a method that keeps the values (mmse) and
    bias correction on (`passes/quantize.py _reuse_calibration`)."""
    return sorted(found, key=lambda c: (bool(c["equalization"]), c["calibration_method"] == "minmax",
                                        not c["bias_correction"]))


def probed_order(judge: Judge, ordered: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """`ordered` as `choose_settings` judges them: the first, then every other run on the
    PROBE_SAMPLES samples the first found worst (`Judge.probe`), and judged on in the order of
    those cosines, best first. The choice is the same in any order (a candidate stops only below
    the best complete one, and a tie goes by `found`'s order); this order makes the likely winner
    the best early, so that the others stop at their first sample instead of each running every
    sample while it is the best so far."""
    if not ordered:
        return
    yield ordered[0]
    probes = {index: judge.probe((), settings, PROBE_SAMPLES) for index, settings in enumerate(ordered[1:])}
    yield from (ordered[1 + index] for index in sorted(probes, key=lambda index: -probes[index]))


def choose_settings(judge: Judge, options: Options, say: Callable[[str], None]) -> tuple[dict[str, Any], Int8Technique]:
    """The best candidate's settings, and the plan's `int8_settings` entry listing every candidate."""
    found = candidates(searched(options, judge.planner))
    judged: list[Judged] = []
    best: Judged | None = None
    for settings in bar(probed_order(judge, judging_order(found)), total=len(found),
                        description="int8 settings: candidates judged", unit="plan"):
        goal = None if best is None else best.cosine
        cosine = judge((), goal, settings)
        complete = judge.complete((), settings)
        judged.append(Judged(settings, cosine, complete))
        say(f"  {settings_label(settings)}: {cosine:.8f}" + ("" if complete else " (a sample below the best; stopped)"))
        if complete and (best is None or cosine > best.cosine
                         or (cosine == best.cosine and found.index(settings) < found.index(best.settings))):
            best, best_plan = Judged(settings, cosine, complete), judge.latest
    judge.latest = best_plan  # the plan to keep: not planned again
    return best.settings, report(best, judged, found)


def report(best: Judged, judged: list[Judged], found: list[dict[str, Any]]) -> Int8Technique:
    """The `int8_settings` entry: the chosen candidate, and each other with its cosine."""
    others = sorted((j for j in judged if j is not best and j.settings != best.settings),
                    key=lambda j: found.index(j.settings))
    declined = tuple(f"{settings_label(j.settings)}: {'at most ' if not j.complete else ''}{j.cosine:.8f}" for j in others)
    searched_names = [name.replace("_", " ") for name in INT8_SETTINGS
                      if len({j.settings[name] for j in judged}) > 1]
    note = (f"{settings_label(best.settings)}, chosen on the calibration data among {len(judged)} candidates "
            f"(searched: {', '.join(searched_names) or 'nothing'}; worst calibration cosine {best.cosine:.8f})")
    return Int8Technique("int8_settings", (settings_label(best.settings),), declined, note)


def int8_stage(before_quantize: CompileContext, finish: Finish,
               validation: list[dict[str, np.ndarray]] | None = None) -> tuple[PlanRecord, CompileContext]:
    """The stage: the int8 settings left to choose chosen, then --auto-float16 resolved on top of
    them (its target met on the `validation` samples when given, else on the calibration
    samples), each candidate planned by `finish` from `before_quantize` (the context after the
    pipeline's front half); the chosen plan with both reported in its `int8_techniques`."""
    options = before_quantize.options
    judge = judge_for(before_quantize, finish)
    chosen = settle(judge, options)
    if options.auto_float16 is None:
        plan, ctx = judge.planned(())
        techniques = [chosen, *ctx.int8_techniques]
    else:
        if validation is not None:
            judge = judge.on(validation)
        search = choose(judge, options.auto_float16)
        plan, ctx = search.plan, search.context
        techniques = [*([chosen] if chosen is not None else []), *ctx.int8_techniques, search.technique]
    return dataclasses.replace(plan.record, int8_techniques=tuple(techniques)), ctx


def settle(judge: Judge, options: Options, say: Callable[[str], None] = lambda text: None) -> Int8Technique | None:
    """Choose the settings `options` leaves to choose, and hold them in `judge`'s planner: the
    plan's entry saying so, or None when the user gave every setting."""
    if not any(getattr(options, name) == CHOOSE for name in INT8_SETTINGS):
        return None
    say("int8 settings:")
    settings, chosen = choose_settings(judge, options, say)
    judge.planner.options = dataclasses.replace(judge.planner.options, **settings)
    return chosen
