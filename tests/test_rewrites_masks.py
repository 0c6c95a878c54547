"""Mask rewrites (passes/rewrites/masks.py): a bool mask that is only relabelled, gathered,
broadcast or combined with an identity constant before a Where has that movement done on the
Where's float result instead, so at most the mask's Cast stays on the CPU; checked against
onnxruntime on masks of other lengths, operand orders and movements than the repro's."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from rkcompile.compiler.pipeline import compile_model
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
    assert {"where_before_mask_movement", "where_reads_mask_source"} & {r.rule for r in ctx.rewrites}
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


def _cpu_ops(path, target):
    plan, _ = compile_model(path, target)
    return sorted(n.op for n in plan.nodes if n.device == "cpu"), plan


def _mask_feeds(length, **others):
    mask = (RNG.random((1, length)) < 0.6).astype(np.int64)
    mask[0, 0] = 1  # no fully masked row: finfo.min is -inf in float16, a float32 model's uniform row
    return {"mask": mask, **{k: RNG.standard_normal(shape).astype(np.float32) for k, shape in others.items()}}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("length,heads,picker", [(24, 4, "Gather"), (40, 3, "GatherND"), (9, 2, "Gather")])
def test_where_with_a_tensor_branch_reads_the_mask_where_it_is_made(tmp_path, target, length, heads, picker):
    """T5's and BERT's chains: the int mask cast to bool, picked in order (a rank-5 Gather of
    arange, or a GatherND of [0, j] pairs), relabelled, And with all-true broadcast, Expand,
    then Where(cond, position_bias, finfo.min): the Where reads the cast mask itself, whose
    broadcast puts every element where the chain does; only the Cast stays on the CPU."""
    nodes = [node("Cast", ["mask"], "mb", to=TensorProto.BOOL)]
    if picker == "Gather":
        nodes += [node("Flatten", ["mb"], "mf", axis=2), node("Gather", ["mf", "idx"], "mg", axis=0),
                  node("Reshape", ["mg", "s1"], "m1")]
        idx = np.arange(length).reshape(1, 1, 1, length)
    else:
        nodes += [node("GatherND", ["mb", "idx"], "m1")]
        idx = np.stack([np.zeros(length, np.int64), np.arange(length)], -1).reshape(1, 1, 1, length, 2)
    nodes += [node("Reshape", ["m1", "s4"], "m4"), node("And", ["ident", "m4"], "ma"),
              node("Expand", ["ma", "se"], "me"), node("Where", ["me", "bias", "low"], "masked"),
              node("Add", ["scores", "masked"], "sb"), node("Softmax", ["sb"], "y", axis=-1)]
    model = make_model(nodes, [value_info("mask", [1, length], TensorProto.INT64),
                               value_info("scores", [1, heads, length, length])],
                       [value_info("y", [1, heads, length, length])],
                       [weight("idx", idx.astype(np.int64)), weight("s1", np.array([length], np.int64)),
                        weight("s4", np.array([1, 1, 1, length], np.int64)),
                        weight("ident", np.ones((1, 1, length, 1), bool)),
                        weight("se", np.array([1, 1, length, length], np.int64)),
                        weight("bias", RNG.standard_normal((1, heads, length, length)).astype(np.float32)),
                        weight("low", np.array(np.finfo(np.float32).min, np.float32))])
    ctx = rewritten(model, tmp_path, target)
    assert "where_reads_mask_source" in {r.rule for r in ctx.rewrites}
    assert_rewrite_exact(model, ctx, _mask_feeds(length, scores=(1, heads, length, length)))
    cpu, _ = _cpu_ops(tmp_path / "model.onnx", target)
    assert cpu == ["Cast"]


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("combine,constant_first", [("And", True), ("And", False), ("Or", True)])
def test_where_of_a_mask_combined_with_a_causal_constant_is_two_wheres(tmp_path, target, combine, constant_first):
    """GPT-2's chain: the moved padding mask And a constant causal mask (either operand order),
    or an Or: Where over the combination is Where over each part, the constant one outermost;
    the moved part is then selected on the float side and only the Cast stays on the CPU."""
    length = 20
    causal = np.tril(np.ones((length, length), bool)).reshape(1, 1, length, length)
    pair = ["causal", "m4"] if constant_first else ["m4", "causal"]
    nodes = [node("Cast", ["mask"], "mb", to=TensorProto.BOOL), node("Flatten", ["mb"], "mf", axis=2),
             node("Gather", ["mf", "idx"], "mg", axis=0), node("Reshape", ["mg", "s4"], "m4"),
             node(combine, pair, "ma"), node("Where", ["ma", "zero", "low"], "masked"),
             node("Add", ["scores", "masked"], "sb"), node("Softmax", ["sb"], "y", axis=-1)]
    model = make_model(nodes, [value_info("mask", [1, length], TensorProto.INT64),
                               value_info("scores", [1, 2, length, length])],
                       [value_info("y", [1, 2, length, length])],
                       [weight("idx", np.arange(length).reshape(1, 1, 1, length)),
                        weight("s4", np.array([1, 1, 1, length], np.int64)),
                        weight("causal", causal if combine == "And" else ~causal),
                        weight("zero", np.array([0.0], np.float32)), weight("low", np.array([-1e4], np.float32))])
    ctx = rewritten(model, tmp_path, target)
    assert "where_of_boolean_op" in {r.rule for r in ctx.rewrites}
    assert_rewrite_exact(model, ctx, _mask_feeds(length, scores=(1, 2, length, length)))
    cpu, _ = _cpu_ops(tmp_path / "model.onnx", target)
    assert cpu == ["Cast"]


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("heads", [2, 5])
def test_where_of_not_swaps_branches_and_a_refused_broadcast_runs_in_pieces(tmp_path, target, heads):
    """DeBERTa's chain: Where(Not(mask2d), finfo.min, scores) with the [1, 1, L, L] mask
    broadcast over the heads, which no Expand pattern allows: Where(mask2d, scores, finfo.min)
    one head at a time, Concat; Not and Where leave the CPU."""
    length = 12
    nodes = [node("Cast", ["mask"], "mb", to=TensorProto.BOOL), node("Not", ["mb"], "nm"),
             node("Where", ["nm", "low", "scores"], "masked"), node("Softmax", ["masked"], "y", axis=-1)]
    model = make_model(nodes, [value_info("mask", [1, 1, length, length], TensorProto.INT64),
                               value_info("scores", [1, heads, length, length])],
                       [value_info("y", [1, heads, length, length])],
                       [weight("low", np.array(-1e4, np.float32))])
    ctx = rewritten(model, tmp_path, target)
    rules = {r.rule for r in ctx.rewrites}
    assert "where_of_boolean_op > where_by_pieces" in rules or {"where_of_boolean_op", "where_by_pieces"} <= rules
    mask = (RNG.random((1, 1, length, length)) < 0.6).astype(np.int64)
    mask[..., 0] = 1
    assert_rewrite_exact(model, ctx, {"mask": mask, "scores": RNG.standard_normal((1, heads, length, length)).astype(np.float32)})
    cpu, _ = _cpu_ops(tmp_path / "model.onnx", target)
    assert cpu == ["Cast"]


def test_where_by_pieces_declines_a_broadcast_over_too_many_pieces(tmp_path):
    model = make_model([node("Where", ["m", "x", "z"], "y")],
                       [value_info("m", [1, 1, 8, 8], TensorProto.BOOL), value_info("x", [1, 100, 8, 8])],
                       [value_info("y", [1, 100, 8, 8])], [weight("z", np.array([0.0], np.float32))])
    ctx = rewritten(model, tmp_path, "rk3588")
    (attempt,) = [a for a in ctx.rewrite_attempts["n_y"] if a.rule == "where_by_pieces"]
    assert "broadcasts along no axis of 2 to 64" in attempt.outcome


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_cast_to_float_moves_before_the_integer_relabels_it_read(tmp_path, target):
    """DeBERTa's embedding mask: Unsqueeze of the int64 mask, Cast to float, Mul: the Cast runs
    on the mask as it comes and the Unsqueeze on its float result, on the NPU. The Cast is still
    reported on the CPU (its work stays there), the Unsqueeze is not."""
    nodes = [node("Unsqueeze", ["mask", "axes"], "mu"), node("Transpose", ["mu"], "mt", perm=[0, 2, 1]),
             node("Cast", ["mt"], "mf", to=TensorProto.FLOAT), node("Mul", ["x", "mf"], "y")]
    model = make_model(nodes, [value_info("mask", [1, 16], TensorProto.INT64), value_info("x", [1, 16, 8])],
                       [value_info("y", [1, 16, 8])], [weight("axes", np.array([1], np.int64))])
    ctx = rewritten(model, tmp_path, target)
    assert "cast_before_movement" in {r.rule for r in ctx.rewrites}
    (attempt,) = [a for a in ctx.rewrite_attempts["n_mf"] if a.rule == "cast_before_movement" and a.node == "n_mf"]
    assert attempt.outcome == "applied (1 node(s) still for the CPU, in place of more)"
    assert_rewrite_exact(model, ctx, {"mask": RNG.integers(-3, 3, (1, 16)), "x": RNG.standard_normal((1, 16, 8)).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    devices = {n.name: n.device for n in plan.nodes}
    assert devices["n_mf"] == "cpu" and devices["n_mu"] != "cpu" and devices["n_mt"] != "cpu"
    assert sorted(n.op for n in plan.nodes if n.device == "cpu") == ["Cast"]


def test_cast_before_a_movement_that_moves_nothing_writes_the_result_itself(tmp_path):
    """Two Transposes of the int mask that undo each other move nothing: the Cast of the mask is
    the result, with no movement after it. (An Expand to its own shape, the other such movement,
    is gone before rewrites: passes/remove_noops.py.)"""
    nodes = [node("Transpose", ["mask"], "mt", perm=[0, 1, 3, 2]), node("Transpose", ["mt"], "me", perm=[0, 1, 3, 2]),
             node("Cast", ["me"], "mf", to=TensorProto.FLOAT), node("Mul", ["x", "mf"], "y")]
    model = make_model(nodes, [value_info("mask", [1, 1, 16, 1], TensorProto.INT64), value_info("x", [1, 1, 16, 8])],
                       [value_info("y", [1, 1, 16, 8])])
    ctx = rewritten(model, tmp_path, "rk3588")
    (applied,) = [r for r in ctx.rewrites if r.rule == "cast_before_movement"]
    assert applied.ops == ("Cast",)
    assert_rewrite_exact(model, ctx, {"mask": RNG.integers(-3, 3, (1, 1, 16, 1)),
                                      "x": RNG.standard_normal((1, 1, 16, 8)).astype(np.float32)})


def test_cast_before_movement_declines_when_the_relabel_has_other_readers(tmp_path):
    """The integer Unsqueeze is also read by an integer Add: it stays on the CPU either way, so
    moving the Cast would not save a CPU step and the rewrite is not kept."""
    nodes = [node("Unsqueeze", ["mask", "axes"], "mu"), node("Cast", ["mu"], "mf", to=TensorProto.FLOAT),
             node("Mul", ["x", "mf"], "y"), node("Add", ["mu", "mu"], "twice")]
    model = make_model(nodes, [value_info("mask", [1, 16], TensorProto.INT64), value_info("x", [1, 16, 8])],
                       [value_info("y", [1, 16, 8]), value_info("twice", [1, 16, 1], TensorProto.INT64)],
                       [weight("axes", np.array([2], np.int64))])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert "cast_before_movement" not in {r.rule for r in ctx.rewrites}
    (attempt,) = [a for a in ctx.rewrite_attempts["n_mf"] if a.rule == "cast_before_movement"]
    assert "its Cast would break" in attempt.outcome


def test_integer_relabel_chain_is_one_cpu_reshape(tmp_path):
    """Unsqueeze, Squeeze, Unsqueeze of an int64 mask feeding an int64 Mul: no NPU op computes
    integers, but the relabels are one Reshape, one CPU step instead of three; the relabels it
    absorbs are reported removed, the one whose output it writes on the CPU."""
    nodes = [node("Unsqueeze", ["mask", "a1"], "u1"), node("Unsqueeze", ["u1", "a2"], "u2"),
             node("Squeeze", ["u2", "a2"], "sq"), node("Unsqueeze", ["sq", "a3"], "u3"),
             node("Mul", ["u3", "u2"], "prod")]
    model = make_model(nodes, [value_info("mask", [1, 6], TensorProto.INT64)],
                       [value_info("prod", [1, 1, 6, 6], TensorProto.INT64)],
                       [weight("a1", np.array([1], np.int64)), weight("a2", np.array([2], np.int64)),
                        weight("a3", np.array([3], np.int64))])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert "collapse_relabels" in {r.rule for r in ctx.rewrites}
    assert_rewrite_exact(model, ctx, {"mask": RNG.integers(0, 2, (1, 6))})
    plan, _ = compile_model(tmp_path / "model.onnx", "rk3588")
    cpu = sorted(n.op for n in plan.nodes if n.device == "cpu")
    assert cpu.count("Unsqueeze") + cpu.count("Squeeze") == 2 and "Mul" in cpu
