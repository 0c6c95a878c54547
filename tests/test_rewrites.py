"""The legalizing rewrites: each fires where its node is illegal (or always, for the rules marked
so), keeps nothing but legal nodes, and computes what the original computed (onnx.reference)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.graph import static_shape
from rkcompile.passes import fold_constants, import_model, remove_noops, rewrite, rewrite_late
from rkcompile.passes.legalize import check_node, evaluate_rules
from rkcompile.passes.rewrites.pooling import pool_stage_kernels
from rkcompile.compiler.pipeline import PASSES, assemble_plan
from rkcompile.plan.schema import PlanRecord, contract_violations
from rkcompile.targets import get_target
from rkcompile.targets.model import OpRule, Rule

from conftest import make_model, needs_zoo, value_info, weight

RNG = np.random.default_rng(7)


def refuse(node, target, when) -> tuple[bool, str]:
    """Test rule: refused where the test says so."""
    return (not when(node)), "refused by the test"


def with_refusals(base: str = "rk3588", **when) -> object:
    """`base` with one extra rule per op that fails when `when[op](node)` is true."""
    target = get_target(base)
    ops = dict(target.ops)
    for op, predicate in when.items():
        kernel = ops[op].kernel if op in ops else op
        rules = ops[op].rules if op in ops else ()
        ops[op] = OpRule(kernel=kernel, rules=rules + (Rule(refuse, {"when": predicate}),))
    return dataclasses.replace(target, ops=ops)


def shape_of(node, index=0):
    return list(node.inputs[index].shape)


def rewritten(model, tmp_path, target) -> CompileContext:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    ctx = CompileContext(model_path=path, target=target)
    for compiler_pass in (import_model, fold_constants, remove_noops, rewrite):
        compiler_pass.run(ctx)
    return ctx


def assert_same_outputs(model, ctx, feeds, rtol=1e-5, atol=1e-5):
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = ReferenceEvaluator(after).run(None, feeds)
    for want, got in zip(expected, actual):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def ops_of(ctx) -> list[str]:
    return [node.op for node in ctx.graph.nodes]


def rules_fired(ctx) -> list[str]:
    return [record.rule for record in ctx.rewrites]


def unary_model(op, shape, opset=17, **attrs):
    return make_model([helper.make_node(op, ["x"], ["y"], name="n", **attrs)],
                      [value_info("x", shape)], [value_info("y", shape)], opset=opset)


def feed(shape, low=-3.0, high=3.0):
    return RNG.uniform(low, high, size=shape).astype(np.float32)


# --- element-wise ------------------------------------------------------------------------------

@pytest.mark.parametrize("exponent, muls", [(4, 2), (5, 3), (7, 4), (12, 4)])
def test_pow_integer_exponent_becomes_mul_chain(tmp_path, exponent, muls):
    model = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")],
                       [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 4, 3, 3])],
                       [weight("e", np.array([exponent], dtype=np.float32))])
    target = with_refusals(Pow=lambda n: float(n.inputs[1].values.reshape(-1)[0]) not in (0, 1, 2, 3, 0.5, -0.5))
    ctx = rewritten(model, tmp_path, target)
    assert ops_of(ctx) == ["Mul"] * muls
    assert rules_fired(ctx) == ["pow_to_mul_chain"]
    assert all(ctx.origins[n.name] == ("pow",) for n in ctx.graph.nodes)
    assert_same_outputs(model, ctx, {"x": feed([1, 4, 3, 3], -1.5, 1.5)}, rtol=1e-4)


def test_pow_with_a_legal_exponent_or_a_fraction_is_left_alone(tmp_path):
    target = with_refusals(Pow=lambda n: float(n.inputs[1].values.reshape(-1)[0]) not in (0, 1, 2, 3, 0.5, -0.5))
    for exponent in (2.0, 4.5):
        model = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")],
                           [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 4, 3, 3])],
                           [weight("e", np.array([exponent], dtype=np.float32))])
        assert ops_of(rewritten(model, tmp_path, target)) == ["Pow"]


def test_no_rewrite_when_the_replacement_is_not_legal_either(tmp_path):
    model = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")],
                       [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 4, 3, 3])],
                       [weight("e", np.array([4.0], dtype=np.float32))])
    ctx = rewritten(model, tmp_path, with_refusals(Pow=lambda n: True, Mul=lambda n: True))
    assert ops_of(ctx) == ["Pow"] and ctx.rewrites == []
    assert [t.name for t in ctx.graph.nodes[0].outputs[0].inputs] == ["pow"]  # candidates left no trace


@pytest.mark.parametrize("op, constant, new_op", [("Sub", 0.75, "Add"), ("Div", 4.0, "Mul")])
def test_sub_and_div_by_a_constant_become_add_and_mul(tmp_path, op, constant, new_op):
    model = make_model([helper.make_node(op, ["x", "c"], ["y"], name="n")],
                       [value_info("x", [1, 3, 4, 4])], [value_info("y", [1, 3, 4, 4])],
                       [weight("c", np.full([1, 3, 1, 1], constant, dtype=np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == [new_op]
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 4, 4])})


def test_sub_from_a_constant_and_div_by_zero_stay(tmp_path):
    reversed_sub = make_model([helper.make_node("Sub", ["c", "x"], ["y"], name="n")],
                              [value_info("x", [1, 3])], [value_info("y", [1, 3])],
                              [weight("c", np.ones([1, 3], dtype=np.float32))])
    assert ops_of(rewritten(reversed_sub, tmp_path, get_target("rk3588"))) == ["Sub"]
    by_zero = make_model([helper.make_node("Div", ["x", "c"], ["y"], name="n")],
                         [value_info("x", [1, 3])], [value_info("y", [1, 3])],
                         [weight("c", np.array([1, 0, 2], dtype=np.float32))])
    assert ops_of(rewritten(by_zero, tmp_path, get_target("rk3588"))) == ["Div"]


def test_hardsigmoid_with_other_alpha_runs_as_native_hardsigmoid(tmp_path):
    model = unary_model("HardSigmoid", [1, 8, 4, 4], alpha=0.2, beta=0.6)
    target = with_refusals(HardSigmoid=lambda n: not np.isclose(n.attrs.get("alpha", 0.2), 1 / 6))
    ctx = rewritten(model, tmp_path, target)
    assert ops_of(ctx) == ["Mul", "Add", "HardSigmoid"]
    assert_same_outputs(model, ctx, {"x": feed([1, 8, 4, 4], -8, 8)})


def test_hardsigmoid_falls_back_to_the_relu6_form_without_a_native_kernel(tmp_path):
    model = unary_model("HardSigmoid", [1, 8, 4, 4], alpha=0.2, beta=0.6)
    ctx = rewritten(model, tmp_path, with_refusals(HardSigmoid=lambda n: True))
    assert ops_of(ctx) == ["Mul", "Add", "Clip", "Mul"]
    assert_same_outputs(model, ctx, {"x": feed([1, 8, 4, 4], -8, 8)})


def test_native_hardsigmoid_is_not_touched(tmp_path):
    model = unary_model("HardSigmoid", [1, 8, 4, 4], alpha=float(np.float32(1 / 6)))
    ctx = rewritten(model, tmp_path, with_refusals(HardSigmoid=lambda n: True))
    assert ops_of(ctx) == ["HardSigmoid"]


def test_elu_with_other_alpha_runs_as_elu1_and_relu(tmp_path):
    model = unary_model("Elu", [1, 8, 4, 4], alpha=0.3)
    ctx = rewritten(model, tmp_path, with_refusals(Elu=lambda n: n.attrs.get("alpha", 1.0) != 1.0))
    assert sorted(ops_of(ctx)) == ["Add", "Elu", "Mul", "Mul", "Relu"]
    assert_same_outputs(model, ctx, {"x": feed([1, 8, 4, 4])})


# --- BatchNormalization ------------------------------------------------------------------------

def batchnorm_weights(channels):
    return [weight("gamma", RNG.uniform(0.5, 2, channels).astype(np.float32)),
            weight("beta", RNG.uniform(-1, 1, channels).astype(np.float32)),
            weight("mean", RNG.uniform(-1, 1, channels).astype(np.float32)),
            weight("var", RNG.uniform(0.5, 2, channels).astype(np.float32))]


def test_batchnorm_after_conv_folds_into_its_weights(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], name="bn")]
    model = make_model(nodes, [value_info("x", [1, 3, 6, 6])], [value_info("y", [1, 4, 6, 6])],
                       [weight("w", RNG.normal(size=[4, 3, 3, 3]).astype(np.float32)),
                        weight("b", RNG.normal(size=[4]).astype(np.float32))] + batchnorm_weights(4))
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Conv"]
    assert ctx.origins[ctx.graph.nodes[0].name] == ("conv", "bn")
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 6, 6])}, rtol=1e-4, atol=1e-4)


def test_batchnorm_after_a_shared_conv_output_is_not_folded(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], name="bn"),
             helper.make_node("Relu", ["c"], ["z"], name="relu")]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])],
                       [value_info("y", [1, 4, 4, 4]), value_info("z", [1, 4, 4, 4])],
                       [weight("w", RNG.normal(size=[4, 3, 1, 1]).astype(np.float32))] + batchnorm_weights(4))
    assert ops_of(rewritten(model, tmp_path, get_target("rk3588"))) == ["Conv", "BatchNormalization", "Relu"]


def test_standalone_batchnorm_becomes_mul_add_where_refused(tmp_path):
    node = helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"], name="bn")
    model = make_model([node], [value_info("x", [1, 4, 5, 5])], [value_info("y", [1, 4, 5, 5])], batchnorm_weights(4))
    ctx = rewritten(model, tmp_path, with_refusals(BatchNormalization=lambda n: True))
    assert ops_of(ctx) == ["Mul", "Add"]
    assert_same_outputs(model, ctx, {"x": feed([1, 4, 5, 5])}, rtol=1e-4, atol=1e-5)


# --- pooling -----------------------------------------------------------------------------------

@pytest.mark.parametrize("size, kernel, stride", [(8, 3, 2), (111, 3, 2), (10, 2, 3)])
def test_maxpool_ceil_mode_becomes_explicit_end_pads(tmp_path, size, kernel, stride):
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[kernel, kernel],
                            strides=[stride, stride], ceil_mode=1)
    out = -(-(size - kernel) // stride) + 1
    model = make_model([node], [value_info("x", [1, 2, size, size])], [value_info("y", [1, 2, out, out])])
    ctx = rewritten(model, tmp_path, with_refusals(MaxPool=lambda n: n.attrs.get("ceil_mode", 0) == 1))
    assert ops_of(ctx) == ["MaxPool"] and ctx.graph.nodes[0].attrs["ceil_mode"] == 0
    assert_same_outputs(model, ctx, {"x": feed([1, 2, size, size])})


@pytest.mark.parametrize("size, include_pad, ops", [(8, 1, ["AveragePool"]), (8, 0, ["AveragePool"]),
                                                    (7, 0, ["AveragePool", "Mul"])])
def test_average_pool_ceil_mode_becomes_floor_mode_where_the_count_allows(tmp_path, size, include_pad, ops):
    # ResNet-D / ResNeSt downsampling: 2x2 stride 2, ceil_mode=1; on an even map floor mode gives
    # the same windows, on an odd one the end pad it adds is excluded from the count as ONNX
    # excludes the window's part past the input
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                            ceil_mode=1, count_include_pad=include_pad)
    out = -(-size // 2)
    model = make_model([node], [value_info("x", [1, 2, size, size])], [value_info("y", [1, 2, out, out])])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ops and ctx.graph.nodes[0].attrs["ceil_mode"] == 0
    assert_same_outputs(model, ctx, {"x": feed([1, 2, size, size])})


def test_average_pool_ceil_mode_counting_pads_it_would_add_stays_and_says_why(tmp_path):
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                            ceil_mode=1, count_include_pad=1)
    model = make_model([node], [value_info("x", [1, 2, 7, 7])], [value_info("y", [1, 2, 4, 4])])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["AveragePool"] and ctx.graph.nodes[0].attrs["ceil_mode"] == 1
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["pool"]}
    assert "count_include_pad is 1 and floor mode needs more end padding" in outcomes["average_pool_ceil_to_pads"]


@pytest.mark.parametrize("size, kernels", [(1, []), (7, [7]), (13, [7, 2]), (20, [5, 4]), (40, [7, 6]), (49, [7, 7]),
                                           (50, [5, 5, 2])])
def test_pool_stage_kernels_use_the_fewest_stages_of_at_most_7(size, kernels):
    assert pool_stage_kernels(size, limit=7) == kernels


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("spatial", [(13, 13), (40, 20), (9, 3), (508,), (13,)])
def test_big_global_pools_become_tiling_pools(tmp_path, op, spatial):
    """Over a 2-D map, or over a sequence's (N, C, L) (1-D pools along L, staged after fusion:
    a late rule, so a norm's mean stays whole for the norm rewrites)."""
    model = unary_model(op, [1, 3, *spatial])
    model.graph.output[0].CopyFrom(value_info("y", [1, 3] + [1] * len(spatial)))
    refused = with_refusals(**{op: lambda n: max(shape_of(n)[2:]) > 7})
    ctx = rewritten(model, tmp_path, refused)
    if len(spatial) == 1:
        assert rules_fired(ctx) == []
        rewrite_late.run(ctx)
        assert rules_fired(ctx) == ["sequence_pool_to_stages"]
    pools = [n for n in ctx.graph.nodes if n.op in ("AveragePool", "MaxPool")]
    assert pools and all(len(n.attrs["kernel_shape"]) == len(spatial) for n in pools)
    assert all(max(n.attrs["kernel_shape"]) <= 7 and max(n.attrs["pads"]) <= 6 for n in pools)
    x = feed([1, 3, *spatial])
    if len(spatial) == 2:
        assert_same_outputs(model, ctx, {"x": x})
        return
    # onnx's ReferenceEvaluator pools a 1-D global pool's input to (N, 1): numpy says what it is
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    (got,) = ReferenceEvaluator(after).run(None, {"x": x})
    reduce = np.mean if op == "GlobalAveragePool" else np.max
    np.testing.assert_allclose(got, reduce(x, axis=2, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spatial, steps", [((8, 8), ["Conv"]), ((8, 4), ["Conv"]), ((8, 6), ["AveragePool", "AveragePool"])])
def test_a_global_average_pool_one_depthwise_conv_covers_exactly_is_that_conv(tmp_path, spatial, steps):
    """A float plan pools a map of at most the depthwise kernel limit (8) and a power-of-two area
    as one depthwise Conv of weights 1/area, exact in float16; 8x6 (1/48 is not) keeps its stages."""
    import rkcompile

    model = unary_model("GlobalAveragePool", [1, 3, *spatial])
    model.graph.output[0].CopyFrom(value_info("y", [1, 3, 1, 1]))
    path = tmp_path / "pool.onnx"
    onnx.save(model, path)
    plan = rkcompile.compile(path, target="rk3588")
    assert [step.kernel for step in plan.record.steps if step.device == "npu"] == steps
    x = feed([1, 3, *spatial])
    np.testing.assert_allclose(rkcompile.run(plan, {"x": x})["y"], x.mean(axis=(2, 3), keepdims=True),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("opset, keepdims", [(13, 1), (18, 1), (18, 0)])
def test_reducemean_over_height_and_width_becomes_global_average_pool(tmp_path, opset, keepdims):
    out_shape = [1, 6, 1, 1] if keepdims else [1, 6]
    if opset >= 18:
        node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="mean", keepdims=keepdims)
        initializers = [weight("axes", np.array([-1, -2], dtype=np.int64))]
    else:
        node = helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[2, 3], keepdims=keepdims)
        initializers = []
    model = make_model([node], [value_info("x", [1, 6, 5, 5])], [value_info("y", out_shape)], initializers, opset=opset)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["GlobalAveragePool"] + ([] if keepdims else ["Reshape"])
    assert_same_outputs(model, ctx, {"x": feed([1, 6, 5, 5])})


# --- matrix products ---------------------------------------------------------------------------

def test_gemm_with_transb_alpha_and_beta_becomes_a_1x1_conv(tmp_path):
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc", transB=1, alpha=0.5, beta=2.0)
    model = make_model([node], [value_info("x", [2, 6])], [value_info("y", [2, 5])],
                       [weight("w", RNG.normal(size=[5, 6]).astype(np.float32)),
                        weight("c", RNG.normal(size=[5]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Reshape", "Conv", "Reshape"]
    assert_same_outputs(model, ctx, {"x": feed([2, 6])})


def test_gemm_with_a_per_row_bias_is_not_a_conv(tmp_path):
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")
    model = make_model([node], [value_info("x", [2, 6])], [value_info("y", [2, 5])],
                       [weight("w", RNG.normal(size=[6, 5]).astype(np.float32)),
                        weight("c", RNG.normal(size=[2, 5]).astype(np.float32))])
    assert ops_of(rewritten(model, tmp_path, get_target("rk3588"))) == ["Gemm"]


@pytest.mark.parametrize("constant_first", [False, True])
def test_matmul_with_a_constant_operand_becomes_a_1x1_conv(tmp_path, constant_first):
    if constant_first:
        node = helper.make_node("MatMul", ["w", "x"], ["y"], name="mm")
        x_shape, w_shape, y_shape = [2, 6, 5], [4, 6], [2, 4, 5]
    else:
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
        x_shape, w_shape, y_shape = [1, 7, 6], [6, 4], [1, 7, 4]
    model = make_model([node], [value_info("x", x_shape)], [value_info("y", y_shape)],
                       [weight("w", RNG.normal(size=w_shape).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Reshape", "Conv", "Reshape"]
    assert_same_outputs(model, ctx, {"x": feed(x_shape)})


@pytest.mark.parametrize("constant_first", [False, True])
def test_a_matmul_weight_becomes_a_conv_weight_read_only_when_needed(tmp_path, caplog, constant_first):
    """The Conv's weight is the MatMul's, transposed (or not) and given two unit axes, worked out
    when something reads it: a float16 plan reads neither (the range check reads the MatMul's
    weight as it stands, and still names a value beyond float16, which it then reads to
    saturate); read, it and its export are what the weight itself gives."""
    import logging

    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, constant_to_onnx_tensor
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from rkcompile.ir.nodes import DerivedValues
    from rkcompile.compiler.pipeline import compile_model

    if constant_first:
        node, x_shape, y_shape = helper.make_node("MatMul", ["w", "x"], ["y"], name="mm"), [2, 4, 5], [2, 6, 5]
    else:
        node, x_shape, y_shape = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), [1, 7, 6], [1, 7, 4]
    w = RNG.normal(size=[6, 4]).astype(np.float32)
    for beyond in (False, True):
        w[1, 2] = 7e4 if beyond else 0.5
        path = tmp_path / "matmul.onnx"
        onnx.save(make_model([node], [value_info("x", x_shape)], [value_info("y", y_shape)], [weight("w", w)]), path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rkcompile"):
            plan, ctx = compile_model(path, "rk3588")
        warned = any("constant mm/weight holds 1 value(s)" in r.getMessage() for r in caplog.records)
        assert warned == beyond
        conv_weight = next(t for node in ctx.graph.nodes for t in node.inputs if t.name == "mm/weight")
        expected = (w if constant_first else w.T)[:, :, None, None]
        assert plan.tensors["mm/weight"].shape == expected.shape and conv_weight.dtype == expected.dtype
        if beyond:
            continue
        derived = conv_weight._values
        assert isinstance(derived, DerivedValues) and not derived.loaded
        assert type(derived.source._values) is LazyValues  # the MatMul's weight, never read
        exported = OnnxExporter.export_tensor_proto(conv_weight)
        assert exported == constant_to_onnx_tensor(gs.Constant("mm/weight", np.ascontiguousarray(expected)))
        np.testing.assert_array_equal(conv_weight.values, expected)
        assert conv_weight.values.flags.c_contiguous


@pytest.mark.parametrize("trans_b, alpha", [(1, 1.0), (0, 2.5)])
def test_a_gemm_weight_becomes_a_conv_weight_read_only_when_needed(tmp_path, trans_b, alpha):
    """B, transposed unless transB and scaled by alpha, is the Conv's weight, worked out when
    something reads it: a float16 plan does not unless alpha changes the values (its range
    check reads them); read, it is what the arithmetic gives."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from rkcompile.ir.nodes import DerivedValues
    from rkcompile.compiler.pipeline import compile_model

    b = RNG.normal(size=[5, 6] if trans_b else [6, 5]).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "b", "c"], ["y"], name="fc", transB=trans_b, alpha=alpha)
    path = tmp_path / "gemm.onnx"
    onnx.save(make_model([node], [value_info("x", [2, 6])], [value_info("y", [2, 5])],
                         [weight("b", b), weight("c", RNG.normal(size=[5]).astype(np.float32))]), path)
    _, ctx = compile_model(path, "rk3588")
    conv_weight = next(t for node in ctx.graph.nodes for t in node.inputs if t.name == "fc/weight")
    derived = conv_weight._values
    # alpha changes the values: the range check reads them
    assert isinstance(derived, DerivedValues) and derived.keeps_values == (alpha == 1) and derived.loaded == (alpha != 1)
    assert (type(derived.source._values) is LazyValues) == (alpha == 1)
    expected = ((b if trans_b else b.T) * np.float32(alpha))[:, :, None, None]
    assert conv_weight.shape == expected.shape
    np.testing.assert_array_equal(conv_weight.values, expected)


def test_matmul_bias_add_becomes_the_conv_bias(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="bias")]
    model = make_model(nodes, [value_info("x", [1, 7, 6])], [value_info("y", [1, 7, 4])],
                       [weight("w", RNG.normal(size=[6, 4]).astype(np.float32)),
                        weight("b", RNG.normal(size=[4]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Reshape", "Conv", "Reshape"]
    conv = ctx.graph.nodes[1]
    assert len(conv.inputs) == 3 and ctx.origins[conv.name] == ("mm", "bias")
    assert_same_outputs(model, ctx, {"x": feed([1, 7, 6])})


def test_residual_add_after_a_matmul_by_weights_runs_on_the_conv_layout(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["xb"], name="bias"),
             helper.make_node("Add", ["r", "xb"], ["y"], name="residual")]
    model = make_model(nodes, [value_info("x", [1, 7, 6]), value_info("r", [1, 7, 4])], [value_info("y", [1, 7, 4])],
                       [weight("w", RNG.normal(size=[6, 4]).astype(np.float32)),
                        weight("b", RNG.normal(size=[4]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    conv = next(n for n in ctx.graph.nodes if n.op == "Conv")
    (add,) = conv.outputs[0].outputs
    assert add.op == "Add" and static_shape(add.outputs[0]) == (7, 4, 1, 1)
    assert_same_outputs(model, ctx, {"x": feed([1, 7, 6]), "r": feed([1, 7, 4])})


@pytest.mark.parametrize("target_name, k, segments", [("rk3576", 5000, 2), ("rk3576", 9000, 3), ("rk3588", 9000, 2)])
def test_matmul_k_over_the_limit_is_split_per_seed_002(tmp_path, target_name, k, segments):
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    model = make_model([node], [value_info("a", [1, 2, k]), value_info("b", [1, k, 3])], [value_info("y", [1, 2, 3])])
    limit = {"rk3576": 4096, "rk3588": 8192}[target_name]
    ctx = rewritten(model, tmp_path, with_refusals(target_name, MatMul=lambda n: shape_of(n)[-1] > limit))
    assert ops_of(ctx).count("MatMul") == segments and ops_of(ctx).count("Add") == segments - 1
    assert all(shape_of(n)[-1] <= limit for n in ctx.graph.nodes if n.op == "MatMul")
    feeds = {"a": feed([1, 2, k], -1, 1), "b": feed([1, k, 3], -1, 1)}
    assert_same_outputs(model, ctx, feeds, rtol=1e-4, atol=1e-3)


# --- normalization, softmax, layout ------------------------------------------------------------

def test_layernorm_over_the_last_axis_runs_over_channels(tmp_path):
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1, epsilon=1e-5)
    model = make_model([node], [value_info("x", [1, 5, 8])], [value_info("y", [1, 5, 8])],
                       [weight("s", RNG.normal(size=[8]).astype(np.float32)),
                        weight("b", RNG.normal(size=[8]).astype(np.float32))])
    refused = with_refusals(LayerNormalization=lambda n: len(shape_of(n)) != 4 or n.attrs.get("axis", -1) != 1)
    ctx = rewritten(model, tmp_path, refused)
    assert ops_of(ctx) == ["Reshape", "LayerNormalization", "Reshape"]
    assert shape_of(ctx.graph.nodes[1]) == [5, 8, 1, 1]
    assert_same_outputs(model, ctx, {"x": feed([1, 5, 8])}, rtol=1e-4, atol=1e-4)


def softmax_axis_refused(node):
    return node.attrs.get("axis", -1) % 4 not in (1, 3)


def test_softmax_on_axis_2_is_transposed_onto_axis_3(tmp_path):
    model = unary_model("Softmax", [1, 3, 16, 8], axis=2)  # h % 16 = 0 suits rk3588's Transpose limits
    ctx = rewritten(model, tmp_path, with_refusals(Softmax=softmax_axis_refused))
    assert ops_of(ctx) == ["Transpose", "Softmax", "Transpose"]
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 16, 8])})


def test_softmax_relabels_instead_where_the_transpose_is_refused(tmp_path):
    model = unary_model("Softmax", [1, 3, 16, 8], axis=2)
    ctx = rewritten(model, tmp_path, with_refusals(Softmax=softmax_axis_refused, Transpose=lambda n: True))
    assert ops_of(ctx) == ["Reshape", "Softmax", "Reshape"]
    assert shape_of(ctx.graph.nodes[1]) == [3, 16, 8, 1] and ctx.graph.nodes[1].attrs["axis"] == 1
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 16, 8])})


@pytest.mark.parametrize("opset", [11, 17])
def test_rank3_softmax_on_the_last_axis_is_relabelled_to_4d(tmp_path, opset):
    model = unary_model("Softmax", [2, 5, 6], opset=opset, axis=2)
    refused = with_refusals(Softmax=lambda n: len(shape_of(n)) != 4 or n.attrs.get("axis", -1) % 4 not in (1, 3))
    ctx = rewritten(model, tmp_path, refused)
    assert ops_of(ctx) == ["Reshape", "Softmax", "Reshape"]
    assert shape_of(ctx.graph.nodes[1]) == [1, 10, 1, 6]
    assert_same_outputs(model, ctx, {"x": feed([2, 5, 6])})


def test_rank3_elementwise_chain_runs_4d_with_relabels_only_at_the_ends(tmp_path):
    nodes = [helper.make_node("Add", ["x", "c"], ["t"], name="add"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    model = make_model(nodes, [value_info("x", [2, 5, 6])], [value_info("y", [2, 5, 6])],
                       [weight("c", RNG.normal(size=[6]).astype(np.float32))])
    refused = with_refusals(Add=lambda n: len(shape_of(n)) != 4, Relu=lambda n: len(shape_of(n)) != 4)
    ctx = rewritten(model, tmp_path, refused)
    assert ops_of(ctx) == ["Reshape", "Add", "Relu", "Reshape"]
    assert "collapse_relabels" in rules_fired(ctx)
    assert_same_outputs(model, ctx, {"x": feed([2, 5, 6])})


def test_a_scale_and_shift_before_a_relu_run_as_one_conv_relu(tmp_path):
    """tf2onnx's Keras BatchNormalization after a Concat (DenseNet): x * scale + shift, per
    channel, then Relu, as a depthwise 1x1 Conv that fuses with the Relu: one step, not two."""
    nodes = [helper.make_node("Concat", ["a", "b"], ["x"], name="concat", axis=1),
             helper.make_node("Mul", ["x", "scale"], ["scaled"], name="bn_mul"),
             helper.make_node("Add", ["scaled", "shift"], ["shifted"], name="bn_add"),
             helper.make_node("Relu", ["shifted"], ["y"], name="relu")]
    model = make_model(nodes, [value_info("a", [1, 2, 5, 5]), value_info("b", [1, 3, 5, 5])],
                       [value_info("y", [1, 5, 5, 5])],
                       [weight("scale", RNG.uniform(0.5, 2, [1, 5, 1, 1]).astype(np.float32)),
                        weight("shift", RNG.normal(size=[5, 1, 1]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "scale_and_shift_before_activation_as_conv" in rules_fired(ctx)
    (conv,) = [n for n in ctx.graph.nodes if n.op == "Conv"]
    assert conv.attrs["group"] == 5 and [r.op for r in conv.outputs[0].outputs] == ["Relu"]
    assert not any(n.op in ("Mul", "Add") for n in ctx.graph.nodes)
    assert_same_outputs(model, ctx, {"a": feed([1, 2, 5, 5]), "b": feed([1, 3, 5, 5])})


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_a_pool_whose_windows_tile_the_map_is_staged_under_the_limit(tmp_path, op):
    """paddle's adaptive_avg_pool2d to 2x2 of an 8x18 map: kernel = stride = [4, 9], over the
    limit of 7, as stages [4, 3] then [1, 3]; the rows and columns left over drop alike."""
    nodes = [helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=[4, 9], strides=[4, 9])]
    model = make_model(nodes, [value_info("x", [1, 3, 9, 19])], [value_info("y", [1, 3, 2, 2])])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    pools = [n for n in ctx.graph.nodes if n.op == op]
    assert [p.attrs["kernel_shape"] for p in pools] == [[4, 3], [1, 3]]
    assert not any(check_node(p, get_target("rk3588")) for p in pools)
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 9, 19])})


def paddle_pad(pads: list[int], extra_reader: bool = False) -> onnx.ModelProto:
    """paddle2onnx's F.pad of a 4-D map [1, 6, 5, 7]: Unsqueeze to 5-D, Pad by `pads` (an odd
    constant value, as it writes one), Squeeze back; the Unsqueezed map also a graph output
    where `extra_reader`."""
    padded = [size + pads[axis] + pads[5 + axis] for axis, size in enumerate([1, 6, 1, 5, 7])]
    nodes = [helper.make_node("Unsqueeze", ["x", "axis"], ["u"], name="to5d"),
             helper.make_node("Pad", ["u", "pads", "value"], ["p"], name="pad3d", mode="constant"),
             helper.make_node("Squeeze", ["p", "axis"], ["y"], name="to4d")]
    outputs = [value_info("y", [size for axis, size in enumerate(padded) if axis != 2])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["u"], ["z"], name="other_reader"))
        outputs.append(value_info("z", [1, 6, 1, 5, 7]))
    return make_model(nodes, [value_info("x", [1, 6, 5, 7])], outputs,
                      [weight("axis", np.array([2], np.int64)), weight("pads", np.array(pads, np.int64)),
                       weight("value", np.array(0.5, np.float32))])


@pytest.mark.parametrize("extra_reader", [False, True])
def test_rank5_pad_of_a_4d_map_is_the_pad_of_the_map(tmp_path, extra_reader):
    """The Pad between relabels that only add and take away a unit axis is the legal Pad of the
    4-D map itself: no relabel left of the Pad's, where the region's rank-3 view [6, 5, 7]
    put the map's channels on the batch axis between two relabels. An Unsqueezed map that
    another op reads too keeps its Unsqueeze for that op."""
    model = paddle_pad([0, 0, 0, 0, 2, 0, 0, 0, 1, 1], extra_reader)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "pad_between_unit_axes" in rules_fired(ctx)
    (pad,) = [n for n in ctx.graph.nodes if n.op == "Pad"]
    assert pad.inputs[0].name == "x" and pad.outputs[0].name == "y"
    assert not check_node(pad, get_target("rk3588"))
    feeds = {"x": feed([1, 6, 5, 7])}
    assert_same_outputs(model, ctx, feeds)


def reshaped_pad(pads: list[int], shape: list[int]) -> onnx.ModelProto:
    """A map [1, 6, 5, 7] Unsqueezed at axis 2, padded by `pads` and Reshaped to `shape`."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axis"], ["u"], name="to5d"),
             helper.make_node("Pad", ["u", "pads"], ["p"], name="pad3d", mode="constant"),
             helper.make_node("Reshape", ["p", "shape"], ["y"], name="to4d")]
    return make_model(nodes, [value_info("x", [1, 6, 5, 7])], [value_info("y", shape)],
                      [weight("axis", np.array([2], np.int64)), weight("shape", np.array(shape, np.int64)),
                       weight("pads", np.array(pads, np.int64))])


def test_rank5_pad_relabelled_to_its_sizes_in_another_rank_is_a_pad_and_a_relabel(tmp_path):
    """The relabel after the Pad may move where the unit axes stand ([1, 6, 1, 6, 10] into
    [6, 6, 10, 1]): the same sizes, so the Pad of the map and one relabel to that shape."""
    model = reshaped_pad([0, 0, 0, 0, 2, 0, 0, 0, 1, 1], [6, 6, 10, 1])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "pad_between_unit_axes" in rules_fired(ctx)
    assert [n.op for n in ctx.graph.nodes] == ["Pad", "Reshape"]
    assert_same_outputs(model, ctx, {"x": feed([1, 6, 5, 7])})


def test_rank5_pad_of_an_added_axis_runs_as_a_region(tmp_path):
    """A Pad of the added unit axis (to 3, Reshaped into the channels after) is no Pad of the
    map: the rule declines and says so."""
    model = reshaped_pad([0, 0, 1, 1, 1, 0, 0, 1, 1, 1], [1, 18, 7, 9])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "pad_between_unit_axes" not in rules_fired(ctx)
    declined = {a.outcome for tried in ctx.rewrite_attempts.values() for a in tried
                if a.rule == "pad_between_unit_axes"}
    assert any("pads an added one" in reason for reason in declined)
    assert_same_outputs(model, ctx, {"x": feed([1, 6, 5, 7])})


def test_rank5_linear_layer_runs_4d(tmp_path):
    """Twins' projection of its [N, h, w, wh, ww, C] windows: a MatMul by a 2-D constant of a
    rank-5 tensor, here between a relabel into windows and a softmax over the last axis. Every
    axis but the last merges alike in its operand and its result, and the region runs at rank 4."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"], name="windows"),
             helper.make_node("MatMul", ["r5", "w"], ["m5"], name="linear"),
             helper.make_node("Softmax", ["m5"], ["p5"], name="softmax", axis=-1),
             helper.make_node("Reshape", ["p5", "s4"], ["y"], name="merge")]
    model = make_model(nodes, [value_info("x", [1, 6, 5, 8])], [value_info("y", [1, 6, 5, 12])],
                       [weight("s5", np.array([1, 2, 3, 5, 8], np.int64)), weight("s4", np.array([1, 6, 5, 12], np.int64)),
                        weight("w", RNG.normal(0, 0.5, (8, 12)).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "collapse_rank_region" in rules_fired(ctx)
    assert all(len(t.shape) <= 4 for n in ctx.graph.nodes for t in n.outputs)
    assert_same_outputs(model, ctx, {"x": feed([1, 6, 5, 8])})


def test_rank5_product_broadcast_over_heads_runs_4d(tmp_path):
    """A lambda layer's position lambdas: [1, heads, L, 1, k] @ [1, 1, L, k, v], broadcast over
    the heads, then the row axis squeezed. The heads move into the one row of the first operand
    and back (Transposes either side of a product of equal batch axes), and the region runs at
    rank 4 with the same numbers."""
    nodes = [helper.make_node("Unsqueeze", ["q", "axis3"], ["q5"], name="rows"),
             helper.make_node("Reshape", ["lambdas", "s5"], ["l5"], name="per_position"),
             helper.make_node("MatMul", ["q5", "l5"], ["m5"], name="position_lambdas"),
             helper.make_node("Squeeze", ["m5", "axis3"], ["y"], name="drop_rows")]
    model = make_model(nodes, [value_info("q", [1, 4, 12, 8]), value_info("lambdas", [1, 12, 8, 6])],
                       [value_info("y", [1, 4, 12, 6])],
                       [weight("axis3", np.array([3], np.int64)), weight("s5", np.array([1, 1, 12, 8, 6], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "collapse_rank_region" in rules_fired(ctx)
    assert all(len(t.shape) <= 4 for n in ctx.graph.nodes for t in n.outputs)
    assert_same_outputs(model, ctx, {"q": feed([1, 4, 12, 8]), "lambdas": feed([1, 12, 8, 6])})


def test_rank5_channel_shuffle_becomes_a_4d_transpose_between_relabels(tmp_path):
    """shufflenet's Reshape -> Transpose(rank 5) -> Reshape: the rank-5 relabels are absorbed.
    The shuffle's result is flattened to [1, 12, 25] here: one back in the input's own shape
    becomes a channel-picking Conv first (tests/test_channel_shuffle.py)."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"], name="split_groups"),
             helper.make_node("Transpose", ["r5"], ["t5"], name="shuffle", perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t5", "s3"], ["y"], name="merge_groups")]
    model = make_model(nodes, [value_info("x", [1, 12, 5, 5])], [value_info("y", [1, 12, 25])],
                       [weight("s5", np.array([1, 3, 4, 5, 5], np.int64)), weight("s3", np.array([1, 12, 25], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3576"))
    assert "collapse_rank_region" in rules_fired(ctx)
    assert all(len(t.shape) <= 4 for n in ctx.graph.nodes for t in n.outputs)
    moves = [n for n in ctx.graph.nodes if n.op in ("Transpose", "Concat")]
    # one Transpose of the 3 groups and 4 channels; [3, 4, 25] breaks h1 % 8 == 0, [3, 4, 5, 5] does not
    assert len(moves) == 1 and not check_node(moves[0], get_target("rk3576"))
    assert_same_outputs(model, ctx, {"x": feed([1, 12, 5, 5])})


def test_refused_transpose_of_a_small_axis_becomes_split_and_concat(tmp_path):
    """attention's q/k/v Transpose [64, 3, 128] -> [3, 64, 128] as rknn-toolkit2 runs it."""
    model = unary_model("Transpose", [64, 3, 128], perm=[1, 0, 2])
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 64
    ctx = rewritten(model, tmp_path, with_refusals(Transpose=lambda n: True))
    assert rules_fired(ctx) == ["transpose_small_axis_as_concat"]
    assert sorted(set(ops_of(ctx))) == ["Concat", "Reshape", "Split"]
    assert_same_outputs(model, ctx, {"x": feed([64, 3, 128])})


def test_transpose_over_its_limits_runs_on_another_view_or_in_slices(tmp_path):
    shape, perm = [1, 4, 64, 32], [2, 0, 1, 3]
    model = unary_model("Transpose", shape, perm=perm)
    for axis, size in enumerate([shape[p] for p in perm]):
        model.graph.output[0].type.tensor_type.shape.dim[axis].dim_value = size
    big = with_refusals(Transpose=lambda n: np.prod(shape_of(n)) >= 8192)
    ctx = rewritten(model, tmp_path, big)
    assert rules_fired(ctx) == ["transpose_as_legal_view"]
    assert ops_of(ctx).count("Transpose") == 2 and "Concat" in ops_of(ctx)
    assert_same_outputs(model, ctx, {"x": feed(shape)})


def test_gather_of_a_scalar_index_becomes_slice_and_relabel(tmp_path):
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], name="pick", axis=1)],
                       [value_info("x", [2, 3, 8])], [value_info("y", [2, 8])],
                       [weight("i", np.array(-1, np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == ["gather_scalar_to_slice"]
    assert ops_of(ctx) == ["Slice", "Reshape"]
    assert_same_outputs(model, ctx, {"x": feed([2, 3, 8])})


def test_average_pool_excluding_pads_runs_as_the_npu_pool_times_a_border_map(tmp_path):
    model = unary_model("AveragePool", [1, 3, 7, 7], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == ["average_pool_excluding_pads"]
    assert ops_of(ctx) == ["AveragePool", "Mul"]
    assert ctx.graph.nodes[0].attrs["count_include_pad"] == 1
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 7, 7])})


def test_sum_of_three_becomes_two_adds(tmp_path):
    model = make_model([helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum")],
                       [value_info(n, [1, 4, 3, 3]) for n in "abc"], [value_info("y", [1, 4, 3, 3])], opset=8)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Add", "Add"] and rules_fired(ctx) == ["sum_to_adds"]
    assert_same_outputs(model, ctx, {n: feed([1, 4, 3, 3]) for n in "abc"})


def test_neg_becomes_a_mul_by_minus_one_and_an_integer_neg_is_left(tmp_path):
    """Rotary embeddings' rotate_half: cat(-x2, x1). Neg is not on the NPU, x * -1 is, exactly."""
    model = make_model([helper.make_node("Neg", ["x"], ["y"], name="neg"),
                        helper.make_node("Neg", ["i"], ["j"], name="int_neg")],
                       [value_info("x", [1, 4, 32, 8]), value_info("i", [1, 4], TensorProto.INT64)],
                       [value_info("y", [1, 4, 32, 8]), value_info("j", [1, 4], TensorProto.INT64)])
    ctx = rewritten(model, tmp_path, get_target("rk3562"))
    assert sorted(ops_of(ctx)) == ["Mul", "Neg"] and rules_fired(ctx) == ["neg_to_mul"]
    assert [n.name for n in ctx.graph.nodes if n.op == "Neg"] == ["int_neg"]
    assert_same_outputs(model, ctx, {"x": feed([1, 4, 32, 8]), "i": np.arange(-2, 2).reshape(1, 4)},
                        rtol=0, atol=0)


def test_an_expand_read_by_broadcasting_ops_is_dropped(tmp_path):
    """SwiftFormer's x / norm.expand_as(x): the Div broadcasts the [1, 1, 1] norm itself, to the
    same values; an Expand whose reader's other operand is smaller stays."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=1),
             helper.make_node("Expand", ["peak", "full"], ["spread"], name="expand"),
             helper.make_node("Div", ["x", "spread"], ["y"], name="div"),
             helper.make_node("Expand", ["peak", "full"], ["kept"], name="expand_kept"),
             helper.make_node("Mul", ["kept", "row"], ["z"], name="mul")]
    model = make_model(nodes, [value_info("x", [1, 64, 1]), value_info("row", [1, 1, 1])],
                       [value_info("y", [1, 64, 1]), value_info("z", [1, 64, 1])],
                       [weight("full", np.array([1, 64, 1], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx).count("expand_into_broadcast") == 1
    assert [n.name for n in ctx.graph.nodes if n.op == "Expand"] == ["expand_kept"]
    assert_same_outputs(model, ctx, {"x": feed([1, 64, 1]), "row": feed([1, 1, 1])}, rtol=0, atol=0)


@pytest.mark.parametrize("rank, repeat", [(4, "Conv"), (3, "Concat")])
def test_unlisted_broadcast_repeats_the_computed_operand(tmp_path, rank, repeat):
    """bert's attention mask: [1, 1, 8, 8] + [1, 4, 8, 8] is none of the Expand patterns. At rank
    4 a 1x1 Conv of ones makes the channels (it reads one C2 block where a Concat of 4 copies
    reads 4); at rank 3 a Concat of copies (the Conv would need relabels to and from 4-D)."""
    shape = [1, 4, 8, 8][4 - rank:]
    mask = [1] * (rank - 3) + [1, 8, 8]
    model = make_model([helper.make_node("Add", ["scores", "mask"], ["y"], name="add")],
                       [value_info("scores", shape), value_info("mask", mask)], [value_info("y", shape)])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == []  # a late rule: fusion patterns get their chance first
    rewrite_late.run(ctx)
    assert rules_fired(ctx) == ["broadcast_by_concat"]
    assert ops_of(ctx) == [repeat, "Add"]
    assert_same_outputs(model, ctx, {"scores": feed(shape), "mask": feed(mask)}, rtol=0, atol=0)


@pytest.mark.parametrize("rank", [3, 4])
def test_a_broadcast_to_many_channels_repeats_the_operand_by_a_conv_of_ones(tmp_path, rank):
    """A LayerNorm written out by jax2tf subtracts its [1, 1, 256] mean from [1, 512, 256]: too
    many copies for a Concat, so a 1x1 Conv of ones makes the 512 channels, exactly."""
    spatial = [4, 64] if rank == 4 else [256]
    model = make_model([helper.make_node("Sub", ["x", "mean"], ["y"], name="sub")],
                       [value_info("x", [1, 512, *spatial]), value_info("mean", [1, 1, *spatial])],
                       [value_info("y", [1, 512, *spatial])])
    target = get_target("rk3588")
    ctx = rewritten(model, tmp_path, target)
    rewrite_late.run(ctx)
    assert "broadcast_by_concat" in rules_fired(ctx)
    (conv,) = [n for n in ctx.graph.nodes if n.op == "Conv"]
    assert shape_of(conv)[1] == 1 and static_shape(conv.outputs[0])[1] == 512
    assert all(not check_node(n, target, plan_dtype="float16", opset=17) for n in ctx.graph.nodes)
    assert_same_outputs(model, ctx, {"x": feed([1, 512, *spatial]), "mean": feed([1, 1, *spatial])},
                        rtol=0, atol=0)


def test_a_channel_vector_times_a_plane_repeats_only_the_plane(tmp_path):
    """FocalNet's global context [1, C, 1, 1] times its gate [1, 1, H, W]: both broadcast. The gate
    repeated over the channels by a Conv of ones is enough: the NPU multiplies by the context per
    channel, which needed two Concats of 8 copies before."""
    model = make_model([helper.make_node("Mul", ["context", "gate"], ["y"], name="modulate")],
                       [value_info("context", [1, 16, 1, 1]), value_info("gate", [1, 1, 8, 8])],
                       [value_info("y", [1, 16, 8, 8])])
    target = get_target("rk3588")
    ctx = rewritten(model, tmp_path, target)
    rewrite_late.run(ctx)
    assert "broadcast_by_concat" in rules_fired(ctx)
    assert ops_of(ctx) == ["Conv", "Mul"]
    assert all(not check_node(n, target, plan_dtype="float16", opset=17) for n in ctx.graph.nodes)
    assert_same_outputs(model, ctx, {"context": feed([1, 16, 1, 1]), "gate": feed([1, 1, 8, 8])}, rtol=0, atol=0)


def test_transpose_moving_only_unit_axes_is_a_reshape(tmp_path):
    model = unary_model("Transpose", [64, 1, 8], perm=[1, 0, 2])
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 64
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Reshape"] and rules_fired(ctx) == ["transpose_of_unit_axes_to_reshape"]
    assert_same_outputs(model, ctx, {"x": feed([64, 1, 8])})


def test_residual_add_of_a_relabelled_conv_runs_in_the_conv_layout(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "s"], ["cr"], name="relabel"),
             helper.make_node("Add", ["cr", "r"], ["y"], name="residual")]
    model = make_model(nodes, [value_info("x", [6, 5, 1, 1]), value_info("r", [1, 6, 4])], [value_info("y", [1, 6, 4])],
                       [weight("w", RNG.normal(size=[4, 5, 1, 1]).astype(np.float32)),
                        weight("s", np.array([1, 6, 4], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    conv = next(n for n in ctx.graph.nodes if n.op == "Conv")
    (add,) = conv.outputs[0].outputs
    assert add.op == "Add" and "elementwise_in_conv_layout" in rules_fired(ctx)
    assert_same_outputs(model, ctx, {"x": feed([6, 5, 1, 1]), "r": feed([1, 6, 4])})


def test_activation_of_a_relabelled_conv_runs_in_the_conv_layout(tmp_path):
    """bert's pooler: Gemm (a 1x1 Conv) -> relabel -> Tanh becomes Conv -> Tanh -> relabel."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="fc", transB=1),
             helper.make_node("Tanh", ["g"], ["y"], name="tanh")]
    model = make_model(nodes, [value_info("x", [1, 6])], [value_info("y", [1, 4])],
                       [weight("w", RNG.normal(size=[4, 6]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    conv = next(n for n in ctx.graph.nodes if n.op == "Conv")
    assert [reader.op for reader in conv.outputs[0].outputs] == ["Tanh"]
    assert_same_outputs(model, ctx, {"x": feed([1, 6])})


def test_activation_of_a_relabelled_conv_of_unknown_shape_is_left_alone(tmp_path):
    """A Conv output relabelled to a shape known only at run time (tf2onnx's Conv1D after a GRU's
    while-loop): the rule declines on the unknown shape instead of stopping the compile."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["s"], name="relabel"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    model = make_model(nodes, [value_info("x", [1, 6, 1, 4]), value_info("shape", [3], TensorProto.INT64)],
                       [value_info("y", ["a", "b", "c"])], [weight("w", RNG.normal(size=[5, 6, 1, 1]).astype(np.float32))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "elementwise_in_conv_layout" not in rules_fired(ctx)
    assert [n.op for n in ctx.graph.nodes if n.op == "Relu"] == ["Relu"]


def test_a_relabel_whose_readers_all_bypass_it_is_removed(tmp_path):
    """x -> Reshape A -> (Reshape B, Reshape C), both back to x's shape: B and C read x, A goes."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["a"], name="A"),
             helper.make_node("Reshape", ["a", "back"], ["b"], name="B"),
             helper.make_node("Reshape", ["a", "back"], ["c"], name="C"),
             helper.make_node("Add", ["b", "c"], ["y"], name="sum")]
    model = make_model(nodes, [value_info("x", [2, 3, 4, 1])], [value_info("y", [2, 3, 4, 1])],
                       [weight("flat", np.array([2, 12], np.int64)), weight("back", np.array([2, 3, 4, 1], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert ops_of(ctx) == ["Add"]
    assert {o for r in ctx.rewrites for o in r.nodes} == {"A", "B", "C"}
    assert_same_outputs(model, ctx, {"x": feed([2, 3, 4, 1])})


@pytest.mark.parametrize("size, beta", [(5, 0.75), (3, 0.5), (7, 1.0)])
def test_lrn_becomes_a_band_conv_of_squares_and_allowed_pows(tmp_path, size, beta):
    model = unary_model("LRN", [1, 7, 3, 3], size=size, alpha=0.02, beta=beta, bias=1.5)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == ["lrn_to_conv_and_pows"]
    assert "LRN" not in ops_of(ctx) and "Conv" in ops_of(ctx)
    # onnx.reference's LRN sums a window other than the spec's; onnxruntime follows the spec.
    import onnxruntime
    feeds = {"x": feed([1, 7, 3, 3])}
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(ReferenceEvaluator(after).run(None, feeds)[0], expected, rtol=1e-4, atol=1e-5)


# --- the plan ----------------------------------------------------------------------------------

def classifier_tail():
    """GlobalAveragePool (9x9) -> Flatten -> Gemm, the tail of resnet and squeezenet."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w", "c"], ["y"], name="fc", transB=1)]
    return make_model(nodes, [value_info("x", [1, 8, 9, 9])], [value_info("y", [1, 5])],
                      [weight("w", RNG.normal(size=[5, 8]).astype(np.float32)),
                       weight("c", RNG.normal(size=[5]).astype(np.float32))])


def planned(model, tmp_path, target) -> tuple[PlanRecord, CompileContext]:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    ctx = CompileContext(model_path=path, target=target)
    for compiler_pass in PASSES:
        compiler_pass.run(ctx)
    return assemble_plan(ctx), ctx


def test_plan_keeps_one_entry_per_original_node_and_lists_the_rewrites(tmp_path):
    model = classifier_tail()
    target = with_refusals(GlobalAveragePool=lambda n: max(shape_of(n)[2:]) > 7)
    plan, ctx = planned(model, tmp_path, target)
    assert contract_violations(plan, [n.name for n in model.graph.node]) == []
    entries = {n.name: n for n in plan.nodes}
    # Every node left breaks no rule (whether a tiny NPU island pays off is partition's call).
    assert not any(ctx.failures.values())
    assert entries["gap"].step is not None and entries["fc"].step is not None
    assert entries["flatten"].device == "removed" and entries["flatten"].step is None
    assert "relabel" in entries["flatten"].reason
    fc_step = plan.steps[entries["fc"].step]
    # The entry points at the step that produces the node's output (on the NPU side of the
    # host conversion that gives the model output its own name), here through the Gemm's
    # relabel back to rank 2, an alias of the step's output
    produced = {*fc_step.outputs, *(name for name, t in plan.tensors.items() if t.aliases in fc_step.outputs)}
    assert "y" in {o.split("@")[0] for o in produced}
    assert {r.rule for r in plan.rewrites} == {"global_pool_to_stages", "gemm_to_conv", "collapse_relabels"}
    assert all(set(r.nodes) <= set(entries) for r in plan.rewrites)
    assert_same_outputs(model, rewritten(model, tmp_path, target), {"x": feed([1, 8, 9, 9])}, rtol=1e-4, atol=1e-5)


def test_plan_json_round_trips_rewrites_and_older_plans_still_load(tmp_path):
    plan, _ = planned(classifier_tail(), tmp_path, get_target("rk3588"))
    data = json.loads(plan.to_json())
    assert PlanRecord.from_dict(data).rewrites == plan.rewrites and plan.rewrites
    del data["rewrites"]
    assert PlanRecord.from_dict(data).rewrites == ()


@needs_zoo
@pytest.mark.parametrize("name", ["squeezenet1_1", "transformer_encoder"])
def test_zoo_plans_after_rewrites_keep_the_contract(name):
    from conftest import ZOO
    from rkcompile.compiler.pipeline import compile_model

    model = onnx.load(str(ZOO / f"{name}.onnx"), load_external_data=False)
    for target in ("rk3588", "rk3576"):
        plan, _ = compile_model(ZOO / f"{name}.onnx", target)
        assert contract_violations(plan, [n.name for n in model.graph.node]) == []


# --- the engine: chains, declines, limits from the target --------------------------------------

@pytest.mark.parametrize("size", [14, 20, 56])
def test_a_rewrite_whose_result_is_illegal_is_rewritten_again(tmp_path, size):
    """ReduceMean -> GlobalAveragePool is illegal over 7x7; the chain stages the pool, where a
    candidate containing one illegal node used to be discarded."""
    node = helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[2, 3], keepdims=1)
    model = make_model([node], [value_info("x", [1, 4, size, size])], [value_info("y", [1, 4, 1, 1])], opset=17)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == ["reducemean_to_global_pool > global_pool_to_stages"]
    assert "ReduceMean" not in ops_of(ctx) and "GlobalAveragePool" not in ops_of(ctx)
    assert all(not check_node(n, ctx.target, plan_dtype="float16", opset=17) for n in ctx.graph.nodes)
    assert_same_outputs(model, ctx, {"x": feed([1, 4, size, size])})
    assert ctx.rewrite_attempts["mean"][-1].outcome == "applied (then global_pool_to_stages)"


def test_chains_are_bounded_and_never_reuse_a_rule(tmp_path, monkeypatch):
    """A rule whose result is its own op again cannot loop: a chain never uses one rule twice."""
    from rkcompile.passes import rewrite as rewrite_pass
    from rkcompile.passes.rewrites.base import RewriteRule

    def relu_again(node, site):
        builder = site.builder(node)
        builder.op("Relu", [node.inputs[0]], out=node.outputs[0])
        yield builder.finish()

    monkeypatch.setattr(rewrite_pass, "RULES", (RewriteRule(relu_again, frozenset({"Relu"})),))
    model = unary_model("Relu", [1, 2, 3, 3])
    ctx = rewritten(model, tmp_path, with_refusals(Relu=lambda n: True))
    assert ops_of(ctx) == ["Relu"] and rules_fired(ctx) == []
    assert "would break" in ctx.rewrite_attempts["n"][0].outcome


def test_explain_lists_the_rewrites_tried_and_why_each_declined(tmp_path, capsys):
    from rkcompile.cli import main

    model = make_model([helper.make_node("Pow", ["x", "e"], ["y"], name="pow")],
                       [value_info("x", [1, 2, 4, 4])], [value_info("y", [1, 2, 4, 4])],
                       [weight("e", np.array(2.5, np.float32))])
    path = tmp_path / "pow.onnx"
    onnx.save(model, path)
    assert main(["plan", str(path), "--target", "rk3588", "--explain", "pow"]) == 0
    out = capsys.readouterr().out
    assert "rewrites tried:" in out
    assert "pow_to_mul_chain on pow: declined: exponent 2.5 is not an integer of at least 4" in out


def test_matmul_k_split_reads_the_limit_from_the_target(tmp_path):
    """The K limit is the target's MatMul rule parameter, not a copy in the rewrite."""
    k = 6000
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                       [value_info("a", [1, 1, 4, k]), value_info("b", [1, 1, k, 8])], [value_info("y", [1, 1, 4, 8])])
    for target, splits in (("rk3588", False), ("rk3576", True)):
        limit = get_target(target).rule_parameter("MatMul", "matmul_depth", "limit")
        assert (k > limit) == splits
        ctx = rewritten(model, tmp_path, get_target(target))
        assert ("matmul_k_split" in rules_fired(ctx)) == splits


@pytest.mark.parametrize("sources", ["passes", "rkcompile/plan/cost_model.py", "rkcompile/compiler/cost_estimate.py"])
def test_passes_name_no_soc(sources):
    """Targets are data: no pass and no part of the cost model names a SoC in its code (docstrings
    and comments may cite files); per-SoC figures live on the Target (targets/<soc>.py)."""
    import ast
    from pathlib import Path

    from rkcompile.targets import all_targets

    names = {t.name for t in all_targets()} | {a for t in all_targets() for a in t.aliases}
    root = Path(__file__).resolve().parents[1] / sources
    offenders = []
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                else node.id if isinstance(node, ast.Name) else None
            if text and any(name in text.lower() for name in names):
                offenders.append(f"{path.name}:{node.lineno}: {text[:60]}")
    assert not offenders


def test_rules_that_undo_each_other_stop_at_a_bound(tmp_path, monkeypatch):
    """A rule whose result it matches again (Relu -> a new Relu, standing for two that undo each other) would grow the
    graph forever through the worklist: the pass stops at MAX_REWRITES_PER_ORIGINAL and says why."""
    from rkcompile.passes import rewrite as rewrite_pass
    from rkcompile.passes.rewrites.base import RewriteRule

    def relu_again(node, site):
        builder = site.builder(node)
        builder.op("Relu", [node.inputs[0]], out=node.outputs[0])
        yield builder.finish()

    monkeypatch.setattr(rewrite_pass, "RULES", (RewriteRule(relu_again, frozenset({"Relu"}), always=True),))
    ctx = rewritten(unary_model("Relu", [1, 2, 3, 3]), tmp_path, get_target("rk3588"))
    assert len(rules_fired(ctx)) == rewrite_pass.MAX_REWRITES_PER_ORIGINAL and ops_of(ctx) == ["Relu"]
    assert "not tried: the nodes it stands for were rewritten" in ctx.rewrite_attempts["n"][-1].outcome


def test_sibling_nodes_of_one_candidate_may_use_the_same_rule(tmp_path, monkeypatch):
    """A chain never repeats a rule along one path, but two illegal nodes of one candidate may each
    be refined by the same rule."""
    from rkcompile.passes import rewrite as rewrite_pass
    from rkcompile.passes.rewrites.base import RewriteRule

    def split_in_two_tanhs(node, site):
        builder = site.builder(node)
        middle = builder.op("Tanh", [node.inputs[0]], static_shape(node.outputs[0]), node.outputs[0].dtype)
        builder.op("Tanh", [middle], out=node.outputs[0])
        yield builder.finish()

    def tanh_as_sigmoid(node, site):
        builder = site.builder(node)
        builder.op("Sigmoid", [node.inputs[0]], out=node.outputs[0])
        yield builder.finish()

    monkeypatch.setattr(rewrite_pass, "RULES", (RewriteRule(split_in_two_tanhs, frozenset({"Erf"})),
                                                RewriteRule(tanh_as_sigmoid, frozenset({"Tanh"}))))
    target = with_refusals(Tanh=lambda n: True)
    ctx = rewritten(unary_model("Erf", [1, 2, 3, 3]), tmp_path, target)
    assert ops_of(ctx) == ["Sigmoid", "Sigmoid"]
    assert rules_fired(ctx) == ["split_in_two_tanhs > tanh_as_sigmoid"]


def test_a_rule_that_declines_before_naming_anything_is_run_once(tmp_path, monkeypatch):
    """A rule that yields no candidate and names nothing would decline the same way when the
    pass tries again with refining on: it runs once per attempt. One that built (named) part of
    a candidate first still runs again, so the names later rewrites get stay as they were."""
    from rkcompile.passes import rewrite as rewrite_pass
    from rkcompile.passes.rewrites.base import RewriteRule

    runs = {"at_once": 0, "after_building": 0}

    def declines_at_once(node, site):
        runs["at_once"] += 1
        return "not of its form"
        yield  # a generator, as every rule is

    def declines_after_building(node, site):
        runs["after_building"] += 1
        site.builder(node).op("Neg", [node.inputs[0]], static_shape(node.inputs[0]), node.inputs[0].dtype)
        return "declined after building"
        yield

    monkeypatch.setattr(rewrite_pass, "RULES", (RewriteRule(declines_at_once, frozenset({"Relu"}), always=True),
                                                RewriteRule(declines_after_building, frozenset({"Relu"}), always=True)))
    ctx = rewritten(unary_model("Relu", [1, 2, 3, 3]), tmp_path, get_target("rk3588"))
    assert runs["at_once"] >= 1 and runs["after_building"] == 2 * runs["at_once"]
    assert [a.outcome for a in ctx.rewrite_attempts["n"]][:2] == [
        "declined: not of its form", "declined: declined after building"]


def test_a_rewrite_keeps_a_scalar_constant_scalar(tmp_path):
    """Builder.const keeps a 0-d value 0-d: a scalar read by a shape-sensitive op (onnx's expanded
    Gelu's SqrtTwo) was planned as [1] and refused by the emulator's shape check."""
    from rkcompile.passes.rewrites.base import Site

    model = unary_model("Relu", [1, 2, 3, 3])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    site = Site(ctx.graph, ctx.target, 17, {})
    assert site.builder(ctx.graph.nodes[0]).const(np.float32(2.0)).shape == ()


def test_rewrite_verdicts_are_recomputed_exactly_when_what_rules_read_changes(monkeypatch):
    """The rewrite pass asks about a node's failures once per state of what target rules read:
    asked again unchanged, the answer is remembered; a new input tensor, a changed shape, a
    tensor turned constant or another node get check_node's fresh answer (the rules evaluated
    again)."""
    from rkcompile.passes.rewrites import Site

    target = get_target("rk3588")
    big = gs.Variable("x", np.float32, [1, 8, 16, 16])
    node = gs.Node("Transpose", name="t", attrs={"perm": [0, 2, 3, 1]}, inputs=[big],
                   outputs=[gs.Variable("y", np.float32, [1, 16, 16, 8])])
    graph = gs.Graph(nodes=[node], inputs=[big], outputs=node.outputs, opset=17)
    calls = []
    monkeypatch.setattr(rewrite, "evaluate_rules",
                        lambda n, t, **facts: calls.append(n.name) or evaluate_rules(n, t, **facts))
    verdicts = rewrite._Verdicts(Site(graph, target, 17, {"plan_dtype": "float16", "opset": 17}))

    def asked() -> list:
        return [str(failure) for failure in verdicts.failures(node)]

    first = asked()
    assert asked() == first and len(calls) == 1
    node.inputs[0] = gs.Variable("x2", np.float32, [1, 8, 16, 16])  # a rewrite rewired its input
    assert asked() == first and len(calls) == 2
    node.inputs[0].shape = [1, 8, 16, 70000]  # past the NPU's width: a rule now fails
    node.outputs[0].shape = [1, 16, 70000, 8]
    changed = asked()
    fresh = [str(failure) for failure in check_node(node, target, plan_dtype="float16", opset=17)]
    assert changed == fresh and changed != first and len(calls) == 3
    node.inputs[0].to_constant(np.zeros((1, 8, 16, 70000), np.float32))
    asked()
    assert len(calls) == 4


def test_legalize_reuses_the_rewrite_passes_verdicts_only_for_nodes_in_the_state_checked(tmp_path, monkeypatch):
    """Legalize takes the rewrite pass's verdicts for a node it left as it checked it, and works
    them out again for a node changed since and whenever the plan's facts are not that run's."""
    from rkcompile.passes import legalize

    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Transpose", ["r"], ["y"], name="t", perm=[0, 2, 3, 1])],
                       [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 16, 16, 8])], opset=17)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    known, calls = ctx.rule_verdicts, []
    for module in (legalize, rewrite):  # legalize's own, and the one the rewrite pass's memory calls
        monkeypatch.setattr(module, "evaluate_rules",
                            lambda n, t, **facts: calls.append(n.name) or evaluate_rules(n, t, **facts))
    legalize.run(ctx)
    assert calls == [] and ctx.rule_verdicts is None  # every node as the rewrite pass checked it
    fresh = {name: [tuple(v) for v in evaluate_rules(node, ctx.target, plan_dtype="float16", opset=17)]
             for name, node in ((n.name, n) for n in ctx.graph.nodes)}
    assert {name: [tuple(v) for v in checked.verdicts] for name, checked in ctx.verdicts.items()} == fresh

    transpose = next(n for n in ctx.graph.nodes if n.op == "Transpose")
    transpose.inputs[0] = gs.Variable("wide", np.float32, [1, 8, 16, 70000])  # past the NPU's width
    transpose.outputs[0].shape = [1, 16, 70000, 8]
    ctx.rule_verdicts = known
    legalize.run(ctx)
    assert calls == [transpose.name] and ctx.failures[transpose.name]

    ctx.rule_verdicts, ctx.options = known, dataclasses.replace(ctx.options, dtype="int8")
    legalize.run(ctx)
    assert len(calls) == 1 + len(ctx.graph.nodes)


@pytest.mark.parametrize("shape, expected", [
    ([1, 3, 8, 8], (1, 3, 8, 8)), ([], ()), ([np.int64(2), 5], (2, 5)), ([1, -1, 4], None), ([-1], None),
    ([1, "batch", 4], None), ([1, None], None), ([2.0, 3], None), (None, None)])
def test_static_shape_is_a_tuple_of_known_nonnegative_ints_or_none(shape, expected):
    assert static_shape(gs.Variable("t", np.float32, shape)) == expected


def test_rule_verdicts_are_remembered_per_state_of_what_rules_read(monkeypatch):
    """The rewrite pass's verdict cache answers from memory only while the node, its attribute
    dict and its tensors (which ones, constant or not, shape, dtype) are as they were."""
    from types import SimpleNamespace

    evaluated = []
    monkeypatch.setattr(rewrite, "evaluate_rules", lambda node, target, **facts: evaluated.append(node.name)
                        or evaluate_rules(node, target, **facts))
    verdicts = rewrite._Verdicts(SimpleNamespace(target=get_target("rk3588"), facts={}))
    float32 = np.dtype(np.float32)  # the dtype a constant reports
    x, y = gs.Variable("x", float32, [1, 4, 8, 8]), gs.Variable("y", float32, [1, 4, 8, 8])
    relu = gs.Node("Relu", "relu", inputs=[x], outputs=[y])
    assert verdicts.failures(relu) == verdicts.failures(relu) == []
    assert evaluated == ["relu"]
    x.shape = [1, 4, 8, 8, 1, 1]  # rank 6: a rule now fails
    assert verdicts.failures(relu) and evaluated == ["relu"] * 2
    x.shape = [1, 4, 8, 8]
    assert verdicts.failures(relu) == [] and evaluated == ["relu"] * 2  # the first state, remembered
    x.dtype = np.int64
    assert verdicts.failures(relu) and len(evaluated) == 3
    x.dtype = float32
    assert verdicts.failures(relu) == [] and len(evaluated) == 3
    alike = gs.Variable("x", float32, [1, 4, 8, 8])
    relu.inputs[0] = alike  # another tensor of the same name, shape and dtype
    assert verdicts.failures(relu) == [] and len(evaluated) == 4
    relu.attrs = {}  # another attribute dict
    assert verdicts.failures(relu) == [] and len(evaluated) == 5
    alike.to_constant(np.ones([1, 4, 8, 8], np.float32))  # the same object, now a constant
    verdicts.failures(relu)
    assert len(evaluated) == 6


def gated_linear(gate: str) -> onnx.ModelProto:
    """A gated MLP: a Linear [16 -> 64] (MatMul and bias Add) chunked in two along its last axis,
    SwiGLU (silu of the first half times the second) or GLU (the first half times the sigmoid
    of the second), then a Linear [32 -> 16]."""
    rng = np.random.default_rng(2)
    if gate == "swiglu":
        tail = [helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
                helper.make_node("Mul", ["a", "s"], ["silu"], name="silu"),
                helper.make_node("Mul", ["silu", "b"], ["g"], name="gated")]
    else:
        tail = [helper.make_node("Sigmoid", ["b"], ["s"], name="sigmoid"),
                helper.make_node("Mul", ["a", "s"], ["g"], name="gated")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="fc1"),
             helper.make_node("Add", ["p", "bias"], ["h"], name="fc1_bias"),
             helper.make_node("Split", ["h", "halves"], ["a", "b"], name="chunk", axis=-1), *tail,
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2")]
    return make_model(nodes, [value_info("x", [1, 10, 16])], [value_info("y", [1, 10, 16])],
                      [weight("w", rng.normal(0, 0.3, (16, 64)).astype(np.float32)),
                       weight("bias", rng.normal(0, 0.3, 64).astype(np.float32)),
                       weight("halves", np.array([32, 32], np.int64)),
                       weight("w2", rng.normal(0, 0.3, (32, 16)).astype(np.float32))], opset=17)


def test_a_chunked_linear_with_a_gate_is_one_conv_per_part(tmp_path):
    """The gate's Conv takes its activation in (ConvExSwish for SwiGLU, ConvSigmoid for GLU),
    the other half is a Conv of its own: no Split, one step fewer than Conv, Split, activation."""
    from test_simplify_layout import npu_kernels
    for gate, fused in (("swiglu", "ConvExSwish"), ("glu", "ConvSigmoid")):
        kernels, ctx = npu_kernels(gated_linear(gate), tmp_path)
        assert sorted(kernels[1:3]) == sorted(["Conv", fused]) and kernels[0::3] == ["Reshape", "Mul"], kernels
        assert len(kernels) == 6 and "Split" not in kernels
        assert any(rule.startswith("split_linear_as_linears") for rule in rules_fired(ctx))


def test_a_chunked_linear_without_an_activation_stays_split(tmp_path):
    model = gated_linear("swiglu")
    model.graph.node[3].op_type = "Tanh"   # the Sigmoid of the gate becomes a Tanh read with a Mul
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert not any(rule.startswith("split_linear_as_linears") for rule in rules_fired(ctx))
