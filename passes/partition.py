"""Partition: group the placed nodes into convex single-device partitions, prune islands that do
not pay for themselves, and fix the execution order.

Topological-wave grouping, as onnxruntime's EP partitioner does: keep taking ready nodes of the
current device; when none is ready, close the partition and switch to the device of the
earliest ready node. Each partition is then a contiguous run of a topological order, which makes
it convex and the contracted graph acyclic; `check_partitions_acyclic` proves it with networkx.

Placement then changes in three ways, each recorded as the node's reason in the plan:
- shape arithmetic (nodes whose results only feed shape and index inputs) stays on the CPU, so
  it never ping-pongs between devices; `fold_constants` already folded what is static;
- an NPU island (fed by and feeding CPU partitions, touching no model input or output) whose
  estimated compute saving is smaller than the conversions and launch it needs moves to the
  CPU, one island at a time, best first, until no move helps;
- a cheap CPU partition between NPU partitions, where the rules leave no choice, is annotated
  with why it stays (rewrites that could have moved it run before `assign`).
The estimate is `rkcompile.cost_estimate`; nothing here knows its rates.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import networkx as nx
import onnx_graphsurgeon as gs

from rkcompile import cost_estimate
from rkcompile.context import CompileContext, Placement
from rkcompile.ir import dataflow_graph, is_onnx_domain
from rkcompile.passes.boundaries import conversion_bytes, tensor_format
from rkcompile.targets.common import ONNX_TO_KERNEL

NAME = "partition"

Partitions = list[tuple[str, list[str]]]

SHAPE_ARITHMETIC = ("shape arithmetic: its result only feeds shape and index inputs, so it stays on "
                    "the CPU rather than ping-pong between devices")
MOVED_TO_CPU = ("moved to the CPU with its NPU island: the estimated compute it saves on the NPU is less "
                "than its conversions and NPU launch cost")
STAYS_BETWEEN_NPU = ("stays on the CPU between two NPU partitions although its conversions cost more "
                     "than its compute: no legal NPU rewrite applies")


def run(ctx: CompileContext) -> None:
    dag = dataflow_graph(ctx.graph)
    position = {node.name: i for i, node in enumerate(ctx.graph.nodes)}
    estimate = PlacementEstimate(ctx)
    keep_shape_arithmetic_on_cpu(ctx, dag)
    partitions = wave_partitions(dag, _devices(ctx), position)
    while (move := best_island_move(estimate, dag, partitions, position)) is not None:
        for name in move.nodes:
            ctx.placement[name] = Placement("cpu", ctx.placement[name].kernel, move.reason)
        partitions = wave_partitions(dag, _devices(ctx), position)
    annotate_sandwiched_cpu_partitions(ctx, estimate, dag, partitions)
    check_partitions_acyclic(dag, partitions)
    ctx.partitions = partitions
    ctx.order = [name for _, members in partitions for name in members]


def _devices(ctx: CompileContext) -> dict[str, str]:
    return {name: placed.device for name, placed in ctx.placement.items()}


def wave_partitions(dag: nx.DiGraph, device: dict[str, str], position: dict[str, int]) -> Partitions:
    indegree = {n: dag.in_degree(n) for n in dag.nodes}
    ready: dict[str, list[tuple[int, str]]] = {}
    for name, degree in indegree.items():
        if degree == 0:
            heapq.heappush(ready.setdefault(device[name], []), (position[name], name))
    partitions: Partitions = []
    while any(ready.values()):
        current = min((queue[0][0], dev) for dev, queue in ready.items() if queue)[1]
        members: list[str] = []
        queue = ready[current]
        while queue:
            _, name = heapq.heappop(queue)
            members.append(name)
            for successor in dag.successors(name):
                indegree[successor] -= 1
                if indegree[successor] == 0:
                    heapq.heappush(ready.setdefault(device[successor], []), (position[successor], successor))
        partitions.append((current, members))
    return partitions


def contracted_graph(dag: nx.DiGraph, partitions: Partitions) -> nx.DiGraph:
    """One node per partition index, an edge wherever a tensor flows between two partitions."""
    owner = {name: index for index, (_, members) in enumerate(partitions) for name in members}
    contracted = nx.DiGraph()
    contracted.add_nodes_from(range(len(partitions)))
    contracted.add_edges_from((owner[a], owner[b]) for a, b in dag.edges if owner[a] != owner[b])
    return contracted


def check_partitions_acyclic(dag: nx.DiGraph, partitions: Partitions) -> None:
    contracted = contracted_graph(dag, partitions)
    if not nx.is_directed_acyclic_graph(contracted):
        raise AssertionError(f"partitions form a cycle: {nx.find_cycle(contracted)}")


def keep_shape_arithmetic_on_cpu(ctx: CompileContext, dag: nx.DiGraph) -> None:
    for name in shape_arithmetic(ctx.graph, dag):
        if ctx.placement[name].device == "npu":
            ctx.placement[name] = Placement("cpu", ctx.placement[name].kernel, SHAPE_ARITHMETIC)


def shape_arithmetic(graph: gs.Graph, dag: nx.DiGraph) -> set[str]:
    """Nodes whose every result is read only as a shape or index input (the positions
    `ONNX_TO_KERNEL` marks), directly or through other such nodes; model outputs never are."""
    nodes = {node.name: node for node in graph.nodes}
    outputs = {t.name for t in graph.outputs}
    found: set[str] = set()
    for name in reversed(list(nx.topological_sort(dag))):
        node = nodes[name]
        reads = [(consumer, position) for tensor in node.outputs if tensor.name
                 for consumer in tensor.outputs
                 for position, read in enumerate(consumer.inputs) if read is tensor]
        if not reads or any(t.name in outputs for t in node.outputs):
            continue
        if all(consumer.name in found or position in _index_inputs(consumer) for consumer, position in reads):
            found.add(name)
    return found


def _index_inputs(node: gs.Node) -> tuple[int, ...]:
    entry = ONNX_TO_KERNEL.get(node.op) if is_onnx_domain(node) else None
    return entry[1] if entry else ()


class PlacementEstimate:
    """Estimated seconds for a whole placement: compute, conversions, NPU launches."""

    def __init__(self, ctx: CompileContext):
        self.nodes = {node.name: node for node in ctx.graph.nodes}
        self.compute = {name: {device: cost_estimate.compute_seconds(node, device, ctx.target, ctx.options.dtype) for device in ("npu", "cpu")}
                        for name, node in self.nodes.items()}
        # (producer or None for a model input, consumers, is model output, format per device)
        self.tensors = []
        outputs = {t.name for t in ctx.graph.outputs}
        produced = [(None, t) for t in ctx.graph.inputs]
        produced += [(node.name, t) for node in ctx.graph.nodes for t in node.outputs if t.name]
        for producer, tensor in produced:
            formats = {device: tensor_format(tensor, device, ctx) for device in ("npu", "cpu")}
            self.tensors.append((producer, tuple(c.name for c in tensor.outputs), tensor.name in outputs, formats))
        self.io_nodes = {c.name for t in ctx.graph.inputs for c in t.outputs}
        self.io_nodes |= {p.name for t in ctx.graph.outputs for p in t.inputs}

    def touches_model_io(self, members: list[str]) -> bool:
        return not self.io_nodes.isdisjoint(members)

    def conversion_seconds(self, device: dict[str, str], among: set[str] | None = None) -> float:
        """Conversions of the tensors produced or read by `among` (every node when None)."""
        total = 0.0
        for producer, consumers, is_output, formats in self.tensors:
            if among is not None and producer not in among and among.isdisjoint(consumers):
                continue
            source_device = device[producer] if producer else "cpu"
            wanted = {device[c] for c in consumers} | ({"cpu"} if is_output else set())
            for target_device in wanted - {source_device}:
                source, target = formats[source_device], formats[target_device]
                if source is not None and target is not None and source != target:
                    total += cost_estimate.conversion_seconds(conversion_bytes(source, target))
        return total

    def seconds(self, device: dict[str, str], partitions: Partitions) -> float:
        compute = sum(self.compute[name][dev] for name, dev in device.items())
        launches = sum(1 for dev, _ in partitions if dev == "npu") * cost_estimate.NPU_LAUNCH_SECONDS
        return compute + launches + self.conversion_seconds(device)


@dataclass(frozen=True)
class IslandMove:
    nodes: tuple[str, ...]
    gain: float
    reason: str


def best_island_move(estimate: PlacementEstimate, dag: nx.DiGraph, partitions: Partitions,
                     position: dict[str, int]) -> IslandMove | None:
    """The NPU island whose move to the CPU lowers the estimate most, or None.

    Only islands in a CPU sea qualify: NPU partitions fed by a CPU partition and feeding one.
    A partition that reads the model's inputs or writes its outputs is the NPU part of the
    model, which the user asked for (and which rknn-toolkit2 would run there), however small.
    """
    device = {name: dev for dev, members in partitions for name in members}
    before = estimate.seconds(device, partitions)
    contracted = contracted_graph(dag, partitions)
    best = None
    for index, (dev, members) in enumerate(partitions):
        if dev != "npu" or not _between_cpu_partitions(contracted, partitions, index, estimate, members):
            continue
        moved = dict(device, **{name: "cpu" for name in members})
        gain = before - estimate.seconds(moved, wave_partitions(dag, moved, position))
        if gain > 0 and (best is None or gain > best.gain):
            saving = sum(estimate.compute[n]["cpu"] - estimate.compute[n]["npu"] for n in members)
            reason = (f"{MOVED_TO_CPU} (seen: island of {len(members)} nodes saves {saving * 1e6:.1f} us, "
                      f"costs {(gain + saving) * 1e6:.1f} us)")
            best = IslandMove(tuple(members), gain, reason)
    return best


def _between_cpu_partitions(contracted: nx.DiGraph, partitions: Partitions, index: int,
                            estimate: PlacementEstimate, members: list[str]) -> bool:
    fed_by_cpu = any(partitions[p][0] == "cpu" for p in contracted.predecessors(index))
    feeds_cpu = any(partitions[s][0] == "cpu" for s in contracted.successors(index))
    return fed_by_cpu and feeds_cpu and not estimate.touches_model_io(members)


def annotate_sandwiched_cpu_partitions(ctx: CompileContext, estimate: PlacementEstimate, dag: nx.DiGraph,
                                       partitions: Partitions) -> None:
    """Say why a cheap CPU partition fed by and feeding NPU partitions stays on the CPU."""
    contracted = contracted_graph(dag, partitions)
    device = {name: dev for dev, members in partitions for name in members}
    for index, (dev, members) in enumerate(partitions):
        neighbours = [partitions[p][0] for p in contracted.predecessors(index)], \
                     [partitions[s][0] for s in contracted.successors(index)]
        if dev != "cpu" or not all("npu" in side for side in neighbours):
            continue
        compute = sum(estimate.compute[name]["cpu"] for name in members)
        if compute >= estimate.conversion_seconds(device, set(members)):
            continue
        for name in members:
            placed = ctx.placement[name]
            if ctx.failures.get(name) and STAYS_BETWEEN_NPU not in placed.reason:
                ctx.placement[name] = Placement("cpu", placed.kernel, f"{placed.reason}; {STAYS_BETWEEN_NPU}")
