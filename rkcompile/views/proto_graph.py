"""Whole-graph facts and clean-ups on ONNX protos that the export's writers share: every node
with its subgraphs' (`all_nodes`, `nodes_within`), each tensor's static shape by onnx's inference
(`static_shapes`), each tensor's readers (`readers_of`), the graph's output names
(`output_names`), the model's ai.onnx opset (`ai_onnx_opset`), a node's attributes read and set
(`node_attributes`, `set_attribute`), a graph's nodes rewritten in place (`nodes_rewritten`), and
the nodes and initializers nothing reads any more, dropped."""
from __future__ import annotations

from typing import Collection, Mapping, Sequence

import onnx
from onnx import helper

from rkcompile.views.partitioned_onnx import proto_subgraphs


def all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of `graph` and of its subgraphs at any depth."""
    return nodes_within(graph.node)


def nodes_within(nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` and the nodes of their subgraphs at any depth."""
    found, pending = [], [nodes]
    while pending:
        for node in pending.pop():
            found.append(node)
            pending.extend(graph.node for graph in proto_subgraphs(node))
    return found


def readers_of(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """The nodes reading each tensor name of `graph` (its top level)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def output_names(graph: onnx.GraphProto) -> set[str]:
    """The names of `graph`'s outputs."""
    return {output.name for output in graph.output}


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    """The version of the ai.onnx opset `model` imports."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)


def node_attributes(node: onnx.NodeProto) -> dict:
    """`node`'s attributes by name, as Python values."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    """Set attribute `name` of `node` to `value`, replacing the one it has."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def nodes_rewritten(graph: onnx.GraphProto, originals: Sequence[onnx.NodeProto],
                    written: Mapping[int, Sequence[onnx.NodeProto]], removed: Collection[int] = ()) -> int:
    """Make `graph`'s nodes `originals` (its nodes, held by the caller while `written` and
    `removed` key them by `id()`: protobuf hands out new wrappers otherwise) in order, each
    replaced by the nodes `written` gives for it, those in `removed` left out. Returns how many
    nodes were replaced, the count a shaping reports."""
    nodes = [new for node in originals if id(node) not in removed for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def drop_unread_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes of `graph` whose results nothing reads (a shaping bypassed them), last
    first, so that a chain of them goes."""
    needed = {output.name for output in graph.output}
    subgraph_reads = {name for node in graph.node for sub in proto_subgraphs(node) for inner in all_nodes(sub)
                      for name in inner.input}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed or name in subgraph_reads for name in node.output if name):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))


def drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove the initializers no node reads, in `graph` or in a subgraph at any depth (which may
    name one without listing it): those a shaping left behind."""
    read = {name for node in all_nodes(graph) for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every tensor's shape onnx's shape inference finds static, by name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes
