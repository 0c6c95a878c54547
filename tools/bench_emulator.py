"""Emulator time against onnxruntime single-thread time per zoo model, rk3588 float16.

    python tools/bench_emulator.py [--repeat 3] [MODEL ...]

Times are the median of --repeat runs of execution only (planning excluded for the emulator,
session creation excluded for onnxruntime). The emulator's BLAS runs on one thread too, unless
OPENBLAS_NUM_THREADS / OMP_NUM_THREADS say otherwise: a like-for-like ratio, and on a shared
2-core machine a second BLAS thread mostly waits for the other users."""
from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # before numpy loads its BLAS

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from rkcompile.context import Options
from rkcompile.api import prepare
from rkcompile.emulator import emulate, make_inputs

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    import onnxruntime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="zoo model names (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = args.models or sorted(p.stem for p in ZOO.glob("*.onnx"))
    print(f"{'model':28} {'emulator s':>11} {'ort 1T s':>9} {'ratio':>7}")
    for name in names:
        model = ZOO / f"{name}.onnx"
        prepared = prepare(model, "rk3588", Options())
        with np.load(ZOO / f"{name}.npz") as archive:
            inputs = make_inputs(prepared.plan, {k: archive[k] for k in archive.files})
        emulator = median_seconds(lambda: emulate(prepared, inputs), args.repeat)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        feeds = {i.name: inputs[i.name] for i in session.get_inputs()}
        ort = median_seconds(lambda: session.run(None, feeds), args.repeat)
        print(f"{name:28} {emulator:11.3f} {ort:9.3f} {emulator / ort:7.1f}x")


if __name__ == "__main__":
    main()
