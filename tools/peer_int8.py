"""rknn-toolkit2's int8 cosine on the calibration set rkcompile's int8 tables use
(docs/quantization.md), for comparison. Runs in the toolkit's own virtualenv (the recipe is
at the top of ../shared/peer/rknn_peer.py); imports nothing of rkcompile.

    PEER_VENV/bin/python tools/peer_int8.py MODEL.onnx CALIB_DIR INPUT.npz [--target rk3588]
                         [--algorithm normal|mmse] [--disable-rule RULE ...] [--analysis DIR]
                         [--held-out NPZ ...] [--calibration-set]

CALIB_DIR holds the calibration samples as 0.npy, 1.npy, ... (one-input models: the npz input
and its 3 seeded variations, as tools/int8_table.py --save-calib writes them). The model is
built with config(target_platform, quantized_algorithm, quantized_method='channel') and
build(do_quantization=True) on those files, run on the simulator on INPUT.npz's input, and
compared with onnxruntime on the model. A model above the newest opset the toolkit reads (19)
is built from a copy onnx.version_converter brings down to it, as tools/run_peer_zoo.py does.
Prints one JSON line: the worst output cosine, per output cosines, and the build seconds (or
the step that failed). --analysis DIR also runs the toolkit's accuracy_analysis on the
simulator for INPUT.npz's input and leaves its report in DIR (error_analysis.txt: per layer the
"entire" and "single" cosines, to set beside `rkcompile run --accuracy-analysis`).
--held-out NPZ ... runs the same build on more inputs (tools/int8_table.py --save-calib writes
the 3 seed-99 inputs its held-out column uses) and adds each one's worst output cosine and
their mean to the line ("held_out_cosines", "held_out_mean"). --calibration-set runs it on each
calibration sample of CALIB_DIR too, in index order, and adds each one's worst output cosine
("calibration_cosines": the cosine on the calibration set itself, which tools/int8_table.py
--calibration-set compares with ours).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: rknn-toolkit2 2.5.0: "Unsupport onnx opset 20, need <= 19!"
NEWEST_OPSET = 19


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("calib", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--algorithm", default="normal", choices=["normal", "mmse"])
    parser.add_argument("--disable-rule", action="append", default=[])
    parser.add_argument("--analysis", type=Path, metavar="DIR")
    parser.add_argument("--held-out", type=Path, nargs="+", default=[], metavar="NPZ")
    parser.add_argument("--calibration-set", action="store_true")
    parser.add_argument("--optimization-level", type=int, choices=[0, 1, 2, 3],
                        help="config(optimization_level=N) (the toolkit's default: 3)")
    parser.add_argument("--prequantized", type=Path, metavar="ORIGINAL",
                        help="MODEL is a QDQ model of ORIGINAL (rkcompile export --dtype int8): build it without "
                             "calibrating and compare with onnxruntime on ORIGINAL")
    args = parser.parse_args()
    import onnx
    import onnxruntime as ort
    from rknn.api import RKNN

    graph = onnx.load(args.model, load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    (name,) = [v.name for v in graph.input if v.name not in weights]
    x = np.load(args.inputs)[name]
    result = {"model": Path(args.model).stem, "algorithm": args.algorithm}
    scratch = Path(tempfile.mkdtemp(prefix="peer_int8_"))
    built = args.model
    opset = max((o.version for o in onnx.load(args.model, load_external_data=False).opset_import
                 if o.domain in ("", "ai.onnx")), default=0)
    if opset > NEWEST_OPSET:
        from onnx import version_converter

        built = str(scratch / Path(args.model).name)
        try:
            onnx.save(version_converter.convert_version(onnx.load(args.model), NEWEST_OPSET), built)
        except Exception as exc:  # noqa: BLE001  (e.g. an op with no older version: Gelu is new in opset 20)
            result["error"] = f"opset {opset} -> {NEWEST_OPSET} conversion: {str(exc).strip().splitlines()[-1]}"
            print(json.dumps(result))
            return 1
        result["note"] = f"built from a copy converted from opset {opset} to {NEWEST_OPSET}"
    listing = scratch / "dataset.txt"
    listing.write_text("".join(f"{path.resolve()}\n" for path in sorted(args.calib.glob("*.npy"))))
    rknn = RKNN(verbose=False)
    config = dict(target_platform=args.target, quantized_algorithm=args.algorithm, quantized_method="channel")
    if args.disable_rule:
        config["disable_rules"] = args.disable_rule
    if args.optimization_level is not None:
        config["optimization_level"] = args.optimization_level
    started = time.perf_counter()
    steps = [("config", lambda: rknn.config(**config)), ("load_onnx", lambda: rknn.load_onnx(built)),
             ("build", lambda: rknn.build(do_quantization=True, dataset=str(listing)) if args.prequantized is None
              else rknn.build(do_quantization=False))]
    if args.analysis is not None:
        np.save(scratch / "input.npy", x)
        steps.append(("accuracy_analysis", lambda: rknn.accuracy_analysis(
            inputs=[str(scratch / "input.npy")], output_dir=str(args.analysis))))
    steps.append(("init_runtime", lambda: rknn.init_runtime()))
    for step, call in steps:
        try:
            code = call()
        except BaseException as exc:  # the toolkit raises or exits on some failures
            code = f"{type(exc).__name__}: {exc}"
        if code != 0:
            result["error"] = f"{step}: {code}"
            print(json.dumps(result))
            return 1
    result["build_seconds"] = round(time.perf_counter() - started, 1)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(args.prequantized or args.model), options, providers=["CPUExecutionProvider"])

    def output_cosines(x: np.ndarray) -> list[float | None]:
        produced = rknn.inference(inputs=[x], data_format=["nchw"])
        cosines = []
        for got, want in zip(produced, reference.run(None, {name: x})):
            a = np.asarray(got, np.float64).reshape(-1)
            b = np.asarray(want, np.float64).reshape(-1)
            denominator = np.linalg.norm(a) * np.linalg.norm(b)
            cosines.append(float(a @ b / denominator) if a.size == b.size and denominator > 0 else None)
        return cosines

    def worst(cosines: list[float | None]) -> float | None:
        return min((c for c in cosines if c is not None), default=None)

    result["cosines"] = output_cosines(x)
    result["worst_cosine"] = worst(result["cosines"])
    if args.held_out:
        result["held_out_cosines"] = [worst(output_cosines(np.load(path)[name])) for path in args.held_out]
        known = [c for c in result["held_out_cosines"] if c is not None]
        result["held_out_mean"] = float(np.mean(known)) if known else None
    if args.calibration_set:
        # 0.npy, 1.npy, ... in index order: 10.npy after 9.npy, not after 1.npy
        in_index_order = sorted(args.calib.glob("*.npy"), key=lambda path: (len(path.stem), path.stem))
        result["calibration_cosines"] = [worst(output_cosines(np.load(path))) for path in in_index_order]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
