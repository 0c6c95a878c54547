"""Reductions and the norms built from them: what the NPU has no kernel for (ReduceMean,
ReduceSum, Sqrt, InstanceNormalization; oplist V2.3.2 lists none of them) run as kernels it has,
as rknn-toolkit2 runs them (its ONNX support table, RKNNToolKit2_OP_Support 2.3.2, lists all
four as supported).

- A LayerNorm or RMSNorm written out op by op over trailing axes (exporters below opset 17) is
  done on the [L, C, 1, 1] view of its input, where exNorm's axis [1] is the normalized axis:
  as one LayerNormalization where the opset or the target's exNorm has it, else as 1x1
  convolutions for the means and element-wise ops the NPU runs. Norms already on the NPU's axes are left to the fusion pass.
- InstanceNormalization normalizes each (image, channel) over its spatial axes: the same on the
  [N*C, H*W, 1, 1] view, then the per-channel scale and bias.
- ReduceMax and ReduceMin stay on the CPU: a softmax written out with a float32 mask of
  finfo.min overflows to -inf in float16, and -inf - max(-inf) is NaN where float32 gives 0
  (onnx's expanded Attention cases with fully masked rows).
- Late, on what fusion left illegal: a mean or sum over one block of neighbouring axes is a 1x1
  Conv with weights 1/D (or 1) on the [outer, D, inner, 1] view; ReduceSumSquare and ReduceL2
  sum x*x the same way (the support table lists them as not supported, yet they are exact in
  these NPU ops, and rknn-toolkit2 2.5.0 plans EdgeNeXt's ReduceL2 with no CPU layer:
  tools/wide_zoo/peer_rk3588.json); Sqrt is Pow 0.5 (seed 000, Pow: exponents 0, 1, 2, 3, 0.5,
  -0.5).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.patterns import Match, matches
from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, element_count, static_shape

from rkcompile.passes.fusion_table import (MEAN_OPS, layer_norm_core, mean_axes, moments_layer_norm, reduction_axes,
                                           rms_norm_core, statistics_axes, statistics_layer_norm,
                                           statistics_restate_the_input)
from rkcompile.passes.rewrites.base import (RESHAPE_LIKE, Builder, Candidates, RewriteRule, Site, conv_1x1, producer,
                                            scalar)
from rkcompile.targets.constraints import NPU_RANK

#: First opset with LayerNormalization.
LAYER_NORMALIZATION_OPSET = 17
NORM_CORES = (("layer", layer_norm_core()), ("rms", rms_norm_core()), ("moments", moments_layer_norm()),
              ("statistics", statistics_layer_norm()))


def decomposed_norm_on_channel_view(node: gs.Node, site: Site) -> Candidates:
    """A LayerNorm (x - mean) / sqrt(var + eps) or RMSNorm x / sqrt(mean(x^2) + eps) written out
    op by op over a block of neighbouring axes of x (a LayerNorm also in tf2onnx's moments form
    and in flax's, their scale and centre inside: fusion_table.moments_layer_norm and
    statistics_layer_norm), whose axes are not exNorm's [1] or [1,2,3] on the 4-D view (seed
    001, exNorm), done on the [outer, C, inner, 1] view: the same reduction over axis 1. Over
    the trailing axes (inner 1), first as LayerNormalization (exNorm); else as -mean by a 1x1
    Conv with weights -1/C, x + (-mean), the variance (or mean square) by a 1x1 Conv with
    weights 1/C and bias eps, its Pow -0.5 and a Mul, then an inner scale and centre as a Mul
    and an Add: on the view when it has one row, so that the fusion pass makes the whole an
    exNorm where the target has it (fusion_table.layer_norm_by_channel_convs and
    rms_norm_by_channel_conv), with float32 statistics that cannot overflow as float16 squares
    can; on x's own shape otherwise, where a [C, 1, 1] constant would broadcast over the view's
    rows. Below opset 17 (paddle2onnx writes 15) the LayerNormalization is made only for a
    target with exNorm: the fusion pass makes it that kernel (one legal node, nothing can stop
    the fusion), so no plan holds an op its opset lacks."""
    reason = "not the output of a LayerNorm or RMSNorm written out op by op"
    for kind, core in NORM_CORES:
        for match in matches(core, node):
            region = _norm_region(match, kind, node, site)
            if isinstance(region, str):
                reason = region
                continue
            x, first, end, epsilon = region
            shape = static_shape(x)
            rows, channels, inner = (element_count(shape[:first]), element_count(shape[first:end]),
                                     element_count(shape[end:]))
            scale, bias = _inner_affine(match, shape, first, end)  # validated by _norm_region

            def on_view(param: np.ndarray) -> np.ndarray:
                return np.broadcast_to(param, shape[first:end]).reshape(channels, 1, 1)

            affine, outer_scale, outer_bias = _affine_after(node, shape, first, end, site)
            whole_scale, whole_bias = scale * outer_scale, bias * outer_scale + outer_bias
            if kind != "rms" and inner == 1 and _layer_normalization_allowed(site):
                builder = site.builder(node)
                view = builder.reshape(x, [rows, channels, 1, 1])
                normed = _layer_normalization(builder, view, epsilon, on_view(whole_scale), on_view(whole_bias))
                builder.reshape(normed, shape, out=(affine[-1] if affine else node).outputs[0])
                yield builder.finish(*match.members, *affine)
            builder = site.builder(node)
            view_shape = [rows, channels, inner, 1]
            normed = _normalized_by_convs(builder, builder.reshape(x, view_shape), epsilon, centre=kind != "rms")
            if rows == 1:  # the affine on the view, where it broadcasts over the channels alone
                if np.any(whole_scale != 1):
                    normed = builder.op("Mul", [normed, builder.const(on_view(whole_scale), "scale")], view_shape, x.dtype)
                if np.any(whole_bias != 0):
                    normed = builder.op("Add", [normed, builder.const(on_view(whole_bias), "bias")], view_shape, x.dtype)
                builder.reshape(normed, shape, out=(affine[-1] if affine else node).outputs[0])
                yield builder.finish(*match.members, *affine)
                return
            if kind in ("moments", "statistics"):  # the inner affine on x's own shape
                on_input = (1,) * (len(shape) - end)
                normed = builder.op("Mul", [builder.reshape(normed, shape),
                                            builder.const(scale.reshape(scale.shape + on_input), "scale")], shape, x.dtype)
                builder.op("Add", [normed, builder.const(bias.reshape(bias.shape + on_input), "bias")],
                           out=node.outputs[0])
            else:
                builder.reshape(normed, shape, out=node.outputs[0])
            yield builder.finish(*match.members)
            return
    return reason


def _norm_region(match: Match, kind: str, root: gs.Node, site: Site) -> tuple[gs.Tensor, int, int, float] | str:
    """(x, first and past-the-last normalized axis, epsilon) of a matched norm that can move to
    the channel view, or why it cannot."""
    x = match.tensors["x"]
    shape = static_shape(x)
    if shape is None or dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "its input is not a float tensor of known shape"
    rank = len(shape)
    if kind == "statistics":
        restated, why = statistics_restate_the_input(match)
        if not restated:
            return why
        normalized = list(statistics_axes(match))
    else:
        axes = {tuple(mean_axes(n, rank) or ()) for n in match.members if n.op in MEAN_OPS}
        if len(axes) != 1 or () in axes:
            return "its means do not share one set of axes, kept"
        normalized = list(next(iter(axes)))
    if not normalized or normalized != list(range(normalized[0], normalized[-1] + 1)):
        return f"it normalizes axes {normalized}, not one block of neighbouring axes"
    view = [a + 4 - rank for a in normalized] if rank <= 4 else None
    allowed = site.target.rule_parameter("LayerNormalization", "norm_axes", "allowed") or ()
    if view is not None and tuple(view) in {tuple(a) for a in allowed}:
        return f"axes {view} on the 4-D view are exNorm's own: the fusion pass runs it as it is"
    members = {id(n) for n in match.members}
    for member in match.members:
        if member is root:
            continue
        for tensor in member.outputs:
            if tensor.name in site.graph_outputs or any(id(reader) not in members for reader in tensor.outputs):
                return f"{tensor.name} is read outside the norm"
    first, end = normalized[0], normalized[-1] + 1
    inner = _inner_affine(match, shape, first, end)
    if isinstance(inner, str):
        return inner
    return x, first, end, float(np.asarray(match.constant("epsilon")).reshape(-1)[0])


def _layer_normalization_allowed(site: Site) -> bool:
    """Below opset 17 (paddle2onnx writes 15) a LayerNormalization is made only for a target
    with exNorm: the fusion pass makes it that kernel, so no plan holds an op its opset lacks."""
    return site.opset >= LAYER_NORMALIZATION_OPSET or site.target.has_kernel("exNorm")


def _over_normalized_axes(values: np.ndarray, shape, first: int, end: int, dtype: str) -> np.ndarray | None:
    """A constant applied to a tensor of `shape` as the values it takes along the normalized
    axes shape[first:end] (1s where it does not vary), or None when it varies along another axis."""
    if values.ndim > len(shape) or dtype_name(values.dtype) not in FLOAT_DTYPES:
        return None
    aligned = values.reshape((1,) * (len(shape) - values.ndim) + values.shape)
    if any(d != 1 for d in (*aligned.shape[:first], *aligned.shape[end:])):
        return None
    return aligned[(0,) * first + (slice(None),) * (end - first) + (0,) * (len(shape) - end)].astype(dtype)


def _inner_affine(match: Match, shape, first: int, end: int) -> tuple[np.ndarray, np.ndarray] | str:
    """The scale and centre a matched norm applies inside its own pattern (the moments and
    statistics forms' gamma and beta; 1 and 0 for others), over the normalized axes, or why
    they cannot be moved."""
    dtype = dtype_name(match.tensors["x"].dtype)
    unit = (1,) * (end - first)
    params = [np.ones(unit, dtype), np.zeros(unit, dtype)]
    for position, label in enumerate(("scale", "bias")):
        if label in match.tensors:
            values = _over_normalized_axes(np.asarray(match.constant(label)), shape, first, end, dtype)
            if values is None:
                return f"its {label} varies along an axis it does not normalize"
            params[position] = values
    return params[0], params[1]


def _affine_after(root: gs.Node, shape, first: int, end: int,
                  site: Site) -> tuple[list[gs.Node], np.ndarray, np.ndarray]:
    """The Mul by a constant scale, then the Add of a constant bias, each constant over the
    normalized axes shape[first:end] only, that alone read the norm's result in turn (exporters
    write LayerNorm's affine after its core): those nodes, and the scale and bias they apply, of
    shape[first:end]'s rank with 1s where they do not vary (a 1 and a 0 for a missing one), so
    the norm takes them as its own."""
    dtype = dtype_name(root.outputs[0].dtype)
    unit = (1,) * (end - first)
    params = {"Mul": np.ones(unit, dtype), "Add": np.zeros(unit, dtype)}
    nodes, result = [], root.outputs[0]
    for op in ("Mul", "Add"):
        reader = result.outputs[0] if len(result.outputs) == 1 and result.name not in site.graph_outputs else None
        if reader is None or reader.op != op or len(reader.inputs) != 2 or static_shape(reader.outputs[0]) != shape:
            continue
        operand = reader.inputs[1] if reader.inputs[0] is result else reader.inputs[0]
        values = np.asarray(operand.values) if isinstance(operand, gs.Constant) else None
        values = None if values is None else _over_normalized_axes(values, shape, first, end, dtype)
        if values is None:
            continue  # not a constant, or it varies along an axis the norm does not normalize
        params[op] = values
        nodes.append(reader)
        result = reader.outputs[0]
    return nodes, params["Mul"], params["Add"]


def _layer_normalization(builder: Builder, view: gs.Tensor, epsilon: float, scale=None, bias=None,
                         out: gs.Tensor | None = None) -> gs.Tensor:
    channels = static_shape(view)[1]
    dtype = dtype_name(view.dtype)
    scale = builder.const(np.ones((channels, 1, 1), dtype) if scale is None else scale, "scale")
    bias = builder.const(np.zeros((channels, 1, 1), dtype) if bias is None else bias, "bias")
    return builder.op("LayerNormalization", [view, scale, bias], static_shape(view), view.dtype, out,
                      axis=1, epsilon=epsilon)


def _normalized_by_convs(builder: Builder, view: gs.Tensor, epsilon: float, centre: bool) -> gs.Tensor:
    """(view - mean) * (var + eps)^-0.5, or view * (mean(view^2) + eps)^-0.5, over axis 1 of an
    [L, C, 1, 1] view, in ops the NPU runs."""
    rows, channels = static_shape(view)[:2]
    dtype = dtype_name(view.dtype)
    per_row = [rows, 1, 1, 1]
    if centre:
        negated_mean = conv_1x1(builder, view, np.full((1, channels), -1 / channels, dtype), None, per_row)
        view = builder.op("Add", [view, negated_mean], static_shape(view), view.dtype)
    square = builder.op("Mul", [view, view], static_shape(view), view.dtype)
    spread = conv_1x1(builder, square, np.full((1, channels), 1 / channels, dtype),
                      np.array([epsilon], dtype), per_row)
    inverse = builder.op("Pow", [spread, scalar(builder, -0.5, view)], per_row, view.dtype)
    return builder.op("Mul", [view, inverse], static_shape(view), view.dtype)


def single_group_norm_as_layer_norm(node: gs.Node, site: Site) -> Candidates:
    """GroupNorm with one group as torch exports it (PoolFormer's GroupNorm(1), ConvNeXt-style
    "LayerNorm over channels" of NCHW): x [N, C, spatial...] reshaped to [N, 1, C*S],
    InstanceNormalization, reshaped back to x's shape, then the per-channel affine as Mul and
    Add of constants. Normalizing the one group is normalizing axes [1, ...] of x, so the whole
    is one LayerNormalization on x [N, C, H, W] (on [N, C, S, 1] for other ranks), exNorm's axes
    [1, 2, 3] (seed 001, exNorm): no relabel steps, and the InstanceNormalization's scale and
    bias with the affine after it as its [C, 1, 1] scale and bias (exact: the same statistics
    and the same products, regrouped). The one group being every value of the image, the shape
    it is normalized in is free: where the relabels around the norm were composed with others
    (MobileViTv2's patches: x came as [64, 4, 256], the result goes on as [1, 64, 4, 256], or on
    into the fold's 6-D view), it is normalized in its result's shape, else in x's, handing on
    the [N, 1, C*S] the relabels after it read."""
    reshape_in = producer(node.inputs[0])
    grouped = static_shape(node.inputs[0])
    if reshape_in is None or reshape_in.op not in RESHAPE_LIKE or grouped is None or len(grouped) != 3 or grouped[1] != 1:
        return "its input is not a relabel to [N, 1, C*S] (GroupNorm with one group)"
    x = reshape_in.inputs[0]
    shape = static_shape(x)
    if shape is None or element_count(shape) != element_count(grouped) or dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "the relabelled tensor is not a float tensor of known shape"
    readers = node.outputs[0].outputs
    reshape_out = readers[0] if len(readers) == 1 else None
    if reshape_out is None or reshape_out.op not in RESHAPE_LIKE or node.outputs[0].name in site.graph_outputs:
        return "its result is not relabelled alone"
    relabelled = static_shape(reshape_out.outputs[0])

    def an_image(candidate) -> bool:   # [N, C, spatial...] of the NPU's rank
        return candidate is not None and 3 <= len(candidate) <= NPU_RANK and candidate[0] == grouped[0]

    if not an_image(relabelled) and not an_image(shape):
        return "neither its input nor its relabelled result is an [N, C, spatial...]"
    parameters = _group_norm_parameters(node, reshape_in, site)
    if isinstance(parameters, str):
        return parameters
    group_scale, group_bias = (float(v.reshape(-1)[0]) for v in parameters)
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    builder = site.builder(node)
    if an_image(relabelled):
        affine, scale, bias = _affine_after(reshape_out, relabelled, 1, len(relabelled), site)
        source = x if relabelled == shape else builder.reshape(x, relabelled)
        _layer_normalized(builder, source, epsilon, scale * group_scale, scale * group_bias + bias,
                          (affine[-1] if affine else reshape_out).outputs[0])
        yield builder.finish(reshape_in, node, reshape_out, *affine)
        return
    unit = np.ones((1,) * (len(shape) - 1), dtype_name(x.dtype))
    normed = _layer_normalized(builder, x, epsilon, unit * group_scale, unit * group_bias)
    builder.reshape(normed, grouped, out=node.outputs[0])   # the relabels after it, as they were
    yield builder.finish(reshape_in, node)


def _group_norm_parameters(node: gs.Node, reshape_in: gs.Node, site: Site) -> tuple[np.ndarray, np.ndarray] | str:
    """The constant scale and bias of a GroupNorm's InstanceNormalization `node`, whose input
    `reshape_in` groups, or why its rewrite as a LayerNormalization declines."""
    if reshape_in.outputs[0].name in site.graph_outputs or len(reshape_in.outputs[0].outputs) != 1:
        return "the relabelled input is read outside the norm"
    scale, bias = (constant_value(t) for t in node.inputs[1:3])
    if scale is None or bias is None:
        return "its scale or bias is not constant"
    if not _layer_normalization_allowed(site):
        return f"opset {site.opset} has no LayerNormalization and {site.target.name} no exNorm"
    return np.asarray(scale), np.asarray(bias)


def group_norm_on_group_view(node: gs.Node, site: Site) -> Candidates:
    """GroupNorm with G > 1 groups as torch exports it: x [N, C, spatial...] relabelled to
    [N, G, C/G*S], InstanceNormalization, relabelled back to x's shape, then the per-channel
    affine as Mul and Add of constants. Normalizing each group is normalizing axes [1, ...] of
    the [N*G, C/G, H, W] view of x (a 3-D x as [N*G, C/G, L, 1]): one LayerNormalization on
    that view, exNorm's axes [1, 2, 3] (seed 001, exNorm). The InstanceNormalization's scale
    and bias (one per group) and the affine after it (one per channel) are one scale and one
    bias per channel: the LayerNormalization's own where they repeat from group to group (torch
    exports GroupNorm with ones and zeros in the InstanceNormalization), else a Mul and an Add
    after the relabel back. Exact: the same statistics over the same elements. Where C/G is a
    multiple of the NPU's channel block, the view stores x's bytes as they are, so neither
    relabel moves any. The view instance_norm_on_channel_view takes instead, [N*G, C/G*S, 1, 1],
    holds a group's every element as a channel: its relabels move every byte, and a per-group
    scale on it broadcasts over a width above the NPU's limit."""
    reshape_in = producer(node.inputs[0])
    grouped = static_shape(node.inputs[0])
    if reshape_in is None or reshape_in.op not in RESHAPE_LIKE or grouped is None or len(grouped) != 3 or grouped[1] < 2:
        return "its input is not a relabel to [N, G, C/G*S] with G > 1 (GroupNorm)"
    x = reshape_in.inputs[0]
    shape = static_shape(x)
    groups = grouped[1]
    if (shape is None or not 3 <= len(shape) <= NPU_RANK or shape[0] != grouped[0] or shape[1] % groups
            or element_count(shape) != element_count(grouped) or dtype_name(x.dtype) not in FLOAT_DTYPES):
        return f"the relabelled tensor is not a float [N, C, spatial...] of rank up to {NPU_RANK} whose channels the groups split"
    readers = node.outputs[0].outputs
    reshape_out = readers[0] if len(readers) == 1 else None
    if (reshape_out is None or reshape_out.op not in RESHAPE_LIKE or node.outputs[0].name in site.graph_outputs
            or static_shape(reshape_out.outputs[0]) != shape):
        return "its result is not relabelled back to the input's shape alone"
    parameters = _group_norm_parameters(node, reshape_in, site)
    if isinstance(parameters, str):
        return parameters
    group_scale, group_bias = parameters
    per_group = shape[1] // groups
    affine, channel_scale, channel_bias = _affine_after(reshape_out, shape, 1, 2, site)
    # per channel: (normed * group scale + group bias) * channel scale + channel bias
    scale = np.repeat(np.broadcast_to(group_scale.reshape(-1), (groups,)), per_group) * channel_scale
    bias = np.repeat(np.broadcast_to(group_bias.reshape(-1), (groups,)), per_group) * channel_scale + channel_bias
    dtype = dtype_name(x.dtype)
    scale, bias = scale.astype(dtype).reshape(groups, per_group), bias.astype(dtype).reshape(groups, per_group)
    view_shape = [shape[0] * groups, per_group] + (list(shape[2:]) if len(shape) == 4 else [shape[2], 1])
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    builder = site.builder(node)
    view = builder.reshape(x, view_shape)
    y = (affine[-1] if affine else reshape_out).outputs[0]
    if np.all(scale == scale[0]) and np.all(bias == bias[0]):
        normed = _layer_normalization(builder, view, epsilon, scale[0].reshape(per_group, 1, 1),
                                      bias[0].reshape(per_group, 1, 1))
        builder.reshape(normed, shape, out=y)
    else:
        normed = _layer_normalization(builder, view, epsilon)
        # [N, C, 1, ...]: a [1, C, 1, 1] operand reaches a batch of several images by none of the Expand patterns
        channel_shape = [shape[0], shape[1]] + [1] * (len(shape) - 2)
        scaled = builder.op("Mul", [builder.reshape(normed, shape),
                                    builder.const(_per_channel(scale, channel_shape, dtype), "scale")], shape, x.dtype)
        builder.op("Add", [scaled, builder.const(_per_channel(bias, channel_shape, dtype), "bias")], out=y)
    yield builder.finish(reshape_in, node, reshape_out, *affine)


def _layer_normalized(builder: Builder, x: gs.Tensor, epsilon: float, scale: np.ndarray, bias: np.ndarray,
                      out: gs.Tensor | None = None) -> gs.Tensor:
    """A LayerNormalization of x [N, C, spatial...] over axes [1, ...] with `scale` and `bias` of
    x's shape less N (1s where they do not vary): on x itself at rank 4, else on its
    [N, C, S, 1] view, relabelled back."""
    shape = static_shape(x)
    if len(shape) == 4:
        return _layer_normalization(builder, x, epsilon, scale, bias, out=out)
    spatial = element_count(shape[2:])

    def on_view(param: np.ndarray) -> np.ndarray:
        if all(d == 1 for d in param.shape[1:]):
            return param.reshape(param.shape[0], 1, 1)
        return np.broadcast_to(param, shape[1:]).reshape(shape[1], spatial, 1)

    view = builder.reshape(x, [shape[0], shape[1], spatial, 1])
    return builder.reshape(_layer_normalization(builder, view, epsilon, on_view(scale), on_view(bias)), shape, out=out)


def instance_norm_on_channel_view(node: gs.Node, site: Site) -> Candidates:
    """InstanceNormalization of x [N, C, spatial...] normalizes each (image, channel) over its
    spatial axes: on the [N*C, S, 1, 1] view that is exNorm's axis [1] (seed 001, exNorm), then
    the per-channel scale and bias as a Mul and an Add of [N, C, 1, ...] constants."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    scale, bias = (np.asarray(t.values) if isinstance(t, gs.Constant) else None for t in node.inputs[1:3])
    if shape is None or len(shape) < 3 or scale is None or bias is None:
        return "not a float input of known shape with constant scale and bias"
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    # [N, C, 1, ...]: a [1, C, 1, 1] operand reaches a batch of several images by none of the Expand patterns
    channel_shape = [shape[0], shape[1]] + [1] * (len(shape) - 2)
    dtype = dtype_name(x.dtype)
    rows = [shape[0] * shape[1], element_count(shape[2:]), 1, 1]
    as_layer_normalization = [True] if site.opset >= LAYER_NORMALIZATION_OPSET else []
    for layer_normalization in as_layer_normalization + [False]:
        builder = site.builder(node)
        view = builder.reshape(x, rows)
        normed = (_layer_normalization(builder, view, epsilon) if layer_normalization
                  else _normalized_by_convs(builder, view, epsilon, centre=True))
        per_channel_scale = builder.const(_per_channel(scale, channel_shape, dtype), "scale")
        scaled = builder.op("Mul", [builder.reshape(normed, shape), per_channel_scale], shape, x.dtype)
        builder.op("Add", [scaled, builder.const(_per_channel(bias, channel_shape, dtype), "bias")], out=y)
        yield builder.finish()


def _per_channel(values: np.ndarray, shape: list[int], dtype: str) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(values.reshape(1, -1, *[1] * (len(shape) - 2)), shape).astype(dtype))


#: The sum of squares an L2 normalization takes is scaled by 2^15 (the largest power of two a
#: float16 weight holds), so its epsilon, stored as a float16 bias, is at least float16's
#: smallest value 2^-24 yet only 2^-39 against the unscaled sum.
L2_SUM_SCALE = 2.0 ** 15


def l2_normalize_on_channel_view(node: gs.Node, site: Site) -> Candidates:
    """x / max(||x||, eps) over trailing axes of x [..., H] (torch's F.normalize: ReduceL2
    keeping dims, Clip or Max at eps, an Expand to x's shape maybe, Div) on the [L, H, 1, 1]
    view as x * (s * sum(x^2) + b)^-0.5 * s^0.5 with the sum by a 1x1 Conv of weights s = 2^15
    and bias b = max(s * eps^2, 2^-24): an RMSNorm, times a constant, that the fusion table makes
    one exNorm (seed 001, exNorm: RMSNormalization; rknn-toolkit2 2.5.0 plans EdgeNeXt's
    normalized queries and keys as exNorm, tools/wide_zoo/peer_rk3588.json). It is
    x / sqrt(||x||^2 + b / s): within float16 rounding (2^-11) of F.normalize for every row of
    norm at least 2^-14.5 (b / s is 2^-39 for eps up to 2^-20, torch's 1e-12 among them; a
    larger eps declines), and a row of smaller norm has every value among float16's
    subnormals; a row of zeros stays zeros.
    Only on a target with exNorm: its statistics are float32, so s * sum(x^2) cannot overflow
    as a float16 step would."""
    x = node.inputs[0]
    shape = static_shape(x)
    if shape is None or dtype_name(x.dtype) not in FLOAT_DTYPES or static_shape(node.outputs[0]) != shape:
        return "not a float tensor of known shape divided without broadcasting it"
    chain, divisor, epsilon = [], producer(node.inputs[1]), 0.0
    if divisor is not None and divisor.op == "Expand":
        chain.append(divisor)
        divisor = producer(divisor.inputs[0])
    if divisor is not None and divisor.op in ("Clip", "Max"):
        bounds = [t for t in divisor.inputs[1:] if t.name]
        floor = constant_value(bounds[0]) if len(bounds) == 1 and divisor.inputs[1] is bounds[0] else None
        if floor is None or floor.size != 1 or (divisor.op == "Clip" and len(divisor.inputs) != 2 and divisor.inputs[2].name):
            return f"{divisor.name} is not a floor at one constant"
        chain.append(divisor)
        epsilon = max(float(np.asarray(floor).reshape(-1)[0]), 0.0)
        divisor = producer(divisor.inputs[0])
    if epsilon > 2.0 ** -20:
        return f"its floor {epsilon:g} is above 2^-20: sqrt(||x||^2 + eps^2) would not stand for max(||x||, eps)"
    if divisor is None or divisor.op != "ReduceL2" or divisor.inputs[0] is not x:
        return "not x divided by its own ReduceL2 (floored, expanded)"
    block = _reduced_block(divisor)
    if isinstance(block, str):
        return block
    _, first, count = block
    if first + count != len(shape) or not divisor.attrs.get("keepdims", 1):
        return "its norm is not over trailing axes, kept"
    chain.append(divisor)
    for member in chain:
        if member.outputs[0].name in site.graph_outputs or len(member.outputs[0].outputs) != 1:
            return f"{member.outputs[0].name} is read outside the normalization"
    if not site.target.has_kernel("exNorm"):
        return f"{site.target.name} has no exNorm to take its statistics in float32"
    rows, depth = element_count(shape[:first]), element_count(shape[first:])
    dtype = dtype_name(x.dtype)
    floor = max(L2_SUM_SCALE * epsilon ** 2, 2.0 ** -24)
    builder = site.builder(node)
    view = builder.reshape(x, [rows, depth, 1, 1])
    square = builder.op("Mul", [view, view], [rows, depth, 1, 1], x.dtype)
    spread = conv_1x1(builder, square, np.full((1, depth), L2_SUM_SCALE, dtype), np.array([floor], dtype),
                      [rows, 1, 1, 1])
    inverse = builder.op("Pow", [spread, scalar(builder, -0.5, x)], [rows, 1, 1, 1], x.dtype)
    normed = builder.op("Mul", [view, inverse], [rows, depth, 1, 1], x.dtype)
    scaled = builder.op("Mul", [normed, scalar(builder, L2_SUM_SCALE ** 0.5, x)], [rows, depth, 1, 1], x.dtype)
    builder.reshape(scaled, shape, out=node.outputs[0])
    yield builder.finish(node, *chain)


def _reduced_block(node: gs.Node) -> tuple[tuple[int, ...], int, int] | str:
    """(input shape, first reduced axis, number of reduced axes) of a reduction over one block
    of neighbouring axes, or why it is not one."""
    shape = static_shape(node.inputs[0])
    if shape is None or static_shape(node.outputs[0]) is None or dtype_name(node.inputs[0].dtype) not in FLOAT_DTYPES:
        return "not a float tensor of known shape"
    axes = reduction_axes(node)
    has_axes_input = len(node.inputs) > 1 and node.inputs[1].name
    if axes is None and has_axes_input:
        return "its axes are not constant"
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return "no axes with noop_with_empty_axes: an identity"
        axes = list(range(len(shape)))
    axes = sorted(a % len(shape) for a in axes)
    if axes != list(range(axes[0], axes[-1] + 1)):
        return f"axes {axes} are not one block of neighbouring axes"
    return shape, axes[0], len(axes)


def reduce_mean_or_sum_as_conv(node: gs.Node, site: Site) -> Candidates:
    """ReduceMean or ReduceSum over one block of neighbouring axes as a 1x1 Conv with weights 1/D
    (or 1) on the [outer, D, inner, 1] view, the sum over D being the convolution's channel sum;
    ReduceSumSquare and ReduceL2 sum x*x the same way, ReduceL2 then takes Pow 0.5 (seed 000,
    Pow exponents)."""
    block = _reduced_block(node)
    if isinstance(block, str):
        return block
    shape, first, count = block
    builder = site.builder(node)
    x = node.inputs[0]
    summed = block_reduction_as_conv(builder, x, shape, first, count, node.op)
    if node.op == "ReduceL2":
        summed = builder.op("Pow", [summed, scalar(builder, 0.5, x)], static_shape(summed), x.dtype)
    builder.reshape(summed, static_shape(node.outputs[0]), out=node.outputs[0])
    yield builder.finish()


def block_reduction_as_conv(builder: Builder, x: gs.Tensor, shape: list[int], first: int, count: int,
                            op: str) -> gs.Tensor:
    """The sum (mean for ReduceMean, sum of squares for ReduceSumSquare and ReduceL2) of `x`, of
    `shape`, over its axes first .. first + count - 1, as a 1x1 Conv of weights 1/D (or 1) on the
    [outer, D, inner, 1] view: the convolution's channel sum is the sum over D. Returns the
    [outer, 1, inner, 1] result."""
    outer, depth = element_count(shape[:first]), element_count(shape[first:first + count])
    inner = element_count(shape[first + count:])
    view = builder.reshape(x, [outer, depth, inner, 1])
    if op in ("ReduceSumSquare", "ReduceL2"):
        view = builder.op("Mul", [view, view], [outer, depth, inner, 1], x.dtype)
    weight = np.full((1, depth), 1 / depth if op == "ReduceMean" else 1.0, dtype_name(view.dtype))
    return conv_1x1(builder, view, weight, None, [outer, 1, inner, 1])


def sqrt_as_pow(node: gs.Node, site: Site) -> Candidates:
    """Sqrt(x) is Pow(x, 0.5), an exponent the NPU's Pow takes (seed 000, Pow)."""
    x = node.inputs[0]
    if dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "not a float tensor"
    builder = site.builder(node)
    builder.op("Pow", [x, scalar(builder, 0.5, x)], out=node.outputs[0])
    yield builder.finish()


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(decomposed_norm_on_channel_view, frozenset({"Div", "Mul", "Add"}), always=True),
    RewriteRule(l2_normalize_on_channel_view, frozenset({"Div"}), always=True),
    RewriteRule(single_group_norm_as_layer_norm, frozenset({"InstanceNormalization"})),
    RewriteRule(group_norm_on_group_view, frozenset({"InstanceNormalization"})),
    RewriteRule(instance_norm_on_channel_view, frozenset({"InstanceNormalization"})),
    RewriteRule(reduce_mean_or_sum_as_conv, frozenset({"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2"}),
                late=True),
    RewriteRule(sqrt_as_pow, frozenset({"Sqrt"}), late=True),
)
