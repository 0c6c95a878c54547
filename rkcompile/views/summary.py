"""The human-readable plan summary, in the spirit of vela's network summary."""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from rkcompile.plan.schema import QUANTIZED_DTYPES, PlanRecord, Validation


#: The value a rule saw, which the reason text carries as " (seen: ...)".
SEEN = re.compile(r" \(seen: ([^;]*)\)")


def _evidence(nodes: list, shown: int = 3) -> str:
    """The first `shown` nodes of a reason, each with the values that broke its rules."""
    named = []
    for node in nodes[:shown]:
        seen = "; ".join(SEEN.findall(node.reason))
        named.append(f"{node.name} ({seen})" if seen else node.name)
    return ", ".join(named) + (f" +{len(nodes) - shown} more" if len(nodes) > shown else "")


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def _padding_line(plan: PlanRecord) -> str:
    """The bytes NC1HWC2 spends on padding channels, against the same tensors stored dense."""
    stored = [t for t in plan.tensors.values() if t.layout == "NC1HWC2"]
    dense = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in stored)
    padding = sum(t.bytes for t in stored) - dense
    return f"  NC1HWC2 padding             {_kib(padding)} (+{100 * padding / max(dense, 1):.1f}% over dense)"


def _partition_lines(plan: PlanRecord) -> list[str]:
    """Partition sizes, the host conversions between them, and a verdict in the spirit of
    onnxruntime's usability checker, from the share of estimated MACs the NPU runs."""
    by_device = {device: [len(p.steps) for p in plan.partitions if p.device == device] for device in ("npu", "cpu")}
    hosts = [s for s in plan.steps if s.device == "host"]
    moved = sum(plan.tensors[t].bytes for s in hosts for t in s.inputs + s.outputs)
    macs = {device: sum(s.macs for s in plan.steps if s.device == device) for device in ("npu", "cpu")}
    share = macs["npu"] / max(macs["npu"] + macs["cpu"], 1)
    count = len(by_device["npu"])
    covering = f"{count} NPU partition{'s' if count != 1 else ''} covering {100 * share:.1f}% of compute"
    if count == 0:
        verdict = "no NPU partition: everything runs on the CPU"
    elif share >= 0.95 and count <= 2:
        verdict = f"{covering}: good"
    elif share >= 0.8:
        verdict = f"{covering}: fair, the CPU partitions and conversions between them cost time"
    else:
        verdict = f"{covering}: poor, most compute stays on the CPU"
    sizes = {device: ", ".join(map(str, counts)) for device, counts in by_device.items()}
    return [
        f"  partitions                  {count} NPU [{sizes['npu']}], {len(by_device['cpu'])} CPU [{sizes['cpu']}]",
        f"  conversions                 {len(hosts)} host steps, {_kib(moved)} read and written",
        f"  verdict                     {verdict}",
    ]


def _fusion_lines(plan: PlanRecord) -> list[str]:
    """Fused steps counted per kernel, and the candidates that were not fused, grouped by why."""
    fused = [s for s in plan.steps if s.operation is not None and s.operation.fused]
    kernels = Counter(s.kernel for s in fused)
    listed = ", ".join(f"{kernel} {count}" for kernel, count in sorted(kernels.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = [f"  fused kernels               {len(fused)} steps running {sum(len(s.nodes) for s in fused)} nodes"
             + (f" ({listed})" if listed else "")]
    notes = Counter(SEEN.sub("", s.note) for s in plan.steps if s.note)
    if notes:
        lines.append("  not fused:")
        lines += [f"    {count:4d} x {note}" for note, count in sorted(notes.items(), key=lambda kv: (-kv[1], kv[0]))]
    return lines


def _rule_counts(plan: PlanRecord) -> str:
    counts = Counter(r.rule for r in plan.rewrites)
    return ", ".join(f"{rule} x{count}" for rule, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


#: step kernels that only move or relabel elements: each is one more pass through DRAM that a
#: leaner plan (or rknn-toolkit2's, whose layer table counts these the same way) may not have
LAYOUT_KERNELS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _layout_lines(plan: PlanRecord) -> list[str]:
    """How many steps are layout steps (by kernel), how many relabels are aliases instead (their
    outputs views of their inputs' bytes, no step), and what one image's steps move in DRAM."""
    kernels = Counter(step.kernel for step in plan.steps if step.kernel in LAYOUT_KERNELS)
    detail = f" ({', '.join(f'{k} {n}' for k, n in kernels.most_common())})" if kernels else ""
    aliased = sum(1 for tensor in plan.tensors.values() if tensor.aliases is not None)
    if aliased:
        detail += f"; {aliased} relabel{'s' * (aliased != 1)} aliased (a view of the input's bytes, no step)"
    lines = [f"  layout steps                {sum(kernels.values())}{detail}"]
    if plan.multicore.dram_bytes_per_image:
        lines.append(f"  DRAM traffic                {_kib(plan.multicore.dram_bytes_per_image)} per image "
                     f"(every step's inputs, outputs and weights)")
    return lines


def _multicore_lines(plan: PlanRecord) -> list[str]:
    """Cores, contexts and splits, the cost model's estimate, and a per-core timeline."""
    multicore = plan.multicore
    axes = Counter(split.axis for split in multicore.splits)
    how = (f"{len(multicore.contexts)} contexts" if multicore.contexts else
           f"core mask {multicore.core_mask}, {len(multicore.splits)} steps split"
           + (f" ({', '.join(f'{axis} x{count}' for axis, count in sorted(axes.items()))})" if axes else ""))
    per_run = plan.model.images_per_run
    lines = [
        f"  NPU cores                   {multicore.cores} for batch {plan.images} ({how})",
        f"  estimate                    {multicore.est_latency_ms:.3f} ms per batch, {multicore.est_fps:.1f} fps, "
        f"{multicore.speedup:.2f}x one core ({multicore.est_one_core_ms:.3f} ms per "
        f"{'image' if per_run == 1 else f'run of {per_run} images'})",
        "    core  images  steps   busy ms   utilisation",
    ]
    images = {context.core: len(context.images) for context in multicore.contexts}
    for timeline in multicore.per_core:
        lines.append(f"    {timeline.core:4d}  {images.get(timeline.core, multicore.batch):6d}  {len(timeline.steps):5d}  "
                     f"{timeline.est_ms:8.3f}   {100 * timeline.utilisation:10.1f}%")
    asked = 1 if multicore.core_mask == "auto" else len(multicore.core_mask.split("_"))
    if max(asked, multicore.cores) > 1 and not multicore.contexts and multicore.speedup < SMALL_SPEEDUP:
        lines += _split_limits(plan)
    return lines


#: A multi-core split of one input below this speedup gets a line saying what limits it.
SMALL_SPEEDUP = 1.05


def _split_limits(plan: PlanRecord) -> list[str]:
    """Why splitting one input across cores buys little, from the plan's own figures: how long the
    busiest core waits for CPU steps, conversions and the other cores (no split shortens the first
    two), and
    the NPU steps that stayed whole, by kernel (not multi-core on the target, or no split of
    theirs beat one core by the cost model: passes/multicore.py best_split)."""
    multicore = plan.multicore
    first = max(multicore.per_core, key=lambda timeline: timeline.est_ms)
    waiting = max(multicore.est_latency_ms - first.est_ms, 0.0)
    split = {s.step for s in multicore.splits}
    npu = [s for s in plan.steps if s.device == "npu"]
    whole = Counter(s.kernel for s in npu if s.id not in split)
    return [
        f"  {f'why {multicore.speedup:.2f}x':28}core {first.core} waits {waiting:.3f} of {multicore.est_latency_ms:.3f} "
        f"ms for CPU steps, conversions and the other cores; {len(split)} of {len(npu)} NPU steps "
        f"split, whole: {_most_common(whole)}",
    ]


def _most_common(counts: Counter, shown: int = 3) -> str:
    """`a x5, b x2, c x1 +4 more`: the first `shown` by count."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{key} x{count}" for key, count in ranked[:shown]) or "none"
    return text + (f" +{len(ranked) - shown} more" if len(ranked) > shown else "")


def _cpu_tensor_lines(plan: PlanRecord) -> list[str]:
    """Where the tensors only CPU steps touch live: host memory, outside the NPU's arena."""
    held = plan.memory.cpu_arena_bytes
    if not held:
        return []
    count = sum(1 for t in plan.tensors.values() if t.region == "cpu")
    return [f"  CPU tensors                 {_kib(held)} in host memory, outside the arena ({count} "
            f"tensor{'s' if count != 1 else ''} only CPU steps and their conversions touch)"]


def _memory_total_line(plan: PlanRecord) -> str:
    """Everything a run holds at once, region by region (eval_memory)."""
    totals = plan.memory_totals()
    contexts = (f" x {totals.contexts} contexts (each its own; the weights shared)" if totals.contexts > 1 else "")
    cpu = f"; the CPU partitions read {_kib(totals.cpu_weight_bytes)} of the weights" if totals.cpu_weight_bytes else ""
    held = f", CPU tensors {_kib(totals.cpu_arena_bytes)}" if totals.cpu_arena_bytes else ""
    return (f"  memory total                {_kib(totals.total_bytes)} (weights {_kib(totals.weight_bytes)}, arena "
            f"{_kib(totals.arena_bytes)}{contexts}{held}, inputs {_kib(totals.input_bytes)}, outputs "
            f"{_kib(totals.output_bytes)}{cpu})")


def _batch_text(plan: PlanRecord) -> str:
    """The batch in images, and how the plan takes them when the model's batch dim is symbolic:
    contexts (--batch) of runs of the graph, its dim 0 planned as given (--input-shape) or 1."""
    if not plan.model.batch_dims:
        return f"batch {plan.batch}"
    per_run = plan.model.images_per_run
    dims = ", ".join(f"dim 0{f' ({symbol!r})' if symbol else ''} of input '{name}'"
                     for name, symbol in plan.model.batch_dims.items())
    contexts = f"{plan.batch} context{'s' if plan.batch > 1 else ''}"
    return f"batch {plan.images}: {contexts} of {per_run} image{'s' if per_run > 1 else ''}, {dims} planned as {per_run}"


def placed_counts(plan: PlanRecord) -> tuple[int, int]:
    """The original nodes that run on the NPU and on the CPU (folded and removed ones run nowhere)."""
    devices = Counter(n.device for n in plan.nodes)
    return devices["npu"], devices["cpu"]


def render_summary(plan: PlanRecord) -> str:
    model_name = plan.model.path.rsplit("/", 1)[-1]
    counted = [n for n in plan.nodes if n.device in ("npu", "cpu")]
    npu, cpu = placed_counts(plan)
    total = (npu + cpu) or 1
    folded = sum(1 for n in plan.nodes if n.device == "folded")
    removed = sum(1 for n in plan.nodes if n.device == "removed")
    lines = [
        f"Network summary for {model_name}",
        f"  target                      {plan.target} ({plan.dtype}, {_batch_text(plan)})",
        f"  nodes                       {len(plan.nodes)} ({folded} folded, {removed} removed, {len(counted)} placed)",
        f"  NPU ops                     {npu} ({100 * npu / total:.1f}%)",
        f"  CPU ops                     {cpu} ({100 * cpu / total:.1f}%)",
        f"  rewrites                    {len(plan.rewrites)} ({_rule_counts(plan) or 'none'})",
    ]
    # The "(seen: ...)" details name single tensors; without them, nodes that broke the same
    # rules group together, and the first few nodes of each group show theirs.
    by_reason: dict[str, list] = {}
    for node in counted:
        if node.device == "cpu":
            by_reason.setdefault(SEEN.sub("", node.reason), []).append(node)
    if by_reason:
        lines.append("  CPU ops by reason:")
        for reason, nodes in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"    {len(nodes):4d} x {reason}")
            lines.append(f"           nodes: {_evidence(nodes)}")
    lines += [
        f"  steps                       {len(plan.steps)}",
        *_layout_lines(plan),
        *_fusion_lines(plan),
        *_partition_lines(plan),
        f"  arena                       {_kib(plan.memory.arena_bytes)} (lower bound {_kib(plan.memory.lower_bound_bytes)}, "
        f"ratio {plan.memory.arena_bytes / max(plan.memory.lower_bound_bytes, 1):.3f})",
        *_cpu_tensor_lines(plan),
        f"  weights                     {_kib(plan.memory.weight_bytes)}",
        _memory_total_line(plan),
        _padding_line(plan),
        *_multicore_lines(plan),
    ]
    if plan.dtype in QUANTIZED_DTYPES:
        for chosen in (t for t in plan.int8_techniques if t.name == "int8_settings"):
            lines.append(f"  int8 settings               {chosen.note}")
            if chosen.declined:
                lines.append(f"    other candidates: {'; '.join(chosen.declined)}")
        applied = [f"{t.name.replace('_', ' ')}: {t.note}" for t in plan.int8_techniques if t.name != "int8_settings"]
        lines.append(f"  int8 techniques             {'; '.join(applied) if applied else 'none (calibration only)'}")
        for technique in plan.int8_techniques:
            if technique.name == "auto_float16" and technique.applied:
                lines.append(f"    float16: {', '.join(technique.applied)}")
        if plan.validation is not None:
            lines.append(f"  validation cosine           {validation_line(plan.validation)}")
    warnings = [q.warning for q in plan.quantization.values() if q.warning]
    if warnings:
        lines.append("  int8 warnings:")
        lines += [f"    {warning}" for warning in warnings]
    return "\n".join(lines)


def validation_line(validation: Validation) -> str:
    """The summary's "validation cosine" line: per output its worst over the --val samples."""
    per_output = ", ".join(f"{name} {cosine:.6f}" for name, cosine in validation.cosines.items())
    return f"{per_output} (worst over {validation.samples} samples of {validation.path})"
