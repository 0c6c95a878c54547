"""Fuse: replace each chain the NPU runs as one kernel by one node, per the fusion table.

Roots are visited from the graph's outputs back to its inputs, so the longest chain ending at a
node is taken before a shorter one could split it (Conv -> Add -> Relu becomes ConvAddRelu, not
ConvAdd + Relu). A row of `fusion_table` applies at a root when:

- the target lists the row's oplist kernel;
- no member's result other than the root's is read outside the chain or is a graph output;
- every member passes its own constraints, with two exceptions, both because the member never
  runs as a kernel of its own. A member whose op the target has no kernel for (Erf in GELU,
  ReduceMean/Sqrt in LayerNorm) passes when it meets the target's common rules (static shapes,
  rank): the fused kernel computes it, so fusing is what brings it onto the NPU. And in a row
  that `absorbs` an exporter's spelling of one kernel (GELU, LayerNorm, attention, ...), every
  member is held to the common rules only; the row's predicates carry the kernel's own limits.
  In kernel fusions (Conv + Relu, ...) each member runs as itself, so any broken rule keeps the
  chain apart;
- the row's predicates hold;
- fusing creates no cycle: no member reaches another member through a node outside the chain.

The fused node keeps what an executor needs: `members` (the ops, in graph order), the row's
attributes (epsilon, scale, ...) and `body`, the members as a subgraph whose inputs are the
fused node's runtime inputs. When a row fits a root's shape but a check fails, the root gets a
note saying why it was not fused; the plan shows it on the step.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.ir import tensor as gs_tensor

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.dag import Dag, descendants
from rkcompile.ir.patterns import FUSED_DOMAIN, Match, matches
from rkcompile.ir.edits import detach, set_input
from rkcompile.ir.graph import dataflow_graph, is_onnx_domain, present_inputs, static_shape, topological_nodes, unique_name
from rkcompile.targets.model import Rule

from rkcompile.passes.fusion_table import TABLES, FusionRule

NAME = "fuse"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"failures", "graph", "original_nodes", "origins", "target"})
PROVIDES = frozenset({"failures", "graph", "notes", "origins"})

log = logging.getLogger("rkcompile")


def run(ctx: CompileContext) -> None:
    for table in TABLES:
        fuse_table(ctx, table)


def fuse_table(ctx: CompileContext, rules: tuple[FusionRule, ...]) -> None:
    # Everything below is built once per table and kept current fusion by fusion, so a pass
    # over a graph with thousands of fusions stays linear in its size.
    dag = dataflow_graph(ctx.graph)
    order = topological_nodes(ctx.graph)
    rank = {node.name: index for index, node in enumerate(order)}
    position = {id(node): index for index, node in enumerate(ctx.graph.nodes)}
    original_position = {name: index for index, (name, _) in enumerate(ctx.original_nodes)}
    replaced: dict[int, gs.Node | None] = {}  # id of a fused member -> the fused node at the root, or None
    # A rule needing an op no node of the graph has cannot fit anywhere (no match, no reason),
    # and is tried at no root. The nodes this table fuses do not count: roots are visited from
    # the outputs up and a pattern reaches up from its root, so a fused node is never a member
    # at a later root.
    present = {node.op for node in ctx.graph.nodes}
    root_ops = [(rule, rule.pattern.root_ops()) for rule in rules
                if all(not ops.isdisjoint(present) for ops in rule.pattern.required_ops())]
    for root in reversed(order):
        if id(root) in replaced:
            continue
        first_reason = None
        for rule, ops in root_ops:
            if ops is not None and root.op not in ops:
                continue  # the pattern cannot fit here: no match, no reason
            match, reason = find_fusion(ctx, rule, root, dag, rank)
            if match is not None:
                fused = apply_fusion(ctx, rule, match, position, original_position)
                log.debug("fused %s from %d nodes", fused.name, len(match.members))
                replaced.update((id(member), None) for member in match.members)
                replaced[id(root)] = fused
                position[id(fused)], rank[fused.name] = position[id(root)], rank[root.name]
                contract(dag, match.members, fused)
                break
            first_reason = first_reason or (reason and f"not fused as {rule.kernel}: {reason}")
        else:
            if first_reason:
                ctx.notes[root.name] = first_reason
    if replaced:
        ctx.graph.nodes = [replaced.get(id(node), node) for node in ctx.graph.nodes
                           if replaced.get(id(node), node) is not None]


def contract(dag: Dag, members: list[gs.Node], fused: gs.Node) -> None:
    """Make `dag` what dataflow_graph would build after `members` became `fused`."""
    names = {member.name for member in members}
    outside_in = {source for name in names for source in dag.predecessors(name)} - names
    outside_out = {sink for name in names for sink in dag.successors(name)} - names
    dag.remove_nodes_from(names)
    dag.add_node(fused.name)
    dag.add_edges_from((source, fused.name) for source in outside_in)
    dag.add_edges_from((fused.name, sink) for sink in outside_out)


def find_fusion(ctx: CompileContext, rule: FusionRule, root: gs.Node, dag: Dag,
                rank: dict[str, int] | None = None) -> tuple[Match | None, str | None]:
    """The first match of `rule` at `root` that passes every check, else the first reason a
    match failed (None when the pattern never fits or the target lacks the kernel)."""
    if not ctx.target.has_kernel(rule.requires):
        return None, None
    graph_outputs = {t.name for t in ctx.graph.outputs}
    reason = None
    for match in matches(rule.pattern, root):
        problem = (escaping_result(match, graph_outputs) or member_problem(ctx, rule, match)
                   or predicate_problem(rule, match) or cycle_problem(match, dag, rank))
        if problem is None:
            return match, None
        reason = reason or problem
    return None, reason


def escaping_result(match: Match, graph_outputs: set[str]) -> str | None:
    members = {id(node) for node in match.members}
    for node in match.members[1:]:
        for tensor in node.outputs:
            if tensor.name in graph_outputs:
                return f"{tensor.name} of {node.name} is a graph output"
            readers = [reader.name for reader in tensor.outputs if id(reader) not in members]
            if readers:
                return f"{tensor.name} of {node.name} is also read by {readers[0]}"
    return None


def member_problem(ctx: CompileContext, rule: FusionRule, match: Match) -> str | None:
    target = ctx.target
    for node in match.members:
        failures = ctx.failures.get(node.name, [])
        if not failures:
            continue
        if not rule.absorbs and is_onnx_domain(node) and node.op in target.ops:
            return f"member {node.name} breaks: {'; '.join(str(f) for f in failures)}"
        broken = [rule.describe() for rule in target.common_rules if not rule.evaluate(node, target)[0]]
        if broken:
            return f"member {node.name} breaks: {'; '.join(broken)}"
    return None


def predicate_problem(rule: FusionRule, match: Match) -> str | None:
    for predicate in rule.predicates:
        ok, detail = predicate(match)
        if not ok:
            text = Rule(predicate).describe().rstrip(".")
            return f"{text} (seen: {detail})" if detail else text
    return None


def cycle_problem(match: Match, dag: Dag, rank: dict[str, int] | None = None) -> str | None:
    """An outside node on a path from one member to another, which fusing would make a cycle.
    With `rank` (a topological index per node) the search stops at the last member's rank:
    no path back into the chain runs through a node ranked after all of it."""
    members = {node.name for node in match.members}
    outside_producers = {source for name in members for source in dag.predecessors(name)} - members
    if rank is None:
        reachable = set().union(*(descendants(dag, name) for name in members))
    else:
        last = max(rank[name] for name in members)
        reachable, frontier = set(), list(members)
        while frontier:
            for successor in dag.successors(frontier.pop()):
                if successor not in reachable and rank[successor] <= last:
                    reachable.add(successor)
                    frontier.append(successor)
    through = sorted(outside_producers & (reachable - members))
    return f"{through[0]} both reads a member and feeds one" if through else None


def apply_fusion(ctx: CompileContext, rule: FusionRule, match: Match, position: dict[int, int],
                 original_position: dict[str, int]) -> gs.Node:
    """The fused node, wired in place of the members; the caller puts it in the node list."""
    members = sorted(match.members, key=lambda node: position[id(node)])
    root = match.members[0]
    for label in rule.broadcasts:
        store_smallest(match, label)
    made_inside = {id(t) for node in members for t in node.outputs}
    inputs: list[gs.Tensor] = []
    for node in members:
        for tensor in present_inputs(node):
            if id(tensor) not in made_inside and all(tensor is not seen for seen in inputs):
                inputs.append(tensor)
    outputs = list(root.outputs)
    origins = sorted({o for node in members for o in ctx.origins.get(node.name, (node.name,))},
                     key=lambda name: original_position.get(name, len(original_position)))
    # every current node has an entry in origins; a rewrite may have split one original
    name = unique_name(f"{rule.kernel}:{origins[0]}", ctx.origins)
    attrs = {"members": [node.op for node in members], **rule.attributes(match),
             "body": body_graph(name, members, inputs, outputs, ctx.graph.opset)}
    for node in members:
        detach(node)
    fused = gs.Node(op=rule.kernel, name=name, domain=FUSED_DOMAIN, attrs=attrs, inputs=inputs, outputs=outputs)
    for node in members:
        ctx.origins.pop(node.name, None)
        ctx.failures.pop(node.name, None)
        ctx.notes.pop(node.name, None)
    ctx.origins[name] = tuple(origins)
    ctx.failures[name] = []
    return fused


def store_smallest(match: Match, label: str) -> None:
    """The constant `label` binds, which the fused kernel broadcasts along any axis, read by the
    members at its smallest shape: every axis along which all its values repeat kept at extent 1
    (a relative-position bias stored once per window of windowed attention, rank.py, is stored
    once). Exact: each member that reads it broadcasts it back to the shape it makes; a member
    it would no longer make its shape leaves it as it is."""
    tensor = match.tensors.get(label)
    if not isinstance(tensor, gs.Constant):
        return
    values = np.asarray(tensor.values)
    smallest = values
    for axis in range(values.ndim):
        first = np.take(smallest, [0], axis=axis)
        if smallest.shape[axis] > 1 and np.array_equal(smallest, np.broadcast_to(first, smallest.shape)):
            smallest = first
    readers = [node for node in match.members if any(t is tensor for t in node.inputs)]
    if smallest.shape == values.shape or any(
            np.broadcast_shapes(*(smallest.shape if t is tensor else tuple(static_shape(t)) for t in present_inputs(node)))
            != tuple(static_shape(node.outputs[0])) for node in readers):
        return
    replacement = gs.Constant(f"{match.members[0].name}/{label}", np.ascontiguousarray(smallest))
    for node in readers:
        for index in [i for i, t in enumerate(node.inputs) if t is tensor]:
            set_input(node, index, replacement)


def body_graph(name: str, members: list[gs.Node], inputs: list[gs.Tensor], outputs: list[gs.Tensor],
               opset: int) -> gs.Graph:
    """The members as a standalone subgraph over copies of their tensors, so the main graph's
    tensors keep only main-graph producers and consumers. Constants are copied in; the graph
    inputs are the fused node's runtime inputs."""
    copies: dict[str, gs.Tensor] = {}

    def copy(tensor: gs.Tensor) -> gs.Tensor:
        if not tensor.name:
            return gs.Variable.empty()
        if tensor.name not in copies:
            copies[tensor.name] = (gs.Constant(tensor.name, _shared_values(tensor)) if isinstance(tensor, gs.Constant)
                                   else gs.Variable(tensor.name, dtype=tensor.dtype, shape=tensor.shape))
        return copies[tensor.name]

    nodes = [gs.Node(op=node.op, name=node.name, domain=node.domain, attrs=dict(node.attrs),
                     inputs=[copy(t) for t in node.inputs], outputs=[copy(t) for t in node.outputs])
             for node in members]
    return gs.Graph(nodes=nodes, inputs=[copies[t.name] for t in inputs if not isinstance(t, gs.Constant)],
                    outputs=[copies[t.name] for t in outputs if t.name], name=name, opset=opset)


def _shared_values(constant: gs.Constant):
    """What a copy of `constant` holds: its array once something has read it, else one loader
    the constant and its copy share, so the weight is read when something needs it, not here
    (a float16 plan reads no Conv weight after fusion; copying each fused one into its body read
    every one of them), and whichever of the two reads first, both hold the same array, as a
    copy of the array itself would."""
    values = constant._values  # onnx-graphsurgeon's holder: an array, or LazyValues not read yet
    if type(values) is gs_tensor.LazyValues:
        values = constant._values = _SharedLoad(values)
    return values


class _SharedLoad(gs_tensor.LazyValues):
    """onnx-graphsurgeon's lazy values of one weight, read at most once for every constant
    holding them. Until read, exporting the constant writes its original TensorProto, as gs
    does; once read, the array (which a pass may have changed), as gs does for an array."""

    def __init__(self, lazy: gs_tensor.LazyValues):
        self._original, self.shape, self.dtype, self.nbytes = lazy.tensor, lazy.shape, lazy.dtype, lazy.nbytes
        self._array = None

    @property
    def tensor(self):
        return self._original if self._array is None else numpy_helper.from_array(self._array, self._original.name)

    def load(self):
        if self._array is None:
            self._array = super().load()
        return self._array
