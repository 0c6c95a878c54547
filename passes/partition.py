"""Partition: group the placed nodes into convex single-device partitions and fix the order.

Topological-wave grouping, as onnxruntime's EP partitioner does: keep taking ready nodes of the
current device; when none is ready, close the partition and switch to the device of the
earliest ready node. Each partition is then a contiguous run of a topological order, which makes
it convex and the contracted graph acyclic; `check_partitions_acyclic` proves it with networkx.
"""
from __future__ import annotations

import heapq

import networkx as nx

from rkcompile.context import CompileContext
from rkcompile.ir import dataflow_graph

NAME = "partition"


def run(ctx: CompileContext) -> None:
    dag = dataflow_graph(ctx.graph)
    position = {node.name: i for i, node in enumerate(ctx.graph.nodes)}
    device = {name: ctx.placement[name].device for name in dag.nodes}
    ctx.partitions = wave_partitions(dag, device, position)
    ctx.order = [name for _, members in ctx.partitions for name in members]
    check_partitions_acyclic(dag, ctx.partitions)


def wave_partitions(dag: nx.DiGraph, device: dict[str, str],
                    position: dict[str, int]) -> list[tuple[str, list[str]]]:
    indegree = {n: dag.in_degree(n) for n in dag.nodes}
    ready: dict[str, list[tuple[int, str]]] = {}
    for name, degree in indegree.items():
        if degree == 0:
            heapq.heappush(ready.setdefault(device[name], []), (position[name], name))
    partitions: list[tuple[str, list[str]]] = []
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


def check_partitions_acyclic(dag: nx.DiGraph, partitions: list[tuple[str, list[str]]]) -> None:
    owner = {name: index for index, (_, members) in enumerate(partitions) for name in members}
    contracted = nx.DiGraph()
    contracted.add_nodes_from(range(len(partitions)))
    contracted.add_edges_from((owner[a], owner[b]) for a, b in dag.edges if owner[a] != owner[b])
    if not nx.is_directed_acyclic_graph(contracted):
        cycle = nx.find_cycle(contracted)
        raise AssertionError(f"partitions form a cycle: {cycle}")
