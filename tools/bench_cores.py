"""What 2 or 3 NPU cores buy, per the cost model: an fps table, and the calibration report.

    python tools/bench_cores.py table [--zoo DIR] [--targets rk3588,rk3576,rk3562] [--batches 1,2,3,8]
    python tools/bench_cores.py calibrate [--zoo DIR]

`table` plans each model once per target and re-runs only the multicore pass per batch (and
for the widest core mask), printing Markdown. `calibrate` builds ResNet-50 and YOLOv5s
(tools/calibration_models.py), takes mobilenet_v2 from the zoo, and compares the int8
estimate of rknn_run (host conversions left out: rknn_benchmark times rknn_run with inputs
already set) with the published figures docs/cost-model.md cites.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import onnx

from rkcompile.context import CompileContext
from rkcompile.cost_model import StepWork
from rkcompile.passes import multicore
from rkcompile.pipeline import compile_model
from rkcompile.plan import Multicore

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


def calibrate(zoo: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths = {"mobilenet_v2": zoo / "mobilenet_v2.onnx"}
        for name, build in MODELS.items():
            paths[name] = Path(folder) / f"{name}.onnx"
            onnx.save(build(), str(paths[name]))
        print("| model | published fps | estimated fps | deviation | batch 3 x | batch 8 x | 0_1_2 x |")
        print("|---|---|---|---|---|---|---|")
        ratios = {key: [] for key in PUBLISHED_RATIOS}
        for name, path in paths.items():
            _, ctx = compile_model(path, "rk3588")
            runs = [estimate(ctx, batch, mask, "int8", rknn_run_only=True)
                    for batch, mask in ((1, "auto"), (3, "auto"), (8, "auto"), (1, "0_1_2"))]
            single, three, eight, split = runs
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("table", "calibrate"))
    parser.add_argument("--zoo", type=Path, default=DEFAULT_ZOO)
    parser.add_argument("--targets", default="rk3588,rk3576,rk3562")
    parser.add_argument("--batches", default="1,2,3,8")
    args = parser.parse_args()
    if not args.zoo.is_dir():
        parser.error(f"--zoo: {args.zoo} is not a folder")
    if args.mode == "table":
        table(args.zoo, args.targets.split(","), [int(b) for b in args.batches.split(",")])
    else:
        calibrate(args.zoo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
