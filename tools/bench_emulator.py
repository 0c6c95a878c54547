"""Emulator time as `rkcompile run` reports it, beside onnxruntime's one-thread run time, per model.

    python tools/bench_emulator.py [MODEL_OR_DIR ...] [--target rk3588] [--repeat 3] [--python PY]
                                   [--baseline-python PY] [--onnxruntime-first-run]
                                   [--later-runs]

Defaults to ../shared/zoo. The emulator side is `PY -m rkcompile run MODEL --target T --inputs
MODEL.npz --json -` in a child process: its report's `seconds`, the first run of a fresh process
(what a user, `zoo --run` or one calibration sample pays: weight decoding and step setup
included, planning excluded). The onnxruntime side is the median of --repeat runs of one session
(CPU provider, one intra-op and one inter-op thread) after one warm-up run, on the same inputs.
Each model's emulator figure is the median of --repeat child processes, run interleaved with the
onnxruntime runs so load from other users of the machine hits both alike. The child's BLAS is
pinned to one thread (OPENBLAS_NUM_THREADS and friends, unless already set): like for like with
onnxruntime's one thread, and on a shared 2-core machine a second thread mostly waits.

A model counts as a CNN when it has Conv nodes and more of them than MatMul/Gemm nodes; the
summary gives the median ratio over CNNs and the worst ratio over all models, against the issue's
bars (3x and 10x). A model whose input has a dynamic dimension is planned with `--input-shape`
from its NAME.npz, as tools/bench_plan.py does. --python picks the interpreter whose rkcompile is
measured (another checkout's venv: a before and an after with one script). With
--baseline-python, each repeat also runs that interpreter's rkcompile on the model, right
before --python's (after it in odd repeats), against the same onnxruntime figure: a before and an after measured in
turn, repeat by repeat, so a shared machine's load, which moves onnxruntime's own time by 2-4x
over minutes, hits both alike.

The bars compare a first run, setup included, with onnxruntime's warm run. Two further measures
say what that comparison asks:
- `--onnxruntime-first-run`: onnxruntime's own first run, timed the same way
  (tools/onnxruntime_first_run.py on this interpreter's onnxruntime, the one the one-thread
  figure runs, in a fresh process per repeat: a session on the model onnxruntime optimized
  beforehand, graph optimizations off, plus its first run; its graph rewriting left out as
  planning is left out of the emulator's). Printed: its seconds, its ratio to onnxruntime's
  one-thread run (the bars applied to onnxruntime itself) and the emulator's ratio to it (first
  run against first run).
- `--later-runs`: the emulator's later runs of one prepared plan (tools/emulator_later_runs.py,
  --python's, the median of --repeat runs after the first), what each further calibration sample
  or input costs, and their ratio to onnxruntime's one-thread run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import DEFAULT_ZOO, child_environment, input_shape_flags, model_paths  # noqa: E402

#: the issue's bars: median ratio over CNNs, worst ratio over all models
CNN_MEDIAN_BAR, WORST_BAR = 3.0, 10.0
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def is_cnn(path: Path) -> bool:
    ops = [node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node]
    convs = ops.count("Conv")
    return convs > 0 and convs > ops.count("MatMul") + ops.count("Gemm")


def one_thread_environment() -> dict[str, str]:
    """A child's environment with its BLAS on one thread (unless already set)."""
    environment = child_environment()
    for variable in ONE_THREAD:
        environment.setdefault(variable, "1")
    return environment


def emulator_seconds(path: Path, python: str, target: str, workdir: Path) -> tuple[float | None, str]:
    """`seconds` from one `rkcompile run --json -` child, or None and its last stderr line."""
    command = [python, "-m", "rkcompile", "run", str(path), "--target", target, "--json", "-",
               *input_shape_flags(path)]
    if path.with_suffix(".npz").exists():
        command += ["--inputs", str(path.with_suffix(".npz"))]
    finished = subprocess.run(command, cwd=workdir, env=one_thread_environment(), capture_output=True, text=True)
    if finished.returncode != 0:
        lines = finished.stderr.strip().splitlines() or [f"exit {finished.returncode}"]
        return None, lines[-1]
    return json.loads(finished.stdout)["seconds"], ""


def json_child(command: list[str], workdir: Path) -> dict | None:
    """The JSON line a tool prints in a child process with BLAS on one thread, or None when it
    failed."""
    finished = subprocess.run(command, cwd=workdir, env=one_thread_environment(), capture_output=True, text=True)
    return json.loads(finished.stdout) if finished.returncode == 0 else None


def onnxruntime_first_run_seconds(path: Path, workdir: Path, repeat: int) -> float | None:
    """The median of `repeat` fresh processes' onnxruntime first run (tools/onnxruntime_first_run.py
    on the model onnxruntime optimized once, here), or None when one failed."""
    tool = str(Path(__file__).resolve().parent / "onnxruntime_first_run.py")
    optimized = workdir / f"{path.stem}.optimized.onnx"
    if json_child([sys.executable, tool, str(path), "--optimize-to", str(optimized)], workdir) is None:
        return None
    seconds = []
    for _ in range(repeat):
        report = json_child([sys.executable, tool, str(path), "--optimized", str(optimized)], workdir)
        if report is None:
            return None
        seconds.append(report["seconds"])
    optimized.unlink()  # a zoo's optimized models, weights and all, need not pile up until the end
    return statistics.median(seconds)


def later_run_seconds(path: Path, python: str, target: str, workdir: Path, runs: int) -> float | None:
    """tools/emulator_later_runs.py's `later_seconds` for the model, or None when it failed."""
    tool = str(Path(__file__).resolve().parent / "emulator_later_runs.py")
    report = json_child([python, tool, str(path), "--target", target, "--runs", str(runs),
                         *input_shape_flags(path)], workdir)
    return None if report is None else report["later_seconds"]


def onnxruntime_feeds(session: onnxruntime.InferenceSession, path: Path) -> dict[str, np.ndarray]:
    """The model's NAME.npz inputs; an input it lacks gets seeded random values of its type."""
    arrays = dict(np.load(path.with_suffix(".npz"))) if path.with_suffix(".npz").exists() else {}
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        if spec.name in arrays:
            feeds[spec.name] = arrays[spec.name]
            continue
        shape = [d if isinstance(d, int) else 1 for d in spec.shape]
        dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
                 "tensor(bool)": np.bool_, "tensor(float16)": np.float16}.get(spec.type, np.float32)
        feeds[spec.name] = (rng.integers(0, 100, shape) if np.issubdtype(dtype, np.integer)
                            else rng.standard_normal(shape)).astype(dtype)
    return feeds


def onnxruntime_seconds(path: Path, repeat: int) -> float:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = onnxruntime_feeds(session, path)
    session.run(None, feeds)  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[DEFAULT_ZOO])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose rkcompile is measured")
    parser.add_argument("--baseline-python", help="also measure this interpreter's rkcompile, in turn with --python's")
    parser.add_argument("--onnxruntime-first-run", action="store_true",
                        help="also time onnxruntime's own first run of a fresh process, as the emulator's is timed")
    parser.add_argument("--later-runs", action="store_true",
                        help="also time the emulator's later runs of one prepared plan")
    args = parser.parse_args()
    sides = ([("baseline", args.baseline_python)] if args.baseline_python else []) + [("measured", args.python)]
    baseline_header = f" {'base s':>8} {'base':>7}" if args.baseline_python else ""
    first_header = f" {'ort 1st s':>9} {'1st/1T':>7} {'emu/1st':>7}" if args.onnxruntime_first_run else ""
    later_header = f" {'later s':>8} {'ratio':>7}" if args.later_runs else ""
    print(f"{'model':42} {'cnn':>3}{baseline_header} {'emulator s':>10} {'ort 1T s':>9} {'ratio':>7}"
          f"{first_header}{later_header}", flush=True)
    ratios = {side: [] for side, _ in sides}
    cnn_ratios = {side: [] for side, _ in sides}
    #: (CNN or not, ratio) per model: onnxruntime's first run to its one-thread run, the emulator's
    #: first run to onnxruntime's, the emulator's later runs to onnxruntime's one-thread run
    onnxruntime_first, against_first, later = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench_emulator_") as folder:
        for path in model_paths(args.models):
            cnn = is_cnn(path)
            times = {side: [] for side, _ in sides}
            ort_times, failure = [], ""
            for repeat in range(args.repeat):
                for side, python in (sides if repeat % 2 == 0 else sides[::-1]):  # neither always first
                    seconds, failure = emulator_seconds(path, python, args.target, Path(folder))
                    if seconds is None:
                        break
                    times[side].append(seconds)
                if failure:
                    break
                ort_times.append(onnxruntime_seconds(path, args.repeat))
            if failure:
                print(f"{path.stem:42} {'yes' if cnn else 'no':>3} run failed: {failure[:80]}", flush=True)
                continue
            ort = statistics.median(ort_times)
            columns = []
            for side, _ in sides:
                emulator = statistics.median(times[side])
                ratios[side].append(emulator / ort)
                if cnn:
                    cnn_ratios[side].append(emulator / ort)
                columns.append((emulator, emulator / ort))
            shown = "".join(f" {seconds:8.3f} {ratio:6.1f}x" for seconds, ratio in columns[:-1])
            emulator, ratio = columns[-1]
            first = ""
            if args.onnxruntime_first_run:
                seconds = onnxruntime_first_run_seconds(path, Path(folder), args.repeat)
                if seconds is None:
                    first = f" {'failed':>9}"
                else:
                    onnxruntime_first.append((cnn, seconds / ort))
                    against_first.append((cnn, emulator / seconds))
                    first = f" {seconds:9.4f} {seconds / ort:6.1f}x {emulator / seconds:6.2f}x"
            later_run = ""
            if args.later_runs:
                seconds = later_run_seconds(path, args.python, args.target, Path(folder), args.repeat)
                if seconds is None:
                    later_run = f" {'failed':>8}"
                else:
                    later.append((cnn, seconds / ort))
                    later_run = f" {seconds:8.4f} {seconds / ort:6.1f}x"
            print(f"{path.stem:42} {'yes' if cnn else 'no':>3}{shown} {emulator:10.3f} {ort:9.4f} {ratio:6.1f}x"
                  f"{first}{later_run}", flush=True)
    for side, python in sides:
        if ratios[side]:
            cnn_median = f"{statistics.median(cnn_ratios[side]):.1f}x" if cnn_ratios[side] else "n/a"
            label = f"{side} ({python}): " if args.baseline_python else ""
            print(f"{label}{len(ratios[side])} models run: median over {len(cnn_ratios[side])} CNNs {cnn_median} "
                  f"(bar {CNN_MEDIAN_BAR}x), median over all {statistics.median(ratios[side]):.1f}x, "
                  f"max {max(ratios[side]):.1f}x (bar {WORST_BAR}x), {sum(r > WORST_BAR for r in ratios[side])} over "
                  f"{WORST_BAR}x")
    for label, measured in (("onnxruntime's own first run, to its one-thread run", onnxruntime_first),
                            ("the emulator's first run, to onnxruntime's first run", against_first),
                            ("the emulator's later runs, to onnxruntime's one-thread run", later)):
        if measured:
            print(f"{label}: {ratio_summary(measured)}")
    return 0


def ratio_summary(measured: list[tuple[bool, float]]) -> str:
    """The median over CNNs and over all, the max and how many are over the worst bar."""
    cnns = [ratio for cnn, ratio in measured if cnn]
    ratios = [ratio for _, ratio in measured]
    cnn_median = f"{statistics.median(cnns):.2f}x" if cnns else "n/a"
    return (f"{len(ratios)} models: median over {len(cnns)} CNNs {cnn_median} (bar {CNN_MEDIAN_BAR}x), "
            f"median over all {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x (bar {WORST_BAR}x), "
            f"{sum(r > WORST_BAR for r in ratios)} over {WORST_BAR}x")


if __name__ == "__main__":
    raise SystemExit(main())
