"""Each int8 step alone: its cosine when it runs on its inputs' float32 reference values,
quantized with the plan's parameters (rknn-toolkit2 accuracy_analysis's "single" column), so
the error a step adds is seen apart from everything before it (docs/quantization.md, Weights).

    python tools/int8_single_steps.py MODEL CALIB INPUT.npz [--no-bias-correction] [--peer ERROR_ANALYSIS.txt]

With --peer (the error_analysis.txt `tools/peer_int8.py --analysis DIR` writes for the same
model, calibration and input), each step whose output the toolkit names too gets the toolkit's
single cosine beside ours, and a summary per step kind: the mean and mean absolute difference
(ours minus the toolkit's; the toolkit prints 5 digits, so a mean absolute difference near 3e-6
is agreement). Uses the emulator's executor step by step (its step nodes and operands).
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

import rkcompile
from rkcompile.context import Options
from rkcompile.emulator import agreement
from rkcompile.emulator.executor import Executor
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.emulator.int8 import QTensor
from rkcompile.nodes import node_operands
from rkcompile.quantize import dequantize, quantize
from rkcompile.targets import get_target

#: a layer row of rknn-toolkit2's error_analysis.txt: [Op] name  entire cos | euc  single cos | euc
PEER_ROW = re.compile(r"\[(\w+)\] (\S+)\s+([\d.]+) \|\s*[\d.]+\s+([\d.]+)")


def single_cosines(model: Path, options: Options, inputs: dict[str, np.ndarray]) -> list[tuple[int, str, str, float]]:
    """(step, kernel, output, single cosine) for every int8 output of an NPU step."""
    plan = rkcompile.compile(model, "rk3588", options)
    record = plan.record
    reference: dict[str, np.ndarray] = {}
    FloatReference(plan.reference_nodes, [s.device for s in record.steps], record.model.opset,
                   [s.name for s in record.model.outputs]).run(inputs, reference.__setitem__)
    prepared = plan.prepared()
    executor = Executor(prepared.plan, prepared.weights, get_target(record.target), prepared.weight_cache)
    executor.run(inputs)  # loads the weight region
    quantization = record.quantization
    rows = []
    for step, node in zip(record.steps, executor.step_nodes()):
        if step.device != "npu":
            continue
        operands = []
        for tensor in node_operands(node):
            activation = tensor.name in quantization and record.tensors[tensor.name].region != "weight"
            if activation and tensor.name in reference:
                quant = quantization[tensor.name]
                operands.append(QTensor(quantize(reference[tensor.name], quant), quant))
            else:
                operands.append(executor._operand(tensor, "npu") if tensor.name else None)
        for tensor, value in zip(node.outputs, executor._npu_node(node, operands)):
            if tensor.name in reference and tensor.name in quantization:
                cosine = agreement(tensor.name, dequantize(value, quantization[tensor.name]),
                                   reference[tensor.name]).cosine
                rows.append((step.id, step.kernel, tensor.name, cosine))
    return rows


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
