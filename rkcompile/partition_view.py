"""What the pictures of a plan show, gathered once: partitions in execution order, their nodes
with op, shapes, kernel and every failing rule, and the edges between partitions.
`graphviz.py` and `html_report.py` render it; neither looks at the compiler's context."""
from __future__ import annotations

from dataclasses import dataclass

from .context import CompileContext
from .ir import node_inputs
from .plan import Plan

DEVICE_COLOURS = {"npu": "#b7e4c7", "cpu": "#ffd6a5", "host": "#dee2e6"}


@dataclass(frozen=True)
class NodeView:
    name: str
    op: str
    device: str
    kernel: str
    inputs: tuple[tuple[str, str], ...]   # (tensor, shape text)
    outputs: tuple[tuple[str, str], ...]
    originals: tuple[str, ...]
    failing_rules: tuple[str, ...]
    reason: str | None


@dataclass(frozen=True)
class PartitionView:
    id: int
    device: str
    nodes: tuple[NodeView, ...]
    feeds: tuple[int, ...]          # partitions that read what this one writes


@dataclass(frozen=True)
class PlanView:
    model: str
    target: str
    partitions: tuple[PartitionView, ...]
    edges: tuple[tuple[str, str, str], ...]   # (producer node, consumer node, tensor)


def _shape_text(plan: Plan, tensor: str) -> str:
    placed = plan.tensors.get(tensor)
    if placed is None or placed.shape is None:
        return "?"
    return "x".join(str(d) for d in placed.shape) or "scalar"


def build_view(plan: Plan, ctx: CompileContext) -> PlanView:
    nodes = {node.name: node for node in ctx.graph.nodes}
    step_name = {index: name for index, name in enumerate(ctx.order)}
    made_by = {t.name: node.name for node in ctx.graph.nodes for t in node.outputs if t.name}
    partition_of = {step_name[s]: p.id for p in plan.partitions for s in p.steps}
    edges = tuple((made_by[t.name], name, t.name) for name in ctx.order for t in node_inputs(nodes[name])
                  if t.name in made_by)
    partitions = []
    for partition in plan.partitions:
        views = []
        for step_id in partition.steps:
            step = plan.steps[step_id]
            name = step_name[step_id]
            views.append(NodeView(
                name=name, op=nodes[name].op, device=step.device, kernel=step.kernel,
                inputs=tuple((t, _shape_text(plan, t)) for t in step.inputs),
                outputs=tuple((t, _shape_text(plan, t)) for t in step.outputs),
                originals=step.nodes,
                failing_rules=tuple(str(f) for f in ctx.failures.get(name, ())),
                reason=ctx.placement[name].reason,
            ))
        feeds = sorted({partition_of[consumer] for producer, consumer, _ in edges
                        if partition_of[producer] == partition.id and partition_of[consumer] != partition.id})
        partitions.append(PartitionView(partition.id, partition.device, tuple(views), tuple(feeds)))
    return PlanView(model=plan.model.path.rsplit("/", 1)[-1], target=plan.target,
                    partitions=tuple(partitions), edges=edges)
