"""A run of layout moves as the one move it makes: `moves_as_gather`."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, unlinked_node
from rkcompile.ir.graph import constant_value, element_count, is_onnx_domain, static_shape

from rkcompile.passes.simplify_layout.driver import Simplifier, layout_move

#: the largest run input whose element positions the rule traces (an int64 per element)
MAX_TRACED_ELEMENTS = 1 << 24


def _gather_indices(node: gs.Node) -> np.ndarray | None:
    """The constant indices of a Gather of known shapes (negative ones counted from the end),
    else None."""
    if not is_onnx_domain(node) or node.op != "Gather" or len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    shape, indices = static_shape(node.inputs[0]), constant_value(node.inputs[1])
    if shape is None or indices is None or static_shape(node.outputs[0]) is None:
        return None
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    return np.asarray(indices, np.int64) % shape[axis]


def _is_move(node: gs.Node | None) -> bool:
    return node is not None and (layout_move(node) is not None or _gather_indices(node) is not None)


def _moved(positions: np.ndarray, node: gs.Node) -> np.ndarray:
    """`positions` (an array of the node's input shape) after the node's move."""
    out_shape = static_shape(node.outputs[0])
    if node.op == "Transpose":
        return positions.transpose(layout_move(node)[2])
    if node.op == "Gather":
        axis = int(node.attrs.get("axis", 0)) % positions.ndim
        return np.take(positions, _gather_indices(node), axis=axis).reshape(out_shape)
    return positions.reshape(out_shape)


def _one_axis_gather(source_shape: list[int], moved: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(axis, indices) of the Gather of `source_shape` whose result, in row-major order, is
    `moved` (the source position of each result element, row-major), outermost axis first;
    None when no one-axis Gather makes it."""
    flat = moved.reshape(-1)
    for axis, extent in enumerate(source_shape):
        outer, inner = element_count(source_shape[:axis]), element_count(source_shape[axis + 1:])
        if flat.size % (outer * inner):
            continue
        blocks = flat.reshape(outer, -1, inner)
        if np.any(blocks[0, :, 0] % inner):
            continue
        indices = blocks[0, :, 0] // inner
        if np.any(indices >= extent):
            continue
        expected = (np.arange(outer)[:, None, None] * (extent * inner) + indices[None, :, None] * inner
                    + np.arange(inner)[None, None, :])
        if np.array_equal(blocks, expected):
            return axis, indices
    return None


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
            positions = _moved(positions, move)
            if simplifier.stores_alike(shape, static_shape(move.outputs[0]), positions.reshape(-1)):
                fewest[last + 1] = min(fewest[last + 1], fewest[first])
    return fewest[-1]


def moves_as_gather(node: gs.Node, simplifier: Simplifier):
    """A run of layout moves (relabels, Transposes, Gathers of constant indices), each reading
    the one before alone, is the one move it makes of its first input's elements: where that
    move takes whole slices of one axis of the input, in any order, it is one Gather along that
    axis (then a relabel to the run's result shape, unless the Gather makes it), and where it
    moves nothing, one relabel. Swin's cyclic shift and window partition on token rows
    [L, C, 1, 1] (two Gathers of the shift, a relabel, two Transposes making the illegal swap
    of the window axes, a relabel) reorder whole rows of C channels: one Gather of rows for six
    steps. The NPU's Gather takes rank-1 indices on any axis (oplist V2.3.2, Gather);
    rknn-toolkit2 runs such shifts as Gathers too. Exact: every element is copied, none
    computed. Runs after every other layout rule and the kernels' takeovers of their operands'
    moves (`SimplifyLayout.run`), so a move another rule cancels, or a kernel reads for free,
    is never made a Gather. It applies only where it leaves fewer steps moving stored bytes (a
    relabel leaving each element where the NPU stores it is a view, no step), each passing the
    target's rules."""
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
        positions = _moved(positions, member)
    found = _one_axis_gather(x_shape, positions)
    if found is None:
        return "its moves take no whole slices of one axis of its input"
    axis, indices = found
    new: list[gs.Node] = []
    moved = x
    if not np.array_equal(indices, np.arange(x_shape[axis])):
        gathered_shape = x_shape[:axis] + [indices.size] + x_shape[axis + 1:]
        moved = result if gathered_shape == y_shape else gs.Variable(
            simplifier.fresh(f"{node.name}/gathered"), x.dtype, gathered_shape)
        index_tensor = gs.Constant(simplifier.fresh(f"{node.name}/indices"), indices.astype(np.int64))
        new.append(unlinked_node(op="Gather", name=simplifier.fresh(f"{node.name}/gather"), attrs={"axis": axis},
                                 inputs=[x, index_tensor], outputs=[moved]))
    if moved is not result:
        shape = gs.Constant(simplifier.fresh(f"{node.name}/shape"), np.array(y_shape, np.int64))
        new.append(unlinked_node(op="Reshape", name=simplifier.fresh(f"{node.name}/relabel"),
                                 inputs=[moved, shape], outputs=[result]))
    before, after = _steps(run, simplifier), _steps(new, simplifier)
    if after >= before:
        return f"its {before} moving steps would be {after}"
    for probe in new:
        broken = simplifier.failures(probe)
        if broken:
            return f"{probe.op} would break: {broken[0]}"
    for member in run:
        detach(member)
    linked = [gs.Node(op=n.op, name=n.name, attrs=n.attrs, inputs=list(n.inputs), outputs=list(n.outputs))
              for n in new]
    simplifier.replace("moves_as_gather", run, linked)
    return True
