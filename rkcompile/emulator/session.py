"""From a plan and its weight region to executed outputs: make the inputs, run.

The emulator runs plans, never models: `rkcompile.api` plans a model (or loads a saved plan)
into a `Prepared`, and this module executes it. The steps' operations and the weight region
come from the plan alone (docs/emulator.md).
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from rkcompile.plan.allocation import verify_allocation
from rkcompile.plan.plain_nodes import Node
from rkcompile.plan.schema import PlanRecord, contract_violations
from rkcompile.targets import get_target

from rkcompile.emulator.executor import Execution, Executor, Observe, WeightCache
from rkcompile.emulator.storage import EmulationError

#: Integer inputs are token ids, indices or masks: small non-negative values stay valid for
#: any of them with a vocabulary of at least 100 entries.
RANDOM_INT_HIGH = 100


@dataclass
class Prepared:
    """A plan ready to execute: the plan, its weight region's bytes and, when it was planned in
    this process, the planned graph's step nodes with the model's own weights, which accuracy
    analysis runs in float32 as its reference. Its runs take turns (`lock`): they go through one
    Executor (`executor`), whose regions they reuse, they fill the weight cache on first use,
    and its CPU steps' onnxruntime sessions run through one IO binding each."""
    plan: PlanRecord
    weights: bytes
    reference_nodes: Sequence[Node] | None = None
    weight_cache: WeightCache = dataclasses.field(default_factory=WeightCache, repr=False)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)
    _executor: Executor | None = dataclasses.field(default=None, repr=False, compare=False)

    def executor(self) -> Executor:
        """The Executor every run of the plan goes through, made and prepared on first use
        (`Executor.prepare`); the caller holds `lock`."""
        if self._executor is None:
            executor = Executor(self.plan, self.weights, get_target(self.plan.target), self.weight_cache)
            executor.prepare()
            self._executor = executor
        return self._executor


def check_plan(plan: PlanRecord) -> None:
    """Refuse a plan that breaks its contract or whose allocation is unsound."""
    problems = contract_violations(plan) + verify_allocation(plan)
    if problems:
        raise EmulationError(f"the plan is unsound: {problems[0]}")


def plan_mismatch(saved: PlanRecord, fresh: PlanRecord) -> str | None:
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


def make_inputs(plan: PlanRecord, given: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The given arrays for the inputs they name; seeded random values for the rest (standard
    normal floats, integers in [0, 100), random booleans). The generator is made only when an
    input is missing: importing numpy.random took about 9 ms of CPU of a fresh process's first
    run, which given inputs do not need."""
    rng = None
    inputs = {}
    for spec in plan.model.inputs:
        if spec.name in given:
            inputs[spec.name] = as_input_dtype(spec.name, given[spec.name], np.dtype(spec.dtype))
            continue
        if rng is None:
            rng = np.random.default_rng(seed)
        if spec.dtype == "bool":
            inputs[spec.name] = rng.random(spec.shape) < 0.5
        elif np.issubdtype(np.dtype(spec.dtype), np.integer):
            inputs[spec.name] = rng.integers(0, RANDOM_INT_HIGH, spec.shape).astype(spec.dtype)
        else:
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    # a scalar input's draw is a numpy scalar, which onnxruntime refuses: every feed is an array
    return {name: np.asarray(value) for name, value in inputs.items()}


def as_input_dtype(name: str, value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A given input in its input's dtype: converted (an int64 index array for an int32 input,
    float32 for a bfloat16 or float8 input), or, when it holds raw items (numpy's void dtype:
    an ml_dtypes array saved to .npz loses its type), reinterpreted as the input's type when
    the items have its size."""
    value = np.asarray(value)
    if value.dtype == dtype:
        return value
    if value.dtype.kind == "V":
        if value.dtype.fields is None and value.dtype.itemsize == dtype.itemsize:
            return value.view(dtype)
        raise EmulationError(f"--inputs: {name} holds raw {value.dtype.itemsize}-byte items; input {name} is "
                             f"{dtype.name}, {dtype.itemsize} bytes each (save it as {dtype.name} or widened, "
                             f"e.g. float32)")
    try:
        return value.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise EmulationError(f"--inputs: {name} is {value.dtype.name}, which does not convert to the input's "
                             f"{dtype.name} ({exc})") from None


def emulate(prepared: Prepared, inputs: Mapping[str, np.ndarray], observe: Observe | None = None) -> Execution:
    with prepared.lock:
        return prepared.executor().run(inputs, observe)
