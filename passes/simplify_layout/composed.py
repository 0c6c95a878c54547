"""A run of layout moves as the one move it makes: `moves_as_gather`."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, unlinked_node
from rkcompile.ir.graph import constant_value, element_count, is_onnx_domain, static_shape

from rkcompile.passes.fold_constants import evaluate_on
from rkcompile.passes.simplify_layout.driver import Simplifier, layout_move

#: the largest run input whose element positions the rule traces (an int64 per element)
MAX_TRACED_ELEMENTS = 1 << 22


def _constant_gather(node: gs.Node) -> bool:
    """A Gather of constant indices, of known shapes."""
    return (is_onnx_domain(node) and node.op == "Gather" and len(node.inputs) == 2 and len(node.outputs) == 1
            and constant_value(node.inputs[1]) is not None
            and static_shape(node.inputs[0]) is not None and static_shape(node.outputs[0]) is not None)


def _is_move(node: gs.Node | None) -> bool:
    return node is not None and (layout_move(node) is not None or _constant_gather(node))


def _moved(positions: np.ndarray, node: gs.Node, opset: int) -> np.ndarray:
    """`positions` (an array of the node's input shape) after the node's move, as the alias pass
    runs relabels on element indices (fold_constants.evaluate_on)."""
    operands = [constant_value(t) if t.name else None for t in node.inputs[1:]]
    return evaluate_on(node, [positions, *operands], opset)[0]


def _gathered(shape: list[int], axis: int, flat: np.ndarray) -> np.ndarray | None:
    """The indices of the Gather along `axis` of a tensor of `shape` whose result, in row-major
    order, is `flat` (the source position of each result element, row-major); None when no
    Gather along that axis makes it."""
    outer, inner = element_count(shape[:axis]), element_count(shape[axis + 1:])
    if flat.size % (outer * inner):
        return None
    blocks = flat.reshape(outer, -1, inner)
    if np.any(blocks[0, :, 0] % inner):
        return None
    indices = blocks[0, :, 0] // inner
    if np.any(indices >= shape[axis]):
        return None
    expected = (np.arange(outer)[:, None, None] * (shape[axis] * inner) + indices[None, :, None] * inner
                + np.arange(inner)[None, None, :])
    return indices if np.array_equal(blocks, expected) else None


def _steps(moves: list[gs.Node], simplifier: Simplifier) -> int:
    """The fewest steps `moves` (a run, each reading the one before) take once the alias pass
    has made views of the relabels and Transposes that, one after another, leave every element
    where the NPU stores it (passes/alias.py): each other move is a step."""
    fewest = [0] + [len(moves)] * len(moves)  # fewest[k]: steps of moves[:k]
    for first in range(len(moves)):
        fewest[first + 1] = min(fewest[first + 1], fewest[first] + 1)
        shape = static_shape(moves[first].inputs[0])
        positions = np.arange(element_count(shape), dtype=np.int64).reshape(shape)
        for last in range(first, len(moves)):
            move = moves[last]
            if move.op == "Gather":
                break
            positions = _moved(positions, move, simplifier.ctx.graph.opset)
            if simplifier.stores_alike(shape, static_shape(move.outputs[0]), positions.reshape(-1)):
                fewest[last + 1] = min(fewest[last + 1], fewest[first])
    return fewest[-1]


def _kept_together(flat: np.ndarray) -> int:
    """The most elements a move keeps together: the largest b such that `flat` (the source
    position of each result element, row-major) is runs of b consecutive positions, each run
    starting at a multiple of b in both orders."""
    starts = np.flatnonzero(np.diff(flat, prepend=flat[0] - 2) != 1)
    return int(np.gcd.reduce(np.concatenate([[flat.size], starts, flat[starts]])))


def _gather_nodes(x: gs.Tensor, view: list[int], axis: int, indices: np.ndarray, result: gs.Tensor,
                  node: gs.Node, simplifier: Simplifier) -> list[gs.Node]:
    """Unlinked nodes making `result` from `x`: a relabel to `view` (unless x has that shape),
    the Gather of `indices` along `axis` (unless it takes every slice in order), and a relabel
    to the result's shape (unless the nodes before make it)."""
    def shape_of(shape: list[int]) -> gs.Constant:
        return gs.Constant(simplifier.fresh(f"{node.name}/shape"), np.array(shape, np.int64))

    x_shape, y_shape = list(static_shape(x)), list(static_shape(result))
    steps = []  # (op, operands after the data, result shape, attributes)
    if view != x_shape:
        steps.append(("Reshape", [shape_of(view)], view, {}))
    if not np.array_equal(indices, np.arange(view[axis])):
        index_tensor = gs.Constant(simplifier.fresh(f"{node.name}/indices"), indices.astype(np.int64))
        steps.append(("Gather", [index_tensor], view[:axis] + [indices.size] + view[axis + 1:], {"axis": axis}))
    if not steps or steps[-1][2] != y_shape:
        steps.append(("Reshape", [shape_of(y_shape)], y_shape, {}))
    new, moved = [], x
    for position, (op, operands, shape, attrs) in enumerate(steps):
        out = result if position == len(steps) - 1 else gs.Variable(
            simplifier.fresh(f"{node.name}/{op.lower()}_out"), x.dtype, shape)
        new.append(unlinked_node(op=op, name=simplifier.fresh(f"{node.name}/{op.lower()}"), attrs=attrs,
                                 inputs=[moved, *operands], outputs=[out]))
        moved = out
    return new


def moves_as_gather(node: gs.Node, simplifier: Simplifier):
    """A run of layout moves (relabels, Transposes, Gathers of constant indices), each reading
    the one before alone, is the one move it makes of its first input's elements: where that
    move takes whole slices of one axis of the input (or of neighbouring axes merged, or the
    rows of its [N / b, b, 1, 1] view where it keeps runs of b elements together), in any order,
    each slice at least the NPU's channel block (C2 elements; smaller ones permute elements one
    by one, left to Transposes), it is one Gather along that axis, then a relabel to
    the run's result shape unless the Gather makes it; where it moves nothing, one relabel.
    Swin's cyclic shift and window partition on token rows [L, C, 1, 1] (two Gathers of the
    shift, a relabel, two Transposes making the illegal swap of the window axes, a relabel)
    reorder whole rows of C channels: one Gather of rows for six steps. The NPU's Gather takes
    rank-1 indices on any axis (oplist V2.3.2, Gather); rknn-toolkit2 runs such shifts as
    Gathers too. Exact: every element is copied, none computed. Runs after every other layout
    rule and the kernels' takeovers of their operands' moves (`SimplifyLayout.run`), so a move
    another rule cancels, or a kernel reads for free, is never made a Gather. It applies only
    where it leaves fewer steps moving stored bytes (a relabel leaving each element where the
    NPU stores it is a view, no step), each passing the target's rules; of several such forms,
    the one of fewest steps, then fewest nodes, then the outermost axis."""
    if not _is_move(node):
        return None
    result = node.outputs[0]
    readers = result.outputs
    if len(readers) == 1 and _is_move(readers[0]) and result.name not in simplifier.graph_outputs:
        return None  # not the end of the run: its last move takes it
    run = [node]
    while True:
        source = run[0].inputs[0]
        made_by = source.inputs[0] if len(source.inputs) == 1 else None
        if not _is_move(made_by) or len(source.outputs) != 1 or source.name in simplifier.graph_outputs:
            break
        run.insert(0, made_by)
    if len(run) < 2 or all(member.op != "Transpose" and member.op != "Gather" for member in run):
        return None  # relabels alone: collapse_relabels joins them
    x = run[0].inputs[0]
    x_shape, y_shape = list(static_shape(x)), list(static_shape(result))
    if element_count(x_shape) > MAX_TRACED_ELEMENTS:
        return "its input is too large to trace element by element"
    positions = np.arange(element_count(x_shape), dtype=np.int64).reshape(x_shape)
    for member in run:
        positions = _moved(positions, member, simplifier.ctx.graph.opset)
    block = simplifier.ctx.target.c2_for(simplifier.ctx.options.dtype)
    flat = positions.reshape(-1)
    # the Gather's axis: axes first..last of x merged, or the rows of [N / kept, kept, 1, 1]
    views = [(x_shape[:first] + [element_count(x_shape[first:last + 1])] + x_shape[last + 1:], first)
             for first in range(len(x_shape)) for last in range(first, len(x_shape))
             if element_count(x_shape[last + 1:]) >= block]
    # runs of `kept` dividing the input too: a Gather may repeat slices, its result the larger
    kept = int(np.gcd(_kept_together(flat), element_count(x_shape)))
    if kept >= block:
        views.append(([element_count(x_shape) // kept, kept, 1, 1], 0))
    candidates = []
    for view, axis in views:
        indices = _gathered(view, axis, flat)
        if indices is not None:
            new = _gather_nodes(x, view, axis, indices, result, node, simplifier)
            candidates.append((_steps(new, simplifier), len(new), len(candidates), new))
    if not candidates:
        return (f"its moves take no whole slices of {block} elements or more (the channel block) along one axis, "
                "or neighbouring axes merged, of its input")
    before = _steps(run, simplifier)
    chosen, why = None, f"no Gather takes fewer than its {before} moving steps"
    for after, _, _, new in sorted(candidates, key=lambda candidate: candidate[:3]):
        if after >= before:
            break
        broken = next((f"{probe.op} would break: {failures[0]}" for probe in new
                       for failures in [simplifier.failures(probe)] if failures), None)
        if broken is None:
            chosen = new
            break
        why = broken
    if chosen is None:
        return why
    for member in run:
        detach(member)
    linked = [gs.Node(op=n.op, name=n.name, attrs=n.attrs, inputs=list(n.inputs), outputs=list(n.outputs))
              for n in chosen]
    simplifier.replace("moves_as_gather", run, linked)
    return True
