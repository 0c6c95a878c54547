"""The emulator's first run of a prepared plan and its later ones: what a calibration sample or
another input costs once the plan has run.

    python tools/emulator_later_runs.py MODEL [--target rk3588] [--runs 5] [--input-shape NAME:DIMS ...]

Plans MODEL as `rkcompile run MODEL` does, then runs the emulator `--runs` + 1 times in this
process on MODEL.npz's inputs (seeded random for those it lacks), each run timed as `rkcompile
run` times its one run (tools/bench_emulator.py), and prints one JSON line: `first_seconds`, and
`later_seconds`, the median of the later runs. The first run decodes the weights and builds the
step nodes and onnxruntime sessions a prepared plan keeps (docs/emulator.md, "Weight cache"); a
later run reads and writes every arena tensor at its planned place again, and computes every step
again, as the first did.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from rkcompile.api import prepare
from rkcompile.options import Options
from rkcompile.emulator import Prepared, emulate, make_inputs


def prepared_and_inputs(args: argparse.Namespace) -> tuple[Prepared, dict[str, np.ndarray]]:
    """`args.model` planned as `rkcompile run MODEL` plans it, and its inputs: MODEL.npz's where
    it has them, seeded random ones otherwise."""
    shapes = {name: tuple(int(d) for d in dims.split(",")) for name, dims in
              (flag.split(":", 1) for flag in args.input_shape)}
    prepared = prepare(args.model, args.target, Options(input_shapes=shapes))
    given = Path(args.model).with_suffix(".npz")
    arrays = dict(np.load(given)) if given.exists() else {}
    names = {spec.name for spec in prepared.plan.model.inputs}
    return prepared, make_inputs(prepared.plan, {k: v for k, v in arrays.items() if k in names}, seed=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS")
    parser.add_argument("--runs", type=int, default=5, help="later runs, after the first")
    args = parser.parse_args()
    prepared, inputs = prepared_and_inputs(args)
    seconds = []
    for _ in range(1 + max(args.runs, 1)):
        started = time.perf_counter()
        emulate(prepared, inputs)
        seconds.append(time.perf_counter() - started)
    print(json.dumps({"first_seconds": seconds[0], "later_seconds": statistics.median(seconds[1:])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
