"""A step's ONNX node as plan data (`plan.Operation`) and back.

The compiler writes the record (rkcompile/ir/describe.py `describe`); `rebuild` turns it back
into the plain node (rkcompile/plan/plain_nodes.py) the emulator's kernels take, whose weight inputs
are constants holding the values read from the plan's weight region, so what executes is what
the plan says. The encoding of attribute values is documented on `plan.Operation` and in
docs/plan-schema.md.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

import numpy as np

from rkcompile.plan.plain_nodes import Constant, Graph, Node, Tensor, Variable
from rkcompile.plan.schema import Operation

#: weight(name) -> a constant holding the weight's value; None when `name` is no weight
WeightLookup = Callable[[str], "Constant | None"]


def rebuild(operation: Operation, weight: WeightLookup, scope: dict[str, Tensor] | None = None) -> Node:
    """The node `operation` describes; weights come from `weight`, other inputs are variables of
    the recorded ONNX dtype (shared by name through `scope` within one graph)."""
    scope = {} if scope is None else scope
    return Node(operation.op, operation.name or "",
                {key: _decode(value, weight) for key, value in operation.attributes.items()},
                [_tensor(name, dtype, weight, scope) for name, dtype in zip(operation.inputs, operation.input_dtypes)],
                [_tensor(name, "", weight, scope) for name in operation.outputs], operation.domain or "")


def encode_array(array: np.ndarray) -> dict[str, Any]:
    array = np.asarray(array)
    if array.dtype == object:  # ONNX strings: their bytes would be pointers
        return {"dtype": "object", "shape": list(array.shape), "strings": [str(v) for v in array.reshape(-1)]}
    array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes a scalar 1-D
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": array.dtype.name, "shape": list(array.shape),
            "data": base64.b64encode(little.tobytes()).decode("ascii")}


def decode_array(record: dict[str, Any]) -> np.ndarray:
    if "strings" in record:
        return np.array(record["strings"], dtype=object).reshape(record["shape"])
    dtype = np.dtype(record["dtype"]).newbyteorder("<")
    raw = np.frombuffer(base64.b64decode(record["data"]), dtype)
    return raw.astype(dtype.newbyteorder("="), copy=True).reshape(record["shape"])


def _decode(value: Any, weight: WeightLookup) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        return Constant("", decode_array(value["tensor"]))
    if isinstance(value, dict) and "graph" in value:
        return _decode_graph(value["graph"], weight)
    return value


def _decode_graph(record: dict[str, Any], weight: WeightLookup) -> Graph:
    scope: dict[str, Tensor] = {name: Constant(name, decode_array(array)) for name, array in record["constants"].items()}
    inputs = [_tensor(name, dtype, weight, scope) for name, dtype, *_ in record["inputs"]]
    for tensor, (_, _, *shape) in zip(inputs, record["inputs"]):
        if shape and shape[0] is not None and isinstance(tensor, Variable):
            tensor.shape = list(shape[0])  # plans written before shapes were recorded have none
    nodes = [rebuild(Operation(**{**member, "inputs": tuple(member["inputs"]), "outputs": tuple(member["outputs"]),
                                  "input_dtypes": tuple(member["input_dtypes"])}), weight, scope)
             for member in record["nodes"]]
    return Graph(nodes, inputs, [_tensor(name, "", weight, scope) for name in record["outputs"]], record["name"])


def _tensor(name: str, dtype: str, weight: WeightLookup, scope: dict[str, Tensor]) -> Tensor:
    """The tensor called `name` in one node or graph: a weight, a constant of the graph, or a
    variable (one object per name within a graph, so its members connect)."""
    if not name:
        return Variable("")
    if name in scope:
        return scope[name]
    found = weight(name)
    if found is None:
        found = Variable(name, dtype or None)
    scope[name] = found
    return found
