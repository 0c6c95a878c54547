"""Aliases as the nodes they stand for. A tensor that `aliases` another (TensorPlacement.aliases,
passes/alias.py) is that tensor's stored bytes under its own shape, which no step writes; its
`view` says how its elements come from the other's (Transposes and Reshapes; none: a Reshape).
Readers that rebuild the planned graph from the steps (the float reference, the ONNX views and
exports) run those nodes right after the step writing the source; the emulator needs none, as
it reads the bytes."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rkcompile.numerics.dtypes import element_count
from rkcompile.plan.plain_nodes import Constant, Node, Variable
from rkcompile.plan.schema import PlanRecord, TensorPlacement


def storage_of(tensors: Mapping[str, TensorPlacement], name: str) -> str:
    """The tensor whose bytes `name` is: its source when it is an alias, else itself."""
    tensor = tensors.get(name)
    return tensor.aliases if tensor is not None and tensor.aliases is not None else name


def view_steps(shape: tuple[int, ...], view: tuple) -> tuple:
    """An alias's view as it is run: ("Reshape", `shape`) for an empty one."""
    return view or (("Reshape", tuple(shape)),)


def viewed_indices(source_shape: tuple[int, ...], shape: tuple[int, ...], view: tuple) -> np.ndarray:
    """Which element of a tensor of `source_shape` (by its row-major index) each element of the
    alias of `shape` holds through `view`."""
    values = np.arange(element_count(source_shape), dtype=np.int64).reshape(source_shape)
    for op, parameter in view_steps(shape, view):
        values = values.transpose(parameter) if op == "Transpose" else values.reshape(parameter)
    return values


def view_nodes(plan: PlanRecord) -> dict[int, list[Node]]:
    """Each alias's nodes (its view, from its source), by the id of the step that writes the source."""
    writer = {name: step.id for step in plan.steps for name in step.outputs}
    found: dict[int, list[Node]] = {}
    for name, tensor in plan.tensors.items():
        if tensor.aliases is None:
            continue
        steps = view_steps(tensor.shape, tensor.view)
        nodes = found.setdefault(writer[tensor.aliases], [])
        reads = tensor.aliases
        for index, (op, parameter) in enumerate(steps):
            writes = name if index == len(steps) - 1 else f"{name}:view{index}"
            if op == "Transpose":
                nodes.append(Node("Transpose", f"{writes}:transpose", {"perm": list(parameter)}, [Variable(reads)],
                                  [Variable(writes)]))
            else:
                shape = Constant(f"{writes}:shape", np.array(parameter, dtype=np.int64))
                nodes.append(Node("Reshape", f"{writes}:reshape", inputs=[Variable(reads), shape],
                                  outputs=[Variable(writes)]))
            reads = writes
    return found


def with_views(plan: PlanRecord, nodes: Sequence[Node]) -> tuple[list[Node], list[str]]:
    """`nodes`, one per step in step order, with each alias's nodes after its source's step,
    and the device each runs on (the step's; an alias's is its source step's, but "npu" after
    a host step: readers run a host step as the identity its conversion is on real values, and
    an alias of its output, RT-DETR's Unsqueeze of TopK's scores on their way to the NPU, still
    needs its Reshape)."""
    views = view_nodes(plan)
    ordered, devices = [], []
    for step, node in zip(plan.steps, nodes):
        added = views.get(step.id, [])
        ordered += [node, *added]
        devices += [step.device] + ["npu" if step.device == "host" else step.device] * len(added)
    return ordered, devices
