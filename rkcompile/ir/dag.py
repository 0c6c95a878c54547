"""A directed graph of hashable nodes and the few algorithms the passes need on it.

The passes used networkx for this, whose import alone (every algorithm it ships) took 0.4 s of
each `rkcompile plan` process, as long as creating an onnxruntime session on a small model
(tools/bench_plan.py). `Dag` keeps networkx's method names for what it offers (`nodes`, `edges`,
`successors`, `predecessors`, `in_degree`, `has_edge`, `add_*`, `remove_nodes_from`), so the
passes read as before, and each algorithm here is linear in nodes plus edges.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator


class Dag:
    """Successor and predecessor sets per node, in insertion order (dicts used as ordered sets),
    so every traversal is deterministic."""

    def __init__(self, edges: Iterable[tuple[Hashable, Hashable]] = ()):
        self._succ: dict[Hashable, dict[Hashable, None]] = {}
        self._pred: dict[Hashable, dict[Hashable, None]] = {}
        self.add_edges_from(edges)

    @property
    def nodes(self) -> list[Hashable]:
        return list(self._succ)

    @property
    def edges(self) -> Iterator[tuple[Hashable, Hashable]]:
        return ((source, sink) for source, sinks in self._succ.items() for sink in sinks)

    def __contains__(self, node: Hashable) -> bool:
        return node in self._succ

    def __len__(self) -> int:
        return len(self._succ)

    def add_node(self, node: Hashable) -> None:
        if node not in self._succ:
            self._succ[node], self._pred[node] = {}, {}

    def add_nodes_from(self, nodes: Iterable[Hashable]) -> None:
        for node in nodes:
            self.add_node(node)

    def add_edge(self, source: Hashable, sink: Hashable) -> None:
        self.add_node(source)
        self.add_node(sink)
        self._succ[source][sink] = None
        self._pred[sink][source] = None

    def add_edges_from(self, edges: Iterable[tuple[Hashable, Hashable]]) -> None:
        for source, sink in edges:
            self.add_edge(source, sink)

    def remove_nodes_from(self, nodes: Iterable[Hashable]) -> None:
        for node in nodes:
            for sink in self._succ.pop(node, ()):
                del self._pred[sink][node]
            for source in self._pred.pop(node, ()):
                del self._succ[source][node]

    def has_edge(self, source: Hashable, sink: Hashable) -> bool:
        return sink in self._succ.get(source, ())

    def successors(self, node: Hashable) -> Iterator[Hashable]:
        return iter(self._succ[node])

    def predecessors(self, node: Hashable) -> Iterator[Hashable]:
        return iter(self._pred[node])

    def in_degree(self, node: Hashable) -> int:
        return len(self._pred[node])


def descendants(dag: Dag, node: Hashable) -> set[Hashable]:
    """Every node reachable from `node`, not counting `node` itself unless on a cycle."""
    found: set[Hashable] = set()
    frontier = [node]
    while frontier:
        for successor in dag.successors(frontier.pop()):
            if successor not in found:
                found.add(successor)
                frontier.append(successor)
    return found


def topological_sort(dag: Dag) -> list[Hashable]:
    """Kahn's algorithm; ValueError naming a cycle when there is one."""
    indegree = {node: dag.in_degree(node) for node in dag.nodes}
    ready = [node for node, degree in indegree.items() if degree == 0]
    order = []
    while ready:
        node = ready.pop()
        order.append(node)
        for successor in dag.successors(node):
            indegree[successor] -= 1
            if indegree[successor] == 0:
                ready.append(successor)
    if len(order) != len(indegree):
        raise ValueError("graph has a cycle through " + " -> ".join(str(a) for a, _ in find_cycle(dag)))
    return order


def is_acyclic(dag: Dag) -> bool:
    try:
        topological_sort(dag)
    except ValueError:
        return False
    return True


def find_cycle(dag: Dag) -> list[tuple[Hashable, Hashable]]:
    """The edges of one cycle, in order (empty when there is none): an iterative depth-first
    search, a cycle being an edge back to a node still on the search path."""
    done: set[Hashable] = set()
    for start in dag.nodes:
        if start in done:
            continue
        path, on_path = [start], {start: 0}
        branches = [dag.successors(start)]
        while branches:
            successor = next(branches[-1], None)
            if successor is None:
                finished = path.pop()
                del on_path[finished]
                done.add(finished)
                branches.pop()
            elif successor in on_path:
                loop = path[on_path[successor]:] + [successor]
                return list(zip(loop, loop[1:]))
            elif successor not in done:
                on_path[successor] = len(path)
                path.append(successor)
                branches.append(dag.successors(successor))
    return []
