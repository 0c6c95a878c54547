"""What the compiler asks of a runtime, and nothing more. Planning itself runs nothing; an int8
plan does: the quantize pass observes the planned graph run in float32 on the calibration inputs
(and, with bias correction, each Conv's output shift from its rounded weights), and choosing the
int8 settings or --auto-float16's float16 steps runs candidate plans and compares their outputs
with that float32 run. The compiler imports no runtime: the caller passes one in
(`pipeline.compile_model(runtime=...)`; rkcompile.api passes the emulator's, `EmulatorRuntime`),
so the float32 semantics calibration sees are the runtime's own, the same the accuracy analysis
compares with. A float16 plan needs none.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Protocol, Sequence

import numpy as np
import onnx_graphsurgeon as gs

if TYPE_CHECKING:
    from rkcompile.compiler.context import CompileContext
    from rkcompile.plan.schema import Plan as PlanRecord

#: name, value: a tensor the float32 run wrote
Visit = Callable[[str, np.ndarray], None]
#: name, value -> a value the run continues with instead, or None to keep it
Adjust = Callable[[str, np.ndarray], "np.ndarray | None"]


class FloatGraph(Protocol):
    """Planned steps run in float32 in their order: NPU steps with nothing rounded to a stored
    dtype, CPU steps on their backend, host conversions as the identity."""

    def run(self, inputs: Mapping[str, np.ndarray], visit: Visit | None = None,
            adjust: Adjust | None = None) -> dict[str, np.ndarray]:
        """The graph outputs; `visit` sees each observed tensor as it is written, and `adjust`
        may replace one for the steps after it."""


class Runtime(Protocol):
    def float_graph(self, nodes: Sequence[gs.Node], devices: Sequence[str], opset: int, outputs: Sequence[str],
                    observed: Collection[str] | None = None) -> FloatGraph:
        """The float32 run of `nodes` (each step's node, on the device in `devices`), returning
        `outputs` and visiting the `observed` tensors (None: every tensor a step writes)."""

    def convolve(self, conv: gs.Node, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """`conv`'s convolution of `x` by `weight` (no bias) in float32, as the float run computes it."""

    def runnable(self, record: PlanRecord, ctx: CompileContext) -> Any:
        """A compiled plan this runtime runs (`run`, `step_drops`); it has the `record` and the
        `reference_nodes` (each step's node with the model's own constants) of the compile."""

    def run(self, plan: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of a `runnable` plan executed as planned."""

    def step_drops(self, plan: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Per tensor a step writes, the output cosine its step loses against its inputs' (the
        accuracy analysis's drop)."""

    def cosine(self, name: str, actual: Any, expected: Any) -> float:
        """The cosine similarity of output `name` computed against its expected value."""
