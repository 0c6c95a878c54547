"""A deliberately simple cost estimate, kept in one place so the real cost model can replace it.

Partitioning asks one question: is an NPU island worth the conversions it needs? This module
answers in estimated seconds, from three kinds of cost:
- compute: multiply-accumulates (MACs) per node divided by a device's sustained MAC rate
  (reductions and recurrences counted in full, anything else one per output element);
- conversion: bytes read plus bytes written by a host step that changes layout or dtype,
  divided by the CPU's reshuffling rate (NC1HWC2 <-> NCHW is a strided copy, not a memcpy);
- launch: a fixed price per NPU partition for submitting a job and syncing caches.

The rates are round assumptions, not measurements: RK3588 is marketed at 6 TOPS int8 over three
cores, and float16 runs at a fraction of int8; a Cortex-A76 cluster sustains a few tens of
GFLOP/s in float32. Only their ratios matter for the decisions made with them.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.ir import element_count, present_inputs, static_shape

#: Sustained multiply-accumulates per second on one NPU core in float16 (assumed).
NPU_MACS_PER_SECOND = 250e9
#: Sustained multiply-accumulates per second on the CPU cluster in float32 (assumed).
CPU_MACS_PER_SECOND = 20e9
#: Bytes per second a host layout/dtype conversion reads plus writes (assumed).
CONVERSION_BYTES_PER_SECOND = 1e9
#: Seconds to submit one NPU partition and sync caches around it (assumed).
NPU_LAUNCH_SECONDS = 50e-6

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


def compute_seconds(node: gs.Node, device: str) -> float:
    rate = NPU_MACS_PER_SECOND if device == "npu" else CPU_MACS_PER_SECOND
    return node_macs(node) / rate


def conversion_seconds(bytes_moved: int) -> float:
    return bytes_moved / CONVERSION_BYTES_PER_SECOND
