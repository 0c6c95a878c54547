"""The int8 build a user waits for, side by side: `rkcompile plan MODEL --dtype int8 --calib DIR`
with default settings (the int8 settings chosen on the calibration data) as a whole process,
beside rknn-toolkit2's int8 build of the same model on as many samples, and beside another
checkout's plan process (a before and an after).

    python tools/bench_int8.py MODEL.onnx ... --calib DIR [--target rk3588] [--repeat 1]
                               [--python PY] [--baseline-python PY]
                               [--peer-python PEER_PY --peer-script rknn_peer.py]

Each repeat runs, model by model, the baseline's plan process (--baseline-python), --python's,
and the toolkit's (`PEER_PY rknn_peer.py MODEL --target T --quant --dataset-size N`, N the
number of files in --calib), in turn, so a shared machine's load hits them alike; each figure
is the least over the repeats. A side is left out when its interpreter is not given. Per model
it prints each side's wall seconds with the CPU seconds (user + system) of the same process,
the toolkit's own build-step seconds (its JSON "timings_s"), --python's wall time over the
toolkit's, and for each rkcompile side the int8 settings it chose and the worst calibration
cosine of the chosen plan (the plan's `int8_settings` entry), so a speed change shows at once
whether it chose or measured anything differently.

Every child runs in a temporary folder, timed as bench_plan.py times its children.
Wall time moves with the machine's load, CPU time far less: quote both.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import timed_output  # noqa: E402

PEER_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "peer" / "rknn_peer.py"
COSINE = re.compile(r"worst calibration cosine ([0-9.]+)")


def chosen(plan_json: Path) -> tuple[str, str]:
    """The int8 settings a plan chose and the worst calibration cosine it recorded."""
    plan = json.loads(plan_json.read_text())
    for entry in plan.get("int8_techniques", []):
        if entry["name"] == "int8_settings":
            found = COSINE.search(entry["note"])
            return entry["applied"][0], found.group(1) if found else "?"
    return "?", "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--calib", type=Path, required=True)
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--baseline-python")
    parser.add_argument("--peer-python")
    parser.add_argument("--peer-script", type=Path, default=PEER_SCRIPT)
    args = parser.parse_args()
    samples = len([p for p in args.calib.iterdir() if p.is_file()])
    sides = [(label, python) for label, python in (("before", args.baseline_python), ("after", args.python))
             if python]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        for model in args.models:
            best: dict[str, tuple[float, float]] = {}
            notes: dict[str, str] = {}
            build = None
            for _ in range(args.repeat):
                for label, python in sides:
                    plan_json = workdir / f"{model.stem}_{label}.json"
                    seconds, cpu, _, failure = timed_output(
                        [python, "-m", "rkcompile", "plan", str(model.resolve()), "--target", args.target,
                         "--dtype", "int8", "--calib", str(args.calib.resolve()), "--json", str(plan_json)], workdir)
                    if failure:
                        notes[label] = f"failed: {failure}"
                        continue
                    best[label] = min(best.get(label, (seconds, cpu)), (seconds, cpu))
                    settings, cosine = chosen(plan_json)
                    notes[label] = f"{settings}; {cosine}"
                if args.peer_python:
                    seconds, cpu, out, failure = timed_output(
                        [args.peer_python, str(args.peer_script), str(model.resolve()), "--target", args.target,
                         "--quant", "--dataset-size", str(samples)], workdir)
                    try:
                        build = json.loads(out).get("timings_s", {}).get("build") if not failure else None
                    except json.JSONDecodeError:
                        failure = "no JSON on its output"
                    if failure:
                        notes["toolkit"] = f"failed: {failure}"
                    else:
                        best["toolkit"] = min(best.get("toolkit", (seconds, cpu)), (seconds, cpu))
            rows.append((model.stem, best, notes, build))
            shown = lambda label: (f"{best[label][0]:7.1f} ({best[label][1]:6.1f})" if label in best  # noqa: E731
                                   else f"{'-':>16}")
            ratio = (f"{best['after'][0] / best['toolkit'][0]:6.2f}" if "after" in best and "toolkit" in best
                     else f"{'-':>6}")
            if len(rows) == 1:
                print(f"{'model':26} {'before s (cpu)':>16} {'after s (cpu)':>16} {'toolkit s (cpu)':>16} "
                      f"{'build':>6} {'ratio':>6}  chosen settings; worst calibration cosine")
            print(f"{model.stem:26} {shown('before')} {shown('after')} {shown('toolkit')} "
                  f"{build if build is not None else '-':>6} {ratio}  "
                  + " | ".join(f"{label}: {notes[label]}" for label in ("before", "after", "toolkit") if label in notes),
                  flush=True)
    print(f"{samples} calibration samples from {args.calib}; best of {args.repeat}; ratio: after wall / toolkit wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
