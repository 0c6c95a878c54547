"""passes/rewrites/reductions.py: norms written out op by op, InstanceNormalization, and the
late lowering of Reduce* and Sqrt. Each case is planned at the three primary targets, must land
wholly on the NPU, and must agree with onnxruntime through the emulator."""
from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import rkcompile

from conftest import PRIMARY_TARGETS, make_model, value_info, weight

RNG = np.random.default_rng(7)


def _constant(name, value):
    return weight(name, np.asarray(value, np.float32))


def decomposed_layer_norm(shape, axes, opset, reciprocal=False, rms=False):
    """LayerNorm (or RMSNorm) over `axes` as torch exports it below opset 17; `reciprocal` writes
    1 / std as Reciprocal (dynamo), or with "div" as Div(1, std) (TorchScript's rsqrt)."""
    axes_kw = {"axes": axes} if opset < 18 else {}
    axes_in = ["axes"] if opset >= 18 else []
    nodes, consts = [], [_constant("two", 2.0), _constant("eps", 1e-5), _constant("w", RNG.uniform(0.5, 2, shape[-1])),
                          _constant("b", RNG.uniform(-1, 1, shape[-1]))]
    if opset >= 18:
        consts.append(weight("axes", np.array(axes, np.int64)))
    source = "x"
    if not rms:
        nodes += [helper.make_node("ReduceMean", ["x", *axes_in], ["mean"], **axes_kw),
                  helper.make_node("Sub", ["x", "mean"], ["centred"])]
        source = "centred"
    nodes += [helper.make_node("Pow", [source, "two"], ["square"]),
              helper.make_node("ReduceMean", ["square", *axes_in], ["var"], **axes_kw),
              helper.make_node("Add", ["var", "eps"], ["var_eps"]),
              helper.make_node("Sqrt", ["var_eps"], ["std"])]
    if reciprocal == "div":
        consts.append(_constant("one", 1.0))
        nodes += [helper.make_node("Div", ["one", "std"], ["inv"]), helper.make_node("Mul", [source, "inv"], ["normed"])]
    elif reciprocal:
        nodes += [helper.make_node("Reciprocal", ["std"], ["inv"]), helper.make_node("Mul", ["inv", source], ["normed"])]
    else:
        nodes.append(helper.make_node("Div", [source, "std"], ["normed"]))
    nodes += [helper.make_node("Mul", ["normed", "w"], ["scaled"]), helper.make_node("Add", ["scaled", "b"], ["y"])]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], consts, opset=opset)


def plan_and_compare(model, save, target, name="model.onnx"):
    path = save(model, name)
    plan = rkcompile.compile(path, target)
    on_cpu = [(n.name, n.op, n.reason) for n in plan.record.nodes if n.device == "cpu"]
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    got = rkcompile.run(plan, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for expected, output in zip(want, model.graph.output):
        actual = got[output.name].astype(np.float64).ravel()
        expected = expected.astype(np.float64).ravel()
        cosine = actual @ expected / (np.linalg.norm(actual) * np.linalg.norm(expected) + 1e-30)
        assert cosine >= 0.9999, (output.name, cosine)
    return plan, on_cpu


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("shape, axes, opset, reciprocal, rms", [
    ([1, 50, 192], [-1], 14, False, False),      # ViT/BERT below opset 17
    ([2, 7, 9, 40], [-1], 13, True, False),     # rank 4, the Reciprocal form
    ([1, 6, 4, 5], [2, 3], 14, False, False),    # two trailing axes
    ([1, 20, 64], [-1], 14, False, True),       # RMSNorm (llama)
    ([1, 20, 64], [-1], 15, "div", True),       # RMSNorm as TorchScript writes rsqrt (T5, LLaMA)
    ([1, 20, 64], [-1], 18, False, False),      # axes as an input
])
def test_decomposed_norm_over_trailing_axes_runs_on_the_npu(save, target, shape, axes, opset, reciprocal, rms):
    plan, on_cpu = plan_and_compare(decomposed_layer_norm(shape, axes, opset, reciprocal, rms), save, target)
    assert on_cpu == []
    if axes == [-1]:  # over [2, 3] the means are spatial: global pooling takes them first
        assert any(r.rule.startswith("decomposed_norm_on_channel_view") for r in plan.record.rewrites)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("opset", [14, 15])
def test_a_trailing_layer_norm_below_opset_17_is_one_exnorm(save, target, opset):
    """paddle2onnx (opset 15) and torch below 17 write LayerNorm out op by op: on a target with
    exNorm it is one exNorm step on the [L, C, 1, 1] view, not 1x1 Convs and element-wise steps."""
    plan, on_cpu = plan_and_compare(decomposed_layer_norm([1, 50, 96], [-1], opset), save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm"]


def test_a_norm_on_exnorms_own_axes_is_left_to_the_fusion(save):
    """Axis 1 of [1, C, H, W] is exNorm's own: the rewrite declines and the fusion makes exNorm."""
    plan, on_cpu = plan_and_compare(decomposed_layer_norm([1, 16, 1, 1], [1], 14), save, "rk3588")
    assert on_cpu == [] and not plan.record.rewrites
    assert any(step.kernel == "exNorm" for step in plan.record.steps)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("shape, opset", [([1, 8, 12, 12], 14), ([2, 3, 5, 7], 17), ([1, 4, 30], 14)])
def test_instance_normalization_runs_on_the_npu(save, target, shape, opset):
    channels = shape[1]
    model = make_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
                       [value_info("x", shape)], [value_info("y", shape)],
                       [_constant("s", RNG.uniform(0.5, 2, channels)), _constant("b", RNG.uniform(-1, 1, channels))],
                       opset=opset)
    _, on_cpu = plan_and_compare(model, save, target)
    assert on_cpu == []


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("op, shape, axes, keepdims", [
    ("ReduceMean", [1, 10, 48], [-1], 1), ("ReduceMean", [2, 6, 5, 4], [1, 2], 0),
    ("ReduceSum", [1, 3, 20], [1], 1),
    ("ReduceL2", [1, 16, 6, 6], [1], 1), ("ReduceSumSquare", [1, 12, 30], [-1], 0),
])
def test_late_reductions_run_on_the_npu(save, target, op, shape, axes, keepdims):
    rank = len(shape)
    out = [1 if a in [x % rank for x in axes] else d for a, d in enumerate(shape)] if keepdims \
        else [d for a, d in enumerate(shape) if a not in [x % rank for x in axes]]
    if op == "ReduceSum":  # axes are an input from opset 13
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        consts = [weight("axes", np.array(axes, np.int64))]
    else:
        node, consts = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims), []
    model = make_model([node], [value_info("x", shape)], [value_info("y", out)], consts, opset=17)
    plan, on_cpu = plan_and_compare(model, save, target)
    assert on_cpu == []


def test_reductions_over_split_axes_decline_with_a_reason(save, capsys):
    from rkcompile.cli import main

    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum", keepdims=1)],
                       [value_info("x", [1, 3, 4, 5])], [value_info("y", [1, 1, 4, 1])],
                       [weight("axes", np.array([1, 3], np.int64))], opset=17)
    assert main(["plan", str(save(model, "split.onnx")), "--target", "rk3588", "--explain", "sum"]) == 0
    assert "reduce_mean_or_sum_as_conv on sum: declined: axes [1, 3] are not one block of neighbouring axes" \
        in capsys.readouterr().out


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_sqrt_runs_as_pow(save, target):
    model = make_model([helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["y"])],
                       [value_info("x", [1, 4, 6, 6])], [value_info("y", [1, 4, 6, 6])])
    plan, on_cpu = plan_and_compare(model, save, target)
    assert not [n for n in on_cpu if n[1] == "Sqrt"]


def single_group_norm(shape, opset, affine=True):
    """torch's GroupNorm(1, C) (PoolFormer): Reshape to [N, 1, -1], InstanceNormalization with a
    scale and bias of ones and zeros, Reshape back, the per-channel affine as Mul and Add."""
    channels = shape[1]
    per_channel = [channels] + [1] * (len(shape) - 2)
    nodes = [helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"]),
             helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-5),
             helper.make_node("Reshape", ["normed", "x_shape"], ["y" if not affine else "restored"])]
    consts = [weight("grouped_shape", np.array([shape[0], 1, -1], np.int64)), weight("x_shape", np.array(shape, np.int64)),
              _constant("ones", [1.0]), _constant("zeros", [0.0])]
    if affine:
        nodes += [helper.make_node("Mul", ["restored", "gamma"], ["scaled"]), helper.make_node("Add", ["scaled", "beta"], ["y"])]
        consts += [_constant("gamma", RNG.uniform(0.5, 2, per_channel)), _constant("beta", RNG.uniform(-1, 1, per_channel))]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], consts, opset=opset)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("shape, opset, affine", [
    ([1, 16, 14, 14], 17, True), ([2, 8, 6, 10], 19, True), ([1, 8, 30], 17, True), ([1, 16, 7, 7], 14, False)])
def test_group_norm_with_one_group_is_one_exnorm(save, target, shape, opset, affine):
    """Reshape, InstanceNormalization, Reshape, Mul, Add: one exNorm over axes [1, 2, 3], no
    relabel or element-wise step left (a rank-3 input takes a relabel each way, [1,C,L] to
    [1,C,1,L] and back, which moves no stored byte: an alias each way, no step)."""
    plan, on_cpu = plan_and_compare(single_group_norm(shape, opset, affine), save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu"] == ["exNorm"]
    assert sum(t.aliases is not None for t in plan.record.tensors.values()) == (0 if len(shape) == 4 else 2)


@pytest.mark.parametrize("source, result, normed", [
    # MobileViTv2's patches: the relabels before the norm composed with its own, x arrives as
    # [1, 256, 4, 4]; normalized on its result's [1, 64, 4, 16], the affine taken in
    ([1, 256, 4, 4], [1, 64, 4, 16], [1, 64, 4, 16]),
    # its result relabelled on into a shape of no image axis (the fold's view): normalized on x
    ([1, 64, 4, 16], [128, 2, 1, 16], [1, 64, 4, 16]),
])
def test_group_norm_with_one_group_is_normalized_in_any_shape_of_the_image(save, source, result, normed):
    """The one group is every value of the image, so the norm is one exNorm in a shape of the
    image whatever shapes the relabels around it have, with one relabel: not on a [1, C*S, 1, 1]
    view with a Reshape each way."""
    nodes = [helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"]),
             helper.make_node("InstanceNormalization", ["grouped", "ones", "zeros"], ["normed"], epsilon=1e-5),
             helper.make_node("Reshape", ["normed", "result_shape"], ["restored"])]
    consts = [weight("grouped_shape", np.array([1, 1, -1], np.int64)), weight("result_shape", np.array(result, np.int64)),
              _constant("ones", [1.0]), _constant("zeros", [0.0])]
    if result[0] == 1:
        nodes += [helper.make_node("Mul", ["restored", "gamma"], ["scaled"]), helper.make_node("Add", ["scaled", "beta"], ["y"])]
        consts += [_constant("gamma", RNG.uniform(0.5, 2, [result[1], 1, 1])),
                   _constant("beta", RNG.uniform(-1, 1, [result[1], 1, 1]))]
    else:
        nodes.append(helper.make_node("Relu", ["restored"], ["y"]))
    model = make_model(nodes, [value_info("x", source)], [value_info("y", result)], consts, opset=17)
    plan, on_cpu = plan_and_compare(model, save, "rk3588")
    assert on_cpu == []
    npu = [s for s in plan.record.steps if s.device == "npu"]
    (norm,) = [s for s in npu if s.kernel == "exNorm"]
    assert list(plan.record.tensors[norm.inputs[0]].shape) == normed
    assert [s.kernel for s in npu].count("Reshape") == 1, [s.kernel for s in npu]


def test_group_norm_whose_grouped_input_is_read_elsewhere_declines(save, capsys):
    from rkcompile.cli import main

    model = single_group_norm([1, 8, 5, 5], 17)
    model.graph.node[1].name = "norm"
    model.graph.output.append(value_info("grouped", [1, 1, 200]))
    assert main(["plan", str(save(model, "shared.onnx")), "--target", "rk3588", "--explain", "norm"]) == 0
    assert "single_group_norm_as_layer_norm on norm: declined: the relabelled input is read outside the norm" \
        in capsys.readouterr().out


def grouped_norm(shape, groups, opset, group_affine=False, repeated_channel_affine=False):
    """torch's GroupNorm(G, C): Reshape to [N, G, -1], InstanceNormalization (of ones and
    zeros as torch writes it; with `group_affine`, a scale and bias per group), Reshape back,
    the per-channel affine as Mul and Add (with `repeated_channel_affine`, the same in every
    group)."""
    channels = shape[1]
    per_channel = [channels] + [1] * (len(shape) - 2)
    if repeated_channel_affine:
        gamma, beta = (np.tile(RNG.uniform(low, high, channels // groups), groups).reshape(per_channel)
                       for low, high in ((0.5, 2), (-1, 1)))
    else:
        gamma, beta = RNG.uniform(0.5, 2, per_channel), RNG.uniform(-1, 1, per_channel)
    nodes = [helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"]),
             helper.make_node("InstanceNormalization", ["grouped", "scale", "bias"], ["normed"], name="norm",
                              epsilon=1e-5),
             helper.make_node("Reshape", ["normed", "x_shape"], ["restored"]),
             helper.make_node("Mul", ["restored", "gamma"], ["scaled"]), helper.make_node("Add", ["scaled", "beta"], ["y"])]
    consts = [weight("grouped_shape", np.array([shape[0], groups, -1], np.int64)),
              weight("x_shape", np.array(shape, np.int64)),
              _constant("scale", RNG.uniform(0.5, 2, groups) if group_affine else np.ones(groups)),
              _constant("bias", RNG.uniform(-1, 1, groups) if group_affine else np.zeros(groups)),
              _constant("gamma", gamma), _constant("beta", beta)]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], consts, opset=opset)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("shape, groups, opset, group_affine, repeated", [
    ([1, 32, 14, 14], 4, 17, False, True),    # 8 channels a group: the NPU's channel block
    ([2, 16, 6, 10], 8, 14, True, False),     # two images, a scale and bias per group
    ([1, 16, 30], 4, 17, False, False),       # rank 3: each group as [C/G, L, 1]
    ([1, 64, 7, 7], 32, 18, False, True),     # 2 channels a group
])
def test_group_norm_is_one_exnorm_of_each_group_as_an_image(save, target, shape, groups, opset, group_affine,
                                                              repeated):
    """Reshape, InstanceNormalization, Reshape, Mul, Add: one exNorm over axes [1, 2, 3] of the
    [N*G, C/G, H, W] view, nothing on the CPU; the InstanceNormalization's and the channels'
    scale and bias are the exNorm's own where they repeat from group to group, else one Mul
    and one Add."""
    plan, on_cpu = plan_and_compare(grouped_norm(shape, groups, opset, group_affine, repeated), save, target)
    assert on_cpu == []
    npu = [s for s in plan.record.steps if s.device == "npu"]
    (norm,) = [s for s in npu if s.kernel == "exNorm"]
    view = [shape[0] * groups, shape[1] // groups, *(shape[2:] if len(shape) == 4 else [shape[2], 1])]
    assert list(plan.record.tensors[norm.inputs[0]].shape) == view
    assert sorted(s.kernel for s in npu if s.kernel in ("Mul", "Add")) == ([] if repeated else ["Add", "Mul"])


def test_group_norm_of_a_block_of_channels_per_group_moves_no_byte(save):
    """8 channels a group (rk3588's float16 channel block): the [N*G, 8, H, W] view stores x's
    bytes as they are, so both relabels are aliases and the exNorm is the plan's one step."""
    plan, _ = plan_and_compare(grouped_norm([1, 32, 14, 14], 4, 17, repeated_channel_affine=True), save, "rk3588")
    assert [s.kernel for s in plan.record.steps if s.device == "npu"] == ["exNorm"]


def test_group_norm_whose_result_is_read_before_its_relabel_declines(save, capsys):
    from rkcompile.cli import main

    model = grouped_norm([1, 16, 5, 5], 4, 17)
    model.graph.output.append(value_info("normed", [1, 4, 100]))
    assert main(["plan", str(save(model, "read.onnx")), "--target", "rk3588", "--explain", "norm"]) == 0
    assert "group_norm_on_group_view on norm: declined: its result is not relabelled back to the input's shape alone" \
        in capsys.readouterr().out


def moments_layer_norm(shape, centred):
    """Keras' LayerNormalization as tf2onnx writes it (tf.nn.moments, then batch_normalization's
    algebra): GlobalAveragePool for the means over the last axis of [N, L, C], the variance of
    (x - mean)^2, m = gamma * 1 / sqrt(variance + eps), then x * m + (-mean) * m, or
    x * m + (beta - mean * m) with a centre."""
    channels = shape[-1]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["mean"]), helper.make_node("Sub", ["x", "mean"], ["dev"]),
             helper.make_node("Mul", ["dev", "dev"], ["square"]), helper.make_node("GlobalAveragePool", ["square"], ["var"]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]), helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Reciprocal", ["std"], ["inv"]), helper.make_node("Mul", ["inv", "gamma"], ["m"]),
             helper.make_node("Mul", ["x", "m"], ["xm"])]
    if centred:
        nodes += [helper.make_node("Mul", ["mean", "m"], ["mean_m"]), helper.make_node("Sub", ["beta", "mean_m"], ["shift"]),
                  helper.make_node("Add", ["xm", "shift"], ["y"])]
    else:
        nodes += [helper.make_node("Neg", ["mean"], ["neg"]), helper.make_node("Mul", ["neg", "m"], ["shift"]),
                  helper.make_node("Add", ["xm", "shift"], ["y"])]
    consts = [_constant("eps", 1e-3), _constant("gamma", RNG.uniform(0.5, 2, (1, 1, channels))),
              _constant("beta", RNG.uniform(-1, 1, (1, 1, channels)))]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], consts[:3 if centred else 2], opset=15)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("centred", [False, True])
def test_a_tf2onnx_moments_layer_norm_is_one_exnorm(save, target, centred):
    """tf2onnx's LayerNorm over the last axis of [1, L, C] (means by GlobalAveragePool, no NPU
    kernel at these sizes) runs as one exNorm on the [L, C, 1, 1] view, nothing on the CPU."""
    plan, on_cpu = plan_and_compare(moments_layer_norm([1, 144, 64], centred), save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm"]


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_an_rms_norm_over_values_whose_squares_overflow_float16_stays_finite(save, target):
    """T5's RMSNorm over [1, L, C] with outliers of 1000 (squares of 1e6, far above float16's
    65504): one exNorm step (then the affine on x's shape), whose statistics are float32, so the
    plan agrees with onnxruntime where squaring step by step in float16 overflows."""
    model = decomposed_layer_norm([1, 20, 64], [-1], 15, "div", True)
    path = save(model, "rms.onnx")
    plan = rkcompile.compile(path, target)
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm", "Mul", "Add"]
    x = RNG.standard_normal((1, 20, 64)).astype(np.float32)
    x[0, :, 5] = 1000.0
    got = rkcompile.run(plan, {"x": x})["y"].astype(np.float64).ravel()
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    want = want.astype(np.float64).ravel()
    assert np.isfinite(got).all()
    assert got @ want / (np.linalg.norm(got) * np.linalg.norm(want)) >= 0.9999


def l2_normalize(shape, floor_op="Clip"):
    """torch's F.normalize(x, dim=-1) as TorchScript exports it: ReduceL2 keeping dims, Clip at
    1e-12 (or Max), Expand to x's shape, Div."""
    floor = (helper.make_node("Clip", ["norm", "eps"], ["floored"]) if floor_op == "Clip"
             else helper.make_node("Max", ["norm", "eps"], ["floored"]))
    nodes = [helper.make_node("ReduceL2", ["x"], ["norm"], axes=[-1], keepdims=1), floor,
             helper.make_node("Shape", ["x"], ["x_shape"]), helper.make_node("Expand", ["floored", "x_shape"], ["wide"]),
             helper.make_node("Div", ["x", "wide"], ["y"], name="normalize")]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], [_constant("eps", 1e-12)], opset=14)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("floor_op", ["Clip", "Max"])
def test_an_l2_normalize_over_the_last_axis_is_one_exnorm(save, target, floor_op):
    """EdgeNeXt's normalized queries: one exNorm on the [L, H, 1, 1] view, and a row of zeros
    stays zeros (its statistics are float32, where eps^2 / H is not 0)."""
    model = l2_normalize([1, 4, 12, 256], floor_op)
    plan, on_cpu = plan_and_compare(model, save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm"]
    x = RNG.standard_normal((1, 4, 12, 256)).astype(np.float32)
    x[0, 1, 3] = 0.0
    got = rkcompile.run(plan, {"x": x})["y"]
    assert np.isfinite(got).all() and not got[0, 1, 3].any()


def test_an_l2_normalize_whose_norm_is_read_elsewhere_declines(save, capsys):
    from rkcompile.cli import main

    model = l2_normalize([1, 4, 12, 32])
    model.graph.output.append(value_info("norm", [1, 4, 12, 1]))
    assert main(["plan", str(save(model, "shared_norm.onnx")), "--target", "rk3588", "--explain", "normalize"]) == 0
    # the Div it tries is the one expand_into_broadcast rewrote to read the norm unexpanded
    assert re.search(r"l2_normalize_on_channel_view on \S+: declined: norm is read outside the normalization",
                     capsys.readouterr().out)


def statistics_layer_norm(shape, axis, divided_sum=True):
    """flax.linen.LayerNorm over `axis` as jax2tf and tf2onnx write it (jax's _compute_stats): the
    mean and the mean square by ReduceSum (keepdims 0) times 1/count, or ReduceMean, the variance
    max(0, E[x^2] - mean^2), the reduced axis put back by a Reshape, then
    (x - mean) * (1 / sqrt(variance + eps) * scale) + bias (the wh_magika model's form)."""
    rank, count = len(shape), shape[axis]
    kept = [1 if a == axis else size for a, size in enumerate(shape)]
    along = [count if a == axis else 1 for a in range(rank)]
    nodes, consts = [], [weight("axes", np.array([axis], np.int64)), weight("kept", np.array(kept, np.int64)),
                         _constant("zero", 0.0), _constant("eps", 1e-6), _constant("scale", RNG.uniform(0.5, 2, along)),
                         _constant("bias", RNG.uniform(-1, 1, along))]
    nodes.append(helper.make_node("Mul", ["x", "x"], ["square"]))
    for source, name in (("x", "mean"), ("square", "mean_square")):
        if divided_sum:
            consts.append(_constant(f"{name}_divisor", 1 / count))
            nodes += [helper.make_node("ReduceSum", [source, "axes"], [f"{name}_sum"], keepdims=0),
                      helper.make_node("Mul", [f"{name}_sum", f"{name}_divisor"], [name])]
        else:
            nodes.append(helper.make_node("ReduceMean", [source, "axes"], [name], keepdims=0))
    nodes += [helper.make_node("Mul", ["mean", "mean"], ["mean_squared"]),
              helper.make_node("Sub", ["mean_square", "mean_squared"], ["difference"]),
              helper.make_node("Max", ["zero", "difference"], ["variance"]),
              helper.make_node("Reshape", ["variance", "kept"], ["variance_kept"]),
              helper.make_node("Add", ["variance_kept", "eps"], ["spread"]), helper.make_node("Sqrt", ["spread"], ["std"]),
              helper.make_node("Reciprocal", ["std"], ["inverse"]), helper.make_node("Mul", ["inverse", "scale"], ["factor"]),
              helper.make_node("Reshape", ["mean", "kept"], ["mean_kept"]),
              helper.make_node("Sub", ["x", "mean_kept"], ["centred"]),
              helper.make_node("Mul", ["centred", "factor"], ["normed"]), helper.make_node("Add", ["normed", "bias"], ["y"])]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], consts, opset=18)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("shape, axis, divided_sum", [
    ([1, 64, 48], 1, True),    # wh_magika's LayerNorm over the channels of [1, C, L]
    ([1, 24, 32], 2, True),    # over the last axis: LayerNormalization on the [L, C, 1, 1] view
    ([1, 64, 48], 1, False),   # the means by ReduceMean
])
def test_a_flax_layer_norm_is_one_exnorm(save, target, shape, axis, divided_sum):
    """flax's LayerNorm (its variance a difference of squares) over a block of axes runs as one
    exNorm on the [outer, C, inner, 1] view, its scale and bias inside, nothing on the CPU (the
    toolkit runs magika's op by op, with a Max and a Div on its CPU)."""
    plan, on_cpu = plan_and_compare(statistics_layer_norm(shape, axis, divided_sum), save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm"]


def test_a_flax_layer_norm_whose_divisor_is_not_the_count_declines(save, capsys):
    """A sum divided by another count than the one it sums is no mean: not a LayerNorm, and
    --explain says why."""
    from rkcompile.cli import main

    model = statistics_layer_norm([1, 64, 48], 1)
    for tensor in model.graph.initializer:
        if tensor.name == "mean_divisor":
            tensor.CopyFrom(weight("mean_divisor", np.asarray(1 / 63, np.float32)))
    for node in model.graph.node:
        node.name = node.name or node.output[0]
    plan, _ = plan_and_compare(model, save, "rk3588")
    assert "exNorm" not in {s.kernel for s in plan.record.steps}
    assert main(["plan", str(save(model, "model.onnx")), "--target", "rk3588", "--explain", "y"]) == 0
    assert "decomposed_norm_on_channel_view on y: declined: divisors" in capsys.readouterr().out


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_a_layer_norm_over_the_middle_axis_is_one_exnorm(save, target):
    """A norm written out over axis 1 of [1, C, L] (not the trailing axes, not exNorm's on the
    4-D view [1, 1, C, L]) runs as one exNorm over the channels of the [1, C, L, 1] view; its
    scale and bias vary along L, not along what it normalizes, so they stay a Mul and an Add."""
    plan, on_cpu = plan_and_compare(decomposed_layer_norm([1, 32, 40], [1], 14), save, target)
    assert on_cpu == []
    assert [s.kernel for s in plan.record.steps if s.device == "npu" and s.kernel != "Reshape"] == ["exNorm", "Mul", "Add"]
    # the means' weights 1/32 and -1/32 are exact in float16 too; 1/C in general is not, and
    # the kernel takes its means exactly: stored float32 in a float16 plan
    norm = next(s for s in plan.record.steps if s.kernel == "exNorm")
    means = [plan.record.tensors[name] for name in norm.inputs if tuple(plan.record.tensors[name].shape) == (1, 32, 1, 1)]
    assert len(means) == 2 and {t.dtype for t in means} == {"float32"}
