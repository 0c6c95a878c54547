"""The public Python API (docs/api.md): plan a model, save and load the plan, execute it.

    import rkcompile
    plan = rkcompile.compile("model.onnx", target="rk3588", dtype="int8", calibration="calib/")
    plan.save("model.rkplan")
    outputs = rkcompile.run(rkcompile.load("model.rkplan"), {"images": x})

A `Plan` is the plan record (`rkcompile.plan.schema.PlanRecord`, the JSON contract) with its weight region;
`run` executes exactly that, so a saved plan runs the same in any process without the model.
"""
from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import functools
import io
import multiprocessing
import os
import re
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Iterator, Mapping, Sequence

import numpy as np
import threadpoolctl

from rkcompile.plan import artifact
from rkcompile.options import Options
from rkcompile.plan.cpu_partitions import cpu_partition_models
from rkcompile.emulator.accuracy import StepAccuracy, analyse
from rkcompile.emulator.closeness import agreement
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.emulator.kernels.conv import tap_means
from rkcompile.numerics import float16 as half
from rkcompile.emulator.session import Prepared, check_plan, emulate, make_inputs, plan_mismatch
from rkcompile.emulator.storage import EmulationError, Storage
from rkcompile.emulator.worker import RunWorker, WorkerGone
from rkcompile.errors import CompileError
from rkcompile.numerics.dtypes import FLOAT_DTYPES
from rkcompile.plan.plain_nodes import Constant, Node, is_constant, node_inputs
from rkcompile.plan.operations import rebuild
from rkcompile.plan.schema import PlanRecord, Quantization
from rkcompile.quantization.params import quantize
from rkcompile.targets import get_target
from rkcompile.targets.model import Target

if TYPE_CHECKING:  # planning only: loading and running a saved plan imports no compiler module
    import onnx_graphsurgeon as gs

    from rkcompile.compiler.context import CompileContext

__all__ = ["Options", "Plan", "Runtime", "accuracy_analysis", "compile", "load", "run", "targets"]


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A compiled execution plan: `record` (steps with their operations, tensors and offsets,
    partitions, memory, quantization; docs/plan-schema.md) and `weights`, the weight region's
    bytes. `reference_nodes` are the planned graph's steps with the model's own weights (accuracy
    analysis runs them as its float reference): from the compile, or rebuilt from a loaded
    artifact's operations and its `reference_weights.npz`; None when the artifact has none."""

    record: PlanRecord
    weights: bytes | None
    reference_nodes: Sequence[Node] | None = dataclasses.field(default=None, repr=False)
    _prepared: list = dataclasses.field(default_factory=list, repr=False)  # the one Prepared, made on first run

    @property
    def target(self) -> str:
        return self.record.target

    @property
    def dtype(self) -> str:
        return self.record.dtype

    def save(self, path: str | Path) -> Path:
        """Write the plan artifact (.rkplan: plan.json, weights.bin, cpu/*.onnx) to `path`."""
        if self.weights is None:
            raise CompileError("this plan was read from a JSON file and has no weight region to save")
        models = cpu_partition_models(self.record, self.step_nodes())
        artifact.save(artifact.Artifact(self.record, self.weights,
                                        {pid: model.SerializeToString() for pid, model in models.items()},
                                        self._reference_weights()), path)
        return Path(path)

    def _reference_weights(self) -> bytes | None:
        """The plan's weights as the model holds them (an .npz), from the reference nodes."""
        if self.reference_nodes is None:
            return None
        weights = {t.name: np.asarray(t.values) for node in self.reference_nodes for t in node_inputs(node)
                   if isinstance(t, Constant) and getattr(self.record.tensors.get(t.name), "region", None) == "weight"}
        buffer = io.BytesIO()
        np.savez(buffer, **weights)
        return buffer.getvalue()

    def summary(self) -> str:
        """The text `rkcompile plan` prints."""
        from rkcompile.views.summary import render_summary

        return render_summary(self.record)

    def partition_graph(self):
        """The partitions and steps as a networkx DiGraph, with their device, kernel, tensors,
        bytes and estimated time (rkcompile/views/partition_graph.py); networkx loads here."""
        from rkcompile.views.partition_graph import partition_graph

        return partition_graph(self.record)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (`rkcompile.plan/2`), without the weight region."""
        return self.record.to_dict()

    def step_nodes(self) -> list[Node]:
        """Each step's node as the emulator executes it: rebuilt from its operation, weights read
        from the weight region."""
        prepared = self.prepared()
        with prepared.lock:
            return prepared.executor().step_nodes()

    def prepared(self) -> Prepared:
        if self.weights is None:
            raise CompileError("this plan was read from a JSON file and has no weight region: compile the model, "
                               "or load an .rkplan file")
        if not self._prepared:
            self._prepared.append(Prepared(self.record, self.weights, self.reference_nodes))
        return self._prepared[0]


def compile(model: str | Path, target: str = "rk3588", options: Options | None = None, **kwargs: Any) -> Plan:
    """Plan `model` for `target`. Options come as an `Options` or as its fields by keyword
    (dtype="int8", calibration="calib/", batch=2, core_mask="0_1_2", input_shapes={...}, ...).
    A failure's message names these parameters, not the command line's flags."""
    try:
        return plan_model(model, target, _options(options, kwargs))
    except CompileError as exc:
        exc.args = (in_api_terms(str(exc)),)
        raise


def plan_model(model: str | Path, target: str, options: Options) -> Plan:
    """`compile` with its Options made, for the command line: failures name its flags."""
    from rkcompile.compiler.idle_npu import refuse_idle_npu
    from rkcompile.compiler.pipeline import compile_model

    plan = plan_of(*compile_model(model, target, options, runtime=EMULATOR_RUNTIME, choose_int8=True))
    refuse_idle_npu(plan.record)
    return plan


#: the command line's planning flags and the API parameter each sets
FLAG_PARAMETERS = {"--target": "target", "--dtype": "dtype", "--batch": "batch", "--core-mask": "core_mask",
                   "--input-shape": "input_shapes", "--calib": "calibration", "--val": "validation",
                   "--calib-method": "calibration_method",
                   "--mean-values": "mean_values", "--std-values": "std_values", "--channel-order": "channel_order",
                   "--float16": "float16_tensors", "--auto-float16": "auto_float16", "--equalization": "equalization",
                   "--bias-correction": "bias_correction", "--dump-after": "dump_after", "--dump-dir": "dump_dir",
                   "--verify-passes": "verify_passes"}


def in_api_terms(message: str) -> str:
    """A planning failure's message with each command-line flag it names replaced by the API
    parameter that flag sets (`--calib` -> `calibration`): the passes speak the command line's
    language, which a caller of `compile` never typed."""
    return re.sub(r"--[a-z][a-z0-9-]*[a-z0-9]", lambda flag: FLAG_PARAMETERS.get(flag[0], flag[0]), message)


#: rknn-toolkit2's config/build/load_onnx keywords and what rkcompile.compile takes instead
RKNN_KEYWORDS = {"dataset": "calibration='dataset.txt' (or a folder or .npz of samples)",
                 "target_platform": "target='rk3588'", "do_quantization": "dtype='int8'",
                 "quantized_algorithm": "calibration_method='minmax' (or 'mmse', 'kl', 'percentile')",
                 "quantized_method": "nothing: weights are quantized per channel",
                 "quantized_dtype": "dtype='int8'", "rknn_batch_size": "batch=N",
                 "quant_img_RGB2BGR": "channel_order='BGR'", "input_size_list": "input_shapes={'name': (1, 3, 224, 224)}",
                 "inputs": "input_shapes={'name': (1, 3, 224, 224)}", "float_dtype": "dtype='float16'"}


def plan_of(record: PlanRecord, ctx: CompileContext) -> Plan:
    """The Plan of a compile's record and context: its weight region and reference nodes."""
    by_name = {node.name: node for node in ctx.graph.nodes}
    return Plan(record, weight_region(record, ctx.graph, ctx.target),
                _reference_nodes(record, [by_name[name] for name in ctx.order], ctx.reference_constants))


class EmulatorRuntime:
    """The emulator as the runtime an int8 compile calibrates and judges its candidates on
    (rkcompile/compiler/context.py `Runtime`): the planned graph in float32 on its float kernels
    (`FloatReference`, the accuracy analysis's reference), candidate plans executed as planned."""

    def float_graph(self, nodes: Sequence[Node], devices: Sequence[str], opset: int, outputs: Sequence[str],
                    observed: Collection[str] | None = None) -> FloatReference:
        return FloatReference(nodes, devices, opset, outputs, observed)

    def tap_means(self, conv: gs.Node, x: np.ndarray, kernel: Sequence[int]) -> np.ndarray:
        return tap_means(conv, x, kernel)

    def runnable(self, record: PlanRecord, ctx: CompileContext) -> Plan:
        return plan_of(record, ctx)

    def run(self, plan: Plan, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return emulate(plan.prepared(), inputs).outputs

    def run_ahead(self, plan: Plan, inputs: Mapping[str, np.ndarray]) -> Future:
        """`run` in a second process (rkcompile/emulator/worker.py: two threads of this one run
        two plans little faster than one), sent the plan once; on a thread of this process
        when there is no second processor or the worker is gone, through a second Prepared of
        the plan (runs of one Prepared take turns: they share its executor's regions)."""
        worker = _run_worker()
        if worker is None:
            return _run_here(plan, inputs)
        done: Future = Future()

        def settle(sent: Future) -> None:
            if not sent.cancelled() and isinstance(sent.exception(), WorkerGone):
                _chain(_run_here(plan, inputs), done)
            else:
                _chain(sent, done)

        worker.submit(worker.token(plan), plan.record, plan.weights, inputs).add_done_callback(settle)
        return done

    @contextlib.contextmanager
    def two_at_a_time(self) -> Iterator[None]:
        """The worker process started (`run_ahead`), and this process's BLAS kept to one thread
        (threadpoolctl) until the context ends, as the worker's is: two processes running
        resnet18_halfwidth's int8 plan at once, each with OpenBLAS's default threads on the
        2-core test machine, took 330 ms a run; with one thread each, 27 ms."""
        _run_worker()
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            yield

    def step_drops(self, plan: Plan, inputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        rows, _ = analyse(plan.prepared(), inputs, single=False)
        return {row.output: row.drop for row in rows}

    def cosine(self, name: str, actual, expected) -> float:
        return agreement(name, actual, expected).cosine


#: what `compile` and the command line pass an int8 compile
EMULATOR_RUNTIME = EmulatorRuntime()


#: process id -> the thread `EmulatorRuntime.run_ahead` runs on without a worker
_AHEAD_THREADS: dict[int, ThreadPoolExecutor] = {}


def _ahead() -> ThreadPoolExecutor:
    """This process's run-ahead thread, made on first use: a forked child (a `zoo` pool worker,
    which runs ahead on it) makes its own, as the parent's executor counts a thread the fork did
    not copy and would never start one to run the child's work."""
    pid = os.getpid()
    if pid not in _AHEAD_THREADS:
        _AHEAD_THREADS[pid] = ThreadPoolExecutor(1, thread_name_prefix="rkcompile-run-ahead")
    return _AHEAD_THREADS[pid]


def _run_here(plan: Plan, inputs: Mapping[str, np.ndarray]) -> Future:
    """`run` on the run-ahead thread of this process, through the plan's second Prepared."""
    if len(plan._prepared) < 2:
        plan.prepared()
        plan._prepared.append(Prepared(plan.record, plan.weights, plan.reference_nodes))
    return _ahead().submit(lambda: emulate(plan._prepared[1], inputs).outputs)


#: process id -> the worker process `EmulatorRuntime.run_ahead` sends runs to (None: none)
_RUN_WORKERS: dict[int, RunWorker | None] = {}


def _run_worker() -> RunWorker | None:
    """This process's worker process, started on first use: a forked child starts its own (the
    parent's pipes and the threads that serve them are the parent's). None on a machine of one
    processor, where a second process has no processor of its own, and in a process that
    multiprocessing started (a `rkcompile zoo` pool worker, a Dask worker), one of several that
    share the processors already."""
    pid = os.getpid()
    if pid not in _RUN_WORKERS:
        _RUN_WORKERS[pid] = None
        if (os.cpu_count() or 1) >= 2 and multiprocessing.parent_process() is None:
            try:
                _RUN_WORKERS[pid] = RunWorker()
            except OSError:  # no interpreter to start (an embedded Python)
                pass
    return _RUN_WORKERS[pid]


def _chain(source: Future, target: Future) -> None:
    """Complete `target` as `source` completes."""
    def copy(done: Future) -> None:
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())
        else:
            target.set_result(done.result())
    source.add_done_callback(copy)


def _reference_nodes(record: PlanRecord, planned: list[gs.Node], model_values: Mapping[str, np.ndarray]) -> list[Node]:
    """The steps as the float reference runs them: the planned nodes as plain nodes, except that
    a step reading a constant the plan changed away from the model's float semantics (a
    corrected bias) is rebuilt from its operation with the model's value."""
    from rkcompile.ir.nodes import plain_nodes

    nodes = plain_nodes(planned)
    if not model_values:
        return nodes
    originals = {name: Constant(name, np.asarray(value)) for name, value in model_values.items()}
    constants = {t.name: t for node in nodes for t in node_inputs(node) if isinstance(t, Constant)}
    lookup = {**constants, **originals}.get
    return [rebuild(step.operation, lookup) if any(t.name in originals for t in node_inputs(node)) else node
            for step, node in zip(record.steps, nodes)]


def load(path: str | Path) -> Plan:
    """A saved plan: an .rkplan artifact (runs as saved), or a plan JSON file (for reading only)."""
    saved = artifact.load(path)
    if saved.weights is not None:
        check_plan(saved.plan)
    reference = None if saved.reference_weights is None else SavedReference(saved.plan, saved.reference_weights)
    return Plan(saved.plan, saved.weights, reference)


class SavedReference(collections.abc.Sequence):
    """A loaded plan's `reference_nodes`, rebuilt from the steps' operations and the artifact's
    reference_weights.npz on first use: accuracy analysis needs them, running never does, and
    reading them was most of the time `load` took."""

    def __init__(self, record: PlanRecord, weights: bytes | artifact.DeferredMember):
        self.record, self.weights = record, weights

    @functools.cached_property
    def nodes(self) -> list[Node]:
        weights = self.weights.read() if isinstance(self.weights, artifact.DeferredMember) else self.weights
        with np.load(io.BytesIO(weights), allow_pickle=False) as stored:
            constants = {name: Constant(name, stored[name]) for name in stored.files}
        return [rebuild(step.operation, constants.get) for step in self.record.steps]

    def __getitem__(self, index):
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.record.steps)


def run(plan: Plan, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Execute `plan` on the emulator: the outputs by name. Inputs it does not name are seeded
    random (`seed`). A step whose float16 result overflowed to infinities is a RuntimeWarning
    naming the step."""
    prepared = plan.prepared()
    execution = emulate(prepared, _inputs(plan.record, inputs, seed))
    for note in execution.overflows:
        warnings.warn(f"float16 overflow at {note}", RuntimeWarning, stacklevel=2)
    return execution.outputs


class Runtime:
    """A plan made ready to execute once and run many times (rknn-toolkit2's `init_runtime`, then
    `inference`): construction decodes the weights, rebuilds the step nodes and works out what
    each step reads and how it runs, the first run makes the CPU steps' onnxruntime sessions, and
    every run reuses them and the plan's regions (they are the plan's: see `Plan.prepared`, which
    `rkcompile.run` uses too). Safe to share between threads: the runs of one plan take turns."""

    def __init__(self, plan: Plan):
        self.plan = plan
        prepared = plan.prepared()
        with prepared.lock:
            prepared.executor()

    def run(self, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """The outputs by name, as `rkcompile.run(plan, inputs, seed)` gives them."""
        return run(self.plan, inputs, seed)


def accuracy_analysis(plan: Plan, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> list[StepAccuracy]:
    """Each step's outputs against the planned graph run in float32 (rknn-toolkit2's
    accuracy_analysis): cosine, max abs error and the cosine the step itself loses."""
    rows, _ = analyse(plan.prepared(), _inputs(plan.record, inputs, seed))
    return rows


def _inputs(record: PlanRecord, given: Mapping[str, np.ndarray] | None, seed: int) -> dict[str, np.ndarray]:
    """The model inputs: the given ones, seeded random for the rest; a name that is no model
    input is refused rather than silently replaced by random values."""
    names = [spec.name for spec in record.model.inputs]
    unknown = sorted(set(given or {}) - set(names))
    if unknown:
        raise CompileError(f"{unknown[0]!r} is not an input of the model (inputs: {', '.join(names)})")
    return make_inputs(record, given or {}, seed)


def targets() -> list[Target]:
    """Every SoC rkcompile plans for, with its figures."""
    from rkcompile.targets import all_targets

    return all_targets()


def _options(options: Options | None, overrides: Mapping[str, Any]) -> Options:
    options = options or Options()
    known = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        hint = (f": rknn-toolkit2's {unknown[0]}; rkcompile.compile takes {RKNN_KEYWORDS[unknown[0]]}"
                if unknown[0] in RKNN_KEYWORDS else "")
        raise CompileError(f"unknown option {unknown[0]!r}{hint} (options: {', '.join(sorted(known))})")
    converted = dict(overrides)
    for name in ("calibration", "validation", "dump_dir"):
        if converted.get(name) is not None:
            converted[name] = Path(converted[name])
    if "input_shapes" in converted:
        converted["input_shapes"] = {name: tuple(shape) for name, shape in converted["input_shapes"].items()}
    for name in ("dump_after", "float16_tensors"):
        if name in converted:
            converted[name] = tuple(converted[name])
    for name in ("mean_values", "std_values"):  # one number for every channel, or a sequence
        if name in converted:
            converted[name] = _per_channel(name, converted[name])
    options = dataclasses.replace(options, **converted)
    if isinstance(options.batch, bool) or not isinstance(options.batch, int) or options.batch < 1:
        raise CompileError(f"batch={options.batch!r}: the images per batch, a positive integer "
                           "(rknn-toolkit2's rknn_batch_size)")
    return options


def _per_channel(name: str, values: Any) -> tuple[float, ...]:
    """mean_values or std_values: one number for every channel, or one per channel; rknn-toolkit2's
    list per input ([[123.675, 116.28, 103.53]]) is taken for a single list."""
    if isinstance(values, (list, tuple)) and any(np.ndim(v) for v in values):  # a list per input
        if len(values) != 1:
            raise CompileError(f"{name}: one number per channel, e.g. {name}=(123.675, 116.28, 103.53), for every "
                               f"image input (rknn-toolkit2's list per input: give one list)")
        values = values[0]
    try:
        return tuple(float(v) for v in (values if np.ndim(values) else [values]))
    except (TypeError, ValueError):
        raise CompileError(f"{name}: numbers, one per channel or one for all, not {values!r}") from None


def prepare(model: str | Path, target: str, options: Options | None = None,
            saved_plan: str | Path | None = None) -> Prepared:
    """Plan `model` and make it ready to execute. With `saved_plan` (a plan JSON file), that
    plan is the one executed, after checking it describes the same execution as a fresh plan;
    its weight region is laid out from the model's weights at the saved offsets."""
    fresh = plan_model(model, target, options or Options())
    if saved_plan is None:
        check_plan(fresh.record)
        return fresh.prepared()
    saved = artifact.load(saved_plan).plan
    mismatch = plan_mismatch(saved, fresh.record)
    if mismatch:
        raise EmulationError(f"--plan {saved_plan} does not match {model} planned for {target}: {mismatch}")
    if any(step.operation is None for step in saved.steps):  # plan/1: operations from the fresh plan
        saved = dataclasses.replace(saved, steps=tuple(
            dataclasses.replace(old, operation=new.operation) for old, new in zip(saved.steps, fresh.record.steps)))
    check_plan(saved)
    constants = {t.name: t for node in fresh.reference_nodes for t in node.inputs if isinstance(t, Constant)}
    return Prepared(saved, _encode_weights(saved, constants), fresh.reference_nodes)


def weight_region(plan: PlanRecord, graph: gs.Graph, target: Target) -> bytes:
    """The weight region's bytes: every weight of the plan from the graph's constants, written
    at its offset in its planned layout and dtype (quantized where the plan says)."""
    constants = {name: tensor for name, tensor in graph.tensors().items() if is_constant(tensor)}
    return _encode_weights(plan, constants, target)


#: (id of a weight's float array, its parameters) -> its integers, while that array lives: an
#: int8 choice's candidate plans read the model's constant arrays themselves (the quantize
#: pass replaces the ones it changes) with mostly the same weight parameters, so each weight
#: is quantized once rather than once per candidate
_QUANTIZED_WEIGHTS: dict[tuple[int, Quantization], np.ndarray] = {}


def _quantized_weight(values: np.ndarray, quant: Quantization) -> np.ndarray:
    """quantize(values, quant), read-only, made once while `values` lives."""
    key = (id(values), quant)
    found = _QUANTIZED_WEIGHTS.get(key)
    if found is None:
        found = np.asarray(quantize(values, quant))  # storage writes arrays alike
        found.flags.writeable = False
        _QUANTIZED_WEIGHTS[key] = found
        weakref.finalize(values, _QUANTIZED_WEIGHTS.pop, key, None)
    return found


def _encode_weights(plan: PlanRecord, constants: Mapping[str, gs.Constant | Constant], target: Target | None = None) -> bytes:
    storage = Storage(plan, target or get_target(plan.target))
    for name, tensor in plan.tensors.items():
        if tensor.region != "weight":
            continue
        if name not in constants:
            raise EmulationError(f"weight {name} is not a constant of the model")
        value = np.asarray(constants[name].values)
        quant = plan.quantization.get(name)
        if quant is not None:
            value = _quantized_weight(value, quant)
        elif tensor.dtype in FLOAT_DTYPES:  # the layout pass warns about each constant this changes
            value = half.saturate(value, tensor.dtype)
        storage.write(name, value)
    return storage.regions["weight"].tobytes()
