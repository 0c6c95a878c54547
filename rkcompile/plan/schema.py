"""The plan contract, `rkcompile.plan/2`: frozen dataclasses, JSON in and out, and invariants.

This module never imports onnx-graphsurgeon: tools that read plans need nothing but the JSON.
docs/plan-schema.md documents every field. `rkcompile.plan/1` files still load: plan/2 only
adds fields (each step's `operation`), so a plan/1 file reads as a plan/2 one without them.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable

from rkcompile.errors import CompileError


PLAN_SCHEMA = "rkcompile.plan/2"
#: Every schema `Plan.from_dict` reads; the older ones lack only fields with a default.
READABLE_SCHEMAS = ("rkcompile.plan/1", PLAN_SCHEMA)

DEVICES_OF_NODES = ("npu", "cpu", "folded", "removed")
DEVICES_OF_STEPS = ("npu", "cpu", "host")
#: "arena": the NPU's intermediate tensors; "cpu": those only CPU steps (and the host conversions
#: for them) read and write, which the CPU runtime keeps in host memory
REGIONS = ("arena", "weight", "input", "output", "cpu")
#: Domain of the nodes rkcompile makes: fused kernels (passes/fuse.py) and host conversions.
FUSED_DOMAIN = "rkcompile"
#: Plan dtypes whose NPU tensors are integers that need `Plan.quantization` to mean anything.
QUANTIZED_DTYPES = ("int8",)
#: The channel orders int8 calibration images can be given in (--channel-order, quantize.ImagePreprocessing).
CHANNEL_ORDERS = ("RGB", "BGR")


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: its name, static shape and ONNX element type name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelInfo:
    """The planned model file: its path and sha256, ai.onnx opset, inputs and outputs."""

    path: str
    sha256: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: the opsets of the other domains the model imports (ai.onnx.ml, ai.onnx.preview.training)
    domain_opsets: dict[str, int] = field(default_factory=dict)
    #: input name -> the symbol ('' when unnamed) of its dim 0, for each input whose dim 0 the
    #: model leaves symbolic: the batch dim, which --batch fills with 1 (an image per context)
    #: and an input shape may fill with more images per run (`images_per_run`)
    batch_dims: dict[str, str] = field(default_factory=dict)

    @property
    def opsets(self) -> dict[str, int]:
        """Every domain's opset, ai.onnx's under ""."""
        return {**self.domain_opsets, "": self.opset}

    @property
    def images_per_run(self) -> int:
        """The images one run of the graph takes: its symbolic batch dim as planned (1 without one)."""
        return max((spec.shape[0] for spec in self.inputs if spec.name in self.batch_dims and spec.shape), default=1)


@dataclass(frozen=True)
class NodeEntry:
    """One node of the input model and its fate: `device` "npu", "cpu", "folded" or "removed",
    the step that runs it, and why it is not on the NPU (`reason`)."""

    name: str
    op: str
    device: str
    step: int | None
    reason: str | None
    #: each rule the node breaks on the NPU, with the values seen (`reason` joins them with "; ",
    #: which rule texts use too); empty when it breaks none, and in plans written before it existed
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    """The ONNX node a step runs, as the kernel reads it: op type and domain, attributes, the
    tensors it reads ('' for an omitted optional input) with their ONNX dtypes, and those it
    writes. Attribute values are JSON: numbers, strings and lists as they are; a tensor as
    {"tensor": {dtype, shape, data (base64, little-endian)}}; a graph (a fused kernel's `body`)
    as {"graph": {name, inputs, outputs, nodes (operations), constants}}, where a graph reads
    weights by name from the weight region and holds only its other constants.
    rkcompile/plan/operations.py writes and reads them."""

    op: str
    name: str
    domain: str
    inputs: tuple[str, ...]
    input_dtypes: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def fused(self) -> bool:
        """A fused kernel: rkcompile's node whose `body` graph holds the members."""
        return self.domain == FUSED_DOMAIN and "body" in self.attributes


@dataclass(frozen=True)
class Step:
    """One step of the execution order: the device and kernel that run it, the model nodes it
    runs, the tensors it reads and writes, its NPU cores and partition."""

    id: int
    device: str
    kernel: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cores: tuple[int, ...]
    partition: int
    note: str | None = None  # why a fusion candidate ending here was not fused
    macs: int = 0  # estimated multiply-accumulates (rkcompile.compiler.cost_estimate); 0 for host steps
    #: What the step executes (plan/2); None in plan/1 files, which need their model to run.
    operation: Operation | None = None
    #: what runs a CPU step in `rkcompile run`: "onnxruntime", or "onnx.reference" for what
    #: onnxruntime has no kernel for (rkcompile/onnx_backends.py); None for NPU and host steps
    cpu_backend: str | None = None


@dataclass(frozen=True)
class TensorPlacement:
    """Where a tensor lives: its shape, dtype and layout as stored, its size in bytes, and its
    region (one of REGIONS) with the offset inside it."""

    shape: tuple[int, ...]
    dtype: str
    layout: str
    bytes: int
    region: str
    offset: int
    #: The arena tensor whose bytes this one overwrites in place (an element-wise step that
    #: reads its last use of `reuses` as it writes this tensor); None when it has bytes of its own.
    reuses: str | None = None
    #: The arena tensor whose stored bytes this one is, read under its own shape: the output of a
    #: relabel that moves no byte (passes/alias.py), which no step writes; None otherwise. The
    #: tensor it names aliases none itself, and holds as many bytes at the same offset.
    aliases: str | None = None
    #: How an alias's elements come from those of the tensor it `aliases`: ("Transpose", perm)
    #: and ("Reshape", shape) steps in order, the last giving its shape; empty when they are in
    #: row-major order (a Reshape of it) and for a tensor that is no alias.
    view: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Quantization:
    """How an integer-stored tensor maps to real values: real = (q - zero_point) * scale.

    One scale and zero point per tensor (per-layer), or one per slice along `axis` (per-channel;
    Conv weights, a zero point per output channel). `dtype` is the stored integer type: int8 for
    activations and weights, int32 for convolution biases (scale = input scale x weight scale).
    `source` says where the range came from: "minmax", "percentile", "kl", "mmse" (calibration),
    "weights" (the constant's own values), "bias", "shared:<tensor>" (a data-movement
    output that keeps its input's parameters, so no requantization happens) or
    "concat:<tensor>" (a Concat operand nothing else reads, written with that Concat output's
    parameters so the Concat moves it unchanged). `warning` says
    when the parameters lose an operand (a Concat operand that spans a few of its steps)."""

    dtype: str
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int | None = None
    source: str = "minmax"
    warning: str | None = None


@dataclass(frozen=True)
class Int8Technique:
    """An accuracy technique an int8 plan applied (docs/quantization.md): `name` is
    "equalization" (cross-layer, `applied` lists the Conv step pairs), "bias_correction"
    (`applied` lists the Conv steps whose int32 bias absorbed their rounded weights' mean shift),
    "auto_float16" (`applied` lists the tensors it kept in float16), "float16_softmax_outputs"
    (`applied` lists the Softmax model outputs computed in float16), "float16_attention_scores"
    (`applied` lists the attention scores computed in float16), "float16_masks" (`applied` lists
    the tensors carrying an attention mask computed in float16), "int8_attention_probabilities"
    (`applied` lists the fused attention probabilities quantized inside their step) or "int8_settings" (the int8
    settings chosen on the calibration data: `applied` the chosen candidate, `declined` each
    other with its worst calibration cosine); `declined` says, per candidate left alone, why;
    `note` sums up."""

    name: str
    applied: tuple[str, ...] = ()
    declined: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Validation:
    """An int8 plan judged on inputs it was not calibrated on (--val): how many samples `path`
    held, and per model output its worst cosine over them against the planned graph in float32."""

    path: str
    samples: int
    cosines: dict[str, float]

    @property
    def worst(self) -> float:
        return min(self.cosines.values())


@dataclass(frozen=True)
class Partition:
    """A run of consecutive steps on one device."""

    id: int
    device: str
    steps: tuple[int, ...]


@dataclass(frozen=True)
class Memory:
    """The arena the plan needs, the lower bound any placement needs, and the weights' bytes."""

    arena_bytes: int
    lower_bound_bytes: int
    weight_bytes: int
    #: Every arena offset is a multiple of this many bytes (docs/memory.md says why).
    alignment: int = 1
    #: The host memory the CPU steps' tensors take (the `cpu` region, planned as the arena is);
    #: 0 in plans written before it, which kept those tensors in the arena.
    cpu_arena_bytes: int = 0


@dataclass(frozen=True)
class MemoryTotals:
    """What a run of the plan holds at once (rknn-toolkit2's eval_memory): the weights, shared by
    every batch context (seed 004: duplicated contexts share them); an arena per context, none
    shared; the batched input and output buffers (`batch` times one run's); and, among the
    weights, those the CPU partitions read; and the CPU steps' tensors in host memory, per
    context as the arena."""

    weight_bytes: int
    arena_bytes: int  # one context's
    contexts: int
    input_bytes: int  # the whole batch's
    output_bytes: int
    cpu_weight_bytes: int
    cpu_arena_bytes: int = 0  # one context's

    @property
    def total_bytes(self) -> int:
        return (self.weight_bytes + (self.arena_bytes + self.cpu_arena_bytes) * self.contexts + self.input_bytes
                + self.output_bytes)


@dataclass(frozen=True)
class IoSlice:
    """Where one image of a model input or output sits in the batched buffer: the queried
    size is `batch` times one image's, and image i starts at i * size / batch (seed 004)."""

    tensor: str
    image: int
    offset: int
    bytes: int


@dataclass(frozen=True)
class BatchContext:
    """One inference context of a multi-batch plan (seed 004: the first plus its duplicates,
    weights shared), the core it runs on, the images it takes and where they are."""

    id: int
    core: int
    images: tuple[int, ...]
    inputs: tuple[IoSlice, ...]
    outputs: tuple[IoSlice, ...]


@dataclass(frozen=True)
class SplitPart:
    """One core's share [start, stop) of a step divided across cores (`StepSplit`)."""

    core: int
    start: int
    stop: int
    #: this core's estimated time for its part (rkcompile/plan/cost_model.py); 0.0 in older plans
    est_ms: float = 0.0


@dataclass(frozen=True)
class StepSplit:
    """A step divided across cores within one input: each core computes [start, stop) of the
    step's output along `axis` ("C" output channels, "H" rows), allowed by `kernel`."""

    step: int
    kernel: str
    axis: str
    parts: tuple[SplitPart, ...]


@dataclass(frozen=True)
class CoreTimeline:
    """One NPU core: the steps it runs (for every image its context takes), its estimated busy
    time and the share of the batch latency that is."""

    core: int
    steps: tuple[int, ...]
    est_ms: float
    utilisation: float


@dataclass(frozen=True)
class Multicore:
    """How the plan uses the NPU cores: batch contexts or steps split within one input, each
    core's timeline, and the cost model's latency, fps and speedup estimates."""

    cores: int
    batch: int
    core_mask: str = "auto"
    contexts: tuple[BatchContext, ...] = ()
    per_core: tuple[CoreTimeline, ...] = ()
    splits: tuple[StepSplit, ...] = ()
    est_latency_ms: float = 0.0  # the whole batch (rkcompile/plan/cost_model.py)
    est_fps: float = 0.0
    est_one_core_ms: float = 0.0  # one image, one run, one core: what `speedup` is against
    speedup: float = 1.0  # images per second against one image at a time on one core
    #: bytes one image's steps read and write in DRAM (inputs, outputs and weights of every
    #: step: a fused kernel's inner tensors never leave the NPU); 0 in older plans
    dram_bytes_per_image: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Multicore":
        io_slices = {"inputs": partial(_build, IoSlice), "outputs": partial(_build, IoSlice)}
        return _build(cls, data, {
            "contexts": lambda context: _build(BatchContext, context, io_slices),
            "per_core": partial(_build, CoreTimeline),
            "splits": lambda split: _build(StepSplit, split, {"parts": partial(_build, SplitPart)}),
        })


@dataclass(frozen=True)
class Rewrite:
    """One applied legalizing rewrite: `rule` replaced the original nodes `nodes` by the nodes
    `into` (names as in --dump-after graphs) of ONNX ops `ops`; both empty for a removed relabel."""

    rule: str
    nodes: tuple[str, ...]
    into: tuple[str, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True)
class PlanRecord:
    """The execution plan of one model for one target (docs/plan-schema.md): what each node
    became, the steps in order, every tensor's placement, the partitions, memory and cores."""

    target: str
    dtype: str
    batch: int
    model: ModelInfo
    nodes: tuple[NodeEntry, ...]
    steps: tuple[Step, ...]
    tensors: dict[str, TensorPlacement]
    partitions: tuple[Partition, ...]
    memory: Memory
    multicore: Multicore
    schema: str = PLAN_SCHEMA
    rewrites: tuple[Rewrite, ...] = ()
    #: Per-tensor int8/int32 parameters of an int8 plan (rkcompile/quantization/params.py); {} for float16.
    quantization: dict[str, Quantization] = field(default_factory=dict)
    #: What the int8 plan did beyond calibrating (equalization, bias correction, auto float16).
    int8_techniques: tuple[Int8Technique, ...] = ()
    #: int8 with --val: the plan's cosines on the validation inputs; None (and absent from the JSON) otherwise
    validation: Validation | None = None

    def memory_totals(self) -> MemoryTotals:
        """The plan's memory, region by region (`MemoryTotals`)."""
        def region(name: str) -> int:
            return sum(tensor.bytes for tensor in self.tensors.values() if tensor.region == name)

        cpu_reads = {name for step in self.steps if step.device == "cpu" for name in step.inputs}
        return MemoryTotals(
            weight_bytes=self.memory.weight_bytes, arena_bytes=self.memory.arena_bytes,
            contexts=len(self.multicore.contexts) or 1, input_bytes=self.batch * region("input"),
            output_bytes=self.batch * region("output"),
            cpu_weight_bytes=sum(self.tensors[name].bytes for name in cpu_reads
                                 if self.tensors[name].region == "weight"),
            cpu_arena_bytes=self.memory.cpu_arena_bytes)

    @property
    def images(self) -> int:
        """The images one batch takes: `batch` contexts' runs of `model.images_per_run` each."""
        return self.batch * self.model.images_per_run

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        # added after plan/2 was published: written only when set, so every other plan's JSON
        # is byte for byte what it was
        if not body["model"]["batch_dims"]:
            del body["model"]["batch_dims"]
        if body["validation"] is None:
            del body["validation"]
        if not body["memory"]["cpu_arena_bytes"]:
            del body["memory"]["cpu_arena_bytes"]
        for tensor in body["tensors"].values():
            if tensor["aliases"] is None:
                del tensor["aliases"]
            if not tensor["view"]:
                del tensor["view"]
        # derived from the rest, for readers of the JSON: `from_dict` leaves it out, so a plan
        # written before it loads alike
        body["memory"]["total_bytes"] = self.memory_totals().total_bytes
        ordered = {"schema": body.pop("schema")}
        ordered.update(body)
        return ordered

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        if data.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(f"not a {PLAN_SCHEMA} plan (schema {data.get('schema')!r})")
        model = data["model"]
        return cls(
            schema=PLAN_SCHEMA, target=data["target"], dtype=data["dtype"], batch=data["batch"],
            model=ModelInfo(
                path=model["path"], sha256=model["sha256"], opset=model["opset"],
                inputs=tuple(_build(TensorSpec, t) for t in model["inputs"]),
                outputs=tuple(_build(TensorSpec, t) for t in model["outputs"]),
                domain_opsets=dict(model.get("domain_opsets", {})),
                batch_dims=dict(model.get("batch_dims", {})),
            ),
            nodes=tuple(_build(NodeEntry, n) for n in data["nodes"]),
            steps=tuple(_build(Step, s, {"operation": partial(_build, Operation)}) for s in data["steps"]),
            tensors={name: _build(TensorPlacement, t, {"view": lambda step: (step[0], tuple(step[1]))})
                     for name, t in data["tensors"].items()},
            partitions=tuple(_build(Partition, p) for p in data["partitions"]),
            memory=_build(Memory, data["memory"]),
            multicore=Multicore.from_dict(data["multicore"]),
            rewrites=tuple(_build(Rewrite, r) for r in data.get("rewrites", ())),
            quantization={name: _build(Quantization, q) for name, q in data.get("quantization", {}).items()},
            int8_techniques=tuple(_build(Int8Technique, t) for t in data.get("int8_techniques", ())),
            validation=_build(Validation, data["validation"]) if data.get("validation") is not None else None,
        )


def _build(cls, data: dict[str, Any], nested: dict[str, Callable[[Any], Any]] | None = None):
    """Construct a dataclass from JSON, turning lists back into tuples (of what `nested` builds
    from each item, or from the value when it is one object, for the fields it names); unknown
    keys are kept out so plans written by newer versions that only add fields still load, and
    fields with a default may be absent so older plans load too."""
    nested = nested or {}
    values = {}
    for f in fields(cls):
        if f.name not in data and (f.default is not MISSING or f.default_factory is not MISSING):
            continue  # a field added later with a default; older plans omit it
        value = data[f.name]
        if f.name in nested and isinstance(value, (list, tuple)):
            value = [nested[f.name](item) for item in value]
        elif f.name in nested and isinstance(value, dict):
            value = nested[f.name](value)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


#: The path that means "standard output" to every command that writes a file (`--json -`).
STDOUT = "-"


def write_atomically(path: str | os.PathLike, text: str | bytes) -> None:
    """Write via a temporary file in the same folder, so a failure leaves no partial file;
    `bytes` are written as they are, `str` as UTF-8. The path "-" writes to standard output.
    Missing parent folders are created, and the file gets the mode any new file gets under the
    umask (mkstemp's own 0600 would hide a plan from the other users of a board)."""
    if str(path) == STDOUT:
        stream = sys.stdout.buffer if isinstance(text, bytes) else sys.stdout
        stream.write(text)
        stream.flush()
        return
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CompileError(f"cannot write {path}: {exc.strerror}") from None
    try:
        os.chmod(temporary, 0o666 & ~_umask())
        with (os.fdopen(handle, "wb") if isinstance(text, bytes) else
              os.fdopen(handle, "w", encoding="utf-8")) as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask; reading it means setting it, so it is set straight back."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def contract_violations(plan: PlanRecord, original_nodes: list[str] | None = None) -> list[str]:
    """Every way `plan` breaks the contract in docs/plan-schema.md; empty when it holds.

    `original_nodes`, when given, are the node names of the input ONNX graph, which `nodes`
    must list exactly once each.
    """
    problems: list[str] = []
    names = [n.name for n in plan.nodes]
    if len(set(names)) != len(names):
        problems.append("nodes: duplicate names")
    if original_nodes is not None and sorted(names) != sorted(original_nodes):
        problems.append("nodes: not exactly one entry per node of the input graph")
    step_ids = [s.id for s in plan.steps]
    if step_ids != list(range(len(plan.steps))):
        problems.append("steps: ids are not 0..n-1 in execution order")
    steps_by_id = {s.id: s for s in plan.steps}
    for node in plan.nodes:
        if node.device not in DEVICES_OF_NODES:
            problems.append(f"node {node.name}: bad device {node.device!r}")
        if node.device == "cpu" and not node.reason:
            problems.append(f"node {node.name}: on the CPU without a reason")
        if node.device in ("npu", "cpu"):
            step = steps_by_id.get(node.step)
            if step is None or node.name not in step.nodes or step.device != node.device:
                problems.append(f"node {node.name}: step {node.step} does not run it on {node.device}")
        elif node.step is not None:
            problems.append(f"node {node.name}: {node.device} but has step {node.step}")
    available = {s.name for s in plan.model.inputs}
    available |= {name for name, t in plan.tensors.items() if t.region == "weight"}
    views = aliases_of(plan.tensors)
    for step in plan.steps:
        if step.device not in DEVICES_OF_STEPS:
            problems.append(f"step {step.id}: bad device {step.device!r}")
        for tensor in step.inputs:
            if tensor not in available:
                problems.append(f"step {step.id}: input {tensor} is not a model input, weight or earlier output")
        for tensor in step.inputs + step.outputs:
            if tensor not in plan.tensors:
                problems.append(f"step {step.id}: tensor {tensor} missing from tensors")
            elif step.device == "npu" and plan.tensors[tensor].region == "cpu":
                problems.append(f"step {step.id}: the NPU step touches {tensor}, held in the CPU's memory")
        for tensor in step.outputs:
            if tensor in plan.tensors and plan.tensors[tensor].aliases is not None:
                problems.append(f"step {step.id}: writes {tensor}, which aliases {plan.tensors[tensor].aliases}")
        available.update(step.outputs)
        available.update(alias for output in step.outputs for alias in views.get(output, ()))
    for name, tensor in plan.tensors.items():
        source = plan.tensors.get(tensor.aliases) if tensor.aliases is not None else None
        if tensor.aliases is not None and (source is None or source.aliases is not None or source.region != "arena"
                                           or tensor.region != "arena" or source.bytes != tensor.bytes
                                           or source.dtype != tensor.dtype):
            problems.append(f"tensor {name}: aliases {tensor.aliases}, which is no arena tensor of its bytes and dtype")
        if tensor.view and (tensor.aliases is None or any(op not in ("Transpose", "Reshape") for op, _ in tensor.view)
                            or tensor.view[-1][0] == "Reshape" and tuple(tensor.view[-1][1]) != tuple(tensor.shape)):
            problems.append(f"tensor {name}: a view that is no alias's chain of Transposes and Reshapes to its shape")
    for output in plan.model.outputs:
        if output.name not in available:
            problems.append(f"model output {output.name} is never produced")
    for name, tensor in plan.tensors.items():
        if tensor.region not in REGIONS:
            problems.append(f"tensor {name}: bad region {tensor.region!r}")
        if tensor.bytes < 0 or tensor.offset < 0:
            problems.append(f"tensor {name}: negative bytes or offset")
        if tensor.region == "arena" and tensor.offset + tensor.bytes > plan.memory.arena_bytes:
            problems.append(f"tensor {name}: outside the arena")
        if tensor.region == "cpu" and tensor.offset + tensor.bytes > plan.memory.cpu_arena_bytes:
            problems.append(f"tensor {name}: outside the cpu region")
        if tensor.region == "weight" and tensor.offset + tensor.bytes > plan.memory.weight_bytes:
            problems.append(f"tensor {name}: outside the weight region")
    # the weight, input and output regions hold their tensors one after another, never shared
    for region in ("weight", "input", "output"):
        placed = sorted((t.offset, t.offset + t.bytes, name) for name, t in plan.tensors.items()
                        if t.region == region and t.bytes)
        for (_, end, before), (start, _, after) in zip(placed, placed[1:]):
            if start < end:
                problems.append(f"tensors {before} and {after} overlap in the {region} region")
    covered = sorted(i for p in plan.partitions for i in p.steps)
    if covered != step_ids:
        problems.append("partitions: do not cover every step exactly once")
    for partition in plan.partitions:
        for step_id in partition.steps:
            step = steps_by_id.get(step_id)
            if step is not None and (step.partition != partition.id or step.device != partition.device):
                problems.append(f"partition {partition.id}: step {step_id} disagrees on partition or device")
    if plan.memory.lower_bound_bytes > plan.memory.arena_bytes:
        problems.append("memory: lower bound above the arena")
    for name, tensor in plan.tensors.items():
        if tensor.dtype in QUANTIZED_DTYPES and plan.dtype in QUANTIZED_DTYPES and name not in plan.quantization:
            problems.append(f"tensor {name}: stored {tensor.dtype} without quantization parameters")
    intermediates = fused_intermediates(plan)
    for name, quant in plan.quantization.items():
        if name not in plan.tensors and name not in intermediates:
            problems.append(f"quantization: {name} is not a tensor of the plan")
        elif len(quant.scales) != len(quant.zero_points) or not all(s > 0 for s in quant.scales):
            problems.append(f"quantization of {name}: scales must be positive, one zero point each")
    return problems + _multicore_violations(plan, steps_by_id)


def fused_intermediates(plan: PlanRecord) -> set[str]:
    """The tensors NPU fused steps compute inside their bodies and store nowhere: an int8 plan
    may give one quantization parameters the step rounds it to (passes/quantize.py)."""
    found: set[str] = set()

    def visit(graph: dict) -> None:
        for node in graph["nodes"]:
            found.update(node["outputs"])
            body = node.get("attributes", {}).get("body")
            if isinstance(body, dict) and "graph" in body:
                visit(body["graph"])

    for step in plan.steps:
        if step.device == "npu" and step.operation is not None and step.operation.fused:
            visit(step.operation.attributes["body"]["graph"])
            found.difference_update(step.outputs)
    return found


def aliases_of(tensors: dict[str, TensorPlacement]) -> dict[str, list[str]]:
    """{tensor: the tensors that alias it (`TensorPlacement.aliases`)}, for the tensors some alias names."""
    found: dict[str, list[str]] = {}
    for name, tensor in tensors.items():
        if tensor.aliases is not None:
            found.setdefault(tensor.aliases, []).append(name)
    return found


def _multicore_violations(plan: PlanRecord, steps_by_id: dict[int, Step]) -> list[str]:
    """The per-core lists, splits and contexts agree with the steps and the batch."""
    multicore = plan.multicore
    problems = []
    timeline_cores = {timeline.core for timeline in multicore.per_core}
    if multicore.cores != max(len(multicore.per_core), 1):
        problems.append(f"multicore: cores {multicore.cores} but {len(multicore.per_core)} per-core timelines")
    for timeline in multicore.per_core:
        if any(getattr(steps_by_id.get(s), "device", None) != "npu" for s in timeline.steps):
            problems.append(f"multicore: core {timeline.core} lists a step that is not an NPU step")
    for step in plan.steps:
        if step.device == "npu" and not set(step.cores) <= timeline_cores:
            problems.append(f"step {step.id}: cores {list(step.cores)} have no per-core timeline")
    for split in multicore.splits:
        step = steps_by_id.get(split.step)
        bounds = [(part.start, part.stop) for part in split.parts]
        if step is None or step.cores != tuple(part.core for part in split.parts):
            problems.append(f"multicore: split of step {split.step} disagrees with the step's cores")
        if any(start >= stop for start, stop in bounds) or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
            problems.append(f"multicore: split of step {split.step} has empty, overlapping or gapped parts")
    if multicore.contexts:
        images = sorted(i for context in multicore.contexts for i in context.images)
        if images != list(range(multicore.batch)):
            problems.append("multicore: contexts do not take every image of the batch exactly once")
        for context in multicore.contexts:
            for io in context.inputs + context.outputs:
                if io.offset != io.image * io.bytes or io.image not in context.images:
                    problems.append(f"multicore: context {context.id} reads or writes {io.tensor} at a wrong offset")
    return problems
