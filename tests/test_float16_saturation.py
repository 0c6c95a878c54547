"""Constants beyond float16's range, stored for an NPU step: saturated, with a warning naming them."""
from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkcompile.api import prepare
from rkcompile.options import Options
from rkcompile.emulator import emulate
from rkcompile.numerics.float16 import beyond_range, overflow, saturate

FLOAT32_LOWEST = float(np.finfo(np.float32).min)  # torch.finfo(torch.float32).min, the usual mask fill


def test_saturate_clamps_finite_values_and_keeps_infinities_and_nan():
    values = np.array([FLOAT32_LOWEST, 7e4, -1.5, 65504, np.inf, -np.inf, np.nan], np.float32)
    out = saturate(values, "float16")
    np.testing.assert_array_equal(out, np.array([-65504, 65504, -1.5, 65504, np.inf, -np.inf, np.nan], np.float32))
    assert out.dtype == np.float32
    assert saturate(np.float32(FLOAT32_LOWEST), "float16") == -65504  # a scalar constant, as exported masks hold
    in_range = np.array([1.0, -65504.0], np.float32)
    assert saturate(in_range, "float16") is in_range
    assert beyond_range(values, "float32").size == 0


def _masked_softmax_model(path, fill: float):
    """Softmax over scores where a mask input is below 0.5, filled with `fill` (a torch masked_fill)."""
    nodes = [helper.make_node("Less", ["mask", "half"], ["masked"]),
             helper.make_node("Where", ["masked", "fill", "scores"], ["filled"]),
             helper.make_node("Softmax", ["filled"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "masked_softmax",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 8]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
        [numpy_helper.from_array(np.array(fill, np.float32), "fill"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize("fill", [FLOAT32_LOWEST, -1e5])
def test_fully_masked_softmax_rows_match_onnxruntime_and_the_plan_warns(tmp_path, caplog, fill):
    import onnxruntime

    model = _masked_softmax_model(tmp_path / "m.onnx", fill)
    rng = np.random.default_rng(0)
    mask = (rng.random((1, 4, 8)) > 0.3).astype(np.float32)
    mask[0, 0] = 0  # a fully masked row: onnxruntime gives a uniform row, float16 -inf gives NaN
    inputs = {"scores": rng.standard_normal((1, 4, 8)).astype(np.float32), "mask": mask}
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        prepared = prepare(model, "rk3588", Options())
    assert prepared.plan.tensors["fill"].dtype == "float16"
    assert any("constant fill" in r.getMessage() and "float16 range" in r.getMessage() for r in caplog.records)
    result = emulate(prepared, inputs).outputs["y"]
    expected = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    assert np.isfinite(result).all()
    np.testing.assert_allclose(result, expected, atol=2e-3)


def test_a_constant_in_float16_range_gives_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        prepare(_masked_softmax_model(tmp_path / "m.onnx", -10000.0), "rk3588", Options())
    assert not [r for r in caplog.records if "float16 range" in r.getMessage()]


def test_a_broadcast_constant_is_inspected_and_saturated_without_expanding_it():
    huge = np.broadcast_to(np.array([FLOAT32_LOWEST, 1.0], np.float32), (100_000, 100_000, 2))
    assert beyond_range(huge, "float16").tolist() == [FLOAT32_LOWEST]
    out = saturate(huge, "float16")
    assert out.shape == huge.shape and out[5, 7].tolist() == [-65504.0, 1.0]


def _variance_model(path):
    """A written-out LayerNorm's variance: (x - mean)^2 averaged. Its squares of values in the
    hundreds pass float16's range although x itself and float32's answer do not."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["centered"]),
             helper.make_node("Mul", ["centered", "centered"], ["squares"]),
             helper.make_node("ReduceMean", ["squares"], ["variance"], axes=[-1])]
    graph = helper.make_graph(nodes, "variance", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
                              [helper.make_tensor_value_info("variance", TensorProto.FLOAT, [1, 8, 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_overflow_counts_the_values_float16_turns_into_infinities():
    values = np.array([1.0, 65504, 65519.99, 65520, -7e4, np.inf, np.nan], np.float32)
    assert overflow(values, "float16") == (2, 7e4)  # 65519.99 still rounds to 65504
    assert overflow(values[:3], "float16") is None
    assert overflow(np.array([np.nan, 1.0], np.float32), "float16") is None
    assert overflow(values, "float32") is None


def test_a_step_overflowing_float16_is_named_by_run_and_the_api(tmp_path, capsys):
    import rkcompile
    from rkcompile.cli import main

    model = _variance_model(tmp_path / "variance.onnx")
    x = np.random.default_rng(0).uniform(-900, 900, (1, 8, 64)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    report = tmp_path / "report.json"
    main(["run", str(model), "--target", "rk3588", "--inputs", str(tmp_path / "x.npz"), "--json", str(report)])
    plan = rkcompile.compile(model, target="rk3588")
    squares = next(step for step in plan.record.steps if "squares" in step.outputs)
    assert plan.record.tensors["squares"].dtype == "float16"  # the step this test is about
    warned = [line for line in capsys.readouterr().err.splitlines() if "float16 overflow" in line]
    assert len(warned) == 1 and f"step {squares.id} " in warned[0] and "squares" in warned[0]
    assert json.loads(report.read_text())["float16_overflows"] == [warned[0].split(" at ", 1)[1]]
    with pytest.warns(RuntimeWarning, match=f"step {squares.id} .*squares"):
        rkcompile.run(plan, {"x": x})
    small = {"x": x / 100}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rkcompile.run(plan, small)


def test_an_accumulator_overflowing_inside_a_fused_step_is_named(tmp_path):
    """Conv -> Sigmoid runs as one ConvSigmoid whose conv result leaves the accumulator as
    float16: past 65520 it is an infinity the Sigmoid turns back into a finite 1, so nothing
    stored shows it; the run names the step."""
    import rkcompile

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])], "conv_sigmoid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [numpy_helper.from_array(np.full((2, 4, 1, 1), 30000, np.float32), "w")])
    model = tmp_path / "conv_sigmoid.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), model)
    plan = rkcompile.compile(model, target="rk3588")
    (step,) = [s for s in plan.record.steps if s.device == "npu"]
    assert step.kernel == "ConvSigmoid"
    with pytest.warns(RuntimeWarning, match=f"step {step.id} ConvSigmoid -> its accumulator result: 32 values"):
        y = rkcompile.run(plan, {"x": np.ones((1, 4, 4, 4), np.float32)})["y"]
    assert np.all(y == 1)
