"""The simplify-layout pass's driver and the vocabulary its rule families share: `Simplifier`
runs the rules over a graph until none applies and keeps the compile context's records (origins,
failures, fates, rewrites, the rules' attempts) current as a rule replaces, adds or drops nodes;
`layout_move` reads what a relabel or Transpose does, and `layout_node` makes one."""
from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext, Failure, RewriteAttempt
from rkcompile.ir.graph import is_onnx_domain, static_shape, topological_nodes, unique_name
from rkcompile.ir.nodes import itemsize
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_bytes, stored_positions
from rkcompile.plan.schema import FUSED_DOMAIN, Rewrite

from rkcompile.passes.legalize import check_node, compile_facts
from rkcompile.passes.rewrites.base import RESHAPE_LIKE


#: ONNX ops whose every output element is computed from the elements at the same position of
#: their operands (after broadcasting), whatever the shape: they commute with any relabel or
#: Transpose applied to every operand alike.
ELEMENTWISE_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Cos", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu",
    "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "Max", "Min", "Mish", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu",
    "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Sub", "Tanh", "Where", "Xor",
})
LAYOUT_OPS = RESHAPE_LIKE | {"Transpose"}
#: what the plan says of an original node a rule took out, with nothing left carrying it
REMOVED_BECAUSE = {
    "identity_layout": "it moves no element",
    "move_layout_down": "its move is made, or undone, by the relabel or Transpose after it",
    "transpose_with_unit_relabel": "one Transpose makes its move and the relabel's of unit axes",
    "transposes_across_relabel": "one Transpose makes its move and the other Transpose's, across the relabel between them",
    "move_relabel_up": "the relabel is made once, on the operands of the element-wise op it was next to",
    "slices_as_split": "one Split cuts the tensor it sliced",
    "relabels_above_split": "one relabel before the Split makes its relabel and that of the Split's outputs",
    "attention_operands": "the attention kernel reads or writes its operand in that layout",
    "matmul_operands": "the matrix multiply reads or writes its operand in that layout",
    "shared_layout": "another node lays out the same tensor the same way",
    "moves_as_gather": "one Gather makes the moves of the run of layout ops it was in",
}


# --- what a layout op does ------------------------------------------------------------------


def layout_move(node: gs.Node) -> tuple[gs.Tensor, gs.Tensor, tuple[int, ...] | None] | None:
    """(source, result, perm) of a relabel (perm None) or Transpose of known shapes, else None."""
    if not is_onnx_domain(node) or node.op not in LAYOUT_OPS or not node.inputs or len(node.outputs) != 1:
        return None
    source, result = node.inputs[0], node.outputs[0]
    shape = static_shape(source)
    if shape is None or static_shape(result) is None:
        return None
    if node.op != "Transpose":
        return source, result, None
    return source, result, tuple(int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1)))


def layout_node(source: gs.Tensor, result: gs.Tensor, perm, base: str, fresh, new_node=gs.Node) -> gs.Node:
    """A Transpose by `perm` (a Reshape when None) of `source` into `result`, named after `base`."""
    if perm is None:
        shape = gs.Constant(fresh(f"{base}/shape"), np.array(static_shape(result), dtype=np.int64))
        return new_node(op="Reshape", name=fresh(f"{base}/moved"), inputs=[source, shape], outputs=[result])
    return new_node(op="Transpose", name=fresh(f"{base}/moved"), attrs={"perm": list(perm)}, inputs=[source],
                    outputs=[result])


@functools.lru_cache(maxsize=256)
def _stored_in_blocks(shape: tuple[int, ...], c2: int) -> np.ndarray:
    """stored_positions of `shape` in NC1HWC2, flat and read-only: a model's layout runs ask
    about the same few shapes many times (moves_as_gather traces each run's every split into
    views: timm_mvitv2_tiny asked 1,509 times, 2.2 s of its 10.5 s plan, uncached)."""
    stored = stored_positions(shape, "NC1HWC2", c2).reshape(-1)
    stored.flags.writeable = False
    return stored


# --- one run of the rules ---------------------------------------------------------------------


class Simplifier:
    """One run of the rules over a graph, with the records a replacement keeps current."""

    def __init__(self, ctx: CompileContext, fused: bool, rules: tuple):
        self.ctx, self.facts, self.rules = ctx, compile_facts(ctx), rules
        #: after fusion: the fuse pass's notes name nodes, which a removed node takes with it
        self.fused = fused
        self.graph_outputs = {t.name for t in ctx.graph.outputs}
        self.carriers = Counter(o for names in ctx.origins.values() for o in names)
        self.declined: dict[str, dict[str, str]] = {}  # layout node -> {rule: why} when each last declined
        self.taken = {n.name for n in ctx.graph.nodes} | set(ctx.graph.tensors())
        #: the nodes the rules took out of the graph, by id; held, so no new node takes an id of theirs
        self.removed: dict[int, gs.Node] = {}

    def run(self) -> bool:
        """Apply the rules to every node until none applies; whether any did."""
        progress, rounds = True, 0
        while progress:
            progress = False
            for node in topological_nodes(self.ctx.graph):
                if id(node) in self.removed:
                    continue  # replaced earlier in this round; its replacements wait for the next
                for rule in self.rules:
                    outcome = rule(node, self)
                    if outcome is True:
                        progress = True
                        break
                    if outcome is not None:
                        self.declined.setdefault(node.name, {})[rule.__name__] = outcome
            rounds += 1
        for name, reasons in self.declined.items():
            for rule, why in reasons.items():
                self.record_attempt(name, rule, f"declined: {why}")
        if rounds > 1:
            self.ctx.graph.nodes = [n for n in self.ctx.graph.nodes if id(n) not in self.removed]
        return rounds > 1

    # bookkeeping shared by the rules

    def fresh(self, base: str) -> str:
        name = unique_name(base, self.taken)
        self.taken.add(name)
        return name

    def failures(self, node: gs.Node) -> list[Failure]:
        if node.domain == FUSED_DOMAIN:  # only the common rules apply: the fusion checked the rest
            return [Failure(rule.describe(), detail) for rule in self.ctx.target.common_rules
                    for ok, detail in [rule.evaluate(node, self.ctx.target, **self.facts)] if not ok]
        return check_node(node, self.ctx.target, **self.facts)

    def stored_bytes(self, shape) -> float:
        """The bytes an NPU tensor of `shape` takes in NC1HWC2 (infinite above rank 4)."""
        if len(shape) > 4:
            return float("inf")
        dtype = self.ctx.options.dtype
        return nc1hwc2_bytes(as_nchw(tuple(shape)), self.ctx.target.c2_for(dtype), itemsize(dtype))

    def stores_alike(self, shape: tuple[int, ...], relabelled: tuple[int, ...],
                     elements: np.ndarray | None = None) -> bool:
        """Whether a relabel of `shape` to `relabelled` (or the move placing, at each element of
        `relabelled` in row-major order, the element `elements` numbers of `shape`) leaves each
        element where the NPU stores it (NC1HWC2, as numerics.nc1hwc2.stored_positions places
        it): a relabel the alias pass makes a view, no step."""
        if len(shape) > 4 or len(relabelled) > 4:
            return False
        c2 = self.ctx.target.c2_for(self.ctx.options.dtype)
        stored = _stored_in_blocks(tuple(shape), c2)
        return np.array_equal(stored if elements is None else stored[elements],
                              _stored_in_blocks(tuple(relabelled), c2))

    def record_attempt(self, name: str, rule: str, outcome: str) -> None:
        for original in self.ctx.origins.get(name, (name,)):
            self.ctx.rewrite_attempts.setdefault(original, []).append(RewriteAttempt(name, rule, outcome))

    def replace(self, rule: str, old: list[gs.Node], new: list[gs.Node]) -> None:
        """`old` (detached already) leave the graph for `new` (placed where the first of `old`
        stood), which carry the origins of the old."""
        ctx = self.ctx
        origins = tuple(dict.fromkeys(o for n in old for o in ctx.origins.get(n.name, (n.name,))))
        for node in old:
            self.removed[id(node)] = node
            self.carriers.subtract(ctx.origins.pop(node.name, (node.name,)))
            self.forget(node.name)
        for node in new:
            ctx.origins[node.name] = origins
            ctx.failures[node.name] = self.failures(node)
            self.carriers.update(origins)
        self.release(origins, rule)
        position = next(i for i, n in enumerate(ctx.graph.nodes) if n is old[0])
        ctx.graph.nodes[position:position] = new
        ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=tuple(n.name for n in new),
                                    ops=tuple(n.op for n in new)))
        for name in {n.name for n in new} | {n.name for n in old}:
            self.declined.pop(name, None)
        for node in new:
            self.record_attempt(node.name, rule, "applied")

    def add(self, rule: str, node: gs.Node, origins: tuple[str, ...]) -> None:
        """`node`, made and linked by `rule`, joins the graph carrying `origins`."""
        ctx = self.ctx
        ctx.origins[node.name] = origins
        ctx.failures[node.name] = self.failures(node)
        self.carriers.update(origins)
        ctx.graph.nodes.append(node)
        ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=(node.name,), ops=(node.op,)))
        self.record_attempt(node.name, rule, "applied")

    def forget(self, name: str) -> None:
        """The records that name a node leaving the graph."""
        self.ctx.failures.pop(name, None)
        if self.fused:
            self.ctx.notes.pop(name, None)

    def release(self, origins, rule: str) -> None:
        for original in origins:
            if self.carriers[original] <= 0:
                self.ctx.fates[original] = ("removed", f"{REMOVED_BECAUSE[rule]} ({rule})")

    def drop(self, node: gs.Node, rule: str) -> None:
        """`node` (detached already) leaves the graph; what it stood for, if nothing else
        carries it, was removed."""
        self.removed[id(node)] = node
        self.declined.pop(node.name, None)
        origins = self.ctx.origins.pop(node.name, (node.name,))
        self.carriers.subtract(origins)
        self.forget(node.name)
        self.release(origins, rule)
        self.ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=(), ops=()))

    def passes_as_before(self, old: gs.Node, probe: gs.Node) -> str | None:
        """Why `probe`, standing for `old`, is worse on the target: it breaks a rule while `old`
        broke none."""
        failures = self.failures(probe)
        if failures and not self.failures(old):
            return f"{old.name} would break: {failures[0]}"
        return None
