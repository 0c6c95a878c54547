"""onnxruntime's own first run of a process, timed as `rkcompile run` times the emulator's: the
setup a first run cannot skip, and the run.

    python tools/onnxruntime_first_run.py MODEL [--optimized PATH | --optimize-to PATH]

`rkcompile run` starts its clock with the plan made and its weight region in memory, and stops it
after the first run of the plan: weight decoding and step setup are in, planning is out
(tools/bench_emulator.py). This times onnxruntime the same way, in this process, which should be
a fresh one: a session (CPU provider, one intra-op and one inter-op thread) made from the model's
bytes already read, then one run on MODEL.npz's inputs (seeded random for an input it lacks, as
tools/bench_emulator.py feeds onnxruntime). It prints one JSON line: `session_seconds`,
`first_run_seconds` and `seconds`, their sum.

- With no flag the session is made from MODEL with onnxruntime's default graph optimizations,
  what a process running the model pays.
- `--optimize-to PATH` writes the model onnxruntime's optimizations make of MODEL (all of them,
  one thread) to PATH, prints `{"optimized": PATH}` and times nothing. `--optimized PATH` then
  makes the session from PATH with graph optimizations off: like the emulator's clock, it
  leaves out the graph rewriting onnxruntime does before it runs (its planning), and keeps the
  rest of its setup (graph resolution, kernels, initializers, the memory plan). The saved model
  holds kernels chosen for this machine (onnxruntime warns so): use it here, not elsewhere.

A model whose weights are in external files is read as bytes without them: the session fails,
and tools/bench_emulator.py prints `failed` for it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_emulator import onnxruntime_feeds  # noqa: E402


def one_thread(level: onnxruntime.GraphOptimizationLevel | None = None) -> onnxruntime.SessionOptions:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # the warning that an optimized model is machine-specific
    if level is not None:
        options.graph_optimization_level = level
    return options


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--optimized", type=Path, help="time a session on this model onnxruntime optimized before")
    chosen.add_argument("--optimize-to", type=Path, help="write onnxruntime's optimized model here; time nothing")
    args = parser.parse_args()
    if args.optimize_to is not None:
        options = one_thread()
        options.optimized_model_filepath = str(args.optimize_to)
        onnxruntime.InferenceSession(str(args.model), options, providers=["CPUExecutionProvider"])
        print(json.dumps({"optimized": str(args.optimize_to)}))
        return 0
    if args.optimized is not None:
        model, options = args.optimized.read_bytes(), one_thread(onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL)
    else:
        model, options = args.model.read_bytes(), one_thread()
    started = time.perf_counter()
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    made = time.perf_counter()
    feeds = onnxruntime_feeds(session, args.model)
    running = time.perf_counter()
    session.run(None, feeds)
    finished = time.perf_counter()
    print(json.dumps({"session_seconds": made - started, "first_run_seconds": finished - running,
                      "seconds": (made - started) + (finished - running)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
