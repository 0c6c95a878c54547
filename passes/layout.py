"""Layout: give every tensor the plan touches its dtype, memory layout, byte size and region.

Where a tensor lives is decided by the step that writes it. NPU feature maps are stored
NC1HWC2 (seed 003, 3.1.2 and table 3-1): C1 = ceil(C / C2), C2 from the target's table for the
stored dtype, and the padding channels are real bytes. Tensors of rank below 4 are stored as
the 4-D feature map `as_nchw` gives them (docs/memory.md). Tensors the CPU writes stay in their
ONNX dtype, row-major (NCHW for rank 4, ND otherwise), in the `cpu` region when no NPU step
reads them: the CPU runtime keeps them in host memory, outside the NPU's arena. A `host` step
converts between the two, so its outputs take the layout and region of the device that reads
them; the NPU copy of a model input of 1, 3 or 4 channels that only ungrouped Convs read is
dense NHWC, the form those Convs read it in (`reads_as_image`). Model inputs and outputs
keep their declared dtype and layout; constants go to the `weight` region in the dtype their
first reader computes in, except a float16 plan's accumulator biases (`accumulator_biases`)
and the weights of the 1x1 Convs that spell a norm's means inside exNorm (`norm_statistics`),
which stay float32. Sizes are Python-int arithmetic, so huge shapes never allocate.
"""
from __future__ import annotations

import functools
import logging

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext
from rkcompile.numerics import float16 as half
from rkcompile.ir.graph import (FLOAT_DTYPES, dtype_name, element_count, fused_body, is_onnx_domain, itemsize,
    node_inputs, present_inputs, readers, static_shape)
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_bytes
from rkcompile.ir.nodes import peeked_values
from rkcompile.plan.plain_nodes import accumulator_stages
from rkcompile.plan.schema import TensorPlacement
from rkcompile.targets.model import Target

NAME = "layout"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "options", "order", "placement", "target"})
PROVIDES = frozenset({"tensors"})

log = logging.getLogger("rkcompile")


def run(ctx: CompileContext) -> None:
    graph = ctx.graph
    nodes = {node.name: node for node in graph.nodes}
    inputs = {t.name for t in graph.inputs}
    outputs = {t.name for t in graph.outputs}
    reading = readers(graph)
    tensors: dict[str, TensorPlacement] = {}
    npu_nodes = [nodes[name] for name in ctx.order if ctx.placement[name].device == "npu"]
    unrounded = accumulator_biases(npu_nodes) | norm_statistics(npu_nodes) if ctx.options.dtype == "float16" else set()

    def place(tensor: gs.Tensor, region: str, device: str, as_image: bool = False) -> None:
        npu_dtype = ACCUMULATOR_DTYPE if region == "weight" and tensor.name in unrounded else ctx.options.dtype
        tensors[tensor.name] = placement(tensor, region, device, ctx.target, npu_dtype, as_image)

    for tensor in graph.inputs:
        place(tensor, "input", "cpu")
    for name in ctx.order:
        node = nodes[name]
        device = ctx.placement[name].device
        for tensor in present_inputs(node):
            if isinstance(tensor, gs.Constant) and tensor.name not in tensors:
                place(tensor, "weight", device)
                _warn_out_of_range(tensor, tensors[tensor.name])
        for tensor in node.outputs:
            if tensor.name in outputs:
                place(tensor, "output", "cpu")
            elif tensor.name and tensor.name not in inputs:
                consumers = reading.get(tensor.name, ())
                read_on_npu = any(ctx.placement[c.name].device == "npu" for c in consumers)
                stored_on, as_image = device, False
                if device == "host":
                    stored_on = "npu" if read_on_npu else "cpu"
                    as_image = (stored_on == "npu" and node.inputs[0].name in inputs
                                and reads_as_image(tensor, consumers, ctx.target))
                # an integer tensor the CPU writes in the form the NPU reads crosses without a
                # conversion (passes/boundaries.py): the NPU reads it in the arena
                place(tensor, "arena" if stored_on == "npu" or read_on_npu else "cpu", stored_on, as_image)
    for tensor in graph.outputs:
        if tensor.name not in tensors:
            place(tensor, "weight" if isinstance(tensor, gs.Constant) else "output", "cpu")
    ctx.tensors = tensors


#: the dtype a float16 plan stores accumulator biases in. rknn-toolkit2 2.5.0's simulator adds
#: them unrounded: on a 3x3 Conv of 64 channels with biases drawn from N(0, 1), its outputs equal
#: the float16 rounding of the products' sum plus the float32 bias at 99.8% of positions, plus a
#: float16-rounded bias at 87.5%; a MatMul followed by a constant Add the same (99.9% against 72%).
ACCUMULATOR_DTYPE = "float32"


def accumulator_biases(npu_nodes) -> set[str]:
    """The constants NPU steps add to their accumulator as a bias (plain_nodes.accumulator_stages:
    a Conv's, ConvTranspose's or Gemm's input 2, a MatMul's constant Add), a lone op or a fused
    step's member. Stored float32, they are added as the model wrote them, before the result's
    one rounding to float16."""
    found: set[str] = set()
    for node in npu_nodes:
        body = fused_body(node)
        members, outputs = (body.nodes, body.outputs) if body is not None else ([node], node.outputs)
        for stage in accumulator_stages(members, outputs):
            found.update(stage.biases)
    return found


def norm_statistics(npu_nodes) -> set[str]:
    """The weights of the 1x1 Convs inside an exNorm step (a norm written out on the channel
    view: rewrites.reductions): they spell the mean over C channels as weights 1/C, which the
    kernel computes exactly in float32 (seed 001, exNorm), while float16 holds 1/1599 only to
    within 2^-12 of itself; stored float16 they would shift the mean the emulator computes."""
    found: set[str] = set()
    for node in npu_nodes:
        body = fused_body(node) if node.op == "exNorm" else None
        if body is not None:
            found.update(member.inputs[1].name for member in body.nodes
                         if member.op == "Conv" and isinstance(member.inputs[1], gs.Constant))
    return found


def _warn_out_of_range(constant: gs.Constant, stored: TensorPlacement) -> None:
    """Warn when the weight region cannot hold a constant's finite values in its stored dtype:
    the weight encoding saturates them to that dtype's largest value (rkcompile.numerics.float16.saturate
    says why, and what Rockchip's compiler does), so the plan computes with a different number
    than the model wrote (typically a float32 mask fill of -3.4e38 read by an NPU step)."""
    if stored.dtype not in FLOAT_DTYPES or stored.dtype == dtype_name(constant.dtype):
        return
    if _within(constant, _largest(stored.dtype)):
        return
    beyond = half.beyond_range(constant.values, stored.dtype)
    if beyond.size:
        extreme = float(beyond[np.argmax(np.abs(beyond))])
        log.warning("layout: constant %s holds %d value(s) beyond the %s range (up to %g); stored as %s they "
                    "saturate to +-%g", constant.name, beyond.size, stored.dtype, extreme, stored.dtype,
                    _largest(stored.dtype))


_largest = functools.cache(half.largest)


def _within(constant: gs.Constant, limit: float) -> bool:
    """True when every value of the float constant lies in [-limit, limit]: its minimum and
    maximum, two passes that allocate nothing, settle it for nearly every weight (a NaN or an
    infinity answers False, and half.beyond_range looks closer). A weight onnx-graphsurgeon has
    not read yet is read and dropped after (`peeked_values`). A broadcast view (a folded
    ConstantOfShape) is left to half.beyond_range, which looks at each stored element once
    instead of every element of the view."""
    values = peeked_values(constant)
    if values is None or values.dtype.kind != "f" or not values.size or 0 in values.strides:
        return False
    return bool(-limit <= values.min() and values.max() <= limit)


def reads_as_image(tensor: gs.Tensor, consumers, target: Target) -> bool:
    """Whether the NPU keeps `tensor`, a model input, as the dense NHWC image its Convs read
    directly (`Target.image_input_channels`): it is 4-D with such a channel count, and every
    one of `consumers` (its NPU readers) is an ungrouped Conv reading it as its data input,
    alone or first in a fused kernel, and reads it nowhere else."""
    shape = static_shape(tensor)
    if shape is None or len(shape) != 4 or shape[1] not in target.image_input_channels:
        return False
    return bool(consumers) and all(_reads_as_conv_data(consumer, tensor.name) for consumer in consumers)


def _reads_as_conv_data(node: gs.Node, name: str) -> bool:
    body = fused_body(node)
    if body is not None:
        # the body's inputs are the fused node's runtime inputs in order, under the names they
        # had when it was fused (a conversion inserted later renamed the outer one)
        runtime = [t.name for t in node.inputs if not isinstance(t, gs.Constant)]
        if runtime.count(name) != 1:
            return False
        inner_name = body.inputs[runtime.index(name)].name
        if any(t.name == inner_name for t in body.outputs):
            return False
        inner = [member for member in body.nodes if any(t.name == inner_name for t in node_inputs(member))]
        return bool(inner) and all(_reads_as_conv_data(member, inner_name) for member in inner)
    return (is_onnx_domain(node) and node.op == "Conv" and node.attrs.get("group", 1) == 1
            and [t.name for t in node_inputs(node)].count(name) == 1 and node.inputs[0].name == name)


def placement(tensor: gs.Tensor, region: str, device: str, target: Target, npu_dtype: str,
              as_image: bool = False) -> TensorPlacement:
    """How `tensor` is stored when `device` holds it in `region`; `as_image`: an NPU copy of a
    model input that `reads_as_image`, stored dense NHWC."""
    shape = static_shape(tensor)
    dtype = dtype_name(tensor.dtype) or "unknown"
    if device == "npu" and dtype in FLOAT_DTYPES:
        dtype = npu_dtype
    if shape is None or dtype == "unknown":
        # Only CPU tensors can get here (verify() demands static NPU shapes); the CPU runtime
        # sizes them when it runs, so the plan cannot reserve bytes for them.
        return TensorPlacement(shape=shape, dtype=dtype, layout="unknown", bytes=0, region=region, offset=0)
    if device == "npu" and region == "arena" and as_image and target.supports_dtype(dtype):
        return TensorPlacement(shape=shape, dtype=dtype, layout="NHWC", bytes=element_count(shape) * itemsize(dtype),
                               region=region, offset=0)
    if device == "npu" and region == "arena" and len(shape) <= 4 and target.supports_dtype(dtype):
        size = nc1hwc2_bytes(as_nchw(shape), target.c2_for(dtype), itemsize(dtype))
        return TensorPlacement(shape=shape, dtype=dtype, layout="NC1HWC2", bytes=size, region=region, offset=0)
    layout = "NCHW" if len(shape) == 4 else "ND"
    return TensorPlacement(shape=shape, dtype=dtype, layout=layout, bytes=element_count(shape) * itemsize(dtype),
                           region=region, offset=0)
