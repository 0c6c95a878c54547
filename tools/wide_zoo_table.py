"""The wide-zoo measure: plan every model of a zoo folder for several targets and print one
markdown row per model with the nodes, our CPU nodes, the peer's CPU layers, internal errors per
target, and the three biggest causes of our CPU nodes (grouped by op).

    python tools/wide_zoo_table.py ZOO_DIR [--target rk3588 --target rk3576 --target rk3562]
                                   [--peer tools/wide_zoo/peer_rk3588.json] [--only NAME,...]
                                   [--jobs 1] [--timeout 600] [--json OUT.json] [--causes OUT.md]
                                   [--rows-from EARLIER.json]

Each (model, target) plan runs in its own child process (`--_one`), so a crash, a hang past
--timeout or a runaway allocation costs one cell, reported as an error, never the table. A plan
that raises, or whose plan breaks `contract_violations`/`verify_allocation`, is an internal
error: its exception type, text and the innermost rkcompile frame are kept. The rkcompile that
plans is whichever the running python imports (run it with /work/main's `python3` to measure
main as it lands).

Columns: `nodes` are the ONNX graph's nodes as the plan lists them; `CPU` are the placed nodes
on the CPU at each target; `peer CPU` the peer's CPU compute layers at rk3588 (its layer table
counts fused kernels, so the numbers are comparable, not identical); `errors` the targets whose
plan failed; `top CPU causes (rk3588)` the ops with the most CPU nodes, each with its most
common reason shortened. --causes writes the CPU causes over the whole zoo, by op and full
reason, with the models they come from.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TARGETS = ("rk3588", "rk3576", "rk3562")
DEFAULT_PEER = REPO / "tools" / "wide_zoo" / "peer_rk3588.json"
#: the parts of a reason that name one node's values, dropped so equal rules group together
_VALUES = re.compile(r" \(seen: [^;]*\)")


# --------------------------------------------------------------------------- child: one plan
def plan_one(model: Path, target: str) -> dict[str, Any]:
    """Plan `model` for `target` in this process; a summary dict, never raising."""
    started = time.perf_counter()
    try:
        from rkcompile.plan.allocation import verify_allocation
        from rkcompile.compiler.pipeline import compile_model
        from rkcompile.plan.schema import contract_violations
        plan, _ = compile_model(model, target)
        problems = contract_violations(plan) + verify_allocation(plan)
        if problems:
            raise AssertionError(f"the plan is unsound: {problems[0]}")
    except Exception as exc:  # the measure reports it; the table goes on
        return {"error": _describe_exception(exc), "seconds": round(time.perf_counter() - started, 2)}
    cpu = [n for n in plan.nodes if n.device == "cpu"]
    return {
        "error": None,
        "nodes": len(plan.nodes),
        "placed": sum(1 for n in plan.nodes if n.device in ("npu", "cpu")),
        "cpu": len(cpu),
        "cpu_nodes": [{"name": n.name, "op": n.op, "reason": _VALUES.sub("", n.reason or "")} for n in cpu],
        "seconds": round(time.perf_counter() - started, 2),
    }


def _describe_exception(exc: BaseException) -> str:
    """`Type: text (at file:line in function)`, the innermost frame inside rkcompile or passes/."""
    text = " ".join(str(exc).split()) or "(no message)"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/rkcompile/" in f.filename or "/passes/" in f.filename or "/targets/" in f.filename]
    where = ""
    if ours or frames:
        frame = (ours or frames)[-1]
        parts = Path(frame.filename).parts
        where = f" (at {'/'.join(parts[-2:])}:{frame.lineno} in {frame.name})"
    return f"{type(exc).__name__}: {text[:400]}{where}"


# --------------------------------------------------------------------------- parent
def run_plan(model: Path, target: str, timeout: int) -> dict[str, Any]:
    """One plan in a child process. An ImportError is retried once: measured against a checkout
    that others land into, a child can start while files are being replaced."""
    result = _run_child(model, target, timeout)
    if (result.get("error") or "").startswith(("ImportError", "ModuleNotFoundError")):
        time.sleep(10)
        result = _run_child(model, target, timeout)
    return result


def _run_child(model: Path, target: str, timeout: int) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--_one", str(model), target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout: no plan within {timeout} s"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = " ".join(done.stderr.split())[-300:]
        return {"error": f"the planning process died (exit {done.returncode}): {tail}"}


def short_reason(reason: str) -> str:
    """A reason's rule in a few words, for the table: the text after 'OP on TARGET[ (runs as K)]: '
    up to the end of the rule's title (its first ':', ';' or sentence end) or its source bracket."""
    rule = reason.split(": ", 1)[1] if ": " in reason else reason
    rule = re.split(r": |; |(?<=[a-z0-9)])\. | \((?:oplist|seed|RKNN)", rule, maxsplit=1)[0]
    return rule if len(rule) <= 70 else rule[:67] + "..."


def top_causes(cpu_nodes: list[dict[str, str]], count: int = 3) -> list[tuple[str, int, str]]:
    """The `count` ops with the most CPU nodes: (op, nodes, the op's most common reason)."""
    by_op: dict[str, Counter] = defaultdict(Counter)
    for node in cpu_nodes:
        by_op[node["op"]][node["reason"]] += 1
    ranked = sorted(by_op.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    return [(op, sum(reasons.values()), reasons.most_common(1)[0][0]) for op, reasons in ranked[:count]]


def peer_cpu(peer: dict[str, Any], model: str) -> str:
    entry = peer.get("models", {}).get(model)
    if entry is None:
        return "-"
    if not entry.get("built"):
        return "fails"
    return str(entry.get("compute_layers_by_target", {}).get("CPU", 0))


def render(rows: list[dict[str, Any]], targets: list[str], peer: dict[str, Any]) -> str:
    first = targets[0]
    head = (["model", "nodes"] + [f"CPU {t}" for t in targets] + [f"peer CPU ({peer.get('target', '?')})",
                                                                    "errors", f"top CPU causes ({first})"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        plans = row["plans"]
        nodes = next((str(p["nodes"]) for p in plans.values() if not p.get("error")), "?")
        cpu = [("ERR" if plans[t].get("error") else str(plans[t]["cpu"])) for t in targets]
        errors = ", ".join(t for t in targets if plans[t].get("error")) or ""
        causes = "; ".join(f"{op} x{n}: {short_reason(reason)}" for op, n, reason in
                           top_causes(plans[first].get("cpu_nodes", [])))
        cells = [row["model"], nodes] + cpu + [peer_cpu(peer, row["model"]), errors, causes]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def render_errors(rows: list[dict[str, Any]], targets: list[str]) -> str:
    out = []
    for row in rows:
        for target in targets:
            error = row["plans"][target].get("error")
            if error:
                out.append(f"- {row['model']}@{target}: {error}")
    return "\n".join(out)


def render_causes(rows: list[dict[str, Any]], target: str) -> str:
    """CPU nodes over the whole zoo at `target`, by op and full reason, most first."""
    grouped: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for row in rows:
        for node in row["plans"][target].get("cpu_nodes", []):
            grouped[(node["op"], node["reason"])][row["model"]] += 1
    ranked = sorted(grouped.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    lines = [f"| nodes | op | reason ({target}) | models |", "|---|---|---|---|"]
    for (op, reason), models in ranked:
        where = ", ".join(f"{m} {n}" for m, n in models.most_common())
        lines.append(f"| {sum(models.values())} | {op} | {reason.replace('|', '/')} | {where} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--_one"]:
        print(json.dumps(plan_one(Path(argv[1]), argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zoo", type=Path)
    parser.add_argument("--target", action="append", default=None, help="repeatable (default: rk3588 rk3576 rk3562)")
    parser.add_argument("--peer", type=Path, default=DEFAULT_PEER, help=f"peer results (default: {DEFAULT_PEER})")
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--jobs", type=int, default=1, help="plans at once")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per plan")
    parser.add_argument("--json", type=Path, default=None, help="write every row, with CPU nodes and reasons")
    parser.add_argument("--causes", type=Path, default=None, help="write the zoo-wide CPU causes (markdown)")
    parser.add_argument("--rows-from", type=Path, default=None,
                        help="render the rows of an earlier --json instead of planning (e.g. with newer peer results)")
    args = parser.parse_args(argv)
    targets = args.target or list(DEFAULT_TARGETS)
    if args.rows_from is None and not args.zoo.is_dir():
        print(f"error: {args.zoo} is not a folder", file=sys.stderr)
        return 2
    peer: dict[str, Any] = {}
    if args.peer.is_file():
        try:
            peer = json.loads(args.peer.read_text())
        except json.JSONDecodeError as exc:
            print(f"error: {args.peer}: not JSON ({exc})", file=sys.stderr)
            return 2
    if args.rows_from is not None:
        try:
            earlier = json.loads(args.rows_from.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: {args.rows_from}: {exc}", file=sys.stderr)
            return 2
        return report(earlier["rows"], earlier["targets"], peer, args)
    wanted = {n for n in args.only.split(",") if n}
    models = [p for p in sorted(args.zoo.glob("*.onnx")) if not wanted or p.stem in wanted]
    if not models:
        print(f"error: no .onnx models in {args.zoo}" + (f" named {args.only}" if wanted else ""), file=sys.stderr)
        return 2
    rows = {p.stem: {"model": p.stem, "plans": {}} for p in models}
    jobs = [(p, t) for p in models for t in targets]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_plan, p, t, args.timeout): (p, t) for p, t in jobs}
        for done, future in enumerate(as_completed(futures), 1):
            path, target = futures[future]
            result = future.result()
            rows[path.stem]["plans"][target] = result
            state = result["error"] if result.get("error") else f"{result['cpu']} CPU"
            print(f"[{done}/{len(jobs)}] {path.stem}@{target}: {state}", file=sys.stderr, flush=True)
    return report([rows[p.stem] for p in models], targets, peer, args)


def report(rows: list[dict[str, Any]], targets: list[str], peer: dict[str, Any], args) -> int:
    print(render(rows, targets, peer))
    errors = render_errors(rows, targets)
    if errors:
        print("\nInternal errors:\n" + errors)
    if args.json:
        args.json.write_text(json.dumps({"targets": targets, "rows": rows}, indent=1) + "\n")
    if args.causes:
        args.causes.write_text(render_causes(rows, targets[0]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
