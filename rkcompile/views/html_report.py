"""A self-contained HTML page of the partition graph: no scripts, fonts or images from anywhere.

Partitions are listed in execution order, coloured by device, as native <details> blocks, so a
large graph stays usable: partitions above `OPEN_LIMIT` nodes start collapsed and open with a
click. A strip at the top shows every partition's share of the steps. Each node shows its op,
kernel, input and output shapes; a CPU node lists every rule it breaks, one per line. Two
pictures (`charts.py`, inline SVG) follow the summary: the arena over the steps and the per-core
timeline of an estimated run.
"""
from __future__ import annotations

from html import escape

from rkcompile.views.charts import memory_svg, timeline_svg
from rkcompile.views.partition_view import DEVICE_COLOURS, NodeView, PartitionView, PlanView
from rkcompile.plan.schema import PlanRecord

OPEN_LIMIT = 12

_STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 1.5em; color: #212529; }
h1 { font-size: 18px; margin: 0 0 .3em; }
pre.summary { background: #f8f9fa; padding: .6em; border-radius: 4px; font-size: 12px; white-space: pre-wrap; }
.strip { display: flex; height: 22px; border: 1px solid #adb5bd; margin: .8em 0 1.2em; }
.strip a { display: block; min-width: 3px; border-right: 1px solid #fff; }
.legend span { display: inline-block; padding: 0 .6em; margin-right: .4em; border-radius: 3px; }
details.partition { border: 1px solid #adb5bd; border-radius: 6px; margin: .5em 0; padding: .3em .6em; }
details.partition > summary { cursor: pointer; font-weight: 600; }
.nodes { display: flex; flex-wrap: wrap; gap: .5em; margin: .5em 0; }
.node { background: #fff; border: 1px solid #ced4da; border-radius: 4px; padding: .3em .5em; max-width: 34em; }
.node .op { font-weight: 600; }
.node .kernel { color: #2b8a3e; }
.node .name, .node .shapes { color: #495057; font-size: 11px; word-break: break-all; }
.node ul.rules { margin: .3em 0 0; padding-left: 1.2em; color: #c92a2a; font-size: 11px; }
.node .reason { color: #862e9c; font-size: 11px; }
.feeds { color: #495057; font-size: 11px; }
h2 { font-size: 15px; margin: 1.2em 0 .3em; }
.chart { overflow-x: auto; }
"""


def _node_html(node: NodeView) -> str:
    shapes = " &rarr; ".join(escape(", ".join(shape for _, shape in side) or "-")
                             for side in (node.inputs, node.outputs))
    parts = [f'<div class="node" id="node-{escape(node.name)}">',
             f'<div><span class="op">{escape(node.op)}</span>'
             + (f' <span class="kernel">{escape(node.kernel)}</span>' if node.kernel != node.op else "") + "</div>",
             f'<div class="shapes">{shapes}</div>',
             f'<div class="name">{escape(node.name)}</div>']
    if node.failing_rules:
        parts.append('<ul class="rules">' + "".join(f"<li>{escape(rule)}</li>" for rule in node.failing_rules)
                     + "</ul>")
    if node.reason and node.device == "cpu" and not node.failing_rules:
        parts.append(f'<div class="reason">{escape(node.reason)}</div>')
    parts.append("</div>")
    return "".join(parts)


def _partition_html(partition: PartitionView) -> str:
    colour = DEVICE_COLOURS[partition.device]
    opened = " open" if len(partition.nodes) <= OPEN_LIMIT else ""
    feeds = ", ".join(f'<a href="#partition-{p}">{p}</a>' for p in partition.feeds) or "model outputs only"
    return (f'<details class="partition" id="partition-{partition.id}" style="background:{colour}"{opened}>'
            f"<summary>partition {partition.id} &middot; {partition.device.upper()} &middot; "
            f"{len(partition.nodes)} step{'s' if len(partition.nodes) != 1 else ''}</summary>"
            f'<div class="feeds">feeds partitions: {feeds}</div>'
            f'<div class="nodes">{"".join(_node_html(n) for n in partition.nodes)}</div></details>')


def to_html(view: PlanView, summary: str, plan: PlanRecord) -> str:
    total = sum(len(p.nodes) for p in view.partitions) or 1
    strip = "".join(
        f'<a href="#partition-{p.id}" title="partition {p.id}: {p.device} ({len(p.nodes)})" '
        f'style="flex:{len(p.nodes) / total:.4f};background:{DEVICE_COLOURS[p.device]}"></a>'
        for p in view.partitions)
    legend = "".join(f'<span style="background:{colour}">{device.upper()}</span>'
                     for device, colour in DEVICE_COLOURS.items())
    title = f"{view.model} on {view.target}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)} - rkcompile partitions</title><style>{_STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1><div class=\"legend\">{legend}</div>"
            f'<div class="strip">{strip}</div><pre class="summary">{escape(summary)}</pre>'
            f'<h2>Memory: the arena over the steps</h2><div class="chart">{memory_svg(plan)}</div>'
            f'<h2>Time: one estimated run, per core</h2><div class="chart">{timeline_svg(plan)}</div>'
            f"<h2>Partitions</h2>"
            f'{"".join(_partition_html(p) for p in view.partitions)}</body></html>\n')
