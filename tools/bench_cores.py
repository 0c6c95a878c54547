"""What 2 or 3 NPU cores buy, per the cost model: an fps table, and the calibration report.

    python tools/bench_cores.py table [--zoo DIR] [--targets rk3588,rk3576,rk3562] [--batches 1,2,3,8]
    python tools/bench_cores.py calibrate [--zoo DIR]
    python tools/bench_cores.py fit [--zoo DIR] [--samples 4000] [--seed 1]

`table` plans each model once per target and re-runs only the multicore pass per batch (and
for the widest core mask), printing Markdown. `calibrate` builds ResNet-50 and YOLOv5s
(tools/calibration_models.py), takes mobilenet_v2 from the zoo, and compares the int8
estimate of rknn_run (host conversions left out: rknn_benchmark times rknn_run with inputs
already set) with the published figures docs/cost-model.md cites. `fit` searches the six
calibrated constants of rkcompile/plan/cost_model.py for the best agreement (random restarts plus
log-normal steps around the best so far) and prints them; copy them into the module by hand.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import onnx

from rkcompile.plan import cost_model
from rkcompile.compiler.context import CompileContext
from rkcompile.plan.cost_model import StepWork
from rkcompile.passes import multicore
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import Multicore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_models import MODELS  # noqa: E402

DEFAULT_ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
WIDEST_MASK = {3: "0_1_2", 2: "0_1"}

#: rknn_model_zoo RK3588 int8 single-core fps (the issue's figures) and the issue's multi-core ratios.
PUBLISHED_FPS = {"mobilenet_v2": 450.7, "resnet50": 110.1, "yolov5s": 48.4}
PUBLISHED_RATIOS = {"batch 8, 3 cores": (3.15, 3.15), "batch 3, 3 contexts": (2.8, 2.8),
                    "batch 1, core mask 0_1_2": (1.0, 1.3)}


def estimate(ctx: CompileContext, batch: int = 1, core_mask: str = "auto", as_dtype: str | None = None,
             rknn_run_only: bool = False) -> Multicore:
    """The multicore record of ctx's plan for another batch or core mask, optionally as int8."""
    ctx.options = replace(ctx.options, batch=batch, core_mask=core_mask)
    works = multicore.step_works(ctx, as_dtype)
    if rknn_run_only:
        works = [StepWork("host", 0, 0, 0, 0) if w.device == "host" else w for w in works]
    record, _ = multicore.schedule(ctx, works, as_dtype or ctx.options.dtype)
    return record


def table(zoo: Path, targets: list[str], batches: list[int]) -> None:
    header = "| model | target | " + " | ".join(f"batch {b} fps (x)" for b in batches) + " | widest mask, batch 1 |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for path in sorted(zoo.glob("*.onnx")):
        for target in targets:
            _, ctx = compile_model(path, target)
            cells = [f"{r.est_fps:.1f} ({r.speedup:.2f}x, {r.cores}c)" for r in (estimate(ctx, b) for b in batches)]
            mask = WIDEST_MASK.get(ctx.target.npu_cores)
            if mask:
                split = estimate(ctx, 1, mask)
                cells.append(f"{mask}: {split.est_fps:.1f} ({split.speedup:.2f}x, {len(split.splits)} splits)")
            else:
                cells.append("-")
            print(f"| {path.stem} | {target} | " + " | ".join(cells) + " |")


def calibration_contexts(zoo: Path, folder: str) -> dict[str, CompileContext]:
    paths = {"mobilenet_v2": zoo / "mobilenet_v2.onnx"}
    for name, build in MODELS.items():
        paths[name] = Path(folder) / f"{name}.onnx"
        onnx.save(build(), str(paths[name]))
    return {name: compile_model(path, "rk3588")[1] for name, path in paths.items()}


def calibration_runs(ctx: CompileContext) -> list[Multicore]:
    """int8 rknn_run estimates: one image on one core, batch 3, batch 8, one image on 0_1_2."""
    return [estimate(ctx, batch, mask, "int8", rknn_run_only=True)
            for batch, mask in ((1, "auto"), (3, "auto"), (8, "auto"), (1, "0_1_2"))]


def calibrate(zoo: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        contexts = calibration_contexts(zoo, folder)
        print("| model | published fps | estimated fps | deviation | batch 3 x | batch 8 x | 0_1_2 x |")
        print("|---|---|---|---|---|---|---|")
        ratios = {key: [] for key in PUBLISHED_RATIOS}
        for name, ctx in contexts.items():
            single, three, eight, split = calibration_runs(ctx)
            for key, run in zip(PUBLISHED_RATIOS, (eight, three, split)):
                ratios[key].append(run.speedup)
            deviation = single.est_fps / PUBLISHED_FPS[name] - 1
            print(f"| {name} | {PUBLISHED_FPS[name]} | {single.est_fps:.1f} | {deviation:+.1%} | "
                  f"{three.speedup:.2f} | {eight.speedup:.2f} | {split.speedup:.2f} |")
        print()
        print("| ratio | published | estimated (mobilenet_v2, resnet50, yolov5s) |")
        print("|---|---|---|")
        for key, (low, high) in PUBLISHED_RATIOS.items():
            shown = f"{low}" if low == high else f"{low}-{high}"
            print(f"| {key} | {shown} | " + ", ".join(f"{r:.2f}" for r in ratios[key]) + " |")


#: The calibrated constants of rkcompile/plan/cost_model.py and the range `fit` searches.
FIT_RANGES = {"MAC_EFFICIENCY": (0.3, 0.9), "CORE_DDR_SHARE": (0.15, 0.6), "DDR_EFFICIENCY": (0.4, 0.9),
              "STEP_SECONDS": (2e-6, 40e-6), "RUN_SECONDS": (100e-6, 1500e-6), "SPLIT_SECONDS": (5e-6, 150e-6)}


def misfit(contexts: dict[str, CompileContext]) -> float:
    """Squared log error of the single-core fps, plus the mobilenet_v2 batch ratios (the
    smallest model, where the run's fixed cost shows most), plus any core-mask speedup outside
    1.0-1.3."""
    total = 0.0
    for name, ctx in contexts.items():
        single, three, eight, split = calibration_runs(ctx)
        total += math.log(single.est_fps / PUBLISHED_FPS[name]) ** 2
        total += 2 * (max(0.0, split.speedup - 1.3) ** 2 + max(0.0, 1.0 - split.speedup) ** 2)
        if name == "mobilenet_v2":
            total += 4 * ((three.speedup - 2.8) ** 2 + (eight.speedup - 3.15) ** 2)
    return total


def fit(zoo: Path, samples: int, seed: int) -> None:
    chooser = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder:
        contexts = calibration_contexts(zoo, folder)
        best: tuple[float, dict[str, float]] | None = None
        for _ in range(samples):
            if best is None or chooser.random() < 0.4:
                trial = {key: chooser.uniform(low, high) for key, (low, high) in FIT_RANGES.items()}
            else:
                trial = {key: min(max(best[1][key] * math.exp(chooser.gauss(0, 0.15)), low), high)
                         for key, (low, high) in FIT_RANGES.items()}
            for key, value in trial.items():
                setattr(cost_model, key, value)
            score = misfit(contexts)
            if best is None or score < best[0]:
                best = score, trial
    print(f"misfit {best[0]:.4f}")
    for key, value in best[1].items():
        print(f"{key} = {value:.3g}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("table", "calibrate", "fit"))
    parser.add_argument("--zoo", type=Path, default=DEFAULT_ZOO)
    parser.add_argument("--targets", default="rk3588,rk3576,rk3562")
    parser.add_argument("--batches", default="1,2,3,8")
    parser.add_argument("--samples", type=int, default=4000, help="fit: parameter sets tried")
    parser.add_argument("--seed", type=int, default=1, help="fit: random seed")
    args = parser.parse_args()
    if not args.zoo.is_dir():
        parser.error(f"--zoo: {args.zoo} is not a folder")
    if args.mode == "table":
        table(args.zoo, args.targets.split(","), [int(b) for b in args.batches.split(",")])
    elif args.mode == "calibrate":
        calibrate(args.zoo)
    else:
        fit(args.zoo, args.samples, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
