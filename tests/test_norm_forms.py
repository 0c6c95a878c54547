"""LayerNorm and RMSNorm written out the ways exporters write them are one exNorm step: x - mean
as Sub, as x + Neg(mean) (paddle2onnx) or x + mean * -1 (tf2onnx); the square as Pow 2 or a
product; 1/sqrt as Div by Sqrt, Reciprocal of Sqrt or Pow -0.5 (tf's rsqrt); epsilon on either
side. Each case asserts the plan's NPU steps and that the emulator's float16 outputs match
onnxruntime's."""
from __future__ import annotations

import pytest

from test_affine_fold import assert_close, const, node, planned, scalar

WRITTEN_OUT = ("ReduceMean", "Sub", "Neg", "Pow", "Sqrt", "Reciprocal", "Div")


def centred(form: str) -> list:
    mean = node("ReduceMean", ["x"], "mean", axes=[1])
    if form == "sub":
        return [mean, node("Sub", ["x", "mean"], "d")]
    if form == "neg":
        return [mean, node("Neg", ["mean"], "negated"), node("Add", ["negated", "x"], "d")]
    return [mean, node("Mul", ["minus_one", "mean"], "negated"), node("Add", ["x", "negated"], "d")]


def inverse_root(value: str, form: str) -> list:
    if form == "div":
        return [node("Sqrt", ["ve"], "s"), node("Div", [value, "s"], "n")]
    if form == "reciprocal":
        return [node("Sqrt", ["ve"], "s"), node("Reciprocal", ["s"], "r"), node("Mul", ["r", value], "n")]
    return [node("Pow", ["ve", "minus_half"], "r"), node("Mul", [value, "r"], "n")]


CONSTANTS = [scalar("minus_one", -1.0), scalar("minus_half", -0.5), scalar("two", 2.0), scalar("eps", 1e-5)]
AFFINE = [const("gamma", (16, 1, 1), 0.5, 2), const("beta", (16, 1, 1))]


@pytest.mark.parametrize("centring, square, root", [
    ("sub", "pow", "div"),                 # torch
    ("neg", "mul", "rsqrt"),               # paddle2onnx
    ("mul_minus_one", "mul", "reciprocal"),  # tf2onnx
    ("neg", "pow", "reciprocal"),
])
def test_layer_norm_form_is_one_ex_norm(tmp_path, centring, square, root):
    squared = node("Pow", ["d", "two"], "p") if square == "pow" else node("Mul", ["d", "d"], "p")
    nodes = [*centred(centring), squared, node("ReduceMean", ["p"], "v", axes=[1]), node("Add", ["eps", "v"], "ve"),
             *inverse_root("d", root), node("Mul", ["n", "gamma"], "g"), node("Add", ["beta", "g"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, CONSTANTS + AFFINE, [("x", (1, 16, 4, 4))], (1, 16, 4, 4))
    assert kernels == ["exNorm"], kernels
    assert_close(got, expected)


@pytest.mark.parametrize("root", ["div", "rsqrt"])
def test_rms_norm_form_is_one_ex_norm(tmp_path, root):
    nodes = [node("Mul", ["x", "x"], "p"), node("ReduceMean", ["p"], "v", axes=[1]), node("Add", ["v", "eps"], "ve"),
             *inverse_root("x", root), node("Mul", ["gamma", "n"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, CONSTANTS + AFFINE[:1], [("x", (1, 16, 4, 4))], (1, 16, 4, 4))
    assert kernels == ["exNorm"], kernels
    assert_close(got, expected)


def test_paddle_layer_norm_over_the_last_axis_runs_as_ex_norm(tmp_path):
    """Over the trailing axis of [1, L, C]: moved to the [L, C, 1, 1] view, then fused."""
    nodes = [node("ReduceMean", ["x"], "mean", axes=[-1]), node("Neg", ["mean"], "negated"),
             node("Add", ["x", "negated"], "d"), node("Mul", ["d", "d"], "p"), node("ReduceMean", ["p"], "v", axes=[-1]),
             node("Add", ["v", "eps"], "ve"), *inverse_root("d", "rsqrt"), node("Mul", ["n", "gamma"], "g"),
             node("Add", ["g", "beta"], "y")]
    inits = CONSTANTS + [const("gamma", (16,), 0.5, 2), const("beta", (16,))]
    kernels, got, expected = planned(tmp_path, nodes, inits, [("x", (1, 6, 16))], (1, 6, 16))
    assert "exNorm" in kernels and not set(WRITTEN_OUT) & set(kernels), kernels
    assert_close(got, expected)
