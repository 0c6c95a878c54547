"""The emulator's fast paths compute what the plain ones did: onnxruntime's float16 casts against
numpy's, the channels-last NC1HWC2 codec on every rank and channel remainder, the conv kernel's
channels-last GEMM, depthwise and blocked paths against onnx.reference, the branch-free
sigmoid, and the per-session weight cache."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rkcompile.options import PREFERRED_INT8, Options
from rkcompile.api import prepare
from rkcompile.emulator import Executor, Storage, emulate, make_inputs
from rkcompile.emulator.storage import EmulationError
from rkcompile.numerics.float16 import ONNXRUNTIME_MIN_ELEMENTS, cast
from rkcompile.emulator.kernels import conv as conv_module
from rkcompile.emulator.kernels.activation import ERF_BLOCK, erf, relu, sigmoid
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_shape
from rkcompile.plan import plain_nodes as plain
from rkcompile.plan.schema import PlanRecord, TensorPlacement
from rkcompile.quantization.params import dequantize
from rkcompile.targets import get_target

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY_CNN = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"
RK3588 = get_target("rk3588")
rng = np.random.default_rng(11)


def float32_cases() -> np.ndarray:
    """Every finite float16 value as float32, its float32 neighbours, the ties halfway to the
    next float16 (and one float32 step either side), the overflow and subnormal edges, and
    random bit patterns (NaNs and infinities among them)."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    exact = halves[np.isfinite(halves)].astype(np.float32)
    bits = exact.view(np.uint32).astype(np.int64)
    shifted = [((bits + delta) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
               for delta in (1, -1, 0xFFF, 0x1000, 0x1001)]
    edges = np.array([65504, 65519.996, 65520, 65536, 3e38, np.inf, -np.inf, 2.9802322e-08, 5.9604645e-08,
                      1e-45, 0.0, -0.0], np.float32)
    patterns = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([exact, *shifted, edges, patterns])


def test_onnxruntime_float16_casts_match_numpy_bit_for_bit():
    pytest.importorskip("onnxruntime")
    values = float32_cases()
    assert values.size >= max(ONNXRUNTIME_MIN_ELEMENTS.values())
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    halves = cast(values, np.float16)
    nan = np.isnan(values)
    assert halves.dtype == np.float16 and np.isnan(halves[nan]).all()
    np.testing.assert_array_equal(halves[~nan].view(np.uint16), expected[~nan].view(np.uint16))
    back = cast(halves, np.float32)
    nan = np.isnan(halves)
    assert back.dtype == np.float32 and np.isnan(back[nan]).all()
    np.testing.assert_array_equal(back[~nan].view(np.uint32), halves[~nan].astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("size", sorted({bound + offset for bound in ONNXRUNTIME_MIN_ELEMENTS.values()
                                         for offset in (-1, 0, 3 * bound + 5)}))
def test_a_cast_into_a_given_array_fills_it_with_the_new_arrays_values(size):
    """cast(..., out=) writes the conversion into the caller's array (onnxruntime through an IO
    binding above the size threshold, numpy below), the same bits a new array holds."""
    values = float32_cases()[:size]
    halves = np.full(size, np.float16(7))
    assert cast(values, np.float16, out=halves) is halves
    np.testing.assert_array_equal(halves.view(np.uint16), cast(values, np.float16).view(np.uint16))
    widened = np.empty(size + 8, np.float32)[4:-4]  # a view inside a larger buffer
    assert cast(halves, np.float32, out=widened) is widened
    np.testing.assert_array_equal(widened.view(np.uint32), cast(halves, np.float32).view(np.uint32))


def test_small_casts_through_the_scratch_arrays_neither_alias_nor_mix_element_counts():
    """Arrays of up to SCRATCH_ELEMENTS convert between two scratch arrays bound to the session
    once per element count: each result is numpy's conversion bit for bit, in memory of its own
    (a later cast of the same count leaves it alone), in the input's shape whatever its memory
    order, and counts taking turns each keep their own binding."""
    pytest.importorskip("onnxruntime")
    from rkcompile.numerics import float16 as half

    values = float32_cases()
    assert 9000 <= half.SCRATCH_ELEMENTS and 5000 >= ONNXRUNTIME_MIN_ELEMENTS[np.dtype(np.float32), np.dtype(np.float16)]
    narrowed = []
    for count, start in ((5000, 0), (9000, 7), (5000, 20011)):
        source = values[start:start + 2 * count].reshape(count // 50, 100)[:, ::2].T  # strided, transposed
        with np.errstate(over="ignore"):
            expected = source.astype(np.float16)
        halves = cast(source, np.float16)
        assert halves.shape == source.shape and not np.shares_memory(halves, half._converter(halves.dtype).scratch_target)
        narrowed.append((halves, halves.copy(), expected))
    for halves, as_made, expected in narrowed:  # untouched by the casts after them
        nan = np.isnan(expected)
        np.testing.assert_array_equal(halves.view(np.uint16), as_made.view(np.uint16))
        np.testing.assert_array_equal(halves[~nan].view(np.uint16), expected[~nan].view(np.uint16))
    assert {5000, 9000} <= set(half._converter(np.dtype(np.float16)).scratch_bindings)
    halves = narrowed[1][0]
    widened = np.empty(halves.shape, np.float32)
    assert cast(halves, np.float32, out=widened) is widened
    nan = np.isnan(halves)
    np.testing.assert_array_equal(widened[~nan].view(np.uint32), halves[~nan].astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("size", [100, 5000, 40000])  # numpy, the scratch arrays, a binding per call
def test_a_cast_of_a_strided_array_comes_back_c_contiguous_with_numpys_values(size):
    """A write hands `cast` the channels-last view of an NCHW value: every path converts it
    into a C-contiguous array (numpy's own in one pass, not in the view's memory order and then
    copied again)."""
    values = float32_cases()[:2 * size].reshape(2, size)[::-1].T  # (size, 2), strided
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    halves = cast(values, np.float16)
    nan = np.isnan(expected)
    assert halves.flags.c_contiguous and halves.shape == values.shape
    np.testing.assert_array_equal(halves[~nan].view(np.uint16), expected[~nan].view(np.uint16))


def one_tensor_storage(shape, dtype, offset=6) -> Storage:
    """A Storage holding one NC1HWC2 arena tensor at `offset`."""
    size = int(np.prod(nc1hwc2_shape(as_nchw(shape), RK3588.c2_for(dtype)))) * np.dtype(dtype).itemsize
    plan = PlanRecord.from_dict({
        "schema": "rkcompile.plan/1", "target": "rk3588", "dtype": "float16", "batch": 1,
        "model": {"path": "m", "sha256": "0", "opset": 17, "inputs": [], "outputs": []},
        "nodes": [], "steps": [], "tensors": {}, "partitions": [],
        "memory": {"arena_bytes": offset + size, "lower_bound_bytes": 0, "weight_bytes": 0},
        "multicore": {"cores": 1, "batch": 1}})
    placement = TensorPlacement(tuple(shape), dtype, "NC1HWC2", size, "arena", offset)
    return Storage(dataclasses.replace(plan, tensors={"t": placement}), RK3588)


@pytest.mark.parametrize("shape", [(3,), (2, 5), (2, 16, 7), (2, 3, 4, 5), (1, 24, 3, 3), (1, 13, 1, 40)])
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_nc1hwc2_codec_round_trips_every_rank_and_zeroes_the_padding(shape, dtype):
    storage = one_tensor_storage(shape, dtype)
    storage.regions["arena"][:] = 0x7B  # stale bytes from an earlier tensor
    value = (rng.standard_normal(shape) * 40).astype(dtype)
    storage.write("t", value)
    np.testing.assert_array_equal(storage.read("t"), value)
    np.testing.assert_array_equal(storage.read("t", np.float32), value.astype(np.float32))
    # the reference layout, seed 003: channel c at block c // C2, lane c % C2, zeros past C
    n, c, h, w = as_nchw(shape)
    c2 = RK3588.c2_for(dtype)
    c1 = -(-c // c2)
    padded = np.zeros((n, c1 * c2, h, w), dtype)
    padded[:, :c] = value.reshape(n, c, h, w)
    expected = padded.reshape(n, c1, c2, h, w).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(storage.view("t"), expected)
    assert storage.regions["arena"][:6].tolist() == [0x7B] * 6


def test_a_tensors_view_is_made_once_and_stays_on_its_planned_bytes():
    storage = one_tensor_storage((1, 24, 3, 3), "float16")
    first = storage.view("t")
    assert storage.view("t") is first  # checked and made on the first use only
    value = rng.standard_normal((1, 24, 3, 3)).astype(np.float16)
    storage.write("t", value)
    # the kept view still aliases the region: what a write puts there, the region holds
    assert np.shares_memory(first, storage.regions["arena"])
    np.testing.assert_array_equal(storage.read("t"), value)


@pytest.mark.parametrize("shape", [(1, 24, 3, 3), (1, 13, 2, 5)])  # whole C2 blocks, and a partial last one
def test_an_nc1hwc2_tensors_block_views_are_made_once_for_every_read_and_write(shape):
    storage = one_tensor_storage(shape, "float16")
    first, second = (rng.standard_normal(shape).astype(np.float16) for _ in range(2))
    storage.write("t", first)
    stored = storage._stored_of("t")
    made = (stored.whole_blocks_channels_last, stored.partial_lanes)
    np.testing.assert_array_equal(storage.read("t"), first)
    reader = stored.blocks_channels_last
    storage.write("t", second)
    np.testing.assert_array_equal(storage.read("t", np.float32), second.astype(np.float32))
    assert stored.whole_blocks_channels_last is made[0] and stored.partial_lanes is made[1] and made[0] is not None
    assert stored.blocks_channels_last is reader and reader is not None
    assert (stored.partial_lanes is None) == (shape[1] % RK3588.c2_for("float16") == 0)


def test_float32_writes_round_once_to_nearest_even():
    storage = one_tensor_storage((1, 9, 30, 20), "float16")
    value = rng.standard_normal((1, 9, 30, 20)).astype(np.float32)
    storage.write("t", np.moveaxis(np.ascontiguousarray(np.moveaxis(value, 1, -1)), -1, 1))  # channels-last input
    np.testing.assert_array_equal(storage.read("t"), value.astype(np.float16))


def channels_last(x: np.ndarray) -> np.ndarray:
    """x as Storage.read hands NC1HWC2 tensors to kernels: ONNX shape over channels-last memory."""
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)


def channels_last_slice(x: np.ndarray, padding: int) -> np.ndarray:
    """x over channels-last memory of `padding` channels more per pixel, as Storage.read hands
    over a tensor whose channels do not fill whole C2 blocks: adjacent channels, not contiguous."""
    wider = np.concatenate([x, np.zeros((x.shape[0], padding, *x.shape[2:]), x.dtype)], axis=1)
    return channels_last(wider)[:, :x.shape[1]]


CONVS = {
    "depthwise_many_blocks": ((2, 6, 9, 7), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    "depthwise_multiplier_stride2": ((1, 4, 9, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 0, 1, 2]}),
    "depthwise_1d": ((2, 5, 17), (5, 1, 5), {"group": 5, "dilations": [2], "pads": [4, 4]}),
    "depthwise_3d_uneven_pads": ((1, 3, 4, 5, 6), (3, 1, 2, 3, 3), {"group": 3, "pads": [1, 0, 2, 1, 1, 0],
                                                                    "strides": [1, 2, 1]}),
    # the corner taps of a 1x1 map read nothing but padding
    "depthwise_taps_in_padding_only": ((1, 2, 1, 1), (2, 1, 5, 5), {"group": 2, "pads": [2, 2, 2, 2]}),
    "dense_padded_strided": ((1, 3, 7, 6), (4, 3, 3, 3), {"pads": [2, 1, 0, 2], "strides": [2, 2]}),
    "pointwise_batch": ((3, 13, 5, 4), (7, 13, 1, 1), {}),
    "dense_3x3_batch": ((2, 5, 8, 6), (9, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    "grouped_strided": ((1, 8, 9, 9), (6, 4, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
    "dense_1d": ((2, 3, 11), (4, 3, 3), {"strides": [2]}),
}


@pytest.mark.parametrize("name", sorted(CONVS))
@pytest.mark.parametrize("memory", ["contiguous", "channels_last"])
def test_conv_paths_match_onnx_reference(name, memory, monkeypatch):
    monkeypatch.setattr(conv_module, "CACHE_BLOCK_ELEMENTS", 40)  # several depthwise row blocks
    x_shape, w_shape, attrs = CONVS[name]
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(w_shape).astype(np.float32)
    bias = rng.standard_normal(w_shape[0]).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], "conv",
        [helper.make_tensor_value_info("x", 1, x_shape)], [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")]),
        opset_imports=[helper.make_opsetid("", 17)])
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    node = plain.Node("Conv", attrs=attrs)
    operand = channels_last(x) if memory == "channels_last" else x
    (result,) = conv_module.conv(node, [operand, weight, bias], 17)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


GROUPED = {
    "regnet_like_strided": ((2, 24, 9, 9), (24, 8, 3, 3), {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "one_output_per_group": ((1, 12, 6, 7), (4, 3, 3, 3), {"group": 4, "pads": [1, 0, 1, 2]}),
    "pointwise_groups": ((1, 12, 5, 5), (18, 4, 1, 1), {"group": 3}),
    "dilated_1d": ((2, 10, 13), (15, 2, 3), {"group": 5, "dilations": [2], "pads": [2, 1]}),
    "window_past_the_input": ((1, 4, 2, 2), (4, 2, 3, 3), {"group": 2}),
}


@pytest.mark.parametrize("name", sorted(GROUPED))
def test_a_grouped_conv_is_each_groups_own_conv_bit_for_bit(name):
    """The grouped conv's one im2col and batched product give each group what that group's conv
    alone (a group-1 conv of its channels and its filters: one BLAS product, as the kernel
    computed group by group before) gives, bit for bit, on float16 values as the NPU reads them."""
    x_shape, w_shape, attrs = GROUPED[name]
    group = attrs["group"]
    x = channels_last(rng.standard_normal(x_shape).astype(np.float16).astype(np.float32))
    weight = rng.standard_normal(w_shape).astype(np.float16).astype(np.float32)
    result = conv_module.convolve(plain.Node("Conv", attrs=attrs), x, weight)
    alone = plain.Node("Conv", attrs={**attrs, "group": 1})
    in_per_group, out_per_group = x_shape[1] // group, w_shape[0] // group
    expected = np.concatenate([
        conv_module.convolve(alone, x[:, g * in_per_group:(g + 1) * in_per_group],
                             weight[g * out_per_group:(g + 1) * out_per_group]) for g in range(group)], axis=1)
    assert result.shape == expected.shape
    np.testing.assert_array_equal(np.ascontiguousarray(result).view(np.uint32),
                                  np.ascontiguousarray(expected).view(np.uint32))


POOLS = {
    "average_cascade_7x7": ((1, 8, 21, 14), "AveragePool", {"kernel_shape": [7, 7], "strides": [7, 7]}),
    "average_ceil_uneven_pads": ((2, 5, 9, 8), "AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                 "ceil_mode": 1, "pads": [1, 0, 1, 0]}),
    "average_counting_pads": ((2, 5, 9, 9), "AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2],
                                                              "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "average_1d": ((2, 5, 13), "AveragePool", {"kernel_shape": [4], "strides": [3]}),
    "max_padded_stride1": ((1, 6, 10, 10), "MaxPool", {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "max_3d_dilated": ((1, 6, 5, 6, 7), "MaxPool", {"kernel_shape": [2, 2, 3], "strides": [1, 2, 1],
                                                     "dilations": [2, 1, 1]}),
}


@pytest.mark.parametrize("padding", [0, 3])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_pools_on_channels_last_memory_equal_the_channels_first_fold_bit_for_bit(name, padding):
    """A pool over channels-last memory (its channels a slice of wider pixels too: `padding`)
    folds a channels-last window view, and an AveragePool whose windows hold no padding divides
    by the kernel's size instead of a folded count: the values a channels-first fold over
    contiguous memory gives, bit for bit, NaN and infinities included."""
    from rkcompile.emulator.kernels.pool import average_pool, max_pool

    shape, op, attrs = POOLS[name]
    x = rng.standard_normal(shape).astype(np.float32) * 100
    x.reshape(-1)[::7] = np.nan
    x.reshape(-1)[3::11] = -np.inf
    node = plain.Node(op, attrs=attrs, outputs=[plain.Variable("y")])
    kernel = max_pool if op == "MaxPool" else average_pool
    (last,), (first,) = kernel(node, [channels_last_slice(x, padding)], 17), kernel(node, [np.ascontiguousarray(x)], 17)
    assert np.moveaxis(last, 1, -1).flags.c_contiguous and first.flags.c_contiguous
    np.testing.assert_array_equal(np.ascontiguousarray(last).view(np.uint32), first.view(np.uint32))
    if op == "AveragePool" and "pads" not in attrs and "ceil_mode" not in attrs:  # divided by the kernel's size
        from rkcompile.emulator.kernels._windows import fold_taps, windows

        geometry = (attrs["kernel_shape"], attrs["strides"], [1] * len(attrs["strides"]), [0] * len(attrs["strides"]),
                    [0] * len(attrs["strides"]))
        rank = len(attrs["strides"])
        counted = fold_taps(windows(x, *geometry), rank, np.add) / fold_taps(windows(np.ones_like(x), *geometry), rank,
                                                                              np.add)
        np.testing.assert_array_equal(counted.view(np.uint32), first.view(np.uint32))
    expected = ReferenceEvaluator(helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "pool", [helper.make_tensor_value_info("x", 1, shape)],
        [helper.make_tensor_value_info("y", 1, None)]), opset_imports=[helper.make_opsetid("", 19)])).run(
        None, {"x": np.nan_to_num(x, nan=0.0, neginf=-1.0)})[0]
    (clean,) = kernel(node, [channels_last(np.nan_to_num(x, nan=0.0, neginf=-1.0))], 17)
    np.testing.assert_allclose(clean, expected, rtol=1e-5, atol=1e-4)


def test_sigmoid_is_exact_in_float32_and_never_overflows():
    x = np.concatenate([np.linspace(-120, 120, 100_001, dtype=np.float32),
                        np.array([np.inf, -np.inf, 0.0, -0.0, 88.7, -88.7, -103.9], np.float32)])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        result = sigmoid(x.copy())
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, exact, rtol=3e-7, atol=1e-44)


def test_sigmoid_with_one_exp_is_the_two_exp_formula_bit_for_bit():
    """exp(-|x|) serves numerator and denominator: the values of exp(min(x, 0)) / (1 + exp(-|x|)),
    which the emulator computed before, on every float16 value, rounding edge and random float32
    bit pattern (NaN included)."""
    x = float32_cases()
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.exp(np.minimum(x, 0)) / (1 + np.exp(-np.abs(x)))
        result = sigmoid(x)
    np.testing.assert_array_equal(result.view(np.uint32), expected.view(np.uint32))


def whole_array_erf(x: np.ndarray) -> np.ndarray:
    """A&S 7.1.26 as one numpy expression over the whole array: what the emulator computed before
    erf went block by block."""
    sign = np.sign(x)
    a = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (sign * (1.0 - poly * np.exp(-a * a))).astype(x.dtype)


def test_erf_block_by_block_is_the_whole_array_expression_bit_for_bit():
    """Every float16 value, rounding edge and random float32 bit pattern, over more than one block
    and a last partial one: the same bits, NaN where it was NaN (its sign bit is numpy's loops')."""
    x = float32_cases()
    assert x.size > 2 * ERF_BLOCK and x.size % ERF_BLOCK
    with np.errstate(invalid="ignore"):
        expected, result = whole_array_erf(x), erf(x)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(result), nan)
    np.testing.assert_array_equal(result[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.parametrize("layout", ["channels-last view", "strided slice", "scalar", "empty"])
def test_erf_keeps_the_shape_and_memory_order_numpys_element_wise_ops_give(layout):
    values = rng.standard_normal((2, 7, 9, 13)).astype(np.float32) * 2
    x = {"channels-last view": values.transpose(0, 3, 1, 2), "strided slice": values[:, ::2, :, 1:],
         "scalar": np.array(0.7, np.float32), "empty": np.zeros((0, 3), np.float32)}[layout]
    result = erf(x)
    numpys = np.abs(x)  # any element-wise op: its result's memory order
    assert result.shape == x.shape and result.dtype == x.dtype and result.strides == numpys.strides
    np.testing.assert_array_equal(result.view(np.uint32), whole_array_erf(x).view(np.uint32))


@pytest.mark.skipif(not (SHARED / "zoo" / "squeezenet1_1.onnx").exists(), reason="needs /work/shared/zoo")
def test_weight_cache_reuses_the_first_runs_weights_without_changing_outputs():
    name = "squeezenet1_1"
    prepared = prepare(SHARED / "zoo" / f"{name}.onnx", "rk3588", Options())
    inputs = make_inputs(prepared.plan, {}, seed=3)
    first = emulate(prepared, inputs).outputs
    decoded = dict(prepared.weight_cache.decoded)
    assert decoded and prepared.weight_cache.nodes is not None
    assert not any(array.flags.writeable for array in decoded.values())
    second = emulate(prepared, inputs).outputs
    assert all(prepared.weight_cache.decoded[k] is v for k, v in decoded.items())  # decoded once
    assert prepared.weight_cache.nodes is not None
    uncached = Executor(prepared.plan, prepared.weights, RK3588).run(inputs).outputs
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
        np.testing.assert_array_equal(first[key], uncached[key])


def test_int8_weights_are_decoded_to_reals_only_when_a_step_reads_them_so(tmp_path):
    """Int8 kernels read an int8 weight's integers, so its real value, which the step nodes'
    constant holds, is made only when read (by a CPU step or a float kernel), and is then what
    the weight region's integers dequantize to."""
    folder = tmp_path / "calib"
    folder.mkdir()
    for seed in range(3):
        np.save(folder / f"{seed}.npy", np.random.default_rng(seed).standard_normal((1, 3, 64, 64)).astype(np.float32))
    prepared = prepare(TINY_CNN, "rk3588", Options(dtype="int8", calibration=folder, **PREFERRED_INT8))
    emulate(prepared, make_inputs(prepared.plan, {}, seed=1))
    executor = prepared.executor()
    deferred = {t.name: t for node in executor.step_nodes() for member in plain.expanded_members(node)
                for t in member.inputs if isinstance(t, plain.DeferredConstant)}
    conv_weights = {node.inputs[1].name for node in prepared.reference_nodes if node.op == "Conv"}
    assert conv_weights and conv_weights <= deferred.keys()
    assert all(deferred[name]._made is None for name in conv_weights)  # the run read integers only
    for name in conv_weights:
        stored = executor.storage.read(name)
        assert stored.dtype == np.int8
        np.testing.assert_array_equal(deferred[name].values, dequantize(stored, executor.quantization[name]))
        assert deferred[name].values is deferred[name].values  # made once


def test_runs_of_one_executor_reuse_its_regions_each_starting_from_zeros():
    """A plan's runs go through one Executor: the same region buffers and tensor views every
    run, each run starting from zeroed regions as a new Executor's, whatever an earlier run left."""
    prepared = prepare(TINY_CNN, "rk3588", Options())
    first_inputs, second_inputs = make_inputs(prepared.plan, {}, seed=1), make_inputs(prepared.plan, {}, seed=2)
    emulate(prepared, first_inputs)
    executor = prepared.executor()
    regions = dict(executor.storage.regions)
    views = {name: executor.storage.view(name) for name in executor.plan.tensors}
    regions["arena"][...] = 0xFF  # what an earlier run may leave anywhere
    first_step = executor.plan.steps[0]
    written = [executor.plan.tensors[name] for name in first_step.outputs]
    untouched = np.ones(regions["arena"].size, bool)
    for placement in written:
        if placement.region == "arena":
            untouched[placement.offset:placement.offset + placement.bytes] = False
    after_first_step = []

    def observe(step: int, values: dict) -> None:
        if step == first_step.id:
            after_first_step.append(regions["arena"][untouched].copy())

    second = emulate(prepared, second_inputs, observe).outputs
    assert prepared.executor() is executor
    assert all(executor.storage.regions[name] is region for name, region in regions.items())
    assert all(executor.storage.view(name) is view for name, view in views.items())
    assert not after_first_step[0].any()  # zeroed before the run, not only where it wrote
    fresh = Executor(prepared.plan, prepared.weights, RK3588).run(second_inputs).outputs
    for name in fresh:
        np.testing.assert_array_equal(second[name], fresh[name])


@pytest.mark.skipif(not (SHARED / "zoo" / "squeezenet1_1.onnx").exists(), reason="needs /work/shared/zoo")
def test_weights_decoded_in_one_cast_equal_their_one_by_one_reads():
    prepared = prepare(SHARED / "zoo" / "squeezenet1_1.onnx", "rk3588", Options())
    executor = Executor(prepared.plan, prepared.weights, RK3588)
    executor.step_nodes()
    float16 = [name for name, t in prepared.plan.tensors.items() if t.region == "weight" and t.dtype == "float16"]
    assert float16 and set(float16) <= set(executor.weight_cache.decoded)
    # all of them views of one float32 array, filled by one conversion per stretch of the region
    assert len({id(executor.weight_cache.decoded[name].base) for name in float16}) == 1
    for name in float16:
        decoded = executor.weight_cache.decoded[name]
        one_by_one = executor.storage.read(name, np.float32)
        assert decoded.shape == one_by_one.shape and not decoded.flags.writeable
        np.testing.assert_array_equal(decoded.view(np.uint32), one_by_one.view(np.uint32))


def test_movement_steps_run_on_the_stored_float16_values_bit_for_bit(tmp_path, monkeypatch):
    """Reshape, Transpose, Slice and Concat between NPU tensors move float16 values as stored
    (no float32 round trip), and the outputs are those of the float32 path."""
    from rkcompile.emulator import executor as executor_module
    from rkcompile.emulator.registry import KERNELS

    weight = numpy_helper.from_array(rng.standard_normal((13, 5, 3, 3)).astype(np.float32), "w")
    # channels into rows: it moves stored bytes, so it is a step (one that moves none is an alias)
    shape = numpy_helper.from_array(np.array([1, 8, 13, 8], np.int64), "shape")
    starts, ends, axes = (numpy_helper.from_array(np.array([v], np.int64), n)
                          for n, v in (("starts", 1), ("ends", 3), ("axes", 2)))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Concat", ["s", "s"], ["j"], axis=3),
             helper.make_node("Relu", ["j"], ["y"])]
    graph = helper.make_graph(nodes, "movement", [helper.make_tensor_value_info("x", 1, [1, 5, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, 8, 2, 26])],
                              [weight, shape, starts, ends, axes])
    path = tmp_path / "movement.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    seen = {}
    for op in ("Reshape", "Transpose", "Slice", "Concat"):
        def recording(node, inputs, opset, kernel=KERNELS[op]):
            seen[node.op] = inputs[0].dtype
            return kernel(node, inputs, opset)
        monkeypatch.setitem(KERNELS, op, recording)

    def outputs():
        prepared = prepare(path, "rk3588", Options())
        assert {s.kernel for s in prepared.plan.steps if s.device == "npu"} >= {"Reshape", "Transpose", "Slice",
                                                                                   "Concat"}
        return emulate(prepared, make_inputs(prepared.plan, {}, seed=4)).outputs

    stored = outputs()
    assert seen == dict.fromkeys(("Reshape", "Transpose", "Slice", "Concat"), np.dtype(np.float16))
    monkeypatch.setattr(executor_module, "MOVEMENT_IN_STORED_DTYPE", frozenset())
    widened = outputs()
    assert set(seen.values()) == {np.dtype(np.float32)}
    np.testing.assert_array_equal(stored["y"].view(np.uint32), widened["y"].view(np.uint32))


@pytest.mark.parametrize("stored_values", [True, False])
def test_row_major_integer_weights_reach_kernels_as_the_weight_regions_own_bytes(tmp_path, monkeypatch,
                                                                                 stored_values):
    """A Reshape's int64 shape is handed to its kernel as a read-only view of the weight region
    (no copy), on the movement path that runs on stored values and on the float32 one."""
    from rkcompile.emulator import executor as executor_module
    from rkcompile.emulator.registry import KERNELS

    weight = numpy_helper.from_array(rng.standard_normal((13, 5, 3, 3)).astype(np.float32), "w")
    # channels into rows: it moves stored bytes, so it is a step (one that moves none is an alias)
    shape = numpy_helper.from_array(np.array([1, 8, 13, 8], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", 1, [1, 5, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, 8, 13, 8])], [weight, shape])
    path = tmp_path / "reshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    seen = []

    def recording(node, inputs, opset, kernel=KERNELS["Reshape"]):
        seen.append(inputs[1])
        return kernel(node, inputs, opset)
    monkeypatch.setitem(KERNELS, "Reshape", recording)
    if not stored_values:
        monkeypatch.setattr(executor_module, "MOVEMENT_IN_STORED_DTYPE", frozenset())
    prepared = prepare(path, "rk3588", Options())
    assert any(s.kernel == "Reshape" and s.device == "npu" for s in prepared.plan.steps)
    inputs = make_inputs(prepared.plan, {}, seed=5)
    outputs = emulate(prepared, inputs).outputs
    (given,) = seen
    assert np.shares_memory(given, np.frombuffer(prepared.weights, np.uint8)) and not given.flags.writeable
    assert given.dtype == np.int64 and given.tolist() == [1, 8, 13, 8]
    uncached = Executor(prepared.plan, prepared.weights, RK3588).run(inputs).outputs
    np.testing.assert_array_equal(outputs["y"], uncached["y"])


@pytest.mark.skipif(not (SHARED / "zoo" / "squeezenet1_1.onnx").exists(), reason="needs /work/shared/zoo")
def test_the_weight_region_is_the_weight_bytes_read_only_and_a_write_into_it_is_refused():
    prepared = prepare(SHARED / "zoo" / "squeezenet1_1.onnx", "rk3588", Options())
    executor = Executor(prepared.plan, prepared.weights, RK3588)
    region = executor.storage.regions["weight"]
    assert np.shares_memory(region, np.frombuffer(prepared.weights, np.uint8)) and not region.flags.writeable
    name, placement = next((n, t) for n, t in prepared.plan.tensors.items() if t.region == "weight" and t.bytes)
    with pytest.raises(EmulationError, match=f"tensor {name} is written, but the plan places it in the weight"):
        executor.storage.write(name, np.zeros(placement.shape, placement.dtype))


def test_relu_is_numpys_maximum_bit_for_bit_but_for_signaling_nans():
    x = float32_cases()
    signaling = np.isnan(x) & (x.view(np.uint32) & 0x400000 == 0)
    x = x[~signaling]
    expected = np.maximum(x, 0)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(relu(x).view(np.uint32), expected.view(np.uint32))
        y = x.copy()
        assert relu(y, out=y) is y
    np.testing.assert_array_equal(y.view(np.uint32), expected.view(np.uint32))


def fused_node(members: list[plain.Node], inputs: list[plain.Variable], outputs: list[plain.Variable]) -> plain.Node:
    body = plain.Graph(nodes=members, inputs=inputs, outputs=outputs)
    return plain.Node("Fused", name="fused", domain="rkcompile", attrs={"body": body},
                   inputs=[plain.Variable("outer_x", np.float32)], outputs=[plain.Variable(t.name, np.float32) for t in outputs])


def test_fused_members_write_into_spent_intermediates_only_with_the_same_values():
    """Members compute in place into intermediates no later member or output reads; never into
    the body's inputs, an output, or an intermediate whose memory a live one shares (a
    Reshape's view)."""
    from rkcompile.emulator.fused import run_fused
    from rkcompile.emulator.registry import IN_PLACE, KERNELS

    t = {name: plain.Variable(name, np.float32) for name in "xabcdefg"}
    shape = plain.Constant("shape", np.array([2, 6, 4], np.int64))
    low, high = plain.Constant("low", np.array(-0.5, np.float32)), plain.Constant("high", np.array(0.75, np.float32))
    members = [plain.Node("Mul", inputs=[t["x"], t["x"]], outputs=[t["a"]]),         # a = x * x
               plain.Node("Sub", inputs=[t["a"], t["x"]], outputs=[t["b"]]),         # b = a - x (a spent)
               plain.Node("Reshape", inputs=[t["b"], shape], outputs=[t["c"]]),      # c: a view of b
               plain.Node("Relu", inputs=[t["c"]], outputs=[t["d"]]),                # c spent, but b lives on
               plain.Node("Clip", inputs=[t["b"], low, high], outputs=[t["e"]]),     # b spent: in place
               plain.Node("Sigmoid", inputs=[t["e"]], outputs=[t["f"]]),             # e read again below
               plain.Node("Mul", inputs=[t["e"], t["f"]], outputs=[t["g"]])]         # e, f spent
    node = fused_node(members, [t["x"]], [t["d"], t["g"]])
    x = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    kept = x.copy()
    calls = []

    def run_member(member, operands):
        return list(KERNELS[member.op](member, operands, 17))

    def in_place(member, operands, spent):
        kernel = IN_PLACE.get(member.op)
        results = None if kernel is None else kernel(member, operands, 17, spent)
        if results is not None:
            calls.append((member.op, tuple(spent)))
        return results

    allocated = run_fused(node, [x], run_member)
    reused = run_fused(node, [x], run_member, in_place)
    np.testing.assert_array_equal(x, kept)  # the body's input is never written
    assert calls == [("Sub", (0,)), ("Clip", (0,)), ("Mul", (0, 1))]  # not the Relu on b's view
    for expected, got in zip(allocated, reused):
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_linear_resize_blends_in_place_with_the_expressions_rounding():
    """Each resized axis is low * (1 - weight) + high * weight, computed into the gathered arrays:
    bit for bit what the expression gives, on channels-last input as the executor hands it."""
    from rkcompile.emulator.kernels.resize import resize, source_coordinates

    x = channels_last(rng.standard_normal((1, 6, 5, 7)).astype(np.float32))
    node = plain.Node("Resize", attrs={"mode": "linear", "coordinate_transformation_mode": "half_pixel"})
    (result,) = resize(node, [x, None, None, np.array([1, 6, 12, 9], np.int64)], 13)
    expected = x
    for axis, size in ((2, 12), (3, 9)):
        coordinates = np.clip(source_coordinates("half_pixel", size, x.shape[axis], size / x.shape[axis]), 0,
                              x.shape[axis] - 1)
        low = np.floor(coordinates).astype(np.int64)
        high = np.minimum(low + 1, x.shape[axis] - 1)
        weight = (coordinates - low).astype(np.float32).reshape([size if a == axis else 1 for a in range(4)])
        expected = np.take(expected, low, axis=axis) * (1 - weight) + np.take(expected, high, axis=axis) * weight
    np.testing.assert_array_equal(result.view(np.uint32), expected.view(np.uint32))


RESIZES = {
    "linear_upsample": ((1, 6, 5, 7), [1, 6, 11, 16], {"mode": "linear"}),
    "linear_align_corners_every_axis": ((2, 3, 4, 5), [3, 5, 7, 3],
                                        {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    "nearest_down_and_up": ((1, 9, 8, 6), [1, 9, 3, 13], {"mode": "nearest", "nearest_mode": "floor",
                                                           "coordinate_transformation_mode": "asymmetric"}),
    "linear_3d": ((1, 4, 3, 4, 5), [1, 4, 6, 2, 9], {"mode": "linear"}),
}


@pytest.mark.parametrize("padding", [0, 3])
@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resize_on_channels_last_memory_equals_the_channels_first_resize_bit_for_bit(name, padding):
    """Over channels-last memory the resize gathers and blends on the channels-last view (with
    the last spatial axis' weights repeated along the channels), every ONNX axis in its place,
    N and C included: the values the channels-first resize of contiguous memory gives, bit for
    bit, and the result channels-last in memory for the store. So too when the channels are a
    slice of wider pixels (`padding` channels more), as Storage.read hands over a tensor whose
    channels do not fill whole C2 blocks."""
    from rkcompile.emulator.kernels.resize import resize

    shape, sizes, attrs = RESIZES[name]
    x = rng.standard_normal(shape).astype(np.float16).astype(np.float32)
    node = plain.Node("Resize", attrs=attrs)
    operands = [None, None, np.array(sizes, np.int64)]
    (last,), (first,) = resize(node, [channels_last_slice(x, padding), *operands], 13), resize(node, [x, *operands], 13)
    assert list(last.shape) == sizes and np.moveaxis(last, 1, -1).flags.c_contiguous
    np.testing.assert_array_equal(np.ascontiguousarray(last).view(np.uint32), first.view(np.uint32))
