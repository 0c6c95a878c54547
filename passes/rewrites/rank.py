"""Rank rewrites: a region of tensors above rank 4 (an exporter's Reshape to [.., 3, heads, dim],
its Transpose, the Gathers that unbind q/k/v, element-wise ops between them) redone on tensors
of rank 4 or less, so no NPU operator meets a fifth axis (oplist V2.3.2: every operator's shape
is [batch, channel, height, width]).

Each tensor of the region is read as a grouping of its axes: size-1 axes dropped and
neighbouring axes merged wherever every op of the region treats them as one (a Transpose
moves them together, a Gather does not pick along either, a broadcast operand spans both or
neither). The groupings are refined together to a fixpoint, so a tensor read by several ops
gets one grouping that suits all of them. Where a tensor keeps over 4 groups, the region is
redone first: pieces selected before a Transpose, a Transpose of over 4 groups in steps, or one
that reorders axes the rest of the region merges in two steps, those axes moved as one block
first. A ReduceMax or ReduceMin of the region, which the NPU has no kernel for, stays on the CPU
at rank 4 or less.

A 3-D network (a video model's [N, C, T, H, W]) is such a region too: each 3-D Conv runs as a
2-D Conv with the depth folded into its channels, each global pool as a 2-D pool; when the
region starts at a model input above rank 4, that input's relabel stays on the CPU."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach
from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, element_count, static_shape

from rkcompile.passes.legalize import check_node
from rkcompile.passes.rewrites.base import RESHAPE_LIKE, Builder, Candidates, RewriteRule, Site, producer
from rkcompile.passes.rewrites.reductions import block_reduction_as_conv
from rkcompile.passes.rewrites.elementwise import ELEMENTWISE
from rkcompile.passes.rewrites.layout_ops import emit_legal_transpose, legal_whole
from rkcompile.passes.rewrites.matmul_as_conv import einsum_as_matmul_form, einsum_as_matmul_nodes
from rkcompile.targets.constraints import NPU_RANK

#: Ops that work along some axes and keep the others as they are: each of those axes stays a
#: group of its own, the other axes merge as in their operands.
AXIS_OPS = frozenset({"Slice", "Split", "Concat", "Softmax", "LogSoftmax", "Pad"})
#: Ops that pick part of their input along some axes.
SELECTIONS = frozenset({"Split", "Slice", "Gather"})
#: The AXIS_OPS that cut their input along an axis or join their inputs along it.
SELECTIONS_AND_JOINS = frozenset({"Split", "Slice", "Concat"})
#: The ops a region may hold: each has a form on merged axes.
#: Batched matrix products: the batch axes merge alike in both operands and the result, the
#: two matrix axes of each stay groups of their own. A MatMul by a 2-D constant (a linear layer
#: on the last axis: Twins' q/k/v projection of its [N, h, w, wh, ww, C] windows) is one too:
#: every axis but the last merges alike in its operand and its result (`_linear_layer`); so is
#: a product broadcast over heads once they move into its one row (`_row_broadcast`).
PRODUCTS = frozenset({"MatMul", "Einsum"})
#: Element-wise ops and Expand: operands broadcast to the result.
BROADCASTS = ELEMENTWISE | {"Expand"}
#: Sums and means over one block of neighbouring axes: each reduced axis is a group of its own,
#: the kept axes merge as in the result (ResNeSt's split attention sums its [N, radix, C, H, W]
#: over the radix), and the reduction is rebuilt by reductions.block_reduction_as_conv, a 1x1
#: Conv on the [outer, D, inner, 1] view of the groups.
REDUCTIONS = frozenset({"ReduceSum", "ReduceMean"})
#: Maxima and minima over one block of neighbouring axes, grouped as REDUCTIONS are and rebuilt as
#: the same reduction over the reduced groups (Hiera's pooled queries, a max over the 4 tokens of
#: each unit: [1, 2, 49, 4, 16, 96] over axis 3). The NPU has no kernel for them (reductions.py
#: keeps them on the CPU), so a region holding one keeps it there at rank 4 or less, one CPU node
#: where the whole region ran on the CPU: the rules are `fewer_cpu`.
EXTREMA = frozenset({"ReduceMax", "ReduceMin"})
#: The opset from which ReduceMax and ReduceMin take their axes as an input.
EXTREMA_AXES_INPUT_OPSET = 18
#: 3-D convolutions and global pools, of [N, C, D, H, W]: a Conv runs as a 2-D Conv with the depth
#: folded into its channels (conv3d_as_conv2d), a pool over the spatial axes as one 2-D pool.
VOLUME_OPS = frozenset({"Conv", "GlobalAveragePool", "GlobalMaxPool"})
REGION_OPS = (RESHAPE_LIKE | {"Transpose", "Gather"} | BROADCASTS | AXIS_OPS | PRODUCTS | REDUCTIONS | EXTREMA
              | VOLUME_OPS)
#: Most nodes one region may hold; a larger one is left as it is, with this as the reason.
MAX_REGION_NODES = 64
#: Most taps, zeros included, the depth-folded Conv of a 3-D convolution may compute for each tap
#: of the convolution: folding depth D into the channels costs D / kernel depth (R3D-18's layers
#: at 8 frames: 8/3); a clip much longer than its kernel is left as it is.
MAX_DEPTH_FOLD = 8


def collapse_rank_region(node: gs.Node, site: Site) -> Candidates:
    """The region of ops connected through tensors above rank 4 that holds `node`, redone on
    their grouped views (see the module docstring): each relabel becomes one Reshape between
    groupings, each Transpose a Transpose of the groups (on a view the target accepts,
    layout.emit_legal_transpose), each Gather a Gather of one group by rank-1 indices, each
    element-wise op the same op on the groups with its operands relabelled to match, each
    Slice/Split/Concat/Softmax/Pad the same op along the group its axis became. Tensors the
    region hands to other ops are relabelled back to their own shapes, which are 4-D or less.
    The rule is `fewer_cpu`: a ReduceMax or ReduceMin of the region (EXTREMA) stays on the CPU,
    at rank 4 or less, where the whole region would have."""
    return (yield from _collapse(node, site, from_input=False))


def collapse_rank_region_from_input(node: gs.Node, site: Site) -> Candidates:
    """collapse_rank_region for a region that reads a model input above rank 4 (a video clip
    [N, C, T, H, W]): the input's relabel onto its grouped view stays on the CPU, one node in
    place of the region's (the rule is `fewer_cpu`)."""
    return (yield from _collapse(node, site, from_input=True))


def pad_between_unit_axes(node: gs.Node, site: Site) -> Candidates:
    """A Pad above rank 4 between a relabel that only adds unit axes to a tensor x and one that
    only takes unit axes away (paddle2onnx's 2-D padding: Unsqueeze to [N, C, 1, H, W], Pad,
    Squeeze), padding none of the added axes, as the Pad of x itself (the first relabel stays
    for its other readers): the same values, one step. The region's grouping would merge x's
    unit batch into its channels and pad a rank-3 view [C, H, W] between relabels out of x's
    layout and back. Tried from the first relabel too, which the worklist meets first (the
    region rule would take the Pad with it)."""
    if node.op != "Pad":
        node = next((reader for reader in node.outputs[0].outputs if reader.op == "Pad"), None)
        if node is None:
            return "not a relabel a Pad reads"
    into = producer(node.inputs[0])
    y = node.outputs[0]
    out = y.outputs[0] if len(y.outputs) == 1 and y.name not in site.graph_outputs else None
    if into is None or into.op not in RESHAPE_LIKE or out is None or out.op not in RESHAPE_LIKE:
        return "not between a relabel and one relabel that alone reads it"
    x = into.inputs[0]
    shape, source, result = static_shape(node.inputs[0]), static_shape(x), static_shape(out.outputs[0])
    pads = _pads(node, site.opset)
    if None in (shape, source, result, pads) or len(shape) <= NPU_RANK or len(source) > NPU_RANK:
        return "no constant pads of a tensor above rank 4 relabelled from one of rank 4 or less"
    kept = _unit_axes_added(list(source), list(shape))
    rank = len(shape)
    if kept is None or any(pads[axis] or pads[rank + axis] for axis in range(rank) if axis not in kept):
        return "its input relabel does more than add unit axes, or it pads an added one"
    padded = [size + pads[axis] + pads[rank + axis] for axis, size in zip(kept, source)]
    if [size for size in result if size != 1] != [size for size in padded if size != 1]:
        return "its output relabel does more than take unit axes away"
    builder = site.builder(node)
    x_pads = builder.const(np.array([pads[axis] for axis in kept] + [pads[rank + axis] for axis in kept], np.int64),
                           "pads")
    result_tensor = out.outputs[0]
    same = list(padded) == list(result)
    padded_x = builder.op("Pad", [x, x_pads, *node.inputs[2:3]], None if same else padded,
                          None if same else y.dtype, out=result_tensor if same else None, **node.attrs)
    if not same:
        builder.reshape(padded_x, list(result), out=result_tensor)
    only_reader = len(node.inputs[0].outputs) == 1 and node.inputs[0].name not in site.graph_outputs
    yield builder.finish(*((into,) if only_reader else ()), node, out)


def _unit_axes_added(source: list[int], shape: list[int]) -> list[int] | None:
    """For each axis of `source`, the axis of `shape` it is, where `shape` is `source` with unit
    axes added (the first match of each, in order); None when it is not."""
    kept, axis = [], 0
    for size in source:
        while axis < len(shape) and shape[axis] != size:
            if shape[axis] != 1:
                return None
            axis += 1
        if axis == len(shape):
            return None
        kept.append(axis)
        axis += 1
    return kept if all(size == 1 for size in shape[axis:]) else None


def _collapse(node: gs.Node, site: Site, from_input: bool) -> Candidates:
    if not any(len(shape) > NPU_RANK for shape in map(static_shape, _data_tensors(node)) if shape):
        return "no tensor of the node is above rank 4"
    region, reason = _region(node, site, from_input)
    if region is None:
        return reason
    original, scratch = region, []
    try:
        region = _gathers_of_flat_indices(region, site, scratch)
        region = _broadcast_heads_into_rows(_einsums_as_products(region, site, scratch), site, scratch)
        while True:
            groups = _grouping(region, site.opset)
            too_many = next((t for n in region for t in _data_tensors(n) if len(groups[id(t)]) > NPU_RANK), None)
            if too_many is None:
                break
            region = (_select_before_transpose(region, groups, site, scratch)
                      or _transpose_in_steps(region, site, scratch)
                      or _blocks_moved_first(region, site, scratch, too_many))
            if region is None:
                return f"{too_many.name} keeps {len(groups[id(too_many)])} axis groups that move independently: above 4"
        builder = site.builder(node)
        produced = {id(t) for n in region for t in n.outputs}
        readers = {id(n) for n in region + original}
        view: dict[int, gs.Tensor] = {}
        for member in _in_order(region, produced):
            targets = []
            for out in member.outputs:
                grouped = _grouped_shape(static_shape(out), groups[id(out)])
                internal = out.name not in site.graph_outputs and all(id(r) in readers for r in out.outputs)
                targets.append(gs.Variable(site.fresh(f"{out.name}/grouped"), out.dtype, grouped) if internal else out)
            _rebuild(member, builder, groups, view, targets, site.opset)
            view.update((id(out), target) for out, target in zip(member.outputs, targets))
    finally:
        for template in scratch:
            detach(template)
    yield builder.finish(*_in_order(original, {id(t) for n in original for t in n.outputs}))


def _gathers_of_flat_indices(region: list[gs.Node], site: Site, scratch: list[gs.Node]) -> list[gs.Node]:
    """The region with each Gather of indices of rank 2 or more (the dynamo exporter's Unfold:
    the windows' rows of VOLO's outlook attention, indices [3, 14], [1, C, 16, 16] -> [1, C,
    3, 14, 16]) replaced by templates: the Gather of the indices flattened, a Reshape to its
    result. The same values; each Gather then keeps its input's rank, as the groupings read it.
    The templates (in `scratch`) are read, never kept."""
    replaced, templates = set(), []
    for gather in region:
        indices = constant_value(gather.inputs[1]) if gather.op == "Gather" else None
        if indices is None or indices.ndim < 2:
            continue
        x, y = gather.inputs[0], gather.outputs[0]
        shape = list(static_shape(x))
        axis = int(gather.attrs.get("axis", 0)) % len(shape)
        flat = gs.Variable(site.fresh(f"{gather.name}/flat"), x.dtype, shape[:axis] + [indices.size] + shape[axis + 1:])
        templates += [
            gs.Node("Gather", site.fresh(f"{gather.name}/flat"), attrs={"axis": axis}, outputs=[flat], inputs=[
                x, gs.Constant(site.fresh(f"{gather.name}/flat_indices"), indices.reshape(-1).astype(np.int64))]),
            gs.Node("Reshape", site.fresh(f"{gather.name}/unflat"), outputs=[y], inputs=[
                flat, gs.Constant(site.fresh(f"{gather.name}/unflat_shape"), np.array(static_shape(y), np.int64))])]
        replaced.add(id(gather))
    scratch.extend(templates)
    return [n for n in region if id(n) not in replaced] + templates


def _grouping(region: list[gs.Node], opset: int) -> dict[int, list[list[int]]]:
    """Each tensor's axis groups: every boundary starts joinable and each op narrows them, to a
    fixpoint."""
    tensors = {id(t): t for n in region for t in _data_tensors(n)}
    joinable = {key: set(_nonunit(static_shape(t))[:-1]) for key, t in tensors.items()}
    while any([_refine(n, joinable, opset) for n in region]):
        pass
    return {key: _groups(static_shape(t), joinable[key]) for key, t in tensors.items()}


def _select_before_transpose(region: list[gs.Node], groups, site: Site,
                             scratch: list[gs.Node]) -> list[gs.Node] | None:
    """The region with one Transpose whose result keeps over 4 groups, and that is read only by
    Splits, Gathers or one-axis Slices along one of its axes, replaced by templates that select
    first and transpose each piece: selecting along output axis u of a Transpose is selecting
    along input axis perm[u] before it. A piece of size 1 along that axis (torch's unbind of
    q/k/v in windowed attention) has one group fewer. None when no Transpose is of that kind.
    The templates (in `scratch`) are read, never kept: the caller rebuilds them and detaches them."""
    for transpose in (n for n in region if n.op == "Transpose"):
        y = transpose.outputs[0]
        if len(groups[id(y)]) <= NPU_RANK or y.name in site.graph_outputs or not y.outputs:
            continue
        axes = {_selection_axis(reader, y, site.opset) for reader in y.outputs}
        if len(axes) != 1 or None in axes:
            continue
        x, rank = transpose.inputs[0], len(static_shape(y))
        perm = [int(p) for p in transpose.attrs.get("perm", range(rank - 1, -1, -1))]
        axis = perm[axes.pop()]
        templates = []
        for reader in y.outputs:
            pieces = [gs.Variable(site.fresh(f"{reader.name}/piece"), x.dtype,
                                  _selected_shape(reader, static_shape(x), axis, out)) for out in reader.outputs]
            attrs = dict(reader.attrs)
            inputs = [x, *reader.inputs[1:]]
            if reader.op == "Slice":
                inputs = [x, *reader.inputs[1:3], gs.Constant(site.fresh(f"{reader.name}/axes"), np.array([axis], np.int64)),
                          *reader.inputs[4:]]
            else:
                attrs["axis"] = axis
            templates.append(gs.Node(reader.op, site.fresh(f"{reader.name}/first"), attrs=attrs, inputs=inputs,
                                     outputs=pieces))
            for piece, out in zip(pieces, reader.outputs):
                piece_perm = perm if len(static_shape(piece)) == rank else [p - (p > axis) for p in perm if p != axis]
                templates.append(gs.Node("Transpose", site.fresh(f"{reader.name}/then"), attrs={"perm": piece_perm},
                                         inputs=[piece], outputs=[out]))
        scratch.extend(templates)
        replaced = {id(transpose)} | {id(reader) for reader in y.outputs}
        return [n for n in region if id(n) not in replaced] + templates
    return None


#: Most groups a Transpose may move for _transpose_in_steps to search its steps (k! orders),
#: and most groups one step moves.
MAX_STEPPED_GROUPS, STEP_RUNS = 6, 3


def _transpose_in_steps(region: list[gs.Node], site: Site, scratch: list[gs.Node]) -> list[gs.Node] | None:
    """The region with one Transpose that moves over 4 groups of axes replaced by templates that
    move them in the fewest steps of at most 4 groups each (a window partition's
    [C, H/p, p, W/p, p] -> [H/p, W/p, p, p, C] is [H/p, p, W/p, p, C] first), an identity relabel
    between steps so each step's result is read on a grouping of its own. None when no Transpose
    is of that kind."""
    for transpose in (n for n in region if n.op == "Transpose"):
        x, y = transpose.inputs[0], transpose.outputs[0]
        shape = static_shape(x)
        perm = [int(p) for p in transpose.attrs.get("perm", range(len(shape) - 1, -1, -1))]
        runs: list[list[int]] = []
        for axis in (a for a in perm if shape[a] != 1):
            if runs and axis == _next_nonunit(shape, runs[-1][-1]):
                runs[-1].append(axis)
            else:
                runs.append([axis])
        if not NPU_RANK < len(runs) <= MAX_STEPPED_GROUPS:
            continue
        by_input = sorted(runs)
        goal = tuple(by_input.index(run) for run in runs)
        dims = [element_count(shape[a] for a in run) for run in by_input]
        # Else steps of 3 groups: the perm table's 3-group perms have the widest limits and views.
        orders = _two_legal_steps(goal, dims, site, x.dtype) or _fewest_steps(goal, STEP_RUNS)
        units = [a for a in range(len(shape)) if shape[a] == 1]
        layouts = [list(range(len(shape)))]
        layouts += [units + [a for g in order for a in by_input[g]] for order in orders[:-1]]
        layouts.append(perm)
        templates, source = [], x
        for step, (before, after) in enumerate(zip(layouts, layouts[1:])):
            last = step == len(layouts) - 2
            out = y if last else gs.Variable(site.fresh(f"{transpose.name}/step"), x.dtype, [shape[a] for a in after])
            templates.append(gs.Node("Transpose", site.fresh(f"{transpose.name}/step"), inputs=[source], outputs=[out],
                                     attrs={"perm": [before.index(a) for a in after]}))
            if not last:
                source = gs.Variable(site.fresh(f"{transpose.name}/step_view"), x.dtype, static_shape(out))
                shape_const = gs.Constant(site.fresh(f"{transpose.name}/step_shape"), np.array(static_shape(out), np.int64))
                templates.append(gs.Node("Reshape", site.fresh(f"{transpose.name}/step_view"),
                                         inputs=[out, shape_const], outputs=[source]))
        scratch.extend(templates)
        return [n for n in region if n is not transpose] + templates
    return None


def _blocks_moved_first(region: list[gs.Node], site: Site, scratch: list[gs.Node],
                        worst: gs.Tensor) -> list[gs.Node] | None:
    """The region with one Transpose replaced by two, an identity relabel between them: the first
    moves as one each group of its input's axes that the rest of the region merges and its
    result keeps together (in any order within), the second reorders the axes within those
    groups. Hiera's attention has its heads and windows [2, 49] as the batch of its products,
    merged, and the Transpose after them, [2, 49, 16, 96] -> [16, 49, 2, 96], kept the two
    apart: five groups with the query pooling's 4 tokens. Taken only where it leaves `worst` (a
    tensor of over 4 groups) fewer groups; None when no Transpose does."""
    before = len(_grouping(region, site.opset)[id(worst)])
    for transpose in (n for n in region if n.op == "Transpose"):
        x, y = transpose.inputs[0], transpose.outputs[0]
        shape = static_shape(x)
        perm = [int(p) for p in transpose.attrs.get("perm", range(len(shape) - 1, -1, -1))]
        moved = [a for a in perm if shape[a] != 1]
        others = [n for n in region if n is not transpose]
        blocks = [[a for a in group if shape[a] != 1] for group in _grouping(others, site.opset).get(id(x), [])]
        blocks = [block for block in blocks if block]
        places = [sorted(moved.index(a) for a in block) for block in blocks]
        if sum(map(len, blocks)) != len(moved) or any(p != list(range(p[0], p[0] + len(p))) for p in places):
            continue   # x is not read elsewhere in the region, or a group is not kept together
        blocks.sort(key=lambda block: min(moved.index(a) for a in block))
        middle = [a for a in range(len(shape)) if shape[a] == 1] + [a for block in blocks for a in block]
        if [a for a in middle if shape[a] != 1] in (_nonunit(shape), moved):
            continue   # one of the two steps would move nothing
        step_shape = [shape[a] for a in middle]
        step = gs.Variable(site.fresh(f"{transpose.name}/blocks"), x.dtype, step_shape)
        view = gs.Variable(site.fresh(f"{transpose.name}/blocks_view"), x.dtype, step_shape)
        view_shape = gs.Constant(site.fresh(f"{transpose.name}/blocks_shape"), np.array(step_shape, np.int64))
        templates = [
            gs.Node("Transpose", site.fresh(f"{transpose.name}/blocks"), inputs=[x], outputs=[step],
                    attrs={"perm": middle}),
            gs.Node("Reshape", site.fresh(f"{transpose.name}/blocks_view"), inputs=[step, view_shape], outputs=[view]),
            gs.Node("Transpose", site.fresh(f"{transpose.name}/within"), inputs=[view], outputs=[y],
                    attrs={"perm": [middle.index(a) for a in perm]})]
        candidate = [n for n in region if n is not transpose] + templates
        if len(_grouping(candidate, site.opset)[id(worst)]) < before:
            scratch.extend(templates)
            return candidate
        for template in templates:
            detach(template)
    return None


#: Most groups _two_legal_steps searches the orders of (k! middle orders, each probed).
MAX_SEARCHED_GROUPS = 5


def _two_legal_steps(goal: tuple[int, ...], dims: list[int], site: Site, dtype) -> tuple[tuple[int, ...], ...] | None:
    """A middle order of groups 0..k-1 (of sizes `dims`) from which the move from (0, ..., k-1)
    to `goal` is two Transposes the target accepts whole, each on a 4-D view (a window
    partition's five groups with windows of 7 move in two steps where steps of 3 groups,
    judged without the target, take three: the perm table's limits, multiples of 8 among them,
    rule out some steps and admit some of 4 groups); None when there is none or k is over
    MAX_SEARCHED_GROUPS."""
    start = tuple(range(len(goal)))
    if len(goal) > MAX_SEARCHED_GROUPS:
        return None
    for middle in itertools.permutations(start):
        if middle in (start, goal):
            continue
        if (legal_whole(site, dims, middle, dtype)
                and legal_whole(site, [dims[g] for g in middle], [middle.index(g) for g in goal], dtype)):
            return middle, goal
    return None


@functools.lru_cache(maxsize=256)
def _fewest_steps(goal: tuple[int, ...], most_runs: int) -> tuple[tuple[int, ...], ...]:
    """The orders of groups 0..k-1 reached step by step from (0, ..., k-1) to `goal`, each step
    moving at most `most_runs` runs of neighbouring groups (a breadth-first search over the k!
    orders; with 2 runs or more every order is reached: a block move is a step). Remembered:
    each search scans the k! orders per order reached, and a model's windowed-attention blocks
    ask for the same few goals (tv_maxvit_t: 36 asks, 0.24 s)."""
    start = tuple(range(len(goal)))
    orders = list(itertools.permutations(start))
    came_from = {start: None}
    frontier = [start]
    while goal not in came_from:
        following = []
        for order in frontier:
            where = {g: i for i, g in enumerate(order)}
            for candidate in orders:
                if candidate in came_from:
                    continue
                positions = [where[g] for g in candidate]
                if sum(b != a + 1 for a, b in zip(positions, positions[1:])) < most_runs:
                    came_from[candidate] = order
                    following.append(candidate)
        frontier = following
    path = [goal]
    while came_from[path[-1]] != start:
        path.append(came_from[path[-1]])
    return tuple(path[::-1])


def _selection_axis(reader: gs.Node, y: gs.Tensor, opset: int) -> int | None:
    """The one axis of `y` along which `reader` picks part of it, if it is a Split, a Gather or a
    one-axis Slice of `y`."""
    if reader.inputs[0] is not y or reader.op not in SELECTIONS or _unsupported(reader, opset):
        return None
    if reader.op == "Gather":
        return int(reader.attrs.get("axis", 0)) % len(static_shape(y))
    axes = _op_axes(reader, opset)
    return axes[0] if len(axes) == 1 else None


def _selected_shape(reader: gs.Node, x_shape, axis: int, out: gs.Tensor) -> list[int]:
    """The shape of what `reader`, moved before the Transpose to pick along `axis` of its input,
    makes in place of `out`."""
    shape = list(x_shape)
    if reader.op == "Gather" and constant_value(reader.inputs[1]).ndim == 0:
        return shape[:axis] + shape[axis + 1:]
    out_axis = _selection_axis(reader, reader.inputs[0], 13 if reader.op != "Slice" else 10)
    shape[axis] = static_shape(out)[out_axis]
    return shape


def _data_tensors(node: gs.Node) -> list[gs.Tensor]:
    """The tensors whose layout the node's op depends on: a relabel's data, not its shape input."""
    inputs = node.inputs[:1] if node.op in RESHAPE_LIKE | REDUCTIONS | EXTREMA | VOLUME_OPS | {
        "Gather", "Slice", "Split", "Expand", "Pad"} else node.inputs
    return [t for t in list(inputs) + list(node.outputs) if t.name]


def _region(node: gs.Node, site: Site, from_input: bool = False) -> tuple[list[gs.Node] | None, str]:
    """The nodes connected to `node` through tensors above rank 4, or why they cannot be redone:
    a model output above rank 4 always stops it, a model input unless `from_input`, which
    also needs one."""
    region, seen, reads_input = [node], {id(node)}, False
    for member in region:
        problem = _unsupported(member, site.opset)
        if problem:
            return None, f"{member.name} ({member.op}) in its rank > 4 region: {problem}"
        for tensor in _data_tensors(member):
            if len(static_shape(tensor)) <= NPU_RANK or isinstance(tensor, gs.Constant):
                continue
            if not tensor.inputs and from_input and tensor.name not in site.graph_outputs:
                reads_input = True
            elif tensor.name in site.graph_outputs or not tensor.inputs:
                return None, f"{tensor.name}, a model input or output, is above rank 4"
            for other in list(tensor.inputs) + list(tensor.outputs):
                if id(other) not in seen:
                    seen.add(id(other))
                    region.append(other)
        if len(region) > MAX_REGION_NODES:
            return None, f"its rank > 4 region holds over {MAX_REGION_NODES} nodes"
    if from_input and not reads_input:
        return None, "its rank > 4 region reads no model input above rank 4"
    return region, ""


def _unsupported(node: gs.Node, opset: int) -> str:
    if node.op not in REGION_OPS:
        return f"{node.op} has no form on merged axes here"
    if any(static_shape(t) is None for t in _data_tensors(node)):
        return "a shape is unknown"
    if node.op in PRODUCTS:
        product = _batched_product(node) is not None or _row_broadcast(node) is not None
        if product or _linear_layer(node) or (node.op == "Einsum" and not isinstance(einsum_as_matmul_form(node), str)):
            return ""
        return ("not a product of operands of one rank whose batch axes lead, in order, of equal sizes (or broadcast "
                "over heads into its one row), a linear layer on the last axis, nor an Einsum one MatMul makes")
    if node.op in AXIS_OPS:
        axes = _op_axes(node, opset)
        if axes is None:
            return "its axes are not constants (or Softmax before opset 13 reduces a flattened tail)"
        if any(static_shape(node.inputs[0])[a] == 1 for a in axes) and node.op != "Concat":
            return "it works along an axis of size 1"
        return ""
    if node.op in VOLUME_OPS:
        return _volume_problem(node)
    if node.op in REDUCTIONS | EXTREMA:
        axes = _reduced_axes(node, opset)
        if not axes or dtype_name(node.inputs[0].dtype) not in FLOAT_DTYPES:
            return "its axes are not constants, it reduces every axis, or its input is not float"
        if any(static_shape(node.inputs[0])[a] == 1 for a in axes):
            return "it reduces an axis of size 1"
        return "" if axes == list(range(axes[0], axes[-1] + 1)) else "its axes are not one block of neighbours"
    if len(node.outputs) != 1:
        return "it has several outputs"
    if node.op == "Gather":
        shape, indices = static_shape(node.inputs[0]), constant_value(node.inputs[1])
        if indices is None:
            return "its indices are not a constant"
        if shape[int(node.attrs.get("axis", 0)) % len(shape)] == 1:
            return "it gathers along an axis of size 1"
    if node.op in BROADCASTS and any(len(static_shape(t)) > len(static_shape(node.outputs[0]))
                                     for t in _operands(node)):
        return "an operand has a higher rank than the result"
    return ""


def _nonunit(shape) -> list[int]:
    return [axis for axis, dim in enumerate(shape) if dim != 1]


def _next_nonunit(shape, axis: int) -> int | None:
    return next((a for a in range(axis + 1, len(shape)) if shape[a] != 1), None)


def _op_axes(node: gs.Node, opset: int) -> list[int] | None:
    """The axes an AXIS_OPS node works along, None when they are not known constants."""
    rank = len(static_shape(node.inputs[0]))
    if node.op in ("Softmax", "LogSoftmax"):
        return [int(node.attrs.get("axis", -1)) % rank] if opset >= 13 else None
    if node.op in ("Concat", "Split"):
        return [int(node.attrs.get("axis", 0)) % rank]
    if node.op == "Pad":  # the axes it pads (paddle2onnx's pad3d of a 4-D map on a 5-D view)
        pads = _pads(node, opset)
        return None if pads is None else [a for a in range(rank) if pads[a] or pads[a + rank]]
    if opset < 10:
        return None
    bounds = [constant_value(t) if t.name else None for t in node.inputs[1:]]
    if any(value is None for value in bounds[:2]) or any(
            t.name and value is None for t, value in zip(node.inputs[3:], bounds[2:])):
        return None
    axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else np.arange(len(bounds[0]))
    return [int(a) % rank for a in axes]


def _volume_problem(node: gs.Node) -> str:
    """Why a VOLUME_OPS node has no form in a region ("" when it has)."""
    shape = static_shape(node.inputs[0])
    if len(shape) != 5:
        return f"a {node.op} of rank {len(shape)}, not of [N, C, D, H, W]"
    if node.op != "Conv":
        return ""
    weight = constant_value(node.inputs[1])
    has_bias = len(node.inputs) > 2 and node.inputs[2].name
    if weight is None or (has_bias and constant_value(node.inputs[2]) is None):
        return "its weights or bias are not constant"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad is set"
    if shape[2] > MAX_DEPTH_FOLD * weight.shape[2]:
        return f"depth {shape[2]} folded into channels computes {shape[2]}/{weight.shape[2]} of its taps, over {MAX_DEPTH_FOLD}"
    return ""


def _reduced_axes(node: gs.Node, opset: int) -> list[int] | None:
    """The axes a REDUCTIONS or EXTREMA node reduces (from its attribute, or its axes input from
    opset 13 for ReduceSum and 18 for the others), None when they are not a known constant."""
    rank = len(static_shape(node.inputs[0]))
    if len(node.inputs) > 1 and node.inputs[1].name:
        axes = constant_value(node.inputs[1])
    else:
        axes = node.attrs.get("axes")
    return None if axes is None else sorted({int(a) % rank for a in np.ravel(axes)})


def _pads(node: gs.Node, opset: int) -> list[int] | None:
    """A Pad's constant pads (begins then ends, every axis), None in the attribute form (opset
    < 11), with an `axes` input or with computed pads."""
    if opset < 11 or (len(node.inputs) > 3 and node.inputs[3].name):
        return None
    pads = constant_value(node.inputs[1])
    return None if pads is None else [int(p) for p in pads.reshape(-1)]


def _refine(node: gs.Node, joinable: dict[int, set[int]], opset: int) -> bool:
    """Narrow the joinable boundaries of `node`'s tensors to what its op allows; True on a change."""
    if node.op == "Transpose":
        shape = static_shape(node.inputs[0])
        perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
        return _link(node.inputs[0], node.outputs[0], perm, joinable)
    if node.op == "Gather":
        return _refine_axis_op(node, joinable, [int(node.attrs.get("axis", 0)) % len(static_shape(node.inputs[0]))])
    if node.op in BROADCASTS:
        return _refine_elementwise(node, joinable)
    if node.op in AXIS_OPS:
        return _refine_axis_op(node, joinable, _op_axes(node, opset))
    if node.op in VOLUME_OPS:  # a Conv merges channels with depth alone; a pool keeps channels apart
        changed = False
        for tensor in _data_tensors(node):
            shape, join = static_shape(tensor), joinable[id(tensor)]
            keep = {1} if node.op == "Conv" and shape[1] != 1 and shape[2] != 1 else set(range(2, len(shape)))
            changed |= bool(join - keep)
            join &= keep
        return changed
    if node.op in REDUCTIONS | EXTREMA:
        axes, rank = _reduced_axes(node, opset), len(static_shape(node.inputs[0]))
        kept = list(range(rank)) if node.attrs.get("keepdims", 1) else [a for a in range(rank) if a not in axes]
        changed = False
        for axis in axes:
            shape, join = static_shape(node.inputs[0]), joinable[id(node.inputs[0])]
            previous = max((a for a in _nonunit(shape) if a < axis), default=None)
            for cut in (previous, axis):
                if cut in join:
                    join.discard(cut)
                    changed = True
        return changed | _link(node.inputs[0], node.outputs[0], kept, joinable)
    if node.op in PRODUCTS and _linear_layer(node):
        rows = len(static_shape(node.outputs[0])) - 1
        return _link(node.inputs[0], node.outputs[0], list(range(rows)) + [None], joinable)
    if node.op in PRODUCTS:
        batch = len(static_shape(node.outputs[0])) - 2
        out_to_in = list(range(batch)) + [None, None]
        return (_link(node.inputs[0], node.outputs[0], out_to_in, joinable)
                | _link(node.inputs[1], node.outputs[0], out_to_in, joinable))
    return False  # a relabel: any grouping on either side


def _row_broadcast(node: gs.Node) -> int | None:
    """The batch axis of a MatMul A @ B of operands of one rank whose batch axes are equal but
    that one, where B has size 1 and A's matrix has one row: a lambda layer's position lambdas,
    [1, heads, L, 1, k] @ [1, 1, L, k, v]. None for any other node."""
    if node.op != "MatMul" or len(node.inputs) != 2:
        return None
    a, b, y = (static_shape(t) for t in (*node.inputs, node.outputs[0]))
    if not len(a) == len(b) == len(y) >= 3 or a[-2] != 1:
        return None
    differing = [axis for axis in range(len(a) - 2) if a[axis] != b[axis]]
    if len(differing) != 1 or b[differing[0]] != 1 or y[differing[0]] != a[differing[0]]:
        return None
    return differing[0]


def _einsums_as_products(region: list[gs.Node], site: Site, scratch: list[gs.Node]) -> list[gs.Node]:
    """The region with each Einsum that `_batched_product` does not take as it stands replaced
    by templates of its MatMul form (matmul_as_conv.einsum_as_matmul_nodes): each operand's
    Transpose and relabel to [B, M, K] or [B, K, N] (a constant one moved at once), their MatMul,
    its relabel to each letter's own axis and the Transpose to the output's order, which the
    region's grouping then takes like any other ops. The templates (in `scratch`) are read,
    never kept, as `_select_before_transpose`'s."""
    for einsum in [n for n in region if n.op == "Einsum" and _batched_product(n) is None]:
        builder = site.builder(einsum)
        einsum_as_matmul_nodes(builder, einsum, einsum_as_matmul_form(einsum))
        scratch.extend(builder.nodes)
        region = [n for n in region if n is not einsum] + builder.nodes
    return region


def _broadcast_heads_into_rows(region: list[gs.Node], site: Site, scratch: list[gs.Node]) -> list[gs.Node]:
    """The region with each MatMul of one broadcast batch axis (`_row_broadcast`) replaced by
    templates that move that axis into A's one row and back: a Transpose of A, a MatMul whose
    batch axes are equal, and a Transpose of its result (the same numbers: each row of the
    product is its own row of A times B). The templates (in `scratch`) are read, never kept,
    as `_select_before_transpose`'s."""
    for product in [n for n in region if n.op == "MatMul"]:
        axis = _row_broadcast(product)
        if axis is None:
            continue
        (a, b), y = product.inputs, product.outputs[0]
        rank = len(static_shape(y))
        perm = list(range(rank))
        perm[axis], perm[rank - 2] = rank - 2, axis
        moved_a = gs.Variable(site.fresh(f"{a.name}/rows"), a.dtype, [static_shape(a)[p] for p in perm])
        moved_y = gs.Variable(site.fresh(f"{y.name}/rows"), y.dtype, [static_shape(y)[p] for p in perm])
        templates = [gs.Node("Transpose", site.fresh(f"{product.name}/into_rows"), attrs={"perm": perm}, inputs=[a],
                             outputs=[moved_a]),
                     gs.Node("MatMul", site.fresh(f"{product.name}/rows"), inputs=[moved_a, b], outputs=[moved_y]),
                     gs.Node("Transpose", site.fresh(f"{product.name}/from_rows"), attrs={"perm": perm},
                             inputs=[moved_y], outputs=[y])]
        scratch.extend(templates)
        region = [n for n in region if n is not product] + templates
    return region


def _linear_layer(node: gs.Node) -> bool:
    """A MatMul of a computed operand above rank 2 by a 2-D constant, the result of its rank."""
    if node.op != "MatMul" or len(node.inputs) != 2 or not isinstance(node.inputs[1], gs.Constant):
        return False
    x, w, y = (static_shape(t) for t in (*node.inputs, node.outputs[0]))
    return len(w) == 2 and len(x) == len(y) > 2 and not isinstance(node.inputs[0], gs.Constant)


def _batched_product(node: gs.Node) -> tuple[bool, bool] | None:
    """(A transposed, B transposed) when `node` is A @ B over leading batch axes of equal sizes:
    a MatMul of two operands of one rank, or an Einsum such as 'bgid,bgjd->bgij' (batch letters
    leading in order everywhere, one free letter per operand, one contracted); else None."""
    a, b, y = (static_shape(t) for t in (*node.inputs[:2], node.outputs[0]))
    if len(node.inputs) != 2 or not len(a) == len(b) == len(y) >= 3 or a[:-2] != b[:-2] or a[:-2] != y[:-2]:
        return None
    if node.op == "MatMul":
        return False, False
    equation = node.attrs.get("equation", "")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "..." in equation or equation.count(",") != 1 or "->" not in equation:
        return None
    inputs, out = equation.split("->")
    lhs, rhs = inputs.split(",")
    batch = out[:-2]
    if lhs[:-2] != batch or rhs[:-2] != batch or len(set(lhs + rhs)) != len(batch) + 3:
        return None
    free_a, free_b = out[-2:]
    contracted = set(lhs[-2:]) & set(rhs[-2:])
    if len(contracted) != 1 or set(lhs[-2:]) != {free_a, *contracted} or set(rhs[-2:]) != {free_b, *contracted}:
        return None
    return lhs[-2] != free_a, rhs[-1] != free_b


def _refine_axis_op(node: gs.Node, joinable: dict[int, set[int]], axes: list[int]) -> bool:
    """Each axis the op works along is a group of its own; for Concat and Softmax in every
    tensor, whose other axes merge alike (they keep their sizes). What a selection (Split,
    Slice, Gather) picks is relabelled into a grouping of its own after the op, so only its
    input is narrowed."""
    reference = node.outputs[0] if node.op == "Concat" else node.inputs[0]
    changed = False
    for tensor in _data_tensors(node) if node.op not in SELECTIONS else [reference]:
        shape, join = static_shape(tensor), joinable[id(tensor)]
        for axis in axes:
            previous = max((a for a in _nonunit(shape) if a < axis), default=None)
            for cut in (previous, axis):
                if cut in join:
                    join.discard(cut)
                    changed = True
        if tensor is not reference:
            changed |= _link(tensor, reference, list(range(len(shape))), joinable)
    return changed


def _link(x: gs.Tensor, y: gs.Tensor, out_to_in: list[int | None], joinable: dict[int, set[int]]) -> bool:
    """Axes of `y` are those of `x` (out_to_in[u] is y's axis u in x, None for a new axis): two
    neighbouring axes merge on one side only if they are neighbours, in order, merged on the other."""
    x_shape, y_shape = static_shape(x), static_shape(y)
    in_to_out = {i: u for u, i in enumerate(out_to_in) if i is not None}
    x_join, y_join = joinable[id(x)], joinable[id(y)]
    before = len(x_join) + len(y_join)
    for i in list(x_join):
        u, v = in_to_out.get(i), in_to_out.get(_next_nonunit(x_shape, i))
        if u is None or v is None or _next_nonunit(y_shape, u) != v or u not in y_join:
            x_join.discard(i)
    for u in list(y_join):
        i, j = out_to_in[u], out_to_in[_next_nonunit(y_shape, u)]
        if i is None or j is None or _next_nonunit(x_shape, i) != j or i not in x_join:
            y_join.discard(u)
    return len(x_join) + len(y_join) != before


def _operands(node: gs.Node) -> list[gs.Tensor]:
    """What a broadcasting op broadcasts: Expand's data, an element-wise op's present inputs."""
    return node.inputs[:1] if node.op == "Expand" else [t for t in node.inputs if t.name]


def _refine_elementwise(node: gs.Node, joinable: dict[int, set[int]]) -> bool:
    """Operands of the result's own shape share its grouping; two axes of the result merge only
    if every broadcasting operand broadcasts along both or neither."""
    y = node.outputs[0]
    y_shape = static_shape(y)
    changed = False
    for operand in _operands(node):
        shape = static_shape(operand)
        if list(shape) == list(y_shape):
            if not isinstance(operand, gs.Constant):
                changed |= _link(operand, y, list(range(len(shape))), joinable)
            continue
        aligned = [1] * (len(y_shape) - len(shape)) + list(shape)
        for u in list(joinable[id(y)]):
            if (aligned[u] == 1) != (aligned[_next_nonunit(y_shape, u)] == 1):
                joinable[id(y)].discard(u)
                changed = True
    return changed


def _groups(shape, joinable: set[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for axis in _nonunit(shape):
        if groups and groups[-1][-1] in joinable:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    return groups


def _grouped_shape(shape, groups: list[list[int]]) -> list[int]:
    return [element_count(shape[a] for a in group) for group in groups] or [1]


def _in_order(region: list[gs.Node], produced: set[int]) -> list[gs.Node]:
    """The region's nodes, each after the region nodes it reads."""
    done: set[int] = set()
    ordered: list[gs.Node] = []
    pending = list(region)
    while pending:
        ready = [n for n in pending if all(id(t) not in produced or id(t) in done for t in n.inputs)]
        for member in ready:
            ordered.append(member)
            done.update(id(t) for t in member.outputs)
        # by identity: onnx-graphsurgeon's Node.__eq__ compares attributes, inputs and outputs
        placed = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in placed]
    return ordered


def _rebuild(node: gs.Node, builder: Builder, groups: dict[int, list[list[int]]],
             view: dict[int, gs.Tensor], targets: list[gs.Tensor], opset: int) -> None:
    """`node` on grouped views, writing `targets` (relabelled into each when its shape differs)."""
    x, y, target = node.inputs[0], node.outputs[0], targets[0]

    def grouped(tensor: gs.Tensor, shape) -> gs.Tensor:
        have = view.get(id(tensor), tensor)
        return have if list(static_shape(have)) == list(shape) else builder.reshape(have, shape)

    def emit(op: str, inputs: list, shape, **attrs) -> None:
        if list(shape) == list(static_shape(target)):
            builder.op(op, inputs, out=target, **attrs)
        else:
            builder.reshape(builder.op(op, inputs, shape, y.dtype, **attrs), static_shape(target), out=target)

    if node.op in RESHAPE_LIKE:
        builder.reshape(view.get(id(x), x), static_shape(target), out=target)
        return
    if node.op in AXIS_OPS:
        _rebuild_axis_op(node, builder, groups, grouped, targets, _op_axes(node, opset))
        return
    if node.op in PRODUCTS and _linear_layer(node):
        x_shape, y_shape = static_shape(x), static_shape(y)
        emit("MatMul", [grouped(x, _grouped_shape(x_shape, groups[id(x)])), node.inputs[1]],
             _grouped_shape(y_shape, groups[id(y)]))
        return
    if node.op in PRODUCTS:
        y_shape = static_shape(y)
        batch = [element_count(y_shape[a] for a in group) for group in groups[id(y)] if group[-1] < len(y_shape) - 2]
        matrices = []
        for operand, transposed in zip(node.inputs, _batched_product(node)):
            rows, columns = static_shape(operand)[-2:]
            matrix = grouped(operand, batch + [rows, columns])
            if transposed:
                swap = list(range(len(batch))) + [len(batch) + 1, len(batch)]
                swapped = gs.Variable(builder.site.fresh(f"{operand.name}/swapped"), operand.dtype,
                                      batch + [columns, rows])
                if not emit_legal_transpose(builder, matrix, swap, swapped):
                    builder.op("Transpose", [matrix], out=swapped, perm=swap)
                matrix = swapped
            matrices.append(matrix)
        emit("MatMul", matrices, batch + list(y_shape[-2:]))
        return
    shape = static_shape(x)
    if node.op == "Conv":
        _conv3d_as_conv2d(node, builder, grouped(x, [shape[0], shape[1] * shape[2], *shape[3:]]), emit)
        return
    if node.op in VOLUME_OPS:  # the pool over the spatial axes, at most two of them left apart
        spatial = [size for size in shape[2:] if size != 1] or [1]
        plane = [element_count(spatial[:-1]), spatial[-1]]
        emit(node.op, [grouped(x, [*shape[:2], *plane])], [*shape[:2], 1, 1])
        return
    source = grouped(x, _grouped_shape(shape, groups[id(x)]))
    if node.op in REDUCTIONS | EXTREMA:
        reduced = sorted({g for g, group in enumerate(groups[id(x)]) for a in _reduced_axes(node, opset) if a in group})
        if node.op in EXTREMA:   # the same reduction over the reduced groups, keeping them
            kept = [1 if g in reduced else size for g, size in enumerate(static_shape(source))]
            if opset >= EXTREMA_AXES_INPUT_OPSET:
                emit(node.op, [source, builder.const(np.array(reduced, np.int64), "axes")], kept, keepdims=1)
            else:
                emit(node.op, [source], kept, axes=reduced, keepdims=1)
            return
        # the channel sum of a 1x1 Conv over the reduced groups, one block
        summed = block_reduction_as_conv(builder, source, static_shape(source), reduced[0], len(reduced), node.op)
        builder.reshape(summed, static_shape(target), out=target)
        return
    if node.op == "Transpose":
        perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
        in_groups = groups[id(x)]
        group_perm = [next(g for g, group in enumerate(in_groups) if perm[out[0]] in group)
                      for out in groups[id(y)]]
        if not emit_legal_transpose(builder, source, group_perm, target):
            emit("Transpose", [source], [static_shape(source)[p] for p in group_perm], perm=group_perm)
        return
    if node.op == "Gather":
        axis = int(node.attrs.get("axis", 0)) % len(shape)
        group_axis = next(g for g, group in enumerate(groups[id(x)]) if axis in group)
        indices = constant_value(node.inputs[1]).reshape(-1)
        picked = list(static_shape(source))
        picked[group_axis] = indices.size
        emit("Gather", [source, builder.const(indices, "indices")], picked, axis=group_axis)
        return
    y_shape = static_shape(y)
    out_groups, constants_full = _elementwise_groups(node, groups[id(y)], builder.site)

    def on_groups(shape) -> list[int]:
        aligned = [1] * (len(y_shape) - len(shape)) + list(shape)
        return [element_count(aligned[a] for a in group) for group in out_groups] or [1]

    operands = []
    for operand in node.inputs if node.op != "Expand" else node.inputs[:1]:
        if not operand.name:
            operands.append(operand)
            continue
        value = constant_value(operand)
        if constants_full and _broadcast_constant(operand, y_shape):
            aligned = value.reshape([1] * (len(y_shape) - value.ndim) + list(value.shape))
            value = np.ascontiguousarray(np.broadcast_to(aligned, y_shape))
        wanted = on_groups(static_shape(operand) if value is None else value.shape)
        if value is None:
            operands.append(grouped(operand, wanted))
        elif value.size == 1 and value.ndim <= 1:
            operands.append(operand)
        else:
            operands.append(builder.const(value.reshape(wanted), "grouped"))
    if node.op == "Expand":
        operands.append(builder.const(np.array(_grouped_shape(y_shape, out_groups), np.int64), "shape"))
    emit(node.op, operands, _grouped_shape(y_shape, out_groups), **node.attrs)


def _conv3d_as_conv2d(node: gs.Node, builder: Builder, flat: gs.Tensor, emit) -> None:
    """A 3-D Conv ([N, C, D, H, W] by a [Cout, C/g, kd, kh, kw] kernel) as a 2-D Conv of its input
    read as [N, C*D, H, W] (`flat`: depth is the fastest part of the merged channel), writing
    [N, Cout*Do, Ho, Wo]: output channel (o, do) takes input channel (c, di) through the kernel's
    depth tap (di - do*stride + pad) / dilation where that is a whole tap inside the kernel, and
    zero elsewhere (a tap in the depth padding reads nothing, as the zero pad gives nothing); the
    bias repeats over Do. Groups keep their channels contiguous, so the group is the same.
    Exact; it computes D / kd times the convolution's taps, zeros included (MAX_DEPTH_FOLD).
    rknn-toolkit2 runs torchvision's r3d_18 all on the NPU."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = static_shape(x), static_shape(y)
    weight = constant_value(node.inputs[1])
    depth, (out_channels, out_depth), kd = in_shape[2], out_shape[1:3], weight.shape[2]
    strides, dilations = list(node.attrs.get("strides", [1] * 3)), list(node.attrs.get("dilations", [1] * 3))
    pads, group = list(node.attrs.get("pads", [0] * 6)), int(node.attrs.get("group", 1))
    folded = np.zeros((out_channels, out_depth, weight.shape[1], depth, *weight.shape[3:]), dtype=weight.dtype)
    for do in range(out_depth):
        for di in range(depth):
            tap, off = divmod(di - do * strides[0] + pads[0], dilations[0])
            if not off and 0 <= tap < kd:
                folded[:, do, :, di] = weight[:, :, tap]
    inputs = [flat, builder.const(folded.reshape(out_channels * out_depth, -1, *weight.shape[3:]), "weight")]
    if len(node.inputs) > 2 and node.inputs[2].name:
        inputs.append(builder.const(np.repeat(constant_value(node.inputs[2]), out_depth), "bias"))
    emit("Conv", inputs, [out_shape[0], out_channels * out_depth, *out_shape[3:]], kernel_shape=list(weight.shape[3:]),
         strides=strides[1:], dilations=dilations[1:], pads=pads[1:3] + pads[4:6], group=group)


def _elementwise_groups(node: gs.Node, linked: list[list[int]], site: Site) -> tuple[list[list[int]], bool]:
    """The groups an element-wise op runs on, and whether its constant operands are stored at
    the result's size: the groups its result shares with the region when the target accepts the
    op on them; else those groups with every constant stored broadcast, as broadcast_by_concat
    stores one (a bias [1, H, I, J] added to [G, H, I, J] over the G windows of windowed
    attention: the relabels to and from the fewer groups below, two steps that each read and
    write the result, are not needed, and the Add stays where the attention pattern reaches it;
    the weights grow by the result's size unless a kernel that broadcasts the constant itself
    takes it in, fuse.store_smallest); else the fewest its own broadcasts allow (a bias
    [H, I, J] added to [G, H, I, J] is [1, H*I*J] added to [G, H*I*J], a broadcast the NPU's
    Expand patterns cover where [1, H, I, J] is not), each operand relabelled to it."""
    y_shape = static_shape(node.outputs[0])
    joinable = set(_nonunit(y_shape)[:-1])
    for operand in _operands(node):
        shape = static_shape(operand)
        aligned = [1] * (len(y_shape) - len(shape)) + list(shape)
        joinable = {u for u in joinable if (aligned[u] == 1) == (aligned[_next_nonunit(y_shape, u)] == 1)}
    own = _groups(y_shape, joinable)
    broadcast_constant = node.op != "Expand" and any(_broadcast_constant(t, y_shape) for t in _operands(node))
    choices = [(linked, False)] + ([(linked, True)] if broadcast_constant else []) + [(own, False)]
    for candidate, constants_full in choices:
        if len(candidate) > NPU_RANK:
            continue
        inputs = []
        for operand in node.inputs if node.op != "Expand" else node.inputs[:1]:
            shape = static_shape(operand) if operand.name else None
            if constants_full and _broadcast_constant(operand, y_shape):
                shape = y_shape
            aligned = None if shape is None else [1] * (len(y_shape) - len(shape)) + list(shape)
            view = None if aligned is None else [element_count(aligned[a] for a in g) for g in candidate] or [1]
            inputs.append(operand if view is None else gs.Variable("probe_in", operand.dtype, view))
        if node.op == "Expand":
            inputs.append(gs.Constant("probe_shape", np.array(_grouped_shape(y_shape, candidate), np.int64)))
        probe = gs.Node(node.op, attrs=dict(node.attrs), inputs=inputs,
                        outputs=[gs.Variable("probe_out", node.outputs[0].dtype, _grouped_shape(y_shape, candidate))])
        legal = not check_node(probe, site.target, **site.facts)
        detach(probe)
        if legal:
            return candidate, constants_full
    return linked, False


def _broadcast_constant(operand: gs.Tensor, y_shape) -> bool:
    """`operand` is a constant of several values that broadcasts to the result's shape."""
    value = constant_value(operand) if operand.name else None
    return value is not None and 1 < value.size < element_count(y_shape)


def _rebuild_axis_op(node: gs.Node, builder: Builder, groups: dict[int, list[list[int]]], grouped,
                     targets: list[gs.Tensor], axes: list[int]) -> None:
    """A Slice/Split/Concat/Softmax/Pad along the groups its axes became: every tensor is viewed on
    the groups of the op's full-sized tensor (Concat's output, the others' input)."""
    reference = node.outputs[0] if node.op == "Concat" else node.inputs[0]
    reference_groups = groups[id(reference)]
    # Three groups [N, C, H] are stored as [N, C, H, 1], C in blocks of C2 channels: a selection
    # or join along C when C is under one block stores each tensor's C padded to the block
    # (Hiera's q, k and v cut from [3136, 3, 192]: 8/3 of the bytes, each piece 8x). Along H of
    # [1, N, C, H] instead, N is the channels: every group one axis later.
    lifted = 0
    if node.op in SELECTIONS_AND_JOINS and len(reference_groups) == 3 and axes[0] in reference_groups[1]:
        channels = element_count(static_shape(reference)[a] for a in reference_groups[1])
        lifted = int(channels < builder.site.target.c2_for(builder.site.facts.get("plan_dtype", "float16")))

    def on_groups(tensor: gs.Tensor) -> list[int]:
        shape = static_shape(tensor)
        return [1] * lifted + [element_count(shape[a] for a in group) for group in reference_groups] or [1]

    def group_of(axis: int) -> int:
        return lifted + next(g for g, group in enumerate(reference_groups) if axis in group)

    data_inputs = node.inputs if node.op == "Concat" else node.inputs[:1]
    inputs = [grouped(t, on_groups(t)) for t in data_inputs]
    attrs = dict(node.attrs)
    if node.op == "Slice":
        starts, ends = (constant_value(t) for t in node.inputs[1:3])
        steps = constant_value(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else None
        new_axes = np.array([group_of(a) for a in axes], np.int64)
        inputs += [builder.const(starts, "starts"), builder.const(ends, "ends"), builder.const(new_axes, "axes")]
        if steps is not None:
            inputs.append(builder.const(steps, "steps"))
    elif node.op == "Pad":  # a padded axis is a group of its own (_refine_axis_op)
        pads, rank = _pads(node, builder.site.opset), len(static_shape(node.inputs[0]))
        on_group = [[sum(pads[a + side] for a in group) for group in reference_groups] for side in (0, rank)]
        inputs += [builder.const(np.array(on_group[0] + on_group[1], np.int64), "pads"),
                   *[t for t in node.inputs[2:3] if t.name]]
    else:
        attrs["axis"] = group_of(axes[0])
        inputs += list(node.inputs[1:]) if node.op == "Split" else []
    outs = [target if on_groups(y) == list(static_shape(target)) else
            gs.Variable(builder.site.fresh(f"{builder.node.name}/{node.op.lower()}_out"), y.dtype, on_groups(y))
            for y, target in zip(node.outputs, targets)]
    builder.nodes.append(gs.Node(node.op, builder.site.fresh(f"{builder.node.name}/{node.op.lower()}"),
                                 attrs=attrs, inputs=inputs, outputs=outs))
    for out, target in zip(outs, targets):
        if out is not target:
            builder.reshape(out, static_shape(target), out=target)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(pad_between_unit_axes, frozenset({"Pad"}) | RESHAPE_LIKE),
    RewriteRule(collapse_rank_region, REGION_OPS, fewer_cpu=True),
    RewriteRule(collapse_rank_region_from_input, REGION_OPS, fewer_cpu=True),
)
