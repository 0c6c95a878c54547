"""A rotary embedding's moves and negations along the last axis as one Gather, its signs
joining the product by sin (passes/rewrites/signed_moves.py), or on rank 2 as one MatMul by a
signed permutation: RoFormer's interleaved rotation becomes one step, exactly; LLaMA's halves,
which need no stepped Slice, stay with the rules that take them in as few steps."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

import rkcompile
from conftest import make_model, value_info, weight
from test_rewrites_conv import rewritten, run_ort

RNG = np.random.default_rng(5)
HEADS, TOKENS, WIDTH = 2, 8, 16


def _ints(name, values):
    return weight(name, np.array(values, np.int64))


def interleaved_rotation(result: str) -> list:
    """RoFormer's exporter's rotation of x's last axis (`last` its index) into `result`:
    stepped Slices, Neg, Unsqueeze, Concat, Reshape to `shape`."""
    return [helper.make_node("Slice", ["x", "one", "big", "last", "two"], ["odd"], name="odd"),
            helper.make_node("Neg", ["odd"], ["negated"], name="neg"),
            helper.make_node("Slice", ["x", "zero", "big", "last", "two"], ["even"], name="even"),
            helper.make_node("Unsqueeze", ["negated", "minus_one"], ["a"], name="a"),
            helper.make_node("Unsqueeze", ["even", "minus_one"], ["b"], name="b"),
            helper.make_node("Concat", ["a", "b"], ["pairs"], name="pairs", axis=-1),
            helper.make_node("Reshape", ["pairs", "shape"], [result], name="rotated")]


def rotary(interleaved: bool):
    """y = x * cos + rotate(x) * sin on [1, HEADS, TOKENS, WIDTH]; rotate as RoFormer's exporter
    writes it (stepped Slices, Neg, Unsqueeze, Concat, Reshape) or as LLaMA's rotate_half."""
    shape = [1, HEADS, TOKENS, WIDTH]
    inits = [weight("cos", RNG.standard_normal((TOKENS, WIDTH)).astype(np.float32)),
             weight("sin", RNG.standard_normal((TOKENS, WIDTH)).astype(np.float32)),
             _ints("last", [3]), _ints("big", [2 ** 62]), _ints("zero", [0]), _ints("one", [1]),
             _ints("two", [2]), _ints("half", [WIDTH // 2]), _ints("minus_one", [-1]), _ints("shape", shape)]
    if interleaved:
        nodes = interleaved_rotation("rotated")
    else:
        nodes = [helper.make_node("Slice", ["x", "zero", "half", "last"], ["first"], name="first"),
                 helper.make_node("Slice", ["x", "half", "big", "last"], ["second"], name="second"),
                 helper.make_node("Neg", ["second"], ["negated"], name="neg"),
                 helper.make_node("Concat", ["negated", "first"], ["rotated"], name="rotated", axis=-1)]
    nodes += [helper.make_node("Mul", ["x", "cos"], ["c"], name="times_cos"),
              helper.make_node("Mul", ["rotated", "sin"], ["s"], name="times_sin"),
              helper.make_node("Add", ["c", "s"], ["y"], name="y")]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], inits)


def test_an_interleaved_rotation_is_one_exact_gather(tmp_path):
    """The rotation is a Gather along the last axis and a Mul by its signs: the same bits. The
    plan runs it as one Gather, the signs in the product by sin: no Conv, no Slice."""
    model = rotary(interleaved=True)
    ctx = rewritten(model, tmp_path, "rk3588")
    (applied,) = [r for r in ctx.rewrites if r.rule == "signed_moves_as_gather"]
    assert {"odd", "even", "neg", "pairs", "rotated"} <= set(applied.nodes)
    assert not any(node.op in ("Slice", "Neg", "Concat", "MatMul") for node in ctx.graph.nodes)
    feeds = {"x": RNG.standard_normal((1, HEADS, TOKENS, WIDTH)).astype(np.float32)}
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    # each output is one input times +1 or -1: the same bits
    assert np.array_equal(run_ort(after, feeds)[0], run_ort(model, feeds)[0])
    path = tmp_path / "rotary.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    kernels = [step.kernel for step in plan.record.steps if step.device == "npu"]
    assert "Slice" not in kernels and "Conv" not in kernels and kernels.count("Gather") == 1
    assert kernels.count("Mul") == 2   # x * cos, and the rotation * (signs * sin)
    expected = run_ort(model, feeds)[0]
    np.testing.assert_allclose(rkcompile.run(plan, feeds)["y"], expected, rtol=0,
                               atol=4e-3 * float(np.abs(expected).max()))


def test_an_interleaved_rotation_of_rank_2_is_one_exact_matmul(tmp_path):
    """On [TOKENS, WIDTH] the last axis is the channels, which a Gather would pick lane by
    lane: the signed permutation as a MatMul, exact."""
    shape = [TOKENS, WIDTH]
    model = make_model(interleaved_rotation("y"), [value_info("x", shape)], [value_info("y", shape)],
                       [_ints("last", [1]), _ints("big", [2 ** 62]), _ints("zero", [0]), _ints("one", [1]),
                        _ints("two", [2]), _ints("minus_one", [-1]), _ints("shape", shape)])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert any(r.rule == "signed_moves_as_gather" for r in ctx.rewrites)
    assert [node.op for node in ctx.graph.nodes if node.op in ("Gather", "MatMul", "Conv")] in (["MatMul"], ["Conv"])
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    assert np.array_equal(run_ort(after, feeds)[0], run_ort(model, feeds)[0])


def test_halves_without_a_stepped_slice_are_left_to_the_other_rules(tmp_path):
    ctx = rewritten(rotary(interleaved=False), tmp_path, "rk3588")
    assert not any(r.rule == "signed_moves_as_gather" for r in ctx.rewrites)
    declined = {a.outcome for tried in ctx.rewrite_attempts.values() for a in tried
                if a.rule == "signed_moves_as_gather"}
    assert any("no Slice steps over 1" in reason for reason in declined)
