"""Facts about one ONNX tensor or node (onnx-graphsurgeon objects, with the subgraphs a node
carries) and dtype names: what the passes, the targets' constraints and the emulator's kernels
share. Nothing here looks at a whole graph or at the compiler; rkcompile/ir/graph.py builds the
graph-level helpers on top."""
from __future__ import annotations

import math
import operator
from itertools import repeat
from typing import Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, constant_to_onnx_tensor
from onnx_graphsurgeon.ir import tensor as gs_tensor

# The domain of the nodes a fusion creates (passes/fuse.py); fusion patterns match these as well
# as ONNX ops, so a kernel fusion can take a recognised activation (Conv + exSwish -> ConvExSwish).
from rkcompile.plan.schema import FUSED_DOMAIN

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})


def dtype_name(dtype) -> str | None:
    """numpy or ONNX dtype -> a plain name ('float32', 'int64', ...), None when unknown.

    Remembered per dtype: a plan asks about every tensor in several passes (33,000 times for a
    2,000-node detector), and numpy's `dtype.name` is computed in Python on every read."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = _dtype_name(dtype)
        return name
    except TypeError:  # an unhashable dtype-like
        return _dtype_name(dtype)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str | None:
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
    try:
        dims = tuple(map(operator.index, shape))  # a symbolic (str), unknown (None) or float dim raises
    except TypeError:
        return None
    for dim in dims:  # a loop, not min(): asked 48,000 times over eight median models' plans
        if dim < 0:
            return None
    return dims


def element_count(shape: Iterable[int]) -> int:
    """Python-int product, so huge shapes never overflow or allocate."""
    return math.prod(int(d) for d in shape)


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    return np.asarray(tensor.values) if isinstance(tensor, gs.Constant) else None


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


def is_onnx_domain(node: gs.Node) -> bool:
    """True for ops of the default ai.onnx domain (gs reports it as None or '')."""
    return node.domain in (None, "", "ai.onnx")


#: attribute values `plain_attribute_key` spells out
_PLAIN_ATTRIBUTE_TYPES = (bool, int, float, str, bytes, np.integer, np.floating)


def plain_attribute_key(name: str, value) -> tuple | None:
    """An attribute holding a plain value, or a list of them, as a hashable key: its name, type
    and exact value (by repr, so -0.0 is not 0.0 and a NaN matches a NaN); None for an attribute
    of another kind (a tensor, a graph), which each caller keys its own way or not at all."""
    if isinstance(value, _PLAIN_ATTRIBUTE_TYPES):
        return name, type(value), repr(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, _PLAIN_ATTRIBUTE_TYPES) for item in value):
        return name, type(value), tuple((type(item), repr(item)) for item in value)
    return None


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
        elif isinstance(value, (list, tuple)) and any(map(isinstance, value, repeat(gs.Graph))):
            # tested in C first: nearly every list attribute holds ints (kernel_shape, pads, ...)
            found.extend(item for item in value if isinstance(item, gs.Graph))
    return found


def outer_scope_reads(node: gs.Node) -> list[gs.Variable]:
    """The tensors `node`'s subgraphs read from the scope around `node` without listing them as
    inputs: ONNX lets an If branch or a Loop/Scan body name any tensor visible where the node
    stands (onnx IR spec, "Names Within a Graph": outer-scope references), at any depth of
    nesting. They are as much the node's inputs as its listed ones: it cannot run before their
    producers, and they must stay alive until it has. Constants are left out: they are values,
    exported inside the subgraph with it, not dataflow.

    A fused kernel's members list only the body's inputs, each other's results and constants
    (passes/fuse.py builds the body so), so only a member carrying subgraphs of its own can read
    further out: the members' listed inputs are not looked at. Most nodes of a plan are fused
    kernels, asked about thousands of times."""
    graphs = subgraphs(node)
    if not graphs:
        return []
    found: dict[str, gs.Variable] = {}
    body = fused_body(node)
    for graph in graphs:
        if graph is body:
            reads = [t for inner in graph.nodes if inner.attrs for t in outer_scope_reads(inner)]
        else:
            reads = [t for inner in graph.nodes for t in node_inputs(inner)]
        if not reads:
            continue
        local = {t.name for t in graph.inputs} | {t.name for inner in graph.nodes for t in inner.outputs}
        for tensor in reads:
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
    implicit = outer_scope_reads(node) if node.attrs else ()
    if not implicit:
        return list(node.inputs)
    listed = {t.name for t in node.inputs if t.name}
    return list(node.inputs) + [t for t in implicit if t.name not in listed]


def fused_body(node: gs.Node) -> gs.Graph | None:
    """The members of a fused kernel, as the subgraph passes/fuse.py stores in its `body`; None
    for every other node, Loop and Scan included, whose `body` is a loop body, not members."""
    body = node.attrs.get("body")
    return body if node.domain == FUSED_DOMAIN and isinstance(body, gs.Graph) else None


def expanded_members(node: gs.Node) -> list[gs.Node]:
    """A fused kernel as its members (nested fusions too), reading and writing the fused node's
    own tensors: a boundary may have renamed one since fusion. Every other node as it is."""
    body = fused_body(node)
    if body is None:
        return [node]
    variables = [t for t in node.inputs if t.name and not isinstance(t, gs.Constant)]
    renamed = {inner.name: outer for inner, outer in zip(body.inputs, variables)}
    renamed.update((inner.name, outer) for inner, outer in zip(body.outputs, node.outputs) if outer.name)

    def outer(tensor: gs.Tensor) -> gs.Tensor:
        if isinstance(tensor, gs.Constant) or tensor.name not in renamed:
            return tensor
        return gs.Variable(renamed[tensor.name].name, dtype=tensor.dtype, shape=tensor.shape)

    members = []
    for member in body.nodes:
        copy = gs.Node(op=member.op, name=member.name, domain=member.domain, attrs=dict(member.attrs),
                       inputs=[outer(t) for t in member.inputs], outputs=[outer(t) for t in member.outputs])
        members += expanded_members(copy)
    return members


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
