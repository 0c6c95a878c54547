"""The plan as a networkx DiGraph (`Plan.partition_graph`, `rkcompile graph --format graphml`):
partitions and steps as nodes, what each holds and what flows between them as edges, every
attribute a string or a number so GraphML and other writers take the graph as it is.

Nodes are `partition:<id>` (kind "partition": device, steps, bytes the partition's steps read
and write, estimated time) and `step:<id>` (kind "step": device, kernel, partition, model nodes,
tensors read and written, MACs, bytes, estimated time). Edges: partition -> step (kind
"contains"), step -> step (kind "tensor": the tensors one writes and the other reads, and their
bytes), and partition -> partition (kind "tensor", the same summed over the steps they hold).
Estimated times are the perf table's (rkcompile/views/perf.py): one image, as the summary times it.

networkx is imported here only, when a graph is asked for: importing it takes 0.4 s, which no
plan process should pay (rkcompile/ir/dag.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rkcompile.plan.aliases import storage_of
from rkcompile.plan.schema import PlanRecord
from rkcompile.views.perf import step_perf

if TYPE_CHECKING:
    import networkx


def partition_graph(plan: PlanRecord) -> "networkx.DiGraph":
    import networkx

    graph = networkx.DiGraph(model=plan.model.path, target=plan.target, dtype=plan.dtype, batch=plan.batch)
    rows = {row.step: row for row in step_perf(plan)}
    for partition in plan.partitions:
        held = [rows[step] for step in partition.steps]
        graph.add_node(f"partition:{partition.id}", kind="partition", device=partition.device,
                       steps=" ".join(map(str, partition.steps)), bytes_read=sum(row.bytes_read for row in held),
                       bytes_written=sum(row.bytes_written for row in held),
                       est_us=round(sum(row.seconds for row in held) * 1e6, 3))
    writer = {}
    for step in plan.steps:
        row = rows[step.id]
        graph.add_node(f"step:{step.id}", kind="step", device=step.device, kernel=step.kernel,
                       partition=step.partition, nodes=" ".join(step.nodes), reads=" ".join(step.inputs),
                       writes=" ".join(step.outputs), macs=step.macs, bytes_read=row.bytes_read,
                       bytes_written=row.bytes_written, est_us=round(row.seconds * 1e6, 3))
        graph.add_edge(f"partition:{step.partition}", f"step:{step.id}", kind="contains")
        writer.update((name, step) for name in step.outputs)
    for step in plan.steps:
        for name in dict.fromkeys(step.inputs):
            source = writer.get(storage_of(plan.tensors, name))  # an alias flows from its source's writer
            if source is None:  # a model input or a weight
                continue
            _add_flow(graph, f"step:{source.id}", f"step:{step.id}", name, plan.tensors[name].bytes)
            if source.partition != step.partition:
                _add_flow(graph, f"partition:{source.partition}", f"partition:{step.partition}", name,
                          plan.tensors[name].bytes)
    return graph


def _add_flow(graph, source: str, target: str, tensor: str, size: int) -> None:
    """`tensor` flows from `source` to `target`: added to their edge's tensors and bytes."""
    if graph.has_edge(source, target):
        edge = graph.edges[source, target]
        if tensor not in edge["tensors"].split(" "):
            edge["tensors"] += f" {tensor}"
            edge["bytes"] += size
        return
    graph.add_edge(source, target, kind="tensor", tensors=tensor, bytes=size)
