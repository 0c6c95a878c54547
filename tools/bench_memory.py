"""Arena against lower bound, and planner time against plan time, for every zoo and light model.

    python tools/bench_memory.py [--targets rk3588,rk3576,rk3562]

Each plan is checked with verify_allocation. Planner time is the memory pass run again on the
finished context (it is deterministic, so it reproduces the plan's allocation).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import onnx

from rkcompile.plan.allocation import verify_allocation
from rkcompile.passes import memory
from rkcompile.compiler.pipeline import compile_model

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="rk3588,rk3576,rk3562")
    args = parser.parse_args()
    models = sorted(ZOO.glob("*.onnx")) + sorted(LIGHT.glob("*.onnx"))
    print(f"{'model':32s} {'target':7s} {'steps':>5s} {'arena KiB':>10s} {'LB KiB':>10s} {'arena/LB':>8s} "
          f"{'plan s':>7s} {'memory s':>8s} {'share':>6s}")
    ratios, shares, failures = [], [], 0
    for target in args.targets.split(","):
        for model in models:
            started = time.perf_counter()
            try:
                plan, ctx = compile_model(model, target)
            except Exception as exc:  # a benchmark reports every model, failing or not
                print(f"{model.stem:32s} {target:7s} failed: {type(exc).__name__}: {exc}")
                failures += 1
                continue
            plan_seconds = time.perf_counter() - started
            started = time.perf_counter()
            memory.run(ctx)
            memory_seconds = time.perf_counter() - started
            problems = verify_allocation(plan)
            failures += bool(problems)
            ratio = plan.memory.arena_bytes / max(plan.memory.lower_bound_bytes, 1)
            ratios.append(ratio)
            shares.append(memory_seconds / plan_seconds)
            print(f"{model.stem:32s} {target:7s} {len(plan.steps):5d} {plan.memory.arena_bytes / 1024:10.1f} "
                  f"{plan.memory.lower_bound_bytes / 1024:10.1f} {ratio:8.4f} {plan_seconds:7.2f} "
                  f"{memory_seconds:8.3f} {100 * memory_seconds / plan_seconds:5.1f}%"
                  + (f"  VERIFY: {problems[0]}" if problems else ""))
    if ratios:
        print(f"\narena/LB over {len(ratios)} plans: median {statistics.median(ratios):.4f}, max {max(ratios):.4f}; "
              f"memory pass share of plan time: median {100 * statistics.median(shares):.1f}%, "
              f"max {100 * max(shares):.1f}%")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
