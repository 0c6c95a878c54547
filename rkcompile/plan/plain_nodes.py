"""A step's node as the plan layer and the runtime hold it: plain records, no graph library.

`Node`, its tensors (`Variable`, `Constant`) and the `Graph`s it carries as attributes (a fused
kernel's `body`, If's branches, Loop's and Scan's bodies) keep the attribute names the ONNX
graph library the compiler uses gives them (`op`, `domain`, `attrs`, `inputs`, `outputs`,
`values`, `dtype`, `shape`, `nodes`), so a kernel reads a plan's node as it reads any. They are
made by `operations.rebuild` from a plan record, or by the compiler from its own graph
(rkcompile/ir/nodes.py `plain_node`), and exported to ONNX by `onnx_protos`. Nothing links a
tensor to the nodes that make or read it: the runtime executes node by node.

The facts below (what a node reads, its subgraphs, a fused kernel's members) answer for these
nodes what rkcompile/ir/nodes.py answers for the compiler's graph. Those that read only what any
node and tensor has (`is_constant`, `constant_value`, `static_shape`, `present_inputs`) answer
for nodes of both kinds: the compiler's graph and the targets' constraints take them from here.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Callable

import numpy as np

from rkcompile.plan.schema import FUSED_DOMAIN


@dataclass(eq=False, slots=True)
class Variable:
    """A tensor computed at run time. `dtype`: the element type as its source records it (a
    dtype name from a plan, a numpy dtype or ONNX enum from a model), None when unknown;
    `shape`: its dims when known (a Loop or Scan body's inputs), else None."""
    name: str
    dtype: object = None
    shape: list | None = None


@dataclass(eq=False, slots=True)
class Constant:
    """A tensor whose value is known: a weight, a subgraph's constant, a tensor attribute."""
    name: str
    values: np.ndarray

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape


class DeferredConstant(Constant):
    """A Constant whose value `make()` computes when it is first read: for a value most runs
    never read (an int8 weight's real value, which int8 kernels do not read: they take the
    integers), so making it costs only the runs that need it. Two threads reading it at once
    may both make it; either gets the same value."""
    __slots__ = ("_make", "_made")

    def __init__(self, name: str, make: Callable[[], np.ndarray]):
        self.name, self._make, self._made = name, make, None

    @property
    def values(self) -> np.ndarray:
        if self._made is None:
            self._made = self._make()
        return self._made


Tensor = Variable | Constant


@dataclass(eq=False, slots=True)
class Node:
    """One ONNX node (its fields in the order gs.Node takes them). `domain` is '' for ai.onnx;
    `attrs` hold plain values, lists of them, `Constant`s (tensor attributes) and `Graph`s."""
    op: str
    name: str = ""
    attrs: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    domain: str = ""


@dataclass(eq=False, slots=True)
class Graph:
    """A graph a node carries: its nodes in order, the tensors it takes and gives."""
    nodes: list
    inputs: list
    outputs: list
    name: str = ""


def is_onnx_domain(node) -> bool:
    """True for ops of the default ai.onnx domain (reported as None, '' or 'ai.onnx')."""
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


# The structural facts below hold for any node with op, domain, attrs, inputs and outputs: the
# plain ones here and the compiler's onnx-graphsurgeon ones (rkcompile/ir/nodes.py passes its
# graph class as `graph_type`), so there is one copy of each for both.


def subgraphs(node: Node, graph_type: type = Graph) -> list[Graph]:
    """The graphs `node` carries as attributes: If's branches, Loop's and Scan's bodies (a
    GRAPHS attribute gives a list of them), a fused kernel's body."""
    found = []
    for value in node.attrs.values():
        if isinstance(value, graph_type):
            found.append(value)
        elif isinstance(value, (list, tuple)) and any(map(isinstance, value, repeat(graph_type))):
            # tested in C first: nearly every list attribute holds ints (kernel_shape, pads, ...)
            found.extend(item for item in value if isinstance(item, graph_type))
    return found


def fused_body(node: Node, graph_type: type = Graph) -> Graph | None:
    """The members of a fused kernel, as the subgraph fusion (passes/fuse.py) stores in its
    `body`; None for every other node, Loop and Scan included, whose `body` is a loop body."""
    body = node.attrs.get("body")
    return body if node.domain == FUSED_DOMAIN and isinstance(body, graph_type) else None


def outer_scope_reads(node: Node, graph_type: type = Graph) -> list[Variable]:
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
    graphs = subgraphs(node, graph_type)
    if not graphs:
        return []
    found: dict[str, Variable] = {}
    body = fused_body(node, graph_type)
    for graph in graphs:
        if graph is body:
            reads = [t for inner in graph.nodes if inner.attrs for t in outer_scope_reads(inner, graph_type)]
        else:
            reads = [t for inner in graph.nodes for t in node_inputs(inner, graph_type)]
        if not reads:
            continue
        local = {t.name for t in graph.inputs} | {t.name for inner in graph.nodes for t in inner.outputs}
        for tensor in reads:
            if tensor.name not in local and not is_constant(tensor):
                found.setdefault(tensor.name, tensor)
    return list(found.values())


def is_constant(tensor) -> bool:
    """Whether `tensor`'s values are known (a weight, a constant), for a plain tensor or one of
    the compiler's graph: a constant's class declares `values` and a variable's does not. It
    is asked of the class, so a weight not read yet stays unread."""
    return _declares_values(type(tensor))


@functools.cache
def _declares_values(cls: type) -> bool:
    return hasattr(cls, "values")


def constant_value(tensor) -> np.ndarray | None:
    """A constant's values; None for a tensor computed at run time."""
    return np.asarray(tensor.values) if is_constant(tensor) else None


def static_shape(tensor) -> tuple[int, ...] | None:
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


def present_inputs(node) -> list[Tensor]:
    """The node's inputs without ONNX's empty-name placeholders for omitted optionals."""
    return [t for t in node.inputs if t.name]


def node_inputs(node: Node, graph_type: type = Graph) -> list[Tensor]:
    """Every tensor `node` reads: its present inputs in order, then its outer-scope reads.

    The one answer to "what does this node read" for dataflow, ordering, placement, boundary
    conversions, lifetimes and execution, so no pass misses an If that reads a tensor only
    from inside a branch."""
    explicit = present_inputs(node)
    if not node.attrs:
        return explicit
    implicit = outer_scope_reads(node, graph_type)
    if not implicit:
        return explicit
    listed = {t.name for t in explicit}
    return explicit + [t for t in implicit if t.name not in listed]


def node_operands(node: Node) -> list[Tensor]:
    """What an executor feeds `node`, position by position: its inputs as ONNX lists them
    (empty placeholders included, so kernels index them as the spec does), then its
    outer-scope reads."""
    implicit = outer_scope_reads(node) if node.attrs else ()
    if not implicit:
        return list(node.inputs)
    listed = {t.name for t in node.inputs if t.name}
    return list(node.inputs) + [t for t in implicit if t.name not in listed]


def expanded_members(node: Node) -> list[Node]:
    """A fused kernel as its members (nested fusions too), reading and writing the fused node's
    own tensors: a boundary may have renamed one since fusion. Every other node as it is."""
    body = fused_body(node)
    if body is None:
        return [node]
    variables = [t for t in node.inputs if t.name and not isinstance(t, Constant)]
    renamed = {inner.name: outer for inner, outer in zip(body.inputs, variables)}
    renamed.update((inner.name, outer) for inner, outer in zip(body.outputs, node.outputs) if outer.name)

    def outer(tensor: Tensor) -> Tensor:
        if isinstance(tensor, Constant) or tensor.name not in renamed:
            return tensor
        return Variable(renamed[tensor.name].name, tensor.dtype, tensor.shape)

    members = []
    for member in body.nodes:
        copy = Node(member.op, member.name, dict(member.attrs), [outer(t) for t in member.inputs],
                    [outer(t) for t in member.outputs], member.domain)
        members += expanded_members(copy)
    return members


#: ops that sum products in the NPU's wide accumulator (its convolution core): their bias is
#: added there, and their result leaves it rounded to the stored float dtype
ACCUMULATING_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
#: ops whose input is their bias (input 2), added in the accumulator
_BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
#: ops whose output channels are its last axis: a constant Add along it is a bias
_CHANNELS_LAST = frozenset({"Gemm", "MatMul"})


@dataclass(frozen=True)
class AccumulatorStage:
    """One accumulating member of a fused kernel with the bias it adds in the accumulator: its
    bias input, or (a MatMul's or Gemm's) a constant Add along the output's last axis that alone
    reads its result (exMatMul's `c`). `biases` names those constants; `output` is the stage's
    result, the accumulator's value as it leaves the convolution core."""
    biases: tuple[str, ...]
    output: str


def accumulator_stages(members, outputs) -> list[AccumulatorStage]:
    """The accumulator stages among `members` (a fused kernel's body nodes, or one node alone)
    whose results leave as `outputs`, for nodes of both kinds."""
    readers: dict[str, list] = {}
    for member in members:
        for tensor in member.inputs:
            if tensor.name:
                readers.setdefault(tensor.name, []).append(member)
    body_outputs = {t.name for t in outputs}
    stages = []
    for member in members:
        if member.op not in ACCUMULATING_OPS or not member.outputs:
            continue
        biases, output = [], member.outputs[0]
        position = _BIAS_INPUT.get(member.op)
        if position is not None and len(member.inputs) > position and is_constant(member.inputs[position]):
            biases.append(member.inputs[position].name)
        following = readers.get(output.name, [])
        if (member.op in _CHANNELS_LAST and len(following) == 1 and following[0].op == "Add"
                and output.name not in body_outputs):
            other = [t for t in following[0].inputs if t.name != output.name]
            if len(other) == 1 and is_constant(other[0]) and all(size == 1 for size in tuple(other[0].shape)[:-1]):
                biases.append(other[0].name)
                output = following[0].outputs[0]
        stages.append(AccumulatorStage(tuple(biases), output.name))
    return stages
