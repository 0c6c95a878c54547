"""Plan time beside onnxruntime session-creation time, per model.

    python tools/bench_plan.py [MODEL_OR_DIR ...] [--target rk3588] [--repeat 3]

Defaults to ../shared/zoo. Session creation uses ORT_ENABLE_ALL and one intra-op thread, so both
sides do a comparable amount of graph work on one core. Each figure is the best of --repeat runs.
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import onnxruntime as ort

from rkcompile.pipeline import compile_model

DEFAULT_ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"


def best_of(repeat: int, action) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()  # the previous run's garbage is not this run's cost
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def ort_session(path: Path) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[DEFAULT_ZOO])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    paths = sorted(p for m in args.models for p in ([m] if m.is_file() else m.glob("*.onnx")))
    print(f"{'model':28} {'plan s':>8} {'ort s':>8} {'ratio':>6}")
    ratios = []
    for path in paths:
        plan_time = best_of(args.repeat, lambda: compile_model(path, args.target))
        ort_time = best_of(args.repeat, lambda: ort_session(path))
        ratios.append(plan_time / ort_time)
        print(f"{path.stem:28} {plan_time:8.3f} {ort_time:8.3f} {ratios[-1]:6.2f}")
    if ratios:
        print(f"{'worst ratio':28} {'':8} {'':8} {max(ratios):6.2f}")


if __name__ == "__main__":
    main()
