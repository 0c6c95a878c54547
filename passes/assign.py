"""Assign: put each node on the NPU, or on the CPU with a reason naming the op and the target."""
from __future__ import annotations

from rkcompile.context import CompileContext, Placement

NAME = "assign"


def run(ctx: CompileContext) -> None:
    placement = {}
    for node in ctx.graph.nodes:
        failures = ctx.failures.get(node.name, [])
        if failures:
            reasons = "; ".join(str(f) for f in failures)
            placement[node.name] = Placement("cpu", node.op, f"{node.op} on {ctx.target.name}: {reasons}")
        else:
            placement[node.name] = Placement("npu", node.op)
    ctx.placement = placement
