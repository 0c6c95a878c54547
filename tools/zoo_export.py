"""What tools/make_wide_zoo.py and tools/make_real_exports_zoo.py share: one model staged,
run through onnxruntime and written atomically as NAME.onnx + NAME.npz with its manifest entry,
the child-process entry that does that for one model, and the parent loop that runs one child
per model with a timeout and keeps OUT_DIR/manifest.json. rkcompile never imports this file.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def agreement(pairs: Iterable[tuple[str, Any]], ort_outputs: dict[str, Any], shapes: bool = False) -> dict[str, Any]:
    """Per output name: how onnxruntime's output compares with the framework's `want` (max abs
    difference for floats, equality otherwise; with `shapes`, the two shapes beside the latter)."""
    import numpy as np
    compared = {}
    for name, want in pairs:
        got = ort_outputs.get(name)
        want = np.asarray(want)
        if got is not None and got.shape == want.shape and want.dtype.kind == "f":
            compared[name] = {"max_abs_diff": float(np.max(np.abs(got - want), initial=0.0)),
                              "max_abs_ref": float(np.max(np.abs(want), initial=0.0))}
        elif got is not None:
            compared[name] = ({"shape_ort": list(got.shape), "shape_framework": list(want.shape)} if shapes else {})
            compared[name]["equal"] = bool(got.shape == want.shape and np.array_equal(got, want))
    return compared


def describe(onnx_path: Path, npz_path: Path, ort_outputs: dict[str, Any], seconds: float, head: dict[str, Any],
             input_generation: str, compare: Callable[[list[str]], tuple[str, Any]]) -> dict[str, Any]:
    """A model's manifest entry, in the shape of ../shared/zoo/manifest.json: `head` (name .. weights)
    first, then what the ONNX file says; `compare(output names)` gives the reference's agreement
    key and value."""
    from collections import Counter

    import numpy as np
    import onnx
    import onnxruntime
    model = onnx.load(str(onnx_path))
    try:
        onnx.checker.check_model(model, full_check=True)
        checker = "check_model(full_check=True) passed"
    except Exception as exc:  # recorded, not fatal: planning such a model is part of the measure
        checker = f"check_model(full_check=True) failed: {' '.join(str(exc).split())[:300]}"
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        shape_inference = f"infer_shapes(strict_mode=True) passed; value_info entries: {len(inferred.graph.value_info)}"
    except Exception as exc:
        shape_inference = f"infer_shapes(strict_mode=True) failed: {' '.join(str(exc).split())[:300]}"

    def count(graph) -> int:
        return sum(1 + sum(count(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)
                   + sum(count(g) for a in n.attribute for g in a.graphs) for n in graph.node)

    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]

    def spec_of(vi):
        t = vi.type.tensor_type
        return {"name": vi.name, "dtype": str(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)),
                "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]}

    outputs = [o.name for o in model.graph.output]
    agreement_key, agreement_value = compare(outputs)
    return {
        **head,
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [spec_of(i) for i in inputs],
        "outputs": [spec_of(o) for o in model.graph.output],
        "outputs_ort_shapes": {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in ort_outputs.items()},
        "node_count": len(model.graph.node),
        "node_count_incl_subgraphs": count(model.graph),
        "op_histogram": dict(Counter(n.op_type for n in model.graph.node).most_common()),
        "initializer_count": len(model.graph.initializer),
        "parameters": int(sum(np.prod(i.dims, dtype=np.int64) for i in model.graph.initializer)),
        "file_size_bytes": onnx_path.stat().st_size,
        "file_size_mb": round(onnx_path.stat().st_size / 2**20, 2),
        "sha256": sha256(onnx_path),
        "onnx_checker": checker,
        "shape_inference": shape_inference,
        "reference": {
            "file": npz_path.name,
            "sha256": sha256(npz_path),
            "keys_inputs": [i.name for i in inputs],
            "keys_outputs": outputs,
            "input_generation": input_generation,
            "onnxruntime_version": onnxruntime.__version__,
            "onnxruntime_settings": "CPUExecutionProvider, default graph_optimization_level (ORT_ENABLE_ALL), "
                                    "intra/inter_op_num_threads=1",
            agreement_key: agreement_value,
        },
        "build_seconds": round(seconds, 1),
    }


def export_one(name: str, out: Path, prefix: str, export: Callable[[Path], dict[str, Any]],
               entry: Callable[[Path, Path, dict[str, Any], float], dict[str, Any]]) -> dict[str, Any]:
    """`export(NAME.onnx in a staging folder)` writes the model and returns its arrays (with
    "inputs" by name); onnxruntime runs it, NAME.onnx + NAME.npz are written into `out`
    atomically; the manifest entry `entry(onnx, npz, arrays + "ort_outputs", seconds)`."""
    import numpy as np
    import onnxruntime
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{name}_", dir=out.parent))  # same disk, not under OUT
    try:
        onnx_tmp = staging / f"{name}.onnx"
        arrays = export(onnx_tmp)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(onnx_tmp), options, providers=["CPUExecutionProvider"])
        feed = {i.name: arrays["inputs"][i.name] for i in session.get_inputs()}
        values = session.run(None, feed)
        arrays["ort_outputs"] = {o.name: v for o, v in zip(session.get_outputs(), values)}
        npz_tmp = staging / f"{name}.npz"
        with open(npz_tmp, "wb") as f:
            np.savez(f, **feed, **arrays["ort_outputs"])
        described = entry(onnx_tmp, npz_tmp, arrays, time.perf_counter() - started)
        npz_tmp.replace(out / npz_tmp.name)
        onnx_tmp.replace(out / onnx_tmp.name)  # the .onnx last: a model in the folder always has its npz
        return described
    finally:
        for leftover in sorted(staging.rglob("*"), reverse=True):
            leftover.unlink() if leftover.is_file() else leftover.rmdir()
        staging.rmdir()


def child(export: Callable[[], dict[str, Any]], result: Path) -> int:
    """The child process's work: `export()` (the manifest entry) or the reason it failed, as JSON in `result`."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # exporters chat on stdout
            entry = export()
        payload = {"ok": True, "entry": entry}
    except Exception as exc:
        traceback.print_exc()
        text = " ".join(str(exc).split()) or type(exc).__name__
        payload = {"ok": False, "reason": f"{type(exc).__name__}: {text[:400]}"}
    result.write_text(json.dumps(payload))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """OUT, --only, --force, --timeout, --list and the hidden child flags."""
    parser.add_argument("out", type=Path, nargs="?", help="folder to write NAME.onnx + NAME.npz into (outside git)")
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--force", action="store_true", help="re-export models already in OUT")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per model export")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_result", type=Path, default=None, help=argparse.SUPPRESS)


def load_manifest(out: Path) -> dict[str, Any]:
    path = out / "manifest.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    return {}


def wanted_names(only: str, specs: list) -> list[str] | None:
    """The names --only asks for, or None (after the error message) when one is unknown."""
    known = {s.name for s in specs}
    wanted = [n for n in only.split(",") if n]
    unknown = sorted(set(wanted) - known)
    if unknown:
        print(f"error: unknown model(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
        return None
    return wanted


def run_children(args: argparse.Namespace, specs: list, wanted: list[str], script: str, prefix: str,
                 python: Callable[[Any], str], kind: Callable[[Any], str], summary: Callable[[Any], str],
                 write_manifest: Callable[[dict[str, Any], dict[str, Any]], None], env: dict[str, str] | None = None,
                 in_tmp: bool = False, died: Callable[[Path], str] = lambda log: "") -> int:
    """Export every wanted spec not already in args.out (or all with --force), each in a child
    `python(spec) script OUT --_child NAME` with args.timeout; manifest.json rewritten after each."""
    known = {s.name for s in specs}
    args.out.mkdir(parents=True, exist_ok=True)
    previous = load_manifest(args.out)
    entries = {m["name"]: m for m in previous.get("models", []) if m.get("name") in known}
    failures = {f["name"]: f for f in previous.get("failures_last_run", []) if f.get("name") in known}
    selected = [s for s in specs if not wanted or s.name in wanted]
    for index, spec in enumerate(selected, 1):
        present = (args.out / f"{spec.name}.onnx").is_file() and (args.out / f"{spec.name}.npz").is_file()
        if present and spec.name in entries and not args.force:
            print(f"[{index}/{len(selected)}] {spec.name}: kept (use --force to re-export)")
            continue
        started = time.perf_counter()
        interpreter = python(spec)
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            result = Path(tmp) / "result.json"
            log = args.out / "logs" / f"{spec.name}.log"
            log.parent.mkdir(exist_ok=True)
            command = [interpreter, os.path.abspath(script), str(args.out), "--_child", spec.name,
                       "--_result", str(result)]
            try:
                if not Path(interpreter).exists():
                    raise FileNotFoundError(interpreter)
                with open(log, "w") as f:
                    subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout, check=False,
                                   env=env, cwd=tmp if in_tmp else None)
                payload = json.loads(result.read_text()) if result.is_file() else {
                    "ok": False, "reason": f"the export process died{died(log)} (see {log})"}
            except subprocess.TimeoutExpired:
                payload = {"ok": False, "reason": f"export timed out after {args.timeout} s"}
            except FileNotFoundError:
                payload = {"ok": False, "reason": f"no interpreter for {kind(spec)} at {interpreter}"}
        seconds = time.perf_counter() - started
        if payload["ok"]:
            entries[spec.name] = payload["entry"]
            failures.pop(spec.name, None)
            print(f"[{index}/{len(selected)}] {spec.name}: exported ({summary(spec)}"
                  f"{payload['entry']['node_count']} nodes, {seconds:.0f} s)", flush=True)
        else:
            entries.pop(spec.name, None)
            for stale in (args.out / f"{spec.name}.onnx", args.out / f"{spec.name}.npz"):
                stale.unlink(missing_ok=True)
            failures[spec.name] = {"name": spec.name, "exporter": kind(spec), "opset": spec.opset,
                                   "reason": payload["reason"]}
            print(f"[{index}/{len(selected)}] {spec.name}: SKIPPED: {payload['reason']}", flush=True)
        write_manifest(entries, failures)
    print(f"{len(entries)} models in {args.out}, {len(failures)} failed to export")
    return 0


def write_manifest(out: Path, specs: list, entries: dict[str, Any], failures: dict[str, Any], set_name: str,
                   description: str, environment: Any) -> None:
    """OUT/manifest.json (written atomically): the entries and failures in the specs' order."""
    order = [s.name for s in specs]
    models = sorted(entries.values(), key=lambda m: order.index(m["name"]))
    manifest = {
        "set": set_name,
        "description": description,
        "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": environment,
        "npz_format": "np.savez; keys = graph input names (seeded random inputs) + graph output names "
                      "(onnxruntime outputs)",
        "total_onnx_bytes": sum(m["file_size_bytes"] for m in models),
        "models": models,
        "failures_last_run": sorted(failures.values(), key=lambda f: order.index(f["name"])),
    }
    staged = out / "manifest.json.tmp"
    staged.write_text(json.dumps(manifest, indent=1) + "\n")
    staged.replace(out / "manifest.json")
