"""Layout rewrites: Transposes of rank above 4 or over their perm's limits, Gathers of one
index, relabels (Reshape, Flatten, Squeeze, Unsqueeze) and the ops done in a Conv's own layout."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir import constant_value, element_count, static_shape

from .base import RESHAPE_LIKE, Builder, Candidates, RewriteRule, Site, producer, split_node


def transpose_to_4d(node: gs.Node, site: Site) -> Candidates:
    """A Transpose of rank above 4 (exporters' channel shuffles and attention head splits) moves
    the same data as a Transpose of the tensor with its size-1 axes dropped and every run of
    neighbouring axes that the perm keeps together merged into one: so Reshape to that merged
    shape, Transpose it (or, if the NPU refuses that perm, Split/relabel/Concat it), Reshape
    back. The relabels that made the tensor rank 5 on either side are absorbed, so no rank-5
    tensor is left. The NPU's operators take [batch, channel, height, width] only (oplist
    V2.3.2, every operator's shape list)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) <= 4 or static_shape(y) is None:
        return "not above rank 4, or a shape is unknown"
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    kept = [axis for axis in perm if shape[axis] != 1]
    runs: list[list[int]] = []
    for axis in kept:
        if runs and axis == _next_kept_axis(runs[-1][-1], shape):
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if not runs or len(runs) > 4:
        return "more than 4 axis groups move independently"
    by_input_order = sorted(runs)
    merged_shape = [element_count(shape[a] for a in run) for run in by_input_order]
    merged_perm = [by_input_order.index(run) for run in runs]
    source, dest, absorbed = x, y, []
    before = producer(x)
    if before is not None and before.op in RESHAPE_LIKE and len(x.outputs) == 1 and x.name not in site.graph_outputs:
        source, absorbed = before.inputs[0], [before]
    after = y.outputs[0] if len(y.outputs) == 1 else None
    if (after is not None and after.op in RESHAPE_LIKE and y.name not in site.graph_outputs
            and static_shape(after.outputs[0]) is not None):
        dest, absorbed = after.outputs[0], absorbed + [after]
    for as_concat in (False, True):
        if as_concat and _moved_axis(merged_shape, merged_perm) is None:
            return "the merged Transpose is refused and moves more than one axis"
        builder = site.builder(node)
        merged = builder.reshape(source, merged_shape)
        if as_concat:
            moved = _moved_axis_as_concat(builder, merged, merged_perm)
        else:
            moved = builder.op("Transpose", [merged], [merged_shape[p] for p in merged_perm], x.dtype,
                               perm=merged_perm)
        builder.reshape(moved, static_shape(dest), out=dest)
        yield builder.finish(node, *absorbed)


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


#: How many slices transpose_in_slices tries, fewest first.
TRANSPOSE_SLICES = (2, 4, 8, 16, 32, 64)


def transpose_in_slices(node: gs.Node, site: Site) -> Candidates:
    """A Transpose over its perm's size limits (oplist V2.3.2, Transpose: products of dims below
    p and q) done in slices along an axis the perm leaves in place: each slice is a smaller
    Transpose of the same perm, and a Concat along that axis puts the slices back in order."""
    x, y = node.inputs[0], node.outputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) > 4:
        return "above rank 4 or of unknown shape"
    perm = [int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1))]
    for axis in (a for a in reversed(range(len(shape))) if perm[a] == a and shape[a] > 1):
        for parts in (n for n in TRANSPOSE_SLICES if shape[axis] % n == 0):
            piece = [shape[axis] // parts if a == axis else d for a, d in enumerate(shape)]
            if not site.transpose_legal(node, piece):
                continue  # a slice would be refused too: building the candidate is wasted work
            builder = site.builder(node)
            slices = split_node(builder, x, axis, [shape[axis] // parts] * parts)
            moved = [builder.op("Transpose", [piece], [static_shape(piece)[p] for p in perm], x.dtype, perm=perm)
                     for piece in slices]
            builder.op("Concat", moved, out=y, axis=axis)
            yield builder.finish()
    return f"no split into {TRANSPOSE_SLICES[-1]} or fewer slices along an axis perm {perm} keeps makes each slice legal"


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
    relabelling every operand alike; constants of one element need no relabel."""
    y_shape = static_shape(node.outputs[0])
    operands = [t for t in node.inputs if t.name]
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


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(transpose_to_4d, frozenset({"Transpose"})),
    RewriteRule(transpose_in_slices, frozenset({"Transpose"})),
    RewriteRule(transpose_small_axis_as_concat, frozenset({"Transpose"})),
    RewriteRule(gather_scalar_to_slice, frozenset({"Gather"})),
    RewriteRule(transpose_of_unit_axes_to_reshape, frozenset({"Transpose"}), always=True),
    RewriteRule(elementwise_in_conv_layout, frozenset({"Add"}) | CONV_ACTIVATIONS, always=True),
    RewriteRule(collapse_relabels, RESHAPE_LIKE, always=True),
)
