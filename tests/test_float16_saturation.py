"""Constants beyond float16's range, stored for an NPU step: saturated, with a warning naming them."""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkcompile.api import prepare
from rkcompile.options import Options
from rkcompile.emulator import emulate
from rkcompile.numerics.float16 import beyond_range, saturate

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
