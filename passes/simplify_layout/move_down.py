"""`move_layout_down`: a relabel or Transpose made after the region of ops below it that compute
the same values in any layout (element-wise ops and kernels, Splits and Softmaxes along an axis
it keeps whole, Concats of operands a Transpose moved alike, Pads and Reduce*s with their axes
renamed (one that drops them ends the region), Gathers re-indexed, a LayerNorm or a
linear layer on the channels a Transpose moved last), where the relabels and Transposes reading
the region take it into their own, or a matrix multiply kernel reads its operand through it
(kernel_operands). `_Region` holds what the move passes and the shape each tensor gets; `_grow`
and `_classify` find it, `_probes` checks it against the target, `_apply` makes the move."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, replace_uses, set_input, unlinked_node
from rkcompile.ir.graph import constant_value, element_count, fused_body, is_onnx_domain, static_shape
from rkcompile.ir.patterns import matches
from rkcompile.plan.schema import FUSED_DOMAIN

from rkcompile.passes.fusion_table import layer_norm_core, rms_norm_core
from rkcompile.passes.simplify_layout.driver import ELEMENTWISE_OPS, LAYOUT_OPS, Simplifier, layout_move, layout_node
from rkcompile.passes.simplify_layout.kernel_operands import kernel_exit_problem, kernel_path


# --- move_layout_down -------------------------------------------------------------------------


def unmoved_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int, perm) -> int | None:
    """The axis of the unmoved layout `new` holding what `axis` holds in the moved layout `old`:
    the Transpose's own axis, or for a relabel an axis of the same extent after the same
    number of elements (so each slice along it is the same block of elements); None if none."""
    if perm is not None:
        return perm[axis]
    before = element_count(old[:axis])
    return next((a for a in range(len(new)) if new[a] == old[axis] and element_count(new[:a]) == before), None)


def _elementwise_fused(node: gs.Node) -> bool:
    """A fused kernel of element-wise members only (exGelu, exSwish, AddRelu, ...), each
    constant one value and each tensor of the kernel's output shape: it computes the same
    values in any layout."""
    body = fused_body(node)
    if body is None or len(node.outputs) != 1:
        return False
    shape = static_shape(node.outputs[0])
    for member in body.nodes:
        if member.op not in ELEMENTWISE_OPS or not is_onnx_domain(member):
            return False
        for t in (*member.inputs, *member.outputs):
            if isinstance(t, gs.Constant):
                if element_count(t.shape) != 1:
                    return False
            elif t.name and static_shape(t) != shape:
                return False
    return True


#: ops `move_layout_down` passes, re-written, when a Transpose moved the channel axis (axis 1)
#: of a 4-D tensor, or of a 3-D [N, C, L] one, last and they work on that last axis: a Transpose
#: to channels-last undone after them leaves a channel normalization and 1x1 Convs on the NCHW
#: tensor the NPU keeps anyway (a 3-D one, a feature map's flattened [N, C, H*W] before its
#: tokens [N, H*W, C], as [N, C, 1, L]).
CHANNEL_OPS = frozenset({"LayerNormalization", "MatMul"})


class _Region:
    """The nodes a layout move passes through, with the shape each of their tensors gets."""

    def __init__(self, entry: gs.Node, perm, fresh, opset: int, into_kernels: bool):
        self.perm, self.fresh, self.opset = perm, fresh, opset
        self.entries: list[gs.Node] = [entry]
        self.nodes: list[gs.Node] = []
        self.exits: list[gs.Node] = []
        #: after fusion: readers leading, through selecting ops, to a matrix multiply kernel
        #: that reads the move's result as part of its operand (`kernel_exit_problem`)
        self.into_kernels = into_kernels
        self.kernel_exits: list[gs.Node] = []
        self.shapes: dict[int, tuple[int, ...]] = {id(entry.outputs[0]): static_shape(entry.inputs[0])}
        self.constants: dict[tuple[int, int], gs.Constant] = {}  # (id(node), position) -> re-laid constant
        self.attrs: dict[int, dict] = {}  # id(node) -> its attributes that name axes, for the unmoved layout
        self.channel_ops: set[int] = set()  # ids of CHANNEL_OPS nodes re-written on the channel axis
        self.classified = {id(entry)}

    def same_move(self, node: gs.Node, moved_shape, unmoved) -> bool:
        """Whether `node` moves `unmoved`-shaped tensors to `moved_shape` as the entry does."""
        move = layout_move(node)
        return (move is not None and move[2] == self.perm and static_shape(move[0]) == tuple(unmoved)
                and static_shape(move[1]) == tuple(moved_shape))


def move_layout_down(node: gs.Node, simplifier: Simplifier):
    """A relabel or Transpose moves its tensor's elements; element-wise ops and Splits compute
    the same values wherever the elements are, so the move can be made after them instead,
    where the relabels or Transposes reading the region take it into their own. The entry
    leaves (with any twin doing the same move to another operand); each exit becomes one
    node, or none when the moves cancel (Reshape -> GELU -> Reshape around a Conv's layout)."""
    move = layout_move(node)
    if move is None:
        return None
    source, result, perm = move
    region = _Region(node, perm, simplifier.fresh, simplifier.ctx.graph.opset, simplifier.fused)
    problem = _grow(region, simplifier)
    if problem:
        return problem
    if not region.exits and not region.kernel_exits:
        return "no relabel or Transpose reads what follows it"
    if region.kernel_exits and not region.nodes:
        return "the matrix multiply reading it is next to it already"
    probes = _probes(region, simplifier)
    if isinstance(probes, str):
        return probes
    _apply(region, probes, simplifier)
    return True


def _grow(region: _Region, simplifier: Simplifier) -> str | None:
    """Classify every reader of the region's tensors as a region node or an exit, adding twin
    entries; why not, when one is neither."""
    frontier = [region.entries[0].outputs[0]]
    waiting: dict[int, gs.Node] = {}
    while frontier:
        tensor = frontier.pop()
        if tensor.name in simplifier.graph_outputs:
            return f"{tensor.name}, in the region it would move through, is a graph output"
        for reader in list(tensor.outputs):
            if id(reader) in region.classified:
                continue
            outcome = _classify(reader, tensor, region)
            if outcome is None:
                waiting[id(reader)] = reader  # an operand is not reached yet
                continue
            if isinstance(outcome, str):
                return outcome
            waiting.pop(id(reader), None)
            region.classified.add(id(reader))
            frontier.extend(outcome)
    if waiting:
        stuck = next(iter(waiting.values()))
        return f"{stuck.name} reads a tensor the move does not reach"
    return None


def _classify(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """The tensors `reader` adds to the region (none for an exit), None to wait for another
    operand, or why the move cannot pass it."""
    perm = region.perm
    unmoved = region.shapes[id(tensor)]
    exit_move = layout_move(reader)
    if exit_move is not None and exit_move[0] is tensor and (exit_move[2] is None) == (perm is None):
        region.exits.append(reader)
        return []
    if region.into_kernels and kernel_path(reader) is not None:
        region.kernel_exits.append(reader)
        return []
    if reader.op == "Gather" and is_onnx_domain(reader) and reader.inputs[0] is tensor:
        return _gather_moved(reader, tensor, region)
    if perm is not None and is_onnx_domain(reader) and reader.op in AXIS_NAMING_OPS and reader.inputs[0] is tensor:
        return _axes_renamed(reader, tensor, region)
    along = _along_one_axis(reader, tensor, region.opset)
    if along is not None:
        moved = static_shape(tensor)
        axis = along % len(moved)
        new_axis = unmoved_axis(moved, unmoved, axis, perm)
        if new_axis is None or any(static_shape(t) is None for t in reader.outputs):
            return f"{reader.name} ({reader.op}) works along an axis the move does not keep"
        region.attrs[id(reader)] = {"axis": new_axis}
        region.nodes.append(reader)
        for part in reader.outputs:
            size = static_shape(part)[axis]
            region.shapes[id(part)] = tuple(size if a == new_axis else d for a, d in enumerate(unmoved))
        return list(reader.outputs)
    if is_onnx_domain(reader) and reader.op in CHANNEL_OPS:
        return _classify_channel_op(reader, tensor, region)
    fused = reader.domain == FUSED_DOMAIN and _elementwise_fused(reader)
    # a Concat joins operands a Transpose moved alike along the axis it moved there (MambaOut's
    # gated block joins a Split's part and its depthwise Conv's, each back to channels-last)
    concat = perm is not None and is_onnx_domain(reader) and reader.op == "Concat"
    if not fused and not concat and not (is_onnx_domain(reader) and reader.op in ELEMENTWISE_OPS
                                         and len(reader.outputs) == 1):
        return (f"{reader.name} ({reader.op}) is neither element-wise, a Split, a Softmax, a Concat of "
                "transposed operands nor a relabel or Transpose")
    moved = static_shape(reader.outputs[0])
    if moved != static_shape(tensor):
        # A Transpose moves an operand that broadcasts (a LayerNorm's mean) as it moves the
        # result: the output's unmoved shape is its own axes put back, each operand checked below.
        if perm is None or moved is None:
            return f"{reader.name} broadcasts {tensor.name} to {moved}"
        unmoved = _unmoved_shape(moved, None, None, perm)
    constants, twins = {}, []
    for position, operand in enumerate(reader.inputs):
        if not operand.name:
            continue
        if id(operand) in region.shapes:
            if region.shapes[id(operand)] != _unmoved_shape(static_shape(operand), moved, unmoved, perm):
                return f"{reader.name} reads {operand.name}, laid out unlike {tensor.name}"
            continue
        if isinstance(operand, gs.Constant):
            if concat:
                return f"{reader.name} (Concat) joins a constant, {operand.name}"
            relaid = _relaid_constant(operand, moved, unmoved, perm, fused, region.fresh)
            if isinstance(relaid, str):
                return f"{reader.name}: {relaid}"
            if relaid is not operand:
                constants[(id(reader), position)] = relaid
            continue
        twin = operand.inputs[0] if len(operand.inputs) == 1 else None
        operand_unmoved = _unmoved_shape(static_shape(operand), moved, unmoved, perm)
        chain = _broadcast_chain(operand, operand_unmoved, region) if perm is not None and operand_unmoved else None
        if twin is not None and operand_unmoved and region.same_move(twin, static_shape(operand), operand_unmoved):
            twins.append((twin, operand))
        elif chain is not None:
            chain_twin, chain_nodes, chain_constants = chain
            twins.append((chain_twin, chain_twin.outputs[0]))
            for node in chain_nodes:
                region.classified.add(id(node))
                region.nodes.append(node)
                region.shapes[id(node.outputs[0])] = operand_unmoved
            region.constants.update(chain_constants)
        elif twin is not None and twin.op not in LAYOUT_OPS and id(twin) not in region.classified:
            return None  # perhaps a region node the search has not reached yet
        else:
            return f"{reader.name} reads {operand.name}, which is not moved as {tensor.name} is"
    region.constants.update(constants)
    if concat:
        region.attrs[id(reader)] = {"axis": perm[int(reader.attrs["axis"]) % len(perm)]}
    for twin, operand in twins:
        if id(twin) not in region.classified:
            region.classified.add(id(twin))
            region.entries.append(twin)
            region.shapes[id(operand)] = static_shape(twin.inputs[0])
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = tuple(unmoved)
    return [operand for _, operand in twins] + [reader.outputs[0]]


#: ops that compute each slice along one axis from that slice alone (opset 13 on for the
#: Softmax family: before it they normalize every axis from `axis` on together)
ONE_AXIS_OPS = {"Split": 0, "Softmax": -1, "LogSoftmax": -1}


def _along_one_axis(reader: gs.Node, tensor: gs.Tensor, opset: int) -> int | None:
    """The axis `reader`, one of ONE_AXIS_OPS reading `tensor` as its data, works along; None
    for any other reader. A move passes it when it keeps that axis whole: each slice is then
    the same elements in the same order, and the op computes the same values from it."""
    if (not is_onnx_domain(reader) or reader.op not in ONE_AXIS_OPS or reader.inputs[0] is not tensor
            or (reader.op != "Split" and (opset < 13 or len(reader.outputs) != 1))):
        return None
    return int(reader.attrs.get("axis", ONE_AXIS_OPS[reader.op]))


def _unmoved_shape(shape, moved, unmoved, perm) -> tuple[int, ...] | None:
    """The unmoved layout's shape of a region operand of `shape` beside a region tensor moved from
    `unmoved` to `moved`: for a relabel only `moved` itself has one; for a Transpose any shape
    of its rank does (an operand that broadcasts), its axes put back."""
    if perm is None:
        return tuple(unmoved) if shape == tuple(moved) else None
    if shape is None or len(shape) != len(perm):
        return None
    restored = [0] * len(perm)
    for axis, source in enumerate(perm):
        restored[source] = shape[axis]
    return tuple(restored)


def _broadcast_chain(operand: gs.Tensor, unmoved, region: _Region):
    """(Transpose, nodes, re-laid constants) when `operand` is made from a Transpose doing the
    region's move by element-wise ops of it and constants, each tensor of `operand`'s shape and
    read by the next alone, so the chain can run on the unmoved layout with the region; else None."""
    shape, nodes, constants = static_shape(operand), [], {}
    tensor = operand
    while True:
        maker = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if maker is None or id(maker) in region.classified or len(tensor.outputs) != 1:
            return None
        if region.same_move(maker, shape, unmoved) and nodes:
            return maker, nodes[::-1], constants
        if not (is_onnx_domain(maker) and maker.op in ELEMENTWISE_OPS and len(maker.outputs) == 1):
            return None
        variables = [t for t in maker.inputs if t.name and not isinstance(t, gs.Constant)]
        if len(variables) != 1 or static_shape(variables[0]) != shape:
            return None
        for position, constant_input in enumerate(maker.inputs):
            if isinstance(constant_input, gs.Constant):
                relaid = _relaid_constant(constant_input, shape, unmoved, region.perm, False, region.fresh)
                if isinstance(relaid, str):
                    return None
                if relaid is not constant_input:
                    constants[(id(maker), position)] = relaid
        nodes.append(maker)
        tensor = variables[0]


#: ops whose attributes or constant inputs name the axes they work along; a Transpose passes
#: them with the axes renamed (a Reduce* that drops the reduced axes ends it: `_axes_renamed`)
AXIS_NAMING_OPS = frozenset({"Pad", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd",
                             "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})


def _axes_renamed(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """`reader` (Pad or a Reduce*) run on the unmoved layout, its axes or pads renamed: what
    it does along moved axis a it does along the unmoved layout's perm[a]. Exact: every output
    is computed from the same elements by the same arithmetic. A Reduce* that drops the axes
    it reduces ends the move when the axes it keeps come in the same order on the unmoved
    layout: its output is then the same tensor (MambaOut's pooling of its channels-last map
    before the classifier), and the region takes nothing after it."""
    perm, rank = region.perm, len(region.perm)
    out_shape = static_shape(reader.outputs[0])
    if out_shape is None or len(reader.outputs) != 1:
        return f"{reader.name} ({reader.op}) has no one output of known shape"
    constant_inputs = {}
    drops = False
    if reader.op == "Pad":
        if len(out_shape) != rank:
            return f"{reader.name} ({reader.op}) changes the rank"
        if reader.attrs.get("mode", "constant") not in ("constant", "reflect", "edge") or len(reader.inputs) > 3:
            return f"{reader.name} pads with a mode or an axes input the move does not rename"
        if len(reader.inputs) > 2 and reader.inputs[2].name and constant_value(reader.inputs[2]) is None:
            return f"{reader.name}'s pad value is not a constant"
        pads = reader.attrs.get("pads") if len(reader.inputs) < 2 else constant_value(reader.inputs[1])
        if pads is None or len(pads) != 2 * rank:
            return f"{reader.name}'s pads are not a constant of two per axis"
        pads = np.asarray(pads, dtype=np.int64)
        renamed = np.zeros_like(pads)
        renamed[list(perm)], renamed[[rank + p for p in perm]] = pads[:rank], pads[rank:]
        if len(reader.inputs) < 2:
            region.attrs[id(reader)] = {"pads": renamed.tolist()}
        else:
            constant_inputs[1] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), renamed)
    else:
        from_input = len(reader.inputs) > 1 and reader.inputs[1].name
        axes = constant_value(reader.inputs[1]) if from_input else reader.attrs.get("axes")
        if axes is None:
            return f"{reader.name} reduces every axis or its axes are not a constant"
        reduced = {int(a) % rank for a in np.asarray(axes).reshape(-1)}
        kept = [perm[a] for a in range(rank) if a not in reduced]
        drops = not reader.attrs.get("keepdims", 1)
        if len(out_shape) != (len(kept) if drops else rank):
            return f"{reader.name} ({reader.op}) changes the rank"
        if drops and kept != sorted(kept):
            return f"{reader.name} drops the axes it reduces and the move reorders the axes it keeps"
        renamed = np.array(sorted(perm[a] for a in reduced), dtype=np.int64)
        if from_input:
            constant_inputs[1] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), renamed)
        else:
            region.attrs[id(reader)] = {"axes": renamed.tolist()}
    region.constants.update({(id(reader), position): c for position, c in constant_inputs.items()})
    region.nodes.append(reader)
    if drops:
        region.shapes[id(reader.outputs[0])] = out_shape
        return []
    region.shapes[id(reader.outputs[0])] = _unmoved_shape(out_shape, None, None, perm)
    return [reader.outputs[0]]


def _classify_channel_op(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """A LayerNormalization over the last axis or a MatMul by a constant [C, D] of a 3-D or 4-D
    tensor whose last axis is the channel axis before the move: the region's tensors it adds, or
    why the move cannot pass it."""
    moved, unmoved = static_shape(tensor), region.shapes[id(tensor)]
    rank = len(moved)
    if region.perm is None or rank not in (3, 4) or region.perm[-1] != 1 or reader.inputs[0] is not tensor:
        return f"{reader.name} ({reader.op}) does not work on the channels a Transpose moved last"
    if reader.op == "LayerNormalization":
        if int(reader.attrs.get("axis", -1)) % rank != rank - 1 or any(t.name for t in reader.outputs[1:]):
            return f"{reader.name} normalizes more than the last axis, or its statistics are read"
        if any(t.name and not isinstance(t, gs.Constant) for t in reader.inputs[1:]):
            return f"{reader.name}: its scale or bias is not constant"
        out = tuple(unmoved)
    else:
        weights = reader.inputs[1] if len(reader.inputs) == 2 else None
        if not isinstance(weights, gs.Constant) or len(weights.shape) != 2 or weights.shape[0] != moved[-1]:
            return f"{reader.name} does not multiply by constant weights [C, D]"
        out = tuple(int(weights.shape[1]) if a == 1 else d for a, d in enumerate(unmoved))
    region.channel_ops.add(id(reader))
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = out
    return [reader.outputs[0]]


def _gather_moved(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """A Gather of constant indices along one axis keeping its extent (rotary embedding's
    rotate-half, a reordered Split) run on the unmoved layout: along the Transpose's own axis
    with the same indices, or, after a relabel, along the unmoved axis holding the gathered
    axis' blocks, each block's elements gathered as before. Exact: every output is the same
    element of the same tensor."""
    moved, unmoved = static_shape(tensor), region.shapes[id(tensor)]
    indices = constant_value(reader.inputs[1]) if len(reader.inputs) == 2 else None
    axis = int(reader.attrs.get("axis", 0)) % len(moved)
    if indices is None or indices.ndim != 1 or indices.size != moved[axis] or static_shape(reader.outputs[0]) != moved:
        return f"{reader.name} does not gather constant indices along one axis keeping its extent"
    indices = np.where(indices < 0, indices + moved[axis], indices).astype(np.int64)
    if region.perm is not None:
        new_axis, new_indices = region.perm[axis], indices
    else:
        found = _gathered_axis(moved, unmoved, axis, indices)
        if found is None:
            return f"{reader.name} gathers along an axis the relabel splits"
        new_axis, new_indices = found
    region.constants[(id(reader), 1)] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), new_indices)
    region.attrs[id(reader)] = {"axis": new_axis}
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = tuple(unmoved)
    return [reader.outputs[0]]


def _gathered_axis(moved, unmoved, axis: int, indices: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(axis, indices) of the Gather along `unmoved` doing what a Gather of `indices` along
    `axis` of the relabelled `moved` does: the unmoved axis whose elements step over the moved
    axis' ones, when every block of the moved axis lies within one run of it; else None."""
    inner = element_count(moved[axis + 1:])
    for candidate, extent in enumerate(unmoved):
        step = element_count(unmoved[candidate + 1:])
        if extent == 1 or not step <= inner < step * extent:
            continue
        block = moved[axis] * inner
        if inner % step or (step * extent) % block:
            return None
        positions = np.arange(extent).reshape(step * extent // block, moved[axis], inner // step)
        return candidate, positions[:, indices, :].reshape(-1)
    return None


def _on_channel_axis(node: gs.Node, x: gs.Tensor, y: gs.Tensor, simplifier: Simplifier,
                     linked: bool) -> list[gs.Node]:
    """The nodes computing CHANNEL_OPS `node`'s work on NCHW (or [N, C, L]) `x` into `y`,
    reducing axis 1: a 1x1 Conv with the MatMul's weights transposed (the same products and
    sums; [N, C, L] relabelled to [N, C, 1, L] around it), or LayerNormalization's arithmetic as
    ONNX defines it, mean, centred values, mean square, epsilon, square root, division, then scale
    and bias as [C, 1, 1] (or [C, 1]) constants."""
    fresh = simplifier.fresh
    base = node.name or y.name

    new_node = gs.Node if linked else unlinked_node

    def make(op, inputs, out=None, **attrs):
        made = out or gs.Variable(fresh(f"{base}/{op.lower()}"), x.dtype, list(static_shape(x)))
        nodes.append(new_node(op=op, name=fresh(f"{base}/{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[made]))
        return made

    def const(label, values):
        return gs.Constant(fresh(f"{base}/{label}"), np.ascontiguousarray(values))

    nodes: list[gs.Node] = []
    x_shape = static_shape(x)
    if node.op == "MatMul":
        weights = constant_value(node.inputs[1])
        if len(x_shape) == 4:
            make("Conv", [x, const("weights", weights.T[:, :, None, None])], y, kernel_shape=[1, 1])
            return nodes
        batch, _, length = x_shape
        planar = make("Reshape", [x, const("planar", np.array([batch, -1, 1, length], np.int64))])
        planar.shape = [batch, x_shape[1], 1, length]
        convolved = make("Conv", [planar, const("weights", weights.T[:, :, None, None])], kernel_shape=[1, 1])
        convolved.shape = [batch, int(weights.shape[1]), 1, length]
        make("Reshape", [convolved, const("flat", np.array(static_shape(y), np.int64))], y)
        return nodes
    dtype = constant_value(node.inputs[1]).dtype
    channels = x_shape[1]

    def mean(value):
        if simplifier.ctx.graph.opset >= 18:
            made = make("ReduceMean", [value, const("axes", np.array([1], dtype=np.int64))], keepdims=1)
        else:
            made = make("ReduceMean", [value], axes=[1], keepdims=1)
        made.shape = [*made.shape[:1], 1, *made.shape[2:]]
        return made

    average = mean(x)
    centred = make("Sub", [x, average])
    variance = mean(make("Pow", [centred, const("two", np.array(2.0, dtype))]))
    epsilon = np.array(node.attrs.get("epsilon", 1e-5), dtype)
    root = make("Sqrt", [make("Add", [variance, const("epsilon", epsilon)])])
    root.shape = list(variance.shape)
    affine = [t for t in node.inputs[1:] if t.name]
    value = make("Div", [centred, root], None if affine else y)
    for position, (op, param) in enumerate(zip(("Mul", "Add"), affine)):
        last = position == len(affine) - 1
        channel = np.broadcast_to(constant_value(param), (channels,)).reshape(channels, *[1] * (len(x_shape) - 2))
        value = make(op, [value, const(op.lower(), channel)], y if last else None)
    return nodes


def _relaid_constant(operand: gs.Constant, moved, unmoved, perm, fused: bool, fresh):
    """`operand` for the unmoved layout: itself when one value of rank the unmoved layout
    takes, a Transpose's inverse of it, or for a relabel, the same values relabelled when it
    has the moved shape; else why not."""
    shape = tuple(operand.shape)
    if element_count(shape) == 1 and len(shape) <= len(unmoved):
        return operand
    if fused:
        return f"constant {operand.name} is not one value"
    values = constant_value(operand)
    if perm is not None and len(shape) <= len(moved):
        aligned = values.reshape((1,) * (len(moved) - len(shape)) + shape)
        return gs.Constant(fresh(f"{operand.name}/unmoved"), np.ascontiguousarray(aligned.transpose(np.argsort(perm))))
    if perm is None and shape == tuple(moved):
        return gs.Constant(fresh(f"{operand.name}/unmoved"), np.ascontiguousarray(values.reshape(unmoved)))
    return f"constant {operand.name} {list(shape)} cannot follow the move"


def _composed(exit_node: gs.Node, region: _Region) -> tuple[int, ...] | None:
    """The exit's new perm (Transposes) or None (relabels)."""
    if region.perm is None:
        return None
    own = layout_move(exit_node)[2]
    return tuple(region.perm[q] for q in own)


#: a LayerNorm and an RMSNorm as exporters write them out (fusion_table's exNorm rows)
NORM_CORES = (layer_norm_core(), rms_norm_core())


def _channel_norm_members(region: _Region, simplifier: Simplifier) -> set[int]:
    """Ids of the region's nodes that, moved, are a LayerNorm or RMSNorm written out over the
    channel axis alone, on a target with exNorm: the fusion table's exNorm rows absorb them
    (their own rules, such as Div's broadcast of [1, 1, H, W], then do not apply; the rows'
    predicate checks the axes), as it absorbs the arithmetic `_on_channel_axis` writes for a
    LayerNormalization."""
    if not simplifier.ctx.target.has_kernel("exNorm"):
        return set()
    in_region = {id(n) for n in region.nodes}
    members: set[int] = set()
    for root in region.nodes:
        if root.op not in ("Div", "Mul") or id(root) in members:
            continue
        for match in (m for core in NORM_CORES for m in matches(core, root)):
            reductions = [n for n in match.members if n.op == "ReduceMean"]
            if (id(match.tensors["x"]) in region.shapes and all(id(n) in in_region for n in match.members)
                    and all(_unmoved_axes(n, region) == [1] for n in reductions)):
                members.update(id(n) for n in match.members)
                break
    return members


def _unmoved_axes(reduction: gs.Node, region: _Region) -> list[int] | None:
    """The axes a region's Reduce* reduces on the unmoved layout (`_axes_renamed`)."""
    renamed = region.attrs.get(id(reduction), {}).get("axes")
    if renamed is None and (id(reduction), 1) in region.constants:
        renamed = constant_value(region.constants[(id(reduction), 1)])
    return None if renamed is None else [int(a) for a in np.asarray(renamed).reshape(-1)]


def _cancels(exit_node: gs.Node, region: _Region, simplifier: Simplifier) -> bool:
    """Whether the region's exit `exit_node` undoes the move (no node left), writing no graph
    output."""
    perm = _composed(exit_node, region)
    unmoved, out = region.shapes[id(exit_node.inputs[0])], exit_node.outputs[0]
    cancels = (list(perm) == sorted(perm)) if perm is not None else tuple(unmoved) == static_shape(out)
    return cancels and out.name not in simplifier.graph_outputs


def _probes(region: _Region, simplifier: Simplifier):
    """Unlinked copies of the region's nodes and exits as they will be, each checked against
    the target; why not when one passes fewer rules than before, or the move stores more in
    the NPU's NC1HWC2 layout (fewer channels padded to C2: a move is not worth a larger arena):
    a tensor of the entry's size in more bytes, or the smaller ones (one value per position,
    padded from one channel to C2) in more bytes than the entries' and the cancelled exits'
    tensors that leave with the move. A norm's statistics that exNorm absorbs are never stored.
    A move into a matrix multiply kernel is judged by the layout at the top of the moves above
    it (`_layout_chain_top`): they follow it down, each the next one's entry, into the kernel,
    so the region's tensors of the entry's size end in that layout, not in the one between."""
    shapes = region.shapes
    full_size = element_count(static_shape(region.entries[0].outputs[0]))
    absorbed = _channel_norm_members(region, simplifier)
    top = _layout_chain_top(region, simplifier)
    # where every exit cancels the move, the region runs between two tensors of the entry's
    # source layout that the plan holds anyway, and both Transposes go: no tensor larger than
    # that source is made (CaiT's talking heads: scores [1, 4, 196, 196], 4 channels padded to
    # C2, Transposed to [1, 196, 196, 4] around a Linear over the heads and back)
    exits_cancel = top is None and region.exits and not region.kernel_exits and all(
        _cancels(exit_node, region, simplifier) for exit_node in region.exits)
    source = simplifier.stored_bytes(static_shape(region.entries[0].inputs[0])) if exits_cancel else 0
    growth = 0.0
    for node in region.nodes:
        if id(node) in absorbed and element_count(static_shape(node.outputs[0])) < full_size:
            continue
        for t in node.outputs:
            eventual = top if top is not None and element_count(static_shape(t)) == full_size else shapes[id(t)]
            before, after = simplifier.stored_bytes(static_shape(t)), simplifier.stored_bytes(eventual)
            if after > max(before, source) and element_count(static_shape(t)) >= full_size:
                return f"{t.name} would take {after} bytes on the NPU instead of {before}"
            growth += after - before

    def probe_tensor(t):
        if isinstance(t, gs.Constant) or not t.name:
            return t
        return gs.Variable(t.name, t.dtype, list(shapes.get(id(t), static_shape(t) or [])))

    for node in region.nodes:
        if id(node) in absorbed:
            continue
        if id(node) in region.channel_ops:
            for probe in _on_channel_axis(node, probe_tensor(node.inputs[0]), probe_tensor(node.outputs[0]),
                                          simplifier, linked=False):
                problem = simplifier.passes_as_before(node, probe)
                if problem:
                    return problem
            continue
        inputs = [region.constants.get((id(node), i)) or probe_tensor(t) for i, t in enumerate(node.inputs)]
        attrs = dict(node.attrs, **region.attrs.get(id(node), {}))
        probe = unlinked_node(op=node.op, name=node.name, attrs=attrs, inputs=inputs,
                              outputs=[probe_tensor(t) for t in node.outputs], domain=node.domain)
        problem = simplifier.passes_as_before(node, probe)
        if problem:
            return problem
    exits = []
    for exit_node in region.exits:
        read = exit_node.inputs[0]
        unmoved, out = shapes[id(read)], exit_node.outputs[0]
        perm = _composed(exit_node, region)
        if _cancels(exit_node, region, simplifier):
            growth -= simplifier.stored_bytes(static_shape(out))
            exits.append(None)
            continue
        reshaped = gs.Variable(read.name, read.dtype, list(unmoved))
        made = layout_node(reshaped, out, perm, exit_node.name, simplifier.fresh, unlinked_node)
        problem = simplifier.passes_as_before(exit_node, made)
        if problem:
            return problem
        exits.append(made)
    for reader in region.kernel_exits:
        for position in _region_reads(reader, region):
            problem = kernel_exit_problem(reader, position, shapes[id(reader.inputs[position])], region.perm, simplifier)
            if problem:
                return f"{reader.name} leads to a matrix multiply that cannot take the move in: {problem}"
    growth -= sum(simplifier.stored_bytes(static_shape(entry.outputs[0])) for entry in region.entries)
    if growth > 0:
        return f"the tensors it passes would take {growth:g} bytes more on the NPU than the moves it removes"
    return exits


def _layout_chain_top(region: _Region, simplifier: Simplifier) -> tuple[int, ...] | None:
    """The shape the moves above a lone entry with kernel exits start from: the input of the
    first of the relabels and Transposes each read by the next alone that end in the entry;
    None without kernel exits, twins, or a move above it."""
    if not region.kernel_exits or len(region.entries) != 1:
        return None
    top, tensor = None, region.entries[0].inputs[0]
    while len(tensor.inputs) == 1 and len(tensor.outputs) == 1 and tensor.name not in simplifier.graph_outputs:
        move = layout_move(tensor.inputs[0])
        if move is None:
            break
        tensor = move[0]
        top = static_shape(tensor)
    return top


def _region_reads(reader: gs.Node, region: _Region) -> list[int]:
    """The input positions at which `reader` reads a tensor of the region."""
    return [position for position, t in enumerate(reader.inputs) if id(t) in region.shapes]


def _apply(region: _Region, exits: list, simplifier: Simplifier) -> None:
    """Make the move: entries out, region re-laid, exits composed, and the move made again in
    front of each kernel exit, carrying the entries' original nodes until the kernel takes it
    in. As when the rewrite pass collapses relabels (rewrites.layout_ops.collapse_relabels), an
    exit carries its own original nodes and an entry's are otherwise reported removed."""
    kernel_reads = [(reader, position, static_shape(reader.inputs[position]))
                    for reader in region.kernel_exits for position in _region_reads(reader, region)]
    for entry in region.entries:
        replace_uses(entry.outputs[0], entry.inputs[0])
        detach(entry)
    for node in region.nodes:
        if id(node) in region.channel_ops:
            x, y = node.inputs[0], node.outputs[0]
            y.shape = list(region.shapes[id(y)])
            made = _on_channel_axis(node, x, y, simplifier, linked=True)
            detach(node)
            simplifier.replace("move_layout_down", [node], made)
            continue
        for (node_id, position), relaid in region.constants.items():
            if node_id == id(node):
                set_input(node, position, relaid)
        if id(node) in region.attrs:
            node.attrs = dict(node.attrs, **region.attrs[id(node)])
        for t in node.outputs:
            t.shape = list(region.shapes[id(t)])
        body = fused_body(node)
        if body is not None:  # its tensors all have its output's shape (_elementwise_fused)
            for t in (*body.inputs, *(t for member in body.nodes for t in member.outputs)):
                t.shape = list(node.outputs[0].shape)
        simplifier.ctx.failures[node.name] = simplifier.failures(node)
    for exit_node, made in zip(region.exits, exits):
        read, out = exit_node.inputs[0], exit_node.outputs[0]
        detach(exit_node)
        if made is None:
            replace_uses(out, read)
            simplifier.drop(exit_node, "move_layout_down")
        else:
            node = gs.Node(op=made.op, name=made.name, attrs=made.attrs, inputs=[read, *made.inputs[1:]], outputs=[out])
            simplifier.replace("move_layout_down", [exit_node], [node])
    moves = []
    for reader, position, moved_shape in kernel_reads:
        read = reader.inputs[position]
        result = gs.Variable(simplifier.fresh(f"{read.name}/moved"), read.dtype, list(moved_shape))
        moves.append(layout_node(read, result, region.perm, region.entries[0].name, simplifier.fresh))
        body = fused_body(reader)
        if body is not None:  # its body reads the input it had there by name
            computed = [t for t in reader.inputs[:position] if t.name and not isinstance(t, gs.Constant)]
            body.inputs[len(computed)].name = result.name
        set_input(reader, position, result)
    if moves:
        simplifier.replace("move_layout_down", list(region.entries), moves)
        return
    for entry in region.entries:
        simplifier.drop(entry, "move_layout_down")
