"""Legalize: check every node against the target's rules and record each one it breaks.

All rules run for every node, not just until the first failure, so a user sees every reason a
node cannot go to the NPU at once. Nothing is placed here; `assign` reads the failures.
The plan dtype and the model's opset are passed to the rules that depend on them.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CheckedNode, CompileContext, Failure, Verdict
from rkcompile.errors import CompileError
from rkcompile.ir.graph import dtype_name, is_onnx_domain, present_inputs
from rkcompile.targets.model import Rule, Target

from rkcompile.passes.integer_results import rounded_to_integers

NAME = "legalize"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "options", "origins", "rule_verdicts", "target"})
PROVIDES = frozenset({"failures", "rule_verdicts", "verdicts"})


def run(ctx: CompileContext) -> None:
    if not ctx.target.supports_dtype(ctx.options.dtype):
        runs = sorted(dtype for dtype in ctx.target.c2 if ctx.target.supports_dtype(dtype))
        raise CompileError(f"{ctx.target.name}'s NPU runs {' and '.join(runs)} only: it has no {ctx.options.dtype} "
                           f"tensors (seed 003, table 3-1: C2 is '/'); use --dtype {runs[0]}")
    facts = compile_facts(ctx)
    rounded = rounded_to_integers(ctx.graph)
    ctx.failures, ctx.verdicts = {}, {}
    # the rewrite pass's verdicts (passes/rewrite.py _Verdicts), each for one state of a node
    known, ctx.rule_verdicts = ctx.rule_verdicts, None
    for node in ctx.graph.nodes:
        verdicts = (known.verdicts(node, ctx.target, facts) if known is not None
                    else evaluate_rules(node, ctx.target, **facts))
        verdicts += planner_verdicts(node, rounded)
        ctx.failures[node.name] = [Failure(v.rule, v.detail) for v in verdicts if not v.ok]
        ctx.verdicts[node.name] = CheckedNode(node.name, node.op, ctx.origins.get(node.name, (node.name,)),
                                              values_seen(node), verdicts)


#: not target rules: what no NPU kernel of the operator list (oplist V2.3.2) computes
TRAINING_MODE_RULE = "the NPU runs inference; a training-mode node computes batch statistics or draws random masks"
ZERO_SIZE_RULE = "a zero-size activation (a dim of 0, which ONNX allows) holds no data for an NPU kernel"
INTEGER_RESULT_RULE = (
    "an integer is rounded from this result (by a Cast to an integer type, Round, Floor, Ceil or QuantizeLinear), "
    "so it runs in float32 on the CPU: the NPU's float16 (oplist V2.3.2, T1 int8/float16) keeps 11 significant bits "
    "(IEEE 754 binary16) and holds 3.4999 as 3.5, which rounds to 4, not 3")


def planner_verdicts(node: gs.Node, rounded: dict[str, str] | None = None) -> list[Verdict]:
    """The failed verdicts of the planner's own rules, which hold on every target. `rounded` is
    `rounded_to_integers` of the node's graph."""
    verdicts = []
    if rounded and node.name in rounded:
        verdicts.append(Verdict(INTEGER_RESULT_RULE, False, rounded[node.name]))
    training = training_mode(node)
    if training is not None:
        verdicts.append(Verdict(TRAINING_MODE_RULE, False, training))
    # an empty constant is a parameter ONNX spells as absent (Resize's roi), not data
    empty = [t for t in present_inputs(node) + node.outputs if t.name and not isinstance(t, gs.Constant)
             and t.shape is not None and any(d == 0 for d in t.shape)]
    if empty:
        verdicts.append(Verdict(ZERO_SIZE_RULE, False, f"{empty[0].name} {list(empty[0].shape)}"))
    return verdicts


def training_mode(node: gs.Node) -> str | None:
    """What puts the node in training mode (BatchNormalization's training_mode=1: batch
    statistics and running-statistics outputs; Dropout's training_mode input not a constant
    false: a random mask), or None for an inference node."""
    if node.op == "BatchNormalization" and is_onnx_domain(node) and int(node.attrs.get("training_mode", 0)):
        return "training_mode=1"
    if node.op == "Dropout" and is_onnx_domain(node) and len(node.inputs) > 2 and node.inputs[2].name:
        flag = node.inputs[2]
        if not isinstance(flag, gs.Constant) or bool(np.asarray(flag.values).any()):
            return f"training_mode input {flag.name}" + ("" if isinstance(flag, gs.Constant) else " (not a constant)")
    return None


def compile_facts(ctx: CompileContext) -> dict[str, object]:
    """What rules may need to know about this compile beyond the node and the target."""
    return {"plan_dtype": ctx.options.dtype, "opset": ctx.graph.opset}


def check_node(node: gs.Node, target: Target, **facts: object) -> list[Failure]:
    """The rules `node` breaks; what evaluate_rules says of the failed ones, rendered lazily."""
    rules = applicable_rules(node, target)
    if rules is None:
        return [Failure(op_missing(node, target), "")]
    failures = []
    for rule in rules:
        ok, detail = rule.evaluate(node, target, **facts)
        if not ok:
            failures.append(Failure(rule.describe(), detail))
    return failures


def evaluate_rules(node: gs.Node, target: Target, **facts: object) -> list[Verdict]:
    """Every rule that applies to `node` on `target`, with its verdict and the values seen.

    `facts` are `compile_facts`; without them rules assume a float16 plan of opset 13 or later.
    A node whose op the target lacks gets one failed verdict saying so.
    """
    rules = applicable_rules(node, target)
    if rules is None:
        return [Verdict(op_missing(node, target), False, "")]
    return [Verdict(rule.describe(), *rule.evaluate(node, target, **facts)) for rule in rules]


def applicable_rules(node: gs.Node, target: Target) -> tuple[Rule, ...] | None:
    """The common rules and the op's own on `target`; None when the target lacks the op."""
    op_rule = target.ops.get(node.op) if is_onnx_domain(node) else None
    return None if op_rule is None else target.common_rules + op_rule.rules


def values_seen(node: gs.Node) -> str:
    """The node's tensors (shape, dtype, constant or not) and attributes, on one line."""
    def tensor(t: gs.Tensor) -> str:
        kind = "const " if isinstance(t, gs.Constant) else ""
        shape = list(t.shape) if t.shape is not None else "?"
        return f"{t.name} {kind}{shape} {dtype_name(t.dtype)}"

    inputs = ", ".join(tensor(t) for t in present_inputs(node))
    outputs = ", ".join(tensor(t) for t in node.outputs)
    attrs = ", ".join(f"{k}={v.decode() if isinstance(v, bytes) else v}" for k, v in sorted(node.attrs.items()))
    return f"inputs {inputs}; outputs {outputs}" + (f"; attributes {attrs}" if attrs else "")


def op_missing(node: gs.Node, target: Target) -> str:
    if not is_onnx_domain(node):
        return f"custom-domain op '{node.domain}::{node.op}' has no NPU kernel on {target.name}"
    return f"{node.op} is not in {target.name}'s NPU operator list (oplist V2.3.2)"
