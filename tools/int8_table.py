"""int8 cosines of zoo CNNs at rk3588 against onnxruntime float32 (docs/quantization.md).

    python tools/int8_table.py [--zoo DIR] [--method auto|minmax|percentile|kl|mmse] [--float16 TENSOR ...]
                               [--techniques [--held-out] | --auto-float16 COSINE] [--save-calib DIR]
                               [--digits N] [--peer docs/int8_peer_rk3588.json] [--range-jitter EPS [--seed N]]
                               [--calibration-set]
                               [MODEL ...]

Each model is calibrated on its NAME.npz input plus 3 seeded variations (`seeded_variations`).
By default it is planned once and emulated on the npz input (the issue's measure) and on 3
held-out variations (seed 99) not in the calibration set; the row is the int8 settings (chosen
on the calibration data unless --method fixes the range method), the worst output's cosine on
each (--digits N decimals, default 5), and with --peer JSON (tools/peer_int8.py's lines
collected, as docs/int8_peer_rk3588.json holds them) rknn-toolkit2's worst cosine for the model
and ours minus it, then the same for the held-out mean where the line has one. --techniques plans it four times (nothing, --equalization, --bias-correction, both;
each switched explicitly, with --method, default minmax) and gives the npz input's cosine of each (with --held-out, the mean
over the 3 held-out inputs instead: the npz input is a calibration sample). --auto-float16 COSINE
chooses the int8 settings as a plan does, then runs both searches of rkcompile/compiler/auto_float16.py
(or those --search names) on top of them and gives, per search, the float16 tensors
chosen, the worst calibration cosine reached, the npz input's cosine and the plans judged
(each search's progress on stderr).
--range-jitter EPS scales every calibrated activation range by 1 + EPS * N(0, 1) (drawn per range
from --seed and the range itself, so every candidate plan of the choice gets the same draw):
how far a change far below calibration's own precision moves the cosines, i.e. the spread of
one input's cosine that a comparison with another tool cannot resolve.
--calibration-set adds the cosine on the calibration set itself: the worst over its 4 samples
(the npz input and its 3 variations) and their mean, and with --peer the toolkit's (the line's
"calibration_cosines", tools/peer_int8.py --calibration-set) and ours minus it.
--save-calib DIR also writes each model's calibration set as DIR/NAME/0.npy..., its npz
input as DIR/NAME_input.npz and its 3 held-out inputs as DIR/NAME_held_out_0.npz ... (what
tools/peer_int8.py gives rknn-toolkit2: the calibration set, the input, --held-out)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import rkcompile
from rkcompile.api import EMULATOR_RUNTIME
from rkcompile.compiler.auto_float16 import STRATEGIES, choose, judge_for
from rkcompile.options import CHOOSE, Options
from rkcompile.compiler.int8_choice import settle
from rkcompile.compiler.pipeline import finish_plan, front_half
from rkcompile.emulator import agreement, onnxruntime_outputs
from rkcompile.passes import quantize as quantize_pass
from rkcompile.quantization.params import METHODS, seeded_variations

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
CNNS = ("resnet18_halfwidth", "mobilenet_v2", "squeezenet1_1", "lraspp_mobilenet_v3_large", "yolov8n")
HELD_OUT_SEED = 99
TECHNIQUES = {"none": {"equalization": False, "bias_correction": False},
              "equalization": {"equalization": True, "bias_correction": False},
              "bias correction": {"equalization": False, "bias_correction": True},
              "both": {"equalization": True, "bias_correction": True}}


@contextlib.contextmanager
def jittered_ranges(eps: float, seed: int):
    """While inside, the quantize pass scales each calibrated activation range [low, high] by
    1 + eps * N(0, 1), drawn from `seed` and the range's own bits (the same draw for the same
    range in every plan); the zero point stays (low / scale does not change)."""
    exact = quantize_pass.activation_params

    def jittered(low: float, high: float, source: str, *grid_options):
        key = np.frombuffer(np.array([low, high], np.float64).tobytes(), np.uint32)
        factor = 1 + eps * np.random.default_rng([seed, *key.tolist()]).standard_normal()
        return exact(low * factor, high * factor, source, *grid_options)

    quantize_pass.activation_params = jittered
    try:
        yield
    finally:
        quantize_pass.activation_params = exact


def worst_cosine(plan, model: Path, inputs: dict[str, np.ndarray]) -> float:
    produced = rkcompile.run(plan, inputs)
    expected = onnxruntime_outputs(model, inputs)
    return min(agreement(name, produced[name], value).cosine for name, value in expected.items())


def model_input(model: Path) -> tuple[str, np.ndarray]:
    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {initializer.name for initializer in graph.initializer}
    (input_name,) = [value.name for value in graph.input if value.name not in weights]
    return input_name, np.load(model.with_suffix(".npz"))[input_name]


def calibration_set(x: np.ndarray) -> list[np.ndarray]:
    """A model's calibration samples: its npz input first, then its 3 seeded variations."""
    return [x] + seeded_variations(x)


def write_calibration(folder: Path, x: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(calibration_set(x)):
        np.save(folder / f"{i}.npy", sample)
    return folder


def measure(model: Path, options: Options, args, folder: Path) -> str:
    name, (input_name, x) = model.stem, model_input(model)
    options = dataclasses.replace(options, calibration=write_calibration(folder / name, x))
    if args.save_calib is not None:
        write_calibration(args.save_calib / name, x)
        np.savez(args.save_calib / f"{name}_input.npz", **{input_name: x})
        for i, held_out in enumerate(seeded_variations(x, seed=HELD_OUT_SEED)):
            np.savez(args.save_calib / f"{name}_held_out_{i}.npz", **{input_name: held_out})
    if args.techniques:
        method = {"calibration_method": "minmax" if args.method is None else args.method}
        plans = [rkcompile.compile(model, "rk3588", dataclasses.replace(options, **method, **switches))
                 for switches in TECHNIQUES.values()]
        if args.held_out:
            cells = [np.mean([worst_cosine(plan, model, {input_name: v})
                              for v in seeded_variations(x, seed=HELD_OUT_SEED)]) for plan in plans]
        else:
            cells = [worst_cosine(plan, model, {input_name: x}) for plan in plans]
        return f"| {name} | " + " | ".join(f"{c:.{args.digits}f}" for c in cells) + " |"
    if args.auto_float16 is not None:
        cells = []
        judge = judge_for(front_half(model, "rk3588", options, EMULATOR_RUNTIME), finish_plan)
        settle(judge, options, lambda text: print(f"{name}: {text}", file=sys.stderr, flush=True))
        for strategy in STRATEGIES:
            if args.search and strategy not in args.search:
                cells.append("not run | | |")
                continue
            search = choose(judge, args.auto_float16, strategy,
                            progress=lambda text: print(f"{name} {strategy}: {text}", file=sys.stderr, flush=True))
            cells.append(f"{len(search.chosen)} | {search.cosine:.5f} | "
                         f"{worst_cosine(search.plan, model, {input_name: x}):.5f} | {search.plans_judged}")
        lowered = sum(target < args.auto_float16 for target in search.targets)  # samples held to all-float16's
        target = f"{args.auto_float16:.5f}" + (f" (all-float16 on {lowered} samples)" if lowered else "")
        return f"| {name} | {search.start_cosine:.5f} | {target} | " + " | ".join(cells) + " |"
    with (jittered_ranges(args.range_jitter, args.seed) if args.range_jitter else contextlib.nullcontext()):
        plan = rkcompile.compile(model, "rk3588", options)
    on_npz = worst_cosine(plan, model, {input_name: x})
    held_out = [worst_cosine(plan, model, {input_name: v}) for v in seeded_variations(x, seed=HELD_OUT_SEED)]
    digits = args.digits
    chosen = [t.applied[0] for t in plan.record.int8_techniques if t.name == "int8_settings"]
    settings = chosen[0] if chosen else options.calibration_method
    if args.range_jitter:
        settings += f"; ranges x (1 + {args.range_jitter:g} N(0, 1)), seed {args.seed}"
    row = (f"| {name} | {settings} | {len(options.float16_tensors)} | {on_npz:.{digits}f} | "
           f"{np.mean(held_out):.{digits}f} ({min(held_out):.{digits}f}) |")
    line = args.peer.get(name, {}) if args.peer is not None else {}
    if args.peer is not None:
        for ours, theirs in ((on_npz, line.get("worst_cosine")), (np.mean(held_out), line.get("held_out_mean"))):
            row += " | |" if theirs is None else f" {theirs:.{digits}f} | {ours - theirs:+.{digits}f} |"
    if args.calibration_set:
        ours = [on_npz] + [worst_cosine(plan, model, {input_name: v}) for v in calibration_set(x)[1:]]
        row += f" {min(ours):.{digits}f} ({np.mean(ours):.{digits}f}) |"
        if args.peer is not None:
            theirs = [c for c in line.get("calibration_cosines") or () if c is not None]
            row += (" | |" if len(theirs) != len(ours) else f" {min(theirs):.{digits}f} ({np.mean(theirs):.{digits}f}) | "
                    f"{min(ours) - min(theirs):+.{digits}f} ({np.mean(ours) - np.mean(theirs):+.{digits}f}) |")
    return row


HEADERS = {
    "techniques": "| model | none | equalization | bias correction | both |",
    "auto_float16": ("| model | int8 (calibration) | target | sensitivity: float16 tensors | cosine (calibration) | "
                     "npz input | plans | worst drop: float16 tensors | cosine (calibration) | npz input | plans |"),
    "default": "| model | int8 settings | float16 tensors | npz input | held-out mean (min) |",
}


def peer_results(path: Path) -> dict[str, dict]:
    """Model -> tools/peer_int8.py's line for it (rknn-toolkit2's worst output cosine, and its
    held-out mean where it was run with --held-out), from a JSON of those lines ({"results":
    [...]}, docs/int8_peer_rk3588.json) or the lines themselves; a failed build has none."""
    text = path.read_text()
    try:
        lines = json.loads(text)["results"]
    except (json.JSONDecodeError, KeyError, TypeError):
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {line["model"]: line for line in lines if line.get("worst_cosine") is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=CNNS)
    parser.add_argument("--zoo", type=Path, default=ZOO)
    parser.add_argument("--method", choices=(*METHODS, CHOOSE),
                        help=f"the range method (default: {CHOOSE}, chosen per model; --techniques: minmax)")
    parser.add_argument("--float16", action="append", default=[], metavar="TENSOR")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--techniques", action="store_true")
    mode.add_argument("--auto-float16", type=float, metavar="COSINE")
    parser.add_argument("--search", action="append", choices=STRATEGIES,
                        help="with --auto-float16: run only this search (repeatable; default both)")
    parser.add_argument("--held-out", action="store_true",
                        help="with --techniques: each cell is the mean over the 3 held-out inputs, not the npz input")
    parser.add_argument("--save-calib", type=Path, metavar="DIR")
    parser.add_argument("--range-jitter", type=float, metavar="EPS",
                        help="scale each calibrated activation range by 1 + EPS * N(0, 1) (default mode only)")
    parser.add_argument("--seed", type=int, default=1, help="with --range-jitter: the draw (default 1)")
    parser.add_argument("--calibration-set", action="store_true",
                        help="also the cosine on each calibration sample: their worst and mean (default mode only)")
    parser.add_argument("--digits", type=int, default=5, help="decimals of each cosine (default 5)")
    parser.add_argument("--peer", type=Path, metavar="JSON",
                        help="add rknn-toolkit2's worst cosine per model from this file, and ours minus it")
    args = parser.parse_args()
    if args.peer is not None:
        args.peer = peer_results(args.peer)
    options = Options(dtype="int8", calibration_method=CHOOSE if args.method is None else args.method,
                      float16_tensors=tuple(args.float16))
    header = HEADERS["techniques" if args.techniques else "auto_float16" if args.auto_float16 else "default"]
    if header == HEADERS["default"]:
        if args.peer is not None:
            header += " rknn-toolkit2 | ours minus it | rknn-toolkit2 held-out mean | ours minus it |"
        if args.calibration_set:
            header += " calibration set: worst (mean) |"
            if args.peer is not None:
                header += " rknn-toolkit2: worst (mean) | ours minus it |"
    print(header)
    print("|---" * header.count(" | ") + "|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            print(measure(args.zoo / f"{name}.onnx", options, args, Path(folder)), flush=True)


if __name__ == "__main__":
    main()
