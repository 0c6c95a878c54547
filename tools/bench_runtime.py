"""A prepared `rkcompile.Runtime` beside onnxruntime's warm one-thread session, per model.

    python tools/bench_runtime.py [MODEL ...] [--target rk3588] [--runs 7] [--first-rounds 3]

Defaults to the dev-zoo CNNs in ../shared/zoo (mobilenet_v2, resnet18_halfwidth, squeezenet1_1,
lraspp_mobilenet_v3_large, yolov8n). Each model is compiled and saved once (untimed: that is
rknn-toolkit2's build, not its init_runtime), with its inputs: MODEL.npz's, seeded random for
those it lacks. Every measurement runs in a child process with BLAS pinned to one thread, as
onnxruntime's session is (`intra_op_num_threads=1`):

- first: onnxruntime's session creation and first run, against `rkcompile.load(M.rkplan)`,
  `Runtime(plan)` and its first run, each side timed in a fresh process of its own that has
  imported both libraries and read the inputs beforehand, as a process that deploys a model
  starts; the median of --first-rounds such processes per side, the two sides taking turns.
  `(load)` is the part `rkcompile.load` took and `(init)` the part `Runtime(plan)` took, `cpu`
  the ratio of the two sides' CPU seconds (`time.process_time`, every thread of the process),
  which other users of a loaded machine move far less than the wall clock. Timing both sides
  one after the other in one process favours whichever goes first: the memory the process
  already holds is what the first side's allocations reuse, and the second side's are fresh
  pages the kernel must zero;
- repeated: the median of --runs further runs of one session, against the median of --runs
  further `Runtime.run` calls, both in one process, interleaved run by run so the machine's
  load hits both alike;
- floor: load, init and a repeated run over onnxruntime's first run: the first-run ratio a
  first run would have if it cost no more than a later one (the fresh memory a first run
  touches, its page faults and cold caches, is the rest).

Prints one table row per model and the issue's bars: repeated median ratio <= 3x, worst <= 10x,
first-run ratio <= 1.5x.
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

ZOO = Path(__file__).resolve().parents[1].parent / "shared" / "zoo"
CNNS = ("mobilenet_v2", "resnet18_halfwidth", "squeezenet1_1", "lraspp_mobilenet_v3_large", "yolov8n")
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
#: the file names a model's saved plan and inputs get in its scratch folder
PLAN_FILE, INPUTS_FILE = "model.rkplan", "inputs.npz"


def prepare(model: Path, target: str, folder: Path) -> None:
    """The model's plan and its inputs, saved into `folder`."""
    import numpy as np

    import rkcompile
    from rkcompile.emulator import make_inputs

    plan = rkcompile.compile(model, target=target)
    plan.save(folder / PLAN_FILE)
    given = model.with_suffix(".npz")
    arrays = dict(np.load(given)) if given.exists() else {}
    names = {spec.name for spec in plan.record.model.inputs}
    np.savez(folder / INPUTS_FILE, **make_inputs(plan.record, {k: v for k, v in arrays.items() if k in names}))


def first_run(model: Path, folder: Path, side: str) -> dict:
    """One side's first run in this fresh process: onnxruntime's session and run of the model,
    or rkcompile's load, Runtime and run of the saved plan."""
    import numpy as np
    import onnxruntime as ort

    import rkcompile

    inputs = dict(np.load(folder / INPUTS_FILE))
    load, runtime = rkcompile.load, rkcompile.Runtime  # imports the API's modules, as `import onnxruntime` did
    started, started_cpu = time.perf_counter(), time.process_time()
    if side == "onnxruntime":
        session = ort.InferenceSession(str(model), _one_thread(ort), providers=["CPUExecutionProvider"])
        session.run(None, inputs)
        return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - started_cpu}
    plan = load(folder / PLAN_FILE)
    loaded = time.perf_counter()
    prepared = runtime(plan)
    initialized = time.perf_counter()
    prepared.run(inputs)
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - started_cpu,
            "load": loaded - started, "init": initialized - loaded}


def repeated(model: Path, folder: Path, runs: int) -> dict:
    """Both sides' repeated runs in this process, interleaved (see the module's docstring)."""
    import numpy as np
    import onnxruntime as ort

    import rkcompile

    inputs = dict(np.load(folder / INPUTS_FILE))
    session = ort.InferenceSession(str(model), _one_thread(ort), providers=["CPUExecutionProvider"])
    session.run(None, inputs)
    runtime = rkcompile.Runtime(rkcompile.load(folder / PLAN_FILE))
    runtime.run(inputs)
    ort_seconds, seconds = [], []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, inputs)
        ort_seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        runtime.run(inputs)
        seconds.append(time.perf_counter() - started)
    return {"repeated": statistics.median(seconds), "ort_repeated": statistics.median(ort_seconds)}


def _one_thread(ort):
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return options


def measure(model: Path, target: str, runs: int, first_rounds: int) -> dict:
    """One model's figures, each from child processes of this script (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        _child(model, target, folder, "prepare")
        firsts: dict[str, list[dict]] = {"onnxruntime": [], "rkcompile": []}
        for round_ in range(first_rounds):
            for side in sorted(firsts, reverse=bool(round_ % 2)):  # each side goes first in turn
                firsts[side].append(_child(model, target, folder, "first", side))
        row = _child(model, target, folder, "repeated", runs=runs)
    ours, theirs = firsts["rkcompile"], firsts["onnxruntime"]
    return {"model": model.stem, "first": statistics.median(r["seconds"] for r in ours),
            "load": statistics.median(r["load"] for r in ours), "init": statistics.median(r["init"] for r in ours),
            "ort_first": statistics.median(r["seconds"] for r in theirs),
            "first_cpu_ratio": statistics.median(r["cpu"] for r in ours) / statistics.median(r["cpu"] for r in theirs),
            **row}


def _child(model: Path, target: str, folder: Path, task: str, side: str = "", runs: int = 1) -> dict:
    command = [sys.executable, __file__, str(model), "--child", task, "--folder", str(folder), "--target", target,
               "--runs", str(runs), "--side", side]
    child = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **ONE_THREAD}, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1]) if task != "prepare" else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[ZOO / f"{name}.onnx" for name in CNNS])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--runs", type=int, default=7, help="repeated runs of each side, after the first")
    parser.add_argument("--first-rounds", type=int, default=3, help="fresh processes per side for the first run")
    # a child's task, on one model: prepare, first (of --side) or repeated
    parser.add_argument("--child", choices=("prepare", "first", "repeated"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--side", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "prepare":
        prepare(args.models[0], args.target, args.folder)
        return 0
    if args.child:
        row = (first_run(args.models[0], args.folder, args.side) if args.child == "first"
               else repeated(args.models[0], args.folder, max(args.runs, 1)))
        print(json.dumps(row))
        return 0
    rows = []
    print(f"{'model':28} {'first s':>8} {'(load)':>8} {'(init)':>8} {'ort s':>8} {'ratio':>6} {'cpu':>6} "
          f"{'floor':>6}   {'repeated s':>10} {'ort s':>8} {'ratio':>6}")
    for model in args.models:
        row = measure(model, args.target, max(args.runs, 1), max(args.first_rounds, 1))
        row["first_ratio"], row["repeated_ratio"] = row["first"] / row["ort_first"], row["repeated"] / row["ort_repeated"]
        floor = (row["load"] + row["init"] + row["repeated"]) / row["ort_first"]
        rows.append(row)
        print(f"{row['model']:28} {row['first']:8.3f} {row['load']:8.3f} {row['init']:8.3f} {row['ort_first']:8.3f} "
              f"{row['first_ratio']:6.2f} {row['first_cpu_ratio']:6.2f} {floor:6.2f}   {row['repeated']:10.4f} "
              f"{row['ort_repeated']:8.4f} {row['repeated_ratio']:6.2f}", flush=True)
    repeated_ratios = [row["repeated_ratio"] for row in rows]
    print(f"repeated: median {statistics.median(repeated_ratios):.2f}x (bar 3x), worst {max(repeated_ratios):.2f}x "
          f"(bar 10x); first: worst {max(row['first_ratio'] for row in rows):.2f}x, on CPU seconds "
          f"{max(row['first_cpu_ratio'] for row in rows):.2f}x (bar 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
