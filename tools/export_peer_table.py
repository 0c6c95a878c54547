"""Does rknn-toolkit2 build what `rkcompile export` writes? One row per model: the toolkit on the
original (built? CPU layers), our export (nodes, CPU nodes in our plan, the toolkit reshapings
applied), the toolkit on the export (built? CPU layers, its simulator's worst cosine). A model
with data-dependent shapes (a detector's NMS), or with an output the toolkit would reshape on
its CPU (a YOLO head at 320x320), is exported with its host tail (`--host-tail`): the toolkit
builds the NPU part, and a line below the table says where the cut is, how many nodes the host
part runs on onnxruntime and how many CPU nodes of the plan are left before it.

    python tools/export_peer_table.py MODEL_OR_DIR ... --python PEER_VENV/bin/python
                                      [--target rk3588] [--out DIR] [--json OUT] [--timeout 900]
                                      [--originals PEER.json ...] [--tolerance FRACTION]

--originals takes the toolkit's results on the originals from a zoo's committed table
(tools/wide_zoo/peer_rk3588.json, written by tools/run_peer_zoo.py) instead of building each
original again. The last lines name the models where the export misses issue #37's bar: the
toolkit puts more layers on its CPU on the export than on the original it builds, or, on one it
fails on, more than the plan puts nodes on the CPU (before the cut, with a host tail); the
Reshapes of int64 inputs the toolkit adds itself, which the export's report predicts
(`toolkit_input_reshapes`), are named there.

The toolkit runs through ../shared/peer/rknn_peer.py in its own virtualenv (tools/run_peer_zoo.py
starts it, one child per build, with --sim); it is never imported here. The simulator's cosine is
against onnxruntime on the export, which the export's own check holds equal to the original
(within 2^-10 of each output's range, in practice float32 rounding). A model with NAME.npz beside
it is checked on those inputs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import model_paths  # noqa: E402
from run_peer_zoo import DEFAULT_PEER, peer_result  # noqa: E402

import rkcompile  # noqa: E402
from rkcompile.errors import CompileError  # noqa: E402


def export_row(model: Path, out: Path, python: str, peer: Path, target: str, timeout: int,
               originals: dict[str, dict], tolerance: dict) -> dict:
    """The toolkit on `model` (its entry in `originals`, by name, if there) and on its export to
    `out`/NAME.onnx (checked within `tolerance`, `rkcompile export --tolerance`, when it names one)."""
    original = originals.get(model.stem) or peer_result(python, peer, model, target, True, timeout)
    row = {"model": model.stem, "original": original}
    exported = out / f"{model.stem}.onnx"
    try:
        report = rkcompile.export(model, exported, target, host_tail=True, **_sample_settings(model), **tolerance).report
    except CompileError as exc:
        row["export_error"] = str(exc)
        return row
    row["export"] = {"nodes": report["nodes"],
                     "plan_cpu_nodes": [f"{n['op']} ({n['name']})" for n in report["cpu_nodes"]],
                     "toolkit_input_reshapes": [entry["input"] for entry in report["toolkit_input_reshapes"]],
                     "toolkit_shapings": report["toolkit_shapings"],
                     "max_rel_vs_original": max(a["max_rel"] for a in report["check"]["outputs"])}
    if "host_tail" in report:
        tail = report["host_tail"]
        row["export"]["host_tail"] = {"cut_tensors": len(tail["cut"]), "host_nodes": tail["nodes"]["host"],
                                      "plan_cpu_nodes_in_npu_part": len(tail["cpu_nodes_in_npu_part"])}
    row["toolkit_on_export"] = peer_result(python, peer, exported, target, True, timeout)
    return row


def _sample_settings(model: Path) -> dict:
    """The check inputs NAME.npz beside `model` holds, if any (its output arrays are ignored)."""
    sample = model.with_suffix(".npz")
    if not sample.is_file():
        return {}
    with np.load(sample) as arrays:
        inputs = {name: arrays[name] for name in arrays.files}
    return {"inputs": inputs}


def render(rows: list[dict]) -> str:
    lines = [f"{'model':28} {'toolkit on the original':34} {'export':26} {'toolkit on the export':44}",
             f"{'':28} {'built  CPU layers':34} {'nodes  plan CPU  shaped':26} {'built  CPU layers  sim cosine':44}"]
    for row in rows:
        original = _peer_cell(row["original"])
        if "export_error" in row:
            lines.append(f"{row['model']:28} {original:34} error: {row['export_error']}")
            continue
        export, peer = row["export"], row["toolkit_on_export"]
        shaped = sum(export["toolkit_shapings"].values())
        nodes = f"{export['nodes']['model']}->{export['nodes']['export']}"
        cosine = "-" if peer["simulator_min_cosine"] is None else f"{peer['simulator_min_cosine']:.6f}"
        lines.append(f"{row['model']:28} {original:34} {nodes:>9} {len(export['plan_cpu_nodes']):>6} {shaped:>6}    "
                     f"{_peer_cell(peer):34} {cosine}")
    for row in rows:
        tail = row.get("export", {}).get("host_tail")
        if tail:
            lines.append(f"  {row['model']} (host tail): the export is cut at {tail['cut_tensors']} tensors, the host "
                         f"part runs {tail['host_nodes']} nodes on onnxruntime; {tail['plan_cpu_nodes_in_npu_part']} "
                         "CPU nodes of the plan before the cut")
        for side in ("original", "toolkit_on_export"):
            entry = row.get(side)
            if entry and (entry["cpu_layers"] or not entry["built"]):
                detail = entry["error"] if not entry["built"] else "; ".join(entry["cpu_layers"])
                lines.append(f"  {row['model']} ({side.replace('_', ' ')}): {detail}")
    lines += [f"  misses the bar: {row['model']} ({reason})" for row in rows for reason in [_missed_bar(row)] if reason]
    return "\n".join(lines)


def _missed_bar(row: dict) -> str:
    """Why the export of `row` misses issue #37's bar on CPU layers, or ''."""
    if "export_error" in row:
        return "not exported"
    peer = row["toolkit_on_export"]
    if not peer["built"]:
        return "the toolkit fails on the export"
    on_export = peer["compute_layers_by_target"].get("CPU", 0)
    if row["original"]["built"]:
        on_original = row["original"]["compute_layers_by_target"].get("CPU", 0)
        return f"{on_export} CPU layers against {on_original} on the original" if on_export > on_original else ""
    tail = row["export"].get("host_tail")
    plan_cpu = tail["plan_cpu_nodes_in_npu_part"] if tail else len(row["export"]["plan_cpu_nodes"])
    if on_export <= plan_cpu:
        return ""
    # an older row has no prediction of the toolkit's own Reshapes of int64 inputs
    reshaped = row["export"].get("toolkit_input_reshapes", [])
    predicted = (f"; {len(reshaped)} of them the toolkit's own Reshape of {', '.join(reshaped)}, as the report "
                 "predicts" if reshaped else "")
    return f"{on_export} CPU layers against the plan's {plan_cpu} CPU nodes{predicted}"


def _peer_cell(entry: dict) -> str:
    if not entry["built"]:
        return "no"
    return f"yes    {entry['compute_layers_by_target'].get('CPU', 0)}/{sum(entry['compute_layers_by_target'].values())}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", type=Path, nargs="+", help="ONNX files or folders of them")
    parser.add_argument("--python", default=os.environ.get("RKNN_PEER_PYTHON"),
                        help="the peer venv's python (default: $RKNN_PEER_PYTHON)")
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER, help=f"rknn_peer.py (default: {DEFAULT_PEER})")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--out", type=Path, default=Path("exports"), help="folder for the exports (default ./exports)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per toolkit build")
    parser.add_argument("--originals", type=Path, nargs="+", default=[], metavar="PEER_JSON",
                        help="the toolkit's committed results on the originals (tools/*/peer_rk3588.json)")
    parser.add_argument("--tolerance", type=float, metavar="FRACTION",
                        help="the export check's tolerance (rkcompile export --tolerance; default its own)")
    args = parser.parse_args(argv)
    if not args.python or not Path(args.python).is_file() or not args.peer.is_file():
        print("error: rknn-toolkit2's python and rknn_peer.py are needed: --python PATH (or RKNN_PEER_PYTHON) and "
              "--peer (recipe at the top of ../shared/peer/rknn_peer.py)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    originals = {name: entry for table in args.originals for name, entry in json.loads(table.read_text())["models"].items()}
    tolerance = {} if args.tolerance is None else {"tolerance": args.tolerance}
    print(render(collect(args.models, lambda model: export_row(model, args.out, args.python, args.peer, args.target,
                                                               args.timeout, originals, tolerance), args.json)))
    return 0


def collect(models: list[Path], make_row: Callable[[Path], dict], json_path: Path | None) -> list[dict]:
    """One row per model of `models` (files or folders of them), saying so on stderr as each is
    done, and the rows so far written to `json_path` (when given) after each."""
    rows = []
    for model in model_paths(models):
        rows.append(make_row(model))
        print(f"{model.stem}: done", file=sys.stderr, flush=True)
        if json_path is not None:
            json_path.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(main())
