"""Two ways an int8 plan loses less without retraining (Nagel et al., "Data-Free Quantization
Through Weight Equalization and Bias Correction", ICCV 2019), used by the quantize pass:

- **Cross-layer equalization** (`settle`, `apply`): in Conv -> f -> Conv, where f commutes with a
  positive scale per channel (identity, Relu, LeakyRelu, max and average pooling), dividing the
  first Conv's output channel i (weights and bias) by s_i and multiplying the second Conv's
  weights that read channel i by s_i leaves the float outputs unchanged, since
  f(x / s) = f(x) / s. s_i = sqrt(r1_i / r2_i), r1_i and r2_i the largest |weight| of channel i
  in each Conv, gives both the same range sqrt(r1_i r2_i); chains are swept until the scales
  settle. Clip (ReLU6) does not commute: Clip(x / s, 0, 6) clips channel i at 6 s_i in x's
  terms, and ONNX Clip takes one bound for every channel, so such a pair is declined with that
  reason, as is any other activation or fused operand (ConvAdd's residual is not scaled).
- **Bias correction** (`WeightErrorMeans`, `correct_biases`): an int8 Conv computes with its
  weights rounded, W_q = W + e, so each output channel shifts by the mean of conv(x, e) over
  the calibration inputs x (the float inputs the calibration run observes); subtracting that
  mean from the bias removes the expected shift. The float reference (accuracy analysis, and a
  saved plan's `reference_weights.npz`) keeps the model's own bias.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.nodes import fused_body
from rkcompile.quantization.params import dequantize, quantize, weight_params

#: Ops f with f(x / s) = f(x) / s for a positive scale s per channel.
SCALE_COMMUTING = frozenset({"Relu", "LeakyRelu", "MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool"})
#: Sweeps over all pairs at most, and the largest |log s| below which the scales have settled.
SWEEPS = 20
SETTLED = 1e-3


def members(node: gs.Node) -> list[gs.Node]:
    """The ONNX nodes one step runs: a fused step's body members (passes/fuse.py), else itself."""
    body = fused_body(node)
    return [inner for member in body.nodes for inner in members(member)] if body is not None else [node]


def constant_weight(conv: gs.Node) -> bool:
    return (len(conv.inputs) > 1 and isinstance(conv.inputs[1], gs.Constant)
            and np.asarray(conv.inputs[1].values).ndim >= 3
            and (len(conv.inputs) < 3 or not conv.inputs[2].name or isinstance(conv.inputs[2], gs.Constant)))


def set_constant(step: gs.Node, name: str, values: np.ndarray) -> None:
    """New values for constant `name` everywhere `step` holds it: its inputs and its fused
    body's copies (passes/fuse.py copies constants into the body)."""
    for tensor in step.inputs:
        if isinstance(tensor, gs.Constant) and tensor.name == name:
            tensor.values = values
    for member in members(step):
        if member is step:
            continue
        for tensor in member.inputs:
            if isinstance(tensor, gs.Constant) and tensor.name == name:
                tensor.values = values


def replace_constant(step: gs.Node, name: str, constant: gs.Constant) -> None:
    """`constant` instead of constant `name` in `step` and its fused body's copies, the other
    readers of `name` unchanged."""
    for node in [step] + [member for member in members(step) if member is not step]:
        for index, tensor in enumerate(node.inputs):
            if isinstance(tensor, gs.Constant) and tensor.name == name:
                node.inputs[index] = constant if node is step else gs.Constant(constant.name, constant.values)


# ---- cross-layer equalization --------------------------------------------------------------

@dataclass
class Pair:
    """Conv `first` (in step `first_step`) feeding Conv `second` (in `second_step`) through
    steps that commute with channel scales."""
    first_step: gs.Node
    first: gs.Node
    second_step: gs.Node
    second: gs.Node
    #: the tensors from the first step's output to the second's data input, each of which the
    #: equalized graph computes divided by the pair's scales along its channel axis (1)
    scaled: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.first_step.name} -> {self.second_step.name}"


@dataclass
class Equalization:
    pairs: list[Pair] = field(default_factory=list)
    #: "first -> second: why not" for each Conv -> ... -> Conv chain left as it is
    declined: list[str] = field(default_factory=list)
    sweeps: int = 0
    #: per pair, the product of its scales over the sweeps (`settle`)
    scales: list[np.ndarray] = field(default_factory=list)
    #: constant name -> what its values are multiplied by: per (output, input) channel for a
    #: weight, per channel for a bias (`settle`; `apply` multiplies and sets them)
    factors: dict[str, np.ndarray] = field(default_factory=dict)
    #: constant name -> the step holding it
    steps: dict[str, gs.Node] = field(default_factory=dict)

    def scaled_tensors(self) -> dict[str, np.ndarray]:
        """Each tensor the equalized graph computes divided along axis 1: the scales it is divided by."""
        return {name: scale for pair, scale in zip(self.pairs, self.scales) for name in pair.scaled}


def find_pairs(ordered: list[gs.Node], devices: list[str], graph_outputs: set[str]) -> Equalization:
    """Every Conv step whose only reader chain, through scale-commuting single-reader steps,
    ends at a Conv reading it as data; and the chains that do not qualify, with the reason."""
    readers: dict[str, list[int]] = {}
    weight_readers: dict[str, int] = {}
    for index, node in enumerate(ordered):
        for tensor in node.inputs:
            if isinstance(tensor, gs.Constant):
                weight_readers[tensor.name] = weight_readers.get(tensor.name, 0) + 1
            elif tensor.name:
                readers.setdefault(tensor.name, []).append(index)
    found = Equalization()
    for index, (step, device) in enumerate(zip(ordered, devices)):
        body = members(step)
        if device != "npu" or body[0].op != "Conv" or not constant_weight(body[0]) or len(step.outputs) != 1:
            continue
        after = [member.op for member in body[1:]]
        tensor = step.outputs[0].name
        scaled = [tensor]
        chain_reason = None
        while True:
            read_by = readers.get(tensor, [])
            if tensor in graph_outputs or len(read_by) != 1:
                break
            reader = ordered[read_by[0]]
            reader_body = members(reader)
            if devices[read_by[0]] != "npu":
                break
            if reader_body[0].op == "Conv" and constant_weight(reader_body[0]):
                second = reader_body[0]
                data = reader.inputs[0].name if reader.inputs else ""
                inner = second.inputs[0].name
                reads_elsewhere = sum(t.name == inner for m in reader_body for t in m.inputs) > 1
                if data != tensor or reads_elsewhere:
                    chain_reason = f"{reader.name} reads {tensor} other than as its Conv's data"
                else:
                    chain_reason = _declined_activation(after) or _shared_weights(body[0], second, weight_readers)
                    if chain_reason is None:
                        found.pairs.append(Pair(step, body[0], reader, second, tuple(scaled)))
                if chain_reason is not None:
                    found.declined.append(f"{step.name} -> {reader.name}: {chain_reason}")
                break
            if len(reader_body) == 1 and reader_body[0].op in SCALE_COMMUTING and len(reader.outputs) == 1:
                tensor = reader.outputs[0].name
                scaled.append(tensor)
                continue
            break
    return found


def _declined_activation(after: list[str]) -> str | None:
    for op in after:
        if op == "Clip":
            return ("Clip (ReLU6) has one bound for every channel: a channel scaled by 1/s would clip at "
                    "s times its bound, so equalization would change the outputs")
        if op not in SCALE_COMMUTING:
            return f"{op} fused after the Conv does not commute with a per-channel scale"
    return None


def _shared_weights(first: gs.Node, second: gs.Node, weight_readers: dict[str, int]) -> str | None:
    for conv in (first, second):
        for tensor in conv.inputs[1:3]:
            if tensor.name and weight_readers.get(tensor.name, 1) > 1:
                return f"{tensor.name} is shared with another step"
    return None


def settle(found: Equalization) -> None:
    """The pairs' scales (`found.scales`) and each constant's factors (`found.factors`), swept
    until they settle, the graph untouched: the quantize pass calibrates on the model's own
    weights and observes the pairs' tensors as the equalized graph computes them before `apply`
    scales the weights.

    A scale multiplies a weight's output or input channel whole, so a sweep needs only each
    weight's largest |value| per (output, input) channel over its kernel taps and the factors of
    its channels (`ChannelPeaks`): the sweeps never touch a weight, and `apply` scales each once.
    (Scaling the whole weights at every sweep took 1.6 s of a 5.4 s tv_resnet50 int8 plan.)"""
    peaks: dict[str, ChannelPeaks] = {}  # weight name -> its peaks and factors
    biases: dict[str, str] = {}  # a pair's first Conv's bias -> its weight, whose output factors it takes

    def of(conv: gs.Node) -> ChannelPeaks:
        weight = conv.inputs[1]
        if weight.name not in peaks:
            peaks[weight.name] = ChannelPeaks(np.asarray(weight.values), int(conv.attrs.get("group", 1)))
        return peaks[weight.name]

    found.scales = [np.ones(pair.first.inputs[1].shape[0]) for pair in found.pairs]
    for sweep in range(1, SWEEPS + 1):
        largest = 0.0
        for index, pair in enumerate(found.pairs):
            first, second = of(pair.first), of(pair.second)
            r1, taps = first.output_peaks(), second.input_peaks()
            scale = np.ones(r1.size)
            usable = (r1 > 0) & (taps > 0)
            scale[usable] = np.sqrt(r1[usable] / taps[usable])
            largest = max(largest, float(np.abs(np.log(scale)).max(initial=0)))
            found.scales[index] = found.scales[index] * scale
            first.scale_outputs(1 / scale)
            second.scale_inputs(scale)
            found.steps[pair.first.inputs[1].name] = pair.first_step
            found.steps[pair.second.inputs[1].name] = pair.second_step
            if len(pair.first.inputs) > 2 and pair.first.inputs[2].name:
                found.steps[pair.first.inputs[2].name] = pair.first_step
                biases[pair.first.inputs[2].name] = pair.first.inputs[1].name
        found.sweeps = sweep
        if largest < SETTLED:
            break
    found.factors = {name: channels.factors() for name, channels in peaks.items()}
    found.factors.update((bias, peaks[weight].outputs) for bias, weight in biases.items())


class ChannelPeaks:
    """A Conv weight [M, C/group, *kernel] as `settle` sweeps it: its largest |value| per output
    channel and input of that output's group over the kernel taps (`peaks`), and what its
    output channels (`outputs`, M) and input channels (`inputs`, C) are multiplied by so far. A
    side never scaled has its peaks' maxima made once; a Conv scaled on both sides (the middle
    of a chain of pairs) takes one pass over its peaks per question."""

    def __init__(self, weight: np.ndarray, groups: int):
        values = np.abs(weight)  # in its own dtype: a maximum is one of the values, exact in float64
        self.groups = groups
        # [group, output of the group, input of the group]
        self.peaks = values.reshape(groups, values.shape[0] // groups, values.shape[1], -1).max(axis=3).astype(
            np.float64)
        self.outputs, self.inputs = np.ones(values.shape[0]), np.ones(groups * values.shape[1])
        self.outputs_scaled = self.inputs_scaled = False

    def scale_outputs(self, factor: np.ndarray) -> None:
        self.outputs, self.outputs_scaled = self.outputs * factor, True

    def scale_inputs(self, factor: np.ndarray) -> None:
        self.inputs, self.inputs_scaled = self.inputs * factor, True

    def output_peaks(self) -> np.ndarray:
        """Per output channel, the largest |value| times its factors."""
        if self.inputs_scaled:
            return (self.peaks * self._grouped_inputs()).max(axis=2).reshape(-1) * self.outputs
        return self._row_maxima * self.outputs

    def input_peaks(self) -> np.ndarray:
        """Per input channel, the largest |value| of the outputs reading it times its factors."""
        if self.outputs_scaled:
            return (self.peaks * self.outputs.reshape(self.groups, -1, 1)).max(axis=1).reshape(-1) * self.inputs
        return self._column_maxima * self.inputs

    def factors(self) -> np.ndarray:
        """Each value's factor, per output channel and input of its group: [M, C/group]."""
        return (self.outputs.reshape(self.groups, -1, 1) * self._grouped_inputs()).reshape(self.outputs.size, -1)

    def _grouped_inputs(self) -> np.ndarray:
        return self.inputs.reshape(self.groups, 1, -1)

    @functools.cached_property
    def _row_maxima(self) -> np.ndarray:
        return self.peaks.max(axis=2).reshape(-1)

    @functools.cached_property
    def _column_maxima(self) -> np.ndarray:
        return self.peaks.max(axis=1).reshape(-1)


def apply(found: Equalization) -> None:
    """Each weight and bias `settle` scaled, multiplied by its factors once and set in the graph
    (new arrays: a model's own keep their values for every other holder of them, the accuracy
    analysis's reference and --auto-float16's candidates)."""
    constants = {t.name: t for step in found.steps.values() for node in [step, *members(step)]
                 for t in node.inputs if isinstance(t, gs.Constant)}
    for name, factor in found.factors.items():
        values = np.asarray(constants[name].values, np.float64)
        scaled = values * factor.reshape(factor.shape + (1,) * (values.ndim - factor.ndim))
        set_constant(found.steps[name], name, scaled.astype(np.float32))


# ---- bias correction -----------------------------------------------------------------------

#: conv node, x, kernel shape -> the runtime's per-tap input means (rkcompile/compiler/context.py `Runtime.tap_means`)
TapMeans = Callable[[gs.Node, np.ndarray, tuple[int, ...]], np.ndarray]


def weight_error(weight: np.ndarray) -> np.ndarray:
    """W_q - W for the plan's int8 weights (per output channel, as `weight_params` quantizes a Conv's)."""
    weight = np.asarray(weight, np.float64)
    quant = weight_params(weight, per_channel=True)
    return dequantize(quantize(weight, quant), quant).astype(np.float64) - weight


class WeightErrorMeans:
    """Per Conv, the mean over calibration inputs x of conv(x, W_q - W) per output channel: the
    shift the int8 weights add to the Conv's output. A convolution is linear, so that mean is
    the error contracted with the mean input each kernel tap reads (`Runtime.tap_means`): no
    convolution runs. A tap mean is linear in the input too, so the calibration run sums each
    Conv input over the samples (`observe`) and takes the tap means of that sum once
    (`settle`), not of every sample (mobilenet_v2 on 32 samples: 0.68 s of the int8 build's
    main thread before). `convs` maps a key to the Conv and the name of the step input it reads
    as data (a fused body renames it). The errors are the Conv's weights' when `means` is asked
    (after equalization, when the plan equalizes)."""

    def __init__(self, convs: dict[str, tuple[gs.Node, str]]):
        self.convs = {key: conv for key, (conv, _) in convs.items()}
        self.by_input: dict[str, list[tuple[str, gs.Node]]] = {}
        for key, (conv, data) in convs.items():
            self.by_input.setdefault(data, []).append((key, conv))
        self.sums: dict[str, np.ndarray] = {}  # key -> the sum over samples of its tap means
        self.counts: dict[str, int] = {}
        #: input name -> its float64 sum over the samples observed and not yet settled, and their count
        self._inputs: dict[str, tuple[np.ndarray, int]] = {}

    def observe(self, name: str, value: np.ndarray) -> None:
        """`value` of tensor `name` seen by the calibration run, added to its sum (float64:
        float32 values of one position sum exactly over any calibration set that fits in memory)."""
        if name not in self.by_input:
            return
        found = self._inputs.get(name)
        if found is None:
            self._inputs[name] = (np.array(value, np.float64), 1)
        else:
            total, count = found
            np.add(total, value, out=total)
            self._inputs[name] = (total, count + 1)

    def settle(self, tap_means: TapMeans) -> None:
        """The tap means of each observed input's sum (`tap_means`, the runtime's:
        `Runtime.tap_means`) added to the sums of the Convs that read it, in the order the run
        observed them, as the summary lists them."""
        for name, (total, count) in self._inputs.items():
            for key, conv in self.by_input[name]:
                self.sums[key] = self.sums.get(key, 0) + tap_means(conv, total, tuple(conv.inputs[1].shape[2:]))
                self.counts[key] = self.counts.get(key, 0) + count
        self._inputs.clear()

    def copy(self) -> "WeightErrorMeans":
        """A copy whose sums `divide_inputs` can change without changing this one's."""
        copied = copy.copy(self)
        copied.sums, copied.counts = dict(self.sums), dict(self.counts)
        return copied

    def divide_inputs(self, scales: dict[str, np.ndarray]) -> None:
        """The sums as inputs divided by per-channel `scales` (tensor name -> scale per channel
        of axis 1) give them, as the equalized graph computes a pair's tensors: a tap mean is
        linear in its input."""
        for name, scale in scales.items():
            for key, _ in self.by_input.get(name, ()):
                if key in self.sums:
                    total = self.sums[key]
                    self.sums[key] = total / scale.reshape((-1,) + (1,) * (total.ndim - 1))

    def means(self) -> dict[str, np.ndarray]:
        return {key: _contracted(weight_error(self.convs[key].inputs[1].values), total / self.counts[key])
                for key, total in self.sums.items()}


def _contracted(error: np.ndarray, tap_means: np.ndarray) -> np.ndarray:
    """Per output channel of a (grouped) Conv's weight `error` (M, C/group, *kernel), its sum
    over the channels and taps it reads, weighted by `tap_means` (C, *kernel)."""
    groups = tap_means.shape[0] // error.shape[1]
    per_group = error.reshape(groups, error.shape[0] // groups, -1)
    return np.einsum("gmt,gt->gm", per_group, tap_means.reshape(groups, -1)).reshape(-1)


def corrected_bias(bias: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The bias that cancels the expected output shift of rounded weights."""
    return (np.asarray(bias, np.float64) - shift).astype(np.float32)
