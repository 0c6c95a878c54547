"""Shapings of the plan's transformer tokens: the rows [R, C, 1, 1] it holds them as written back
as the sequences [P, N, C] they were (`token_rows_as_sequences`), rows it transposed into
channels [C, R, 1, 1] relabelled as one plane [1, C, 1, R] (`transposed_rows_as_planes`), its
two Transposes in a row that move one axis written in the Split form
(`transpose_pairs_as_splits`), and the Split form of its one-axis Transposes written back as the
Transpose (`transposes_from_splits`)."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import (ai_onnx_opset, node_attributes, nodes_rewritten, output_names, readers_of,
                                         set_attribute, static_shapes)
from rkcompile.views.toolkit_shapings.common import (ELEMENTWISE, TOOLKIT_BLOCK, Shaping, lookups, pointwise,
                                                    reduced_axes, reshape_node, split_node)


def token_rows_as_sequences(model: onnx.ModelProto) -> int:
    """Write the plan's tokens held as rows [R, C, 1, 1] (a transformer's [P, N, C] tokens,
    each Linear a 1x1 Conv) back as the sequences [P, N, C] they were: each region of rows the
    Reshapes into them start and Reshapes out of them end, computed by LayerNormalizations
    over the channels, 1x1 Convs and element-by-element ops of per-channel constants
    (`_TokenRegion`), its Reshapes in writing [P, N, C], each LayerNormalization over the last
    axis, each Conv a MatMul (then an Add of its bias), each Gather of whole rows reading the
    sequences Reshaped back to rows: the same values up to float32 rounding. From the rows
    rknn-toolkit2 2.5.0 holds the tokens as one row [1, C, 1, R] and runs on its CPU the
    Reshape of the patches into it (MobileViT's unfold of each block, [640, 8, 2, 2] into
    [1, 80, 1, 256]) and the one its fold makes back; from the sequences it holds them as
    [P, C, 1, N] and keeps both on its NPU. Returns how many ops it wrote so."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    found = _TokenRegion.all_in(graph, shapes, constants)
    readers = readers_of(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    for region in found:
        for entry in region.entries:
            shape = numpy_helper.from_array(np.array([*region.sequences, shapes[entry.output[0]][1]], np.int64),
                                            f"{entry.name}/sequences_shape")
            graph.initializer.append(shape)
            entry.input[1] = shape.name
        for node in region.ops:
            written[id(node)] = _on_sequences(node, graph, constants)
        for node in [*region.entries, *region.ops]:
            gathers = [reader for reader in readers.get(node.output[0], [])
                       if _gathers_rows(reader, node.output[0], constants)]
            if gathers:
                rows = f"{node.output[0]}/rows"
                back = reshape_node(graph, node.output[0], shapes[node.output[0]], rows, f"{rows}/reshape")
                written[id(node)] = [*written.get(id(node), [node]), back]
                for gather in gathers:
                    gather.input[0] = rows
    return nodes_rewritten(graph, graph.node, written)


class _TokenRegion(NamedTuple):
    """Rows [R, C, 1, 1] that `token_rows_as_sequences` writes as sequences: the Reshapes
    writing them from other shapes (`entries`), the ops computing them from those (`ops`),
    and the sequences' [P, N]."""
    entries: list[onnx.NodeProto]
    ops: list[onnx.NodeProto]
    sequences: tuple[int, int]

    @staticmethod
    def all_in(graph: onnx.GraphProto, shapes: dict[str, list[int]],
               constants: dict[str, np.ndarray]) -> list["_TokenRegion"]:
        """The regions of rows in `graph` (`_region_from`): each the tensors of [R, *, 1, 1]
        that reach one another through its ops, none a graph output, each made by a Reshape
        from another shape or by an op a region may hold (`_on_rows`), each read by such ops or
        by Reshapes or by Gathers of whole rows, a LayerNormalization among the ops (a
        transformer's tokens: the rows of a sum over bins, Reshaped to an output, stay, as
        `sums_as_reduce_sums` says); its [P, N] from an exit's shape [P, N, C] (unit axes aside:
        rknn-toolkit2 2.5.0 runs MViTv2's Reshape of its pooled keys from [56, 28, 96] into
        [1, 2, 784, 96] on its CPU), else from an entry's source [..., N, C]."""
        readers = readers_of(graph)
        made_by = {name: node for node in graph.node for name in node.output}
        outputs = output_names(graph)

        def rows(name: str) -> bool:
            return name not in constants and _is_rows(shapes.get(name))

        def entry(node: onnx.NodeProto | None) -> bool:
            return node is not None and node.op_type == "Reshape" and not rows(node.input[0]) \
                and node.input[0] in shapes

        regions, seen = [], set()
        for start in graph.node:
            if not entry(start) or not rows(start.output[0]) or start.output[0] in seen:
                continue
            count = shapes[start.output[0]][0]
            entries, ops, tensors, whole = _region_from(
                start.output[0], lambda name: rows(name) and shapes[name][0] == count, entry,
                lambda node: _on_rows(node, shapes, constants), constants, readers, made_by, outputs,
                gathers_exit=True)
            seen.update(tensors)
            # (shape unit axes aside, the rows' channels) of each exit
            exits = [([size for size in constants[reader.input[1]].tolist() if size != 1], shapes[name][1])
                     for name in tensors for reader in readers.get(name, [])
                     if reader.op_type == "Reshape" and reader.input[0] == name and reader.input[1] in constants]
            # an exit into [P, N, C] then only adds unit axes
            lengths = [*(shape[-2] for shape, channels in exits if len(shape) == 3 and shape[-1] == channels),
                       *(shapes[e.input[0]][-2] for e in entries
                         if len(shapes[e.input[0]]) >= 2 and shapes[e.input[0]][-1] == shapes[e.output[0]][1])]
            normalized = any(op.op_type == "LayerNormalization" for op in ops)
            if whole and normalized and lengths and count % lengths[0] == 0 and 1 < lengths[0] < count:
                length = lengths[0]
                regions.append(_TokenRegion(entries, ops, (count // length, length)))
        return regions


def _region_from(start: str, member: Callable[[str], bool], entry: Callable[[onnx.NodeProto], bool],
                 computes: Callable[[onnx.NodeProto], bool], constants: dict[str, np.ndarray],
                 readers: dict[str, list[onnx.NodeProto]], made_by: dict[str, onnx.NodeProto],
                 outputs: set[str], *, gathers_exit: bool = False
                 ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto], set[str], bool]:
    """The region of tensors the tensor `start` reaches through the ops `computes` accepts, both
    ways: its entries (the nodes `entry` accepts that make its tensors), its ops, its tensors,
    and whether it is whole: every tensor a `member`, no graph output, made by an entry or an
    op, and read by ops or by Reshapes to a constant shape (its exits, which stay: a 0 in their
    shape, copying an axis of the tensor a shaping changes, is not whole) or, with
    `gathers_exit`, by Gathers of whole rows (`_gathers_rows`: exits the caller writes for)."""
    entries, ops, tensors, pending, whole = {}, {}, set(), [start], True
    while pending and whole:
        name = pending.pop()
        if name in tensors:
            continue
        tensors.add(name)
        producer = made_by.get(name)
        if not member(name) or name in outputs or producer is None:
            whole = False
        elif entry(producer):
            entries[id(producer)] = producer
        elif computes(producer):
            ops[id(producer)] = producer
            pending.extend(n for n in producer.input if n and n not in constants)
        else:
            whole = False
        for reader in readers.get(name, []):
            if reader.op_type == "Reshape" and reader.input[0] == name:
                whole = whole and reader.input[1] in constants and 0 not in constants[reader.input[1]]
                continue
            if gathers_exit and _gathers_rows(reader, name, constants):
                continue
            whole = whole and computes(reader)
            pending.extend([*(n for n in reader.input if n and n not in constants), *reader.output])
    return list(entries.values()), list(ops.values()), tensors, whole


def _gathers_rows(node: onnx.NodeProto, rows: str, constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` picks whole rows of `rows` by constant indices (a Gather along axis 0)."""
    return node.op_type == "Gather" and node.input[0] == rows and node.input[1] in constants \
        and next((a.i for a in node.attribute if a.name == "axis"), 0) == 0


def _on_rows(node: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` computes each row [C, 1, 1] of its rows [R, C, 1, 1] from that row of
    its variable inputs alone, by an op that works alike on sequences [P, N, C]: a
    LayerNormalization over the channels, a 1x1 Conv of constant weights, or an
    element-by-element op of inputs of its result's shape and constants of one value or one a
    channel."""
    result = shapes.get(node.output[0])
    if result is None or len(node.output) != 1 or len(result) != 4:
        return False
    channels = result[1]
    if node.op_type == "LayerNormalization":
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        return axis in (1, -3) and node.input[0] not in constants \
            and all(name in constants and constants[name].size == channels for name in node.input[1:] if name)
    if node.op_type == "Conv":
        return node.input[0] not in constants and node.input[1] in constants \
            and pointwise(node, constants[node.input[1]].shape) \
            and all(name in constants for name in node.input[2:] if name)
    return node.op_type in ELEMENTWISE and all(
        _per_channel(constants[name], channels) if name in constants else shapes.get(name) == result
        for name in node.input if name)


def _per_channel(values: np.ndarray, channels: int) -> bool:
    """Whether `values` broadcast over rows [R, C, 1, 1] gives each channel one value."""
    return values.size == 1 or (values.size == channels and values.shape[-3:] == (channels, 1, 1))


def _on_sequences(node: onnx.NodeProto, graph: onnx.GraphProto,
                  constants: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    """The nodes computing `node`, an op `_on_rows` accepts, on sequences [P, N, C]: its
    constants as vectors (initializers added to `graph`), a Conv as a MatMul then an Add of
    its bias."""
    if node.op_type == "Conv":
        weights = constants[node.input[1]]
        matrix = numpy_helper.from_array(np.ascontiguousarray(weights.reshape(weights.shape[:2]).T),
                                         f"{node.name}/matrix")
        graph.initializer.append(matrix)
        if len(node.input) < 3 or not node.input[2]:
            return [helper.make_node("MatMul", [node.input[0], matrix.name], [node.output[0]], f"{node.name}/matmul")]
        bias = numpy_helper.from_array(constants[node.input[2]], f"{node.name}/bias")
        graph.initializer.append(bias)
        return [helper.make_node("MatMul", [node.input[0], matrix.name], [f"{node.name}/product"],
                                 f"{node.name}/matmul"),
                helper.make_node("Add", [f"{node.name}/product", bias.name], [node.output[0]], f"{node.name}/bias")]
    for index, name in enumerate(node.input):
        if name in constants and constants[name].ndim > 1:
            vector = numpy_helper.from_array(constants[name].reshape(-1), f"{node.name}/vector_{index}")
            graph.initializer.append(vector)
            node.input[index] = vector.name
    if node.op_type == "LayerNormalization":
        set_attribute(node, "axis", -1)
    return [node]


def _is_rows(shape: list[int] | None) -> bool:
    """Whether `shape` is the plan's rows [R, C, 1, 1], R > 1: tokens, each Linear a 1x1 Conv."""
    return shape is not None and len(shape) == 4 and shape[2:] == [1, 1] and shape[0] > 1


def transposed_rows_as_planes(model: onnx.ModelProto) -> int:
    """Relabel the plan's token rows transposed into channel rows (a Transpose swapping the
    first two axes of rows [R, C, 1, 1] into [C, R, 1, 1]: XCiT's cross-covariance attention,
    its q, k and v each a channel over the tokens) as one plane [1, C, 1, R], and so every
    tensor [a, b, 1, 1] that the ops after it compute from such rows (`_TransposedRows`) as
    [1, a, 1, b]: the same values in the same order, so the Reshapes that read them (into
    heads) stay as they are. From [C, R, 1, 1], R tokens not a multiple of TOOLKIT_BLOCK,
    rknn-toolkit2 2.5.0 runs on its CPU each Reshape of the rows into heads ([128, 196, 1, 1]
    into [1, 4, 32, 196]: 36 layers on XCiT-nano, 3 a block); from [1, C, 1, R] it keeps them
    on its NPU. Where R is a multiple (EdgeNeXt's 1024, 256 and 64 tokens) it keeps them on its
    NPU from the rows too, in 2 layers fewer a block. Returns how many Transposes it
    relabelled."""
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, made_by, outputs = lookups(graph)
    transposes = 0
    for region in _TransposedRows.all_in(graph, shapes, constants, readers, made_by, outputs):
        transposes += len(region.entries)
        for entry in region.entries:
            perm = list(node_attributes(entry)["perm"])
            # the unit axes lead the two that move: perm[2] and perm[3] index axes of size 1
            set_attribute(entry, "perm", [perm[2], perm[0], perm[3], perm[1]])
        for node in region.ops:
            _on_planes(node, graph)
    return transposes


class _TransposedRows(NamedTuple):
    """Tensors [a, b, 1, 1] that `transposed_rows_as_planes` relabels [1, a, 1, b]: the
    Transposes that make them from token rows (`entries`) and the ops computing the others from
    those (`ops`)."""
    entries: list[onnx.NodeProto]
    ops: list[onnx.NodeProto]

    @staticmethod
    def all_in(graph: onnx.GraphProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray],
               readers: dict[str, list[onnx.NodeProto]], made_by: dict[str, onnx.NodeProto],
               outputs: set[str]) -> list["_TransposedRows"]:
        """The regions in `graph` (`_region_from`): each the tensors of [a, b, 1, 1] that reach
        one another through ops that work alike on the relabelled tensors
        (`_on_transposed_rows`), none a graph output, each made by such an op or a Transpose of
        token rows of R tokens not a multiple of TOOLKIT_BLOCK, each read by such ops or by
        Reshapes."""

        def entry(node: onnx.NodeProto | None) -> bool:
            perm = list(node_attributes(node).get("perm", ())) \
                if node is not None and node.op_type == "Transpose" else None
            return perm == [1, 0, 2, 3] and _is_rows(shapes.get(node.input[0])) \
                and shapes[node.input[0]][0] % TOOLKIT_BLOCK != 0

        regions, seen = [], set()
        for start in graph.node:
            if not entry(start) or start.output[0] in seen:
                continue
            entries, ops, tensors, whole = _region_from(
                start.output[0], lambda name: len(shapes.get(name) or ()) == 4 and shapes[name][2:] == [1, 1], entry,
                lambda node: _on_transposed_rows(node, shapes, constants), constants, readers, made_by, outputs)
            seen.update(tensors)
            if whole:
                regions.append(_TransposedRows(entries, ops))
        return regions


def _on_transposed_rows(node: onnx.NodeProto, shapes: dict[str, list[int]],
                        constants: dict[str, np.ndarray]) -> bool:
    """Whether `node`, reading and writing tensors [a, b, 1, 1], computes the same values from
    them relabelled [1, a, 1, b] once its axes are relabelled alike: an element-by-element op
    whose constants are of one value, a Split of the rows, or a ReduceSum or ReduceMean over
    the tokens (an L2 normalization's sum of squares) keeping them. A constant of several
    values would need a new shape under a new name, where an int8 export finds the plan's
    quantized constants by theirs."""
    if any(len(shapes.get(name) or ()) != 4 for name in node.output):
        return False
    if node.op_type in ("Split", "ReduceSum", "ReduceMean"):
        attributes = node_attributes(node)
        axes = [attributes.get("axis", 0)] if node.op_type == "Split" else reduced_axes(node, constants)
        kept = attributes.get("keepdims", 1)
        return axes is not None and [axis % 4 for axis in axes] == [0 if node.op_type == "Split" else 1] and kept == 1
    return node.op_type in ELEMENTWISE and all(constants[name].size == 1 for name in node.input if name in constants)


def _on_planes(node: onnx.NodeProto, graph: onnx.GraphProto) -> None:
    """Relabel `node`, an op `_on_transposed_rows` accepts, to read and write planes
    [1, a, 1, b]: a Split along the rows splits axis 1, a reduction over the tokens reduces
    axis 3 (its axes an initializer added to `graph` where they are an input); an
    element-by-element op stays as it is."""
    if node.op_type == "Split":
        set_attribute(node, "axis", 1)
    elif node.op_type in ("ReduceSum", "ReduceMean"):
        if len(node.input) > 1 and node.input[1]:
            axes = numpy_helper.from_array(np.array([3], np.int64), f"{node.name}/axes_on_planes")
            graph.initializer.append(axes)
            node.input[1] = axes.name
        else:
            set_attribute(node, "axes", [3])


#: The most unit pieces transpose_pairs_as_splits cuts a moved axis into: the plan's own Split
#: form of a Transpose moves an axis of at most 16 (passes/rewrites/layout_ops.py)
MOST_SPLIT_PIECES = 16


def transpose_pairs_as_splits(model: onnx.ModelProto) -> int:
    """Write two Transposes in a row that together move one axis of 2 to MOST_SPLIT_PIECES and
    keep the others in order (the plan's two legal steps of a movement whose one Transpose the
    perm table refuses) as the plan's Split form of that movement: a Split of that axis into
    unit pieces, a Reshape of each moving its unit axis to the new place, a Concat along it.
    rknn-toolkit2 2.5.0 merges two Transposes in a row into one (its rule `fuse_two_transpose`)
    and runs it on its CPU where its perm table refuses it (timm swin_tiny's window partition
    [4, 7, 4, 1344] by (0, 2, 1, 3): 2 layers); `transposes_from_splits`, next, writes the
    Split form back as one Transpose where the toolkit runs that on its NPU. Returns how many
    pairs it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    readers = readers_of(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    graph_outputs = output_names(graph)
    opset = ai_onnx_opset(model)
    originals = list(graph.node)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for second in originals:
        first = made_by.get(second.input[0]) if second.op_type == "Transpose" else None
        source = shapes.get(first.input[0]) if first is not None and first.op_type == "Transpose" else None
        if source is None or len(readers[first.output[0]]) != 1 or first.output[0] in graph_outputs \
                or id(first) in written:  # a run of three: the middle one is the second of a pair already
            continue
        inner = node_attributes(first).get("perm", range(len(source) - 1, -1, -1))
        outer = node_attributes(second).get("perm", range(len(source) - 1, -1, -1))
        perm = [inner[axis] for axis in outer]
        movable = [axis for axis in range(len(source)) if 1 < source[axis] <= MOST_SPLIT_PIECES
                   and [p for p in perm if p != axis] == sorted(p for p in perm if p != axis)]
        if not movable:
            continue
        moved = min(movable, key=lambda axis: source[axis])  # a swap moves either axis: the fewer pieces
        name = second.name or second.output[0]
        pieces = [f"{name}/piece_{index}" for index in range(source[moved])]
        constants, split = split_node(first.input[0], [1] * source[moved], pieces, f"{name}/split", moved, opset)
        graph.initializer.extend(constants)
        piece_shape = [1 if axis == moved else source[axis] for axis in perm]
        relabelled = [reshape_node(graph, piece, piece_shape, f"{piece}/moved", f"{piece}/reshape") for piece in pieces]
        written[id(second)] = [split, *relabelled, helper.make_node(
            "Concat", [node.output[0] for node in relabelled], [second.output[0]], f"{name}/concat",
            axis=perm.index(moved))]
        removed.add(id(first))
    return nodes_rewritten(graph, originals, written, removed)


def transposes_from_splits(model: onnx.ModelProto) -> int:
    """Write the plan's Transpose that moves one axis, done as a Split of that axis into unit
    pieces, a Reshape of each moving its unit axis to the new place and a Concat along it,
    back as the Transpose: the same values. With the tokens as sequences
    (`token_rows_as_sequences`) rknn-toolkit2 2.5.0 keeps on its NPU the Transposes of
    MobileViT's unfold and fold; from the Splits it runs on its CPU the Reshape it makes
    before one ([1, 96, 8, 8] into [384, 8, 1, 2]) and the one after the Concat. A Transpose
    read by a Reshape into rows [R, C, 1, 1] keeps the Split form: written back there (Swin's
    window partition, [4, 7, 4, 1344] moved by (0, 2, 1, 3) into [784, 192, 1, 1]) the
    toolkit runs the Transpose itself on its CPU. So does one read by a Reshape that a Gather
    reads: the toolkit moves that Reshape past the Gather into rows (Swin's window reverse
    before the shifted window's roll, [2, 2, 7, 1344] moved by (0, 2, 1, 3): tv_swin_nano and
    timm's swin_tiny ran one such Transpose per shifted block of a stage on its CPU). Returns
    how many Transposes it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    readers = readers_of(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    originals = list(graph.node)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for node in originals:
        pieces = [made_by.get(name) for name in node.input] if node.op_type == "Concat" else []
        split = made_by.get(pieces[0].input[0]) if pieces and pieces[0] is not None else None
        if split is None or split.op_type != "Split" or len(pieces) < 2 \
                or any(p is None or p.op_type != "Reshape" or len(readers[p.output[0]]) != 1 for p in pieces) \
                or list(split.output) != [p.input[0] for p in pieces] \
                or any(len(readers[name]) != 1 for name in split.output) \
                or any(r.op_type == "Reshape" and (_is_rows(shapes.get(r.output[0]))
                                                   or any(g.op_type == "Gather" for g in readers.get(r.output[0], [])))
                       for r in readers.get(node.output[0], [])):
            continue
        source, result = shapes.get(split.input[0]), shapes.get(node.output[0])
        if source is None or result is None:
            continue
        cut = next((a.i for a in split.attribute if a.name == "axis"), 0) % len(source)
        joined = next(a.i for a in node.attribute if a.name == "axis") % len(source)
        perm = [axis for axis in range(len(source)) if axis != cut]
        perm.insert(joined, cut)
        piece = [source[axis] for axis in perm]
        piece[joined] = 1
        if cut == joined or source[cut] != len(pieces) or [source[axis] for axis in perm] != result \
                or any(shapes.get(p.output[0]) != piece for p in pieces):
            continue
        written[id(node)] = [helper.make_node("Transpose", [split.input[0]], [node.output[0]],
                                              f"{node.name}/transpose", perm=perm)]
        removed.update([id(split), *(id(p) for p in pieces)])
    return nodes_rewritten(graph, originals, written, removed)


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    token_rows_as_sequences,
    transposed_rows_as_planes,
    transpose_pairs_as_splits,
    transposes_from_splits,
)
