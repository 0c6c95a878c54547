"""Layouts: NC1HWC2 sizes from seed 003 (its worked examples and every C2 column of table 3-1),
rank < 4 NPU tensors, and the layout pass's rules on a compiled plan."""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_model, value_info, weight
from onnx import helper

from rkcompile.api import prepare
from rkcompile.emulator import emulate, onnxruntime_outputs
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_bytes, nc1hwc2_shape
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.allocation import Buffer, lower_bound
from rkcompile.targets import all_targets, get_target

#: Seed 003, table 3-1: C2 per platform column and dtype ('/' cells left out).
SEED_C2 = {
    "RK2118": {"float16": 4},
    "RK3566/RK3568": {"int8": 8, "float16": 4},
    "RK3588/RK3576/RV1126B": {"int8": 16, "float16": 8},
    "RV1103B/RV1106B": {"int8": 8},
    "RV1103/RV1106": {"int8": 16, "float16": 8},
    "RK3562": {"int8": 16, "float16": 8},
}
COLUMNS = [(column, dtype, c2) for column, row in SEED_C2.items() for dtype, c2 in row.items()]
ITEMSIZE = {"int8": 1, "float16": 2}


def test_seed_003_worked_examples():
    """(1,13,4,4) int8 on RK3568 is (1,2,4,4,8); so is (1,13,2,2) -> (1,2,2,2,8): 3 of every 8
    channels in the second block are padding."""
    c2 = SEED_C2["RK3566/RK3568"]["int8"]
    assert nc1hwc2_shape((1, 13, 4, 4), c2) == (1, 2, 4, 4, 8)
    assert nc1hwc2_shape((1, 13, 2, 2), c2) == (1, 2, 2, 2, 8)
    assert nc1hwc2_bytes((1, 13, 4, 4), c2, 1) == 1 * 2 * 4 * 4 * 8
    assert nc1hwc2_bytes((1, 13, 4, 4), c2, 1) - 13 * 4 * 4 == 3 * 4 * 4


@pytest.mark.parametrize("column,dtype,c2", COLUMNS, ids=[f"{c}-{d}" for c, d, _ in COLUMNS])
@pytest.mark.parametrize("channels,stored", [(13, {4: 16, 8: 16, 16: 16}), (17, {4: 20, 8: 24, 16: 32}),
                                              (32, {4: 32, 8: 32, 16: 32}), (1, {4: 4, 8: 8, 16: 16})])
def test_every_c2_column_pads_channels_up(column, dtype, c2, channels, stored):
    shape = (2, channels, 3, 5)
    assert nc1hwc2_shape(shape, c2) == (2, stored[c2] // c2, 3, 5, c2)
    assert nc1hwc2_bytes(shape, c2, ITEMSIZE[dtype]) == 2 * stored[c2] * 3 * 5 * ITEMSIZE[dtype]


def test_targets_c2_tables_match_seed_003():
    columns = {name.lower(): row for column, row in SEED_C2.items() for name in column.split("/")}
    checked = 0
    for target in all_targets():
        if target.name in columns:
            for dtype, c2 in columns[target.name].items():
                assert target.c2_for(dtype) == c2, f"{target.name} {dtype}"
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("shape,nchw", [((), (1, 1, 1, 1)), ((7,), (1, 7, 1, 1)), ((2, 7), (2, 7, 1, 1)),
                                        ((2, 7, 9), (2, 7, 1, 9)), ((2, 7, 9, 4), (2, 7, 9, 4))])
def test_rank_below_4_is_stored_with_channels_on_axis_1(shape, nchw):
    assert as_nchw(shape) == nchw
    assert math.prod(as_nchw(shape)) == math.prod(shape)


def test_rank_5_is_refused():
    with pytest.raises(ValueError, match="rank 4 or less"):
        as_nchw((1, 2, 3, 4, 5))


def _mixed_model():
    """Two convs on the NPU, Erf (in no NPU list) on the CPU, two more convs, then pool,
    flatten and gemm, whose rank-2 results the NPU stores as (N, C, 1, 1). Channel counts
    are odd so NC1HWC2 pads; the convs are heavy enough to be worth their conversions."""
    channels = 61
    convs = [helper.make_node("Conv", [source, f"w{i}"], [result], name=f"conv{i}", pads=[1, 1, 1, 1])
             for i, (source, result) in enumerate([("t0", "t1"), ("t1", "t2"), ("e", "t3"), ("t3", "t4")])]
    nodes = [
        *convs[:2],
        helper.make_node("Erf", ["t2"], ["e"], name="erf"),
        *convs[2:],
        helper.make_node("GlobalAveragePool", ["t4"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "g"], ["y"], name="gemm", transB=1),
    ]
    weights = [weight(f"w{i}", np.full((channels, 29 if i == 0 else channels, 3, 3), 0.01, np.float32))
               for i in range(4)]
    return make_model(nodes, [value_info("t0", [1, 29, 64, 64])], [value_info("y", [1, 10])],
                      [*weights, weight("g", np.full((10, channels), 0.01, np.float32))])


@pytest.mark.parametrize("target", ["rk3588", "rk3576", "rk3562"])
def test_layout_rules_on_a_plan(save, target):
    plan, _ = compile_model(save(_mixed_model()), target)
    c2 = {t.name: t for t in all_targets()}[target].c2_for(plan.dtype)
    writer = {out: step for step in plan.steps for out in step.outputs}
    readers: dict[str, set[str]] = {}
    for step in plan.steps:
        for name in step.inputs:
            readers.setdefault(name, set()).add(step.device)
    declared = {t.name: t for t in (*plan.model.inputs, *plan.model.outputs)}
    seen = set()
    for name, tensor in plan.tensors.items():
        if name in declared:
            assert (tensor.shape, tensor.dtype) == (declared[name].shape, declared[name].dtype)
            assert tensor.layout in ("NCHW", "ND") and tensor.region in ("input", "output")
            continue
        if tensor.region == "weight":
            assert tensor.bytes == math.prod(tensor.shape) * np.dtype(tensor.dtype).itemsize
            seen.add(("weight", tensor.dtype))
            continue
        step = writer[name] if tensor.aliases is None else writer[tensor.aliases]  # an alias is its source's bytes
        stored_on = step.device if step.device != "host" else ("npu" if "npu" in readers.get(name, ()) else "cpu")
        if stored_on == "npu":
            assert tensor.layout == "NC1HWC2" and tensor.dtype == plan.dtype
            assert tensor.bytes == nc1hwc2_bytes(as_nchw(tensor.shape), c2, np.dtype(tensor.dtype).itemsize)
        else:
            assert tensor.layout == ("NCHW" if len(tensor.shape) == 4 else "ND")
            assert tensor.bytes == math.prod(tensor.shape) * np.dtype(tensor.dtype).itemsize
        seen.add((stored_on, tensor.layout))
    assert ("npu", "NC1HWC2") in seen and ("cpu", "NCHW") in seen and ("weight", "float16") in seen


def test_weights_beyond_float16_are_named_and_a_weight_no_pass_reads_stays_unread(save, caplog):
    """The layout pass warns about float32 weights a float16 step cannot hold (infinities and
    NaN are not beyond the range: they stay what they are), and checks the others without
    onnx-graphsurgeon loading them: a Conv weight no pass reads is still unread after the plan."""
    import logging

    from onnx_graphsurgeon.ir.tensor import LazyValues

    from rkcompile.compiler import pipeline

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "special"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "huge"], ["y"], name="mul")]
    special = np.array([np.inf, -np.inf, np.nan, 65504.0, -1.0, 0.0, 2.0, 3.0], np.float32).reshape(1, 8, 1, 1)
    huge = np.array([1.0, 7e4, -1e5, np.inf, 0.5, 0.5, 0.5, 0.5], np.float32).reshape(1, 8, 1, 1)
    path = save(make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16])],
                           [weight("w", w), weight("special", special), weight("huge", huge)]))
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        plan, ctx = pipeline.compile_model(path, "rk3588")
    warned = [r.getMessage() for r in caplog.records if "float16 range" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("layout: constant huge holds 2 value(s)")
    assert plan.tensors["w"].dtype == "float16"
    weights = {t.name: t for node in ctx.graph.nodes for t in node.inputs if t.name == "w"}
    assert isinstance(weights["w"]._values, LazyValues)


def _image_input_model(channels: int, readers: str):
    """x (1, channels, 16, 16) read by `readers`: "conv" (Conv + Relu, fused), "grouped" (a
    Conv of one group per channel) or "conv+relu" (a Conv and a Relu of its own)."""
    group = channels if readers == "grouped" else 1
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1], group=group),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    outputs = [value_info("y", [1, 8, 16, 16])]
    if readers == "conv+relu":
        nodes.append(helper.make_node("Relu", ["x"], ["r"], name="relu_x"))
        outputs.append(value_info("r", [1, channels, 16, 16]))
    w = np.random.default_rng(0).standard_normal((8, channels // group, 3, 3)).astype(np.float32)
    return make_model(nodes, [value_info("x", [1, channels, 16, 16])], outputs, [weight("w", w)])


@pytest.mark.parametrize("channels,readers,image", [
    (1, "conv", True), (3, "conv", True), (4, "conv", True), (2, "conv", False), (5, "conv", False),
    (3, "grouped", False), (3, "conv+relu", False)])
def test_a_model_input_only_ungrouped_convs_read_is_a_dense_nhwc_image(save, channels, readers, image):
    """RKNN's Convs read a 1, 3 or 4 channel model input as it is (Target.image_input_channels):
    the NPU copy is dense NHWC, and the arena's lower bound is below the one the same plan
    has with that copy padded to C2 blocks. Any other channel count or reader keeps NC1HWC2.
    The emulator runs the NHWC copy to the same result as onnxruntime."""
    path = save(_image_input_model(channels, readers))
    prepared = prepare(path, "rk3588")
    plan = prepared.plan
    stored = plan.tensors["x@npu"]
    c2 = get_target("rk3588").c2_for(plan.dtype)
    padded = nc1hwc2_bytes(as_nchw(stored.shape), c2, 2)
    if not image:
        assert stored.layout == "NC1HWC2" and stored.bytes == padded
        return
    assert stored.layout == "NHWC" and stored.bytes == channels * 16 * 16 * 2 < padded
    spans: dict[str, list[int]] = {}
    for step in plan.steps:
        for name in (*step.inputs, *step.outputs):
            if plan.tensors[name].region == "arena":
                spans.setdefault(name, [step.id, step.id])[1] = step.id
    as_blocks = [Buffer(first, last, padded if name == "x@npu" else plan.tensors[name].bytes)
                 for name, (first, last) in spans.items()]
    assert plan.memory.lower_bound_bytes < lower_bound(as_blocks)
    x = np.random.default_rng(1).standard_normal((1, channels, 16, 16)).astype(np.float32)
    seen = {}
    got = emulate(prepared, {"x": x}, observe=lambda step, values: seen.update(values)).outputs["y"]
    assert np.array_equal(seen["x@npu"], x.astype(np.float16).astype(np.float32))
    want = onnxruntime_outputs(path, {"x": x})["y"]
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
