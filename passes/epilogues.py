"""Epilogues: element-wise work that reads a relabel of a Conv's output moved before the
relabel, so that it follows the Conv and fuses with it (ConvExGelu, ConvRelu, ...).

The rewrite pass runs a MatMul or Gemm by weights as a 1x1 Conv between two Reshapes
(rewrites/matmul_as_conv.py), so the activation the model applies to the product, GELU in a
transformer's feed-forward block, reads a Reshape of the Conv's output and no kernel fusion
can take it; rknn-toolkit2 runs the pair as one ConvExGelu (peer/zoo_rk3588.json,
transformer_encoder and bert_mini). A relabel only renames elements, and an element-wise op
whose other operands are one-value constants computes each element from that element alone,
so the two commute exactly: the region of such ops reading the relabel's output, up to the
one tensor read beyond it, runs on the Conv's output and the relabel moves after it. Only
regions the NPU runs move: each node has a kernel of the target, or is part of an exporter's
spelling of one that a recogniser of the fusion table takes whole (the Erf of a GELU); a lone
Erf after a Gemm stays where it is, or the CPU step would split the Conv from its relabel.
Nodes keep their names and origins; only tensors change. Before legalize, which judges the
moved nodes on their new shapes.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.edits import replace_uses, set_input, set_output
from rkcompile.ir.graph import constant_value, is_onnx_domain, static_shape, unique_name
from rkcompile.ir.patterns import matches
from rkcompile.targets.model import Target

from rkcompile.passes.fusion_table import CONV, RECOGNISERS
from rkcompile.passes.rewrites.base import RESHAPE_LIKE

NAME = "epilogues"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "target"})
PROVIDES = frozenset({"graph"})

RELABELS = RESHAPE_LIKE | {"Transpose"}
#: element-wise ops of one tensor input (Clip's bounds and PRelu's slope must be one-value constants)
UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "Erf", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu",
                   "Softplus", "Softsign", "Mish", "Gelu", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Clip",
                   "PRelu"})
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})


def run(ctx: CompileContext) -> None:
    graph = ctx.graph
    graph_outputs = {t.name for t in graph.outputs}
    names = set(graph.tensors())
    for relabel in [node for node in graph.nodes if node.op in RELABELS and is_onnx_domain(node)]:
        region = epilogue_region(relabel, graph_outputs)
        if region is not None and runs_on_the_npu(region, ctx.target):
            move_after(graph, relabel, region, names, graph_outputs)


def epilogue_region(relabel: gs.Node, graph_outputs: set[str]) -> list[gs.Node] | None:
    """The element-wise nodes computed from the relabel's output alone (and one-value
    constants), in the order they join, when the relabel relabels a Conv's output that it alone
    reads, every reader of its output is one of them, and one of their results is read beyond
    them; else None."""
    made, relabelled = relabel.inputs[0], relabel.outputs[0]
    producer = made.inputs[0] if len(made.inputs) == 1 else None
    if producer is None or producer.op not in CONV or len(made.outputs) != 1 or made.name in graph_outputs:
        return None
    shape, rank = static_shape(relabelled), min(len(static_shape(made) or ()), len(static_shape(relabelled) or ()))
    if shape is None or static_shape(made) is None or relabelled.name in graph_outputs:
        return None
    inside, region, pending = {id(relabelled)}, [], list(relabelled.outputs)
    while pending:
        node = pending.pop(0)
        if any(node is member for member in region) or not _joins(node, inside, shape, rank):
            continue
        region.append(node)
        inside.add(id(node.outputs[0]))
        pending.extend(node.outputs[0].outputs)
    members = {id(node) for node in region}
    if not region or any(id(reader) not in members for reader in relabelled.outputs):
        return None
    leaving = [node for node in region if node.outputs[0].name in graph_outputs
               or any(id(reader) not in members for reader in node.outputs[0].outputs)]
    return region if len(leaving) == 1 else None


def runs_on_the_npu(region: list[gs.Node], target: Target) -> bool:
    """Whether every node of `region` has a kernel on `target` or is a member of a recogniser's
    match within the region (fuse.py judges the rest of each rule when it fuses)."""
    inside = {id(node) for node in region}
    absorbed: set[int] = set()
    for node in region:
        for rule in RECOGNISERS:
            ops = rule.pattern.root_ops()
            if (ops is not None and node.op not in ops) or not target.has_kernel(rule.requires):
                continue
            found = next((match for match in matches(rule.pattern, node)
                          if all(id(member) in inside for member in match.members)), None)
            if found is not None:
                absorbed.update(id(member) for member in found.members)
                break
    return all(id(node) in absorbed or node.op in target.ops for node in region)


def _joins(node: gs.Node, inside: set[int], shape: tuple[int, ...], rank: int) -> bool:
    """Whether `node` is element-wise over region tensors and one-value constants of rank at
    most `rank` (so it broadcasts nothing), with one output of the region's shape."""
    if not is_onnx_domain(node) or node.op not in UNARY | BINARY or len(node.outputs) != 1:
        return False
    if static_shape(node.outputs[0]) != shape:
        return False
    operands = [t for t in node.inputs if t.name]
    if node.op in UNARY and (not operands or id(operands[0]) not in inside):
        return False
    reads_region = False
    for tensor in operands:
        if id(tensor) in inside:
            reads_region = True
            continue
        value = constant_value(tensor)
        if value is None or value.size != 1 or value.ndim > rank:
            return False
    return reads_region


def move_after(graph: gs.Graph, relabel: gs.Node, region: list[gs.Node], names: set[str],
               graph_outputs: set[str]) -> None:
    """Rewire `region` to read the relabel's input and the relabel to relabel the region's
    result; the relabel moves after the region in the node list, which stays topological."""
    made, relabelled = relabel.inputs[0], relabel.outputs[0]
    shape = list(static_shape(made))
    members = {id(node) for node in region}
    last = next(node for node in region if node.outputs[0].name in graph_outputs
                or any(id(reader) not in members for reader in node.outputs[0].outputs))
    result = last.outputs[0]
    name = unique_name(f"{result.name}/before_relabel", names)
    names.add(name)
    replace_uses(relabelled, made)
    for node in region:
        if node is not last:
            node.outputs[0].shape = list(shape)
    set_output(last, 0, gs.Variable(name, result.dtype, shape))
    set_input(relabel, 0, last.outputs[0])
    set_output(relabel, 0, result)
    nodes = [node for node in graph.nodes if node is not relabel]
    after = max(position for position, node in enumerate(nodes) if id(node) in members)
    nodes.insert(after + 1, relabel)
    graph.nodes = nodes
