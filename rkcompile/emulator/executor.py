"""Execute a plan step by step on `Storage`: NPU steps through the kernel registry in float32
with results rounded once to the stored dtype, CPU steps in the model's dtype on the backend the
step names (onnxruntime, or onnx.reference for what onnxruntime cannot
run; reference.py), host steps as the layout and dtype conversions they name.

Everything comes from the plan and its weight region: the order, the tensors each step reads
and writes, where every tensor lives, and each step's operation (attributes, fused members),
rebuilt into the node the kernels take (rkcompile/plan/operations.py). A weight an operation reads
is decoded from the weight region at its planned offset, in its planned layout and dtype, so a
wrong offset or layout is a wrong answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from rkcompile.collector import cyclic_collector_paused
from rkcompile.numerics.dtypes import dtype_name, element_count
from rkcompile.plan.plain_nodes import (ACCUMULATING_OPS, Constant, DeferredConstant, Graph, Node, Tensor,
                                        accumulator_stages, fused_body, node_operands)
from rkcompile.plan.operations import rebuild
from rkcompile.plan.schema import PlanRecord, Step
from rkcompile.quantization.params import dequantize, is_movement, quantize
from rkcompile.targets.model import Target

from rkcompile.emulator import kernels  # noqa: F401  (registers the kernels)
from rkcompile.emulator.cpu_partition import CpuPartition, cpu_runs
from rkcompile.emulator.fused import run_fused
from rkcompile.emulator.int8 import QTensor, run_int8
from rkcompile.emulator.reference import CpuRuntime, run_reference
from rkcompile.emulator.registry import IN_PLACE, KERNELS, Unsupported
from rkcompile.numerics import float16 as half
from rkcompile.numerics.float16 import cast
from rkcompile.onnx_backends import ONNX_REFERENCE, ONNXRUNTIME
from rkcompile.emulator.storage import EmulationError, Storage, held_by_runtime, is_float

#: float dtypes a model's weight may have, which its CPU step computes in (bfloat16 and the
#: float8s through ml_dtypes, whose numpy kind is not "f")
MODEL_FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz",
                      "float8_e5m2", "float8_e5m2fnuz")
#: NPU ops whose kernels only reshape, reorder, select or join elements, never compute with them
MOVEMENT_IN_STORED_DTYPE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split",
                                      "Concat"})
#: observe(step, {output name: real value}) after each step, for accuracy analysis
Observe = Callable[[int, dict], None]


@dataclass
class Execution:
    outputs: dict[str, np.ndarray]
    #: "step N op: reason" for each NPU op a kernel handed to onnx.reference, and each CPU node
    #: onnxruntime failed on while running, which onnx.reference then computed
    fallbacks: list[str] = field(default_factory=list)
    #: CPU tensors of unknown shape held outside the regions (see storage.py)
    dynamic_tensors: int = 0
    #: "step N KERNEL -> TENSOR: ..." for each step whose result, finite as computed (in float32),
    #: held values that became infinities when stored in the tensor's float16 (`overflow_note`)
    overflows: list[str] = field(default_factory=list)


#: ops that give each value an input of theirs or a constant bound: rounding before or after them
#: stores the same float16 values
ROUNDING_COMMUTES = frozenset({"Relu", "Clip"})


#: fused kernels that keep every intermediate in float32, so no member's result leaves an
#: accumulator rounded: a norm's statistics (an RMSNorm or L2 normalization written with a 1x1
#: Conv of its mean square is exNorm, kernels/layernorm.py), and an attention's scores and
#: weights. rknn-toolkit2 2.5.0's simulator runs exSDPAttention (q @ k^T, a scale, Softmax, @ v
#: on [1, 2, 16, 8]) bit for bit as this emulator does with its scores kept in float32, and at
#: 47% of positions with them rounded to float16; scores of 1.04e5 give its output a cosine of
#: 0.99999998 where float16 scores overflow.
FLOAT32_WITHIN = frozenset({"exNorm", "exSDPAttention"})


def leaving_accumulator(kernel: str, body, dtype: str | None) -> frozenset[str]:
    """The intermediates of a fused NPU kernel that leave the convolution core's accumulator,
    rounded to the stored float `dtype` before the rest of the kernel computes with them.
    rknn-toolkit2 2.5.0's simulator does so in every fused form it was given: a Conv followed by
    Add (another tensor), Relu+Add, LeakyRelu, Sigmoid, Swish or HardSwish matches the rest
    computed on the float16-rounded conv result at 99.3-99.95% of positions, on the unrounded
    one at 61-87%; MatMul followed by Add or Sigmoid, Gemm followed by Sigmoid the same. Biases
    are inside the stage (`plain_nodes.accumulator_stages`). Empty when nothing after the stage
    can tell (Relu, Clip) or the kernel stores no narrower float."""
    if dtype not in ("float16", "bfloat16") or kernel in FLOAT32_WITHIN:
        return frozenset()
    stages = accumulator_stages(body.nodes, body.outputs)
    outputs = {t.name for t in body.outputs}
    inside = frozenset(stage.output for stage in stages if stage.output not in outputs)
    staged = {stage.output for stage in stages}
    rest = [m for m in body.nodes if m.op not in ACCUMULATING_OPS and not staged & {t.name for t in m.outputs}]
    return inside if inside and any(m.op not in ROUNDING_COMMUTES for m in rest) else frozenset()


def rounded_in_its_order(value: np.ndarray, dtype: str) -> np.ndarray:
    """`value` rounded to `dtype` and back to float32, its axes kept in their memory order (a
    Conv's result is channels-last in memory, which the write to NC1HWC2 then reads in order)."""
    order = np.argsort(value.strides, kind="stable")[::-1]
    rounded = cast(cast(value.transpose(order), dtype), np.float32)
    return rounded.transpose(np.argsort(order))


def overflow_note(step: int, kernel: str, tensor: str, dtype: str, count: int, peak: float) -> str:
    return (f"step {step} {kernel} -> {tensor}: {count} value{'s' * (count != 1)} beyond {dtype}'s range "
            f"became infinities (largest magnitude {peak:.4g}, finite as computed)")


@dataclass
class WeightCache:
    """What every run of one plan computes the same way, because weights are constants: each
    weight's real value decoded from the weight region (float32 for float weights; an int8
    weight's only once a step reads it as reals), the step nodes rebuilt over them, and the
    onnxruntime sessions of the CPU steps. The first run makes them from its weight region;
    weights are not arena tensors, so nothing the plan places is bypassed."""
    decoded: dict[str, np.ndarray] = field(default_factory=dict)
    #: each int8 weight as NPU steps read it, keeping what the int8 kernels derive from it
    quantized: dict[str, QTensor] = field(default_factory=dict)
    nodes: list[Node] | None = None
    #: onnxruntime sessions of the CPU steps, made by the first run that needs them
    cpu: CpuRuntime | None = None
    #: the runs of consecutive CPU steps executed as one session each, by their first step's index
    partitions: dict[int, CpuPartition] | None = None


@dataclass(frozen=True)
class PreparedStep:
    """A step as every run executes it, worked out once from the plan (`Executor.prepare`)."""
    step: Step
    node: Node
    #: what the step reads, position by position (`node_operands`)
    operands: tuple[Tensor, ...]
    #: an NPU step whose kernel runs on the stored values (`Executor._moves_stored_values`)
    moves_stored_values: bool = False
    #: a fused NPU step's accumulator results rounded as they leave the core, and the dtype they
    #: are rounded to (`Executor._leaving_accumulator`)
    leaving: tuple[frozenset[str], str | None] = (frozenset(), None)
    #: a CPU step's backend (`Executor._cpu_backend`)
    backend: str | None = None


class Executor:
    """Runs one plan, as many times as asked: its regions, its tensors' views and each step's
    decisions (`prepare`) serve every run, and each run starts from zeroed regions, as a new
    Executor's are, so no run sees what an earlier one left there. Runs of one Executor take
    turns (session.Prepared's lock)."""

    def __init__(self, plan: PlanRecord, weights: bytes, target: Target, weight_cache: WeightCache | None = None):
        without = [step.id for step in plan.steps if step.operation is None]
        if without:
            raise EmulationError(f"step {without[0]} has no operation (a {plan.schema} plan written before "
                                 "plans carried them): plan the model again")
        self.plan = plan
        self.opset = plan.model.opset
        self.storage = Storage(plan, target)
        region = self.storage.regions["weight"]
        if len(weights) != region.size:
            raise EmulationError(f"the weight region holds {len(weights)} bytes, the plan places weights in "
                                 f"{region.size}")
        # the weight region is the weight bytes themselves, read-only: no step writes a weight
        # (Storage.write refuses it), so copying them in (7 MB of new pages to fault in on a
        # mobilenet_v2 first run) changed nothing
        region = np.frombuffer(weights, np.uint8)
        region.flags.writeable = False
        self.storage.regions["weight"] = region
        self.fallbacks: list[str] = []
        self.overflows: list[str] = []
        self._step = -1
        self.quantization = plan.quantization  # int8 plans; empty for float16
        self.weight_cache = WeightCache() if weight_cache is None else weight_cache
        if self.weight_cache.cpu is None:
            self.weight_cache.cpu = CpuRuntime(self.opset, plan.model.domain_opsets)
        self.cpu = self.weight_cache.cpu
        self._steps: list[PreparedStep] | None = None
        self._has_run = False

    def prepare(self) -> list[PreparedStep]:
        """Every step as runs execute it, worked out on first use: the weights decoded, the step
        nodes rebuilt, each step's operands and decisions, the runs of CPU steps one session
        runs (their sessions are made by the first run, from the values it feeds)."""
        if self._steps is None:
            nodes = self.step_nodes()
            steps = [self._prepared_step(step, node) for step, node in zip(self.plan.steps, nodes)]
            self._cpu_partitions(nodes)
            self._steps = steps
        return self._steps

    def _prepared_step(self, step: Step, node: Node) -> PreparedStep:
        if tuple(t.name for t in node.outputs if t.name) != tuple(step.outputs):
            raise EmulationError(f"step {step.id} writes {list(step.outputs)} but its operation {node.name} "
                                 f"writes others")
        operands = tuple(node_operands(node))
        if step.device == "npu":
            return PreparedStep(step, node, operands, self._moves_stored_values(node, operands),
                                self._leaving_accumulator(node))
        if step.device == "cpu":
            return PreparedStep(step, node, operands, backend=self._cpu_backend(step, node))
        return PreparedStep(step, node, operands)

    def step_nodes(self) -> list[Node]:
        """Each step's node, rebuilt from its operation over the weights of this weight region."""
        if self.weight_cache.nodes is None:
            with cyclic_collector_paused():
                self.weight_cache.nodes = self._rebuilt_nodes()
        return self.weight_cache.nodes

    def _rebuilt_nodes(self) -> list[Node]:
        self._decode_float16_weights()
        constants: dict[str, Constant] = {}
        # a weight's constant holds its value in the model's dtype, as the model's constant did
        model_dtypes = {name: dtype for step in self.plan.steps
                        for name, dtype in zip(step.operation.inputs, step.operation.input_dtypes) if dtype}

        def weight(name: str) -> Constant | None:
            placement = self.plan.tensors.get(name)
            if placement is None or placement.region != "weight":
                return None
            if name not in constants:
                # an int8 weight's real value is decoded only if a step reads it as reals (a CPU
                # step, a float kernel): int8 kernels read its integers (`_operand`), and decoding
                # every weight of an int8 plan was a third of preparing it
                constants[name] = (DeferredConstant(name, lambda name=name: model_value(name))
                                   if name in self.quantization else Constant(name, model_value(name)))
            return constants[name]

        def model_value(name: str) -> np.ndarray:
            value, dtype = self._weight(name), model_dtypes.get(name)
            if dtype in MODEL_FLOAT_DTYPES and value.dtype.kind == "f" and dtype != dtype_name(value.dtype):
                value = value.astype(dtype)
            return value

        return [rebuild(step.operation, weight) for step in self.plan.steps]

    def _decode_float16_weights(self) -> None:
        """Every row-major float16 weight decoded to float32 by one conversion per stretch of
        the weight region that holds float16 weights only (one call for many small weights
        instead of one each, the bulk of a first run's weight decoding), all stretches into one
        float32 array numpy allocates (half.cast), each weight then a read-only view
        at its offset: the values `_weight` would decode one by one, bit for bit (both convert
        through `half.cast`). A stretch ends at any other weight (float32, integer, quantized,
        NC1HWC2), whose bytes are not converted (alignment padding between two float16 weights
        is)."""
        weights = sorted(((placement.offset, name, placement) for name, placement in self.plan.tensors.items()
                          if placement.region == "weight" and placement.bytes), key=lambda item: item[0])
        region = self.storage.regions["weight"]
        stretches: list[list] = []  # [first byte, end byte, [(name, placement), ...]]
        after_other = True  # the last weight seen was not a float16 one: a new stretch starts
        for offset, name, placement in weights:
            if (placement.dtype != "float16" or placement.layout == "NC1HWC2" or offset % 2
                    or name in self.quantization or name in self.weight_cache.decoded):
                after_other = True
                continue
            self.storage.view(name)  # checks the tensor's bytes against its layout, as a read does
            if after_other:
                stretches.append([offset, offset, []])
            stretches[-1][1] = max(stretches[-1][1], offset + placement.bytes)
            stretches[-1][2].append((name, placement))
            after_other = False
        decoded = np.empty(sum(end - first for first, end, _ in stretches) // 2, np.float32)
        starts = np.cumsum([0] + [(end - first) // 2 for first, end, _ in stretches]).tolist()
        for (first, end, _), start in zip(stretches, starts):
            cast(region[first:end].view(np.float16), np.float32, out=decoded[start:start + (end - first) // 2])
        decoded.flags.writeable = False  # shared by every step and run that reads it (so are its views)
        for (first, _, members), start in zip(stretches, starts):
            for name, placement in members:
                at = start + (placement.offset - first) // 2
                self.weight_cache.decoded[name] = decoded[at:at + element_count(placement.shape)].reshape(
                    placement.shape)

    def run(self, inputs: Mapping[str, np.ndarray], observe: Observe | None = None) -> Execution:
        if self._has_run:
            self.storage.reset()
        self._has_run = True
        self.fallbacks, self.overflows = [], []
        with cyclic_collector_paused():
            return self._run(inputs, observe)

    def _run(self, inputs: Mapping[str, np.ndarray], observe: Observe | None) -> Execution:
        steps = self.prepare()
        for spec in self.plan.model.inputs:
            if spec.name not in inputs:
                raise EmulationError(f"no value for model input {spec.name}")
            value = np.asarray(inputs[spec.name])
            if tuple(value.shape) != tuple(spec.shape):
                raise EmulationError(f"input {spec.name} has shape {list(value.shape)}, the plan expects "
                                     f"{list(spec.shape)}")
            self.storage.write(spec.name, value)
        partitions = self.weight_cache.partitions
        index = 0
        while index < len(steps):
            partition = partitions.get(index)
            if partition is not None and self._run_partition(partition, observe):
                index += len(partition.steps)
                continue
            self._run_step(steps[index], observe)
            index += 1
        outputs = {spec.name: self.storage.read(spec.name) for spec in self.plan.model.outputs}
        return Execution(outputs, list(self.fallbacks), len(self.storage.dynamic), list(self.overflows))

    def _run_step(self, prepared: PreparedStep, observe: Observe | None) -> None:
        step, node = prepared.step, prepared.node
        self._step = step.id
        if step.device == "host":
            (source,), (converted,) = step.inputs, step.outputs
            self._store(converted, self._real(source))
        else:
            if prepared.moves_stored_values:
                # weights (a Reshape's shape) as decoded when the nodes were rebuilt: no copy
                decoded = self.weight_cache.decoded
                values = [None if not t.name else decoded[t.name] if t.name in decoded else self.storage.read(t.name)
                          for t in prepared.operands]
            else:
                values = [self._operand(t, step.device) if t.name else None for t in prepared.operands]
            results = self._npu_node(node, values, prepared.leaving) if step.device == "npu" else \
                self._cpu_node(node, values, prepared.backend)
            for tensor, value in zip(node.outputs, results):
                if tensor.name:
                    self._write(tensor.name, value)
        if observe is not None:
            observe(step.id, {name: self._real(name) for name in step.outputs})

    def run_alone(self, index: int, real: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """NPU step `index` alone, on its activations' real values given in `real` (by tensor
        name), stored as the plan stores them: quantized with the plan's parameters where it
        stores integers, rounded to the stored float dtype otherwise; weights come from the
        weight region. The step's outputs as real values, nothing written to storage; None for
        a step that is not an NPU step or reads an activation `real` lacks (rknn-toolkit2
        accuracy_analysis's "single": the error one step adds, its result's rounding to the
        stored dtype included, apart from everything before it)."""
        step, node = self.plan.steps[index], self.step_nodes()[index]
        if step.device != "npu":
            return None
        self._step = step.id
        operands = []
        for tensor in node_operands(node):
            if not tensor.name or self.storage.placement(tensor.name).region == "weight":
                operands.append(self._operand(tensor, "npu") if tensor.name else None)
            elif tensor.name not in real:
                return None
            else:
                operands.append(self._stored_form(tensor.name, real[tensor.name]))
        results = self._npu_node(node, operands)
        # as stored: an int8 kernel's result is already on its grid, a float one is rounded to
        # the tensor's dtype here, as writing it would (else "single" misses the step's rounding)
        return {tensor.name: self._real_of(tensor.name, value if tensor.name in self.quantization
                                           else self._stored_form(tensor.name, value))
                for tensor, value in zip(node.outputs, results) if tensor.name}

    def _stored_form(self, name: str, real: np.ndarray):
        """An NPU operand as a read of `real` stored in the tensor's planned dtype would give it."""
        quant = self.quantization.get(name)
        if quant is not None:
            return QTensor(quantize(real, quant), quant)
        stored = np.dtype(self.storage.placement(name).dtype)
        if stored.kind != "f":
            return np.asarray(real).astype(stored, copy=False)
        return np.asarray(real, np.float32).astype(stored).astype(np.float32, copy=False)

    def _real_of(self, name: str, value) -> np.ndarray:
        """The real value of `value` as tensor `name` stores it: dequantized when it is integers."""
        quant = self.quantization.get(name)
        return dequantize(value, quant) if quant is not None else value

    def _moves_stored_values(self, node: Node, operands: Sequence[Tensor]) -> bool:
        """Whether the NPU node only moves elements between arena tensors of one float dtype:
        its kernel then runs on the stored values, which gives the float32 path's result bit
        for bit (every stored value is exact in float32, and rounding it back is the identity)
        without converting each operand to float32 and the result back."""
        if node.op not in MOVEMENT_IN_STORED_DTYPE or node.domain not in ("", None) or self.quantization:
            return False
        dtypes = set()
        for tensor in [*operands, *node.outputs]:
            if not tensor.name:
                continue
            placement = self.storage.placement(tensor.name)
            if is_float(placement.dtype):
                if placement.region == "weight" or held_by_runtime(placement):
                    return False
                dtypes.add(placement.dtype)
        return len(dtypes) == 1

    def _cpu_partitions(self, nodes: Sequence[Node]) -> dict[int, CpuPartition]:
        """The runs of consecutive CPU steps onnxruntime executes, as one session each
        (cpu_partition.py), by the index of their first step; made once per prepared plan, after
        the steps (`prepare`), which check each node writes its step's outputs."""
        if self.weight_cache.partitions is None:
            steps = self.plan.steps

            def eligible(index: int) -> bool:
                step, node = steps[index], nodes[index]
                return (step.device == "cpu" and self._cpu_backend(step, node) == ONNXRUNTIME
                        and not any(name in self.quantization for name in (*step.inputs, *step.outputs)))

            self.weight_cache.partitions = {
                start: CpuPartition([steps[i] for i in run], [nodes[i] for i in run], self.cpu.opsets)
                for start, run in cpu_runs(range(len(steps)), eligible).items()}
        return self.weight_cache.partitions

    def _run_partition(self, partition: CpuPartition, observe: Observe | None) -> bool:
        """The partition's steps in one session; False (nothing written) when they must run
        step by step."""
        results = partition.run(lambda tensor: self._operand(tensor, "cpu"), self.storage.placement)
        if results is None:
            return False
        for step in partition.steps:
            self._step = step.id
            for name in step.outputs:
                self._write(name, results[name])
            if observe is not None:
                observe(step.id, {name: self._real(name) for name in step.outputs})
        return True

    def _store(self, name: str, real: np.ndarray) -> None:
        """Write a real value, quantized first when the plan stores the tensor as integers."""
        quant = self.quantization.get(name)
        self._write(name, quantize(real, quant) if quant is not None else real)

    def _write(self, name: str, value) -> None:
        """Store a step's result, noting the step when float16 storage turns finite values into
        infinities: the float32 model has numbers there and the plan's answer silently has
        infinities (or the NaN they make further on). rknn-toolkit2's simulator warns the same way
        ("The range [...] of 'y' is out of the float16!"); the NPU stores infinities too."""
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            dtype = self.storage.placement(name).dtype
            found = half.overflow(value, dtype) if is_float(dtype) else None
            if found is not None:
                step = self.plan.steps[self._step]
                self.overflows.append(overflow_note(step.id, step.kernel, name, dtype, *found))
        self.storage.write(name, value)

    def _real(self, name: str) -> np.ndarray:
        """A tensor's real value: dequantized when it is stored as integers."""
        return self._real_of(name, self.storage.read(name))

    def _operand(self, tensor: Tensor, device: str) -> np.ndarray:
        quant = self.quantization.get(tensor.name)
        if quant is not None:
            if device != "npu":
                return self._real(tensor.name)
            cached = self.weight_cache.quantized.get(tensor.name)
            if cached is not None:
                return cached
            value = QTensor(self.storage.read(tensor.name), quant)
            if self.storage.placement(tensor.name).region == "weight":
                value.values.flags.writeable = False  # shared by every run, as the decoded weights are
                self.weight_cache.quantized[tensor.name] = value
            return value
        if device == "npu":
            placement = self.storage.placement(tensor.name)
            if placement.region == "weight":
                return self._weight(tensor.name)
            return self.storage.read(tensor.name, np.float32 if is_float(placement.dtype) else None)
        value = self.storage.read(tensor.name)
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f":  # also a sequence's list
            return value
        # the CPU computes in the model's dtype, even on a weight stored for an NPU reader
        wanted = dtype_name(tensor.dtype)
        return value.astype(wanted, copy=False) if wanted and wanted != value.dtype.name else value

    def _quantized_intermediates(self, body: Graph, rounding: tuple[frozenset[str], Callable]
                                 ) -> tuple[frozenset[str], Callable]:
        """`rounding` for a fused step of an int8 plan, extended to the intermediates the plan
        quantizes (an attention's probabilities, passes/quantize.py): each rounded to its grid as
        it is made, as a QuantizeLinear/DequantizeLinear pair in the export rounds it."""
        rounded, round_value = rounding
        quantized = frozenset(t.name for member in body.nodes for t in member.outputs if t.name in self.quantization)
        if not quantized:
            return rounding

        def to_grid(name: str, value: np.ndarray) -> np.ndarray:
            quant = self.quantization.get(name) if name in quantized else None
            return round_value(name, value) if quant is None else dequantize(quantize(value, quant), quant)

        return rounded | quantized, to_grid

    def _weight(self, name: str) -> np.ndarray:
        """A weight's real value as the weight region holds it: float32 for float weights."""
        cached = self.weight_cache.decoded.get(name)
        if cached is None:
            placement = self.storage.placement(name)
            stored = np.dtype(placement.dtype)
            if (name not in self.quantization and placement.layout != "NC1HWC2" and not held_by_runtime(placement)
                    and (stored.kind != "f" or stored == np.float32)):
                # a row-major weight already in the dtype steps compute with (a Reshape's int64
                # shape, a float32 weight): the read-only region's own view, no copy
                self.weight_cache.decoded[name] = cached = self.storage.view(name)
                return cached
            cached = np.asarray(self._real(name) if name in self.quantization else
                                self.storage.read(name, np.float32 if stored.kind == "f" else None))
            cached.flags.writeable = False  # shared by every step and run that reads it
            self.weight_cache.decoded[name] = cached
        return cached

    def _npu_node(self, node: Node, values: Sequence[np.ndarray | None],
                  leaving: tuple[frozenset[str], str | None] | None = None) -> list:
        """The node's results; `leaving` is `_leaving_accumulator(node)`, worked out here when not given."""
        body = fused_body(node)
        rounded, dtype = self._leaving_accumulator(node) if leaving is None else leaving
        rounding = (rounded, lambda name, value: self._leaving(value, dtype))
        if self.quantization:  # a float16 step of an int8 plan rounds as a float16 plan's does
            out_quants = [self.quantization.get(t.name) for t in node.outputs]
            if body is not None:
                rounding = self._quantized_intermediates(body, rounding)
            return run_int8(node, values, out_quants, self.opset, is_movement, rounding)
        if body is not None:
            return run_fused(node, values, self._npu_node, self._npu_in_place, *rounding)
        kernel = KERNELS.get(node.op)
        if kernel is None:
            raise EmulationError(f"step {self._step}: no emulator kernel for NPU op {node.op}")
        try:
            return list(kernel(node, values, self.opset))
        except Unsupported as exc:
            self.fallbacks.append(f"step {self._step} {node.op}: {exc}")
            return run_reference(node, values, self.opset)

    def _leaving_accumulator(self, node: Node) -> tuple[frozenset[str], str | None]:
        """A fused NPU node's intermediates rounded as they leave the accumulator
        (`leaving_accumulator`) and the stored dtype they are rounded to; none for another node."""
        body = fused_body(node)
        # a fused step's stored dtype; a member fused within a member writes a body tensor, not
        # a planned one, and its own members are no accumulator stage of the step
        stored = self.plan.tensors.get(node.outputs[0].name) if body is not None and node.outputs else None
        if stored is None:
            return frozenset(), None
        return leaving_accumulator(node.op, body, stored.dtype), stored.dtype

    def _leaving(self, value: np.ndarray, dtype: str) -> np.ndarray:
        """An accumulator result inside a fused step, rounded to `dtype` as it leaves the core;
        an overflow there is noted as one of the step's outputs would be."""
        found = half.overflow(value, dtype)
        if found is not None:
            step = self.plan.steps[self._step]
            self.overflows.append(overflow_note(step.id, step.kernel, "its accumulator result", dtype, *found))
        return rounded_in_its_order(value, dtype)

    def _npu_in_place(self, member: Node, operands: Sequence[np.ndarray | None], spent: Sequence[int]):
        """A fused NPU member's result written into one of its spent operands (registry.IN_PLACE),
        or None when its op has no such kernel or none of them can hold the result."""
        kernel = IN_PLACE.get(member.op)
        return None if kernel is None or fused_body(member) is not None else kernel(member, operands, self.opset,
                                                                                    spent)

    def _cpu_backend(self, step, node: Node) -> str:
        """The step's backend as planned; plans written before the plan carried it get the
        choice a fresh plan would make."""
        if step.cpu_backend in (ONNXRUNTIME, ONNX_REFERENCE):
            return step.cpu_backend
        if step.cpu_backend is not None:
            raise EmulationError(f"step {step.id}: unknown cpu_backend {step.cpu_backend!r}")
        backend = self.cpu.backend_of(node)
        if backend is None:
            domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
            raise EmulationError(f"step {step.id} ({domain}{node.op}): neither onnxruntime nor onnx.reference "
                                 f"can run it, so the emulator cannot run this plan")
        return backend

    def _cpu_node(self, node: Node, values: Sequence[np.ndarray | None], backend: str) -> list:
        if fused_body(node) is not None:
            return run_fused(node, values, lambda member, operands: self._cpu_node(member, operands, backend))
        notes: list[str] = []
        results = self.cpu.run(node, values, backend, notes)
        self.fallbacks += [f"step {self._step} {note}" for note in notes]
        return results
