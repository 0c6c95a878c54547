"""Every tensor of the planned graph in float32: the plan's steps in order, NPU nodes through the
emulator's float kernels with nothing rounded to a stored dtype, CPU nodes on the backend the
executor would choose (onnxruntime, else onnx.reference: reference.py), host conversions as the
identity they are on real values.

This is the float32 model int8 calibration observes (rkcompile/quantize.py) and the reference
`rkcompile run --accuracy-analysis` compares each int8 step with: it runs the same graph, with
the same tensor names, as the int8 execution, so a step's two results line up one to one.
Its outputs agree with onnxruntime on the original model to float32 rounding
(tests/test_quantize.py).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.nodes import fused_body, node_operands

from . import kernels  # noqa: F401  (registers the kernels)
from .fused import run_fused
from .reference import ONNX_REFERENCE, CpuRuntime, run_reference
from .registry import KERNELS, Unsupported

Visit = Callable[[str, np.ndarray], None]
#: name, value -> a value to continue with instead, or None to keep it
Adjust = Callable[[str, np.ndarray], "np.ndarray | None"]


class FloatReference:
    def __init__(self, nodes: Sequence[gs.Node], devices: Sequence[str], opset: int, outputs: Sequence[str]):
        self.nodes, self.devices, self.opset = list(nodes), list(devices), opset
        self.cpu = CpuRuntime(opset, {})
        self.outputs = set(outputs)
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
        """The graph outputs; `visit(name, value)` sees every tensor a step writes, in step order;
        `adjust(name, value)` may replace it for the steps after (--auto-float16 rounds one
        tensor at a time to its int8 grid to see what that costs at the outputs)."""
        env: dict[str, np.ndarray] = {name: np.asarray(value) for name, value in inputs.items()}
        for node, device, release in zip(self.nodes, self.devices, self.release):
            values = [None if not t.name else np.asarray(t.values) if isinstance(t, gs.Constant) else env[t.name]
                      for t in node_operands(node)]
            results = [values[0]] if device == "host" else (self._npu if device == "npu" else self._cpu)(node, values)
            for tensor, value in zip(node.outputs, results):
                if tensor.name:
                    env[tensor.name] = np.asarray(value)
                    if adjust is not None:
                        adjusted = adjust(tensor.name, env[tensor.name])
                        if adjusted is not None:
                            env[tensor.name] = np.asarray(adjusted, env[tensor.name].dtype)
                    if visit is not None:
                        visit(tensor.name, env[tensor.name])
            for name in release:
                env.pop(name, None)
        return {name: env[name] for name in self.outputs}

    def _npu(self, node: gs.Node, values: Sequence[np.ndarray | None]) -> list:
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

    def _cpu(self, node: gs.Node, values: Sequence[np.ndarray | None]) -> list:
        if fused_body(node) is not None:
            return run_fused(node, values, self._cpu)
        return self.cpu.run(node, values, self.cpu.backend_of(node) or ONNX_REFERENCE, [])
