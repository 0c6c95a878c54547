"""Rewrite: replace nodes the NPU cannot run with equivalent nodes it can (passes/rewrites/).

A rule fires on a node that breaks a target rule, or on any node when the rule is marked
`always` (its result is what the NPU runs best). A candidate replacement is kept only when every
new node passes every rule of the target (legalize.check_node). A new node that breaks a rule is
rewritten again, by the rules of its own op, inside the candidate: ReduceMean becomes a global
pool, and a global pool over the window limit becomes staged pools. Such chains are at most
MAX_CHAIN_RULES rules long and never use one rule twice, so they end and cannot cycle. When no
candidate can be made legal the node stays as it is and legalize reports why. A rule marked
`fewer_cpu` is the one exception: its candidate may keep nodes no rule makes legal when they are
fewer than the nodes breaking a rule that it replaces (CPU work the NPU cannot take, done in
fewer CPU steps).

New nodes carry the origins of the nodes they replace, so each original node still has one plan
entry; its entry's step is the last step that carries it, the one that produces its outputs.
Every applied rewrite is recorded in `ctx.rewrites`, and every rule tried on a node, with why it
declined, in `ctx.rewrite_attempts` (`plan --explain` shows them).

Rules only ever replace a node by legal nodes, shrink relabel chains, or turn an op into one no
rule matches while legal, so the worklist drains.

Rules marked `late` would hide a fusion pattern (a broadcast repeated by Concat inside a
decomposed LayerNorm, say); `rewrite_late` runs them after fusion, on what is still illegal.
"""
from __future__ import annotations

import logging
from collections import Counter, deque

import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext, Failure, RewriteAttempt
from rkcompile.ir.edits import detach, replace_uses
from rkcompile.ir.graph import topological_nodes
from rkcompile.plan.schema import Rewrite
from rkcompile.targets.model import Target

from rkcompile.passes.integer_results import rounded_to_integers
from rkcompile.passes.legalize import Verdict, compile_facts, evaluate_rules
from rkcompile.passes.rewrites import RESHAPE_LIKE, RULES, Replacement, RewriteRule, Site

NAME = "rewrite"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "model_info", "options", "origins", "target"})
PROVIDES = frozenset({"failures", "fates", "graph", "origins", "rewrite_attempts", "rewrites", "rule_verdicts"})

log = logging.getLogger("rkcompile")

#: Longest chain of rules one node's replacement may take (the rule on the graph node included).
MAX_CHAIN_RULES = 3
#: Most rewrites applied to the nodes standing for one original node. Rules are written to make
#: progress, but two rules that each undo the other would otherwise grow the graph without end;
#: at this bound the node stays as it is, with the reason in `plan --explain`.
MAX_REWRITES_PER_ORIGINAL = 64


def run(ctx: CompileContext) -> None:
    # legalize, next, checks every node again: most of them unchanged since this pass checked them
    ctx.rule_verdicts = rewrite_graph(ctx, late=False)


def rewrite_graph(ctx: CompileContext, late: bool) -> "_Verdicts":
    """Rewrite the graph's nodes; the verdicts of the target's rules on the nodes checked."""
    site = Site(ctx.graph, ctx.target, ctx.model_info.opset, compile_facts(ctx), rounded_to_integers(ctx.graph))
    edits = _Edits(ctx, late, _Verdicts(site))
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
    return edits.verdicts


class _Edits:
    """Bookkeeping that keeps each rewrite O(size of the rewrite) on graphs of many thousand
    nodes: the node list is rebuilt once at the end (new nodes where the first node they replace
    stood), and each original node's number of carriers is counted instead of searched."""

    def __init__(self, ctx: CompileContext, late: bool, verdicts: "_Verdicts"):
        self.alive = {id(node) for node in ctx.graph.nodes}
        self.verdicts = verdicts
        # The rules of this run by op, in RULES' order: looked up for every node of the worklist.
        self.rules_by_op: dict[str, list[RewriteRule]] = {}
        for rule in RULES:
            if rule.late == late:
                for op in rule.ops:
                    self.rules_by_op.setdefault(op, []).append(rule)
        # id(replaced node) -> (that node, its replacements); holding the node keeps its id
        # from being reused by a node created later.
        self.spliced: dict[int, tuple[gs.Node, tuple[gs.Node, ...]]] = {}
        self.carriers = Counter(o for names in ctx.origins.values() for o in names)
        self.rewrites_of: Counter[str] = Counter()  # original node -> rewrites applied to its carriers
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
    """Apply the first rule whose candidate is, or can be made, legal on the target; None when none is."""
    rules = edits.rules_by_op.get(node.op)
    if not rules:
        return None
    origins = ctx.origins.get(node.name, (node.name,))
    if any(edits.rewrites_of[o] >= MAX_REWRITES_PER_ORIGINAL for o in origins):
        log.warning("rewrite: %s keeps being rewritten; stopped at %d rewrites", node.name, MAX_REWRITES_PER_ORIGINAL)
        _record_attempts(ctx, node, [RewriteAttempt(node.name, "(any)", (
            f"not tried: the nodes it stands for were rewritten {MAX_REWRITES_PER_ORIGINAL} times already, the "
            "bound that stops rules undoing each other"))])
        return None
    if node.name in site.pinned:  # no rule may change what its float32 arithmetic computes
        if not late:
            _record_attempts(ctx, node, [RewriteAttempt(node.name, "(any)", (
                f"not tried: an integer is {site.pinned[node.name]}, so it runs on the CPU as written"))])
        return None
    illegal = bool(edits.verdicts.failures(node))
    attempts = []
    for rule in rules:
        if not (illegal or rule.always):
            continue
        legal, outcome = _first_legal_candidate(node, rule, site, edits.verdicts, (rule.name,), owned=None,
                                                fewer_cpu=rule.fewer_cpu)
        if legal is not None:
            chain, replacement = legal
            kept = rule.fewer_cpu and sum(1 for new in replacement.new if edits.verdicts.failures(new))
            attempts.append(RewriteAttempt(node.name, rule.name, "applied" + _via(chain) + (
                f" ({kept} node(s) still for the CPU, in place of more)" if kept else "")))
            _record_attempts(ctx, node, attempts)
            apply(replacement, " > ".join(chain), ctx, edits)
            return replacement
        attempts.append(RewriteAttempt(node.name, rule.name, outcome))
    _record_attempts(ctx, node, attempts)
    return None


class _Verdicts:
    """`evaluate_rules`' verdicts for the nodes one rewrite run asks about, each computed once per
    state of what a target rule reads: the node's op, domain and attribute dict, and its input
    and output tensors (which ones, constant or not, shape, dtype). A node is asked about when
    its candidate is built, when it is applied and when the worklist reaches it, and a graph
    node again whenever a neighbour changes (11,000 checks of 4,000 nodes on a MaxViT).
    Rules read nothing else (targets/constraints.py), and nothing in the pass changes an
    attribute dict or a constant in place. Each entry holds the objects its key names by id, so
    no id is reused for another object while the entry stands. Legalize, the next pass, asks
    again about the nodes left (`ctx.rule_verdicts`)."""

    def __init__(self, site: Site):
        self.target, self.facts = site.target, site.facts
        self.known: dict[tuple, tuple[tuple, list[Verdict], list[Failure]]] = {}

    def _entry(self, node: gs.Node) -> tuple[tuple, list[Verdict], list[Failure]]:
        # One flat key, built in one comprehension: asked thousands of times a pass, mostly of
        # nodes checked before (a hit costs the key alone).
        inputs = node.inputs
        key = (id(node), id(node.attrs), node.name, node.op, node.domain, len(inputs),
               *[(id(t), type(t), None if t.shape is None else tuple(t.shape), t.dtype) for t in (*inputs, *node.outputs)])
        entry = self.known.get(key)
        if entry is None:
            verdicts = evaluate_rules(node, self.target, **self.facts)
            failures = [Failure(verdict.rule, verdict.detail) for verdict in verdicts if not verdict.ok]
            entry = self.known[key] = ((node, node.attrs, *inputs, *node.outputs), verdicts, failures)
        return entry

    def failures(self, node: gs.Node) -> list[Failure]:
        """`check_node(node, target, **facts)`."""
        return list(self._entry(node)[2])

    def verdicts(self, node: gs.Node, target: Target, facts: dict[str, object]) -> list[Verdict]:
        """`evaluate_rules(node, target, **facts)`, remembered when `target` and `facts` are this
        run's."""
        if target is not self.target or facts != self.facts:
            return evaluate_rules(node, target, **facts)
        return list(self._entry(node)[1])


def _via(chain: tuple[str, ...]) -> str:
    return f" (then {', '.join(chain[1:])})" if len(chain) > 1 else ""


def _first_legal_candidate(node: gs.Node, rule: RewriteRule, site: Site, verdicts: "_Verdicts",
                           chain: tuple[str, ...], owned: set[int] | None,
                           fewer_cpu: bool = False) -> tuple[tuple[tuple[str, ...], Replacement] | None, str]:
    """The first candidate of `rule` on `node` that is legal as built, else the first that is legal
    once its illegal nodes are rewritten in turn, with the chain of rules used; else None and why
    not. The rule's own alternatives are preferred to refining one of them. With `fewer_cpu`, a
    refined candidate may keep illegal nodes, fewer than the illegal nodes it replaces.

    `owned` holds the nodes of the enclosing candidate when `node` is one of them: a nested
    candidate may replace only those, never a graph node the enclosing rule did not claim.
    """
    problems: list[str] = []
    for refine in (False, True):
        started, taken, yielded = len(site.builders), site.names_taken, False
        candidates = rule.build(node, site)
        while True:
            try:
                candidate = next(candidates)
                yielded = True
            except StopIteration as declined:
                if not refine:
                    reason = declined.value
                # A rule may decline after building part of a candidate, wired to graph tensors:
                # detached here, whatever the rule, so no pass meets a node outside the graph.
                for builder in site.builders[started:]:
                    builder.discard()
                del site.builders[started:]
                break
            if owned is not None and (candidate.aliases or any(id(old) not in owned for old in candidate.old)):
                candidate.discard()
                problems.append("its candidate reaches outside the rewrite it would refine")
                continue
            pinned = next((old.name for old in candidate.old if old.name in site.pinned), None)
            if pinned is not None:
                candidate.discard()
                problems.append(f"its candidate would replace {pinned}, whose result an integer is "
                                f"{site.pinned[pinned]}")
                continue
            budget = _cpu_budget(candidate, verdicts) if fewer_cpu and refine else 0
            legal, chain_used, problem = _made_legal(candidate, site, verdicts, chain, refine, budget)
            if legal is not None:
                candidates.close()
                del site.builders[started:]
                return (chain_used, legal), ""
            candidate.discard()
            if refine:
                problems.append(problem)
        if not yielded and site.names_taken == taken:
            # It declined before naming anything: on the same graph, the refining pass would
            # decline the same way, and take no name a later rewrite could have had (a fifth
            # of the rule runs on tv_ssdlite320, most nodes declined by every rule of their op).
            break
    if not problems:
        return None, f"declined: {reason or 'the node is not of the form it rewrites'}"
    return None, "; ".join(dict.fromkeys(problems))


def _cpu_budget(candidate: Replacement, verdicts: "_Verdicts") -> int:
    """How many illegal nodes a `fewer_cpu` candidate may keep: fewer than the illegal nodes it
    replaces."""
    return max(0, sum(1 for old in candidate.old if verdicts.failures(old)) - 1)


def _made_legal(candidate: Replacement, site: Site, verdicts: "_Verdicts", chain: tuple[str, ...],
                refine: bool, budget: int = 0) -> tuple[Replacement | None, tuple[str, ...], str]:
    """`candidate` with each new node that breaks a rule replaced by a legal rewrite of it (only
    when `refine`), the rules used; or None and the first node no rule makes legal. Up to
    `budget` such nodes are kept as they are instead.

    `chain` is the path of rules that built `candidate`: a node's rewrite may not repeat one of
    them (no cycle) or make the path longer than MAX_CHAIN_RULES, while sibling nodes of one
    candidate may each use the same rule (three Gathers, each as a Slice)."""
    nodes = list(candidate.new)
    used = chain
    for node in candidate.new:
        if _position(nodes, node) is None:
            continue  # replaced along with an earlier node by that node's rewrite
        failures = verdicts.failures(node)
        if not failures:
            continue
        rewrite = None
        if refine and len(chain) < MAX_CHAIN_RULES:
            owned = {id(n) for n in nodes}
            for rule in RULES:
                if node.op not in rule.ops or rule.name in chain or rule.late:
                    continue
                rewrite, _ = _first_legal_candidate(node, rule, site, verdicts, chain + (rule.name,), owned)
                if rewrite is not None:
                    break
        if rewrite is None and budget > 0:
            budget -= 1
            continue
        if rewrite is None:
            for built in nodes:
                detach(built)
            return None, chain, f"its {node.op} would break: {failures[0]}"
        path, inner = rewrite
        used += tuple(name for name in path if name not in used)
        first = min(_position(nodes, old) for old in inner.old)
        for old in inner.old:
            del nodes[_position(nodes, old)]
            detach(old)
        nodes[first:first] = inner.new
    return Replacement(candidate.old, tuple(nodes), candidate.aliases), used, ""


def _position(nodes: list[gs.Node], node: gs.Node) -> int | None:
    """Where `node` itself is in `nodes`: by identity, as onnx-graphsurgeon's Node.__eq__
    compares attributes, inputs and outputs (half a second of a large transformer's rewrites)."""
    return next((index for index, other in enumerate(nodes) if other is node), None)


def _record_attempts(ctx: CompileContext, node: gs.Node, attempts: list[RewriteAttempt]) -> None:
    for original in ctx.origins.get(node.name, (node.name,)):
        ctx.rewrite_attempts.setdefault(original, []).extend(attempts)


def _origins_of_new(replacement: Replacement, ctx: CompileContext, verdicts: "_Verdicts",
                    kept: list[gs.Node]) -> dict[int, tuple[str, ...]]:
    """The original nodes each new node stands for: all the replaced ones, except that a node a
    fewer_cpu rule kept for the CPU stands for one replaced node that broke a rule (the one
    writing the same tensor, else one of its op, else the first), and the other new nodes for
    the rest. So an original whose work stays on the CPU is still reported there, and one whose
    work the NPU now does, or no one does, is not. `kept` are the new nodes that break a rule."""
    def origins_of(nodes) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o for node in nodes for o in ctx.origins.get(node.name, (node.name,))))

    if not kept:
        everything = origins_of(replacement.old)
        return {id(n): everything for n in replacement.new}
    # a fewer_cpu candidate keeps fewer illegal nodes than it replaces, so a partner is left for each
    unpaired = [old for old in replacement.old if verdicts.failures(old)]
    partners = {}
    for node in kept:
        writes = {t.name for t in node.outputs}
        partner = next((old for old in unpaired if writes & {t.name for t in old.outputs}), None) or next(
            (old for old in unpaired if old.op == node.op), unpaired[0])
        unpaired.remove(partner)
        partners[id(node)] = partner
    taken = {id(old) for old in partners.values()}
    rest = origins_of([old for old in replacement.old if id(old) not in taken])
    return {id(n): origins_of([partners[id(n)]]) if id(n) in partners else rest for n in replacement.new}


def apply(replacement: Replacement, rule: str, ctx: CompileContext, edits: _Edits) -> None:
    origins = tuple(dict.fromkeys(o for node in replacement.old for o in ctx.origins.get(node.name, (node.name,))))
    # [] but for what a fewer_cpu rule kept; legalize records every node's failures again
    failures = {id(node): edits.verdicts.failures(node) for node in replacement.new}
    new_origins = _origins_of_new(replacement, ctx, edits.verdicts, [n for n in replacement.new if failures[id(n)]])
    edits.spliced[id(replacement.old[0])] = (replacement.old[0], replacement.new)
    edits.rewrites_of.update(origins)
    edits.bypassed.extend(producer for node in replacement.old for t in node.inputs for producer in t.inputs)
    for node in replacement.old:
        detach(node)
        edits.alive.discard(id(node))
        edits.carriers.subtract(ctx.origins.get(node.name, (node.name,)))
        for record in (ctx.origins, ctx.failures):  # no placement yet: assign comes later
            record.pop(node.name, None)
    for old, new in replacement.aliases:
        replace_uses(old, new)
    for node in replacement.new:
        ctx.origins[node.name] = new_origins[id(node)]
        ctx.failures[node.name] = failures[id(node)]
        edits.alive.add(id(node))
        edits.carriers.update(new_origins[id(node)])
    for original in origins:
        if edits.carriers[original] <= 0:
            ctx.fates[original] = ("removed", f"relabel only, its readers read its input ({rule})")
    ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=tuple(n.name for n in replacement.new),
                                ops=tuple(n.op for n in replacement.new)))
    log.debug("rewrite %s: %s -> %s", rule, ", ".join(origins),
              ", ".join(n.op for n in replacement.new) or "nothing")
