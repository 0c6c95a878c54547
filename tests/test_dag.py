"""rkcompile.ir.dag against networkx (what the passes used before) on random graphs."""
from __future__ import annotations

import random

import networkx as nx
import pytest

from rkcompile.ir.dag import Dag, descendants, find_cycle, is_acyclic, topological_sort


def random_edges(seed: int, nodes: int = 30, edges: int = 60, acyclic: bool = True) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    pairs = [(rng.randrange(nodes), rng.randrange(nodes)) for _ in range(edges)]
    return [(min(a, b), max(a, b)) if acyclic else (a, b) for a, b in pairs if a != b]


@pytest.mark.parametrize("seed", range(20))
def test_matches_networkx(seed):
    edges = random_edges(seed, acyclic=seed % 2 == 0)
    ours, theirs = Dag(edges), nx.DiGraph(edges)
    assert sorted(ours.edges) == sorted(theirs.edges)
    assert is_acyclic(ours) == nx.is_directed_acyclic_graph(theirs)
    for node in theirs.nodes:
        assert descendants(ours, node) == nx.descendants(theirs, node) | ({node} if _on_cycle(theirs, node) else set())
        assert ours.in_degree(node) == theirs.in_degree(node)
    cycle = find_cycle(ours)
    if nx.is_directed_acyclic_graph(theirs):
        order = {node: index for index, node in enumerate(topological_sort(ours))}
        assert cycle == [] and all(order[a] < order[b] for a, b in edges)
    else:
        assert cycle and cycle[0][0] == cycle[-1][1] and all(theirs.has_edge(a, b) for a, b in cycle)
        with pytest.raises(ValueError, match="cycle"):
            topological_sort(ours)


def _on_cycle(graph: nx.DiGraph, node) -> bool:
    return any(node in nx.descendants(graph, s) or s == node for s in graph.successors(node))


def test_remove_nodes_keeps_both_directions():
    dag = Dag([("a", "b"), ("b", "c"), ("a", "c")])
    dag.remove_nodes_from(["b"])
    assert list(dag.edges) == [("a", "c")] and list(dag.predecessors("c")) == ["a"] and "b" not in dag
