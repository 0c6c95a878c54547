"""Per-node costs for decisions made before the plan exists (which NPU islands to keep).

MACs are counted here (`node_macs`, also what plan steps report); seconds come from the one cost
model, `rkcompile.cost_model`, so partitioning and the plan's estimates agree. Before layout,
a node's bytes are its dense tensor sizes at the dtype each device computes in.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile import cost_model
from rkcompile.ir import element_count, itemsize, present_inputs, static_shape
from rkcompile.targets.model import Target

_REDUCTION_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def node_macs(node: gs.Node) -> int:
    """MACs of `node`: output elements times the reduction length for convolutions and matrix
    products, one per output element for everything else. Unknown shapes count as zero."""
    body = node.attrs.get("body")
    if isinstance(body, gs.Graph):  # a fused kernel (passes/fuse.py) does its members' work
        return sum(node_macs(member) for member in body.nodes)
    outputs = [static_shape(t) for t in node.outputs if t.name]
    if not outputs or any(shape is None for shape in outputs):
        return 0
    produced = sum(element_count(shape) for shape in outputs)
    if node.op in _RECURRENT_OPS:
        return _recurrent_macs(node)
    if node.op not in _REDUCTION_OPS:
        return produced
    return produced * _reduction_length(node)


def _recurrent_macs(node: gs.Node) -> int:
    """Every time step multiplies the input by W and the hidden state by R, for every gate and
    direction: seq_length * batch * (|W| + |R|) with X shaped (seq_length, batch, input)."""
    inputs = node.inputs
    shapes = [static_shape(t) for t in inputs[:3]]
    if any(shape is None for shape in shapes):
        return 0
    x, w, r = shapes
    return x[0] * x[1] * (element_count(w) + element_count(r))


def _reduction_length(node: gs.Node) -> int:
    inputs = present_inputs(node)
    weight = static_shape(inputs[1]) if len(inputs) > 1 else None
    if weight is None or not weight:
        return 1
    if node.op in ("Conv", "ConvTranspose"):
        # Conv weights are (M, C/group, kH, kW...); ConvTranspose's are (C, M/group, kH, kW...),
        # and each output element then gathers C/group * kernel inputs.
        group = int(node.attrs.get("group", 1))
        per_output = element_count(weight[1:]) if node.op == "Conv" else weight[0] // group * element_count(weight[2:])
        return max(per_output, 1)
    if node.op == "Gemm":
        return weight[1] if node.attrs.get("transB", 0) else weight[0]
    return weight[-2] if len(weight) >= 2 else weight[0]


def compute_seconds(node: gs.Node, device: str, target: Target, dtype: str) -> float:
    """Roofline seconds of `node` on the NPU (in `dtype`) or on the CPU (in its ONNX dtype)."""
    element_bytes = itemsize(dtype) if device == "npu" else 4
    sizes = {id(t): element_count(static_shape(t)) * element_bytes if static_shape(t) is not None else 0
             for t in list(present_inputs(node)) + [t for t in node.outputs if t.name]}
    work = cost_model.StepWork(
        device=device, macs=node_macs(node),
        weight_bytes=sum(sizes[id(t)] for t in present_inputs(node) if isinstance(t, gs.Constant)),
        input_bytes=sum(sizes[id(t)] for t in present_inputs(node) if not isinstance(t, gs.Constant)),
        output_bytes=sum(sizes[id(t)] for t in node.outputs if t.name),
    )
    if device == "npu":
        return cost_model.npu_seconds(work, cost_model.hardware_for(target), dtype)
    return cost_model.cpu_seconds(work)


def conversion_seconds(bytes_moved: int) -> float:
    return bytes_moved / cost_model.CONVERSION_BYTES_PER_SECOND


#: Seconds an NPU partition costs to submit and sync, as one inference run does.
NPU_LAUNCH_SECONDS = cost_model.RUN_SECONDS
