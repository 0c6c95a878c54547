"""Our plans beside the peer's (Rockchip's rknn-toolkit2) for every model of a zoo folder: one
markdown row per model with NPU steps, layout steps, memory and CPU nodes, ours / the peer's,
and a median / worst line for the NPU-step ratio.

    python tools/peer_table.py ZOO_DIR --peer PEER.json [--python PY] [--rkcompile-root CHECKOUT]
                               [--target rk3588] [--only NAME,...] [--jobs 1] [--timeout 600]
                               [--json ROWS.json] [--rows-from ROWS.json]

Each model is planned by `PY -m rkcompile plan MODEL --target T --json PLAN --quiet` in its own
process (PY defaults to the running python; --rkcompile-root CHECKOUT makes that process import
rkcompile, its passes and targets from the checkout's folders rather than from what PY has
installed, so one interpreter with rkcompile's dependencies can measure any checkout). A plan that fails or times
out is a row with its error; the table goes on. PEER.json is tools/run_peer_zoo.py's output
(tools/wide_zoo/peer_rk3588.json, tools/real_exports_zoo/peer_rk3588.json) or the shape of
../shared/peer/zoo_rk3588.json (a `layers` list per model instead of `compute_ops_by_target`).

Columns (ours / the peer's):
  NPU steps   our plan's steps on the NPU / the peer's NPU compute layers (its layer table,
              Input/OutputOperator left out; both count fused kernels as one);
  ratio       ours / theirs for NPU steps (the median and worst line is over this column);
  layout      our steps, on any device, whose op is Transpose, Reshape, Flatten, Squeeze or
              Unsqueeze / the peer's compute layers of those op types;
  arena       our plan's memory arena / the peer's "Total Internal Memory Size";
  CPU         our plan's nodes placed on the CPU / the peer's CPU compute layers.
A peer entry that did not build shows `fails`; a model the peer has no entry for shows `-`.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

LAYOUT_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
_SIZE = re.compile(r"^\s*([0-9.]+)\s*([KMG]?i?B)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20, "gb": 2**30, "gib": 2**30}


# --------------------------------------------------------------------------- ours
#: `python -c` program running `rkcompile ARGS` from the checkout in argv[1], not from whatever the
#: interpreter has installed: rkcompile.passes and rkcompile.targets live at the checkout's top
#: level (pyproject's package-dir), so an editable install of another checkout would otherwise
#: supply them; they are bound to the checkout's folders before anything imports them.
_FROM_CHECKOUT = """
import importlib.util, sys, tomllib
from pathlib import Path
root = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(root))
import rkcompile
assert Path(rkcompile.__file__).resolve().is_relative_to(root), rkcompile.__file__
mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-dir", {})
for name, folder in sorted(mapping.items()):
    if name.startswith("rkcompile."):
        spec = importlib.util.spec_from_file_location(name, root / folder / "__init__.py",
                                                      submodule_search_locations=[str(root / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        setattr(rkcompile, name.split(".", 1)[1], module)
        spec.loader.exec_module(module)
sys.argv = ["rkcompile"] + sys.argv[2:]
from rkcompile.cli import console_main
console_main()
"""


def plan_row(python: str, root: Path | None, model: Path, target: str, timeout: int) -> dict[str, Any]:
    """Plan `model` in a child process; the row's numbers from the plan JSON (never raises)."""
    with tempfile.TemporaryDirectory(prefix="peer_table_") as tmp:
        out = Path(tmp) / "plan.json"
        cli = ["plan", str(model), "--target", target, "--json", str(out), "--quiet"]
        command = [python, "-m", "rkcompile", *cli] if root is None else [python, "-c", _FROM_CHECKOUT, str(root), *cli]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout} s"}
        if not out.is_file():
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            return {"error": f"exit {done.returncode}: {lines[-1].strip()[:200] if lines else 'no output'}"}
        return summarize_plan(json.loads(out.read_text()))


def summarize_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """NPU steps, layout steps, arena bytes and CPU nodes of one plan JSON."""
    def op_of(step):
        return (step.get("operation") or {}).get("op") or step.get("kernel")
    steps = plan.get("steps", [])
    return {
        "error": None,
        "npu_steps": sum(1 for s in steps if s.get("device") == "npu"),
        "layout_steps": sum(1 for s in steps if op_of(s) in LAYOUT_OPS),
        "arena_bytes": (plan.get("memory") or {}).get("arena_bytes"),
        "cpu_nodes": sum(1 for n in plan.get("nodes", []) if n.get("device") == "cpu"),
        "nodes": len(plan.get("nodes", [])),
    }


# --------------------------------------------------------------------------- theirs
def peer_numbers(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The peer's numbers for one model, from either peer-JSON shape; None without an entry."""
    if entry is None:
        return None
    if not entry.get("built"):
        return {"built": False, "error": entry.get("error")}
    ops = entry.get("compute_ops_by_target")
    if ops is None and entry.get("layers") is not None:  # ../shared/peer/zoo_rk3588.json
        ops = {}
        for layer in entry["layers"]:
            op = layer.get("op") or layer.get("op_type")
            if op not in ("InputOperator", "OutputOperator"):
                per_target = ops.setdefault(layer.get("target"), {})
                per_target[op] = per_target.get(op, 0) + 1
    counts = entry.get("compute_layers_by_target", {})
    memory = (entry.get("memory") or {}).get("internal_memory")
    return {
        "built": True,
        "npu_layers": counts.get("NPU", 0),
        "cpu_layers": counts.get("CPU", 0),
        "layout_layers": (sum(c.get(op, 0) for c in ops.values() for op in LAYOUT_OPS) if ops is not None else None),
        "internal_bytes": parse_size(memory),
        "simulator_min_cosine": entry.get("simulator_min_cosine"),
    }


def parse_size(text: str | None) -> int | None:
    """'2000KB' -> 2048000 (librknnc's KB are 1024 bytes); None for anything else."""
    match = _SIZE.match(text or "")
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


# --------------------------------------------------------------------------- table
def human(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}" if size < 10 * scale else f"{size / scale:.0f}{unit}"
    return f"{size}B"


def pair(ours: Any, theirs: Any) -> str:
    return f"{'-' if ours is None else ours} / {'-' if theirs is None else theirs}"


def render(rows: list[dict[str, Any]]) -> str:
    head = ["model", "NPU steps", "ratio", "layout", "arena", "CPU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    ratios = []
    for row in rows:
        ours, theirs = row["ours"], row["peer"]
        if theirs is None:
            theirs_cells = {"npu": "-", "layout": "-", "mem": "-", "cpu": "-"}
        elif not theirs["built"]:
            theirs_cells = {"npu": "fails", "layout": "fails", "mem": "fails", "cpu": "fails"}
        else:
            theirs_cells = {"npu": theirs["npu_layers"], "layout": theirs["layout_layers"],
                            "mem": human(theirs["internal_bytes"]), "cpu": theirs["cpu_layers"]}
        if ours.get("error"):
            cells = [pair("err", theirs_cells["npu"]), "", pair("err", theirs_cells["layout"]),
                     pair("err", theirs_cells["mem"]), pair("err", theirs_cells["cpu"])]
        else:
            ratio = ""
            if theirs and theirs.get("built") and theirs["npu_layers"]:
                value = ours["npu_steps"] / theirs["npu_layers"]
                ratios.append((value, row["model"]))
                ratio = f"{value:.2f}"
            cells = [pair(ours["npu_steps"], theirs_cells["npu"]), ratio,
                     pair(ours["layout_steps"], theirs_cells["layout"]),
                     pair(human(ours["arena_bytes"]), theirs_cells["mem"]),
                     pair(ours["cpu_nodes"], theirs_cells["cpu"])]
        lines.append("| " + " | ".join([row["model"]] + [str(c) for c in cells]) + " |")
    lines.append("")
    if ratios:
        worst, worst_model = max(ratios)
        best, best_model = min(ratios)
        lines.append(f"NPU-step ratio ours/peer over {len(ratios)} models both built: median "
                     f"{statistics.median(r for r, _ in ratios):.2f}, worst {worst:.2f} ({worst_model}), "
                     f"best {best:.2f} ({best_model})")
    errors = [r["model"] for r in rows if r["ours"].get("error")]
    peer_fails = [r["model"] for r in rows if r["peer"] is not None and not r["peer"]["built"]]
    lines.append(f"{len(rows)} models; our plan failed on {len(errors)}"
                 + (f" ({', '.join(errors)})" if errors else "")
                 + f"; the peer failed on {len(peer_fails)}" + (f" ({', '.join(peer_fails)})" if peer_fails else ""))
    for row in rows:
        if row["ours"].get("error"):
            lines.append(f"  {row['model']}: {row['ours']['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zoo", type=Path, help="folder of NAME.onnx models")
    parser.add_argument("--peer", type=Path, required=True, help="the peer's results for the zoo (run_peer_zoo.py)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs rkcompile")
    parser.add_argument("--rkcompile-root", type=Path, default=None,
                        help="plan with the rkcompile of this checkout (its folders, not PY's install)")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--jobs", type=int, default=1, help="plans at once")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per plan")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--rows-from", type=Path, default=None, help="render an earlier --json's rows, no planning")
    args = parser.parse_args(argv)
    try:
        peer = json.loads(args.peer.read_text()) if args.peer.is_file() else {}
    except json.JSONDecodeError as exc:
        print(f"error: {args.peer}: not JSON ({exc})", file=sys.stderr)
        return 2
    models_peer = peer.get("models", {})
    if args.rows_from:
        rows = json.loads(args.rows_from.read_text())["rows"]
        for row in rows:  # newer peer results apply to old rows
            row["peer"] = peer_numbers(models_peer.get(row["model"]))
        print(render(rows))
        return 0
    if not args.zoo.is_dir():
        print(f"error: {args.zoo} is not a folder", file=sys.stderr)
        return 2
    wanted = {n for n in args.only.split(",") if n}
    models = [p for p in sorted(args.zoo.glob("*.onnx")) if not wanted or p.stem in wanted]
    ours: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(plan_row, args.python, args.rkcompile_root, p, args.target, args.timeout): p
                   for p in models}
        for future in as_completed(futures):
            path = futures[future]
            ours[path.stem] = future.result()
            print(f"planned {path.stem}: {ours[path.stem].get('error') or 'ok'}", file=sys.stderr, flush=True)
    rows = [{"model": p.stem, "ours": ours[p.stem], "peer": peer_numbers(models_peer.get(p.stem))} for p in models]
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "python": args.python,
                                         "rkcompile_root": str(args.rkcompile_root or ""), "rows": rows},
                                        indent=1) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
