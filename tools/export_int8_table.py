"""Does rknn-toolkit2 keep our int8 plan? One row per model: the toolkit's own int8 cosine, our
int8 export (`rkcompile export --dtype int8`, a QDQ model) built by the toolkit without
calibrating, and what our emulator predicts for the plan; each the worst output cosine against
onnxruntime on the original, on the model's NAME.npz input.

    python tools/export_int8_table.py MODEL_OR_DIR ... --python PEER_VENV/bin/python
                                      [--peer docs/int8_peer_rk3588.json] [--out DIR] [--json OUT]
                                      [--more-inputs]

Both sides calibrate on the same set, tools/int8_table.py's: the npz input and its 3 seeded
variations. The toolkit runs through tools/peer_int8.py in its own virtualenv (the recipe is at
the top of ../shared/peer/rknn_peer.py): `--prequantized` for the export, and for its own int8
unless --peer names a file of its earlier lines (tools/int8_table.py --peer's format). A plan
whose export its own check refuses for its outputs (onnxruntime on the file further than 0.002 of
cosine from the emulator) is exported without the check all the same, the refusal said below the
table; one it refuses for a step the file computes otherwise than the plan is not exported.

--more-inputs also runs all three on the other 3 calibration samples and on the 3 held-out
inputs tools/int8_table.py uses (seed 99), and adds a second table: per side the mean and the
worst over those 7 inputs. One input's cosine is not enough to compare two int8 executions of
a deep network: rounding differences of one step in about 1% of a layer's values (which the
toolkit's simulator has against onnxruntime on the same QDQ file, layer by layer) grow through
the network into up to +-0.004 on one input (tv_resnet50, tv_densenet121: the toolkit on the
export against the emulator on the plan), either way, which a mean over several inputs evens out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_peer_table import collect  # noqa: E402
from int8_table import (HELD_OUT_SEED, calibration_set, model_input, peer_results, worst_cosine,  # noqa: E402
                        write_calibration)

import rkcompile  # noqa: E402
from rkcompile.errors import CompileError  # noqa: E402
from rkcompile.quantization.params import seeded_variations  # noqa: E402

PEER_INT8 = Path(__file__).resolve().parent / "peer_int8.py"


#: The three sides of a row, as its fields name them
SIDES = ("toolkit_own", "toolkit_on_export", "emulator")


def toolkit_cosine(python: str, model: Path, calib: Path, sample: Path, original: Path | None = None,
                   held_out: list[Path] | None = None, timeout: int = 1800) -> dict:
    """tools/peer_int8.py's JSON line for `model` (prequantized, compared with `original`, when
    given; with `held_out`, also on each calibration sample and each of those inputs)."""
    command = [python, str(PEER_INT8), str(model), str(calib), str(sample)]
    if original is not None:
        command += ["--prequantized", str(original)]
    if held_out:
        command += ["--calibration-set", "--held-out", *map(str, held_out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": done.stderr.strip().splitlines()[-1:] or ["no output"]}


def every_input(line: dict) -> list[float] | None:
    """A tools/peer_int8.py line's worst cosines on the calibration samples, then on the held-out
    inputs (None: it was not run on both)."""
    calibration, held_out = line.get("calibration_cosines"), line.get("held_out_cosines")
    return None if not calibration or not held_out or None in calibration + held_out else calibration + held_out


def row(model: Path, out: Path, python: str, peer: dict[str, dict], more_inputs: bool = False) -> dict:
    input_name, x = model_input(model)
    calib = write_calibration(out / "calib" / model.stem, x)
    sample = out / f"{model.stem}_input.npz"
    np.savez(sample, **{input_name: x})
    held_out = []
    for index, value in enumerate(seeded_variations(x, seed=HELD_OUT_SEED) if more_inputs else []):
        held_out.append(out / f"{model.stem}_held_out_{index}.npz")
        np.savez(held_out[-1], **{input_name: value})
    plan = rkcompile.compile(model, "rk3588", dtype="int8", calibration=calib)
    exported = out / f"{model.stem}.int8.onnx"
    try:
        report, refused = rkcompile.export(plan, exported, inputs={input_name: x}).report, {}
    except CompileError:  # its check: onnxruntime on the file too far from the emulator; the toolkit still judges it
        try:
            report = rkcompile.export(plan, exported, inputs={input_name: x}, int8_tolerance=1.0).report
        except CompileError as exc:  # a step the file computes otherwise than the plan: no file to judge
            report, refused = None, {"export check": f"refused: {exc}"}
        else:
            cosines = [min(a["cosine"] for a in report["check"][side]) for side in ("outputs", "emulator")]
            refused = {"export check": "refused, written here without it: onnxruntime on the file {:.5f}, "
                                       "the emulator {:.5f}".format(*cosines)}
    own = peer.get(model.stem)
    if own is None or (more_inputs and every_input(own) is None):
        own = toolkit_cosine(python, model, calib, sample, held_out=held_out)
    through = toolkit_cosine(python, exported, calib, sample, model, held_out=held_out) if report is not None else {}
    settings = [t.applied[0] for t in plan.record.int8_techniques if t.name == "int8_settings"]
    return {"model": model.stem, "settings": settings[0] if settings else "",
            "float16_tensors": len(report["quantization"]["float16_tensors"]) if report is not None else None,
            "toolkit_own": own.get("worst_cosine"), "toolkit_on_export": through.get("worst_cosine"),
            "export_on_onnxruntime": min(a["cosine"] for a in report["check"]["outputs"]) if report is not None else None,
            "emulator": worst_cosine(plan, model, {input_name: x}),
            "errors": {**refused, **{side: entry["error"] for side, entry in (("own", own), ("export", through))
                                     if "error" in entry}},
            **({"inputs": {"toolkit_own": every_input(own), "toolkit_on_export": every_input(through),
                           "emulator": [worst_cosine(plan, model, {input_name: value})
                                        for value in calibration_set(x) + seeded_variations(x, seed=HELD_OUT_SEED)]}}
               if more_inputs else {})}


def render(rows: list[dict]) -> str:
    lines = ["| model | int8 settings | toolkit's own int8 | ours through the toolkit | our emulator | "
             "ours through the toolkit minus its own | minus the emulator |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["toolkit_own"], r["toolkit_on_export"], r["emulator"]]
        text = ["-" if c is None else f"{c:.5f}" for c in cells]
        gaps = ["-" if None in (a, b) else f"{a - b:+.5f}" for a, b in ((cells[1], cells[0]), (cells[1], cells[2]))]
        lines.append(f"| {r['model']} | {r['settings']} | {' | '.join(text)} | {' | '.join(gaps)} |")
    lines += [f"  {r['model']} ({side}): {error}" for r in rows for side, error in r["errors"].items()]
    spread = [r for r in rows if "inputs" in r]
    if spread:
        lines += ["", "| model | inputs | toolkit's own int8: mean (worst) | ours through the toolkit | our emulator | "
                      "ours through the toolkit minus its own: mean (worst) | minus the emulator |",
                  "|---|---|---|---|---|---|---|"]
    for r in spread:
        cosines = [r["inputs"][side] for side in SIDES]
        count = max(len(c) for c in cosines if c) if any(cosines) else 0
        text = ["-" if not c else f"{np.mean(c):.5f} ({min(c):.5f})" for c in cosines]
        gaps = ["-" if not a or not b else f"{np.mean(a) - np.mean(b):+.5f} ({min(a) - min(b):+.5f})"
                for a, b in ((cosines[1], cosines[0]), (cosines[1], cosines[2]))]
        lines.append(f"| {r['model']} | {count} | {' | '.join(text)} | {' | '.join(gaps)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path, nargs="+", help="ONNX files (NAME.npz beside each) or folders of them")
    parser.add_argument("--python", default=os.environ.get("RKNN_PEER_PYTHON"),
                        help="the peer venv's python (default: $RKNN_PEER_PYTHON)")
    parser.add_argument("--peer", type=Path, metavar="JSON",
                        help="the toolkit's own int8 lines (docs/int8_peer_rk3588.json) instead of building them")
    parser.add_argument("--out", type=Path, default=Path("exports_int8"), help="folder for the exports")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--more-inputs", action="store_true",
                        help="also the other calibration samples and 3 held-out inputs: mean and worst per side")
    args = parser.parse_args(argv)
    if not args.python or not Path(args.python).is_file():
        print("error: rknn-toolkit2's python is needed: --python PATH (or RKNN_PEER_PYTHON)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    peer = peer_results(args.peer) if args.peer is not None else {}
    print(render(collect(args.models, lambda model: row(model, args.out, args.python, peer, args.more_inputs), args.json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
