"""Shapings of the plan's Reshapes, Slices and ranks into the layouts the toolkit keeps on its NPU:
Slices and Splits moved before a Reshape (`slices_before_reshapes`), one-index Gathers as Slices
(`gathers_as_slices`), planes padded to a multiple of 8 before they are flattened
(`flattened_planes_padded`) and before token rows are made of them or they of the rows
(`token_rows_of_planes_padded`), a Concat's Split bypassed (`splits_of_concats_bypassed`),
element-wise ops moved before an output's Reshapes (`reshapes_after_elementwise_ops`), rank-3
tails given a unit axis (`rank3_tails_as_rank4`), Transposes moved before Expands
(`transposes_before_expands`), a rank > 4 Transpose's steps written as the
one Transpose they make (`transpose_steps_as_one`), and Transposes with an axis longer than the
toolkit's NPU takes written as swaps of shorter blocks (`wide_transposes_as_block_swaps`)."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.partitioned_onnx import proto_subgraphs
from rkcompile.views.proto_graph import (ai_onnx_opset, all_nodes, drop_unread_nodes, node_attributes, nodes_rewritten,
                                         output_names, readers_of, set_attribute, static_shapes)
from rkcompile.views.toolkit_shapings.common import (ELEMENTWISE, TOOLKIT_BLOCK, Shaping, lookups, reshape_node,
                                                    slice_node, split_node)


def slices_before_reshapes(model: onnx.ModelProto) -> int:
    """Move each Slice or Split that reads a Reshape before it, where the Reshape keeps the cut
    axis whole (it only regroups the axes around it): Slice(Reshape(x)) becomes
    Reshape(Slice(x)), Split(Reshape(x)) a Split of x and a Reshape per part, the same values.
    rknn-toolkit2 2.5.0 turns parallel Slices after a Reshape of a Conv into a Split and then
    fails on that Conv -> Reshape -> Split (its rule `seperate_conv_rs_split`, IndexError: the
    error it gives on yolov8n's box head), and on the Split our plan makes of such Slices.
    Returns how many Slices and Splits moved."""
    shapes = static_shapes(model)
    opset = ai_onnx_opset(model)
    graph = model.graph
    constants, readers, _, graph_outputs = lookups(graph)
    replaced: dict[str, list[onnx.NodeProto]] = {}   # a Reshape's name -> the nodes written in its place
    dropped: set[str] = set()
    for node in graph.node:
        slices = readers.get(node.output[0], []) if node.op_type == "Reshape" else []
        if not slices or node.output[0] in graph_outputs:
            continue
        moves = [_cut_before(node, s, shapes, constants, opset) for s in slices]
        if all(moves):
            replaced[node.name] = [new for move in moves for new in move[1]]
            graph.initializer.extend(tensor for move in moves for tensor in move[0])
            dropped.update(s.name for s in slices)
    nodes = [new for node in graph.node if node.name not in dropped for new in replaced.get(node.name, [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(dropped)


def gathers_as_slices(model: onnx.ModelProto) -> int:
    """Write a Gather of one constant non-negative index given as a 1-D array (the axis kept)
    as the Slice of that index: the same values. rknn-toolkit2 2.5.0 runs a Reshape it adds
    after the last of such Gathers on its CPU (tv_swin_nano's qkv split: 6 CPU layers), and
    none after Slices. Returns how many Gathers it wrote."""
    graph = model.graph
    opset = ai_onnx_opset(model)
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    changed = 0
    for node in graph.node:
        index = constants.get(node.input[1]) if node.op_type == "Gather" and len(node.input) > 1 else None
        if index is None or index.shape != (1,) or index[0] < 0 or opset < 10:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        prefix = f"{node.name}/as_slice"
        node.CopyFrom(slice_node(graph, node.input[0], int(index[0]), int(index[0]) + 1, axis, node.output[0], prefix))
        changed += 1
    return changed


def _cut_before(reshape: onnx.NodeProto, node: onnx.NodeProto, shapes: dict[str, list[int]],
                constants: dict[str, np.ndarray], opset: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]] | None:
    """The constants and nodes computing `node`, a Slice or Split of `reshape`'s result, as the
    same cut of its input then a Reshape of each part; None when `node` is neither (a Slice of
    one axis by constant bounds and step 1, a Split with every part's shape known), or the
    reshape does not keep that axis whole."""
    source, result = shapes.get(reshape.input[0]), shapes.get(reshape.output[0])
    if source is None or result is None:
        return None
    prefix = f"{node.name}/before_reshape"
    if node.op_type == "Split":
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(result)
        parts = [shapes.get(name) for name in node.output]
        kept = _kept_axis(source, result, axis)
        if kept is None or any(part is None for part in parts):
            return None
        cut = [f"{prefix}/part_{index}" for index in range(len(parts))]
        tensors, split = split_node(reshape.input[0], [part[axis] for part in parts], cut, prefix, kept, opset)
        nodes = [split]
        for index, (piece, name, part) in enumerate(zip(cut, node.output, parts)):
            shape = numpy_helper.from_array(np.array(part, np.int64), f"{prefix}/shape_{index}")
            tensors.append(shape)
            nodes.append(helper.make_node("Reshape", [piece, shape.name], [name], f"{prefix}/reshape_{index}"))
        return tensors, nodes
    operands = [constants.get(name) for name in node.input[1:]]
    if (node.op_type != "Slice" or len(node.input) < 4
            or any(value is None for value in operands) or any(value.size != 1 for value in operands)):
        return None
    starts, ends, axes, *steps = (int(value.reshape(-1)[0]) for value in operands)
    if steps and steps[0] != 1:
        return None
    axis = axes % len(result)
    kept = _kept_axis(source, result, axis)
    if kept is None:
        return None
    start, end, _ = slice(starts, ends).indices(result[axis])
    shape = list(result)
    shape[axis] = max(end - start, 0)
    tensors = [numpy_helper.from_array(np.array(values, np.int64), f"{prefix}/{what}")
               for what, values in (("starts", [start]), ("ends", [end]), ("axes", [kept]), ("shape", shape))]
    sliced = f"{prefix}/sliced"
    return tensors, [
        helper.make_node("Slice", [reshape.input[0], *(t.name for t in tensors[:3])], [sliced], prefix),
        helper.make_node("Reshape", [sliced, tensors[3].name], [node.output[0]], f"{prefix}/reshape")]


def _kept_axis(source: list[int], result: list[int], axis: int) -> int | None:
    """The axis of a Reshape's input that is `axis` of its result whole (the same size, after
    as many elements), or None when the Reshape regroups it."""
    before = int(np.prod(result[:axis]))
    return next((b for b in range(len(source)) if int(np.prod(source[:b])) == before and source[b] == result[axis]),
                None)


def flattened_planes_padded(model: onnx.ModelProto) -> int:
    """Write a Reshape of [1, C, H, W] that merges H and W into its innermost axis (each of the
    C planes one row of the result), when neither C nor H*W is a multiple of 8, as a Pad of
    e zero rows below each plane, the fewest for (H+e)*W to be a multiple of 8, the Reshape to
    rows of (H+e)*W, then a Slice of their first H*W: the same values. rknn-toolkit2 2.5.0 runs
    the Reshape on its CPU (a YOLO head's 10x10 grid of 1 or 51 channels at 320x320), the
    padded one on its NPU. Not for a plane of one row or column ([1, 1, 3234, 1], ssdlite's
    decoded box sides): the toolkit runs that Pad on its CPU. Nor for a Transpose's result:
    the toolkit's `swap_transpose_pad` moves the Pad above the Transpose, where it pads an axis
    its Pad does not take ("mode constant unsupport pads[5] = 1": the Pad goes to its CPU),
    while it merges the plain Reshape with the Transpose on its NPU (a [1, 49, 7, 7] attention
    map made [1, 49, 49] in timm's shvit and efficientvit_m0: 4 and 10 CPU Pads). Returns how
    many Reshapes it wrote."""
    if ai_onnx_opset(model) < 11:   # Pad takes its pads as an input from opset 11
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    transposed = {name for node in originals if node.op_type == "Transpose" for name in node.output}
    for node in originals:
        source, result = shapes.get(node.input[0]), shapes.get(node.output[0])
        if (node.op_type != "Reshape" or source is None or result is None or len(source) != 4
                or node.input[0] in transposed):
            continue
        batch, channels, height, width = source
        plane = height * width
        if batch != 1 or result[-1] != plane or int(np.prod(result[:-1])) != channels \
                or channels % TOOLKIT_BLOCK == 0 or plane % TOOLKIT_BLOCK == 0 or min(height, width) == 1:
            continue
        rows = _rows_to_pad(height, width)
        written[id(node)] = _padded_regrouping(graph, node.input[0], [0, 0, rows, 0],
                                               [*result[:-1], (height + rows) * width], len(result) - 1, plane,
                                               node.output[0], f"{node.name}/padded")
    return nodes_rewritten(graph, originals, written)


def token_rows_of_planes_padded(model: onnx.ModelProto) -> int:
    """Write the plan's token rows [H*W, C, 1, 1] of a map [1, C, H, W] (a Transpose to
    [H, W, 1, C] and a Reshape), and the map again from them (a Transpose to [1, C, H*W, 1] or
    [1, C, 1, H*W] and a Reshape), when neither C nor H*W is a multiple of TOOLKIT_BLOCK, through
    planes padded by e rows, the fewest for (H+e)*W to be one (`flattened_planes_padded`): into
    the rows, a Pad of the map, its Reshape to [1, C, 1, (H+e)*W], a Slice of the first H*W and
    a Transpose to the rows; out of them, the Transpose as it is, a Pad of the H*W axis by e*W,
    a Reshape to [1, C, H+e, W] and a Slice of the first H rows. The same values. rknn-toolkit2
    2.5.0 merges each Transpose and Reshape into a Reshape between [1, C, H, W] and
    [1, C, 1, H*W], which it runs on its CPU (timm's swiftformer_xs, its last stage's 220
    channels of 7x7: 2 layers), the padded ones on its NPU. Returns how many Reshapes it
    wrote."""
    if ai_onnx_opset(model) < 11:   # Pad takes its pads as an input from opset 11
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        transpose = made_by.get(node.input[0]) if node.op_type == "Reshape" else None
        if transpose is None or transpose.op_type != "Transpose":
            continue
        source, moved, result = (shapes.get(name) for name in (transpose.input[0], node.input[0], node.output[0]))
        perm = list(node_attributes(transpose).get("perm", ()))
        if source is None or moved is None or result is None or not len(source) == len(result) == 4:
            continue
        if perm == [2, 3, 0, 1] and source[0] == 1 and result == [source[2] * source[3], source[1], 1, 1]:
            (_, channels, height, width), into_rows = source, True
        elif source[2:] == [1, 1] and perm in _ROWS_ALONG_ONE_AXIS and result[0] == 1 \
                and moved[:2] == result[:2] == [1, source[1]] and source[0] == result[2] * result[3]:
            (_, channels, height, width), into_rows = result, False
        else:
            continue
        plane = height * width
        if channels % TOOLKIT_BLOCK == 0 or plane % TOOLKIT_BLOCK == 0 or min(height, width) == 1:
            continue
        padding, prefix = _rows_to_pad(height, width), f"{node.name}/padded"
        if into_rows:
            sliced = f"{prefix}/plane"
            written[id(node)] = [
                *_padded_regrouping(graph, transpose.input[0], [0, 0, padding, 0],
                                    [1, channels, 1, (height + padding) * width], 3, plane, sliced, prefix),
                helper.make_node("Transpose", [sliced], [node.output[0]], f"{prefix}/rows", perm=[3, 1, 0, 2])]
        else:
            pads = [0, 0, padding * width, 0] if moved[2] == plane else [0, 0, 0, padding * width]
            written[id(node)] = _padded_regrouping(graph, node.input[0], pads, [1, channels, height + padding, width],
                                                   2, height, node.output[0], prefix)
    return nodes_rewritten(graph, originals, written)


#: The Transposes of the plan's token rows [R, C, 1, 1] to [1, C, R, 1] or [1, C, 1, R]: each
#: channel's rows in their order along the one long axis.
_ROWS_ALONG_ONE_AXIS = ([2, 1, 0, 3], [2, 1, 3, 0], [3, 1, 0, 2], [3, 1, 2, 0])


def _rows_to_pad(height: int, width: int) -> int:
    """The fewest zero rows e below a plane of `height` x `width` for (height + e) * width to be a
    multiple of TOOLKIT_BLOCK."""
    return next(extra for extra in range(1, TOOLKIT_BLOCK) if (height + extra) * width % TOOLKIT_BLOCK == 0)


def _padded_regrouping(graph: onnx.GraphProto, source: str, pads_after: list[int], shape: list[int], axis: int,
                       end: int, result: str, prefix: str) -> list[onnx.NodeProto]:
    """A Pad of `source` by `pads_after` zeros at the end of each axis, its Reshape to `shape`,
    and the Slice of its first `end` along `axis` into `result`, named from `prefix`; their
    constants added to `graph`."""
    tensors = [numpy_helper.from_array(np.array(values, np.int64), f"{prefix}/{what}") for what, values in (
        ("pads", [0] * len(pads_after) + pads_after), ("shape", shape), ("starts", [0]), ("ends", [end]),
        ("axes", [axis]))]
    graph.initializer.extend(tensors)
    padded, regrouped = f"{prefix}/pad", f"{prefix}/reshape"
    return [helper.make_node("Pad", [source, tensors[0].name], [padded], padded),
            helper.make_node("Reshape", [padded, tensors[1].name], [regrouped], regrouped),
            helper.make_node("Slice", [regrouped, *(t.name for t in tensors[2:])], [result], f"{prefix}/slice")]


def splits_of_concats_bypassed(model: onnx.ModelProto) -> int:
    """Let the readers of each part of a Split that cuts a Concat's result back into the
    Concat's inputs (the same axis, the same sizes) read those inputs: the same values.
    torchvision's detectors join the heads' levels and split them again; the plan keeps the
    pair, which ties each level's Reshape of [1, H, W, A*K] into [1, H*W*A, 1, K] (a Reshape
    rknn-toolkit2 2.5.0 runs on its CPU) to the ops after the Split, so that neither
    `reshapes_after_elementwise_ops` nor the host tail can take it off the toolkit's hands. Returns
    how many Splits it bypassed."""
    shapes = static_shapes(model)
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    graph_outputs = output_names(graph)
    bypassed = {}
    for node in graph.node:
        concat = made_by.get(node.input[0]) if node.op_type == "Split" else None
        rank = len(shapes.get(node.input[0], ()))
        if concat is None or concat.op_type != "Concat" or not rank or len(concat.input) != len(node.output) \
                or any(name in graph_outputs for name in node.output):
            continue
        axes = [next((a.i for a in n.attribute if a.name == "axis"), 0) % rank for n in (node, concat)]
        if axes[0] == axes[1] and all(shapes.get(part) is not None and shapes.get(part) == shapes.get(piece)
                                      for part, piece in zip(node.output, concat.input)):
            bypassed.update(zip(node.output, concat.input))
    for node in graph.node:
        node.input[:] = [bypassed.get(name, name) for name in node.input]
    drop_unread_nodes(graph)   # the pairs, so that each Concat input keeps its one reader
    return len(set(made_by[name].name for name in bypassed))


def reshapes_after_elementwise_ops(model: onnx.ModelProto) -> int:
    """Write an element-by-element op whose variable inputs are each a Reshape's result (its
    only reader), its constants of one value or of as many as the result, and whose result
    reaches a graph output through Reshapes and element-by-element ops alone, as that op on
    the Reshapes' inputs (the constants reshaped alike; an input Transposed where that brings
    its elements to the others'), then a Reshape to its result's shape, when each element
    meets the same operands so (`_lifted_layout`): the same values; again,
    until no such op is left. The Reshapes then end the output, where the host tail
    (`--host-tail`) hands them to the host part: rknn-toolkit2 2.5.0 runs on its CPU a Reshape
    that splits the channels of [1, H, W, A*K] into [1, H*W*A, 1, K] (a detector head's anchors
    and classes before their Sigmoid, at 10x10 and smaller), and one into an output of rank 2
    (faster-rcnn's proposal sides before their anchors' scale and offset, FCOS's scores before
    their product with the centreness), and the centreness [1, 1, H, W] Reshaped into
    [1, H*W, 1, 1] to meet the scores, where it runs the Transpose into the scores' layout
    [H, W, 1, 1] on its NPU. Returns how many ops it moved before Reshapes."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    graph_outputs = output_names(graph)
    moved = 0
    while True:
        nodes = list(graph.node)
        made_by = {name: index for index, node in enumerate(nodes) for name in node.output}
        readers = readers_of(graph)

        def reshaped_to_output(name: str) -> bool:
            after = readers.get(name, [])
            return name in graph_outputs or (len(after) == 1 and after[0].op_type in ELEMENTWISE | {"Reshape"}
                                             and reshaped_to_output(after[0].output[0]))

        def lifted(node: onnx.NodeProto) -> tuple[list[int], list[tuple[int, ...] | None]] | None:
            variables = [name for name in node.input if name and name not in constants]
            reshapes = [nodes[made_by[name]] if name in made_by else None for name in variables]
            if node.op_type not in ELEMENTWISE or not variables or node.output[0] not in shapes \
                    or any(r is None or r.op_type != "Reshape" or len(readers[r.output[0]]) != 1
                           or r.output[0] in graph_outputs or r.input[0] not in shapes for r in reshapes) \
                    or not reshaped_to_output(node.output[0]):
                return None
            return _lifted_layout(shapes[node.output[0]], [(shapes[name], shapes[r.input[0]])
                                                           for name, r in zip(variables, reshapes)],
                                  [constants[name].size for name in node.input if name in constants])

        found = next(((index, layout) for index, node in enumerate(nodes) if (layout := lifted(node)) is not None),
                     None)
        if found is None:
            return moved
        at, (shape, perms) = found
        node = onnx.NodeProto()
        node.CopyFrom(nodes[at])
        prefix = f"{node.name}/before_reshape/{moved}"
        reshapes = {made_by[name] for name in node.input if name and name not in constants}
        transposes = []
        perm_of = dict(zip([name for name in node.input if name and name not in constants], perms))
        for index, name in enumerate(node.input):
            if name in constants and constants[name].size > 1:
                tensor = numpy_helper.from_array(constants[name].reshape(shape), f"{prefix}/operand_{index}")
                graph.initializer.append(tensor)
                node.input[index] = tensor.name
            elif perm_of.get(name) is not None:   # its elements reach the others' layout by a Transpose
                transposes.append(helper.make_node("Transpose", [nodes[made_by[name]].input[0]],
                                                   [f"{prefix}/transpose_{index}"], f"{prefix}/transpose_{index}",
                                                   perm=list(perm_of[name])))
                node.input[index] = transposes[-1].output[0]
            elif name in perm_of:
                node.input[index] = nodes[made_by[name]].input[0]
        result_shape = numpy_helper.from_array(np.array(shapes[node.output[0]], np.int64), f"{prefix}/shape")
        graph.initializer.append(result_shape)
        reshape = helper.make_node("Reshape", [prefix, result_shape.name], [node.output[0]], f"{prefix}/reshape")
        node.output[0] = prefix
        shapes[prefix] = shape
        written = [new for index, old in enumerate(nodes) if index not in reshapes
                   for new in ([*transposes, node, reshape] if index == at else [old])]
        del graph.node[:]
        graph.node.extend(written)
        moved += 1


def _lifted_layout(result: list[int], operands: list[tuple[list[int], list[int]]],
                   constant_sizes: list[int]) -> tuple[list[int], list[tuple[int, ...] | None]] | None:
    """The shape of an element-by-element op's result on the inputs of the Reshapes that give
    it its operands (`operands`: each operand's shape and its Reshape's input's), and for each
    operand None or the perm of a Transpose of that input: when each element of that result,
    in order, meets the operands' same elements as the op's `result` does (the shape the
    inputs broadcast to, else that of the one input of the result's size), and each constant
    (of `constant_sizes`) has one value or as many as the result; else None."""
    size = int(np.prod(result))
    if any(c not in (1, size) for c in constant_sizes):
        return None
    try:
        shape = list(np.broadcast_shapes(*(source for _, source in operands)))
    except ValueError:
        shape = []
    if int(np.prod(shape)) != size:
        shape = next((list(source) for _, source in operands if int(np.prod(source)) == size), None)
    if shape is None:
        return None
    perms = []
    for operand, source in operands:
        order = np.arange(int(np.prod(operand))).reshape(operand)
        wanted = np.broadcast_to(order, result).reshape(-1)
        candidates = [None, *(p for p in itertools.permutations(range(len(source))) if list(p) != sorted(p))] \
            if len(source) == len(shape) else [None]
        perm = next((p for p in candidates if _meets(order.reshape(source), p, shape, wanted)), False)
        if perm is False:
            return None
        perms.append(perm)
    return shape, perms


def _meets(elements: np.ndarray, perm: tuple[int, ...] | None, shape: list[int], wanted: np.ndarray) -> bool:
    """Whether `elements` (indices), transposed by `perm` if any and broadcast to `shape`, are
    `wanted` in order."""
    moved = elements.transpose(perm) if perm is not None else elements
    try:
        return bool(np.array_equal(np.broadcast_to(moved, shape).reshape(-1), wanted))
    except ValueError:
        return False


#: Ops with an axis, liftable with that axis renumbered.
_ALONG_AN_AXIS = frozenset({"Concat", "Split", "Softmax", "Slice"})


def rank3_tails_as_rank4(model: onnx.ModelProto) -> int:
    """Give each rank-3 tensor [a, b, c] of a region that starts at Reshapes and ends at graph
    outputs or Reshapes, through element-by-element ops, Concat, Split, Slice and Softmax, a
    unit axis: [a, b, 1, c], its constants reshaped alike, and each such output a Reshape back
    to its shape (the same values: the elements keep their order). rknn-toolkit2 2.5.0 holds a
    rank-3 tensor read by such ops as [b, 1, 1, c] (its rules `unsqueeze_to_4d_*`), one its
    Reshapes write as [a, b, h, c/h], and runs on its CPU the Reshape from one layout to the
    other (a YOLO head at 320x320: the class scores joining the decoded boxes). A region with a
    reader of another kind stays as it is. Returns how many nodes it lifted."""
    shapes = static_shapes(model)
    opset = ai_onnx_opset(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    subgraph_reads = {name for node in graph.node for sub in proto_subgraphs(node) for inner in all_nodes(sub)
                      for name in inner.input}
    region_of: dict[str, int] = {}              # a liftable tensor -> its region (union-find root)
    parent: dict[int, int] = {}
    liftable: list[onnx.NodeProto] = []
    blocked: set[int] = set()

    def root(region: int) -> int:
        while parent[region] != region:
            region = parent[region]
        return region

    for node in graph.node:
        variables = [name for name in node.input if name and name not in constants]
        outputs_rank3 = all(len(shapes.get(name, ())) == 3 for name in node.output if name)
        if node.op_type == "Reshape" and node.input[1] in constants and outputs_rank3:
            regions = []
        elif (node.op_type in ELEMENTWISE or node.op_type in _ALONG_AN_AXIS) and outputs_rank3 and variables \
                and all(name in region_of for name in variables) and _liftable_constants(node, constants):
            regions = [root(region_of[name]) for name in variables]
        else:
            if not _reads_any_rank(node, constants):
                blocked.update(root(region_of[name]) for name in variables if name in region_of)
            continue
        region = regions[0] if regions else len(parent)
        parent.setdefault(region, region)
        for other in regions[1:]:
            parent[root(other)] = region
        for name in node.output:
            if name:
                region_of[name] = region
        liftable.append(node)
    blocked.update(root(region_of[name]) for name in subgraph_reads if name in region_of)
    kept_nodes = [node for node in liftable if root(region_of[node.output[0]]) not in blocked]
    computing = {root(region_of[node.output[0]]) for node in kept_nodes if node.op_type != "Reshape"}
    kept_nodes = [node for node in kept_nodes if root(region_of[node.output[0]]) in computing]
    for node in kept_nodes:
        _lift(node, shapes, constants, graph, opset)
    lifted = {name for node in kept_nodes for name in node.output if name}
    kept_infos = [info for info in graph.value_info if info.name not in lifted]   # the converter's, of rank 3
    del graph.value_info[:]
    graph.value_info.extend(kept_infos)
    for output in graph.output:
        if output.name in lifted:
            four_d = f"{output.name}/rank4"
            for node in graph.node:
                node.input[:] = [four_d if name == output.name else name for name in node.input]
                node.output[:] = [four_d if name == output.name else name for name in node.output]
            shape = numpy_helper.from_array(np.array(shapes[output.name], np.int64), f"{output.name}/rank3_shape")
            graph.initializer.append(shape)
            graph.node.append(helper.make_node("Reshape", [four_d, shape.name], [output.name], f"{output.name}/rank3"))
    return len(kept_nodes)


def _rows_of_one(shape: Sequence[int] | None) -> bool:
    """Whether `shape` is the plan's batch of rows of one plane row each: [N, C, 1, W], N > 1."""
    return shape is not None and len(shape) == 4 and shape[0] > 1 and shape[2] == 1


def batched_rows_as_one_image(model: onnx.ModelProto) -> int:
    """Write each region of the plan's batches of rows [N, C, 1, W] (N > 1), made by Reshapes
    to constant shapes and combined by element-by-element ops of no other operands (scalar
    constants apart) and read only by those ops and Reshapes, as one image [1, N, C, W]: the
    same elements in the same order, each broadcast operand ([N, C, 1, 1], [N, 1, 1, W]) moved
    alike. rknn-toolkit2 2.5.0 runs the Reshapes into and out of the batched form on its CPU
    (MViTv2's relative positions added to its scores [1568, 28, 1, 28]: a 2-head 28x28 map's
    rows); those into and out of the image it runs on its NPU. Returns how many Reshapes it
    rewrote."""
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, _, graph_outputs = lookups(graph)
    region_of: dict[str, int] = {}
    parent: dict[int, int] = {}
    computing: set[int] = set()

    def root(region: int) -> int:
        while parent[region] != region:
            region = parent[region]
        return region

    made = []   # the Reshapes making rows, in graph order
    for node in graph.node:
        if not node.output or not _rows_of_one(shapes.get(node.output[0])):
            continue
        variables = [name for name in node.input if name and name not in constants]
        if node.op_type == "Reshape" and node.input[1] in constants:
            regions = []
            made.append(node)
        elif node.op_type in ELEMENTWISE and len(node.output) == 1 and variables \
                and all(name in region_of for name in variables) \
                and all(constants[name].size == 1 for name in node.input if name in constants):
            regions = [root(region_of[name]) for name in variables]
        else:
            continue
        region = regions[0] if regions else len(parent)
        parent.setdefault(region, region)
        for other in regions[1:]:
            parent[root(other)] = region
        region_of[node.output[0]] = region
        if node.op_type != "Reshape":
            computing.add(region)
    computing = {root(region) for region in computing}
    blocked = {root(region) for name, region in region_of.items()
               if name in graph_outputs or any(reader.op_type != "Reshape" and reader.output[0] not in region_of
                                               for reader in readers.get(name, []))}
    rewritten = 0
    for node in made:
        region = root(region_of[node.output[0]])
        if region in blocked or region not in computing:
            continue
        batch, channels, _, width = shapes[node.output[0]]
        image = numpy_helper.from_array(np.array([1, batch, channels, width], np.int64), f"{node.name}/one_image")
        graph.initializer.append(image)
        node.input[1] = image.name
        rewritten += 1
    if rewritten:
        moved = {name for name, region in region_of.items() if root(region) not in blocked and root(region) in computing}
        kept_infos = [info for info in graph.value_info if info.name not in moved]
        del graph.value_info[:]
        graph.value_info.extend(kept_infos)
    return rewritten


def _reads_any_rank(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` is a Reshape to a constant shape that copies no input dimension past the
    second (a 0 there): one that reads its input's elements in order, whatever its rank."""
    if node.op_type != "Reshape" or node.input[1] not in constants:
        return False
    allow_zero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
    return bool(allow_zero) or 0 not in constants[node.input[1]].reshape(-1)[2:].tolist()


def _unit_axis_inserted(shape: Sequence[int]) -> list[int]:
    """`shape` (rank 3, or of lower rank broadcast against one) with a unit axis before its last."""
    return [*shape[:-1], 1, shape[-1]] if len(shape) >= 2 else list(shape)


def _rank4_constant(value: np.ndarray) -> np.ndarray:
    """A constant operand of rank 1 to 3 read with a rank-3 tensor, at rank 4 for the tensor
    lifted: unit axes before it up to rank 3, then one before its last axis (the same values
    broadcast alike). Full rank because rknn-toolkit2 2.5.0 crashes (signal 11) building an
    int8 export whose element-by-element op broadcasts a constant of lower rank against its
    rank-4 input (YOLOv8's strides [1, boxes] as [1, 1, boxes] times the boxes [1, 4, 1, boxes]);
    its float build takes either."""
    return value.reshape(_unit_axis_inserted([1] * (3 - value.ndim) + list(value.shape)))


def _liftable_constants(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether the constant operands of `node` stay right with a unit axis inserted: operands
    of at most rank 3 of an element-by-element op, of rank 3 of a Concat, the bounds of a
    Slice."""
    if node.op_type in ELEMENTWISE:
        return all(constants[name].ndim <= 3 for name in node.input if name in constants)
    if node.op_type == "Concat":
        return all(constants[name].ndim == 3 for name in node.input if name in constants)
    if node.op_type == "Slice":   # axes absent (every axis from 0) or given as a constant
        return len(node.input) < 4 or not node.input[3] or node.input[3] in constants
    return True


def _rank4_axis(axis: int) -> int:
    """Axis `axis` of a rank-3 tensor numbered in the tensor with a unit axis before its last."""
    return (0, 1, 3)[axis % 3]


def _lift(node: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray],
          graph: onnx.GraphProto, opset: int) -> None:
    """Rewrite `node` for its rank-3 inputs and outputs each given a unit axis before the last."""
    def constant(name: str, value: np.ndarray) -> str:
        tensor = numpy_helper.from_array(value, f"{node.name or node.output[0]}/{name}")
        graph.initializer.append(tensor)
        return tensor.name

    if node.op_type == "Reshape":
        node.input[1] = constant("rank4_shape", np.array(_unit_axis_inserted(shapes[node.output[0]]), np.int64))
        return
    if node.op_type in ELEMENTWISE or node.op_type == "Concat":
        node.input[:] = [
            constant(f"rank4_operand_{index}", _rank4_constant(constants[name]))
            if name in constants and constants[name].ndim >= 1 else name for index, name in enumerate(node.input)]
        if node.op_type in ELEMENTWISE:
            return
    attributes = {a.name: a for a in node.attribute}
    if node.op_type == "Slice" and len(node.input) > 1:
        given = len(node.input) > 3 and node.input[3]
        axes = constants[node.input[3]] if given else np.arange(constants[node.input[1]].size)
        axes_input = constant("rank4_axes", np.array([_rank4_axis(int(a)) for a in axes.reshape(-1)], np.int64))
        node.input[:] = [*node.input[:3], axes_input, *node.input[4:]]
    elif node.op_type == "Slice":
        axes = helper.get_attribute_value(attributes["axes"]) if "axes" in attributes \
            else range(len(helper.get_attribute_value(attributes["starts"])))
        set_attribute(node, "axes", [_rank4_axis(int(a)) for a in axes])
    else:
        default = (-1 if opset >= 13 else 1) if node.op_type == "Softmax" else 0
        axis = helper.get_attribute_value(attributes["axis"]) if "axis" in attributes else default
        set_attribute(node, "axis", _rank4_axis(axis))


def transposes_before_expands(model: onnx.ModelProto) -> int:
    """Write a Transpose of an Expand's result as the Expand of the transposed source to the
    shape permuted alike: the same values, the Transpose moving the source's elements before
    the Expand repeats them. rknn-toolkit2 2.5.0 stops its build in its rule
    reduce_tp_in_mesh_forward ("ValueError: 3 is not in list") on the rank-5 Transposes of
    Expands in BoTNet's and HaloNet's relative position logits (timm botnet26t_256 and
    halonet26t; their originals fail alike), and builds them moved. Only where the Expand's
    shape is a constant of its source's rank and the Transpose alone reads the Expand. Returns
    how many Transposes it moved."""
    graph = model.graph
    nodes = list(graph.node)
    constants, readers, made_by, graph_outputs = lookups(graph, nodes)
    shapes = static_shapes(model)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for transpose in nodes:
        expand = made_by.get(transpose.input[0]) if transpose.op_type == "Transpose" else None
        if expand is None or expand.op_type != "Expand" or expand.input[1] not in constants \
                or len(readers[expand.output[0]]) != 1 or expand.output[0] in graph_outputs:
            continue
        shape, source_shape = constants[expand.input[1]], shapes.get(expand.input[0])
        perm = node_attributes(transpose).get("perm")
        if source_shape is None or perm is None or shape.size != len(source_shape):
            continue
        prefix = f"{transpose.output[0]}/before_expand"
        moved_shape = numpy_helper.from_array(shape.reshape(-1)[list(perm)].astype(np.int64), f"{prefix}/shape")
        graph.initializer.append(moved_shape)
        written[id(expand)] = [
            helper.make_node("Transpose", [expand.input[0]], [f"{prefix}/moved"], f"{prefix}/transpose", perm=perm),
            helper.make_node("Expand", [f"{prefix}/moved", moved_shape.name], [transpose.output[0]],
                             f"{prefix}/expand")]
        removed.add(id(transpose))
    return nodes_rewritten(graph, nodes, written, removed)


#: Most axes the Transpose transpose_steps_as_one writes has, a unit batch axis included: the
#: rank of the window partitions and patch unfolds exporters write (Reshape to 6-D, Transpose).
MOST_JOINED_AXES = 6


def transpose_steps_as_one(model: onnx.ModelProto) -> int:
    """Write each tensor that a run of Reshapes and two Transposes or more makes of a tensor
    (the plan's steps of a rank > 4 Transpose, each on a 4-D view) as one Reshape that groups its
    source's elements, the one Transpose of those groups the run makes, and a Reshape to its
    shape (`_one_transpose_of`): the same values. Two such tensors with their elements in one
    order share the Transpose, the later a Reshape of the earlier. rknn-toolkit2 2.5.0 runs
    some of the steps' Reshapes on its CPU (timm_mobilevitv2_050's unfold of 8x8 planes into
    2x2 patches, [128, 16, 2, 2] -> [256, 2, 2, 8] and on: 3 CPU layers) and keeps the rank-6
    Reshape and Transpose the exporters write on its NPU (tv_maxvit_t's window partitions:
    41 CPU layers on the export before, 27 after). A run whose Transpose needs over
    MOST_JOINED_AXES axes, or over 4 from a source of more than one image (the window reverses:
    those the toolkit runs on its CPU, `_one_transpose_nodes`), or that would not get fewer
    nodes, stays; one whose Transposes undo each other is one Reshape. Returns how many tensors
    it wrote so."""
    return _runs_as_one_transpose(model, lambda transposes, steps: transposes >= 2)


def one_transpose_runs_shortened(model: onnx.ModelProto) -> int:
    """Write each tensor that a run of Reshapes and one Transpose makes of a tensor with fewer
    nodes where the run's order allows (`_one_transpose_nodes`): the Transpose of the source's
    own axes where the Reshape before it only splits and merges them, then one Reshape. The
    plan moves a map `[N, C, H, W]` into token rows `[N*H*W, C, 1, 1]` through its 4-D layout as
    `[N, C/k, k, H*W]`, a Transpose and a Reshape; rknn-toolkit2 2.5.0 runs that last Reshape on
    its CPU where N > 1 (MViTv2's pooled queries and keys), and both the Transpose of
    the map and the Reshape after it on its NPU. Runs before `token_rows_as_sequences`, which
    writes the rows of such a source as sequences. Returns how many tensors it wrote so."""
    return _runs_as_one_transpose(model, lambda transposes, steps: transposes == 1 and steps >= 3)


def _runs_as_one_transpose(model: onnx.ModelProto, takes: Callable[[int, int], bool]) -> int:
    """The work of `transpose_steps_as_one` on each run of moves whose count of Transposes and
    of steps `takes` accepts, where the one Transpose writes the run in fewer nodes (or with no
    Transpose at all)."""
    def shorter(graph, source, source_shape, order, result, result_shape, prefix, run):
        steps = _one_transpose_nodes(graph, source, source_shape, order, result, result_shape, prefix)
        if steps is None or (len(steps) >= len(run) and any(step.op_type == "Transpose" for step in steps)):
            return None
        return steps

    return _runs_rewritten(model, lambda run, shapes: takes(sum(step.op_type == "Transpose" for step in run),
                                                            len(run)), shorter, "one_transpose")


#: The longest axis of a Transpose rknn-toolkit2 2.5.0 runs on its NPU. Probed one Transpose
#: between two Adds at a time: [1, 4, 8192, 2] -> [1, 4, 2, 8192] on its NPU; [1, 2, 4, 9408]
#: -> [1, 2, 9408, 4], [1, 4, 9408, 2] -> [1, 9408, 4, 2] and [1, 4, 2, 9408] -> [1, 2, 9408, 4]
#: on its CPU. The oplist gives its Transpose no limit.
TOOLKIT_TRANSPOSE_EXTENT = 8192
#: Most Transposes `wide_transposes_as_block_swaps` writes one run of moves as.
MOST_BLOCK_SWAPS = 4


def wide_transposes_as_block_swaps(model: onnx.ModelProto) -> int:
    """Write each run of Reshapes and Transposes with a Transpose that has an axis longer than
    TOOLKIT_TRANSPOSE_EXTENT, which rknn-toolkit2 2.5.0 runs on its CPU, as the fewest swaps of
    two neighbouring blocks of its elements' axes whose blocks are all within it
    (`_fewest_block_swaps`): each a Transpose [A, B, C, D] -> [A, C, B, D] between Reshapes. The
    toolkit kept every swap of neighbours probed within the limit on its NPU, while a Transpose
    that reverses three blocks it ran on its CPU at [1, 16, 4000, 2] -> [1, 2, 4000, 16] (on its
    NPU at [1, 16, 512, 2]). NesT's window reverse, tokens [3136, 96] into the map
    [1, 96, 56, 56], planned as [4, 4, 2, 9408] -> [4, 2, 9408, 4] and a second Transpose
    (the toolkit: both Transposes and a Reshape of the second level on its CPU), becomes
    [4, 4, 14, 1344] -> [4, 14, 4, 1344] and [1, 3136, 96, 1] -> [1, 96, 3136, 1], all on its
    NPU. Returns how many tensors it wrote so."""
    def wide(run: list[onnx.NodeProto], shapes: dict[str, list[int]]) -> bool:
        return any(step.op_type == "Transpose" and max(shapes[step.input[0]]) > TOOLKIT_TRANSPOSE_EXTENT
                   for step in run if step.input[0] in shapes)

    def as_swaps(graph, source, source_shape, order, result, result_shape, prefix, run):
        found = _one_transpose_of(order)
        swaps = _fewest_block_swaps(*found) if found is not None else None
        return None if swaps is None else _block_swap_nodes(graph, source, source_shape, found[0], swaps, result,
                                                            result_shape, prefix)

    return _runs_rewritten(model, wide, as_swaps, "block_swaps")


def _fewest_block_swaps(sizes: list[int], perm: list[int]) -> list[tuple[int, int, int]] | None:
    """The fewest swaps of two neighbouring blocks that move axes of `sizes` from their order into
    `perm`'s, each swap (i, j, k) the blocks [i, j) and [j, k) of the axes as they stand then,
    every block (and what stands before and after them) at most TOOLKIT_TRANSPOSE_EXTENT
    elements. Among the fewest, the one whose swaps have the fewest elements before their
    blocks (the batch axis of their 4-D view), then the smallest largest block: rknn-toolkit2
    2.5.0 ran on its CPU the Reshape of [1, 96, 3136, 1] into [384, 4, 14, 14] (channels into
    the batch, NesT's window reverse moving its channels first), and the Reshapes of the order
    that moves them last, [4, 4, 14, 1344] and [1, 3136, 96, 1], on its NPU. None when no
    MOST_BLOCK_SWAPS swaps do. A breadth-first search over the orders of the axes (at most
    MOST_JOINED_AXES of them, so at most 720 orders)."""
    start, goal = tuple(range(len(sizes))), tuple(perm)
    if len(sizes) > MOST_JOINED_AXES:
        return None
    if start == goal:
        return []

    def extent(block: tuple[int, ...]) -> int:
        return int(np.prod([sizes[axis] for axis in block]))

    # order -> ((elements before the blocks, summed over the swaps; largest block), swaps)
    layer: dict[tuple[int, ...], tuple[tuple[int, int], list[tuple[int, int, int]]]] = {start: ((0, 0), [])}
    seen = {start}
    for _ in range(MOST_BLOCK_SWAPS):
        following: dict[tuple[int, ...], tuple[tuple[int, int], list[tuple[int, int, int]]]] = {}
        for order, ((batches, largest), swaps) in layer.items():
            for i, j, k in itertools.combinations(range(len(order) + 1), 3):   # blocks [i, j) and [j, k)
                blocks = (order[:i], order[i:j], order[j:k], order[k:])
                widest = max(extent(block) for block in blocks)
                moved = blocks[0] + blocks[2] + blocks[1] + blocks[3]
                if widest > TOOLKIT_TRANSPOSE_EXTENT or moved in seen:
                    continue
                candidate = ((batches + extent(blocks[0]), max(largest, widest)), [*swaps, (i, j, k)])
                if moved not in following or candidate[0] < following[moved][0]:
                    following[moved] = candidate
        if goal in following:
            return following[goal][1]
        seen.update(following)
        layer = following
    return None


def _block_swap_nodes(graph: onnx.GraphProto, source: str, source_shape: list[int], sizes: list[int],
                      swaps: list[tuple[int, int, int]], result: str, result_shape: list[int],
                      prefix: str) -> list[onnx.NodeProto]:
    """The nodes writing `result` as `swaps` (`_fewest_block_swaps`) of the axes of `sizes` (a
    grouping of `source`'s elements): per swap, a Reshape to the 4-D view [A, B, C, D] of the
    blocks where the tensor has another shape, and its Transpose (0, 2, 1, 3); then a Reshape
    to the result's shape."""
    steps: list[onnx.NodeProto] = []
    order, tensor, shape = list(range(len(sizes))), source, list(source_shape)
    for index, (i, j, k) in enumerate(swaps):
        blocks = (order[:i], order[i:j], order[j:k], order[k:])
        view = [int(np.prod([sizes[axis] for axis in block])) for block in blocks]
        if view != shape:
            steps.append(reshape_node(graph, tensor, view, f"{prefix}/blocks_{index}", f"{prefix}/view_{index}"))
            tensor = steps[-1].output[0]
        steps.append(helper.make_node("Transpose", [tensor], [f"{prefix}/swapped_{index}"], f"{prefix}/swap_{index}",
                                      perm=[0, 2, 1, 3]))
        tensor, shape = steps[-1].output[0], [view[0], view[2], view[1], view[3]]
        order = blocks[0] + blocks[2] + blocks[1] + blocks[3]
    if shape != list(result_shape) or not steps:
        steps.append(reshape_node(graph, tensor, result_shape, result, f"{prefix}/result"))
    else:
        steps[-1].output[0] = result
    return steps


def _runs_rewritten(model: onnx.ModelProto, takes: Callable[[list[onnx.NodeProto], dict[str, list[int]]], bool],
                    write: Callable[..., list[onnx.NodeProto] | None], form: str) -> int:
    """Each tensor a run of moves (Reshapes and Transposes) makes of a tensor, where `takes`
    accepts the run, written as `write` gives it the source's elements in the order the run
    leaves them (`write(graph, source, source_shape, order, result, result_shape, prefix, run)`,
    None to leave the run; its nodes named under RESULT/`form`); a second tensor of the same
    order from the same source is a Reshape of the first. Returns how many tensors it wrote."""
    graph = model.graph
    shapes, nodes, made_by, readers, graph_outputs, moves_elements = _moves_index(model)
    written: dict[int, list[onnx.NodeProto]] = {}
    orders: list[tuple[str, np.ndarray, str]] = []   # (source, element order, tensor written) so far
    for node in nodes:
        if not moves_elements(node) or (node.output[0] not in graph_outputs and all(
                moves_elements(reader) for reader in readers.get(node.output[0], []))):
            continue
        run, source = [node], node.input[0]
        while moves_elements(made_by.get(source)):
            run.insert(0, made_by[source])
            source = run[0].input[0]
        if source not in shapes or not takes(run, shapes):
            continue
        elements = np.arange(int(np.prod(shapes[source])), dtype=np.int64).reshape(shapes[source])
        order = _elements_moved(elements, run, shapes).reshape(-1)
        result = node.output[0]
        prefix = f"{result}/{form}"   # a tensor's name is unique, a node's may be empty
        same = next((tensor for earlier, seen, tensor in orders if earlier == source and np.array_equal(seen, order)),
                    None)
        if same is not None:
            written[id(node)] = [reshape_node(graph, same, shapes[result], result, prefix)]
            continue
        steps = write(graph, source, shapes[source], order, result, shapes[result], prefix, run)
        if steps is None:
            continue
        written[id(node)] = steps
        orders.append((source, order, result))
    changed = nodes_rewritten(graph, nodes, written)
    drop_unread_nodes(graph)
    return changed


def attention_operands_in_one_transpose(model: onnx.ModelProto) -> int:
    """Write the operands an attention's matrix products read from one tensor (q, k and v cut
    from one projection by a Split, each part moved by its own Reshapes and Transposes) as one
    Reshape grouping the tensor's elements, one Transpose, the Split into the operands along the
    first axis and, for an operand in another order than the others (k transposed), its own
    Transpose (`_one_transpose_nodes`): the same values. The plan's steps on a 4-D view (the
    rewrites' form of a rank-5 Transpose and its Gathers) leave each operand behind two
    Transposes; from those rknn-toolkit2 2.5.0 builds the attention with 4 Transposes and 3
    Reshapes more than from the original (tv_vit_tiny: 77 layers against 49), from the one
    Transpose as it builds the original (49). Only where the parts are read by MatMuls alone,
    and where fewer nodes result. Returns how many Splits it wrote so."""
    graph = model.graph
    shapes, nodes, made_by, readers, graph_outputs, moves_elements = _moves_index(model)
    scalars = {tensor.name for tensor in graph.initializer if int(np.prod(tensor.dims)) == 1}
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for split in nodes:
        if split.op_type != "Split" or split.input[0] not in shapes or any(name not in shapes for name in split.output):
            continue
        before, source = [], split.input[0]
        while moves_elements(made_by.get(source)) and len(readers[source]) == 1 and source not in graph_outputs:
            before.insert(0, made_by[source])
            source = before[0].input[0]
        operands = [_run_to_products(part, readers, moves_elements, graph_outputs, scalars)
                    for part in split.output]
        if source not in shapes or any(found is None for found in operands):
            continue
        axis = node_attributes(split).get("axis", 0) % len(shapes[split.input[0]])
        elements = _elements_moved(np.arange(int(np.prod(shapes[source])), dtype=np.int64).reshape(shapes[source]),
                                   before, shapes)
        cuts = np.cumsum([shapes[name][axis] for name in split.output])[:-1]
        orders = [_elements_moved(part, run, shapes).reshape(-1)
                  for part, (run, _) in zip(np.split(elements, cuts, axis=axis), operands)]
        steps = _operands_written(graph, source, shapes[source], orders, [shapes[leaf] for _, leaf in operands],
                                  [leaf for _, leaf in operands], f"{split.output[0]}/one_transpose",
                                  ai_onnx_opset(model))
        if steps is None or len(steps) >= len(before) + 1 + sum(len(run) for run, _ in operands):
            continue
        written[id(split)] = steps
        removed.update(id(step) for step in [*before, *(step for run, _ in operands for step in run)])
    changed = nodes_rewritten(graph, nodes, written, removed)
    drop_unread_nodes(graph)
    return changed


def softmaxes_before_layout_runs(model: onnx.ModelProto) -> int:
    """Write a Softmax whose input joins (a Concat along another axis) or is the result of runs of
    Reshapes and Transposes (one Transpose at least) from tensors computed before, and whose
    result reaches a graph output through such runs alone, as a Softmax of each source on a
    view that holds the softmax's rows along one axis ([A, K, H, W] for a detector's
    [1, A*K, H, W] anchors and classes), the runs and the Concat after it: the same values.
    The runs then end the output, where the host tail (`--host-tail`) hands them to the host
    part: rknn-toolkit2 2.5.0 runs on its CPU the Reshape of [1, H, W, A*K] into
    [1, H*W*A, 1, K] (tv_ssdlite320_mobilenet_v3_large's six class heads), and the Softmax of
    each [A, K, H, W] over its channels on its NPU. Returns how many Softmaxes it moved."""
    graph = model.graph
    shapes, nodes, made_by, readers, graph_outputs, moves_elements = _moves_index(model)
    opset = ai_onnx_opset(model)

    def ends_outputs(name: str) -> bool:
        after = readers.get(name, [])
        return name in graph_outputs or (bool(after) and all(moves_elements(node) and ends_outputs(node.output[0])
                                                             for node in after))

    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for softmax in nodes:
        if softmax.op_type != "Softmax" or softmax.input[0] not in shapes or not ends_outputs(softmax.output[0]):
            continue
        rank = len(shapes[softmax.input[0]])
        axis = node_attributes(softmax).get("axis", -1 if opset >= 13 else 1) % rank
        joined = made_by.get(softmax.input[0])
        concat = joined if joined is not None and joined.op_type == "Concat" else None
        if (opset < 13 and axis != rank - 1) or len(readers[softmax.input[0]]) != 1 \
                or (concat is not None and node_attributes(concat).get("axis", 0) % rank == axis):
            continue
        sources = []
        for part in (concat.input if concat is not None else [softmax.input[0]]):
            run, source = [], part
            while moves_elements(made_by.get(source)) and len(readers[source]) == 1:
                run.insert(0, made_by[source])
                source = run[0].input[0]
            view = _rows_view(shapes[source], _elements_moved(
                np.arange(int(np.prod(shapes[source])), dtype=np.int64).reshape(shapes[source]), run, shapes), axis) \
                if run and source in made_by and source in shapes else None
            if view is None or id(made_by[source]) in written:
                sources = None
                break
            sources.append((run, source, view))
        if not sources or not any(step.op_type == "Transpose" for run, _, _ in sources for step in run):
            continue   # Reshapes alone: the Softmax reads a relabel of its source, as the toolkit runs it
        for index, (run, source, view) in enumerate(sources):
            prefix = f"{softmax.output[0]}/before_moves/{index}"
            if view == shapes[source]:   # the rows are the source's channels already
                steps = [helper.make_node("Softmax", [source], [f"{prefix}/softmaxed"], f"{prefix}/softmax", axis=1)]
            else:
                steps = [reshape_node(graph, source, view, f"{prefix}/rows", f"{prefix}/view"),
                         helper.make_node("Softmax", [f"{prefix}/rows"], [f"{prefix}/softmax"], f"{prefix}/softmax",
                                          axis=1),
                         reshape_node(graph, f"{prefix}/softmax", shapes[source], f"{prefix}/softmaxed",
                                      f"{prefix}/back")]
            written[id(made_by[source])] = [made_by[source], *steps]
            run[0].input[0] = f"{prefix}/softmaxed"
        last = concat if concat is not None else made_by[softmax.input[0]]
        last.output[0] = softmax.output[0]
        removed.add(id(softmax))
    nodes_rewritten(graph, nodes, written, removed)
    return len(removed)


def _rows_view(source_shape: list[int], elements: np.ndarray, axis: int) -> list[int] | None:
    """A view of a tensor of `source_shape` (at most 4 axes) whose axis 1 holds, for each row of
    `elements` (the source's indices, moved) along `axis`, that row's elements: when each row's
    K elements stand at one stride st of the source, at the digits k * st of its flat index
    ([outer, K, inner], the inner axes the source's own when they make st); None otherwise."""
    rows = np.moveaxis(elements, axis, -1).reshape(-1, elements.shape[axis])
    count = rows.shape[1]
    if count < 2:
        return None
    stride = int(rows[0, 1] - rows[0, 0])
    if stride <= 0 or np.any(np.diff(rows, axis=1) != stride) or np.any((rows[:, 0] // stride) % count):
        return None
    outer = int(np.prod(source_shape)) // (count * stride)
    inner = next((list(source_shape[start:]) for start in range(len(source_shape))
                  if int(np.prod(source_shape[start:])) == stride and len(source_shape[start:]) <= 2), [stride, 1])
    return [outer, count, *inner] if len(inner) == 2 else [outer, count, *inner, 1]


def _run_to_products(part: str, readers: dict[str, list[onnx.NodeProto]], moves_elements,
                     graph_outputs: set[str], scalars: set[str]) -> tuple[list[onnx.NodeProto], str] | None:
    """The run of single-reader Reshapes and Transposes from `part` to a tensor MatMuls alone
    read (or one Mul by a constant scalar, an attention's scale, whose result they alone read),
    and that tensor; None when the run ends anywhere else."""
    run, tensor = [], part
    while tensor not in graph_outputs and len(readers.get(tensor, [])) == 1 and moves_elements(readers[tensor][0]):
        run.append(readers[tensor][0])
        tensor = run[-1].output[0]
    found = readers.get(tensor, [])
    if len(found) == 1 and found[0].op_type == "Mul" and found[0].output[0] not in graph_outputs and any(
            name in scalars for name in found[0].input):
        found = readers.get(found[0].output[0], [])
    if tensor in graph_outputs or not found or any(reader.op_type != "MatMul" for reader in found):
        return None
    return run, tensor


def _operands_written(graph: onnx.GraphProto, source: str, source_shape: list[int], orders: list[np.ndarray],
                      shapes: list[list[int]], results: list[str], prefix: str,
                      opset: int) -> list[onnx.NodeProto] | None:
    """The nodes writing `results` (of `shapes`), each the elements of `source` in its `orders`,
    as one Transpose's result split along its first axis, then a Reshape or a Transpose of each
    part where its shape or its order differs (the order most operands share is the Transpose's);
    None when the operands are not that, or need more than MOST_JOINED_AXES axes."""
    lows = [int(order.min()) for order in orders]
    relative = [order - low for order, low in zip(orders, lows)]
    shared = max(relative, key=lambda order: sum(np.array_equal(order, other) for other in relative))
    by_place = sorted(range(len(orders)), key=lambda index: lows[index])
    joined = np.concatenate([lows[index] + shared for index in by_place])
    found = _one_transpose_of(joined) if joined.size == int(np.prod(source_shape)) else None
    if found is None or found[1] == sorted(found[1]) or found[0][found[1][0]] % len(orders):
        return None
    sizes, perm = found
    if sizes[perm[0]] != len(orders):   # the operands' axis joined with the next: apart, so each part is one
        axis, inner = perm[0], sizes[perm[0]] // len(orders)
        sizes = [*sizes[:axis], len(orders), inner, *sizes[axis + 1:]]
        perm = [axis, axis + 1, *(other + (other > axis) for other in perm[1:])]
    if len(sizes) > MOST_JOINED_AXES:
        return None
    transposed = [sizes[axis] for axis in perm]
    grouping = sizes != source_shape
    steps = [reshape_node(graph, source, sizes, f"{prefix}/grouped", f"{prefix}/group")] if grouping else []
    steps.append(helper.make_node("Transpose", [steps[-1].output[0] if steps else source], [f"{prefix}/moved"],
                                  f"{prefix}/transpose", perm=perm))
    part_shape = [transposed[0] // len(orders), *transposed[1:]]
    ordered, place_of = np.sort(shared), np.argsort(shared)   # shared[place_of[k]] == ordered[k]
    pieces, rest = [], []
    for place, index in enumerate(by_place):
        at = np.minimum(np.searchsorted(ordered, relative[index]), ordered.size - 1)
        if not np.array_equal(ordered[at], relative[index]):
            return None
        within = place_of[at]   # where in its part each element of the operand stands
        if np.array_equal(within, np.arange(within.size)) and part_shape == shapes[index]:
            pieces.append(results[index])
            continue
        pieces.append(f"{prefix}/part_{place}")
        found = _one_transpose_nodes(graph, pieces[-1], part_shape, within, results[index], shapes[index],
                                     f"{prefix}/operand_{place}")
        if found is None:
            return None
        rest += found
    sizes_constant, split = split_node(f"{prefix}/moved", [part_shape[0]] * len(orders), pieces, f"{prefix}/split", 0,
                                       opset)
    graph.initializer.extend(sizes_constant)
    return [*steps, split, *rest]


def _moves_index(model: onnx.ModelProto):
    """What the shapings of runs of moves look up: the static shapes, the nodes in order, each
    tensor's producer and readers, the graph's outputs, and whether a node only moves its
    input's elements (a Transpose, or a Reshape to a constant shape, its result's shape known)."""
    shapes = static_shapes(model)
    constants = {tensor.name for tensor in model.graph.initializer}
    nodes = list(model.graph.node)

    def moves_elements(node: onnx.NodeProto | None) -> bool:
        return node is not None and node.output[0] in shapes and (
            node.op_type == "Transpose" or (node.op_type == "Reshape" and node.input[1] in constants))

    return (shapes, nodes, {name: node for node in nodes for name in node.output}, readers_of(model.graph),
            output_names(model.graph), moves_elements)


def _elements_moved(elements: np.ndarray, run: Sequence[onnx.NodeProto], shapes: dict[str, list[int]]) -> np.ndarray:
    """`elements` moved by each of `run`'s Transposes and Reshapes in turn."""
    for step in run:
        elements = elements.transpose(node_attributes(step).get("perm")) if step.op_type == "Transpose" \
            else elements.reshape(shapes[step.output[0]])
    return elements


def _one_transpose_nodes(graph: onnx.GraphProto, source: str, source_shape: list[int], order: np.ndarray,
                         result: str, result_shape: list[int], prefix: str) -> list[onnx.NodeProto] | None:
    """The nodes writing `result` (`result_shape`) as the elements of `source` (`source_shape`) in
    `order` (`_one_transpose_of`): a Reshape grouping the source's elements, the Transpose of
    those groups and a Reshape to the result's shape, each left out where it would change
    nothing; one Reshape where the order is the source's own. None when no Transpose of at most
    MOST_JOINED_AXES axes writes that order, or when it needs over 4 axes and the source is not
    one image (no unit batch axis to keep), a Transpose rknn-toolkit2 runs on its CPU."""
    found = _one_transpose_of(order)
    if found is None:
        return None
    sizes, perm = found
    if perm == sorted(perm):   # the elements keep their order: a relabel
        return [reshape_node(graph, source, result_shape, result, prefix)]
    on_source = _on_source_axes(sizes, perm, source_shape)
    if on_source is not None:
        sizes, perm = on_source
    elif source_shape[:1] == [1]:   # keep the batch axis, as the exporters write it
        sizes, perm = [1, *sizes], [0, *(axis + 1 for axis in perm)]
    elif len(sizes) > 4:
        # above rank 4 and not from a single image: rknn-toolkit2 2.5.0 runs that Transpose and
        # both its Reshapes on its CPU (a window reverse from the windows as images, [4, 64, 7, 7]
        # into [1, 64, 14, 14], in timm efficientvit_m0 and tv_maxvit_t), the 4-D steps on its NPU
        return None
    if len(sizes) > MOST_JOINED_AXES:
        return None
    moved = [sizes[axis] for axis in perm]
    grouping, ungrouping = sizes != source_shape, moved != result_shape
    grouped = f"{prefix}/grouped" if grouping else source
    steps = [reshape_node(graph, source, sizes, grouped, f"{prefix}/group")] if grouping else []
    steps.append(helper.make_node("Transpose", [grouped], [f"{prefix}/moved" if ungrouping else result],
                                  f"{prefix}/transpose", perm=perm))
    if ungrouping:
        steps.append(reshape_node(graph, steps[-1].output[0], result_shape, result, f"{prefix}/ungroup"))
    return steps


def _on_source_axes(sizes: list[int], perm: list[int], source_shape: list[int]) -> tuple[list[int], list[int]] | None:
    """The Transpose of groups `sizes` by `perm` as a Transpose of the source's own axes, where
    each group is a run of whole source axes and the source has at most 4: the same order with
    no Reshape grouping the source (rknn-toolkit2 2.5.0 runs the Reshape after a grouped form,
    MViTv2's `[2, 96, 14, 14]` as `[2, 3, 32, 196]` moved into token rows, on its CPU, and the
    one after the 4-D Transpose on its NPU). A unit batch axis stays first. None otherwise."""
    if len(source_shape) > 4 or 1 in sizes:
        return None
    kept = 1 if source_shape[:1] == [1] else 0   # a unit batch axis, kept in front
    groups: list[list[int]] = []
    axis = kept
    for size in sizes:
        group, product = [], 1
        while product < size and axis < len(source_shape):
            group.append(axis)
            product *= source_shape[axis]
            axis += 1
        if product != size:
            return None
        groups.append(group)
    groups[-1].extend(range(axis, len(source_shape)))   # trailing unit axes stay with the last group
    return list(source_shape), [*range(kept), *(source_axis for group in perm for source_axis in groups[group])]


def _one_transpose_of(order: np.ndarray) -> tuple[list[int], list[int]] | None:
    """The sizes and the perm, fewest axes, of the Transpose that reads `order.size` elements
    grouped by those sizes and writes them in `order` (the source index of each result element):
    `np.arange(n).reshape(sizes).transpose(perm).reshape(-1) == order`; None when no Transpose
    does. The result's axes come innermost first: each is the longest run of equal strides
    through the source from where the axes within it repeat."""
    count = order.size
    runs: list[tuple[int, int]] = []   # (length, stride in the source) of the result's axes, innermost first
    span = 1   # result elements one step of the next axis crosses
    while span < count:
        stride = int(order[span])
        length = 1
        while span * length < count and int(order[span * length]) == stride * length:
            length += 1
        if stride == 0 or count % (span * length):
            return None
        runs.append((length, stride))
        span *= length
    by_stride = sorted(range(len(runs)), key=lambda axis: -runs[axis][1])
    sizes = [runs[axis][0] for axis in by_stride]
    perm = [by_stride.index(axis) for axis in reversed(range(len(runs)))]
    if not np.array_equal(np.arange(count).reshape(sizes).transpose(perm).reshape(-1), order):
        return None
    return sizes, perm


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    slices_before_reshapes,
    gathers_as_slices,
    flattened_planes_padded,
    rank3_tails_as_rank4,
    batched_rows_as_one_image,
    splits_of_concats_bypassed,
    reshapes_after_elementwise_ops,
    softmaxes_before_layout_runs,
    transposes_before_expands,
    one_transpose_runs_shortened,
    attention_operands_in_one_transpose,
    transpose_steps_as_one,
    wide_transposes_as_block_swaps,
    token_rows_of_planes_padded,
)
