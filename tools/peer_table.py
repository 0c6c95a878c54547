"""Our plans beside the peer's (Rockchip's rknn-toolkit2) for every model of a zoo folder: one
markdown row per model with NPU steps, layout steps, memory and CPU nodes, ours / the peer's,
and a median / worst line for the NPU-step ratio.

    python tools/peer_table.py ZOO_DIR --peer PEER.json [--python PY] [--rkcompile-root CHECKOUT]
                               [--target rk3588] [--only NAME,...] [--jobs 1] [--timeout 600]
                               [--cosine] [--json ROWS.json] [--rows-from ROWS.json]

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
  CPU         our plan's nodes placed on the CPU / the peer's CPU compute layers;
  cosine      (with --cosine) our float16 plan run on the emulator / the peer's simulator, each
              against onnxruntime float32 with graph optimizations off, on the inputs the peer's
              --sim makes (`peer_inputs`): the worst over the float outputs of the float64
              cosine of the flattened arrays (`peer_cosine`, rknn_peer.py's formula); `LOW`
              marks ours below theirs - 1e-5 and the models below the bar are listed. The run
              is `PY -m rkcompile run MODEL --target T --inputs X.npz --outputs Y.npz` in its
              own process, as the plan is.
A peer entry that did not build shows `fails`; a model the peer has no entry for shows `-`.
"""
from __future__ import annotations

import argparse
import json
import math
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


def rkcompile_command(python: str, root: Path | None, cli: list[str]) -> list[str]:
    """The child command running `rkcompile CLI` with `python`, from the checkout `root` if given."""
    return [python, "-m", "rkcompile", *cli] if root is None else [python, "-c", _FROM_CHECKOUT, str(root), *cli]


def run_child(command: list[str], timeout: int, cwd: str, made: Path) -> str | None:
    """Run `command`; None when it wrote `made`, else the row's error (never raises)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout} s"
    if made.is_file():
        return None
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return f"exit {done.returncode}: {lines[-1].strip()[:200] if lines else 'no output'}"


def plan_row(python: str, root: Path | None, model: Path, target: str, timeout: int) -> dict[str, Any]:
    """Plan `model` in a child process; the row's numbers from the plan JSON (never raises)."""
    with tempfile.TemporaryDirectory(prefix="peer_table_") as tmp:
        out = Path(tmp) / "plan.json"
        cli = ["plan", str(model), "--target", target, "--json", str(out), "--quiet"]
        error = run_child(rkcompile_command(python, root, cli), timeout, tmp, out)
        return {"error": error} if error else summarize_plan(json.loads(out.read_text()))


# --------------------------------------------------------------------------- cosine
def peer_inputs(model: Path, seed: int = 0) -> dict[str, Any]:
    """The inputs rknn_peer.py's --sim gives the toolkit's simulator and onnxruntime, value for
    value: one numpy Generator seeded `seed`, drawn per graph input in order (initializers that
    are also listed as inputs are skipped; a dimension without a positive size is 1): floats
    uniform in [-1, 1) as `random() * 2 - 1` cast to the input's type, integers (and booleans)
    `integers(0, 4)` cast."""
    import numpy as np
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    rng = np.random.default_rng(seed)
    inputs = {}
    for info in graph.input:
        if info.name in initializers:
            continue
        tensor = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        inputs[info.name] = ((rng.random(shape) * 2 - 1).astype(dtype) if np.issubdtype(dtype, np.floating)
                             else rng.integers(0, 4, shape).astype(dtype))
    return inputs


def onnxruntime_reference(model: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    """The model's outputs by name from onnxruntime float32 with graph optimizations off, the
    peer's reference (its fusions would round differently from the graph as written)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def peer_cosine(actual: Any, expected: Any) -> float | None:
    """rknn_peer.py's cosine: both flattened in float64, dot over the product of the norms;
    None when a norm is zero."""
    import numpy as np

    a = np.asarray(actual, np.float64).reshape(-1)
    b = np.asarray(expected, np.float64).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(a) * np.linalg.norm(b)
        return float(a @ b / norms) if not norms <= 0 else None  # NaN or inf in an output: NaN


def cosine_row(python: str, root: Path | None, model: Path, target: str, timeout: int) -> dict[str, Any]:
    """Our float16 plan of `model` run on the emulator (a child process) against onnxruntime,
    on the peer's inputs: the cosine per float output and the worst (never raises)."""
    import numpy as np

    try:
        inputs = peer_inputs(model)
        reference = onnxruntime_reference(model, inputs)
    except Exception as exc:  # a model onnxruntime cannot run has no reference to compare with
        return {"error": f"onnxruntime: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
    with tempfile.TemporaryDirectory(prefix="peer_table_") as tmp:
        given, out = Path(tmp) / "inputs.npz", Path(tmp) / "outputs.npz"
        np.savez(given, **inputs)
        cli = ["run", str(model), "--target", target, "--inputs", str(given), "--outputs", str(out)]
        error = run_child(rkcompile_command(python, root, cli), timeout, tmp, out)
        if error:
            return {"error": error}
        with np.load(out) as outputs:
            ours = dict(outputs)
    cosines: dict[str, float | None] = {}
    for name, expected in reference.items():
        if np.asarray(expected).dtype.kind != "f":  # the peer compares integer outputs for equality only
            continue
        if name not in ours or ours[name].size != np.asarray(expected).size:
            return {"error": f"output {name}: {'missing' if name not in ours else 'size differs'}"}
        cosines[name] = peer_cosine(ours[name], expected)
    known = [c for c in cosines.values() if c is not None]
    worst = None if not known else math.nan if any(math.isnan(c) for c in known) else min(known)
    return {"error": None, "min_cosine": worst, "cosines": cosines}


#: how far below the peer's simulator our cosine may be (issue 36's bar)
COSINE_SLACK = 1e-5


def cosine_low(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> bool:
    """True when our worst cosine is below the peer's minus COSINE_SLACK (a NaN is below)."""
    if not ours or ours.get("error") or not theirs or theirs.get("simulator_min_cosine") is None:
        return False
    return not (ours["min_cosine"] is not None and ours["min_cosine"] >= theirs["simulator_min_cosine"] - COSINE_SLACK)


def cosine_cell(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    mine = "err" if ours is None or ours.get("error") else ("-" if ours["min_cosine"] is None else f"{ours['min_cosine']:.8f}")
    peer = "-" if theirs is None or theirs.get("simulator_min_cosine") is None else f"{theirs['simulator_min_cosine']:.8f}"
    return f"{mine} / {peer}" + (" LOW" if cosine_low(ours, theirs) else "")


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
    with_cosine = any("cosine" in row for row in rows)
    head = ["model", "NPU steps", "ratio", "layout", "arena", "CPU"] + (["cosine"] if with_cosine else [])
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
        if with_cosine:
            cells.append(cosine_cell(row.get("cosine"), theirs if theirs and theirs["built"] else None))
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
    if with_cosine:
        low = [r["model"] for r in rows if cosine_low(r.get("cosine"), r["peer"])]
        compared = [r for r in rows if r.get("cosine") and not r["cosine"].get("error")
                    and r["peer"] and r["peer"].get("simulator_min_cosine") is not None]
        lines.append(f"cosine: ours below the peer's simulator - {COSINE_SLACK:g} on {len(low)} of {len(compared)} "
                     "models both ran" + (f" ({', '.join(low)})" if low else ""))
        for row in rows:
            if row.get("cosine") and row["cosine"].get("error"):
                lines.append(f"  {row['model']} (cosine): {row['cosine']['error']}")
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
    parser.add_argument("--cosine", action="store_true",
                        help="also run each plan on the peer's inputs: cosine against onnxruntime, ours / the peer's")
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
    measures = [("ours", plan_row)] + ([("cosine", cosine_row)] if args.cosine else [])
    found: dict[tuple[str, str], dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(measure, args.python, args.rkcompile_root, p, args.target, args.timeout): (p, key)
                   for p in models for key, measure in measures}
        for future in as_completed(futures):
            path, key = futures[future]
            found[path.stem, key] = row = future.result()
            shown = row.get("error") or ("ok" if key == "ours" else f"cosine {row['min_cosine']}")
            print(f"{'planned' if key == 'ours' else 'ran'} {path.stem}: {shown}", file=sys.stderr, flush=True)
    rows = [{"model": p.stem, **{key: found[p.stem, key] for key, _ in measures},
             "peer": peer_numbers(models_peer.get(p.stem))} for p in models]
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "python": args.python,
                                         "rkcompile_root": str(args.rkcompile_root or ""), "rows": rows},
                                        indent=1) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
