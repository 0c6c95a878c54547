"""What the pictures of a plan show, gathered once: partitions in execution order, their steps
with op, shapes, kernel and every failing rule, and the edges between partitions.
Built from the plan alone (a fresh compile, or a saved .rkplan or plan JSON file), so
`graphviz.py` and `html_report.py` draw what the plan says and never look at the compiler."""
from __future__ import annotations


from dataclasses import dataclass
from rkcompile.plan.schema import NodeEntry, PlanRecord, Step

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


def _shape_text(plan: PlanRecord, tensor: str) -> str:
    placed = plan.tensors.get(tensor)
    if placed is None or placed.shape is None:
        return "?"
    return "x".join(str(d) for d in placed.shape) or "scalar"


def step_name(step: Step) -> str:
    """The name of the node a step runs (its operation's); plan/1 files, which record no
    operation, name a step by its first original node or its id."""
    if step.operation is not None:
        return step.operation.name
    return step.nodes[0] if step.nodes else f"step_{step.id}"


def build_view(plan: PlanRecord) -> PlanView:
    names = [step_name(step) for step in plan.steps]
    made_by = {tensor: step.id for step in plan.steps for tensor in step.outputs}
    # an alias (a relabel that is no step) comes from the step writing the tensor whose bytes it is
    made_by.update((name, made_by[tensor.aliases]) for name, tensor in plan.tensors.items()
                   if tensor.aliases in made_by)
    step_edges = [(made_by[tensor], step.id, tensor) for step in plan.steps for tensor in step.inputs
                  if tensor in made_by]
    edges = tuple((names[producer], names[consumer], tensor) for producer, consumer, tensor in step_edges)
    entries: dict[int, list[NodeEntry]] = {}
    for node in plan.nodes:
        if node.step is not None:
            entries.setdefault(node.step, []).append(node)
    partitions = []
    for partition in plan.partitions:
        views = []
        for step_id in partition.steps:
            step = plan.steps[step_id]
            runs = entries.get(step_id, [])
            views.append(NodeView(
                name=names[step_id], op=step.operation.op if step.operation is not None else step.kernel,
                device=step.device, kernel=step.kernel,
                inputs=tuple((t, _shape_text(plan, t)) for t in step.inputs),
                outputs=tuple((t, _shape_text(plan, t)) for t in step.outputs),
                originals=step.nodes,
                # every original node of a step carries the step's placement, so the first speaks for all
                failing_rules=runs[0].rules if runs else (),
                reason=runs[0].reason if runs else None,
            ))
        feeds = sorted({plan.steps[consumer].partition for producer, consumer, _ in step_edges
                        if plan.steps[producer].partition == partition.id != plan.steps[consumer].partition})
        partitions.append(PartitionView(partition.id, partition.device, tuple(views), tuple(feeds)))
    return PlanView(model=plan.model.path.rsplit("/", 1)[-1], target=plan.target,
                    partitions=tuple(partitions), edges=edges)
