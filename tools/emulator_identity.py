"""Whether two checkouts' emulators give bit-identical outputs on the same plans, per model.

    python tools/emulator_identity.py [MODEL_OR_DIR ...] --baseline-python PY [--python PY]
                                      [--target rk3588] [--dtype DTYPE] [--keep DIR]

Defaults to ../shared/zoo. Each model is planned once, by --python's rkcompile, into an
artifact (`rkcompile plan MODEL -o M.rkplan`), and that artifact is executed by both
interpreters' emulators (`rkcompile run --plan M.rkplan --inputs MODEL.npz --outputs OUT.npz`),
so a change in planning between the two checkouts cannot hide or fake an emulator difference.
Every output is compared byte for byte (its dtype, shape and raw bytes: NaN payloads and the
sign of zero included). A model whose input has a dynamic dimension is planned with
`--input-shape` from its NAME.npz, as tools/bench_plan.py does. `--dtype int8` plans int8
(calibrated on the seeded random inputs a plan without --calib uses) to check the int8 kernels.

Prints one line per model (identical, DIFFERENT with the outputs that differ, or failed with the
last stderr line) and exits 1 when any model differs or fails. A speed change to the emulator
that claims "outputs unchanged" runs this against the tree before it (a `git worktree` with its
own venv as the baseline).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import DEFAULT_ZOO, child_environment, input_shape_flags, model_paths  # noqa: E402


def completed(command: list[str], workdir: Path) -> str | None:
    """None when the command succeeded, else its last stderr line."""
    finished = subprocess.run(command, cwd=workdir, env=child_environment(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    if finished.returncode == 0:
        return None
    lines = finished.stderr.strip().splitlines() or [f"exit {finished.returncode}"]
    return lines[-1]


def differing_outputs(first: Path, second: Path) -> list[str]:
    """The output names whose dtype, shape or bytes differ between two --outputs files."""
    with np.load(first) as a, np.load(second) as b:
        names = sorted(set(a.files) | set(b.files))
        return [name for name in names
                if name not in a.files or name not in b.files or a[name].dtype != b[name].dtype
                or a[name].shape != b[name].shape or a[name].tobytes() != b[name].tobytes()]


def compare_model(path: Path, python: str, baseline: str, target: str, folder: Path,
                  dtype: str | None = None) -> tuple[str, str]:
    """(verdict, detail) for one model: "identical", "DIFFERENT" or "failed"."""
    artifact = folder / f"{path.stem}.rkplan"
    failure = completed([python, "-m", "rkcompile", "plan", str(path), "--target", target, "--quiet",
                         "-o", str(artifact), *input_shape_flags(path), *(["--dtype", dtype] if dtype else [])],
                        folder)
    if failure:
        return "failed", f"plan: {failure}"
    outputs = {}
    for side, interpreter in (("baseline", baseline), ("candidate", python)):
        outputs[side] = folder / f"{path.stem}.{side}.npz"
        command = [interpreter, "-m", "rkcompile", "run", "--plan", str(artifact), "--outputs", str(outputs[side])]
        if path.with_suffix(".npz").exists():
            command += ["--inputs", str(path.with_suffix(".npz"))]
        failure = completed(command, folder)
        if failure:
            return "failed", f"{side} run: {failure}"
    differing = differing_outputs(outputs["baseline"], outputs["candidate"])
    return ("DIFFERENT", ", ".join(differing)) if differing else ("identical", "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=[DEFAULT_ZOO])
    parser.add_argument("--baseline-python", required=True, help="the interpreter of the tree compared against")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose emulator is checked")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--dtype", help="the plans' --dtype (default: the plan command's)")
    parser.add_argument("--keep", type=Path, help="keep the artifacts and outputs in this folder")
    args = parser.parse_args()
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="emulator_identity_") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for path in model_paths(args.models):
            verdict, detail = compare_model(path, args.python, args.baseline_python, args.target, folder.resolve(),
                                             args.dtype)
            verdicts.append(verdict)
            print(f"{path.stem:42} {verdict}{': ' + detail if detail else ''}", flush=True)
    counts = {verdict: verdicts.count(verdict) for verdict in ("identical", "DIFFERENT", "failed")}
    print(f"{len(verdicts)} models: " + ", ".join(f"{n} {verdict}" for verdict, n in counts.items()))
    return 0 if counts["identical"] == len(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
