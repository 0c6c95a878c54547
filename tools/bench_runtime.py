"""A prepared `rkcompile.Runtime` beside onnxruntime's warm one-thread session, per model.

    python tools/bench_runtime.py [MODEL ...] [--target rk3588] [--runs 7]

Defaults to the dev-zoo CNNs in ../shared/zoo (mobilenet_v2, resnet18_halfwidth, squeezenet1_1,
lraspp_mobilenet_v3_large, yolov8n). Each model is measured in a child process of its own, both
sides in that one process on MODEL.npz's inputs (seeded random for those it lacks), with BLAS
pinned to one thread as onnxruntime's session is (`intra_op_num_threads=1`):

- first: onnxruntime's session creation and first run, against `rkcompile.load(M.rkplan)`,
  `Runtime(plan)` and its first run (the plan is compiled and saved beforehand, untimed: that
  is rknn-toolkit2's build, not its init_runtime); `(load)` is the part `rkcompile.load` took;
- repeated: the median of --runs further runs of that one session, against the median of --runs
  further `Runtime.run` calls, interleaved run by run so the machine's load hits both alike.

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


def measure(model: Path, target: str, runs: int) -> dict:
    """One model's figures, in this process: see the module's docstring."""
    import numpy as np
    import onnxruntime as ort

    import rkcompile
    from rkcompile.emulator import make_inputs

    with tempfile.TemporaryDirectory() as folder:
        saved = rkcompile.compile(model, target=target).save(Path(folder) / "model.rkplan")
        given = model.with_suffix(".npz")
        arrays = dict(np.load(given)) if given.exists() else {}
        record = rkcompile.load(saved).record
        names = {spec.name for spec in record.model.inputs}
        inputs = make_inputs(record, {k: v for k, v in arrays.items() if k in names})

        started = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        session.run(None, inputs)
        ort_first = time.perf_counter() - started

        started = time.perf_counter()
        plan = rkcompile.load(saved)
        loaded = time.perf_counter()
        runtime = rkcompile.Runtime(plan)
        runtime.run(inputs)
        first, load = time.perf_counter() - started, loaded - started

    ort_seconds, seconds = [], []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, inputs)
        ort_seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        runtime.run(inputs)
        seconds.append(time.perf_counter() - started)
    return {"model": model.stem, "first": first, "load": load, "ort_first": ort_first,
            "repeated": statistics.median(seconds), "ort_repeated": statistics.median(ort_seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[ZOO / f"{name}.onnx" for name in CNNS])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--runs", type=int, default=7, help="repeated runs of each side, after the first")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # a child: one model
    args = parser.parse_args()
    if args.in_process:
        print(json.dumps(measure(args.models[0], args.target, max(args.runs, 1))))
        return 0
    rows = []
    print(f"{'model':28} {'first s':>8} {'(load)':>8} {'ort s':>8} {'ratio':>6}   {'repeated s':>10} {'ort s':>8} "
          f"{'ratio':>6}")
    for model in args.models:
        child = subprocess.run([sys.executable, __file__, str(model), "--in-process", "--target", args.target,
                                "--runs", str(args.runs)], capture_output=True, text=True,
                               env={**os.environ, **ONE_THREAD}, check=True)
        row = json.loads(child.stdout.strip().splitlines()[-1])
        row["first_ratio"], row["repeated_ratio"] = row["first"] / row["ort_first"], row["repeated"] / row["ort_repeated"]
        rows.append(row)
        print(f"{row['model']:28} {row['first']:8.3f} {row['load']:8.3f} {row['ort_first']:8.3f} {row['first_ratio']:6.2f}   "
              f"{row['repeated']:10.4f} {row['ort_repeated']:8.4f} {row['repeated_ratio']:6.2f}", flush=True)
    repeated = [row["repeated_ratio"] for row in rows]
    print(f"repeated: median {statistics.median(repeated):.2f}x (bar 3x), worst {max(repeated):.2f}x (bar 10x); "
          f"first: worst {max(row['first_ratio'] for row in rows):.2f}x (bar 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
