"""A compiler node as plan data: `describe` writes the record (`plan.Operation`) a plan keeps
for a step, which rkcompile/plan/operations.py `rebuild` turns back into a node. The encoding of
attribute values is documented on `plan.Operation` and in docs/plan-schema.md."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.errors import CompileError
from rkcompile.numerics.dtypes import dtype_name
from rkcompile.plan.operations import encode_array
from rkcompile.plan.schema import Operation


def describe(node: gs.Node, weights: frozenset[str] | set[str]) -> Operation:
    """The plan record of `node`; `weights` are the tensors the plan keeps in its weight region
    (a graph attribute reads those by name instead of holding a copy)."""
    return Operation(
        op=node.op, name=node.name, domain=node.domain or "",
        inputs=tuple(t.name for t in node.inputs),
        input_dtypes=tuple(dtype_name(t.dtype) or "" if t.name else "" for t in node.inputs),
        outputs=tuple(t.name for t in node.outputs),
        attributes={key: _encode(value, weights, f"{node.name}.{key}") for key, value in node.attrs.items()},
    )


def _encode(value: Any, weights, where: str) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)) or value is None:
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, tuple)):
        return [_encode(item, weights, where) for item in value]
    if isinstance(value, gs.Constant):
        return {"tensor": encode_array(np.asarray(value.values))}
    if isinstance(value, np.ndarray):
        return {"tensor": encode_array(value)}
    if isinstance(value, gs.Graph):
        return {"graph": _encode_graph(value, weights)}
    raise CompileError(f"attribute {where}: a {type(value).__name__} value cannot be written to a plan")


def _encode_graph(graph: gs.Graph, weights) -> dict[str, Any]:
    constants = {name: encode_array(np.asarray(t.values)) for name, t in graph.tensors().items()
                 if isinstance(t, gs.Constant) and name not in weights}
    # an input's shape too: onnxruntime runs a Loop or Scan body only when its inputs are shaped
    return {"name": graph.name or "", "inputs": [[t.name, dtype_name(t.dtype) or "",
                                                  None if t.shape is None else list(t.shape)] for t in graph.inputs],
            "outputs": [t.name for t in graph.outputs], "constants": constants,
            "nodes": [_operation_dict(describe(node, weights)) for node in graph.nodes]}


def _operation_dict(operation: Operation) -> dict[str, Any]:
    return {"op": operation.op, "name": operation.name, "domain": operation.domain,
            "inputs": list(operation.inputs), "input_dtypes": list(operation.input_dtypes),
            "outputs": list(operation.outputs), "attributes": operation.attributes}
