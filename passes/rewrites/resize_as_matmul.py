"""Resize rewrites: a Resize the NPU's Resize kernel does not take (a scale that is not an
integer within the target's limit, a downscale, cubic interpolation, ...) as constant-weight
matrix products, which the matmul family runs as 1x1 convolutions; a nearest one whose rows
and columns are every S-th of an integer upscale, as that upscale and a strided pick."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape
from rkcompile.onnx_backends import make_session

from rkcompile.passes.rewrites.base import Candidates, RewriteRule, Site
from rkcompile.passes.rewrites.conv_windows import conv_limits


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


def _upscale_and_stride(picked: np.ndarray, size: int, largest: int, limits) -> tuple[int, int, int] | None:
    """(U, S, o), U smallest, then S, then o: output i reads input floor((o + S*i) / U), the
    row o + S*i of an integer upscale by U, for every i, and a one-hot depthwise Conv of
    kernel o + 1 and stride S within `limits` picks those rows from the upscale."""
    steps = np.arange(len(picked))
    for upscale in range(1, largest + 1):
        for stride in range(1, limits.stride + 1):
            for offset in range(min(limits.depthwise_kernel, upscale * size)):
                rows = offset + stride * steps
                if (rows[-1] < upscale * size and (upscale * size - offset - 1) // stride + 1 == len(picked)
                        and np.array_equal(rows // upscale, picked)):
                    return upscale, stride, offset
    return None


def nearest_resize_as_upscale_and_pick(node: gs.Node, site: Site) -> Candidates:
    """A nearest Resize of height and width whose output row i is input row floor((o + S*i) / U)
    (likewise columns), as an integer nearest upscale by U, which the NPU's Resize takes, then
    a depthwise Conv of stride S whose one-hot kernel picks tap o: two steps where the matrix
    products are five (timm's ghostnetv2 resizes its 3x3 gate to 7x7: floor(3i / 7) =
    floor(2i / 5), an upscale by 5 and a pick of every second row, as rknn-toolkit2 keeps one
    step). Exact: every output is one input times 1. Each axis's picks are the node's own,
    read from its interpolation matrix (`interpolation_matrix`), so any coordinate mode and
    rounding that picks such rows qualifies. Limits: the target's Resize scale and depthwise
    Conv kernel and stride (oplist V2.3.2, Resize and Depthwise Convolution)."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = static_shape(x), static_shape(y)
    if node.attrs.get("mode", "nearest") != "nearest" or site.opset < 11:
        return "not a nearest Resize of opset 11 or later"
    if in_shape is None or out_shape is None or len(in_shape) != 4 or dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "not a 4-D floating-point tensor of known shape"
    scales = _axis_scales(node, site.opset, in_shape, out_shape)
    if isinstance(scales, str):
        return scales
    if scales[0] is not None or scales[1] is not None:
        return "it resizes the batch or the channels"
    largest = site.target.rule_parameter("Resize", "resize_scale", "largest")
    limits = conv_limits(site)
    if largest is None or limits is None:
        return f"{site.target.name} has no Resize scale or Conv window rule to work to"
    plan = []
    for axis in (2, 3):
        if scales[axis] is None:
            plan.append((1, 1, 0))
            continue
        matrix = interpolation_matrix(node, site.opset, in_shape[axis], out_shape[axis], scales[axis])
        if isinstance(matrix, str):
            return matrix
        picked = matrix.argmax(axis=1)
        if not np.array_equal(matrix, np.eye(in_shape[axis], dtype=matrix.dtype)[picked]):
            return f"axis {axis}'s output is not one input each"
        found = _upscale_and_stride(picked, in_shape[axis], largest, limits)
        if found is None:
            return f"axis {axis}'s picks are no stride of an integer upscale within the limits"
        plan.append(found)
    (up_h, stride_h, row), (up_w, stride_w, column) = plan
    n, c, h, w = in_shape
    builder = site.builder(node)
    upscaled = x
    if (up_h, up_w) != (1, 1):  # a downscale is the pick alone
        scales = builder.const(np.array([1, 1, up_h, up_w], np.float32), "scales")
        upscaled = builder.op("Resize", [x, gs.Variable.empty(), scales], [n, c, h * up_h, w * up_w], x.dtype,
                              mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    one_hot = np.zeros((c, 1, row + 1, column + 1), dtype_name(x.dtype))
    one_hot[:, 0, row, column] = 1
    builder.op("Conv", [upscaled, builder.const(one_hot, "pick")], out=y, kernel_shape=[row + 1, column + 1],
               strides=[stride_h, stride_w], group=c)
    yield builder.finish()


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(nearest_resize_as_upscale_and_pick, frozenset({"Resize"})),
    RewriteRule(resize_as_matrix_products, frozenset({"Resize"})),
)
