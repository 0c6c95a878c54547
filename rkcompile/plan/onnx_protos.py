"""Plain nodes (rkcompile/plan/plain_nodes.py) as ONNX protos: the one converter behind every ONNX
model the runtime and the plan layer build (one-node models for onnxruntime and onnx.reference,
the CPU partitions' sessions and artifact models, the partitioned-graph view).

It writes what onnx-graphsurgeon's exporter writes for the same node: the attributes in their
order, a tensor attribute as a TensorProto named after its constant, a graph attribute with its
constants as initializers and its typed tensors as value infos (an outer-scope tensor its nodes
read included), so the compiler's questions to onnxruntime about its own nodes
(rkcompile/ir/nodes.py `node_proto`) get the answers they always got.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.plan.plain_nodes import Constant, Graph, Node, Variable, node_inputs


def node_proto(node: Node) -> onnx.NodeProto:
    proto = helper.make_node(node.op, [t.name for t in node.inputs], [t.name for t in node.outputs],
                             name=node.name, domain=node.domain or None)
    proto.attribute.extend(_attribute(key, value) for key, value in node.attrs.items())
    return proto


def _attribute(key: str, value) -> onnx.AttributeProto:
    if isinstance(value, Constant):
        value = tensor_proto(value)
    elif isinstance(value, Graph):
        value = graph_proto(value)
    elif isinstance(value, type):  # a numpy scalar type (Cast's `to` as a model's importer gives it)
        try:
            value = tensor_type(value)
        except TypeError:
            pass
    return helper.make_attribute(key, value)


def tensor_type(dtype) -> int:
    """The ONNX element type of a dtype name, numpy dtype or ONNX enum (kept as it is)."""
    if isinstance(dtype, int):
        return dtype
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def tensor_proto(constant: Constant) -> onnx.TensorProto:
    """The constant's values, raw bytes for numbers (strings as ONNX string data)."""
    values = np.asarray(constant.values)
    return numpy_helper.from_array(values.astype(object) if values.dtype.kind in "SU" else values, constant.name)


def value_info(tensor: Variable | Constant) -> onnx.ValueInfoProto:
    """The tensor typed by its dtype and shape where known, else untyped."""
    if tensor.dtype is None:
        return helper.make_empty_tensor_value_info(tensor.name)
    return helper.make_tensor_value_info(tensor.name, tensor_type(tensor.dtype), tensor.shape)


def graph_proto(graph: Graph) -> onnx.GraphProto:
    """A graph attribute: the tensors it uses by name in the order they appear (inputs, each
    node's inputs and outputs, outputs; a name's last tensor kept), its constants as
    initializers, its variables of known dtype or shape but its inputs and outputs as value
    infos."""
    tensors: dict[str, Variable | Constant] = {}
    for tensor in [*graph.inputs, *(t for node in graph.nodes for t in (*node.inputs, *node.outputs)),
                   *graph.outputs]:
        if tensor.name:
            tensors[tensor.name] = tensor
    initializers = [tensor_proto(t) for t in tensors.values() if isinstance(t, Constant)]
    for tensor in [*graph.inputs, *graph.outputs]:
        tensors.pop(tensor.name, None)
    described = [value_info(t) for t in tensors.values()
                 if isinstance(t, Variable) and (t.dtype is not None or t.shape is not None)]
    return helper.make_graph([node_proto(node) for node in graph.nodes], graph.name,
                             [value_info(t) for t in graph.inputs], [value_info(t) for t in graph.outputs],
                             initializers, value_info=described)


def single_node_graph(node: Node) -> onnx.GraphProto:
    """The node alone in an untyped graph: onnx.reference honours a given opset only for
    graphs (a bare NodeProto runs at the newest opset), and old models need their own. Its
    outer-scope reads are graph inputs too, which its subgraphs then see."""
    untyped = onnx.TypeProto()
    return helper.make_graph([node_proto(node)], node.name,
                             [helper.make_value_info(t.name, untyped) for t in node_inputs(node)],
                             [helper.make_value_info(t.name, untyped) for t in node.outputs if t.name])
