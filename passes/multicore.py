"""Multicore: which NPU cores run which steps, for a batch or within one input, and what the
cost model (rkcompile/plan/cost_model.py) says that buys against one core.

A batch follows seed 004 (4.1.4 multi-batch): `rknn_batch_size` 2 duplicates the context once,
3 or more twice, so at most three contexts (two on RK3576, one on single-core parts) run at
once, one per core, sharing the weights. Image i goes to context i mod contexts, which reads it
at offset i * input_size / batch of each batched input and writes its outputs likewise.

Within one input (`--core-mask` naming several cores), a step is split only when the target's
oplist marks its kernel multi-core, along an axis `split_axes` allows for that kernel, and when
the estimate says the split is faster than one core; every other NPU step runs on the mask's
first core. The split step's parts are recorded in the plan.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.plan import cost_model
from rkcompile.compiler.context import CompileContext
from rkcompile.compiler.cost_estimate import step_work
from rkcompile.plan.cost_model import Share, StepWork
from rkcompile.errors import CompileError
from rkcompile.ir.graph import fused_body, itemsize, present_inputs
from rkcompile.passes.fusion_table import TABLES
from rkcompile.numerics.nc1hwc2 import as_nchw
from rkcompile.plan.schema import BatchContext, CoreTimeline, IoSlice, Multicore, SplitPart, StepSplit
from rkcompile.targets.model import Target

NAME = "multicore"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "model_info", "options", "order", "placement", "target", "tensors"})
PROVIDES = frozenset({"multicore", "step_cores"})

#: rknn_core_mask values (RKNN_NPU_CORE_AUTO, _0, _1, _2, _0_1, _0_1_2), as the CLI spells them.
CORE_MASKS = ("auto", "0", "1", "2", "0_1", "0_1_2")

#: Fused step kernel -> the oplist kernel whose multi-core flag applies to it.
_FUSED_TO_OPLIST = {rule.kernel: rule.requires for table in TABLES for rule in table}
_ELEMENTWISE = frozenset({"Add", "AddRelu", "Mul", "MulRelu"})


def run(ctx: CompileContext) -> None:
    ctx.multicore, ctx.step_cores = schedule(ctx, step_works(ctx), ctx.options.dtype)


def schedule(ctx: CompileContext, works: list[StepWork],
             dtype: str) -> tuple[Multicore, dict[str, tuple[int, ...]]]:
    """The multicore record for ctx's batch and core mask, and the cores of each NPU step,
    from `works` timed at `dtype`'s MAC rate (tools/bench_cores.py calibrates with int8)."""
    mask_cores = parse_core_mask(ctx.options.core_mask, ctx.target, ctx.options.batch)
    if ctx.options.batch > 1:
        record, cores = batch_plan(ctx, works, dtype)
    else:
        record, cores = split_plan(ctx, works, dtype, mask_cores)
    return record, {name: cores[index] for index, name in enumerate(ctx.order) if ctx.placement[name].device == "npu"}


def parse_core_mask(mask: str, target: Target, batch: int) -> tuple[int, ...]:
    """The cores a mask names on `target` (auto: the first idle one, core 0 in a plan)."""
    if mask not in CORE_MASKS:
        raise CompileError(f"--core-mask {mask}: expected one of {', '.join(CORE_MASKS)}")
    if mask == "auto":
        return (0,)
    if batch > 1:
        raise CompileError(f"--core-mask {mask} with --batch {batch}: multi-batch contexts schedule their own "
                           f"cores (seed 004, core_mask auto); give one or the other")
    cores = tuple(int(core) for core in mask.split("_"))
    if max(cores) >= target.npu_cores:
        valid = [m for m in CORE_MASKS if m == "auto" or max(map(int, m.split("_"))) < target.npu_cores]
        raise CompileError(f"--core-mask {mask}: {target.name} has {target.npu_cores} NPU "
                           f"core{'s' if target.npu_cores > 1 else ''}; use {', '.join(valid)}")
    return cores


def step_works(ctx: CompileContext, as_dtype: str | None = None) -> list[StepWork]:
    """MACs and bytes of each step in execution order. With `as_dtype`, tensors stored in the
    plan's NPU dtype are counted at that dtype's size (an int8 estimate of a float16 plan)."""
    plan_dtype = ctx.options.dtype
    scale = itemsize(as_dtype) / itemsize(plan_dtype) if as_dtype else 1.0

    def size(name: str) -> float:
        tensor = ctx.tensors[name]
        return tensor.bytes * (scale if tensor.dtype == plan_dtype else 1.0)

    nodes = {node.name: node for node in ctx.graph.nodes}
    return [step_work(nodes[name], ctx.placement[name].device, lambda t: size(t.name)) for name in ctx.order]


def batch_plan(ctx: CompileContext, works: list[StepWork], dtype: str) -> tuple[Multicore, list[tuple[int, ...]]]:
    """Seed 004's contexts, one per core, images dealt round-robin, and their timeline."""
    batch, hardware = ctx.options.batch, cost_model.hardware_for(ctx.target)
    count = min(batch, ctx.target.npu_cores)
    images = [tuple(range(first, batch, count)) for first in range(count)]
    npu_steps = tuple(index for index, work in enumerate(works) if work.device == "npu")
    # An image's time depends only on how many contexts stream beside it: (all steps, NPU steps).
    seconds = {}
    for active in range(1, count + 1):
        times = [cost_model.step_seconds(work, hardware, dtype, active) for work in works]
        seconds[active] = sum(times), sum(times[s] for s in npu_steps)
    contexts, timelines, spent = [], [], []
    for core, taken in enumerate(images):
        # Image i runs in round i // count, alongside the other contexts that have an image then.
        rounds = [seconds[min(count, batch - i // count * count)] for i in taken]
        spent.append(cost_model.RUN_SECONDS + sum(total for total, _ in rounds))
        busy = sum(npu for _, npu in rounds)
        contexts.append(BatchContext(id=core, core=core, images=taken,
                                     inputs=_io_slices(ctx, ctx.model_info.inputs, taken),
                                     outputs=_io_slices(ctx, ctx.model_info.outputs, taken)))
        timelines.append((core, npu_steps, busy))
    multicore = _estimate(ctx, works, dtype, spent=max(spent), timelines=timelines, contexts=tuple(contexts))
    return multicore, [tuple(range(count))] * len(works)


def _io_slices(ctx: CompileContext, specs, images: tuple[int, ...]) -> tuple[IoSlice, ...]:
    """Seed 004, 4.1.4.3: image i of a batched tensor starts at i * (batched size / batch)."""
    return tuple(IoSlice(tensor=spec.name, image=i, offset=i * ctx.tensors[spec.name].bytes,
                         bytes=ctx.tensors[spec.name].bytes)
                 for spec in specs if spec.name in ctx.tensors for i in images)


def split_plan(ctx: CompileContext, works: list[StepWork], dtype: str,
               cores: tuple[int, ...]) -> tuple[Multicore, list[tuple[int, ...]]]:
    """One input on the mask's cores: multi-core steps split where it pays, the rest on the
    first core; the latency is the steps one after another."""
    hardware = cost_model.hardware_for(ctx.target)
    nodes = {node.name: node for node in ctx.graph.nodes}
    busy = dict.fromkeys(cores, 0.0)
    ran: dict[int, list[int]] = {core: [] for core in cores}
    step_cores, splits, latency = [], [], cost_model.RUN_SECONDS
    for index, (name, work) in enumerate(zip(ctx.order, works)):
        split = None
        if work.device == "npu" and len(cores) > 1:
            split = best_split(nodes[name], ctx, work, dtype, cores, index)
        if split is None:
            seconds = cost_model.step_seconds(work, hardware, dtype)
            latency += seconds
            if work.device == "npu":
                busy[cores[0]] += seconds
                ran[cores[0]].append(index)
                step_cores.append((cores[0],))
            else:
                step_cores.append(())
            continue
        step_split, parts = split
        for core, part in zip(cores, parts):
            busy[core] += part
            ran[core].append(index)
        latency += max(parts) + cost_model.SPLIT_SECONDS
        splits.append(step_split)
        step_cores.append(cores)
    timelines = [(core, tuple(ran[core]), busy[core]) for core in cores if ran[core]]
    multicore = _estimate(ctx, works, dtype, spent=latency, timelines=timelines, splits=tuple(splits))
    return multicore, step_cores


def split_axes(kernel: str) -> tuple[str, ...]:
    """The axes along which `kernel`'s output elements are independent, so cores compute
    disjoint parts without exchanging partial sums: output channels ("C", in whole C2 blocks,
    so each core writes whole NC1HWC2 planes) or rows ("H", each core reading the input rows
    its window covers). The oplist says only whether a kernel is multi-core, not how it
    divides; these axes are rkcompile's choice (docs/cost-model.md)."""
    if kernel.startswith("Convolution") or kernel == "Depthwise Convolution" or kernel in _ELEMENTWISE:
        return "C", "H"
    if kernel == "exSDPAttention":  # query rows are independent; keys and values are read whole
        return ("H",)
    return ()


def oplist_kernel(node: gs.Node, target: Target) -> str:
    """The oplist kernel a step runs, whose multi-core flag decides whether it may split."""
    if node.op in _FUSED_TO_OPLIST:
        return _FUSED_TO_OPLIST[node.op]
    if _depthwise(node):
        return "Depthwise Convolution"
    rule = target.ops.get(node.op)
    return rule.kernel if rule else node.op


def _depthwise(node: gs.Node) -> bool:
    group = int(node.attrs.get("group", 1)) if node.op == "Conv" else 1
    inputs = present_inputs(node)
    return group > 1 and inputs[0].shape is not None and group == inputs[0].shape[1]


def _channel_local(node: gs.Node, kernel: str) -> bool:
    """Output channel c reads only input channel c, so a channel split divides the input too."""
    body = fused_body(node)
    members = body.nodes if body is not None else [node]
    return kernel in _ELEMENTWISE or any(_depthwise(member) for member in members)


def best_split(node: gs.Node, ctx: CompileContext, work: StepWork, dtype: str, cores: tuple[int, ...],
               index: int) -> tuple[StepSplit, list[float]] | None:
    """The split of step `index` over `cores` whose slowest part is fastest, with each part's
    seconds; None when the kernel may not split or no split beats one core."""
    kernel = oplist_kernel(node, ctx.target)
    if kernel not in ctx.target.multi_core_kernels:
        return None
    hardware = cost_model.hardware_for(ctx.target)
    _, channels, height, _ = as_nchw(ctx.tensors[node.outputs[0].name].shape)
    block = ctx.target.c2_for(dtype)
    extents = {"C": (-(-channels // block), block, channels), "H": (height, 1, height)}
    best = None
    for axis in split_axes(kernel):
        units, unit, limit = extents[axis]
        if units < len(cores):
            continue
        chunks = [chunk for chunk in np.array_split(np.arange(units), len(cores))]
        parts = tuple(SplitPart(core, int(chunk[0]) * unit, min(int(chunk[-1] + 1) * unit, limit))
                      for core, chunk in zip(cores, chunks))
        seconds = [cost_model.npu_seconds(work, hardware, dtype, Share(
            fraction=(part.stop - part.start) / limit, divides_weights=axis == "C",
            divides_inputs=axis == "H" or _channel_local(node, kernel)), active=len(cores)) for part in parts]
        if best is None or max(seconds) < max(best[1]):
            timed = tuple(replace(part, est_ms=round(part_seconds * 1e3, 6))
                          for part, part_seconds in zip(parts, seconds))
            best = StepSplit(step=index, kernel=kernel, axis=axis, parts=timed), seconds
    whole = cost_model.step_seconds(work, hardware, dtype)
    if best is None or max(best[1]) + cost_model.SPLIT_SECONDS >= whole:
        return None
    return best


def _estimate(ctx: CompileContext, works: list[StepWork], dtype: str, *, spent: float,
              timelines: list[tuple[int, tuple[int, ...], float]], contexts: tuple[BatchContext, ...] = (),
              splits: tuple[StepSplit, ...] = ()) -> Multicore:
    """The plan's multicore record: per-core timeline against the batch latency `spent`, and
    the speedup over running the batch one image at a time on one core."""
    hardware = cost_model.hardware_for(ctx.target)
    one_core = cost_model.one_core_seconds(works, hardware, dtype)
    batch = ctx.options.batch
    images = batch * ctx.model_info.images_per_run
    per_core = tuple(CoreTimeline(core=core, steps=steps, est_ms=_ms(busy), utilisation=round(busy / spent, 4))
                     for core, steps, busy in timelines)
    return Multicore(
        cores=len(per_core) or 1, batch=batch, core_mask=ctx.options.core_mask, contexts=contexts,
        per_core=per_core, splits=splits, est_latency_ms=_ms(spent), est_fps=round(images / spent, 2),
        est_one_core_ms=_ms(one_core), speedup=round(batch * one_core / spent, 3),
        dram_bytes_per_image=round(sum(work.bytes for work in works)),
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)
