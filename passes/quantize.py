"""Quantize: int8 plans get a scale and zero point for every int8 tensor, and int32 biases.

Runs after layout, which stores every NPU float tensor in the plan dtype, and before memory,
which sizes the regions: so the storage changes made here (a convolution bias becomes int32, a
float operand the NPU reads as a parameter, such as Resize's scales, keeps its float dtype) are
what the planner allocates. Float16 plans pass through untouched.

Activation ranges come from the planned graph run in float32 on the calibration inputs
(`--calib`, else seeded random ones with a warning); rkcompile/quantization/params.py holds the
observers and the parameter arithmetic. A data-movement output (Reshape, Transpose, Slice,
Split, MaxPool, nearest Resize, ...) keeps its input's parameters, so moving int8 values never
requantizes them; a Concat operand nothing else reads takes the Concat's, so it is rounded once;
every other tensor gets its own calibrated range.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext, FloatGraph

from rkcompile.options import CHOOSE, PREFERRED_INT8, settings_label
from rkcompile.errors import CompileError
from rkcompile.ir.graph import dtype_name, element_count, itemsize
from rkcompile.ir.nodes import plain_nodes
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_bytes
from rkcompile.plan.schema import QUANTIZED_DTYPES, Int8Technique, Quantization
from rkcompile.progress import bar
from rkcompile.quantization.params import (INT8, PER_CHANNEL_WEIGHTS, KeptDraws, RangeObserver, activation_params,
    bias_params, fit_bias, is_movement, samples_for, weight_params)
from rkcompile.targets.common import ONNX_TO_KERNEL

from rkcompile.passes.int8_accuracy import (Equalization, WeightErrorMeans, apply, constant_weight, corrected_bias,
    find_pairs, replace_constant, set_constant, settle)
from rkcompile.passes.int8_accuracy import members as int8_members

NAME = "quantize"
T, R = TypeVar("T"), TypeVar("R")
#: Threads searching tensors' ranges at once (numpy lets go of the interpreter in the search's
#: passes over a tensor's kept values): one per core, at most 4 (each holds ~16 MB of scratch)
SEARCH_THREADS = min(4, os.cpu_count() or 1)
#: An operand of a Concat that spans fewer int8 steps of the output than this is reported; a
#: Softmax model output whose mean probability spans fewer is computed in float16.
DROWNED_LEVELS = 16
#: A Split all of whose outputs a Concat reads takes the Concat's parameters when its step is at
#: most this many times the Split input's: one bit coarser for another step reading an output.
SPLIT_COARSENING = 2.0


def run(ctx: CompileContext) -> None:
    ctx.quantization = {}
    if ctx.options.dtype not in QUANTIZED_DTYPES:
        return
    _settle_unchosen(ctx)
    nodes = {node.name: node for node in ctx.graph.nodes}
    ordered = [nodes[name] for name in ctx.order]
    devices = [ctx.placement[name].device for name in ctx.order]
    equalization = _equalization(ctx, ordered, devices)
    _own_bias_copies(ctx, ordered, devices)
    _keep_parameters_float(ctx, ordered, devices)
    distributions = _float16_distributions(ctx, ordered, devices)
    scores = [] if ctx.target.builds_int8_attention_scores else _float16_attention_scores(ctx, ordered, devices)
    masks, unmasked = _float16_masks(ctx, ordered, devices)
    _make_float16_islands(ctx, ordered, devices,
                          set(ctx.options.float16_tensors) | set(distributions) | set(scores) | set(masks))
    weight_errors = _bias_correction_candidates(ctx, ordered, devices) if ctx.options.bias_correction else None
    observers = _calibrate(ctx, ordered, devices, weight_errors, equalization)
    if ctx.options.equalization:
        _equalize(equalization, weight_errors)
    if weight_errors is not None:
        _correct_biases(ctx, weight_errors)
    parameters = ActivationParameters(observers, ctx.options.calibration_method,
                                      ctx.target.allows_activation_zero_point_0)
    for node, device in zip(ordered, devices):
        for tensor in node.outputs:
            if not _is_quantized(ctx, tensor.name) or tensor.name in parameters:
                continue
            source = node.inputs[0].name if node.inputs else ""
            if device == "npu" and is_movement(node) and source in parameters:
                parameters.share(tensor.name, source)
            else:
                parameters.own(tensor.name)
    outputs = {t.name for t in ctx.graph.outputs}
    # the ranges certainly used are searched at once; a Concat operand's may be dropped for the Concat's
    parameters.search(parameters.unmade() - _concat_operand_sources(ordered, devices, parameters))
    _share_concat_parameters(ordered, devices, parameters, outputs)
    quantization = parameters.made()
    for name in unmasked:  # an int8-only step carrying a mask: the plan says what int8 does to it
        quantization[name] = replace(quantization[name], warning=(
            f"{name} carries an attention mask, which int8 cannot hold beside the scores it masks, and "
            f"{ctx.target.name}'s NPU runs the step writing it only in int8: masked tokens may be attended"))
    _quantize_weights(ctx, ordered, devices, quantization)
    _warn_of_drowned_operands(ordered, devices, observers, ctx.options.calibration_method, quantization)
    if not ctx.target.builds_int8_attention_scores:
        quantization.update(_int8_fused_attention_probabilities(ctx, ordered, devices))
    ctx.quantization = quantization


def _settle_unchosen(ctx: CompileContext) -> None:
    """The int8 settings still left to choose here take their preferred values, and the plan says
    so. rkcompile.compile and the command line choose them before this pass
    (rkcompile/compiler/int8_choice.py); `pipeline.compile_model` alone plans without searching."""
    unchosen = {name: value for name, value in PREFERRED_INT8.items() if getattr(ctx.options, name) == CHOOSE}
    if not unchosen:
        return
    ctx.options = replace(ctx.options, **unchosen)
    ctx.int8_techniques.append(Int8Technique(
        "int8_settings", (settings_label(ctx.options),), (),
        f"{settings_label(ctx.options)}; {', '.join(name.replace('_', ' ') for name in unchosen)} at the preferred "
        f"value, not searched (planned without the choice: pipeline.compile_model)"))


def idle_techniques(ctx: CompileContext) -> set[str]:
    """The int8 techniques that would change nothing in the graph this pass receives: equalization
    without a Conv pair to equalize, bias correction without a Conv whose bias it corrects
    (float16 islands only remove candidates). rkcompile/compiler/int8_choice.py does not search them."""
    nodes = {node.name: node for node in ctx.graph.nodes}
    ordered = [nodes[name] for name in ctx.order]
    devices = [ctx.placement[name].device for name in ctx.order]
    idle = set()
    if not find_pairs(ordered, devices, {t.name for t in ctx.graph.outputs}).pairs:
        idle.add("equalization")
    if not _bias_correction_candidates(ctx, ordered, devices).convs:
        idle.add("bias_correction")
    return idle


def _share_concat_parameters(ordered: list[gs.Node], devices: list[str], quantization: "ActivationParameters",
                             outputs: set[str]) -> None:
    """An NPU Concat's operand that only the Concat reads is written with the Concat output's
    parameters, so its producer rounds each value once, onto the grid it is stored on; with
    parameters of its own, the Concat would round it a second time (rescale it into the output's
    scale). rknn-toolkit2 2.5.0's "single" cosines of yolov8n's Concat steps are 2.4e-5 above
    the two-rounding form on average, and TFLite gives a Concat's inputs its output's parameters
    for the same reason. The Concat's range is the union of its operands' on the same samples, so
    an operand keeps all its values, on a grid at most as fine as its own would be. A move step
    between the producer and the Concat (Reshape, ...) passes the parameters back to its input
    when that input too has no other reader. A Split whose every output is an operand of the
    Concat (YOLOv8's C2f block: both halves of cv1's output, beside the bottleneck outputs) does
    too, when the Concat's step is at most SPLIT_COARSENING times its input's: cv1 then writes
    on the Concat's grid and neither half is rounded again, while a step that also reads a half
    (the bottleneck's Conv) reads it on that grid, at most one bit coarser than its own (yolov8n:
    1.1-1.6 times; its output cosine 0.9998679 -> 0.9998890 with minmax). Concats are visited
    last to first, so a Concat feeding another takes the outer one's parameters before handing
    them on to its operands."""
    readers = Counter(t.name for node in ordered for t in node.inputs if not isinstance(t, gs.Constant))
    producers = {t.name: (node, device) for node, device in zip(ordered, devices) for t in node.outputs}

    def split_into(node: gs.Node, operands: set[str], name: str, shared: Quantization) -> bool:
        """Whether the multi-output move step `node` (writing `name`) may take the Concat's
        parameters: each of its outputs an operand of this Concat, none a model output, its grid
        at most SPLIT_COARSENING times coarser for a step that also reads an output."""
        names = [t.name for t in node.outputs]
        return (len(names) > 1 and all(name in operands and name in quantization and name not in outputs
                                       for name in names)
                and shared.scales[0] <= SPLIT_COARSENING * quantization[name].scales[0])

    def adopt(name: str, shared: Quantization, source: str, operands: set[str]) -> bool:
        """Give `name` the Concat's parameters if nothing else reads it (nor, for a move step's
        output, its input), or it is a Split's output `split_into` allows; whether it took them.
        Its own parameters are not read: what they would be decides nothing here."""
        if name not in quantization or name in outputs or name not in producers:
            return False
        node, device = producers[name]
        kept_from = quantization.shared_source(name)
        if kept_from is not None:  # a move step's output keeps its input's parameters
            split = split_into(node, operands, name, shared)
            if (device != "npu" or not is_movement(node)
                    or ((readers[name] != 1 or len(node.outputs) != 1) and not split)
                    or not adopt(kept_from, shared, source, operands)):
                return False
            for tensor in node.outputs:  # a Split's outputs all keep their input's (new) parameters
                quantization[tensor.name] = replace(shared, source=quantization[tensor.name].source, warning=None)
            return True
        if readers[name] != 1:
            return False
        quantization[name] = replace(shared, source=source, warning=None)
        return True

    for node, device in reversed(list(zip(ordered, devices))):
        output = node.outputs[0].name if node.outputs else ""
        if device != "npu" or node.op != "Concat" or output not in quantization:
            continue
        operands = {t.name for t in node.inputs if not isinstance(t, gs.Constant)}
        for tensor in node.inputs:
            if not isinstance(tensor, gs.Constant) and tensor.name != output:
                adopt(tensor.name, quantization[output], f"concat:{output}", operands)


def _is_quantized(ctx: CompileContext, name: str) -> bool:
    tensor = ctx.tensors.get(name)
    return tensor is not None and tensor.dtype in QUANTIZED_DTYPES


def _calibrate(ctx: CompileContext, ordered: list[gs.Node], devices: list[str],
               weight_errors: WeightErrorMeans | None, equalization: Equalization) -> dict[str, RangeObserver]:
    """Each int8 activation's observer, whose range by the options' method is its calibrated
    [low, high] (searched when first asked: `ActivationParameters`), the graph's (equalized when
    the options say so: `_equalize` scales the weights after this run).

    The float32 run is always the model's own weights': equalization leaves the outputs as they
    are and divides only the tensors between each pair's Convs by the pair's scales per channel
    (`Pair.scaled`), so those are observed a second time, divided, as the equalized graph
    computes them (to float32 rounding), and one run serves plans with and without it."""
    options = ctx.options
    method = options.calibration_method
    wanted = {name for name, t in ctx.tensors.items() if t.dtype in QUANTIZED_DTYPES and t.region != "weight"}
    scaled = {name: scale for name, scale in equalization.scaled_tensors().items() if name in wanted}
    if not _reuse_calibration(ctx.calibration, wanted, set(scaled) if options.equalization else set(), weight_errors,
                              method):
        _observe(ctx, ordered, devices, wanted, scaled, weight_errors)
    calibration = ctx.calibration
    chosen = {**calibration.observers, **(calibration.equalized if options.equalization else {})}
    return {name: chosen[name] for name in wanted}


def _observe(ctx: CompileContext, ordered: list[gs.Node], devices: list[str], wanted: set[str],
             scaled: dict[str, np.ndarray], weight_errors: WeightErrorMeans | None) -> None:
    """The calibration run (`ctx.calibration`): the graph in float32 on the calibration samples,
    each `wanted` tensor observed, each `scaled` one a second time divided by its scales along
    axis 1, and with `weight_errors` each Conv's tap means."""
    options = ctx.options
    method = options.calibration_method
    if ctx.calibration_samples is None:
        ctx.calibration_samples = samples_for(options, ctx.model_info.inputs)
    samples = ctx.calibration_samples
    if ctx.kept_draws is None:
        ctx.kept_draws = KeptDraws()
    observers = {name: RangeObserver(method, draws=ctx.kept_draws) for name in wanted}
    equalized = {name: RangeObserver(method, draws=ctx.kept_draws) for name in scaled}

    def observe(name, value):
        if name in observers:
            observers[name].update(value)
        if name in equalized:
            scale = scaled[name].reshape((1, -1) + (1,) * (np.ndim(value) - 2))
            equalized[name].update((value / scale).astype(np.float32))
        if weight_errors is not None:
            weight_errors.observe(name, value)

    runtime = ctx.runtime
    if runtime is None:
        raise CompileError("an int8 plan calibrates on a runtime that runs its graph in float32: plan it "
                           "with rkcompile.compile, or give pipeline.compile_model a runtime "
                           "(rkcompile.api.EMULATOR_RUNTIME)")
    observed = wanted | set(weight_errors.by_input if weight_errors is not None else ())
    reference = runtime.float_graph(plain_nodes(ordered), devices, ctx.graph.opset, [t.name for t in ctx.graph.outputs],
                                    observed)

    def observed_values(sample) -> tuple[list[tuple[str, np.ndarray]], dict[str, np.ndarray]]:
        seen = []
        return seen, reference.run(sample, lambda name, value: seen.append((name, value)))

    outputs = []
    with ThreadPoolExecutor(1) as runner:
        # the next sample runs while this one's values are observed, in the samples' order
        for seen, produced in bar(one_ahead(runner, observed_values, samples), total=len(samples),
                                  description=f"int8 calibration: float32 pass ({method})", unit="sample"):
            for name, value in seen:
                observe(name, value)
            outputs.append(produced)
    if weight_errors is not None:
        weight_errors.settle(runtime.tap_means)
    ctx.calibration = Calibration(observers, equalized, weight_errors.copy() if weight_errors is not None else None,
                                  reference, tuple(outputs))


def one_ahead(runner: ThreadPoolExecutor, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """function(item) for each item in order, computed by `runner` (one thread: one item at a
    time), the next item's while the caller works on this one's (numpy and onnxruntime let go
    of the interpreter while they compute); never more than two results held."""
    pending = None
    for item in items:
        following = runner.submit(function, item)
        if pending is not None:
            yield pending.result()
        pending = following
    if pending is not None:
        yield pending.result()


@dataclass(frozen=True)
class Calibration:
    """What one calibration run observed: each int8 tensor's range, and each tensor an
    equalized plan divides (`Pair.scaled`) as that plan computes it (`equalized`); with bias
    correction, each Conv's tap means. `graph` is the runtime's float32 graph it ran, with the
    model's own constants (equalization scales them after the run, and the biases are
    corrected after it), and `outputs` its graph outputs per calibration sample: the float32
    reference a judge of candidate plans compares with, when its own graph computes alike
    (rkcompile/compiler/auto_float16.py `Judge.expected_outputs`)."""
    observers: dict[str, RangeObserver]
    equalized: dict[str, RangeObserver]
    weight_errors: WeightErrorMeans | None
    graph: FloatGraph | None = None
    outputs: tuple[dict[str, np.ndarray], ...] | None = None


def _reuse_calibration(earlier: Calibration | None, wanted: set[str], equalized: set[str],
                       weight_errors: WeightErrorMeans | None, method: str) -> bool:
    """--auto-float16 and the choice of int8 settings plan one graph many times. The float32 run
    depends neither on which tensors are float16, nor on the range method (an observer that kept
    the values for mmse has the min and max too), nor on bias correction (the biases are
    corrected after it), nor on equalization (it runs on the model's own weights and observes
    the tensors equalization divides in both forms). So an earlier run of the same graph whose
    observers answer `method` and that observed every tensor (`wanted`, and `equalized` in
    their equalized form) and Conv this plan needs (the plan without those float16 tensors, with
    bias correction when this plan has it) serves it: its tap means are copied into
    `weight_errors` and True is returned; otherwise False."""
    if earlier is None or not wanted <= earlier.observers.keys() or not equalized <= earlier.equalized.keys():
        return False
    if not all(earlier.observers[name].answers(method) for name in wanted):
        return False
    if weight_errors is not None:
        if earlier.weight_errors is None or not weight_errors.convs.keys() <= earlier.weight_errors.convs.keys():
            return False
        for key in earlier.weight_errors.sums:  # in the order a run observes them, as the summary lists them
            if key not in weight_errors.convs:
                continue
            weight_errors.sums[key] = earlier.weight_errors.sums[key]
            weight_errors.counts[key] = earlier.weight_errors.counts[key]
    return True


def _equalization(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> Equalization:
    """Cross-layer equalization's pairs and scales (passes/int8_accuracy.py), found whether or
    not this plan equalizes (the calibration run observes their tensors in both forms, for
    every plan of the model) and recorded when it does; the weights are scaled after the
    calibration run (`_equalize`). The float outputs do not change."""
    found = find_pairs(ordered, devices, {t.name for t in ctx.graph.outputs})
    settle(found)
    if ctx.options.equalization:
        ctx.int8_techniques.append(Int8Technique(
            "equalization", tuple(pair.label for pair in found.pairs), tuple(found.declined),
            f"{len(found.pairs)} Conv pairs equalized in {found.sweeps} sweeps, {len(found.declined)} declined"))
    return found


def _equalize(found: Equalization, weight_errors: WeightErrorMeans | None) -> None:
    """The pairs' weights scaled as `settle` found, after the calibration run observed their
    tensors in the equalized form; the tap means the Convs reading a divided tensor took are
    divided alike."""
    apply(found)
    if weight_errors is not None:
        weight_errors.divide_inputs(found.scaled_tensors())


def _bias_correction_candidates(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> WeightErrorMeans:
    """Every NPU step that begins with a Conv of int8 weights and a bias: the calibration run
    measures the mean shift its rounded weights cause (passes/int8_accuracy.py)."""
    convs = {}
    for node, device in zip(ordered, devices):
        first = int8_members(node)[0]
        if (device == "npu" and first.op == "Conv" and constant_weight(first) and len(first.inputs) > 2
                and first.inputs[2].name and ctx.tensors[first.inputs[1].name].dtype == "int8"
                and node.inputs and _is_quantized(ctx, node.inputs[0].name)):
            convs[node.name] = (first, node.inputs[0].name)
    return WeightErrorMeans(convs)


def _own_bias_copies(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> None:
    """Each NPU convolution reading a bias other steps read too gets its own copy of it.
    Exporters store equal biases once (the zero bias of every Conv with as many channels; a
    detector head's constant bias), but an int8 bias is an int32 at its own reader's input scale
    times weight scale, and bias correction gives each reader its own shift: one stored bias
    would serve one reader and silently shift the others."""
    readers = Counter(t.name for node, device in zip(ordered, devices) for t in node.inputs
                      if isinstance(t, gs.Constant))
    for node, device in zip(ordered, devices):
        if device != "npu":
            continue
        for member in _members(node)[0]:
            if member.op not in PER_CHANNEL_WEIGHTS or len(member.inputs) < 3:
                continue
            bias = member.inputs[2]
            if not isinstance(bias, gs.Constant) or readers[bias.name] < 2 or bias.name not in ctx.tensors:
                continue
            name = f"{bias.name}/{node.name}"
            ctx.tensors[name] = ctx.tensors[bias.name]
            replace_constant(node, bias.name, gs.Constant(name, np.array(bias.values)))
            readers[bias.name] -= 1  # the last reader keeps the original


def _correct_biases(ctx: CompileContext, weight_errors: WeightErrorMeans) -> None:
    """Each measured Conv's bias minus its weights' mean shift; the model's bias stays the float
    reference's (`ctx.reference_constants`)."""
    nodes = {node.name: node for node in ctx.graph.nodes}
    corrected = []
    for step_name, shift in weight_errors.means().items():
        bias = weight_errors.convs[step_name].inputs[2]  # this step's own (`_own_bias_copies`)
        ctx.reference_constants[bias.name] = np.asarray(bias.values)
        set_constant(nodes[step_name], bias.name, corrected_bias(bias.values, shift))
        corrected.append(step_name)
    ctx.int8_techniques.append(Int8Technique(
        "bias_correction", tuple(corrected), (),
        f"{len(corrected)} Conv biases corrected for their int8 weights' mean output shift"))


def _warn_of_drowned_operands(ordered: list[gs.Node], devices: list[str], observers: dict[str, RangeObserver],
                              method: str, quantization: dict[str, Quantization]) -> None:
    """A Concat's operands share its one per-layer scale: an operand whose values span only a
    few of its steps arrives as a few integers, or all zero. YOLOv8's output is the case users
    meet: box coordinates up to ~640 and class scores up to 1 in one tensor, where the scores are
    quantized to 0 and 2.5 (rknn-toolkit2 2.5.0 does the same). The plan records it on the
    Concat's parameters (`warning`, logged once the plan is chosen: `int8_choice`) and says how
    to keep the operand. An operand's span is its calibrated range when it has parameters of its
    own, else its observed one within the range of the grid it keeps or takes (`_stored_span`);
    a constant's is its values' (with 0). A learned token concatenated to activations is the
    constant case: XCiT's and CaiT's class token (random init: values within +-0.05) joins
    tokens in the tens, every value rounds to the zero point, and the class attention after it
    reads a row of zeros (timm xcit_nano_12_p16_224: output cosine 0.000)."""
    for node, device in zip(ordered, devices):
        output = node.outputs[0].name if node.outputs else ""
        if device != "npu" or node.op != "Concat" or output not in quantization:
            continue
        step = quantization[output].scales[0]
        drowned = []
        for tensor in node.inputs:
            if isinstance(tensor, gs.Constant):
                values = np.asarray(tensor.values)
                if not values.size:
                    continue
                low, high, what = min(float(values.min()), 0.0), max(float(values.max()), 0.0), "constant "
            elif tensor.name in observers:
                low, high = _stored_span(observers[tensor.name], method, quantization.get(tensor.name))
                what = ""
            else:
                continue
            if high - low < DROWNED_LEVELS * step:
                drowned.append(f"{what}{tensor.name} (range [{low:.3g}, {high:.3g}]: {(high - low) / step:.1f} steps)")
        if drowned:
            warning = (f"Concat {output} stores its operands with one int8 step of {step:.3g}, which leaves "
                       f"fewer than {DROWNED_LEVELS} of 256 levels to {'; '.join(drowned)}; keep the Concat in "
                       f"float16 with --float16 {output}, or output the operands separately")
            quantization[output] = replace(quantization[output], warning=warning)


def _stored_span(observer: RangeObserver, method: str, quant: Quantization | None) -> tuple[float, float]:
    """The [low, high] a tensor's stored values span: its range calibrated by `method` when its
    parameters are its own (or it has none), else the values it was seen to take, widened to
    include 0 as a calibrated range is, within the range of the grid it keeps from its input or
    takes from a Concat."""
    if quant is None or not quant.source.startswith(("shared:", "concat:")):
        return observer.range(method)
    low, high = observer.range("minmax")
    scale, zero = quant.scales[0], quant.zero_points[0]
    return max(min(low, 0.0), scale * (INT8[0] - zero)), min(max(high, 0.0), scale * (INT8[1] - zero))


def _concat_operand_sources(ordered: list[gs.Node], devices: list[str], parameters: "ActivationParameters") -> set[str]:
    """The tensors whose own parameters a Concat's may replace (`_share_concat_parameters`):
    each NPU Concat's operands, and the tensors a move step between keeps them from."""
    found: set[str] = set()
    for node, device in zip(ordered, devices):
        if device != "npu" or node.op != "Concat" or not node.outputs or node.outputs[0].name not in parameters:
            continue
        for tensor in node.inputs:
            name = None if isinstance(tensor, gs.Constant) else tensor.name
            while name in parameters and name not in found:
                found.add(name)
                name = parameters.shared_source(name)
    return found


@dataclass(frozen=True)
class _KeptFrom:
    """A move step's output: it keeps the parameters of `source`, its input."""
    source: str


#: an activation whose parameters are its own, made from its calibrated range when first read
_OWN = object()


class ActivationParameters(MutableMapping):
    """The int8 activations' parameters as `run` decides them, each made when first read: one
    whose parameters are its own (`own`) from its calibrated range, which the distribution
    methods (mmse, kl, percentile) search only then, a move step's output (`share`) as its
    input's. A Concat operand that takes the Concat's parameters instead
    (`_share_concat_parameters`) never reads its own, so its range is never searched: of the
    mmse searches the pass made, 50 of tv_googlenet's 83 and 61 of yolov8n's 133 were of such
    tensors, or of move steps' outputs. A mapping, so every read (`[]`, `get`, `items`) makes
    what it reads."""

    def __init__(self, observers: dict[str, RangeObserver], method: str, zero_point_0: bool):
        self.observers, self.method, self.zero_point_0 = observers, method, zero_point_0
        self.entries: dict[str, object] = {}  # name -> Quantization, _OWN or _KeptFrom

    def own(self, name: str) -> None:
        self.entries[name] = _OWN

    def share(self, name: str, source: str) -> None:
        self.entries[name] = _KeptFrom(source)

    def shared_source(self, name: str) -> str | None:
        """The tensor whose parameters `name` keeps (a move step's input), or None."""
        entry = self.entries[name]
        if isinstance(entry, _KeptFrom):
            return entry.source
        if isinstance(entry, Quantization) and entry.source.startswith("shared:"):
            return entry.source.split(":", 1)[1]
        return None

    def __getitem__(self, name: str) -> Quantization:
        entry = self.entries[name]
        if entry is _OWN:
            observer = self.observers[name]
            entry = activation_params(*observer.range(self.method), self.method, self.zero_point_0)
            if observer.nonfinite:
                entry = replace(entry, warning=(
                    f"{name} held {observer.nonfinite} infinite or NaN value(s) in the calibration samples, which no "
                    f"int8 range holds: stored as int8 they saturate to the ends of its grid; keep it in float16 "
                    f"with --float16 {name}"))
        elif isinstance(entry, _KeptFrom):
            entry = replace(self[entry.source], source=f"shared:{entry.source}")
        else:
            return entry
        self.entries[name] = entry
        return entry

    def __setitem__(self, name: str, quant: Quantization) -> None:
        self.entries[name] = quant

    def __delitem__(self, name: str) -> None:
        del self.entries[name]

    def __contains__(self, name: object) -> bool:  # Mapping's would make the parameters it asks about
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def unmade(self) -> set[str]:
        """The tensors whose own parameters are still to be made."""
        return {name for name, entry in self.entries.items() if entry is _OWN}

    def search(self, names: Iterable[str]) -> None:
        """The calibrated ranges of `names` found SEARCH_THREADS at a time (numpy lets go of
        the interpreter in a search's passes over the kept values), where one is still to
        search (each is searched once, then kept: `RangeObserver.range`)."""
        searched = [self.observers[name] for name in names]
        searched = [observer for observer in searched if observer.method == self.method != "minmax"
                    and observer.found is None]
        if not searched:
            return
        with ThreadPoolExecutor(SEARCH_THREADS) as pool:
            for _ in bar(pool.map(RangeObserver.range, searched), total=len(searched),
                         description=f"int8 calibration: {self.method} ranges", unit="tensor"):
                pass

    def made(self) -> dict[str, Quantization]:
        """Every tensor's parameters, those still to be made searched at once first."""
        self.search(self.unmade())
        return dict(self.items())


def _members(node: gs.Node) -> tuple[list[gs.Node], dict[str, str]]:
    """The nodes a step runs and, for a fused one, its body's input names -> the step's."""
    if "body" not in node.attrs:
        return [node], {}
    body = node.attrs["body"]
    variables = [t for t in node.inputs if t.name and not isinstance(t, gs.Constant)]
    outer = {inner.name: t.name for inner, t in zip(body.inputs, variables)}
    members = []
    for member in body.nodes:
        inner, renamed = _members(member)
        members += inner
        outer.update(renamed)
    return members, outer


def _quantize_weights(ctx: CompileContext, ordered: list[gs.Node], devices: list[str],
                      quantization: dict[str, Quantization]) -> None:
    """Weights int8 (asymmetric per channel where the op allows it, else symmetric per layer:
    `weight_params`), Conv biases int32."""
    biases: dict[str, tuple[str, str]] = {}
    per_channel: set[str] = set()
    for node, device in zip(ordered, devices):
        if device != "npu":
            continue
        members, outer = _members(node)
        for member in members:
            if member.op not in PER_CHANNEL_WEIGHTS:
                continue
            data, weight = member.inputs[0], member.inputs[1]
            if isinstance(weight, gs.Constant):
                per_channel.add(weight.name)
                if len(member.inputs) > 2 and isinstance(member.inputs[2], gs.Constant):
                    biases[member.inputs[2].name] = (outer.get(data.name, data.name), weight.name)
    constants = {t.name: t for t in ctx.graph.tensors().values() if isinstance(t, gs.Constant)}
    for name, tensor in ctx.tensors.items():
        if tensor.region == "weight" and tensor.dtype in QUANTIZED_DTYPES and name not in biases:
            quantization[name] = weight_params(constants[name].values, name in per_channel, f"constant {name}")
    for name, (data, weight) in biases.items():  # every bias must fit int32 before any is set
        if data in quantization and weight in quantization:
            quantization[weight] = fit_bias(quantization[weight], quantization[data], constants[name].values)
    for name, (data, weight) in biases.items():
        if data in quantization and weight in quantization:
            quantization[name] = bias_params(quantization[data], quantization[weight])
            _restore(ctx, name, "int32")
        elif ctx.tensors[weight].dtype == "float16":  # a float16 island's convolution
            quantization.pop(name, None)
            _restore(ctx, name, "float16")
        else:  # the conv reads an intermediate of its fused body: no int32 accumulator to add to
            quantization.pop(name, None)
            _restore(ctx, name, dtype_name(constants[name].dtype))


def _keep_parameters_float(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> None:
    """A float constant an NPU op reads as a parameter (Resize's roi and scales, ...) is not
    data: it keeps its float dtype, as int8 would change the output shape it gives."""
    for node, device in zip(ordered, devices):
        if device != "npu":
            continue
        for member in _members(node)[0]:
            positions = ONNX_TO_KERNEL.get(member.op, ("", ()))[1]
            for position, tensor in enumerate(member.inputs):
                if position in positions and isinstance(tensor, gs.Constant) and _is_quantized(ctx, tensor.name):
                    _restore(ctx, tensor.name, dtype_name(tensor.dtype))


def _float16_distributions(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> list[str]:
    """The outputs of NPU Softmax steps over 16 or more classes that only the host reads (a
    model output's NPU copy): they are computed and stored in float16, and the plan says so.

    Why: a Softmax output is a probability distribution, and its honest range is [0, 1] whatever
    the calibration data showed (a calibrated maximum below 1 clips any confident answer on other
    inputs). On that range int8's step is 1/255, and an N-way distribution's mean probability
    1/N spans 255/N steps: fewer than DROWNED_LEVELS (as for a Concat operand) once N >= 16,
    and below half a step, rounded to 0, past 510 classes (an ImageNet classifier's 1000). Float16
    keeps every probability to 11 significant bits (down to 2^-14, then steps of 2^-24). No NPU
    step reads the tensor again (the host converts it to float32), so only this step and its
    N outputs pay for the precision; a Softmax another NPU step reads stays int8, since that
    reader would round it to its own int8 grid anyway. rknn-toolkit2 2.5.0 makes the same choice
    on the wide zoo's yolov8n_cls (its final exSoftmax13 in float16 after an exDataConvert of the
    int8 logits; the oplist allows int8 or float16 there)."""
    readers: dict[str, list[str]] = {}
    for node, device in zip(ordered, devices):
        for tensor in node.inputs:
            readers.setdefault(tensor.name, []).append(device)
    chosen = []
    for node, device in zip(ordered, devices):
        if device != "npu" or node.op != "Softmax" or not _is_quantized(ctx, node.outputs[0].name):
            continue
        output = node.outputs[0]
        if set(readers.get(output.name, ["npu"])) != {"host"}:
            continue
        classes = _softmax_classes(node, ctx.graph.opset)
        # where the NPU runs Softmax only in int8 (RV1106B), the distribution stays int8
        if classes is not None and classes * DROWNED_LEVELS > INT8[1] - INT8[0] and _computes_float16(ctx, node):
            chosen.append((output.name, classes))
    return _recorded(ctx, "float16_softmax_outputs", [name for name, _ in chosen],
                     f"{len(chosen)} Softmax model output(s) computed in float16 ("
                     + ", ".join(f"{name}: {classes} classes" for name, classes in chosen)
                     + f"; int8 on [0, 1] would give the mean probability fewer than {DROWNED_LEVELS} steps)")


def _recorded(ctx: CompileContext, name: str, chosen: list[str], note: str) -> list[str]:
    """`chosen`, the tensors a technique computes in float16, recorded in the plan's
    int8_techniques as `name` with `note` when there are any."""
    if chosen:
        ctx.int8_techniques.append(Int8Technique(name, tuple(chosen), (), note))
    return chosen


def _float16_attention_scores(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> list[str]:
    """The scores of an NPU attention, on a target whose toolkit cannot build them in int8
    (`Target.builds_int8_attention_scores`): the int8 output of a MatMul of two activations that
    a Softmax reads, where a MatMul reads the Softmax's output (through Transposes and Reshapes).
    The MatMul writing them computes in float16, as the toolkit's hybrid quantization would; the
    Softmax and the second MatMul stay int8. Records which in the plan's int8 techniques."""
    npu = {node.name for node, device in zip(ordered, devices) if device == "npu"}
    chosen = []
    for node in ordered:
        if node.name not in npu or node.op != "Softmax" or not node.inputs[0].inputs:
            continue
        scores, (source,) = node.inputs[0], node.inputs[0].inputs
        if (source.name not in npu or source.op != "MatMul" or not _is_quantized(ctx, scores.name)
                or any(isinstance(operand, gs.Constant) for operand in source.inputs)):
            continue
        # where the NPU runs the MatMul only in int8 (RV1106's exMatMul), the scores stay int8
        if _reaches_matmul(node.outputs[0], npu) and _computes_float16(ctx, source):
            chosen.append(scores.name)
    return _recorded(ctx, "float16_attention_scores", chosen,
                     f"{len(chosen)} attention score tensor(s) computed in float16 ({', '.join(chosen)}): "
                     f"{ctx.target.name}'s toolkit cannot build an int8 MatMul -> Softmax -> MatMul")


#: A float constant at or below this is a mask's: what an attention adds to the scores of the
#: tokens it may not attend (Hugging Face models add -10000, float32's minimum or -inf)
MASK_VALUE = -1e4
#: the ops whose constants are masks when they hold MASK_VALUE, not weights
MASKING_OPS = frozenset({"Add", "Sub", "Mul", "Where", "Min", "Max", "Concat", "Expand", "Tile"})


def _float16_masks(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]) -> tuple[list[str], list[str]]:
    """The int8 tensors that carry a mask to the Softmax it masks: each output of an NPU step
    (or NPU copy of a CPU step's output) that a mask constant (a value at or below MASK_VALUE,
    -inf included, that an element-wise or joining member reads) or a tensor carrying one
    reaches, and that itself reaches the input of a step with a Softmax (a clamp's bound of
    -1e9 reaches none). Computed in float16, and the plan says so.

    Why: such a tensor holds the mask's value beside the values it masks, and int8 cannot hold
    both. A range that covers the mask leaves the scores one or two integers, so every token is
    attended alike (hf_llama_tiny's dynamo export adds float32's minimum: scale 1.3e36); one that
    does not (an infinity never is in a calibrated range) clips the mask to the scores' lowest
    value, so the masked tokens are attended (its torchscript export's -inf: the Softmax steps at
    cosine 0.51, the output 0.911). Float16 holds both: -inf, or -65504 for a larger constant,
    whose exponential is 0 as well. Whatever the calibration data held, which for a padding mask
    is often none of it.

    A tensor whose step the target's NPU runs only in int8 (oplist T1: RV1106's Add, Mul, Sub)
    stays int8, and is returned second, for its parameters to say what that costs."""
    carrying: dict[str, str] = {}  # tensor -> the device of the step writing it
    softmax_steps = set()
    for node, device in zip(ordered, devices):
        members = _members(node)[0]
        if any(member.op == "Softmax" for member in members):
            softmax_steps.add(node.name)
            continue
        if any(t.name in carrying for t in node.inputs) or any(
                isinstance(t, gs.Constant) and member.op in MASKING_OPS and _holds_mask(t)
                for member in members for t in member.inputs):
            carrying.update((t.name, device) for t in node.outputs)
    # only what reaches a Softmax: a large constant elsewhere (a clamp's bound) masks nothing
    masking: set[str] = set()
    for node in reversed(ordered):
        if node.name in softmax_steps or any(t.name in masking for t in node.outputs):
            masking.update(t.name for t in node.inputs if t.name in carrying)
    # an NPU step's output, or the host's NPU copy of a CPU step's
    found = [name for name, device in carrying.items()
             if name in masking and device != "cpu" and _is_quantized(ctx, name)]
    writers = {t.name: node for node in ordered for t in node.outputs}
    unmasked = [name for name in found if not _computes_float16(ctx, writers[name])]
    chosen = [name for name in found if name not in unmasked]
    return _recorded(ctx, "float16_masks", chosen,
                     f"{len(chosen)} tensor(s) carrying an attention mask computed in float16 (int8 cannot hold "
                     f"a mask value, at or below {MASK_VALUE:g}, beside the scores it masks)"), unmasked


def _computes_float16(ctx: CompileContext, node: gs.Node) -> bool:
    """Whether the target's NPU may run `node` (every member of a fused one) in float16: no
    member's data-type constraint (oplist T1) leaves float16 out. A host conversion may."""
    if ctx.placement[node.name].device != "npu":
        return ctx.target.supports_dtype("float16")
    return ctx.target.supports_dtype("float16") and all(
        "float16" in (ctx.target.rule_parameter(member.op, "plan_dtype", "dtypes") or ("float16",))
        for member in _members(node)[0])


def _holds_mask(constant: gs.Constant) -> bool:
    values = np.asarray(constant.values)
    return values.dtype.kind == "f" and values.size > 0 and bool(np.nanmin(values) <= MASK_VALUE)


#: the grid of attention probabilities (a Softmax's output, in [0, 1]): `activation_params`
#: of that range, scale 1/255 and zero point -128
PROBABILITIES_RANGE = (0.0, 1.0)


def _int8_fused_attention_probabilities(ctx: CompileContext, ordered: list[gs.Node], devices: list[str]
                                        ) -> dict[str, Quantization]:
    """The probabilities inside a fused NPU attention (the exSDPAttention step's Softmax
    output, which its second MatMul reads) on an int8 grid for [0, 1], on a target whose toolkit
    cannot build an int8 attention (`Target.builds_int8_attention_scores`): rknn-toolkit2 2.5.0
    builds such an attention with float16 scores and int8 probabilities, and crashes (signal 11)
    on the QDQ export of one whose inside is all float (transformer_encoder) or all int8. The
    plan stores these parameters of the step's intermediate, the emulator rounds the
    probabilities to them inside the step, and the export writes their pair."""
    chosen: dict[str, Quantization] = {}
    for node, device in zip(ordered, devices):
        if device != "npu" or "body" not in node.attrs:
            continue
        members = node.attrs["body"].nodes  # the kernel's own members, those the emulator rounds
        member_names, step_outputs = {member.name for member in members}, {t.name for t in node.outputs}
        for member in members:
            probabilities = member.outputs[0] if member.op == "Softmax" else None
            if (probabilities is None or probabilities.name in step_outputs
                    or not _is_quantized(ctx, node.outputs[0].name)):
                continue
            scores = _scaled_source(member.inputs[0])
            if (scores is not None and scores.name in member_names and scores.op == "MatMul"
                    and any(reader.name in member_names and reader.op == "MatMul" for reader in probabilities.outputs)):
                chosen[probabilities.name] = activation_params(*PROBABILITIES_RANGE, "attention probabilities",
                                                               ctx.target.allows_activation_zero_point_0)
    if chosen:
        ctx.int8_techniques.append(Int8Technique(
            "int8_attention_probabilities", tuple(chosen), (),
            f"{len(chosen)} fused attention probability tensor(s) on an int8 grid for [0, 1] "
            f"({', '.join(chosen)}): {ctx.target.name}'s toolkit builds a fused attention with int8 "
            f"probabilities and float16 scores"))
    return chosen


def _scaled_source(tensor: gs.Variable) -> gs.Node | None:
    """The node writing `tensor`, past Muls and Divs by a constant (an attention's scaling of its
    scores)."""
    source = tensor.inputs[0] if tensor.inputs else None
    while (source is not None and source.op in ("Mul", "Div") and len(source.inputs) == 2
           and isinstance(source.inputs[1], gs.Constant) and source.inputs[0].inputs):
        source = source.inputs[0].inputs[0]
    return source


def _reaches_matmul(tensor: gs.Variable, npu: set[str]) -> bool:
    """Whether an NPU MatMul reads `tensor`, directly, through NPU Transposes and Reshapes, or
    as a step fused around one (the plan's exMatMul of a Transpose, a MatMul and a Reshape)."""
    for reader in tensor.outputs:
        if reader.name not in npu:
            continue
        if any(member.op == "MatMul" for member in _members(reader)[0]):
            return True
        if reader.op in ("Transpose", "Reshape") and _reaches_matmul(reader.outputs[0], npu):
            return True
    return False


def _softmax_classes(node: gs.Node, opset: int) -> int | None:
    """How many values one distribution of the Softmax holds: the axis's length (opset 13 on;
    before, the input is coerced to 2-D at the axis, so the product of the dims from it)."""
    shape = node.inputs[0].shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1)) % len(shape)
    return int(shape[axis]) if opset >= 13 else int(np.prod(shape[axis:]))


def _make_float16_islands(ctx: CompileContext, ordered: list[gs.Node], devices: list[str], wanted: set[str]) -> None:
    """--float16 TENSOR: the NPU step writing TENSOR computes in float16 (rknn-toolkit2's hybrid
    quantization): its outputs and the weights only it reads are stored as float16 and get no
    quantization parameters; an int8 input is dequantized as it is read, and an int8 step that
    reads a float16 output quantizes it with its own calibrated parameters. TENSOR may also be
    the NPU copy of a model input or of a CPU step's output (`NAME@npu`): the host then converts
    it to float16, so the first steps of a network whose error grows with depth see it unrounded,
    and a mask a CPU step makes reaches the NPU whole (`_float16_masks`). A host step that
    converts an island's output (to a model output, or for a CPU step) reads float16."""
    if not wanted:
        return
    island_steps = [node for node, device in zip(ordered, devices)
                    if device == "npu" and wanted & {t.name for t in node.outputs}]
    conversions = [node for node, device in zip(ordered, devices)
                   if device == "host" and node.outputs[0].name in wanted]
    written = {t.name for node in island_steps + conversions for t in node.outputs}
    for name in sorted(wanted):
        if name not in written or not _is_quantized(ctx, name):  # only --float16 names can miss
            raise CompileError(f"--float16 {name}: not an int8 tensor an NPU step or a conversion to the NPU "
                               f"writes (rkcompile run --dtype int8 --accuracy-analysis lists them)")
    for node in island_steps:  # the techniques above choose none of these: a --float16 name
        if not _computes_float16(ctx, node):
            name = sorted(wanted & {t.name for t in node.outputs})[0]
            raise CompileError(f"--float16 {name}: {ctx.target.name}'s NPU runs the step writing it "
                               f"({ctx.placement[node.name].kernel}) only in int8 (oplist data-type constraint T1)")
    for node in conversions:  # the tensor reaches the NPU as float16, not quantized by the host
        _restore(ctx, node.outputs[0].name, "float16")
        _relabel_conversion(ctx, node, "to")
    readers: dict[str, set[str]] = {}
    for node in ordered:
        for member in _members(node)[0]:
            for tensor in member.inputs:
                readers.setdefault(tensor.name, set()).add(node.name)
    islands = {node.name for node in island_steps}
    for node in island_steps:
        weights = {t.name for member in _members(node)[0] for t in member.inputs if isinstance(t, gs.Constant)}
        for name in {name for name in weights if readers[name] <= islands} | {t.name for t in node.outputs}:
            if _is_quantized(ctx, name):
                _restore(ctx, name, "float16")
    island_outputs = {t.name for node in island_steps for t in node.outputs}
    for node, device in zip(ordered, devices):
        if device == "host" and node.inputs and node.inputs[0].name in island_outputs:
            _relabel_conversion(ctx, node, "from")


def _relabel_conversion(ctx: CompileContext, node: gs.Node, side: str) -> None:
    """A host conversion's `from` or `to` side now holds float16 (`NC1HWC2 int8` -> `NC1HWC2
    float16`), and its kernel name says so."""
    node.attrs[side] = node.attrs[side].rsplit(" ", 1)[0] + " float16"
    ctx.placement[node.name] = replace(ctx.placement[node.name], kernel=f"{node.attrs['from']} -> {node.attrs['to']}")


def _restore(ctx: CompileContext, name: str, dtype: str) -> None:
    placed = ctx.tensors[name]
    if placed.layout == "NC1HWC2":  # the channel padding follows the dtype's C2
        size = nc1hwc2_bytes(as_nchw(placed.shape), ctx.target.c2_for(dtype), itemsize(dtype))
    else:
        size = element_count(placed.shape) * itemsize(dtype)
    ctx.tensors[name] = replace(placed, dtype=dtype, bytes=size)
