"""The planned graph as ONNX, each NPU partition one `rkcompile::NpuPartition` node.

Each partition node calls a model-local ONNX function that holds the partition's original nodes,
its weights as Constant nodes inside the body. The functions share the name `NpuPartition` and
are told apart by ONNX's function `overload` (IR version 10), so Netron shows one op type and
opens each partition's own subgraph; onnxruntime runs the file as the plain model it came from.
Fused kernels (`fuse` pass: a `rkcompile` node whose `body` attribute holds its members) are
expanded back into their members, so every body is plain ONNX and the file runs anywhere; the
function's doc string names the kernels. Host conversion steps change only the NPU's storage,
which ONNX does not model, so they are left out and their tensors keep their ONNX names.
"""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from .context import CompileContext

DOMAIN = "rkcompile"
OP = "NpuPartition"
MIN_IR_VERSION = 10


def partitioned_model(ctx: CompileContext) -> onnx.ModelProto:
    model = gs.export_onnx(ctx.graph, do_type_check=False)
    graph = model.graph
    _drop_host_steps(graph, {name for name, placed in ctx.placement.items() if placed.device == "host"})
    fused_step = _expand_fused_nodes(graph)

    def step_of(node: onnx.NodeProto) -> str:
        return fused_step.get(node.name, node.name)

    # Execution order keeps each partition contiguous and after everything it reads; the
    # graph's own node list need not (rewrites place new nodes where the old ones stood).
    position = {name: index for index, name in enumerate(ctx.order)}
    ordered = sorted(graph.node, key=lambda n: position.get(step_of(n), -1))
    del graph.node[:]
    graph.node.extend(ordered)
    initializers = {t.name: t for t in graph.initializer}
    members = {index: set(names) for index, (device, names) in enumerate(ctx.partitions) if device == "npu"}
    owner = {name: index for index, names in members.items() for name in names}
    opsets = [o for o in model.opset_import if o.domain != DOMAIN]
    functions, new_nodes, placed = [], [], set()
    for node in graph.node:
        partition = owner.get(step_of(node))
        if partition is None:
            new_nodes.append(node)
        elif partition not in placed:
            placed.add(partition)
            body = [n for n in graph.node if owner.get(step_of(n)) == partition]
            kernels = sorted({ctx.placement[step_of(n)].kernel for n in body})
            call, function = _partition_function(partition, body, kernels, graph, initializers, ctx, opsets)
            new_nodes.append(call)
            functions.append(function)
    used = {name for node in new_nodes for name in node.input}
    kept_initializers = [t for t in graph.initializer if t.name in used]
    names = used | {o for node in new_nodes for o in node.output}
    kept_info = [v for v in graph.value_info if v.name in names]
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(kept_initializers)
    graph.value_info.extend(kept_info)
    model.functions.extend(functions)
    del model.opset_import[:]
    model.opset_import.extend(opsets + [helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = max(model.ir_version, MIN_IR_VERSION)
    return model


def _drop_host_steps(graph: onnx.GraphProto, host_steps: set[str]) -> None:
    """Remove the host conversion nodes: readers of a converted tensor read its source again, except for
    a model output, whose name the producer takes back."""
    outputs = {o.name for o in graph.output}
    renames = {}
    for node in [n for n in graph.node if n.name in host_steps]:
        source, converted = node.input[0], node.output[0]
        if converted in outputs:
            renames[source] = converted
        else:
            renames[converted] = source
        graph.node.remove(node)
    for node in graph.node:
        for field in (node.input, node.output):
            for position, name in enumerate(field):
                if name in renames:
                    field[position] = renames[name]


def _expand_fused_nodes(graph: onnx.GraphProto) -> dict[str, str]:
    """Replace each fused node by its body's nodes, which keep their original names, until no
    fused node is left (a fused kernel can contain an earlier one); the bodies' weights join the
    graph's initializers. Returns each expanded node's fused step name."""
    fused_step: dict[str, str] = {}
    pending, expanded = list(graph.node), []
    known = {t.name for t in graph.initializer}
    while pending:
        node = pending.pop(0)
        body = next((a.g for a in node.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH), None)
        if node.domain != DOMAIN or body is None:
            expanded.append(node)
            continue
        graph.initializer.extend(t for t in body.initializer if t.name not in known)
        known.update(t.name for t in body.initializer)
        step = fused_step.get(node.name, node.name)
        members = []
        for index, member in enumerate(body.node):
            copy = onnx.NodeProto()
            copy.CopyFrom(member)
            copy.name = member.name or f"{node.name}#{index}"
            fused_step[copy.name] = step
            members.append(copy)
        pending[:0] = members
    del graph.node[:]
    graph.node.extend(expanded)
    return fused_step


def _partition_function(partition: int, body: list[onnx.NodeProto], kernels: list[str], graph: onnx.GraphProto,
                        initializers: dict[str, onnx.TensorProto], ctx: CompileContext,
                        opsets: list[onnx.OperatorSetIdProto]) -> tuple[onnx.NodeProto, onnx.FunctionProto]:
    produced = [o for node in body for o in node.output if o]
    produced_set = set(produced)
    body_ids = {id(node) for node in body}
    read_outside = {name for node in graph.node if id(node) not in body_ids for name in node.input}
    read_outside |= {o.name for o in graph.output}
    inputs, weights = [], []
    for node in body:
        for name in node.input:
            if not name or name in produced_set or name in inputs or name in weights:
                continue
            (weights if name in initializers else inputs).append(name)
    outputs = [name for name in produced if name in read_outside]
    constants = [helper.make_node("Constant", [], [name], value=initializers[name]) for name in weights]
    overload = f"partition{partition}"
    doc = f"NPU partition {partition} on {ctx.target.name}: {len(body)} nodes; kernels: {', '.join(kernels)}"
    function = helper.make_function(DOMAIN, OP, inputs, outputs, constants + body, opsets, overload=overload,
                                    doc_string=doc)
    call = helper.make_node(OP, inputs, outputs, name=f"npu_partition_{partition}", domain=DOMAIN, doc_string=doc)
    call.overload = overload
    return call, function
