"""Layout: give every tensor the plan touches its dtype, memory layout, byte size and region.

NPU feature maps are stored NC1HWC2 (seed 003, 3.x "NC1HWC2"): C1 = ceil(C / C2), with C2 from
the target's table for the plan dtype, and the padding channels are real bytes. Tensors the CPU
produces stay in their ONNX dtype and row-major layout; model inputs and outputs keep their
declared dtype and layout. Sizes are Python-int arithmetic, so huge shapes never allocate.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.context import CompileContext
from rkcompile.ir import FLOAT_DTYPES, dtype_name, element_count, itemsize, present_inputs, static_shape
from rkcompile.plan import TensorPlacement

NAME = "layout"


def run(ctx: CompileContext) -> None:
    graph = ctx.graph
    nodes = {node.name: node for node in graph.nodes}
    inputs = {t.name for t in graph.inputs}
    outputs = {t.name for t in graph.outputs}
    npu_dtype = ctx.options.dtype
    tensors: dict[str, TensorPlacement] = {}

    def place(tensor: gs.Tensor, region: str, on_npu: bool) -> None:
        shape = static_shape(tensor)
        dtype = dtype_name(tensor.dtype) or "unknown"
        if on_npu and dtype in FLOAT_DTYPES:
            dtype = npu_dtype
        if shape is None:
            layout, size = "unknown", 0
        elif on_npu and region == "arena" and len(shape) == 4:
            layout, size = "NC1HWC2", nc1hwc2_bytes(shape, ctx.target.c2_for(npu_dtype), itemsize(dtype))
        else:
            layout = "NCHW" if len(shape) == 4 else "ND"
            size = element_count(shape) * itemsize(dtype) if dtype != "unknown" else 0
        tensors[tensor.name] = TensorPlacement(shape=shape, dtype=dtype, layout=layout, bytes=size,
                                               region=region, offset=0)

    for tensor in graph.inputs:
        place(tensor, "input", on_npu=False)
    for name in ctx.order:
        node = nodes[name]
        on_npu = ctx.placement[name].device == "npu"
        for tensor in present_inputs(node):
            if isinstance(tensor, gs.Constant) and tensor.name not in tensors:
                place(tensor, "weight", on_npu)
        for tensor in node.outputs:
            if tensor.name in outputs:
                place(tensor, "output", on_npu=False)
            elif tensor.name and tensor.name not in inputs:
                place(tensor, "arena", on_npu)
    for tensor in graph.outputs:
        if tensor.name not in tensors:
            place(tensor, "weight" if isinstance(tensor, gs.Constant) else "output", on_npu=False)
    ctx.tensors = tensors


def nc1hwc2_shape(shape: tuple[int, ...], c2: int) -> tuple[int, int, int, int, int]:
    """(N, C, H, W) -> (N, C1, H, W, C2) with C1 = ceil(C / C2); seed 003's example: (1,13,4,4)
    with C2 = 8 is (1,2,4,4,8)."""
    n, c, h, w = shape
    return n, -(-c // c2), h, w, c2


def nc1hwc2_bytes(shape: tuple[int, ...], c2: int, element_bytes: int) -> int:
    return element_count(nc1hwc2_shape(shape, c2)) * element_bytes
