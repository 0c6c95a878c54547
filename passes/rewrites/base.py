"""What every rewrite rule is written with: the candidate it yields, what it may read, how it
builds nodes, and the helpers several families share.

A rule never edits the graph. It is a generator over a matched node: it yields `Replacement`s,
new nodes wired from the matched node's inputs to its outputs, most preferred first, and it
returns the reason it declines (`return "why"`) when it yields nothing, so `plan --explain`
can say why a rule did not apply. The rewrite pass keeps the first candidate whose every node
is legal on the target, rewriting an illegal new node again where a rule can (passes/rewrite.py).
Each rule's docstring says why its result computes the same thing and which constraint it works
around; limits come from the target's own rules (`Target.rule_parameter`), never copied here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir import tensor as gs_tensor

from rkcompile.ir.edits import detach
from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape, unique_name
from rkcompile.ir.nodes import DerivedValues
from rkcompile.targets.model import Target

from rkcompile.passes.legalize import check_node

RESHAPE_LIKE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


#: A rule's generator: candidates, most preferred first; its return value says why it declined.
Candidates = Generator["Replacement", None, "str | None"]


@dataclass(frozen=True)
class Replacement:
    """`old` nodes leave the graph, `new` nodes take their place; consumers of each tensor in
    `aliases`' first position read the second instead (a removed relabel)."""

    old: tuple[gs.Node, ...]
    new: tuple[gs.Node, ...]
    aliases: tuple[tuple[gs.Tensor, gs.Tensor], ...] = ()

    def discard(self) -> None:
        for node in self.new:
            detach(node)


class Site:
    """What rules may read: the graph, the target, the opset, the compile's facts for the
    target's rules (legalize.compile_facts), the nodes no rule may replace, and fresh unique
    names."""

    def __init__(self, graph: gs.Graph, target: Target, opset: int, facts: dict[str, object],
                 pinned: dict[str, str] | None = None):
        self.graph, self.target, self.opset, self.facts = graph, target, opset, facts
        #: node name -> why it stays as the model wrote it (it runs on the CPU in float32)
        self.pinned = pinned or {}
        self.graph_outputs = {t.name for t in graph.outputs}
        self._taken = {n.name for n in graph.nodes} | set(graph.tensors())
        #: builders of the rule applications in progress, so the rewrite pass can detach what a
        #: rule built before it declined (passes/rewrite.py)
        self.builders: list[Builder] = []
        #: (shape, perm, dtype, neighbours) -> the legal view of that Transpose
        #: layout.emit_legal_transpose found, or None; ("whole", shape, perm, dtype) -> whether
        #: one view is legal whole (layout_ops.legal_whole): the target and the facts its rules
        #: read are fixed for a site, and a model's repeated blocks ask about the same Transposes
        #: (tv_maxvit_t: 242 asks, 1,834 probes)
        self.legal_transposes: dict[tuple, object] = {}

    @property
    def names_taken(self) -> int:
        """How many names the graph and `fresh` hold: unchanged across a rule's attempt that
        built nothing (passes/rewrite.py)."""
        return len(self._taken)

    def fresh(self, base: str) -> str:
        name = unique_name(base, self._taken)
        self._taken.add(name)
        return name

    def transpose_legal(self, node: gs.Node, input_shape: list[int]) -> bool:
        """Whether the Transpose `node`, reading a tensor of `input_shape` instead, passes the
        target's rules; judged on a detached probe that touches no graph tensor."""
        perm = [int(p) for p in node.attrs.get("perm", range(len(input_shape) - 1, -1, -1))]
        probe = gs.Node("Transpose", attrs=dict(node.attrs),
                        inputs=[gs.Variable("probe_in", node.inputs[0].dtype, list(input_shape))],
                        outputs=[gs.Variable("probe_out", node.outputs[0].dtype, [input_shape[p] for p in perm])])
        return not check_node(probe, self.target, **self.facts)

    def builder(self, node: gs.Node) -> "Builder":
        builder = Builder(self, node)
        self.builders.append(builder)
        return builder


class Builder:
    """Makes the nodes and tensors of one replacement of `node`, named after it."""

    def __init__(self, site: Site, node: gs.Node):
        self.site, self.node, self.nodes = site, node, []

    def const(self, values, hint: str = "const") -> gs.Constant:
        # np.array, not np.ascontiguousarray, which makes a 0-d constant 1-D
        return gs.Constant(self.site.fresh(f"{self.node.name}/{hint}"), np.array(values, order="C"))

    def derived(self, source: gs.Constant, derive, shape, hint: str, keeps_values: bool) -> gs.Constant:
        """A constant of `derive(source's values)` (`shape`, the source's dtype), worked out when
        something reads it (`DerivedValues`: `keeps_values` when derive only moves values), or
        at once for a source whose dtype that does not take."""
        if source.dtype not in DerivedValues.SOURCE_DTYPES or isinstance(source._values, gs_tensor.SparseValues):
            return self.const(derive(constant_value(source)), hint)
        return gs.Constant(self.site.fresh(f"{self.node.name}/{hint}"), DerivedValues(source, derive, shape, keeps_values))

    def op(self, op: str, inputs: list, shape=None, dtype=None, out: gs.Tensor | None = None,
           **attrs) -> gs.Tensor:
        """Append an `op` node; it writes `out`, or a new tensor of `shape` and `dtype`."""
        if out is None:
            out = gs.Variable(self.site.fresh(f"{self.node.name}/{op.lower()}_out"), dtype=dtype, shape=list(shape))
        name = self.site.fresh(f"{self.node.name}/{op.lower()}")
        self.nodes.append(gs.Node(op=op, name=name, attrs=attrs, inputs=list(inputs), outputs=[out]))
        return out

    def reshape(self, tensor: gs.Tensor, shape, out: gs.Tensor | None = None) -> gs.Tensor:
        target_shape = self.const(np.array(shape, dtype=np.int64), "shape")
        return self.op("Reshape", [tensor, target_shape], shape, tensor.dtype, out)

    def discard(self) -> None:
        """Detach what was built so far: the rule declines after all."""
        for node in self.nodes:
            detach(node)

    def finish(self, *old: gs.Node, aliases=()) -> Replacement:
        return Replacement(old or (self.node,), tuple(self.nodes), tuple(aliases))


@dataclass(frozen=True)
class RewriteRule:
    """`build` yields candidate replacements for a node of one of `ops` and returns why it
    declines. An `always` rule fires even when the node is legal as it stands, because its
    result is what the NPU runs best. A `late` rule runs after fusion (passes/rewrite_late.py):
    its result would hide a pattern. A `fewer_cpu` rule's candidate may keep nodes that stay on
    the CPU, when they are fewer than the nodes breaking a rule that it replaces (the work no NPU
    kernel does, in fewer CPU steps: passes/rewrite.py)."""

    build: Callable[[gs.Node, "Site"], "Candidates"]
    ops: frozenset[str]
    always: bool = False
    late: bool = False
    fewer_cpu: bool = False

    @property
    def name(self) -> str:
        return self.build.__name__


def float_constant(tensor: gs.Tensor) -> np.ndarray | None:
    value = constant_value(tensor)
    if value is None or value.dtype.name not in FLOAT_DTYPES:
        return None
    return value


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def split_node(builder: Builder, tensor: gs.Tensor, axis: int, sizes: list[int]) -> list[gs.Tensor]:
    """A Split of `tensor` along `axis` into `sizes`; its split sizes are an input from opset 13."""
    shape = static_shape(tensor)
    outs = []
    for size in sizes:
        part = list(shape)
        part[axis] = size
        outs.append(gs.Variable(builder.site.fresh(f"{builder.node.name}/split_out"), tensor.dtype, part))
    split = np.array(sizes, dtype=np.int64)
    if builder.site.opset >= 13:
        inputs, attrs = [tensor, builder.const(split, "split")], {"axis": axis}
    else:
        inputs, attrs = [tensor], {"axis": axis, "split": split.tolist()}
    builder.nodes.append(gs.Node("Split", builder.site.fresh(f"{builder.node.name}/split"), attrs=attrs,
                                 inputs=inputs, outputs=outs))
    return outs


def scalar(builder: Builder, value: float, like: gs.Tensor) -> gs.Constant:
    """A 0-d operand in `like`'s dtype: it broadcasts to any shape without changing it (a [1]
    would make a 0-d result [1])."""
    return builder.const(np.array(value, dtype=dtype_name(like.dtype)))


def clip(builder: Builder, x: gs.Tensor, low: float, high: float, shape, out: gs.Tensor | None = None) -> gs.Tensor:
    """Clip's bounds are inputs from opset 11, attributes before."""
    if builder.site.opset >= 11:
        dtype = dtype_name(x.dtype)
        bounds = [builder.const(np.array(low, dtype=dtype), "min"), builder.const(np.array(high, dtype=dtype), "max")]
        return builder.op("Clip", [x, *bounds], shape, x.dtype, out)
    return builder.op("Clip", [x], shape, x.dtype, out, min=low, max=high)


def conv_1x1(builder: Builder, x4: gs.Tensor, weight: np.ndarray | gs.Constant, bias: np.ndarray | None,
              out_shape) -> gs.Tensor:
    """A 1x1 Conv of `x4` by `weight`: the [N, K] array, or a constant already [N, K, 1, 1]."""
    if not isinstance(weight, gs.Constant):
        weight = builder.const(weight[:, :, None, None], "weight")
    inputs = [x4, weight]
    if bias is not None:
        inputs.append(builder.const(bias, "bias"))
    return builder.op("Conv", inputs, out_shape, x4.dtype, kernel_shape=[1, 1])
