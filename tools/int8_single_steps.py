"""Each int8 step alone: its cosine when it runs on its inputs' float32 reference values,
quantized with the plan's parameters (rknn-toolkit2 accuracy_analysis's "single" column), so
the error a step adds is seen apart from everything before it (docs/quantization.md, Weights).

    python tools/int8_single_steps.py MODEL CALIB INPUT.npz [--no-bias-correction] [--peer ERROR_ANALYSIS.txt]

With --peer (the error_analysis.txt `tools/peer_int8.py --analysis DIR` writes for the same
model, calibration and input), each step whose output the toolkit names too gets the toolkit's
single cosine beside ours, and a summary per step kind: the mean and mean absolute difference
(ours minus the toolkit's; the toolkit prints 5 digits, so a mean absolute difference near 3e-6
is agreement). The single cosines are `rkcompile.accuracy_analysis`'s `single` column.
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

import rkcompile
from rkcompile.compiler.context import Options

#: a layer row of rknn-toolkit2's error_analysis.txt: [Op] name  entire cos | euc  single cos | euc
PEER_ROW = re.compile(r"\[(\w+)\] (\S+)\s+([\d.]+) \|\s*[\d.]+\s+([\d.]+)")


def single_cosines(model: Path, options: Options, inputs: dict[str, np.ndarray]) -> list[tuple[int, str, str, float]]:
    """(step, kernel, output, single cosine) for every int8 output of an NPU step."""
    plan = rkcompile.compile(model, "rk3588", options)
    quantization = plan.record.quantization
    model_inputs = {spec.name for spec in plan.record.model.inputs}  # an .npz may hold reference outputs too
    rows = rkcompile.accuracy_analysis(plan, {name: inputs[name] for name in model_inputs & set(inputs)})
    return [(row.step, row.kernel, row.output, row.single) for row in rows
            if row.single is not None and row.output in quantization]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("calib", type=Path)
    parser.add_argument("inputs", type=Path)
    parser.add_argument("--bias-correction", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--peer", type=Path, metavar="ERROR_ANALYSIS.txt")
    args = parser.parse_args()
    with np.load(args.inputs) as archive:
        inputs = {name: archive[name] for name in archive.files}
    rows = single_cosines(args.model, Options(dtype="int8", calibration=args.calib,
                                              bias_correction=args.bias_correction), inputs)
    peer = {}
    if args.peer is not None:
        for line in args.peer.read_text().splitlines():
            match = PEER_ROW.match(line)
            if match:
                peer[match.group(2)] = (match.group(1), float(match.group(4)))
    differences = defaultdict(list)
    for step, kernel, output, cosine in rows:
        theirs = peer.get(output.removesuffix("@npu"))
        line = f"{step:>4} {kernel[:24]:24} {output[-48:]:48} {cosine:.6f}"
        if theirs is not None:
            line += f"  toolkit {theirs[0]} {theirs[1]:.5f}  {cosine - theirs[1]:+.6f}"
            differences[f"{kernel} vs toolkit {theirs[0]}"].append(cosine - theirs[1])
        print(line)
    for kind, values in differences.items():
        values = np.asarray(values)
        print(f"{kind}: {len(values)} steps, ours minus the toolkit's {values.mean():+.2e} on average, "
              f"mean absolute {np.abs(values).mean():.2e}")


if __name__ == "__main__":
    main()
