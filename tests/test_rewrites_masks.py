"""Mask rewrites (passes/rewrites/masks.py): a bool mask that is only relabelled, gathered,
broadcast or combined with an identity constant before a Where has that movement done on the
Where's float result instead, so at most the mask's Cast stays on the CPU; checked against
onnxruntime on masks of other lengths, operand orders and movements than the repro's."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from rkcompile.pipeline import compile_model
from test_rewrites_conv import assert_rewrite_exact, rewritten

RNG = np.random.default_rng(5)


def node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], name=f"n_{output}", **attrs)


def mask_chain(length, heads=2, combine="And", constant_first=True, gather=None, transpose=False,
               branches=(0.0, -1e4)):
    """transformers' attention-mask chain on a [1, length] int64 mask, with variations."""
    identity = np.ones((1, 1, length, 1), bool) if combine == "And" else np.zeros((1, 1, length, 1), bool)
    indices = np.arange(length) if gather is None else np.asarray(gather)
    nodes = [node("Cast", ["mask"], "mb", to=TensorProto.BOOL), node("Flatten", ["mb"], "mf", axis=2),
             node("Gather", ["mf", "idx"], "mg", axis=0), node("Reshape", ["mg", "s1"], "m1"),
             node("Reshape", ["m1", "s4"], "m4")]
    last = "m4"
    if transpose:
        nodes.append(node("Transpose", ["m4"], "mt", perm=[0, 1, 3, 2]))
        last = "mt"
    pair = ["ident", last] if constant_first else [last, "ident"]
    nodes += [node(combine, pair, "ma"), node("Expand", ["ma", "se"], "me"),
              node("Where", ["me", "a", "b"], "bias"), node("Add", ["scores", "bias"], "sb"),
              node("Softmax", ["sb"], "y", axis=-1)]
    inits = [weight("idx", indices.reshape(1, 1, 1, -1).astype(np.int64)), weight("s1", np.array([length], np.int64)),
             weight("s4", np.array([1, 1, 1, length], np.int64)), weight("ident", identity),
             weight("se", np.array([1, 1, length, length], np.int64)),
             weight("a", np.array([branches[0]], np.float32)), weight("b", np.array([branches[1]], np.float32))]
    return make_model(nodes, [value_info("mask", [1, length], TensorProto.INT64),
                              value_info("scores", [1, heads, length, length])],
                      [value_info("y", [1, heads, length, length])], inits)


VARIANTS = {
    "and_constant_first": dict(length=16),
    "and_constant_second": dict(length=40, constant_first=False),
    "or_with_all_false": dict(length=24, combine="Or", branches=(-1e4, 0.0)),
    "transposed_mask": dict(length=16, transpose=True),
    "permuting_gather": dict(length=12, gather=np.arange(12)[::-1]),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_mask_chain_leaves_only_the_cast_on_the_cpu_and_computes_the_same(tmp_path, name, target):
    spec = VARIANTS[name]
    model = mask_chain(**spec)
    ctx = rewritten(model, tmp_path, target)
    assert "where_before_mask_movement" in [r.rule for r in ctx.rewrites]
    length = spec["length"]
    feeds = {"mask": (RNG.random((1, length)) < 0.6).astype(np.int64),
             "scores": RNG.standard_normal((1, 2, length, length)).astype(np.float32)}
    assert_rewrite_exact(model, ctx, feeds)
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert {n.op for n in plan.nodes if n.device == "cpu"} <= {"Cast"}


def test_where_with_a_computed_branch_is_left_alone_and_says_why(tmp_path):
    model = make_model([node("Reshape", ["m", "s"], "mr"), node("Where", ["mr", "x", "z"], "y")],
                       [value_info("m", [4, 4], TensorProto.BOOL), value_info("x", [1, 1, 4, 4])],
                       [value_info("y", [1, 1, 4, 4])],
                       [weight("s", np.array([1, 1, 4, 4], np.int64)), weight("z", np.array([0.0], np.float32))])
    ctx = rewritten(model, tmp_path, "rk3588")
    (attempt,) = [a for a in ctx.rewrite_attempts["n_y"] if a.rule == "where_before_mask_movement"]
    assert "a branch is not a single constant" in attempt.outcome


def test_gather_of_every_index_is_a_reshape(tmp_path):
    model = make_model([node("Gather", ["x", "idx"], "y", axis=0)], [value_info("x", [6, 8])],
                       [value_info("y", [2, 3, 8])], [weight("idx", np.arange(6).reshape(2, 3))])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert ctx.rewrites[0].rule == "gather_of_every_index_to_reshape"
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((6, 8)).astype(np.float32)})
