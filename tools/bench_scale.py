"""Plan time as graphs grow, in this process: 5,000- and 20,000-node models, beside onnxruntime
session creation (tools/bench_plan.py times the same models as whole processes).

    python tools/bench_scale.py [--nodes 5000 20000] [--target rk3588] [--repeat 1] [--keep DIR]

Each graph is a chain of residual conv blocks the way exporters write them: Conv, Relu, Conv,
Add, and around every block the shape arithmetic of a flatten-and-restore (Shape, Gather of each
dimension, Mul, Unsqueeze, Concat, Reshape and back), so most nodes are shape arithmetic that
constant folding must see through and a few hundred are NPU work. The issue's bar: the
20,000-node plan takes at most 4.5x the 5,000-node one (4x the nodes). Session creation uses
ORT_ENABLE_ALL on one thread. Each figure is the best of --repeat.
"""
from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rkcompile.compiler.pipeline import compile_model

CHANNELS, SIZE = 8, 8
SCALING_BAR = 4.5


def best_of(repeat: int, action) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()  # the previous run's garbage is not this run's cost
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def ort_session(path: Path) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def block(index: int, x: str, nodes: list, weights: list) -> str:
    """One residual block and its shape arithmetic; returns the block's output."""
    def name(suffix: str) -> str:
        return f"b{index}_{suffix}"

    def node(op: str, inputs: list[str], suffix: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name(suffix)], name=name(suffix), **attrs))
        return name(suffix)

    rng = np.random.default_rng(index)
    for conv in ("w0", "w1"):
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) / 8).astype(np.float32), name(conv)))
    y = node("Relu", [node("Conv", [x, name("w0")], "conv0", pads=[1] * 4)], "relu")
    y = node("Conv", [y, name("w1")], "conv1", pads=[1] * 4)
    shape = node("Shape", [y], "shape")
    dims = [node("Gather", [shape, f"axis{axis}"], f"dim{axis}", axis=0) for axis in range(4)]
    area = node("Mul", [dims[2], dims[3]], "area")
    parts = [node("Unsqueeze", [value, "zero"], f"unsq{i}") for i, value in enumerate((dims[0], dims[1], area))]
    flat = node("Reshape", [y, node("Concat", parts, "flat_shape", axis=0)], "flat")
    restored = node("Reshape", [flat, shape], "restored")
    return node("Add", [restored, x], "add")


def scale_model(target_nodes: int) -> onnx.ModelProto:
    nodes: list = []
    weights = [numpy_helper.from_array(np.array([0], np.int64), "zero")]
    weights += [numpy_helper.from_array(np.array(axis, np.int64), f"axis{axis}") for axis in range(4)]
    x, index = "input", 0
    while len(nodes) < target_nodes:
        x = block(index, x, nodes, weights)
        index += 1
    nodes[-1].output[0] = "output"
    graph = helper.make_graph(nodes, f"scale{target_nodes}",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, CHANNELS, SIZE, SIZE])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="write the generated models to this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'nodes':>7} {'plan s':>8} {'ort s':>8} {'plan/ort':>9} {'placed':>7} {'folded':>7} {'steps':>6}")
    rows = []
    for count in args.nodes:
        model = scale_model(count)
        path = folder / f"scale_{count}.onnx"
        onnx.save(model, str(path))
        planned = []
        plan_time = best_of(args.repeat, lambda: planned.append(compile_model(path, args.target)[0]))
        ort_time = best_of(args.repeat, lambda: ort_session(path))
        plan = planned[-1]
        folded = sum(1 for n in plan.nodes if n.device == "folded")
        rows.append((len(model.graph.node), plan_time, ort_time))
        print(f"{len(model.graph.node):7d} {plan_time:8.2f} {ort_time:8.2f} {plan_time / ort_time:9.2f} "
              f"{len(plan.nodes) - folded:7d} {folded:7d} {len(plan.steps):6d}")
    if len(rows) >= 2:
        (small_nodes, small_plan, small_ort), (large_nodes, large_plan, large_ort) = rows[0], rows[-1]
        growth = large_plan / small_plan
        print(f"{large_nodes / small_nodes:.1f}x the nodes: plan time {growth:.2f}x (bar {SCALING_BAR}x), "
              f"onnxruntime session creation {large_ort / small_ort:.2f}x")
        return 0 if growth <= SCALING_BAR else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
