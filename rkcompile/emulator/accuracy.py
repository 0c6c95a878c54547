"""Accuracy analysis: where an int8 plan loses accuracy, step by step.

The open counterpart of rknn-toolkit2's accuracy_analysis: the plan is executed as planned
(int8 storage and kernels), and every step's outputs, dequantized, are compared with the same
tensors of the planned graph run in float32 (`float_reference`). The error each step shows is
the accumulated error of the whole int8 run up to it ("entire" in rknn-toolkit2's terms), so
the worst steps are where the cosine falls; a step whose cosine drops sharply from its inputs'
is where quantization hurts. Where the float32 reference is not finite (-inf attention masks,
which int8 saturates), the finite positions are compared.

Each NPU step is also run alone ("single" in rknn-toolkit2's terms): on its inputs' float32
reference values, stored as the plan stores them (quantized with the plan's parameters), so
its cosine is the error the step itself adds, whatever came before it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from rkcompile.plan.aliases import with_views
from rkcompile.progress import bar
from rkcompile.targets import get_target

from rkcompile.emulator.closeness import agreement
from rkcompile.emulator.executor import Execution, Executor
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.emulator.session import Prepared, emulate
from rkcompile.emulator.storage import EmulationError


@dataclass(frozen=True)
class StepAccuracy:
    step: int
    device: str
    kernel: str
    output: str
    cosine: float
    max_abs: float
    #: the worst cosine among the step's inputs minus this one: the accuracy this step loses
    drop: float
    #: the cosine of the step run alone on its inputs' reference values, stored as planned
    #: (NPU steps; None for the others, and where analyse was asked for the entire run only)
    single: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def analyse(prepared: Prepared, inputs: Mapping[str, np.ndarray],
            single: bool = True) -> tuple[list[StepAccuracy], Execution]:
    """Per-step agreement of the plan's execution with the float32 graph, and the execution;
    with `single`, each NPU step's cosine run alone too (one more pass over the NPU steps)."""
    plan, nodes = prepared.plan, prepared.reference_nodes
    if nodes is None:
        raise EmulationError("accuracy analysis compares with the planned graph in float32, which a saved plan "
                             "does not hold (its weights are stored as the NPU reads them): plan the model")
    written = {name for step in plan.steps for name in step.outputs}
    reference: dict[str, np.ndarray] = {}

    def keep(name: str, value: np.ndarray) -> None:
        if name in written:
            reference[name] = value

    FloatReference(*with_views(plan, nodes), plan.model.opset,
                   [spec.name for spec in plan.model.outputs], observed=written).run(inputs, keep)
    rows: list[StepAccuracy] = []
    cosines: dict[str, float] = {}
    alone = Executor(plan, prepared.weights, get_target(plan.target), prepared.weight_cache) if single else None
    known = {**inputs, **reference}

    steps = bar(total=len(plan.steps), description="accuracy analysis: int8 steps", unit="step")

    def compare(step_id: int, values: dict) -> None:
        steps.update()
        step = plan.steps[step_id]
        before = min((cosines[name] for name in step.inputs if name in cosines), default=1.0)
        singles = alone.run_alone(step_id, known) if alone is not None else None
        for name, value in values.items():
            if name in reference and np.asarray(value).dtype.kind == "f":
                match = _agreement(name, value, reference[name])
                cosines[name] = match.cosine
                own = None if singles is None else _agreement(name, singles[name], reference[name]).cosine
                rows.append(StepAccuracy(step_id, step.device, step.kernel, name, match.cosine, match.max_abs,
                                         before - match.cosine, own))

    with steps:
        execution = emulate(prepared, inputs, observe=compare)
    return rows, execution


def _agreement(name: str, value, expected: np.ndarray):
    """`agreement` over the positions where the float32 reference is finite (-inf attention
    masks: int8 saturates them, compare the rest)."""
    finite = np.isfinite(expected)
    if not finite.all():
        value, expected = np.asarray(value)[finite], expected[finite]
    return agreement(name, value, expected)


def render(rows: list[StepAccuracy], worst: int = 5) -> str:
    """The per-step table, then the steps with the lowest cosine, those that lose the most, and
    (when the rows have them) those that lose the most run alone."""
    lines = [f"{'step':>4} {'device':6} {'kernel':28} {'output':36} {'cosine':>10} {'drop':>9} {'single':>10} "
             f"{'max abs':>10}"]
    lines += [f"{r.step:>4} {r.device:6} {r.kernel[:28]:28} {r.output[-36:]:36} {r.cosine:10.6f} {r.drop:9.6f} "
              f"{'' if r.single is None else f'{r.single:10.6f}':>10} {r.max_abs:10.4g}" for r in rows]
    alone = [r for r in rows if r.single is not None]
    for title, key, shown in ((f"worst {worst} steps by cosine", lambda r: r.cosine, rows),
                              (f"worst {worst} steps by drop (cosine lost in the step itself)", lambda r: -r.drop, rows),
                              (f"worst {worst} steps run alone (single: on their inputs' reference values)",
                               lambda r: r.single, alone)):
        if shown:
            lines += ["", title + ":"]
            lines += [f"  step {r.step} {r.kernel} -> {r.output}: cosine {r.cosine:.6f}, drop {r.drop:.6f}"
                      + ("" if r.single is None else f", single {r.single:.6f}")
                      for r in sorted(shown, key=key)[:worst]]
    return "\n".join(lines)
