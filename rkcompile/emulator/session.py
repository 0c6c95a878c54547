"""From a model file to executed outputs: plan (or check a saved plan against a fresh one),
make the inputs, run, compare.

A saved plan does not carry the rewritten graph (folded BatchNorm, Gemm as Conv) or its
weights, so the model is always re-planned for them; the saved plan must then describe the
same execution (model hash, target, dtype, steps) and its tensor placements are the ones run.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from rkcompile.allocation import verify_allocation
from rkcompile.context import Options
from rkcompile.plan import Plan, contract_violations
from rkcompile.targets import get_target

from .executor import Execution, Executor, Observe, WeightCache
from .storage import EmulationError

#: Integer inputs are token ids, indices or masks: small non-negative values stay valid for
#: any of them with a vocabulary of at least 100 entries.
RANDOM_INT_HIGH = 100


@dataclass
class Prepared:
    plan: Plan
    graph: object
    order: list[str]
    weight_cache: WeightCache = dataclasses.field(default_factory=WeightCache, repr=False)


def prepare(model: Path, target: str, options: Options, saved_plan: Path | None = None) -> Prepared:
    from rkcompile.pipeline import compile_model

    fresh, ctx = compile_model(model, target, options)
    plan = fresh
    if saved_plan is not None:
        plan = load_plan(saved_plan)
        mismatch = plan_mismatch(plan, fresh)
        if mismatch:
            raise EmulationError(f"--plan {saved_plan} does not match {model} planned for {target}: {mismatch}")
    problems = contract_violations(plan) + verify_allocation(plan)
    if problems:
        raise EmulationError(f"the plan is unsound: {problems[0]}")
    return Prepared(plan, ctx.graph, list(ctx.order))


def load_plan(path: Path) -> Plan:
    try:
        return Plan.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise EmulationError(f"--plan: {path} does not exist") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EmulationError(f"--plan: {path} is not a readable plan ({exc})") from None


def plan_mismatch(saved: Plan, fresh: Plan) -> str | None:
    """The first way `saved` describes a different execution than `fresh`, else None."""
    if saved.model.sha256 != fresh.model.sha256:
        return "the model's sha256 differs"
    if saved.target != fresh.target:
        return f"target {saved.target}, not {fresh.target}"
    if saved.dtype != fresh.dtype:
        return f"dtype {saved.dtype}, not {fresh.dtype}"
    if len(saved.steps) != len(fresh.steps):
        return f"{len(saved.steps)} steps, not {len(fresh.steps)}"
    for old, new in zip(saved.steps, fresh.steps):
        for field in ("device", "kernel", "nodes", "inputs", "outputs"):
            if getattr(old, field) != getattr(new, field):
                return f"step {old.id} differs in {field}"
    return None


def make_inputs(plan: Plan, given: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The given arrays for the inputs they name; seeded random values for the rest (standard
    normal floats, integers in [0, 100), random booleans)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in plan.model.inputs:
        if spec.name in given:
            inputs[spec.name] = np.asarray(given[spec.name]).astype(spec.dtype, copy=False)
        elif spec.dtype == "bool":
            inputs[spec.name] = rng.random(spec.shape) < 0.5
        elif np.issubdtype(np.dtype(spec.dtype), np.integer):
            inputs[spec.name] = rng.integers(0, RANDOM_INT_HIGH, spec.shape).astype(spec.dtype)
        else:
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    # a scalar input's draw is a numpy scalar, which onnxruntime refuses: every feed is an array
    return {name: np.asarray(value) for name, value in inputs.items()}


def emulate(prepared: Prepared, inputs: Mapping[str, np.ndarray], observe: Observe | None = None) -> Execution:
    target = get_target(prepared.plan.target)
    return Executor(prepared.plan, prepared.graph, prepared.order, target, prepared.weight_cache).run(inputs, observe)
