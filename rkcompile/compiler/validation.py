"""--val: an int8 plan judged on inputs it was not calibrated on. Its ranges were fitted to the
calibration samples, and --auto-float16 and the int8 settings were judged on them too, so a
cosine on those samples flatters the plan; the same measure on held-out inputs does not. The
plan runs on the compile's runtime (rkcompile/compiler/context.py), against the planned graph
in float32 with the model's constants, as the int8 choices judge their candidates.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from rkcompile.compiler.auto_float16 import float_reference
from rkcompile.compiler.context import CompileContext, Runtime
from rkcompile.plan.schema import PlanRecord, Validation


def output_cosines(plan, runtime: Runtime, samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Per model output of `plan` (the runtime's `runnable`), its worst cosine over `samples`."""
    reference = float_reference(plan, runtime)
    worst: dict[str, float] = {}
    for sample in samples:
        expected, outputs = reference.run(sample), runtime.run(plan, sample)
        for name, value in expected.items():
            worst[name] = min(worst.get(name, np.inf), runtime.cosine(name, outputs[name], value))
    return worst


def validated(record: PlanRecord, ctx: CompileContext, samples: Sequence[Mapping[str, np.ndarray]]) -> PlanRecord:
    """`record` (planned in `ctx`) with its `validation`: its cosines on `samples`, the --val inputs."""
    cosines = output_cosines(ctx.runtime.runnable(record, ctx), ctx.runtime, samples)
    validation = Validation(str(ctx.options.validation), len(samples), {name: float(c) for name, c in cosines.items()})
    return dataclasses.replace(record, validation=validation)
