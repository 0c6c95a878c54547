"""Remove inference no-ops: Identity, a Cast or CastLike to the type its input already has
(exporters keep the float32 round trips of mixed-precision code, e.g. an RMSNorm's
`x.to(float32)` ... `.to(input_dtype)`, in a model that is float32 throughout), and Dropout
whose mask nobody reads and which is not in training mode (a training-mode Dropout draws a
random mask: legalize keeps it on the CPU).

The removed node's output name survives when it is a graph output, so the plan's outputs keep
the names users feed and fetch.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.edits import detach, replace_uses
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
        if not _is_noop(node):
            continue
        source, result = node.inputs[0], node.outputs[0]
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


def _is_noop(node: gs.Node) -> bool:
    if node.op == "Identity":
        return True
    if node.op in ("Cast", "CastLike"):
        return _same_type_cast(node)
    if node.op == "Dropout":
        if training_mode(node) is not None:
            return False
        return len(node.outputs) < 2 or not node.outputs[1].name or not node.outputs[1].outputs
    return False



def _same_type_cast(node: gs.Node) -> bool:
    """A Cast whose input already has the target type returns its input unchanged (ONNX Cast:
    the conversion is elementwise per value; `saturate` only matters for float8 targets, which
    this compares like any other type)."""
    source_type = dtype_name(node.inputs[0].dtype)
    return source_type is not None and source_type == dtype_name(node.outputs[0].dtype)
