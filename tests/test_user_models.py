"""The three user models of issue 38, built with onnx.helper at small sizes: each plans in
float16 and in int8 (judged on --val data), prints its per-step performance, and runs on the
emulator within --check's tolerance of onnxruntime, all through the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import make_model, value_info, weight
from rkcompile.cli import main

RNG = np.random.default_rng(38)


def _w(name: str, *shape: int, scale: float = 0.3) -> "onnx.TensorProto":
    return weight(name, (RNG.standard_normal(shape) * scale).astype(np.float32))


def _layer_norm(x: str, out: str, width: int, name: str) -> tuple[list, list]:
    ones, zeros = np.ones(width, np.float32), np.zeros(width, np.float32)
    return ([helper.make_node("LayerNormalization", [x, f"{name}_g", f"{name}_b"], [out], axis=-1, name=name)],
            [weight(f"{name}_g", ones), weight(f"{name}_b", zeros)])


def vit_classifier():
    """Dynamic batch N: Conv stem (4x4 patches) -> 64 tokens of 16 -> LayerNorm -> one-head
    attention -> residual -> LayerNorm -> MLP (GELU as Erf) -> residual -> mean over tokens -> Gemm."""
    d = 16
    nodes = [helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["stem"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Reshape", ["stem", "tokens_shape"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1])]
    inits = [_w("stem_w", d, 3, 4, 4), _w("stem_b", d), weight("tokens_shape", np.array([0, d, -1], np.int64))]
    more, consts = _layer_norm("tokens", "ln1", d, "ln1")
    nodes += more
    inits += consts
    for name in ("q", "k", "v", "o"):
        inits.append(_w(f"w{name}", d, d))
    nodes += [helper.make_node("MatMul", ["ln1", "wq"], ["q"]), helper.make_node("MatMul", ["ln1", "wk"], ["k"]),
              helper.make_node("MatMul", ["ln1", "wv"], ["v"]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Softmax", ["scaled"], ["attn"], axis=-1),
              helper.make_node("MatMul", ["attn", "v"], ["mixed"]),
              helper.make_node("MatMul", ["mixed", "wo"], ["attended"]),
              helper.make_node("Add", ["tokens", "attended"], ["res1"])]
    inits.append(weight("scale", np.array(d ** -0.5, np.float32)))
    more, consts = _layer_norm("res1", "ln2", d, "ln2")
    nodes += more
    inits += consts
    nodes += [helper.make_node("MatMul", ["ln2", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
              helper.make_node("Div", ["hb", "sqrt2"], ["hs"]), helper.make_node("Erf", ["hs"], ["he"]),
              helper.make_node("Add", ["he", "one"], ["h1"]), helper.make_node("Mul", ["hb", "h1"], ["hm"]),
              helper.make_node("Mul", ["hm", "half"], ["gelu"]),
              helper.make_node("MatMul", ["gelu", "w2"], ["mlp"]), helper.make_node("Add", ["res1", "mlp"], ["res2"]),
              helper.make_node("ReduceMean", ["res2"], ["pooled"], axes=[1], keepdims=0),
              helper.make_node("Gemm", ["pooled", "head_w", "head_b"], ["logits"], transB=1)]
    inits += [_w("w1", d, 2 * d), _w("b1", 2 * d), _w("w2", 2 * d, d), _w("head_w", 10, d), _w("head_b", 10),
              weight("sqrt2", np.array(np.sqrt(2), np.float32)), weight("one", np.array(1, np.float32)),
              weight("half", np.array(0.5, np.float32))]
    return make_model(nodes, [value_info("x", ["N", 3, 32, 32])], [value_info("logits", ["N", 10])], inits)


def small_unet():
    """Conv -> GroupNorm (a group per channel, InstanceNorm-style) -> ReLU, down by a stride-2
    Conv, up by a ConvTranspose, the skip concatenated, then a Conv to 12 channels and a 2x
    PixelShuffle (DepthToSpace CRD) to a 3-channel image twice the size."""
    def norm(x: str, out: str, channels: int) -> list:
        inits.extend([weight(f"{out}_g", np.ones(channels, np.float32)), weight(f"{out}_b", np.zeros(channels, np.float32))])
        return [helper.make_node("GroupNormalization", [x, f"{out}_g", f"{out}_b"], [f"{out}_n"], num_groups=channels),
                helper.make_node("Relu", [f"{out}_n"], [out])]

    inits = [_w("c1_w", 8, 3, 3, 3), _w("c1_b", 8), _w("down_w", 16, 8, 3, 3), _w("down_b", 16),
             _w("up_w", 16, 8, 2, 2), _w("up_b", 8), _w("out_w", 12, 16, 3, 3), _w("out_b", 12)]
    nodes = [helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             *norm("c1", "e1", 8),
             helper.make_node("Conv", ["e1", "down_w", "down_b"], ["down"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             *norm("down", "e2", 16),
             helper.make_node("ConvTranspose", ["e2", "up_w", "up_b"], ["up"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["up", "e1"], ["skip"], axis=1),
             helper.make_node("Conv", ["skip", "out_w", "out_b"], ["pre"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["pre"], ["y"], blocksize=2, mode="CRD")]
    # opset 21: GroupNormalization's scale and bias per channel (18's per group is deprecated)
    return make_model(nodes, [value_info("x", [1, 3, 32, 32])], [value_info("y", [1, 3, 64, 64])], inits, opset=21)


def gru_text():
    """Token ids -> Gather embedding -> bidirectional GRU (PyTorch's linear_before_reset) ->
    both final states -> Gemm to 5 classes."""
    vocab, emb, hidden, seq = 50, 16, 12, 10
    nodes = [helper.make_node("Gather", ["embedding", "ids"], ["embedded"]),
             helper.make_node("Transpose", ["embedded"], ["time_major"], perm=[1, 0, 2]),
             helper.make_node("GRU", ["time_major", "W", "R", "B"], ["", "Y_h"], hidden_size=hidden,
                              direction="bidirectional", linear_before_reset=1),
             helper.make_node("Transpose", ["Y_h"], ["states"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["states", "flat_shape"], ["flat"]),
             helper.make_node("Gemm", ["flat", "head_w", "head_b"], ["logits"], transB=1)]
    inits = [_w("embedding", vocab, emb, scale=1.0), _w("W", 2, 3 * hidden, emb), _w("R", 2, 3 * hidden, hidden),
             _w("B", 2, 6 * hidden, scale=0.1), weight("flat_shape", np.array([1, -1], np.int64)),
             _w("head_w", 5, 2 * hidden), _w("head_b", 5)]
    return make_model(nodes, [value_info("ids", [1, seq], TensorProto.INT64)], [value_info("logits", [1, 5])], inits)


def _samples(name: str, shape: tuple[int, ...], count: int, seed: int) -> dict[str, np.ndarray]:
    random = np.random.default_rng(seed)
    if name == "ids":
        return {"ids": random.integers(0, 50, (count, *shape), dtype=np.int64)}
    return {name: random.random((count, *shape), np.float32)}


#: ops whose work a plan of these models must leave to the NPU
COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: each model, its input and the shape it is planned with (the classifier's batch dim N as 2 images)
MODELS = {"vit_classifier": (vit_classifier, "x", (2, 3, 32, 32)), "small_unet": (small_unet, "x", (1, 3, 32, 32)),
          "gru_text": (gru_text, "ids", (1, 10))}


@pytest.mark.parametrize("name", MODELS)
def test_a_user_model_plans_runs_and_checks(name, save, tmp_path, capsys):
    build, input_name, shape = MODELS[name]
    model = str(save(build(), f"{name}.onnx"))
    calib, val, one = tmp_path / "calib.npz", tmp_path / "val.npz", tmp_path / "one.npz"
    np.savez(calib, **_samples(input_name, shape, 8, 0))
    np.savez(val, **_samples(input_name, shape, 3, 1))
    np.savez(one, **{key: stack[0] for key, stack in _samples(input_name, shape, 1, 2).items()})
    target = ["--target", "rk3588", "--input-shape", f"{input_name}:{','.join(map(str, shape))}"]
    int8 = ["--dtype", "int8", "--calib", str(calib), "--val", str(val)]
    plan = tmp_path / "plan.json"
    assert main(["plan", model, *target, "--quiet", "--json", str(plan)]) == 0
    nodes = json.loads(plan.read_text(encoding="utf-8"))["nodes"]
    # the compute: none left on the CPU (the UNet's once were, after its first GroupNormalization
    # left every later tensor without a shape)
    assert [n["name"] for n in nodes if n["op"] in COMPUTE and n["device"] == "cpu"] == []
    assert main(["plan", model, *target, *int8]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "validation cosine" in line]
    assert "worst over 3 samples" in line
    assert main(["perf", model, *target]) == 0
    assert "est" in capsys.readouterr().out.lower()
    assert main(["run", model, *target, "--inputs", str(one), "--check"]) == 0, capsys.readouterr()
    assert main(["run", model, *target, *int8, "--inputs", str(one), "--check"]) == 0, capsys.readouterr()
