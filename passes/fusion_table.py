"""The fusion table: every fused kernel rkcompile forms, as rows of (kernel, pattern, predicates).

Two tables run in order. `RECOGNISERS` turn an exporter's spelling of one operation (SiLU as
Sigmoid*Mul, GELU as Erf arithmetic, LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div, attention as
MatMul/Softmax/MatMul) into the one kernel the NPU has for it. `KERNEL_FUSIONS` then join a
producer with what follows it (Conv + Relu, Add + Relu, ...), and may take a recognised node as a
member (Conv + exSwish -> ConvExSwish). Within a table the first row that fits a root wins, so
longer chains come first.

A row applies only when the target lists `requires` (the oplist V2.3.2 kernel name); the step
shows `kernel`, rknn-toolkit2's name for the same fusion (peer/zoo_rk3588.json), so plans compare
with the peer by name. Each predicate is `check(match) -> (ok, detail)`; its docstring is the rule
a user reads when a candidate is not fused, and cites its source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from rkcompile.ir.patterns import Alt, Any, Chain, Const, Match, Op, Pattern, optional
from rkcompile.ir.graph import static_shape

Predicate = Callable[[Match], tuple[bool, str]]

#: ONNX ops the oplist's Convolution kernel runs (targets/common.py maps Gemm to it too).
CONV = ("Conv", "Gemm")


@dataclass(frozen=True)
class FusionRule:
    """One row. `absorbs` says the members are an exporter's spelling of the kernel, not kernels
    the NPU runs one by one: their own op rules (a Sub's broadcast limits inside a LayerNorm)
    then do not apply, only the target's common rules and the row's predicates, which state the
    fused kernel's own limits. Otherwise every member must pass its own rules."""

    kernel: str
    requires: str
    pattern: Pattern
    predicates: tuple[Predicate, ...] = ()
    attributes: Callable[[Match], dict] = field(default=lambda match: {})
    absorbs: bool = False
    #: labels of the kernel's inputs that it broadcasts along any axis itself (fuse.apply_fusion
    #: stores a constant there at its smallest shape)
    broadcasts: tuple[str, ...] = ()


# --- predicates ---------------------------------------------------------------------------


def _rank(tensor) -> int | None:
    shape = static_shape(tensor)
    return None if shape is None else len(shape)


def _last_axis(axis: int, rank: int | None) -> bool:
    return rank is not None and axis in (-1, rank - 1)


def _scalar(values: np.ndarray) -> bool:
    return values.size == 1


def slope_scalar_or_per_channel(match: Match) -> tuple[bool, str]:
    """PRelu's slope is one value or one value per output channel: ConvolutionPRelu/LeakyRelu
    applies the activation per channel of the convolution output (oplist V2.3.2, RK3588
    3.2.9 ConvolutionPRelu/LeakyRelu; issue 4)."""
    slope = match.constant("slope")
    rank = _rank(match.nodes["activation"].outputs[0]) or slope.ndim
    aligned = (1,) * (rank - slope.ndim) + slope.shape
    varying = [axis for axis, size in enumerate(aligned) if size != 1]
    return varying in ([], [1]), f"slope shape {tuple(slope.shape)}"


def clip_bounds_constant(match: Match) -> tuple[bool, str]:
    """Clip's min and max are constants, fixed when the kernel is built (oplist V2.3.2,
    RK3588 3.2.8 ConvolutionClip: Output = Clip(Conv(Input)))."""
    clip = match.nodes["clip"]
    dynamic = [t.name for t in clip.inputs[1:] if t.name and t.inputs]
    return not dynamic, f"bound {', '.join(dynamic)} is computed" if dynamic else ""


def operand_same_shape(match: Match) -> tuple[bool, str]:
    """The added operand has the convolution output's shape: ConvolutionAdd adds a second
    feature map, Output = Add(Conv(Input0), Input1) (oplist V2.3.2, RK3588 3.2.10/3.2.19)."""
    made, other = static_shape(match.nodes["conv"].outputs[0]), static_shape(match.tensors["other"])
    return made is not None and made == other, f"{other} added to {made}"


def hard_sigmoid_is_relu6_over_6(match: Match) -> tuple[bool, str]:
    """HardSigmoid has alpha 1/6 and beta 0.5, so x * HardSigmoid(x) is HardSwish (seed 001,
    HardSwish: y = x * HardSigmoid(x) with alpha=1/6, beta=0.5)."""
    attrs = match.nodes["hard_sigmoid"].attrs
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    ok = np.isclose(alpha, 1 / 6, rtol=1e-3) and np.isclose(beta, 0.5, rtol=1e-3)
    return bool(ok), f"alpha {alpha:g}, beta {beta:g}"


def split_halves_on_channels(match: Match) -> tuple[bool, str]:
    """The Split cuts axis 1 into two equal halves: exGlu splits on axis 1 only (seed 001,
    exGlu, attribute axis: only 1 is supported)."""
    split = match.nodes["split"]
    rank = _rank(match.tensors["x"])
    axis = int(split.attrs.get("axis", 0))
    axis = axis + rank if rank is not None and axis < 0 else axis
    halves = [static_shape(t) for t in split.outputs]
    ok = axis == 1 and len(halves) == 2 and halves[0] is not None and halves[0] == halves[1]
    return ok, f"axis {axis}, parts {halves}"


def reduction_axes(node) -> list[int] | None:
    """A Reduce* node's axes, from its attribute or (newer opsets) its constant input; None when
    not given or not constant."""
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1 and node.inputs[1].name:
        values = getattr(node.inputs[1], "values", None)
        return None if values is None else [int(a) for a in np.asarray(values).reshape(-1)]
    return None


#: ops taking a norm's means: ReduceMean, or GlobalAveragePool over every axis after the
#: first two (tf2onnx writes a mean over the last axis of [N, L, C] as one)
MEAN_OPS = ("ReduceMean", "GlobalAveragePool")


#: the ops of a norm's match whose axes are the normalized ones
NORMALIZING_OPS = (*MEAN_OPS, "LayerNormalization", "Conv")


def mean_axes(node, rank: int) -> list[int] | None:
    """The axes a MEAN_OPS node averages, keeping them, sorted; None when they are not known or
    not kept."""
    if node.op == "GlobalAveragePool":
        return list(range(2, rank))
    if not node.attrs.get("keepdims", 1):
        return None
    axes = reduction_axes(node)
    return None if axes is None else sorted(a % rank for a in axes)


def _normalized_axes(node, rank: int) -> list[int] | None:
    if node.op == "Conv":  # a mean over the channels (channel_mean_convolution)
        return [1]
    if node.op == "LayerNormalization":
        axis = int(node.attrs.get("axis", -1)) % rank
        return list(range(axis, rank))
    return mean_axes(node, rank)


def normalizes_supported_axes(match: Match) -> tuple[bool, str]:
    """The normalized axes, on the 4-D view (leading 1s for lower ranks), are [1] or [1,2,3],
    keeping dims (seed 001, exNorm, axes: only [1] and [1,2,3])."""
    rank = _rank(match.tensors["x"])
    if rank is None or rank > 4:
        return False, f"rank {rank}"
    seen = {label: _normalized_axes(node, rank) for label, node in match.nodes.items()
            if node.op in NORMALIZING_OPS}
    viewed = {label: None if axes is None else [a + 4 - rank for a in axes] for label, axes in seen.items()}
    return all(axes in ([1], [1, 2, 3]) for axes in viewed.values()), f"axes {viewed}"


def _sums_the_channels(conv, weights: np.ndarray, channels: int | None) -> bool:
    """`conv` (of `weights`) weighs the C input channels alike into one output channel: a 1x1
    kernel, group 1, no stride, pad or dilation."""
    plain = (int(conv.attrs.get("group", 1)) == 1 and all(int(v) == 1 for key in ("strides", "dilations")
             for v in conv.attrs.get(key, [1, 1])) and not any(conv.attrs.get("pads", [0] * 4))
             and conv.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET"))
    return (plain and channels is not None and weights.shape == (1, channels, 1, 1)
            and bool(np.all(weights == weights.reshape(-1)[0])))


def channel_mean_convolution(match: Match) -> tuple[bool, str]:
    """The Conv sums the channels evenly: one 1x1 output channel of one positive weight w for
    each of the C input channels, group 1, no stride, pad or dilation, one bias value b, so
    x * (w * sum(x^2) + b)^-0.5 is (w*C)^-0.5 times an RMSNorm over axis 1 with epsilon
    b / (w*C), exNorm's axes [1] (seed 001, exNorm: RMSNormalization)."""
    conv, weights = match.nodes["mean_square"], match.constant("mean_weights")
    shape = static_shape(match.tensors["x"])
    channels = None if shape is None or len(shape) != 4 else shape[1]
    uniform = _sums_the_channels(conv, weights, channels) and float(weights.reshape(-1)[0]) > 0
    return uniform and _scalar(match.constant("epsilon")), f"weights {weights.shape} on {shape}"


def channel_mean_and_variance_convolutions(match: Match) -> tuple[bool, str]:
    """layer_norm_by_channel_convs: the first Conv takes -mean over the C channels (weights
    -1/C, no bias), the second the mean of the squared deviations plus epsilon (weights 1/C, one
    bias value), so the ops are a LayerNorm over axis 1, exNorm's axes [1] (seed 001, exNorm)."""
    shape = static_shape(match.tensors["x"])
    channels = None if shape is None or len(shape) != 4 else shape[1]
    centring, spread = match.nodes["negated_mean"], match.nodes["variance"]
    negated, mean = match.constant("negated_mean_weights"), match.constant("mean_weights")
    unbiased = len(centring.inputs) < 3 or not np.any(np.asarray(getattr(centring.inputs[2], "values", 1)))
    ok = (channels is not None and unbiased and _scalar(match.constant("epsilon"))
          and _sums_the_channels(centring, negated, channels) and _sums_the_channels(spread, mean, channels)
          and np.isclose(float(negated.reshape(-1)[0]) * channels, -1.0, rtol=1e-6)
          and np.isclose(float(mean.reshape(-1)[0]) * channels, 1.0, rtol=1e-6))
    return ok, f"weights {negated.shape} and {mean.shape} on {shape}"


def statistics_restate_the_input(match: Match) -> tuple[bool, str]:
    """The mean and the mean square of statistics_layer_norm reduce the same axes of x, a
    sum's divisor is the count of elements it sums, and what meets x again has x's rank with
    the reduced axes kept as 1 (a Reshape puts back what keepdims 0 dropped): then the ops are
    a LayerNorm over those axes."""
    shape = static_shape(match.tensors["x"])
    if shape is None:
        return False, "x's shape is unknown"
    axes = statistics_axes(match)
    if axes is None:
        return False, "its sums do not share one set of constant axes"
    count = int(np.prod([shape[a] for a in axes]))
    divisors = [_scalar_value(match, label) for label in ("mean_divisor", "mean_square_divisor") if label in match.tensors]
    if any(not np.isclose(divisor * count, 1.0, rtol=1e-6) for divisor in divisors):
        return False, f"divisors {divisors} for sums of {count} elements"
    kept = [1 if a in axes else size for a, size in enumerate(shape)]
    for label in ("centre", "spread"):
        restated = static_shape(match.nodes[label].outputs[0]) if label in match.nodes else None
        if restated is None or [1] * (len(shape) - len(restated)) + list(restated) != kept:
            return False, f"its statistics meet x {shape} as {restated}"
    return True, f"axes {list(axes)}"


def statistics_axes(match: Match) -> tuple[int, ...] | None:
    """The axes statistics_layer_norm's reductions share (sorted, non-negative), or None."""
    rank = _rank(match.tensors["x"])
    found = {None if axes is None or rank is None else tuple(sorted(a % rank for a in axes))
             for axes in (reduction_axes(node) for node in match.members if node.op in ("ReduceSum", "ReduceMean"))}
    return next(iter(found)) if len(found) == 1 else None


def layer_norm_output_only(match: Match) -> tuple[bool, str]:
    """Only LayerNormalization's normalized output is read: exNorm returns Y alone (seed 001,
    exNorm outputs)."""
    extra = [t.name for t in match.nodes["norm"].outputs[1:] if t.name and t.outputs]
    return not extra, f"{', '.join(extra)} is read" if extra else ""


def scales_are_scalars(match: Match) -> tuple[bool, str]:
    """Attention scales are scalars: exSDPAttention takes one float scale (seed 001,
    exSDPAttention, scale: T3 float scalar)."""
    shapes = {label: match.constant(label).shape for label in ("q_scale", "k_scale", "scale")
              if label in match.tensors}
    return all(int(np.prod(s)) == 1 for s in shapes.values()), str(shapes)


def softmax_on_last_axis(match: Match) -> tuple[bool, str]:
    """Softmax runs over the keys, the last axis of the scores (seed 001, exSDPAttention:
    scaled dot-product attention)."""
    softmax = match.nodes["softmax"]
    axis = int(softmax.attrs.get("axis", -1))
    return _last_axis(axis, _rank(softmax.outputs[0])), f"axis {axis}"


def attention_channels_within_8192(match: Match) -> tuple[bool, str]:
    """Query and value have at most 8192 channels (seed 001, exSDPAttention: query and value
    channel in (0, 8192])."""
    shapes = [static_shape(match.tensors[label]) for label in ("q", "v")]
    channels = [s[1] if s is not None and len(s) > 1 else None for s in shapes]
    return all(c is not None and 0 < c <= 8192 for c in channels), f"channels {channels}"


def recurrent_plain(match: Match) -> tuple[bool, str]:
    """The cell is the plain variant: exLSTM supports neither CIFG (input_forget) nor
    projection (oplist V2.3.2, RK3588 3.2.38 LSTM, input_forget and has_projection: only 0)."""
    forget = int(match.nodes["cell"].attrs.get("input_forget", 0))
    return forget == 0, f"input_forget {forget}"


def relabel_of_sequence_batch_layout(match: Match) -> tuple[bool, str]:
    """With one direction or a batch of 1, swapping Y's direction and batch axes moves no bytes,
    so any relabel of Y holds exLSTM/exGRU's '(sn)c' output layout (oplist V2.3.2, RK3588
    3.2.38 LSTM, output_layout)."""
    y, out = static_shape(match.nodes["cell"].outputs[0]), static_shape(match.nodes["reshape"].outputs[0])
    ok = y is not None and out is not None and (y[1] == 1 or y[2] == 1)
    return ok, f"Y {y} -> {out}"


def sequence_batch_layout(match: Match) -> tuple[bool, str]:
    """The output is reordered to [sequence, batch, directions*hidden]: exLSTM/exGRU's
    '(sn)c' output layout (oplist V2.3.2, RK3588 3.2.38 LSTM, output_layout)."""
    perm = list(match.nodes["transpose"].attrs.get("perm", []))
    y, out = static_shape(match.nodes["cell"].outputs[0]), static_shape(match.nodes["reshape"].outputs[0])
    expected = None if y is None else (y[0], y[2], y[1] * y[3])
    return perm == [0, 2, 1, 3] and out == expected, f"perm {perm}, {y} -> {out}"


# --- attributes the fused kernel needs beyond its members -----------------------------------


def _scalar_value(match: Match, label: str) -> float:
    return float(match.constant(label).reshape(-1)[0])


def norm_attributes(mode: str) -> Callable[[Match], dict]:
    def attributes(match: Match) -> dict:
        if "norm" in match.nodes:
            epsilon = float(match.nodes["norm"].attrs.get("epsilon", 1e-5))
        else:
            epsilon = _scalar_value(match, "epsilon")
        rank = _rank(match.tensors["x"]) or 1
        axes = next(_normalized_axes(node, rank) for node in match.nodes.values()
                    if node.op in NORMALIZING_OPS)
        return {"mode": mode, "epsilon": epsilon, "axes": axes}
    return attributes


def channel_conv_rms_attributes(match: Match) -> dict:
    """exNorm's attributes for x * (w * sum(x^2) + b)^-0.5 over C channels: epsilon b / (w*C)."""
    channels = static_shape(match.tensors["x"])[1]
    weight = float(match.constant("mean_weights").reshape(-1)[0])
    return {"mode": "rms", "epsilon": _scalar_value(match, "epsilon") / (weight * channels), "axes": [1]}


def channel_conv_layer_attributes(match: Match) -> dict:
    """exNorm's attributes for layer_norm_by_channel_convs: epsilon is the variance Conv's bias."""
    return {"mode": "layer", "epsilon": _scalar_value(match, "epsilon"), "axes": [1]}


def sdpa_attributes(match: Match) -> dict:
    scale = 1.0
    for label in ("q_scale", "k_scale", "scale"):
        if label in match.tensors:
            value = _scalar_value(match, label)
            scale *= 1 / value if label == "scale" and match.nodes["scaling"].op == "Div" else value
    return {"scale": scale, "has_mask": "mask" in match.tensors}


def clip_attributes(match: Match) -> dict:
    bounds = [np.asarray(t.values).reshape(-1)[0] if t.name else None for t in match.nodes["clip"].inputs[1:3]]
    bounds += [None] * (2 - len(bounds))
    return {name: float(value) for name, value in zip(("min", "max"), bounds) if value is not None}


# --- patterns -------------------------------------------------------------------------------


def _mul(*factors: Pattern, label: str | None = None) -> Chain:
    """A product in any order and grouping of the factors (Mul is associative and commutative)."""
    return Chain("Mul", *factors, label=label)


def _add(*terms: Pattern, label: str | None = None) -> Chain:
    """A sum in any order and grouping of the terms."""
    return Chain("Add", *terms, label=label)


def _gelu_erf() -> Pattern:
    """x * 0.5 * (1 + erf(x / sqrt(2))), the 0.5 on any factor, every operand in any order."""
    x = Any("x")
    scaled = Alt(Op("Div", x, Const(float(np.sqrt(2)))), _mul(x, Const(float(1 / np.sqrt(2)))))
    return _mul(x, Const(0.5), _add(Op("Erf", scaled), Const(1.0)))


def _gelu_tanh() -> Pattern:
    """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), and the form that factors x out of
    the tanh's argument: sqrt(2/pi) * x * (1 + 0.044715 x^2) (transformers' FastGELU). The
    cubic term's factors in any grouping: jax's gelu(approximate=True), through jax2tf and
    tf2onnx, writes x * (x * (0.044715 * x))."""
    x = Any("x")
    coefficient = Const(0.044715)
    cubic = Alt(_mul(Op("Pow", x, Const(3.0)), coefficient), _mul(x, x, x, coefficient),
                _mul(x, Op("Pow", x, Const(2.0)), coefficient))
    square = Alt(_mul(x, x), Op("Pow", x, Const(2.0)))
    inner = Alt(_mul(_add(x, cubic), Const(float(np.sqrt(2 / np.pi)))),
                _mul(x, Const(float(np.sqrt(2 / np.pi))), _add(Const(1.0), _mul(square, Const(0.044715)))))
    return _mul(x, Const(0.5), _add(Op("Tanh", inner), Const(1.0)))


def _hard_swish_relu6() -> Pattern:
    x = Any("x")
    relu6 = Op("Clip", _add(x, Const(3.0)), Const(0.0), Const(6.0))
    return Alt(Op("Div", _mul(x, relu6), Const(6.0)),
               _mul(x, relu6, Const(1 / 6)),
               _mul(x, Op("Div", relu6, Const(6.0))))


def _normalized_by(value: Pattern, mean_square_plus_epsilon: Pattern) -> Pattern:
    """value / sqrt(s), value * (1 / sqrt(s)) with 1 / as Reciprocal (torch.onnx dynamo's rsqrt)
    or as Div of 1 (TorchScript's rsqrt: T5's and LLaMA's RMSNorm), or value * s^-0.5 (tf's
    rsqrt), s the mean square plus epsilon."""
    root = Op("Sqrt", mean_square_plus_epsilon)
    return Alt(Op("Div", value, root), _mul(value, Op("Reciprocal", root)), _mul(value, Op("Div", Const(1.0), root)),
               _mul(value, Op("Pow", mean_square_plus_epsilon, Const(-0.5))))


def layer_norm_core() -> Pattern:
    """(x - mean) / sqrt(variance + epsilon) as exporters write it out, without the affine:
    x - mean as Sub, or as x + Neg(mean) or x + mean * -1 (paddle2onnx; the rewrite pass makes a
    Neg a Mul by -1); the square as Pow 2 or a product; epsilon on either side of its Add."""
    x = Any("x")
    mean = Op("ReduceMean", x, label="mean")
    centred = Alt(Op("Sub", x, mean, label="centred"),
                  _add(x, Alt(Op("Neg", mean), _mul(mean, Const(-1.0))), label="centred"))
    # `centred` whole wherever it appears: the first occurrence matched binds x and the mean.
    square = Alt(Op("Pow", centred, Const(2.0)), Op("Mul", centred, centred))
    return _normalized_by(centred, _add(Op("ReduceMean", square, label="variance"), Const(label="epsilon")))


def _mean(of: Pattern, label: str) -> Alt:
    return Alt(Op("ReduceMean", of, label=label), Op("GlobalAveragePool", of, label=label))


def moments_layer_norm() -> Pattern:
    """LayerNorm as tf2onnx writes Keras' (tf.nn.moments, then batch_normalization's algebra):
    the mean and the variance of (x - mean)^2 by ReduceMean or by GlobalAveragePool over the
    last axis of [N, L, C], m = rsqrt(variance + epsilon) [* gamma], and the result
    x * m + (-mean) * m, or x * m + (beta - mean * m) with a centre; -mean as Neg or as a Mul
    by -1."""
    x = Any("x")
    mean = _mean(x, "mean")
    deviation = Op("Sub", x, mean, label="deviation")
    square = Alt(Op("Pow", deviation, Const(2.0)), Op("Mul", deviation, deviation))
    spread = _add(_mean(square, "variance"), Const(label="epsilon"))
    root = Op("Sqrt", spread)
    inverse = Alt(Op("Reciprocal", root, label="m"), Op("Div", Const(1.0), root, label="m"),
                  Op("Pow", spread, Const(-0.5), label="m"))
    inverse_root = Alt(Op("Reciprocal", root), Op("Div", Const(1.0), root), Op("Pow", spread, Const(-0.5)))
    factor = Alt(_mul(inverse_root, Const(label="scale"), label="m"), inverse)
    negated_mean = Alt(Op("Neg", mean), _mul(mean, Const(-1.0)))  # the rewrite pass makes a Neg a Mul by -1
    return _add(_mul(x, factor), Alt(_mul(negated_mean, factor),
                                     Op("Sub", Const(label="bias"), _mul(mean, factor))))


def statistics_layer_norm() -> Pattern:
    """LayerNorm as flax.linen.LayerNorm computes it (jax's _compute_stats), through jax2tf and
    tf2onnx: the mean and the mean square by ReduceMean, or ReduceSum times 1/count, the reduced
    axes dropped (keepdims 0) and put back by a Reshape where x meets them again; the variance
    max(0, E[x^2] - mean^2) (the Max may be a Relu by then); then (x - mean) times
    rsqrt(variance + epsilon) [times scale], [plus bias]. Whether the statistics are x's own is
    statistics_restate_the_input's to say."""
    x = Any("x")

    def mean_of(value: Pattern, label: str) -> Pattern:
        return Alt(Op("ReduceMean", value, label=label),
                   _mul(Op("ReduceSum", value), Const(label=f"{label}_divisor"), label=label))

    def restated(value: Pattern, label: str) -> Pattern:
        return Alt(Op("Reshape", value, label=label), value)

    mean = mean_of(x, "mean")
    mean_square = mean_of(Alt(Op("Mul", x, x), Op("Pow", x, Const(2.0))), "mean_square")
    difference = Op("Sub", mean_square, Alt(Op("Mul", mean, mean), Op("Pow", mean, Const(2.0))))
    variance = Alt(Op("Relu", difference), Op("Max", difference, Const(0.0), commutative=True), difference)
    spread = _add(restated(variance, "spread"), Const(label="epsilon"))
    inverse = Alt(Op("Reciprocal", Op("Sqrt", spread)), Op("Div", Const(1.0), Op("Sqrt", spread)),
                  Op("Pow", spread, Const(-0.5)))
    centred = Op("Sub", x, restated(mean, "centre"))
    normalized = Alt(_mul(centred, inverse, Const(label="scale")), _mul(centred, inverse))
    return optional(lambda inner: _add(inner, Const(label="bias")), normalized)


def rms_norm_core() -> Pattern:
    """x / sqrt(mean(x^2) + epsilon) as exporters write it out, without the scale."""
    x = Any("x")
    square = Alt(Op("Pow", x, Const(2.0)), Op("Mul", x, x))
    return _normalized_by(x, _add(Op("ReduceMean", square, label="mean_square"), Const(label="epsilon")))


def rms_norm_by_channel_conv() -> Pattern:
    """x * (w * sum(x^2) + b)^-0.5 with the sum over the channels taken by a 1x1 Conv of uniform
    weights w and bias b: an RMSNorm (w = 1/C, b its epsilon) or an L2 normalization over
    trailing axes as rewrites.reductions writes them on the [L, C, 1, 1] view, in ops the NPU
    runs one by one where a target has no exNorm."""
    x = Any("x")
    square = Alt(Op("Mul", x, x), Op("Pow", x, Const(2.0)))
    spread = Op("Conv", square, Const(label="mean_weights"), Const(label="epsilon"), label="mean_square")
    return _mul(x, Op("Pow", spread, Const(-0.5)))


def layer_norm_by_channel_convs() -> Pattern:
    """(x - mean) * (mean((x - mean)^2) + epsilon)^-0.5 over the channels, the means taken by
    1x1 Convs: d = x + Conv(x) with weights -1/C, then d * Pow(Conv(d * d) with weights 1/C and
    bias epsilon, -0.5), as rewrites.reductions writes a LayerNorm on the [outer, C, inner, 1]
    view when LayerNormalization cannot say it (the normalized axes are not the last)."""
    x = Any("x")
    deviation = _add(x, Op("Conv", x, Const(label="negated_mean_weights"), label="negated_mean"), label="deviation")
    square = Alt(Op("Mul", deviation, deviation), Op("Pow", deviation, Const(2.0)))
    spread = Op("Conv", square, Const(label="mean_weights"), Const(label="epsilon"), label="variance")
    return _mul(deviation, Op("Pow", spread, Const(-0.5)))


def _scaled(normalized: Pattern) -> Pattern:
    return optional(lambda inner: _mul(inner, Const()), normalized)


def _affine(normalized: Pattern) -> Pattern:
    return optional(lambda inner: _add(inner, Const()), _scaled(normalized))


def _attention() -> Op:
    q = optional(lambda inner: _mul(inner, Const(label="q_scale")), Any("q"))
    k = optional(lambda inner: _mul(inner, Const(label="k_scale")), Any("k"))
    scores = Op("MatMul", q, k, label="scores")
    scores = optional(lambda inner: Alt(_mul(inner, Const(label="scale"), label="scaling"),
                                        Op("Div", inner, Const(label="scale"), label="scaling")), scores)
    scores = optional(lambda inner: _add(inner, Any("mask")), scores)
    return Op("MatMul", Op("Softmax", scores, label="softmax"), Any("v"))


def _recurrent_with_layout(cell: str) -> Op:
    """The cell's Y reordered by Transpose + Reshape, as PyTorch exports a (bi)directional RNN."""
    return Op("Reshape", Op("Transpose", Op(cell, label="cell"), label="transpose"), label="reshape")


def _recurrent_relabelled(cell: str) -> Op:
    """The cell's Y relabelled straight on: where PyTorch's Transpose of Y only moves an axis of
    size 1, the rewrite pass has turned it into a relabel (rewrites.layout.
    transpose_of_unit_axes_to_reshape) and merged it with the Reshape after it."""
    return Op("Reshape", Op(cell, label="cell"), label="reshape")


def _conv_then(activation: str | tuple[str, ...], *inputs: Pattern, label: str | None = None) -> Op:
    return Op(activation, Op(CONV, label="conv"), *inputs, label=label)


RECOGNISERS: tuple[FusionRule, ...] = (
    FusionRule("exSDPAttention", "exSDPAttention", _attention(),
               (softmax_on_last_axis, scales_are_scalars, attention_channels_within_8192), sdpa_attributes, absorbs=True,
               # oplist V2.3.2, RK3588 3.2.78 exSDPAttention, mask: 支持任意维度广播操作 (broadcast along any axis)
               broadcasts=("mask",)),
    FusionRule("exNorm", "exNorm", _affine(layer_norm_core()), (normalizes_supported_axes,), norm_attributes("layer"), absorbs=True),
    FusionRule("exNorm", "exNorm", moments_layer_norm(), (normalizes_supported_axes,), norm_attributes("layer"), absorbs=True),
    FusionRule("exNorm", "exNorm", _scaled(rms_norm_core()), (normalizes_supported_axes,), norm_attributes("rms"), absorbs=True),
    FusionRule("exNorm", "exNorm", _affine(layer_norm_by_channel_convs()),
               (normalizes_supported_axes, channel_mean_and_variance_convolutions), channel_conv_layer_attributes,
               absorbs=True),
    FusionRule("exNorm", "exNorm", _scaled(rms_norm_by_channel_conv()), (normalizes_supported_axes, channel_mean_convolution),
               channel_conv_rms_attributes, absorbs=True),
    FusionRule("exNorm", "exNorm", Op("LayerNormalization", Any("x"), label="norm"),
               (normalizes_supported_axes, layer_norm_output_only), norm_attributes("layer")),
    FusionRule("exGelu", "exGelu", _gelu_erf(), attributes=lambda m: {"approximate": "none"}, absorbs=True),
    FusionRule("exGelu", "exGelu", _gelu_tanh(), attributes=lambda m: {"approximate": "tanh"}, absorbs=True),
    FusionRule("exMish", "exMish", _mul(Any("x"), Op("Tanh", Alt(
        Op("Softplus", Any("x")), Op("Log", _add(Op("Exp", Any("x")), Const(1.0)))))), absorbs=True),
    FusionRule("HardSwish", "HardSwish", _mul(Any("x"), Op("HardSigmoid", Any("x"), label="hard_sigmoid")),
               (hard_sigmoid_is_relu6_over_6,), absorbs=True),
    FusionRule("HardSwish", "HardSwish", _hard_swish_relu6(), absorbs=True),
    FusionRule("exSwish", "exSwish", _mul(Any("x"), Op("Sigmoid", Any("x"))), absorbs=True),
    FusionRule("exGlu", "exGlu", _mul(Op("Split", Any("x"), label="split", output=0),
                                      Op("Sigmoid", Op("Split", Any("x"), label="split", output=1))),
               (split_halves_on_channels,), lambda m: {"axis": 1}, absorbs=True),
    FusionRule("exLSTM", "LSTM", _recurrent_with_layout("LSTM"), (recurrent_plain, sequence_batch_layout),
               lambda m: {"output_layout": "(sn)c"}),
    FusionRule("exGRU", "GRU", _recurrent_with_layout("GRU"), (sequence_batch_layout,),
               lambda m: {"output_layout": "(sn)c"}),
    FusionRule("exLSTM", "LSTM", _recurrent_relabelled("LSTM"), (recurrent_plain, relabel_of_sequence_batch_layout),
               lambda m: {"output_layout": "(sn)c"}),
    FusionRule("exGRU", "GRU", _recurrent_relabelled("GRU"), (relabel_of_sequence_batch_layout,),
               lambda m: {"output_layout": "(sn)c"}),
    FusionRule("exLSTM", "LSTM", Op("LSTM", label="cell"), (recurrent_plain,),
               lambda m: {"output_layout": "sbnc"}),
    FusionRule("exGRU", "GRU", Op("GRU", label="cell"), attributes=lambda m: {"output_layout": "sbnc"}),
)

KERNEL_FUSIONS: tuple[FusionRule, ...] = (
    FusionRule("ConvAddRelu", "ConvolutionAddRelu",
               Op("Relu", _add(Op(CONV, label="conv"), Any("other"))), (operand_same_shape,)),
    FusionRule("ConvAdd", "ConvolutionAdd", _add(Op(CONV, label="conv"), Any("other")), (operand_same_shape,)),
    FusionRule("AddRelu", "AddRelu", Op("Relu", Op("Add", Any(), Any()))),
    FusionRule("MulRelu", "MulRelu", Op("Relu", Op("Mul", Any(), Any()))),
    FusionRule("ConvRelu", "ConvolutionRelu", _conv_then("Relu")),
    FusionRule("ConvClip", "ConvolutionClip", _conv_then("Clip", label="clip"), (clip_bounds_constant,),
               clip_attributes),
    FusionRule("ConvPRelu", "ConvolutionPRelu/LeakyRelu", _conv_then("PRelu", Const(label="slope"), label="activation"),
               (slope_scalar_or_per_channel,)),
    FusionRule("ConvLeakyRelu", "ConvolutionPRelu/LeakyRelu", _conv_then("LeakyRelu")),
    FusionRule("ConvSigmoid", "ConvolutionSigmoid", _conv_then("Sigmoid")),
    FusionRule("ConvTanh", "ConvolutionTanh", _conv_then("Tanh")),
    FusionRule("ConvHardSigmoid", "ConvolutionHardSigmoid", _conv_then("HardSigmoid")),
    FusionRule("ConvHardSwish", "ConvolutionHardSwish", _conv_then("HardSwish")),
    FusionRule("ConvElu", "ConvolutionElu", _conv_then("Elu")),
    FusionRule("ConvSoftplus", "ConvolutionSoftplus", _conv_then("Softplus")),
    FusionRule("ConvExSwish", "ConvolutionSwish", _conv_then("exSwish")),
    # The oplist V2.3.2 has no ConvolutionGelu; rknn-toolkit2 runs ConvExGelu on a target with
    # exGelu (peer/zoo_rk3588.json, transformer_encoder and bert_mini), so the row requires exGelu.
    # ONNX's own Gelu (opset 20) runs as exGelu too, and the toolkit fuses it the same way.
    FusionRule("ConvExGelu", "exGelu", _conv_then(("exGelu", "Gelu"))),
    FusionRule("ConvExMish", "ConvolutionMish", _conv_then(("exMish", "Mish"))),
    FusionRule("exMatMul", "exMatMul", _add(Op("MatMul", label="matmul"), Any("c")),
               attributes=lambda m: {"c_type": "add"}),
)

TABLES = (RECOGNISERS, KERNEL_FUSIONS)


def conv_activation_kernels() -> dict[str, tuple[str, ...]]:
    """Activation op -> the oplist kernels that run it fused after a convolution (the rows
    written `_conv_then`: the activation reading the Conv's output alone)."""
    found: dict[str, tuple[str, ...]] = {}
    for rule in KERNEL_FUSIONS:
        pattern = rule.pattern
        if (isinstance(pattern, Op) and len(pattern.inputs) >= 1 and isinstance(pattern.inputs[0], Op)
                and pattern.inputs[0].ops == CONV):
            for op in pattern.ops:
                found[op] = found.get(op, ()) + (rule.requires,)
    return found

#: Every kernel name a fused step can show.
FUSED_KERNELS = frozenset(rule.kernel for table in TABLES for rule in table)
