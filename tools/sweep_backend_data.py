"""Run onnx's shipped backend test data through the emulator: every case the planner accepts
must match the expected outputs at float16 (cosine >= 0.9999 per output).

    python tools/sweep_backend_data.py [pytorch-converted pytorch-operator ...] [-v]
        [--upgrade-opset 13]

Prints one line per case that is not a pass and the pass/total per collection; exits 1 when a
planned case fails. Most of these cases are opset 6, which the planner takes as it is;
`--upgrade-opset N` first converts each model with onnx.version_converter (a different model,
reported as such). Most are one op, which stays on the NPU: island pruning never moves the NPU
part that reads model inputs or writes outputs."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from rkcompile.context import Options
from rkcompile.api import prepare
from rkcompile.emulator import agreement, emulate
from rkcompile.errors import CompileError

DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
MIN_COSINE = 0.9999
FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_TINIEST = float(np.finfo(np.float16).smallest_subnormal)


@dataclass(frozen=True)
class Outcome:
    case: str
    #: "pass", "fail", "not planned", "planner error", or "outside float16" (data float16 cannot hold: some
    #: pytorch-operator cases are uninitialised float64 memory, 1e-309 to 1e228)
    status: str
    detail: str = ""


def load_tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def run_case(case: Path, upgrade_opset: int | None = None, target: str = "rk3588") -> Outcome:
    model = case / "model.onnx"
    with tempfile.TemporaryDirectory() as folder:
        if upgrade_opset is not None:
            try:
                converted = onnx.version_converter.convert_version(onnx.load(str(model)), upgrade_opset)
            except Exception as exc:  # the converter's own limits: the case is not planned
                return Outcome(case.name, "not planned", f"version_converter: {exc}")
            try:  # the converter does not adapt every op (opset-6 PRelu's per-channel slope)
                ReferenceEvaluator(converted).run(None, dict(zip([i.name for i in converted.graph.input],
                                                                  load_tensors(case / "test_data_set_0", "input"))))
            except Exception as exc:
                return Outcome(case.name, "not planned", f"the converted model fails in onnx.reference: {exc}")
            model = Path(folder) / "model.onnx"
            onnx.save(converted, str(model))
        try:
            prepared = prepare(model, target, Options())
        except CompileError as exc:
            return Outcome(case.name, "not planned", str(exc))
        except Exception as exc:  # a planner bug is reported, not fatal to the sweep
            return Outcome(case.name, "planner error", f"{type(exc).__name__}: {exc}")
    dataset = case / "test_data_set_0"
    values = load_tensors(dataset, "input")
    expected = load_tensors(dataset, "output")
    largest = max((float(np.abs(v).max()) for v in values + expected if v.size and v.dtype.kind == "f"), default=0.0)
    if largest > FLOAT16_MAX or 0 < largest < FLOAT16_TINIEST:
        return Outcome(case.name, "outside float16", f"data reaches {largest:.3g}")
    inputs = {spec.name: value for spec, value in zip(prepared.plan.model.inputs, values)}
    try:
        outputs = emulate(prepared, inputs).outputs
    except Exception as exc:  # a failing case is reported, the sweep goes on
        return Outcome(case.name, "fail", f"{type(exc).__name__}: {exc}")
    worst = min((agreement(spec.name, outputs[spec.name], want)
                 for spec, want in zip(prepared.plan.model.outputs, expected)), key=lambda a: a.cosine)
    detail = f"{worst.output} cosine {worst.cosine:.6f} max abs {worst.max_abs:.3g}"
    return Outcome(case.name, "pass" if worst.cosine >= MIN_COSINE else "fail", detail)


def sweep(collection: str, upgrade_opset: int | None = None) -> list[Outcome]:
    return [run_case(case, upgrade_opset) for case in sorted((DATA / collection).iterdir())
            if (case / "model.onnx").is_file()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("collections", nargs="*", default=["pytorch-converted", "pytorch-operator"])
    parser.add_argument("-v", "--verbose", action="store_true", help="print passes and planner refusals too")
    parser.add_argument("--upgrade-opset", type=int, metavar="N", help="convert each model to opset N first")
    args = parser.parse_args()
    failed = 0
    for collection in args.collections:
        outcomes = sweep(collection, args.upgrade_opset)
        for outcome in outcomes:
            if args.verbose or outcome.status in ("fail", "planner error"):
                print(f"{collection}/{outcome.case}: {outcome.status}: {outcome.detail}")
        planned = [o for o in outcomes if o.status in ("pass", "fail")]
        passed = sum(o.status == "pass" for o in planned)
        failed += len(planned) - passed
        skipped = {status: sum(o.status == status for o in outcomes) for status in ("not planned", "outside float16", "planner error")}
        print(f"{collection}: {passed}/{len(planned)} planned cases pass ({len(outcomes)} cases; "
              + ", ".join(f"{count} {status}" for status, count in skipped.items()) + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
