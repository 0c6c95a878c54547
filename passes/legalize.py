"""Legalize: check every node against the target's rules and record each one it breaks.

All rules run for every node, not just until the first failure, so a user sees every reason a
node cannot go to the NPU at once. Nothing is placed here; `assign` reads the failures.
The plan dtype and the model's opset are passed to the rules that depend on them.
"""
from __future__ import annotations

from typing import NamedTuple

import onnx_graphsurgeon as gs

from rkcompile.context import CompileContext, Failure
from rkcompile.ir import is_onnx_domain
from rkcompile.targets.model import Target

NAME = "legalize"


class Verdict(NamedTuple):
    rule: str
    ok: bool
    detail: str


def run(ctx: CompileContext) -> None:
    facts = compile_facts(ctx)
    ctx.failures = {node.name: check_node(node, ctx.target, **facts) for node in ctx.graph.nodes}


def compile_facts(ctx: CompileContext) -> dict[str, object]:
    """What rules may need to know about this compile beyond the node and the target."""
    return {"plan_dtype": ctx.options.dtype, "opset": ctx.graph.opset}


def check_node(node: gs.Node, target: Target, **facts: object) -> list[Failure]:
    return [Failure(v.rule, v.detail) for v in evaluate_rules(node, target, **facts) if not v.ok]


def evaluate_rules(node: gs.Node, target: Target, **facts: object) -> list[Verdict]:
    """Every rule that applies to `node` on `target`, with its verdict and the values seen.

    `facts` are `compile_facts`; without them rules assume a float16 plan of opset 13 or later.
    A node whose op the target lacks gets one failed verdict saying so.
    """
    op_rule = target.ops.get(node.op) if is_onnx_domain(node) else None
    if op_rule is None:
        return [Verdict(op_missing(node, target), False, "")]
    return [Verdict(rule.describe(), *rule.evaluate(node, target, **facts))
            for rule in target.common_rules + op_rule.rules]


def op_missing(node: gs.Node, target: Target) -> str:
    if not is_onnx_domain(node):
        return f"custom-domain op '{node.domain}::{node.op}' has no NPU kernel on {target.name}"
    return f"{node.op} is not in {target.name}'s NPU operator list (oplist V2.3.2)"
