"""The float32 matrix products a plan's NPU steps cannot do without, timed alone: a floor under
the numpy emulator's run time.

    python tools/emulator_gemm_floor.py MODEL [--target rk3588] [--input-shape NAME:DIMS ...]

Plans MODEL, runs the emulator once (on MODEL.npz's inputs when there is one, as
tools/bench_emulator.py does; seeded random ones otherwise) with its Conv, MatMul and Gemm
kernels recording the products they compute (a convolution's im2col product per group, shaped
as the conv kernel shapes it; a depthwise conv is no matrix product and is left out), then
times each product alone on fresh float32 operands of the same shapes and memory order (the
best of three), and prints one JSON line: `gemm_seconds` (their sum, on this interpreter's
numpy and BLAS), `gemms` (how many), `depthwise_macs`. What onnxruntime runs instead (its own
kernels, its layout, Winograd or not) is not modelled: the figure says what the emulator's
float32 GEMMs alone cost next to onnxruntime's whole run (tools/bench_emulator.py --gemm-floor).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import time
from pathlib import Path

import numpy as np

from rkcompile.api import prepare
from rkcompile.compiler.context import Options
from rkcompile.emulator import Prepared, emulate, make_inputs
from rkcompile.emulator.registry import KERNELS

#: (batch, rows, inner, columns, transposed right operand) -> how many times the run computes it
Products = collections.Counter


def record_products(products: Products) -> None:
    """Wrap the NPU's Conv, MatMul and Gemm kernels so each records its products."""
    conv, matmul, gemm = KERNELS["Conv"], KERNELS["MatMul"], KERNELS["Gemm"]

    def recording_conv(node, inputs, opset):
        results = conv(node, inputs, opset)
        x, weight, y = inputs[0], inputs[1], results[0]
        group = int(node.attrs.get("group", 1) or 1)
        if not (group == x.shape[1] and weight.shape[1] == 1):
            rows = y.shape[0] * math.prod(y.shape[2:])
            products[(1, rows, weight.shape[1] * math.prod(weight.shape[2:]), weight.shape[0] // group, True)] += group
        else:
            products["depthwise_macs"] += y.size * math.prod(weight.shape[2:])
        return results

    def recording_matmul(node, inputs, opset):
        a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
        batch = math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        rows = a.shape[-2] if a.ndim > 1 else 1
        products[(batch, rows, a.shape[-1], b.shape[-1] if b.ndim > 1 else 1, False)] += 1
        return matmul(node, inputs, opset)

    def recording_gemm(node, inputs, opset):
        a, b = inputs[0], inputs[1]
        rows, inner = a.shape[::-1] if node.attrs.get("transA", 0) else a.shape
        products[(1, rows, inner, b.shape[0] if node.attrs.get("transB", 0) else b.shape[1], False)] += 1
        return gemm(node, inputs, opset)

    KERNELS.update(Conv=recording_conv, MatMul=recording_matmul, Gemm=recording_gemm)


def product_seconds(batch: int, rows: int, inner: int, columns: int, transposed: bool) -> float:
    rng = np.random.default_rng(0)
    left = rng.standard_normal((batch, rows, inner) if batch > 1 else (rows, inner), dtype=np.float32)
    right = rng.standard_normal((columns, inner) if transposed else (inner, columns), dtype=np.float32)
    right = right.T if transposed else right
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        left @ right
        best = min(best, time.perf_counter() - started)
    return best


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS")


def prepared_and_inputs(args: argparse.Namespace) -> tuple[Prepared, dict[str, np.ndarray]]:
    """`args.model` planned as `rkcompile run MODEL` plans it, and its inputs: MODEL.npz's where
    it has them, seeded random ones otherwise."""
    shapes = {name: tuple(int(d) for d in dims.split(",")) for name, dims in
              (flag.split(":", 1) for flag in args.input_shape)}
    prepared = prepare(args.model, args.target, Options(input_shapes=shapes))
    given = Path(args.model).with_suffix(".npz")
    arrays = dict(np.load(given)) if given.exists() else {}
    names = {spec.name for spec in prepared.plan.model.inputs}
    return prepared, make_inputs(prepared.plan, {k: v for k, v in arrays.items() if k in names}, seed=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    prepared, inputs = prepared_and_inputs(parser.parse_args())
    products: Products = collections.Counter()
    record_products(products)
    emulate(prepared, inputs)
    depthwise = products.pop("depthwise_macs", 0)
    seconds = sum(count * product_seconds(*shape) for shape, count in products.items())
    print(json.dumps({"gemm_seconds": seconds, "gemms": sum(products.values()), "depthwise_macs": depthwise}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
