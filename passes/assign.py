"""Assign: put each node on the NPU, or on the CPU with the rules it breaks as the reason.

The plan prefixes every reason with the original op and the target (pipeline.assemble_plan).
"""
from __future__ import annotations

import logging

from rkcompile.compiler.context import CompileContext, Placement

NAME = "assign"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"failures", "graph", "target"})
PROVIDES = frozenset({"placement"})

log = logging.getLogger("rkcompile")


def run(ctx: CompileContext) -> None:
    placement = {}
    for node in ctx.graph.nodes:
        failures = ctx.failures.get(node.name, [])
        if failures:
            reasons = "; ".join(str(f) for f in failures)
            placement[node.name] = Placement("cpu", node.op, reasons)
            log.info("cpu fallback %s (%s) on %s: %s", node.name, node.op, ctx.target.name, reasons)
        else:
            placement[node.name] = Placement("npu", node.op)
    ctx.placement = placement
