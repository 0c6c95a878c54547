"""The human-readable plan summary, in the spirit of vela's network summary."""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

from .plan import Plan


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"


def _padding_line(plan: Plan) -> str:
    """The bytes NC1HWC2 spends on padding channels, against the same tensors stored dense."""
    stored = [t for t in plan.tensors.values() if t.layout == "NC1HWC2"]
    dense = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in stored)
    padding = sum(t.bytes for t in stored) - dense
    return f"  NC1HWC2 padding             {_kib(padding)} (+{100 * padding / max(dense, 1):.1f}% over dense)"


def render_summary(plan: Plan) -> str:
    model_name = plan.model.path.rsplit("/", 1)[-1]
    counted = [n for n in plan.nodes if n.device in ("npu", "cpu")]
    total = len(counted) or 1
    npu = sum(1 for n in counted if n.device == "npu")
    cpu = len(counted) - npu
    folded = sum(1 for n in plan.nodes if n.device == "folded")
    removed = sum(1 for n in plan.nodes if n.device == "removed")
    lines = [
        f"Network summary for {model_name}",
        f"  target                      {plan.target} ({plan.dtype}, batch {plan.batch})",
        f"  nodes                       {len(plan.nodes)} ({folded} folded, {removed} removed, {len(counted)} placed)",
        f"  NPU ops                     {npu} ({100 * npu / total:.1f}%)",
        f"  CPU ops                     {cpu} ({100 * cpu / total:.1f}%)",
    ]
    # The "(seen: ...)" details name single tensors; without them, nodes that broke the same
    # rules group together.
    reasons = Counter(re.sub(r" \(seen: [^;]*\)", "", n.reason) for n in counted if n.device == "cpu")
    if reasons:
        lines.append("  CPU ops by reason:")
        for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {count:4d} x {reason}")
    sizes = ", ".join(f"{p.device}:{len(p.steps)}" for p in plan.partitions)
    lines += [
        f"  steps                       {len(plan.steps)}",
        f"  partitions                  {len(plan.partitions)} [{sizes}]",
        f"  arena                       {_kib(plan.memory.arena_bytes)} (lower bound {_kib(plan.memory.lower_bound_bytes)}, "
        f"ratio {plan.memory.arena_bytes / max(plan.memory.lower_bound_bytes, 1):.3f})",
        f"  weights                     {_kib(plan.memory.weight_bytes)}",
        _padding_line(plan),
    ]
    return "\n".join(lines)
