"""Plan time as a user sees it: `rkcompile plan` as a whole process, beside a process that creates
an onnxruntime session on the same model; the ratio per model, their median and maximum, then the
scaling check: a 20,000-node generated model's plan process beside a 5,000-node one's.

    python tools/bench_plan.py [MODEL_OR_DIR ...] [--target rk3588] [--repeat 3]
                               [--python PY] [--scale 5000 20000 | --scale]

Defaults to ../shared/zoo. Both sides are child processes started the same way (`PY -m rkcompile
plan MODEL --target T`, its summary printed to a pipe, and `PY -c` creating an
`onnxruntime.InferenceSession` with ORT_ENABLE_ALL on one thread), so interpreter start-up and
imports count on both sides. They run interleaved, model by model and repeat by repeat, so load
from other users of the machine hits both alike; each figure is the best of --repeat. One
unmeasured warm-up of each side per model first fills the OS file cache and Python's bytecode
caches (a child runs with bytecode caching on, as an installed package does, whatever
PYTHONDONTWRITEBYTECODE says here). A model whose input has a dynamic dimension is planned with
`--input-shape` from its NAME.npz beside it.

--python picks the interpreter whose rkcompile is measured (another checkout's venv, to measure
a before and an after with the same script); the onnxruntime side always uses it too.
--scale N M generates two models with tools/bench_scale.py's `scale_model` (residual conv blocks
wrapped in exporter-style shape arithmetic) and checks the issue's bar: the M-node plan takes at
most 4.5x the N-node one (4x the nodes); `--scale` with no numbers skips the check.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

DEFAULT_ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
#: the issue's bars: median and worst plan/onnxruntime ratio, and 20k-node over 5k-node plan time
MEDIAN_BAR, WORST_BAR, SCALING_BAR = 1.5, 3.0, 4.5

ORT_SESSION = """
import sys
import onnxruntime as ort
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
"""


def child_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files
    return environment


def timed(command: list[str], workdir: Path) -> tuple[float, str | None]:
    """Wall time of one child process, and its last stderr line when it failed."""
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=workdir, env=child_environment(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if finished.returncode != 0:
        lines = finished.stderr.strip().splitlines() or [f"exit {finished.returncode}"]
        return seconds, lines[-1]
    return seconds, None


def input_shape_flags(path: Path) -> list[str]:
    """`--input-shape NAME:DIMS` for each graph input with a dynamic dim, from NAME.npz's arrays."""
    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    dynamic = [i.name for i in model.graph.input if i.name not in initializers
               and any(not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)]
    if not dynamic or not path.with_suffix(".npz").exists():
        return []
    with np.load(path.with_suffix(".npz")) as arrays:
        return [flag for name in dynamic if name in arrays.files
                for flag in ("--input-shape", f"{name}:{','.join(str(d) for d in arrays[name].shape)}")]


def measure(path: Path, python: str, target: str, repeat: int, workdir: Path) -> tuple[float, float, str | None]:
    """Best plan-process and onnxruntime-process seconds over `repeat` interleaved runs."""
    plan_command = [python, "-m", "rkcompile", "plan", str(path), "--target", target, *input_shape_flags(path)]
    ort_command = [python, "-c", ORT_SESSION, str(path)]
    timed(plan_command, workdir)  # warm-up: file cache, bytecode caches
    timed(ort_command, workdir)
    plan_times, ort_times, failure = [], [], None
    for _ in range(repeat):
        seconds, failure = timed(plan_command, workdir)
        plan_times.append(seconds)
        ort_times.append(timed(ort_command, workdir)[0])
    return min(plan_times), min(ort_times), failure


def model_paths(arguments: list[Path]) -> list[Path]:
    return sorted(p for m in arguments for p in ([m] if m.is_file() else m.glob("*.onnx")))


def zoo_table(paths: list[Path], python: str, target: str, repeat: int, workdir: Path) -> None:
    print(f"{'model':42} {'plan s':>8} {'ort s':>7} {'ratio':>6}", flush=True)
    ratios = []
    for path in paths:
        plan_time, ort_time, failure = measure(path, python, target, repeat, workdir)
        note = f"  plan failed: {failure[:80]}" if failure else ""
        if not failure:
            ratios.append(plan_time / ort_time)
        print(f"{path.stem:42} {plan_time:8.2f} {ort_time:7.2f} {plan_time / ort_time:6.2f}{note}", flush=True)
    if ratios:
        over = sum(r > WORST_BAR for r in ratios)
        print(f"{len(ratios)} models planned: median ratio {statistics.median(ratios):.2f} (bar {MEDIAN_BAR}), "
              f"max {max(ratios):.2f} (bar {WORST_BAR}), {over} over {WORST_BAR}", flush=True)


def scaling_check(node_counts: list[int], python: str, target: str, repeat: int, workdir: Path) -> bool:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scale import scale_model

    print(f"{'nodes':>7} {'plan s':>8} {'ort s':>7} {'ratio':>6}", flush=True)
    rows = []
    for count in node_counts:
        model = scale_model(count)
        path = workdir / f"scale_{count}.onnx"
        onnx.save(model, str(path))
        plan_time, ort_time, failure = measure(path, python, target, repeat, workdir)
        if failure:
            print(f"{count:7d} plan failed: {failure}")
            return False
        rows.append((len(model.graph.node), plan_time, ort_time))
        print(f"{rows[-1][0]:7d} {plan_time:8.2f} {ort_time:7.2f} {plan_time / ort_time:6.2f}", flush=True)
    (small_nodes, small_plan, small_ort), (large_nodes, large_plan, large_ort) = rows[0], rows[-1]
    growth = large_plan / small_plan
    print(f"{large_nodes / small_nodes:.1f}x the nodes: plan process {growth:.2f}x (bar {SCALING_BAR}x), "
          f"onnxruntime process {large_ort / small_ort:.2f}x")
    return growth <= SCALING_BAR


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[DEFAULT_ZOO])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose rkcompile is measured")
    parser.add_argument("--scale", type=int, nargs="*", default=[5000, 20000],
                        help="node counts of the generated scaling models (none: skip the check)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as folder:
        workdir = Path(folder)  # children start here: no checkout's rkcompile/ shadows --python's
        zoo_table(model_paths(args.models), args.python, args.target, args.repeat, workdir)
        if len(args.scale) >= 2:
            return 0 if scaling_check(args.scale, args.python, args.target, args.repeat, workdir) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
