"""Rewrite, late: the legalizing rewrites that would hide a fusion pattern, run after fusion on
the nodes that are still illegal (the rules marked `late` in passes/rewrites/)."""
from __future__ import annotations

from rkcompile.compiler.context import CompileContext

from rkcompile.passes.rewrite import rewrite_graph

NAME = "rewrite-late"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"failures", "graph", "model_info", "options", "origins", "target"})
PROVIDES = frozenset({"failures", "fates", "graph", "origins", "rewrite_attempts", "rewrites"})


def run(ctx: CompileContext) -> None:
    rewrite_graph(ctx, late=True)
