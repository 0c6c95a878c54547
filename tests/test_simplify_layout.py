"""passes/simplify_layout/ on the forms exporters write: relabels around a GELU between two
linear layers, Transposes around an Add of a constant, Slices that together are a Split,
relabel chains through element-wise ops, relabels of both operands of an Add. Each plan is
checked for its NPU steps and, run in the emulator, against onnxruntime."""
from __future__ import annotations

import inspect
import json

import numpy as np
import onnx
from onnx import helper

from rkcompile.cli import main
from rkcompile.compiler.pipeline import compile_model

from conftest import make_model, value_info, weight

RNG = np.random.default_rng(5)


def npu_kernels(model, tmp_path, target="rk3588") -> tuple[list[str], object]:
    """The kernels of the plan's NPU steps, in order, and the compile context; the emulated
    plan agrees with onnxruntime."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    plan, ctx = compile_model(path, target)
    report = tmp_path / "report.json"
    assert main(["run", str(path), "--target", target, "--check", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["passed"] and min(a["cosine"] for a in data["agreement"]) >= 0.9999, data["agreement"]
    return [s.kernel for s in plan.steps if s.device == "npu"], ctx


def attempts(ctx, original: str) -> list[tuple[str, str]]:
    return [(a.rule, a.outcome) for a in ctx.rewrite_attempts.get(original, [])]


def gelu_nodes(x: str, y: str, prefix: str) -> list:
    """GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    return [helper.make_node("Div", [x, "sqrt2"], [f"{prefix}_d"], name=f"{prefix}_div"),
            helper.make_node("Erf", [f"{prefix}_d"], [f"{prefix}_e"], name=f"{prefix}_erf"),
            helper.make_node("Add", [f"{prefix}_e", "one"], [f"{prefix}_a"], name=f"{prefix}_add"),
            helper.make_node("Mul", [x, f"{prefix}_a"], [f"{prefix}_m"], name=f"{prefix}_mul"),
            helper.make_node("Mul", [f"{prefix}_m", "half"], [y], name=f"{prefix}_half")]


GELU_CONSTANTS = [weight("sqrt2", np.array(np.sqrt(2), np.float32)), weight("one", np.array(1.0, np.float32)),
                  weight("half", np.array(0.5, np.float32))]


def test_relabels_around_a_gelu_between_linear_layers_cancel(tmp_path):
    # MatMul by weights runs as a 1x1 Conv wrapped in relabels ([L, C] <-> [L, C, 1, 1]); the GELU
    # between two of them now runs in the Convs' layout, fused with the first, and the relabel pair leaves
    tokens, width, hidden = 32, 64, 128
    model = make_model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), *gelu_nodes("h", "g", "gelu"),
         helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2")],
        [value_info("x", [1, tokens, width])], [value_info("y", [1, tokens, width])],
        [weight("w1", RNG.normal(0, 0.1, (width, hidden)).astype(np.float32)),
         weight("w2", RNG.normal(0, 0.1, (hidden, width)).astype(np.float32)), *GELU_CONSTANTS])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Reshape", "ConvExGelu", "Conv", "Reshape"]
    assert "move_layout_down" in {r.rule for r in ctx.rewrites}


def test_transposes_around_an_add_of_a_constant_cancel(tmp_path):
    # the constant is re-laid out by the inverse perm (exactly, no broadcast materialized)
    shape, perm, inverse = [1, 8, 6, 5], [0, 1, 3, 2], [0, 1, 3, 2]
    moved = [shape[p] for p in perm]
    bias = RNG.normal(size=[1, 1, moved[3]]).astype(np.float32)  # broadcast over the moved layout's last axis
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="t1", perm=perm),
         helper.make_node("Add", ["t", "bias"], ["a"], name="add"),
         helper.make_node("Sigmoid", ["a"], ["s"], name="sig"),
         helper.make_node("Transpose", ["s"], ["y"], name="t2", perm=inverse)],
        [value_info("x", shape)], [value_info("y", shape)], [weight("bias", bias)])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Add", "Sigmoid"]
    assert ctx.fates["t1"][0] == ctx.fates["t2"][0] == "removed"


def transposes_around_a_relu(x_shape, y_shape):
    """Transpose [0, 2, 1, 3], Relu, Transpose [0, 1, 3, 2]: two Transposes that do not cancel."""
    return make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="t1", perm=[0, 2, 1, 3]),
         helper.make_node("Relu", ["t"], ["r"], name="relu"),
         helper.make_node("Transpose", ["r"], ["y"], name="t2", perm=[0, 1, 3, 2])],
        [value_info("x", x_shape)], [value_info("y", y_shape)])


def test_transposes_that_do_not_cancel_become_one(tmp_path):
    # channel counts that are multiples of C2, so the Relu's tensor takes the same bytes either way
    kernels, _ = npu_kernels(transposes_around_a_relu([1, 16, 32, 8], [1, 32, 8, 16]), tmp_path)
    assert kernels == ["Relu", "Transpose"]


def test_a_move_storing_a_tensor_in_more_bytes_declines(tmp_path):
    # [1, 4, 6, 8] -> [1, 6, 4, 8]: the Relu would run on 4 channels padded to C2 instead of 6
    _, ctx = npu_kernels(transposes_around_a_relu([1, 4, 6, 8], [1, 6, 8, 4]), tmp_path)
    assert ("move_layout_down", "declined: r would take 768 bytes on the NPU instead of 512") in attempts(ctx, "t1")


def test_slices_covering_an_axis_once_are_one_split(tmp_path):
    # q, k, v unbound from one projection as exporters write it: x[:, :, 0:16], 16:32, 32:48
    model = make_model(
        [*(helper.make_node("Slice", ["x", f"s{i}", f"e{i}", "axis"], [f"p{i}"], name=f"slice{i}") for i in range(3)),
         *(helper.make_node("Relu", [f"p{i}"], [f"y{i}"], name=f"relu{i}") for i in range(3))],
        [value_info("x", [1, 10, 48])], [value_info(f"y{i}", [1, 10, 16]) for i in range(3)],
        [*(weight(f"s{i}", np.array([16 * i], np.int64)) for i in range(3)),
         *(weight(f"e{i}", np.array([16 * i + 16], np.int64)) for i in range(3)),
         weight("axis", np.array([-1], np.int64))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels.count("Split") == 1 and "Slice" not in kernels
    assert [r.rule for r in ctx.rewrites].count("slices_as_split") == 1


def test_slices_overlapping_or_leaving_a_gap_stay(tmp_path):
    model = make_model(
        [helper.make_node("Slice", ["x", "s0", "e0", "axis"], ["p0"], name="slice0"),
         helper.make_node("Slice", ["x", "s1", "e1", "axis"], ["p1"], name="slice1"),
         helper.make_node("Add", ["p0", "p1"], ["y"], name="add")],
        [value_info("x", [1, 10, 48])], [value_info("y", [1, 10, 24])],
        [weight("s0", np.array([0], np.int64)), weight("e0", np.array([24], np.int64)),
         weight("s1", np.array([20], np.int64)), weight("e1", np.array([44], np.int64)),
         weight("axis", np.array([2], np.int64))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels.count("Slice") == 2
    assert ("slices_as_split", "declined: the Slices of x along axis 2 do not cover it once") in attempts(ctx, "slice0")


def test_relabel_chain_through_element_wise_ops_collapses(tmp_path):
    # [1, 64, 32] -> [1, 2048] -> Relu -> [32, 64] -> Sigmoid -> [1, 64, 32]: no relabel is left
    model = make_model(
        [helper.make_node("Reshape", ["x", "flat"], ["f"], name="r1"),
         helper.make_node("Relu", ["f"], ["a"], name="relu"),
         helper.make_node("Reshape", ["a", "square"], ["b"], name="r2"),
         helper.make_node("Mul", ["b", "two"], ["c"], name="double"),
         helper.make_node("Sigmoid", ["c"], ["d"], name="sig"),
         helper.make_node("Reshape", ["d", "back"], ["y"], name="r3")],
        [value_info("x", [1, 64, 32])], [value_info("y", [1, 64, 32])],
        [weight("flat", np.array([1, 2048], np.int64)), weight("square", np.array([32, 64], np.int64)),
         weight("back", np.array([1, 64, 32], np.int64)), weight("two", np.array([2.0], np.float32))])
    kernels, _ = npu_kernels(model, tmp_path)
    assert kernels == ["Relu", "Mul", "Sigmoid"]


def test_relabels_of_both_operands_move_together(tmp_path):
    # Add(relabel(a), relabel(b)) -> relabel back: the Add runs on a and b as they are
    shape, flat = [1, 16, 4, 4], [1, 16, 16]
    model = make_model(
        [helper.make_node("Relu", ["x0"], ["a"], name="relu_a"),
         helper.make_node("Sigmoid", ["x1"], ["b"], name="sig_b"),
         helper.make_node("Reshape", ["a", "flat"], ["fa"], name="ra"),
         helper.make_node("Reshape", ["b", "flat"], ["fb"], name="rb"),
         helper.make_node("Add", ["fa", "fb"], ["s"], name="add"),
         helper.make_node("Reshape", ["s", "back"], ["y"], name="back_relabel")],
        [value_info("x0", shape), value_info("x1", shape)], [value_info("y", shape)],
        [weight("flat", np.array(flat, np.int64)), weight("back", np.array(shape, np.int64))])
    kernels, _ = npu_kernels(model, tmp_path)
    assert "Reshape" not in kernels and kernels.count("Add") + kernels.count("AddRelu") == 1


def test_a_move_through_an_op_reading_another_layout_declines(tmp_path):
    # the Add's other operand is laid out as the Transpose's result: the Transposes stay, with the reason
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="t1", perm=[0, 2, 1, 3]),
         helper.make_node("Add", ["t", "z"], ["a"], name="add"),
         helper.make_node("Transpose", ["a"], ["y"], name="t2", perm=[0, 2, 1, 3])],
        [value_info("x", [1, 4, 6, 8]), value_info("z", [1, 6, 4, 8])], [value_info("y", [1, 4, 6, 8])])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels.count("Transpose") == 2
    assert ("move_layout_down", "declined: add reads z, which is not moved as t is") in attempts(ctx, "t1")


def test_a_region_tensor_that_is_a_graph_output_keeps_the_move(tmp_path):
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="t1", perm=[0, 2, 1, 3]),
         helper.make_node("Relu", ["t"], ["r"], name="relu"),
         helper.make_node("Transpose", ["r"], ["y"], name="t2", perm=[0, 2, 1, 3])],
        [value_info("x", [1, 4, 6, 8])], [value_info("y", [1, 4, 6, 8]), value_info("r", [1, 6, 4, 8])])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels.count("Transpose") == 2
    assert any("graph output" in outcome for _, outcome in attempts(ctx, "t1"))


def nhwc_conv(x: str, y: str, prefix: str, channels: int, inputs: int, kernel: int = 1, **attrs) -> tuple[list, list]:
    """A Conv as tf2onnx exports one of an NHWC model: Transposes to NCHW and back around it."""
    nodes = [helper.make_node("Transpose", [x], [f"{prefix}_nchw"], name=f"{prefix}_in", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", [f"{prefix}_nchw", f"{prefix}_w"], [f"{prefix}_c"], name=prefix, **attrs),
             helper.make_node("Transpose", [f"{prefix}_c"], [y], name=f"{prefix}_out", perm=[0, 2, 3, 1])]
    group = attrs.get("group", 1)
    shape = (channels, inputs // group, kernel, kernel)
    return nodes, [weight(f"{prefix}_w", RNG.normal(0, 0.3, shape).astype(np.float32))]


def test_nhwc_squeeze_and_excite_and_pad_run_without_transposes(tmp_path):
    # tf2onnx's MobileNetV3 block on an NHWC tensor: a 1x1 Conv, Pad, a depthwise Conv, a batch norm as Mul
    # and Add, squeeze-and-excite (ReduceMean over H and W, two 1x1 Convs, a hard sigmoid
    # broadcast over the block), then the projection Conv; every Conv in Transposes
    channels = 16
    expand, expand_w = nhwc_conv("x", "e", "expand", channels, 4)
    pad = [helper.make_node("Pad", ["e", "pads"], ["p"], name="pad")]
    depthwise, dw_w = nhwc_conv("p", "d", "dw", channels, channels, kernel=3, group=channels, strides=[2, 2])
    norm = [helper.make_node("Mul", ["d", "scale"], ["ds"], name="bn_mul"),
            helper.make_node("Add", ["ds", "shift"], ["db"], name="bn_add"),
            helper.make_node("Relu", ["db"], ["r"], name="relu"),
            helper.make_node("ReduceMean", ["r"], ["mean"], name="mean", axes=[1, 2], keepdims=1)]
    squeeze, squeeze_w = nhwc_conv("mean", "sq", "squeeze", 4, channels)
    excite, excite_w = nhwc_conv("sq", "ex", "excite", channels, 4)
    gate = [helper.make_node("Add", ["ex", "three"], ["e3"], name="gate_add"),
            helper.make_node("Clip", ["e3", "zero", "six"], ["e6"], name="gate_clip"),
            helper.make_node("Mul", ["e6", "sixth"], ["g"], name="gate_scale"),
            helper.make_node("Mul", ["r", "g"], ["se"], name="excite_mul")]
    project, project_w = nhwc_conv("se", "y", "project", 8, channels)
    scalars = {"three": 3.0, "zero": 0.0, "six": 6.0, "sixth": 1 / 6}
    model = make_model(
        expand + pad + depthwise + norm + squeeze + excite + gate + project,
        [value_info("x", [1, 10, 10, 4])], [value_info("y", [1, 5, 5, 8])],
        [weight("pads", np.array([0, 0, 0, 0, 0, 1, 1, 0], np.int64)),
         weight("scale", RNG.uniform(0.5, 2, channels).astype(np.float32)),
         weight("shift", RNG.normal(0, 1, channels).astype(np.float32)),
         *expand_w, *dw_w, *squeeze_w, *excite_w, *project_w,
         *(weight(name, np.array(value, np.float32)) for name, value in scalars.items())])
    kernels, _ = npu_kernels(model, tmp_path)
    # only the input's move to NCHW and the output's back (on a legal view: Reshape, Transpose,
    # Reshape) stay; the Pad, moved into NCHW, and the batch norm fold into the depthwise Conv
    assert kernels.count("Transpose") == 2 and kernels[:3] == ["Transpose", "Conv", "ConvRelu"], kernels
    assert "Pad" not in kernels, kernels
    assert "Add" not in kernels and kernels[-3:] == ["Reshape", "Transpose", "Reshape"], kernels


def convnext_block(opset: int):
    """A ConvNeXt block as torch exports it: depthwise Conv, Transpose to channels-last,
    LayerNormalization over the channels, MatMul/GELU/MatMul with biases, a layer-scale Mul,
    Transpose back and the residual Add. GELU as the dynamo exporter writes it (opset 18:
    x * (0.5 * (1 + erf(x / sqrt(2))))) or as the TorchScript one does (x * (1 + erf(...)) * 0.5,
    whose 0.5 must not be folded into the next Conv's weights)."""
    if opset >= 18:
        gelu = [helper.make_node("Div", ["h", "sqrt2"], ["d"], name="gelu_div"),
                helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
                helper.make_node("Add", ["e", "one"], ["a"], name="gelu_add"),
                helper.make_node("Mul", ["half", "a"], ["m"], name="gelu_half"),
                helper.make_node("Mul", ["h", "m"], ["g"], name="gelu")]
    else:
        gelu = gelu_nodes("h", "g", "gelu")
    channels, hidden, size = 16, 64, 6
    nodes = [helper.make_node("Conv", ["x", "dw", "dw_b"], ["c"], name="dwconv", group=channels,
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], name="to_last", perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "ln_s", "ln_b"], ["n"], name="norm", axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["n", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1_bias"), *gelu,
             helper.make_node("MatMul", ["g", "w2"], ["o0"], name="fc2"),
             helper.make_node("Add", ["o0", "b2"], ["o1"], name="fc2_bias"),
             helper.make_node("Mul", ["o1", "gamma"], ["o"], name="layer_scale"),
             helper.make_node("Transpose", ["o"], ["back"], name="to_first", perm=[0, 3, 1, 2]),
             helper.make_node("Add", ["x", "back"], ["y"], name="residual")]
    shape = [1, channels, size, size]
    params = {"dw": (channels, 1, 3, 3), "dw_b": (channels,), "ln_s": (channels,), "ln_b": (channels,),
              "w1": (channels, hidden), "b1": (hidden,), "w2": (hidden, channels), "b2": (channels,),
              "gamma": (channels,)}
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)],
                      [weight(n, RNG.normal(0.5, 0.3, s).astype(np.float32)) for n, s in params.items()]
                      + GELU_CONSTANTS, opset=opset)


def test_channels_last_block_runs_on_the_channel_axis_without_transposes(tmp_path):
    # The Transpose to channels-last passes the LayerNormalization (as channel-axis arithmetic,
    # then exNorm) and both MatMuls (as 1x1 Convs) and cancels the Transpose back: ReduceMean takes
    # its axes as an input from opset 18, as an attribute before
    for opset in (17, 18):
        kernels, ctx = npu_kernels(convnext_block(opset), tmp_path)
        assert kernels == ["Conv", "exNorm", "ConvExGelu", "ConvAdd"], (opset, kernels)
        assert ctx.fates["to_last"][0] == ctx.fates["to_first"][0] == "removed"


def gated_channels_last_block(tail: str = "pool", constant_part: bool = False):
    """MambaOut's gated block as torch exports it: a Transpose to channels-last, a linear layer,
    a Split of its channels into a gate, an identity part and a part that goes back to NCHW
    for a depthwise Conv and to channels-last again, the Concat of those two parts along the
    channels, the gate's GELU times it, a linear layer, and then (`tail`) the mean over the
    positions with the axes dropped ("pool", before a classifier), or a Transpose back to NCHW.
    With `constant_part` the Concat joins a constant instead of the depthwise Conv's part."""
    channels, gate, kept, convolved, size = 16, 24, 8, 16, 6
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="to_last", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "w1"], ["h"], name="fc1"),
             helper.make_node("Split", ["h", "parts"], ["g", "i", "c"], name="split", axis=3),
             helper.make_node("Transpose", ["c"], ["c_nchw"], name="c_to_first", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["c_nchw", "dw"], ["c_conv"], name="dwconv", group=convolved,
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c_conv"], ["c_last"], name="c_to_last", perm=[0, 2, 3, 1]),
             *gelu_nodes("g", "gg", "gelu"),
             helper.make_node("Concat", ["i", "kept_constant" if constant_part else "c_last"], ["j"], name="cat",
                              axis=-1),
             helper.make_node("Mul", ["gg", "j"], ["m"], name="gated"),
             helper.make_node("MatMul", ["m", "w2"], ["o"], name="fc2")]
    if tail == "pool":
        nodes.append(helper.make_node("ReduceMean", ["o"], ["y"], name="pool", axes=[1, 2], keepdims=0))
        out_shape = [1, channels]
    else:
        nodes.append(helper.make_node("Transpose", ["o"], ["y"], name="to_first", perm=[0, 3, 1, 2]))
        out_shape = [1, channels, size, size]
    params = {"w1": (channels, gate + kept + convolved), "dw": (convolved, 1, 3, 3), "w2": (gate, channels),
              "kept_constant": (1, size, size, convolved)}
    return make_model(nodes, [value_info("x", [1, channels, size, size])], [value_info("y", out_shape)],
                      [weight(n, RNG.normal(0, 0.3, s).astype(np.float32)) for n, s in params.items()]
                      + [weight("parts", np.array([gate, kept, convolved], np.int64))] + GELU_CONSTANTS)


def test_a_concat_of_transposed_parts_and_a_pool_dropping_axes_take_the_move(tmp_path):
    # the move to channels-last passes the Split, its part's Transposes around the depthwise Conv
    # cancel, the Concat of that part with another joins the channels of the NCHW map, and the
    # mean over the positions that drops them gives the same [1, C] from NCHW: no Transpose
    # stays; with a Transpose back to NCHW instead, it cancels
    for tail in ("pool", "transpose"):
        kernels, ctx = npu_kernels(gated_channels_last_block(tail), tmp_path)
        assert not {"Transpose", "Reshape"} & set(kernels), (tail, kernels)
        assert "Concat" in kernels and ctx.fates["to_last"][0] == "removed", (tail, kernels)


def test_a_concat_joining_a_constant_declines_the_move(tmp_path):
    kernels, ctx = npu_kernels(gated_channels_last_block("transpose", constant_part=True), tmp_path)
    assert ("move_layout_down", "declined: cat (Concat) joins a constant, kept_constant") in attempts(ctx, "to_last")


def test_a_mean_dropping_axes_the_move_would_reorder_stays_after_it(tmp_path):
    # the Transpose swaps H and W; the mean over the channels then keeps [N, W, H], which the
    # unmoved layout holds as [N, H, W]: the move declines with its reason
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], name="swap", perm=[0, 1, 3, 2]),
                        helper.make_node("Relu", ["t"], ["r"], name="relu"),
                        helper.make_node("ReduceMean", ["r"], ["y"], name="mean", axes=[1], keepdims=0)],
                       [value_info("x", [1, 8, 4, 6])], [value_info("y", [1, 6, 4])])
    _, ctx = npu_kernels(model, tmp_path)
    assert ("move_layout_down", "declined: mean drops the axes it reduces and the move reorders the axes it keeps") \
        in attempts(ctx, "swap")


def test_transpose_stays_before_a_norm_over_another_axis(tmp_path):
    # a LayerNormalization over the last axis of a Transpose that did not move the channels there
    # is not a channel normalization: the move declines with its reason
    shape = [1, 8, 6, 5]
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="swap", perm=[0, 1, 3, 2]),
         helper.make_node("LayerNormalization", ["t", "s"], ["n"], name="norm", axis=-1),
         helper.make_node("Transpose", ["n"], ["y"], name="back", perm=[0, 1, 3, 2])],
        [value_info("x", shape)], [value_info("y", shape)], [weight("s", np.ones(6, np.float32))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert ("move_layout_down", "declined: norm (LayerNormalization) does not work on the channels a "
            "Transpose moved last") in attempts(ctx, "swap")


def test_a_written_out_layer_norm_between_channels_last_transposes_runs_on_nchw(tmp_path):
    # timm's EdgeNeXt/ConvNeXt block below opset 17: permute to NHWC, LayerNorm written out as
    # ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div with its affine, a Linear, permute back. The
    # norm's mean broadcasts over the moved channels; moved, it is exNorm over axis 1 of NCHW
    # and the Linear a 1x1 Conv, with no Transpose or relabel left.
    channels, hidden = 24, 48
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("ReduceMean", ["t"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["t", "mean"], ["centred"]),
             helper.make_node("Pow", ["centred", "two"], ["square"]),
             helper.make_node("ReduceMean", ["square"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Div", ["centred", "std"], ["normed"]),
             helper.make_node("Mul", ["normed", "gamma"], ["scaled"]),
             helper.make_node("Add", ["scaled", "beta"], ["norm_out"]),
             helper.make_node("MatMul", ["norm_out", "w"], ["fc"]),
             helper.make_node("Add", ["fc_bias", "fc"], ["fc_out"]),
             helper.make_node("Transpose", ["fc_out"], ["y"], name="to_nchw", perm=[0, 3, 1, 2])]
    model = make_model(nodes, [value_info("x", [1, channels, 16, 16])], [value_info("y", [1, hidden, 16, 16])],
                       [weight("two", np.array(2.0, np.float32)), weight("eps", np.array(1e-6, np.float32)),
                        weight("gamma", RNG.uniform(0.5, 2, channels).astype(np.float32)),
                        weight("beta", RNG.uniform(-1, 1, channels).astype(np.float32)),
                        weight("w", RNG.normal(0, 0.2, (channels, hidden)).astype(np.float32)),
                        weight("fc_bias", RNG.uniform(-1, 1, hidden).astype(np.float32))], opset=14)
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["exNorm", "Conv"]
    assert ctx.fates["to_nhwc"][0] == ctx.fates["to_nchw"][0] == "removed"


def attention_pooling(width: int = 64, steps: int = 40):
    """A recurrent layer's sequence [T, 1, C] pooled by attention, as a keyword spotter writes
    it: scores by a linear layer, a Softmax over time, the sequence weighted and summed."""
    return make_model(
        [helper.make_node("Transpose", ["seq"], ["x"], name="to_batch_first", perm=[1, 0, 2]),
         helper.make_node("MatMul", ["x", "w"], ["s"], name="score"),
         helper.make_node("Softmax", ["s"], ["a"], name="softmax", axis=1),
         helper.make_node("Mul", ["a", "x"], ["m"], name="weigh"),
         helper.make_node("ReduceSum", ["m", "axes"], ["y"], name="pool", keepdims=0)],
        [value_info("seq", [steps, 1, width])], [value_info("y", [1, width])],
        [weight("w", RNG.normal(0, 0.1, (width, 1)).astype(np.float32)), weight("axes", np.array([1], np.int64))],
        opset=13)


def test_a_relabel_after_an_element_wise_op_moves_onto_its_relabelled_operands(tmp_path):
    # the ReduceSum runs as a Conv on [1, T, C, 1]: the relabel to it after the Mul is made on
    # the Mul's operands instead, each of which a relabel already makes (one node for two, none
    # for the Softmax's, run on [1, T, 1, 1] already): 4 layout steps where there were 6
    kernels, ctx = npu_kernels(attention_pooling(), tmp_path)
    assert "move_relabel_up" in {r.rule for r in ctx.rewrites}
    assert kernels.count("Reshape") + kernels.count("Transpose") == 4, kernels
    assert kernels[kernels.index("Softmax"):kernels.index("Softmax") + 3] == ["Softmax", "Mul", "Conv"], kernels


def test_a_softmax_moved_to_a_supported_axis_runs_on_the_layout_the_npu_stores(tmp_path):
    # [1, T, 1] is stored as [1, T, 1, 1]: the Softmax runs there on the channel axis (axis 1),
    # not on [1, 1, 1, T]'s width; the relabels to and from it move no stored byte (aliases)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)],
                       [value_info("x", [1, 40, 1])], [value_info("y", [1, 40, 1])], opset=13)
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Softmax"]
    assert [n.op for n in ctx.graph.nodes if n.op != "Convert"] == ["Reshape", "Softmax", "Reshape"]
    softmax = next(n for n in ctx.graph.nodes if n.op == "Softmax")
    assert softmax.attrs["axis"] == 1 and list(softmax.inputs[0].shape) == [1, 40, 1, 1]


def heads_relabelled_around_a_softmax(relabelled: list[int]):
    """Attention as tf2onnx writes it: the scores [heads, L, L] relabelled (to [1, heads, L, L]),
    scaled, a Softmax over the keys, relabelled back, then times v."""
    heads, length, depth = 2, 48, 16
    return make_model(
        [helper.make_node("MatMul", ["q", "k"], ["scores"], name="scores"),
         helper.make_node("Reshape", ["scores", "relabelled"], ["r"], name="relabel_in"),
         helper.make_node("Mul", ["r", "scale"], ["scaled"], name="scale"),
         helper.make_node("Softmax", ["scaled"], ["weights"], name="softmax", axis=-1),
         helper.make_node("Reshape", ["weights", "back"], ["w"], name="relabel_out"),
         helper.make_node("MatMul", ["w", "v"], ["y"], name="values")],
        [value_info("q", [heads, length, depth]), value_info("k", [heads, depth, length]),
         value_info("v", [heads, length, depth])], [value_info("y", [heads, length, depth])],
        [weight("relabelled", np.array(relabelled, np.int64)),
         weight("back", np.array([heads, length, length], np.int64)),
         weight("scale", np.array(0.25, np.float32))], opset=13)


def test_relabels_of_attention_heads_pass_the_softmax_and_the_attention_is_one_kernel(tmp_path):
    # [2, 48, 48] is stored with 48 channels, [1, 2, 48, 48] with 2 channels padded to C2: the
    # relabel moves through the scaling and the Softmax over the last axis, which it keeps, and
    # cancels with the one after; the attention then fuses, and no scores are stored at all
    kernels, ctx = npu_kernels(heads_relabelled_around_a_softmax([1, 2, 48, 48]), tmp_path)
    assert kernels == ["exSDPAttention"], kernels
    assert ctx.fates["relabel_in"][0] == ctx.fates["relabel_out"][0] == "removed"


def test_a_relabel_merging_the_softmax_axis_stays(tmp_path):
    # [2, 48, 48] -> [2, 2304]: each Softmax row would be all of a head's scores, not one query's
    _, ctx = npu_kernels(heads_relabelled_around_a_softmax([2, 48 * 48]), tmp_path)
    assert ("move_layout_down", "declined: softmax (Softmax) works along an axis the move does not keep") \
        in attempts(ctx, "relabel_in")


def test_a_relabel_after_an_op_reading_a_computed_operand_stays(tmp_path):
    # the Mul's second operand is the graph input itself: relabelling it would add a node
    model = make_model(
        [helper.make_node("Reshape", ["a", "rows"], ["r"], name="relabel_in"),
         helper.make_node("Mul", ["r", "b"], ["m"], name="mul"),
         helper.make_node("Reshape", ["m", "four"], ["y"], name="relabel_out")],
        [value_info("a", [1, 1, 1, 30]), value_info("b", [1, 30, 16])], [value_info("y", [1, 30, 16, 1])],
        [weight("rows", np.array([1, 30, 1], np.int64)), weight("four", np.array([1, 30, 16, 1], np.int64))])
    _, ctx = npu_kernels(model, tmp_path)
    assert "move_relabel_up" not in {r.rule for r in ctx.rewrites}
    assert ("move_relabel_up", "declined: mul reads b, which no relabel read by it alone makes") in attempts(ctx, "relabel_out")


def test_a_transpose_and_a_relabel_of_unit_axes_after_it_are_one_transpose(tmp_path):
    # tokens made sequence-major ([1, C, 1, L] -> [1, L, C]) for a linear layer run as a 1x1 Conv
    # on [L, C, 1, 1]: the Transpose and the relabel into the Conv's layout are one Transpose
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], name="tokens", perm=[0, 3, 1, 2]),
                        helper.make_node("Reshape", ["t", "seq"], ["s"], name="squeeze"),
                        helper.make_node("MatMul", ["s", "w"], ["y"], name="fc")],
                       [value_info("x", [1, 120, 1, 40])], [value_info("y", [1, 40, 64])],
                       [weight("seq", np.array([1, 40, 120], np.int64)),
                        weight("w", RNG.normal(0, 0.1, (120, 64)).astype(np.float32))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Transpose", "Conv", "Reshape"]
    assert "transpose_with_unit_relabel" in {r.rule for r in ctx.rewrites}


def test_a_relabel_of_unit_axes_and_the_transpose_after_it_are_one_transpose(tmp_path):
    model = make_model([helper.make_node("Conv", ["x", "k"], ["c"], name="conv"),
                        helper.make_node("Reshape", ["c", "rows"], ["r"], name="unflatten"),
                        helper.make_node("Transpose", ["r"], ["t"], name="to_nchw", perm=[0, 2, 3, 1]),
                        helper.make_node("Conv", ["t", "k2"], ["y"], name="conv2")],
                       [value_info("x", [40, 120, 1, 1])], [value_info("y", [1, 32, 1, 40])],
                       [weight("rows", np.array([1, 40, 64, 1], np.int64)),
                        weight("k", RNG.normal(0, 0.1, (64, 120, 1, 1)).astype(np.float32)),
                        weight("k2", RNG.normal(0, 0.1, (32, 64, 1, 1)).astype(np.float32))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Conv", "Transpose", "Conv"]
    joined = next(n for n in ctx.graph.nodes if n.op == "Transpose")
    assert list(joined.inputs[0].shape) == [40, 64, 1, 1] and list(joined.outputs[0].shape) == [1, 64, 1, 40]


def test_a_move_meeting_a_computed_operand_of_lower_rank_declines(tmp_path):
    # a Transpose's region meets a Div by a computed scalar (ReduceMax dropping every axis): the
    # operand has no unmoved shape of the Transpose's rank, the move declines and the plan is
    # made (it once raised a TypeError)
    model = make_model(
        [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[3, 2, 1, 0]),
         helper.make_node("Abs", ["t"], ["a"], name="abs"),
         helper.make_node("ReduceMax", ["a"], ["m"], name="max", keepdims=0),
         helper.make_node("Div", ["m", "q"], ["s"], name="scale"),
         helper.make_node("Div", ["t", "s"], ["y"], name="div")],
        [value_info("x", [1, 1, 1, 1])], [value_info("y", [1, 1, 1, 1])],
        [weight("q", np.array(127.0, np.float32))])
    npu_kernels(model, tmp_path)


def grid_model(channels: int, grid: int, size: int, reverse: bool = False):
    """maxvit's grid partition as torch exports it: [1, C, H, W] viewed [1, C, H/g, g, W/g, g],
    perm (0, 2, 4, 3, 5, 1), viewed [1, (H/g)(W/g), g*g, C], the two middle axes swapped; with
    reverse=True its inverse: the swap, a view cutting both axes, the rank-6 perm back."""
    side, tokens, groups = grid * size, size * size, grid * grid
    six = [1, channels, size, grid, size, grid]
    moved = [1, size, size, grid, grid, channels]
    if reverse:
        nodes = [helper.make_node("Transpose", ["x"], ["t"], name="swap", perm=[0, 2, 1, 3]),
                 helper.make_node("Reshape", ["t", "six"], ["r"], name="cut"),
                 helper.make_node("Transpose", ["r"], ["p"], name="back", perm=[0, 5, 1, 3, 2, 4]),
                 helper.make_node("Reshape", ["p", "image"], ["y"], name="image_view")]
        return make_model(nodes, [value_info("x", [1, groups, tokens, channels])], [value_info("y", [1, channels, side, side])],
                          [weight("six", np.array(moved, np.int64)),
                           weight("image", np.array([1, channels, side, side], np.int64))])
    nodes = [helper.make_node("Reshape", ["x", "six"], ["r"], name="view"),
             helper.make_node("Transpose", ["r"], ["p"], name="permute", perm=[0, 2, 4, 3, 5, 1]),
             helper.make_node("Reshape", ["p", "merged"], ["m"], name="merge"),
             helper.make_node("Transpose", ["m"], ["y"], name="swap", perm=[0, 2, 1, 3])]
    return make_model(nodes, [value_info("x", [1, channels, side, side])], [value_info("y", [1, groups, tokens, channels])],
                      [weight("six", np.array(six, np.int64)),
                       weight("merged", np.array([1, tokens, groups, channels], np.int64))])


def test_transposes_across_a_merging_or_cutting_relabel_are_one(tmp_path):
    # the grid partition's rank-6 Transpose and the swap after the merge are one Transpose, as
    # are the swap and the rank-6 Transpose after the cut of its reverse: two legal steps for the
    # rank-6 move, where the swap apart took two more (8 and 9 NPU steps before)
    for reverse in (False, True):
        model = grid_model(16, 4, 7, reverse)
        kernels, ctx = npu_kernels(model, tmp_path)
        assert "transposes_across_relabel" in {r.rule for r in ctx.rewrites}
        assert kernels == ["Reshape", "Transpose", "Reshape", "Transpose", "Reshape"]


def test_transposes_across_a_relabel_both_merging_and_cutting_stay_apart(tmp_path):
    # [2, 6, 4] -> [12, 2, 2]: one axis merged, another cut; the Transposes keep their own moves
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], name="first", perm=[1, 0, 2]),
                        helper.make_node("Reshape", ["t", "shape"], ["r"], name="regroup"),
                        helper.make_node("Transpose", ["r"], ["y"], name="second", perm=[2, 1, 0])],
                       [value_info("x", [6, 2, 4])], [value_info("y", [2, 2, 12])],
                       [weight("shape", np.array([12, 2, 2], np.int64))])
    _, ctx = npu_kernels(model, tmp_path)
    assert "transposes_across_relabel" not in {r.rule for r in ctx.rewrites}
    assert ("transposes_across_relabel", "declined: the relabel between the Transposes both merges and cuts axes") in attempts(ctx, "second")


def test_transposes_across_a_relabel_whose_joined_move_the_target_refuses_stay_apart(tmp_path):
    # [1, 8, 6, 7] -> (0, 3, 1, 2) -> [1, 7, 8, 6] merged to [1, 1, 56, 6] -> swap: both legal on
    # rk3588, their join (0, 2, 3, 1) on [1, 8, 6, 7] is not (h1*w1 % 8 == 0)
    model = make_model([helper.make_node("Transpose", ["x"], ["t"], name="first", perm=[0, 3, 1, 2]),
                        helper.make_node("Reshape", ["t", "shape"], ["r"], name="merge"),
                        helper.make_node("Transpose", ["r"], ["y"], name="second", perm=[0, 1, 3, 2])],
                       [value_info("x", [1, 8, 6, 7])], [value_info("y", [1, 1, 6, 56])],
                       [weight("shape", np.array([1, 1, 56, 6], np.int64))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Transpose", "Reshape", "Transpose"]
    reasons = [outcome for rule, outcome in attempts(ctx, "second") if rule == "transposes_across_relabel"]
    assert reasons and reasons[-1].startswith("declined: the joined Transpose would break"), reasons


def flattened_feature_map_mlp(channels: int, hidden: int, side: int, norm: bool):
    """SegFormer's decode-head MLP as torch.onnx writes it: a feature map flattened to
    [1, C, H*W], transposed to tokens [1, H*W, C], (optionally a LayerNorm over C,) a Linear
    (MatMul and bias Add), transposed back and relabelled to [1, D, H, W]."""
    tokens = "n" if norm else "t"
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
             helper.make_node("Transpose", ["f"], ["t"], name="to_tokens", perm=[0, 2, 1]),
             *([helper.make_node("LayerNormalization", ["t", "ln_s", "ln_b"], ["n"], name="norm", axis=-1)]
               if norm else []),
             helper.make_node("MatMul", [tokens, "w"], ["m"], name="linear"),
             helper.make_node("Add", ["m", "b"], ["l"], name="linear_bias"),
             helper.make_node("Transpose", ["l"], ["back"], name="to_channels", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["back", "planes"], ["y"], name="unflatten")]
    return make_model(
        nodes, [value_info("x", [1, channels, side, side])], [value_info("y", [1, hidden, side, side])],
        [weight("flat", np.array([1, channels, side * side], np.int64)),
         weight("planes", np.array([1, hidden, side, side], np.int64)),
         weight("ln_s", RNG.uniform(0.5, 2, channels).astype(np.float32)),
         weight("ln_b", RNG.uniform(-1, 1, channels).astype(np.float32)),
         weight("w", RNG.normal(0, 0.2, (channels, hidden)).astype(np.float32)),
         weight("b", RNG.uniform(-1, 1, hidden).astype(np.float32))], opset=18)


def test_a_linear_layer_on_a_flattened_feature_map_runs_as_a_conv_on_it(tmp_path):
    # the Transpose of [1, C, H*W] to tokens passes the LayerNorm (exNorm over axis 1) and the
    # MatMul (a 1x1 Conv on [1, C, 1, H*W]) and cancels the Transpose back; the relabels left
    # between [1, C, H, W], [1, C, H*W] and [1, C, 1, H*W] move no stored byte
    for norm, expected in ((False, ["Conv"]), (True, ["exNorm", "Conv"])):
        kernels, ctx = npu_kernels(flattened_feature_map_mlp(16, 32, 8, norm), tmp_path)
        assert kernels == expected, (norm, kernels)
        assert ctx.fates["to_tokens"][0] == ctx.fates["to_channels"][0] == "removed"


def mix_ffn(channels: int, hidden: int, side: int):
    """SegFormer's Mix-FFN on tokens [1, H*W, C] as torch.onnx writes it: Linear, Transpose and
    Reshape to the feature map [1, D, H, W], depthwise 3x3 Conv, Reshape and Transpose back to
    tokens, GELU, Linear, and the residual Add that keeps the block on tokens."""
    length = side * side
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1_bias"),
             helper.make_node("Transpose", ["h"], ["ht"], name="to_channels", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["ht", "planes"], ["map"], name="to_map"),
             helper.make_node("Conv", ["map", "dw", "dw_b"], ["c"], name="dwconv", group=hidden,
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "flat"], ["cf"], name="flatten"),
             helper.make_node("Transpose", ["cf"], ["g_in"], name="to_tokens", perm=[0, 2, 1]),
             *gelu_nodes("g_in", "g", "gelu"),
             helper.make_node("MatMul", ["g", "w2"], ["o0"], name="fc2"),
             helper.make_node("Add", ["o0", "b2"], ["o"], name="fc2_bias"),
             helper.make_node("Add", ["x", "o"], ["y"], name="residual")]
    return make_model(
        nodes, [value_info("x", [1, length, channels])], [value_info("y", [1, length, channels])],
        [weight("planes", np.array([1, hidden, side, side], np.int64)),
         weight("flat", np.array([1, hidden, length], np.int64)),
         weight("w1", RNG.normal(0, 0.2, (channels, hidden)).astype(np.float32)),
         weight("b1", RNG.uniform(-1, 1, hidden).astype(np.float32)),
         weight("dw", RNG.normal(0, 0.3, (hidden, 1, 3, 3)).astype(np.float32)),
         weight("dw_b", RNG.uniform(-1, 1, hidden).astype(np.float32)),
         weight("w2", RNG.normal(0, 0.2, (hidden, channels)).astype(np.float32)),
         weight("b2", RNG.uniform(-1, 1, channels).astype(np.float32)), *GELU_CONSTANTS], opset=18)


def test_tokens_to_a_feature_map_is_one_transpose(tmp_path):
    # the Linear's [L, D, 1, 1] relabelled to [1, L, D] and Transposed to [1, D, L] (then relabelled
    # to [1, D, H, W]) is one Transpose to [1, D, 1, L], which the NPU stores as [1, D, H, W]
    kernels, ctx = npu_kernels(mix_ffn(16, 32, 8), tmp_path)
    assert kernels[1:4] == ["Conv", "Transpose", "Conv"], kernels
    assert ("transpose_beside_relabel", "applied") in attempts(ctx, "to_channels")


def tokens_from_a_feature_map(channels: int, side: int):
    """A feature map flattened and transposed to tokens [1, H*W, C] (torch.onnx's form), a Linear
    on them and a residual Add of tokens that keeps the Linear on tokens."""
    length = side * side
    return make_model(
        [helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
         helper.make_node("Transpose", ["f"], ["t"], name="to_tokens", perm=[0, 2, 1]),
         helper.make_node("MatMul", ["t", "w"], ["m"], name="linear"),
         helper.make_node("Add", ["m", "z"], ["y"], name="residual")],
        [value_info("x", [1, channels, side, side]), value_info("z", [1, length, channels])],
        [value_info("y", [1, length, channels])],
        [weight("flat", np.array([1, channels, length], np.int64)),
         weight("w", RNG.normal(0, 0.2, (channels, channels)).astype(np.float32))], opset=18)


def test_a_feature_map_to_tokens_is_one_transpose_within_the_targets_limits(tmp_path):
    # [1, C, H, W] Transposed to [1, H*W, C] and relabelled to the Linear's [L, C, 1, 1] is one
    # Transpose of [1, C, L, 1] (stored as the feature map is) when C * L is below the RK3588's
    # 8192; at 8192 the joined Transpose would break that limit and the two steps stay. (The other
    # Reshapes relabel the tokens input z and the result, to and from the Conv's layout.)
    kernels, ctx = npu_kernels(tokens_from_a_feature_map(16, 8), tmp_path)
    assert kernels == ["Transpose", "Reshape", "ConvAdd", "Reshape"], kernels
    assert ("transpose_beside_relabel", "applied") in attempts(ctx, "to_tokens")
    kernels, ctx = npu_kernels(tokens_from_a_feature_map(32, 16), tmp_path)
    assert kernels == ["Transpose", "Reshape", "Reshape", "ConvAdd", "Reshape"], kernels
    assert any(rule == "transpose_beside_relabel" and "would break" in outcome
               for rule, outcome in attempts(ctx, "to_tokens")), attempts(ctx, "to_tokens")


def cross_covariance_attention(channels: int = 48, heads: int = 2, length: int = 64):
    """timm's cross-covariance attention (XCiT, EdgeNeXt) as torch exports it: the q/k/v
    projection cut into heads with channels before tokens, unbound by a Split, q and k
    normalized along the tokens, their channel-by-channel scores scaled per head, a Softmax,
    times v, and the heads merged back into tokens for the output projection."""
    depth = channels // heads
    normalize = []
    for name in ("q", "k"):
        normalize += [helper.make_node("Squeeze", [f"{name}5", "first"], [f"{name}4"], name=f"unbind_{name}"),
                      helper.make_node("ReduceL2", [f"{name}4"], [f"{name}_norm"], name=f"norm_{name}", axes=[-1]),
                      helper.make_node("Clip", [f"{name}_norm", "eps"], [f"{name}_clip"], name=f"clip_{name}"),
                      helper.make_node("Div", [f"{name}4", f"{name}_clip"], [f"{name}_n"], name=f"normalize_{name}")]
    return make_model(
        [helper.make_node("MatMul", ["x", "wqkv"], ["qkv"], name="qkv"),
         helper.make_node("Reshape", ["qkv", "heads"], ["qkv5"], name="cut_heads"),
         helper.make_node("Transpose", ["qkv5"], ["qkv_t"], name="channels_first", perm=[2, 0, 3, 4, 1]),
         helper.make_node("Split", ["qkv_t", "ones"], ["q5", "k5", "v5"], name="unbind", axis=0),
         helper.make_node("Squeeze", ["v5", "first"], ["v4"], name="unbind_v"), *normalize,
         helper.make_node("Transpose", ["k_n"], ["kt"], name="k_transposed", perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["q_n", "kt"], ["scores"], name="scores"),
         helper.make_node("Mul", ["scores", "temperature"], ["scaled"], name="temperature"),
         helper.make_node("Softmax", ["scaled"], ["weights"], name="softmax", axis=-1),
         helper.make_node("MatMul", ["weights", "v4"], ["mixed"], name="mix"),
         helper.make_node("Transpose", ["mixed"], ["tokens"], name="tokens_last", perm=[0, 3, 1, 2]),
         helper.make_node("Reshape", ["tokens", "merged"], ["merged_heads"], name="merge_heads"),
         helper.make_node("MatMul", ["merged_heads", "wproj"], ["y"], name="proj")],
        [value_info("x", [1, length, channels])], [value_info("y", [1, length, channels])],
        [weight("wqkv", RNG.normal(0, 0.2, (channels, 3 * channels)).astype(np.float32)),
         weight("heads", np.array([1, length, 3, heads, depth], np.int64)),
         weight("ones", np.array([1, 1, 1], np.int64)), weight("first", np.array([0], np.int64)),
         weight("eps", np.array(1e-12, np.float32)),
         weight("temperature", RNG.uniform(0.5, 2, (heads, 1, 1)).astype(np.float32)),
         weight("merged", np.array([1, length, channels], np.int64)),
         weight("wproj", RNG.normal(0, 0.2, (channels, channels)).astype(np.float32))], opset=17)


def test_relabels_of_most_outputs_of_a_split_are_made_once_before_it(tmp_path):
    # q and k are relabelled to the normalization's [C, L, 1, 1] after the unbinding Split:
    # that relabel is made once, with the one before the Split, which then cuts the Transpose's
    # result [3C, L, 1, 1] along its first axis, and v is relabelled back below it: 4 layout
    # steps where there were 5 (relabel in, Transpose, v, relabel out)
    kernels, ctx = npu_kernels(cross_covariance_attention(), tmp_path)
    assert "relabels_above_split" in {r.rule for r in ctx.rewrites}
    split = next(n for n in ctx.graph.nodes if n.op == "Split")
    assert split.attrs["axis"] == 0 and list(split.inputs[0].shape) == [144, 64, 1, 1]
    assert kernels[:6] == ["Reshape", "Conv", "Transpose", "Split", "Reshape", "exNorm"], kernels
    assert kernels.count("Reshape") + kernels.count("Transpose") == 4, kernels


def split_with_relabelled_outputs(relabelled: int):
    """[24, 16] relabelled to [3, 8, 16] and cut in three along its first axis; the first
    `relabelled` pieces are relabelled to [8, 16, 1, 1] and go through a Relu each, the others
    are added."""
    pieces = ["a", "b", "c"]
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["g"], name="group"),
             helper.make_node("Split", ["g", "ones"], pieces, name="cut", axis=0)]
    outputs = []
    for piece in pieces[:relabelled]:
        nodes += [helper.make_node("Reshape", [piece, "tokens"], [f"{piece}_t"], name=f"relabel_{piece}"),
                  helper.make_node("Relu", [f"{piece}_t"], [f"{piece}_y"], name=f"relu_{piece}")]
        outputs.append(value_info(f"{piece}_y", [8, 16, 1, 1]))
    rest = pieces[relabelled:]
    nodes.append(helper.make_node("Add", [rest[0], rest[-1]], ["sum"], name="add"))
    outputs.append(value_info("sum", [1, 8, 16]))
    return make_model(nodes, [value_info("x", [24, 16])], outputs,
                      [weight("grouped", np.array([3, 8, 16], np.int64)), weight("ones", np.array([1, 1, 1], np.int64)),
                       weight("tokens", np.array([8, 16, 1, 1], np.int64))], opset=13)


def test_relabels_of_two_of_three_outputs_of_a_split_are_made_before_it(tmp_path):
    _, ctx = npu_kernels(split_with_relabelled_outputs(2), tmp_path)
    assert ("relabels_above_split", "applied") in attempts(ctx, "relabel_a")
    assert ("relabels_above_split", "applied") in attempts(ctx, "relabel_b")
    split = next(n for n in ctx.graph.nodes if n.op == "Split")
    assert split.attrs["axis"] == 0 and list(split.inputs[0].shape) == [24, 16, 1, 1]


def test_a_relabel_of_one_of_three_outputs_of_a_split_stays_below_it(tmp_path):
    # moving it would leave one relabel before the Split and two below it, for two
    _, ctx = npu_kernels(split_with_relabelled_outputs(1), tmp_path)
    assert "relabels_above_split" not in {r.rule for r in ctx.rewrites}
    assert ("relabels_above_split", "declined: no more than half its outputs take one relabel of their pieces") \
        in attempts(ctx, "cut")


def test_the_pass_runs_every_rule_its_families_define():
    """Each rule a family module of passes/simplify_layout/ defines (a public function of the node
    and the simplifier) runs, once: in RULES, or after the kernel fusions. A rule written but left
    out of both would run nowhere, silently."""
    from rkcompile.passes import simplify_layout
    from rkcompile.passes.simplify_layout import kernel_operands, move_down, redundant, relabels

    listed = [*simplify_layout.RULES, simplify_layout.attention_operands, simplify_layout.matmul_operands]
    defined = {function for family in (redundant, move_down, relabels, kernel_operands)
               for name, function in vars(family).items()
               if inspect.isfunction(function) and function.__module__ == family.__name__ and not name.startswith("_")
               and list(inspect.signature(function).parameters) == ["node", "simplifier"]}
    assert len(set(listed)) == len(listed)
    assert set(listed) == defined


def window_partition(shift: bool, channels=16, side=32, window=8):
    """Swin's window partition of projected tokens [1, side*side, C] into [windows, window^2, C]
    (a relabel to [1, rows, window, cols, window, C], the Transpose swapping the window axes, a
    relabel), before a linear layer; with `shift`, its cyclic shift by one row first (Slices and
    a Concat)."""
    rows = side // window
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Transpose", ["c"], ["t"], name="to_tokens", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "tokens_shape"], ["tokens"], name="tokens"),
             helper.make_node("MatMul", ["tokens", "w1"], ["projected"], name="projection")]
    source = "projected"
    if shift:
        nodes += [helper.make_node("Reshape", [source, "map_shape"], ["map"], name="map"),
                  helper.make_node("Slice", ["map", "zero", "one", "axis"], ["first_row"], name="first_row"),
                  helper.make_node("Slice", ["map", "one", "side", "axis"], ["other_rows"], name="other_rows"),
                  helper.make_node("Concat", ["other_rows", "first_row"], ["shifted"], name="shift", axis=1)]
        source = "shifted"
    nodes += [helper.make_node("Reshape", [source, "split_shape"], ["split"], name="split"),
              helper.make_node("Transpose", ["split"], ["partitioned"], name="partition", perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["partitioned", "windows_shape"], ["windows"], name="windows"),
              helper.make_node("MatMul", ["windows", "w2"], ["y"], name="linear")]
    windows_shape = [rows * rows, window * window, channels]
    constants = [weight("w", RNG.normal(0, 0.3, (channels, channels, 1, 1)).astype(np.float32)),
                 weight("w1", RNG.normal(0, 0.3, (channels, channels)).astype(np.float32)),
                 weight("w2", RNG.normal(0, 0.3, (channels, channels)).astype(np.float32)),
                 weight("tokens_shape", np.array([1, side * side, channels])),
                 weight("map_shape", np.array([1, side, side, channels])),
                 weight("zero", np.array([0])), weight("one", np.array([1])), weight("side", np.array([side])),
                 weight("axis", np.array([1])),
                 weight("split_shape", np.array([1, rows, window, rows, window, channels])),
                 weight("windows_shape", np.array(windows_shape))]
    return make_model(nodes, [value_info("x", [1, channels, side, side])], [value_info("y", windows_shape)],
                      constants, opset=17)


def test_a_window_partition_of_token_rows_is_one_gather(tmp_path):
    # the tokens run as rows [1024, 16, 1, 1] of the projections' 1x1 Convs; the partition (two
    # Transposes between relabels: the swap of the window axes is no legal perm on its own) moves
    # whole rows, and so does the cyclic shift's Gather before it: one Gather of rows either way
    for shift in (False, True):
        kernels, ctx = npu_kernels(window_partition(shift), tmp_path)
        assert kernels == ["Conv", "Transpose", "Reshape", "Conv", "Gather", "Conv", "Reshape"], (shift, kernels)
        assert "moves_as_gather" in {r.rule for r in ctx.rewrites}


def test_a_linear_over_heads_between_transposes_that_cancel_runs_on_the_heads_as_channels(tmp_path):
    # CaiT's talking heads: scores [1, 4, 24, 24] = q @ k, moved heads-last, a Linear over the 4
    # heads, moved back, Softmax. The scores' layout stores 4 channels padded to C2, more bytes
    # than the heads-last [1, 24, 24, 4]; but both Transposes cancel, so the region runs between
    # tensors the plan holds at that size anyway: the product, one 1x1 Conv over the heads, the
    # Softmax (4 steps before: the product's result relabelled for the Conv)
    heads, side, depth = 4, 24, 16
    model = make_model(
        [helper.make_node("MatMul", ["q", "k"], ["s"], name="scores"),
         helper.make_node("Transpose", ["s"], ["t"], name="heads_last", perm=[0, 2, 3, 1]),
         helper.make_node("MatMul", ["t", "w"], ["m"], name="mix"),
         helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
         helper.make_node("Transpose", ["a"], ["u"], name="heads_first", perm=[0, 3, 1, 2]),
         helper.make_node("Softmax", ["u"], ["y"], name="softmax", axis=-1)],
        [value_info("q", [1, heads, side, depth]), value_info("k", [1, heads, depth, side])],
        [value_info("y", [1, heads, side, side])],
        [weight("w", RNG.normal(size=(heads, heads)).astype(np.float32)),
         weight("b", RNG.normal(size=heads).astype(np.float32))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["MatMul", "Conv", "Softmax"]
    assert ctx.fates["heads_last"][0] == ctx.fates["heads_first"][0] == "removed"
