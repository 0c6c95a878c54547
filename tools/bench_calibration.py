"""Seconds per sample of int8 calibration's float32 pass on a dev-zoo model (docs/quantization.md).

    python tools/bench_calibration.py MODEL [--samples 8] [--node-by-node]

The model's NAME.npz input plus seeded variations are the calibration set; each
`FloatReference.run` (one per sample) is timed. `--node-by-node` runs the planned graph on the
emulator's float kernels instead of one onnxruntime session, as calibration did before."""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from rkcompile.api import compile as compile_plan
from rkcompile.compiler.context import Options
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.quantization.params import seeded_variations

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model of ../shared/zoo, e.g. yolov8n")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--node-by-node", action="store_true")
    args = parser.parse_args()
    model = ZOO / f"{args.model}.onnx"
    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {initializer.name for initializer in graph.initializer}
    (name,) = [value.name for value in graph.input if value.name not in weights]
    x = np.load(ZOO / f"{args.model}.npz")[name]
    seconds: list[float] = []
    timed_run = FloatReference.run

    def run(self, *positional, **keywords):
        started = time.perf_counter()
        try:
            return timed_run(self, *positional, **keywords)
        finally:
            seconds.append(time.perf_counter() - started)

    FloatReference.run = run
    if args.node_by_node:
        FloatReference._run_whole_graph = lambda self, inputs: None
    with tempfile.TemporaryDirectory() as folder:
        for i, sample in enumerate([x] + seeded_variations(x, args.samples - 1)):
            np.save(Path(folder) / f"{i}.npy", sample)
        compile_plan(model, "rk3588", Options(dtype="int8", calibration=Path(folder)))
    print(f"{args.model}: {len(seconds)} samples {'node by node' if args.node_by_node else 'on onnxruntime'}: "
          f"first {seconds[0]:.3f} s, then {np.mean(seconds[1:]):.3f} s per sample")


if __name__ == "__main__":
    main()
