"""Which float arithmetic an integer result is rounded from: legalize keeps it off the NPU
(legalize.INTEGER_RESULT_RULE) and the rewrite pass leaves it as the model wrote it.

The walk starts at every float -> integer conversion (a Cast to an integer or bool type,
Round, Floor, Ceil, QuantizeLinear's x and scale, DynamicQuantizeLinear) and goes back through
ROUNDED_ARITHMETIC. It follows only the elements that reach the conversion where data movement
says which ones with constants: `rois[:, 0].to(int64)` of `rois = cat([ids, boxes], 1)`
(torchvision's MultiScaleRoIAlign) rounds the ids alone, so the box arithmetic stays where it
was. A selection is one axis and the indices along it that matter; None means every element.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, is_onnx_domain, present_inputs

#: float -> integer conversions, with the inputs whose values they round (QuantizeLinear divides
#: x by its scale, then rounds)
INTEGER_CONVERSIONS = {"Cast": (0,), "Round": (0,), "Floor": (0,), "Ceil": (0,), "QuantizeLinear": (0, 1),
                       "DynamicQuantizeLinear": (0,)}
#: ops an integer result depends on value for value, walked back from a conversion: exact
#: arithmetic, reductions that pick or add, and data movement (on the NPU even a Reshape stores
#: its result as float16). Any other op (a convolution, a transcendental activation, ...) ends
#: the walk: its float16 result is the float16 plan's approximation, as for any float output.
ROUNDED_ARITHMETIC = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Reciprocal", "Min", "Max", "Sum", "Mean", "Clip", "Relu",
    "Round", "Floor", "Ceil", "Sign", "Mod",
    "ReduceMin", "ReduceMax", "ReduceSum", "ReduceMean",
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Concat", "Split", "Slice",
    "Gather", "Tile", "Pad", "Where", "DepthToSpace", "SpaceToDepth"})
#: selections one node is walked with before the walk takes all of it (keeps the walk linear)
MAX_SELECTIONS_PER_NODE = 4

Selection = "tuple[int, frozenset[int]] | None"


def rounded_to_integers(graph: gs.Graph) -> dict[str, str]:
    """Node name -> the conversion that rounds its result to integers ("rounded by NAME (OP)"),
    for every node of ROUNDED_ARITHMETIC some of whose float result reaches a conversion
    through such nodes only."""
    rounded: dict[str, str] = {}
    seen: dict[str, set] = {}
    pending: list[tuple[gs.Tensor, str, Selection]] = []
    for node in graph.nodes:
        if not is_onnx_domain(node) or node.op not in INTEGER_CONVERSIONS:
            continue
        if node.op == "Cast" and not _integer_dtype(dtype_name(node.attrs.get("to"))):
            continue
        converted = f"rounded by {node.name} ({node.op}" + \
            (f" to {dtype_name(node.attrs.get('to'))})" if node.op == "Cast" else ")")
        pending += [(node.inputs[i], converted, None) for i in INTEGER_CONVERSIONS[node.op] if i < len(node.inputs)]
    while pending:
        tensor, converted, selection = pending.pop()
        if isinstance(tensor, gs.Constant) or not tensor.name or dtype_name(tensor.dtype) not in FLOAT_DTYPES:
            continue
        for producer in tensor.inputs:
            if not is_onnx_domain(producer) or producer.op not in ROUNDED_ARITHMETIC:
                continue
            walked = seen.setdefault(producer.name, set())
            if None in walked or selection in walked:
                continue
            if len(walked) >= MAX_SELECTIONS_PER_NODE:
                selection = None
            walked.add(selection)
            rounded.setdefault(producer.name, converted)
            pending += [(t, converted, part) for t, part in _read_parts(producer, selection)]
    return rounded


def _integer_dtype(name: str | None) -> bool:
    return name is not None and (name == "bool" or name.startswith(("int", "uint")))


def _read_parts(node: gs.Node, selection: Selection) -> list[tuple[gs.Tensor, Selection]]:
    """The node's inputs, each with the part of it the selected part of its output reads."""
    if node.op == "Gather":
        return [(node.inputs[0], _gather_part(node, selection))]
    if node.op == "Concat" and selection is not None:
        return _concat_parts(node, selection)
    if node.op in ("Squeeze", "Unsqueeze", "Transpose") and selection is not None:
        return [(node.inputs[0], _relabelled_part(node, selection))]
    return [(t, None) for t in present_inputs(node)]


def _rank(tensor: gs.Tensor) -> int | None:
    return len(tensor.shape) if tensor.shape is not None else None


def _gather_part(node: gs.Node, selection: Selection) -> Selection:
    """Constant indices read only those indices of the data; dynamic ones pass a selection on
    another axis through."""
    data, indices = node.inputs[0], node.inputs[1]
    rank, index_rank = _rank(data), _rank(indices)
    if rank is None or index_rank is None:
        return None
    axis = int(node.attrs.get("axis", 0)) % rank
    picked = constant_value(indices)
    size = data.shape[axis]
    if picked is not None and isinstance(size, int):
        positions = [int(i) % size for i in picked.flat]
        if selection is not None and index_rank == 1 and selection[0] == axis:
            return axis, frozenset(positions[t] for t in selection[1] if t < len(positions))
        return axis, frozenset(positions)
    if selection is None:
        return None
    out_axis, kept = selection
    if out_axis < axis:
        return out_axis, kept
    if out_axis >= axis + index_rank:
        return out_axis - index_rank + 1, kept
    return None


def _concat_parts(node: gs.Node, selection) -> list[tuple[gs.Tensor, Selection]]:
    """A selection along the Concat's axis reaches only the inputs it overlaps."""
    inputs = present_inputs(node)
    rank = _rank(node.outputs[0])
    out_axis, kept = selection
    if rank is None or out_axis != int(node.attrs.get("axis", 0)) % rank:
        return [(t, selection) for t in inputs]
    sizes = [t.shape[out_axis] if t.shape is not None else None for t in inputs]
    if not all(isinstance(s, int) for s in sizes):
        return [(t, None) for t in inputs]
    parts, offset = [], 0
    for tensor, size in zip(inputs, sizes):
        inside = frozenset(k - offset for k in kept if offset <= k < offset + size)
        if inside:
            parts.append((tensor, (out_axis, inside)))
        offset += size
    return parts


def _relabelled_part(node: gs.Node, selection) -> Selection:
    """The selected output axis as an axis of the input (Squeeze, Unsqueeze, Transpose)."""
    out_axis, kept = selection
    rank_in, rank_out = _rank(node.inputs[0]), _rank(node.outputs[0])
    if rank_in is None or rank_out is None:
        return None
    if node.op == "Transpose":
        perm = [int(p) for p in node.attrs.get("perm", range(rank_in - 1, -1, -1))]
        return perm[out_axis], kept
    axes = constant_value(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    if axes is None:
        return None
    if node.op == "Squeeze":
        axes = {int(a) % rank_in for a in axes}
        return [a for a in range(rank_in) if a not in axes][out_axis], kept
    axes = {int(a) % rank_out for a in axes}
    if out_axis in axes:
        return None
    return out_axis - sum(a < out_axis for a in axes), kept
