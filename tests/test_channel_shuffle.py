"""Channel shuffles as channel-picking 1x1 Convs (passes/rewrites/channels.py), in the form
paddle2onnx and torch write ShuffleNet's: Reshape [N, g, C/g, H, W] -> Transpose [0, 2, 1, 3,
4] -> Reshape [N, C, H, W], then a Split of the channels whose parts a Concat and a 1x1 Conv
read; and a map's blocks stacked on its channels (MobileViT's unfold, SpaceToDepth) as a
strided Conv that picks. Each case asserts the plan's NPU steps and that the emulator's float16
outputs match onnxruntime's."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import helper

import rkcompile
from conftest import make_model, value_info, weight
from test_rewrites_conv import rewritten

RNG = np.random.default_rng(11)
LAYOUT_KERNELS = {"Reshape", "Transpose", "Split", "Flatten", "Squeeze", "Unsqueeze"}


def node(op, inputs, outputs, **attrs):
    outputs = [outputs] if isinstance(outputs, str) else outputs
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def shape_const(name, values):
    return weight(name, np.array(values, dtype=np.int64))


def shuffle(x, out, channels, size, groups=2):
    """ShuffleNet's channel shuffle of `x` [1, channels, size, size]."""
    return ([node("Reshape", [x, f"{out}/split_shape"], f"{out}/r"),
             node("Transpose", [f"{out}/r"], f"{out}/t", perm=[0, 2, 1, 3, 4]),
             node("Reshape", [f"{out}/t", f"{out}/merge_shape"], out)],
            [shape_const(f"{out}/split_shape", [1, groups, channels // groups, size, size]),
             shape_const(f"{out}/merge_shape", [1, channels, size, size])])


def planned(tmp_path, nodes, inits, x_shape, y_shape):
    model = make_model(nodes, [value_info("x", x_shape)], [value_info("y", y_shape)], inits)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = rkcompile.run(plan, feeds)["y"]
    kernels = [step.kernel for step in plan.record.steps if step.device == "npu"]
    np.testing.assert_allclose(got, expected, rtol=0, atol=4e-3 * float(np.abs(expected).max()))
    return kernels


def conv_1x1(x, out, channels, inputs):
    return (node("Conv", [x, f"{out}/w", f"{out}/b"], out),
            [weight(f"{out}/w", RNG.uniform(-1, 1, (channels, inputs, 1, 1)).astype(np.float32)),
             weight(f"{out}/b", RNG.uniform(-1, 1, channels).astype(np.float32))])


def test_shuffle_then_split_becomes_a_pick_and_a_pick_folded_into_the_next_conv(tmp_path):
    first, first_w = conv_1x1("x", "a", 8, 4)
    second, second_w = conv_1x1("x", "b", 8, 4)
    moves, shapes = shuffle("ab", "s", 16, 6)
    branch, branch_w = conv_1x1("right", "branch", 8, 8)
    nodes = [first, second, node("Concat", ["a", "b"], "ab", axis=1), *moves,
             node("Split", ["s", "halves"], ["left", "right"], axis=1), branch,
             node("Relu", ["branch"], "relu"), node("Concat", ["left", "relu"], "y", axis=1)]
    inits = first_w + second_w + shapes + branch_w + [shape_const("halves", [8, 8])]
    kernels = planned(tmp_path, nodes, inits, (1, 4, 6, 6), (1, 16, 6, 6))
    assert not LAYOUT_KERNELS & set(kernels), kernels
    # the two Convs, their Concat, the pick of the left half, the branch Conv (reading the
    # Concat with its weights moved) with its Relu, the last Concat
    assert sorted(kernels) == ["Concat", "Concat", "Conv", "Conv", "Conv", "ConvRelu"]


def test_shuffle_read_by_a_depthwise_conv_is_one_pick(tmp_path):
    conv, conv_w = conv_1x1("x", "c", 12, 4)
    moves, shapes = shuffle("c", "s", 12, 5, groups=3)
    depthwise = node("Conv", ["s", "dw"], "y", group=12, pads=[1] * 4)
    inits = conv_w + shapes + [weight("dw", RNG.uniform(-1, 1, (12, 1, 3, 3)).astype(np.float32))]
    kernels = planned(tmp_path, [conv, *moves, depthwise], inits, (1, 4, 5, 5), (1, 12, 5, 5))
    assert kernels == ["Conv", "Conv", "Conv"]


def test_a_transpose_that_moves_pixels_is_no_pick(tmp_path):
    conv, conv_w = conv_1x1("x", "c", 4, 4)
    # [1, 4, 6, 6] -> [1, 4, 2, 3, 6] -> rows interleaved: pixels move, not whole channels
    moves = [node("Reshape", ["c", "rows"], "r"), node("Transpose", ["r"], "t", perm=[0, 1, 3, 2, 4]),
             node("Reshape", ["t", "back"], "y")]
    inits = conv_w + [shape_const("rows", [1, 4, 2, 3, 6]), shape_const("back", [1, 4, 6, 6])]
    kernels = planned(tmp_path, [conv, *moves], inits, (1, 4, 6, 6), (1, 4, 6, 6))
    assert "Conv" in kernels and LAYOUT_KERNELS & set(kernels), kernels


def test_a_split_conv_is_a_conv_per_part_and_the_residual_add_fuses(tmp_path):
    """rexnet's partial residual: a 1x1 Conv's first channels plus the block input, the rest
    concatenated: a Conv per part, the first a ConvAdd, as rknn-toolkit2 builds it (no Split
    step). (The Conv reads the block's inner tensor: a Conv of the block input itself would take
    the residual into its weights.)"""
    inner, inner_w = conv_1x1("x", "inner", 8, 8)
    conv, conv_w = conv_1x1("inner", "c", 12, 8)
    nodes = [inner, conv, node("Split", ["c", "sizes"], ["head", "tail"], axis=1), node("Add", ["head", "x"], "sum"),
             node("Concat", ["sum", "tail"], "y", axis=1)]
    kernels = planned(tmp_path, nodes, inner_w + conv_w + [shape_const("sizes", [8, 4])], (1, 8, 5, 5), (1, 12, 5, 5))
    assert sorted(kernels) == ["Concat", "Conv", "Conv", "ConvAdd"]


@pytest.mark.parametrize("sizes, reason", [
    ([4, 4, 4], "3 parts would be as many Conv steps"),
    ([8, 4], "no part is read by one node alone, other than a Concat")])
def test_a_split_conv_that_would_not_lose_a_step_stays_one_conv_and_says_why(tmp_path, sizes, reason):
    conv, conv_w = conv_1x1("x", "c", 12, 8)
    parts = [f"p{i}" for i in range(len(sizes))]
    nodes = [conv, node("Split", ["c", "sizes"], parts, axis=1), node("Concat", parts[::-1], "y", axis=1)]
    model = make_model(nodes, [value_info("x", (1, 8, 5, 5))], [value_info("y", (1, 12, 5, 5))],
                       conv_w + [shape_const("sizes", sizes)])
    attempts = rewritten(model, tmp_path, "rk3588").rewrite_attempts["p0"]
    outcomes = {attempt.rule: attempt.outcome for attempt in attempts}
    assert reason in outcomes["split_of_conv"]


def unfold(x, out, channels, size, block=2):
    """MobileViTv2's unfold of `x` [1, channels, size, size] into [1, channels, block*block,
    patches]: Reshape to 6-D, Transpose the block offsets ahead of the block positions, Reshape."""
    cells = size // block
    return ([node("Reshape", [x, f"{out}/blocks"], f"{out}/r"),
             node("Transpose", [f"{out}/r"], f"{out}/t", perm=[0, 1, 3, 5, 2, 4]),
             node("Reshape", [f"{out}/t", f"{out}/patches"], out)],
            [shape_const(f"{out}/blocks", [1, channels, cells, block, cells, block]),
             shape_const(f"{out}/patches", [1, channels, block * block, cells * cells])])


def test_an_unfold_of_patches_is_a_strided_conv_of_one_group_per_channel(tmp_path):
    conv, conv_w = conv_1x1("x", "c", 8, 4)
    moves, shapes = unfold("c", "u", 8, 8)
    nodes = [conv, *moves, node("Relu", ["u"], "y")]
    kernels = planned(tmp_path, nodes, conv_w + shapes, (1, 4, 8, 8), (1, 8, 4, 16))
    # the 1x1 Conv, the pick (its Relu fused), one relabel to [1, 8, 4, 16]; the chain's 6-D
    # Transpose cut to 4-D was five layout steps
    assert kernels == ["Conv", "ConvRelu", "Reshape"], kernels
    model = make_model(nodes, [value_info("x", (1, 4, 8, 8))], [value_info("y", (1, 8, 4, 16))], conv_w + shapes)
    ctx = rewritten(model, tmp_path, "rk3588")
    (pick,) = [n for n in ctx.graph.nodes if n.op == "Conv" and n.attrs.get("strides") == [2, 2]]
    assert pick.attrs["group"] == 8 and list(pick.inputs[1].values.shape) == [32, 1, 2, 2]


def test_space_to_depth_of_an_image_is_one_strided_conv(tmp_path):
    """SpaceToDepth (DCR: the block offsets ahead of the channels) on a 3-channel image: a pick
    of one group, 12 multiply-adds per output, where its Transposes were five layout steps."""
    kernels = planned(tmp_path, [node("SpaceToDepth", ["x"], "y", blocksize=2)], [], (1, 3, 8, 8), (1, 12, 4, 4))
    assert kernels == ["Conv"], kernels


def test_an_unfold_of_many_channels_in_large_blocks_is_one_grouped_pick(tmp_path):
    """7 x 7 blocks of 1024 channels: 50,176 output channels, whose one-group weight (each output
    reading every input channel) would hold 2.5e9 values; the pick is grouped and holds 2.5e6."""
    moves, shapes = unfold("x", "y", 1024, 14, block=7)
    model = make_model(moves, [value_info("x", (1, 1024, 14, 14))], [value_info("y", (1, 1024, 49, 4))], shapes)
    ctx = rewritten(model, tmp_path, "rk3588")
    (pick,) = [n for n in ctx.graph.nodes if n.op == "Conv"]
    assert pick.attrs["group"] == 1024 and list(pick.inputs[1].values.shape) == [50176, 1, 7, 7]
