"""Layout nodes that are no work, or the same work twice: `identity_layout` (a Transpose keeping
every axis in place, a relabel to the shape it reads), `shared_layout` (relabels or Transposes of
one tensor making the same result) and `slices_as_split` (Slices covering one axis once)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, replace_uses, unlinked_node
from rkcompile.ir.graph import constant_value, fused_body, is_onnx_domain, static_shape

from rkcompile.passes.simplify_layout.driver import Simplifier, layout_move


# --- identity_layout --------------------------------------------------------------------------


def identity_layout(node: gs.Node, simplifier: Simplifier):
    """A Transpose that keeps every axis in place, or a relabel to the shape it reads, moves no
    element: its readers read its input. One writing a graph output has its input's producer
    write the output instead, so the output keeps its name (as passes/remove_noops.py does)."""
    move = layout_move(node)
    if move is None:
        return None
    source, result, perm = move
    if perm is not None and list(perm) != sorted(perm) or static_shape(source) != static_shape(result):
        return None
    if result.name in simplifier.graph_outputs:
        made_by = source.inputs[0] if len(source.inputs) == 1 else None
        if made_by is None or source.name in simplifier.graph_outputs or len(source.outputs) != 1:
            return "it writes a graph output from a tensor it cannot rename"
        detach(node)
        position = made_by.outputs.index(source)
        made_by.outputs[position] = result
        body = fused_body(made_by)
        if body is not None:  # a kernel's body names its results as the kernel does
            body.outputs[position].name = result.name
    else:
        replace_uses(result, source)
        detach(node)
    simplifier.drop(node, "identity_layout")
    return True


# --- shared_layout ----------------------------------------------------------------------------


def _same_layout(one: gs.Node, other: gs.Node) -> bool:
    """Both lay out the same tensor by the same op, attributes and constant operands."""
    if (other.op != one.op or other.domain != one.domain or other.attrs != one.attrs
            or len(other.inputs) != len(one.inputs) or len(other.outputs) != 1
            or static_shape(other.outputs[0]) != static_shape(one.outputs[0])):
        return False
    for mine, theirs in zip(one.inputs[1:], other.inputs[1:]):
        if mine is theirs:
            continue
        values, others = constant_value(mine), constant_value(theirs)
        if values is None or others is None or not np.array_equal(values, others) or values.shape != others.shape:
            return False
    return one.inputs[0] is other.inputs[0]


def shared_layout(node: gs.Node, simplifier: Simplifier):
    """Relabels or Transposes of one tensor that make the same result are one node, read by
    the readers of all of them: a tensor read by two linear layers (the residual and the
    projection, or the q, k and v projections) is relabelled into the 1x1 Conv layout once."""
    if layout_move(node) is None:
        return None
    twins = [reader for reader in node.inputs[0].outputs
             if reader is not node and id(reader) not in simplifier.removed and _same_layout(node, reader)]
    twins = [twin for twin in twins if twin.outputs[0].name not in simplifier.graph_outputs]
    if not twins:
        return None
    inputs, result = list(node.inputs), node.outputs[0]
    for old in (node, *twins):
        made = old.outputs[0]
        detach(old)
        if made is not result:
            replace_uses(made, result)
    kept = gs.Node(op=node.op, name=node.name, domain=node.domain, attrs=dict(node.attrs), inputs=inputs,
                   outputs=[result])
    simplifier.replace("shared_layout", [node, *twins], [kept])
    return True


# --- slices_as_split --------------------------------------------------------------------------


def _slice_range(node: gs.Node, shape) -> tuple[int, int, int] | None:
    """(axis, start, end) of a Slice of constant bounds along one axis with step 1, normalized."""
    values = [constant_value(t) if t.name else None for t in node.inputs[1:5]]
    if len(node.inputs) < 3 or values[0] is None or values[1] is None:
        return None
    starts, ends = values[0].reshape(-1), values[1].reshape(-1)
    axes = values[2].reshape(-1) if len(values) > 2 and values[2] is not None else np.arange(starts.size)
    if len(values) > 2 and node.inputs[3].name and values[2] is None:
        return None
    if len(values) > 3 and node.inputs[4].name and (values[3] is None or np.any(values[3] != 1)):
        return None
    if starts.size != 1 or ends.size != 1 or axes.size != 1:
        return None
    axis = int(axes[0]) % len(shape)
    dim = shape[axis]
    start, end = int(starts[0]), int(ends[0])
    start = min(max(start + dim if start < 0 else start, 0), dim)
    end = min(max(end + dim if end < 0 else end, 0), dim)
    return axis, start, end


def slices_as_split(node: gs.Node, simplifier: Simplifier):
    """Slices of one tensor along one axis whose ranges cover it, each element once, are one
    Split of it: one step instead of one per Slice (rknn-toolkit2 runs attention's q/k/v
    unbinding as one Split)."""
    if node.op != "Slice" or not is_onnx_domain(node) or simplifier.ctx.graph.opset < 10:
        return None
    x = node.inputs[0]
    shape = static_shape(x)
    own = None if shape is None else _slice_range(node, shape)
    if own is None:
        return "its bounds are not constant, on one axis with step 1, of a known shape"
    group = []
    for reader in x.outputs:
        if reader.op == "Slice" and is_onnx_domain(reader) and reader.inputs[0] is x:
            found = _slice_range(reader, shape)
            if found is not None and found[0] == own[0] and all(r is not reader for _, _, r in group):
                group.append((found[1], found[2], reader))
    group.sort(key=lambda item: item[0])
    axis, covered = own[0], 0
    for start, end, _ in group:
        if start != covered or end <= start:
            return f"the Slices of {x.name} along axis {axis} do not cover it once"
        covered = end
    if covered != shape[axis] or len(group) < 2:
        return f"the Slices of {x.name} along axis {axis} do not cover it once"
    slices = [reader for _, _, reader in group]
    if any(simplifier.ctx.failures.get(s.name) for s in slices):
        return "a Slice of the group runs on the CPU"
    sizes = np.array([end - start for start, end, _ in group], dtype=np.int64)
    outputs = [s.outputs[0] for s in slices]
    name = simplifier.fresh(f"{slices[0].name}/split")
    if simplifier.ctx.graph.opset >= 13:
        inputs, attrs = [x, gs.Constant(simplifier.fresh(f"{name}/sizes"), sizes)], {"axis": axis}
    else:
        inputs, attrs = [x], {"axis": axis, "split": sizes.tolist()}
    probe = unlinked_node(op="Split", name=name, attrs=attrs, inputs=inputs, outputs=outputs)
    problem = simplifier.failures(probe)
    if problem:
        return f"the Split would break: {problem[0]}"
    for s in slices:
        detach(s)
    split = gs.Node(op="Split", name=name, attrs=attrs, inputs=inputs, outputs=outputs)
    simplifier.replace("slices_as_split", slices, [split])
    return True
