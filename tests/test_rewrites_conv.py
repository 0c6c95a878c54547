"""Conv rewrites (passes/rewrites/conv_windows.py): a Conv over the target's window limits becomes
convolutions within them that compute exactly what it computes, for strides, kernels, pads and
groups other than the repros', at every primary target."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import helper

from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from rkcompile.compiler.context import CompileContext
from rkcompile.passes import fold_constants, import_model, remove_noops, rewrite
from rkcompile.passes.rewrites.conv_windows import factors_within
from rkcompile.compiler.pipeline import compile_model
from rkcompile.targets import get_target

RNG = np.random.default_rng(11)


def conv_model(channels, out_channels, size, kernel, strides, pads=(0, 0, 0, 0), group=1, bias=True):
    kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
    strides = (strides, strides) if isinstance(strides, int) else strides
    w = RNG.standard_normal((out_channels, channels // group, *kernel)).astype(np.float32) * 0.1
    inputs, inits = ["x", "w"], [weight("w", w)]
    if bias:
        inputs.append("b")
        inits.append(weight("b", RNG.standard_normal(out_channels).astype(np.float32)))
    size = (size, size) if isinstance(size, int) else size
    out = [(s + p0 + p1 - k) // st + 1 for s, p0, p1, k, st in zip(size, pads[:2], pads[2:], kernel, strides)]
    node = helper.make_node("Conv", inputs, ["y"], name="conv", kernel_shape=list(kernel), strides=list(strides),
                            pads=list(pads), group=group)
    return make_model([node], [value_info("x", [1, channels, *size])], [value_info("y", [1, out_channels, *out])], inits)


def rewritten(model, tmp_path, target) -> CompileContext:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    ctx = CompileContext(model_path=path, target=get_target(target))
    for compiler_pass in (import_model, fold_constants, remove_noops, rewrite):
        compiler_pass.run(ctx)
    return ctx


def run_ort(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_rewrite_exact(model, ctx, feeds):
    after = gs.export_onnx(ctx.graph, do_type_check=False)
    del after.opset_import[:]
    after.opset_import.extend(model.opset_import)
    for want, got in zip(run_ort(model, feeds), run_ort(after, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


CASES = {
    "patch_embedding": dict(channels=3, out_channels=8, size=64, kernel=16, strides=16),
    "kernel_over_stride_with_pads": dict(channels=3, out_channels=4, size=40, kernel=17, strides=16, pads=(8, 8, 8, 8)),
    "depthwise_stride_8": dict(channels=4, out_channels=4, size=35, kernel=8, strides=8, group=4),
    "rectangular": dict(channels=2, out_channels=3, size=(45, 20), kernel=(14, 4), strides=(14, 2)),
    "groups_asymmetric_pads": dict(channels=4, out_channels=6, size=50, kernel=12, strides=12, pads=(1, 2, 3, 0),
                                   group=2),
    "stride_9_kernel_10": dict(channels=3, out_channels=5, size=40, kernel=10, strides=9, bias=False),
    "stride_32_in_two_stages": dict(channels=2, out_channels=3, size=70, kernel=4, strides=32),
    "tiles_kernel_33_stride_1": dict(channels=2, out_channels=3, size=40, kernel=33, strides=1, pads=(16, 16, 16, 16)),
    "tiles_depthwise_kernel_11": dict(channels=4, out_channels=4, size=24, kernel=11, strides=2, pads=(5, 5, 5, 5), group=4),
    "tiles_depthwise_kernel_9_unpadded": dict(channels=4, out_channels=4, size=20, kernel=9, strides=1, group=4),
    "tiles_depthwise_kernel_9_asymmetric": dict(channels=4, out_channels=4, size=(14, 17), kernel=(9, 12), strides=(1, 3),
                                                pads=(4, 4, 4, 3), group=4),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_over_the_window_limits_becomes_legal_convs_computing_the_same(tmp_path, name, target):
    model = conv_model(**CASES[name])
    ctx = rewritten(model, tmp_path, target)
    expected = "conv_kernel_to_tiles" if name.startswith("tiles_") else "conv_stride_to_space_to_depth"
    assert [r.rule for r in ctx.rewrites] == [expected]
    limits = get_target(target)
    for node in ctx.graph.nodes:
        if node.op == "Conv":
            assert max(node.attrs["strides"]) <= limits.rule_parameter("Conv", "conv_window", "stride")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    assert_rewrite_exact(model, ctx, feeds)
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]
    # an ungrouped Conv on a 1, 3 or 4 channel model input still reads it as an image after the
    # space-to-depth (its first stage is ungrouped); the other inputs stay C2-padded blocks
    image = CASES[name].get("group", 1) == 1 and shape[1] in limits.image_input_channels
    assert plan.tensors["x@npu"].layout == ("NHWC" if image else "NC1HWC2")


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("kernel, stride, pads, group", [(256, 128, (0, 0), 1), (40, 1, (20, 19), 2)])
def test_a_1d_conv_over_the_limits_is_lifted_to_2d_and_legalized(tmp_path, target, kernel, stride, pads, group):
    """An STFT front end's 1-D Conv (kernel 256, stride 128) and a long grouped 1-D kernel: the
    2-D view of each is legalized by the 2-D rules, and every step runs on the NPU."""
    channels, length = 2, 832
    w = RNG.standard_normal((6, channels // group, kernel)).astype(np.float32) * 0.05
    out = (length + sum(pads) - kernel) // stride + 1
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[kernel], strides=[stride],
                            pads=list(pads), group=group)
    model = make_model([node], [value_info("x", [1, channels, length])], [value_info("y", [1, 6, out])],
                       [weight("w", w)])
    ctx = rewritten(model, tmp_path, target)
    assert len(ctx.rewrites) == 1 and "conv_1d_as_2d" in ctx.rewrites[0].rule.split(" > ")
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((1, channels, length)).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]


@pytest.mark.parametrize("name, copies", [("tiles_depthwise_kernel_11", []), ("tiles_depthwise_kernel_9_asymmetric", []),
                                           ("tiles_depthwise_kernel_9_unpadded", ["Slice"] * 4),
                                           ("tiles_kernel_33_stride_1", ["Pad"] + ["Slice"] * 4)])
def test_kernel_tiles_read_the_input_through_their_own_pads_where_the_pads_allow(tmp_path, name, copies):
    """mixnet's 9x9 and 11x11 depthwise kernels (pads 4 and 5, limit 8): each tile a Conv of the
    input itself, one step per tile as rknn-toolkit2 keeps one step per Conv. Without pads to
    hold a window, the tiles read Slices of the input; with pads over the limit (16 > 15), of
    one Pad of it."""
    ctx = rewritten(conv_model(**CASES[name]), tmp_path, "rk3588")
    ops = [node.op for node in ctx.graph.nodes]
    assert [op for op in ops if op not in ("Conv", "Add")] == copies
    kernel = CASES[name]["kernel"]
    limit = get_target("rk3588").rule_parameter(
        "Conv", "conv_window", "depthwise_kernel" if CASES[name].get("group", 1) > 1 else "kernel")
    tiles = math.prod(-(-k // limit) for k in ((kernel, kernel) if isinstance(kernel, int) else kernel))
    assert ops.count("Conv") == tiles


def test_a_stride_with_a_prime_factor_over_the_limit_stays_and_says_why(tmp_path):
    model = conv_model(channels=2, out_channels=2, size=44, kernel=11, strides=11)
    ctx = rewritten(model, tmp_path, "rk3588")
    assert not ctx.rewrites
    reasons = {a.rule: a.outcome for a in ctx.rewrite_attempts["conv"]}
    assert "no block size divides stride [11, 11]" in reasons["conv_stride_to_space_to_depth"]
    assert "kernel is within the limit" in reasons["conv_kernel_to_tiles"]


def test_a_legal_conv_is_left_alone(tmp_path):
    ctx = rewritten(conv_model(channels=3, out_channels=4, size=16, kernel=7, strides=7), tmp_path, "rk3588")
    assert not ctx.rewrites


@pytest.mark.parametrize("value, limit, factors", [(16, 7, [4, 4]), (8, 7, [4, 2]), (36, 7, [6, 6]),
                                                   (11, 7, None), (1, 7, [])])
def test_factors_within_the_limit(value, limit, factors):
    found = factors_within(value, limit)
    assert (sorted(found) if found is not None else None) == (sorted(factors) if factors is not None else None)


def slice_model(shape, starts, ends, axes, steps):
    inits = [weight(name, np.array(v, dtype=np.int64)) for name, v in
             (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="slice")
    out = list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        out[axis] = len(range(*slice(start, end, step).indices(shape[axis])))
    return make_model([node], [value_info("x", list(shape))], [value_info("y", out)], inits)


SLICES = {
    "swin_rows_nhwc": ((1, 12, 12, 8), [1], [12], [1], [2]),
    "height_and_width_from_the_end": ((1, 3, 20, 18), [-19, 2], [20, 100], [2, 3], [3, 4]),
    "channels_and_width": ((2, 10, 6, 9), [1, 0], [9, 9], [1, 3], [2, 2]),
    "rank3_last_axis": ((4, 6, 30), [0], [30], [-1], [3]),
    "rank2_step_8_in_two_stages": ((5, 64), [3], [64], [1], [8]),
    "prime_step_over_the_stride_limit": ((1, 2, 40, 6), [1], [40], [2], [11]),
    "batch_axis": ((4, 3, 5, 5), [0], [4], [0], [2]),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(SLICES))
def test_strided_slice_becomes_legal_picking_ops_computing_the_same(tmp_path, name, target):
    shape, *spec = SLICES[name]
    model = slice_model(shape, *spec)
    ctx = rewritten(model, tmp_path, target)
    assert [r.rule for r in ctx.rewrites][:1] == ["strided_slice_to_convs"]
    picking = {n.op for n in ctx.graph.nodes} - {"Reshape", "Slice"}
    assert picking == ({"Gather"} if name in ("prime_step_over_the_stride_limit", "batch_axis") else {"Conv"})
    assert all(list(n.inputs[4].values) == [1] * len(n.inputs[4].values)
               for n in ctx.graph.nodes if n.op == "Slice" and len(n.inputs) > 4)
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal(shape).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]


def test_a_backwards_slice_is_not_rewritten_and_says_why(tmp_path):
    ctx = rewritten(slice_model((1, 2, 8, 8), [7], [-9], [2], [-2]), tmp_path, "rk3588")
    assert not ctx.rewrites
    (attempt,) = [a for a in ctx.rewrite_attempts["slice"] if a.rule == "strided_slice_to_convs"]
    assert "runs backwards" in attempt.outcome


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("size, dilation, strides, kept", [(14, 36, 1, [1, 1]), (20, 24, 2, [1, 1]), ((9, 12), 20, 1, [1, 1])])
def test_taps_reading_only_padding_are_dropped(tmp_path, target, size, dilation, strides, kept):
    model = conv_model(channels=4, out_channels=6, size=size, kernel=3, strides=strides, pads=(dilation,) * 4)
    (conv,) = model.graph.node
    conv.attribute.append(helper.make_attribute("dilations", [dilation, dilation]))
    size = (size, size) if isinstance(size, int) else size
    out = [(s + 2 * dilation - 2 * dilation - 1) // strides + 1 for s in size]
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_value = out[0]
    model.graph.output[0].type.tensor_type.shape.dim[3].dim_value = out[1]
    ctx = rewritten(model, tmp_path, target)
    assert [r.rule for r in ctx.rewrites] == ["conv_padding_only_taps_dropped"]
    (new,) = [n for n in ctx.graph.nodes if n.op == "Conv"]
    assert list(new.attrs["kernel_shape"]) == kept
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((1, 4, *size)).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]


def padded_conv_model(pads, conv_pads=(0, 0, 0, 0), pad_value=0.0, size=9):
    """A constant Pad (pads in ONNX order, input form) before a 3x3 stride-2 Conv, as tf2onnx writes
    a strided convolution's "same" padding."""
    w = RNG.standard_normal((5, 4 + pads[1] + pads[5], 3, 3)).astype(np.float32)
    padded = [size + pads[2] + pads[6] + conv_pads[0] + conv_pads[2], size + pads[3] + pads[7] + conv_pads[1] + conv_pads[3]]
    out = [(s - 3) // 2 + 1 for s in padded]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], name="pad", mode="constant"),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv", kernel_shape=[3, 3], strides=[2, 2],
                              pads=list(conv_pads))]
    inits = [weight("pads", np.array(pads, np.int64)), weight("value", np.array(pad_value, np.float32)),
             weight("w", w)]
    return make_model(nodes, [value_info("x", [1, 4, size, size])], [value_info("y", [1, 5, *out])], inits)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_a_zero_pad_before_a_conv_becomes_the_convs_own_pads(tmp_path, target):
    model = padded_conv_model([0, 0, 0, 1, 0, 0, 1, 0], conv_pads=(1, 0, 0, 1))
    ctx = rewritten(model, tmp_path, target)
    assert [r.rule for r in ctx.rewrites] == ["zero_pad_into_conv"]
    (conv,) = [n for n in ctx.graph.nodes if n.op != "Constant"]
    assert conv.op == "Conv" and list(conv.attrs["pads"]) == [1, 1, 1, 1]
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)})


@pytest.mark.parametrize("pads, value, reason", [
    ([0, 0, 0, 1, 0, 0, 1, 0], 0.5, "not a Pad of constant zeros"),
    ([0, 1, 0, 0, 0, 0, 0, 0], 0.0, "pads the batch or channel axis"),
    ([0, 0, 0, 16, 0, 0, 0, 0], 0.0, "over the target's limit"),
])
def test_a_pad_the_conv_cannot_take_stays_and_says_why(tmp_path, pads, value, reason):
    ctx = rewritten(padded_conv_model(pads, pad_value=value), tmp_path, "rk3588")
    assert "zero_pad_into_conv" not in [r.rule for r in ctx.rewrites]
    reasons = {a.rule: a.outcome for a in ctx.rewrite_attempts["pad"]}
    assert reason in reasons["zero_pad_into_conv"]


def focus_model(offsets, size=(8, 12), channel_end=None):
    """YOLOv5's Focus: for each (row, column) offset, x[:, :channel_end, r::2, q::2] as a Slice of
    the rows, then one of the columns (and channels), and a Concat of them over the channels."""
    nodes, inits, operands = [], [], []
    for index, (row, column) in enumerate(offsets):
        rows, picked = f"rows{index}", f"pick{index}"
        inits += [weight(f"r_start{index}", np.array([row], np.int64)), weight("big", np.array([1 << 30], np.int64)),
                  weight("axis2", np.array([2], np.int64)), weight("two", np.array([2], np.int64)),
                  weight(f"q_starts{index}", np.array([0, column], np.int64)),
                  weight("q_ends", np.array([channel_end or (1 << 30), 1 << 30], np.int64)),
                  weight("axes13", np.array([1, 3], np.int64)), weight("steps13", np.array([1, 2], np.int64))]
        nodes += [helper.make_node("Slice", ["x", f"r_start{index}", "big", "axis2", "two"], [rows], name=rows),
                  helper.make_node("Slice", [rows, f"q_starts{index}", "q_ends", "axes13", "steps13"], [picked],
                                   name=picked)]
        operands.append(picked)
    nodes.append(helper.make_node("Concat", operands, ["y"], name="concat", axis=1))
    channels = channel_end or 3
    out = [1, channels * len(offsets), size[0] // 2, size[1] // 2]
    unique = {init.name: init for init in inits}
    return make_model(nodes, [value_info("x", [1, 3, *size])], [value_info("y", out)], list(unique.values()))


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_yolov5_focus_becomes_one_picking_conv(tmp_path, target):
    model = focus_model([(0, 0), (1, 0), (0, 1), (1, 1)])
    ctx = rewritten(model, tmp_path, target)
    (conv,) = [n for n in ctx.graph.nodes if n.op != "Constant"]
    assert conv.op == "Conv" and list(conv.attrs["strides"]) == [2, 2]
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((1, 3, 8, 12)).astype(np.float32)})


def test_a_channels_last_patch_merge_with_shared_row_slices_is_one_picking_conv(tmp_path):
    """Swin's patch merging as HF exports it: x[:, 0::2] and x[:, 1::2] taken once each, each
    cut into even and odd columns, the four parts joined on the last (channel) axis: one
    picking Conv between a Transpose to channels-first and one back, exactly."""
    inits = [weight(name, np.array([value], np.int64)) for name, value in
             (("zero", 0), ("one", 1), ("big", 1 << 30), ("axis1", 1), ("axis2", 2), ("two", 2))]
    nodes = [helper.make_node("Slice", ["x", "zero", "big", "axis1", "two"], ["even_rows"], name="even_rows"),
             helper.make_node("Slice", ["x", "one", "big", "axis1", "two"], ["odd_rows"], name="odd_rows")]
    parts = []
    for column, start in (("even", "zero"), ("odd", "one")):
        for rows in ("even_rows", "odd_rows"):
            parts.append(f"{rows}_{column}")
            nodes.append(helper.make_node("Slice", [rows, start, "big", "axis2", "two"], [parts[-1]], name=parts[-1]))
    nodes.append(helper.make_node("Concat", parts, ["y"], name="merge", axis=-1))
    model = make_model(nodes, [value_info("x", [1, 8, 8, 4])], [value_info("y", [1, 4, 4, 16])], inits)
    ctx = rewritten(model, tmp_path, "rk3588")
    assert [n.op for n in ctx.graph.nodes if n.op != "Constant"] == ["Transpose", "Conv", "Transpose"]
    assert "stepped_slices_concat_as_conv" in [r.rule for r in ctx.rewrites]
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal((1, 8, 8, 4)).astype(np.float32)})


def test_a_focus_that_cuts_channels_is_left_to_the_slice_rewrites(tmp_path):
    ctx = rewritten(focus_model([(0, 0), (1, 1)], channel_end=2), tmp_path, "rk3588")
    reasons = {a.rule: a.outcome for a in ctx.rewrite_attempts["rows0"]}
    assert "cuts the batch or channels" in reasons["stepped_slices_concat_as_conv"]
    assert "stepped_slices_concat_as_conv" not in [r.rule for r in ctx.rewrites]
