"""int8 calibration as a user meets it (issue 17 items 4 and 5): its float32 pass on onnxruntime,
progress bars for calibration and accuracy analysis, and calibration data as users have it."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest

import rkcompile.emulator.float_reference as float_reference
from rkcompile.api import prepare
from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.emulator.accuracy import analyse
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.plan.aliases import with_views
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.compiler.pipeline import compile_model
from rkcompile.progress import quiet

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"  # NPU convolutions and an Erf on the CPU


def _input_spec():
    plan, _ = compile_model(EXAMPLE, "rk3588")
    return plan.model.inputs[0]


def _calibration(tmp_path: Path, count: int = 3) -> Path:
    spec = _input_spec()
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(count):
        np.save(folder / f"{i}.npy", np.random.default_rng(i).standard_normal(spec.shape).astype(np.float32))
    return folder


# ---- the float32 pass on onnxruntime ---------------------------------------------------------

def _every_tensor(reference: FloatReference, inputs) -> dict[str, np.ndarray]:
    seen = {}
    reference.run(inputs, lambda name, value: seen.setdefault(name, value))
    return seen


def test_calibration_runs_its_float_pass_on_onnxruntime_not_the_numpy_kernels(tmp_path, monkeypatch):
    def numpy_kernel(*_):
        raise AssertionError("the float pass ran an NPU node through the emulator's numpy kernels")

    monkeypatch.setattr(FloatReference, "_npu", numpy_kernel)
    plan, _ = compile_model(EXAMPLE, "rk3588", Options(dtype="int8", calibration=_calibration(tmp_path)),
                            runtime=EMULATOR_RUNTIME)
    assert plan.quantization


def test_the_whole_graph_session_sees_what_the_node_by_node_pass_sees(tmp_path):
    prepared = prepare(EXAMPLE, "rk3588", Options(dtype="int8", calibration=_calibration(tmp_path)))
    steps = prepared.plan.steps
    spec = prepared.plan.model.inputs[0]
    inputs = {spec.name: np.random.default_rng(7).standard_normal(spec.shape).astype(np.float32)}
    outputs = [s.name for s in prepared.plan.model.outputs]
    nodes, devices = with_views(prepared.plan, prepared.reference_nodes)  # aliases run as their views' nodes
    whole = FloatReference(nodes, devices, prepared.plan.model.opset, outputs)
    fast = _every_tensor(whole, inputs)
    assert whole.sessions and all(session is not None for session in whole.sessions.values())
    node_by_node = FloatReference(nodes, devices, prepared.plan.model.opset, outputs)
    node_by_node.sessions[next(iter(whole.sessions))] = None  # as for a graph onnxruntime cannot run
    slow = _every_tensor(node_by_node, inputs)
    assert list(fast) == list(slow) == [t.name for node in nodes for t in node.outputs if t.name]
    assert {name for step in steps for name in step.outputs} < set(fast)
    for name, value in slow.items():  # the same float32 values, up to the order of sums
        np.testing.assert_allclose(fast[name], value, rtol=1e-4, atol=1e-5 * float(np.abs(value).max()), err_msg=name)


def test_a_graph_onnxruntime_refuses_runs_node_by_node(tmp_path, monkeypatch):
    def refuse(model):
        raise RuntimeError("no kernel")

    options = Options(dtype="int8", calibration=_calibration(tmp_path))
    monkeypatch.setattr(float_reference, "make_session", refuse)
    plan, _ = compile_model(EXAMPLE, "rk3588", options, runtime=EMULATOR_RUNTIME)
    monkeypatch.undo()
    again, _ = compile_model(EXAMPLE, "rk3588", options, runtime=EMULATOR_RUNTIME)
    assert plan.quantization.keys() == again.quantization.keys()
    for name, quant in plan.quantization.items():
        assert again.quantization[name].zero_points == quant.zero_points
        np.testing.assert_allclose(again.quantization[name].scales, quant.scales, rtol=1e-4)


def test_observed_limits_what_the_session_returns(tmp_path):
    prepared = prepare(EXAMPLE, "rk3588", Options(dtype="int8", calibration=_calibration(tmp_path)))
    steps = prepared.plan.steps
    spec = prepared.plan.model.inputs[0]
    wanted = {steps[2].outputs[0], steps[-3].outputs[0]}
    reference = FloatReference(*with_views(prepared.plan, prepared.reference_nodes), prepared.plan.model.opset,
                               [s.name for s in prepared.plan.model.outputs], observed=wanted)
    seen = _every_tensor(reference, {spec.name: np.zeros(spec.shape, np.float32)})
    assert set(seen) == wanted
    (session,) = reference.sessions.values()
    assert {o.name for o in session.get_outputs()} == wanted | {s.name for s in prepared.plan.model.outputs}


# ---- progress ---------------------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Standard error as a terminal, while the test body runs (pytest sets its own capture
    again once the fixtures are set up)."""
    screen = Terminal()

    @contextlib.contextmanager
    def attached():
        with monkeypatch.context() as patch:
            patch.setattr(sys, "stderr", screen)
            yield screen

    return attached


@pytest.mark.parametrize("method, bars", [("minmax", ["int8 calibration: float32 pass (minmax)"]),
                                          ("kl", ["int8 calibration: float32 pass (kl)",
                                                  "int8 calibration: kl ranges"])])
def test_calibration_shows_its_progress_on_a_terminal(tmp_path, terminal, method, bars):
    options = Options(dtype="int8", calibration=_calibration(tmp_path), calibration_method=method)
    with terminal() as screen:
        compile_model(EXAMPLE, "rk3588", options, runtime=EMULATOR_RUNTIME)
    shown = screen.getvalue()
    for bar in bars:
        assert bar in shown
    assert "3/3" in shown


def test_calibration_is_quiet_inside_quiet_and_with_plan_quiet(tmp_path, terminal):
    calibration = _calibration(tmp_path)
    with terminal() as screen:
        with quiet():
            compile_model(EXAMPLE, "rk3588", Options(dtype="int8", calibration=calibration), runtime=EMULATOR_RUNTIME)
        fixed = ["--calib-method", "minmax", "--bias-correction", "--no-equalization"]
        assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--dtype", "int8", "--quiet",
                     "--calib", str(calibration), *fixed]) == 0
        assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--dtype", "int8", "--calib", str(calibration),
                     "--json", str(tmp_path / "plan.json"), *fixed]) == 0
    assert screen.getvalue().count("int8 calibration: float32 pass (minmax):   0%") == 1  # the last plan, not --quiet


def test_calibration_prints_no_bar_into_a_pipe(tmp_path, capsys):
    compile_model(EXAMPLE, "rk3588", Options(dtype="int8", calibration=_calibration(tmp_path)),
                  runtime=EMULATOR_RUNTIME)
    assert "int8 calibration" not in capsys.readouterr().err


def test_accuracy_analysis_shows_its_progress_on_a_terminal(tmp_path, terminal):
    prepared = prepare(EXAMPLE, "rk3588", Options(dtype="int8", calibration=_calibration(tmp_path)))
    spec = prepared.plan.model.inputs[0]
    with terminal() as screen:
        analyse(prepared, {spec.name: np.zeros(spec.shape, np.float32)})
    steps = len(prepared.plan.steps)
    assert "accuracy analysis: int8 steps" in screen.getvalue() and f"{steps}/{steps}" in screen.getvalue()
