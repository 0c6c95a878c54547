"""The partition graph as Graphviz DOT, and as SVG through Graphviz's own `dot` when installed.

Each partition is a cluster filled with its device's colour; each node shows its op, kernel and
output shapes; edges carry the tensor's shape.
"""
from __future__ import annotations

import json
import shutil
import subprocess

from rkcompile.errors import CompileError
from rkcompile.views.partition_view import DEVICE_COLOURS, PlanView


def _quote(text: str) -> str:
    # A JSON string is a valid DOT quoted string: quotes and backslashes escaped, and a newline
    # becomes DOT's own line break escape.
    return json.dumps(text, ensure_ascii=False)


def to_dot(view: PlanView) -> str:
    lines = [f"digraph {_quote(view.model)} {{",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];',
             f"  label={_quote(f'{view.model} on {view.target}')};"]
    shapes = {}
    for partition in view.partitions:
        lines.append(f"  subgraph cluster_{partition.id} {{")
        lines.append(f"    label={_quote(f'partition {partition.id}: {partition.device} ({len(partition.nodes)})')};")
        lines.append(f'    style=filled; fillcolor="{DEVICE_COLOURS[partition.device]}";')
        for node in partition.nodes:
            out = ", ".join(shape for _, shape in node.outputs)
            label = "\n".join(dict.fromkeys((node.op, node.kernel, out)))
            tooltip = "; ".join(node.failing_rules) or node.reason or node.name
            lines.append(f"    {_quote(node.name)} [label={_quote(label)}, "
                         f"tooltip={_quote(tooltip)}];")
            shapes.update(node.outputs)
            shapes.update(node.inputs)  # an alias, which no step writes, is read in its own shape
        lines.append("  }")
    for producer, consumer, tensor in view.edges:
        lines.append(f"  {_quote(producer)} -> {_quote(consumer)} [label={_quote(shapes.get(tensor, ''))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dot_to_svg(dot_source: str) -> str:
    executable = shutil.which("dot")
    if executable is None:
        raise CompileError("--format svg needs Graphviz's 'dot' on PATH (Debian: apt-get install graphviz); "
                           "--format dot writes the DOT source instead")
    result = subprocess.run([executable, "-Tsvg"], input=dot_source, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        message = (result.stderr.strip().splitlines() or ["no message"])[0]
        raise CompileError(f"Graphviz 'dot' failed: {message}")
    return result.stdout
