"""Accuracy analysis: where an int8 plan loses accuracy, step by step.

The open counterpart of rknn-toolkit2's accuracy_analysis: the plan is executed as planned
(int8 storage and kernels), and every step's outputs, dequantized, are compared with the same
tensors of the planned graph run in float32 (`float_reference`). The error each step shows is
the accumulated error of the whole int8 run up to it ("entire" in rknn-toolkit2's terms), so
the worst steps are where the cosine falls; a step whose cosine drops sharply from its inputs'
is where quantization hurts. Where the float32 reference is not finite (-inf attention masks,
which int8 saturates), the finite positions are compared.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from rkcompile.progress import bar

from .compare import agreement
from .executor import Execution
from .float_reference import FloatReference
from .session import Prepared, emulate
from .storage import EmulationError


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

    def to_dict(self) -> dict:
        return asdict(self)


def analyse(prepared: Prepared, inputs: Mapping[str, np.ndarray]) -> tuple[list[StepAccuracy], Execution]:
    """Per-step agreement of the plan's execution with the float32 graph, and the execution."""
    plan, nodes = prepared.plan, prepared.reference_nodes
    if nodes is None:
        raise EmulationError("accuracy analysis compares with the planned graph in float32, which a saved plan "
                             "does not hold (its weights are stored as the NPU reads them): plan the model")
    written = {name for step in plan.steps for name in step.outputs}
    reference: dict[str, np.ndarray] = {}

    def keep(name: str, value: np.ndarray) -> None:
        if name in written:
            reference[name] = value

    FloatReference(nodes, [s.device for s in plan.steps], plan.model.opset,
                   [spec.name for spec in plan.model.outputs], observed=written).run(inputs, keep)
    rows: list[StepAccuracy] = []
    cosines: dict[str, float] = {}

    steps = bar(total=len(plan.steps), description="accuracy analysis: int8 steps", unit="step")

    def compare(step_id: int, values: dict) -> None:
        steps.update()
        step = plan.steps[step_id]
        before = min((cosines[name] for name in step.inputs if name in cosines), default=1.0)
        for name, value in values.items():
            if name in reference and np.asarray(value).dtype.kind == "f":
                expected = reference[name]
                finite = np.isfinite(expected)
                if not finite.all():  # -inf attention masks: int8 saturates them, compare the rest
                    value, expected = np.asarray(value)[finite], expected[finite]
                match = agreement(name, value, expected)
                cosines[name] = match.cosine
                rows.append(StepAccuracy(step_id, step.device, step.kernel, name, match.cosine, match.max_abs,
                                         before - match.cosine))

    with steps:
        execution = emulate(prepared, inputs, observe=compare)
    return rows, execution


def render(rows: list[StepAccuracy], worst: int = 5) -> str:
    """The per-step table, then the steps with the lowest cosine and those that lose the most."""
    lines = [f"{'step':>4} {'device':6} {'kernel':28} {'output':36} {'cosine':>10} {'drop':>9} {'max abs':>10}"]
    lines += [f"{r.step:>4} {r.device:6} {r.kernel[:28]:28} {r.output[-36:]:36} {r.cosine:10.6f} {r.drop:9.6f} "
              f"{r.max_abs:10.4g}" for r in rows]
    for title, key in ((f"worst {worst} steps by cosine", lambda r: r.cosine),
                       (f"worst {worst} steps by drop (cosine lost in the step itself)", lambda r: -r.drop)):
        lines += ["", title + ":"]
        lines += [f"  step {r.step} {r.kernel} -> {r.output}: cosine {r.cosine:.6f}, drop {r.drop:.6f}"
                  for r in sorted(rows, key=key)[:worst]]
    return "\n".join(lines)
