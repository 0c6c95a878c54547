"""Helpers over the mutable IR (onnx-graphsurgeon) and its analysis view (networkx).

Every pass mutates a `gs.Graph`; whole-graph questions (cycles, convexity, reachability) use a
networkx view built by `dataflow_graph`. The topological order, asked after every pass, is
computed on plain lists instead.
"""
from __future__ import annotations

import heapq
import math
from typing import Iterable

import networkx as nx
import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})


def dtype_name(dtype) -> str | None:
    """numpy or ONNX dtype -> a plain name ('float32', 'int64', ...), None when unknown."""
    if dtype is None:
        return None
    if isinstance(dtype, (int, np.integer)):
        return onnx.helper.tensor_dtype_to_np_dtype(int(dtype)).name if dtype else None
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def itemsize(dtype: str) -> int:
    if dtype == "bfloat16":
        return 2
    return np.dtype(dtype).itemsize


def static_shape(tensor: gs.Tensor) -> tuple[int, ...] | None:
    """The tensor's shape when every dim is a known non-negative int, else None."""
    shape = tensor.shape
    if shape is None:
        return None
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def element_count(shape: Iterable[int]) -> int:
    """Python-int product, so huge shapes never overflow or allocate."""
    return math.prod(int(d) for d in shape)


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    return np.asarray(tensor.values) if isinstance(tensor, gs.Constant) else None


def present_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The node's inputs without ONNX's empty-name placeholders for omitted optionals."""
    return [t for t in node.inputs if t.name]


def subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The graphs `node` carries as attributes: If's branches, Loop's and Scan's bodies (a
    GRAPHS attribute gives a list of them), a fused kernel's body (passes/fuse.py)."""
    found = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, gs.Graph))
    return found


def outer_scope_reads(node: gs.Node) -> list[gs.Variable]:
    """The tensors `node`'s subgraphs read from the scope around `node` without listing them as
    inputs: ONNX lets an If branch or a Loop/Scan body name any tensor visible where the node
    stands (onnx IR spec, "Names Within a Graph": outer-scope references), at any depth of
    nesting. They are as much the node's inputs as its listed ones: it cannot run before their
    producers, and they must stay alive until it has. Constants are left out: they are values,
    exported inside the subgraph with it, not dataflow."""
    found: dict[str, gs.Variable] = {}
    for graph in subgraphs(node):
        local = {t.name for t in graph.inputs} | {t.name for inner in graph.nodes for t in inner.outputs}
        for inner in graph.nodes:
            for tensor in node_inputs(inner):
                if tensor.name not in local and not isinstance(tensor, gs.Constant):
                    found.setdefault(tensor.name, tensor)
    return list(found.values())


def node_inputs(node: gs.Node) -> list[gs.Tensor]:
    """Every tensor `node` reads: its present inputs in order, then its outer-scope reads.

    The one answer to "what does this node read" for dataflow, ordering, placement, boundary
    conversions, lifetimes and execution, so no pass misses an If that reads a tensor only
    from inside a branch."""
    explicit = present_inputs(node)
    if not node.attrs:
        return explicit
    implicit = outer_scope_reads(node)
    if not implicit:
        return explicit
    listed = {t.name for t in explicit}
    return explicit + [t for t in implicit if t.name not in listed]


def node_operands(node: gs.Node) -> list[gs.Tensor]:
    """What an executor feeds `node`, position by position: its inputs as ONNX lists them
    (empty placeholders included, so kernels index them as the spec does), then its
    outer-scope reads."""
    listed = {t.name for t in node.inputs if t.name}
    return list(node.inputs) + [t for t in outer_scope_reads(node) if t.name not in listed]


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


def dataflow_graph(graph: gs.Graph) -> nx.DiGraph:
    """Nodes are gs node names, edges follow tensors (`node_inputs`) from producer to consumer."""
    dag = nx.DiGraph()
    dag.add_nodes_from(node.name for node in graph.nodes)
    made_by = producers(graph)
    dag.add_edges_from((made_by[t.name].name, node.name) for node in graph.nodes
                       for t in node_inputs(node) if t.name in made_by)
    return dag


def topological_nodes(graph: gs.Graph) -> list[gs.Node]:
    """A deterministic topological order that keeps the model's own order where it can.

    Kahn's algorithm, always releasing the ready node that came first in the file, so
    plans are stable and read in the order users see in Netron. It runs after every pass, so it
    works on plain lists indexed by file position rather than on a networkx view.
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
        cycle = nx.find_cycle(dataflow_graph(graph))
        raise ValueError("graph has a cycle through " + " -> ".join(a for a, _ in cycle))
    return order


#: Domain of the nodes a fusion creates (passes/fuse.py); fusion patterns match these as well
#: as ONNX ops, so a kernel fusion can take a recognised activation (Conv + exSwish -> ConvExSwish).
FUSED_DOMAIN = "rkcompile"


def fused_body(node: gs.Node) -> gs.Graph | None:
    """The members of a fused kernel, as the subgraph passes/fuse.py stores in its `body`; None
    for every other node, Loop and Scan included, whose `body` is a loop body, not members."""
    body = node.attrs.get("body")
    return body if node.domain == FUSED_DOMAIN and isinstance(body, gs.Graph) else None


def is_onnx_domain(node: gs.Node) -> bool:
    """True for ops of the default ai.onnx domain (gs reports it as None or '')."""
    return node.domain in (None, "", "ai.onnx")


#: Weights up to this many elements keep their data when a graph is exported for shape
#: inference: shape-carrying constants (Reshape targets, Slice bounds) are always this small.
SHAPE_DATA_MAX_ELEMENTS = 4096


def node_proto(node: gs.Node) -> onnx.NodeProto:
    return OnnxExporter.export_node(node)


def single_node_graph(node: gs.Node) -> onnx.GraphProto:
    """The node alone in an untyped graph: onnx.reference honours a given opset only for
    graphs (a bare NodeProto runs at the newest opset), and old models need their own. Its
    outer-scope reads are graph inputs too, which its subgraphs then see."""
    untyped = onnx.TypeProto()
    return onnx.helper.make_graph([node_proto(node)], node.name,
                                  [onnx.helper.make_value_info(t.name, untyped) for t in node_inputs(node)],
                                  [onnx.helper.make_value_info(t.name, untyped) for t in node.outputs if t.name])


def shape_only_model(graph: gs.Graph, opset: int) -> onnx.ModelProto:
    """The graph with its large weights declared as typed inputs instead of data.

    Shape inference needs only their shapes; serializing the data would dominate planning time
    and would materialize folded broadcast fills.
    """
    inputs = [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in graph.inputs]
    initializers = []
    for tensor in graph.tensors().values():
        if not isinstance(tensor, gs.Constant):
            continue
        if element_count(tensor.shape) <= SHAPE_DATA_MAX_ELEMENTS:
            initializers.append(OnnxExporter.export_tensor_proto(tensor))
        else:
            inputs.append(onnx.helper.make_tensor_value_info(
                tensor.name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype)), list(tensor.shape)))
    outputs = [OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in graph.outputs]
    body = onnx.helper.make_graph([node_proto(n) for n in graph.nodes], graph.name or "graph",
                                  inputs, outputs, initializers)
    opsets = [onnx.helper.make_opsetid(d.domain, d.version) for d in graph.import_domains or []
              if d.domain not in ("", "ai.onnx")]
    return onnx.helper.make_model(body, opset_imports=[onnx.helper.make_opsetid("", opset)] + opsets)
