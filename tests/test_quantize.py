"""int8 quantization: parameters, observers, calibration data, the quantize pass, dtype-aware
legalization on both sides, the CLI, accuracy analysis, and (slow) the zoo CNNs at int8."""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import rkcompile
from rkcompile.cli import main
from rkcompile.options import PREFERRED_INT8, Options
from rkcompile.api import prepare
from rkcompile.emulator import agreement, emulate, onnxruntime_outputs
from rkcompile.emulator.accuracy import analyse
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.errors import CompileError
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.compiler.pipeline import compile_model, finish_plan, front_half
from rkcompile.plan.schema import PlanRecord, TensorSpec, contract_violations
from rkcompile.quantization.params import (KeptDraws, RangeObserver, activation_params, dequantize, kl_threshold,
    load_calibration, mmse_range, quantize, random_calibration, seeded_variations, weight_params)

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
rng = np.random.default_rng(3)


def vi(name, shape):
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def save_model(path: Path, nodes, inputs, outputs, weights) -> Path:
    graph = helper.make_graph(nodes, "m", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def cnn(tmp_path) -> Path:
    """Conv+bias, Relu, MaxPool, nearest Resize by constant scales, Conv: 13 channels, not a
    multiple of either C2."""
    weights = {"w1": (rng.standard_normal((13, 3, 3, 3)) * rng.uniform(0.05, 1, (13, 1, 1, 1))).astype(np.float32),
               "b1": rng.standard_normal(13).astype(np.float32) * 0.1,
               "scales": np.array([1, 1, 2, 2], np.float32),
               "w2": rng.standard_normal((5, 13, 3, 3)).astype(np.float32) * 0.2}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Resize", ["p1", "", "scales"], ["u1"], mode="nearest", name="resize"),
             helper.make_node("Conv", ["u1", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    return save_model(tmp_path / "cnn.onnx", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 5, 16, 16])], weights)


@pytest.fixture
def with_div(tmp_path) -> Path:
    """Div of two computed tensors between convolutions: float16 only on the NPU."""
    weights = {"w1": rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3,
               "w2": rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1,
               "two": np.array([2.0], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="sigmoid"),
             helper.make_node("Add", ["s1", "two"], ["d"], name="add"),
             helper.make_node("Div", ["c1", "d"], ["q"], name="div"),
             helper.make_node("Conv", ["q", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    return save_model(tmp_path / "div.onnx", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 8, 16, 16])], weights)


def calibration_file(tmp_path: Path, count: int = 3) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, x=rng.standard_normal((count, 1, 3, 16, 16)).astype(np.float32))
    return path


# ---- parameters and observers ---------------------------------------------------------------

def test_activation_params_cover_the_range_and_hold_zero_exactly():
    quant = activation_params(-1.0, 3.0, "minmax")
    assert quantize(np.array([-1.0, 3.0]), quant).tolist() == [-128, 127]
    assert dequantize(quantize(np.float64(0.0), quant), quant) == 0.0
    relu = activation_params(0.5, 6.0, "minmax")  # widened to include 0, all 256 steps on [0, 6]
    assert relu.zero_points == (-128,) and relu.scales[0] == pytest.approx(6 / 255)


def test_a_grid_that_would_have_zero_point_0_moves_to_the_narrower_neighbour_when_asked():
    """[-1, 1] has zero point 0 (-low / scale = 127.5 rounds to 128); without it, zero point -1
    or 1 on a step at most 1.2% coarser, still holding the range and real zero exactly."""
    assert activation_params(-1.0, 1.0, "minmax").zero_points == (0,)
    for low, high in ((-1.0, 1.0), (-1.0, 0.99), (-1.003, 0.997), (-2.01, 1.99)):
        assert activation_params(low, high, "minmax").zero_points == (0,)
        quant = activation_params(low, high, "minmax", zero_point_0=False)
        assert quant.zero_points in ((-1,), (1,))
        assert quant.scales[0] <= 1.012 * (high - low) / 255
        ends = quantize(np.array([low, high]), quant)
        assert -128 <= ends[0] and ends[1] <= 127
        assert np.abs(dequantize(ends, quant) - [low, high]).max() <= quant.scales[0] / 2
        assert dequantize(quantize(np.float64(0.0), quant), quant) == 0.0


def test_per_channel_weight_parameters_are_each_channels_activation_parameters_exactly():
    """weight_params computes every channel at once: the same floats and ints as
    activation_params on each channel's min and max, over ranges 1e-6 to 100 wide, one-signed
    channels and all-zero ones (signed zeros too)."""
    generator = np.random.default_rng(5)
    for shape in [(64, 3, 3, 3), (5, 1, 1, 1), (7, 4)]:
        magnitudes = 10.0 ** generator.integers(-6, 3, size=(shape[0],) + (1,) * (len(shape) - 1))
        base = generator.standard_normal(shape) * magnitudes
        zeros = base.copy()
        zeros[0], zeros[1] = 0.0, -0.0
        for values in (base, np.abs(base), -np.abs(base), zeros):
            quant = weight_params(values, per_channel=True)
            channels = [activation_params(float(row.min()), float(row.max()), "weights")
                        for row in values.reshape(shape[0], -1)]
            assert quant.scales == tuple(q.scales[0] for q in channels)
            assert quant.zero_points == tuple(q.zero_points[0] for q in channels)
            assert {type(s) for s in quant.scales} == {float} and {type(z) for z in quant.zero_points} == {int}


def test_conv_weights_are_asymmetric_per_channel_and_other_constants_symmetric_per_layer():
    values = np.stack([np.full((2, 3, 3), 0.5), np.full((2, 3, 3), -2.0)]).astype(np.float32)
    values[0, 0, 0, 0] = -0.25
    per_channel = weight_params(values, per_channel=True)
    assert per_channel.axis == 0
    # channel 0 spans [-0.25, 0.5] on all 256 steps, channel 1 [-2, 0] (widened to include 0)
    assert per_channel.scales == pytest.approx((0.75 / 255, 2.0 / 255))
    assert per_channel.zero_points == (-43, 127)
    q = quantize(values, per_channel)
    assert q[0].max() == 127 and q[1].min() == -128 and q[1].max() == -128
    assert np.abs(dequantize(q, per_channel) - values).max() <= max(per_channel.scales) / 2 + 1e-7
    assert dequantize(quantize(np.zeros_like(values), per_channel), per_channel).tolist() == \
        np.zeros_like(values).tolist()  # real 0 (a padded tap) stays exact in every channel
    many = rng.uniform(-1, 2, 1000).astype(np.float32)
    per_layer = weight_params(many, per_channel=False)
    assert per_layer.axis is None and per_layer.zero_points == (0,)
    assert per_layer.scales == pytest.approx((np.abs(many).max() / 127,))


@pytest.mark.parametrize("values", [
    np.array([8.0, 16.0, 32.0]),  # a detector head's strides: 8 is 8.06 on the symmetric grid 32/127
    np.arange(80) + 0.5,  # its anchor points: the symmetric step 0.63 puts some 0.31 off
    np.tile(np.arange(80) + 0.5, 100),  # the same 80 values over more elements than the distinct-value prefix
    np.array([-0.25, 0.5, -2.0]),
])
def test_a_constant_of_few_values_gets_a_grid_that_holds_them_exactly(values):
    symmetric = np.abs(values).max() / 127
    assert np.abs(np.rint(values / symmetric) * symmetric - values).max() > 1e-3  # the old grid's error
    quant = weight_params(values, per_channel=False)
    assert quant.axis is None
    assert np.abs(dequantize(quantize(values, quant), quant) - values).max() <= 1e-5 * np.abs(values).max()


def test_a_constant_the_symmetric_grid_holds_keeps_it():
    for values in (np.array([0.5]), np.array([-3.0, 3.0]), np.array([127.0, -64.0])):
        quant = weight_params(values, per_channel=False)
        assert quant.zero_points == (0,) and quant.scales == pytest.approx((np.abs(values).max() / 127,))


def test_percentile_and_kl_clip_an_outlier_that_minmax_keeps():
    values = np.concatenate([rng.standard_normal(200_000), [80.0]]).astype(np.float32)
    ranges = {}
    for method in ("minmax", "percentile", "kl"):
        observer = RangeObserver(method)
        for part in np.array_split(values, 4):
            observer.update(part)
        ranges[method] = observer.range()
    assert ranges["minmax"][1] == 80.0
    assert 3.0 < ranges["percentile"][1] < 10.0
    assert ranges["kl"][1] < 40.0


def test_observers_sharing_kept_draws_keep_what_their_own_generators_draw():
    """Observers of tensors of one size share the positions they keep (KeptDraws draws them
    once); each keeps what a generator of its seed alone would keep, whatever the sizes."""
    draws, generator = KeptDraws(), np.random.default_rng(12)  # not the module's: later tests' values stay theirs
    for sizes in ([20_000] * 4, [401_408, 401_408, 50_000, 401_408], [1_000, 70_000, 70_000]):
        first, second = RangeObserver("mmse", draws=draws), RangeObserver("mmse", draws=draws)
        alone = np.random.default_rng(0)
        for size in sizes:
            values = generator.standard_normal(size).astype(np.float32)
            first.update(values)
            second.update(values)
            expected = values if size <= 16_384 else alone.choice(values, 16_384, replace=False)
            assert np.array_equal(first.kept[-1], expected) and np.array_equal(second.kept[-1], expected)
    assert len(draws.found) == 4 + 4 + 2  # one draw per update of more than 16384 values, per history


def test_kl_keeps_the_whole_range_of_a_uniform_distribution():
    assert kl_threshold(rng.uniform(0, 1, 100_000)) > 0.95


def test_kl_is_not_decided_by_a_relus_zeros():
    """Half a ReLU's output is 0, which every grid holds exactly: left in, its first bin made
    the merged bins near 0 decide kl's cut, and a ReLU of N(0, 1) was clipped at 1.75."""
    observer = RangeObserver("kl")
    observer.update(np.maximum(np.random.default_rng(6).standard_normal(200_000), 0).astype(np.float32))
    low, high = observer.range()
    assert low == 0 and high > 3.5


@pytest.mark.parametrize("value", [15.0, -3.0])
def test_kl_keeps_a_constant_tensor_whole(value):
    """Every value in the histogram's last bin: only the whole histogram keeps them, which a
    one-signed tensor's 255-level cuts do not reach every KL_STRIDE bins."""
    observer = RangeObserver("kl")
    observer.update(np.full((1, 4, 8, 8), value, np.float32))
    assert observer.range() == (value, value)


def quantization_mse(values: np.ndarray, low: float, high: float) -> float:
    quant = activation_params(low, high, "test")
    return float(np.mean((dequantize(quantize(values, quant), quant) - values) ** 2))


def test_mmse_clips_a_tail_that_costs_the_bulk_more_than_it_gains():
    # one value at 1.2 above a uniform bulk: clipping it costs 0.04 once, the finer step saves
    # about (2.2^2 - 2^2) / 255^2 / 12 on each of 100000 values
    values = np.concatenate([rng.uniform(-1, 1, 100_000), [1.2]])
    low, high = mmse_range(values, values.min(), 1.2)
    assert 0.95 < high < 1.2 and low == values.min()
    assert quantization_mse(values, low, high) < quantization_mse(values, low, 1.2)


def test_mmse_keeps_a_far_outlier_whose_clipping_error_would_dominate():
    values = np.concatenate([rng.standard_normal(50_000), [80.0]])
    assert mmse_range(values, values.min(), 80.0)[1] > 70.0


def test_mmse_search_is_the_least_squared_error_of_quantize_then_dequantize():
    """mmse_range computes the round trip in place; the clip it keeps is the one the plain
    expression, dequantize(quantize(values)), finds, on two- and one-signed and integer values."""
    generator = np.random.default_rng(11)
    for kind in range(8):
        values = generator.standard_normal(int(generator.integers(1, 20_000))) ** (1 + kind % 3)
        values = (values * 10.0 ** generator.integers(-3, 3)).astype(np.float32)
        values = {3: np.abs(values), 4: -np.abs(values), 5: np.round(values)}.get(kind, values)
        low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
        best, best_error = None, np.inf
        for threshold in max(-low, high) * np.arange(100, 0, -1) / 100:
            candidate = (max(low, -threshold), min(high, threshold))
            quant = activation_params(*candidate, "mmse")
            error = float(np.mean((dequantize(quantize(values, quant), quant) - values.astype(np.float64)) ** 2))
            if error < best_error:
                best, best_error = candidate, error
        assert mmse_range(values, float(values.min()), float(values.max())) == best


def plain_mmse_search(values: np.ndarray, low: float, high: float) -> tuple[float, float]:
    """The clip of least `quantization_mse` over every value, thresholds from the widest (the
    first of equals)."""
    best, best_error = None, np.inf
    for threshold in max(-low, high) * np.arange(100, 0, -1) / 100:
        candidate = (max(low, -threshold), min(high, threshold))
        error = quantization_mse(values.astype(np.float64), *candidate)
        if error < best_error:
            best, best_error = candidate, error
    return best


def _spied_errors(monkeypatch) -> tuple[list[int], list[int]]:
    """The sizes of the values each float32 and each float64 error computation of mmse_range
    runs over, as it runs them."""
    from rkcompile.quantization import params

    in_float32, in_float64 = [], []
    float32_error, squared_errors = params._float32_mean_error, params._squared_errors
    monkeypatch.setattr(params, "_float32_mean_error", lambda v, *rest: in_float32.append(v.size)
                        or float32_error(v, *rest))
    monkeypatch.setattr(params, "_squared_errors", lambda v, *rest: in_float64.append(v.size)
                        or squared_errors(v, *rest))
    return in_float32, in_float64


def test_mmse_dismisses_deep_clips_on_the_extremes_and_finds_the_same_clip(monkeypatch):
    """A heavy-tailed tensor: the thresholds that clip deep into the tail are dismissed on the
    values at its ends (their error alone is above the best), so fewer than all 100 are
    computed, most of those only in float32, and the clip is the one the plain search over
    every threshold finds in float64."""
    values = (rng.standard_t(3, 200_000) * 0.7).astype(np.float32)
    low, high = float(values.min()), float(values.max())
    best = plain_mmse_search(values, low, high)
    in_float32, in_float64 = _spied_errors(monkeypatch)
    assert mmse_range(values, low, high) == best
    assert len(in_float32) < 60 and in_float64.count(values.size) <= len(in_float32) / 2 and best[1] < high


@pytest.mark.parametrize("seed", range(4))
def test_mmse_sums_a_relus_nonzero_values_and_finds_the_same_clip(seed, monkeypatch):
    """A ReLU's output, half of it 0 (error 0 at every grid): the float32 errors are summed over
    the other half, the float64 sums over every value only decide between near thresholds, and
    the clip is the one the plain search over every value finds."""
    generator = np.random.default_rng(seed)
    values = np.maximum(generator.standard_t(3 + seed, 100_000), 0).astype(np.float32)
    values[: 100 * seed] = 6.0  # a ReLU6's clipped top, on some
    low, high = float(values.min()), float(values.max())
    best = plain_mmse_search(values, low, high)
    in_float32, in_float64 = _spied_errors(monkeypatch)
    assert mmse_range(values, low, high) == best
    assert set(in_float32) == {np.count_nonzero(values)}
    assert in_float64.count(values.size) <= len(in_float32) / 2


def test_mmse_keeps_the_range_of_a_uniform_distribution():
    low, high = mmse_range(rng.uniform(-1, 1, 50_000), -1.0, 1.0)
    assert low <= -0.95 and high >= 0.95


# ---- calibration data -----------------------------------------------------------------------

SPECS = (TensorSpec("x", (1, 3, 4, 4), "float32"),)


def test_calibration_from_a_folder_of_npy_and_npz(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 4, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((2, 1, 3, 4, 4), np.float32))  # a stack of two samples
    np.savez(tmp_path / "c.npz", x=np.full((1, 3, 4, 4), 2.0), logits=np.zeros(3))  # outputs ignored
    samples = load_calibration(tmp_path, SPECS)
    assert [float(s["x"].mean()) for s in samples] == [0.0, 1.0, 1.0, 2.0]
    assert all(s["x"].dtype == np.float32 and s["x"].shape == (1, 3, 4, 4) for s in samples)


@pytest.mark.parametrize("write, message", [
    (lambda p: None, "does not exist"),
    (lambda p: np.savez(p, y=np.zeros((1, 3, 4, 4))), "no array for input x"),
    (lambda p: np.savez(p, x=np.zeros((1, 3, 5, 4))), "has shape [1, 3, 5, 4]"),
    (lambda p: p.write_bytes(b"not a zip"), "not a readable"),
])
def test_bad_calibration_data_is_one_clear_error(tmp_path, write, message):
    path = tmp_path / "calib.npz"
    write(path)
    with pytest.raises(CompileError, match=message.replace("[", r"\[")):
        load_calibration(path, SPECS)


def test_random_calibration_warns(caplog):
    samples = random_calibration(SPECS, count=2)
    assert len(samples) == 2 and "without --calib" in caplog.text


# ---- the pass -------------------------------------------------------------------------------

def test_int8_plan_parameters(cnn, tmp_path):
    plan, _ = compile_model(cnn, "rk3588", Options(dtype="int8", calibration=calibration_file(tmp_path)),
                            runtime=EMULATOR_RUNTIME)
    assert contract_violations(plan) == []
    quant, tensors = plan.quantization, plan.tensors
    int8 = [name for name, t in tensors.items() if t.dtype == "int8"]
    assert int8 and all(name in quant for name in int8)
    assert quant["w1"].axis == 0 and len(quant["w1"].scales) == 13 and len(set(quant["w1"].zero_points)) > 1
    data_scale = quant[plan.steps[1].inputs[0]].scales[0]
    assert tensors["b1"].dtype == "int32" and tensors["b1"].bytes == 13 * 4
    assert quant["b1"].scales == pytest.approx(tuple(data_scale * s for s in quant["w1"].scales))
    assert quant["p1"].scales == quant["r1"].scales and quant["p1"].source == "shared:r1"
    assert tensors["scales"].dtype == "float32"  # a parameter, not data
    relu_out = quant["r1"]
    assert relu_out.zero_points == (-128,)  # ReLU output spends every step on [0, max]
    loaded = PlanRecord.from_dict(json.loads(plan.to_json()))
    assert loaded.quantization == plan.quantization


@pytest.mark.parametrize("target", ["rk3588", "rk3576", "rv1106"])
def test_no_int8_activation_gets_zero_point_0_on_a_toolkit_target(cnn, tmp_path, target):
    """An input calibrated on exactly [-1, 1] would have zero point 0, which rknn-toolkit2 reads
    as symmetric on another scale (`Target.allows_activation_zero_point_0`)."""
    samples = rng.uniform(-1, 1, (3, 1, 3, 16, 16)).astype(np.float32)
    samples[:, 0, 0, 0, :2] = [-1.0, 1.0]
    np.savez(tmp_path / "calib.npz", x=samples)
    plan, _ = compile_model(cnn, target, Options(dtype="int8", calibration=tmp_path / "calib.npz",
                                                 calibration_method="minmax"), runtime=EMULATOR_RUNTIME)
    activations = {name: quant for name, quant in plan.quantization.items()
                   if plan.tensors[name].region != "weight" and quant.dtype == "int8"}
    assert activations and all(quant.zero_points != (0,) for quant in activations.values())
    (first_conv,) = [step for step in plan.steps if step.nodes and "conv1" in step.nodes]
    assert activations[first_conv.inputs[0]].zero_points in ((-1,), (1,))


def attention_block(path: Path, normalize: str = "Softmax") -> Path:
    """A C2PSA-like attention (yolo11n's): a Conv's q, k and v, `normalize`(s * q^T k), then
    v @ attn^T, with weights small enough that int8 follows the float model closely."""
    generator = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["qkv"], name="qkv"),
             helper.make_node("Reshape", ["qkv", "heads"], ["r"], name="r"),
             helper.make_node("Split", ["r", "split"], ["q", "k", "v"], axis=2, name="split"),
             helper.make_node("Mul", ["q", "scale"], ["qs"], name="scale"),
             helper.make_node("Transpose", ["qs"], ["qt"], perm=[0, 1, 3, 2], name="qt"),
             helper.make_node("MatMul", ["qt", "k"], ["scores"], name="scores"),
             helper.make_node(normalize, ["scores"], ["attn"], name="normalize"),
             helper.make_node("Transpose", ["attn"], ["attnt"], perm=[0, 1, 3, 2], name="attnt"),
             helper.make_node("MatMul", ["v", "attnt"], ["o"], name="o"),
             helper.make_node("Reshape", ["o", "planes"], ["y"], name="y")]
    weights = {"w": (generator.standard_normal((128, 64, 1, 1)) * 0.03).astype(np.float32),
               "heads": np.array([1, 2, 64, 64], np.int64), "split": np.array([16, 16, 32], np.int64),
               "scale": np.array(16 ** -0.5, np.float32), "planes": np.array([1, 64, 8, 8], np.int64)}
    return save_model(path, nodes, [vi("x", [1, 64, 8, 8])], [vi("y", [1, 64, 8, 8])], weights)


def masked_attention(path: Path, mask_value: float, form: str) -> Path:
    """One head of self-attention over 16 tokens of width 32, masked as exports mask: `form`
    "causal", a Where putting `mask_value` in place of the scores of later tokens (torchscript
    exports); "padding", (1 - keep) * `mask_value` added to the scores, `keep` a model input
    (1 for a token to attend, 0 for padding), as Hugging Face models build it."""
    generator = np.random.default_rng(1)
    weights = {name: (generator.standard_normal((32, 32)) * 0.3).astype(np.float32) for name in ("wq", "wk", "wv")}
    weights.update(scale=np.array(32 ** -0.5, np.float32), masked_value=np.array(mask_value, np.float32))
    inputs = [vi("x", [1, 16, 32])]
    if form == "causal":
        weights["causal"] = np.tril(np.ones((16, 16), bool))[None]
        masking = [helper.make_node("Where", ["causal", "scaled", "masked_value"], ["masked"], name="mask")]
    else:
        inputs.append(vi("keep", [1, 1, 16]))
        weights["one"] = np.array(1.0, np.float32)
        masking = [helper.make_node("Sub", ["one", "keep"], ["dropped"], name="dropped"),
                   helper.make_node("Mul", ["dropped", "masked_value"], ["mask"], name="mask_values"),
                   helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
             *masking,
             helper.make_node("Softmax", ["masked"], ["attn"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["attn", "v"], ["y"], name="y")]
    return save_model(path, nodes, inputs, [vi("y", [1, 16, 32])], weights)


@pytest.mark.parametrize("mask_value, form", [(-np.inf, "causal"), (np.finfo(np.float32).min, "causal"),
                                              (-10000.0, "padding"), (np.finfo(np.float32).min, "padding")])
def test_the_tensors_carrying_an_attention_mask_are_float16(tmp_path, mask_value, form):
    """int8 cannot hold a mask beside the scores it masks (`_float16_masks`): a range that holds
    -10000 or float32's minimum leaves the scores an integer or two, and neither an infinity nor
    a padding mask the calibration samples never had is in a calibrated range, so the masked
    tokens were attended. Carried in float16, the plan attends as the model does."""
    model = masked_attention(tmp_path / "attention.onnx", mask_value, form)
    generator = np.random.default_rng(2)
    calibration = {"x": generator.standard_normal((4, 1, 16, 32)).astype(np.float32)}
    inputs = {"x": generator.standard_normal((1, 16, 32)).astype(np.float32)}
    if form == "padding":  # calibrated on unpadded samples, run on a padded one
        calibration["keep"] = np.ones((4, 1, 1, 16), np.float32)
        inputs["keep"] = (np.arange(16) < 11).astype(np.float32).reshape(1, 1, 16)
    np.savez(tmp_path / "calib.npz", **calibration)
    prepared = prepare(model, "rk3588", Options(dtype="int8", calibration=tmp_path / "calib.npz", **PREFERRED_INT8))
    (masks,) = [t.applied for t in prepared.plan.int8_techniques if t.name == "float16_masks"]
    assert masks and all(prepared.plan.tensors[name].dtype == "float16" for name in masks)
    result = emulate(prepared, inputs).outputs["y"]
    # 0.9991-0.9992 here; with the mask in int8 0.996 (-inf), 0.61 (float32's minimum), 0.87 (padding)
    assert agreement("y", result, onnxruntime_outputs(model, inputs)["y"]).cosine >= 0.998


def test_a_mask_an_int8_only_step_carries_stays_int8_and_says_so(tmp_path):
    """RV1106's NPU runs Sub, Mul and Add only in int8 (oplist T1): the mask cannot be carried
    in float16 there, so no step of the plan computes in float16, and the mask's parameters
    say what int8 does to it."""
    model = masked_attention(tmp_path / "attention.onnx", -10000.0, "padding")
    generator = np.random.default_rng(2)
    np.savez(tmp_path / "calib.npz", x=generator.standard_normal((4, 1, 16, 32)).astype(np.float32),
             keep=np.ones((4, 1, 1, 16), np.float32))
    plan, _ = compile_model(model, "rv1106", Options(dtype="int8", calibration=tmp_path / "calib.npz",
                                                     **PREFERRED_INT8), runtime=EMULATOR_RUNTIME)
    assert not [t for t in plan.int8_techniques if t.name == "float16_masks"]
    assert not any(step.device == "npu" and any(plan.tensors[o].dtype == "float16" for o in step.outputs)
                   for step in plan.steps)
    warned = [name for name, quant in plan.quantization.items() if quant.warning and "attention mask" in quant.warning]
    assert warned


def test_float16_needs_a_step_the_npu_runs_in_float16(tmp_path):
    """RV1106's NPU runs exMatMul only in int8 (oplist T1): an attention's scores stay int8
    there, and --float16 on them is one error line, not a plan the NPU cannot run."""
    np.savez(tmp_path / "calib.npz", x=rng.uniform(-1, 1, (4, 1, 64, 8, 8)).astype(np.float32))
    model = attention_block(tmp_path / "attention.onnx")
    options = Options(dtype="int8", calibration=tmp_path / "calib.npz", **PREFERRED_INT8)
    plan, _ = compile_model(model, "rv1106", options, runtime=EMULATOR_RUNTIME)
    assert not [t for t in plan.int8_techniques if t.name == "float16_attention_scores"]
    assert plan.quantization["scores"].dtype == "int8"
    with pytest.raises(CompileError, match="--float16 scores: rv1106's NPU runs the step writing it .* only in int8"):
        compile_model(model, "rv1106", dataclasses.replace(options, float16_tensors=("scores",)),
                      runtime=EMULATOR_RUNTIME)


def test_a_softmax_output_stays_int8_where_the_npu_has_no_float16(tmp_path):
    """RV1106B's NPU runs Softmax only in int8: a 100-way model output stays int8 there, with no
    error for a --float16 nobody gave."""
    weights = {"w": np.random.default_rng(7).standard_normal((100, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["logits"], name="conv"),
             helper.make_node("Softmax", ["logits"], ["y"], axis=1, name="softmax")]
    model = save_model(tmp_path / "classes.onnx", nodes, [vi("x", [1, 3, 1, 1])], [vi("y", [1, 100, 1, 1])], weights)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(8).standard_normal((3, 1, 3, 1, 1)).astype(np.float32))
    options = Options(dtype="int8", calibration=tmp_path / "calib.npz", **PREFERRED_INT8)
    for target, float16 in (("rk3588", True), ("rv1106b", False)):
        plan, _ = compile_model(model, target, options, runtime=EMULATOR_RUNTIME)
        chosen = [t.applied for t in plan.int8_techniques if t.name == "float16_softmax_outputs"]
        assert bool(chosen) == float16 and (plan.tensors["y@npu"].dtype == "float16") == float16


def test_a_large_constant_that_masks_no_softmax_stays_int8(tmp_path):
    """A clamp's bound of -1e9 (Max) is no mask: nothing it reaches is a Softmax's input, so
    the convolutions after it stay int8."""
    generator = np.random.default_rng(5)
    weights = {"w": generator.standard_normal((4, 3, 1, 1)).astype(np.float32),
               "w2": generator.standard_normal((4, 4, 1, 1)).astype(np.float32), "floor": np.array(-1e9, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Max", ["c", "floor"], ["m"], name="clamp"),
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2")]
    model = save_model(tmp_path / "clamp.onnx", nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])], weights)
    np.savez(tmp_path / "calib.npz", x=generator.standard_normal((3, 1, 3, 8, 8)).astype(np.float32))
    plan, _ = compile_model(model, "rk3588", Options(dtype="int8", calibration=tmp_path / "calib.npz", **PREFERRED_INT8),
                            runtime=EMULATOR_RUNTIME)
    assert not [t for t in plan.int8_techniques if t.name == "float16_masks"]
    assert plan.quantization["y@npu"].dtype == "int8" and not any(
        plan.tensors[name].dtype == "float16" for name in plan.tensors if plan.tensors[name].region == "arena")


def test_an_activation_that_held_infinities_in_calibration_says_so(tmp_path):
    """A calibrated range holds no infinity (the observer drops them): an int8 tensor that held
    some (1/x of a ReLU's zeros) saturates them, and its parameters say so and how to keep it."""
    generator = np.random.default_rng(3)
    weights = {"w": generator.standard_normal((4, 3, 1, 1)).astype(np.float32),
               "w2": generator.standard_normal((4, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reciprocal", ["r"], ["inverse"], name="inverse"),
             helper.make_node("Conv", ["inverse", "w2"], ["y"], name="conv2")]
    model = save_model(tmp_path / "inverse.onnx", nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])], weights)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(4).standard_normal((3, 1, 3, 8, 8)).astype(np.float32))
    plan, _ = compile_model(model, "rk3588", Options(dtype="int8", calibration=tmp_path / "calib.npz", **PREFERRED_INT8),
                            runtime=EMULATOR_RUNTIME)
    warned = {name: quant.warning for name, quant in plan.quantization.items() if quant.warning}
    assert warned and all("infinite or NaN" in text and f"--float16 {name}" in text for name, text in warned.items())
    assert "r" not in warned  # finite: the ReLU's zeros are what the inverse makes infinite


@pytest.mark.parametrize("normalize", ["Softmax", "Sigmoid"])
def test_int8_attention_scores_are_float16_on_a_toolkit_target(tmp_path, normalize):
    """rknn-toolkit2 2.5.0 crashes building an int8 MatMul -> Softmax -> MatMul
    (`Target.builds_int8_attention_scores`): the score MatMul computes in float16, the Softmax
    and the second MatMul stay int8; scores another op reads stay int8."""
    np.savez(tmp_path / "calib.npz", x=rng.uniform(-1, 1, (4, 1, 64, 8, 8)).astype(np.float32))
    plan, _ = compile_model(attention_block(tmp_path / "attention.onnx", normalize), "rk3588",
                            Options(dtype="int8", calibration=tmp_path / "calib.npz"), runtime=EMULATOR_RUNTIME)
    chosen = [t.applied for t in plan.int8_techniques if t.name == "float16_attention_scores"]
    assert plan.quantization["attn"].dtype == "int8" and plan.quantization["v"].dtype == "int8"
    if normalize == "Softmax":
        assert chosen == [("scores",)] and "scores" not in plan.quantization
        assert plan.tensors["scores"].dtype == "float16"
    else:
        assert chosen == [] and plan.quantization["scores"].dtype == "int8"


def test_fused_attention_probabilities_are_int8_on_a_toolkit_target(tmp_path):
    """rknn-toolkit2 2.5.0 builds a fused attention (exSDPAttention) with float16 scores and
    int8 probabilities, and crashes on one whose inside is all float
    (`Target.builds_int8_attention_scores`): the int8 plan quantizes the Softmax output inside
    the step on [0, 1], the emulator rounds it there, and the export's QDQ pair on it makes
    onnxruntime compute what the emulator does."""
    from test_attention_operands import TOKENS, WIDTH, fused_projection_split

    path = tmp_path / "attention.onnx"
    onnx.save(fused_projection_split("Gather"), path)
    samples = rng.uniform(-1, 1, (4, 1, TOKENS, WIDTH)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=samples)
    plan = rkcompile.compile(path, "rk3588", dtype="int8", calibration=tmp_path / "calib.npz")
    record = plan.record
    assert [s.kernel for s in record.steps if s.device == "npu"].count("exSDPAttention") == 1
    assert "probs" not in record.tensors and contract_violations(record) == []
    assert record.quantization["probs"] == activation_params(0.0, 1.0, "attention probabilities", False)
    assert [t.applied for t in record.int8_techniques if t.name == "int8_attention_probabilities"] == [("probs",)]
    x = {"x": samples[0]}
    unrounded = rkcompile.Plan(dataclasses.replace(record, quantization={
        name: quant for name, quant in record.quantization.items() if name != "probs"}), plan.weights)
    written = rkcompile.export(plan, tmp_path / "out.onnx")
    exported = onnx.load(written.path)
    assert "probs/QuantizeLinear" in {node.name for node in exported.graph.node}
    (through_onnxruntime,) = onnxruntime_outputs(written.path, x).values()
    rounded_error = np.abs(rkcompile.run(plan, x)["y"] - through_onnxruntime).max()
    unrounded_error = np.abs(rkcompile.run(unrounded, x)["y"] - through_onnxruntime).max()
    assert rounded_error < unrounded_error / 2, (rounded_error, unrounded_error)


def test_float16_plans_have_no_quantization(cnn):
    plan, _ = compile_model(cnn, "rk3588", Options())
    assert plan.quantization == {} and "quantization" in json.loads(plan.to_json())


def test_contract_catches_an_int8_tensor_without_parameters(cnn, tmp_path):
    plan, _ = compile_model(cnn, "rk3588", Options(dtype="int8", calibration=calibration_file(tmp_path)),
                            runtime=EMULATOR_RUNTIME)
    broken = PlanRecord.from_dict({**plan.to_dict(), "quantization": {
        k: v.__dict__ for k, v in plan.quantization.items() if k != "r1"}})
    assert any("r1" in problem for problem in contract_violations(broken))


@pytest.mark.parametrize("target, c2", [("rk3588", 16), ("rk3566", 8)])
def test_int8_uses_the_int8_c2(cnn, tmp_path, target, c2):
    plan, _ = compile_model(cnn, target, Options(dtype="int8", calibration=calibration_file(tmp_path)),
                            runtime=EMULATOR_RUNTIME)
    relu = plan.tensors["r1"]  # (1, 13, 16, 16) stored NC1HWC2 int8
    assert relu.layout == "NC1HWC2" and relu.bytes == -(-13 // c2) * c2 * 16 * 16


# ---- dtype-aware legalization, both sides ---------------------------------------------------

def test_div_runs_on_the_npu_in_float16(with_div):
    plan, _ = compile_model(with_div, "rk3588", Options())
    assert {n.name: n.device for n in plan.nodes}["div"] == "npu"


def test_div_falls_back_to_the_cpu_in_int8_with_conversions_that_quantize(with_div, tmp_path):
    calib = calibration_file(tmp_path)
    plan, _ = compile_model(with_div, "rk3588", Options(dtype="int8", calibration=calib), runtime=EMULATOR_RUNTIME)
    div = {n.name: n for n in plan.nodes}["div"]
    assert div.device == "cpu" and "only in {float16}" in div.reason and "Div" in div.reason
    kernels = [s.kernel for s in plan.steps if s.device == "host"]
    assert "NC1HWC2 int8 -> NCHW float32" in kernels and "NCHW float32 -> NC1HWC2 int8" in kernels
    prepared = prepare(with_div, "rk3588", Options(dtype="int8", calibration=calib))
    x = np.load(calib)["x"][0]
    outputs = emulate(prepared, {"x": x}).outputs
    expected = onnxruntime_outputs(with_div, {"x": x})
    assert agreement("y", outputs["y"], expected["y"]).cosine >= 0.99


# ---- the float32 reference and accuracy analysis --------------------------------------------

def test_float_reference_of_the_planned_graph_matches_onnxruntime(cnn, tmp_path):
    prepared = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calibration_file(tmp_path)))
    reference = FloatReference(prepared.reference_nodes, [s.device for s in prepared.plan.steps], 17, ["y"])
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    seen = []
    outputs = reference.run({"x": x}, lambda name, value: seen.append(name))
    np.testing.assert_allclose(outputs["y"], onnxruntime_outputs(cnn, {"x": x})["y"], rtol=1e-4, atol=1e-4)
    assert seen == [name for step in prepared.plan.steps for name in step.outputs]


def test_int8_run_of_a_small_cnn_matches_onnxruntime(cnn, tmp_path):
    calib = calibration_file(tmp_path)
    prepared = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calib))
    x = np.load(calib)["x"][1]
    result = emulate(prepared, {"x": x}).outputs["y"]
    assert agreement("y", result, onnxruntime_outputs(cnn, {"x": x})["y"]).cosine >= 0.999


def first_conv_output(plan: PlanRecord) -> str:
    return next(step.outputs[0] for step in plan.steps if step.device == "npu" and step.kernel.startswith("Conv"))


def test_float16_island_stores_its_step_in_float16_and_the_rest_in_int8(cnn, tmp_path):
    calib = calibration_file(tmp_path)
    x = np.load(calib)["x"][1]
    expected = onnxruntime_outputs(cnn, {"x": x})["y"]
    plain = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calib))
    island = first_conv_output(plain.plan)
    hybrid = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calib, float16_tensors=(island,)))
    plan = hybrid.plan
    assert not contract_violations(plan)
    for name in (island, "w1", "b1"):
        assert plan.tensors[name].dtype == "float16" and name not in plan.quantization
    assert plan.tensors["w2"].dtype == "int8" and "w2" in plan.quantization
    assert plain.plan.tensors[island].dtype == "int8"
    # C2 is 8 for float16 on rk3588, so the island's NC1HWC2 bytes are those of 16 padded channels
    assert plan.tensors[island].bytes == 16 * 16 * 16 * 2
    seen = {}
    result = emulate(hybrid, {"x": x}, observe=lambda step, values: seen.update(values)).outputs["y"]
    assert len(np.unique(seen[island])) > 256  # not int8 values
    assert agreement("y", result, expected).cosine >= 0.999


def test_a_model_input_can_reach_the_npu_in_float16(cnn, tmp_path):
    calib = calibration_file(tmp_path)
    x = np.load(calib)["x"][1]
    expected = onnxruntime_outputs(cnn, {"x": x})["y"]
    plain = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calib))
    hybrid = prepare(cnn, "rk3588", Options(dtype="int8", calibration=calib, float16_tensors=("x@npu",)))
    assert plain.plan.tensors["x@npu"].dtype == "int8" and "x@npu" in plain.plan.quantization
    plan = hybrid.plan
    assert not contract_violations(plan)
    assert plan.tensors["x@npu"].dtype == "float16" and "x@npu" not in plan.quantization
    # the 3-channel input a Conv reads is a dense NHWC image (passes/layout.py, reads_as_image),
    # now of 2-byte elements
    assert plan.tensors["x@npu"].layout == "NHWC" and plain.plan.tensors["x@npu"].layout == "NHWC"
    assert plan.tensors["x@npu"].bytes == 2 * plain.plan.tensors["x@npu"].bytes == 16 * 16 * 3 * 2
    (conversion,) = [s for s in plan.steps if s.outputs == ("x@npu",)]
    assert conversion.device == "host" and conversion.kernel.endswith("NHWC float16")
    seen = {}
    result = emulate(hybrid, {"x": x}, observe=lambda step, values: seen.update(values)).outputs["y"]
    assert np.array_equal(seen["x@npu"], x.astype(np.float16).astype(np.float32))
    assert agreement("y", result, expected).cosine >= 0.999


@pytest.fixture
def boxes_and_scores(tmp_path) -> Path:
    """YOLOv8's output in small: coordinates in the hundreds beside Sigmoid scores in one Concat."""
    weights = {"wb": rng.standard_normal((4, 3, 1, 1)).astype(np.float32) * 200,
               "ws": rng.standard_normal((6, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "wb"], ["boxes"], name="box_conv"),
             helper.make_node("Conv", ["x", "ws"], ["logits"], name="score_conv"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1, name="concat")]
    return save_model(tmp_path / "head.onnx", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 10, 16, 16])], weights)


def test_a_constant_concat_operand_quantized_away_is_reported(tmp_path):
    """A learned token beside activations hundreds of times its size (XCiT's class token): every
    value of it rounds to the Concat's zero point, and the warning names the constant."""
    weights = {"w": rng.standard_normal((8, 3, 1, 1)).astype(np.float32) * 20,
               "token": rng.standard_normal((1, 1, 16, 16)).astype(np.float32) * 0.02}
    nodes = [helper.make_node("Conv", ["x", "w"], ["features"], name="conv"),
             helper.make_node("Concat", ["token", "features"], ["y"], axis=1, name="concat")]
    model = save_model(tmp_path / "token.onnx", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 9, 16, 16])], weights)
    calib = calibration_file(tmp_path)
    prepared = prepare(model, "rk3588", Options(dtype="int8", calibration=calib))
    (concat,) = [s for s in prepared.plan.steps if s.kernel == "Concat"]
    warning = prepared.plan.quantization[concat.outputs[0]].warning
    assert warning and "constant token" in warning and "features" not in warning
    token = emulate(prepared, {"x": np.load(calib)["x"][0]}).outputs["y"][:, :1]
    assert not token.any()


def test_a_concat_operand_quantized_away_is_reported_and_kept_in_float16(boxes_and_scores, tmp_path, capsys, caplog):
    calib = calibration_file(tmp_path)
    x = np.load(calib)["x"][0]
    expected = onnxruntime_outputs(boxes_and_scores, {"x": x})["y"][:, 4:]
    assert main(["plan", str(boxes_and_scores), "--target", "rk3588", "--dtype", "int8", "--calib", str(calib),
                 "--json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    plan = PlanRecord.from_dict(json.loads((tmp_path / "plan.json").read_text()))
    (concat,) = [s for s in plan.steps if s.kernel == "Concat"]
    warning = plan.quantization[concat.outputs[0]].warning
    assert warning and "scores" in warning and "boxes" not in warning and f"--float16 {concat.outputs[0]}" in warning
    assert "int8 warnings:" in out and warning in out
    # logged once, for the chosen plan; a candidate plan (the pipeline's back half, as choosing
    # the int8 settings makes several) only records it
    assert sum(warning in record.getMessage() for record in caplog.records) == 1
    caplog.clear()
    candidate = finish_plan(front_half(boxes_and_scores, "rk3588", Options(dtype="int8", calibration=calib),
                                       EMULATOR_RUNTIME))
    recorded = [q.warning for q in candidate.quantization.values() if q.warning]
    assert recorded and not any(text in caplog.text for text in recorded)
    plain = prepare(boxes_and_scores, "rk3588", Options(dtype="int8", calibration=calib))
    lost = emulate(plain, {"x": x}).outputs["y"][:, 4:]
    assert len(np.unique(lost)) <= 16
    kept = prepare(boxes_and_scores, "rk3588",
                   Options(dtype="int8", calibration=calib, float16_tensors=(concat.outputs[0],)))
    assert not any(q.warning for q in kept.plan.quantization.values())
    scores = emulate(kept, {"x": x}).outputs["y"][:, 4:]
    assert agreement("scores", scores, expected).cosine >= 0.999


@pytest.fixture
def two_branch_concat(tmp_path) -> Path:
    """A Concat of a MaxPool of one Conv (each read by nothing else) and of another Conv that a
    third Conv reads too; the two branches' ranges differ fivefold."""
    weights = {"wa": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 5,
               "wb": rng.standard_normal((6, 3, 3, 3)).astype(np.float32),
               "wc": rng.standard_normal((2, 6, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("MaxPool", ["a"], ["pa"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv_b"),
             helper.make_node("Conv", ["b", "wc"], ["c"], name="conv_c"),
             helper.make_node("Concat", ["pa", "b"], ["y"], axis=1, name="concat")]
    return save_model(tmp_path / "concat.onnx", nodes, [vi("x", [1, 3, 16, 16])],
                      [vi("y", [1, 10, 8, 8]), vi("c", [1, 2, 8, 8])], weights)


def test_a_concat_operand_read_by_nothing_else_is_written_with_the_concat_parameters(two_branch_concat, tmp_path):
    calib = calibration_file(tmp_path)
    prepared = prepare(two_branch_concat, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8))
    quant = prepared.plan.quantization
    (output,) = [s.outputs[0] for s in prepared.plan.steps if s.kernel == "Concat"]
    shared = (quant[output].scales, quant[output].zero_points)
    # conv_a rounds onto the Concat's grid (through the MaxPool, which keeps its input's parameters)
    assert (quant["a"].scales, quant["a"].zero_points) == shared and quant["a"].source == f"concat:{output}"
    assert (quant["pa"].scales, quant["pa"].zero_points) == shared and quant["pa"].source == "shared:a"
    # b is read by conv_c too: it keeps its own, finer grid, and the Concat rescales it
    assert quant["b"].source == "minmax" and quant["b"].scales[0] < quant[output].scales[0]
    assert_moved_unrounded(prepared, two_branch_concat, np.load(calib)["x"][0], output, "pa", 4)


def test_a_range_the_concat_parameters_replace_is_never_searched(two_branch_concat, tmp_path):
    """mmse searches a tensor's range when its own parameters are read: `a` takes the Concat's
    (through the MaxPool, whose output keeps its input's), so neither is searched; `b`, read by
    conv_c too, keeps its own, searched; the parameters are those searching everything gives."""
    calib = calibration_file(tmp_path)
    options = Options(dtype="int8", calibration=calib, calibration_method="mmse", bias_correction=False,
                      equalization=False)
    ctx = front_half(two_branch_concat, "rk3588", options, EMULATOR_RUNTIME)
    plan = finish_plan(ctx)
    observers = ctx.calibration.observers
    (output,) = [s.outputs[0] for s in plan.steps if s.kernel == "Concat"]
    assert plan.quantization["a"].source == f"concat:{output}" and plan.quantization["b"].source == "mmse"
    assert observers["a"].found is None and observers["pa"].found is None
    assert observers["b"].found is not None and observers[output].found is not None
    for name in ("b", output):  # as the range searched on its own gives
        found = activation_params(*observers[name]._search(), "mmse", ctx.target.allows_activation_zero_point_0)
        assert (plan.quantization[name].scales, plan.quantization[name].zero_points) == (found.scales,
                                                                                         found.zero_points)


def assert_moved_unrounded(prepared, model: Path, x: np.ndarray, output: str, operand: str, channels: int) -> None:
    """The Concat `output`'s first `channels` are `operand`'s integers moved as they are (not
    rounded a second time), and the model output `y` still agrees with onnxruntime."""
    seen = {}
    emulate(prepared, {"x": x}, observe=lambda step, values: seen.update(values))
    assert np.array_equal(seen[output][:, :channels], seen[operand])
    assert agreement("y", seen[output], onnxruntime_outputs(model, {"x": x})["y"]).cosine >= 0.999


def split_block(tmp_path: Path, gain: float) -> Path:
    """YOLOv8's C2f in small: a Conv's output split in two halves, a Conv on the second half
    (its weights times `gain`), and a Concat of both halves and that Conv's output."""
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
               "wm": (rng.standard_normal((4, 4, 3, 3)) * gain / 6).astype(np.float32),
               "halves": np.array([4, 4], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="cv1"),
             helper.make_node("Split", ["c", "halves"], ["y0", "y1"], axis=1, name="split"),
             helper.make_node("Conv", ["y1", "wm"], ["m"], pads=[1, 1, 1, 1], name="m"),
             helper.make_node("Concat", ["y0", "y1", "m"], ["y"], axis=1, name="concat")]
    return save_model(tmp_path / f"split{gain}.onnx", nodes, [vi("x", [1, 3, 16, 16])], [vi("y", [1, 12, 16, 16])],
                      weights)


def test_a_split_whose_outputs_a_concat_reads_takes_its_parameters_within_one_bit(tmp_path):
    """Both halves of the split Conv output are Concat operands: the Conv writes on the Concat's
    grid, the Split and the Concat then move integers without rounding them again, and the
    Conv reading a half reads that grid (its own at most twice as fine)."""
    calib, model = calibration_file(tmp_path), split_block(tmp_path, 1.0)
    prepared = prepare(model, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8))
    quant = prepared.plan.quantization
    (output,) = [s.outputs[0] for s in prepared.plan.steps if s.kernel == "Concat"]
    shared = (quant[output].scales, quant[output].zero_points)
    assert quant["c"].source == f"concat:{output}" and (quant["c"].scales, quant["c"].zero_points) == shared
    for half in ("y0", "y1"):
        assert quant[half].source == "shared:c" and (quant[half].scales, quant[half].zero_points) == shared
    assert_moved_unrounded(prepared, model, np.load(calib)["x"][0], output, "c", 8)
    # the bottleneck's output spans far more than the halves: they keep their finer grid
    wide = prepare(split_block(tmp_path, 20.0), "rk3588",
                   Options(dtype="int8", calibration=calib, **PREFERRED_INT8)).plan
    assert not wide.quantization["c"].source.startswith("concat:")
    assert wide.quantization[output].scales[0] > 2 * wide.quantization["c"].scales[0]


def classifier(tmp_path: Path, classes: int, spread: float, read_again: bool = False) -> Path:
    """Conv, global average pool, a fully connected layer to `classes` logits (spread by
    `spread`, so a few classes are likely and most are not), Softmax as the output; with
    `read_again`, a Mul by a constant (an NPU step) reads the probabilities and is the output."""
    weights = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
               "fc": (rng.standard_normal((8, classes)) * spread).astype(np.float32), "two": np.float32(2.0)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["p"], axis=1, name="softmax")]
    output = "p"
    if read_again:
        nodes.append(helper.make_node("Mul", ["p", "two"], ["y"], name="mul"))
        output = "y"
    return save_model(tmp_path / f"classifier{classes}.onnx", nodes, [vi("x", [1, 3, 16, 16])],
                      [vi(output, [1, classes])], weights)


def test_a_many_class_softmax_output_is_computed_in_float16(tmp_path):
    """Int8 on a 1000-way distribution leaves the unlikely classes a few steps or none; the
    Softmax step that writes the model output computes and stores it in float16 instead, and
    the host reads float16."""
    model, calib = classifier(tmp_path, 1000, 1.0), calibration_file(tmp_path)
    x = np.load(calib)["x"][0]
    expected = onnxruntime_outputs(model, {"x": x})["p"]
    prepared = prepare(model, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8))
    plan = prepared.plan
    assert not contract_violations(plan)
    assert plan.tensors["p@npu"].dtype == "float16" and "p@npu" not in plan.quantization
    assert plan.tensors["logits"].dtype == "int8" and "logits" in plan.quantization  # only the Softmax changes
    (technique,) = [t for t in plan.int8_techniques if t.name == "float16_softmax_outputs"]
    assert technique.applied == ("p@npu",) and "1000 classes" in technique.note
    (conversion,) = [s for s in plan.steps if s.inputs == ("p@npu",)]
    assert conversion.device == "host" and conversion.kernel.startswith("NC1HWC2 float16")
    produced = emulate(prepared, {"x": x}).outputs["p"]
    # below the median probability an int8 grid over the calibrated range has a few steps
    # (there its mean relative error was about 0.3); what is left is the int8 logits' rounding
    small = expected < np.median(expected)
    assert np.mean(np.abs(produced[small] - expected[small]) / expected[small]) < 0.05
    assert agreement("p", produced, expected).cosine > 0.999


@pytest.mark.parametrize("classes, read_again", [(10, False), (1000, True)])
def test_a_few_class_softmax_or_one_an_npu_step_reads_stays_int8(tmp_path, classes, read_again):
    model = classifier(tmp_path, classes, 3.0, read_again)
    plan = prepare(model, "rk3588", Options(dtype="int8", calibration=calibration_file(tmp_path), **PREFERRED_INT8)).plan
    softmax = next(s.outputs[0] for s in plan.steps if s.kernel == "Softmax")
    assert plan.tensors[softmax].dtype == "int8" and softmax in plan.quantization
    assert not any(t.name == "float16_softmax_outputs" for t in plan.int8_techniques)


def test_a_staged_global_average_pool_rounds_its_small_stage_first_in_int8(tmp_path, monkeypatch):
    """A 13x13 mean is two pooling stages (kernels 7 and 2, plus a Mul for the padding); in int8
    each stage's output is rounded, and the first stage's rounding is averaged only by the later
    stages, so where the mean is a model output the int8 plan runs the 2x2 stage first (its
    rounding then averages over 49 values, not 4): the error of the mean is smaller than with
    the 7x7 stage first. A float16 plan, and an int8 one where a Conv reads the mean, keep 7x7
    first (a float16 plan's last stage a Conv that takes the Mul in)."""
    from rkcompile.passes.rewrites import pooling

    model = save_model(tmp_path / "gap.onnx", [helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                       [vi("x", [1, 512, 13, 13])], [vi("y", [1, 512, 1, 1])], {})
    calib = tmp_path / "calib.npz"
    samples = np.random.default_rng(0).uniform(0, 1, (4, 1, 512, 13, 13)).astype(np.float32)
    np.savez(calib, x=samples)

    def kernels(plan):
        return [tuple(step.operation.attributes["kernel_shape"]) for step in plan.steps if step.kernel == "AveragePool"]

    def error(prepared):
        return np.sqrt(np.mean([(emulate(prepared, {"x": x}).outputs["y"] - x.mean(axis=(2, 3), keepdims=True)) ** 2
                                for x in samples]))

    small_first = prepare(model, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8))
    assert kernels(small_first.plan) == [(2, 2), (7, 7)]
    float16 = prepare(model, "rk3588", Options()).plan  # its 2x2 stage a depthwise Conv with the padding's scale
    assert kernels(float16) == [(7, 7)] and [s.kernel for s in float16.steps if s.device == "npu"] == ["AveragePool", "Conv"]
    monkeypatch.setattr(pooling, "QUANTIZED_DTYPES", ())  # the order before: 7x7 first in int8 too
    large_first = prepare(model, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8))
    assert kernels(large_first.plan) == [(7, 7), (2, 2)]
    assert error(small_first) < 0.9 * error(large_first)
    monkeypatch.undo()
    # where another int8 step reads the mean (a squeeze-excitation scale), the order stays
    read = save_model(tmp_path / "gap_conv.onnx",
                      [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
                       helper.make_node("Conv", ["g", "w"], ["y"], name="fc")],
                      [vi("x", [1, 512, 13, 13])], [vi("y", [1, 8, 1, 1])],
                      {"w": rng.standard_normal((8, 512, 1, 1)).astype(np.float32)})
    read_plan = prepare(read, "rk3588", Options(dtype="int8", calibration=calib, **PREFERRED_INT8)).plan
    assert kernels(read_plan) == [(7, 7), (2, 2)]


@pytest.mark.parametrize("extra, message", [
    (["--float16", "r1"], "add --dtype int8"),
    (["--dtype", "int8", "--float16", "w1"], "--float16 w1: not an int8 tensor an NPU step or a conversion to the NPU"),
])
def test_float16_island_errors_are_one_line(cnn, capsys, extra, message):
    assert main(["plan", str(cnn), "--target", "rk3588", "--quiet"] + extra) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


# ---- the command line -----------------------------------------------------------------------

def test_plan_int8_writes_quantization(cnn, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", str(cnn), "--target", "rk3588", "--dtype", "int8", "--calib",
                 str(calibration_file(tmp_path)), "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["dtype"] == "int8" and data["quantization"]["w1"]["axis"] == 0
    assert "without --calib" not in capsys.readouterr().err


def test_plan_int8_without_calib_warns_on_stderr(cnn):
    done = subprocess.run([sys.executable, "-m", "rkcompile.cli", "plan", str(cnn), "--target", "rk3588",
                           "--dtype", "int8", "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "seeded random inputs" in done.stderr and "--calib PATH" in done.stderr


@pytest.mark.parametrize("extra, message", [
    (["--calib", "somewhere"], "add --dtype int8"),
    (["--dtype", "int8", "--calib", "/nonexistent/calib"], "--calib: /nonexistent/calib does not exist"),
])
def test_calibration_errors_are_one_line(cnn, capsys, extra, message):
    assert main(["plan", str(cnn), "--target", "rk3588", "--quiet"] + extra) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_run_accuracy_analysis(cnn, tmp_path, capsys):
    report = tmp_path / "report.json"
    status = main(["run", str(cnn), "--target", "rk3588", "--dtype", "int8", "--calib",
                   str(calibration_file(tmp_path)), "--accuracy-analysis", "--check", "--json", str(report)])
    printed = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert status == 0 and data["min_cosine"] == 0.99 and data["passed"]
    rows = data["accuracy_analysis"]
    assert [r["output"] for r in rows][-1] == "y" and all(-1 <= r["cosine"] <= 1 for r in rows)
    assert "worst 5 steps by cosine" in printed and "by drop" in printed
    # the conversion into the NPU is the first loss; the last step reports what --check compares
    assert rows[0]["step"] == 0 and rows[0]["cosine"] < 1
    assert rows[-1]["cosine"] == pytest.approx(data["agreement"][0]["cosine"], abs=1e-6)
    # each NPU step also runs alone ("single"); the host conversion has no such column
    assert rows[0]["single"] is None and all(r["single"] is not None for r in rows if r["device"] == "npu")
    assert "single" in printed.splitlines()[0] and "steps run alone" in printed


def test_a_step_run_alone_starts_from_its_inputs_stored_as_planned(cnn, tmp_path):
    """The first NPU step reads only the model input's int8 copy: run alone on the input
    quantized with the plan's parameters it computes exactly what the whole run computes, so its
    single cosine equals its entire one (an unquantized operand would beat it). A later step's
    single leaves out the error before it, so it differs from its entire cosine."""
    plan = rkcompile.compile(cnn, "rk3588", dtype="int8", calibration=calibration_file(tmp_path), **PREFERRED_INT8)
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    rows = rkcompile.accuracy_analysis(plan, x)
    npu = [row for row in rows if row.device == "npu"]
    assert npu[0].single == npu[0].cosine < 1
    assert any(row.single != row.cosine for row in npu[1:])
    entire_only, _ = analyse(plan.prepared(), x, single=False)
    assert [dataclasses.replace(row, single=None) for row in rows] == entire_only


def test_a_float16_step_run_alone_includes_its_result_rounding(cnn):
    """The same for a float16 plan: the first NPU step alone, on the input rounded as planned,
    rounds its result to float16 as the whole run stores it, so single and entire agree."""
    plan = rkcompile.compile(cnn, "rk3588")
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    npu = [row for row in rkcompile.accuracy_analysis(plan, x) if row.device == "npu"]
    assert npu[0].single == npu[0].cosine < 1


# ---- the zoo CNNs ---------------------------------------------------------------------------

CNNS = ["resnet18_halfwidth", "squeezenet1_1", "lraspp_mobilenet_v3_large", "yolov8n",
        pytest.param("mobilenet_v2", marks=pytest.mark.xfail(
            strict=True, reason="0.979 measured (rknn-toolkit2 2.5.0: 0.979): with its seeded random weights "
                                "the network amplifies int8 noise layer by layer (docs/quantization.md)"))]


#: The hybrid recipe docs/quantization.md gives for mobilenet_v2: the input and the first two
#: inverted-residual blocks in float16, where its error is amplified most.
MOBILENET_V2_FLOAT16 = ("input@npu", "hardtanh", "hardtanh_1", "getitem_6", "hardtanh_2", "hardtanh_3", "getitem_15")


def zoo_int8_cosines(model: str, tmp_path: Path, *extra: str) -> list[dict]:
    """The agreement of `rkcompile run --dtype int8` with onnxruntime on the model's npz input,
    calibrated on that input and its seeded variations."""
    data = np.load(ZOO / f"{model}.npz")
    (name,) = [spec.name for spec in compile_model(ZOO / f"{model}.onnx", "rk3588", Options())[0].model.inputs]
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, sample in enumerate([data[name]] + seeded_variations(data[name])):
        np.save(folder / f"{i}.npy", sample)
    report = tmp_path / "report.json"
    main(["run", str(ZOO / f"{model}.onnx"), "--target", "rk3588", "--dtype", "int8", "--calib", str(folder),
          "--inputs", str(ZOO / f"{model}.npz"), "--check", "--json", str(report), *extra])
    return json.loads(report.read_text())["agreement"]


@pytest.mark.slow
@pytest.mark.skipif(not ZOO.is_dir(), reason="../shared/zoo is not present")
@pytest.mark.parametrize("model", CNNS)
def test_zoo_cnn_at_int8_reaches_cosine_099(model, tmp_path):
    agreements = zoo_int8_cosines(model, tmp_path)
    assert all(a["cosine"] >= 0.99 for a in agreements), agreements


@pytest.mark.slow
@pytest.mark.skipif(not ZOO.is_dir(), reason="../shared/zoo is not present")
def test_zoo_mobilenet_v2_reaches_cosine_099_with_its_first_blocks_in_float16(tmp_path):
    extra = [flag for name in MOBILENET_V2_FLOAT16 for flag in ("--float16", name)]
    agreements = zoo_int8_cosines("mobilenet_v2", tmp_path, *extra)
    assert all(a["cosine"] >= 0.99 for a in agreements), agreements


def test_an_int8_plan_without_calibration_data_reads_and_warns_once(cnn, caplog):
    """Choosing the int8 settings plans the model several times (each equalization setting
    calibrates, and a judge compares the candidates): all of them share one set of samples."""
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        rkcompile.compile(cnn, "rk3588", dtype="int8")
    assert sum("int8 without --calib" in record.getMessage() for record in caplog.records) == 1


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_infinite_constant_value_saturates_to_the_grid_of_the_finite_ones(per_channel):
    """An attention mask's -inf has no grid step: the grid spans the finite values and 0 (it
    crashed with a NaN zero point), the infinite value stores as the grid's end, and the plan's
    warning says so."""
    finite = np.array([[0.0, 1.5, -2.0, 0.25], [3.0, 0.0, -1.0, 0.5]])
    masked = finite.copy()
    masked[0, 1], masked[1, 3] = -np.inf, np.inf
    quant = weight_params(masked, per_channel, "constant mask")
    assert quant.warning == "constant mask holds 2 infinite value(s): stored as int8 they saturate to the ends of its grid"
    replaced = np.where(np.isinf(masked), 0.0, masked)
    assert dataclasses.replace(quant, warning=None) == weight_params(replaced, per_channel)
    stored = quantize(masked, quant)
    assert stored[0, 1] == -128 and stored[1, 3] == 127
    assert np.array_equal(stored[np.isfinite(masked)], quantize(finite, quant)[np.isfinite(masked)])


def test_a_nan_constant_value_is_refused_by_name():
    with pytest.raises(CompileError, match=r"^int8: constant w holds 1 NaN value\(s\), which int8 cannot store"):
        weight_params(np.array([1.0, np.nan, -2.0]), False, "constant w")
