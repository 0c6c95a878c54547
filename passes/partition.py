"""Partition: group the placed nodes into convex single-device partitions, prune islands that do
not pay for themselves, and fix the execution order.

Topological-wave grouping, as onnxruntime's EP partitioner does: keep taking ready nodes of the
current device; when none is ready, close the partition and switch to the device of the
earliest ready node. Each partition is then a contiguous run of a topological order, which makes
it convex and the contracted graph acyclic; `check_partitions_acyclic` proves it.

Placement then changes in four ways, each recorded as the node's reason in the plan:
- shape arithmetic (nodes whose results only feed shape and index inputs) stays on the CPU, so
  it never ping-pongs between devices; `fold_constants` already folded what is static;
- a relabel the compiler wrote, of a CPU result that no other NPU node reads, runs on the CPU,
  where the row-major tensor takes it without moving a byte; the conversion after it writes
  the NPU's layout;
- an NPU island (fed by and feeding CPU partitions, touching no model input or output) moves to
  the CPU when the plan's own estimate of the whole run (what passes/multicore.py reports, for
  one image on one core) says the plan gets faster without it by more than the estimate can
  resolve (`ISLAND_MOVE_RESOLUTION` of the island's own cost); one island at a time, best
  first, each move strictly lowering the estimate, so the loop ends;
- a cheap CPU partition between NPU partitions, where the rules leave no choice, is annotated
  with why it stays (rewrites that could have moved it run before `assign`).
The estimate is `rkcompile.plan.cost_model` over `cost_estimate.step_work`; nothing here knows its rates.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
import heapq
from typing import Callable

import onnx_graphsurgeon as gs

from rkcompile.plan import cost_model
from rkcompile.compiler.context import CompileContext, Placement
from rkcompile.ir.dag import Dag, find_cycle, topological_sort
from rkcompile.compiler.cost_estimate import step_work
from rkcompile.ir.graph import dataflow_graph, is_onnx_domain, outer_scope_reads, readers
from rkcompile.passes.boundaries import TensorFormat, tensor_format
from rkcompile.passes.layout import placement
from rkcompile.passes.rewrites.base import RESHAPE_LIKE as RELABELS
from rkcompile.targets.common import ONNX_TO_KERNEL

NAME = "partition"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"failures", "graph", "options", "origins", "placement", "target"})
PROVIDES = frozenset({"order", "partitions", "placement"})

Partitions = list[tuple[str, list[str]]]
DEVICES = ("npu", "cpu")

SHAPE_ARITHMETIC = ("shape arithmetic: its result only feeds shape and index inputs, so it stays on "
                    "the CPU rather than ping-pong between devices")
MOVED_TO_CPU = ("moved to the CPU with its NPU island: the plan runs faster by the cost model's estimate "
                "without the conversions the island needs")
# The cost model's single-core fps deviate from Rockchip's published figures by up to 10.3%
# (docs/cost-model.md). A move whose gain is smaller than that share of what the island costs on
# the NPU (its steps and its conversions) is a tie the estimate cannot call; the island then stays
# on the NPU, where the board's own compiler puts it (a transformer's 58-node attention block moved
# for 0.3% of the run).
ISLAND_MOVE_RESOLUTION = 0.10
RELABELLED_ON_CPU = ("a relabel of a CPU result, made on the CPU: its row-major tensor takes it without "
                     "moving a byte, and the conversion to the NPU's layout comes after it")
STAYS_BETWEEN_NPU = ("stays on the CPU between two NPU partitions although its conversions cost more "
                     "than its compute: no legal NPU rewrite applies")


def run(ctx: CompileContext) -> None:
    dag = dataflow_graph(ctx.graph)
    position = {node.name: i for i, node in enumerate(ctx.graph.nodes)}
    reading = readers(ctx.graph)
    estimate = PlacementEstimate(ctx, reading)
    keep_shape_arithmetic_on_cpu(ctx, dag, reading)
    relabel_cpu_results_on_cpu(ctx, reading)
    partitions = wave_partitions(dag, _devices(ctx), position)
    while (move := best_island_move(estimate, dag, partitions)) is not None:
        for name in move.nodes:
            ctx.placement[name] = Placement("cpu", ctx.placement[name].kernel, move.reason)
        partitions = wave_partitions(dag, _devices(ctx), position)
    annotate_sandwiched_cpu_partitions(ctx, estimate, dag, partitions)
    check_partitions_acyclic(dag, partitions)
    ctx.partitions = partitions
    ctx.order = [name for _, members in partitions for name in members]


def _devices(ctx: CompileContext) -> dict[str, str]:
    return {name: placed.device for name, placed in ctx.placement.items()}


def wave_partitions(dag: Dag, device: dict[str, str], position: dict[str, int]) -> Partitions:
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


def contracted_graph(dag: Dag, partitions: Partitions) -> Dag:
    """One node per partition index, an edge wherever a tensor flows between two partitions."""
    owner = {name: index for index, (_, members) in enumerate(partitions) for name in members}
    contracted = Dag()
    contracted.add_nodes_from(range(len(partitions)))
    contracted.add_edges_from((owner[a], owner[b]) for a, b in dag.edges if owner[a] != owner[b])
    return contracted


def check_partitions_acyclic(dag: Dag, partitions: Partitions) -> None:
    contracted = contracted_graph(dag, partitions)
    cycle = find_cycle(contracted)
    if cycle:
        raise AssertionError(f"partitions form a cycle: {cycle}")


def keep_shape_arithmetic_on_cpu(ctx: CompileContext, dag: Dag, reading: dict[str, list[gs.Node]]) -> None:
    for name in shape_arithmetic(ctx.graph, dag, reading):
        if ctx.placement[name].device == "npu":
            ctx.placement[name] = Placement("cpu", ctx.placement[name].kernel, SHAPE_ARITHMETIC)


def relabel_cpu_results_on_cpu(ctx: CompileContext, reading: dict[str, list[gs.Node]]) -> None:
    """An NPU relabel of a tensor a CPU node writes and no NPU node but it reads runs on the CPU:
    the tensor has to be converted to the NPU's layout anyway, and converted after the relabel
    it is never stored twice on the NPU (in the layout before the relabel and the one after),
    nor moved by an NPU step. A chain of relabels follows, one by one. Only a relabel the
    compiler wrote for a node whose work stays on the NPU moves (the relabels a MatMul run as a
    1x1 Conv reads through): the model's own nodes keep the places the rules gave them, as
    rknn-toolkit2 keeps such a Reshape of the model's on the NPU."""
    nodes = {node.name: node for node in ctx.graph.nodes}
    carriers = Counter(original for node in ctx.graph.nodes if ctx.placement[node.name].device == "npu"
                       for original in ctx.origins.get(node.name, (node.name,)))
    moved = True
    while moved:
        moved = False
        for node in ctx.graph.nodes:
            if ctx.placement[node.name].device != "npu" or not is_onnx_domain(node) or node.op not in RELABELS:
                continue
            data, origins = node.inputs[0], ctx.origins.get(node.name, (node.name,))
            writers = [w for w in data.inputs if w.name in nodes]
            if (len(writers) != 1 or ctx.placement[writers[0].name].device != "cpu"
                    or any(carriers[original] < 2 for original in origins)
                    or any(ctx.placement[r.name].device == "npu" for r in reading.get(data.name, ()) if r is not node)):
                continue
            ctx.placement[node.name] = Placement("cpu", ctx.placement[node.name].kernel, RELABELLED_ON_CPU)
            carriers.subtract(origins)
            moved = True


#: Ops whose integer results locate or rank the values of their data input rather than compute
#: on shapes (ONNX: TopK, ArgMax, ArgMin, NonZero, NonMaxSuppression, Unique).
LOCATES_VALUES = frozenset({"TopK", "ArgMax", "ArgMin", "NonZero", "NonMaxSuppression", "Unique"})


def shape_arithmetic(graph: gs.Graph, dag: Dag, reading: dict[str, list[gs.Node]]) -> set[str]:
    """Nodes whose every result is read only as a shape or index input (the positions
    `ONNX_TO_KERNEL` marks), directly or through other such nodes; model outputs never are,
    and neither is anything an If, Loop or Scan reads from inside a subgraph (data, there).
    What an op of `LOCATES_VALUES` reads stays data: its indices say where values lie or how
    they rank (a detector's scores through ReduceMax and TopK), and the score head computing
    them is the network's work, not arithmetic on shapes. `reading` is `ir.readers` of the graph."""
    nodes = {node.name: node for node in graph.nodes}
    outputs = {t.name for t in graph.outputs}
    found: set[str] = set()
    for name in reversed(topological_sort(dag)):
        node = nodes[name]
        results = [t for t in node.outputs if t.name]
        consumers = {id(c): c for t in results for c in reading.get(t.name, ())}
        if not consumers or any(t.name in outputs for t in results):
            continue
        if all((consumer.name in found and consumer.op not in LOCATES_VALUES) or _reads_only_as_index(consumer, results)
               for consumer in consumers.values()):
            found.add(name)
    return found


def _reads_only_as_index(consumer: gs.Node, tensors: list[gs.Tensor]) -> bool:
    index_positions = _index_inputs(consumer)
    listed = all(position in index_positions for position, read in enumerate(consumer.inputs)
                 if any(read is t for t in tensors))
    return listed and not any(read is t for read in outer_scope_reads(consumer) for t in tensors)


def _index_inputs(node: gs.Node) -> tuple[int, ...]:
    entry = ONNX_TO_KERNEL.get(node.op) if is_onnx_domain(node) else None
    return entry[1] if entry else ()


class PlacementEstimate:
    """The plan's own estimate (`cost_model.one_core_seconds`: one image, one core, one run) of
    a placement before the plan exists: each node a step on its device, each tensor crossing
    devices a host conversion, every tensor sized as that device stores it (`layout.placement`,
    which the plan's tensors then follow) and every step's work counted by
    `cost_estimate.step_work`, as passes/multicore.py counts the finished plan's."""

    def __init__(self, ctx: CompileContext, reading: dict[str, list[gs.Node]]):
        """`reading` is `ir.readers` of the graph."""
        self.hardware, self.dtype = cost_model.hardware_for(ctx.target), ctx.options.dtype
        nodes = {node.name: node for node in ctx.graph.nodes}
        outputs = {t.name for t in ctx.graph.outputs}
        # (producer or None for a model input, readers, is model output, name)
        self.tensors = []
        produced = [(None, t) for t in ctx.graph.inputs]
        produced += [(node.name, t) for node in ctx.graph.nodes for t in node.outputs if t.name]
        for producer, tensor in produced:
            self.tensors.append((producer, tuple(c.name for c in reading.get(tensor.name, ())),
                                 tensor.name in outputs, tensor.name))
        # A step's seconds on a device, and a tensor's format on a device, are worked out
        # when first asked: most are never asked (a CPU-only node's NPU cost; an NPU node's CPU
        # cost unless it is in an island; the conversions of a plan with no island to weigh).
        self._ctx, self._produced = ctx, {tensor.name: tensor for _, tensor in produced}
        self._formats: dict[tuple[str, str], TensorFormat | None] = {}
        self._nodes = nodes
        self._stored = {device: self._stored_on(device, self.format, ctx) for device in DEVICES}
        self._step_seconds: dict[tuple[str, str], float] = {}
        self.io_nodes = {c.name for t in ctx.graph.inputs for c in reading.get(t.name, ())}
        self.io_nodes |= {p.name for t in ctx.graph.outputs for p in t.inputs}

    def format(self, name: str, device: str) -> TensorFormat | None:
        """How `device` stores the tensor `name` (a model input or a node's result) as an
        intermediate result (`boundaries.tensor_format`; None for an unknown shape). Per device:
        a CPU node's step asks only the CPU's, and most tensors never cross devices
        (tv_ssdlite320: 1,586 CPU nodes, few of whose tensors ever need an NPU format)."""
        key = (name, device)
        if key not in self._formats:
            self._formats[key] = tensor_format(self._produced[name], device, self._ctx)
        return self._formats[key]

    def _seconds(self, work: cost_model.StepWork) -> float:
        return cost_model.step_seconds(work, self.hardware, self.dtype)

    def step(self, name: str, device: str) -> float:
        """The estimated seconds of node `name`'s step on `device`."""
        seconds = self._step_seconds.get((name, device))
        if seconds is None:
            work = step_work(self._nodes[name], device, self._stored[device])
            seconds = self._step_seconds[name, device] = self._seconds(work)
        return seconds

    @staticmethod
    def _stored_on(device: str, format_on: Callable[[str, str], TensorFormat | None],
                   ctx: CompileContext) -> Callable[[gs.Tensor], int]:
        """Bytes of a tensor as a step on `device` reads or writes it: a weight as that device
        stores weights, anything else in the device's own format, which a host conversion
        provides when the producer stores it otherwise (unknown shapes: no bytes, as layout)."""
        def stored(tensor: gs.Tensor) -> int:
            if isinstance(tensor, gs.Constant):
                return placement(tensor, "weight", device, ctx.target, ctx.options.dtype).bytes
            own = format_on(tensor.name, device)
            return own.bytes if own is not None else 0
        return stored

    def touches_model_io(self, members: list[str]) -> bool:
        return not self.io_nodes.isdisjoint(members)

    def conversion_seconds(self, device: dict[str, str], among: set[str] | None = None) -> float:
        """Host conversions of the tensors produced or read by `among` (every node when None)."""
        total = 0.0
        for producer, consumers, is_output, name in self.tensors:
            if among is not None and producer not in among and among.isdisjoint(consumers):
                continue
            source_device = device[producer] if producer else "cpu"
            wanted = {device[c] for c in consumers} | ({"cpu"} if is_output else set())
            for target_device in wanted - {source_device}:
                source, target = self.format(name, source_device), self.format(name, target_device)
                if source is not None and target is not None and source != target:
                    total += self._seconds(cost_model.StepWork("host", 0, 0, source.bytes, target.bytes))
        return total

    def island_seconds(self, device: dict[str, str], members: list[str]) -> float:
        """What an island costs where it is: its steps and the conversions of what it reads and writes."""
        return sum(self.step(name, device[name]) for name in members) + self.conversion_seconds(device, set(members))

    def seconds(self, device: dict[str, str]) -> float:
        """The whole plan's estimated run with every node on `device[node]`."""
        steps = sum(self.step(name, dev) for name, dev in device.items())
        return cost_model.RUN_SECONDS + steps + self.conversion_seconds(device)


@dataclass(frozen=True)
class IslandMove:
    """An NPU island worth moving to the CPU: its nodes, the estimated gain, and why."""

    nodes: tuple[str, ...]
    gain: float
    reason: str


def best_island_move(estimate: PlacementEstimate, dag: Dag, partitions: Partitions) -> IslandMove | None:
    """The NPU island whose move to the CPU makes the whole plan's estimated run fastest, or
    None when no move makes it faster by more than `ISLAND_MOVE_RESOLUTION` of the island's cost.

    Only islands in a CPU sea qualify: NPU partitions fed by a CPU partition and feeding one.
    A partition that reads the model's inputs or writes its outputs is the NPU part of the
    model, which the user asked for (and which rknn-toolkit2 would run there), however small.
    """
    device = {name: dev for dev, members in partitions for name in members}
    contracted = contracted_graph(dag, partitions)
    before = best = None  # the whole plan's estimate, worked out once an island qualifies: most plans have none
    for index, (dev, members) in enumerate(partitions):
        if dev != "npu" or not _between_cpu_partitions(contracted, partitions, index, estimate, members):
            continue
        if before is None:
            before = estimate.seconds(device)
        after = estimate.seconds(dict(device, **{name: "cpu" for name in members}))
        island_cost = estimate.island_seconds(device, members)
        if before - after > ISLAND_MOVE_RESOLUTION * island_cost and (best is None or before - after > best.gain):
            reason = (f"{MOVED_TO_CPU} (seen: island of {len(members)} nodes; the plan's estimated run (one image, "
                      f"one core) is {after * 1e6:.1f} us with it on the CPU, {before * 1e6:.1f} us on the NPU; "
                      f"the gain is over {ISLAND_MOVE_RESOLUTION:.0%} of the island's own {island_cost * 1e6:.1f} us)")
            best = IslandMove(tuple(members), before - after, reason)
    return best


def _between_cpu_partitions(contracted: Dag, partitions: Partitions, index: int,
                            estimate: PlacementEstimate, members: list[str]) -> bool:
    fed_by_cpu = any(partitions[p][0] == "cpu" for p in contracted.predecessors(index))
    feeds_cpu = any(partitions[s][0] == "cpu" for s in contracted.successors(index))
    return fed_by_cpu and feeds_cpu and not estimate.touches_model_io(members)


def annotate_sandwiched_cpu_partitions(ctx: CompileContext, estimate: PlacementEstimate, dag: Dag,
                                       partitions: Partitions) -> None:
    """Say why a cheap CPU partition fed by and feeding NPU partitions stays on the CPU."""
    contracted = contracted_graph(dag, partitions)
    device = {name: dev for dev, members in partitions for name in members}
    for index, (dev, members) in enumerate(partitions):
        neighbours = [partitions[p][0] for p in contracted.predecessors(index)], \
                     [partitions[s][0] for s in contracted.successors(index)]
        if dev != "cpu" or not all("npu" in side for side in neighbours):
            continue
        compute = sum(estimate.step(name, "cpu") for name in members)
        if compute >= estimate.conversion_seconds(device, set(members)):
            continue
        for name in members:
            placed = ctx.placement[name]
            if ctx.failures.get(name) and STAYS_BETWEEN_NPU not in placed.reason:
                ctx.placement[name] = Placement("cpu", placed.kernel, f"{placed.reason}; {STAYS_BETWEEN_NPU}")
