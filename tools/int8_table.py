"""int8 cosines of the zoo's CNNs at rk3588 against onnxruntime float32 (docs/quantization.md).

    python tools/int8_table.py [--method minmax|percentile|kl|mmse] [--float16 TENSOR ...] [MODEL ...]

Each model is calibrated on its NAME.npz input plus 3 seeded variations (`seeded_variations`),
planned once, and emulated on the npz input (the issue's measure) and on 3 held-out variations
(seed 99) not in the calibration set; the row is the worst output's cosine on each."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx

from rkcompile.context import Options
from rkcompile.api import prepare
from rkcompile.emulator import agreement, emulate, onnxruntime_outputs
from rkcompile.quantize import METHODS, seeded_variations

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
CNNS = ("resnet18_halfwidth", "mobilenet_v2", "squeezenet1_1", "lraspp_mobilenet_v3_large", "yolov8n")
HELD_OUT_SEED = 99


def worst_cosine(prepared, model: Path, inputs: dict[str, np.ndarray]) -> float:
    produced = emulate(prepared, inputs).outputs
    expected = onnxruntime_outputs(model, inputs)
    return min(agreement(name, produced[name], value).cosine for name, value in expected.items())


def measure(name: str, method: str, float16: tuple[str, ...]) -> str:
    model = ZOO / f"{name}.onnx"
    data = np.load(ZOO / f"{name}.npz")
    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {initializer.name for initializer in graph.initializer}
    (input_name,) = [value.name for value in graph.input if value.name not in weights]
    x = data[input_name]
    with tempfile.TemporaryDirectory() as folder:
        for i, sample in enumerate([x] + seeded_variations(x)):
            np.save(Path(folder) / f"{i}.npy", sample)
        prepared = prepare(model, "rk3588", Options(dtype="int8", calibration=Path(folder),
                                                      calibration_method=method, float16_tensors=float16))
    on_npz = worst_cosine(prepared, model, {input_name: x})
    held_out = [worst_cosine(prepared, model, {input_name: v}) for v in seeded_variations(x, seed=HELD_OUT_SEED)]
    return (f"| {name} | {method} | {len(float16)} | {on_npz:.5f} | {np.mean(held_out):.5f} "
            f"({min(held_out):.5f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=CNNS)
    parser.add_argument("--method", choices=METHODS, default="minmax")
    parser.add_argument("--float16", action="append", default=[], metavar="TENSOR")
    args = parser.parse_args()
    print("| model | method | float16 tensors | npz input | held-out mean (min) |")
    print("|---|---|---|---|---|")
    for name in args.models:
        print(measure(name, args.method, tuple(args.float16)), flush=True)


if __name__ == "__main__":
    main()
