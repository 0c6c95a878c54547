"""Fast constructors of onnx-graphsurgeon objects, for the importer and the passes that build
many nodes.

They make the same objects as gs.Node, gs.Variable, gs.Constant and gs.Graph (the same
attributes, the tensors' producer and consumer lists linked the same way) without
onnx-graphsurgeon's attribute setter, which probes each attribute it sets by raising and
catching an AttributeError. tests/test_operations_rebuild.py compares them with the library's
own constructors, attribute by attribute.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs
from onnx_graphsurgeon.util.misc import SynchronizedList


def graph_node(op: str, name: str, domain: str | None, attrs: dict, inputs: list, outputs: list) -> gs.Node:
    """gs.Node(op=op, name=name, domain=domain, attrs=attrs, inputs=inputs, outputs=outputs)."""
    node = gs.Node.__new__(gs.Node)
    node.__dict__.update(op=op, name=name or "", attrs=attrs, domain=domain,
                         inputs=_linked(node, "outputs", inputs), outputs=_linked(node, "inputs", outputs))
    return node


def variable(name: str, dtype=None, shape=None, value_type: str = "tensor_type") -> gs.Variable:
    """gs.Variable(name, dtype=dtype, shape=shape, type=value_type)."""
    tensor = gs.Variable.__new__(gs.Variable)
    tensor.__dict__.update(name=name, dtype=dtype, shape=shape, type=value_type,
                           inputs=_linked(tensor, "outputs", ()), outputs=_linked(tensor, "inputs", ()))
    return tensor


def constant(name: str, values, data_location: int | None = None) -> gs.Constant:
    """gs.Constant(name, values, data_location) for a numpy array or onnx-graphsurgeon's
    LazyValues."""
    tensor = gs.Constant.__new__(gs.Constant)
    tensor.__dict__.update(name=name, _values=values, data_location=data_location, _export_dtype=None,
                           inputs=_linked(tensor, "outputs", ()), outputs=_linked(tensor, "inputs", ()))
    return tensor


def graph(nodes: list, inputs: list, outputs: list, name: str, opset: int = gs.Graph.DEFAULT_OPSET) -> gs.Graph:
    """gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=name, opset=opset). The
    library's constructor takes 26 us (planning makes one per fusion): it sets each attribute
    through its setter and merges the nested graphs' function lists, which for graphs without
    functions leaves every nested graph sharing this graph's (empty) list, as done below.
    Nodes whose graphs carry local functions go to the constructor, which gathers them."""
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


def _linked(owner, field_name: str, items) -> SynchronizedList:
    """SynchronizedList(owner, field_name, items): `items`, each of which lists `owner` in its
    `field_name` list."""
    made = SynchronizedList.__new__(SynchronizedList)
    made.parent_obj, made.field_name = owner, field_name
    list.extend(made, items)
    for item in items:
        list.append(getattr(item, field_name), owner)
    return made
