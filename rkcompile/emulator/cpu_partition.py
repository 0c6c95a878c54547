"""A run of consecutive CPU steps executed as one onnxruntime session instead of one session
per step.

A detector's post-processing is hundreds of small CPU steps (tv_ssdlite320's is 1,586 in a
row); one session per node meant hundreds of sessions made on a plan's first run, and a
Python round trip per step on every run. One model holding every member of the run, with
graph optimizations off as the per-node sessions have them, runs the same kernels on the same
values: what the run reads from before it is fed as the per-node path feeds it (`operand`,
the model's dtype), and every tensor a step writes comes back as a graph output and is
written to its planned place in step order, so the regions hold what the per-node path leaves
there (and `observe` sees each step's outputs as it did).

Equal to the per-node path only while passing a tensor from one member to the next inside the
session is what storing and reloading it does: each tensor the run both writes and reads must
come back in the dtype it is stored in and read in, row-major. A run where that fails, where
onnxruntime refuses the model or fails on the values, or that reads a sequence is executed
step by step as before; `tests/test_emulator_cpu_partition.py` checks both paths agree.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from rkcompile.onnx_backends import NODE_MODEL_IR_VERSION, make_session
from rkcompile.emulator.reference import runtime_value, session_for_feeds
from rkcompile.emulator.storage import held_by_runtime
from rkcompile.numerics.dtypes import dtype_name
from rkcompile.plan.plain_nodes import Node, Tensor, expanded_members, node_inputs, subgraphs
from rkcompile.plan.onnx_protos import node_proto

#: the fewest steps worth a session of their own: a single step keeps its per-node session
SMALLEST_RUN = 2
#: operand(tensor) -> the value the per-node path feeds the step reading `tensor`
Operand = Callable[[Tensor], "np.ndarray | list | None"]


class CpuPartition:
    """The steps `steps` (consecutive CPU steps, onnxruntime their backend) with their nodes."""

    def __init__(self, steps: Sequence, nodes: Sequence[Node], opsets: Mapping[str, int]):
        self.steps, self.nodes, self.opsets = list(steps), list(nodes), dict(opsets)
        self.members = [member for node in nodes for member in expanded_members(node)]
        produced: set[str] = set()
        #: what the run reads from before it, each name once, as its first reader names it
        self.inputs: list[Tensor] = []
        #: the tensors the run both writes and reads, with the dtypes their readers record
        self.passed: dict[str, set[str]] = {}
        read: set[str] = set()
        for node in self.nodes:
            for tensor in node_inputs(node):
                if tensor.name in produced:
                    self.passed.setdefault(tensor.name, set()).add(dtype_name(tensor.dtype) or "")
                elif tensor.name not in read:
                    read.add(tensor.name)
                    self.inputs.append(tensor)
            produced.update(t.name for t in node.outputs if t.name)
        self.outputs = [name for step in self.steps for name in step.outputs if name]
        self.has_subgraphs = any(subgraphs(member) for member in self.members)
        #: input dtypes and shapes -> the session, or None where onnxruntime refused the model
        self.sessions: dict[tuple, object] = {}

    def run(self, operand: Operand, placement) -> dict[str, np.ndarray] | None:
        """Every tensor the run writes, by name; None when the run must go step by step
        (`placement(name)` is the tensor's plan placement)."""
        feeds = {tensor.name: operand(tensor) for tensor in self.inputs}
        if not all(isinstance(value, np.ndarray) for value in feeds.values()):
            return None  # a sequence or an omitted value: the per-node path knows how to feed it
        session = session_for_feeds(self.sessions, feeds, self._session)
        if session is None:
            return None
        try:
            values = session.run(self.outputs, feeds)
        except Exception:  # noqa: BLE001  (onnxruntime's own error classes: the per-node path reports them)
            return None
        results = {name: runtime_value(value) for name, value in zip(self.outputs, values)}
        return results if all(self._passes_through(name, results[name], placement(name))
                              for name in self.passed) else None

    def _passes_through(self, name: str, value, placed) -> bool:
        """Whether storing `value` and reading it back for the run's readers (`operand`) gives
        it back unchanged: stored row-major in its own dtype (or held as it is, by the runtime),
        and, a float, read in that dtype."""
        if not isinstance(value, np.ndarray):
            return False
        if not held_by_runtime(placed) and (placed.layout == "NC1HWC2" or np.dtype(placed.dtype) != value.dtype):
            return False
        return value.dtype.kind != "f" or all(wanted in ("", value.dtype.name) for wanted in self.passed[name])

    def _session(self, feeds: Mapping[str, np.ndarray]):
        inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
                                                     value.shape) for name, value in feeds.items()]
        outputs = [onnx.helper.make_value_info(name, onnx.TypeProto()) for name in self.outputs]
        try:
            graph = onnx.helper.make_graph([node_proto(member) for member in self.members], "cpu_partition",
                                           inputs, outputs)
            imports = [onnx.helper.make_opsetid(domain, version) for domain, version in self.opsets.items()]
            model = onnx.helper.make_model(graph, opset_imports=imports, ir_version=NODE_MODEL_IR_VERSION)
            if self.has_subgraphs:  # onnxruntime runs a Loop or Scan body only with its outputs typed
                model = onnx.shape_inference.infer_shapes(model)
            return make_session(model)
        except Exception:  # noqa: BLE001  (onnx's and onnxruntime's own classes for "cannot")
            return None


def cpu_runs(steps: Sequence, eligible: Callable[[object], bool]) -> dict[int, list]:
    """The maximal runs of consecutive eligible steps of at least SMALLEST_RUN steps, by the
    index of their first step."""
    runs: dict[int, list] = {}
    start = None
    for index, step in enumerate(list(steps) + [None]):
        if step is not None and eligible(step):
            start = index if start is None else start
            continue
        if start is not None and index - start >= SMALLEST_RUN:
            runs[start] = list(range(start, index))
        start = None
    return runs
