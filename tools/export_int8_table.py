"""Does rknn-toolkit2 keep our int8 plan? One row per model: the toolkit's own int8 cosine, our
int8 export (`rkcompile export --dtype int8`, a QDQ model) built by the toolkit without
calibrating, and what our emulator predicts for the plan; each the worst output cosine against
onnxruntime on the original, on the model's NAME.npz input.

    python tools/export_int8_table.py MODEL_OR_DIR ... --python PEER_VENV/bin/python
                                      [--peer docs/int8_peer_rk3588.json] [--out DIR] [--json OUT]

Both sides calibrate on the same set, tools/int8_table.py's: the npz input and its 3 seeded
variations. The toolkit runs through tools/peer_int8.py in its own virtualenv (the recipe is at
the top of ../shared/peer/rknn_peer.py): `--prequantized` for the export, and for its own int8
unless --peer names a file of its earlier lines (tools/int8_table.py --peer's format). A plan
whose export its own check refuses (onnxruntime on the file further than 0.002 of cosine from the
emulator) is exported without the check all the same, the refusal said below the table.
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
from int8_table import model_input, peer_results, worst_cosine, write_calibration  # noqa: E402

import rkcompile  # noqa: E402
from rkcompile.errors import CompileError  # noqa: E402

PEER_INT8 = Path(__file__).resolve().parent / "peer_int8.py"


def toolkit_cosine(python: str, model: Path, calib: Path, sample: Path, original: Path | None = None,
                   timeout: int = 1800) -> dict:
    """tools/peer_int8.py's JSON line for `model` (prequantized, compared with `original`, when given)."""
    command = [python, str(PEER_INT8), str(model), str(calib), str(sample)]
    if original is not None:
        command += ["--prequantized", str(original)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": done.stderr.strip().splitlines()[-1:] or ["no output"]}


def row(model: Path, out: Path, python: str, peer: dict[str, dict]) -> dict:
    input_name, x = model_input(model)
    calib = write_calibration(out / "calib" / model.stem, x)
    sample = out / f"{model.stem}_input.npz"
    np.savez(sample, **{input_name: x})
    plan = rkcompile.compile(model, "rk3588", dtype="int8", calibration=calib)
    exported = out / f"{model.stem}.int8.onnx"
    try:
        report, refused = rkcompile.export(plan, exported, inputs={input_name: x}).report, {}
    except CompileError:  # its check: onnxruntime on the file too far from the emulator; the toolkit still judges it
        report = rkcompile.export(plan, exported, inputs={input_name: x}, int8_tolerance=1.0).report
        cosines = [min(a["cosine"] for a in report["check"][side]) for side in ("outputs", "emulator")]
        refused = {"export check": "refused, written here without it: onnxruntime on the file {:.5f}, "
                                   "the emulator {:.5f}".format(*cosines)}
    own = peer.get(model.stem) or toolkit_cosine(python, model, calib, sample)
    through = toolkit_cosine(python, exported, calib, sample, model)
    settings = [t.applied[0] for t in plan.record.int8_techniques if t.name == "int8_settings"]
    return {"model": model.stem, "settings": settings[0] if settings else "",
            "float16_tensors": len(report["quantization"]["float16_tensors"]),
            "toolkit_own": own.get("worst_cosine"), "toolkit_on_export": through.get("worst_cosine"),
            "export_on_onnxruntime": min(a["cosine"] for a in report["check"]["outputs"]),
            "emulator": worst_cosine(plan, model, {input_name: x}),
            "errors": {**refused, **{side: entry["error"] for side, entry in (("own", own), ("export", through))
                                     if "error" in entry}}}


def render(rows: list[dict]) -> str:
    lines = ["| model | int8 settings | toolkit's own int8 | ours through the toolkit | our emulator | "
             "ours through the toolkit minus its own | minus the emulator |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["toolkit_own"], r["toolkit_on_export"], r["emulator"]]
        text = ["-" if c is None else f"{c:.5f}" for c in cells]
        gaps = ["-" if None in (a, b) else f"{a - b:+.5f}" for a, b in ((cells[1], cells[0]), (cells[1], cells[2]))]
        lines.append(f"| {r['model']} | {r['settings']} | {' | '.join(text)} | {' | '.join(gaps)} |")
    lines += [f"  {r['model']} ({side}): {error}" for r in rows for side, error in r["errors"].items()]
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
    args = parser.parse_args(argv)
    if not args.python or not Path(args.python).is_file():
        print("error: rknn-toolkit2's python is needed: --python PATH (or RKNN_PEER_PYTHON)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    peer = peer_results(args.peer) if args.peer is not None else {}
    print(render(collect(args.models, lambda model: row(model, args.out, args.python, peer), args.json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
