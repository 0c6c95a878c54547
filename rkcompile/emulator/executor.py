"""Execute a plan step by step on `Storage`: NPU steps through the kernel registry in float32
with results rounded once to the stored dtype, CPU steps through onnx.reference in the model's
dtype, host steps as the layout and dtype conversions they name.

The plan gives the order, the tensors each step reads and writes, and where every tensor
lives; the final graph (from re-planning the model) gives what the plan does not carry: each
step's attributes, fused bodies and weight values. Step i of the plan is node `order[i]`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir import dtype_name, fused_body, node_operands
from rkcompile.plan import Plan
from rkcompile.targets.model import Target

from rkcompile.quantize import dequantize, quantize

from . import kernels  # noqa: F401  (registers the kernels)
from .int8 import QTensor, run_int8
from .reference import run_reference
from .registry import KERNELS, Unsupported
from .storage import EmulationError, Storage

RunNode = Callable[[gs.Node, Sequence["np.ndarray | None"]], list]
#: observe(step, {output name: real value}) after each step, for accuracy analysis
Observe = Callable[[int, dict], None]


@dataclass
class Execution:
    outputs: dict[str, np.ndarray]
    #: "step N op: reason" for each NPU op a kernel handed to onnx.reference
    fallbacks: list[str] = field(default_factory=list)
    #: CPU tensors of unknown shape held outside the regions (see storage.py)
    dynamic_tensors: int = 0


@dataclass
class WeightCache:
    """What every run of one prepared plan computes the same way, because weights are constants:
    the weight region's bytes, and the float32 decodes of the float weights NPU steps read. The
    first run makes them; later runs copy the bytes into their weight region and read the
    decodes. Weights are not arena tensors, so nothing the plan places is bypassed."""
    region: np.ndarray | None = None
    decoded: dict[str, np.ndarray] = field(default_factory=dict)


class Executor:
    def __init__(self, plan: Plan, graph: gs.Graph, order: Sequence[str], target: Target,
                 weight_cache: WeightCache | None = None):
        if len(order) != len(plan.steps):
            raise EmulationError(f"the plan has {len(plan.steps)} steps but the model plans to {len(order)}")
        self.plan = plan
        self.opset = plan.model.opset
        self.storage = Storage(plan, target)
        by_name = {node.name: node for node in graph.nodes}
        self.step_nodes = [by_name[name] for name in order]
        self.constants = {t.name: t for t in graph.tensors().values() if isinstance(t, gs.Constant)}
        self.fallbacks: list[str] = []
        self._step = -1
        self.quantization = plan.quantization  # int8 plans; empty for float16
        self.weight_cache = WeightCache() if weight_cache is None else weight_cache

    def run(self, inputs: Mapping[str, np.ndarray], observe: Observe | None = None) -> Execution:
        self._load_weights()
        for spec in self.plan.model.inputs:
            if spec.name not in inputs:
                raise EmulationError(f"no value for model input {spec.name}")
            value = np.asarray(inputs[spec.name])
            if tuple(value.shape) != tuple(spec.shape):
                raise EmulationError(f"input {spec.name} has shape {list(value.shape)}, the plan expects "
                                     f"{list(spec.shape)}")
            self.storage.write(spec.name, value)
        for step, node in zip(self.plan.steps, self.step_nodes):
            self._step = step.id
            if tuple(t.name for t in node.outputs if t.name) != tuple(step.outputs):
                raise EmulationError(f"step {step.id} writes {list(step.outputs)} but its node {node.name} "
                                     f"writes others")
            if step.device == "host":
                (source,), (converted,) = step.inputs, step.outputs
                self._store(converted, self._real(source))
            else:
                run = self._npu_node if step.device == "npu" else self._cpu_node
                values = [self._operand(t, step.device) if t.name else None for t in node_operands(node)]
                results = run(node, values)
                for tensor, value in zip(node.outputs, results):
                    if tensor.name:
                        self.storage.write(tensor.name, value)
            if observe is not None:
                observe(step.id, {name: self._real(name) for name in step.outputs})
        outputs = {spec.name: self.storage.read(spec.name) for spec in self.plan.model.outputs}
        return Execution(outputs, list(self.fallbacks), len(self.storage.dynamic))

    def _load_weights(self) -> None:
        region = self.storage.regions["weight"]
        if self.weight_cache.region is not None:
            region[...] = self.weight_cache.region
            return
        for name, tensor in self.plan.tensors.items():
            if tensor.region != "weight":
                continue
            if name not in self.constants:
                raise EmulationError(f"weight {name} is not a constant of the model")
            self._store(name, np.asarray(self.constants[name].values))
        self.weight_cache.region = region.copy()

    def _store(self, name: str, real: np.ndarray) -> None:
        """Write a real value, quantized first when the plan stores the tensor as integers."""
        quant = self.quantization.get(name)
        self.storage.write(name, quantize(real, quant) if quant is not None else real)

    def _real(self, name: str) -> np.ndarray:
        """A tensor's real value: dequantized when it is stored as integers."""
        value, quant = self.storage.read(name), self.quantization.get(name)
        return dequantize(value, quant) if quant is not None else value

    def _operand(self, tensor: gs.Tensor, device: str) -> np.ndarray:
        quant = self.quantization.get(tensor.name)
        if quant is not None:
            value = self.storage.read(tensor.name)
            return QTensor(value, quant) if device == "npu" else self._real(tensor.name)
        if device == "npu":
            placement = self.storage.placement(tensor.name)
            if np.dtype(placement.dtype).kind != "f":
                return self.storage.read(tensor.name)
            if placement.region == "weight":
                return self._weight(tensor.name)
            return self.storage.read(tensor.name, np.float32)
        value = self.storage.read(tensor.name)
        if value.dtype.kind != "f":
            return value
        # the CPU computes in the model's dtype, even on a weight stored for an NPU reader
        wanted = dtype_name(tensor.dtype)
        return value.astype(wanted, copy=False) if wanted and wanted != value.dtype.name else value

    def _weight(self, name: str) -> np.ndarray:
        cached = self.weight_cache.decoded.get(name)
        if cached is None:
            cached = self.storage.read(name, np.float32)
            cached.flags.writeable = False  # shared by every step and run that reads it
            self.weight_cache.decoded[name] = cached
        return cached

    def _npu_node(self, node: gs.Node, values: Sequence[np.ndarray | None]) -> list:
        if self.quantization:
            from rkcompile.passes.quantize import is_movement

            out_quants = [self.quantization.get(t.name) for t in node.outputs]
            return run_int8(node, values, out_quants, self.opset, is_movement)
        if fused_body(node) is not None:
            return run_fused(node, values, self._npu_node)
        kernel = KERNELS.get(node.op)
        if kernel is None:
            raise EmulationError(f"step {self._step}: no emulator kernel for NPU op {node.op}")
        try:
            return list(kernel(node, values, self.opset))
        except Unsupported as exc:
            self.fallbacks.append(f"step {self._step} {node.op}: {exc}")
            return run_reference(node, values, self.opset)

    def _cpu_node(self, node: gs.Node, values: Sequence[np.ndarray | None]) -> list:
        if fused_body(node) is not None:
            return run_fused(node, values, self._cpu_node)
        return run_reference(node, values, self.opset)


def run_fused(node: gs.Node, values: Sequence[np.ndarray | None], run_member: RunNode) -> list:
    """A fused node as one kernel: its `body` members run in order on unrounded intermediate
    values, so only the fused node's outputs are rounded, when they are stored.

    The body's graph inputs are the fused node's non-constant inputs in order (a boundary may
    have renamed them since fusion); constants keep their names, and their values come from
    the weight region like every other operand."""
    body: gs.Graph = node.attrs["body"]
    env: dict[str, np.ndarray] = {}
    variables = [(t, v) for t, v in zip(node.inputs, values) if t.name and not isinstance(t, gs.Constant)]
    if len(variables) != len(body.inputs):
        raise EmulationError(f"fused node {node.name}: {len(variables)} runtime inputs, body takes {len(body.inputs)}")
    env.update((inner.name, value) for inner, (_, value) in zip(body.inputs, variables))
    env.update((t.name, v) for t, v in zip(node.inputs, values) if isinstance(t, gs.Constant))
    for member in body.nodes:
        operands = [None if not t.name else env[t.name] if t.name in env else np.asarray(t.values)
                    for t in member.inputs]
        env.update((t.name, v) for t, v in zip(member.outputs, run_member(member, operands)) if t.name)
    return [env[t.name] for t in body.outputs]
