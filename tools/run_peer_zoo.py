"""Run the peer compiler (Rockchip's rknn-toolkit2, through ../shared/peer/rknn_peer.py) on every
model of a zoo folder and keep what it placed where, per model, as JSON in the shape of
../shared/peer/zoo_rk3588.json.

    python tools/run_peer_zoo.py ZOO_DIR --python PEER_VENV/bin/python [--target rk3588]
                                 [--out tools/wide_zoo/peer_rk3588.json] [--only NAME,...]
                                 [--jobs 1] [--timeout 1800] [--sim] [--force]

rknn-toolkit2 pins old numpy/onnx/protobuf, so it lives in its own virtualenv (the recipe is at
the top of rknn_peer.py); this script only starts that venv's python on rknn_peer.py, one child
per model, and never imports the toolkit. Each build runs under `nice -n 10`. The output file is
rewritten after every model, so an interrupted run keeps what it finished; a model whose
sha256 matches its entry is not built again unless --force.

Per model: `built`, `error` (the step that failed and its message), `compute_layers_by_target`
(layers of librknnc's table other than Input/OutputOperator, by NPU/CPU), `cpu_layers`
(`OpType (FullName)` of each CPU layer), `fused_kernels` (layer op types that are not ONNX ops
of the model: ConvRelu, exNorm, ...), `compute_ops_by_target` (those layers' op types counted per
NPU/CPU: the layout layers Reshape, Transpose, ... among them), `memory` (librknnc's internal and
weight memory totals as it prints them, "2000KB"), `simulator_min_cosine` (with --sim: the worst
cosine of the simulator's outputs against onnxruntime's on the same random inputs),
`build_seconds`, and the model's `sha256`; for a model the toolkit refused for its opset and built from a
down-converted copy, `error_as_exported` and a `note`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PEER = REPO.parent / "shared" / "peer" / "rknn_peer.py"
PEER_NAME = "rknn-toolkit2 2.5.0"
OPSET_REFUSAL = re.compile(r"Unsupport onnx opset (\d+), need <= (\d+)")


def peer_result(python: str, peer: Path, model: Path, target: str, sim: bool, timeout: int) -> dict[str, Any]:
    """One model through the peer; the summary entry (never raises). The toolkit refuses opsets
    above the newest it knows ("Unsupport onnx opset 20, need <= 19!"); such a model is built
    again from a copy that onnx.version_converter brings down to that opset, as a user would
    do, and the entry keeps both the refusal and the conversion."""
    entry = _peer_build(python, peer, model, target, sim, timeout)
    refused = OPSET_REFUSAL.search(entry["error"] or "")
    if not refused:
        return entry
    newest = int(refused.group(2))
    with tempfile.TemporaryDirectory(prefix="peer_opset_") as tmp:
        converted = Path(tmp) / model.name
        try:
            import onnx
            from onnx import version_converter
            onnx.save(version_converter.convert_version(onnx.load(str(model)), newest), str(converted))
        except Exception as exc:  # the refusal stands
            entry["note"] = f"conversion to opset {newest} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            return entry
        retried = _peer_build(python, peer, converted, target, sim, timeout)
    retried["error_as_exported"] = entry["error"]
    retried["note"] = f"built from a copy converted to opset {newest} by onnx.version_converter"
    return retried


def _peer_build(python: str, peer: Path, model: Path, target: str, sim: bool, timeout: int) -> dict[str, Any]:
    command = ["nice", "-n", "10", python, str(peer), str(model), "--target", target, "--timeout", str(timeout)]
    if sim:
        command.append("--sim")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 120, check=False)
        report = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except subprocess.TimeoutExpired:
        return _failed(f"timeout: no result within {timeout + 120} s")
    except json.JSONDecodeError:
        report = None
    if report is None:
        tail = " ".join((done.stderr or "").split())[-300:]
        return _failed(f"the peer printed no result (exit {done.returncode}): {tail}")
    return summarize(report)


def _failed(error: str) -> dict[str, Any]:
    return {"built": False, "error": error, "compute_layers_by_target": {}, "cpu_layers": [], "fused_kernels": [],
            "simulator_min_cosine": None, "build_seconds": None}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """rknn_peer.py's report reduced to the zoo_rk3588.json entry."""
    error = None
    if not report.get("ok"):
        # the toolkit's own error line ("build: IndexError: ..."), else the failed step's last line
        failed = next(((step, rc) for step, rc in report.get("steps", {}).items() if rc not in (0, "ok", None)),
                      None)
        if report.get("errors"):
            error = report["errors"][0][:300]
        elif failed:
            step, rc = failed
            lines = [line.strip() for line in str(rc).splitlines() if line.strip()]
            error = f"{step}: {lines[-1] if lines else rc}"
        else:
            error = f"the peer's worker exited with {report.get('worker_rc')}"
    cosines = [e["cosine"] for e in report.get("sim_vs_onnxruntime", []) if e.get("cosine") is not None]
    counts = report.get("counts", {})
    entry = {
        "built": bool(report.get("ok")),
        "error": error,
        "compute_layers_by_target": counts.get("compute_by_target", {}),
        "cpu_layers": counts.get("cpu_layers", []),
        "fused_kernels": report.get("fused_op_types", []),
        "simulator_min_cosine": min(cosines) if cosines else None,
        "build_seconds": report.get("build_seconds"),
    }
    if report.get("layers"):  # per target, the layer table's op types and their counts (layout layers among them)
        ops: dict[str, dict[str, int]] = {}
        for layer in report["layers"]:
            if layer.get("op_type") not in ("InputOperator", "OutputOperator"):
                per_target = ops.setdefault(str(layer.get("target")), {})
                per_target[layer["op_type"]] = per_target.get(layer["op_type"], 0) + 1
        entry["compute_ops_by_target"] = {t: dict(sorted(c.items())) for t, c in sorted(ops.items())}
    if report.get("memory"):  # librknnc's "Total Internal/Weight Memory Size" lines, as printed ("2000KB")
        entry["memory"] = report["memory"]
    return entry


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(out: Path, results: dict[str, Any]) -> None:
    staged = out.with_name(out.name + ".tmp")
    staged.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    staged.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zoo", type=Path, help="folder of NAME.onnx models")
    parser.add_argument("--python", default=os.environ.get("RKNN_PEER_PYTHON"),
                        help="the peer venv's python (default: $RKNN_PEER_PYTHON)")
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER, help=f"rknn_peer.py (default: {DEFAULT_PEER})")
    parser.add_argument("--target", default="rk3588")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: tools/wide_zoo/peer_TARGET.json)")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--jobs", type=int, default=1, help="peer builds at once")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per build")
    parser.add_argument("--sim", action="store_true", help="also run the peer's simulator against onnxruntime")
    parser.add_argument("--force", action="store_true", help="rebuild models whose entry is up to date")
    args = parser.parse_args(argv)
    if not args.python or not Path(args.python).is_file():
        print("error: the peer venv's python is needed: --python PATH or RKNN_PEER_PYTHON "
              "(recipe at the top of ../shared/peer/rknn_peer.py)", file=sys.stderr)
        return 2
    if not args.peer.is_file():
        print(f"error: {args.peer} not found (--peer)", file=sys.stderr)
        return 2
    if not args.zoo.is_dir():
        print(f"error: {args.zoo} is not a folder", file=sys.stderr)
        return 2
    out = args.out or REPO / "tools" / "wide_zoo" / f"peer_{args.target}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"peer": PEER_NAME, "target": args.target, "dtype": "float16", "models": {}}
    if out.is_file():
        try:
            previous = json.loads(out.read_text())
            if previous.get("target") == args.target:
                results["models"] = previous.get("models", {})
        except json.JSONDecodeError:
            pass
    wanted = {n for n in args.only.split(",") if n}
    models = [p for p in sorted(args.zoo.glob("*.onnx")) if not wanted or p.stem in wanted]
    if wanted - {p.stem for p in models}:
        print(f"error: not in {args.zoo}: {', '.join(sorted(wanted - {p.stem for p in models}))}", file=sys.stderr)
        return 2
    todo = []
    for path in models:
        digest = _sha256(path)
        if not args.force and results["models"].get(path.stem, {}).get("sha256") == digest:
            print(f"{path.stem}: up to date")
            continue
        todo.append((path, digest))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(peer_result, args.python, args.peer, path, args.target, args.sim, args.timeout):
                   (path, digest) for path, digest in todo}
        for future in as_completed(futures):
            path, digest = futures[future]
            entry = {**future.result(), "sha256": digest}
            results["models"][path.stem] = entry
            results["models"] = dict(sorted(results["models"].items()))
            _write(out, results)
            state = (f"built, {entry['compute_layers_by_target']}" if entry["built"]
                     else f"FAILED: {entry['error']}")
            print(f"{path.stem}: {state}", flush=True)
    print(f"{len(results['models'])} models in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
