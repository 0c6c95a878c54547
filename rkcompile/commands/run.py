"""`rkcompile run`: plan (or load a saved plan), emulate, write the outputs, compare and report.

The command line's layer: `cli.py` parses the flags and builds the Options; everything below
goes through the library (`rkcompile.api`), which executes a plan and its weight region."""
from __future__ import annotations

import argparse
import hashlib
import ast
import io
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from rkcompile.api import load, prepare
from rkcompile.options import Options
from rkcompile.emulator.accuracy import analyse, render
from rkcompile.emulator.closeness import agreement, onnxruntime_outputs
from rkcompile.emulator.session import Prepared, emulate, make_inputs
from rkcompile.emulator.storage import EmulationError
from rkcompile.errors import CompileError
from rkcompile.compiler.idle_npu import refuse_idle_npu
from rkcompile.plan.schema import STDOUT, write_atomically
from rkcompile.targets import get_target


#: --check's default tolerance per plan dtype: float16 rounding, and the issue's int8 bar
DEFAULT_MIN_COSINE = {"float16": 0.9999, "int8": 0.99}


def run_command(args: argparse.Namespace, options: Options) -> int:
    to_stdout = [option for option, path in (("--json", args.json), ("--outputs", args.outputs))
                 if path is not None and str(path) == STDOUT]
    if len(to_stdout) > 1:
        raise CompileError("--json - and --outputs - both ask for standard output; send one to a file")
    # With a file on standard output, what a person reads goes to standard error.
    text = sys.stderr if to_stdout else sys.stdout
    images = getattr(args, "image_preprocessing", None)
    arrays = _load_inputs(args.inputs) if args.inputs is not None and images is None else None
    prepared = _prepared(args, options)
    refuse_idle_npu(prepared.plan)
    refuse_arena_beyond_memory(prepared.plan, available_memory())
    given = {} if arrays is None else match_inputs(args.inputs, arrays, prepared.plan)
    if images is not None:
        given = image_input(args.inputs, prepared.plan, images)
    inputs = make_inputs(prepared.plan, given, args.seed)
    if given and set(inputs) - set(given):
        print(f"note: seeded random values for {', '.join(sorted(set(inputs) - set(given)))} "
              f"(not in {args.inputs})", file=sys.stderr)
    started = time.perf_counter()
    steps = None
    if args.accuracy_analysis:
        steps, execution = analyse(prepared, inputs)
        print(render(steps), file=text)
    else:
        execution = emulate(prepared, inputs)
    seconds = time.perf_counter() - started
    if args.outputs is not None:
        save_npz(args.outputs, execution.outputs)
    report = {"model": str(args.model if args.model is not None else prepared.plan.model.path), "target": prepared.plan.target, "dtype": prepared.plan.dtype,
              "steps": len(prepared.plan.steps), "arena_bytes": prepared.plan.memory.arena_bytes,
              "seconds": round(seconds, 4), "fallbacks": execution.fallbacks,
              "dynamic_tensors": execution.dynamic_tensors, "float16_overflows": execution.overflows,
              "random_inputs": sorted(set(inputs) - set(given))}
    if steps is not None:
        report["accuracy_analysis"] = [row.to_dict() for row in steps]
    min_cosine = args.min_cosine if args.min_cosine is not None else DEFAULT_MIN_COSINE[prepared.plan.dtype]
    status = 0
    if args.check:
        expected = {spec.name: given[spec.name] for spec in prepared.plan.model.outputs if spec.name in given}
        source = "inputs file"
        if len(expected) < len(prepared.plan.model.outputs):
            if args.model is None:
                raise CompileError("--check: --inputs holds no reference outputs, and onnxruntime needs the MODEL")
            expected, source = onnxruntime_outputs(args.model, inputs), "onnxruntime"
        agreements = [agreement(name, value, expected[name]) for name, value in execution.outputs.items()]
        passed = all(a.passes(min_cosine) for a in agreements)
        report.update(reference=source, min_cosine=min_cosine, passed=passed,
                      agreement=[a.to_dict() for a in agreements])
        print(f"{'output':32} {'cosine':>12} {'max abs':>12} {'max rel':>12}  (vs {source})", file=text)
        for a in agreements:
            verdict = "ok" if a.passes(min_cosine) else f"FAIL (< {min_cosine})"
            print(f"{a.output[:32]:32} {a.cosine:12.8f} {a.max_abs:12.4g} {a.max_rel:12.4g}  {verdict}", file=text)
        status = 0 if passed else 1
    else:
        print(f"ran {len(prepared.plan.steps)} steps in {seconds:.3f}s; outputs: "
              + ", ".join(f"{n} {shape_text(v)}" for n, v in execution.outputs.items()), file=text)
    for fallback in execution.fallbacks:
        print(f"note: onnx.reference computed {fallback}", file=text)
    for overflow in execution.overflows:
        print(f"warning: float16 overflow at {overflow}", file=sys.stderr)
    if args.json is not None:
        write_atomically(args.json, json.dumps(report, indent=1) + "\n")
    return status


def _prepared(args: argparse.Namespace, options: Options) -> Prepared:
    """What `run` executes: a saved artifact as it is (checked against MODEL when one is given),
    a JSON plan checked against a fresh plan of MODEL, or a fresh plan of MODEL; every one
    through the same executor, on the plan's operations and weight region."""
    saved = None if args.plan is None else load(args.plan)
    if saved is not None and saved.weights is not None:
        if args.model is not None:
            digest = _sha256(Path(args.model))
            if digest != saved.record.model.sha256:
                raise EmulationError(f"--plan {args.plan} was planned from another model than {args.model}")
        if args.target is not None and get_target(args.target).name != saved.target:
            raise EmulationError(f"--plan {args.plan} was planned for {saved.target}, not {args.target}")
        _refuse_contradicting_flags(args, saved.record)
        return saved.prepared()
    if args.model is None or args.target is None:
        raise CompileError("run needs MODEL and --target (or --plan PLAN.rkplan, a saved plan artifact)")
    return prepare(args.model, args.target, options, args.plan)


def _refuse_contradicting_flags(args: argparse.Namespace, record) -> None:
    """An artifact runs as it was planned: a planning flag that restates the artifact is
    harmless, one that differs (or asks to calibrate or reshape again) would be silently
    ignored, so it is refused."""
    planned_shapes = {spec.name: tuple(spec.shape) for spec in record.model.inputs}
    planned = {"--dtype": (record.dtype, record.dtype), "--batch": (record.batch, record.batch),
               "--input-shape": (planned_shapes, " ".join(map(shape_flag, planned_shapes.items())))}
    for flag, value in getattr(args, "planning_flags", {}).items():
        if flag == "--input-shape":  # [(name, dims)], restating some inputs' planned shapes or not
            restated = all(planned_shapes.get(name) == tuple(dims) for name, dims in value)
            shown = " ".join(map(shape_flag, value))
        else:
            restated = flag in planned and value == planned[flag][0]
            shown = value if not isinstance(value, list) else " ".join(map(str, value))
        if restated:
            continue
        was = f" (planned with {planned[flag][1]})" if flag in planned else ""
        raise CompileError(f"{flag} {shown} contradicts --plan {args.plan}{was}: a saved artifact runs as planned; "
                           f"plan the model again with {flag} instead")


def shape_flag(shape: tuple[str, tuple[int, ...]]) -> str:
    """An input shape as --input-shape takes it: NAME:d0,d1,..."""
    name, dims = shape
    return f"{name}:{','.join(map(str, dims))}"


def refuse_arena_beyond_memory(plan, available: int | None) -> None:
    """The emulator allocates the plan's arena (with the CPU steps' region) whole before the
    first step: an arena larger than the memory the process can have (a plan from elsewhere, or
    a hostile one) is refused in one line instead of failing deep in numpy or waking the OOM
    killer. `available` None: unknown."""
    arena, cpu = plan.memory.arena_bytes, plan.memory.cpu_arena_bytes
    if available is not None and arena + cpu > available:
        held = f" and its CPU tensors {cpu} bytes" if cpu else ""
        raise EmulationError(f"the plan's arena is {arena} bytes ({arena / 2**20:.1f} MiB){held}, more than the "
                             f"{available} bytes ({available / 2**20:.1f} MiB) of memory available to run it")


def available_memory() -> int | None:
    """Bytes this process could still allocate: the system's available memory (/proc/meminfo's
    MemAvailable, else the free pages), capped by the cgroup's limit less its use; None when
    neither can be read."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            found += [int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _sha256(path: Path) -> str:
    """The model file's sha256, as a plan records it."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise CompileError(f"cannot read {path}: {exc.strerror}") from None


def image_input(path: Path, plan, images) -> dict[str, np.ndarray]:
    """--inputs as an image: the value of a single-input model's input, read as --calib reads an
    image (`ImagePreprocessing` from --mean-values, --std-values and --channel-order)."""
    from rkcompile.quantization.params import read_image

    if len(plan.model.inputs) != 1:
        raise EmulationError(f"--inputs: {path} is an image but the model has {len(plan.model.inputs)} inputs "
                             f"({', '.join(spec.name for spec in plan.model.inputs)}); give an .npz keyed by input name")
    if not path.is_file():
        raise EmulationError(f"--inputs: {path} does not exist")
    spec = plan.model.inputs[0]
    return {spec.name: read_image(path, spec, images, str(path), flag="--inputs")}


def _load_inputs(path: Path) -> np.ndarray | dict[str, np.ndarray]:
    """--inputs as the file holds it: one array (.npy) or arrays keyed by name (.npz)."""
    if path.suffix.lower() != ".npy":
        return load_npz(path)
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise EmulationError(f"--inputs: {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise EmulationError(f"--inputs: {path} is not an .npy array ({exc})") from None


def match_inputs(path: Path, arrays: np.ndarray | dict[str, np.ndarray], plan) -> dict[str, np.ndarray]:
    """--inputs keyed by the model's names, never guessed: one .npy array is the input of a
    single-input model; an .npz names model inputs (and, for --check, reference outputs), and a
    key that is neither, or a file naming none of the inputs, is refused (random values in
    their place would make the comparison meaningless)."""
    names = [spec.name for spec in plan.model.inputs]
    expected = ", ".join(names)
    if isinstance(arrays, np.ndarray):
        if len(names) != 1:
            raise EmulationError(f"--inputs: {path} holds one array but the model has {len(names)} inputs "
                                 f"({expected}); give an .npz keyed by input name")
        return {names[0]: arrays}
    outputs = {spec.name for spec in plan.model.outputs}
    unknown = sorted(set(arrays) - set(names) - outputs)
    if unknown:
        raise EmulationError(f"--inputs: {path} holds {', '.join(map(repr, unknown))}, which the model does not "
                             f"name; expected inputs: {expected}")
    if not set(arrays) & set(names):
        raise EmulationError(f"--inputs: {path} holds none of the model's inputs; expected inputs: {expected}")
    return arrays


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, by name. An array numpy cannot type (bfloat16, float8 and int4
    saved from ml_dtypes arrays: numpy writes void or a descriptor it cannot read back, like
    float8_e5m2's '<f1') comes back as raw items of its size; `make_inputs` gives them the
    input's type."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {member[:-len(".npy")]: read_npy(archive.read(member))
                    for member in archive.namelist() if member.endswith(".npy")}
    except FileNotFoundError:
        raise EmulationError(f"--inputs: {path} does not exist") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise EmulationError(f"--inputs: {path} is not an .npz archive ({exc})") from None
    except (ValueError, SyntaxError) as exc:
        raise EmulationError(f"--inputs: {path} cannot be read: {exc}") from None


def read_npy(data: bytes) -> np.ndarray:
    try:
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        if "Object arrays" in str(exc):
            raise ValueError("it holds an object array (strings?), which --inputs does not load: "
                             "loading one would unpickle") from None
        if "descr" not in str(exc):
            raise
    stream = io.BytesIO(data)
    major, _ = np.lib.format.read_magic(stream)
    length = int.from_bytes(stream.read(2 if major == 1 else 4), "little")
    header = ast.literal_eval(stream.read(length).decode("latin1"))
    descr, shape = header["descr"], tuple(header["shape"])
    if not isinstance(descr, str) or not descr[-1:].isdigit():
        raise ValueError(f"an array of unknown dtype {descr!r}")
    raw = np.frombuffer(stream.read(), np.dtype(f"V{int(descr.lstrip('<>|=')[1:])}"))
    return raw.reshape(shape, order="F" if header["fortran_order"] else "C")


def shape_text(value) -> str:
    """[2, 3] for an array, a sequence as the list of its tensors' shapes, 'none' for an empty optional."""
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return f"sequence of {[list(np.shape(item)) for item in value]}"
    return str(list(np.shape(value)))


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez through write_atomically's temporary-file discipline, in bytes. A sequence
    output is saved as one array per tensor, NAME[0], NAME[1], ...; an empty optional not at all."""
    flat = {}
    for name, value in arrays.items():
        if isinstance(value, (list, tuple)):
            flat.update((f"{name}[{index}]", item) for index, item in enumerate(value))
        elif value is not None:
            flat[name] = value
    buffer = io.BytesIO()
    np.savez(buffer, **flat)
    write_atomically(path, buffer.getvalue())
