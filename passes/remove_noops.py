"""Remove inference no-ops: Identity, a Cast or CastLike to the type its input already has
(exporters keep the float32 round trips of mixed-precision code, e.g. an RMSNorm's
`x.to(float32)` ... `.to(input_dtype)`, in a model that is float32 throughout), Dropout
whose mask nobody reads and which is not in training mode (a training-mode Dropout draws a
random mask: legalize keeps it on the CPU), a Slice that keeps every element in order
(timm's GhostNet cuts its module's Concat back to the width it already has), a Concat, Sum,
Mean, Max or Min of one input (torchvision's DenseNet concatenates a block's first feature map
alone), a Pad of zero widths, a Mul or Div by constant ones, an Add or Sub of constant zeros,
that leave the shape as it was (paddle2onnx writes swish as x * sigmoid(1.0 * x); a residual branch whose weights
are zero folds to x + 0): x * 1 is x, bit for bit; and an Expand or Tile to the shape its
input has.

The removed node's output name survives when it is a graph output, so the plan's outputs keep
the names users feed and fetch.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.edits import detach, replace_uses
from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, is_onnx_domain, static_shape, stored_elements
from rkcompile.ir.nodes import dtype_name

from rkcompile.passes.legalize import training_mode

NAME = "remove-noops"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "origins"})
PROVIDES = frozenset({"fates", "graph", "origins"})


def run(ctx: CompileContext) -> None:
    graph = ctx.graph
    graph_outputs = {t.name for t in graph.outputs}
    graph_inputs = {t.name for t in graph.inputs}
    for node in list(graph.nodes):
        source = _passed_through(node)
        if source is None:
            continue
        result = node.outputs[0]
        if result.name in graph_outputs:
            if source.name in graph_inputs or source.name in graph_outputs or isinstance(source, gs.Constant):
                continue
            replace_uses(source, result)
            producer = source.inputs[0]
            producer.outputs[producer.outputs.index(source)] = result
        else:
            replace_uses(result, source)
        detach(node)
        ctx.retire(node, "removed", f"{node.op} is a no-op at inference")
    ctx.cleanup_graph()


def _passed_through(node: gs.Node) -> gs.Tensor | None:
    """The input `node` returns unchanged, if it is a no-op."""
    if node.op in IDENTITY_OPERANDS:
        return _identity_operand(node)
    if node.op == "Identity":
        return node.inputs[0]
    if node.op in ("Cast", "CastLike"):
        return node.inputs[0] if _same_type_cast(node) else None
    if node.op in ("Expand", "Tile") and is_onnx_domain(node):
        # to the shape it has already (jax2tf writes BroadcastTo so): every element once, in place
        shape = static_shape(node.inputs[0])
        return node.inputs[0] if shape is not None and shape == static_shape(node.outputs[0]) else None
    if node.op in ONE_INPUT_IDENTITIES and is_onnx_domain(node) and len(node.inputs) == 1:
        return node.inputs[0]
    if node.op == "Slice" and is_onnx_domain(node):
        return node.inputs[0] if _keeps_everything(node) else None
    if node.op == "Pad" and is_onnx_domain(node):
        return node.inputs[0] if _pads_nothing(node) else None
    if node.op == "Dropout":
        if training_mode(node) is not None:
            return None
        unread_mask = len(node.outputs) < 2 or not node.outputs[1].name or not node.outputs[1].outputs
        return node.inputs[0] if unread_mask else None
    return None


#: variadic ops that return their one input unchanged when given only one
ONE_INPUT_IDENTITIES = frozenset({"Concat", "Sum", "Mean", "Max", "Min"})

#: binary ops that return x when the other operand is all this constant, and the positions that
#: operand may take (x - 0 and x / 1, never 0 - x or 1 / x)
IDENTITY_OPERANDS = {"Mul": (1, (0, 1)), "Div": (1, (1,)), "Add": (0, (0, 1)), "Sub": (0, (1,))}


def _identity_operand(node: gs.Node) -> gs.Tensor | None:
    """x of x * 1, x / 1, x + 0 or x - 0 (either side where the op commutes): float constants of
    any shape that do not broadcast x larger. Bit for bit, save x + 0 turning a -0 into +0."""
    if len(node.inputs) != 2 or not is_onnx_domain(node):
        return None
    identity, positions = IDENTITY_OPERANDS[node.op]
    for position in positions:
        constant, x = node.inputs[position], node.inputs[1 - position]
        values = constant_value(constant)
        if (values is not None and values.dtype.name in FLOAT_DTYPES and np.all(stored_elements(values) == identity)
                and dtype_name(x.dtype) == dtype_name(node.outputs[0].dtype)
                and static_shape(x) is not None and static_shape(x) == static_shape(node.outputs[0])):
            return x
    return None


def _keeps_everything(node: gs.Node) -> bool:
    """A Slice of step 1 on every axis (opset 10 on: a constant `steps` of ones, or none) whose
    output has its input's static shape: a step-1 range as long as its axis starts at 0, so each
    element stays where it was."""
    shape = static_shape(node.inputs[0])
    if shape is None or shape != static_shape(node.outputs[0]):
        return False
    if len(node.inputs) < 5 or not node.inputs[4].name:
        return True
    steps = constant_value(node.inputs[4])
    return steps is not None and bool(np.all(steps == 1))


def _pads_nothing(node: gs.Node) -> bool:
    """A Pad whose pads are all zero, in any mode (the attribute before opset 11, the constant
    input after), with its input's static shape: every element stays where it was, and no
    value is added. HF Swin's `maybe_pad` writes one per block, padding a map its window size
    divides by 0."""
    shape = static_shape(node.inputs[0])
    if shape is None or shape != static_shape(node.outputs[0]):
        return False
    if len(node.inputs) > 1 and node.inputs[1].name:
        pads = constant_value(node.inputs[1])
    else:
        pads = node.attrs.get("pads")
    return pads is not None and bool(np.all(np.asarray(pads) == 0))


def _same_type_cast(node: gs.Node) -> bool:
    """A Cast whose input already has the target type returns its input unchanged (ONNX Cast:
    the conversion is elementwise per value; `saturate` only matters for float8 targets, which
    this compares like any other type)."""
    source_type = dtype_name(node.inputs[0].dtype)
    return source_type is not None and source_type == dtype_name(node.outputs[0].dtype)
