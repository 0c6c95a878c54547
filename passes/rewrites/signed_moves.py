"""Moves and negations along the last axis as one Gather (times the signs), or one MatMul.

Rotary position embeddings rotate pairs of a head's features: RoFormer, GPT-J, CodeGen and
EVA-02 interleave them (x[..., 1::2] negated and x[..., ::2], stacked on a new last axis and
flattened back), LLaMA's `rotate_half` swaps halves (Concat(-x[..., d/2:], x[..., :d/2])).
Either way the result is x with its last axis moved and some of it negated: x @ M for a
constant M of one +1 or -1 per column. The interleaved form is exported as two stepped Slices
(which the NPU's Slice does not take: each becomes a Slice and a picking Conv), a Neg,
Unsqueezes, a Concat and a Reshape, about nine steps per rotation. On a tensor of rank 3 or 4
the last axis is a plane axis of NC1HWC2 (as_nchw), so one Gather along it moves whole C2
vectors, and the signs are a Mul that joins the product by sin after it
(elementwise.constant_operands_as_one): one step, where x @ M was a 1x1 Conv between two
relabels into rows and back (three; EVA-02's 24 rotations took 48 steps off its plan). On rank
2 the last axis is the channels, which a Gather would pick lane by lane: x @ M, which
matmul_as_conv's rules make a 1x1 Conv. LLaMA's halves need no stepped Slice: a Split and a
Concat with the Neg folded into the sine take as few steps, so a region without a stepped
Slice is left to them. Every output is one input times +1 or -1: exact, in float16 and in int8
alike.

The region is found from a Slice or Split: the data-movement nodes around it (`MOVES`) whose
every input comes from one tensor x or from the region, and that give one tensor y read
outside it. It is run on the element numbers of x (negation carried as a sign,
`fold_constants.evaluate_on`) to see where each element of y comes from; the rule holds when
y has x's shape and every row of the last axis is filled from the same row of x in the same
way.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape

from rkcompile.passes.fold_constants import evaluate_on
from rkcompile.passes.rewrites.base import RESHAPE_LIKE, Candidates, RewriteRule, Site, producer

#: ops that only move elements or negate them, given constant parameters
MOVES = RESHAPE_LIKE | {"Slice", "Split", "Concat", "Neg", "Transpose", "Identity"}
#: Most nodes a region may hold: rotations are 5 to 9; a larger region is something else
MOST_REGION_NODES = 16
#: Largest last axis made a MatMul: each output then sums this many products where the moves
#: cost one copy (rotary heads are 32 to 256 wide)
LARGEST_AXIS = 256


def _data_inputs(node: gs.Node) -> list[gs.Tensor]:
    """The inputs of a move that carry elements (a Slice's bounds or a Reshape's shape do not)."""
    return list(node.inputs) if node.op == "Concat" else node.inputs[:1]


def _region(start: gs.Node, site: Site) -> tuple[list[gs.Node], gs.Tensor, gs.Tensor] | str:
    """The moves around `start`, its one source tensor x and its one result y, or why not."""
    region, frontier = {id(start): start}, [start]

    def take(node: gs.Node) -> None:
        region[id(node)] = node
        frontier.append(node)

    while frontier:
        node = frontier.pop()
        for tensor in _data_inputs(node):
            earlier = producer(tensor)
            if (earlier is not None and id(earlier) not in region and earlier.op in MOVES
                    and all(reader.op in MOVES for reader in tensor.outputs)
                    and tensor.name not in site.graph_outputs):
                take(earlier)
        for tensor in node.outputs:
            for reader in tensor.outputs:
                if id(reader) not in region and reader.op in MOVES:
                    take(reader)
        if len(region) > MOST_REGION_NODES:
            return f"more than {MOST_REGION_NODES} moves around it"
    nodes = list(region.values())
    made = {id(t) for node in nodes for t in node.outputs}
    sources = {id(t): t for node in nodes for t in _data_inputs(node) if id(t) not in made}
    results = {id(t): t for node in nodes for t in node.outputs
               if t.name in site.graph_outputs or any(id(reader) not in region for reader in t.outputs)}
    if len(sources) != 1 or len(results) != 1:
        return f"its moves read {len(sources)} tensors and give {len(results)} (one of each wanted)"
    for node in nodes:
        data = {id(t) for t in _data_inputs(node)}
        if any(t.name and id(t) not in data and constant_value(t) is None for t in node.inputs):
            return f"{node.op} {node.name} has parameters that are not constant"
    return nodes, next(iter(sources.values())), next(iter(results.values()))


def _sources(region: list[gs.Node], x: gs.Tensor, y: gs.Tensor, opset: int) -> np.ndarray | None:
    """Per element of y, the element number of x it holds, 1-based, negative where negated;
    None when an op of the region does not run on numbers."""
    values = {id(x): np.arange(1, int(np.prod(static_shape(x))) + 1, dtype=np.float64).reshape(static_shape(x))}
    pending = list(region)
    while pending:
        ready = next((n for n in pending if all(id(t) in values for t in _data_inputs(n))), None)
        if ready is None:
            return None
        data = {id(t) for t in _data_inputs(ready)}
        operands = [values[id(t)] if id(t) in data else (constant_value(t) if t.name else None)
                    for t in ready.inputs]
        results = evaluate_on(ready, operands, opset)
        if results is None:
            return None
        for tensor, result in zip([t for t in ready.outputs if t.name], results):
            values[id(tensor)] = result
        pending = [n for n in pending if n is not ready]
    return values.get(id(y))


def _stepped(node: gs.Node) -> bool:
    """A Slice taking every k-th element, k > 1 (the NPU's Slice takes steps of 1 only)."""
    if node.op != "Slice" or len(node.inputs) < 5 or not node.inputs[4].name:
        return False
    steps = constant_value(node.inputs[4])
    return steps is not None and bool(np.any(np.abs(steps) > 1))


def signed_moves_as_gather(node: gs.Node, site: Site) -> Candidates:
    """Moves and negations that give a tensor of x's shape, each row of its last axis filled
    from the same row of x alike (a rotary embedding's rotation of each head's features), as a
    Gather of x along its last axis times the signs where any is negative; on rank 2, as x times
    the constant signed permutation that does it (the module's docstring says why)."""
    found = _region(node, site)
    if isinstance(found, str):
        return found
    region, x, y = found
    shape = static_shape(x)
    if shape is None or static_shape(y) != shape or dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "its result does not have its source's shape, or is not a float tensor of known shape"
    if not any(_stepped(n) for n in region):
        return "no Slice steps over 1: its moves are Splits and Concats the NPU takes as they are"
    width = shape[-1]
    if width > LARGEST_AXIS:
        return f"last axis of {width}, over {LARGEST_AXIS}"
    numbers = _sources(region, x, y, site.opset)
    if numbers is None or numbers.shape != tuple(shape) or np.any(numbers == 0):
        return "its moves do not run on element numbers"
    rows = numbers.reshape(-1, width)
    sign, source = np.sign(rows), np.abs(rows).astype(np.int64) - 1
    column, row = source % width, source // width
    if (np.any(row != np.arange(len(rows))[:, None]) or np.any(column != column[:1])
            or np.any(sign != sign[:1])):
        return "it moves elements across rows of the last axis, or moves the rows unalike"
    builder = site.builder(node)
    if len(shape) >= 3:   # the last axis is a plane axis: the Gather moves whole C2 vectors
        negated = bool(np.any(sign[0] < 0))
        moved = builder.op("Gather", [x, builder.const(column[0].astype(np.int64), "indices")],
                           shape if negated else None, x.dtype if negated else None,
                           out=None if negated else y, axis=len(shape) - 1)
        if negated:
            builder.op("Mul", [moved, builder.const(sign[0].astype(dtype_name(x.dtype)), "signs")], out=y)
        yield builder.finish(*region)
        return
    matrix = np.zeros((width, width), dtype_name(x.dtype))
    matrix[column[0], np.arange(width)] = sign[0]
    builder.op("MatMul", [x, builder.const(matrix, "signed_moves")], out=y)
    yield builder.finish(*region)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(signed_moves_as_gather, frozenset({"Slice", "Split"}), always=True),
)
