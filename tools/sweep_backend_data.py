"""Run onnx's backend test cases through the emulator: every case must come out right or be
refused with a clean error.

    python tools/sweep_backend_data.py --node [--sample N] [--only REGEX] [-v] [--target T]
    python tools/sweep_backend_data.py [pytorch-converted pytorch-operator ...] [-v]
        [--upgrade-opset 13]

`--node` generates onnx's operator test cases (onnx/backend/test/case/node, about 1,900; the
wheel ships their generators, not their data) and runs each as `rkcompile run --inputs X.npz
--check` would: the inputs go through an npz and `load_npz`, the model is planned and the plan
executed on the emulator. Each case is classified:

    pass     every output matches: integer, bool and other non-float outputs exactly; float
             outputs within the case's own tolerance or float32 rounding (FLOAT32_MAX_REL), or
             float16's (NODE_FLOAT16_*) for a float16 output or when the plan runs any step on
             the NPU (also against onnxruntime on the inputs rounded to float16, which is what
             the NPU is given); random ops' outputs by shape and dtype; the few cases whose
             expected output reads the spec otherwise than onnxruntime and PyTorch
             (DISPUTED_EXPECTATIONS) against onnxruntime
    wrong    a plan ran and an output differs (or is missing): a silent wrong answer
    refused  a clean `error:` (a CompileError, as the CLI prints it)
    crash    any other exception, or no answer within NODE_TIMEOUT_SECONDS

It prints one line per wrong or crash case (every case with -v), the refusals grouped by
reason, and the counts; exits 1 when any case is wrong or crashed. `--sample N` runs the fixed
stratified sample the fast test uses (`node_sample`).

Without `--node` it runs the backend data onnx ships (pytorch-converted, pytorch-operator):
every case the planner accepts must match at float16 (cosine >= 0.9999 per output). Most of
these cases are opset 6, which the planner takes as it is; `--upgrade-opset N` first converts
each model with onnx.version_converter (a different model, reported as such). Most are one op,
which stays on the NPU: island pruning never moves the NPU part that reads model inputs or
writes outputs."""
from __future__ import annotations

import argparse
import io
import os
import random
import re
import signal
import sys
import tempfile
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from rkcompile.options import Options
from rkcompile.api import prepare
from rkcompile.emulator import agreement, emulate, make_inputs, onnxruntime_outputs
from rkcompile.commands.run import load_npz, save_npz
from rkcompile.errors import CompileError

DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
MIN_COSINE = 0.9999
FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_TINIEST = float(np.finfo(np.float16).smallest_subnormal)


@dataclass(frozen=True)
class Outcome:
    case: str
    #: "pass", "fail", "not planned", "planner error", or "outside float16" (data float16 cannot hold: some
    #: pytorch-operator cases are uninitialised float64 memory, 1e-309 to 1e228)
    status: str
    detail: str = ""


def load_tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def run_case(case: Path, upgrade_opset: int | None = None, target: str = "rk3588") -> Outcome:
    model = case / "model.onnx"
    with tempfile.TemporaryDirectory() as folder:
        if upgrade_opset is not None:
            try:
                converted = onnx.version_converter.convert_version(onnx.load(str(model)), upgrade_opset)
            except Exception as exc:  # the converter's own limits: the case is not planned
                return Outcome(case.name, "not planned", f"version_converter: {exc}")
            try:  # the converter does not adapt every op (opset-6 PRelu's per-channel slope)
                ReferenceEvaluator(converted).run(None, dict(zip([i.name for i in converted.graph.input],
                                                                  load_tensors(case / "test_data_set_0", "input"))))
            except Exception as exc:
                return Outcome(case.name, "not planned", f"the converted model fails in onnx.reference: {exc}")
            model = Path(folder) / "model.onnx"
            onnx.save(converted, str(model))
        try:
            prepared = prepare(model, target, Options())
        except CompileError as exc:
            return Outcome(case.name, "not planned", str(exc))
        except Exception as exc:  # a planner bug is reported, not fatal to the sweep
            return Outcome(case.name, "planner error", f"{type(exc).__name__}: {exc}")
    dataset = case / "test_data_set_0"
    values = load_tensors(dataset, "input")
    expected = load_tensors(dataset, "output")
    largest = max((float(np.abs(v).max()) for v in values + expected if v.size and v.dtype.kind == "f"), default=0.0)
    if largest > FLOAT16_MAX or 0 < largest < FLOAT16_TINIEST:
        return Outcome(case.name, "outside float16", f"data reaches {largest:.3g}")
    inputs = {spec.name: value for spec, value in zip(prepared.plan.model.inputs, values)}
    try:
        outputs = emulate(prepared, inputs).outputs
    except Exception as exc:  # a failing case is reported, the sweep goes on
        return Outcome(case.name, "fail", f"{type(exc).__name__}: {exc}")
    worst = min((agreement(spec.name, outputs[spec.name], want)
                 for spec, want in zip(prepared.plan.model.outputs, expected)), key=lambda a: a.cosine)
    detail = f"{worst.output} cosine {worst.cosine:.6f} max abs {worst.max_abs:.3g}"
    return Outcome(case.name, "pass" if worst.cosine >= MIN_COSINE else "fail", detail)


def sweep(collection: str, upgrade_opset: int | None = None) -> list[Outcome]:
    return [run_case(case, upgrade_opset) for case in sorted((DATA / collection).iterdir())
            if (case / "model.onnx").is_file()]


#: float16 tolerance for float outputs of plans with NPU steps or NPU tensors: the cosine `rkcompile run --check`
#: asks, and every element within 1% of the output's range (a cosine cannot see a scale error)
NODE_FLOAT16_MIN_COSINE = 0.9999
NODE_FLOAT16_MAX_REL = 1e-2
#: float32 rounding of a long computation (DFT, STFT): errors within this share of the output's
#: range, where the case's element-wise tolerance fails on the elements near zero
FLOAT32_MAX_REL = 1e-5
#: a case that plans and runs for longer than this is a hang (a user would see no answer)
NODE_TIMEOUT_SECONDS = 120


class CaseTimeout(Exception):
    pass


def node_cases(only: str | None = None) -> list:
    """onnx's operator test cases, generated by the installed onnx, sorted by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the generators overflow casts on purpose
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    pattern = re.compile(only) if only else None
    return sorted((c for c in cases if pattern is None or pattern.search(c.name)), key=lambda c: c.name)


def node_sample(cases: list, size: int, seed: int = 0) -> list:
    """A fixed sample of `size` cases stratified by operator: operators drawn in a seeded order,
    one case of each, round after round, so every operator is sampled before any twice."""
    by_op: dict[str, list] = defaultdict(list)
    for case in cases:
        by_op[case_operator(case)].append(case)
    rng = random.Random(seed)
    ops = sorted(by_op)
    rng.shuffle(ops)
    for op in ops:
        rng.shuffle(by_op[op])
    chosen: list = []
    for round_ in range(max(map(len, by_op.values()), default=0)):
        chosen += [by_op[op][round_] for op in ops if round_ < len(by_op[op])]
    return sorted(chosen[:size], key=lambda c: c.name)


def case_operator(case) -> str:
    """The operator a case tests: its one node's op, or the first op of an expanded function."""
    nodes = case.model.graph.node
    return nodes[-1].op_type if len(nodes) == 1 or not case.name.endswith("_expanded") else \
        case.name.removeprefix("test_").split("_")[0]


def outputs_match(actual: np.ndarray, expected: np.ndarray, on_npu: bool, rtol: float, atol: float) -> str | None:
    """None when `actual` is a right answer for `expected`, else how it differs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    floating = expected.dtype.kind == "f" or expected.dtype.name in FLOAT_LIKE
    if not floating:
        same = np.array_equal(actual.astype(expected.dtype), expected) if actual.dtype != expected.dtype \
            else np.array_equal(actual, expected)
        return None if same else f"{expected.dtype} values differ ({int((actual != expected).sum())} elements)"
    a, b = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(b)
    if not np.array_equal(a[~finite], b[~finite], equal_nan=True) or not np.isfinite(a[finite]).all():
        return "NaN or infinity where the expected output has none (or the reverse)"
    a, b = a[finite], b[finite]
    if np.allclose(a, b, rtol=rtol, atol=atol):
        return None
    found = agreement("", a, b)
    if found.max_rel <= FLOAT32_MAX_REL:
        return None
    half = on_npu or expected.dtype.itemsize <= 2  # computed on the NPU, or a float16/bfloat16 output
    if half and found.cosine >= NODE_FLOAT16_MIN_COSINE and found.max_rel <= NODE_FLOAT16_MAX_REL:
        return None
    return f"cosine {found.cosine:.6f} max abs {found.max_abs:.3g} max rel {found.max_rel:.3g}"


#: ml_dtypes' float formats that numpy sees as void (bfloat16, the float8s): compared as floats
FLOAT_LIKE = {"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
              "float8_e8m0fnu", "float4_e2m1fn"}


def as_array(value) -> np.ndarray | None:
    """A case's input or output as an array (some are TensorProtos or numpy scalars); None for
    what an npz cannot hold (sequences, absent optionals)."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    return None


def as_output(value) -> np.ndarray | list | None:
    """An expected output: an array, or a sequence as a list of arrays; None for what the
    emulator holds no value for (an absent optional)."""
    if isinstance(value, list):
        items = [as_array(item) for item in value]
        return None if any(item is None for item in items) else items
    return as_array(value)


def sequences_match(actual, expected: list, on_npu: bool, rtol: float, atol: float) -> str | None:
    """None when the sequence `actual` holds a right answer for each tensor of `expected`."""
    if not isinstance(actual, list) or len(actual) != len(expected):
        return f"a sequence of {len(expected)} tensors expected, got {type(actual).__name__}" + \
            (f" of {len(actual)}" if isinstance(actual, list) else "")
    problems = [outputs_match(a, b, on_npu, rtol, atol) for a, b in zip(actual, expected)]
    return next((f"tensor {i}: {p}" for i, p in enumerate(problems) if p), None)


def as_saved(value: np.ndarray) -> np.ndarray:
    """How a user saves an input to an npz that loads without unpickling: strings as numpy's
    fixed-width unicode instead of Python objects."""
    return value.astype(np.str_) if value.dtype == object else value


def _raise_timeout(signum, frame):
    raise CaseTimeout(f"no answer within {NODE_TIMEOUT_SECONDS} s")


def run_node_case(case, target: str = "rk3588") -> Outcome:
    """Plan and emulate one node test case as `rkcompile run --inputs X.npz --check` would."""
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(NODE_TIMEOUT_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run_node_case(case, target)
    except CompileError as exc:
        return Outcome(case.name, "refused", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except Exception as exc:  # noqa: BLE001  (everything else is what the CLI reports as an internal error)
        return Outcome(case.name, "crash", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _run_node_case(case, target: str) -> Outcome:
    model = case.model
    initializers = {t.name for t in model.graph.initializer}
    input_names = [v.name for v in model.graph.input if v.name not in initializers]
    output_names = [v.name for v in model.graph.output]
    datasets = [([as_array(v) for v in inputs], [as_output(v) for v in outputs]) for inputs, outputs in case.data_sets]
    feedable = all(v is not None for inputs, outputs in datasets for v in inputs + outputs)
    first_inputs = datasets[0][0]
    shapes = {name: tuple(value.shape) for name, value in zip(input_names, first_inputs)
              if value is not None and not _static_shape(model, name)}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{case.name}.onnx"
        onnx.save(model, str(path))
        prepared = prepare(path, target, Options(input_shapes=shapes))
        if not feedable:
            return Outcome(case.name, "refused", "a sequence input or an absent optional, which an npz cannot hold")
        # values pass through the NPU's float16 when a step runs there or a tensor is stored there
        # (a relabel aliased in place runs no step, yet its tensor is the NPU's)
        on_npu = any(step.device == "npu" for step in prepared.plan.steps) or any(
            tensor.region == "arena" and tensor.dtype in ("float16", "bfloat16")
            for tensor in prepared.plan.tensors.values())
        random_op = any(n.op_type in RANDOM_OPS or (n.op_type == "Dropout" and len(n.input) > 2 and n.input[2])
                        for n in model.graph.node)  # Dropout with a training_mode input may draw a mask
        for inputs, outputs in datasets:
            npz = Path(folder) / "inputs.npz"
            save_npz(npz, {name: as_saved(value) for name, value in zip(input_names, inputs)})
            given = make_inputs(prepared.plan, load_npz(npz))
            results = emulate(prepared, given).outputs
            if case.name in DISPUTED_EXPECTATIONS:
                outputs = [onnxruntime_outputs(path, given)[name] for name in output_names]
            for name, want in zip(output_names, outputs):
                if name not in results:
                    return Outcome(case.name, "wrong", f"output {name} is missing")
                if random_op:
                    problem = None if results[name].shape == want.shape and results[name].dtype == want.dtype \
                        else f"{results[name].dtype} {list(results[name].shape)}, expected {want.dtype} {list(want.shape)}"
                elif isinstance(want, list):
                    problem = sequences_match(results[name], want, on_npu, case.rtol, case.atol)
                else:
                    problem = outputs_match(results[name], want, on_npu, case.rtol, case.atol)
                if problem and on_npu and outputs_match(results[name], float16_expectation(path, given)[name],
                                                        on_npu, case.rtol, case.atol) is None:
                    problem = None
                if problem:
                    return Outcome(case.name, "wrong", f"{name}: {problem}" + (" (NPU)" if on_npu else " (CPU)"))
    return Outcome(case.name, "pass", ("NPU" if on_npu else "CPU") + (", random: shape and dtype" if random_op else "")
                   + (", against onnxruntime" if case.name in DISPUTED_EXPECTATIONS else ""))


#: cases whose expected output reads the spec otherwise than onnxruntime and PyTorch do; the
#: emulator runs them on onnxruntime, so they are compared with onnxruntime's outputs instead
DISPUTED_EXPECTATIONS = {
    # Resize align_corners divides by length_resized - 1, "the length of the resized tensor": the
    # expected [1, 3.142857] takes the fractional 4 * 0.6 = 2.4, onnxruntime and PyTorch the
    # tensor's 2 and give [1, 4]
    "test_resize_downsample_scales_linear_align_corners", "test_resize_downsample_scales_cubic_align_corners",
}

#: ops whose outputs are random draws: only their shape and dtype can be checked
RANDOM_OPS = {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}


def float16_expectation(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for the float inputs rounded to float16, as the NPU stores them:
    what a float16 plan can be asked for when the inputs carry more precision (Softmax of
    [10000, 10001, 10002], which float16 holds as [10000, 10000, 10000])."""
    rounded = {name: value.astype(np.float16).astype(value.dtype) if value.dtype in (np.float32, np.float64)
               else value for name, value in inputs.items()}
    return onnxruntime_outputs(model, rounded)


def _static_shape(model: onnx.ModelProto, name: str) -> bool:
    value = next(v for v in model.graph.input if v.name == name)
    tensor_type = value.type.tensor_type
    return tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                                 for d in tensor_type.shape.dim)


def refusal_reason(detail: str) -> str:
    """A refusal's message with names and numbers blanked, to group refusals by reason."""
    detail = re.sub(r"'[^']*'|\"[^\"]*\"|/\S+", "'…'", detail)
    return re.sub(r"\d+(\.\d+)?", "N", detail)[:110]


def node_main(args: argparse.Namespace) -> int:
    cases = node_cases(args.only)
    if args.sample:
        cases = node_sample(cases, args.sample)
    outcomes = []
    for case in cases:
        outcome = run_node_case(case, args.target)
        outcomes.append(outcome)
        if args.verbose or outcome.status in ("wrong", "crash"):
            print(f"{outcome.case}: {outcome.status}: {outcome.detail}", flush=True)
    reasons = Counter(refusal_reason(o.detail) for o in outcomes if o.status == "refused")
    if reasons:
        print("refused, by reason:")
        for reason, count in reasons.most_common():
            print(f"  {count:4d}  {reason}")
    counts = Counter(o.status for o in outcomes)
    print(f"{len(outcomes)} node cases at {args.target}: "
          + ", ".join(f"{counts[s]} {s}" for s in ("pass", "wrong", "refused", "crash")))
    return 1 if counts["wrong"] or counts["crash"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("collections", nargs="*", default=["pytorch-converted", "pytorch-operator"])
    parser.add_argument("-v", "--verbose", action="store_true", help="print passes and planner refusals too")
    parser.add_argument("--upgrade-opset", type=int, metavar="N", help="convert each model to opset N first")
    parser.add_argument("--node", action="store_true", help="onnx's operator test cases instead of the shipped data")
    parser.add_argument("--sample", type=int, metavar="N", help="--node: the fixed stratified sample of N cases")
    parser.add_argument("--only", metavar="REGEX", help="--node: the cases whose name matches")
    parser.add_argument("--target", default="rk3588", help="--node: the target (default rk3588)")
    args = parser.parse_args()
    if args.node:
        return node_main(args)
    failed = 0
    for collection in args.collections:
        outcomes = sweep(collection, args.upgrade_opset)
        for outcome in outcomes:
            if args.verbose or outcome.status in ("fail", "planner error"):
                print(f"{collection}/{outcome.case}: {outcome.status}: {outcome.detail}")
        planned = [o for o in outcomes if o.status in ("pass", "fail")]
        passed = sum(o.status == "pass" for o in planned)
        failed += len(planned) - passed
        skipped = {status: sum(o.status == status for o in outcomes) for status in ("not planned", "outside float16", "planner error")}
        print(f"{collection}: {passed}/{len(planned)} planned cases pass ({len(outcomes)} cases; "
              + ", ".join(f"{count} {status}" for status, count in skipped.items()) + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
