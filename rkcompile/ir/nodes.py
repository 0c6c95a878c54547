"""Facts about one ONNX tensor or node of the compiler's graph (onnx-graphsurgeon objects, with
the subgraphs a node carries): what the passes share, and a node as the plan layer's plain node
(`plain_nodes`), which is what the compiler hands the runtime.
Nothing here looks at a whole graph; rkcompile/ir/graph.py builds the graph-level helpers on
top. Dtype names and element counts (rkcompile/numerics/dtypes.py) and the facts that read a
node of either kind (rkcompile/plan/plain_nodes.py) are imported from below and passed on."""
from __future__ import annotations

from itertools import repeat
from typing import Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, constant_to_onnx_tensor
from onnx_graphsurgeon.ir import tensor as gs_tensor

from rkcompile.numerics.dtypes import FLOAT_DTYPES, dtype_name, element_count, itemsize  # noqa: F401  (passed on)
from rkcompile.plan import plain_nodes as plain
from rkcompile.plan.plain_nodes import (constant_value, is_onnx_domain, plain_attribute_key,  # noqa: F401  (passed on)
    present_inputs, static_shape)
# The domain of the nodes a fusion creates (passes/fuse.py); fusion patterns match these as well
# as ONNX ops, so a kernel fusion can take a recognised activation (Conv + exSwish -> ConvExSwish).
from rkcompile.plan.schema import FUSED_DOMAIN


class DerivedValues(gs_tensor.LazyValues):
    """The values of a constant made from another constant's values by `derive` (a MatMul's
    weight transposed into a Conv's), worked out when something first reads them: a float16
    plan never reads the weights of most rewritten nodes, and reading, transposing and copying
    every weight of a transformer was a third of its rewrite pass. onnx-graphsurgeon holds it
    as it holds a weight it has not read (LazyValues): `values` reads it, export writes it.

    `keeps_values`: the result holds exactly the source's values, only moved (transposed,
    reshaped, given unit axes), so a question about the set of values (their range) may be
    asked of the source instead (`values_source`)."""

    #: the source dtypes taken: numpy's own floats, whose arrays onnx-graphsurgeon loads as they
    #: are stored (it casts a bfloat16 or float8 weight when read)
    SOURCE_DTYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})

    def __init__(self, source: gs.Constant, derive, shape: Iterable[int], keeps_values: bool):
        """`derive` gives an array of `shape` in the source's dtype."""
        self.source, self._derive, self.keeps_values = source, derive, keeps_values
        self._array = None
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(source.dtype)
        self.nbytes = element_count(self.shape) * self.dtype.itemsize

    @property
    def loaded(self) -> bool:
        return self._array is not None

    def load(self) -> np.ndarray:
        if self._array is None:
            # np.array, not np.ascontiguousarray, which makes a 0-d constant 1-D (Builder.const)
            array = np.array(self._derive(np.asarray(self.source.values)), order="C")
            if array.shape != self.shape or array.dtype != self.dtype:
                raise ValueError(f"derived {array.dtype} {array.shape} values, not the declared {self.dtype} "
                                 f"{self.shape}")
            self._array = array
        return self._array

    @property
    def tensor(self) -> onnx.TensorProto:
        """The TensorProto onnx-graphsurgeon exports for the array itself; the exporter names it."""
        return constant_to_onnx_tensor(gs.Constant("", self.load()))


def values_source(constant: gs.Constant):
    """What holds `constant`'s values, or values equal to them as a set: its array or
    onnx-graphsurgeon's loader; for values derived by moving another constant's (not read
    yet), that constant's, so reading their range reads no new array; other derived values
    worked out."""
    values = constant._values
    while isinstance(values, DerivedValues):
        if values.loaded or not values.keeps_values:
            return values.load()
        values = values.source._values
    return values


def peeked_values(constant: gs.Constant) -> np.ndarray | None:
    """`constant`'s values (or, for values only moved from another constant, that constant's),
    read without onnx-graphsurgeon keeping them: a weight it has not read is read from its
    TensorProto and dropped after, where reading `values` would have gs keep a second, writable
    copy of every weight of the model (numpy_helper.to_array's array copied again). None for
    sparse values. For questions about the set of values (their range, whether all are zero)."""
    source = values_source(constant)
    if isinstance(source, gs_tensor.SparseValues):
        return None
    return numpy_helper.to_array(source.tensor) if isinstance(source, gs_tensor.LazyValues) else np.asarray(source)


def subgraphs(node: gs.Node) -> list[gs.Graph]:
    """`plain.subgraphs` of a node of the compiler's graph."""
    return plain.subgraphs(node, gs.Graph)


def outer_scope_reads(node: gs.Node) -> list[gs.Variable]:
    """`plain.outer_scope_reads` (what a node's subgraphs read from around it) of a node of the
    compiler's graph."""
    return plain.outer_scope_reads(node, gs.Graph)


def node_inputs(node: gs.Node) -> list[gs.Tensor]:
    """`plain.node_inputs` (its present inputs, then its outer-scope reads) of a node of the
    compiler's graph."""
    return plain.node_inputs(node, gs.Graph)


def fused_body(node: gs.Node) -> gs.Graph | None:
    """`plain.fused_body` (a fused kernel's members) of a node of the compiler's graph."""
    return plain.fused_body(node, gs.Graph)


def node_proto(node: gs.Node) -> onnx.NodeProto:
    """The node as ONNX. A tensor attribute of strings (LabelEncoder's keys_tensor) is written
    by onnx's numpy_helper: onnx-graphsurgeon writes every constant as raw data, which a string
    tensor cannot be."""
    strings = {name: value for name, value in node.attrs.items()
               if isinstance(value, gs.Constant) and np.asarray(value.values).dtype.kind in "OSU"}
    if not strings:
        return OnnxExporter.export_node(node)
    attrs = node.attrs
    node.attrs = {name: value for name, value in attrs.items() if name not in strings}
    try:
        proto = OnnxExporter.export_node(node)
    finally:
        node.attrs = attrs
    proto.attribute.extend(
        onnx.helper.make_attribute(name, onnx.numpy_helper.from_array(np.asarray(value.values).astype(object), name))
        for name, value in strings.items())
    return proto


def single_node_graph(node: gs.Node) -> onnx.GraphProto:
    """The node alone in an untyped graph: onnx.reference honours a given opset only for
    graphs (a bare NodeProto runs at the newest opset), and old models need their own. Its
    outer-scope reads are graph inputs too, which its subgraphs then see."""
    untyped = onnx.TypeProto()
    return onnx.helper.make_graph([node_proto(node)], node.name,
                                  [onnx.helper.make_value_info(t.name, untyped) for t in node_inputs(node)],
                                  [onnx.helper.make_value_info(t.name, untyped) for t in node.outputs if t.name])


def plain_node(node: gs.Node) -> plain.Node:
    """`node` as the plan layer's plain node (`plain_nodes`)."""
    return plain_nodes([node])[0]


def plain_nodes(nodes: Iterable[gs.Node]) -> list[plain.Node]:
    """The nodes as the plan layer's plain nodes, which the emulator runs and the ONNX exports
    read: the same ops, attributes and tensor names, each constant holding its values (read
    now), each subgraph converted with them. A tensor or graph several nodes share becomes one
    plain object, so a weight is not held twice."""
    convert = _ToPlain()
    return [convert.node(node) for node in nodes]


class _ToPlain:
    """Converts gs objects to plain ones, each once (by identity)."""

    def __init__(self):
        self.made: dict[int, object] = {}

    def node(self, node: gs.Node) -> plain.Node:
        return plain.Node(node.op, node.name or "", {key: self.value(value) for key, value in node.attrs.items()},
                          [self.tensor(t) for t in node.inputs], [self.tensor(t) for t in node.outputs],
                          node.domain or "")

    def tensor(self, tensor: gs.Tensor) -> plain.Variable | plain.Constant:
        found = self.made.get(id(tensor))
        if found is None:
            found = self.made[id(tensor)] = (
                plain.Constant(tensor.name, np.asarray(tensor.values)) if isinstance(tensor, gs.Constant)
                else plain.Variable(tensor.name, tensor.dtype, tensor.shape))
        return found

    def graph(self, graph: gs.Graph) -> plain.Graph:
        found = self.made.get(id(graph))
        if found is None:
            found = self.made[id(graph)] = plain.Graph(
                [self.node(n) for n in graph.nodes], [self.tensor(t) for t in graph.inputs],
                [self.tensor(t) for t in graph.outputs], graph.name or "")
        return found

    def value(self, value):
        """An attribute's value: tensors and graphs converted, anything else as it is."""
        if isinstance(value, gs.Constant):
            return self.tensor(value)
        if isinstance(value, gs.Graph):
            return self.graph(value)
        if isinstance(value, list) and any(map(isinstance, value, repeat(gs.Graph))):
            return [self.value(item) for item in value]
        return value
