"""Rewrites of ops the targets would otherwise run on the CPU, where rknn-toolkit2 runs them on
the NPU: DepthToSpace/SpaceToDepth (passes/rewrites/layout_ops.py) and pools with auto_pad or
kernels over the window limit (passes/rewrites/pooling.py), each exact: 0 CPU nodes, the
rewritten graph agrees with the original in onnxruntime, and the emulated plan with both."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

import rkcompile

from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from rkcompile.cli import main
from rkcompile.compiler.pipeline import compile_model
from test_rewrites_conv import RNG, assert_rewrite_exact, rewritten


def assert_npu_only_and_exact(model, tmp_path, target, rule):
    ctx = rewritten(model, tmp_path, target)
    assert rule in [r.rule.split(" > ")[0] for r in ctx.rewrites]
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal(shape).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]
    report = tmp_path / "run.json"
    assert main(["run", str(tmp_path / "model.onnx"), "--target", target, "--check", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["passed"] and min(a["cosine"] for a in result["agreement"]) >= 0.9999


BLOCK_CASES = {
    "depth_to_space_dcr": ("DepthToSpace", dict(mode="DCR"), (1, 16, 5, 6), (1, 4, 10, 12)),
    "depth_to_space_crd": ("DepthToSpace", dict(mode="CRD"), (1, 16, 5, 6), (1, 4, 10, 12)),
    "pixel_shuffle_3": ("DepthToSpace", dict(mode="CRD", blocksize=3), (1, 18, 4, 4), (1, 2, 12, 12)),
    "space_to_depth": ("SpaceToDepth", {}, (1, 3, 8, 10), (1, 12, 4, 5)),
}


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_lists_its_channels_in_its_mode(tmp_path, mode):
    """Opset 28's SpaceToDepth mode: CRD lists each channel's b*b block offsets together, DCR
    (the default) the offsets ahead of the channels. Against numpy's reading of the definition."""
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], name="blocks", blocksize=2, mode=mode)
    model = make_model([node], [value_info("x", [2, 3, 4, 6])], [value_info("y", [2, 12, 2, 3])], [], opset=28)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    blocks = x.reshape(2, 3, 2, 2, 3, 2)  # n, c, h/b, bh, w/b, bw
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    expected = blocks.transpose(order).reshape(2, 12, 2, 3)
    got = rkcompile.run(rkcompile.compile(path, target="rk3588"), {"x": x})["y"]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(BLOCK_CASES))
def test_block_rearrangements_become_npu_transposes_computing_the_same(tmp_path, name, target):
    op, attrs, shape, out = BLOCK_CASES[name]
    node = helper.make_node(op, ["x"], ["y"], name="blocks", **{"blocksize": 2, **attrs})
    model = make_model([node], [value_info("x", list(shape))], [value_info("y", list(out))], [])
    assert_npu_only_and_exact(model, tmp_path, target, "block_rearrangement_as_transpose")


def pool_model(op, shape, kernel, out_size, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=list(kernel), **attrs)
    return make_model([node], [value_info("x", list(shape))], [value_info("y", [*shape[:2], *out_size])], [])


AUTO_PAD_CASES = {
    "maxpool_same_upper_stride_2": ("MaxPool", (1, 4, 9, 10), (3, 3), (5, 5), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "maxpool_same_lower_even_kernel": ("MaxPool", (1, 3, 8, 7), (2, 4), (8, 7), dict(auto_pad="SAME_LOWER")),
    "average_same_upper_excluding_pads": ("AveragePool", (1, 3, 9, 9), (3, 3), (5, 5),
                                          dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "average_same_lower_including_pads": ("AveragePool", (1, 3, 8, 8), (4, 4), (8, 8),
                                          dict(auto_pad="SAME_LOWER", count_include_pad=1)),
    "average_valid": ("AveragePool", (1, 2, 9, 9), (3, 3), (4, 4), dict(auto_pad="VALID", strides=[2, 2])),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(AUTO_PAD_CASES))
def test_auto_pad_pools_become_explicitly_padded_pools_computing_the_same(tmp_path, name, target):
    op, shape, kernel, out_size, attrs = AUTO_PAD_CASES[name]
    assert_npu_only_and_exact(pool_model(op, shape, kernel, out_size, **attrs), tmp_path, target,
                              "pool_auto_pad_to_pads")


CASCADE_CASES = {
    "spp_9": ((1, 4, 20, 20), (9, 9), (20, 20), dict(pads=[4, 4, 4, 4])),
    "spp_13": ((1, 4, 20, 20), (13, 13), (20, 20), dict(pads=[6, 6, 6, 6])),
    "rectangular_unpadded": ((1, 2, 30, 12), (17, 3), (14, 10), {}),
    "asymmetric_pads_stride_2": ((1, 3, 21, 21), (11, 11), (8, 7), dict(pads=[0, 2, 5, 1], strides=[2, 2])),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(CASCADE_CASES))
def test_maxpool_kernels_over_the_limit_become_cascades_computing_the_same(tmp_path, name, target):
    shape, kernel, out_size, attrs = CASCADE_CASES[name]
    assert_npu_only_and_exact(pool_model("MaxPool", shape, kernel, out_size, **attrs), tmp_path, target,
                              "maxpool_kernel_to_cascade")


PADDED_CONV_CASES = {
    "dilated_1d_pads_24": ((1, 4, 60), [3], dict(dilations=[24], pads=[24, 24])),
    "dilated_1d_causal_pads_20": ((1, 4, 50), [2], dict(dilations=[20], pads=[20, 0])),
    "2d_pads_over_the_limit": ((1, 3, 10, 12), [3, 3], dict(pads=[18, 1, 16, 17])),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(PADDED_CONV_CASES))
def test_conv_pads_over_the_limit_become_a_pad_computing_the_same(tmp_path, name, target):
    shape, kernel, attrs = PADDED_CONV_CASES[name]
    w = RNG.standard_normal((5, shape[1], *kernel)).astype(np.float32)
    pads, dilations = attrs["pads"], attrs.get("dilations", [1] * len(kernel))
    out = [(s + b + e - (k - 1) * d - 1) + 1 for s, b, e, k, d in
           zip(shape[2:], pads[:len(kernel)], pads[len(kernel):], kernel, dilations)]
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=kernel, **attrs)
    model = make_model([node], [value_info("x", list(shape))], [value_info("y", [1, 5, *out])], [weight("w", w)])
    assert_npu_only_and_exact(model, tmp_path, target, "conv_pads_to_pad")
