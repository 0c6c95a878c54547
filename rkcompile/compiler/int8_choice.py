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
float32 calibration run once (its ranges serve both methods: the mmse observer keeps the
minimum and maximum too; bias correction's shifts are measured in the same run and applied
after it; the run is the model's own weights', and observes the tensors equalization divides in
both forms: passes/quantize.py `_calibrate`), and with it the float32 reference outputs.
Equalization is searched only when it would equalize a Conv pair, bias correction only when a
Conv's bias would be corrected (otherwise the plans are the same). Judging goes best first
(`choose_settings`): the next run is always the leading candidate's (the best worst cosine so
far, a bound above its worst), and the leader that has run every sample is the choice; the
others stop at the sample that put them below it (their recorded cosine then that sample's, an
upper bound, marked as such). The choice is the one judging every candidate on every sample
makes, with only the winner running every sample; the candidates' plans are made at once, while
the first one's rounded float run orders the samples hardest first (`Judge.hardest_first`), and
kept while they are judged (`Judge.keep`). While one run is made, the run likely to follow it
(`next_run`: the next candidate yet to run, or the leader's next sample, as a leader keeps the
lead often) is made by the runtime's other runner, a process of its own for the emulator
(`Judge.run_ahead`), or here when that is busy with the run asked for; a run made ahead is
only taken up when the order above asks for it, so the choice and every recorded cosine are the
same.

`--auto-float16` then searches float16 steps on top of the chosen settings, with the same
planner and judge.
"""
from __future__ import annotations

import dataclasses
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rkcompile.compiler.context import CompileContext

from rkcompile.options import CHOOSE, INT8_SETTINGS, Options, settings_label
from rkcompile.plan.schema import Int8Technique, PlanRecord
from rkcompile.progress import bar
from rkcompile.compiler.auto_float16 import KEPT_WEIGHT_BYTES, Finish, Judge, Planner, choose, judge_for


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
    """The candidates grouped by equalization, and in each group the one whose calibration
    serves the others first: a method that keeps the values (mmse) and bias correction on
    (`passes/quantize.py _reuse_calibration`); the first of all calibrates for every other."""
    return sorted(found, key=lambda c: (bool(c["equalization"]), c["calibration_method"] == "minmax",
                                        not c["bias_correction"]))


def choose_settings(judge: Judge, options: Options, say: Callable[[str], None]) -> tuple[dict[str, Any], Int8Technique]:
    """The best candidate's settings, and the plan's `int8_settings` entry listing every candidate.

    Best first: the next sample run is always the leading candidate's, the one whose worst
    cosine so far (a bound above its worst over every sample; above any cosine before it ran
    one) is highest, a tie going to the one `found` lists first. When the leader has run every
    sample it is the choice: every other's bound, so its worst, is no higher. That is the
    choice judging every candidate on every sample makes, with only the winner running them
    all; each other stops once a sample puts it below the leader (`next_sample` tries first
    the samples that look hardest). Candidates no sample ran yet lead in
    `judging_order`, so the first plan calibrates for the others."""
    found = candidates(searched(options, judge.planner))
    ordered = judging_order(found)
    count = len(judge.given_samples)

    def lead(settings: dict[str, Any]) -> tuple:
        known = judge.sample_cosines.get(judge.key((), settings))
        if not known:
            return (np.inf, -ordered.index(settings))
        return (min(known.values()), -found.index(settings))

    # runs two at a time from here: a worker process starts while the first plan calibrates
    with judge.two_at_a_time():
        first, _ = judge.planned((), ordered[0])  # calibrates for every candidate
        # the candidates' plans share their weights' size: all held at once, or each made when it leads
        held = len(ordered) * first.record.memory.weight_bytes <= KEPT_WEIGHT_BYTES
        with ThreadPoolExecutor(1) as runner:  # the rounded runs (onnxruntime) while the others are planned
            hardest = runner.submit(judge.hardest_first, first)
            for settings in ordered if held else ordered[:1]:
                judge.keep((), settings)
            judge.order = hardest.result() or judge.order

        # no total: how many runs the losers need shows only as they fall behind
        with bar(description="int8 settings: candidate runs", unit="run") as progress:
            while True:
                leader = max(ordered, key=lead)
                known = judge.sample_cosines.get(judge.key((), leader), {})
                if len(known) == count:
                    break
                judge.keep((), leader)
                index = next_sample(judge, known)
                following = next_run(judge, ordered, leader, index)
                # made meanwhile, by the runner not busy with `index` (another candidate's when held)
                if following is not None and (held or following[0] == leader):
                    judge.run_ahead((), *following, here=judge.in_flight((), leader, index))
                judge.sample_cosine((), leader, index)
                progress.update()
    judged = [Judged(settings, *judge.cosines[judge.key((), settings)]) for settings in ordered]
    for entry in judged:
        say(f"  {settings_label(entry.settings)}: {entry.cosine:.8f}"
            + ("" if entry.complete else " (a sample below the best; stopped)"))
    best = next(entry for entry in judged if entry.settings == leader)
    judge.planned((), leader)  # the plan to keep: not planned again
    judge.release()
    return best.settings, report(best, judged, found)


def next_run(judge: Judge, ordered: list[dict[str, Any]], leader: dict[str, Any],
             index: int) -> tuple[dict[str, Any], int] | None:
    """The run likely to follow the leader's on sample `index`: while candidates no sample ran
    remain, the next of them in `ordered` (they lead in that order) on the sample it will start
    on, certainly; else the leader's next sample (a leader that has run keeps the lead often);
    None when the leader runs its last sample."""
    ran = [settings for settings in ordered if judge.sample_cosines.get(judge.key((), settings))]
    if leader not in ran:
        fresh = [settings for settings in ordered if settings not in ran and settings != leader]
        if not fresh:
            return None
        taken = {index}.union(*(judge.sample_cosines[judge.key((), settings)] for settings in ran))
        start = next((sample for sample in judge.order if sample not in taken), None)
        return None if start is None else (fresh[0], start)
    known = judge.sample_cosines[judge.key((), leader)]
    if len(known) + 1 >= len(judge.given_samples):
        return None
    return leader, next_sample(judge, {**known, index: np.nan})


def next_sample(judge: Judge, known: dict[int, float]) -> int:
    """The sample a candidate that ran `known` runs next. One that ran none starts on a sample no
    candidate ran, while there is one: the first runs spread over the samples and show which
    are hard. Otherwise the sample that looks hardest, the one some candidate that ran it found
    furthest below its own best sample so far: candidates differ in level but share their hard
    samples, so the drop below a candidate's best, not its cosine, says which sample is hard (a
    sample only a weak candidate ran would otherwise look hardest); then the first no candidate
    ran. "First" is in the judge's order: the first candidate's plan run with its int8 tensors
    rounded in float32 (`Judge.hardest_first`), the hardest first, so the first runs already
    meet the hard samples that stop a losing candidate (mobilenet_v2: 76 runs -> 43). (Running
    first the samples of least reference output energy cost more runs on yolov8n and fewer
    on resnet18_halfwidth: that proxy did not hold across models.)"""
    ran = [cosines for cosines in judge.sample_cosines.values() if cosines]
    if not known:
        fresh = next((index for index in judge.order if not any(index in cosines for cosines in ran)), None)
        if fresh is not None:
            return fresh
    drops: dict[int, float] = {}
    for cosines in ran:
        best = max(cosines.values())
        for index, cosine in cosines.items():
            drops[index] = min(drops.get(index, np.inf), cosine - best)
    rank = {index: position for position, index in enumerate(judge.order)}
    return min((index for index in judge.order if index not in known),
               key=lambda index: (drops.get(index, np.inf), rank[index]))


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
