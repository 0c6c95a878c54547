"""tools/bench_emulator.py's further columns (issue 18): onnxruntime's own first run, timed as
the emulator's first run is, and the emulator's later runs of one prepared plan."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import REPO, TOOLS, load_tool


def test_ratio_summary_takes_the_cnn_median_apart_and_counts_the_models_over_the_worst_bar():
    bench = load_tool("bench_emulator")
    text = bench.ratio_summary([(True, 1.0), (True, 3.0), (False, 12.0), (True, 2.0), (False, 10.0)])
    assert text == ("5 models: median over 3 CNNs 2.00x (bar 3.0x), median over all 3.00x, max 12.00x "
                    "(bar 10.0x), 1 over 10.0x")
    assert "median over 0 CNNs n/a" in bench.ratio_summary([(False, 4.0)])


def test_onnxruntime_first_run_times_a_session_on_the_optimized_model_and_its_first_run(tmp_path):
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(REPO / "examples" / "tiny_cnn.onnx", model)
    tool = [sys.executable, str(TOOLS / "onnxruntime_first_run.py"), str(model)]
    optimized = tmp_path / "optimized.onnx"
    written = subprocess.run([*tool, "--optimize-to", str(optimized)], capture_output=True, text=True, check=True)
    assert json.loads(written.stdout) == {"optimized": str(optimized)} and optimized.stat().st_size > 0
    for flags in ([], ["--optimized", str(optimized)]):
        report = json.loads(subprocess.run([*tool, *flags], capture_output=True, text=True, check=True).stdout)
        assert report["session_seconds"] > 0 and report["first_run_seconds"] > 0
        assert report["seconds"] == report["session_seconds"] + report["first_run_seconds"]


def test_bench_prints_onnxruntimes_first_run_and_the_later_runs_beside_the_bars(tmp_path, monkeypatch, capsys):
    bench = load_tool("bench_emulator")
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(REPO / "examples" / "tiny_cnn.onnx", model)
    monkeypatch.setattr(bench, "emulator_seconds", lambda *args: (0.012, ""))
    monkeypatch.setattr(bench, "onnxruntime_seconds", lambda *args: 0.002)
    monkeypatch.setattr(bench, "onnxruntime_first_run_seconds", lambda *args: 0.008)
    monkeypatch.setattr(bench, "later_run_seconds", lambda *args: 0.005)
    monkeypatch.setattr(sys, "argv", ["bench_emulator.py", str(model), "--repeat", "1",
                                      "--onnxruntime-first-run", "--later-runs"])
    assert bench.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["tiny_cnn", "yes", "0.012", "0.0020", "6.0x", "0.0080", "4.0x", "1.50x",
                                "0.0050", "2.5x"]
    assert lines[3:] == [
        "onnxruntime's own first run, to its one-thread run: 1 models: median over 1 CNNs 4.00x (bar 3.0x), "
        "median over all 4.00x, max 4.00x (bar 10.0x), 0 over 10.0x",
        "the emulator's first run, to onnxruntime's first run: 1 models: median over 1 CNNs 1.50x (bar 3.0x), "
        "median over all 1.50x, max 1.50x (bar 10.0x), 0 over 10.0x",
        "the emulator's later runs, to onnxruntime's one-thread run: 1 models: median over 1 CNNs 2.50x "
        "(bar 3.0x), median over all 2.50x, max 2.50x (bar 10.0x), 0 over 10.0x"]


def test_later_runs_reports_the_first_run_and_the_median_of_the_later_ones(tmp_path):
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(REPO / "examples" / "tiny_cnn.onnx", model)
    finished = subprocess.run([sys.executable, str(TOOLS / "emulator_later_runs.py"), str(model), "--runs", "2"],
                              capture_output=True, text=True, check=True, cwd=tmp_path)
    report = json.loads(finished.stdout)
    assert set(report) == {"first_seconds", "later_seconds"}
    assert report["first_seconds"] > 0 and report["later_seconds"] > 0
