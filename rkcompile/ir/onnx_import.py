"""onnx-graphsurgeon's import of an ONNX model (`gs.import_onnx`), made without its setters.

The library builds every tensor and node through its attribute setters and synchronized lists:
about 45 us a node, 10-20 ms of a typical CNN's plan process and 0.1 s of tv_ssdlite320's 3,462
nodes (issue 18). `import_onnx` follows the library's importer step by step (initializers, then
value_info merged into what is known, graph inputs and outputs, then the nodes in order, each
reading a tensor met before or making it) and makes the same objects with `operations`'
constructors. Attributes of plain values (numbers, strings, their lists, tensors) are read as
the library reads them. What it does not restate it hands to the library itself: the attributes
of a node with any other kind (`OnnxImporter.import_attributes`: If branches and Loop bodies,
which see the tensors made so far as gs's importer lets them, references to a function's
attributes), the dtype, shape and kind of a value that is not a plain tensor, and the graph
object. A model with local functions or sparse initializers, or without an ai.onnx opset (which
the library warns about), goes to gs.import_onnx whole.
`tests/test_graph_import.py` compares both importers' graphs field by field.
"""
from __future__ import annotations

from collections import OrderedDict

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.importers.onnx_importer import (OnnxImporter, get_numpy_type, get_onnx_tensor_dtype,
                                                       get_onnx_tensor_shape, get_onnx_tensor_type)
from onnx_graphsurgeon.ir.tensor import LazyValues

from rkcompile.ir.construct import constant, graph_node, variable


def import_onnx(model: onnx.ModelProto) -> gs.Graph:
    """gs.import_onnx(model): the same graph, tensors, nodes and links."""
    opset = ai_onnx_opset(model)
    if model.functions or model.graph.sparse_initializer or opset is None:
        return gs.import_onnx(model)
    onnx_graph = model.graph
    domains = model.opset_import
    tensors: dict[str, gs.Tensor] = {}  # the library's `subgraph_tensor_map` of the main graph
    for initializer in onnx_graph.initializer:
        if initializer.name not in tensors:
            tensors[initializer.name] = _constant(initializer)
    for value in onnx_graph.value_info:  # repeated entries add what the first lacked
        known = tensors.get(value.name)
        if known is None:
            tensors[value.name] = _variable(value)
        elif isinstance(known, gs.Variable):
            dtype, shape, _ = _value_type(value) if value.type.ByteSize() > 0 else (None, None, None)
            known.dtype = known.dtype or dtype
            known.shape = known.shape or shape
    initializers = {tensor.name for tensor in onnx_graph.initializer}
    inputs = [_known_or_new(tensors, value) for value in onnx_graph.input if value.name not in initializers]
    outputs = [_known_or_new(tensors, value) for value in onnx_graph.output]
    outer: dict[str, gs.Tensor] = {}  # the main graph has no enclosing scope
    nodes = []
    for node in onnx_graph.node:
        attrs = _attributes(node, outer, tensors, opset, domains)
        nodes.append(graph_node(node.op_type, node.name, node.domain if node.HasField("domain") else None, attrs,
                                [_read(tensors, name) for name in node.input],
                                [_read(tensors, name) for name in node.output]))
    return gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=onnx_graph.name,
                    doc_string=onnx_graph.doc_string, producer_name=model.producer_name,
                    producer_version=model.producer_version, opset=opset, import_domains=domains, functions=[],
                    ir_version=model.ir_version)


def ai_onnx_opset(model: onnx.ModelProto) -> int | None:
    """The model's ai.onnx opset version, None when it imports none (OnnxImporter.get_opset's
    answer, without its warning)."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def _constant(tensor: onnx.TensorProto) -> gs.Constant:
    """OnnxImporter.import_tensor of a TensorProto: its values loaded when first read."""
    location = int(tensor.data_location) if tensor.HasField("data_location") else None
    return constant(tensor.name, LazyValues(tensor), data_location=location)


#: AttributeProto types of plain values -> the value the library's import_attributes gives
_PLAIN_ATTRIBUTES = {
    onnx.AttributeProto.FLOAT: lambda attribute: attribute.f,
    onnx.AttributeProto.INT: lambda attribute: attribute.i,
    onnx.AttributeProto.STRING: lambda attribute: attribute.s.decode(),
    onnx.AttributeProto.TENSOR: lambda attribute: _constant(attribute.t),
    onnx.AttributeProto.FLOATS: lambda attribute: list(attribute.floats),
    onnx.AttributeProto.INTS: lambda attribute: list(attribute.ints),
    onnx.AttributeProto.STRINGS: lambda attribute: [item.decode() for item in attribute.strings],
}


def _attributes(node: onnx.NodeProto, outer: dict, tensors: dict, opset: int, domains) -> OrderedDict:
    """OnnxImporter.import_attributes(node.attribute, outer, tensors, opset, domains): read here
    when every attribute holds a plain value, else the library's answer for the whole node. The
    library's closures took 18-20 ms of tv_ssdlite320_mobilenet_v3_large's 3,462 nodes (a third
    of its import), these reads 13 (4.5-5.4 of it the 1,041 Constant nodes' tensors)."""
    attrs = OrderedDict()
    for attribute in node.attribute:
        read = _PLAIN_ATTRIBUTES.get(attribute.type)
        if read is None or attribute.ref_attr_name:
            return OnnxImporter.import_attributes(node.attribute, outer, tensors, opset, domains)
        attrs[attribute.name] = read(attribute)
    return attrs


def _variable(value: onnx.ValueInfoProto) -> gs.Variable:
    """OnnxImporter.import_tensor of a ValueInfoProto: typed when the value states a type."""
    if value.type.ByteSize() > 0:
        dtype, shape, kind = _value_type(value)
        return variable(value.name, dtype, shape=shape, value_type=kind)
    return variable(value.name)


def _value_type(value: onnx.ValueInfoProto) -> tuple:
    """(dtype, shape, kind) as the library's get_onnx_tensor_dtype, _shape and _type give them;
    worked out here for a plain tensor whose element type numpy has."""
    tensor_type = value.type.tensor_type if value.type.WhichOneof("value") == "tensor_type" else None
    dtype = _NUMPY_DTYPES[tensor_type.elem_type] if tensor_type is not None else None
    if dtype is None:  # anything else, warnings included, is the library's
        return get_onnx_tensor_dtype(value), get_onnx_tensor_shape(value), get_onnx_tensor_type(value)
    if not tensor_type.HasField("shape"):
        return dtype, None, "tensor_type"
    shape = []
    for dim in tensor_type.shape.dim:
        which = dim.WhichOneof("value")
        shape.append(dim.dim_param if which == "dim_param" else dim.dim_value if which == "dim_value" else None)
    return dtype, shape, "tensor_type"


class _NumpyDtypes(dict):
    """ONNX element type -> the numpy dtype the library's get_numpy_type gives, for the element
    types it gives one (the others, bfloat16 and float8, it warns about: left to it)."""

    def __missing__(self, elem_type: int):
        dtype = get_numpy_type(elem_type)
        if dtype is not None:
            self[elem_type] = dtype
        return dtype


_NUMPY_DTYPES = _NumpyDtypes()


def _known_or_new(tensors: dict[str, gs.Tensor], value: onnx.ValueInfoProto) -> gs.Tensor:
    """A graph input's or output's tensor: the one met before, as it is, else made from `value`."""
    known = tensors.get(value.name)
    if known is None:
        known = tensors[value.name] = _variable(value)
    return known


def _read(tensors: dict[str, gs.Tensor], name: str) -> gs.Tensor:
    """A node's input or output: the tensor met before, a fresh empty one for an omitted
    optional (never kept), else a new untyped one, kept."""
    known = tensors.get(name)
    if known is not None:
        return known
    if not name:
        return variable("")
    made = tensors[name] = variable(name)
    return made
