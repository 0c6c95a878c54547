"""Rewrite: replace nodes the NPU cannot run with equivalent nodes it can (rewrite_rules.RULES).

A rule fires on a node that breaks a target rule, or on any node when the rule is marked
`always` (its result is what the NPU runs best). A candidate replacement is kept only when every
new node passes every rule of the target (legalize.check_node); otherwise the node stays as it
is and legalize reports why. New nodes carry the origins of the nodes they replace, so each
original node still has one plan entry; its entry's step is the last step that carries it,
the one that produces its outputs. Every applied rewrite is recorded in `ctx.rewrites`.

Rules only ever replace a node by legal nodes, shrink relabel chains, or turn an op into one no
rule matches while legal, so the worklist drains.

Rules marked `late` would hide a fusion pattern (a broadcast repeated by Concat inside a
decomposed LayerNorm, say); `rewrite_late` runs them after fusion, on what is still illegal.
"""
from __future__ import annotations

import logging
from collections import Counter, deque

import onnx_graphsurgeon as gs

from rkcompile.context import CompileContext
from rkcompile.ir import topological_nodes
from rkcompile.plan import Rewrite

from .legalize import check_node, compile_facts
from .rewrite_rules import RESHAPE_LIKE, RULES, Replacement, RewriteRule, Site

NAME = "rewrite"
log = logging.getLogger("rkcompile")


def run(ctx: CompileContext) -> None:
    rewrite_graph(ctx, late=False)


def rewrite_graph(ctx: CompileContext, late: bool) -> None:
    site = Site(ctx.graph, ctx.target, ctx.model_info.opset, compile_facts(ctx))
    edits = _Edits(ctx)
    worklist = deque(topological_nodes(ctx.graph))
    while worklist:
        node = worklist.popleft()
        if id(node) not in edits.alive:
            continue
        applied = rewrite_node(node, site, ctx, edits, late)
        if applied is not None:
            # A new node's readers may have become rewritable (a relabel now follows a relabel).
            touched = [t for n in applied.new for t in n.outputs] + [new for _, new in applied.aliases]
            worklist.extend(applied.new)
            worklist.extend(reader for tensor in touched for reader in tensor.outputs)
            worklist.extend(edits.unread_relabels())
    ctx.graph.nodes = edits.node_list(ctx.graph.nodes)


class _Edits:
    """Bookkeeping that keeps each rewrite O(size of the rewrite) on graphs of many thousand
    nodes: the node list is rebuilt once at the end (new nodes where the first node they replace
    stood), and each original node's number of carriers is counted instead of searched."""

    def __init__(self, ctx: CompileContext):
        self.alive = {id(node) for node in ctx.graph.nodes}
        # id(replaced node) -> (that node, its replacements); holding the node keeps its id
        # from being reused by a node created later.
        self.spliced: dict[int, tuple[gs.Node, tuple[gs.Node, ...]]] = {}
        self.carriers = Counter(o for names in ctx.origins.values() for o in names)
        # Producers of what replaced nodes read: a relabel among them may have lost its last reader.
        self.bypassed: list[gs.Node] = []

    def unread_relabels(self) -> list[gs.Node]:
        found = [node for node in self.bypassed if node.op in RESHAPE_LIKE and id(node) in self.alive
                 and not any(t.outputs for t in node.outputs)]
        self.bypassed.clear()
        return found

    def node_list(self, nodes) -> list[gs.Node]:
        result = []
        for node in nodes:
            if id(node) in self.spliced:
                result.extend(self.node_list(self.spliced[id(node)][1]))
            elif id(node) in self.alive:
                result.append(node)
        return result


def rewrite_node(node: gs.Node, site: Site, ctx: CompileContext, edits: _Edits,
                 late: bool = False) -> Replacement | None:
    """Apply the first rule whose candidate is legal on the target; None when none is."""
    rules = [rule for rule in RULES if node.op in rule.ops and rule.late == late]
    if not rules:
        return None
    illegal = bool(check_node(node, ctx.target, **site.facts))
    for rule in rules:
        if not (illegal or rule.always):
            continue
        for candidate in rule.build(node, site):
            if all(not check_node(new, ctx.target, **site.facts) for new in candidate.new):
                apply(candidate, rule, ctx, edits)
                return candidate
            candidate.discard()
    return None


def apply(replacement: Replacement, rule: RewriteRule, ctx: CompileContext, edits: _Edits) -> None:
    origins = tuple(dict.fromkeys(o for node in replacement.old for o in ctx.origins.get(node.name, (node.name,))))
    edits.spliced[id(replacement.old[0])] = (replacement.old[0], replacement.new)
    edits.bypassed.extend(producer for node in replacement.old for t in node.inputs for producer in t.inputs)
    for node in replacement.old:
        node.inputs.clear()
        node.outputs.clear()
        edits.alive.discard(id(node))
        edits.carriers.subtract(ctx.origins.get(node.name, (node.name,)))
        for record in (ctx.origins, ctx.failures, ctx.placement):
            record.pop(node.name, None)
    for old, new in replacement.aliases:
        for reader in list(old.outputs):
            for index, tensor in enumerate(reader.inputs):
                if tensor is old:
                    reader.inputs[index] = new
    for node in replacement.new:
        ctx.origins[node.name] = origins
        ctx.failures[node.name] = []  # every new node passed check_node
        edits.alive.add(id(node))
        edits.carriers.update(origins)
    for original in origins:
        if edits.carriers[original] <= 0:
            ctx.fates[original] = ("removed", f"relabel only, its readers read its input ({rule.name})")
    ctx.rewrites.append(Rewrite(rule=rule.name, nodes=origins, into=tuple(n.name for n in replacement.new),
                                ops=tuple(n.op for n in replacement.new)))
    log.debug("rewrite %s: %s -> %s", rule.name, ", ".join(origins),
              ", ".join(n.op for n in replacement.new) or "nothing")
