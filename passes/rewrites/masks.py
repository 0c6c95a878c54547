"""Mask rewrites: the boolean and integer mask arithmetic exporters write around attention
(transformers' attention-mask chain: Cast, Flatten, a Gather or GatherND of every index,
Reshapes, And with an all-true or a causal constant, Not, Expand, Where) reduced to what
computes. A Where reads its mask where the mask is made when its own broadcast moves the
elements as the chain does; otherwise an op that only moves, repeats or keeps a mask's elements
is done on the float values the mask selects instead, where the NPU runs it; a Where over a
combined mask is Wheres over its parts; a Cast to float is done before the integer relabels it
read. The oplist V2.3.2 computes int8/float16 tensors only, so on the mask itself each of these
ops would stay on the CPU."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, element_count, static_shape

from rkcompile.passes.rewrites.base import (RESHAPE_LIKE, Builder, Candidates, Replacement, RewriteRule,
    Site, producer, split_node)
from rkcompile.passes.rewrites.elementwise import BROADCAST_COPIES

#: Ops that move or repeat their first input's elements and compute nothing.
MOVING_OPS = RESHAPE_LIKE | {"Expand", "Transpose", "Identity"}

#: Boolean ops and the constant that leaves the other operand as it is.
IDENTITY_ELEMENT = {"And": True, "Or": False}


def _identity_operand(node: gs.Node) -> gs.Tensor | None:
    """For And/Or with a constant operand made of the op's identity element only (x AND true,
    x OR false): the other operand, which the op only broadcasts."""
    if node.op not in IDENTITY_ELEMENT or len(node.inputs) != 2:
        return None
    for kept, other in (node.inputs, node.inputs[::-1]):
        value = constant_value(other)
        if value is not None and constant_value(kept) is None and np.all(value == IDENTITY_ELEMENT[node.op]):
            return kept
    return None


def _picks_by_constant_indices(node: gs.Node) -> bool:
    """Gather, or GatherND without batch axes, whose indices are a constant: it picks elements."""
    if node.op == "GatherND" and int(node.attrs.get("batch_dims", 0)) != 0:
        return False
    return node.op in ("Gather", "GatherND") and constant_value(node.inputs[1]) is not None


def moved_input(node: gs.Node) -> gs.Tensor | None:
    """The tensor whose elements `node` only moves, repeats or keeps, or None when it computes."""
    if node.op in MOVING_OPS or _picks_by_constant_indices(node):
        return node.inputs[0]
    return _identity_operand(node)


def moved_chain(tensor: gs.Tensor) -> tuple[list[gs.Node], gs.Tensor]:
    """The nodes that only move, repeat or keep elements on the way to `tensor` (source first),
    and the tensor they start from."""
    chain, source = [], tensor
    while (made := producer(source)) is not None and (moved := moved_input(made)) is not None:
        chain.append(made)
        source = moved
    chain.reverse()
    return chain, source


def index_map(chain: list[gs.Node], source_shape: tuple[int, ...]) -> np.ndarray:
    """Which element of the chain's source each element of its result is: the chain (source
    first) run on the source's flat indices."""
    index = np.arange(element_count(source_shape)).reshape(source_shape)
    for node in chain:
        out_shape = static_shape(node.outputs[0])
        if node.op == "Transpose":
            index = np.transpose(index, [int(p) for p in node.attrs.get("perm", range(index.ndim - 1, -1, -1))])
        elif node.op == "Gather":
            index = np.take(index, constant_value(node.inputs[1]).astype(np.int64), axis=int(node.attrs.get("axis", 0)))
        elif node.op == "GatherND":  # batch_dims 0: the last axis of the indices addresses the leading axes
            picks = constant_value(node.inputs[1]).astype(np.int64)
            index = index[tuple(np.moveaxis(picks, -1, 0))]
        elif node.op in RESHAPE_LIKE:
            index = index.reshape(out_shape)
        else:  # Expand, Identity, And/Or with their identity element
            index = np.broadcast_to(index, out_shape)
    return index


def movement_into(tensor: gs.Tensor, out: gs.Tensor) -> tuple[list[gs.Node], gs.Tensor, np.ndarray] | str:
    """(chain, its source, which source element each element of `out` is) for a `tensor` that
    only moves, repeats or keeps its source's elements and broadcasts to `out`; else why not."""
    chain, source = moved_chain(tensor)
    if not chain:
        return "is not a moved, repeated or kept tensor"
    source_shape, out_shape = static_shape(source), static_shape(out)
    if source_shape is None or out_shape is None or any(static_shape(n.outputs[0]) is None for n in chain):
        return "has a shape that is unknown"
    return chain, source, np.broadcast_to(index_map(chain, source_shape), out_shape)


def compute_then_move(builder: Builder, op: str, source: gs.Tensor, operands: list[gs.Tensor],
                      index: np.ndarray, out: gs.Tensor, **attrs) -> None:
    """`out` = `op`(source, *operands) computed on the unmoved source, then its result moved as
    `index` says: an elementwise op commutes with moving the elements it works on."""
    source_shape = static_shape(source)
    unmoved = source_shape == static_shape(out) and np.array_equal(index.ravel(), np.arange(index.size))
    result = builder.op(op, [source, *operands], source_shape, out.dtype, out=out if unmoved else None, **attrs)
    if not unmoved:
        emit_movement(builder, result, index, out)


def emit_movement(builder: Builder, values: gs.Tensor, index: np.ndarray, out: gs.Tensor) -> None:
    """`out` = `values`' elements at the flat positions `index`: a relabel then a broadcast when
    `index` is one (the usual case), else a Gather of the flat values."""
    shape = static_shape(values)
    kept = [size > 1 and not np.all(np.diff(index, axis=axis) == 0) for axis, size in enumerate(index.shape)]
    core = index[tuple(slice(None) if keep else slice(0, 1) for keep in kept)]
    steps: list = []
    if core.size == element_count(shape) and np.array_equal(core.ravel(), np.arange(core.size)):
        if list(core.shape) != list(shape):
            steps.append(("Reshape", core.shape))
    else:
        steps += [("Reshape", [element_count(shape)]), ("Gather", core.ravel()), ("Reshape", core.shape)]
    if core.shape != index.shape:
        steps.append(("Expand", index.shape))
    current = values
    for position, (op, argument) in enumerate(steps):
        target = out if position == len(steps) - 1 else None
        if op == "Reshape":
            current = builder.reshape(current, list(argument), out=target)
        elif op == "Gather":
            current = builder.op("Gather", [current, builder.const(np.asarray(argument, np.int64), "indices")],
                                 [len(argument)], values.dtype, out=target, axis=0)
        else:
            current = builder.op("Expand", [current, builder.const(np.array(argument, np.int64), "shape")],
                                 list(argument), values.dtype, out=target)


def where_before_mask_movement(node: gs.Node, site: Site) -> Candidates:
    """Where(cond, a, b) with single-value branches whose cond only moves, repeats or keeps
    the elements of a mask m (relabels, Transpose, Expand, a Gather of constant indices, And
    with all-true, Or with all-false) as Where(m, a, b) with the same movement done on its float
    result: choosing a or b per element commutes with moving the elements. The mask's ops then
    compute nothing on bool tensors, which the NPU does not compute (oplist V2.3.2, data types)."""
    cond, a, b = node.inputs
    branches = [constant_value(a), constant_value(b)]
    if any(v is None or v.size != 1 for v in branches):
        return "a branch is not a single constant"
    movement = movement_into(cond, node.outputs[0])
    if isinstance(movement, str):
        return f"the condition {movement}"
    chain, source, index = movement
    builder = site.builder(node)
    small = [builder.const(v.reshape([1] * len(static_shape(source))), "branch") for v in branches]
    compute_then_move(builder, "Where", source, small, index, node.outputs[0])
    yield builder.finish(node, *_only_feeding(chain, node, site))


def where_reads_mask_source(node: gs.Node, site: Site) -> Candidates:
    """Where(cond, a, b) whose cond only moves, repeats or keeps the elements of a mask m (the
    ops of where_before_mask_movement) such that the Where's own broadcast of m puts every
    element where the chain does (relabels that add or drop leading unit axes, an And with
    all-true that only broadcasts, Expand, a Gather or GatherND of every index in order) as
    Where(m, a, b): the same output, with no op on the bool mask, which the NPU does not
    compute (oplist V2.3.2, data types). The earliest such m is read, whatever the branches."""
    cond = node.inputs[0]
    out_shape = static_shape(node.outputs[0])
    chain, _ = moved_chain(cond)
    if not chain:
        return "the condition is not a moved, repeated or kept mask"
    branch_shapes = [static_shape(t) for t in node.inputs[1:]]
    if out_shape is None or any(s is None for s in branch_shapes):
        return "a shape is unknown"
    for start, first in enumerate(chain):
        source = first.inputs[0]
        source_shape = static_shape(source)
        if source_shape is None or any(static_shape(n.outputs[0]) is None for n in chain[start:]):
            continue
        try:
            if tuple(np.broadcast_shapes(source_shape, *branch_shapes)) != tuple(out_shape):
                continue
        except ValueError:
            continue
        moved = np.broadcast_to(index_map(chain[start:], source_shape), out_shape)
        direct = np.broadcast_to(np.arange(element_count(source_shape)).reshape(source_shape), out_shape)
        if np.array_equal(moved, direct):
            builder = site.builder(node)
            builder.op("Where", [source, *node.inputs[1:]], out=node.outputs[0])
            yield builder.finish(node, *_only_feeding(chain[start:], node, site))
            return None
    return "the mask's movement is not the Where's own broadcast of it"


def _is_identity_constant(tensor: gs.Tensor, op: str) -> bool:
    value = constant_value(tensor)
    return value is not None and bool(np.all(value == IDENTITY_ELEMENT[op]))


def where_of_boolean_op(node: gs.Node, site: Site) -> Candidates:
    """Where over a combined condition as Wheres over its parts, each part then free to be read
    where it is made (where_reads_mask_source) or selected on the float side instead:
    Where(Not(x), a, b) = Where(x, b, a); Where(And(x, y), a, b) = Where(x, Where(y, a, b), b);
    Where(Or(x, y), a, b) = Where(x, a, Where(y, a, b)). The outer Where broadcasts x, y, a and
    b to the same shape as the original (And and Or broadcast x with y). A constant part is the
    outer condition, computed by no one. Not, And and Or are not NPU operators (oplist V2.3.2),
    and bool tensors stay on the CPU."""
    made = producer(node.inputs[0])
    if made is None or made.op not in ("Not", "And", "Or"):
        return "the condition is not made by Not, And or Or"
    if any(reader.op != "Where" for reader in made.outputs[0].outputs):
        return f"the {made.op}'s result is read by other ops than Where too: it would stay"
    _, a, b = node.inputs
    builder = site.builder(node)
    if made.op == "Not":
        builder.op("Where", [made.inputs[0], b, a], out=node.outputs[0])
    else:
        x, y = made.inputs
        if any(_is_identity_constant(t, made.op) for t in (x, y)):
            builder.discard()
            return f"an operand of the {made.op} is its identity element (and_or_with_identity_removed)"
        if constant_value(y) is not None and constant_value(x) is None:
            x, y = y, x
        shapes = [static_shape(t) for t in (y, a, b)]
        if any(s is None for s in shapes):
            builder.discard()
            return "a shape is unknown"
        inner_shape = list(np.broadcast_shapes(*shapes))
        inner = builder.op("Where", [y, a, b], inner_shape, node.outputs[0].dtype)
        outer = [x, inner, b] if made.op == "And" else [x, a, inner]
        builder.op("Where", outer, out=node.outputs[0])
    yield builder.finish(node, *_only_feeding([made], node, site))


def where_by_pieces(node: gs.Node, site: Site) -> Candidates:
    """A Where whose condition broadcasts along an axis in a way the target refuses (oplist
    V2.3.2, Where: the Expand broadcast patterns only) as one Where per slice of that axis,
    Concat together: each piece's condition is then no wider on that axis than its result.
    The condition, a bool tensor, cannot be repeated on the NPU; the float branches are split
    instead (constants sliced). At most BROADCAST_COPIES pieces; the fewest pieces first."""
    cond = node.inputs[0]
    out_shape = static_shape(node.outputs[0])
    shapes = [static_shape(t) for t in node.inputs]
    if out_shape is None or any(s is None for s in shapes):
        return "a shape is unknown"
    rank = len(out_shape)
    padded = [[1] * (rank - len(s)) + list(s) for s in shapes]
    axes = sorted((out_shape[axis], axis) for axis in range(rank)
                  if padded[0][axis] == 1 and 1 < out_shape[axis] <= BROADCAST_COPIES)
    if not axes:
        return f"the condition broadcasts along no axis of 2 to {BROADCAST_COPIES}"
    for pieces, axis in axes:
        builder = site.builder(node)
        branches = []
        for tensor, shape in zip(node.inputs[1:], padded[1:]):
            value = constant_value(tensor)
            if shape[axis] == 1:
                branches.append([tensor] * pieces)
            elif value is not None:
                full = value.reshape(shape)
                branches.append([builder.const(np.take(full, [k], axis=axis), "piece") for k in range(pieces)])
            else:
                lifted = tensor if len(static_shape(tensor)) == rank else builder.reshape(tensor, shape)
                branches.append(split_node(builder, lifted, axis, [1] * pieces))
        piece_shape = list(out_shape)
        piece_shape[axis] = 1
        parts = [builder.op("Where", [cond, a, b], piece_shape, node.outputs[0].dtype)
                 for a, b in zip(*branches)]
        builder.op("Concat", parts, out=node.outputs[0], axis=axis)
        yield builder.finish()
    return None


def cast_before_movement(node: gs.Node, site: Site) -> Candidates:
    """A Cast to a float type of an integer or bool tensor that was only moved, repeated or kept
    (relabels, Transpose, Expand, a Gather or GatherND of constant indices) as the Cast of the
    unmoved tensor, the movement then done on its float result: converting each element commutes
    with moving it. The Cast stays on the CPU (not an NPU operator, oplist V2.3.2); the movement,
    on integers a CPU op each (data types T1 int8/float16), runs on the NPU. Kept only when the
    movement's nodes leave with it (fewer_cpu)."""
    if dtype_name(node.outputs[0].dtype) not in FLOAT_DTYPES:
        return "it does not cast to a float type"
    movement = movement_into(node.inputs[0], node.outputs[0])
    if isinstance(movement, str):
        return f"its input {movement}"
    chain, source, index = movement
    builder = site.builder(node)
    compute_then_move(builder, "Cast", source, [], index, node.outputs[0], **node.attrs)
    yield builder.finish(node, *_only_feeding(chain, node, site))


def _only_feeding(chain: list[gs.Node], reader: gs.Node, site: Site) -> list[gs.Node]:
    """The nodes of `chain` (source first) whose results only the rest of the chain and `reader`
    read: they leave with the rewrite, the others stay for their other readers."""
    leaving = {id(reader)}
    gone = []
    for node in reversed(chain):
        if any(t.name in site.graph_outputs for t in node.outputs) or any(
                id(r) not in leaving for t in node.outputs for r in t.outputs):
            break
        leaving.add(id(node))
        gone.append(node)
    return gone


def gather_of_every_index_to_reshape(node: gs.Node, site: Site) -> Candidates:
    """Gather whose constant indices are 0, 1, ..., n-1 of the whole axis (in any index shape)
    as a Reshape: it keeps every element in order (transformers' attention mask gathers
    arange(sequence))."""
    indices = constant_value(node.inputs[1])
    shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if indices is None or shape is None or out_shape is None:
        return "the indices are computed or a shape is unknown"
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    if not np.array_equal(np.ravel(indices) % max(shape[axis], 1), np.arange(shape[axis])):
        return "the indices are not every index of the axis in order"
    builder = site.builder(node)
    builder.reshape(node.inputs[0], out_shape, out=node.outputs[0])
    yield builder.finish()


def and_or_with_identity_removed(node: gs.Node, site: Site) -> Candidates:
    """x AND true, x OR false (all-true or all-false constant) as x itself where it does not
    broadcast x: the op changes nothing."""
    kept = _identity_operand(node)
    if kept is None:
        return "no operand is the op's identity element"
    if static_shape(kept) is None or static_shape(kept) != static_shape(node.outputs[0]):
        return "the constant broadcasts the other operand"
    if node.outputs[0].name in site.graph_outputs:
        return "its result is a graph output"
    yield Replacement((node,), (), ((node.outputs[0], kept),))


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(where_reads_mask_source, frozenset({"Where"}), always=True),
    RewriteRule(where_before_mask_movement, frozenset({"Where"}), always=True),
    RewriteRule(where_of_boolean_op, frozenset({"Where"}), always=True),
    RewriteRule(where_by_pieces, frozenset({"Where"})),
    RewriteRule(and_or_with_identity_removed, frozenset(IDENTITY_ELEMENT), always=True),
    RewriteRule(gather_of_every_index_to_reshape, frozenset({"Gather"}), always=True),
    RewriteRule(cast_before_movement, frozenset({"Cast"}), fewer_cpu=True),
)
