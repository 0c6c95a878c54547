"""What one step does, counted once for every estimate: MACs (`node_macs`, also what plan steps
report) and the bytes it moves (`step_work`). Seconds come from the one cost model,
`rkcompile.plan.cost_model`, so partitioning and the plan's estimates agree.
"""
from __future__ import annotations

from typing import Callable

import onnx_graphsurgeon as gs

from rkcompile.plan import cost_model
from rkcompile.ir.graph import element_count, fused_body, node_inputs, present_inputs, static_shape

_REDUCTION_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def node_macs(node: gs.Node) -> int:
    """MACs of `node`: output elements times the reduction length for convolutions and matrix
    products, one per output element for everything else. Unknown shapes count as zero."""
    body = fused_body(node)
    if body is not None:  # a fused kernel does its members' work
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


def step_work(node: gs.Node, device: str, stored_bytes: Callable[[gs.Tensor], float]) -> cost_model.StepWork:
    """What `node` does as a step on `device`: its MACs, and the bytes of every tensor it reads
    (`node_inputs`, outer-scope reads included) and writes, each as `stored_bytes` says it is
    stored. The one way a step's work is counted, both for the plan's own estimate
    (passes/multicore.py, from the plan's tensors) and for what-ifs before the plan exists
    (passes/partition.py, from each device's storage), so the two cannot disagree."""
    reads = node_inputs(node)
    return cost_model.StepWork(
        device=device, macs=node_macs(node) if device != "host" else 0,
        weight_bytes=round(sum(stored_bytes(t) for t in reads if isinstance(t, gs.Constant))),
        input_bytes=round(sum(stored_bytes(t) for t in reads if not isinstance(t, gs.Constant))),
        output_bytes=round(sum(stored_bytes(t) for t in node.outputs if t.name)),
    )
