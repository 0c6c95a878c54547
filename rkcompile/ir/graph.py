"""Helpers over the mutable IR (onnx-graphsurgeon) and its analysis view (`rkcompile.ir.dag`).

Every pass mutates a `gs.Graph`; whole-graph questions (cycles, convexity, reachability) use a
`Dag` built by `dataflow_graph`. The topological order, asked after every pass, is
computed on plain lists instead.
"""
from __future__ import annotations

import heapq
from typing import Container

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

# What one node or tensor says about itself lives in rkcompile.ir.nodes (and, where it reads only
# what any node has, in rkcompile.plan.plain_nodes, which the targets' constraints use too); passes keep
# importing it from here.
from rkcompile.ir.dag import Dag, find_cycle
from rkcompile.ir.nodes import (FLOAT_DTYPES, FUSED_DOMAIN, constant_value, dtype_name, element_count,
    fused_body, is_onnx_domain, itemsize, node_inputs, node_proto, outer_scope_reads,
    present_inputs, single_node_graph, static_shape, subgraphs)


def readers(graph: gs.Graph) -> dict[str, list[gs.Node]]:
    """Tensor name -> the nodes of `graph` that read it (`node_inputs`), in node order.

    Unlike a gs tensor's `outputs`, this lists only nodes of `graph` itself: an If reading a
    tensor from inside a branch is its reader, not the branch's node."""
    found: dict[str, list[gs.Node]] = {}
    for node in graph.nodes:
        for tensor in node_inputs(node):
            found.setdefault(tensor.name, []).append(node)
    return found


def replace_reads(node: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    """`node` reads `new` wherever it read `old`: in its listed inputs and, for an outer-scope
    read, inside its subgraphs at any depth (a subgraph tensor of the same name is another
    object, so shadowed names are left alone)."""
    for position, tensor in enumerate(node.inputs):
        if tensor is old:
            node.inputs[position] = new
    for graph in subgraphs(node):
        for inner in graph.nodes:
            replace_reads(inner, old, new)


def producers(graph: gs.Graph) -> dict[str, gs.Node]:
    return {t.name: node for node in graph.nodes for t in node.outputs}


def dataflow_graph(graph: gs.Graph) -> Dag:
    """Nodes are gs node names, edges follow tensors (`node_inputs`) from producer to consumer."""
    dag = Dag()
    dag.add_nodes_from(node.name for node in graph.nodes)
    made_by = producers(graph)
    dag.add_edges_from((made_by[t.name].name, node.name) for node in graph.nodes
                       for t in node_inputs(node) if t.name in made_by)
    return dag


def topological_nodes(graph: gs.Graph) -> list[gs.Node]:
    """A deterministic topological order that keeps the model's own order where it can.

    Kahn's algorithm, always releasing the ready node that came first in the file, so
    plans are stable and read in the order users see in Netron. It runs after every pass, so it
    works on plain lists indexed by file position rather than on a `Dag`.
    """
    nodes = list(graph.nodes)
    made_by = {t.name: index for index, node in enumerate(nodes) for t in node.outputs if t.name}
    successors: list[list[int]] = [[] for _ in nodes]
    indegree = [0] * len(nodes)
    for index, node in enumerate(nodes):
        for source in {made_by[t.name] for t in node_inputs(node) if t.name in made_by}:
            successors[source].append(index)
            indegree[index] += 1
    ready = [index for index, degree in enumerate(indegree) if degree == 0]
    heapq.heapify(ready)
    order: list[gs.Node] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(nodes[index])
        for successor in successors[index]:
            indegree[successor] -= 1
            if indegree[successor] == 0:
                heapq.heappush(ready, successor)
    if len(order) != len(nodes):
        cycle = find_cycle(dataflow_graph(graph))
        raise ValueError("graph has a cycle through " + " -> ".join(a for a, _ in cycle))
    return order


#: Weights up to this many elements keep their data when a graph is exported for shape
#: inference: shape-carrying constants (Reshape targets, Slice bounds) are always this small.
SHAPE_DATA_MAX_ELEMENTS = 4096


def shape_only_model(graph: gs.Graph, opset: int) -> onnx.ModelProto:
    """The graph with its large weights declared as typed inputs instead of data.

    Shape inference needs only their shapes; serializing the data would dominate planning time
    and would materialize folded broadcast fills.
    """
    return _shape_only_model([node_proto(n) for n in graph.nodes], graph.name or "graph", graph.inputs,
                             graph.tensors().values(), graph.outputs, opset, graph.import_domains)


def node_shape_model(node: gs.Node, opset: int, import_domains) -> onnx.ModelProto:
    """shape_only_model of a graph of `node` alone, its inputs that are not constants the graph's
    inputs and its named outputs the graph's outputs, built without making that graph (a plan
    infers one node at a time up to a thousand times: passes/fold_constants.py)."""
    inputs = present_inputs(node)
    outputs = [t for t in node.outputs if t.name]
    tensors = {t.name: t for t in inputs + outputs}
    return _shape_only_model([node_proto(node)], "graph", [t for t in inputs if not isinstance(t, gs.Constant)],
                             tensors.values(), outputs, opset, import_domains)


def _shape_only_model(nodes: list[onnx.NodeProto], name: str, inputs, tensors, outputs, opset: int,
                      import_domains) -> onnx.ModelProto:
    """A model of `nodes` reading `inputs` and the constants among `tensors` (data up to
    SHAPE_DATA_MAX_ELEMENTS elements, else typed inputs), writing `outputs`."""
    inputs = [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in inputs]
    initializers = []
    for tensor in tensors:
        if not isinstance(tensor, gs.Constant):
            continue
        if element_count(tensor.shape) <= SHAPE_DATA_MAX_ELEMENTS:
            initializers.append(OnnxExporter.export_tensor_proto(tensor))
        else:
            inputs.append(onnx.helper.make_tensor_value_info(
                tensor.name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype)), list(tensor.shape)))
    outputs = [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in outputs]
    body = onnx.helper.make_graph(nodes, name, inputs, outputs, initializers)
    opsets = [onnx.helper.make_opsetid(d.domain, d.version) for d in import_domains or []
              if d.domain not in ("", "ai.onnx")]
    return onnx.helper.make_model(body, opset_imports=[onnx.helper.make_opsetid("", opset)] + opsets)


def stored_elements(values: np.ndarray) -> np.ndarray:
    """The elements `values` holds in memory: a broadcast view (a folded ConstantOfShape, a bias
    spread over a feature map) cut to one along each axis it repeats, so a test of every value
    reads what is stored, never the view's possibly huge extent."""
    return values[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in values.strides)]


def unique_name(base: str, taken: Container[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... the first that `taken` does not hold."""
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name
