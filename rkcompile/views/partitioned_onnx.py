"""The planned graph as ONNX, each NPU partition one `rkcompile::NpuPartition` node.

Built from the plan alone: its steps in order, each rebuilt from its `operation` (`nodes`, from
a fresh compile or a loaded .rkplan). Each partition node calls a model-local ONNX function that
holds the partition's nodes, its weights as Constant nodes inside the body. The functions share
the name `NpuPartition` and are told apart by ONNX's function `overload` (IR version 10), so
Netron shows one op type and opens each partition's own subgraph; onnxruntime runs the file as
the plain model it came from. Fused kernels are expanded back into their members, so every body
is plain ONNX and the file runs anywhere; the function's doc string names the kernels. Host
conversion steps change only the NPU's storage, which ONNX does not model, so they are left out
and their readers read the tensor they convert.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from rkcompile.plan.aliases import view_nodes
from rkcompile.plan.plain_nodes import Constant, Node, expanded_members, node_operands
from rkcompile.plan.onnx_protos import node_proto, tensor_proto
from rkcompile.plan.schema import FUSED_DOMAIN, PlanRecord

OP = "NpuPartition"
MIN_IR_VERSION = 10


def partitioned_model(plan: PlanRecord, nodes: Sequence[Node]) -> onnx.ModelProto:
    """`nodes` are the plan's step nodes, in step order: with the model's own weights
    (`rkcompile.api.Plan.reference_nodes`) or as the weight region holds them (`step_nodes()`)."""
    members, weights = plain_steps(plan, nodes)
    model_outputs = {spec.name for spec in plan.model.outputs}
    opsets = [helper.make_opsetid(domain, version) for domain, version in plan.model.opsets.items()]
    graph_nodes, functions = [], []
    for partition in plan.partitions:
        body = [proto for step_id in partition.steps for proto in members.get(step_id, ())]
        if partition.device != "npu":
            graph_nodes += body
            continue
        others = [proto for step_id, protos in members.items() if step_id not in partition.steps for proto in protos]
        kernels = sorted({plan.steps[step_id].kernel for step_id in partition.steps if step_id in members})
        call, function = _partition_function(plan, partition.id, body, kernels, others, model_outputs,
                                             weights, opsets)
        graph_nodes.append(call)
        functions.append(function)
    read = {name for node in graph_nodes for name in node.input}
    graph = helper.make_graph(
        graph_nodes, plan.model.path.rsplit("/", 1)[-1],
        [_value_info(spec) for spec in plan.model.inputs], [_value_info(spec) for spec in plan.model.outputs],
        [tensor for name, tensor in weights.items() if name in read])
    model = helper.make_model(graph, opset_imports=opsets + [helper.make_opsetid(FUSED_DOMAIN, 1)],
                              functions=functions)
    model.ir_version = max(MIN_IR_VERSION, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    return model


def plain_steps(plan: PlanRecord,
                nodes: Sequence[Node]) -> tuple[dict[int, list[onnx.NodeProto]], dict[str, onnx.TensorProto]]:
    """Each step but the host conversions as plain ONNX nodes (a fused kernel as its members,
    then the Reshapes of the aliases of what it writes: rkcompile/plan/aliases.py), by step id,
    and the constants they read, by name (`host_renames` applied)."""
    renames = host_renames(plan)
    views = view_nodes(plan)
    members: dict[int, list[onnx.NodeProto]] = {}
    weights: dict[str, onnx.TensorProto] = {}
    for step, node in zip(plan.steps, nodes):
        own = [] if step.device == "host" else expanded_members(node)
        if step.device == "host" and step.id not in views:
            continue
        members[step.id] = []
        for member in [*own, *views.get(step.id, ())]:
            for tensor in node_operands(member):
                if isinstance(tensor, Constant) and tensor.name and tensor.name not in weights:
                    weights[tensor.name] = tensor_proto(tensor)
            proto = node_proto(member)
            rename_tensors(proto, renames)
            members[step.id].append(proto)
    return members, weights


def rename_tensors(node: onnx.NodeProto, renames: Mapping[str, str]) -> None:
    """`renames` applied to what `node` reads and writes, and to what its subgraphs read from
    the scope around them (ONNX forbids a subgraph to shadow an outer name, so every match is one)."""
    for field in (node.input, node.output):
        field[:] = [renames.get(name, name) for name in field]
    for graph in proto_subgraphs(node):
        for inner in graph.node:
            rename_tensors(inner, renames)


def proto_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs `node` carries as attributes (If's branches, a Loop's or Scan's body)."""
    return [graph for attribute in node.attribute
            for graph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)]


def host_renames(plan: PlanRecord) -> dict[str, str]:
    """Tensor renames that drop the host conversion steps: readers of a converted tensor read its
    source, except for a model output, whose name the source takes."""
    outputs = {spec.name for spec in plan.model.outputs}
    renames = {}
    for step in plan.steps:
        if step.device == "host":
            source, converted = step.inputs[0], step.outputs[0]
            if converted in outputs:
                renames[source] = converted
            else:
                renames[converted] = renames.get(source, source)
    return renames


def _partition_function(plan: PlanRecord, partition: int, body: list[onnx.NodeProto], kernels: list[str],
                        others: list[onnx.NodeProto], model_outputs: set[str], weights: dict[str, onnx.TensorProto],
                        opsets: list[onnx.OperatorSetIdProto]) -> tuple[onnx.NodeProto, onnx.FunctionProto]:
    produced = [name for node in body for name in node.output if name]
    read_outside = {name for node in others for name in node.input} | model_outputs
    inputs, constants = [], []
    for node in body:
        for name in node.input:
            if not name or name in produced or name in inputs or name in constants:
                continue
            (constants if name in weights else inputs).append(name)
    outputs = [name for name in produced if name in read_outside]
    constant_nodes = [helper.make_node("Constant", [], [name], value=weights[name]) for name in constants]
    overload = f"partition{partition}"
    doc = f"NPU partition {partition} on {plan.target}: {len(body)} nodes; kernels: {', '.join(kernels)}"
    function = helper.make_function(FUSED_DOMAIN, OP, inputs, outputs, constant_nodes + body, opsets,
                                    overload=overload, doc_string=doc)
    call = helper.make_node(OP, inputs, outputs, name=f"npu_partition_{partition}", domain=FUSED_DOMAIN,
                            doc_string=doc)
    call.overload = overload
    return call, function


def _value_info(spec) -> onnx.ValueInfoProto:
    shape = [d if d >= 0 else None for d in spec.shape]
    return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)), shape)
