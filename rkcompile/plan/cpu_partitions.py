"""Each CPU partition of a plan as a standalone ONNX model, for the CPU runtime beside the NPU.

Built from the plan alone: the partition's steps in order, each from its `operation` (a fused CPU
kernel expanded into its members), the weights they read as initializers with the values the
weight region holds (in the dtype the CPU computes in), the tensors the partition reads from
elsewhere as inputs and those it writes for others (or as model outputs) as outputs. The .rkplan
artifact stores them as cpu/partition_<id>.onnx (docs/plan-schema.md).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper

from rkcompile.plan.plain_nodes import Constant, Node, expanded_members, node_operands
from rkcompile.plan.onnx_protos import node_proto, tensor_proto
from rkcompile.plan.schema import PlanRecord, Step


def cpu_partition_models(plan: PlanRecord, nodes: Sequence[Node]) -> dict[int, onnx.ModelProto]:
    """partition id -> its model; `nodes` are the plan's step nodes rebuilt over its weight
    region (the emulator's `Executor.step_nodes`)."""
    models = {}
    for partition in plan.partitions:
        if partition.device == "cpu":
            steps = [plan.steps[index] for index in partition.steps]
            models[partition.id] = _partition_model(plan, steps, [nodes[step.id] for step in steps],
                                                    f"cpu_partition_{partition.id}")
    return models


def _partition_model(plan: PlanRecord, steps: list[Step], nodes: list[Node], name: str) -> onnx.ModelProto:
    members = [member for node in nodes for member in expanded_members(node)]
    written = {t.name for member in members for t in member.outputs if t.name}
    inside = {step.id for step in steps}
    read_elsewhere = {tensor for step in plan.steps if step.id not in inside for tensor in step.inputs}
    read_elsewhere |= {spec.name for spec in plan.model.outputs}
    inputs, initializers = {}, {}
    for member in members:
        for tensor in node_operands(member):
            if not tensor.name or tensor.name in written:
                continue
            if isinstance(tensor, Constant) and tensor.name not in initializers:
                initializers[tensor.name] = tensor_proto(tensor)
            else:
                inputs.setdefault(tensor.name, _value_info(plan, tensor.name, tensor.dtype))
    outputs = [_value_info(plan, t.name, None) for member in members for t in member.outputs
               if t.name and t.name in read_elsewhere]
    graph = helper.make_graph([node_proto(member) for member in members], name, list(inputs.values()), outputs,
                              list(initializers.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", plan.model.opset)])


def _value_info(plan: PlanRecord, name: str, dtype) -> onnx.ValueInfoProto:
    placed = plan.tensors.get(name)
    shape = list(placed.shape) if placed is not None and placed.shape is not None else None
    element = dtype if dtype else placed.dtype if placed is not None else None
    if element is None:
        return helper.make_value_info(name, onnx.TypeProto())
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(element)), shape)
