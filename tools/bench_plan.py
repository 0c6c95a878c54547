"""Plan time as a user sees it: `rkcompile plan` as a whole process, beside a process that creates
an onnxruntime session on the same model; the ratio per model, their median and maximum, then the
scaling check: a 20,000-node generated model's plan process beside a 5,000-node one's.

    python tools/bench_plan.py [MODEL_OR_DIR ...] [--target rk3588] [--repeat 3]
                               [--python PY] [--baseline-python PY] [--floor] [--scale 5000 20000 | --scale]

Defaults to ../shared/zoo. Both sides are child processes started the same way (`PY -m rkcompile
plan MODEL --target T`, its summary printed to a pipe, and `PY -c` creating an
`onnxruntime.InferenceSession` with ORT_ENABLE_ALL on one thread), so interpreter start-up and
imports count on both sides. They run interleaved, model by model and repeat by repeat, and each
figure is the best of --repeat. Run it on an otherwise idle machine: load does not hit both
sides alike. The onnxruntime process loads numpy, whose OpenBLAS starts a worker per core, and
those workers spin on the cores a second job wants; a float16 plan process keeps one BLAS thread.
On 2 cores with other jobs running, hf_t5_encoder_tiny's onnxruntime process took 0.65 s, or
0.30 s with OPENBLAS_NUM_THREADS=1 (best of 7 each). So two benches at once, one per core, read
better ratios than one alone: the same tree (6c80e6d) read medians of 1.33 (dev zoo) and 1.56
(wide zoo) that way, and 1.45 and 1.73 alone (issue 18, docs/zoo.md "A seventh round"). One
unmeasured warm-up of each side per model first fills the OS file cache and Python's bytecode
caches (a child runs with bytecode caching on, as an installed package does, whatever
PYTHONDONTWRITEBYTECODE says here). A model whose input has a dynamic dimension is planned with
`--input-shape` from its NAME.npz beside it.

--python picks the interpreter whose rkcompile is measured (another checkout's venv, to measure
a before and an after with the same script); the onnxruntime side always uses it too. With
--baseline-python, each repeat also runs that interpreter's plan process on the model, right
before --python's (after it in odd repeats): a before and an after in turn, repeat by repeat,
against the same onnxruntime process, so a shared machine's load hits the two plan sides alike.

It first prints each interpreter's numpy, onnx, ml_dtypes, onnx-graphsurgeon and onnxruntime
releases: a plan process imports all of them, and a release can move every figure at once
(ml_dtypes 0.7.0 made `import onnx` 0.6 s slower; pyproject.toml excludes it).

Beside each wall time, the CPU time of the same process (user + system, the least over the
repeats): on a machine other users load, it moves far less than wall time does. A plan process
can take more CPU than wall time (import's sha256 runs on a second core); so does onnxruntime's
(its session is made on one thread, but numpy's OpenBLAS workers spin as it loads).
--floor adds one more process per model, timed in the same turns: what no planner built on
this project's stack can skip (`FLOOR`). It imports numpy, onnx and onnx-graphsurgeon and parses
the model's bytes, and does nothing else: no check, no shape inference, no graph. Its ratio is
the part of the median bar's 1.5x that is gone before a first pass could start.
--scale N M generates two models with tools/bench_scale.py's `scale_model` (residual conv blocks
wrapped in exporter-style shape arithmetic) and checks the issue's bar: the M-node plan takes at
most 4.5x the N-node one (4x the nodes); `--scale` with no numbers skips the check.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

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

#: what no plan on this project's stack can skip: its imports, then the file's bytes parsed; with
#: one OpenBLAS thread, the collector off and the exit without teardown, as a float16 plan command
#: runs (rkcompile/cli.py; OpenBLAS's second thread added 1-8 ms to this process here)
FLOOR = """
import gc, os, sys
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
gc.disable()
import numpy, onnx, onnx_graphsurgeon
with open(sys.argv[1], "rb") as model:
    onnx.load_model_from_string(model.read())
os._exit(0)
"""

#: what a plan process imports before its first pass, whose releases move its time: ml_dtypes
#: 0.7.0 (imported by `import onnx`) alone added 0.6 s to every process (issue 18's eighth round)
VERSIONS = """
from importlib.metadata import PackageNotFoundError, version
def release(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
print(", ".join(f"{name} {release(name)}" for name in ("numpy", "onnx", "ml_dtypes", "onnx-graphsurgeon", "onnxruntime")))
"""


def child_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc files
    return environment


def timed(command: list[str], workdir: Path) -> tuple[float, float, str | None]:
    """Wall time and CPU time (user + system) of one child process, and its last stderr line
    when it failed."""
    seconds, cpu, _, failure = timed_output(command, workdir, stdout=subprocess.DEVNULL)
    return seconds, cpu, failure


def timed_output(command: list[str], workdir: Path, stdout=subprocess.PIPE) -> tuple[float, float, str, str | None]:
    """`timed`, with what the child wrote to its standard output (`stdout`: where it goes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=workdir, env=child_environment(), stdout=stdout,
                              stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if finished.returncode != 0:
        lines = finished.stderr.strip().splitlines() or [f"exit {finished.returncode}"]
        return seconds, cpu, finished.stdout or "", lines[-1]
    return seconds, cpu, finished.stdout or "", None


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


class Times(NamedTuple):
    """The least wall and CPU seconds of one process over the repeats."""

    wall: float
    cpu: float


def side_command(path: Path, label: str, python: str, target: str) -> list[str]:
    """The process a side of the table runs on `path`: `FLOOR` for the floor side, else a plan."""
    if label == "floor":
        return [python, "-c", FLOOR, str(path)]
    return [python, "-m", "rkcompile", "plan", str(path), "--target", target, *input_shape_flags(path)]


def measure(path: Path, sides: list[tuple[str, str]], target: str, repeat: int,
            workdir: Path) -> tuple[list[Times], Times, str | None]:
    """Best times per side of `sides` (label, interpreter) and the best onnxruntime-process
    times over `repeat` runs, the sides' processes in turn (reversed in odd repeats) and then
    onnxruntime's, repeat by repeat; the first failure's last stderr line."""
    plan_commands = [side_command(path, label, python, target) for label, python in sides]
    ort_command = [sides[-1][1], "-c", ORT_SESSION, str(path)]
    for command in plan_commands + [ort_command]:
        timed(command, workdir)  # warm-up: file cache, bytecode caches
    plan_runs: list[list[tuple[float, float]]] = [[] for _ in sides]
    ort_runs, failure = [], None
    for index in range(repeat):
        order = list(range(len(sides)))
        for side in (order if index % 2 == 0 else order[::-1]):  # neither always first
            seconds, cpu, failed = timed(plan_commands[side], workdir)
            plan_runs[side].append((seconds, cpu))
            failure = failure or failed
        seconds, cpu, _ = timed(ort_command, workdir)
        ort_runs.append((seconds, cpu))

    def best(runs: list[tuple[float, float]]) -> Times:
        return Times(min(wall for wall, _ in runs), min(cpu for _, cpu in runs))

    return [best(runs) for runs in plan_runs], best(ort_runs), failure


def model_paths(arguments: list[Path]) -> list[Path]:
    return sorted(p for m in arguments for p in ([m] if m.is_file() else m.glob("*.onnx")))


def zoo_table(paths: list[Path], sides: list[tuple[str, str]], target: str, repeat: int, workdir: Path) -> None:
    """One row per model: each side's plan process (wall s, CPU s, wall ratio to onnxruntime),
    then onnxruntime's process; a summary per side."""
    labels = "".join(f" {label[:6] + ' s':>8} {'cpu s':>6} {'ratio':>6}" for label, _ in sides)
    print(f"{'model':42}{labels} {'ort s':>7} {'cpu s':>6}", flush=True)
    ratios: list[list[float]] = [[] for _ in sides]
    for path in paths:
        plans, ort, failure = measure(path, sides, target, repeat, workdir)
        columns = ""
        for side, plan in enumerate(plans):
            ratios[side].append(plan.wall / ort.wall)
            columns += f" {plan.wall:8.2f} {plan.cpu:6.2f} {plan.wall / ort.wall:6.2f}"
        if failure:
            for side_ratios in ratios:
                side_ratios.pop()
        note = f"  plan failed: {failure[:80]}" if failure else ""
        print(f"{path.stem:42}{columns} {ort.wall:7.2f} {ort.cpu:6.2f}{note}", flush=True)
    for (label, python), side_ratios in zip(sides, ratios):
        if side_ratios and label == "floor":
            over = sum(r > MEDIAN_BAR for r in side_ratios)
            print(f"floor ({python}): {len(side_ratios)} models: median ratio {statistics.median(side_ratios):.2f}, "
                  f"max {max(side_ratios):.2f}; {over} over {MEDIAN_BAR} before any pass", flush=True)
        elif side_ratios:
            over = sum(r > WORST_BAR for r in side_ratios)
            named = f"{label} ({python}): " if len(sides) > 1 else ""
            print(f"{named}{len(side_ratios)} models planned: median ratio {statistics.median(side_ratios):.2f} "
                  f"(bar {MEDIAN_BAR}), max {max(side_ratios):.2f} (bar {WORST_BAR}), {over} over {WORST_BAR}",
                  flush=True)


def scaling_check(node_counts: list[int], sides: list[tuple[str, str]], target: str, repeat: int,
                  workdir: Path) -> bool:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scale import scale_model

    labels = "".join(f" {label[:6] + ' s':>8} {'cpu s':>6}" for label, _ in sides)
    print(f"{'nodes':>7}{labels} {'ort s':>7}", flush=True)
    rows = []
    for count in node_counts:
        model = scale_model(count)
        path = workdir / f"scale_{count}.onnx"
        onnx.save(model, str(path))
        plans, ort, failure = measure(path, sides, target, repeat, workdir)
        if failure:
            print(f"{count:7d} plan failed: {failure}")
            return False
        rows.append((len(model.graph.node), plans, ort))
        print(f"{rows[-1][0]:7d}" + "".join(f" {plan.wall:8.2f} {plan.cpu:6.2f}" for plan in plans) + f" {ort.wall:7.2f}",
              flush=True)
    (small_nodes, small_plans, small_ort), (large_nodes, large_plans, large_ort) = rows[0], rows[-1]
    within = True
    for (label, _), small, large in zip(sides, small_plans, large_plans):
        growth = large.wall / small.wall
        within = within and growth <= SCALING_BAR
        named = f"{label}: " if len(sides) > 1 else ""
        print(f"{named}{large_nodes / small_nodes:.1f}x the nodes: plan process {growth:.2f}x (bar {SCALING_BAR}x), "
              f"onnxruntime process {large_ort.wall / small_ort.wall:.2f}x")
    return within


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[DEFAULT_ZOO])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose rkcompile is measured")
    parser.add_argument("--baseline-python", help="also measure this interpreter's rkcompile, in turn with --python's")
    parser.add_argument("--scale", type=int, nargs="*", default=[5000, 20000],
                        help="node counts of the generated scaling models (none: skip the check)")
    parser.add_argument("--floor", action="store_true",
                        help="also time the stack's floor: its imports and the model parsed (FLOOR)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as folder:
        workdir = Path(folder)  # children start here: no checkout's rkcompile/ shadows --python's
        sides = ([("before", args.baseline_python)] if args.baseline_python else []) + [("plan", args.python)]
        for label, python in sides:
            print(f"{label} ({python}): " + subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True,
                                                           check=True).stdout.strip(), flush=True)
        zoo_table(model_paths(args.models), sides + ([("floor", args.python)] if args.floor else []), args.target,
                  args.repeat, workdir)
        if len(args.scale) >= 2:
            return 0 if scaling_check(args.scale, sides, args.target, args.repeat, workdir) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
