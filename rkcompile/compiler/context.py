"""What the passes share: the options (rkcompile/options.py), the graph, and the records the
plan is assembled from.

Passes key their records by the current gs node name. `origins` maps each current node back to
the nodes of the input ONNX graph it stands for, so a rewrite or fusion that replaces nodes
keeps the plan's one-entry-per-original-node promise.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, ContextManager, Mapping, NamedTuple, Protocol, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.options import Options
from rkcompile.plan.schema import (Int8Technique, Memory, ModelInfo, Multicore, Quantization, Rewrite,
    TensorPlacement)
from rkcompile.plan.plain_nodes import Node as PlainNode
from rkcompile.targets.model import Target

if TYPE_CHECKING:  # int8 only: a float16 plan never imports them
    from rkcompile.plan.schema import PlanRecord
    from rkcompile.quantization.params import KeptDraws, RangeObserver


@dataclass(frozen=True)
class Failure:
    """One rule a node broke: the rendered rule text and the value that broke it."""

    rule: str
    detail: str

    def __str__(self) -> str:
        rule = self.rule.rstrip(".")
        return f"{rule} (seen: {self.detail})" if self.detail else rule


@dataclass(frozen=True)
class Placement:
    """Where one node runs: its device and kernel, and why when not on the NPU."""

    device: str
    kernel: str
    reason: str | None = None


@dataclass(frozen=True)
class RewriteAttempt:
    """One rewrite rule tried on a node: what `plan --explain` lists. `outcome` is 'applied', or
    why the rule declined or why its candidates could not be made legal."""

    node: str
    rule: str
    outcome: str


class Verdict(NamedTuple):
    """One target rule's verdict on one node (passes/legalize.py)."""

    rule: str
    ok: bool
    detail: str


class CheckedNode(NamedTuple):
    """What `plan --explain` shows for one node: the values the rules saw and every verdict."""

    name: str
    op: str
    originals: tuple[str, ...]
    seen: str
    verdicts: list[Verdict]


class RuleVerdicts(Protocol):
    """The target rules' verdicts the rewrite pass worked out (passes/rewrite.py `_Verdicts`),
    which legalize asks again instead of evaluating the rules."""

    def verdicts(self, node: gs.Node, target: Target, facts: dict[str, object]) -> list[Verdict]: ...


class CalibrationRun(Protocol):
    """What one int8 calibration run observed (passes/quantize.py `Calibration`): a range
    observer per tensor, and per tensor that equalization divides one of its equalized form;
    the float32 graph it ran (the model's own constants) and its outputs per calibration sample."""

    observers: Mapping[str, RangeObserver]
    equalized: Mapping[str, RangeObserver]
    graph: FloatGraph | None
    outputs: Sequence[dict[str, np.ndarray]] | None


# --- what the compiler asks of a runtime -------------------------------------------------
# What the compiler asks of a runtime, and nothing more. Planning itself runs nothing; an int8
# plan does: the quantize pass observes the planned graph run in float32 on the calibration inputs
# (and, with bias correction, each Conv's output shift from its rounded weights), and choosing the
# int8 settings or --auto-float16's float16 steps runs candidate plans and compares their outputs
# with that float32 run. The compiler imports no runtime: the caller passes one in
# (`pipeline.compile_model(runtime=...)`; rkcompile.api passes the emulator's, `EmulatorRuntime`),
# so the float32 semantics calibration sees are the runtime's own, the same the accuracy analysis
# compares with. A float16 plan needs none.

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

    # optional: a float graph without it never takes another's outputs as its own
    def same_outputs(self, other: FloatGraph, inputs: Mapping[str, np.ndarray]) -> bool:
        """Whether `other`'s run on `inputs` gives this graph's outputs bit for bit."""


class Runtime(Protocol):
    def float_graph(self, nodes: Sequence[PlainNode], devices: Sequence[str], opset: int, outputs: Sequence[str],
                    observed: Collection[str] | None = None) -> FloatGraph:
        """The float32 run of `nodes` (each step's node as the plan layer's plain node, on the
        device in `devices`; rkcompile.ir.nodes.plain_nodes converts the compiler's), returning
        `outputs` and visiting the `observed` tensors (None: every tensor a step writes)."""

    def tap_means(self, conv: gs.Node, x: np.ndarray, kernel: Sequence[int]) -> np.ndarray:
        """Per channel of `x` (N, C, *spatial) and tap of a `kernel`-sized window of `conv`, the
        mean over the batch and the convolution's output positions of the value the tap reads
        (padding reads zero), in float64: (C, *kernel). Any convolution's mean output is these
        contracted with its weights."""

    def runnable(self, record: PlanRecord, ctx: CompileContext) -> Any:
        """A compiled plan this runtime runs (`run`, `step_drops`); it has the `record` and the
        `reference_nodes` (each step's node with the model's own constants) of the compile."""

    def run(self, plan: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of a `runnable` plan executed as planned."""

    # optional: a runtime without it has every run made when asked
    def run_ahead(self, plan: Any, inputs: Mapping[str, np.ndarray]) -> Future:
        """`run`'s outputs, computed on another thread or process while the caller goes on (a
        judge runs the sample a leading candidate would run next while it runs this one)."""

    # optional: the context a judge makes runs two at a time in (its own and `run_ahead`'s)
    def two_at_a_time(self) -> ContextManager:
        """Entered before the plans those runs run are made: a runtime that runs ahead in another
        process starts it, and each runner keeps to one processor's worth of threads (its BLAS)
        until the context ends, so the two do not oversubscribe the machine."""

    def step_drops(self, plan: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Per tensor a step writes, the output cosine its step loses against its inputs' (the
        accuracy analysis's drop)."""

    def cosine(self, name: str, actual: Any, expected: Any) -> float:
        """The cosine similarity of output `name` computed against its expected value."""


@dataclass
class CompileContext:
    """What the passes share: the model, target and options, the graph, and what each pass
    records for the plan."""

    model_path: Path
    target: Target
    options: Options = field(default_factory=Options)
    graph: gs.Graph | None = None
    model_info: ModelInfo | None = None
    original_nodes: list[tuple[str, str]] = field(default_factory=list)
    origins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    fates: dict[str, tuple[str, str]] = field(default_factory=dict)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    placement: dict[str, Placement] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    partitions: list[tuple[str, list[str]]] = field(default_factory=list)
    tensors: dict[str, TensorPlacement] = field(default_factory=dict)
    memory: Memory | None = None
    rewrites: list[Rewrite] = field(default_factory=list)  # applied by the rewrite pass, in order
    rewrite_attempts: dict[str, list[RewriteAttempt]] = field(default_factory=dict)  # original node -> rules tried
    notes: dict[str, str] = field(default_factory=dict)  # current node -> why it was not fused
    verdicts: dict[str, CheckedNode] = field(default_factory=dict)  # legalize: every rule and verdict per node
    #: rewrite -> legalize: the target rules' verdicts on the nodes the rewrite pass checked, by
    #: each node's state (passes/rewrite.py _Verdicts); legalize takes them and clears this
    rule_verdicts: RuleVerdicts | None = None
    multicore: Multicore | None = None  # contexts, splits, per-core timeline, estimates (passes/multicore.py)
    step_cores: dict[str, tuple[int, ...]] = field(default_factory=dict)  # NPU node -> cores it runs on
    quantization: dict[str, Quantization] = field(default_factory=dict)  # int8 plans: tensor -> parameters
    int8_techniques: list[Int8Technique] = field(default_factory=list)  # int8: what the quantize pass applied
    #: constants the quantize pass changed away from the model's float semantics (a corrected
    #: bias) -> the model's value, which the float reference of accuracy analysis keeps
    reference_constants: dict[str, np.ndarray] = field(default_factory=dict)
    #: int8: what the quantize pass's float32 calibration run observed (passes/quantize.py
    #: `Calibration`); set beforehand, a later plan of the same graph reuses it (--auto-float16)
    calibration: CalibrationRun | None = None
    #: int8: the calibration inputs (rkcompile/quantization/params.py `calibration_samples`), read by the
    #: quantize pass when not set beforehand; a Planner sets its own, read (and warned about) once
    calibration_samples: list[dict[str, np.ndarray]] | None = None
    #: int8: the positions calibration observers keep (rkcompile/quantization/params.py
    #: `KeptDraws`), made by the quantize pass when not set beforehand; a Planner shares its own
    kept_draws: KeptDraws | None = None
    #: int8: what runs the float32 calibration run and judges candidate plans
    #: (`Runtime` above), set by the caller; a float16 plan needs none
    runtime: Runtime | None = None

    def retire(self, node: gs.Node, fate: str, reason: str) -> None:
        """Record that `node` leaves the graph as `fate` ('folded' or 'removed'). Only the
        passes before legalize retire nodes, so no failure or placement names one yet."""
        for original in self.origins.pop(node.name, (node.name,)):
            self.fates[original] = (fate, reason)

    def cleanup_graph(self) -> None:
        """onnx-graphsurgeon's cleanup, with every node it drops (no graph output depends on
        it) retired as 'removed', so the plan still lists each original node once."""
        before = list(self.graph.nodes)
        self.graph.cleanup(remove_unused_graph_inputs=False)
        kept = {id(node) for node in self.graph.nodes}
        for node in before:
            if id(node) not in kept and node.name in self.origins:
                self.retire(node, "removed", "no graph output depends on it")
