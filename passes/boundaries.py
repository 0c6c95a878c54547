"""Boundaries: an explicit host step for every tensor that changes format between devices.

The NPU keeps 4-D feature maps as NC1HWC2 in the plan's NPU dtype (seed 003, 3.x "NC1HWC2");
the CPU and the user see ONNX's NCHW (or plain row-major) in the model's dtype. Wherever a
tensor crosses from one to the other, a `host` step converts it and writes a new tensor,
`NAME@cpu` or `NAME@npu`, which the consumers on the other device then read. Model inputs
entering the NPU and model outputs leaving it are boundaries too: rknn-toolkit2 lists them as
the CPU layers InputOperator and OutputOperator (shared/peer/zoo_rk3588.json).

A tensor an If, Loop or Scan reads from inside a subgraph crosses like any other input: the
subgraph's nodes are rewired to the converted tensor. Each conversion runs right after the partition that produced its tensor, in a `host` partition
of its own, so one conversion serves every later consumer on the other device. Tensors stored
the same way on both sides (integer shape and index tensors) cross without a step.
Formats are `layout.placement`'s, the one rule for how a device stores a tensor; `layout` runs
after this pass and stores each converted tensor the way the device that reads it does.

A float constant read on both devices is stored once per device: the CPU's readers read a copy,
`NAME@cpu`, in the model's dtype. The CPU computes in the model's dtype, and a weight rounded
to the NPU's float16 would change its results: a shared scale of 0.0123 is 1e-4 off, enough
for x/scale to round to another integer.
"""
from __future__ import annotations

from typing import NamedTuple

import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext, Placement
from rkcompile.ir.graph import node_inputs, readers, replace_reads
from rkcompile.passes.layout import placement, reads_as_image

NAME = "boundaries"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "options", "order", "origins", "partitions", "placement", "target"})
PROVIDES = frozenset({"graph", "order", "origins", "partitions", "placement"})

HOST_DOMAIN = "rkcompile"
HOST_OP = "Convert"


class TensorFormat(NamedTuple):
    layout: str
    dtype: str
    bytes: int

    def __str__(self) -> str:
        return f"{self.layout} {self.dtype}"


def tensor_format(tensor: gs.Tensor, device: str, ctx: CompileContext, as_image: bool = False) -> TensorFormat | None:
    """How `device` stores `tensor` as an intermediate result (`as_image`: a model input's NPU
    copy that `layout.reads_as_image`); None when its shape or dtype is unknown. The user's side
    of model inputs and outputs is the CPU's format."""
    stored = placement(tensor, "arena", device, ctx.target, ctx.options.dtype, as_image)
    if stored.layout == "unknown":
        return None
    return TensorFormat(stored.layout, stored.dtype, stored.bytes)


class Crossing(NamedTuple):
    """A tensor leaving its producer's device for consumers on `device`."""

    tensor: gs.Variable
    source: TensorFormat
    target: TensorFormat
    device: str
    consumers: tuple[gs.Node, ...]


def crossings(ctx: CompileContext, reading: dict[str, list[gs.Node]]) -> list[Crossing]:
    """Every tensor whose consumers on another device need it in another format, in the order
    the tensors are produced (model inputs first). `reading` is `ir.readers` of the graph."""
    device_of = {name: placed.device for name, placed in ctx.placement.items()}
    nodes = {node.name: node for node in ctx.graph.nodes}
    outputs = {t.name for t in ctx.graph.outputs}
    model_inputs = {t.name for t in ctx.graph.inputs}
    produced = [(t, "cpu") for t in ctx.graph.inputs]
    produced += [(t, device_of[name]) for name in ctx.order for t in nodes[name].outputs if t.name]
    found = []
    for tensor, producer_device in produced:
        by_device: dict[str, list[gs.Node]] = {}
        for consumer in reading.get(tensor.name, ()):
            by_device.setdefault(device_of.get(consumer.name, producer_device), []).append(consumer)
        if tensor.name in outputs:
            by_device.setdefault("cpu", [])
        source = tensor_format(tensor, producer_device, ctx)
        for device, consumers in by_device.items():
            as_image = device == "npu" and tensor.name in model_inputs and reads_as_image(tensor, consumers, ctx.target)
            target = tensor_format(tensor, device, ctx, as_image)
            if device != producer_device and source is not None and target is not None and source != target:
                found.append(Crossing(tensor, source, target, device, tuple(consumers)))
    return found


def run(ctx: CompileContext) -> None:
    split_shared_constants(ctx)
    owner = {name: index for index, (_, members) in enumerate(ctx.partitions) for name in members}
    outputs = {t.name for t in ctx.graph.outputs}
    after_partition: dict[int, list[str]] = {}
    reading = readers(ctx.graph)
    found = crossings(ctx, reading)
    for crossing in found:
        producer = crossing.tensor.inputs[0].name if crossing.tensor.inputs else None
        step = _insert_conversion(ctx, crossing, crossing.tensor.name in outputs, reading.get(crossing.tensor.name, ()))
        after_partition.setdefault(owner[producer] if producer else -1, []).append(step)
    partitions = [("host", after_partition[-1])] if -1 in after_partition else []
    for index, partition in enumerate(ctx.partitions):
        partitions.append(partition)
        if index in after_partition:
            partitions.append(("host", after_partition[index]))
    ctx.partitions = partitions
    ctx.order = [name for _, members in partitions for name in members]
    _nodes_in_execution_order(ctx)


def _nodes_in_execution_order(ctx: CompileContext) -> None:
    """The graph's nodes, the conversions appended above among them, in `ctx.order`: a
    topological order by construction (partitions run in a dependency order, and a conversion
    right after the partition writing its tensor). Later passes look nodes up by name and walk
    `ctx.order`; onnx-graphsurgeon's toposort of the whole graph, which this replaces, took a
    tenth of a second on tv_ssdlite320's 2,000 nodes. The nodes inside subgraphs (If branches,
    loop bodies, fused kernels' members, which the plan describes in order) and model-local
    functions are sorted as that toposort sorted them."""
    graph = ctx.graph
    for function in graph.functions:
        function.toposort(mode="nodes")
    for subgraph in graph.subgraphs():
        if not _in_toposort_order(subgraph):
            subgraph.toposort(recurse_functions=False, mode="nodes")
    graph.toposort(mode="functions")
    position = {name: index for index, name in enumerate(ctx.order)}
    unordered = [node.name for node in graph.nodes if node.name not in position]
    if unordered or len(position) != len(graph.nodes):
        raise AssertionError(f"boundaries: the execution order and the graph's nodes differ: {unordered[:5]}")
    graph.nodes.sort(key=lambda node: position[node.name])


def _in_toposort_order(graph: gs.Graph) -> bool:
    """True when onnx-graphsurgeon's toposort would leave `graph`'s nodes as they are. That
    toposort gives each node a depth (1 + the deepest node of the graph writing a tensor it
    reads, its subgraphs' outer reads included; 0 when none does) and sorts by depth, stably,
    from the list order when the list is already topological. So the list stays as it is
    exactly when each node's producers come before it and the depths never fall along it. Most
    subgraphs are fused kernels' bodies in that order (Conv then a nested exSwish; LayerNorm's
    ReduceMean, Sub, Pow, ...; two roots and their join), and sorting each with the toposort
    cost a tenth of the boundaries pass."""
    local = {t.name for node in graph.nodes for t in node.outputs if t.name}
    depth_of: dict[int, int] = {}
    last = 0
    for node in graph.nodes:
        depth = 0
        for tensor in node_inputs(node):
            if tensor.name not in local:
                continue
            for producer in tensor.inputs:
                if id(producer) not in depth_of:
                    return False  # written later in the list (or elsewhere): left to the toposort
                depth = max(depth, depth_of[id(producer)] + 1)
        if depth < last:
            return False
        depth_of[id(node)] = last = depth
    return True


def split_shared_constants(ctx: CompileContext) -> None:
    """Give the CPU readers of a constant the NPU also reads, and stores in another dtype, a copy
    of their own (`NAME@cpu`, stored as the model wrote it)."""
    device_of = {name: placed.device for name, placed in ctx.placement.items()}
    for name, consumers in readers(ctx.graph).items():
        on_cpu = [c for c in consumers if device_of.get(c.name) == "cpu"]
        if not on_cpu or len(on_cpu) == len(consumers):
            continue  # asked first: most tensors are read on one device, and this needs no node_inputs
        tensor = next((t for t in node_inputs(consumers[0]) if t.name == name), None)
        if not isinstance(tensor, gs.Constant):
            continue
        stored = {device: placement(tensor, "weight", device, ctx.target, ctx.options.dtype).dtype
                  for device in ("npu", "cpu")}
        if stored["npu"] == stored["cpu"]:
            continue
        copy = gs.Constant(f"{name}@cpu", values=tensor.values)
        for consumer in on_cpu:
            replace_reads(consumer, tensor, copy)


def _insert_conversion(ctx: CompileContext, crossing: Crossing, is_model_output: bool,
                       reading: tuple[gs.Node, ...] | list[gs.Node]) -> str:
    """Add the host node converting `crossing.tensor` and rewire the consumers (`reading`: every
    node of the graph that reads the tensor, outer-scope reads included); returns its name.

    A model output keeps its name on the user's side: the NPU then writes `NAME@npu`, which
    its own consumers read, and the host step converts that into `NAME`.
    """
    tensor = crossing.tensor
    if is_model_output:
        source = gs.Variable(f"{tensor.name}@npu", dtype=tensor.dtype, shape=tensor.shape)
        producer = tensor.inputs[0]
        producer.outputs[producer.outputs.index(tensor)] = source
        converting_for = {id(c) for c in crossing.consumers}
        for consumer in reading:
            if id(consumer) not in converting_for:
                replace_reads(consumer, tensor, source)
        converted = tensor
    else:
        source = tensor
        converted = gs.Variable(f"{tensor.name}@{crossing.device}", dtype=tensor.dtype, shape=tensor.shape)
        for consumer in crossing.consumers:
            replace_reads(consumer, tensor, converted)
    name = f"convert:{converted.name}"
    node = gs.Node(op=HOST_OP, name=name, domain=HOST_DOMAIN, inputs=[source], outputs=[converted],
                   attrs={"from": str(crossing.source), "to": str(crossing.target)})
    ctx.graph.nodes.append(node)
    ctx.placement[name] = Placement("host", f"{crossing.source} -> {crossing.target}")
    ctx.origins[name] = ()
    return name
