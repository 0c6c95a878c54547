"""Every tensor of the planned graph in float32: the plan's steps in order, NPU nodes through the
emulator's float kernels with nothing rounded to a stored dtype, CPU nodes on the backend the
executor would choose (onnxruntime, else onnx.reference: reference.py), host conversions as the
identity they are on real values.

This is the float32 model int8 calibration observes (rkcompile/quantization/params.py) and the reference
`rkcompile run --accuracy-analysis` compares each int8 step with: it runs the same graph, with
the same tensor names, as the int8 execution, so a step's two results line up one to one.
Its outputs agree with onnxruntime on the original model to float32 rounding
(tests/test_quantize.py).

The whole graph runs as one onnxruntime session when onnxruntime can run it (fused kernels
expanded into their members, host conversions as Identity, every observed tensor a graph
output): one call per input instead of a numpy kernel per step, 4-13x faster on the dev zoo's
CNNs. Node by node (numpy kernels for NPU steps, each CPU step's backend) is the fallback: for a
graph onnxruntime refuses (an op or a type it has no kernel for, a custom domain) or fails on at
run time, and for a node it computes against the spec (onnx_backends.ONNXRUNTIME_DEVIATIONS).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Callable, Collection, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from rkcompile.plan.plain_nodes import Constant, Node, expanded_members, fused_body, node_operands
from rkcompile.plan.onnx_protos import node_proto, tensor_proto

from rkcompile.emulator import kernels  # noqa: F401  (registers the kernels)
from rkcompile.emulator.fused import run_fused
from rkcompile.onnx_backends import NODE_MODEL_IR_VERSION, ONNX_REFERENCE, make_session, onnxruntime_deviates
from rkcompile.emulator.reference import CpuRuntime, feeds_signature, run_reference, session_for_feeds
from rkcompile.emulator.registry import KERNELS, Unsupported

Visit = Callable[[str, np.ndarray], None]
#: name, value -> a value to continue with instead, or None to keep it
Adjust = Callable[[str, np.ndarray], "np.ndarray | None"]
log = logging.getLogger("rkcompile")


class FloatReference:
    """`nodes`: the steps' plain nodes (a plan's `reference_nodes`; the compiler converts its
    own with rkcompile.ir.nodes.plain_nodes). `observed`: the tensors a `visit` wants to see
    (default: every tensor a step writes); the onnxruntime session returns only those."""

    def __init__(self, nodes: Sequence[Node], devices: Sequence[str], opset: int, outputs: Sequence[str],
                 observed: Collection[str] | None = None):
        self.nodes, self.devices, self.opset = list(nodes), list(devices), opset
        self.cpu = CpuRuntime(opset, {})
        self.outputs = set(outputs)
        self.observed = None if observed is None else frozenset(observed)
        #: input dtypes and shapes -> the whole-graph session, or None where onnxruntime cannot run the graph
        self.sessions: dict[tuple, object] = {}
        #: input dtypes and shapes -> the whole-graph model's `computation` key (None: no whole-graph model)
        self.computations: dict[tuple, bytes | None] = {}
        last_use: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            for tensor in node_operands(node):
                last_use[tensor.name] = index
        # what can be dropped after each step, so a big model's activations are not all held at once
        self.release: list[list[str]] = [[] for _ in self.nodes]
        for name, index in last_use.items():
            if name not in self.outputs:
                self.release[index].append(name)

    def run(self, inputs: Mapping[str, np.ndarray], visit: Visit | None = None,
            adjust: Adjust | None = None) -> dict[str, np.ndarray]:
        """The graph outputs; `visit(name, value)` sees every tensor a step writes (of those
        `observed`), in step order; `adjust(name, value)` may replace it for the steps after
        (--auto-float16 rounds one tensor at a time to its int8 grid to see what that costs at
        the outputs), which only the node-by-node run can do."""
        inputs = {name: np.asarray(value) for name, value in inputs.items()}
        found = self._run_whole_graph(inputs) if adjust is None else None
        if found is None:
            return self._run_node_by_node(inputs, visit, adjust)
        if visit is not None:
            for node in self.nodes:
                for tensor in node.outputs:
                    if tensor.name in found and self._observes(tensor.name):
                        visit(tensor.name, found[tensor.name])
        return {name: found[name] for name in self.outputs}

    def _observes(self, name: str) -> bool:
        return self.observed is None or name in self.observed

    def _run_whole_graph(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Every observed tensor and graph output from one onnxruntime session, or None when
        onnxruntime cannot run this graph on these inputs."""
        session = session_for_feeds(self.sessions, inputs, self._whole_graph_session)
        if session is None:
            return None
        try:
            names = [output.name for output in session.get_outputs()]
            return {**inputs, **dict(zip(names, session.run(names, dict(inputs))))}
        except Exception as exc:  # noqa: BLE001  (onnxruntime's own error classes)
            log.debug("float reference: onnxruntime failed on the whole graph (%s); running it node by node",
                      str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.sessions[feeds_signature(inputs)] = None  # not tried again
            return None

    def same_outputs(self, other: "FloatReference", inputs: Mapping[str, np.ndarray]) -> bool:
        """Whether `other`'s run on `inputs` gave (or gives) this one's outputs bit for bit: both
        run one onnxruntime session (`other`'s ran on feeds like these without failing), the two
        models compute alike (`computation`: the same nodes on the same constant values, in
        the same order, whatever the nodes and constants are named and whatever else each
        returns), and the outputs are the same tensors. onnxruntime runs here with no graph
        optimization on one thread (onnx_backends.make_session), so the same model computes
        each output in the same kernels and order."""
        signature = feeds_signature(inputs)
        if self.outputs != other.outputs or other.sessions.get(signature) is None:
            return False
        mine = self.computation(inputs)
        return mine is not None and mine == other.computation(inputs)

    def computation(self, inputs: Mapping[str, np.ndarray]) -> bytes | None:
        """A digest of the whole-graph model for feeds like `inputs` as onnxruntime computes it:
        its inputs and nodes, node names left out and each constant named by its value; None
        where onnxruntime would not run the whole graph. Made once per feeds' signature."""
        signature = feeds_signature(inputs)
        if signature not in self.computations:
            model = self._whole_graph_model(inputs)
            self.computations[signature] = None if model is None else _computation(model)
        return self.computations[signature]

    def _whole_graph_session(self, inputs: Mapping[str, np.ndarray]):
        model = self._whole_graph_model(inputs)
        if model is None:
            return None
        try:
            return make_session(model)
        except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own classes for every "cannot")
            log.debug("float reference: onnxruntime cannot run the whole graph (%s); running it node by node",
                      str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None

    def _whole_graph_model(self, inputs: Mapping[str, np.ndarray]) -> onnx.ModelProto | None:
        """The graph as one onnxruntime model returning every observed tensor and graph output,
        or None when a member is one onnxruntime computes against the spec."""
        members = [member for node, device in zip(self.nodes, self.devices) if device != "host"
                   for member in expanded_members(node)]
        if any(onnxruntime_deviates(member) for member in members):
            return None
        protos = []
        for node, device in zip(self.nodes, self.devices):
            if device == "host":  # a layout or dtype conversion: the identity on real values
                protos.append(helper.make_node("Identity", [node.inputs[0].name], [node.outputs[0].name], node.name))
            else:
                protos += [node_proto(member) for member in expanded_members(node)]
        wanted = {t.name for node in self.nodes for t in node.outputs if t.name}
        if self.observed is not None:
            wanted &= set(self.observed)
        initializers = {}
        for member in members:
            for tensor in node_operands(member):
                if isinstance(tensor, Constant) and tensor.name not in initializers:
                    initializers[tensor.name] = tensor_proto(tensor)
        untyped = onnx.TypeProto()
        graph = helper.make_graph(
            protos, "float_reference",
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
             for name, value in inputs.items()],
            [helper.make_value_info(name, untyped) for name in sorted(wanted | self.outputs) if name not in inputs],
            list(initializers.values()))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=NODE_MODEL_IR_VERSION)

    def _run_node_by_node(self, inputs: Mapping[str, np.ndarray], visit: Visit | None,
                          adjust: Adjust | None) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = dict(inputs)
        for node, device, release in zip(self.nodes, self.devices, self.release):
            values = [None if not t.name else np.asarray(t.values) if isinstance(t, Constant) else env[t.name]
                      for t in node_operands(node)]
            results = [values[0]] if device == "host" else (self._npu if device == "npu" else self._cpu)(node, values)
            for tensor, value in zip(node.outputs, results):
                if tensor.name:
                    env[tensor.name] = np.asarray(value)
                    if adjust is not None:
                        adjusted = adjust(tensor.name, env[tensor.name])
                        if adjusted is not None:
                            env[tensor.name] = np.asarray(adjusted, env[tensor.name].dtype)
                    if visit is not None and self._observes(tensor.name):
                        visit(tensor.name, env[tensor.name])
            for name in release:
                env.pop(name, None)
        return {name: env[name] for name in self.outputs}

    def _npu(self, node: Node, values: Sequence[np.ndarray | None]) -> list:
        if fused_body(node) is not None:
            return run_fused(node, values, self._npu)
        operands = [v.astype(np.float32, copy=False) if v is not None and v.dtype.kind == "f" else v for v in values]
        kernel = KERNELS.get(node.op)
        if kernel is not None:
            try:
                return list(kernel(node, operands, self.opset))
            except Unsupported:
                pass  # as the executor does: onnx.reference in float32
        return run_reference(node, operands, self.opset)

    def _cpu(self, node: Node, values: Sequence[np.ndarray | None]) -> list:
        if fused_body(node) is not None:
            return run_fused(node, values, self._cpu)
        return self.cpu.run(node, values, self.cpu.backend_of(node) or ONNX_REFERENCE, [])


def _computation(model: onnx.ModelProto) -> bytes:
    """`FloatReference.computation` of a whole-graph model: a digest of its opsets, inputs and
    nodes with their names cleared and each initializer a node reads replaced by its value's
    digest; an initializer only a subgraph reads (by name, from its own nodes) keeps its name
    beside its value's digest."""
    constants = {}
    for tensor in model.graph.initializer:
        anonymous = onnx.TensorProto()
        anonymous.CopyFrom(tensor)
        anonymous.name = ""
        constants[tensor.name] = hashlib.sha256(anonymous.SerializeToString(deterministic=True)).hexdigest()
    digest = hashlib.sha256()
    for part in (*model.opset_import, *model.graph.input):
        digest.update(part.SerializeToString(deterministic=True))
    for node in model.graph.node:
        anonymous = onnx.NodeProto()
        anonymous.CopyFrom(node)
        anonymous.name = ""
        anonymous.input[:] = [f"constant {constants[name]}" if name in constants else name for name in node.input]
        digest.update(anonymous.SerializeToString(deterministic=True))
    read = {name for node in model.graph.node for name in node.input}
    for name, value in constants.items():
        if name not in read:
            digest.update(f"{name} {value}".encode())
    return digest.digest()
