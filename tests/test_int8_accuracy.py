"""int8 accuracy techniques (passes/int8_accuracy.py): cross-layer equalization is exact in float
and balances the pair's weights; bias correction lowers a quantized layer's mean error; both are
recorded in the plan, shown in the summary, and survive the .rkplan round trip."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper

import rkcompile
import rkcompile.errors
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.options import PREFERRED_INT8
from rkcompile.compiler.auto_float16 import STRATEGIES, Search, choose, judge_for
from rkcompile.compiler.pipeline import finish_plan, front_half
from rkcompile.emulator import onnxruntime_outputs
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.emulator.kernels._windows import output_sizes, spatial_pads, tap_spans
from rkcompile.emulator.kernels.conv import convolve, tap_means
from rkcompile.passes.int8_accuracy import WeightErrorMeans, corrected_bias, weight_error
from rkcompile.plan.plain_nodes import Constant

rng = np.random.default_rng(19)


def vi(name, shape):
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def uneven(shape, axis=0):
    """Random weights whose channels along `axis` span ranges 100x apart (what equalization evens)."""
    spread = np.ones(len(shape), int)
    spread[axis] = shape[axis]
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-2.3, 2.3, spread))).astype(np.float32)


@pytest.fixture
def chain(tmp_path) -> Path:
    """Conv -> Relu -> depthwise Conv -> LeakyRelu -> MaxPool -> Conv (two equalizable pairs, one
    through a pooling step), then -> Clip (ReLU6) -> Conv (declined) and -> Conv with a second
    reader (not a pair)."""
    weights = {"w1": uneven((8, 3, 3, 3)), "b1": rng.standard_normal(8).astype(np.float32),
               "w2": uneven((8, 1, 3, 3)), "b2": rng.standard_normal(8).astype(np.float32),
               "w3": uneven((6, 8, 1, 1), axis=1), "b3": rng.standard_normal(6).astype(np.float32),
               "w4": uneven((4, 6, 3, 3), axis=1), "b4": rng.standard_normal(4).astype(np.float32),
               "zero": np.array(0, np.float32), "six": np.array(6, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("LeakyRelu", ["c2"], ["r2"], alpha=0.1),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p2", "w3", "b3"], ["c3"]),
             helper.make_node("Clip", ["c3", "zero", "six"], ["r3"]),
             helper.make_node("Conv", ["r3", "w4", "b4"], ["y"], pads=[1, 1, 1, 1])]
    return _save(tmp_path, "chain", nodes, [1, 3, 16, 16], [1, 4, 8, 8], weights)


def _save(folder: Path, name: str, nodes, x_shape, y_shape, weights: dict[str, np.ndarray]) -> Path:
    """The model x -> nodes -> y with `weights` as initializers, saved as folder/name.onnx."""
    graph = helper.make_graph(nodes, name, [vi("x", x_shape)], [vi("y", y_shape)],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


#: a calibration sample this many times the others overflows float16 inside `chain` (quarter-octave
#: steps: with some weights the output overflows at once, with others an inner tensor first)
OUTLIER_SCALES = tuple(round(100 * 2 ** (k / 4)) for k in range(21))


def _calibration(tmp_path: Path) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"{i}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    return folder


def _technique(plan, name):
    (found,) = [t for t in plan.record.int8_techniques if t.name == name]
    return found


def _constants(plan, float_reference: bool = False) -> dict[str, np.ndarray]:
    """The constants the plan stores (dequantized), or those its float32 reference computes with."""
    nodes = plan.reference_nodes if float_reference else plan.step_nodes()
    return {t.name: np.asarray(t.values) for node in nodes for t in node.inputs if isinstance(t, Constant)}


def test_equalization_is_exact_in_float_and_evens_the_pairs(chain, tmp_path):
    calibration = _calibration(tmp_path)
    plain = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, calibration_method="minmax",
                              equalization=False, bias_correction=False)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, calibration_method="minmax",
                             equalization=True, bias_correction=False)
    technique = _technique(plan, "equalization")
    assert len(technique.applied) == 2, technique
    assert any("Clip (ReLU6)" in reason for reason in technique.declined), technique.declined
    # before quantization the equalized graph computes what the model computes
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    reference = FloatReference(plan.reference_nodes, [s.device for s in plan.record.steps],
                               plan.record.model.opset, ["y"]).run(x)["y"]
    expected = onnxruntime_outputs(chain, x)["y"]
    assert np.abs(reference - expected).max() <= 1e-4 * np.abs(expected).max()
    # ... with the weights changed: each pair's channel ranges are now the same on both sides
    # (in float: int8 weights need not reach a channel's peak exactly)
    before, after = _constants(plain, float_reference=True), _constants(plan, float_reference=True)
    assert not np.allclose(before["w1"], after["w1"])
    first = np.abs(after["w1"]).reshape(8, -1).max(axis=1)
    second = np.abs(after["w2"]).reshape(8, -1).max(axis=1)  # depthwise: input channel i is output i
    np.testing.assert_allclose(first, second, rtol=1e-3)
    assert np.allclose(before["w4"], after["w4"])  # behind the declined Clip: untouched
    assert "equalization: 2 Conv pairs equalized" in plan.summary()
    assert "int8 techniques             none" in plain.summary()


def test_an_equalized_plan_is_calibrated_as_its_own_graph_computes(chain, tmp_path):
    """The calibration run is the model's own weights'; an equalized plan takes the tensors
    between each pair's Convs divided by the pair's scales. Its ranges are what observing its
    own (equalized) graph gives, to float32 rounding."""
    from rkcompile.quantization.params import activation_params
    from rkcompile.targets import get_target

    calibration = _calibration(tmp_path)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, calibration_method="minmax",
                             equalization=True, bias_correction=False)
    record = plan.record
    low, high = {}, {}

    def visit(name, value):
        low[name] = min(low.get(name, np.inf), float(value.min()))
        high[name] = max(high.get(name, -np.inf), float(value.max()))

    equalized = FloatReference(plan.reference_nodes, [s.device for s in record.steps], record.model.opset, ["y"],
                               observed=set(record.quantization))
    for path in sorted(calibration.glob("*.npy")):
        equalized.run({"x": np.load(path)}, visit)
    own = {name: quant for name, quant in record.quantization.items()
           if name in low and quant.source == "minmax" and record.tensors[name].region != "weight"}
    assert {"r1", "r2"} <= own.keys()  # the pairs' first steps' outputs: divided by their scales
    for name, quant in own.items():
        expected = activation_params(low[name], high[name], "minmax",
                                     get_target(record.target).allows_activation_zero_point_0)
        np.testing.assert_allclose(quant.scales, expected.scales, rtol=1e-5, err_msg=name)


def test_tap_means_divided_are_those_of_the_divided_input():
    """`WeightErrorMeans.divide_inputs`, how an equalized plan takes the tap means of a tensor
    its pair divides, gives what observing the divided tensor gives."""
    conv = gs.Node("Conv", "conv", attrs={"pads": [1, 1, 1, 1], "group": 4},
                   inputs=[gs.Variable("x"), gs.Constant("w", uneven((4, 1, 3, 3))), gs.Constant("b", np.ones(4))],
                   outputs=[gs.Variable("y")])
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    scale = np.exp(rng.uniform(-2, 2, 4))
    divided, observed = WeightErrorMeans({"k": (conv, "x")}), WeightErrorMeans({"k": (conv, "x")})
    divided.observe("x", x)
    divided.settle(EMULATOR_RUNTIME.tap_means)
    kept = divided.copy()
    divided.divide_inputs({"x": scale})
    observed.observe("x", (x / scale.reshape(1, 4, 1, 1)).astype(np.float32))
    observed.settle(EMULATOR_RUNTIME.tap_means)
    np.testing.assert_allclose(divided.means()["k"], observed.means()["k"], rtol=1e-6)
    assert not np.allclose(kept.means()["k"], divided.means()["k"])  # the copy kept its own sums


def test_equalization_sweeps_on_channel_peaks_as_on_the_weights():
    """`settle` sweeps each weight's largest |value| per (output, input) channel instead of the
    weights: the scales and the equalized weights are those sweeping the whole weights gives,
    through a chain of pairs (the middle Conv, depthwise, scaled on both sides)."""
    import onnx_graphsurgeon as gs

    from rkcompile.passes.int8_accuracy import SETTLED, SWEEPS, Equalization, Pair, apply, settle

    weights = {"w1": uneven((6, 4, 3, 3)), "b1": rng.standard_normal(6), "w2": uneven((6, 1, 3, 3)),
               "b2": rng.standard_normal(6), "w3": uneven((5, 6, 1, 1), axis=1)}
    x, y1, y2, y3 = (gs.Variable(name) for name in ("x", "y1", "y2", "y3"))
    first = gs.Node("Conv", "first", inputs=[x, gs.Constant("w1", weights["w1"]), gs.Constant("b1", weights["b1"])],
                    outputs=[y1])
    middle = gs.Node("Conv", "middle", attrs={"group": 6},
                     inputs=[y1, gs.Constant("w2", weights["w2"]), gs.Constant("b2", weights["b2"])], outputs=[y2])
    last = gs.Node("Conv", "last", inputs=[y2, gs.Constant("w3", weights["w3"])], outputs=[y3])
    found = Equalization(pairs=[Pair(first, first, middle, middle), Pair(middle, middle, last, last)])
    settle(found)
    apply(found)

    expected = {name: np.array(values, np.float64) for name, values in weights.items()}
    totals = [np.ones(6), np.ones(6)]
    for _ in range(SWEEPS):  # the sweep over whole weights, in float64
        largest = 0.0
        for index, (one, two, bias, groups) in enumerate((("w1", "w2", "b1", 6), ("w2", "w3", "b2", 1))):
            r1 = np.abs(expected[one]).reshape(6, -1).max(axis=1)
            by_channel = expected[two].reshape(groups, -1, 6 // groups, expected[two][0, 0].size)
            taps = np.abs(by_channel).max(axis=(1, 3)).reshape(6)
            scale = np.sqrt(r1 / taps)
            largest = max(largest, float(np.abs(np.log(scale)).max()))
            totals[index] = totals[index] * scale
            expected[one] = expected[one] / scale.reshape(-1, 1, 1, 1)
            expected[two] = (by_channel * scale.reshape(groups, 1, 6 // groups, 1)).reshape(expected[two].shape)
            expected[bias] = expected[bias] / scale
        if largest < SETTLED:
            break
    for total, scale in zip(totals, found.scales):
        np.testing.assert_allclose(scale, total, rtol=1e-9)
    assert not np.allclose(totals[0], 1) and not np.allclose(totals[1], 1)
    for node in (first, middle, last):
        for tensor in node.inputs[1:]:
            np.testing.assert_allclose(tensor.values, expected[tensor.name], rtol=1e-6, err_msg=tensor.name)


def test_bias_correction_reduces_the_mean_error_of_a_synthetic_layer():
    conv = gs.Node("Conv", "conv", attrs={"pads": [1, 1, 1, 1]},
                   inputs=[gs.Variable("x"), gs.Constant("w", uneven((16, 8, 3, 3))), gs.Constant("b", np.zeros(16, np.float32))],
                   outputs=[gs.Variable("y")])
    weight = conv.inputs[1].values
    # post-ReLU-like inputs with a channel-dependent mean: the rounded weights' error does not average out
    def sample():
        return np.maximum(rng.standard_normal((1, 8, 12, 12)) + rng.uniform(0, 2, (1, 8, 1, 1)), 0).astype(np.float32)
    means = WeightErrorMeans({"conv": (conv, "x")})
    for _ in range(8):
        means.observe("x", sample())
    means.settle(EMULATOR_RUNTIME.tap_means)
    bias = corrected_bias(np.zeros(16), means.means()["conv"])
    rounded = weight + weight_error(weight)
    held_out = np.concatenate([sample() for _ in range(8)])
    exact = convolve(conv, held_out, weight)
    error_before = (convolve(conv, held_out, rounded) - exact).mean(axis=(0, 2, 3))
    error_after = (convolve(conv, held_out, rounded) + bias.reshape(1, -1, 1, 1) - exact).mean(axis=(0, 2, 3))
    assert np.abs(error_after).mean() < 0.5 * np.abs(error_before).mean()


@pytest.mark.parametrize("attrs, channels, weight_shape", [
    ({"pads": [1, 1, 1, 1]}, 8, (16, 8, 3, 3)),
    ({"strides": [2, 2], "pads": [0, 1, 2, 1]}, 8, (16, 8, 3, 3)),  # uneven pads, a stride
    ({"dilations": [2, 1], "pads": [2, 0, 2, 0]}, 8, (6, 8, 3, 2)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, 8, (8, 8, 4, 4)),
    ({"group": 4, "pads": [1, 1, 1, 1]}, 8, (12, 2, 3, 3)),  # grouped
    ({"group": 8, "pads": [1, 1, 1, 1], "strides": [2, 2]}, 8, (16, 1, 3, 3)),  # depthwise, multiplier 2
])
def test_bias_correction_shift_is_the_mean_of_the_error_convolution(attrs, channels, weight_shape):
    """The shift measured from per-tap input means is the calibration inputs' mean of the
    convolution of the weights' rounding error, whatever the Conv's geometry."""
    conv = gs.Node("Conv", "conv", attrs=attrs,
                   inputs=[gs.Variable("x"), gs.Constant("w", uneven(weight_shape)), gs.Constant("b", np.zeros(weight_shape[0], np.float32))],
                   outputs=[gs.Variable("y")])
    samples = [(rng.standard_normal((1, channels, 11, 13)) + rng.uniform(0, 2, (1, channels, 1, 1))).astype(np.float32)
               for _ in range(3)]
    means = WeightErrorMeans({"conv": (conv, "x")})
    for x in samples:
        means.observe("x", x)
    means.settle(EMULATOR_RUNTIME.tap_means)
    error = weight_error(conv.inputs[1].values)
    expected = np.mean([convolve(conv, x.astype(np.float64), error).mean(axis=(0, 2, 3)) for x in samples], axis=0)
    # the depthwise kernel sums in float32 whatever its inputs
    np.testing.assert_allclose(means.means()["conv"], expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("attrs, kernel, size", [
    ({"pads": [1, 1, 1, 1]}, (3, 3), (11, 13)),
    ({"strides": [2, 3], "pads": [3, 0, 2, 1]}, (7, 5), (16, 17)),  # each stride's grids, uneven pads
    ({"dilations": [3, 2], "pads": [4, 2, 0, 3]}, (3, 4), (9, 10)),
    ({"strides": [4, 1], "pads": [2, 0, 2, 0]}, (2, 1), (3, 5)),  # a tap that reads only padding
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (4, 4), (8, 7)),
])
def test_tap_means_are_the_direct_mean_of_each_tap(attrs, kernel, size):
    """Each tap's mean over the positions it reads is the one its own slice sums to, to the last
    bit (values on a grid that float64 sums exactly, so any order of summing agrees): the sum of
    each stride grid less the positions outside the tap misses or adds none."""
    conv = gs.Node("Conv", "conv", attrs=attrs)
    # positive, so a mean is 0 only where its tap reads only padding
    x = ((np.round(np.abs(rng.standard_normal((2, 3) + size)) * 64) + 1) / 64).astype(np.float32)
    begin, end = spatial_pads(conv, size, kernel, attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]))
    out_sizes = output_sizes(size, kernel, attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), begin, end)
    expected = np.zeros((3,) + kernel)
    for tap in np.ndindex(*kernel):
        found = tap_spans(size, out_sizes, tap, attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]), begin)
        if found is not None:
            expected[(slice(None),) + tap] = x[(slice(None), slice(None)) + found[1]].sum((0, 2, 3), np.float64)
    means = tap_means(conv, x, kernel)
    assert np.array_equal(means, expected / (2 * np.prod(out_sizes)))
    assert (means == 0).any() == (kernel == (2, 1))


def test_bias_correction_keeps_the_model_bias_as_the_float_reference(chain, tmp_path):
    calibration = _calibration(tmp_path)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, **PREFERRED_INT8)  # on
    technique = _technique(plan, "bias_correction")
    assert len(technique.applied) == 4
    planned = _constants(plan)
    assert not np.allclose(planned["b1"], onnx.numpy_helper.to_array(
        [i for i in onnx.load(str(chain)).graph.initializer if i.name == "b1"][0]))
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    reference = FloatReference(plan.reference_nodes, [s.device for s in plan.record.steps],
                               plan.record.model.opset, ["y"]).run(x)["y"]
    expected = onnxruntime_outputs(chain, x)["y"]
    assert np.abs(reference - expected).max() <= 1e-4 * np.abs(expected).max()
    # the artifact carries the corrected plan and the model's bias for its reference
    saved = rkcompile.load(plan.save(tmp_path / "chain.rkplan"))
    assert saved.record.int8_techniques == plan.record.int8_techniques
    np.testing.assert_array_equal(rkcompile.run(saved, x)["y"], rkcompile.run(plan, x)["y"])
    assert rkcompile.accuracy_analysis(saved, x) == rkcompile.accuracy_analysis(plan, x)


def _two_convs_sharing_a_bias(tmp_path, bias: np.ndarray):
    """x -> Conv(w1, shared) -> Relu -> Conv(w2 30x larger, shared) -> y: (model path, weights)."""
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
               "w2": (rng.standard_normal((8, 8, 3, 3)) * 30).astype(np.float32), "shared": bias}
    nodes = [helper.make_node("Conv", ["x", "w1", "shared"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "shared"], ["y"], pads=[1, 1, 1, 1])]
    return _save(tmp_path, "shared_bias", nodes, [1, 3, 16, 16], [1, 8, 16, 16], weights), weights


def _calibration_folder(tmp_path, samples: list[np.ndarray]) -> Path:
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, sample in enumerate(samples):
        np.save(folder / f"{i}.npy", sample)
    return folder


def test_bias_correction_gives_each_reader_of_a_shared_bias_its_own_correction(tmp_path):
    """Exporters store equal biases once (the zero bias of every Conv with as many channels is
    one initializer): each Conv reading it has its own inputs and rounded weights, so its own
    shift, and the other readers' biases must not take it."""
    path, weights = _two_convs_sharing_a_bias(tmp_path, np.zeros(8, np.float32))
    # inputs with a mean per channel, so the rounded weights' error does not average out
    samples = [(rng.uniform(0, 1, (1, 3, 16, 16)) + [[[[0.5]], [[1.0]], [[2.0]]]]).astype(np.float32)
               for _ in range(3)]
    calibration = _calibration_folder(tmp_path, samples)
    plan = rkcompile.compile(path, "rk3588", dtype="int8", calibration=calibration, **PREFERRED_INT8)
    assert len(_technique(plan, "bias_correction").applied) == 2
    first = gs.Node("Conv", "first", attrs={"pads": [1, 1, 1, 1]})  # both Convs' geometry
    first_inputs = samples
    second_inputs = [np.maximum(convolve(first, x, weights["w1"]), 0) for x in samples]
    expected = [-np.mean([convolve(first, x, weight_error(w).astype(np.float32)).mean(axis=(0, 2, 3))
                          for x in inputs], axis=0)
                for w, inputs in ((weights["w1"], first_inputs), (weights["w2"], second_inputs))]
    planned = [t for node in plan.step_nodes() for t in node.inputs
               if isinstance(t, Constant) and t.name.startswith("shared")]
    assert len(planned) == 2
    steps = [np.asarray(plan.record.quantization[bias.name].scales) for bias in planned]
    assert np.abs(expected[0] - expected[1]).max() > 4 * max(step.max() for step in steps)  # one bias cannot serve both
    for bias, shift, step in zip(planned, expected, steps):  # within half a step of the int32 bias
        assert np.all(np.abs(np.asarray(bias.values) - shift) <= step / 2 * 1.001)
    # the float reference keeps the model's zero bias for both
    x = {"x": samples[0]}
    reference = FloatReference(plan.reference_nodes, [s.device for s in plan.record.steps],
                               plan.record.model.opset, ["y"]).run(x)["y"]
    exact = onnxruntime_outputs(path, x)["y"]
    assert np.abs(reference - exact).max() <= 1e-4 * np.abs(exact).max()
    saved = rkcompile.load(plan.save(tmp_path / "shared_bias.rkplan"))  # the copies survive the artifact
    np.testing.assert_array_equal(rkcompile.run(saved, x)["y"], rkcompile.run(plan, x)["y"])
    assert rkcompile.accuracy_analysis(saved, x) == rkcompile.accuracy_analysis(plan, x)


def _search(model, options, wanted: float, strategy: str = "sensitivity") -> Search:
    """--auto-float16's search for `wanted` on `model` with `options`, as the int8 stage runs it."""
    return choose(judge_for(front_half(model, "rk3588", options, EMULATOR_RUNTIME), finish_plan), wanted, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_auto_float16_reaches_its_target_with_float16_steps(chain, tmp_path, strategy):
    calibration = _calibration(tmp_path)
    options = rkcompile.Options(dtype="int8", calibration=calibration, **PREFERRED_INT8)
    start = _search(chain, options, 0.0, strategy)
    assert start.chosen == () and start.cosine < 0.9999  # int8 alone misses the target below
    wanted = 1 - (1 - start.cosine) / 4
    search = _search(chain, options, wanted, strategy)
    assert search.targets == tuple(min(wanted, cosine) for cosine in search.all_float16_cosines)
    assert search.cosine >= min(search.targets) and search.chosen
    assert all(cosine >= target for cosine, target in zip(search.cosines, search.targets))
    assert all(search.plan.record.tensors[name].dtype == "float16" for name in search.chosen)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_auto_float16_holds_each_sample_to_its_own_target(chain, tmp_path, strategy):
    """An outlier sample float16 itself computes badly (large enough to overflow float16 inside
    the network before its Clip) lowers the target on that sample only: every other sample must
    still reach the cosine asked."""
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    for scale in OUTLIER_SCALES:  # the first at which float16 loses accuracy on it
        (tmp_path / f"x{scale}").mkdir()
        outlier = [*samples[:1], scale * samples[1], *samples[2:]]
        options = rkcompile.Options(dtype="int8", calibration=_calibration_folder(tmp_path / f"x{scale}", outlier),
                                    **PREFERRED_INT8)
        start = _search(chain, options, 0.0, strategy)
        outlier_float16, others = start.all_float16_cosines[1], np.delete(start.all_float16_cosines, 1)
        if outlier_float16 < 0.9999 < others.min():
            break
    else:
        pytest.fail(f"float16 computes no scaled sample badly: {start.all_float16_cosines}")
    # above the outlier's float16 cosine (-inf where float16 overflows at the output), below the others'
    wanted = (max(outlier_float16, 0.9999) + others.min()) / 2
    search = _search(chain, options, wanted, strategy)
    assert search.chosen and min(search.cosines) < wanted  # the outlier misses what was asked...
    assert search.targets == (wanted, outlier_float16, wanted, wanted)
    assert all(cosine >= min(wanted, float16) for cosine, float16 in zip(search.cosines, search.all_float16_cosines))
    assert all(cosine >= wanted for i, cosine in enumerate(search.cosines) if i != 1)  # ...the others do not
    note = search.technique.note
    assert (f"(reached target {wanted:.6f} on 3 of 4 samples, the all-float16 plan's cosine on the rest: "
            f"sample 2 {outlier_float16:.6f})") in note


@pytest.fixture
def observed_runs(monkeypatch) -> list[list[str]]:
    """The inputs of each float32 run that observes its tensors (a calibration run), in order."""
    runs = []
    run = FloatReference.run

    def counted(self, inputs, visit=None, adjust=None):
        if visit is not None:
            runs.append(sorted(inputs))
        return run(self, inputs, visit, adjust)

    monkeypatch.setattr(FloatReference, "run", counted)
    return runs


@pytest.mark.parametrize("equalization", [False, True])
def test_auto_float16_calibrates_once_and_plans_each_candidate_as_a_fresh_compile(chain, tmp_path, observed_runs,
                                                                                   equalization):
    """The calibration run (the float32 pass with an observer) happens once per search, not once
    per candidate plan, and the plan it chose is the plan a compile with those tensors gives
    (equalized weights too: each candidate starts from the unequalized graph)."""
    options = rkcompile.Options(dtype="int8", calibration=_calibration(tmp_path),
                                **{**PREFERRED_INT8, "equalization": equalization})
    start = _search(chain, options, 0.0)
    assert len(observed_runs) == 3  # one pass over the 3 calibration samples
    search = _search(chain, options, 1 - (1 - start.cosine) / 4)
    assert search.plans_judged > 3 and len(observed_runs) == 6
    fresh = rkcompile.compile(chain, "rk3588", dataclasses.replace(options, float16_tensors=search.chosen))
    assert search.chosen and fresh.record == search.plan.record and fresh.weights == search.plan.weights


def test_auto_float16_is_recorded_in_the_plan_and_the_summary(chain, tmp_path):
    calibration = _calibration(tmp_path)
    plan = rkcompile.compile(chain, "rk3588", dtype="int8", calibration=calibration, auto_float16=0.99999)
    technique = _technique(plan, "auto_float16")
    chosen = [entry.split(" (+")[0] for entry in technique.applied]
    assert chosen and all(plan.record.tensors[name].dtype == "float16" for name in chosen)
    assert "ms)" in technique.applied[0] and "reached target" in technique.note
    assert "float16: " + technique.applied[0] in plan.summary()
    with pytest.raises(rkcompile.errors.CompileError, match="int8"):
        rkcompile.compile(chain, "rk3588", auto_float16=0.999)


def test_a_bias_that_int32_cannot_hold_raises_the_weight_scale_instead_of_saturating(tmp_path):
    """A tiny input range and a large bias (a random-weight classifier whose logits are mostly
    its bias): at scale input x weight the bias would pass int32 and be clipped silently."""
    weights = {"w": rng.standard_normal((6, 3, 1, 1)).astype(np.float32),
               "b": np.array([1, -3, 5, 0.5, -2, 4], np.float32)}
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"])], "tiny",
                              [vi("x", [1, 3, 4, 4])], [vi("y", [1, 6, 4, 4])],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    folder = tmp_path / "calib"
    folder.mkdir()
    samples = [(rng.standard_normal((1, 3, 4, 4)) * 1e-6).astype(np.float32) for _ in range(3)]
    for i, sample in enumerate(samples):
        np.save(folder / f"{i}.npy", sample)
    plan = rkcompile.compile(path, "rk3588", dtype="int8", calibration=folder, **PREFERRED_INT8)
    produced = rkcompile.run(plan, {"x": samples[0]})["y"]
    expected = onnxruntime_outputs(path, {"x": samples[0]})["y"]
    (conv,) = [step for step in plan.record.steps if step.device == "npu"]
    step = plan.record.quantization[conv.outputs[0]].scales[0]
    assert np.abs(produced - expected).max() <= 0.51 * step  # the output's own int8 rounding only
    assert "int32 cannot hold" in plan.record.quantization["w"].warning


def test_cli_plans_with_auto_float16_and_refuses_it_without_int8(chain, tmp_path, capsys):
    from rkcompile.cli import main

    calibration = _calibration(tmp_path)
    assert main(["plan", str(chain), "--target", "rk3588", "--dtype", "int8", "--calib", str(calibration),
                 "--auto-float16", "0.99999", "--no-bias-correction", "--calib-method", "minmax",
                 "--no-equalization"]) == 0
    printed = capsys.readouterr().out
    assert "auto float16: " in printed and "    float16: " in printed and "bias correction" not in printed
    assert main(["plan", str(chain), "--target", "rk3588", "--auto-float16", "0.999"]) != 0
    assert "add --dtype int8" in capsys.readouterr().err
    assert main(["plan", str(chain), "--target", "rk3588", "--dtype", "int8", "--auto-float16", "2"]) != 0
    assert "error: --auto-float16 2.0: a cosine in (0, 1]" in capsys.readouterr().err


def test_equalization_leaves_the_arrays_it_read_untouched():
    """Equalization writes new constants; a float64 weight array it read (numpy hands back the same
    array for a float64 `asarray`) must keep its values for whoever else holds it."""
    import onnx_graphsurgeon as gs

    from rkcompile.passes.int8_accuracy import Equalization, Pair, apply, settle

    rng = np.random.default_rng(3)
    w1 = rng.normal(size=(4, 3, 1, 1)) * np.array([1, 10, 100, 1000]).reshape(4, 1, 1, 1)
    w2 = rng.normal(size=(2, 4, 1, 1))
    kept1, kept2 = w1.copy(), w2.copy()
    x, y, z = gs.Variable("x"), gs.Variable("y"), gs.Variable("z")
    first = gs.Node("Conv", "first", inputs=[x, gs.Constant("w1", w1)], outputs=[y])
    second = gs.Node("Conv", "second", inputs=[y, gs.Constant("w2", w2)], outputs=[z])
    found = Equalization(pairs=[Pair(first, first, second, second)])
    settle(found)
    assert np.allclose(first.inputs[1].values, kept1)  # settling leaves the graph as it is
    apply(found)
    assert not np.allclose(first.inputs[1].values, kept1)  # the pair was equalized
    assert np.array_equal(w1, kept1) and np.array_equal(w2, kept2)


@pytest.mark.parametrize("bias_correction", [False, True])
def test_convolutions_sharing_a_bias_each_add_it_at_their_own_scale(tmp_path, bias_correction):
    """An int8 bias is an int32 at its reader's input scale times weight scale, added to the
    accumulator unchanged; two Convs whose scales differ 30x reading one stored (non-zero) bias
    each get their own int32 copy at their own scale, with or without bias correction (one
    shared copy held the last reader's scale, which the NPU would add to the other's
    accumulator as is; the emulator rescales such a bias of an older plan)."""
    path, _ = _two_convs_sharing_a_bias(tmp_path, np.full(8, 5.0, np.float32))
    samples = [rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(3)]
    calibration = _calibration_folder(tmp_path, samples)
    plan = rkcompile.compile(path, "rk3588", dtype="int8", calibration=calibration,
                             **{**PREFERRED_INT8, "bias_correction": bias_correction})
    biases = [t.name for node in plan.step_nodes() for t in node.inputs
              if isinstance(t, Constant) and t.name.startswith("shared")]
    assert len(set(biases)) == 2
    quantization = plan.record.quantization
    for node in plan.step_nodes():
        if not any(t.name in biases for t in node.inputs):
            continue  # the host's conversions
        data, weight, bias = node.inputs[:3]
        np.testing.assert_allclose(quantization[bias.name].scales,
                                   np.multiply(quantization[data.name].scales, quantization[weight.name].scales))
    x = {"x": samples[0]}
    got, exact = rkcompile.run(plan, x)["y"].ravel(), onnxruntime_outputs(path, x)["y"].ravel()
    assert float(got @ exact / np.linalg.norm(got) / np.linalg.norm(exact)) > 0.999
