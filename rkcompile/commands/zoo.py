"""`rkcompile zoo`: plan (and emulate) every model of a folder per target, tabulate, and compare
with golden summaries.

Each (model, target) pair is one job, run in a worker process; a job never raises, a failure
becomes a result with its one-line error. A result's `golden` part is the small, stable summary
kept in GOLDEN_DIR as MODEL@TARGET.json (no timings, no paths); `diff_golden` compares two of
them and sorts what changed into regressions and notes.

Regressions (the run exits 1 when there is one):
  * a node of the model that ran on the NPU now runs on the CPU;
  * the arena grew by more than `arena_tolerance` (a fraction, default 2%);
  * the worst output cosine fell below `min_cosine` and below the golden's;
  * a model that planned (or emulated) now fails.
Everything else that changed (a node moved to the NPU, a smaller arena, other fusions, a new
estimate) is printed as a note.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable


GOLDEN_SCHEMA = "rkcompile.zoo-golden/1"
DEFAULT_ARENA_TOLERANCE = 0.02
DEFAULT_MIN_COSINE = 0.9999
#: Cosines are kept to this many decimals, so float noise below it never shows as a change.
COSINE_DECIMALS = 6
_SEEN = re.compile(r" \(seen: [^;]*\)")


@dataclass(frozen=True)
class Job:
    model: Path
    name: str
    target: str
    run: bool


@dataclass
class Result:
    name: str
    target: str
    golden: dict[str, Any]
    plan_seconds: float = 0.0
    run_seconds: float = 0.0
    arena_lower_bound: int = 0
    est_fps: float | None = None
    cosine_reference: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.target}"

    @property
    def error(self) -> str | None:
        return self.golden.get("error")


@dataclass
class Diff:
    key: str
    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def discover(folder: Path) -> list[tuple[Path, str]]:
    """Every .onnx file under `folder`, named by its path relative to it without the suffix."""
    return [(path, path.relative_to(folder).with_suffix("").as_posix())
            for path in sorted(folder.rglob("*.onnx"))]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def evaluate(job: Job) -> Result:
    """Plan `job.model` for `job.target` (and emulate it when `job.run`), never raising."""
    from rkcompile.plan.allocation import verify_allocation
    from rkcompile.compiler.pipeline import compile_model
    from rkcompile.plan.schema import contract_violations

    result = Result(job.name, job.target, {"schema": GOLDEN_SCHEMA, "model": job.name, "target": job.target})
    started = time.perf_counter()
    try:
        plan, ctx = compile_model(job.model, job.target)
        problems = contract_violations(plan) + verify_allocation(plan)
        if problems:
            raise AssertionError(f"the plan is unsound: {problems[0]}")
    except Exception as exc:  # a zoo row, not a crash: the run goes on
        result.golden["error"] = f"plan: {type(exc).__name__}: {one_line(exc)}"
        result.plan_seconds = time.perf_counter() - started
        return result
    result.plan_seconds = time.perf_counter() - started
    result.golden.update(plan_summary(plan))
    result.arena_lower_bound = plan.memory.lower_bound_bytes
    result.est_fps = plan.multicore.est_fps if plan.multicore and plan.multicore.est_fps else None
    if job.run:
        started = time.perf_counter()
        try:
            cosine, result.cosine_reference = worst_cosine(job.model, plan, ctx)
            result.golden["worst_cosine"] = round(cosine, COSINE_DECIMALS)
        except Exception as exc:
            result.golden["error"] = f"run: {type(exc).__name__}: {one_line(exc)}"
        result.run_seconds = time.perf_counter() - started
    return result


def plan_summary(plan) -> dict[str, Any]:
    """The stable part of a plan a golden keeps: where each node went (nodes not listed ran on
    the NPU), partitions, conversions, fusions and memory."""
    from rkcompile.passes.fusion_table import FUSED_KERNELS

    placed = [n for n in plan.nodes if n.device in ("npu", "cpu")]
    off_npu = {n.name: {"device": n.device, **({"reason": n.reason} if n.reason else {})}
               for n in plan.nodes if n.device != "npu"}
    cpu_reasons = Counter(_SEEN.sub("", n.reason or "") for n in placed if n.device == "cpu")
    fused = Counter(s.kernel for s in plan.steps if s.kernel in FUSED_KERNELS)
    return {
        "sha256": plan.model.sha256,
        "nodes": len(plan.nodes),
        "placed": len(placed),
        "npu": sum(1 for n in placed if n.device == "npu"),
        "off_npu": dict(sorted(off_npu.items())),
        "cpu_by_reason": dict(sorted(cpu_reasons.items())),
        "partitions": {device: sum(1 for p in plan.partitions if p.device == device) for device in ("npu", "cpu")},
        "conversions": sum(1 for s in plan.steps if s.device == "host"),
        "fused": dict(sorted(fused.items())),
        "steps": len(plan.steps),
        "arena_bytes": plan.memory.arena_bytes,
        "weight_bytes": plan.memory.weight_bytes,
    }


def worst_cosine(model: Path, plan, ctx) -> tuple[float, str]:
    """The lowest cosine over the outputs of the emulated plan against NAME.npz's reference
    outputs when the file beside the model has them all, else against onnxruntime; inputs from
    NAME.npz where it has them, seeded random otherwise."""
    from rkcompile.api import Plan, weight_region
    from rkcompile.emulator.closeness import agreement, onnxruntime_outputs
    from rkcompile.emulator.session import emulate, make_inputs
    from rkcompile.commands.run import load_npz

    arrays = model.with_suffix(".npz")
    given = load_npz(arrays) if arrays.is_file() else {}
    inputs = make_inputs(plan, given)
    outputs = emulate(Plan(plan, weight_region(plan, ctx.graph, ctx.target)).prepared(), inputs).outputs
    expected = {spec.name: given[spec.name] for spec in plan.model.outputs if spec.name in given}
    source = "npz"
    if len(expected) < len(plan.model.outputs):
        expected, source = onnxruntime_outputs(model, inputs), "onnxruntime"
    cosines = [agreement(name, value, expected[name]).cosine for name, value in outputs.items()]
    return min(cosines), source


Progress = Callable[[int, int, Result], None]


def run_jobs(jobs: list[Job], workers: int, progress: Progress | None = None,
             scheduler: str | None = None) -> list[Result]:
    """Every job's result in the order of `jobs`: on the Dask cluster whose scheduler is at
    `scheduler` when given, else in a local process pool of `workers` (one evaluates in this
    process)."""
    if scheduler is not None:
        return _run_on_dask(jobs, scheduler, progress)
    results: dict[int, Result] = {}
    if workers <= 1 or len(jobs) <= 1:
        for index, job in enumerate(jobs):
            results[index] = evaluate(job)
            if progress:
                progress(len(results), len(jobs), results[index])
        return [results[index] for index in range(len(jobs))]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(evaluate, job): index for index, job in enumerate(jobs)}
        return _collect(jobs, pending, as_completed(pending), progress)


def _collect(jobs: list[Job], pending: dict, finished: Iterable, progress: Progress | None) -> list[Result]:
    """The results of `pending` futures (future -> job index) as `finished` yields them; a
    future that raised (its worker died: out of memory, a signal, a lost cluster worker) is a row
    with the error, and the run goes on."""
    results: dict[int, Result] = {}
    for future in finished:
        index = pending[future]
        try:
            results[index] = future.result()
        except Exception as exc:  # noqa: BLE001  (the executor's and Dask's own classes)
            job = jobs[index]
            results[index] = Result(job.name, job.target, {
                "schema": GOLDEN_SCHEMA, "model": job.name, "target": job.target,
                "error": f"worker: {type(exc).__name__}: {one_line(exc)}"})
        if progress:
            progress(len(results), len(jobs), results[index])
    return [results[index] for index in range(len(jobs))]


#: How long connecting to a Dask scheduler may take before `--scheduler` gives up.
SCHEDULER_TIMEOUT_SECONDS = 20


def _run_on_dask(jobs: list[Job], scheduler: str, progress: Progress | None) -> list[Result]:
    """The jobs on a Dask distributed cluster (the optional extra rkcompile[dask]): each is one
    task running `evaluate` on a worker, so a worker must have rkcompile installed and see the
    models at the same paths (a shared file system)."""
    from rkcompile.errors import CompileError

    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise CompileError("--scheduler runs the zoo on a Dask cluster, which needs Dask: "
                           "pip install 'rkcompile[dask]'") from None
    try:
        client = Client(scheduler, timeout=SCHEDULER_TIMEOUT_SECONDS)
    except (OSError, TimeoutError, ValueError) as exc:
        raise CompileError(f"--scheduler: no Dask scheduler answers at {scheduler} ({one_line(exc)})") from None
    try:
        futures = client.map(evaluate, jobs, pure=False)
        return _collect(jobs, {future: index for index, future in enumerate(futures)}, dask_completed(futures),
                        progress)
    finally:
        client.close()


def progress_bar(stream=None, width: int = 30) -> Callable[[int, int, Result], None]:
    """A one-line bar redrawn in place on a terminal, one line per finished job elsewhere; on
    standard error unless `stream` says otherwise."""
    stream = stream or sys.stderr
    interactive = stream.isatty()

    def show(done: int, total: int, result: Result) -> None:
        filled = width * done // total
        status = "error" if result.error else f"{result.plan_seconds:.1f}s"
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {result.key} ({status})"
        if interactive:
            stream.write("\r\x1b[K" + line + ("\n" if done == total else ""))
        else:
            stream.write(line + "\n")
        stream.flush()

    return show


# ---- goldens -------------------------------------------------------------------------------

def golden_path(folder: Path, key: str) -> Path:
    return folder / (key.replace("/", "__") + ".json")


def golden_text(golden: dict[str, Any]) -> str:
    return json.dumps(golden, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def load_golden(folder: Path, key: str) -> dict[str, Any] | None:
    path = golden_path(folder, key)
    if not path.is_file():
        return None
    try:
        golden = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"golden {path} is not JSON ({exc})") from None
    if golden.get("schema") != GOLDEN_SCHEMA:
        raise ValueError(f"golden {path} is not a {GOLDEN_SCHEMA} summary")
    return golden


def _percent(old: float, new: float) -> str:
    return f"{100 * (new - old) / old:+.1f}%" if old else f"{old} -> {new}"


def diff_golden(key: str, old: dict[str, Any], new: dict[str, Any],
                arena_tolerance: float = DEFAULT_ARENA_TOLERANCE,
                min_cosine: float = DEFAULT_MIN_COSINE) -> Diff:
    """What changed from `old` to `new`, as regressions and notes (the module docstring
    defines which is which)."""
    diff = Diff(key)
    if old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
        diff.notes.append("the model file changed since the golden was written")
    old_error, new_error = old.get("error"), new.get("error")
    if new_error and not old_error:
        diff.regressions.append(f"now fails: {new_error}")
        return diff
    if old_error and not new_error:
        diff.notes.append(f"now succeeds (was: {old_error})")
    elif old_error and new_error:
        if old_error != new_error:
            diff.notes.append(f"still fails, now with: {new_error}")
        return diff
    if "nodes" not in old or "nodes" not in new:
        return diff  # one side failed before planning finished: nothing more to compare
    _diff_nodes(diff, old["off_npu"], new["off_npu"])
    old_arena, new_arena = old["arena_bytes"], new["arena_bytes"]
    if new_arena != old_arena:
        text = f"arena {_percent(old_arena, new_arena)} ({old_arena} -> {new_arena} bytes)"
        grew_too_much = new_arena > old_arena * (1 + arena_tolerance)
        (diff.regressions if grew_too_much else diff.notes).append(
            text + (f", beyond the {100 * arena_tolerance:g}% tolerance" if grew_too_much else ""))
    for field_name in ("partitions", "conversions", "fused", "steps", "weight_bytes"):
        if old.get(field_name) != new.get(field_name):
            diff.notes.append(f"{field_name} {_compact(old.get(field_name))} -> {_compact(new.get(field_name))}")
    old_cosine, new_cosine = old.get("worst_cosine"), new.get("worst_cosine")
    if new_cosine is not None and new_cosine != old_cosine:
        below = new_cosine < min_cosine and (old_cosine is None or new_cosine < old_cosine)
        text = f"worst cosine {old_cosine if old_cosine is not None else 'unmeasured'} -> {new_cosine}"
        (diff.regressions if below else diff.notes).append(
            text + (f", below the {min_cosine} tolerance" if below else ""))
    return diff


def _diff_nodes(diff: Diff, old: dict[str, dict], new: dict[str, dict]) -> None:
    """Nodes that changed device; a node absent from `off_npu` ran on the NPU."""
    npu = {"device": "npu"}
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, npu), new.get(name, npu)
        if before["device"] == after["device"]:
            if before.get("reason") != after.get("reason") and after["device"] == "cpu":
                diff.notes.append(f"{name} stays on the cpu for another reason ({after.get('reason')})")
            continue
        text = f"{name} moved {before['device']}->{after['device']}"
        if after.get("reason"):
            text += f" ({after['reason']})"
        (diff.regressions if before["device"] == "npu" and after["device"] == "cpu" else diff.notes).append(text)


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {v}" for k, v in sorted(value.items())) + "}"
    return str(value)


# ---- the table -----------------------------------------------------------------------------

def _kib(size: int) -> str:
    return f"{size / 1024:,.0f}K"


def render_table(results: Iterable[Result]) -> str:
    results = list(results)
    header = (f"{'model@target':34} {'nodes':>5} {'NPU %':>6} {'CPU':>4} {'parts':>7} {'conv':>4} {'fused':>5} "
              f"{'arena/LB':>18} {'est fps':>8} {'cosine':>9} {'plan s':>7}")
    lines = [header, "-" * len(header)]
    reasons = []
    for result in results:
        golden = result.golden
        if "nodes" not in golden:
            lines.append(f"{result.key:34} {result.error}")
            continue
        placed = golden["placed"] or 1
        parts = golden["partitions"]
        arena = f"{_kib(golden['arena_bytes'])}/{_kib(result.arena_lower_bound)}"
        fps = f"{result.est_fps:8.1f}" if result.est_fps else f"{'-':>8}"
        cosine = golden.get("worst_cosine")
        cosine_text = f"{cosine:9.6f}" if cosine is not None else f"{'-':>9}"
        lines.append(f"{result.key:34} {golden['nodes']:5d} {100 * golden['npu'] / placed:6.1f} "
                     f"{golden['placed'] - golden['npu']:4d} {parts['npu']:>3}/{parts['cpu']:<3} "
                     f"{golden['conversions']:4d} {sum(golden['fused'].values()):5d} {arena:>18} {fps} "
                     f"{cosine_text} {result.plan_seconds:7.2f}")
        if result.error:
            lines.append(f"{'':34} {result.error}")
        for reason, count in sorted(golden["cpu_by_reason"].items(), key=lambda kv: (-kv[1], kv[0])):
            reasons.append(f"  {result.key}: {count} x {reason}")
    if reasons:
        lines += ["", "CPU ops by reason:", *reasons]
    return "\n".join(lines)


def results_json(results: Iterable[Result], diffs: Iterable[Diff]) -> str:
    by_key = {d.key: d for d in diffs}
    rows = []
    for result in results:
        diff = by_key.get(result.key)
        rows.append({**result.golden, "plan_seconds": round(result.plan_seconds, 3),
                     "run_seconds": round(result.run_seconds, 3),
                     "lower_bound_bytes": result.arena_lower_bound, "est_fps": result.est_fps,
                     "cosine_reference": result.cosine_reference,
                     "regressions": diff.regressions if diff else [], "notes": diff.notes if diff else []})
    return json.dumps({"schema": "rkcompile.zoo-report/1", "results": rows}, indent=1) + "\n"


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def compare_with_goldens(results: list[Result], folder: Path, arena_tolerance: float,
                         min_cosine: float) -> tuple[list[Diff], list[str]]:
    """The diff of every result that has a golden, and the keys that have none."""
    diffs, missing = [], []
    for result in results:
        old = load_golden(folder, result.key)
        if old is None:
            missing.append(result.key)
            continue
        diff = diff_golden(result.key, old, result.golden, arena_tolerance, min_cosine)
        if diff.regressions or diff.notes:
            diffs.append(diff)
    return diffs, missing


def render_diffs(diffs: Iterable[Diff]) -> str:
    lines = []
    for diff in diffs:
        lines += [f"{diff.key}: REGRESSION: {text}" for text in diff.regressions]
        lines += [f"{diff.key}: {text}" for text in diff.notes]
    return "\n".join(lines)


def zoo_command(args) -> int:
    """The `rkcompile zoo` subcommand: 0 when nothing regressed, 1 when something did."""
    from rkcompile.errors import CompileError
    from rkcompile.plan.schema import write_atomically
    from rkcompile.targets import get_target

    if not args.folder.is_dir():
        raise CompileError(f"{args.folder} is not a folder")
    targets = [get_target(name).name for name in (args.target or ["rk3588"])]
    models = discover(args.folder)
    if not models:
        raise CompileError(f"no .onnx files under {args.folder}")
    if args.json is not None and not args.json.parent.is_dir():
        raise CompileError(f"--json: folder {args.json.parent} does not exist")
    if args.update_golden and args.golden is None:
        raise CompileError("--update-golden needs --golden GOLDEN_DIR")
    if args.scheduler is not None and args.jobs is not None:
        raise CompileError("--jobs and --scheduler: with a Dask scheduler its workers run the jobs; drop --jobs")
    jobs = [Job(path.resolve(), name, target, args.run) for path, name in models for target in targets]
    results = run_jobs(jobs, args.jobs or default_jobs(), progress_bar(), args.scheduler)
    print(render_table(results))
    diffs: list[Diff] = []
    if args.golden is not None:
        try:
            diffs, missing = compare_with_goldens(results, args.golden, args.arena_tolerance, args.min_cosine)
        except ValueError as exc:
            raise CompileError(str(exc)) from None
        if diffs:
            print("\nchanges against the goldens in " + str(args.golden) + ":\n" + render_diffs(diffs))
        else:
            print(f"\nno changes against the goldens in {args.golden}")
        if missing and not args.update_golden:
            print(f"no golden yet for {len(missing)}: {', '.join(missing)} (write them with --update-golden)")
        if args.update_golden:
            args.golden.mkdir(parents=True, exist_ok=True)
            for result in results:
                write_atomically(golden_path(args.golden, result.key), golden_text(result.golden))
            print(f"wrote {len(results)} goldens to {args.golden}")
    if args.json is not None:
        write_atomically(args.json, results_json(results, diffs))
    regressed = [d.key for d in diffs if d.regressions]
    if regressed and not args.update_golden:
        print(f"error: {len(regressed)} regressed: {', '.join(regressed)}", file=sys.stderr)
        return 1
    return 0
