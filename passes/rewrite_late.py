"""Rewrite, late: the legalizing rewrites that would hide a fusion pattern, run after fusion on
the nodes that are still illegal (the rules marked `late` in passes/rewrites/)."""
from __future__ import annotations

from rkcompile.context import CompileContext

from .rewrite import rewrite_graph

NAME = "rewrite-late"


def run(ctx: CompileContext) -> None:
    rewrite_graph(ctx, late=True)
