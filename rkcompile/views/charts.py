"""Two pictures of a plan as plain SVG, drawn from the plan alone (no compiler, no dependency).

- **Memory** (`memory_svg`): the arena over the steps. Each arena tensor is a rectangle, its
  live range (first to last step that lists it, as docs/memory.md defines it) across and its
  `[offset, offset + bytes)` up; the arena size and the lower bound are horizontal lines. A
  tensor written in place over another (`reuses`) takes the shared step's second half, so no two
  rectangles ever share area and the picture is the planner's own proof of non-overlap.
- **Time** (`timeline_svg`): a Gantt chart of one estimated run. A lane per NPU core and one for
  the CPU (per context with a batch): NPU steps, CPU fallback steps, host conversions between
  them, the run's fixed cost, and split steps on each core they use. Step times come from the
  cost model (`rkcompile/plan/cost_model.py`, docs/cost-model.md) applied to the plan's steps and
  tensors, scheduled as `passes/multicore.py` schedules them, so the chart ends at the plan's
  `est_latency_ms` and each core's busy time is its `per_core[].est_ms`.

Every rectangle carries its tensor or step in `data-*` attributes and a <title> tooltip.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
import math
from html import escape

from rkcompile.plan import cost_model
from rkcompile.plan.aliases import storage_of
from rkcompile.plan.allocation import live_ranges
from rkcompile.plan.schema import PlanRecord, Step
from rkcompile.targets import get_target

#: Fill colours by what a rectangle is; conversions are the host steps between devices.
FILLS = {"npu": "#40c057", "cpu": "#fd7e14", "host": "#868e96", "run": "#ced4da"}
#: A second shade per kind, so neighbouring arena tensors of one device stay apart.
SHADES = {"npu": "#8ce99a", "cpu": "#ffc078", "host": "#ced4da"}
LEGEND = {"npu": "NPU step", "cpu": "CPU step", "host": "conversion", "run": "run (submit, sync)"}
LOWER_BOUND_COLOUR = "#e03131"
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'
PLOT_WIDTH = 960
LEFT = 130       # room for lane and axis labels
TOP = 34         # room for the title
AXIS = 30        # room for the axis below the plot


@dataclass(frozen=True)
class Block:
    """One arena tensor: live over steps [start, stop) (fractions at an in-place hand-over)."""

    tensor: str
    start: float
    stop: float
    offset: int
    bytes: int
    writer: str  # the device of the step that writes it


@dataclass(frozen=True)
class Bar:
    """One interval of the estimated run on one lane; `step` None is the run's fixed cost."""

    lane: str
    step: int | None
    image: int
    start_ms: float
    stop_ms: float
    kind: str  # "npu", "cpu", "host" or "run"


def arena_blocks(plan: PlanRecord) -> list[Block]:
    # an alias is its source's bytes: its reads extend the source's rectangle
    arena = {name: t for name, t in plan.tensors.items() if t.region == "arena" and t.bytes > 0 and t.aliases is None}
    ranges = live_ranges([(map(partial(storage_of, plan.tensors), step.inputs), step.outputs) for step in plan.steps],
                         arena)
    first = {name: start for name, (start, _) in ranges.items()}
    last = {name: stop for name, (_, stop) in ranges.items()}
    writer = {name: step.device for step in reversed(plan.steps) for name in step.outputs}
    # the step that reads a tensor for the last time and writes another over it in place
    handed_over = {arena[name].reuses for name in first
                   if arena[name].reuses in last and last[arena[name].reuses] == first[name]}
    blocks = []
    for name in first:
        placed = arena[name]
        starts_in_place = placed.reuses in handed_over and last[placed.reuses] == first[name]
        blocks.append(Block(name, first[name] + (0.5 if starts_in_place else 0.0),
                            last[name] + (0.5 if name in handed_over else 1.0), placed.offset, placed.bytes,
                            writer.get(name, "host")))
    return blocks


def step_works(plan: PlanRecord) -> list[cost_model.StepWork]:
    """What the cost model needs of each step, from the plan: its MACs and the bytes of the
    tensors it reads (weights apart) and writes, as the plan stores them."""
    def total(names, weights: bool | None = None) -> int:
        return sum(plan.tensors[n].bytes for n in names
                   if weights is None or (plan.tensors[n].region == "weight") == weights)

    return [cost_model.StepWork(step.device, step.macs, total(step.inputs, True), total(step.inputs, False),
                                total(step.outputs)) for step in plan.steps]


def one_image_seconds(plan: PlanRecord, works: list[cost_model.StepWork]) -> list[float]:
    """Each step's estimated time for one image, as the multicore pass timed it: a split step's
    slowest part (its recorded `est_ms`) and the split's cost, any other step whole on one core."""
    hardware = cost_model.hardware_for(get_target(plan.target))
    splits = {split.step: split for split in plan.multicore.splits}
    return [max(part.est_ms for part in splits[step.id].parts) / 1e3 + cost_model.SPLIT_SECONDS
            if step.id in splits else cost_model.step_seconds(work, hardware, plan.dtype)
            for step, work in zip(plan.steps, works)]


def timeline_bars(plan: PlanRecord) -> list[Bar]:
    """One estimated run of the plan: every step of every image on the lane that runs it."""
    hardware = cost_model.hardware_for(get_target(plan.target))
    works = step_works(plan)
    multicore = plan.multicore
    run_ms = cost_model.RUN_SECONDS * 1e3
    if multicore.contexts:
        count = len(multicore.contexts)
        bars = []
        for context in multicore.contexts:
            cpu_lane = f"CPU (context {context.id})" if count > 1 else "CPU"
            bars.append(Bar(npu_lane(context.core), None, context.images[0], 0.0, run_ms, "run"))
            clock = run_ms
            for image in context.images:
                # seed 004 rounds: image i runs alongside the other contexts that have an image then
                active = min(count, multicore.batch - image // count * count)
                for step, work in zip(plan.steps, works):
                    seconds = cost_model.step_seconds(work, hardware, plan.dtype, active)
                    lane = npu_lane(context.core) if step.device == "npu" else cpu_lane
                    bars.append(Bar(lane, step.id, image, clock, clock + seconds * 1e3, step.device))
                    clock += seconds * 1e3
        return bars
    splits = {split.step: split for split in multicore.splits}
    first_core = multicore.per_core[0].core if multicore.per_core else 0
    bars = [Bar(npu_lane(first_core), None, 0, 0.0, run_ms, "run")]
    clock = run_ms
    for step, seconds in zip(plan.steps, one_image_seconds(plan, works)):
        split = splits.get(step.id)
        if split is not None:
            bars += [Bar(npu_lane(part.core), step.id, 0, clock, clock + part.est_ms, "npu") for part in split.parts]
        else:
            lane = npu_lane(_core_of(step, first_core)) if step.device == "npu" else "CPU"
            bars.append(Bar(lane, step.id, 0, clock, clock + seconds * 1e3, step.device))
        clock += seconds * 1e3
    return bars


def npu_lane(core: int) -> str:
    return f"NPU core {core}"


def _core_of(step: Step, default: int) -> int:
    return step.cores[0] if step.cores else default


def memory_svg(plan: PlanRecord) -> str:
    blocks = arena_blocks(plan)
    memory = plan.memory
    steps = max(len(plan.steps), 1)
    top_bytes = max(memory.arena_bytes, 1)
    height = 320
    x_scale, y_scale = PLOT_WIDTH / steps, height / top_bytes

    def y_of(size: float) -> float:
        return TOP + height - size * y_scale

    parts = [_title(f"{_model_name(plan)} on {plan.target}: arena over the steps "
                    f"({len(blocks)} tensors, {_kib(memory.arena_bytes)}, lower bound {_kib(memory.lower_bound_bytes)})"),
             f'<rect id="arena" x="{LEFT}" y="{TOP}" width="{PLOT_WIDTH}" height="{height}" fill="#f8f9fa" '
             f'stroke="#adb5bd" data-arena-bytes="{memory.arena_bytes}"/>']
    for index, block in enumerate(blocks):
        x0, x1 = LEFT + block.start * x_scale, LEFT + block.stop * x_scale
        tip = (f"{block.tensor}: {_kib(block.bytes)} at offset {block.offset}, "
               f"steps {math.floor(block.start)}-{math.ceil(block.stop) - 1}")
        parts.append(f'<rect class="tensor" x="{x0:.3f}" y="{y_of(block.offset + block.bytes):.3f}" '
                     f'width="{x1 - x0:.3f}" height="{block.bytes * y_scale:.3f}" '
                     f'fill="{(FILLS if index % 2 == 0 else SHADES)[block.writer]}" '
                     f'stroke="#fff" stroke-width="0.3" data-tensor="{escape(block.tensor)}" '
                     f'data-offset="{block.offset}" data-bytes="{block.bytes}" data-start="{block.start}" '
                     f'data-stop="{block.stop}"><title>{escape(tip)}</title></rect>')
    bound = y_of(memory.lower_bound_bytes)
    parts.append(f'<line id="lower-bound" x1="{LEFT}" x2="{LEFT + PLOT_WIDTH}" y1="{bound:.3f}" y2="{bound:.3f}" '
                 f'stroke="{LOWER_BOUND_COLOUR}" stroke-width="2" stroke-dasharray="6 3" '
                 f'data-bytes="{memory.lower_bound_bytes}"/>')
    parts.append(f'<text x="{LEFT + PLOT_WIDTH - 4}" y="{bound - 4:.1f}" text-anchor="end" '
                 f'fill="{LOWER_BOUND_COLOUR}" {_FONT}>lower bound {_kib(memory.lower_bound_bytes)}</text>')
    parts += [f'<text x="{LEFT - 6}" y="{y_of(value) + 4:.1f}" text-anchor="end" {_FONT}>{_kib(value)}</text>'
              for value in (0, memory.arena_bytes)]
    parts += _x_axis(steps, x_scale, TOP + height, "step", lambda value: f"{value:g}")
    legend = {device: LEGEND[device].replace(" step", "-written") for device in ("npu", "cpu", "host")}
    parts += _legend(legend, TOP + height + AXIS)
    return _svg(parts, TOP + height + AXIS + 24, "memory")


def timeline_svg(plan: PlanRecord) -> str:
    bars = timeline_bars(plan)
    lanes = sorted({bar.lane for bar in bars}, key=lambda lane: (lane.startswith("CPU"), lane))
    end_ms = max((bar.stop_ms for bar in bars), default=0.0) or 1.0
    lane_height, gap = 26, 6
    x_scale = PLOT_WIDTH / end_ms
    height = len(lanes) * (lane_height + gap)
    multicore = plan.multicore
    parts = [_title(f"{_model_name(plan)} on {plan.target}: estimated run, batch {multicore.batch}, "
                    f"{multicore.est_latency_ms:g} ms ({multicore.est_fps:g} fps)")]
    for row, lane in enumerate(lanes):
        y = TOP + row * (lane_height + gap)
        parts.append(f'<rect class="lane" x="{LEFT}" y="{y}" width="{PLOT_WIDTH}" height="{lane_height}" '
                     f'fill="#f8f9fa" data-lane="{escape(lane)}"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + lane_height / 2 + 4}" text-anchor="end" {_FONT}>'
                     f'{escape(lane)}</text>')
    row_of = {lane: row for row, lane in enumerate(lanes)}
    for bar in bars:
        y = TOP + row_of[bar.lane] * (lane_height + gap)
        step = plan.steps[bar.step] if bar.step is not None else None
        what = "run: submit and sync" if step is None else f"step {step.id} {step.kernel} ({step.device})"
        tip = f"{what}, image {bar.image}: {bar.start_ms:.4f}-{bar.stop_ms:.4f} ms"
        step_attribute = f' data-step="{bar.step}"' if bar.step is not None else ""
        parts.append(f'<rect class="bar" x="{LEFT + bar.start_ms * x_scale:.3f}" y="{y + 2}" '
                     f'width="{(bar.stop_ms - bar.start_ms) * x_scale:.3f}" height="{lane_height - 4}" '
                     f'fill="{FILLS[bar.kind]}" data-lane="{escape(bar.lane)}" data-kind="{bar.kind}" '
                     f'data-image="{bar.image}"{step_attribute} data-start-ms="{bar.start_ms:.6f}" '
                     f'data-stop-ms="{bar.stop_ms:.6f}"><title>{escape(tip)}</title></rect>')
    parts += _x_axis(end_ms, x_scale, TOP + height, "ms", lambda value: f"{value:g}")
    parts += _legend(LEGEND, TOP + height + AXIS)
    return _svg(parts, TOP + height + AXIS + 24, "timeline")


def _x_axis(extent: float, scale: float, y: float, unit: str, label) -> list[str]:
    parts = [f'<line x1="{LEFT}" x2="{LEFT + PLOT_WIDTH}" y1="{y}" y2="{y}" stroke="#495057"/>']
    for value in _ticks(extent):
        x = LEFT + value * scale
        parts.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y}" y2="{y + 4}" stroke="#495057"/>')
        parts.append(f'<text x="{x:.2f}" y="{y + 15}" text-anchor="middle" {_FONT}>{label(value)}</text>')
    parts.append(f'<text x="{LEFT + PLOT_WIDTH}" y="{y + 27}" text-anchor="end" {_FONT}>{unit}</text>')
    return parts


def _ticks(extent: float, wanted: int = 8) -> list[float]:
    """Round values from 0 to `extent`, about `wanted` of them (1, 2 or 5 times a power of ten apart)."""
    raw = extent / wanted
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    spacing = next(f * power for f in (1, 2, 5, 10) if f * power >= raw)
    return [round(i * spacing, 10) for i in range(int(extent / spacing) + 1)]


def _legend(entries: dict[str, str], y: float) -> list[str]:
    parts, x = [], LEFT
    for kind, text in entries.items():
        parts.append(f'<rect x="{x}" y="{y + 6}" width="12" height="12" fill="{FILLS[kind]}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 16}" {_FONT}>{escape(text)}</text>')
        x += 28 + 7 * len(text)
    return parts


def _title(text: str) -> str:
    return f'<text x="{LEFT}" y="{TOP - 14}" font-family="system-ui, sans-serif" font-size="13">{escape(text)}</text>'


def _svg(parts: list[str], height: float, kind: str) -> str:
    width = LEFT + PLOT_WIDTH + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="rkcompile-{kind}" width="{width}" '
            f'height="{height:.0f}" viewBox="0 0 {width} {height:.0f}">' + "".join(parts) + "</svg>\n")


def _model_name(plan: PlanRecord) -> str:
    return plan.model.path.rsplit("/", 1)[-1]


def _kib(size: int) -> str:
    return f"{size / 1024:,.1f} KiB"
