"""A step's ONNX node as plan data (`plan.Operation`) and back.

`describe` turns an onnx-graphsurgeon node into the JSON record a plan keeps; `rebuild` turns the
record back into a node the emulator's kernels take, whose weight inputs are constants holding
the values read from the plan's weight region, so what executes is what the plan says. The
encoding of attribute values is documented on `plan.Operation` and in docs/plan-schema.md.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.util.misc import SynchronizedList

from rkcompile.errors import CompileError
from rkcompile.ir.nodes import dtype_name
from rkcompile.plan.schema import Operation

#: weight(name) -> a constant holding the weight's value; None when `name` is no weight
WeightLookup = Callable[[str], "gs.Constant | None"]


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


def rebuild(operation: Operation, weight: WeightLookup, scope: dict[str, gs.Tensor] | None = None,
            linked: bool = True) -> gs.Node:
    """The node `operation` describes; weights come from `weight`, other inputs are variables of
    the recorded ONNX dtype (shared by name through `scope` within one graph).

    `linked=False` makes the node for a reader that never walks or edits it as a graph (the
    emulator's steps, executed and exported node by node): its input and output lists, and its
    tensors' producer and consumer lists, are plain lists, and no tensor lists the nodes that
    make or read it (`weight` should give unlinked constants too). Linking them was about a
    fifth of rebuilding a plan's step nodes, which every first run of a plan does."""
    scope = {} if scope is None else scope
    return graph_node(
        operation.op, operation.name, operation.domain or None,
        {key: _decode(value, weight, linked) for key, value in operation.attributes.items()},
        [_tensor(name, dtype, weight, scope, linked) for name, dtype in zip(operation.inputs, operation.input_dtypes)],
        [_tensor(name, "", weight, scope, linked) for name in operation.outputs], linked)


# The three constructors below make the same objects as gs.Node, gs.Variable and gs.Constant
# (the same attributes, the tensors' producer and consumer lists linked the same way) without
# onnx-graphsurgeon's attribute setter, which probes each attribute it sets by raising and
# catching an AttributeError: that made rebuilding the steps, on every first run of a plan,
# cost about as much as executing them. tests/test_operations_rebuild.py compares them with
# the library's own constructors, attribute by attribute.

def graph_node(op: str, name: str, domain: str | None, attrs: dict, inputs: list, outputs: list,
               linked: bool = True) -> gs.Node:
    """gs.Node(op=op, name=name, domain=domain, attrs=attrs, inputs=inputs, outputs=outputs);
    unlinked (plain lists, the tensors not told) with `linked=False` (see `rebuild`)."""
    node = gs.Node.__new__(gs.Node)
    node.__dict__.update(op=op, name=name or "", attrs=attrs, domain=domain,
                         inputs=_linked(node, "outputs", inputs, linked),
                         outputs=_linked(node, "inputs", outputs, linked))
    return node


def variable(name: str, dtype=None, linked: bool = True, shape=None, value_type: str = "tensor_type") -> gs.Variable:
    """gs.Variable(name, dtype=dtype, shape=shape, type=value_type); with plain producer and
    consumer lists with `linked=False`."""
    tensor = gs.Variable.__new__(gs.Variable)
    tensor.__dict__.update(name=name, dtype=dtype, shape=shape, type=value_type,
                           inputs=_linked(tensor, "outputs", (), linked), outputs=_linked(tensor, "inputs", (), linked))
    return tensor


def constant(name: str, values, linked: bool = True, data_location: int | None = None) -> gs.Constant:
    """gs.Constant(name, values, data_location) for a numpy array or onnx-graphsurgeon's
    LazyValues; with plain producer and consumer lists with `linked=False`."""
    tensor = gs.Constant.__new__(gs.Constant)
    tensor.__dict__.update(name=name, _values=values, data_location=data_location, _export_dtype=None,
                           inputs=_linked(tensor, "outputs", (), linked), outputs=_linked(tensor, "inputs", (), linked))
    return tensor


def graph(nodes: list, inputs: list, outputs: list, name: str, opset: int = gs.Graph.DEFAULT_OPSET) -> gs.Graph:
    """gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=name, opset=opset). The
    library's constructor takes 26 us (a first run of a plan with 120 fused steps makes as many
    graphs, and planning one per fusion): it sets each attribute through its setter and merges
    the nested graphs' function lists, which for graphs without functions leaves every nested
    graph sharing this graph's (empty) list, as done below. Nodes whose graphs carry local
    functions go to the constructor, which gathers them."""
    nested = list(_nested_graphs(nodes))
    if any(inner._functions for inner in nested):
        return gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=name, opset=opset)
    made = gs.Graph.__new__(gs.Graph)
    made.__dict__.update(nodes=nodes, inputs=list(inputs), outputs=list(outputs), name=name, __name__=name,
                         doc_string="", opset=opset, producer_name="", producer_version="",
                         import_domains=None, ir_version=None, name_idx=0, _functions=[])
    for inner in nested:
        inner._functions = made._functions
    return made


def _nested_graphs(nodes: list):
    """Every graph the nodes hold as a graph attribute, at any depth (gs.Node.subgraphs: a list
    of graphs is not one)."""
    for node in nodes:
        for value in node.attrs.values():
            if isinstance(value, gs.Graph):
                yield value
                yield from _nested_graphs(value.nodes)


def _linked(owner, field_name: str, items, linked: bool = True) -> SynchronizedList | list:
    """SynchronizedList(owner, field_name, items): `items`, each of which lists `owner` in its
    `field_name` list; with `linked=False` a plain list of `items`, which are left alone."""
    if not linked:
        return list(items)
    made = SynchronizedList.__new__(SynchronizedList)
    made.parent_obj, made.field_name = owner, field_name
    list.extend(made, items)
    for item in items:
        list.append(getattr(item, field_name), owner)
    return made


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


def _decode(value: Any, weight: WeightLookup, linked: bool) -> Any:
    if isinstance(value, dict) and "tensor" in value:
        return constant("", decode_array(value["tensor"]), linked)
    if isinstance(value, dict) and "graph" in value:
        return _decode_graph(value["graph"], weight, linked)
    return value


def _decode_graph(record: dict[str, Any], weight: WeightLookup, linked: bool) -> gs.Graph:
    scope: dict[str, gs.Tensor] = {name: constant(name, decode_array(array), linked)
                                   for name, array in record["constants"].items()}
    inputs = [_tensor(name, dtype, weight, scope, linked) for name, dtype, *_ in record["inputs"]]
    for tensor, (_, _, *shape) in zip(inputs, record["inputs"]):
        if shape and shape[0] is not None and isinstance(tensor, gs.Variable):
            tensor.shape = list(shape[0])  # plans written before shapes were recorded have none
    nodes = [rebuild(Operation(**{**member, "inputs": tuple(member["inputs"]), "outputs": tuple(member["outputs"]),
                                  "input_dtypes": tuple(member["input_dtypes"])}), weight, scope, linked)
             for member in record["nodes"]]
    return graph(nodes, inputs, [_tensor(name, "", weight, scope, linked) for name in record["outputs"]],
                 record["name"])


def _tensor(name: str, dtype: str, weight: WeightLookup, scope: dict[str, gs.Tensor], linked: bool) -> gs.Tensor:
    """The tensor called `name` in one node or graph: a weight, a constant of the graph, or a
    variable (one object per name within a graph, so its members connect)."""
    if not name:
        return variable("", linked=linked)
    if name in scope:
        return scope[name]
    found = weight(name)
    if found is None:
        found = variable(name, dtype or None, linked)
    scope[name] = found
    return found
