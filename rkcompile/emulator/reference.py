"""onnx.reference for one node: what CPU steps run (the CPU computes in the model's dtype),
and what the NPU kernels in `kernels/reference_ops.py` or a kernel's `Unsupported` case fall
back to, in float32."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

from rkcompile.nodes import node_operands, single_node_graph


def run_reference(node: gs.Node, inputs: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray]:
    feeds = {t.name: value for t, value in zip(node_operands(node), inputs) if t.name}
    evaluator = ReferenceEvaluator(single_node_graph(node), opsets={"": opset})
    return [np.asarray(v) for v in evaluator.run(None, feeds)]
