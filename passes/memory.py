"""Memory: give every arena tensor an offset so that tensors live at the same step never share
bytes, and lay the weight, input and output regions out one tensor after another.

Two regions are planned so: the NPU's arena, and the `cpu` region, the host memory of the
tensors only CPU steps and their conversions touch (passes/layout.py), which the NPU never
reads; each is sized apart. Live ranges come from the step order and the tensors each step
lists, whatever the step is (NPU, CPU or host conversion), so anything a step reads or writes
in either region is sized by its layout and planned. An alias (passes/alias.py) has no bytes
of its own: its reads count as its source's, it gets its source's offset, and a tensor
something aliases is never overwritten in place (the alias's reader may read it under another
shape). An element-wise step may write its output over an input it reads for the last time
(`reuses` in the plan); the pair becomes one buffer for the planner. Offsets are multiples of
the target's C2 block (docs/memory.md).
"""
from __future__ import annotations

from collections.abc import Set
from dataclasses import replace
from functools import partial

from rkcompile.plan.aliases import storage_of
from rkcompile.plan.allocation import Allocation, Buffer, live_ranges, plan_arena
from rkcompile.compiler.context import CompileContext
from rkcompile.ir.graph import itemsize, node_inputs
from rkcompile.plan.schema import Memory, TensorPlacement

NAME = "memory"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "options", "order", "placement", "target", "tensors"})
PROVIDES = frozenset({"memory", "tensors"})

#: Kernels (ONNX op names and oplist kernel names) whose every output element depends only on
#: the same element of each input, read before it is written; only these may work in place.
STREAMING_KERNELS = frozenset({
    "Abs", "Add", "AddRelu", "BatchNormalization", "Clip", "Clip/ReLU6", "Div", "Elu", "Erf", "Exp",
    "Gelu", "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Max", "Min", "Mish", "Mul", "MulRelu",
    "Neg", "PRelu", "Pow", "Reciprocal", "Relu", "Sigmoid", "Softplus", "Sqrt", "Sub", "Tanh",
    "exGelu", "exMish", "exSwish",
})


#: the regions of intermediate tensors, each planned as one block of memory: the NPU's arena,
#: and the host memory of the tensors only CPU steps touch (passes/layout.py)
PLANNED_REGIONS = ("arena", "cpu")


def run(ctx: CompileContext) -> None:
    nodes = {node.name: node for node in ctx.graph.nodes}
    storage = partial(storage_of, ctx.tensors)  # an alias's reads are reads of the tensor whose bytes it is
    steps = [(ctx.placement[name].kernel, [storage(t.name) for t in node_inputs(nodes[name])],
              [t.name for t in nodes[name].outputs if t.name]) for name in ctx.order]
    alignment = ctx.target.c2_for(ctx.options.dtype) * itemsize(ctx.options.dtype)
    viewed = {t.aliases for t in ctx.tensors.values() if t.aliases is not None}
    tensors = dict(ctx.tensors)
    allocations = {}
    for region in PLANNED_REGIONS:
        members = {name: t for name, t in ctx.tensors.items() if t.region == region and t.aliases is None}
        allocations[region] = _plan_region(steps, members, alignment, tensors, viewed)
    for name, tensor in ctx.tensors.items():
        if tensor.aliases is not None:
            tensors[name] = replace(tensor, offset=tensors[storage(name)].offset)

    region_ends = {"weight": 0, "input": 0, "output": 0}
    for name, tensor in ctx.tensors.items():
        if tensor.region in region_ends:
            tensors[name] = replace(tensor, offset=region_ends[tensor.region])
            region_ends[tensor.region] += _aligned(tensor.bytes, alignment)
    ctx.tensors = tensors
    arena = allocations["arena"]
    ctx.memory = Memory(arena_bytes=arena.arena_bytes, lower_bound_bytes=arena.lower_bound_bytes,
                        weight_bytes=region_ends["weight"], alignment=alignment,
                        cpu_arena_bytes=allocations["cpu"].arena_bytes)


def _plan_region(steps: list[tuple[str, list[str], list[str]]], members: dict[str, TensorPlacement],
                 alignment: int, tensors: dict[str, TensorPlacement], viewed: Set[str]) -> Allocation:
    """Offsets for `members`, the tensors of one planned region that hold bytes of their own,
    written into `tensors`: live ranges from the steps, in-place pairs as one buffer (never over
    a tensor in `viewed`, one an alias reads), each buffer aligned."""
    ranges = live_ranges([(inputs, outputs) for _, inputs, outputs in steps], members)
    reuses = in_place_reuses(steps, ranges, members, viewed)
    owner = {}
    for name in ranges:
        owner[name] = owner[reuses[name]] if name in reuses else name
    spans: dict[str, list[int]] = {}
    for name, (first, last) in ranges.items():
        span = spans.setdefault(owner[name], [first, last])
        span[0], span[1] = min(span[0], first), max(span[1], last)
    buffers = {root: Buffer(first, last, _aligned(members[root].bytes, alignment))
               for root, (first, last) in spans.items()}
    allocation = plan_arena(buffers)
    for name, tensor in members.items():
        tensors[name] = replace(tensor, offset=allocation.offsets.get(owner.get(name), 0), reuses=reuses.get(name))
    return allocation


def in_place_reuses(steps: list[tuple[str, list[str], list[str]]], ranges: dict[str, tuple[int, int]],
                    arena: dict[str, TensorPlacement], kept: Set[str] = frozenset()) -> dict[str, str]:
    """{output: input} for each streaming step whose output can overwrite an input: the step is
    the input's last reader, and both have the same shape, dtype, layout and size, so no
    broadcast makes the kernel read an element after it wrote over it. No output overwrites
    one of `kept`."""
    reuses: dict[str, str] = {}
    taken: set[str] = set()
    for index, (kernel, inputs, outputs) in enumerate(steps):
        if kernel not in STREAMING_KERNELS:
            continue
        for output in outputs:
            if output not in arena or output in reuses:
                continue
            for source in inputs:
                if (source in arena and source not in taken and source not in outputs and source not in kept
                        and ranges[source][1] == index and _same_storage(arena[source], arena[output])):
                    reuses[output] = source
                    taken.add(source)
                    break
    return reuses


def _same_storage(a: TensorPlacement, b: TensorPlacement) -> bool:
    return (a.shape, a.dtype, a.layout, a.bytes) == (b.shape, b.dtype, b.layout, b.bytes) and a.bytes > 0


def _aligned(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment
