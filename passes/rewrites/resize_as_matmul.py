"""Resize rewrites: a Resize the NPU's Resize kernel does not take (a scale that is not an
integer within the target's limit, a downscale, cubic interpolation, ...) as constant-weight
matrix products, which the matmul family runs as 1x1 convolutions."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape
from rkcompile.onnx_backends import make_session

from rkcompile.passes.rewrites.base import Candidates, RewriteRule, Site


def resize_as_matrix_products(node: gs.Node, site: Site) -> Candidates:
    """Resize of the last two axes as Y = A_h . X . A_w^T, two MatMuls by constant
    interpolation matrices (the matmul family makes 1x1 Convs of them). Every Resize mode is
    separable: the output at (i, j) weighs input (k, l) by w_h(i, k) * w_w(j, l), each factor
    depending on one axis's size, scale and the node's attributes alone (ONNX Resize, "the
    interpolation is done along each axis"). Each A is the node itself applied to an identity
    matrix along its axis, by onnxruntime's Resize, so the weights are the ones the model runs with,
    edge clamping included. The NPU's Resize takes integer upscales of height and width within
    a limit only (oplist V2.3.2, Resize: "目前仅支持宽高方向的整数倍缩放"); MatMul by weights
    runs as Convolution (oplist V2.3.2)."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = static_shape(x), static_shape(y)
    if in_shape is None or out_shape is None or len(in_shape) < 2:
        return "a shape is unknown, or the input is below rank 2"
    if dtype_name(x.dtype) not in FLOAT_DTYPES:
        return f"the data is {dtype_name(x.dtype)}, not floating point"
    scales = _axis_scales(node, site.opset, in_shape, out_shape)
    if isinstance(scales, str):
        return scales
    rank = len(in_shape)
    resized = [axis for axis in range(rank) if scales[axis] is not None]
    if not resized:
        return "no axis is resized"
    if any(axis < rank - 2 for axis in resized):
        return f"it resizes axes {resized}, not only the last two"
    matrices = {}
    for axis in resized:
        matrix = interpolation_matrix(node, site.opset, in_shape[axis], out_shape[axis], scales[axis])
        if isinstance(matrix, str):
            return matrix
        matrices[axis] = matrix.astype(dtype_name(x.dtype))
    builder = site.builder(node)
    height, width = rank - 2, rank - 1
    (h, w), (h2, w2) = in_shape[height:], out_shape[height:]
    # the order of fewer multiply-adds: (X A_w^T) first costs h*w*w2 + h2*h*w2, (A_h X) h2*h*w + h2*w*w2
    width_first = h * w * w2 + h2 * h * w2 <= h2 * h * w + h2 * w * w2
    order = sorted(matrices, reverse=width_first)  # ascending: height, then width
    value, shape = x, list(in_shape)
    for index, axis in enumerate(order):
        shape[axis] = out_shape[axis]
        out = y if index == len(order) - 1 else None
        if axis == width:
            operands = [value, builder.const(np.ascontiguousarray(matrices[axis].T), "columns")]
        else:
            operands = [builder.const(matrices[axis], "rows"), value]
        value = builder.op("MatMul", operands, list(shape), x.dtype, out=out)
    yield builder.finish()


def _axis_scales(node: gs.Node, opset: int, in_shape: list[int], out_shape: list[int]) -> list | str:
    """Per axis: None when the axis is left alone, else ("scales", s) or ("sizes", n), how the
    node states it; the reason when the node's scales or sizes are not constant."""
    attrs = node.attrs
    if attrs.get("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        return "coordinate_transformation_mode tf_crop_and_resize reads a region of interest"
    inputs = list(node.inputs) + [gs.Variable.empty()] * 4
    scales_input, sizes_input = (inputs[1], None) if opset < 11 else (inputs[2], inputs[3])
    rank = len(in_shape)
    axes = [a % rank for a in attrs.get("axes", range(rank))]
    per_axis: list = [None] * rank
    sizes = constant_value(sizes_input) if sizes_input is not None and sizes_input.name else None
    scales = constant_value(scales_input) if scales_input.name else None
    if sizes is not None and sizes.size:
        if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "keep_aspect_ratio_policy is not stretch: the sizes are not the output's"
        for axis, size in zip(axes, sizes.tolist()):
            if int(size) != in_shape[axis]:
                per_axis[axis] = ("sizes", int(size))
    elif scales is not None and scales.size:
        for axis, scale in zip(axes, scales.tolist()):
            if float(scale) != 1.0:
                per_axis[axis] = ("scales", float(scale))
    else:
        return "the scales or sizes are not constant"
    for axis, stated in enumerate(per_axis):
        if stated is None and in_shape[axis] != out_shape[axis]:
            return f"axis {axis} changes size without a stated scale"
    return per_axis


def interpolation_matrix(node: gs.Node, opset: int, size: int, out_size: int, stated: tuple) -> np.ndarray | str:
    """The [out_size, size] matrix of one axis: the node's Resize, with its attributes and this
    axis's scale or size, applied by onnxruntime to the identity [size, size] along axis 0
    (axis 1 keeps scale 1, which every mode maps onto itself)."""
    kind, value = stated
    attrs = {k: v for k, v in node.attrs.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    initializers = []
    if kind == "scales":
        initializers.append(helper.make_tensor("scales", onnx.TensorProto.FLOAT, [2], [value, 1.0]))
    else:
        initializers.append(helper.make_tensor("sizes", onnx.TensorProto.INT64, [2], [value, size]))
    if opset < 11:
        if kind != "scales":
            return "sizes before opset 11"
        inputs = ["identity", "scales"]
    else:
        inputs = ["identity", "", "scales", ""] if kind == "scales" else ["identity", "", "", "sizes"]
    graph = helper.make_graph(
        [helper.make_node("Resize", inputs, ["matrix"], **attrs)], "axis",
        [helper.make_tensor_value_info("identity", onnx.TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("matrix", onnx.TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:  # onnxruntime, the reference every check compares with: onnx.reference's align_corners
        # downscale divides by the fractional output length (0..4 along 3 -> [0, 2.67], not [0, 4])
        session = make_session(model)
    except Exception:  # noqa: BLE001  (onnxruntime raises its own classes for every "cannot")
        return "onnxruntime has no kernel for this Resize on one axis"
    (matrix,) = session.run(None, {"identity": np.eye(size, dtype=np.float32)})
    if matrix.shape != (out_size, size):
        return f"the interpolation matrix came out {list(matrix.shape)}, not [{out_size}, {size}]"
    return matrix


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(resize_as_matrix_products, frozenset({"Resize"})),
)
