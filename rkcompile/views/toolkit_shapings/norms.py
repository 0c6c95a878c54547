"""Shapings of the plan's norms: a mean's epsilon apart from its Conv (`mean_biases_apart`, so
that the mean is written back as a ReduceMean and the norm reads as the toolkit fuses it),
GroupNorm's rows written on the input's planes (`group_norms_on_their_planes`), and a norm over
the channels as a LayerNormalization between Transposes (`channel_norms_as_layer_norms`)."""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import ai_onnx_opset, node_attributes, nodes_rewritten, static_shapes
from rkcompile.views.toolkit_shapings.common import (Shaping, lookups, pointwise, reduction_node, reshape_node,
                                                    torch_layer_norm)


def group_norms_on_their_planes(model: onnx.ModelProto) -> int:
    """Write the plan's norm of groups of channels, a Reshape of x [N, C, H, W] to [N*G, L, 1, 1]
    (G groups of L = C/G*H*W values, one per row), the rows normalized (a LayerNormalization
    over axis 1, or the mean and variance by 1x1 Convs of uniform weights and
    (x - mean) / sqrt(variance + eps)), or to [N*G, C/G, H, W] (each group an image),
    normalized by a LayerNormalization over axes [1, 2, 3] (the rewrites' GroupNorm), then Reshapes and Muls and Adds by constants equal
    along each row (the norm's scale and bias) to x's shape, or as far as they go when another
    op reads them first (a norm whose scale the plan folded into the next Conv: MobileViTv2's),
    as a norm of the same statistics that keeps H and W apart (torchvision's GroupNorm; float32
    rounding apart): the Reshape of x to [N, G, C/G*H, W], an InstanceNormalization and the
    Reshape back when C/G or H*W is a multiple of 8, else on x's own shape by per-channel means
    averaged within each group, and a Reshape to the shape where the chain stopped.
    rknn-toolkit2 2.5.0 runs both Reshapes of the plan's form on its CPU where H*W is not a
    multiple of 8 (FCOS's head at 10x10, 5x5, 3x3), and either form here on its NPU (the first
    as one exNorm of [N*G, C/G, H, W], whose Reshapes it runs on its CPU when neither size is a
    multiple of 8); it cuts the plan's mean of a long row into Convs of 1024 channels added up
    (timm_mobilevitv2_050: 62 ConvAdd layers a norm of 65,536 values). Groups of one channel
    (an InstanceNormalization, or a norm of rows held as channels) stay as planned. Returns how
    many norms it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, _, graph_outputs = lookups(graph)
    opset = ai_onnx_opset(model)
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    made_by = {name: node for node in originals for name in node.output}
    for node in originals:
        source, view = shapes.get(node.input[0]), shapes.get(node.output[0])
        if node.op_type != "Reshape" or source is None or view is None or len(source) != 4 or len(view) != 4 \
                or view[0] % source[0] or int(np.prod(view)) != int(np.prod(source)):
            continue
        batch, channels, height, width = source
        groups = view[0] // batch
        if view[2:] == [1, 1]:
            normed = _row_norm(node.output[0], view[1], readers, constants, graph_outputs)
        elif view[1:] == [channels // groups, height, width] and groups > 1:
            normed = _group_view_norm(node.output[0], readers, constants, graph_outputs)
        else:
            continue
        if normed is None or channels % groups or channels == groups:   # one channel a group: a row norm
            continue
        end, scale, bias = _affine_to_shape(made_by[normed[0]], normed[3:], source, groups, shapes, readers,
                                            constants, graph_outputs)
        if end.output[0] not in shapes:
            continue
        scale, bias = (values.reshape(batch, groups, -1) for values in (scale, bias))
        group_norm = GroupNorm(node.input[0], source, groups, normed[1], scale[0, :, 0].astype(normed[2]),
                               bias[0, :, 0].astype(normed[2]), end.output[0], shapes[end.output[0]])
        written[id(end)] = (_instance_norm_of_groups(graph, group_norm, f"{node.name}/instance_norm")
                            if channels // groups % 8 == 0 or height * width % 8 == 0
                            else _group_norm_by_channel_means(graph, group_norm, f"{node.name}/channel_means", opset))
    return nodes_rewritten(graph, originals, written)


class GroupNorm(NamedTuple):
    """A norm of `groups` groups of channels of `source` [N, C, H, W] (the mean and variance
    of each group's C/G*H*W values), then each group's scale and bias, into `result` (of
    `result_shape`, a view of the same elements)."""
    source: str
    shape: list[int]
    groups: int
    epsilon: float
    scale: np.ndarray
    bias: np.ndarray
    result: str
    result_shape: list[int]


def _instance_norm_of_groups(graph: onnx.GraphProto, norm: GroupNorm, prefix: str) -> list[onnx.NodeProto]:
    """`norm` as the Reshape of its source to [N, G, C/G*H, W], an InstanceNormalization and
    the Reshape back (rknn-toolkit2 2.5.0 makes it one exNorm of [N*G, C/G, H, W] on its NPU
    when C/G or H*W is a multiple of 8); its initializers added to `graph`."""
    batch, channels, height, width = norm.shape
    tensors = [numpy_helper.from_array(values, f"{prefix}/{what}") for what, values in (
        ("grouped_shape", np.array([batch, norm.groups, channels // norm.groups * height, width], np.int64)),
        ("scale", norm.scale), ("bias", norm.bias), ("shape", np.array(norm.result_shape, np.int64)))]
    graph.initializer.extend(tensors)
    grouped, normalized = f"{prefix}/grouped", f"{prefix}/normalized"
    return [helper.make_node("Reshape", [norm.source, tensors[0].name], [grouped], grouped),
            helper.make_node("InstanceNormalization", [grouped, tensors[1].name, tensors[2].name], [normalized],
                             prefix, epsilon=norm.epsilon),
            helper.make_node("Reshape", [normalized, tensors[3].name], [norm.result], f"{prefix}/reshape")]


def _group_norm_by_channel_means(graph: onnx.GraphProto, norm: GroupNorm, prefix: str,
                                 opset: int) -> list[onnx.NodeProto]:
    """`norm` on its source's own shape: each channel's mean over H, W (ReduceMean), their mean
    over the channel's group as each channel's group mean (a 1x1 Conv of weights 1/(C/G)
    within each group, 0 across), the same for the variance, then (x - mean) /
    sqrt(variance + eps) and the scale and bias per channel: the same statistics (each channel
    has H*W values). Its initializers added to `graph`."""
    channels = norm.shape[1]
    size = channels // norm.groups
    dtype = norm.scale.dtype
    within_groups = np.kron(np.eye(norm.groups), np.full((size, size), 1.0 / size)).astype(dtype)
    tensors = [numpy_helper.from_array(values, f"{prefix}/{what}") for what, values in (
        ("group_mean_weight", within_groups.reshape(channels, channels, 1, 1)),
        ("epsilon", np.array(norm.epsilon, dtype)),
        ("scale", np.repeat(norm.scale, size).reshape(1, channels, 1, 1)),
        ("bias", np.repeat(norm.bias, size).reshape(1, channels, 1, 1)))]
    graph.initializer.extend(tensors)
    names = {what: f"{prefix}/{what}" for what in ("channel_means", "means", "centred", "squares", "channel_variances",
                                                   "variances", "shifted", "deviations", "normalized", "scaled", "biased")}
    return [
        reduction_node(graph, "ReduceMean", norm.source, [2, 3], names["channel_means"], names["channel_means"], opset),
        helper.make_node("Conv", [names["channel_means"], tensors[0].name], [names["means"]], names["means"]),
        helper.make_node("Sub", [norm.source, names["means"]], [names["centred"]], names["centred"]),
        helper.make_node("Mul", [names["centred"], names["centred"]], [names["squares"]], names["squares"]),
        reduction_node(graph, "ReduceMean", names["squares"], [2, 3], names["channel_variances"],
                       names["channel_variances"], opset),
        helper.make_node("Conv", [names["channel_variances"], tensors[0].name], [names["variances"]],
                         names["variances"]),
        helper.make_node("Add", [names["variances"], tensors[1].name], [names["shifted"]], names["shifted"]),
        helper.make_node("Sqrt", [names["shifted"]], [names["deviations"]], names["deviations"]),
        helper.make_node("Div", [names["centred"], names["deviations"]], [names["normalized"]], names["normalized"]),
        helper.make_node("Mul", [names["normalized"], tensors[2].name], [names["scaled"]], names["scaled"]),
        *([helper.make_node("Add", [names["scaled"], tensors[3].name], [norm.result], f"{prefix}/bias")]
          if norm.result_shape == norm.shape else
          [helper.make_node("Add", [names["scaled"], tensors[3].name], [names["biased"]], f"{prefix}/bias"),
           reshape_node(graph, names["biased"], norm.result_shape, norm.result, f"{prefix}/reshape")])]


def _row_norm(rows: str, length: int, readers: dict[str, list[onnx.NodeProto]], constants: dict[str, np.ndarray],
              graph_outputs: set[str]) -> tuple[str, float, np.dtype, float, float] | None:
    """(the result, epsilon, the float type, scale, bias) of the plan's norm of each row of `rows`
    [R, length, 1, 1], times a scale plus a bias: a LayerNormalization over axis 1 of one
    scale and one bias value, or centred = rows + Conv(rows) by weights -1/length, then
    centred / Sqrt(the mean of centred * centred by a Conv of weights 1/length, plus epsilon
    as its bias or an Add), of scale 1 and bias 0; None when `rows` is read otherwise or the
    norm's steps are read outside it."""
    def only(name: str, op_type: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type and name not in graph_outputs else None

    def mean(conv: onnx.NodeProto | None, weight: float) -> np.ndarray | None:
        """The weights of `conv` when it is a 1x1 Conv of one channel, every weight `weight`."""
        weights = constants.get(conv.input[1]) if conv is not None and conv.op_type == "Conv" else None
        if weights is None or weights.shape != (1, length, 1, 1) or not pointwise(conv, weights.shape) \
                or not np.allclose(weights, weight, rtol=1e-6, atol=0):
            return None
        return weights

    first = readers.get(rows, [])
    if len(first) == 1 and first[0].op_type == "LayerNormalization" and rows not in graph_outputs:
        return _layer_norm_of_rows(first[0], constants)
    centring = next((r for r in first if r.op_type == "Conv"), None)
    centre = next((r for r in first if r.op_type == "Add"), None)
    if rows in graph_outputs or len(first) != 2 or mean(centring, -1.0 / length) is None or centre is None \
            or sorted(centre.input) != sorted([rows, centring.output[0]]) \
            or (len(centring.input) > 2 and centring.input[2] and constants.get(centring.input[2], np.ones(1)).any()) \
            or only(centring.output[0], "Add") is not centre:
        return None
    centred = centre.output[0]
    users = list({id(user): user for user in readers.get(centred, [])}.values())   # the square reads it twice
    square = next((r for r in users if r.op_type == "Mul" and list(r.input) == [centred, centred]), None)
    divide = next((r for r in users if r.op_type == "Div" and r.input[0] == centred), None)
    variance = only(square.output[0], "Conv") if square is not None else None
    weights = mean(variance, 1.0 / length)
    if len(users) != 2 or divide is None or weights is None or centred in graph_outputs:
        return None
    if len(variance.input) > 2 and variance.input[2]:
        epsilon, shifted = constants.get(variance.input[2]), variance
    else:
        shifted = only(variance.output[0], "Add")
        epsilon = constants.get(next((n for n in shifted.input if n != variance.output[0]), "")) if shifted else None
    root = only(shifted.output[0], "Sqrt") if epsilon is not None and epsilon.size == 1 else None
    if root is None or only(root.output[0], "Div") is not divide or divide.input[1] != root.output[0]:
        return None
    return divide.output[0], float(epsilon.reshape(-1)[0]), weights.dtype, 1.0, 0.0


def _group_view_norm(view: str, readers: dict[str, list[onnx.NodeProto]], constants: dict[str, np.ndarray],
                     graph_outputs: set[str]) -> tuple[str, float, np.dtype, float, float] | None:
    """(the result, epsilon, the float type, scale, bias) of the plan's norm of each group as an
    image of the [N*G, C/G, H, W] view (`view`) of one scale and one bias value: a
    LayerNormalization over axes [1, 2, 3] read by it alone, or that norm in the ops an export
    below opset 17 writes it in (standard_onnx's older form: ReduceMean, Sub, Pow, ReduceMean,
    Add, Sqrt, Div, Mul, Add); None otherwise."""
    found = readers.get(view, [])
    if view in graph_outputs:
        return None
    if len(found) == 1 and found[0].op_type == "LayerNormalization":
        return _layer_norm_of_rows(found[0], constants)

    def only(name: str, op_type: str) -> onnx.NodeProto | None:
        after = readers.get(name, [])
        return after[0] if len(after) == 1 and after[0].op_type == op_type and name not in graph_outputs else None

    def operand(node: onnx.NodeProto, name: str) -> np.ndarray | None:
        other = [n for n in node.input if n != name]
        return constants.get(other[0]) if len(other) == 1 else None

    mean = next((r for r in found if r.op_type == "ReduceMean"), None)
    centre = next((r for r in found if r.op_type == "Sub"), None)
    if len(found) != 2 or mean is None or centre is None or list(centre.input) != [view, mean.output[0]] \
            or node_attributes(mean).get("axes") != [1, 2, 3]:
        return None
    users = readers.get(centre.output[0], [])
    square = next((r for r in users if r.op_type == "Pow"), None)
    divide = next((r for r in users if r.op_type == "Div" and r.input[0] == centre.output[0]), None)
    variance = only(square.output[0], "ReduceMean") if square is not None else None
    shifted = only(variance.output[0], "Add") if variance is not None else None
    root = only(shifted.output[0], "Sqrt") if shifted is not None else None
    if len(users) != 2 or divide is None or root is None or only(root.output[0], "Div") is not divide \
            or node_attributes(variance).get("axes") != [1, 2, 3]:
        return None
    epsilon, two = operand(shifted, variance.output[0]), operand(square, centre.output[0])
    scaling = only(divide.output[0], "Mul")
    scale = operand(scaling, divide.output[0]) if scaling is not None else None
    if epsilon is None or epsilon.size != 1 or two is None or two.size != 1 or float(two.reshape(-1)[0]) != 2.0 \
            or scale is None or (scale != scale.reshape(-1)[0]).any():
        return None
    biasing = only(scaling.output[0], "Add")
    bias = operand(biasing, scaling.output[0]) if biasing is not None else None
    if bias is None or (bias != bias.reshape(-1)[0]).any():
        biasing, bias = None, np.zeros(1, scale.dtype)
    return ((biasing or scaling).output[0], float(epsilon.reshape(-1)[0]), scale.dtype, float(scale.reshape(-1)[0]),
            float(bias.reshape(-1)[0]))


def _layer_norm_of_rows(norm: onnx.NodeProto, constants: dict[str, np.ndarray]) -> tuple[str, float, np.dtype, float,
                                                                                            float] | None:
    """(the result, epsilon, the float type, scale, bias) of `norm`, a LayerNormalization over
    the axes from 1 of a 4-D view, when its scale is one value and its bias one value (or
    none); else None."""
    attributes = node_attributes(norm)
    scale = constants.get(norm.input[1])
    bias = constants.get(norm.input[2]) if len(norm.input) > 2 and norm.input[2] else np.zeros(1, np.float32)
    if attributes.get("axis", -1) not in (1, -3) or scale is None or bias is None \
            or (scale != scale.reshape(-1)[0]).any() or (bias != bias.reshape(-1)[0]).any():
        return None
    return (norm.output[0], float(attributes.get("epsilon", 1e-5)), scale.dtype, float(scale.reshape(-1)[0]),
            float(bias.reshape(-1)[0]))


def _affine_to_shape(start: onnx.NodeProto, affine: Sequence[float], shape: list[int], groups: int,
                     shapes: dict[str, list[int]], readers: dict[str, list[onnx.NodeProto]],
                     constants: dict[str, np.ndarray], graph_outputs: set[str],
                     ) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray]:
    """(the last node, scale, bias) of the chain of Reshapes and of Muls and Adds by constants
    that the norm's result (`start`'s output) alone feeds, up to a Reshape to `shape` (x's, of
    `groups` groups of channels) or else as far as it goes while each group's scale and bias
    stay one value (`start` itself when it goes nowhere): (the result * a + b, with `affine`
    (a, b)) through that chain is the norm * scale + bias, `scale` and `bias` flat in the
    elements' order (Reshapes keep it)."""
    scale, bias = (np.full(int(np.prod(shape)), value, np.float64) for value in affine)
    end, name = start, start.output[0]
    while len(readers.get(name, [])) == 1 and name not in graph_outputs and name in shapes:
        node, current = readers[name][0], shapes[name]
        if node.op_type in ("Mul", "Add") and list(node.input).count(name) == 1:
            operand = constants.get(next(n for n in node.input if n != name))
            if operand is None or shapes.get(node.output[0]) != current \
                    or list(np.broadcast_shapes(operand.shape, current)) != current:
                break
            values = np.broadcast_to(operand, current).reshape(-1)
            scaled = (scale * values, bias * values) if node.op_type == "Mul" else (scale, bias + values)
            if any((per_group != per_group[:1, :, :1]).any()
                   for per_group in (values.reshape(shape[0], groups, -1) for values in scaled)):
                break   # the scale or bias would differ within a group or between images
            scale, bias = scaled
        elif node.op_type != "Reshape" or node.output[0] not in shapes:
            break
        end, name = node, node.output[0]
        if node.op_type == "Reshape" and shapes[name] == list(shape):
            break
    return end, scale, bias


def mean_biases_apart(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of one output channel whose bias is one value b (a mean plus an epsilon,
    as the plan's norms compute a variance) as the Conv without bias, then an Add of b: the same
    sum, added last; `means_as_reduce_means` then writes the Conv back as a ReduceMean, and the
    norm reads mean -> Add -> Sqrt as rknn-toolkit2 fuses it. Returns how many it wrote."""
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        bias = constants.get(node.input[2]) if node.op_type == "Conv" and len(node.input) > 2 and node.input[2] else None
        weight = constants.get(node.input[1]) if bias is not None else None
        if weight is None or bias.size != 1 or weight.shape[0] != 1 \
                or not pointwise(node, weight.shape) or not bias.any():
            continue
        summed = f"{node.name}/without_bias"
        offset = numpy_helper.from_array(bias.reshape(()), f"{node.name}/bias_value")
        graph.initializer.append(offset)
        bare = onnx.NodeProto()
        bare.CopyFrom(node)
        del bare.input[2:]
        bare.output[0] = summed
        written[id(node)] = [bare, helper.make_node("Add", [summed, offset.name], [node.output[0]], f"{node.name}/add_bias")]
    return nodes_rewritten(graph, originals, written)


def channel_norms_as_layer_norms(model: onnx.ModelProto) -> int:
    """Write the plan's norm over the channels of x [N, C, H, W] (exNorm of tokens held as a
    plane: x plus a 1x1 Conv of weights -1/C, the centred values squared, their mean by a 1x1
    Conv of weights 1/C, an Add of epsilon, Sqrt, and the centred values divided by it) as a
    Transpose of x to [N, H, W, C], a LayerNormalization over its last axis and the Transpose
    back: the same values up to float32 rounding. Below opset 17 (no LayerNormalization) the
    norm is the nodes torch writes for one there (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
    Div over the last axis). rknn-toolkit2 2.5.0 runs the plan's form as seven layers a norm and
    loops on it in gMLP (timm_gmlp_ti16_224's export: no build within 900 s); the Transposes and
    either form of the norm between them it makes one exNorm of x. Returns how many norms it
    wrote."""
    opset = ai_onnx_opset(model)
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, _, graph_outputs = lookups(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        found = _channel_norm_from(node, shapes, constants, readers, graph_outputs)
        if found is None:
            continue
        members, epsilon = found
        source, result = node.input[0], members[-1].output[0]
        prefix = node.name or result
        written[id(members[-1])] = [
            helper.make_node("Transpose", [source], [f"{prefix}/channels_last"], f"{prefix}/channels_last",
                             perm=[0, 2, 3, 1]),
            *_norm_over_last_axis(graph, f"{prefix}/channels_last", shapes[source][1], epsilon, f"{prefix}/normed",
                                  f"{prefix}/layer_norm", opset),
            helper.make_node("Transpose", [f"{prefix}/normed"], [result], f"{prefix}/channels_first",
                             perm=[0, 3, 1, 2])]
        removed.update(id(member) for member in members[:-1])
    return nodes_rewritten(graph, originals, written, removed)


def _norm_over_last_axis(graph: onnx.GraphProto, source: str, channels: int, epsilon: float, result: str,
                         prefix: str, opset: int) -> list[onnx.NodeProto]:
    """The nodes normalizing `source` (rank 4) over its last axis of `channels` into `result`,
    unscaled: a LayerNormalization from opset 17, torch's nodes for one before it
    (`torch_layer_norm`); their constants added to `graph`."""
    if opset >= 17:
        scale = numpy_helper.from_array(np.ones(channels, np.float32), f"{prefix}/scale")
        graph.initializer.append(scale)
        return [helper.make_node("LayerNormalization", [source, scale.name], [result], prefix, axis=-1,
                                 epsilon=epsilon)]
    constants, nodes = torch_layer_norm(source, [3], epsilon, result, prefix)
    graph.initializer.extend(constants)
    return nodes


def _channel_norm_from(mean: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray],
                       readers: dict[str, list[onnx.NodeProto]], graph_outputs: set[str]
                       ) -> tuple[list[onnx.NodeProto], float] | None:
    """The nodes of the plan's norm over the channels that `mean` (the Conv of weights -1/C)
    starts, in order, the Div last, and its epsilon (`channel_norms_as_layer_norms`); None
    where `mean` starts none, or another op or a graph output reads one of its tensors but the
    last."""
    source = shapes.get(mean.input[0]) if mean.op_type == "Conv" else None
    if source is None or len(source) != 4 or len(mean.input) > 2 and mean.input[2]:
        return None
    channels = source[1]

    def uniform_mean(conv: onnx.NodeProto, sign: float) -> bool:
        weight = constants.get(conv.input[1])
        return conv.op_type == "Conv" and weight is not None and weight.shape == (1, channels, 1, 1) \
            and pointwise(conv, weight.shape) and (len(conv.input) < 3 or not conv.input[2]) \
            and np.allclose(weight, sign / channels, rtol=1e-6, atol=0)

    def only_reader(node: onnx.NodeProto) -> onnx.NodeProto | None:
        found = readers.get(node.output[0], [])
        return found[0] if len(found) == 1 and node.output[0] not in graph_outputs else None

    centre = only_reader(mean)
    if not uniform_mean(mean, -1.0) or centre is None or centre.op_type != "Add" \
            or sorted(centre.input) != sorted([mean.input[0], mean.output[0]]) or centre.output[0] in graph_outputs:
        return None
    centred = list({id(node): node for node in readers.get(centre.output[0], [])}.values())   # Mul reads it twice
    square = next((n for n in centred if n.op_type == "Mul" and list(n.input) == [centre.output[0]] * 2), None)
    divide = next((n for n in centred if n.op_type == "Div" and n.input[0] == centre.output[0]), None)
    if len(centred) != 2 or square is None or divide is None:
        return None
    variance = only_reader(square)
    if variance is None or not uniform_mean(variance, 1.0):
        return None
    members, epsilon, step = [mean, centre, square, variance], 0.0, only_reader(variance)
    shift = constants.get(step.input[1]) if step is not None and step.op_type == "Add" \
        and step.input[0] == variance.output[0] else None
    if shift is not None and shift.size == 1:
        members.append(step)
        epsilon, step = float(shift.reshape(())), only_reader(step)
    if step is None or step.op_type != "Sqrt" or only_reader(step) is not divide or divide.input[1] != step.output[0]:
        return None
    return [*members, step, divide], epsilon


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    mean_biases_apart,
    group_norms_on_their_planes,
    channel_norms_as_layer_norms,
)
