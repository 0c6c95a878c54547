"""Layout rewrites: DepthToSpace and SpaceToDepth as Transposes, Transposes of rank above 4 or
over their perm's limits, Gathers of one index, a Split's parts rejoined in another order as one
Gather, relabels (Reshape, Flatten, Squeeze, Unsqueeze) and the ops done in a Conv's own layout."""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import constant_value, element_count, static_shape
from rkcompile.numerics.nc1hwc2 import nc1hwc2_bytes

from rkcompile.passes.legalize import check_node
from rkcompile.passes.rewrites.base import (RESHAPE_LIKE, Builder, Candidates, RewriteRule, Site, producer,
    split_node)


#: Largest axis _moved_axis_as_concat splits into slices.
MOVED_AXIS_SLICES = 16


def _moved_axis_as_concat(builder: Builder, x: gs.Tensor, perm: list[int],
                          out: gs.Tensor | None = None) -> gs.Tensor | None:
    """When `perm` moves one small axis and keeps the others in order, the Transpose is a Split
    along that axis, a relabel of each slice (moving a size-1 axis keeps the data order) and a
    Concat at the axis' new place; None when `perm` is not of that kind."""
    shape = static_shape(x)
    axis = _moved_axis(shape, perm)
    if axis is not None:
        position = perm.index(axis)
        piece_shape = [1 if p == axis else shape[p] for p in perm]
        slices = split_node(builder, x, axis, [1] * shape[axis])
        relabelled = [builder.reshape(piece, piece_shape) for piece in slices]
        if out is None:
            return builder.op("Concat", relabelled, [shape[p] for p in perm], x.dtype, axis=position)
        return builder.op("Concat", relabelled, out=out, axis=position)
    return None


def _moved_axis(shape, perm: list[int]) -> int | None:
    """The one axis of 2 to 16 that `perm` moves while keeping the others in order, if any."""
    for axis in range(len(perm)):
        rest = [p for p in perm if p != axis]
        if rest == sorted(rest) and 1 < shape[axis] <= MOVED_AXIS_SLICES:
            return axis
    return None


def transpose_small_axis_as_concat(node: gs.Node, site: Site) -> Candidates:
    """A Transpose the NPU refuses (oplist V2.3.2, Transpose: the perm table and its limits) that
    moves one axis of at most 16 and keeps the rest in order (a q/k/v or head split): Split that
    axis into slices, relabel each, Concat them where the axis goes, as rknn-toolkit2 does for
    attention's q/k/v Transpose."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) > 4:
        return "above rank 4 or of unknown shape"
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    builder = site.builder(node)
    if _moved_axis_as_concat(builder, x, perm, out=y) is None:
        return f"perm {perm} does not move one axis of 2 to {MOVED_AXIS_SLICES} while keeping the rest in order"
    yield builder.finish()


def _next_kept_axis(axis: int, shape: tuple[int, ...]) -> int | None:
    return next((a for a in range(axis + 1, len(shape)) if shape[a] != 1), None)


def transpose_as_legal_view(node: gs.Node, site: Site) -> Candidates:
    """A Transpose the NPU refuses, of any rank, as the same data movement on another 4-D view:
    the perm table's limits (oplist V2.3.2, Transpose: the supported perms and their limits in
    p and q, read on the 4-D view [n1, c1, h1, w1]) depend on how the moved axes are laid out,
    and the same movement has many views (transpose_views). When no view passes, two legal
    Transposes in a row make it (`_two_transposes`), else a view is done in slices along any
    one axis, moved or not: each slice is a smaller Transpose, a Concat where that axis lands
    puts them back in order. A rank above 4 falls back to the merged view for the next rule
    (Split/Concat of a small axis) to make legal."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    if shape is None or y_shape is None:
        return "a shape is unknown"
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    builder = site.builder(node)
    if emit_legal_transpose(builder, x, perm, y):
        yield builder.finish()
        return
    builder.discard()
    groups = transpose_groups(shape, perm)
    if len(shape) > 4 and groups is not None and len(groups[0]) <= 4:
        builder = site.builder(node)
        merged = builder.reshape(x, groups[0])
        moved = builder.op("Transpose", [merged], [groups[0][p] for p in groups[1]], x.dtype, perm=groups[1])
        builder.reshape(moved, y_shape, out=y)
        yield builder.finish()
        return
    return (f"no 4-D view of perm {perm} on {shape}, whole or in up to {MAX_TRANSPOSE_SLICES} slices "
            "along one axis, passes the target's Transpose rules")


def transpose_groups(shape, perm) -> tuple[list[int], list[int]] | None:
    """The Transpose with size-1 axes dropped and every run of axes the perm keeps together
    merged: (merged dims in input order, perm over them); None when nothing but size-1 axes move."""
    kept = [axis for axis in perm if shape[axis] != 1]
    runs: list[list[int]] = []
    for axis in kept:
        if runs and axis == _next_kept_axis(runs[-1][-1], shape):
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if len(runs) < 2:
        return None
    by_input_order = sorted(runs)
    return ([element_count(shape[a] for a in run) for run in by_input_order],
            [by_input_order.index(run) for run in runs])


#: Most 4-D views transpose_views yields for one Transpose (each is a probe of the target's rules).
MAX_TRANSPOSE_VIEWS = 400
#: Most views tried in slices, and most slices per view.
SLICED_VIEWS, MAX_TRANSPOSE_SLICES = 24, 64


def transpose_views(shape, perm) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every 4-D (input shape, perm) that moves data exactly as `perm` on `shape` does, the
    merged view first: the merged groups (transpose_groups), any group cut in two factors that
    move together (a row-major [a*b] is [a, b]), up to 4 groups, placed among size-1 axes
    anywhere in input and output (a size-1 axis can go anywhere without moving data)."""
    return list(_transpose_views(tuple(shape), tuple(perm)))


@functools.lru_cache(maxsize=1024)
def _transpose_views(shape: tuple[int, ...], perm: tuple[int, ...]) -> "_Views":
    """transpose_views, remembered and listed only as far as it is read: a model's attention
    blocks repeat the same few Transposes, and listing all views of one takes thousands of
    steps where the first is often legal (tv_maxvit_t: 242 asks, 0.35 s to list them all)."""
    return _Views(_views_in_order(shape, perm))


class _Views:
    """A sequence made from an iterator as far as it is read, kept for the next reader."""

    def __init__(self, made):
        self._made, self._rest = [], made

    def __iter__(self):
        index = 0
        while True:
            if index == len(self._made):
                following = next(self._rest, None)
                if following is None:
                    return
                self._made.append(following)
            yield self._made[index]
            index += 1

    def first(self, count: int) -> list:
        return list(itertools.islice(self, count))


def _views_in_order(shape: tuple[int, ...], perm: tuple[int, ...]):
    """transpose_views' views in its order, at most MAX_TRANSPOSE_VIEWS of them: each refinement
    (breadth first) with its size-1 axes leading, then the other placements of each."""
    groups = transpose_groups(shape, perm)
    if groups is None:
        return
    refinements = []  # those read so far: the other placements go over them all again
    views: set[tuple] = set()
    for leading_only in (True, False):
        for dims, gperm in (_refinements(groups, refinements) if leading_only else refinements):
            for view in _placements(dims, gperm, leading_only):
                if view not in views:
                    views.add(view)
                    yield view
                if len(views) >= MAX_TRANSPOSE_VIEWS:
                    return


def _refinements(groups, read: list):
    """The merged groups, then the groups with one group cut in two factors, layer by layer
    (breadth first), until a layer brings the count to MAX_TRANSPOSE_VIEWS; each one also
    appended to `read` as it is yielded."""
    layer, seen, count = [groups], set(), 0
    while layer and count < MAX_TRANSPOSE_VIEWS:
        for refinement in layer:
            read.append(refinement)
            yield refinement
        count += len(layer)
        layer = next_refinements(layer, seen)


def next_refinements(layer: list, seen: set) -> list:
    """The refinements of a layer's groups with one group of under 4 cut in two factors, each
    not in `seen` (repr'd), which they join."""
    following = []
    for dims, gperm in layer:
        for index, dim in enumerate(dims if len(dims) < 4 else ()):
            for factor in (f for f in range(2, dim) if dim % f == 0):
                split_perm = []
                for g in gperm:
                    split_perm += [index, index + 1] if g == index else [g + (g > index)]
                split = (dims[:index] + [factor, dim // factor] + dims[index + 1:], split_perm)
                if repr(split) not in seen:
                    seen.add(repr(split))
                    following.append(split)
    return following


def _placements(dims: list[int], gperm: list[int], leading_only: bool):
    """The 4-D (input shape, perm) views of groups `dims` moved by `gperm`, among size-1 axes:
    only the view with the size-1 axes leading and in place, or every other one."""
    rank = len(dims)
    for in_pos in itertools.combinations(range(4), rank):
        for out_pos in itertools.combinations(range(4), rank):
            free_in = [a for a in range(4) if a not in in_pos]
            free_out = [a for a in range(4) if a not in out_pos]
            for units in itertools.permutations(free_in):
                leading = in_pos == out_pos == tuple(range(4 - rank, 4)) and list(units) == free_in
                if leading != leading_only:
                    continue
                perm4 = [0] * 4
                for j, g in enumerate(gperm):
                    perm4[out_pos[j]] = in_pos[g]
                for slot, axis in zip(free_out, units):
                    perm4[slot] = axis
                in4 = [1] * 4
                for g, axis in enumerate(in_pos):
                    in4[axis] = dims[g]
                yield tuple(in4), tuple(perm4)


def emit_legal_transpose(builder: Builder, x: gs.Tensor, perm: list[int], out: gs.Tensor) -> bool:
    """Build, into `builder`, a Transpose of `x` by `perm` writing `out` that passes the target's
    rules: on the first legal 4-D view (transpose_views), else as two legal Transposes
    (`_two_transposes`), else on a view in the fewest slices along one of its axes; relabels move
    between the views. False, building nothing, when none passes."""
    shape = static_shape(x)
    neighbours = (_relabelled_from(x), _relabelled_to(out))
    key = (tuple(shape), tuple(perm), x.dtype, neighbours)
    if key not in builder.site.legal_transposes:
        probe = _TransposeProbe(builder.site, x.dtype)
        c2s = {c2 for c2 in builder.site.target.c2.values() if c2}
        found = _legal_transpose_view(shape, perm, probe, c2s)
        if found is not None and found[1] is None:
            joining = next((view for view in _joining_views(shape, perm, *neighbours)
                            if _stores_no_more(view, found[0], neighbours, c2s) and probe(*view)), None)
            found = found if joining is None else (joining, None)
        builder.site.legal_transposes[key] = found
    found = builder.site.legal_transposes[key]
    if found is None:
        return False
    (in4, perm4), tiling = found
    source = x if list(in4) == list(shape) else builder.reshape(x, in4)
    out4 = [in4[p] for p in perm4]
    if isinstance(tiling, SecondTranspose):
        source = builder.op("Transpose", [source], out4, x.dtype, perm=list(perm4))
        in4, perm4, tiling = out4, tiling.perm, None
        out4 = [in4[p] for p in perm4]
    moved_out = out if list(out4) == list(static_shape(out)) else None
    if tiling is None:
        moved = builder.op("Transpose", [source], out4, x.dtype, out=moved_out, perm=list(perm4))
    else:
        axis, sizes = tiling
        pieces = split_node(builder, source, axis, sizes)
        parts = [builder.op("Transpose", [piece], [static_shape(piece)[p] for p in perm4], x.dtype, perm=list(perm4))
                 for piece in pieces]
        if moved_out is None:
            moved = builder.op("Concat", parts, out4, x.dtype, axis=perm4.index(axis))
        else:
            moved = builder.op("Concat", parts, out=moved_out, axis=perm4.index(axis))
    if moved_out is None:
        builder.reshape(moved, static_shape(out), out=out)
    return True


def _relabelled_from(x: gs.Tensor) -> tuple[int, ...] | None:
    """The 4-D shape a relabel making `x` reads, if one makes it."""
    maker = producer(x)
    shape = static_shape(maker.inputs[0]) if maker is not None and maker.op in RESHAPE_LIKE else None
    return tuple(shape) if shape is not None and len(shape) == 4 else None


def _relabelled_to(out: gs.Tensor) -> tuple[int, ...] | None:
    """The 4-D shape every reader of `out` relabels it to, if they are all relabels to one."""
    shapes = {tuple(static_shape(r.outputs[0]) or ()) if r.op in RESHAPE_LIKE and len(r.outputs) == 1 else None
              for r in out.outputs}
    shape = shapes.pop() if len(shapes) == 1 else None
    return shape if shape is not None and len(shape) == 4 else None


def _joining_views(shape, perm, read: tuple | None, written: tuple | None) -> list[tuple[tuple, tuple]]:
    """4-D views of `perm` on `shape` (the same merged groups, so the same data movement) that
    read the shape `read` a relabel before the Transpose read, or write the shape `written` the
    relabels after it make: the relabel between them and the view collapses with that one, a
    step fewer than a view beside it. Those joining both first. emit_legal_transpose takes the
    first legal one that stores no more than the first legal view (`_stores_no_more`)."""
    groups = transpose_groups(shape, perm)
    if groups is None:
        return []
    views = set()
    for perm4 in itertools.permutations(range(4)):
        candidates = [read]
        if written is not None:
            candidates.append(tuple(written[perm4.index(axis)] for axis in range(4)))
        views.update((in4, perm4) for in4 in candidates
                     if in4 is not None and transpose_groups(in4, perm4) == groups)

    def relabels_joined(view) -> int:
        return (view[0] == read) + (tuple(view[0][p] for p in view[1]) == written)

    return sorted(views, key=lambda view: (-relabels_joined(view), view))


def _stores_no_more(view, other, neighbours, c2s) -> bool:
    """Whether the tensors `view` makes take no more bytes in NC1HWC2 than those `other` makes,
    for each C2 the target stores with: its input when a relabel makes it (none when it is the
    shape the relabel before read, `neighbours[0]`) and its output (none when it is the shape the
    relabels after make, `neighbours[1]`). A view with fewer channels pads each position to C2
    (a [1, 1, L, C] output takes C2 times its elements), which a relabel saved may not pay for."""
    read, written = neighbours

    def stored(in4, perm4, c2):
        out4 = tuple(in4[p] for p in perm4)
        return sum(nc1hwc2_bytes(tuple(shape), c2, 1) for shape, joined in ((in4, read), (out4, written))
                   if tuple(shape) != joined)
    return all(stored(*view, c2) <= stored(*other, c2) for c2 in c2s)


@dataclass(frozen=True)
class SecondTranspose:
    """The perm of a second Transpose, on the first one's output, that completes a movement no
    single legal Transpose makes (`_two_transposes`)."""
    perm: tuple[int, ...]


def _legal_transpose_view(shape, perm, legal: "_TransposeProbe", c2s: set[int]):
    """The first view of `perm` on `shape` that `legal` accepts, with None for its slicing; else
    two legal Transposes in a row (`_two_transposes`), the first's view with the second's perm;
    else the first view (of the first SLICED_VIEWS) and (axis, sizes) in the fewest slices along
    one axis that it accepts; else None."""
    views = _transpose_views(tuple(shape), tuple(perm))
    found = next(((view, None) for view in views if legal(*view)), None)
    if found is None:
        found = _two_transposes(shape, perm, legal, c2s)
    for slices in range(2, MAX_TRANSPOSE_SLICES + 1):
        if found is not None:
            break
        for view in views.first(SLICED_VIEWS):
            sizes = next((s for s in (_slice_sizes(view, axis, slices, legal) for axis in range(4)) if s), None)
            if sizes is not None:
                found = view, sizes
                break
    return found


def _two_transposes(shape, perm, legal, c2s: set[int]) -> tuple[tuple, SecondTranspose] | None:
    """A movement no 4-D view makes legal in one Transpose, as two on the merged view (size-1
    axes leading): a first perm the target accepts, then the perm that completes `perm` from its
    output, which the target must accept too; of those, the one whose output in between is
    stored in the fewest bytes (NC1HWC2 at each C2 in `c2s`, the target's), and never in more
    than the larger of the input and output. Two steps, each moving the tensor once, where
    slicing the movement (a Split, a Transpose or relabel per slice, a Concat) takes at least
    four steps and moves it three times: a Swin window reverse [8, 8, 7, 336] -> [8, 7, 8, 336]
    swaps an axis of 7 where the swap needs a multiple of 8 (oplist V2.3.2, Transpose, perm
    (0, 2, 1, 3): h1 % 8 == 0), and goes [8, 336, 8, 7] by (0, 3, 1, 2), then (0, 3, 2, 1)
    (the wide zoo's tv_swin_nano: 258 NPU steps -> 183). None when no pair passes, or the merged
    view is above rank 4."""
    groups = transpose_groups(shape, perm)
    if groups is None or len(groups[0]) > 4:
        return None
    dims, moved = groups
    lead = 4 - len(dims)
    in4 = (1,) * lead + tuple(dims)
    wanted = tuple(range(lead)) + tuple(axis + lead for axis in moved)

    def stored(dims4) -> list[int]:
        return [nc1hwc2_bytes(dims4, c2, 1) for c2 in sorted(c2s)]

    ends = [max(pair) for pair in zip(stored(in4), stored(tuple(in4[axis] for axis in wanted)))]
    pairs = []
    for first in itertools.permutations(range(4)):
        between = tuple(in4[axis] for axis in first)
        second = tuple(first.index(axis) for axis in wanted)
        # a tensor in between padded past both ends (a small axis on the channels) would move
        # more bytes than the slices do
        if all(b <= e for b, e in zip(stored(between), ends)) and legal(in4, first) and legal(between, second):
            pairs.append((sum(stored(between)), (in4, first), SecondTranspose(second)))
    if not pairs:
        return None
    _, view, second = min(pairs, key=lambda pair: pair[0])
    return view, second


def _slice_sizes(view, axis: int, slices: int, legal) -> tuple[int, list[int]] | None:
    """(axis, sizes) cutting `view`'s input along `axis` into `slices` pieces, all but the last
    of one size, each a legal Transpose; None when they are not."""
    in4, perm4 = view
    dim = in4[axis]
    size = -(-dim // slices)
    if dim < slices or size * (slices - 1) >= dim:
        return None
    sizes = [size] * (slices - 1) + [dim - size * (slices - 1)]
    for piece in set(sizes):
        if not legal(tuple(piece if a == axis else d for a, d in enumerate(in4)), perm4):
            return None
    return axis, sizes


def legal_whole(site: Site, shape, perm, dtype) -> bool:
    """Whether a Transpose of `shape` by `perm` has a 4-D view (transpose_views) the target
    accepts whole, in no slices; remembered on the site beside emit_legal_transpose's views."""
    key = ("whole", tuple(shape), tuple(perm), dtype)
    if key not in site.legal_transposes:
        probe = _TransposeProbe(site, dtype)
        site.legal_transposes[key] = any(probe(*view) for view in _transpose_views(tuple(shape), tuple(perm)))
    return site.legal_transposes[key]


class _TransposeProbe:
    """Whether a 4-D Transpose passes the target's rules, judged on detached probe nodes (they
    touch no graph tensor) and remembered per (shape, perm)."""

    def __init__(self, site: Site, dtype):
        self.site, self.dtype, self.seen = site, dtype, {}

    def __call__(self, in4, perm4) -> bool:
        key = (tuple(in4), tuple(perm4))
        if key not in self.seen:
            probe = gs.Node("Transpose", attrs={"perm": list(perm4)},
                            inputs=[gs.Variable("probe_in", self.dtype, list(in4))],
                            outputs=[gs.Variable("probe_out", self.dtype, [in4[p] for p in perm4])])
            self.seen[key] = not check_node(probe, self.site.target, **self.site.facts)
        return self.seen[key]


def gather_scalar_to_slice(node: gs.Node, site: Site) -> Candidates:
    """A Gather of one constant scalar index (x[:, i] in exporters' code) is a Slice of width one
    along its axis followed by a relabel that drops that axis: the NPU's Gather takes rank-1
    indices only (oplist V2.3.2, Gather: "Indices ... rank = 1")."""
    x, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape, index = static_shape(x), constant_value(indices)
    if shape is None or index is None or index.ndim != 0 or site.opset < 10:
        return "not a constant scalar index on a known shape"
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    start = int(index) % shape[axis]
    builder = site.builder(node)
    sliced_shape = [1 if a == axis else d for a, d in enumerate(shape)]
    bounds = [builder.const(np.array([v], dtype=np.int64), hint) for v, hint in
              ((start, "starts"), (start + 1, "ends"), (axis, "axes"))]
    sliced = builder.op("Slice", [x, *bounds], sliced_shape, x.dtype)
    builder.reshape(sliced, static_shape(y), out=y)
    yield builder.finish()


def reordered_split_as_gather(node: gs.Node, site: Site) -> Candidates:
    """A Concat of every part of one Split, along the Split's axis, in another order, is one
    Gather of that axis's positions in the new order: a rotary embedding's rotate_half swaps the
    halves of each head, Concat(x2, x1), once its negation has gone into sin
    (affine.scalar_factors_out_of_concat). One step for two; rknn-toolkit2 runs such moves as
    a Gather too. The NPU's Gather takes rank-1 indices on any axis (oplist V2.3.2, Gather)."""
    split = producer(node.inputs[0]) if node.inputs else None
    parts = list(split.outputs) if split is not None and split.op == "Split" else []
    if not parts or sorted(map(id, node.inputs)) != sorted(map(id, parts)):
        return "not every part of one Split, each once"
    if any(len(part.outputs) != 1 or part.name in site.graph_outputs for part in parts):
        return "a part of the Split is read elsewhere too"
    shape = static_shape(split.inputs[0])
    if shape is None or any(static_shape(part) is None for part in parts):
        return "a shape is unknown"
    axis = int(split.attrs.get("axis", 0)) % len(shape)
    if int(node.attrs["axis"]) % len(shape) != axis:
        return "the Concat joins another axis than the Split cut"
    starts = np.cumsum([0] + [static_shape(part)[axis] for part in parts])
    begins = {id(part): start for part, start in zip(parts, starts)}
    order = [id(t) for t in node.inputs]
    if order == [id(part) for part in parts]:
        return "the parts are in their own order: the Concat undoes the Split"
    indices = np.concatenate([np.arange(begins[id(t)], begins[id(t)] + static_shape(t)[axis]) for t in node.inputs])
    builder = site.builder(node)
    builder.op("Gather", [split.inputs[0], builder.const(indices.astype(np.int64), "indices")],
               out=node.outputs[0], axis=axis)
    yield builder.finish(split, node)


def gather_indices_flattened(node: gs.Node, site: Site) -> Candidates:
    """A Gather of constant indices of rank 2 or more is a Gather of the same indices laid out
    flat (rank 1), then a relabel of its result: row-major order puts index k's slice at the
    same place either way. The NPU's Gather takes rank-1 indices only (oplist V2.3.2, Gather)."""
    x, indices, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape, index, y_shape = static_shape(x), constant_value(indices), static_shape(y)
    if shape is None or index is None or y_shape is None or index.ndim < 2:
        return "the indices are computed, not of rank 2 or more, or a shape is unknown"
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    if np.any((index < -shape[axis]) | (index >= shape[axis])):
        return "an index is out of range"
    flat = index.reshape(-1).astype(np.int64) % shape[axis]  # negative indices count from the end
    builder = site.builder(node)
    gathered = builder.op("Gather", [x, builder.const(flat, "indices")],
                          [*shape[:axis], flat.size, *shape[axis + 1:]], x.dtype, axis=axis)
    builder.reshape(gathered, y_shape, out=y)
    yield builder.finish()


def transpose_of_unit_axes_to_reshape(node: gs.Node, site: Site) -> Candidates:
    """A Transpose that moves only axes of size 1 keeps every element where it was in a
    row-major tensor: it is a relabel, and runs (and collapses with its neighbours) as a Reshape."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    if shape is None or y_shape is None:
        return "a shape is unknown"
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    moved = [axis for axis in perm if shape[axis] != 1]
    if moved != sorted(moved):
        return "it moves axes of size above 1 out of order: not a relabel"
    builder = site.builder(node)
    builder.reshape(x, y_shape, out=y)
    yield builder.finish()


#: Activations the NPU fuses after a convolution (oplist V2.3.2: ConvolutionRelu, ...Clip,
#: ...Sigmoid, ...Tanh, ...HardSigmoid, ...HardSwish, ...LeakyRelu, ...Elu, ...Softplus).
CONV_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu",
                              "Elu", "Softplus"})


def elementwise_in_conv_layout(node: gs.Node, site: Site) -> Candidates:
    """An activation of a relabelled Conv output, or an Add of one and a tensor of the same
    shape (a residual), done in the Conv's own [L, C, 1, 1] layout and relabelled after, so the
    Conv and the op run as one kernel (oplist V2.3.2: ConvolutionAdd, ConvolutionTanh, ...), as
    rknn-toolkit2 runs fully connected and transformer layers. Element-wise ops commute with
    relabelling every operand alike; constants of one element need no relabel.

    An op that already reads a Conv's output as it is, of its own shape, is in that Conv's
    layout and stays: moving it to another Conv's layout would let the two Convs pull it back
    and forth without end (a MatMul-by-weights Conv's residual Add of another Conv's output)."""
    y_shape = static_shape(node.outputs[0])
    if y_shape is None:
        return "the output shape is unknown"
    operands = [t for t in node.inputs if t.name]
    in_layout = next((t for t in operands if (p := producer(t)) is not None and p.op == "Conv"
                      and static_shape(t) == y_shape), None)
    if in_layout is not None:
        return f"it already reads Conv output {in_layout.name} in that Conv's layout"
    for position, relabelled in enumerate(operands):
        relabel = producer(relabelled)
        if (relabel is None or relabel.op not in RESHAPE_LIKE or len(relabelled.outputs) != 1
                or relabelled.name in site.graph_outputs or static_shape(relabelled) != y_shape):
            continue
        source = relabel.inputs[0]
        conv = producer(source)
        if conv is None or conv.op != "Conv":
            continue
        others = operands[:position] + operands[position + 1:]
        builder = site.builder(node)
        inputs = []
        for operand in node.inputs:
            if operand is relabelled:
                inputs.append(source)
            elif not operand.name or (isinstance(operand, gs.Constant) and constant_value(operand).size == 1):
                inputs.append(operand)
            elif node.op == "Add" and not isinstance(operand, gs.Constant) and static_shape(operand) == y_shape:
                inputs.append(builder.reshape(operand, static_shape(source)))
            else:
                builder.discard()
                return f"operand {operand.name} cannot follow the Conv's layout"
        if node.op == "Add" and not others:
            return "an Add with no other operand to fuse"
        result = builder.op(node.op, inputs, static_shape(source), source.dtype, **node.attrs)
        builder.reshape(result, y_shape, out=node.outputs[0])
        yield builder.finish(node, relabel)
        return
    return "no operand is a relabelled Conv output"


def collapse_relabels(node: gs.Node, site: Site) -> Candidates:
    """Squeeze/Unsqueeze/Flatten/Reshape only relabel a row-major tensor, so a relabel of a
    relabel is one Reshape from the first input, and one whose output shape equals that input's
    is no node at all: its readers read the input (the node is 'removed' in the plan). The first
    relabel goes with it when this was its only reader, and a relabel nobody reads any more
    goes too. Rewrites leave such pairs behind wherever they wrap an op in relabels."""
    y = node.outputs[0]
    y_shape = static_shape(y)
    if y_shape is None:
        return "the output shape is unknown"
    source = node.inputs[0]
    earlier = producer(source)
    relabelled = earlier is not None and earlier.op in RESHAPE_LIKE and static_shape(earlier.inputs[0]) is not None
    only_reader = relabelled and len(source.outputs) == 1 and source.name not in site.graph_outputs
    replaced = (earlier, node) if only_reader else (node,)
    origin = earlier.inputs[0] if relabelled else source
    builder = site.builder(node)
    if not y.outputs and y.name not in site.graph_outputs:
        yield builder.finish(*replaced)
    elif static_shape(origin) == y_shape and y.name not in site.graph_outputs:
        yield builder.finish(*replaced, aliases=((y, origin),))
    elif relabelled:
        builder.reshape(origin, y_shape, out=y)
        yield builder.finish(*replaced)
    else:
        return "it neither follows a relabel nor leaves the shape as it was"


def block_rearrangement_as_transpose(node: gs.Node, site: Site) -> Candidates:
    """DepthToSpace and SpaceToDepth (DCR or CRD mode) as the Reshape -> Transpose -> Reshape
    that the ONNX operator definitions give as their meaning, so exact: the targets have no
    kernel for either op (oplist V2.3.2), while the 6-D Transpose between the relabels is left to
    the rank and Transpose rules, which rewrite it again where it is itself illegal.
    SpaceToDepth's 6-D Transpose has no merged 4-D form for those rules, so it is written as two
    4-D Transposes instead: one swaps each row block's columns with its blocks, the other moves
    the b*b block offsets ahead of channel and row (DCR) or of the row only (CRD), the order
    SpaceToDepth's channels list them in."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    if shape is None or y_shape is None or len(shape) != 4:
        return "not a 4-D tensor of known shape"
    n, c, h, w = shape
    block = int(node.attrs["blocksize"])
    builder = site.builder(node)
    if node.op == "SpaceToDepth":
        rows = builder.reshape(x, [n * c * h // block, block, w // block, block])
        offsets_last = builder.op("Transpose", [rows], [n * c * h // block, block, block, w // block], x.dtype,
                                  perm=[0, 1, 3, 2])
        # DCR (the default) lists the block offsets ahead of the channels, CRD (opset 28) after them
        images = n if node.attrs.get("mode", "DCR") == "DCR" else n * c
        grouped = builder.reshape(offsets_last, [images, n * c * h // block // images, block * block, w // block])
        offsets_first = builder.op("Transpose", [grouped], [images, block * block, n * c * h // block // images,
                                                            w // block], x.dtype, perm=[0, 2, 1, 3])
        builder.reshape(offsets_first, y_shape, out=y)
        yield builder.finish()
        return
    if node.attrs.get("mode", "DCR") == "CRD":
        split, perm = [n, c // block ** 2, block, block, h, w], [0, 1, 4, 2, 5, 3]
    else:
        split, perm = [n, block, block, c // block ** 2, h, w], [0, 3, 4, 1, 5, 2]
    blocks = builder.reshape(x, split)
    moved = builder.op("Transpose", [blocks], [split[p] for p in perm], x.dtype, perm=perm)
    builder.reshape(moved, y_shape, out=y)
    yield builder.finish()


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(block_rearrangement_as_transpose, frozenset({"DepthToSpace", "SpaceToDepth"})),
    RewriteRule(transpose_as_legal_view, frozenset({"Transpose"})),
    RewriteRule(transpose_small_axis_as_concat, frozenset({"Transpose"})),
    RewriteRule(gather_scalar_to_slice, frozenset({"Gather"})),
    RewriteRule(gather_indices_flattened, frozenset({"Gather"})),
    RewriteRule(transpose_of_unit_axes_to_reshape, frozenset({"Transpose"}), always=True),
    RewriteRule(elementwise_in_conv_layout, frozenset({"Add"}) | CONV_ACTIVATIONS, always=True),
    RewriteRule(collapse_relabels, RESHAPE_LIKE, always=True, fewer_cpu=True),
    # late: rotate_half's Concat reads the Split's parts alone only once its negation has moved
    # into sin, a late rule (passes/rewrites/affine.py)
    RewriteRule(reordered_split_as_gather, frozenset({"Concat"}), always=True, late=True),
)
