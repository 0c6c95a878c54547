"""Fast constructors of onnx-graphsurgeon objects, for the passes that build many nodes.

They make the same objects as gs.Node, gs.Variable and gs.Constant (the same
attributes, the tensors' producer and consumer lists linked the same way) without
onnx-graphsurgeon's attribute setter, which probes each attribute it sets by raising and
catching an AttributeError. `linked=False` makes a node or tensor no graph walk sees (a
probe a pass evaluates and drops): plain lists, and no tensor lists the nodes that make or
read it. tests/test_operations_rebuild.py compares them with the library's own constructors,
attribute by attribute.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs
from onnx_graphsurgeon.util.misc import SynchronizedList


def graph_node(op: str, name: str, domain: str | None, attrs: dict, inputs: list, outputs: list,
               linked: bool = True) -> gs.Node:
    """gs.Node(op=op, name=name, domain=domain, attrs=attrs, inputs=inputs, outputs=outputs);
    unlinked (plain lists, the tensors not told) with `linked=False`."""
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
