"""Normalization rewrites: BatchNormalization made affine where rewrites.affine cannot fold it
into a weighted op (a depthwise Conv where an activation would fuse after it), LRN as a band convolution, LayerNormalization and Softmax moved onto the
axes the NPU normalizes."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import constant_value, dtype_name, element_count, static_shape
from rkcompile.numerics.nc1hwc2 import as_nchw

from rkcompile.passes.fusion_table import conv_activation_kernels
from rkcompile.passes.rewrites.affine import affine_of, per_channel_values, batchnorm_affine
from rkcompile.passes.rewrites.base import Candidates, RewriteRule, Site, conv_1x1, producer, scalar


def batchnorm_to_mul_add(node: gs.Node, site: Site) -> Candidates:
    """A BatchNormalization that stays on its own, as x*scale + shift with per-channel constants
    of shape [1,C,1,1]: Mul and Add broadcast [b,c,1,1] operands (Expand patterns, seed 000)."""
    affine = batchnorm_affine(node)
    x = node.inputs[0]
    shape = static_shape(x)
    if affine is None or shape is None or len(shape) < 2:
        return "its statistics are not constant (or training mode), or the input is below rank 2 or unknown"
    channel_shape = [1, shape[1]] + [1] * (len(shape) - 2)
    dtype = dtype_name(x.dtype)
    scale, shift = (a.astype(dtype).reshape(channel_shape) for a in affine)
    builder = site.builder(node)
    scaled = builder.op("Mul", [x, builder.const(scale, "scale")], shape, x.dtype)
    builder.op("Add", [scaled, builder.const(shift, "shift")], out=node.outputs[0])
    yield builder.finish()


def batchnorm_before_activation_as_conv(node: gs.Node, site: Site) -> Candidates:
    """A BatchNormalization no weighted op around it takes (DenseNet's pre-activation BN after a
    Concat), read only by an activation the target runs fused after a convolution (Relu, Clip,
    Sigmoid, ...), as a depthwise 1x1 Conv of weights scale and bias shift: then one Conv+Relu
    kernel instead of two steps, as rknn-toolkit2 runs BatchNormalizationRelu. Within one
    float16 rounding of the scale and shift, as every affine fold (rewrites.affine)."""
    affine = batchnorm_affine(node)
    shape = static_shape(node.inputs[0])
    if affine is None or shape is None or len(shape) != 4:
        return "its statistics are not constant (or training mode), or the input is not 4-D of known shape"
    return (yield from _affine_as_conv_before_activation(node.inputs[0], *affine, [node], site))


def scale_and_shift_before_activation_as_conv(node: gs.Node, site: Site) -> Candidates:
    """A constant per-channel scale and then shift (tf2onnx writes a Keras BatchNormalization as
    Mul and Add: DenseNet's pre-activation BN after a Concat) read only by an activation the
    target runs fused after a convolution, as the depthwise 1x1 Conv of
    `batchnorm_before_activation_as_conv`: one Conv+Relu kernel instead of Mul and Add+Relu."""
    shape = static_shape(node.outputs[0])
    if shape is None or len(shape) != 4:
        return "the result is not 4-D of known shape"
    shifted = affine_of(node)
    if isinstance(shifted, str):
        return shifted
    scaled_tensor, outer_scale, outer_shift = shifted
    scaling = producer(scaled_tensor)
    if (scaling is None or scaling.op not in ("Mul", "Div") or len(scaled_tensor.outputs) != 1
            or scaled_tensor.name in site.graph_outputs):
        return "its input is not a scale by a constant that it alone reads"
    scaled = affine_of(scaling)
    if isinstance(scaled, str):
        return f"its input's {scaling.op}: {scaled}"
    x, inner_scale, inner_shift = scaled
    if all(v.size == 1 for v in (inner_scale, outer_shift)):
        return "a scalar scale and shift (a batch norm's vary per channel): element-wise ops, as other rules make"
    channels = [per_channel_values(v, 4, 1, shape[1]) for v in (inner_scale, inner_shift, outer_scale, outer_shift)]
    if any(v is None for v in channels):
        return "a constant varies along another axis than the channels"
    inner_scale, inner_shift, outer_scale, outer_shift = channels
    return (yield from _affine_as_conv_before_activation(x, outer_scale * inner_scale,
                                                         outer_scale * inner_shift + outer_shift,
                                                         [scaling, node], site))


def _affine_as_conv_before_activation(x: gs.Tensor, scale: np.ndarray, shift: np.ndarray, old: list[gs.Node],
                                      site: Site) -> Candidates:
    """scale*x + shift per channel of the 4-D `x`, which the last of `old` writes, as a depthwise
    1x1 Conv, where that result is read by one activation the target fuses after a Conv."""
    y = old[-1].outputs[0]
    readers = y.outputs
    if len(readers) != 1 or y.name in site.graph_outputs:
        return "its result is read by more than one node, or is a graph output"
    kernels = conv_activation_kernels().get(readers[0].op, ())
    if not any(site.target.has_kernel(kernel) for kernel in kernels):
        return f"its reader, a {readers[0].op}, is no activation {site.target.name} runs fused after a Conv"
    channels, dtype = static_shape(x)[1], dtype_name(x.dtype)
    builder = site.builder(old[-1])
    builder.op("Conv", [x, builder.const(scale.astype(dtype).reshape(channels, 1, 1, 1), "scale"),
                        builder.const(shift.astype(dtype).reshape(channels), "shift")],
               out=y, kernel_shape=[1, 1], group=channels)
    yield builder.finish(*old)


#: x^-beta as NPU Pows (exponents from seed 000, Pow: {0, 1, 2, 3, 0.5, -0.5}) and Muls: the
#: exponents to apply in turn, each to the previous result, and whether to multiply the last
#: two results (x^-0.75 = x^-0.5 * (x^-0.5)^0.5).
INVERSE_POWERS = {0.5: ((-0.5,), False), 0.75: ((-0.5, 0.5), True), 1.0: ((-0.5, 2.0), False)}


def lrn_to_conv_and_pows(node: gs.Node, site: Site) -> Candidates:
    """LRN (no NPU kernel in oplist V2.3.2) as NPU ops: the squares summed over each channel's
    window by a 1x1 Conv with a constant band matrix (alpha / size folded into its weights, bias
    into its bias), raised to -beta by Pows of allowed exponents, times x. ONNX's window for
    channel c runs from c - floor((size - 1) / 2) to c + ceil((size - 1) / 2)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    beta = float(node.attrs.get("beta", 0.75))
    if shape is None or len(shape) != 4 or beta not in INVERSE_POWERS:
        return f"beta {beta:g} has no exact NPU power" if shape is not None and len(shape) == 4 else "the input is not 4-D"
    size = int(node.attrs["size"])
    alpha, bias = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("bias", 1.0))
    channels = shape[1]
    dtype = dtype_name(x.dtype) or "float32"
    offsets = np.arange(channels)[None, :] - np.arange(channels)[:, None]  # input c' minus output c
    band = ((offsets >= -((size - 1) // 2)) & (offsets <= -(-(size - 1) // 2))).astype(dtype) * (alpha / size)
    builder = site.builder(node)
    squares = builder.op("Mul", [x, x], shape, x.dtype)
    summed = conv_1x1(builder, squares, band, np.full(channels, bias, dtype), list(shape))
    exponents, multiply_last_two = INVERSE_POWERS[beta]
    powers = [summed]
    for exponent in exponents:
        powers.append(builder.op("Pow", [powers[-1], scalar(builder, exponent, x)], shape, x.dtype))
    scale = builder.op("Mul", powers[-2:], shape, x.dtype) if multiply_last_two else powers[-1]
    builder.op("Mul", [x, scale], out=y)
    yield builder.finish()


def layernorm_to_channel_axis(node: gs.Node, site: Site) -> Candidates:
    """LayerNormalization over the trailing axes of [..., C] as one over the channels of
    [L, C, 1, 1]: exNorm normalizes axes [1] or [1,2,3] only (seed 001, exNorm), and with
    H = W = 1 the two are the same reduction. Scale and bias become [C, 1, 1]."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len([t for t in node.outputs if t.name]) != 1:
        return "the input shape is unknown, or it has mean/variance outputs"
    axis = node.attrs.get("axis", -1) % len(shape)
    rows, channels = element_count(shape[:axis]), element_count(shape[axis:])
    params = [constant_value(t) for t in node.inputs[1:] if t.name]
    if any(p is None for p in params):
        return "scale or bias is not constant"
    builder = site.builder(node)
    x4 = builder.reshape(x, [rows, channels, 1, 1])
    consts = [builder.const(np.broadcast_to(p, shape[axis:]).reshape(channels, 1, 1), "param") for p in params]
    normed = builder.op("LayerNormalization", [x4, *consts], [rows, channels, 1, 1], x.dtype,
                        **{**node.attrs, "axis": 1})
    builder.reshape(normed, shape, out=y)
    yield builder.finish()


def softmax_to_supported_axis(node: gs.Node, site: Site) -> Candidates:
    """Softmax on an axis other than 1 or 3 (oplist V2.3.2, Softmax: "axis 1, 3, channel and
    width") moved onto one: first a Transpose swapping it with axis 3 and back; else relabels
    to [1, outer, 1, D] (axis 3) when nothing follows the axis, or to [outer, D, inner, 1] (axis 1),
    the one that is the 4-D form the NPU stores the tensor in first (rkcompile.numerics.nc1hwc2.as_nchw:
    [1, D, 1] is [1, D, 1, 1]), where the relabels move nothing and cancel with their neighbours.
    Before opset 13 Softmax normalizes every axis from `axis` on, so D covers them all."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or not shape:
        return "the input shape is unknown"
    axis = node.attrs.get("axis", -1 if site.opset >= 13 else 1) % len(shape)
    flattening = site.opset < 13
    outer = element_count(shape[:axis])
    depth = element_count(shape[axis:]) if flattening else shape[axis]
    inner = 1 if flattening else element_count(shape[axis + 1:])
    if len(shape) == 4 and not flattening and axis in (0, 2):
        builder = site.builder(node)
        perm = list(range(4))
        perm[axis], perm[3] = 3, axis
        swapped = builder.op("Transpose", [x], [shape[p] for p in perm], x.dtype, perm=perm)
        normed = builder.op("Softmax", [swapped], [shape[p] for p in perm], x.dtype, axis=3)
        builder.op("Transpose", [normed], out=y, perm=perm)
        yield builder.finish()
    layouts = ([([1, outer, 1, depth], 3)] if inner == 1 else []) + ([] if flattening else [([outer, depth, inner, 1], 1)])
    if len(shape) <= 4:  # the layout the NPU stores the tensor in already first: its relabels move nothing there
        layouts.sort(key=lambda candidate: candidate[0] != list(as_nchw(shape)))
    for layout, new_axis in layouts:
        builder = site.builder(node)
        normed = builder.op("Softmax", [builder.reshape(x, layout)], layout, x.dtype, axis=new_axis)
        builder.reshape(normed, shape, out=y)
        yield builder.finish()


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(batchnorm_before_activation_as_conv, frozenset({"BatchNormalization"}), always=True),
    RewriteRule(scale_and_shift_before_activation_as_conv, frozenset({"Add", "Sub"}), always=True),
    RewriteRule(batchnorm_to_mul_add, frozenset({"BatchNormalization"})),
    RewriteRule(lrn_to_conv_and_pows, frozenset({"LRN"})),
    RewriteRule(layernorm_to_channel_axis, frozenset({"LayerNormalization"})),
    RewriteRule(softmax_to_supported_axis, frozenset({"Softmax"})),
)
