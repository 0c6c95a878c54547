"""`rkcompile perf`: each step's share of the estimated run (rknn-toolkit2's eval_perf), from
what the plan records and the cost model that made its estimate (rkcompile/plan/cost_model.py).

A step's work is counted as the multicore pass counted it (`compiler.cost_estimate.step_work`),
from the plan (`charts.step_works`): its MACs as recorded, the bytes of the weights and other
tensors it reads and of those it writes, as the plan stores them. A step split across cores
takes its slowest part, as recorded, plus the split's cost (`charts.one_image_seconds`, which
the timeline chart draws). The steps' times and the run's fixed cost add up to the summary's
estimate of one image (its latency, for a plan of one image); a batch's latency is the
summary's, which these rows do not divide.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from rkcompile.plan import cost_model
from rkcompile.plan.schema import PlanRecord
from rkcompile.views.charts import one_image_seconds, step_works


@dataclass(frozen=True)
class StepPerf:
    """One step's row: where it runs, what it does and its estimated time."""

    step: int
    device: str
    kernel: str
    nodes: tuple[str, ...]
    macs: int
    bytes_read: int
    bytes_written: int
    seconds: float


def step_perf(plan: PlanRecord) -> list[StepPerf]:
    """Every step's row, in execution order, timed as the timeline chart times it."""
    works = step_works(plan)
    return [StepPerf(step.id, step.device, step.kernel, step.nodes, step.macs, work.weight_bytes + work.input_bytes,
                     work.output_bytes, seconds)
            for step, work, seconds in zip(plan.steps, works, one_image_seconds(plan, works))]


def run_seconds(rows: list[StepPerf]) -> float:
    """One image's estimated time: the steps' and the run's fixed cost (`cost_model.RUN_SECONDS`)."""
    return cost_model.RUN_SECONDS + sum(row.seconds for row in rows)


def render_perf(plan: PlanRecord) -> str:
    """The eval_perf table: a row per step, the run's fixed cost, and the totals, which are the
    summary's estimate."""
    rows = step_perf(plan)
    total = run_seconds(rows)
    name = plan.model.path.rsplit("/", 1)[-1]
    lines = [f"Performance estimate for {name} on {plan.target} ({plan.dtype}; rkcompile/plan/cost_model.py)",
             f"{'step':>5} {'device':6} {'kernel':30} {'nodes':>5} {'MACs':>13} {'read B':>11} {'written B':>11} "
             f"{'est us':>10} {'share':>7}  first node"]
    for row in rows:
        lines.append(f"{row.step:5d} {row.device:6} {row.kernel[:30]:30} {len(row.nodes):5d} {row.macs:13d} "
                     f"{row.bytes_read:11d} {row.bytes_written:11d} {row.seconds * 1e6:10.1f} "
                     f"{100 * row.seconds / total:6.1f}%  {row.nodes[0] if row.nodes else '-'}")
    fixed = cost_model.RUN_SECONDS
    lines.append(f"{'':5} {'run':6} {'(fixed cost per run)':30} {'':5} {'':13} {'':11} {'':11} {fixed * 1e6:10.1f} "
                 f"{100 * fixed / total:6.1f}%")
    lines.append(f"{'total':>5} {'':6} {'':30} {sum(len(r.nodes) for r in rows):5d} {sum(r.macs for r in rows):13d} "
                 f"{sum(r.bytes_read for r in rows):11d} {sum(r.bytes_written for r in rows):11d} "
                 f"{total * 1e6:10.1f} {100.0:6.1f}%")
    by_device = {}
    for row in rows:
        by_device[row.device] = by_device.get(row.device, 0.0) + row.seconds
    lines.append("  by device: " + ", ".join(f"{device} {seconds * 1e3:.3f} ms ({100 * seconds / total:.1f}%)"
                                               for device, seconds in sorted(by_device.items())))
    multicore = plan.multicore
    lines.append(f"  estimate: {multicore.est_latency_ms:.3f} ms per batch of {plan.images}, {multicore.est_fps:.1f} fps "
                 f"(the summary's); one image on one core {multicore.est_one_core_ms:.3f} ms")
    return "\n".join(lines)


#: the per-step CSV's columns, as Arm's vela writes its per-layer CSV: one row a layer, counts,
#: the estimate and its share of the network, the name last
CSV_COLUMNS = ("Step", "Device", "Kernel", "Nodes", "MAC Count", "Bytes Read", "Bytes Written", "Estimated us",
               "Network%", "Name")


def perf_csv(plan: PlanRecord) -> str:
    """The rows of `render_perf` as CSV (`perf --csv`)."""
    rows = step_perf(plan)
    total = run_seconds(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow((row.step, row.device, row.kernel, len(row.nodes), row.macs, row.bytes_read,
                         row.bytes_written, f"{row.seconds * 1e6:.3f}", f"{100 * row.seconds / total:.3f}",
                         " ".join(row.nodes)))
    writer.writerow(("", "run", "(fixed cost per run)", 0, 0, 0, 0, f"{cost_model.RUN_SECONDS * 1e6:.3f}",
                     f"{100 * cost_model.RUN_SECONDS / total:.3f}", ""))
    return buffer.getvalue()


def summary_csv(plan: PlanRecord) -> str:
    """The summary's figures as CSV, a header and one row (`plan --csv`), as vela writes its
    summary CSV: what a script comparing plans reads without parsing the summary's text."""
    from rkcompile.views.summary import placed_counts

    npu, cpu = placed_counts(plan)
    multicore, memory = plan.multicore, plan.memory
    figures = {"model": plan.model.path.rsplit("/", 1)[-1], "target": plan.target, "dtype": plan.dtype,
               "batch": plan.batch, "images": plan.images, "nodes": len(plan.nodes), "npu_ops": npu, "cpu_ops": cpu,
               "npu_percent": round(100 * npu / max(npu + cpu, 1), 1), "steps": len(plan.steps),
               "partitions": len(plan.partitions), "arena_bytes": memory.arena_bytes,
               "arena_lower_bound_bytes": memory.lower_bound_bytes, "weight_bytes": memory.weight_bytes,
               "memory_total_bytes": plan.memory_totals().total_bytes,
               "cores": multicore.cores, "est_latency_ms": multicore.est_latency_ms, "est_fps": multicore.est_fps,
               "est_one_core_ms": multicore.est_one_core_ms, "speedup": multicore.speedup}
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(figures)
    writer.writerow(figures.values())
    return buffer.getvalue()
