"""The NPU's float16 arithmetic as the emulator models it (docs/emulator.md, "Accumulation and
rounding"): a bias is added to the accumulator unrounded, and the accumulator's result is
rounded to float16 before the rest of a fused kernel computes with it. rknn-toolkit2's
simulator agrees with both; these tests pin the emulator to them on small graphs, against a
float64 computation of each rule and of the rule's alternative."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, value_info, weight
from onnx import helper

import rkcompile
from rkcompile.emulator.executor import leaving_accumulator
from rkcompile.plan.plain_nodes import Constant, Graph, Node, Variable

rng = np.random.default_rng(0)


def rounded(value):
    return np.asarray(value, np.float64).astype(np.float16).astype(np.float64)


def conv3x3(x, w):
    """A 3x3, pad 1, stride 1 Conv in float64."""
    size = x.shape[-1]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sum(np.einsum("nchw,mc->nmhw", padded[:, :, i:i + size, j:j + size], w[:, :, i, j])
               for i in range(3) for j in range(3))


def conv_then(tail, extra_inputs=()):
    """Conv(x, w, b) -> `tail` nodes -> y: the model, w and b (float64)."""
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(16) * 3).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *tail],
                       [value_info("x", [1, 8, 8, 8]), *extra_inputs], [value_info("y", [1, 16, 8, 8])],
                       [weight("w", w), weight("b", b)])
    return model, w.astype(np.float64), b.astype(np.float64)


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid"])
def test_a_convs_float32_bias_and_rounded_result_feed_its_fused_activation(save, activation):
    model, w, b = conv_then([helper.make_node(activation, ["c"], ["y"])])
    plan = rkcompile.compile(save(model), "rk3588")
    assert (plan.record.tensors["b"].dtype, plan.record.tensors["w"].dtype) == ("float32", "float16")
    assert [s.kernel for s in plan.record.steps if s.device == "npu"] == [f"Conv{activation}"]
    x = rounded(rng.random((1, 8, 8, 8)) * 2 - 1)
    y = rkcompile.run(plan, {"x": x.astype(np.float32)})["y"].astype(np.float64)
    act = (lambda v: np.maximum(v, 0)) if activation == "Relu" else sigmoid
    sums = conv3x3(x, rounded(w))
    as_modelled = rounded(act(rounded(sums + b[None, :, None, None])))
    float16_bias = rounded(act(rounded(sums + rounded(b)[None, :, None, None])))
    assert np.mean(y == as_modelled) > 0.99 > 0.95 > np.mean(y == float16_bias)
    if activation == "Sigmoid":  # the unrounded accumulator is another answer; Relu's is the same
        assert np.mean(y == rounded(act(sums + b[None, :, None, None]))) < 0.95
    assert rkcompile.compile(save(model), "rk3588", dtype="int8").record.tensors["b"].dtype == "int32"


def test_conv_add_adds_the_other_tensor_to_the_rounded_conv_result(save):
    model, w, b = conv_then([helper.make_node("Add", ["c", "r"], ["y"])], [value_info("r", [1, 16, 8, 8])])
    plan = rkcompile.compile(save(model), "rk3588")
    assert [s.kernel for s in plan.record.steps if s.device == "npu"] == ["ConvAdd"]
    x, r = rounded(rng.random((1, 8, 8, 8)) * 2 - 1), rounded(rng.random((1, 16, 8, 8)) * 4 - 2)
    y = rkcompile.run(plan, {"x": x.astype(np.float32), "r": r.astype(np.float32)})["y"].astype(np.float64)
    accumulator = conv3x3(x, rounded(w)) + b[None, :, None, None]
    assert np.mean(y == rounded(rounded(accumulator) + r)) > 0.99 > 0.95 > np.mean(y == rounded(accumulator + r))


def test_a_matmuls_constant_add_along_its_last_axis_is_a_float32_bias(save):
    w = (rng.standard_normal((32, 24)) * 0.2).astype(np.float32)
    c = (rng.standard_normal(24) * 3).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "c"], ["y"])],
                       [value_info("x", [1, 16, 32])], [value_info("y", [1, 16, 24])], [weight("w", w), weight("c", c)])
    plan = rkcompile.compile(save(model), "rk3588")
    # a Conv's bias once the MatMul runs as a 1x1 Conv, or exMatMul's c: stored float32 either way
    assert [t.dtype for t in plan.record.tensors.values() if t.region == "weight" and tuple(t.shape) == (24,)] \
        == ["float32"]
    x = rounded(rng.random((1, 16, 32)) * 2 - 1)
    y = rkcompile.run(plan, {"x": x.astype(np.float32)})["y"].astype(np.float64)
    sums = x @ rounded(w)
    assert np.mean(y == rounded(sums + c)) > 0.99 > 0.95 > np.mean(y == rounded(sums + rounded(c)))


def _body(*members):
    def tensors(names):
        return [Constant(n, np.zeros(4, np.float32)) if n.startswith("k") else Variable(n) for n in names]
    nodes = [Node(op, op, {}, tensors(inputs), tensors(outputs)) for op, inputs, outputs in members]
    return Graph(nodes, [Variable("x")], nodes[-1].outputs)


def test_only_what_follows_the_accumulator_and_can_tell_rounds_it():
    matmul_bias_sigmoid = _body(("MatMul", ["x", "kw"], ["t"]), ("Add", ["t", "kc"], ["u"]), ("Sigmoid", ["u"], ["y"]))
    assert leaving_accumulator("exMatMulSigmoid", matmul_bias_sigmoid, "float16") == {"u"}  # after the bias
    assert leaving_accumulator("exMatMulSigmoid", matmul_bias_sigmoid, "float32") == frozenset()
    assert leaving_accumulator("ConvRelu", _body(("Conv", ["x", "kw", "kb"], ["t"]), ("Relu", ["t"], ["y"])),
                               "float16") == frozenset()
    conv_add = _body(("Conv", ["x", "kw"], ["t"]), ("Add", ["t", "r"], ["y"]))
    assert leaving_accumulator("ConvAdd", conv_add, "float16") == {"t"}
    # an RMSNorm written with a 1x1 Conv of its mean square: exNorm's statistics stay float32
    rms = _body(("Mul", ["x", "x"], ["sq"]), ("Conv", ["sq", "kw", "kb"], ["ms"]), ("Pow", ["ms", "kp"], ["r"]),
                ("Mul", ["x", "r"], ["y"]))
    assert leaving_accumulator("exNorm", rms, "float16") == frozenset()


def test_an_attention_keeps_its_scores_unrounded_inside_its_kernel(save):
    """exSDPAttention's scores stay float32 inside the kernel, as rknn-toolkit2 2.5.0's simulator
    computes them (bit for bit on [1, 2, 16, 8]; executor.FLOAT32_WITHIN): scores q @ k^T beyond
    float16's range, in range once scaled, give the float32 model's output, where rounding them
    as they leave the accumulator would make infinities of them."""
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) * scale for scale in (90, 90, 1))
    assert np.abs(q @ k.transpose(0, 1, 3, 2)).max() > 65504
    model = make_model([helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                        helper.make_node("MatMul", ["q", "kt"], ["s"]),
                        helper.make_node("Mul", ["s", "scale"], ["scaled"]),
                        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
                        helper.make_node("MatMul", ["p", "v"], ["y"])],
                       [value_info(name, [1, 2, 16, 8]) for name in "qkv"], [value_info("y", [1, 2, 16, 8])],
                       [weight("scale", np.array(0.125, np.float32))])
    plan = rkcompile.compile(save(model), "rk3588")
    assert [step.kernel for step in plan.record.steps if step.device == "npu"] == ["exSDPAttention"]
    scores = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) * 0.125
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v.astype(np.float64)
    got = np.asarray(rkcompile.run(plan, {"q": q, "k": k, "v": v})["y"], np.float64)
    assert np.all(np.isfinite(got))
    assert np.abs(got - expected).max() < 0.01
