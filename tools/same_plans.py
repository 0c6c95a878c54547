"""Are two checkouts' plans byte-identical? Plans each model with a reference interpreter and a
candidate one (`PY -m rkcompile plan MODEL --target T --json OUT`) and compares the JSON files
byte for byte: a speed change to the passes must leave every plan as it was.

    python tools/same_plans.py OUT MODEL_OR_DIR ... --before PY --after PY [--target rk3588 ...]

OUT/before/ keeps the reference plans, so a second run only re-plans the candidate. A model
whose input has a dynamic dimension is planned with `--input-shape` from its NAME.npz beside it
(as tools/bench_plan.py does). Prints `same`, `DIFF` or `FAILED` (either side's exit code or last
error line differing) per model and exits 1 when any model is not the same.
"""
from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import child_environment, input_shape_flags, model_paths  # noqa: E402


def plan(python: str, model: Path, target: str, output: Path) -> tuple[int, str]:
    """Exit code and last stderr line of one plan process writing `output`."""
    command = [python, "-m", "rkcompile", "plan", str(model), "--target", target, *input_shape_flags(model),
               "--quiet", "--json", str(output)]
    finished = subprocess.run(command, cwd=output.parent, env=child_environment(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    lines = finished.stderr.strip().splitlines()
    return finished.returncode, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--before", required=True, help="the reference checkout's interpreter")
    parser.add_argument("--after", required=True, help="the candidate checkout's interpreter")
    parser.add_argument("--target", nargs="+", default=["rk3588"])
    args = parser.parse_args()
    different = 0
    for side in ("before", "after"):
        (args.out / side).mkdir(parents=True, exist_ok=True)
    for target in args.target:
        for model in model_paths(args.models):
            name = f"{model.stem}.{target}.json"
            before, after = args.out / "before" / name, args.out / "after" / name
            status_file = before.with_suffix(".status")
            if not status_file.exists():
                code, line = plan(args.before, model.resolve(), target, before)
                status_file.write_text(f"{code} {line}")
            before_status = status_file.read_text()
            after.unlink(missing_ok=True)
            code, line = plan(args.after, model.resolve(), target, after)
            if f"{code} {line}" != before_status:
                verdict = f"FAILED before: {before_status[:80]!r} after: {code} {line[:80]!r}"
            elif code != 0:
                verdict = "same (both fail alike)"
            else:
                verdict = "same" if filecmp.cmp(before, after, shallow=False) else "DIFF"
            different += not verdict.startswith("same")
            print(f"{verdict:6} {target} {model.stem}", flush=True)
    print(f"{different} not the same", flush=True)
    return 1 if different else 0


if __name__ == "__main__":
    raise SystemExit(main())
