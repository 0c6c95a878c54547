"""Every int8 kernel of the emulator against a float reference of the same quantized arithmetic:
the operands dequantized exactly, the op computed by onnx.reference in float64, the result
quantized once (round half to even, saturate). The int8 kernels accumulate in integers and
requantize in fixed point, so they may differ from that reference by one step where the
real result sits within the multiplier's 2^-31 rounding of a half-way point: the tests allow
one step of difference and demand almost every value exact."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import rkcompile.emulator.kernels  # noqa: F401  (registers the int8 kernels in INT8_KERNELS)
from rkcompile.emulator.int8 import (INT8_KERNELS, Accumulator, QTensor, fixed_point, lookup_table,
    requantize, rounding_shift, run_int8)
from rkcompile.plan import plain_nodes as plain
from rkcompile.plan.schema import Quantization
from rkcompile.quantization.params import (INT8, activation_params, bias_params, dequantize, is_movement,
    quantize, weight_params)

OPSET = 17
rng = np.random.default_rng(11)


def activation(shape, low=-3.0, high=5.0) -> QTensor:
    """A random int8 activation with asymmetric parameters for [low, high]."""
    quant = activation_params(low, high, "minmax")
    return QTensor(rng.integers(-128, 128, shape).astype(np.int8), quant)


def weight(values: np.ndarray, per_channel: bool = True) -> QTensor:
    quant = weight_params(values, per_channel)
    return QTensor(quantize(values, quant), quant)


def float_reference(op: str, operands: list, out_quant: Quantization, **attrs) -> np.ndarray:
    """Dequantize, compute with onnx.reference in float64, quantize once."""
    names = [f"i{k}" for k in range(len(operands))]
    feeds = {n: (v.real().astype(np.float64) if isinstance(v, QTensor) else v) for n, v in zip(names, operands)}
    node = helper.make_node(op, names, ["y"], **attrs)
    (result,) = ReferenceEvaluator(node, opsets={"": OPSET}).run(None, feeds)
    return quantize(result, out_quant)


def node(op: str, operands: list, **attrs) -> plain.Node:
    inputs = [plain.Constant(f"i{k}", v.values if isinstance(v, QTensor) else v) if k else plain.Variable(f"i{k}")
              for k, v in enumerate(operands)]
    return plain.Node(op=op, name=op, attrs=attrs, inputs=inputs, outputs=[plain.Variable("y")])


def assert_one_step(actual: np.ndarray, expected: np.ndarray, exact_share: float = 0.99) -> None:
    assert actual.dtype == np.int8 and actual.shape == expected.shape
    difference = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    assert difference.max() <= 1, f"off by {difference.max()} steps"
    assert (difference == 0).mean() >= exact_share


def output_quant(operands: list, op: str, **attrs) -> Quantization:
    """Parameters fitted to the float result, as calibration would give them."""
    names = [f"i{k}" for k in range(len(operands))]
    feeds = {n: (v.real() if isinstance(v, QTensor) else v) for n, v in zip(names, operands)}
    (result,) = ReferenceEvaluator(helper.make_node(op, names, ["y"], **attrs), opsets={"": OPSET}).run(None, feeds)
    return activation_params(float(result.min()), float(result.max()), "minmax")


# ---- requantization -------------------------------------------------------------------------

def test_fixed_point_multiplier_is_exact_to_31_bits():
    multipliers = np.array([1e-5, 3.1e-3, 0.25, 0.7071, 0.999999999, 1.0, 3.5])
    mantissa, shift = fixed_point(multipliers)
    assert ((mantissa >= 2 ** 30) & (mantissa < 2 ** 31)).all()
    assert np.allclose(mantissa * 2.0 ** -shift, multipliers, rtol=2 ** -31, atol=0)


@pytest.mark.parametrize("layout, axis", [("channels-last view", None), ("channels-last view", 1),
                                          ("contiguous", None), ("contiguous", 1), ("scalar", None)])
def test_quantize_dequantize_and_accumulators_are_their_float64_formulas_bit_for_bit(layout, axis):
    """quantize, dequantize and Accumulator.real work in place or straight into their result
    (params.py): the same float64 operations as the plain formulas, so the same values (ties,
    saturation, infinities, a channels-last map's memory order kept)."""
    random = np.random.default_rng(4)
    channels = 6
    quant = Quantization("int8", tuple(random.uniform(0.01, 0.2, channels if axis else 1)),
                         tuple(random.integers(-20, 20, channels if axis else 1)), axis)
    real = (random.standard_normal((2, 5, 4, channels)) * 8).astype(np.float32)
    real.reshape(-1)[:6] = [np.inf, -np.inf, 1e30, -0.0, 0.5 * quant.scales[0], 2.5 * quant.scales[0]]
    real = {"channels-last view": np.moveaxis(real, -1, 1), "contiguous": np.moveaxis(real, -1, 1).copy(),
            "scalar": np.array(real.reshape(-1)[6])}[layout]
    scale = np.asarray(quant.scales).reshape((1, -1, 1, 1) if axis and real.ndim else ())
    zero = np.asarray(quant.zero_points, np.float64).reshape(scale.shape)
    stored = quantize(real, quant)
    formula = np.clip(np.rint(real.astype(np.float64) / scale) + zero, *INT8).astype(np.int8)
    np.testing.assert_array_equal(stored, formula)
    back = dequantize(stored, quant)
    assert back.dtype == np.float32 and back.strides == np.abs(stored.astype(np.float32)).strides
    np.testing.assert_array_equal(back.view(np.uint32), ((stored.astype(np.float64) - zero) * scale).astype(
        np.float32).view(np.uint32))
    accumulator = Accumulator(stored.astype(np.float64) * 12345, scale / 7)
    np.testing.assert_array_equal(accumulator.real().view(np.uint32),
                                  (accumulator.values * accumulator.scale).astype(np.float32).view(np.uint32))


def test_requantize_rounds_half_to_even_both_signs():
    half = Quantization("int8", (1.0,), (0,))
    acc = Accumulator(np.array([1, 3, 5, 7, -1, -3, -5, 2, -2]), np.float64(0.5))
    # 0.5, 1.5, 2.5, 3.5 -> 0, 2, 2, 4; negatives mirror them
    assert requantize(acc, half).tolist() == [0, 2, 2, 4, 0, -2, -2, 1, -1]


def test_requantize_saturates_and_adds_the_zero_point_exactly():
    quant = Quantization("int8", (0.1,), (-20,))
    acc = Accumulator(np.array([0, 10, -10, 10 ** 6, -(10 ** 6)]), np.float64(0.1))
    assert requantize(acc, quant).tolist() == [-20, -10, -30, 127, -128]


@pytest.mark.parametrize("multiplier", [2.0 ** -40, 2.0 ** -33, 1e-15])
def test_requantize_with_a_multiplier_below_the_widest_shift_rounds_to_zero(multiplier):
    """A step whose accumulator scale is ~1e-12 of its output step (a random-weight network's
    collapsed features written onto a detector output's grid): every real result is far below
    half a step. A shift clipped to 62 made a full int32 accumulator one step or more."""
    quant = Quantization("int8", (1.0,), (3,))
    full = 2 ** 31 - 1
    acc = Accumulator(np.array([full, -full, 12345, 0]), np.float64(multiplier))
    expected = np.rint(acc.values * multiplier) + 3
    assert requantize(acc, quant).tolist() == expected.tolist() == [3, 3, 3, 3]


def test_requantize_with_a_multiplier_above_2_to_30_saturates():
    quant = Quantization("int8", (1.0,), (0,))
    acc = Accumulator(np.array([1, 0, -1]), np.float64(2.0 ** 33))
    assert requantize(acc, quant).tolist() == [127, 0, -128]


def test_requantize_in_float64_is_the_fixed_point_result():
    """requantize takes a float64 product where it rounds as the fixed point's shift does: ties
    (products of exactly half a step), widest shifts, a full int32 accumulator, either dtype."""
    generator = np.random.default_rng(5)
    for exponent in [-33, *range(-2, 34)]:
        # a power of two has exact ties (odd multiples of half a step) among the accumulators
        multiplier = np.append(generator.uniform(1, 2, 6), 1.0) * 2.0 ** -exponent
        mantissa, shift = fixed_point(multiplier)
        # the accumulators nearest a tie: odd multiples of 2^(shift - 1) / mantissa
        ties = np.rint((2 * np.arange(-20, 20)[:, None] + 1) * 2.0 ** (shift - 1) / mantissa)
        values = np.concatenate([ties.reshape(-1), generator.integers(-2 ** 31, 2 ** 31, 300),
                                 [2 ** 31 - 1, -2 ** 31, 0, 1, -1]])
        values = np.clip(values, -2 ** 31, 2 ** 31 - 1).astype(np.int64)  # an accumulator is int32
        for scale in multiplier:
            quant = Quantization("int8", (1.0,), (int(generator.integers(-128, 128)),))
            product_mantissa, product_shift = fixed_point(np.float64(scale))
            fixed = rounding_shift(values * product_mantissa, product_shift)
            expected = np.clip(fixed + quant.zero_points[0], -128, 127)
            for dtype in (np.int64, np.float64):
                actual = requantize(Accumulator(values.astype(dtype), np.float64(scale)), quant)
                assert actual.tolist() == expected.tolist(), (scale, dtype)
    # 1619930296 * 2135131692 = 3 * 2^60 - 96: at a shift of 61 the product is 1.5 - 2^-61.4,
    # which rounds to 1, where its float64 product (1.5) would round to 2
    multiplier = np.float64(2135131692 * 2.0 ** -61)
    acc = Accumulator(np.array([1619930296, -1619930296], np.float64), multiplier)
    assert requantize(acc, Quantization("int8", (1.0,), (0,))).tolist() == [1, -1]


def test_requantize_clamps_for_fused_activations():
    quant = Quantization("int8", (0.05,), (-100,))
    acc = Accumulator(np.arange(-50, 50), np.float64(0.1))
    assert requantize(acc, quant, low=-100).min() == -100  # Relu: real 0 is q = zero point


# ---- accumulating kernels ------------------------------------------------------------------

CONVS = {
    "3x3 stride 2 pad 1": ((1, 13, 9, 11), (17, 13, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    "depthwise 3x3 pad 1": ((1, 12, 8, 8), (12, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=12)),
    "grouped 1x1": ((1, 8, 5, 6), (6, 4, 1, 1), dict(group=2)),
    "1x1 dense": ((2, 19, 4, 4), (7, 19, 1, 1), {}),
    "dilated 3x3": ((1, 5, 10, 10), (4, 5, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
}


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-layer"])
@pytest.mark.parametrize("case", CONVS)
def test_conv_matches_quantized_float_reference(case, per_channel):
    x_shape, w_shape, attrs = CONVS[case]
    x = activation(x_shape, -2.0, 6.0)  # zero point far from 0, so padding must use it
    w = weight(rng.standard_normal(w_shape).astype(np.float32) * rng.uniform(0.1, 2, (w_shape[0], 1, 1, 1)),
               per_channel)
    bias_quant = bias_params(x.quant, w.quant)
    bias = QTensor(quantize(rng.standard_normal(w_shape[0]), bias_quant), bias_quant)
    out = output_quant([x, w, bias], "Conv", **attrs)
    (actual,) = run_int8(node("Conv", [x, w, bias], **attrs), [x, w, bias], [out], OPSET, is_movement)
    expected = float_reference("Conv", [x, w, bias], out, **attrs)
    assert_one_step(actual, expected)


def test_conv_accumulator_is_the_exact_integer_sum():
    x = activation((1, 6, 5, 5))
    w = weight(rng.standard_normal((4, 6, 3, 3)).astype(np.float32))
    acc = INT8_KERNELS["Conv"](node("Conv", [x, w], pads=[1, 1, 1, 1]), [x, w], OPSET)
    padded = np.pad(x.centered(), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    exact = np.einsum("nchwij,ocij->nohw", windows, w.centered())  # both zero points subtracted
    assert acc.values.dtype in (np.int64, np.float64) and np.array_equal(acc.values, exact)
    assert np.abs(acc.values).max() < 2 ** 31


def test_fused_conv_relu_and_clip_are_clamps_of_one_requantization():
    x = activation((1, 8, 6, 6))
    w = weight(rng.standard_normal((5, 8, 3, 3)).astype(np.float32))
    for activation_op, extra in (("Relu", []), ("Clip", [np.float32(0), np.float32(1.5)])):
        inner_x, conv_out, y = plain.Variable("bx"), plain.Variable("c"), plain.Variable("y")
        constants = [plain.Constant(f"k{i}", np.asarray(v)) for i, v in enumerate(extra)]
        conv = plain.Node("Conv", "conv", {"pads": [1, 1, 1, 1]}, [inner_x, plain.Constant("w", w.values)], [conv_out])
        act = plain.Node(activation_op, "act", {}, [conv_out] + constants, [y])
        fused = plain.Node("Conv" + activation_op, "fused", {"body": plain.Graph([conv, act], [inner_x], [y])},
                        [plain.Variable("x"), plain.Constant("w", w.values)], [plain.Variable("out")], domain="rkcompile")
        out = activation_params(0.0, 4.0, "minmax")
        (actual,) = run_int8(fused, [x, w], [out], OPSET, is_movement)
        feeds = {"i0": x.real().astype(np.float64), "i1": w.real().astype(np.float64)}
        (real,) = ReferenceEvaluator(helper.make_node("Conv", ["i0", "i1"], ["y"], pads=[1, 1, 1, 1]),
                                     opsets={"": OPSET}).run(None, feeds)
        upper = extra[1] if extra else np.inf
        expected = quantize(np.clip(real, 0, upper), out)
        assert_one_step(actual, expected)
        assert actual.min() == out.zero_points[0]  # negative results clamp to real 0 exactly


def test_matmul_matches_quantized_float_reference():
    a, b = activation((2, 7, 33)), activation((2, 33, 9), -1, 1)
    out = output_quant([a, b], "MatMul")
    (actual,) = run_int8(node("MatMul", [a, b]), [a, b], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference("MatMul", [a, b], out))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("other_shape", [(1, 6, 5, 5), (1, 6, 1, 1)], ids=["same", "channel-broadcast"])
def test_binary_matches_quantized_float_reference(op, other_shape):
    a, b = activation((1, 6, 5, 5), -4, 4), activation(other_shape, -0.5, 2)
    out = output_quant([a, b], op)
    (actual,) = run_int8(node(op, [a, b]), [a, b], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference(op, [a, b], out))


def test_global_average_pool_matches_quantized_float_reference():
    x = activation((1, 20, 7, 7))
    out = output_quant([x], "GlobalAveragePool")
    (actual,) = run_int8(node("GlobalAveragePool", [x]), [x], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference("GlobalAveragePool", [x], out), exact_share=0.95)


# ---- lookup tables and moves ---------------------------------------------------------------

@pytest.mark.parametrize("op, attrs", [("Sigmoid", {}), ("HardSwish", {}), ("LeakyRelu", {"alpha": 0.1}),
                                       ("Tanh", {}), ("Relu", {})])
def test_lookup_table_matches_quantized_float_reference(op, attrs):
    x = activation((1, 5, 9, 9), -6, 6)
    out = output_quant([x], op, **attrs)
    (actual,) = run_int8(node(op, [x], **attrs), [x], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference(op, [x], out, **attrs), exact_share=0.999)
    table = lookup_table(node(op, [x], **attrs), x.quant, out, OPSET, [x])
    assert table.shape == (256,) and table.dtype == np.int8


def test_concat_rescales_inputs_to_the_output_parameters():
    a, b = activation((1, 3, 4, 4), -1, 1), activation((1, 5, 4, 4), -8, 3)
    out = output_quant([a, b], "Concat", axis=1)
    concat = plain.Node("Concat", "concat", {"axis": 1}, [plain.Variable("a"), plain.Variable("b")], [plain.Variable("y")])
    (actual,) = run_int8(concat, [a, b], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference("Concat", [a, b], out, axis=1))


def test_moves_keep_integers_when_parameters_are_shared():
    x = activation((1, 4, 6, 6))
    pool = node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    (actual,) = run_int8(pool, [x], [x.quant], OPSET, is_movement)
    expected = x.values.reshape(1, 4, 3, 2, 3, 2).max(axis=(3, 5))
    assert np.array_equal(actual, expected)
    transpose = node("Transpose", [x], perm=[0, 2, 3, 1])
    (moved,) = run_int8(transpose, [x], [x.quant], OPSET, is_movement)
    assert np.array_equal(moved, x.values.transpose(0, 2, 3, 1))


def test_other_ops_dequantize_compute_and_quantize_once():
    x = activation((1, 6, 4, 4))
    out = output_quant([x], "Softmax", axis=1)
    (actual,) = run_int8(node("Softmax", [x], axis=1), [x], [out], OPSET, is_movement)
    assert_one_step(actual, float_reference("Softmax", [x], out, axis=1), exact_share=0.999)


def test_dequantize_inverts_quantize_within_half_a_step():
    quant = activation_params(-1.3, 2.9, "minmax")
    real = rng.uniform(-1.3, 2.9, 1000)
    assert np.abs(dequantize(quantize(real, quant), quant) - real).max() <= quant.scales[0] / 2 + 1e-7


def test_a_move_quantizes_a_data_input_the_plan_holds_as_float():
    """A model output that an NPU step also reads stays float32 in the plan (bert_mini's pooler
    Slice); the move quantizes it to its output's parameters instead of taking it as integers."""
    x = rng.uniform(-2, 2, (1, 4, 6)).astype(np.float32)
    out = activation_params(-2.0, 2.0, "minmax")
    starts, ends, axes = np.array([0]), np.array([1]), np.array([1])
    slice_node = plain.Node("Slice", "slice", {}, [plain.Variable("x")] + [plain.Constant(n, v) for n, v in
                                                                      (("s", starts), ("e", ends), ("a", axes))],
                         [plain.Variable("y")])
    (actual,) = run_int8(slice_node, [x, starts, ends, axes], [out], OPSET, is_movement)
    assert np.array_equal(actual, quantize(x[:, :1], out))


def test_rounding_shift_rounds_half_to_even_as_exact_arithmetic_does():
    """Products near and at every half, and the extremes, against Python's exact integers."""
    rng = np.random.default_rng(3)
    shifts = rng.integers(-2, 66, 64)
    bounded = np.clip(shifts, 1, 62)
    floors = rng.integers(0, 2 ** 20, 64)
    products = np.concatenate([
        np.minimum((floors << bounded) + (np.int64(1) << (bounded - 1)) + offset, (1 << 62) - 1)
        for offset in (-1, 0, 1)] + [rng.integers(0, 1 << 62, 64), np.full(64, (1 << 62) - 1)])
    shifts = np.tile(shifts, 5)
    got = rounding_shift(products, shifts)
    for product, shift, value in zip(products.tolist(), shifts.tolist(), got.tolist()):
        if shift > 62:
            expected = 0
        elif shift < 1:
            expected = product
        else:
            floor, remainder = divmod(product, 1 << shift)
            half = 1 << (shift - 1)
            expected = floor + (remainder > half or (remainder == half and floor % 2 == 1))
        assert value == expected, (product, shift)


def test_rounding_shift_of_a_negative_product_is_the_negated_rounding_of_its_magnitude():
    """Half to even is symmetric: the signed product's arithmetic shift rounds -x as x."""
    rng = np.random.default_rng(5)
    shifts = np.tile(rng.integers(-2, 66, 64), 4)
    bounded = np.clip(shifts, 1, 62)
    halves = np.minimum((rng.integers(0, 2 ** 20, 256) << bounded) + (np.int64(1) << (bounded - 1)), (1 << 62) - 1)
    magnitudes = np.concatenate([halves[:128], rng.integers(0, 1 << 62, 128)])
    assert np.array_equal(rounding_shift(-magnitudes, shifts), -rounding_shift(magnitudes, shifts))


@pytest.mark.parametrize("channels, exact", [(16, np.float32), (1024, np.float64)])
def test_conv_sums_are_exact_whichever_float_type_serves(channels, exact):
    """float32 serves while max|x| times the largest |weight| sum of an output stays below 2^24;
    a wider one falls back to float64: both give the exact integer sums of int64 arithmetic."""
    from rkcompile.emulator.kernels.int8_arithmetic import exact_float

    x = activation((1, channels, 6, 6))
    w = weight(rng.standard_normal((8, channels, 3, 3)).astype(np.float32), per_channel=False)
    assert exact_float(x.largest_centered(), np.abs(w.centered()).reshape(8, -1).sum(axis=1)) is exact
    acc = INT8_KERNELS["Conv"](node("Conv", [x, w], pads=[1, 1, 1, 1]), [x, w], OPSET)
    padded = np.pad(x.centered(), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    assert np.array_equal(acc.values, np.einsum("nchwij,ocij->nohw", windows, w.centered()))


def test_requantize_of_a_rank_0_accumulator_is_a_rank_0_int8():
    quant = activation_params(-1.0, 1.0, "minmax")
    actual = requantize(Accumulator(np.array(1000, np.int64), np.float64(0.0003)), quant)
    assert actual.shape == () and actual.dtype == np.int8
    assert int(actual) == int(quantize(np.float64(0.3), quant))
