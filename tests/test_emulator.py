"""The emulator's storage, arena discipline, plan checks, kernel coverage and the `run` command."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from rkcompile.plan.allocation import verify_allocation
from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.api import prepare
from rkcompile.emulator import EmulationError, Executor, Storage, emulate, make_inputs
from rkcompile.emulator.registry import KERNELS
from rkcompile.ir.patterns import Pattern
from rkcompile.passes.fusion_table import TABLES
from rkcompile.plan.schema import PlanRecord, TensorPlacement
from rkcompile.targets import get_target
from rkcompile.targets.common import ONNX_TO_KERNEL

RK3588 = get_target("rk3588")
rng = np.random.default_rng(3)


def residual_model(channels: int = 29, size: int = 64) -> onnx.ModelProto:
    """x -> conv a -> relu -> conv b; y = a + b (fused as ConvAdd): `a` stays live while `r` is
    made. Big enough that the partition cost model keeps it on the NPU."""
    weights = [numpy_helper.from_array(rng.standard_normal((channels, c, 3, 3)).astype(np.float32) * 0.2, name)
               for name, c in (("w1", 3), ("w2", channels))]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "residual",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, channels, size, size])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def residual(tmp_path) -> Path:
    path = tmp_path / "residual.onnx"
    onnx.save(residual_model(), path)
    return path


def one_tensor_plan(placement: TensorPlacement) -> PlanRecord:
    """A plan skeleton holding one arena tensor, enough for Storage."""
    empty = PlanRecord.from_dict({
        "schema": "rkcompile.plan/1", "target": "rk3588", "dtype": "float16", "batch": 1,
        "model": {"path": "m", "sha256": "0", "opset": 17, "inputs": [], "outputs": []},
        "nodes": [], "steps": [], "tensors": {}, "partitions": [],
        "memory": {"arena_bytes": placement.offset + placement.bytes, "lower_bound_bytes": 0, "weight_bytes": 0},
        "multicore": {"cores": 1, "batch": 1}})
    return dataclasses.replace(empty, tensors={"t": placement})


def test_nc1hwc2_storage_puts_each_element_where_seed_003_says_and_zeroes_the_padding():
    n, c, h, w, c2 = 1, 13, 3, 5, RK3588.c2_for("float16")
    c1 = -(-c // c2)
    size = n * c1 * h * w * c2 * 2
    storage = Storage(one_tensor_plan(TensorPlacement((n, c, h, w), "float16", "NC1HWC2", size, "arena", 32)),
                      RK3588)
    storage.regions["arena"][:] = 0xFF  # stale bytes, as a reused arena holds
    value = rng.standard_normal((n, c, h, w)).astype(np.float16)
    storage.write("t", value)
    raw = storage.regions["arena"][32:32 + size].view(np.float16)
    for ci, hi, wi in [(0, 0, 0), (7, 2, 4), (8, 1, 3), (12, 2, 0)]:
        position = (((ci // c2) * h + hi) * w + wi) * c2 + ci % c2
        assert raw[position] == value[0, ci, hi, wi]
    padding = raw.reshape(c1, h, w, c2)[-1, :, :, c - (c1 - 1) * c2:]
    assert padding.size and not padding.any()
    np.testing.assert_array_equal(storage.read("t"), value)
    assert storage.regions["arena"][:32].tolist() == [0xFF] * 32  # nothing written before the offset


def test_storage_refuses_a_size_the_layout_does_not_need():
    storage = Storage(one_tensor_plan(TensorPlacement((1, 13, 2, 2), "float16", "NC1HWC2", 13 * 4 * 2, "arena", 0)),
                      RK3588)
    with pytest.raises(EmulationError, match="needs 128"):
        storage.write("t", np.zeros((1, 13, 2, 2), np.float16))


def test_every_plannable_op_and_fusion_member_has_an_emulator_kernel():
    def ops_in(pattern) -> set[str]:
        found = set(getattr(pattern, "ops", ()))
        for field in dataclasses.fields(pattern):
            value = getattr(pattern, field.name)
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, Pattern):
                    found |= ops_in(item)
        return found

    fused = {rule.kernel for table in TABLES for rule in table}
    members = set().union(*(ops_in(rule.pattern) for table in TABLES for rule in table))
    missing = (set(ONNX_TO_KERNEL) | members) - set(KERNELS) - fused
    assert not missing, f"no emulator kernel for {sorted(missing)}"


def test_residual_model_runs_on_the_npu_and_matches_onnx_reference(residual):
    from onnx.reference import ReferenceEvaluator

    prepared = prepare(residual, "rk3588", Options())
    assert [s.device for s in prepared.plan.steps].count("npu") >= 2
    inputs = make_inputs(prepared.plan, {})
    expected = ReferenceEvaluator(str(residual)).run(None, inputs)[0]
    result = emulate(prepared, inputs).outputs["y"]
    np.testing.assert_allclose(result, expected, rtol=2e-2, atol=2e-2 * np.abs(expected).max())


def test_two_live_tensors_made_to_overlap_fail_the_verifier_and_change_the_outputs(residual):
    prepared = prepare(residual, "rk3588", Options())
    plan = prepared.plan
    inputs = make_inputs(plan, {})
    good = emulate(prepared, inputs).outputs["y"]
    steps_reading = {name: [s.id for s in plan.steps if name in s.inputs] for name in plan.tensors}
    # a tensor still to be read (the skip branch) and one written while it waits
    waiting = next(name for name, readers in steps_reading.items()
                   if plan.tensors[name].region == "arena" and len(readers) >= 2)
    written = next(out for s in plan.steps if steps_reading[waiting][0] <= s.id < steps_reading[waiting][-1]
                   for out in s.outputs if plan.tensors[out].region == "arena" and out != waiting)
    tensors = dict(plan.tensors)
    tensors[written] = dataclasses.replace(tensors[written], offset=tensors[waiting].offset)
    arena = max(t.offset + t.bytes for t in tensors.values() if t.region == "arena")
    corrupt = dataclasses.replace(plan, tensors=tensors, memory=dataclasses.replace(plan.memory, arena_bytes=arena))
    assert any("overlap" in problem for problem in verify_allocation(corrupt))
    bad = Executor(corrupt, prepared.weights, RK3588).run(inputs).outputs["y"]
    assert np.abs(bad - good).max() > 0.1 * np.abs(good).max()


def test_a_saved_plan_must_match_the_model(residual, tmp_path):
    saved = tmp_path / "plan.json"
    assert main(["plan", str(residual), "--target", "rk3588", "--quiet", "--json", str(saved)]) == 0
    prepared = prepare(residual, "rk3588", Options(), saved)
    assert prepared.plan.steps == prepare(residual, "rk3588", Options()).plan.steps
    data = json.loads(saved.read_text())
    data["steps"][0]["kernel"] = "Other"
    saved.write_text(json.dumps(data))
    with pytest.raises(EmulationError, match="step 0 differs in kernel"):
        prepare(residual, "rk3588", Options(), saved)
    data["model"]["sha256"] = "0" * 64
    saved.write_text(json.dumps(data))
    with pytest.raises(EmulationError, match="sha256"):
        prepare(residual, "rk3588", Options(), saved)


def test_run_command_writes_outputs_and_report_and_checks(residual, tmp_path, capsys):
    outputs, report = tmp_path / "out.npz", tmp_path / "report.json"
    assert main(["run", str(residual), "--target", "rk3588", "--check", "--outputs", str(outputs),
                 "--json", str(report)]) == 0
    assert "vs onnxruntime" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["passed"] and data["agreement"][0]["cosine"] >= 0.9999 and data["random_inputs"] == ["x"]
    with np.load(outputs) as archive:
        assert archive["y"].shape == (1, 29, 64, 64)
    # the reference arrays in --inputs win over onnxruntime; a wrong one fails the check
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.ones((1, 3, 64, 64), np.float32), y=np.zeros((1, 29, 64, 64), np.float32))
    assert main(["run", str(residual), "--target", "rk3588", "--inputs", str(inputs), "--check"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--inputs", "missing.npz"], "does not exist"),
    (["--plan", "missing.json"], "does not exist"),
    (["--outputs", "/proc/rkcompile-test/out.npz"], "cannot write /proc/rkcompile-test/out.npz"),
])
def test_run_command_bad_input_is_one_line(residual, tmp_path, capsys, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(residual), "--target", "rk3588", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and err.count("\n") == 1


def test_inputs_of_the_wrong_shape_are_a_one_line_error(residual, tmp_path, capsys):
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.ones((1, 3, 8, 8), np.float32))
    assert main(["run", str(residual), "--target", "rk3588", "--inputs", str(inputs)]) == 1
    assert "input x has shape [1, 3, 8, 8]" in capsys.readouterr().err


def test_agreement_needs_nan_in_the_same_places_and_survives_denormal_outputs():
    from rkcompile.emulator import agreement

    reference = np.array([np.nan, 1.0, 2.0])
    assert agreement("y", np.array([np.nan, 1.0, 2.001]), reference).cosine > 0.9999
    assert agreement("y", np.array([np.inf, 1.0, 2.0]), reference).cosine == float("-inf")
    tiny = np.array([1e-309, 2e-309, -3e-309])
    assert agreement("y", tiny, tiny).cosine == pytest.approx(1.0)
    assert agreement("y", -tiny, tiny).cosine == pytest.approx(-1.0)
