"""`rkcompile compare`: one model planned for several SoCs, one row each, the question users ask
when they choose a board: how much runs on the NPU, how many ops fall back to the CPU, steps,
arena, weights and the cost model's estimated fps (docs/cost-model.md).

A target that cannot take the model (a float16 plan on an SoC whose NPU runs int8 only, say)
gets a row naming why instead of numbers; the others still plan.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rkcompile.options import Options
from rkcompile.errors import CompileError
from rkcompile.compiler.idle_npu import refuse_idle_npu
from rkcompile.plan.schema import PlanRecord
from rkcompile.views.summary import placed_counts
from rkcompile.targets import all_targets, get_target
from rkcompile.targets.model import Target

#: --target value that names every target
ALL = "all"


@dataclass(frozen=True)
class Row:
    target: str
    npu_percent: float | None = None   # NPU ops among the placed ops, as the summary's "NPU ops" line
    npu_ops: int | None = None
    cpu_ops: int | None = None
    steps: int | None = None
    arena_bytes: int | None = None
    weight_bytes: int | None = None
    est_fps: float | None = None
    est_latency_ms: float | None = None
    error: str | None = None
    # int8: the worst output cosine over the calibration samples (and the --val samples when
    # given) against the planned graph in float32, on the emulator
    calibration_cosine: float | None = None
    validation_cosine: float | None = None


def parse_targets(text: str) -> list[Target]:
    """`all`, or a comma list of targets (names or aliases; repeats count once)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise CompileError("--target: name one target, a comma list, or 'all'")
    if ALL in (name.lower() for name in names):
        if len(names) > 1:
            raise CompileError(f"--target {text}: 'all' already names every target; give it alone")
        return all_targets()
    chosen = {}
    for name in names:
        target = get_target(name)
        chosen.setdefault(target.name, target)
    return list(chosen.values())


def row_of(plan: PlanRecord) -> Row:
    npu, cpu = placed_counts(plan)
    return Row(target=plan.target, npu_percent=round(100 * npu / max(npu + cpu, 1), 1), npu_ops=npu, cpu_ops=cpu,
               steps=len(plan.steps), arena_bytes=plan.memory.arena_bytes, weight_bytes=plan.memory.weight_bytes,
               est_fps=plan.multicore.est_fps, est_latency_ms=plan.multicore.est_latency_ms)


def compare(model: Path, targets: list[Target], options: Options) -> list[Row]:
    """One row per target. The int8 settings left to choose are planned at their preferred values
    instead of searched per target (pipeline.compile_model): they change how tensors are
    rounded, not what the table compares. An int8 plan still calibrates, on the emulator, and
    runs there on its calibration (and --val) samples for its cosines."""
    from rkcompile.api import EMULATOR_RUNTIME
    from rkcompile.compiler.pipeline import compile_model

    rows = []
    for target in targets:
        try:
            # its CPU steps' backends left to the emulator: an int8 plan runs only for its cosines
            plan, ctx = compile_model(model, target.name, options, cpu_backends=False, runtime=EMULATOR_RUNTIME)
            refuse_idle_npu(plan)
        except CompileError as exc:
            rows.append(Row(target=target.name, error=str(exc).splitlines()[0]))
            continue
        rows.append(dataclasses.replace(row_of(plan), **_cosines(plan, ctx)))
    errors = {row.error for row in rows}
    if len(errors) == 1 and None not in errors:  # the model, not a target, failed: say it once
        raise CompileError(errors.pop())
    return rows


def _cosines(plan: PlanRecord, ctx) -> dict[str, float]:
    """An int8 plan's Row cosines: its worst over the calibration samples it was fitted on, and
    over the --val samples (`plan.validation`) when given; nothing for a float16 plan."""
    if not ctx.calibration_samples:
        return {}
    from rkcompile.api import EMULATOR_RUNTIME
    from rkcompile.compiler.validation import output_cosines

    calibration = output_cosines(EMULATOR_RUNTIME.runnable(plan, ctx), EMULATOR_RUNTIME, ctx.calibration_samples)
    validation = {} if plan.validation is None else {"validation_cosine": plan.validation.worst}
    return {"calibration_cosine": min(calibration.values()), **validation}


def render_table(model: Path, options: Options, rows: list[Row]) -> str:
    cosines = [(name, f"{label} cosine") for name, label in (("calibration_cosine", "cal"), ("validation_cosine", "val"))
               if any(getattr(row, name) is not None for row in rows)]
    lines = [f"{model.name} ({options.dtype}, batch {options.batch})",
             f"{'target':10} {'NPU %':>6} {'CPU ops':>7} {'steps':>6} {'arena KiB':>10} {'weights KiB':>11} "
             f"{'est fps':>9}" + "".join(f" {header:>10}" for _, header in cosines)]
    for row in rows:
        if row.error is not None:
            lines.append(f"{row.target:10} not planned: {row.error}")
            continue
        lines.append(f"{row.target:10} {row.npu_percent:6.1f} {row.cpu_ops:7d} {row.steps:6d} "
                     f"{row.arena_bytes / 1024:10,.1f} {row.weight_bytes / 1024:11,.1f} {row.est_fps:9.1f}"
                     + "".join(f" {getattr(row, name):10.6f}" for name, _ in cosines))
    return "\n".join(lines)


def to_json(model: Path, options: Options, rows: list[Row]) -> str:
    body = {"model": str(model), "dtype": options.dtype, "batch": options.batch,
            "rows": [asdict(row) for row in rows]}
    return json.dumps(body, indent=1) + "\n"
