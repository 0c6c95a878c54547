"""Resize rewrites (passes/rewrites/resize_as_matmul.py): a Resize the NPU's kernel does not take becomes
two MatMuls by constant interpolation matrices that compute what onnxruntime computes, for
modes, coordinate conventions, scales and sizes other than the wide zoo's, at every primary
target; a Resize the kernel takes is left to it."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from rkcompile.cli import main
from rkcompile.compiler.pipeline import compile_model
from test_rewrites_conv import assert_rewrite_exact, rewritten

RNG = np.random.default_rng(5)


def resize_model(shape, out_hw, *, scales=None, opset=17, **attrs):
    """A Resize of the last two axes stated by `scales` (floats for the last two axes) or, when
    None, by sizes giving `out_hw`."""
    rank = len(shape)
    if scales is not None:
        full = np.array([1.0] * (rank - 2) + list(scales), dtype=np.float32)
        inputs, inits = ["x", "", "scales"], [weight("scales", full)]
    else:
        full = np.array(list(shape[:-2]) + list(out_hw), dtype=np.int64)
        inputs, inits = ["x", "", "", "sizes"], [weight("sizes", full)]
    node = helper.make_node("Resize", inputs, ["y"], name="resize", **attrs)
    return make_model([node], [value_info("x", list(shape))], [value_info("y", list(shape[:-2]) + list(out_hw))],
                      inits, opset=opset)


CASES = {
    # bilinear 7 -> 77 (11x: no multiple of 2 to 8, outside the kernel), sizes, half_pixel
    "bilinear_11x_sizes": dict(shape=(1, 5, 7, 7), out_hw=(77, 77), mode="linear"),
    "bilinear_non_integer_scales": dict(shape=(1, 3, 6, 10), out_hw=(15, 25), scales=(2.5, 2.5), mode="linear",
                                        coordinate_transformation_mode="pytorch_half_pixel"),
    "bilinear_align_corners_rectangular": dict(shape=(2, 3, 5, 9), out_hw=(13, 11), mode="linear",
                                               coordinate_transformation_mode="align_corners"),
    "linear_downscale": dict(shape=(1, 4, 16, 12), out_hw=(5, 7), mode="linear"),
    "nearest_13x_asymmetric": dict(shape=(1, 2, 3, 4), out_hw=(39, 52), scales=(13.0, 13.0), mode="nearest",
                                   coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "cubic_3x": dict(shape=(1, 2, 6, 6), out_hw=(18, 18), scales=(3.0, 3.0), mode="cubic"),
    "width_only_rank3": dict(shape=(4, 6, 10), out_hw=(6, 35), mode="linear"),
}


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_resize_outside_the_kernel_becomes_matmuls_computing_the_same(tmp_path, name, target):
    case = dict(CASES[name])
    shape = case.pop("shape")
    model = resize_model(shape, **case)
    ctx = rewritten(model, tmp_path, target)
    assert [r.rule for r in ctx.rewrites][:1] == ["resize_as_matrix_products"]
    assert "Resize" not in {n.op for n in ctx.graph.nodes}
    assert_rewrite_exact(model, ctx, {"x": RNG.standard_normal(shape).astype(np.float32)})
    plan, _ = compile_model(tmp_path / "model.onnx", target)
    assert not [n.op for n in plan.nodes if n.device == "cpu"]


def test_the_emulated_plan_matches_onnxruntime(tmp_path):
    """float16 on the NPU: the fcn head's 32x bilinear upsampling through the plan's own steps."""
    model = resize_model((1, 5, 7, 7), (224, 224), mode="linear")
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    report = tmp_path / "run.json"
    assert main(["run", str(path), "--target", "rk3588", "--check", "--json", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["passed"] and min(a["cosine"] for a in result["agreement"]) >= 0.9999


def test_a_resize_the_kernel_takes_is_left_to_it(tmp_path):
    model = resize_model((1, 3, 8, 8), (16, 16), scales=(2.0, 2.0), mode="linear")
    ctx = rewritten(model, tmp_path, "rk3588")
    assert not ctx.rewrites and [n.op for n in ctx.graph.nodes] == ["Resize"]


def test_a_resize_of_the_channels_is_not_rewritten_and_says_why(tmp_path):
    sizes = weight("sizes", np.array([1, 6, 16, 16], dtype=np.int64))
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="nearest")
    model = make_model([node], [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 6, 16, 16])], [sizes])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert not ctx.rewrites
    (attempt,) = [a for a in ctx.rewrite_attempts["resize"] if a.rule == "resize_as_matrix_products"]
    assert "not only the last two" in attempt.outcome


def test_integer_data_is_not_rewritten(tmp_path):
    sizes = weight("sizes", np.array([1, 1, 24, 24], dtype=np.int64))
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="nearest")
    model = make_model([node], [value_info("x", [1, 1, 2, 2], TensorProto.INT32)],
                       [value_info("y", [1, 1, 24, 24], TensorProto.INT32)], [sizes])
    ctx = rewritten(model, tmp_path, "rk3588")
    assert not ctx.rewrites
