"""An activation after a Conv is one fused NPU step in every form exporters write it: ReLU6 as
Clip or as a Min/Max pair (tf2onnx, paddle2onnx), ReLU as Max(x, 0), HardSwish as the op, as
x * HardSigmoid(x) or as x * relu6(x + 3) / 6, Swish as x * sigmoid(x) in either order, GELU
written out with Erf or as ONNX's Gelu op (ConvExGelu, as rknn-toolkit2 fuses it). Each case asserts the plan's NPU
steps and that the emulator's float16 outputs match onnxruntime's."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import rkcompile
from conftest import make_model, value_info
from test_affine_fold import assert_close, const, conv_3x3, node, planned, scalar

X = [("x", (1, 4, 8, 8))]
Y = (1, 8, 8, 8)


def relu6_min_max(x: str, out: str, max_first: bool) -> list:
    if max_first:
        return [node("Max", [x, "zero"], f"{out}_lo"), node("Min", ["six", f"{out}_lo"], out)]
    return [node("Min", [x, "six"], f"{out}_hi"), node("Max", ["zero", f"{out}_hi"], out)]


BOUNDS = [scalar("zero", 0.0), scalar("six", 6.0), scalar("three", 3.0)]

FORMS = {
    "relu6 as Max then Min": (lambda: relu6_min_max("c", "y", max_first=True), "ConvClip"),
    "relu6 as Min then Max": (lambda: relu6_min_max("c", "y", max_first=False), "ConvClip"),
    "relu as Max with 0": (lambda: [node("Max", ["c", "zero"], "y")], "ConvRelu"),
    "hardswish op": (lambda: [node("HardSwish", ["c"], "y")], "ConvHardSwish"),
    "hardswish as x * HardSigmoid(x)": (
        lambda: [node("HardSigmoid", ["c"], "h", alpha=1 / 6), node("Mul", ["h", "c"], "y")], "ConvHardSwish"),
    "hardswish as x * relu6(x + 3) / 6, relu6 from Min/Max": (
        lambda: [node("Add", ["c", "three"], "a"), *relu6_min_max("a", "r", max_first=True),
                 node("Mul", ["c", "r"], "m"), node("Div", ["m", "six"], "y")], "ConvHardSwish"),
    "swish as x * sigmoid(x)": (lambda: [node("Sigmoid", ["c"], "s"), node("Mul", ["c", "s"], "y")], "ConvExSwish"),
    "swish as sigmoid(x) * x": (lambda: [node("Sigmoid", ["c"], "s"), node("Mul", ["s", "c"], "y")], "ConvExSwish"),
    "gelu with erf": (
        lambda: [node("Div", ["c", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["one", "e"], "a"),
                 node("Mul", ["half", "c"], "h"), node("Mul", ["h", "a"], "y")], "ConvExGelu"),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_activation_form_fuses_with_the_conv_before_it(tmp_path, form):
    build, kernel = FORMS[form]
    conv, inits = conv_3x3()
    inits += BOUNDS + [scalar("sqrt2", np.sqrt(2)), scalar("one", 1.0), scalar("half", 0.5)]
    kernels, got, expected = planned(tmp_path, [conv, *build()], inits, X, Y)
    assert kernels == [kernel]
    assert_close(got, expected)


def test_onnx_gelu_op_fuses_with_the_conv_before_it(tmp_path):
    """ONNX's own Gelu (opset 20, the dynamo exporter's form) runs as exGelu, and fuses with the
    Conv before it as the Erf form does: one ConvExGelu step (rknn-toolkit2 fuses it too)."""
    conv, inits = conv_3x3()
    model = make_model([conv, node("Gelu", ["c"], "y")], [value_info("x", X[0][1])], [value_info("y", Y)], inits,
                       opset=20)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    plan = rkcompile.compile(path, target="rk3588")
    assert [step.kernel for step in plan.record.steps if step.device == "npu"] == ["ConvExGelu"]
    feeds = {"x": np.random.default_rng(0).standard_normal(X[0][1]).astype(np.float32)}
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert_close(rkcompile.run(plan, feeds)["y"], expected)


def test_min_max_with_crossed_bounds_is_not_a_clip(tmp_path):
    """Max(Min(x, 0), 6) is 6 everywhere: not Clip(x, 6, 0)."""
    conv, inits = conv_3x3()
    nodes = [conv, node("Min", ["c", "zero"], "hi"), node("Max", ["hi", "six"], "y")]
    kernels, got, expected = planned(tmp_path, nodes, inits + BOUNDS, X, Y)
    assert "ConvClip" not in kernels and "Clip" not in kernels, kernels
    assert_close(got, expected)


def feed_forward(extra_reader: bool) -> tuple[list, list]:
    """A transformer's x @ W + b then GELU, on [1, L, K]: the rewrite pass runs the product as
    a 1x1 Conv between Reshapes (passes/epilogues.py moves the GELU before the second)."""
    nodes = [node("MatMul", ["x", "w"], "p"), node("Add", ["p", "bias"], "h"),
             node("Div", ["h", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "a"),
             node("Mul", ["h", "a"], "m"), node("Mul", ["m", "half"], "g")]
    nodes.append(node("Add", ["g", "h"], "y") if extra_reader else node("Relu", ["g"], "y"))
    inits = [const("w", (16, 24)), const("bias", (24,)), scalar("sqrt2", np.sqrt(2)), scalar("one", 1.0),
             scalar("half", 0.5)]
    return nodes, inits


def test_gelu_after_a_matmul_by_weights_fuses_as_conv_ex_gelu(tmp_path):
    kernels, got, expected = planned(tmp_path, *feed_forward(extra_reader=False), [("x", (1, 6, 16))], (1, 6, 24))
    assert kernels.count("ConvExGelu") == 1 and "exGelu" not in kernels and "Conv" not in kernels, kernels
    assert_close(got, expected)


def test_gelu_whose_input_is_read_elsewhere_does_not_fuse_with_the_conv(tmp_path):
    kernels, got, expected = planned(tmp_path, *feed_forward(extra_reader=True), [("x", (1, 6, 16))], (1, 6, 24))
    assert "ConvExGelu" not in kernels and "exGelu" in kernels, kernels
    assert_close(got, expected)


def test_a_lone_cpu_op_after_a_matmul_stays_after_its_relabel(tmp_path):
    """Moved before the relabel, the Erf (no NPU kernel, no GELU around it) would split the
    Conv from its Reshape with a CPU step and two conversions."""
    kernels, got, expected = planned(tmp_path, [node("MatMul", ["x", "w"], "p"), node("Erf", ["p"], "y")],
                                     [const("w", (16, 24))], [("x", (1, 6, 16))], (1, 6, 24))
    assert kernels == ["Reshape", "Conv", "Reshape"], kernels
    assert_close(got, expected)
