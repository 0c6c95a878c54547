"""Shapings of the plan's Convs: a zero Pad folded into the Conv after it (`pads_into_convs`), a
one-channel Conv's vector moved into the channels (`vectors_into_channels`), two Convs of one
input added as one (`added_convs_as_one`), the Conv of a reshaped matrix written back as the
Gemm it was (`linear_layers_as_gemms`), two Gemms added as one of the inputs joined
(`added_linears_as_one`), and a Conv between small planes and Reshapes written
from and into channels (`small_planes_into_channels`)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import node_attributes, nodes_rewritten, readers_of, static_shapes
from rkcompile.views.toolkit_shapings.common import Shaping, lookups, pointwise, reshape_node


def pads_into_convs(model: onnx.ModelProto) -> int:
    """Fold a zero constant Pad of the spatial axes whose only reader is a Conv (explicit pads)
    into that Conv's pads: the same values. rknn-toolkit2 2.5.0 tries that itself (its rule
    `fuse_pad_into_conv`) and fails on a Pad whose pads are an initializer (ValueError:
    assignment destination is read-only; tf2onnx's "same" padding of a strided Conv). Returns
    how many Pads it folded."""
    graph = model.graph
    constants, readers, _, graph_outputs = lookups(graph)
    folded = set()
    for node in graph.node:
        conv = readers.get(node.output[0], []) if node.op_type == "Pad" else []
        if len(conv) != 1 or conv[0].op_type != "Conv" or conv[0].input[0] != node.output[0] \
                or node.output[0] in graph_outputs:
            continue
        pads = _zero_constant_pads(node, constants)
        attributes = {a.name: a for a in conv[0].attribute}
        rank = len(pads) // 2 if pads is not None else 0
        if pads is None or any(pads[:2]) or any(pads[rank:rank + 2]) or any(p < 0 for p in pads) \
                or attributes.get("auto_pad", helper.make_attribute("auto_pad", b"NOTSET")).s not in (b"NOTSET", b""):
            continue
        spatial = rank - 2
        old = list(attributes["pads"].ints) if "pads" in attributes else [0] * (2 * spatial)
        new = [a + b for a, b in zip(old, [*pads[2:rank], *pads[rank + 2:]])]
        if "pads" in attributes:
            conv[0].attribute.remove(attributes["pads"])
        conv[0].attribute.append(helper.make_attribute("pads", new))
        conv[0].input[0] = node.input[0]
        folded.add(id(node))
    nodes = [node for node in graph.node if id(node) not in folded]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(folded)


def vectors_into_channels(model: onnx.ModelProto) -> int:
    """Write a Reshape of a one-channel Conv result holding a vector along a spatial axis
    ([N, 1, K, 1], the plan's mean over tokens as a Conv) as a Transpose of that axis into the
    channels, then the Reshape if the result is another shape: the same values. From Conv ->
    Reshape -> Conv (the head after a token mean) rknn-toolkit2 2.5.0 never returns: its rule
    `fuse_rs_conv` rewrites the pair back and forth (swin_tiny, levit). Returns how many Reshapes
    it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        source, shape = made_by.get(node.input[0]) if node.op_type == "Reshape" else None, shapes.get(node.input[0])
        if source is None or source.op_type != "Conv" or shape is None or len(shape) != 4 or shape[1] != 1:
            continue
        axis = next((a for a in (2, 3) if shape[a] > 1 and int(np.prod(shape[1:])) == shape[a]), None)
        if axis is None:
            continue
        perm = [0, axis, *(a for a in (1, 2, 3) if a != axis)]
        moved = [shape[a] for a in perm]
        target = shapes.get(node.output[0])
        if target == moved:
            written[id(node)] = [helper.make_node("Transpose", [node.input[0]], [node.output[0]],
                                                  f"{node.name}/as_transpose", perm=perm)]
        elif target is not None:
            name = f"{node.name}/into_channels"
            written[id(node)] = [helper.make_node("Transpose", [node.input[0]], [name], name, perm=perm),
                                 helper.make_node("Reshape", [name, *node.input[1:]], [node.output[0]], node.name)]
    return nodes_rewritten(graph, graph.node, written)


def added_convs_as_one(model: onnx.ModelProto) -> int:
    """Write the sum of two Convs of the same input with the same strides, dilations and
    groups, each read by that Add alone, as one Conv whose window spans both of theirs: each
    one's weights at its taps' offsets in the union, zeros elsewhere, summed, and the biases
    summed (`_union_of_windows`). The same values in real arithmetic (float32 rounding
    apart). rknn-toolkit2 2.5.0 sums two Convs of one window itself (its rule
    `fuse_conv_conv_add`) and fails on the Convs the plan makes of Gemms (TypeError:
    'NoneType' object is unsliceable: levit's two heads). The plan's tiles of a depthwise
    window wider than its kernel limit (inception_next's 1x11 band kernels: a 1x8 and a 1x5
    Conv added) the toolkit builds as two Convs and an Add; their union (1x9) it builds as one
    Conv, as it builds the original's 1x11. A sum of more tiles (a 13x13 window: four, added
    in a chain) becomes one Conv pass by pass, each merging the Convs the last one made.
    Returns how many Adds it wrote."""
    written = 0
    while merged := _added_convs_merged(model.graph):
        written += merged
    return written


def _added_convs_merged(graph: onnx.GraphProto) -> int:
    """One pass of `added_convs_as_one` over `graph`: how many Adds it wrote."""
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers = readers_of(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    merged: dict[int, onnx.NodeProto] = {}
    removed = set()
    for node in graph.node:
        convs = [made_by.get(name) for name in node.input] if node.op_type == "Add" else []
        if len(convs) != 2 or any(c is None or c.op_type != "Conv" or len(readers[c.output[0]]) != 1 for c in convs) \
                or convs[0] is convs[1] or _source(convs[0].input[0], made_by, constants) is None \
                or _source(convs[0].input[0], made_by, constants) != _source(convs[1].input[0], made_by, constants):
            continue
        if any(name not in constants for conv in convs for name in conv.input[1:] if name):
            continue
        weights = [numpy_helper.to_array(constants[conv.input[1]]) for conv in convs]
        union = _union_of_windows(convs, weights)
        if union is None:
            continue
        weight, attributes = union
        biases = [numpy_helper.to_array(constants[conv.input[2]]) if len(conv.input) > 2 and conv.input[2]
                  else np.zeros(weights[0].shape[0], weights[0].dtype) for conv in convs]
        prefix = f"{node.name}/summed_conv"
        summed = [numpy_helper.from_array(weight, f"{prefix}/weight"),
                  numpy_helper.from_array(biases[0] + biases[1], f"{prefix}/bias")]
        graph.initializer.extend(summed)
        merged[id(node)] = helper.make_node("Conv", [convs[0].input[0], *(t.name for t in summed)], [node.output[0]],
                                            prefix, **attributes)
        removed.update(id(conv) for conv in convs)
    nodes = [merged.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(merged)


def _union_of_windows(convs: Sequence[onnx.NodeProto], weights: Sequence[np.ndarray]
                      ) -> tuple[np.ndarray, dict] | None:
    """The weights and attributes of one Conv computing the sum of `convs` (of `weights`) on
    their common input, or None. Along each axis a Conv's taps read the offsets
    k * dilation - pad_begin from each output's first position; the union's window runs from
    the least such offset to the greatest, each Conv's weights added in at its own. That needs
    the same strides, dilations and groups (auto_pad unset), offsets on one dilation grid, and
    each Conv reaching equally far past the input's end (its end pad less its last offset), so
    every output position is the same."""
    attributes = [node_attributes(conv) for conv in convs]
    rank = weights[0].ndim - 2

    def settings(written: dict) -> dict:
        """The attributes but the window's, unwritten ones at their defaults."""
        return {"strides": [1] * rank, "dilations": [1] * rank, "group": 1, "auto_pad": b"NOTSET",
                **{k: v for k, v in written.items() if k not in ("kernel_shape", "pads")}}

    if weights[0].shape[:2] != weights[1].shape[:2] or settings(attributes[0]) != settings(attributes[1]) \
            or settings(attributes[0])["auto_pad"] not in (b"NOTSET", b""):
        return None
    dilations = list(settings(attributes[0])["dilations"])
    pads = [list(a.get("pads", [0] * 2 * rank)) for a in attributes]
    firsts = [[-p[axis] for axis in range(rank)] for p in pads]
    lasts = [[(w.shape[2 + axis] - 1) * dilations[axis] - p[axis] for axis in range(rank)]
             for w, p in zip(weights, pads)]
    first = [min(f[axis] for f in firsts) for axis in range(rank)]
    last = [max(e[axis] for e in lasts) for axis in range(rank)]
    past = [[p[rank + axis] - e[axis] for axis in range(rank)] for p, e in zip(pads, lasts)]
    if past[0] != past[1] or any((f[axis] - first[axis]) % dilations[axis] for f in firsts for axis in range(rank)):
        return None
    kernel = [(last[axis] - first[axis]) // dilations[axis] + 1 for axis in range(rank)]
    weight = np.zeros(weights[0].shape[:2] + tuple(kernel), weights[0].dtype)
    for w, f in zip(weights, firsts):
        at = tuple(slice((f[axis] - first[axis]) // dilations[axis],
                         (f[axis] - first[axis]) // dilations[axis] + w.shape[2 + axis]) for axis in range(rank))
        weight[(slice(None), slice(None)) + at] += w
    if weights[0].shape == weights[1].shape and firsts[0] == firsts[1]:
        return weight, attributes[0]   # one window: its attributes as the Convs wrote them
    union = {**attributes[0], "kernel_shape": kernel,
             "pads": [-f for f in first] + [past[0][axis] + last[axis] for axis in range(rank)]}
    return weight, union


def _source(name: str, made_by: dict[str, onnx.NodeProto],
            constants: dict[str, onnx.TensorProto]) -> tuple[str, tuple[int, ...] | None] | None:
    """What tensor `name` is, to tell two names of the same values apart from others: (the
    tensor a Reshape by a constant shape reads, that shape) for a Reshape's result, else
    (name, None). The plan writes a Reshape per reader."""
    node = made_by.get(name)
    if node is None or node.op_type != "Reshape":
        return name, None
    if node.input[1] not in constants:
        return None
    return node.input[0], tuple(numpy_helper.to_array(constants[node.input[1]]).tolist())


def linear_layers_as_gemms(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of a [N, C] matrix reshaped to [N, C, 1, 1] (the plan's Gemm as a Conv)
    as the Gemm it was, with a zero bias if it had none, then the Reshape to the Conv's
    result: the same values. From the plan's form rknn-toolkit2 2.5.0 never returns (its rule
    `fuse_rs_conv` rewrites the Reshape -> Conv pair back and forth: levit's two heads), and
    its rule `fuse_conv_conv_add` fails on two such Convs added without biases (TypeError:
    'NoneType' object is unsliceable). Returns how many Convs it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        reshape = made_by.get(node.input[0]) if node.op_type == "Conv" else None
        matrix_shape = shapes.get(reshape.input[0], []) if reshape is not None and reshape.op_type == "Reshape" else []
        if len(matrix_shape) != 2 or shapes.get(reshape.output[0]) != [*matrix_shape, 1, 1] \
                or node.input[1] not in constants or node.output[0] not in shapes:
            continue
        weights = numpy_helper.to_array(constants[node.input[1]])
        if not pointwise(node, weights.shape):
            continue
        prefix = f"{node.name}/gemm"
        matrix = numpy_helper.from_array(weights.reshape(weights.shape[:2]), f"{prefix}/weight")
        shape = numpy_helper.from_array(np.array(shapes[node.output[0]], np.int64), f"{prefix}/shape")
        bias = [] if len(node.input) > 2 and node.input[2] else \
            [numpy_helper.from_array(np.zeros(weights.shape[0], weights.dtype), f"{prefix}/bias")]
        graph.initializer.extend([matrix, shape, *bias])
        inputs = [reshape.input[0], matrix.name, bias[0].name if bias else node.input[2]]
        written[id(node)] = [helper.make_node("Gemm", inputs, [f"{prefix}/result"], prefix, transB=1),
                             helper.make_node("Reshape", [f"{prefix}/result", shape.name], [node.output[0]],
                                              f"{prefix}/reshape")]
    return nodes_rewritten(graph, graph.node, written)


def added_linears_as_one(model: onnx.ModelProto) -> int:
    """Write the sum of two Gemms of different inputs, [M, K1] and [M, K2], each read by that
    Add alone, as one Gemm of the inputs joined along K (a Concat), the weights joined alike and
    the biases summed: the same values in real arithmetic (float32 rounding apart; LeViT's
    class and distillation heads, 1000 outputs of magnitude 3.9e3: 1.5e-3 apart).
    rknn-toolkit2 2.5.0 makes Convs of the two Gemms and fails summing them in its rule
    `fuse_conv_conv_add` (TypeError: 'NoneType' object is unsliceable: timm levit_conv_128s,
    its original and its export); it builds the one Gemm. Only Gemms with transA = 0, alpha and
    beta 1, the same transB, constant weights and biases. Returns how many Adds it wrote."""
    graph = model.graph
    nodes = list(graph.node)
    constants, readers, made_by, graph_outputs = lookups(graph, nodes)
    shapes = static_shapes(model)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for add in nodes:
        gemms = [made_by.get(name) for name in add.input] if add.op_type == "Add" and len(add.input) == 2 else []
        if len(gemms) != 2 or any(gemm is None or gemm.op_type != "Gemm" or len(readers[gemm.output[0]]) != 1
                                  or gemm.output[0] in graph_outputs or any(
                                      name not in constants for name in gemm.input[1:] if name) for gemm in gemms):
            continue
        attributes = [node_attributes(gemm) for gemm in gemms]
        inputs = [shapes.get(gemm.input[0]) for gemm in gemms]
        if gemms[0] is gemms[1] or gemms[0].input[0] == gemms[1].input[0] or any(
                a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 for a in attributes) \
                or attributes[0].get("transB", 0) != attributes[1].get("transB", 0) \
                or any(shape is None or len(shape) != 2 for shape in inputs) or inputs[0][0] != inputs[1][0] \
                or shapes.get(gemms[0].output[0]) is None or shapes.get(gemms[0].output[0]) != shapes.get(
                    gemms[1].output[0]):
            continue   # the joined Gemm needs the same rows and the same outputs, no broadcast between them
        transposed = attributes[0].get("transB", 0)
        weights = [constants[gemm.input[1]] for gemm in gemms]
        biases = [constants[gemm.input[2]] if len(gemm.input) > 2 and gemm.input[2] else np.zeros((), np.float32)
                  for gemm in gemms]
        prefix = f"{add.name or add.output[0]}/joined_gemm"
        joined = [numpy_helper.from_array(np.concatenate(weights, axis=1 if transposed else 0), f"{prefix}/weight"),
                  numpy_helper.from_array((biases[0] + biases[1]).astype(weights[0].dtype), f"{prefix}/bias")]
        graph.initializer.extend(joined)
        written[id(add)] = [
            helper.make_node("Concat", [gemm.input[0] for gemm in gemms], [f"{prefix}/inputs"], f"{prefix}/concat",
                             axis=1),
            helper.make_node("Gemm", [f"{prefix}/inputs", *(t.name for t in joined)], [add.output[0]], prefix,
                             transB=transposed)]
        removed.update(id(gemm) for gemm in gemms)
    return nodes_rewritten(graph, nodes, written, removed)


#: Planes of this many positions (H*W) and up to SMALL_PLANE rknn-toolkit2 2.5.0 will not reshape
#: into planes of more on its NPU: a Reshape from [640, 16, 1, 2], [640, 16, 2, 1], [384, 8, 1, 2],
#: [384, 4, 2, 2], [320, 16, 1, 4] or [64, 16, 1, W] (W from 3 to 7) into maps [1, C, H, W] of 64
#: positions or more, or from such a map into [384, 4, 2, 2], runs on its CPU; from
#: [640, 2, 8, 2], [160, 16, 4, 2], [80, 16, 4, 4] or [640, 32, 1, 1], or into [1, 20480, 1, 1] or
#: [20, 512, 1, 2], on its NPU (probes of Relu -> Reshape -> Conv)
SMALL_PLANE = (2, 7)
#: The most input positions a Conv's window may cover for small_planes_into_channels to read them
#: as channels: its weights grow by the output positions times the input positions over the taps
MOST_PLANE_INPUTS = 16


def small_planes_into_channels(model: onnx.ModelProto) -> int:
    """Write a Conv that reads or writes a plane of 2 to 7 positions (SMALL_PLANE) through a
    Reshape into another plane size, whose windows tile its input without padding, as a 1x1 Conv
    of its input's positions as channels ([N, C*H*W, 1, 1], a relabel of the same elements) into
    its output's positions as channels ([N, M*Ho*Wo, 1, 1]: each output position's copy of the
    weights at that position's taps, zeros elsewhere), which the Reshapes read in the same
    element order: the same values. rknn-toolkit2 2.5.0 runs such a Reshape on its CPU, where
    it reshapes a plane of one position on its NPU (SMALL_PLANE: MobileViT's fold of 2x2 patches,
    which the plan picks with a strided Conv into [640, 16, 1, 2] and reshapes into the 16x16
    map: 3 CPU layers). Returns how many Convs it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, made_by, graph_outputs = lookups(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    for conv in graph.node:
        found = _planes_as_channels(conv, shapes, constants, readers, made_by, graph_outputs)
        if found is None:
            continue
        weights, bias, flat_input, flat_output = found
        name = conv.name or conv.output[0]
        graph.initializer.append(numpy_helper.from_array(weights, f"{name}/planes_as_channels/weight"))
        operands = [f"{name}/planes_as_channels/input", f"{name}/planes_as_channels/weight"]
        if bias is not None:
            graph.initializer.append(numpy_helper.from_array(bias, f"{name}/planes_as_channels/bias"))
            operands.append(f"{name}/planes_as_channels/bias")
        result = conv.output[0] if flat_output == shapes[conv.output[0]] else f"{name}/planes_as_channels/output"
        for reader in readers.get(conv.output[0], []):
            reader.input[0] = result
        written[id(conv)] = [
            reshape_node(graph, conv.input[0], flat_input, operands[0], f"{name}/planes_as_channels/reshape"),
            helper.make_node("Conv", operands, [result], f"{name}/planes_as_channels",
                             group=int(node_attributes(conv).get("group", 1)), kernel_shape=[1, 1])]
    return nodes_rewritten(graph, graph.node, written)


def _reshaped_on_the_toolkit_cpu(source: list[int], result: list[int]) -> bool:
    """Whether rknn-toolkit2 2.5.0 runs a Reshape of 4-D `source` into `result` on its CPU, by the
    probes SMALL_PLANE lists: between a plane of 2 to 7 positions and one of 8 or more, unless it
    only moves the batch into the channels or back (its rule `convert_reshape_to_transpose`
    makes that a Transpose on its NPU: [960, 7, 1, 7] into [1, 960, 7, 7], ghostnetv2's
    resized attention)."""
    if len(source) != 4 or len(result) != 4:
        return False
    planes = sorted(int(np.prod(shape[2:])) for shape in (source, result))
    into_channels = result[:2] == [1, source[0]] and int(np.prod(source[1:])) == int(np.prod(result[2:]))
    out_of_channels = source[:2] == [1, result[0]] and int(np.prod(result[1:])) == int(np.prod(source[2:]))
    return SMALL_PLANE[0] <= planes[0] <= SMALL_PLANE[1] and planes[1] > SMALL_PLANE[1] \
        and not (into_channels or out_of_channels)


def _planes_as_channels(conv: onnx.NodeProto, shapes, constants, readers, made_by, graph_outputs):
    """small_planes_into_channels' Conv for `conv`: (1x1 weights, bias, its input's and its
    output's shapes with the positions as channels); None where it does not apply."""
    if conv.op_type != "Conv" or conv.input[1] not in constants or (len(conv.input) > 2 and conv.input[2]
                                                                   and conv.input[2] not in constants):
        return None
    x, y, weight = shapes.get(conv.input[0]), shapes.get(conv.output[0]), constants[conv.input[1]]
    attributes = node_attributes(conv)
    if x is None or y is None or len(x) != 4 or any(attributes.get("pads", [0])) \
            or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"", ""):
        return None
    (kh, kw), (sh, sw) = weight.shape[2:], attributes.get("strides", [1, 1])
    dh, dw = attributes.get("dilations", [1, 1])
    (n, channels, h, w), (_, outputs, ho, wo) = x, y
    if (ho - 1) * sh + (kh - 1) * dh + 1 != h or (wo - 1) * sw + (kw - 1) * dw + 1 != w or h * w > MOST_PLANE_INPUTS \
            or ho * wo > SMALL_PLANE[1] or conv.output[0] in graph_outputs:
        return None

    def on_the_toolkit_cpu(reshape: onnx.NodeProto) -> bool:
        source, result = shapes.get(reshape.input[0]), shapes.get(reshape.output[0])
        return reshape.op_type == "Reshape" and source is not None and result is not None \
            and _reshaped_on_the_toolkit_cpu(source, result)

    reading = readers.get(conv.output[0], [])
    if ho * wo > 1 and not (reading and all(r.op_type == "Reshape" and r.input[0] == conv.output[0] for r in reading)):
        return None  # only a Reshape reads the positions as channels in the same order
    if not any(on_the_toolkit_cpu(r) for r in [*reading, made_by.get(conv.input[0])] if r is not None):
        return None
    positions = ho * wo
    spread = np.zeros((outputs, positions) + weight.shape[1:2] + (h, w), weight.dtype)
    for row, column, tap_row, tap_column in np.ndindex(ho, wo, kh, kw):
        spread[:, row * wo + column, :, row * sh + tap_row * dh, column * sw + tap_column * dw] = \
            weight[:, :, tap_row, tap_column]
    bias = np.repeat(constants[conv.input[2]], positions) if len(conv.input) > 2 and conv.input[2] else None
    return (spread.reshape(outputs * positions, -1, 1, 1), bias, [n, channels * h * w, 1, 1],
            [n, outputs * positions, 1, 1])


def _zero_constant_pads(pad: onnx.NodeProto, constants: dict[str, np.ndarray]) -> list[int] | None:
    """The pads of `pad`, a Pad node, when it pads every axis (no `axes`) with a constant zero;
    else None. The attribute form (opset < 11) and the input form both."""
    attributes = node_attributes(pad)
    if attributes.get("mode", b"constant") != b"constant":
        return None
    if len(pad.input) == 1:
        value, pads = attributes.get("value", 0.0), attributes.get("pads")
    else:
        if len(pad.input) > 3 and pad.input[3] or pad.input[1] not in constants:
            return None
        given = len(pad.input) > 2 and pad.input[2]
        if given and pad.input[2] not in constants:
            return None
        value = constants[pad.input[2]].reshape(-1)[0] if given else 0.0
        pads = constants[pad.input[1]].reshape(-1).tolist()
    return [int(p) for p in pads] if pads is not None and value == 0 else None


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    pads_into_convs,
    vectors_into_channels,
    added_convs_as_one,
    linear_layers_as_gemms,
    added_linears_as_one,
    small_planes_into_channels,
)
