"""Constant scales and shifts folded into the weights of the op before or after them
(passes/rewrites/affine.py), in the forms exporters write: a batch norm as Mul and Add by
per-channel constants after a Conv (tf2onnx, paddle2onnx), BatchNormalization after a
ConvTranspose or before a Conv, attention's query scale after the projection's relabels
(transformers), Gemm with alpha and beta. Each case asserts the plan's NPU steps and that the
emulator's float16 outputs match onnxruntime's."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import helper

import rkcompile
from rkcompile.compiler.pipeline import compile_model
from conftest import make_model, value_info, weight

RNG = np.random.default_rng(7)


def const(name, shape, low=-1.0, high=1.0):
    return weight(name, RNG.uniform(low, high, shape).astype(np.float32))


def scalar(name, value):
    return weight(name, np.array(value, dtype=np.float32))


def node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def planned(tmp_path, nodes, inits, inputs, output_shape):
    """The plan's NPU kernels, and its outputs beside onnxruntime's on one random input."""
    model = make_model(nodes, [value_info(n, s) for n, s in inputs], [value_info("y", output_shape)], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs}
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = rkcompile.run(plan, feeds)["y"]
    kernels = [step.kernel for step in plan.record.steps if step.device == "npu"]
    return kernels, got, expected


def assert_close(got, expected):
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=0, atol=4e-3 * scale)


def conv_3x3(x="x", out="c", channels=8, inputs=4, pads=1, group=1):
    return node("Conv", [x, "w", "b"], out, pads=[pads] * 4, group=group), [
        const("w", (channels, inputs // group, 3, 3)), const("b", (channels,))]


def test_tf_batch_norm_as_mul_and_add_after_a_conv_is_one_conv(tmp_path):
    conv, inits = conv_3x3()
    nodes = [conv, node("Mul", ["c", "scale"], "m"), node("Add", ["shift", "m"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + [const("scale", (8, 1, 1), 0.5, 2),
                                                               const("shift", (1, 8, 1, 1))],
                                     [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["Conv"]
    assert_close(got, expected)


def test_sub_then_div_by_constants_after_a_conv_then_relu_is_conv_relu(tmp_path):
    conv, inits = conv_3x3()
    nodes = [conv, node("Sub", ["c", "mean"], "s"), node("Div", ["s", "std"], "d"), node("Relu", ["d"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + [const("mean", (8, 1, 1)), scalar("std", 0.7)],
                                     [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


def test_constant_minus_conv_output_folds_with_a_negative_scale(tmp_path):
    conv, inits = conv_3x3()
    nodes = [conv, node("Sub", ["offset", "c"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + [const("offset", (8, 1, 1))],
                                     [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["Conv"]
    assert_close(got, expected)


@pytest.mark.parametrize("group, out_per_group", [(1, 6), (4, 1)])
def test_batch_norm_after_a_conv_transpose_folds_per_output_channel(tmp_path, group, out_per_group):
    channels = group * out_per_group
    nodes = [node("ConvTranspose", ["x", "w", "b"], "c", strides=[2, 2], group=group),
             node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], "y")]
    inits = [const("w", (4, out_per_group, 2, 2)), const("b", (channels,)), const("gamma", (channels,), 0.5, 2),
             const("beta", (channels,)), const("mean", (channels,)), const("var", (channels,), 0.5, 2)]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 4, 5, 5))], (1, channels, 10, 10))
    assert kernels == ["ConvTranspose"]
    assert_close(got, expected)


def test_gemm_with_alpha_beta_then_per_feature_mul_and_add_is_one_conv(tmp_path):
    nodes = [node("Gemm", ["x", "w", "bias"], "g", transB=1, alpha=0.5, beta=2.0),
             node("Mul", ["g", "scale"], "m"), node("Add", ["m", "shift"], "y")]
    inits = [const("w", (6, 16)), const("bias", (6,)), const("scale", (6,), 0.5, 2), const("shift", (1, 6))]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (3, 16))], (3, 6))
    assert [k for k in kernels if k not in ("Reshape",)] == ["Conv"], kernels
    assert_close(got, expected)


def test_query_scale_after_the_projection_relabels_folds_into_the_projection(tmp_path):
    """transformers' attention: q = x @ W + b, reshaped to heads and transposed, times a scalar."""
    nodes = [node("MatMul", ["x", "w"], "p"), node("Add", ["bias", "p"], "q"),
             node("Reshape", ["q", "heads"], "r"), node("Transpose", ["r"], "t", perm=[0, 2, 1, 3]),
             node("Mul", ["t", "scale"], "y")]
    inits = [const("w", (16, 16)), const("bias", (16,)), weight("heads", np.array([1, 6, 2, 8], dtype=np.int64)),
             scalar("scale", 8 ** -0.5)]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 6, 16))], (1, 2, 6, 8))
    assert "Mul" not in kernels and kernels.count("Conv") == 1, kernels
    assert_close(got, expected)


def test_per_feature_scale_after_a_matmul_relabel_that_keeps_the_features_folds(tmp_path):
    nodes = [node("MatMul", ["x", "w"], "p"), node("Mul", ["p", "scale"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, [const("w", (16, 12)), const("scale", (12,), 0.5, 2)],
                                     [("x", (1, 6, 16))], (1, 6, 12))
    assert "Mul" not in kernels and kernels.count("Conv") == 1, kernels
    assert_close(got, expected)


def test_scale_before_a_padded_grouped_conv_folds_into_its_weights(tmp_path):
    conv, inits = conv_3x3(x="s", group=2)
    nodes = [node("Mul", ["x", "scale"], "s"), conv, node("Relu", ["c"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + [const("scale", (1, 4, 1, 1), 0.5, 2)],
                                     [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


def test_batch_norm_before_an_unpadded_conv_folds_into_it(tmp_path):
    conv, inits = conv_3x3(x="n", pads=0)
    nodes = [node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], "n"), conv, node("Relu", ["c"], "y")]
    inits += [const("gamma", (4,), 0.5, 2), const("beta", (4,)), const("mean", (4,)), const("var", (4,), 0.5, 2)]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 4, 8, 8))], (1, 8, 6, 6))
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


def test_shift_before_a_padded_conv_is_not_folded(tmp_path):
    """Its padding would be shifted too: the border outputs would change."""
    conv, inits = conv_3x3(x="s")
    nodes = [node("Add", ["x", "shift"], "s"), conv, node("Relu", ["c"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + [const("shift", (1, 4, 1, 1))],
                                     [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["Add", "ConvRelu"]
    assert_close(got, expected)


def test_a_scale_that_would_take_weights_beyond_float16_is_not_folded(tmp_path):
    conv, inits = conv_3x3()
    nodes = [conv, node("Mul", ["c", "scale"], "y")]
    kernels, _, _ = planned(tmp_path, nodes, inits + [scalar("scale", 1e5)], [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["Conv", "Mul"]


@pytest.mark.parametrize("case", ["shared output", "per-element constant"])
def test_a_conv_output_read_elsewhere_or_a_per_element_constant_is_not_folded(tmp_path, case):
    conv, inits = conv_3x3()
    if case == "shared output":
        nodes = [conv, node("Mul", ["c", "scale"], "m"), node("Add", ["m", "c"], "y")]
        inits.append(const("scale", (8, 1, 1)))
    else:
        nodes = [conv, node("Mul", ["c", "scale"], "y")]
        inits.append(const("scale", (8, 8, 8)))
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert "Mul" in kernels, kernels
    assert_close(got, expected)


@pytest.mark.parametrize("shape, reason", [((8, 8, 8), "the constant varies on more than one axis"),
                                           ((1, 1, 8), "the constant varies on an axis other than the Conv's output channels")])
def test_the_plan_explains_why_a_fold_declined(tmp_path, shape, reason):
    conv, inits = conv_3x3()
    nodes = [conv, node("Mul", ["c", "scale"], "y")]
    model = make_model(nodes, [value_info("x", (1, 4, 8, 8))], [value_info("y", (1, 8, 8, 8))],
                       inits + [const("scale", shape)])
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    _, ctx = compile_model(path, "rk3588")
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["y"]}
    assert reason in outcomes["fold_affine_into_weighted_op"]


def test_hard_swish_scale_before_a_conv_stays_in_the_hard_swish(tmp_path):
    # paddle2onnx's hard swish, x * relu6(x + 3) / 6, between two Convs: the / 6 could fold into
    # the next Conv's weights, but it completes a HardSwish the NPU runs fused with the first Conv
    conv, inits = conv_3x3()
    relu6 = [node("Add", ["c", "three"], "a"), node("Clip", ["a", "zero", "six"], "r")]
    nodes = [conv, *relu6, node("Mul", ["c", "r"], "m"), node("Div", ["m", "six"], "h"),
             node("Conv", ["h", "dw"], "y", pads=[1] * 4, group=8)]
    extra = [scalar("three", 3.0), scalar("zero", 0.0), scalar("six", 6.0), const("dw", (8, 1, 3, 3))]
    kernels, got, expected = planned(tmp_path, nodes, inits + extra, [("x", (1, 4, 8, 8))], (1, 8, 8, 8))
    assert kernels == ["ConvHardSwish", "Conv"]
    assert_close(got, expected)


def test_residual_branch_with_zero_weights_folds_away(tmp_path):
    """A zero-initialised last layer of a residual branch (timm's and torchvision's random-init
    exports): the branch computes its bias alone, so it folds to a constant and x + 0 to x; with
    a bias, the branch folds to that bias and one Add stays. The branch's first Conv then feeds
    nothing and leaves the plan."""
    for bias, expected_kernels in ((0.0, ["Relu"]), (0.25, ["AddRelu"])):
        conv, inits = conv_3x3(out="c", channels=4)
        nodes = [conv, node("Relu", ["c"], "r"),
                 node("Conv", ["r", "zero_w", "zero_b"], "branch", pads=[1] * 4),
                 node("Add", ["x", "branch"], "s"), node("Relu", ["s"], "y")]
        inits += [weight("zero_w", np.zeros((4, 4, 3, 3), np.float32)),
                  weight("zero_b", np.full(4, bias, np.float32))]
        kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 4, 8, 8))], (1, 4, 8, 8))
        assert kernels == expected_kernels
        assert_close(got, expected)


@pytest.mark.parametrize("op, operands, x_shape, zeros_shape, out_shape", [
    ("MatMul", ["x", "zeros"], (4, 6), (6, 5), (4, 5)),
    ("MatMul", ["zeros", "x"], (6, 5), (4, 6), (4, 5)),
    ("Mul", ["x", "zeros"], (4, 6), (1, 6), (4, 6)),
    ("Gemm", ["x", "zeros", "c"], (4, 6), (6, 5), (4, 5)),
])
def test_products_by_zeros_fold_to_their_constant(tmp_path, op, operands, x_shape, zeros_shape, out_shape):
    """MatMul, Mul and Gemm by an all-zero constant are known without their computed operand;
    Gemm keeps beta * C."""
    inits = [weight("zeros", np.zeros(zeros_shape, np.float32)), const("c", (5,))]
    attrs = {"beta": 0.5} if op == "Gemm" else {}
    nodes = [node(op, operands, "p", **attrs), node("Relu", ["p"], "y")]
    model = make_model(nodes, [value_info("x", x_shape)], [value_info("y", out_shape)],
                       inits if op == "Gemm" else inits[:1])
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    assert {n.name: n.device for n in plan.record.nodes}["p"] == "folded"
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(rkcompile.run(plan, feeds)["y"], expected, rtol=1e-3, atol=1e-3)


def test_a_written_out_mean_of_squares_scales_its_sum_in_the_conv_and_stays_in_float16_range(tmp_path):
    """jax2tf's LayerNorm variance: ReduceSum(x*x) * (1/n). ReduceSum becomes a Conv of ones only
    after fusion (a late rewrite); the scale then folds into its weights, so the float16 Conv
    stores the mean of squares (here ~900) rather than their sum (~460,000, past float16's 65504)."""
    nodes = [node("Mul", ["x", "x"], "square"), node("ReduceSum", ["square", "axes"], "sum", keepdims=0),
             node("Mul", ["sum", "inverse"], "y")]
    inits = [weight("axes", np.array([1], np.int64)), scalar("inverse", 1 / 512)]
    model = make_model(nodes, [value_info("x", [1, 512, 8])], [value_info("y", [1, 8])], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    kernels = [step.kernel for step in plan.record.steps if step.device == "npu"]
    assert kernels.count("Mul") == 1 and "Conv" in kernels  # the square; the scale is in the Conv
    feeds = {"x": (30 * RNG.standard_normal((1, 512, 8))).astype(np.float32)}
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = rkcompile.run(plan, feeds)["y"]
    assert np.all(np.isfinite(got)) and expected.max() * 512 > 65504
    assert_close(got, expected)


def test_a_batch_norm_before_a_relu_with_no_weighted_op_to_fold_into_is_one_conv_relu(tmp_path):
    """DenseNet's pre-activation: Concat -> BatchNormalization -> Relu -> Conv. The BN has no
    weighted op before it, and the Relu stands between it and the next Conv, so it becomes a
    depthwise 1x1 Conv that runs fused with the Relu. Read by an Add instead, it is no such
    Conv (nothing would fuse with it)."""
    conv, inits = conv_3x3(x="r", out="y", channels=4, inputs=8)
    bn_params = [const("gamma", (8,), 0.5, 2), const("beta", (8,)), const("mean", (8,)),
                 const("var", (8,), 0.5, 2)]
    nodes = [node("Concat", ["x", "x2"], "cat", axis=1),
             node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], "bn"),
             node("Relu", ["bn"], "r"), conv]
    kernels, got, expected = planned(tmp_path, nodes, inits + bn_params, [("x", (1, 4, 8, 8)), ("x2", (1, 4, 8, 8))],
                                     (1, 4, 8, 8))
    assert kernels == ["Concat", "ConvRelu", "Conv"]
    assert_close(got, expected)
    nodes[2] = node("Add", ["bn", "x_again"], "r")
    kernels, got, expected = planned(tmp_path, nodes + [node("Concat", ["x", "x2"], "x_again", axis=1)],
                                     inits + bn_params, [("x", (1, 4, 8, 8)), ("x2", (1, 4, 8, 8))], (1, 4, 8, 8))
    assert "ConvRelu" not in kernels and kernels.count("Conv") == 1
    assert_close(got, expected)


def rotary_attention_input(scale_after_transpose: bool):
    """transformers' Llama query (or key): the projection split into heads, x*cos + rotate_half(x)*sin
    with cos and sin constant for the fixed sequence, then the attention's scalar scale, after the
    key's transpose for k^T."""
    halves = [weight("zero", np.array([0], dtype=np.int64)), weight("half", np.array([4], dtype=np.int64)),
              weight("end", np.array([8], dtype=np.int64)), weight("last", np.array([3], dtype=np.int64))]
    nodes = [node("MatMul", ["x", "w"], "p"), node("Reshape", ["p", "heads"], "r"),
             node("Transpose", ["r"], "q", perm=[0, 2, 1, 3]),
             node("Slice", ["q", "zero", "half", "last"], "q1"), node("Slice", ["q", "half", "end", "last"], "q2"),
             node("Neg", ["q2"], "n"), node("Concat", ["n", "q1"], "rot", axis=-1),
             node("Mul", ["q", "cos"], "qc"), node("Mul", ["rot", "sin"], "rs"), node("Add", ["qc", "rs"], "e")]
    if scale_after_transpose:
        nodes += [node("Transpose", ["e"], "kt", perm=[0, 1, 3, 2]), node("Mul", ["kt", "scale"], "y")]
    else:
        nodes.append(node("Mul", ["e", "scale"], "y"))
    angles = RNG.uniform(0, 3, (1, 1, 6, 4))
    inits = [const("w", (16, 16)), weight("heads", np.array([1, 6, 2, 8], dtype=np.int64)),
             weight("cos", np.cos(np.concatenate([angles, angles], -1)).astype(np.float32)),
             weight("sin", np.sin(np.concatenate([angles, angles], -1)).astype(np.float32)),
             scalar("scale", 8 ** -0.25), *halves]
    return nodes, inits


@pytest.mark.parametrize("scale_after_transpose", [False, True])
def test_attention_scale_after_a_rotary_embedding_moves_into_cos_and_sin(tmp_path, scale_after_transpose):
    nodes, inits = rotary_attention_input(scale_after_transpose)
    output_shape = (1, 2, 8, 6) if scale_after_transpose else (1, 2, 6, 8)
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 6, 16))], output_shape)
    # x*cos and rot*sin: the scale went into cos and sin, rotate_half's negation into sin
    assert kernels.count("Mul") == 2, kernels
    # rotate_half's halves swapped by one Gather (passes/rewrites/layout_ops.py)
    assert "Gather" in kernels and "Split" not in kernels and "Concat" not in kernels, kernels
    assert_close(got, expected)


def test_a_scaled_sum_read_elsewhere_keeps_its_scale_and_says_why(tmp_path):
    nodes, inits = rotary_attention_input(scale_after_transpose=False)
    nodes.append(node("Add", ["e", "y"], "z"))
    model = make_model(nodes, [value_info("x", (1, 6, 16))], [value_info("z", (1, 2, 6, 8))], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    _, ctx = compile_model(path, "rk3588")
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["y"]}
    assert "is not a sum that it alone reads" in outcomes["scale_into_constant_products"]


def test_scalar_factors_of_concat_parts_move_into_the_constant_after_it(tmp_path):
    nodes = [node("Mul", ["a", "two"], "a2"), node("Mul", ["b", "minus"], "bn"),
             node("Concat", ["a2", "bn", "c"], "j", axis=1), node("Mul", ["j", "k"], "y")]
    inits = [scalar("two", 2.5), scalar("minus", -1.0), const("k", (1, 12, 1, 1))]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("a", (1, 4, 6, 6)), ("b", (1, 4, 6, 6)),
                                                              ("c", (1, 4, 6, 6))], (1, 12, 6, 6))
    assert kernels == ["Concat", "Mul"], kernels
    assert_close(got, expected)


def test_scalar_factors_stay_where_folding_them_would_spread_the_constant(tmp_path):
    nodes = [node("Mul", ["a", "two"], "a2"), node("Concat", ["a2", "b"], "j", axis=1), node("Mul", ["j", "k"], "y")]
    model = make_model(nodes, [value_info("a", (1, 4, 6, 6)), value_info("b", (1, 4, 6, 6))],
                       [value_info("y", (1, 8, 6, 6))], [scalar("two", 2.5), const("k", (1, 1, 1, 6))])
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    _, ctx = compile_model(path, "rk3588")
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["y"]}
    assert "does not vary along the Concat's axis" in outcomes["scalar_factors_out_of_concat"]


@pytest.mark.parametrize("head", ["MatMul", "Gemm"])
def test_dropout_scale_before_flatten_folds_into_the_classifier(tmp_path, head):
    """paddle2onnx's inference dropout, a Mul by 1 - p between the last feature map and the
    classifier's Flatten and MatMul (or Gemm), goes into the classifier's weights, as
    rknn-toolkit2's fuse_mul_exmatmul does: no Mul step stores the scaled features."""
    classifier = (node("MatMul", ["f", "w_fc"], "y") if head == "MatMul"
                  else node("Gemm", ["f", "w_fc", "b_fc"], "y", transB=1))
    nodes = [node("Conv", ["x", "w"], "c"), node("HardSwish", ["c"], "h"), node("Mul", ["h", "keep"], "d"),
             node("Flatten", ["d"], "f"), classifier]
    inits = [const("w", (32, 4, 1, 1)), scalar("keep", 0.8), const("b_fc", (5,)),
             const("w_fc", (32, 5) if head == "MatMul" else (5, 32))]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 4, 1, 1))], (1, 5))
    assert "Mul" not in kernels and len(kernels) == 2, kernels
    assert_close(got, expected)


def test_a_per_channel_scale_before_a_flatten_stays_a_mul(tmp_path):
    """Only a scalar crosses the relabels into the next weighted op: a per-channel scale would
    need the Flatten's channel order spelled out in the weights' rows."""
    nodes = [node("Conv", ["x", "w"], "c"), node("HardSwish", ["c"], "h"), node("Mul", ["h", "scale"], "d"),
             node("Flatten", ["d"], "f"), node("MatMul", ["f", "w_fc"], "y")]
    inits = [const("w", (32, 4, 1, 1)), const("scale", (32, 1, 1), 0.5, 2), const("w_fc", (32, 5))]
    model = make_model(nodes, [value_info("x", (1, 4, 1, 1))], [value_info("y", (1, 5))], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    _, ctx = compile_model(path, "rk3588")
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["d"]}
    assert "only a scalar scale folds into a MatMul's weights" in outcomes["fold_affine_into_next_weighted_op"]


def branch_conv(name, kernel, pads, channels=8, inputs=8, group=1, strides=1, dilation=1, x="x"):
    kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
    pads = [pads] * 4 if isinstance(pads, int) else list(pads)
    return node("Conv", [x, f"{name}_w", f"{name}_b"], name, pads=pads, group=group, strides=[strides] * 2,
                dilations=[dilation] * 2), [const(f"{name}_w", (channels, inputs // group, *kernel)),
                                            const(f"{name}_b", (channels,))]


def summed(tmp_path, branches, extra_nodes=(), extra_inits=(), x_shape=(1, 8, 10, 10), out_shape=(1, 8, 10, 10)):
    """The branches' outputs added up in a chain (as MobileOne's export writes them), then a Relu."""
    nodes, inits = list(extra_nodes), list(extra_inits)
    for conv, weights in branches:
        nodes.append(conv)
        inits += weights
    names = [n.output[0] for n in nodes]
    total = names[0]
    for index, name in enumerate(names[1:]):
        nodes.append(node("Add", [total, name], f"sum{index}"))
        total = f"sum{index}"
    nodes.append(node("Relu", [total], "y"))
    return planned(tmp_path, nodes, inits, [("x", x_shape)], out_shape)


@pytest.mark.parametrize("group", [1, 8])
def test_parallel_convs_and_a_batch_norm_of_one_input_summed_are_one_conv(tmp_path, group):
    # a MobileOne / RepVGG block as exported: k 3x3 branches, a 1x1 branch and a BatchNormalization
    # of the input, added up; rknn-toolkit2 runs the Convs as one
    bn = node("BatchNormalization", ["x", "g", "beta", "mean", "var"], "bn")
    stats = [const("g", (8,), 0.5, 1.5), const("beta", (8,)), const("mean", (8,)), const("var", (8,), 0.5, 2)]
    branches = [branch_conv("k0", 3, 1, group=group), branch_conv("k1", 3, 1, group=group),
                branch_conv("scale", 1, 0, group=group)]
    kernels, got, expected = summed(tmp_path, branches, [bn], stats)
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


@pytest.mark.parametrize("group", [1, 8])
def test_a_conv_plus_its_own_input_is_one_conv(tmp_path, group):
    """RepViT's token mixer as exported, Conv3x3(x) + Conv1x1(x) + x: the identity lands on the
    merged window's diagonal as a scale of 1, and the sum is one Conv (rknn-toolkit2 folds the
    identity too, and cannot build that fold from an int8 QDQ file)."""
    (conv, conv_w), (scale, scale_w) = branch_conv("k", 3, 1, group=group), branch_conv("scale", 1, 0, group=group)
    nodes = [conv, scale, node("Add", ["k", "scale"], "branches"), node("Add", ["branches", "x"], "with_identity"),
             node("Relu", ["with_identity"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, conv_w + scale_w, [("x", (1, 8, 10, 10))], (1, 8, 10, 10))
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


def test_a_batch_norm_of_concatenated_convs_folds_into_each(tmp_path):
    """MixNet's mixed kernels: the channels Split, each part through a depthwise Conv of its own
    size, joined, one BatchNormalization: each part's scale and shift fold into its Conv, no
    BatchNormalization step (rknn-toolkit2's layer table for timm's mixnet_s has none)."""
    (small, small_w), (large, large_w) = (branch_conv("small", 3, 1, channels=4, inputs=4, group=4, x="left"),
                                          branch_conv("large", 5, 2, channels=4, inputs=4, group=4, x="right"))
    bn = node("BatchNormalization", ["mixed", "g", "beta", "mean", "var"], "bn")
    stats = [const("g", (8,), 0.5, 1.5), const("beta", (8,)), const("mean", (8,)), const("var", (8,), 0.5, 2)]
    nodes = [node("Split", ["x"], "left", axis=1), small, large, node("Concat", ["small", "large"], "mixed", axis=1),
             bn, node("Relu", ["bn"], "y")]
    nodes[0] = helper.make_node("Split", ["x", "halves"], ["left", "right"], name="split", axis=1)
    inits = small_w + large_w + stats + [weight("halves", np.array([4, 4], np.int64))]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 8, 10, 10))], (1, 8, 10, 10))
    assert "BatchNormalization" not in kernels and sorted(kernels) == ["Concat", "Conv", "Conv", "Relu", "Split"]
    assert_close(got, expected)


@pytest.mark.parametrize("strides, dilation", [(2, 1), (1, 2)])
def test_strided_or_dilated_parallel_convs_merge_where_their_taps_align(tmp_path, strides, dilation):
    size = 10 // strides
    branches = [branch_conv("k", 3, dilation, strides=strides, dilation=dilation),
                branch_conv("scale", 1, 0, strides=strides, dilation=dilation)]
    kernels, got, expected = summed(tmp_path, branches, out_shape=(1, 8, size, size))
    assert kernels == ["ConvRelu"]
    assert_close(got, expected)


@pytest.mark.parametrize("case, reason", [
    ("crossed", "the merged kernel [3, 3] has more taps than the branches together"),
    ("two inputs", "the terms read different tensors"),
    ("groups", "the Convs' groups differ"),
    ("over the limit", "the merged kernel [9, 9] is over rk3588's limit of 8")])
def test_parallel_convs_that_do_not_merge_say_why(tmp_path, case, reason):
    if case == "over the limit":  # a 9x9 depthwise kernel tiled into 8x8 windows stays tiled
        branches = [branch_conv("a", 8, (4, 4, 3, 3), group=8), branch_conv("b", 8, (3, 3, 4, 4), group=8)]
    elif case == "crossed":  # ACNet's 1x3 and 3x1: one 3x3 would compute 9 taps where they compute 6
        branches = [branch_conv("a", (1, 3), (0, 1, 0, 1)), branch_conv("b", (3, 1), (1, 0, 1, 0))]
    elif case == "two inputs":
        branches = [branch_conv("a", 3, 1), branch_conv("b", 3, 1, x="z")]
    else:
        branches = [branch_conv("a", 3, 1, group=8), branch_conv("b", 3, 1)]
    nodes, inits = [], []
    for conv, weights in branches:
        nodes.append(conv)
        inits += weights
    nodes.append(node("Add", ["a", "b"], "y"))
    inputs = [value_info("x", (1, 8, 10, 10))] + ([value_info("z", (1, 8, 10, 10))] if case == "two inputs" else [])
    model = make_model(nodes, inputs, [value_info("y", (1, 8, 10, 10))], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan, ctx = compile_model(path, "rk3588")
    outcomes = {attempt.rule: attempt.outcome for attempt in ctx.rewrite_attempts["y"]}
    assert reason in outcomes["sum_of_convs_of_one_input"]
    assert sum(step.kernel.startswith("Conv") for step in plan.steps) == 2
