"""The command line as a new user meets it (issue 17): refusals that name the way out, --inputs
matched by name, output files a user can read, and a summary that shows its evidence."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.compiler.pipeline import compile_model
from rkcompile.views.summary import render_summary

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and err.startswith("error: ") and "internal" not in err
    return err


def test_float16_on_an_int8_only_npu_is_refused_naming_int8(capsys):
    """rv1106 stores float16 (C2 8) but its convolutions run int8 only: planning 0% silently was the bug."""
    err = _one_line_error(capsys, main(["plan", str(EXAMPLE), "--target", "rv1106"]))
    assert "rv1106's NPU runs" in err and "use --dtype int8" in err


def test_float16_on_a_target_without_float16_storage_names_int8(capsys):
    err = _one_line_error(capsys, main(["plan", str(EXAMPLE), "--target", "rv1106b"]))
    assert "use --dtype int8" in err


def test_int8_on_the_int8_only_npu_still_plans(capsys):
    assert main(["plan", str(EXAMPLE), "--target", "rv1106", "--dtype", "int8", "--quiet"]) == 0


def _model_names():
    plan, _ = compile_model(EXAMPLE, "rk3588")
    return [s.name for s in plan.model.inputs], [s.name for s in plan.model.outputs], plan.model.inputs[0]


def test_run_refuses_an_npz_whose_keys_are_not_the_models(tmp_path, capsys):
    inputs, _, spec = _model_names()
    other = tmp_path / "other.npz"
    np.savez(other, images=np.zeros(spec.shape, np.float32))
    err = _one_line_error(capsys, main(["run", str(EXAMPLE), "--target", "rk3588", "--inputs", str(other), "--check"]))
    assert "'images'" in err and f"expected inputs: {', '.join(inputs)}" in err


def test_run_refuses_an_npz_of_reference_outputs_without_inputs(tmp_path, capsys):
    _, outputs, _ = _model_names()
    only_outputs = tmp_path / "ref.npz"
    np.savez(only_outputs, **{outputs[0]: np.zeros(3, np.float32)})
    err = _one_line_error(capsys, main(["run", str(EXAMPLE), "--target", "rk3588", "--inputs", str(only_outputs)]))
    assert "none of the model's inputs" in err


def test_run_takes_an_npy_for_a_single_input_model(tmp_path, capsys):
    inputs, _, spec = _model_names()
    array = np.random.default_rng(1).standard_normal(spec.shape).astype(np.float32)
    np.save(tmp_path / "x.npy", array)
    np.savez(tmp_path / "x.npz", **{inputs[0]: array})
    reports = []
    for name in ("x.npy", "x.npz"):
        report = tmp_path / f"{name}.json"
        assert main(["run", str(EXAMPLE), "--target", "rk3588", "--inputs", str(tmp_path / name),
                     "--outputs", str(tmp_path / f"{name}.out.npz"), "--json", str(report)]) == 0
        reports.append(json.loads(report.read_text())["random_inputs"])
    assert reports == [[], []]
    with np.load(tmp_path / "x.npy.out.npz") as a, np.load(tmp_path / "x.npz.out.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_run_refuses_an_npy_for_a_multi_input_model(tmp_path, capsys, save):
    from onnx import helper
    from conftest import make_model, value_info

    model = save(make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                            [value_info("a", [1, 4, 2, 2]), value_info("b", [1, 4, 2, 2])], [value_info("y", [1, 4, 2, 2])]))
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 2, 2), np.float32))
    err = _one_line_error(capsys, main(["run", str(model), "--target", "rk3588", "--inputs", str(tmp_path / "x.npy")]))
    assert "2 inputs (a, b)" in err


def test_onnxruntime_is_a_runtime_dependency():
    """run --check and zoo --run import onnxruntime: a test extra left `pip install .` broken."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(dep.split(">")[0].split("=")[0].strip() == "onnxruntime" for dep in project["dependencies"])


def test_outputs_follow_the_umask_and_folders_are_created(tmp_path, capsys):
    previous = os.umask(0o022)
    try:
        plan_json, artifact = tmp_path / "new" / "deeper" / "plan.json", tmp_path / "made" / "m.rkplan"
        assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--quiet", "--json", str(plan_json),
                     "-o", str(artifact)]) == 0
    finally:
        os.umask(previous)
    for path in (plan_json, artifact):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_dash_writes_to_standard_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["target"] == "rk3588"
    assert "Network summary" in captured.err
    assert main(["graph", str(EXAMPLE), "--target", "rk3588", "--format", "dot", "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith("digraph")
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("suffix, start", [(".html", b"<!DOCTYPE html"), (".dot", b"digraph"), (".onnx", None)])
def test_graph_infers_the_format_from_the_suffix(tmp_path, suffix, start):
    out = tmp_path / f"g{suffix}"
    assert main(["graph", str(EXAMPLE), "--target", "rk3588", "-o", str(out)]) == 0
    if start is None:
        import onnx

        assert any(n.op_type == "NpuPartition" for n in onnx.load(str(out)).graph.node)
    else:
        assert out.read_bytes().lstrip()[:len(start)].lower() == start.lower()


def test_graph_without_format_or_known_suffix_is_refused(tmp_path, capsys):
    err = _one_line_error(capsys, main(["graph", str(EXAMPLE), "--target", "rk3588", "-o", str(tmp_path / "g.txt")]))
    assert "--format" in err


def test_python_dash_m_rkcompile(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rkcompile", "targets"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0 and "rk3588" in result.stdout


def test_summary_names_the_fallback_nodes_and_the_values_they_broke():
    """rv1106 in float16 (the library still plans it) sends every Conv to the CPU for its dtype."""
    plan, _ = compile_model(EXAMPLE, "rv1106")
    convs = [n for n in plan.nodes if n.op == "Conv" and n.device == "cpu"]
    assert len(convs) > 3
    lines = render_summary(plan).splitlines()
    reason = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{len(convs)} x Conv on rv1106"))
    evidence = lines[reason + 1].strip()
    assert evidence.startswith(f"nodes: {convs[0].name} (plan dtype float16), {convs[1].name} (plan dtype float16)")
    assert evidence.endswith(f"+{len(convs) - 3} more")


def test_a_split_that_buys_little_says_what_limits_it():
    plan, _ = compile_model(EXAMPLE, "rk3588", Options(core_mask="0_1_2"))
    multicore = plan.multicore
    assert multicore.speedup < 1.05
    why = next(line for line in render_summary(plan).splitlines() if line.strip().startswith("why "))
    waiting = multicore.est_latency_ms - max(t.est_ms for t in multicore.per_core)
    npu_steps = sum(1 for s in plan.steps if s.device == "npu")
    assert f"waits {waiting:.3f} of {multicore.est_latency_ms:.3f} ms" in why
    assert f"{len(multicore.splits)} of {npu_steps} NPU steps split" in why
    # one core asked for: nothing to explain
    single, _ = compile_model(EXAMPLE, "rk3588")
    assert not any(line.strip().startswith("why ") for line in render_summary(single).splitlines())


def test_calibration_from_an_rknn_style_dataset_txt(tmp_path):
    from rkcompile.plan.schema import TensorSpec
    from rkcompile.quantization.params import load_calibration

    specs = (TensorSpec("a", (1, 2), "float32"), TensorSpec("b", (1, 3), "float32"))
    (tmp_path / "data").mkdir()
    for i in range(2):
        np.save(tmp_path / "data" / f"a{i}.npy", np.full((1, 2), i, np.float64))
        np.save(tmp_path / "data" / f"b{i}.npy", np.full((1, 3), 10 + i, np.float32))
    listing = tmp_path / "dataset.txt"
    listing.write_text("# preprocessed\ndata/a0.npy data/b0.npy\n\ndata/a1.npy  data/b1.npy\n")
    samples = load_calibration(listing, specs)
    assert [(float(s["a"][0, 0]), float(s["b"][0, 0])) for s in samples] == [(0, 10), (1, 11)]
    assert all(s["a"].dtype == np.float32 for s in samples)


@pytest.mark.parametrize("line, message", [
    ("data/a0.npy", "names 1 files, the model has 2 inputs (a, b)"),
    ("data/a0.npy data/notes.csv", "notes.csv is neither a .npy array nor an image"),
    ("data/a0.npy data/absent.npy", "does not exist"),
])
def test_a_bad_dataset_txt_line_is_one_clear_error(tmp_path, line, message):
    from rkcompile.errors import CompileError
    from rkcompile.plan.schema import TensorSpec
    from rkcompile.quantization.params import load_calibration

    specs = (TensorSpec("a", (1, 2), "float32"), TensorSpec("b", (1, 3), "float32"))
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "a0.npy", np.zeros((1, 2), np.float32))
    listing = tmp_path / "dataset.txt"
    listing.write_text(line + "\n")
    with pytest.raises(CompileError, match=re.escape(f"{listing} line 1")) as error:
        load_calibration(listing, specs)
    assert message in str(error.value)


def test_plan_int8_calibrates_from_a_dataset_txt(tmp_path, capsys):
    _, _, spec = _model_names()
    for i in range(2):
        np.save(tmp_path / f"s{i}.npy", np.random.default_rng(i).standard_normal(spec.shape).astype(np.float32))
    (tmp_path / "dataset.txt").write_text("s0.npy\ns1.npy\n")
    assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--dtype", "int8", "--quiet",
                 "--calib", str(tmp_path / "dataset.txt")]) == 0
