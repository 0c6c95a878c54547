"""`rkcompile.export` (`rkcompile export`): the planned graph as standard ONNX for rknn-toolkit2
(docs/deploy.md), checked against the original model on onnxruntime before it is written.

The graph is the plan's (rkcompile/views/standard_onnx.py): what the passes made of the model
after folding, simplifying and legalizing, which the toolkit builds where it fails on the
original (yolov8n in the dev zoo). An input that only selects a branch can be frozen to a value
first, so the branch folds away. Nothing is written unless the file agrees with the original.
An int8 plan is written with its quantization as QuantizeLinear/DequantizeLinear pairs
(`views.qdq.quantize_dequantize`), which rknn-toolkit2 builds without calibrating; it is
checked against the emulator's prediction for the plan instead.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx

from rkcompile.api import Plan, compile, run
from rkcompile.options import Options
from rkcompile.emulator.closeness import Agreement, agreement, onnxruntime_outputs
from rkcompile.emulator.executor import Executor
from rkcompile.emulator.session import make_inputs
from rkcompile.quantization.params import dequantize, quantize
from rkcompile.errors import CompileError
from rkcompile.targets import get_target
from rkcompile.plan.aliases import viewed_indices
from rkcompile.plan.schema import QUANTIZED_DTYPES, write_atomically
from rkcompile.views.host_tail import SELECTIONS
from rkcompile.views.partitioned_onnx import host_renames
from rkcompile.views.standard_onnx import MAX_OPSET, export_summary, host_tail_summary, standard_model

#: the largest difference an export may show against the original, relative to each output's
#: largest magnitude: float16's machine epsilon. The rewrites are exact in real arithmetic; in
#: float32 they differ by rounding (a reduction in another order), far below it.
FLOAT16_TOLERANCE = 2.0 ** -10
#: the tolerance is relative to an output's largest magnitude, or to this when that is smaller:
#: onnxruntime's own error on the activations it approximates is absolute (its Sigmoid gives 0
#: and 2.1e-7 for logits of -16.3458 and -16.3459, where the sigmoid is 8e-8), and on an output
#: of magnitude 1e-4 (a text detector's map on noise) more than 2^-10 of it; 2^-10 of 2^-12 is
#: 2^-22, twice that error
SMALLEST_JUDGED_MAGNITUDE = 2.0 ** -12
#: ops whose result is a choice among their input's elements (host_tail's SELECTIONS, and those
#: choosing which survive): two graphs equal up to float32 rounding may choose differently among
#: near-tied scores
SELECTION_OPS = SELECTIONS | {"NonZero", "NonMaxSuppression", "Unique"}
#: an output computed from such a choice is judged by its cosine against the original instead
#: (the bar issue #37 sets for the toolkit's simulator): RT-DETR's 300 queries, taken by TopK
#: from scores that differ by 1e-6, swap a few near-tied ones
SELECTED_MIN_COSINE = 0.9999
#: an int8 export's outputs may differ from the emulator's prediction for the plan by this much of
#: cosine against the original (each on onnxruntime): the file computes the plan's arithmetic,
#: but onnxruntime rounds a requantization in float32 where the emulator uses the NPU's
#: fixed-point multiplier, so a value here and there lands one int8 step apart. Judged where not
#: every step could be compared with the file's (`refuse_int8_export`)
INT8_COSINE_TOLERANCE = 0.002
#: an int8 step of the export computes the plan's step when, run on the file's own values of its
#: inputs, its output integers differ from the emulator's for the step on the same values in at
#: most this share of elements (or STEP_DIFFERING_ELEMENTS, for a small tensor): onnxruntime's
#: float32 requantization lands a value at a tie one step apart here and there (at most 0.51% of
#: a step's integers on 34 zoo models: timm_convnext_atto's ConvAdd, yolov8n's Softmax 0.49%),
#: where a quantization point the file adds or leaves out moves a sixth or more, another zero
#: point all
STEP_DIFFERING_SHARE = 0.02
STEP_DIFFERING_ELEMENTS = 2


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """How `export` writes and checks the file (the compile's own settings are `Options`).

    `freeze_inputs`: input name -> the value it is fixed to (a number fills the input's shape),
    folded into the graph before planning; the file no longer has that input. `inputs`: the
    arrays the check runs on (seeded random for the inputs it does not name, `seed`).
    `tolerance`: the largest difference from the original accepted, relative to each output's
    largest magnitude, or to SMALLEST_JUDGED_MAGNITUDE when that is smaller (a float plan; an
    output computed from a selection, TopK's indices say, passes at cosine SELECTED_MIN_COSINE
    too). `int8_tolerance`: for an int8 plan, the largest difference accepted
    between each output's cosine against the original and the emulator's for the plan, where
    not every step of the plan could be compared with the file's (`compare_steps`).
    `max_opset`: a model of a newer ai.onnx opset is converted down to it. `host_tail`: a graph
    with tensors of data-dependent shape (a detector's NMS) is written as its static NPU part and,
    in OUT.host.onnx (`host_path`), the rest for onnxruntime on the host, instead of refused; so
    is a static graph's Reshape into an output that rknn-toolkit2 would run on its CPU (a YOLO
    head's [1, 84, 2100] at 320x320), the NPU part writing the 4-D tensor it reads."""

    freeze_inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    inputs: Mapping[str, np.ndarray] | None = None
    seed: int = 0
    tolerance: float = FLOAT16_TOLERANCE
    int8_tolerance: float = INT8_COSINE_TOLERANCE
    max_opset: int = MAX_OPSET
    host_tail: bool = False


@dataclasses.dataclass(frozen=True)
class StepComparison:
    """One int8 output of a plan step against the file: the step run by the emulator on the
    file's own values of its inputs (onnxruntime's, dequantized), its `elements` integers
    against the file's; `differing` of them differ, by at most `largest` grid steps."""

    step: int
    kernel: str
    output: str
    elements: int
    differing: int
    largest: int

    @property
    def agrees(self) -> bool:
        return self.differing <= max(STEP_DIFFERING_ELEMENTS, STEP_DIFFERING_SHARE * self.elements)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """What `export` wrote: the ONNX file, its JSON report beside it (`report`), and each
    output's agreement with the original model on onnxruntime; for an int8 plan, `emulated`:
    the emulator's outputs for the plan against the original, on the same inputs. With a host
    tail, `host_path` is the host part's file, and the agreements are of the host part run on the
    NPU part's outputs."""

    path: Path
    report_path: Path
    agreements: tuple[Agreement, ...]
    report: dict
    emulated: tuple[Agreement, ...] = ()
    host_path: Path | None = None


def report_path(path: str | Path) -> Path:
    """OUT.onnx's report: OUT.report.json beside it."""
    path = Path(path)
    return path.with_name(path.stem + ".report.json")


def host_path(path: str | Path) -> Path:
    """OUT.onnx's host part (`--host-tail`): OUT.host.onnx beside it."""
    path = Path(path)
    return path.with_name(path.stem + ".host.onnx")


def export(plan_or_model: Plan | str | Path, path: str | Path, target: str = "rk3588",
           options: Options | None = None, export_options: ExportOptions | None = None,
           **kwargs: Any) -> ExportReport:
    """Write the plan's graph as standard ONNX to `path` and its report to OUT.report.json.
    `plan_or_model`: an ONNX model, planned here for `target` with `options`, or a `Plan` with
    its reference nodes (a fresh compile, or an .rkplan saved with them). Keyword arguments are
    fields of `ExportOptions` or of `Options`."""
    export_fields = {f.name for f in dataclasses.fields(ExportOptions)}
    export_options = dataclasses.replace(export_options or ExportOptions(),
                                         **{k: v for k, v in kwargs.items() if k in export_fields})
    compile_kwargs = {k: v for k, v in kwargs.items() if k not in export_fields}
    frozen: dict[str, np.ndarray] = {}
    if isinstance(plan_or_model, Plan):
        if options is not None or compile_kwargs or export_options.freeze_inputs:
            raise CompileError("a Plan is planned already: give the model to export it with other options "
                               "or frozen inputs")
        plan, original = plan_or_model, Path(plan_or_model.record.model.path)
        if plan.reference_nodes is None:
            raise CompileError("this plan has no reference nodes (a plan JSON file, or an .rkplan saved without "
                               "them): export the model instead")
        if not original.is_file():
            raise CompileError(f"{original}, the model the plan was made of, is not there to check the export "
                               "against: export the model instead")
    else:
        original = Path(plan_or_model)
        with tempfile.TemporaryDirectory(prefix="rkcompile-export-") as folder:
            planned = original
            if export_options.freeze_inputs:
                planned, frozen = frozen_model(original, export_options.freeze_inputs, Path(folder))
            plan = compile(planned, target, options, **compile_kwargs)
    quantized = plan.dtype in QUANTIZED_DTYPES
    written = standard_model(plan.record, plan.reference_nodes, export_options.max_opset,
                             stored_weight_integers(plan) if quantized else None, export_options.host_tail)
    model = written.model
    agreements, emulated, steps, not_compared, unoptimized = check(original, model, plan, export_options, frozen,
                                                                   written.host)
    selected = _selected(model.graph, *([written.host.graph] if written.host else []))
    tolerance = {"int8_cosine": export_options.int8_tolerance} if quantized else {"tolerance": export_options.tolerance}
    report = {
        "model": str(original), "target": plan.target, "dtype": plan.dtype, "export": str(path),
        "frozen_inputs": {name: value.tolist() for name, value in frozen.items()},
        **export_summary(plan.record, plan.reference_nodes, model), "toolkit_shapings": written.shaped,
        **({"host_tail": host_tail_summary(plan.record, written, str(host_path(path)))} if written.host else
           {"data_dependent": list(written.data_dependent)} if written.data_dependent else {}),
        "check": {**tolerance, "seed": export_options.seed, "outputs": [a.to_dict() for a in agreements],
                  **({} if quantized else {"smallest_judged_magnitude": SMALLEST_JUDGED_MAGNITUDE,
                                           "computed_from_a_selection": sorted(selected & {a.output for a in agreements}),
                                           "selected_min_cosine": SELECTED_MIN_COSINE}),
                  **({"emulator": [a.to_dict() for a in emulated],
                      "steps": steps_summary(steps, not_compared)} if quantized else {})},
    }
    if quantized:
        refuse_int8_export(original, agreements, emulated, steps, not_compared, export_options.int8_tolerance)
    failed = [a for a in agreements
              if not quantized and not _agrees(a, export_options.tolerance, a.output in selected)]
    if failed:
        worst = ", ".join(f"{a.output} (max abs {a.max_abs:.3g}, {a.max_rel:.3g} of its largest magnitude, "
                          f"cosine {a.cosine:.6f}{', computed from a selection' if a.output in selected else ''}"
                          f"; the original's own with onnxruntime's graph optimizations off: max abs "
                          f"{unoptimized[a.output].max_abs:.3g}, {unoptimized[a.output].max_rel:.3g})" for a in failed)
        beyond = [a.output for a in failed if unoptimized[a.output].max_rel > export_options.tolerance]
        note = (f"; {', '.join(beyond)}: the original's own float32 evaluations differ beyond the tolerance (a model "
                "that grows float32 rounding layer by layer, as random weights can): a --tolerance of that order "
                "accepts the export" if beyond else "")
        raise CompileError(f"the export disagrees with {original} on onnxruntime beyond {export_options.tolerance:.3g} "
                           f"of an output's largest magnitude (cosine {SELECTED_MIN_COSINE} for an output computed "
                           f"from a selection): {worst}{note}; nothing written")
    write_atomically(path, model.SerializeToString())
    if written.host is not None:
        write_atomically(host_path(path), written.host.SerializeToString())
    write_atomically(report_path(path), json.dumps(report, indent=1) + "\n")
    return ExportReport(Path(path), report_path(path), tuple(agreements), report, tuple(emulated),
                        host_path(path) if written.host is not None else None)


def steps_summary(steps: list[StepComparison], not_compared: list[str]) -> dict:
    """What the report says of the step-by-step comparison: how many int8 outputs were
    compared, the one with the largest share of differing integers, and the steps left out."""
    worst = max(steps, key=lambda s: (s.differing / max(s.elements, 1), s.largest), default=None)
    return {"compared": len(steps), "differing_share": STEP_DIFFERING_SHARE,
            "worst": worst.to_dict() if worst is not None else None, "not_compared": not_compared}


def refuse_int8_export(original: Path, agreements: list[Agreement], emulated: list[Agreement],
                       steps: list[StepComparison], not_compared: list[str], tolerance: float) -> None:
    """Refuse an int8 export (CompileError) that does not compute the plan: a step whose
    integers differ from the plan's on more than their share, or outputs whose cosine against
    the original is further than `tolerance` from the emulator's, unless every step was compared
    and agrees (then the outputs' distance is the plan's own sensitivity to rounding a tie
    apart, which the NPU shares: `compare_steps`)."""
    apart = [s for s in steps if not s.agrees]
    if apart:
        first = apart[0]
        more = f" ({len(apart) - 1} more outputs of steps differ)" if len(apart) > 1 else ""
        raise CompileError(f"the int8 export computes step {first.step} ({first.kernel}) otherwise than the plan: "
                           f"{first.differing} of the {first.elements} integers of {first.output} differ (up to "
                           f"{first.largest} steps of its grid) from the emulator's on the file's own inputs to the "
                           f"step{more}; nothing written")
    far = [f"{a.output} (cosine {a.cosine:.6f}, the emulator's {e.cosine:.6f})"
           for a, e in zip(agreements, emulated) if not abs(a.cosine - e.cosine) <= tolerance]
    if far and not_compared:
        raise CompileError(f"the int8 export's outputs on onnxruntime are further than {tolerance:.3g} of cosine against "
                           f"{original} from what the emulator computes for the plan: {', '.join(far)}, and "
                           f"{len(not_compared)} steps could not be compared one by one ({not_compared[0]}); "
                           "nothing written")


def stored_weight_integers(plan: Plan) -> dict[str, np.ndarray]:
    """An int8 plan's quantized weights as its weight region stores them, by name: int8 weights
    (after equalization), int32 convolution biases (after bias correction)."""
    storage = Executor(plan.record, plan.weights, get_target(plan.target)).storage
    return {name: storage.read(name) for name in plan.record.quantization
            if name in plan.record.tensors and plan.record.tensors[name].region == "weight"}


def frozen_model(path: Path, values: Mapping[str, Any], folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """`path`'s model with each input of `values` made a constant of that value, written to
    `folder` under the model's own file name; and the values as the arrays frozen."""
    model = onnx.load(str(path))
    declared = {value_info.name: value_info for value_info in model.graph.input}
    initialized = {tensor.name for tensor in model.graph.initializer}
    frozen = {}
    for name, value in values.items():
        if name not in declared or name in initialized:
            inputs = ", ".join(n for n in declared if n not in initialized)
            raise CompileError(f"--freeze-input {name}: not an input of {path} (inputs: {inputs})")
        tensor_type = declared[name].type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        value = np.asarray(value)
        if value.ndim == 0:  # a number fills the input's shape (an unknown dim taken as 1)
            value = np.full([d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim], value)
        frozen[name] = value.astype(dtype)
        model.graph.initializer.append(onnx.numpy_helper.from_array(frozen[name], name))
        model.graph.input.remove(declared[name])
    while _inline_decided_branch(model):
        pass
    planned = folder / path.name
    onnx.save(model, str(planned))
    return planned, frozen


def _inline_decided_branch(model: onnx.ModelProto) -> bool:
    """Replace the first If of the main graph whose condition the constants decide by the
    branch it takes (its nodes, then an Identity per output): True when there was one. The
    condition is evaluated with onnx's reference runtime over the nodes it depends on, which
    must read constants only and carry no subgraph."""
    graph = model.graph
    constants = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in graph.initializer}
    made_by = {name: node for node in graph.node for name in node.output}

    def value(name: str) -> np.ndarray | None:
        if name in constants or name not in made_by:
            return constants.get(name)
        node = made_by[name]
        inputs = [value(i) if i else None for i in node.input]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute) or \
                any(v is None for i, v in zip(node.input, inputs) if i):
            return None
        from onnx.reference import ReferenceEvaluator

        single = onnx.helper.make_graph([node], "fold", [], [onnx.helper.make_value_info(o, onnx.TypeProto())
                                                              for o in node.output if o],
                                        [onnx.numpy_helper.from_array(v, i) for i, v in zip(node.input, inputs) if i])
        results = ReferenceEvaluator(onnx.helper.make_model(single, opset_imports=model.opset_import)).run(None, {})
        constants.update(zip([o for o in node.output if o], map(np.asarray, results)))
        return constants[name]

    for position, node in enumerate(graph.node):
        condition = value(node.input[0]) if node.op_type == "If" else None
        if condition is None:
            continue
        branches = {a.name: a.g for a in node.attribute}
        taken = branches["then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"]
        inlined = [*taken.node, *(onnx.helper.make_node("Identity", [inner.name], [outer], f"{node.name}/{outer}")
                                  for inner, outer in zip(taken.output, node.output))]
        graph.initializer.extend(taken.initializer)
        graph.node.remove(node)
        for offset, inner in enumerate(inlined):
            graph.node.insert(position + offset, inner)
        return True
    return False


def check(original: Path, model: onnx.ModelProto, plan: Plan, export_options: ExportOptions,
          frozen: Mapping[str, np.ndarray],
          host: onnx.ModelProto | None = None
          ) -> tuple[list[Agreement], list[Agreement], list[StepComparison], list[str], dict[str, Agreement]]:
    """Each output of `model` (followed by `host`, run on the model's inputs and outputs, when
    given) against `original`'s on onnxruntime, on the given inputs (seeded random for the rest;
    the arrays given for outputs or frozen inputs are not used) and the frozen values; and for
    an int8 plan, the emulator's outputs for the plan against the same, and its steps against
    the file's one by one (`compare_steps`; all three empty for a float plan). Last, where an
    output of a float plan is beyond the tolerance, each output of the original with
    onnxruntime's graph optimizations off (fusions that add in another order) against the same,
    by name: how far float32 rounding alone moves the model's outputs, which a refusal gives
    beside the export's own difference; else empty."""
    model_io = plan.record.model
    names = [spec.name for spec in model_io.inputs]
    given = dict(export_options.inputs or {})
    unknown = sorted(set(given) - set(names) - set(frozen) - {spec.name for spec in model_io.outputs})
    if unknown:
        raise CompileError(f"{unknown[0]!r} is not an input of the exported model (inputs: {', '.join(names)})")
    inputs = make_inputs(plan.record, {name: given[name] for name in names if name in given}, export_options.seed)
    try:
        expected = onnxruntime_outputs(original, {**inputs, **frozen})
    except Exception as exc:  # onnxruntime's error types derive from Exception alone
        drawn = [name for name in names if name not in given]
        values = f"seeded random values for {', '.join(drawn)}" if drawn else "the given inputs"
        raise CompileError(f"the export's check: onnxruntime fails on {Path(original).name} with {values} "
                           f"({str(exc).splitlines()[0]}); give inputs the model accepts (--inputs FILE.npz)") from exc
    actual = onnxruntime_outputs(model.SerializeToString(), inputs)
    if host is not None:
        actual = onnxruntime_outputs(host.SerializeToString(), {**inputs, **actual})
    quantized = plan.dtype in QUANTIZED_DTYPES
    emulated = run(plan, inputs) if quantized else {}
    compared, not_compared = compare_steps(plan, model, inputs) if quantized else ([], [])
    agreements = [agreement(name, actual[name], expected[name]) for name in expected]
    unoptimized = {}
    if not quantized and not all(_agrees(found, export_options.tolerance, False) for found in agreements):
        outputs = onnxruntime_outputs(original, {**inputs, **frozen}, optimized=False)
        unoptimized = {name: agreement(name, outputs[name], expected[name]) for name in expected}
    return (agreements, [agreement(name, emulated[name], expected[name]) for name in expected if name in emulated],
            compared, not_compared, unoptimized)


def compare_steps(plan: Plan, model: onnx.ModelProto,
                  inputs: Mapping[str, np.ndarray]) -> tuple[list[StepComparison], list[str]]:
    """The int8 plan's steps against its QDQ export `model`, each on the file's own values of its
    inputs (onnxruntime on the file, every QuantizeLinear's integers read out), so that an error
    of one step does not reach the next: a plan whose outputs are sensitive to single rounding
    steps (squeeze-and-excitation gates spread one over a channel, layer after layer) computes
    on two runtimes that round a tie apart outputs as far apart as their int8 error, though each
    step computes the same. A step's int8 output is compared where the file holds its integers
    and every activation the step reads (an alias, which the export may write no view for, as
    its source's values through its view); the steps left out (CPU steps, those whose tensors
    the file does not hold, float outputs) are named, by step, kernel and reason."""
    record = plan.record
    renames = host_renames(record)
    made = {output for node in model.graph.node for output in node.output} | {v.name for v in model.graph.input}

    def held(name: str) -> str | None:
        """The file's tensor holding plan tensor `name`: its QuantizeLinear's integers where the
        file has its pair, else the tensor itself (a float one, or an int8 one whose pair the
        file lacks; a CPU step's float output that the plan converts to int8 is the float input
        of its pair), None where the file does not hold it."""
        written = renames.get(name, name)
        forms = (f"{written}/quantized", written) if name in record.quantization else (written, f"{written}/float")
        return next((held for held in forms if held in made), None)

    wanted = {name: held(name) for step in record.steps for name in (*step.inputs, *step.outputs)}
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    outputs = {value.name for value in tapped.graph.output}
    tapped.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in set(wanted.values()) - {None}
                               if name not in outputs)
    computed = onnxruntime_outputs(tapped.SerializeToString(), inputs)
    # what the file's readers read: the dequantized pair, or the float tensor where the file has no pair
    real = {name: dequantize(computed[tensor], record.quantization[name]) if tensor.endswith("/quantized")
            else computed[tensor] for name, tensor in wanted.items() if tensor is not None}
    for name, value in list(real.items()):  # a tensor the shapings wrote at another shape (rank3_tails_as_rank4)
        shape = record.tensors[name].shape if name in record.tensors else value.shape
        if tuple(value.shape) != tuple(shape):
            if [d for d in value.shape if d != 1] == [d for d in shape if d != 1]:  # unit axes only: the same order
                real[name] = value.reshape(shape)
            else:
                del real[name]
    for name in wanted.keys() - real.keys():  # an alias the export wrote no view for: its source's bytes
        placed = record.tensors.get(name)
        if placed is not None and placed.aliases in real:
            source = real[placed.aliases]
            real[name] = source.reshape(-1)[viewed_indices(source.shape, placed.shape, placed.view)]
    alone = Executor(record, plan.weights, get_target(plan.target), plan.prepared().weight_cache)
    compared, not_compared = [], []
    for index, step in enumerate(record.steps):
        outputs = [name for name in step.outputs if name in record.quantization]
        if not outputs and step.device == "host":  # a conversion out of the integers: the file's DequantizeLinear
            continue
        missing = [name for name in (*step.inputs, *outputs)
                   if name not in real and record.tensors[name].region != "weight"]
        if step.device not in ("npu", "host") or missing or not outputs:
            not_compared.append(f"step {step.id} ({step.kernel}): " + (
                f"a {step.device} step" if step.device not in ("npu", "host") else
                f"the file does not hold {missing[0]}" if missing else "float outputs"))
            continue
        # a host step converts into the NPU's integers, as the file's QuantizeLinear does
        results = {step.outputs[0]: real[step.inputs[0]]} if step.device == "host" else alone.run_alone(index, real)
        if results is None:
            not_compared.append(f"step {step.id} ({step.kernel}): the file does not hold what it reads")
            continue
        for name in outputs:
            quant = record.quantization[name]
            difference = np.abs(quantize(results[name], quant).astype(np.int64)
                                - quantize(real[name], quant).astype(np.int64))
            compared.append(StepComparison(step.id, step.kernel, name, difference.size,
                                           int(np.count_nonzero(difference)), int(difference.max(initial=0))))
    return compared, not_compared


def _agrees(found: Agreement, tolerance: float, computed_from_a_selection: bool) -> bool:
    """Within `tolerance` of the output's largest magnitude (SMALLEST_JUDGED_MAGNITUDE at
    least); an output computed from a selection (SELECTION_OPS) also by its cosine."""
    return (found.max_rel <= tolerance or found.max_abs <= tolerance * SMALLEST_JUDGED_MAGNITUDE
            or (computed_from_a_selection and found.cosine >= SELECTED_MIN_COSINE))


def _selected(*graphs: onnx.GraphProto) -> set[str]:
    """The tensors of `graphs` (run one after the other, each in topological order) computed
    from a selection's result."""
    selected: set[str] = set()
    for node in (node for graph in graphs for node in graph.node):
        if node.op_type in SELECTION_OPS or not selected.isdisjoint(node.input):
            selected.update(node.output)
    return selected
