"""Mask rewrites: the boolean and integer mask arithmetic exporters write around attention
(transformers' attention-mask chain: Cast, Flatten, a Gather of every index, Reshapes, And with
an all-true constant, Expand, Where) reduced to what computes. An op that only moves, repeats or
keeps a mask's elements is done on the float values the mask selects instead, where the NPU
runs it; the oplist V2.3.2 computes int8/float16 tensors only, so on the mask itself each of
these ops would stay on the CPU."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir import constant_value, element_count, static_shape

from .base import RESHAPE_LIKE, Builder, Candidates, Replacement, RewriteRule, Site, producer

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


def moved_input(node: gs.Node) -> gs.Tensor | None:
    """The tensor whose elements `node` only moves, repeats or keeps, or None when it computes."""
    if node.op in MOVING_OPS:
        return node.inputs[0]
    if node.op == "Gather" and constant_value(node.inputs[1]) is not None:
        return node.inputs[0]
    return _identity_operand(node)


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
        elif node.op in RESHAPE_LIKE:
            index = index.reshape(out_shape)
        else:  # Expand, Identity, And/Or with their identity element
            index = np.broadcast_to(index, out_shape)
    return index


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
    chain, source = [], cond
    while (made := producer(source)) is not None and (moved := moved_input(made)) is not None:
        chain.append(made)
        source = moved
    if not chain:
        return "the condition is not a moved, repeated or kept mask"
    source_shape, out_shape = static_shape(source), static_shape(node.outputs[0])
    if source_shape is None or out_shape is None or any(static_shape(n.outputs[0]) is None for n in chain):
        return "a shape is unknown"
    chain.reverse()
    index = np.broadcast_to(index_map(chain, source_shape), out_shape)
    builder = site.builder(node)
    small = [builder.const(v.reshape([1] * len(source_shape)), "branch") for v in branches]
    unmoved = source_shape == out_shape and np.array_equal(index.ravel(), np.arange(index.size))
    picked = builder.op("Where", [source, *small], source_shape, node.outputs[0].dtype,
                        out=node.outputs[0] if unmoved else None)
    if not unmoved:
        emit_movement(builder, picked, index, node.outputs[0])
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
    RewriteRule(where_before_mask_movement, frozenset({"Where"}), always=True),
    RewriteRule(and_or_with_identity_removed, frozenset(IDENTITY_ELEMENT), always=True),
    RewriteRule(gather_of_every_index_to_reshape, frozenset({"Gather"}), always=True),
)
