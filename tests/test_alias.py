"""Relabels that move no stored byte (passes/alias.py): their outputs are aliases of their inputs'
storage, no step; the proof on element positions, the plan, the arena, the emulator and the plan
readers that rebuild the graph."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, value_info, weight
from onnx import helper

import rkcompile
from rkcompile.emulator import onnxruntime_outputs
from rkcompile.emulator.float_reference import FloatReference
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_shape, stored_positions
from rkcompile.plan.aliases import with_views
from rkcompile.plan.allocation import verify_allocation
from rkcompile.plan.schema import PlanRecord, contract_violations
from rkcompile.views.partitioned_onnx import partitioned_model
from rkcompile.views.summary import render_summary

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("shape", [(1, 13, 4, 4), (2, 9, 3), (3, 17), (20,), (1, 1, 5, 1)])
def test_stored_positions_are_where_the_nc1hwc2_encoding_puts_each_element(shape):
    c2 = 8
    n, c, h, w = as_nchw(shape)
    padded = np.full((n, -(-c // c2) * c2, h, w), -1, np.int64)
    padded[:, :c] = np.arange(np.prod(shape)).reshape(n, c, h, w)
    # seed 003's layout written out: channel blocks of C2, each block's channels innermost
    stored = padded.reshape(n, -1, c2, h, w).transpose(0, 1, 3, 4, 2).reshape(-1)
    assert stored.size == np.prod(nc1hwc2_shape((n, c, h, w), c2))
    positions = stored_positions(shape, "NC1HWC2", c2)
    assert positions.shape == shape
    assert np.array_equal(stored[positions.reshape(-1)], np.arange(np.prod(shape)))
    assert np.array_equal(stored_positions(shape, "ND", None).reshape(-1), np.arange(np.prod(shape)))


def _relabel_model(relabels, shape_after, tail="Sigmoid"):
    """Conv [1,6,8,8] -> `relabels` (node builders reading "c" and writing "r") -> `tail` -> y."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), *relabels,
             helper.make_node(tail, ["r"], ["y"], name="tail")]
    initializers = [weight("w", RNG.standard_normal((6, 3, 3, 3)).astype(np.float32))]
    initializers += [init for init in _shapes if any(init.name in n.input for n in relabels)]
    return make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", shape_after)], initializers)


_shapes = [weight("flat", np.array([1, 6, 64], np.int64)), weight("mixed", np.array([1, 1, 6, 64], np.int64)),
           weight("axis3", np.array([3], np.int64))]


def _planned(save, model, **options):
    path = save(model)
    plan = rkcompile.compile(path, "rk3588", **options)
    assert contract_violations(plan.record) == [] and verify_allocation(plan.record) == []
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = rkcompile.run(plan, {"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})["y"]
    return plan, got, want


def test_a_reshape_keeping_every_stored_byte_is_an_alias_not_a_step(save):
    model = _relabel_model([helper.make_node("Reshape", ["c", "flat"], ["f"], name="flatten"),
                            helper.make_node("Unsqueeze", ["f", "axis3"], ["r"], name="unsqueeze")], [1, 6, 64, 1])
    plan, got, want = _planned(save, model)
    record = plan.record
    # the relabels, moved after the Sigmoid and joined into one Reshape, are no step
    assert [s.device for s in record.steps] == ["host", "npu", "host"]
    conv_out = record.steps[1].outputs[0]
    (alias, placed), = [(name, t) for name, t in record.tensors.items() if t.aliases is not None]
    assert placed.aliases == conv_out and placed.shape == (1, 6, 64, 1)
    assert (placed.offset, placed.bytes) == (record.tensors[conv_out].offset, record.tensors[conv_out].bytes)
    assert record.steps[2].inputs == (alias,)  # the model output's conversion reads the alias
    assert "flatten" in {n.name for n in record.nodes if n.device == "removed"}
    assert "1 relabel aliased" in render_summary(record)
    np.testing.assert_allclose(got, want, atol=2e-2)
    # the plan JSON keeps the field where it is set, and reads back
    data = record.to_dict()
    assert data["tensors"][alias]["aliases"] == conv_out and "aliases" not in data["tensors"][conv_out]
    assert PlanRecord.from_dict(json.loads(json.dumps(data))) == record


def test_a_relabel_that_moves_channels_stays_a_step(save):
    # [1,6,8,8] -> [1,1,6,64]: the 6 channels become rows of one channel, other bytes
    model = _relabel_model([helper.make_node("Reshape", ["c", "mixed"], ["r"], name="reshape")], [1, 1, 6, 64])
    plan, got, want = _planned(save, model)
    assert [s.kernel for s in plan.record.steps].count("Reshape") == 1
    assert all(t.aliases is None for t in plan.record.tensors.values())
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_a_cpu_reader_and_the_graph_rebuilt_from_the_plan_see_the_alias(save):
    # Erf runs on the CPU: its host conversion reads the alias
    model = _relabel_model([helper.make_node("Reshape", ["c", "flat"], ["r"], name="flatten")], [1, 6, 64],
                           tail="Erf")
    plan, got, want = _planned(save, model)
    record = plan.record
    assert [t.aliases for t in record.tensors.values() if t.aliases is not None]
    assert any(s.device == "cpu" for s in record.steps)
    np.testing.assert_allclose(got, want, atol=2e-2)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    rebuilt = partitioned_model(record, plan.reference_nodes).SerializeToString()
    session = ort.InferenceSession(rebuilt, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["y"], {"x": x})[0], onnxruntime_outputs(save(model), {"x": x})["y"],
                               atol=1e-5)


def test_an_int8_plan_aliases_a_relabel_sharing_its_parameters(save):
    model = _relabel_model([helper.make_node("Reshape", ["c", "flat"], ["r"], name="flatten")], [1, 6, 64])
    plan, got, want = _planned(save, model, dtype="int8")
    record = plan.record
    (alias, source), = [(name, t.aliases) for name, t in record.tensors.items() if t.aliases is not None]
    assert (record.quantization[alias].scales, record.quantization[alias].zero_points) == \
        (record.quantization[source].scales, record.quantization[source].zero_points)
    assert np.corrcoef(got.reshape(-1), want.reshape(-1))[0, 1] > 0.99
    rows = rkcompile.accuracy_analysis(plan)  # the float reference runs the alias as a Reshape
    assert {row.output for row in rows} >= {"y"}


def test_a_chain_of_relabels_ending_on_its_first_tensors_bytes_is_one_alias(save):
    # 8 channels are one float16 C2 block on rk3588: stored pixel by pixel, channels innermost,
    # which is how [64, 8] rows are stored; the Transpose and Reshape between move bytes each
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], name="nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "rows"], ["r"], name="rows"),
             helper.make_node("MatMul", ["r", "m"], ["y"], name="matmul")]
    model = make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [64, 5])],
                       [weight("w", RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)),
                        weight("rows", np.array([64, 8], np.int64)),
                        weight("m", RNG.standard_normal((8, 5)).astype(np.float32))])
    path = save(model)
    plan = rkcompile.compile(path, "rk3588")
    record = plan.record
    assert contract_violations(record) == [] and verify_allocation(record) == []
    assert not [s for s in record.steps if s.kernel in ("Transpose", "Reshape")]
    assert "t" not in record.tensors  # read only by the next relabel, it is in no plan
    (alias, placed), = [(name, t) for name, t in record.tensors.items() if t.aliases == "c"]
    assert placed.view[0] == ("Transpose", (0, 2, 3, 1)) and placed.view[-1] == ("Reshape", placed.shape)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = onnxruntime_outputs(path, {"x": x})["y"]
    np.testing.assert_allclose(rkcompile.run(plan, {"x": x})["y"], want, atol=0.1)
    rebuilt = partitioned_model(record, plan.reference_nodes).SerializeToString()
    session = ort.InferenceSession(rebuilt, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["y"], {"x": x})[0], want, atol=1e-4)
    assert min(row.cosine for row in rkcompile.accuracy_analysis(plan, {"x": x})) > 0.999
    # the same chain on 9 channels (two blocks) moves bytes: it stays steps
    wider = make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [64, 5])],
                       [weight("w", RNG.standard_normal((9, 3, 3, 3)).astype(np.float32)),
                        weight("rows", np.array([64, 9], np.int64)),
                        weight("m", RNG.standard_normal((9, 5)).astype(np.float32))])
    assert [s.kernel for s in rkcompile.compile(save(wider, "wider.onnx"), "rk3588").record.steps].count("Transpose") == 1


def test_an_alias_of_an_alias_takes_its_view_from_the_tensor_with_the_bytes():
    from dataclasses import replace

    from rkcompile.passes.alias import composed
    from rkcompile.plan.aliases import viewed_indices
    from rkcompile.plan.schema import TensorPlacement

    base = TensorPlacement(shape=(1, 8, 4, 4), dtype="float16", layout="NC1HWC2", bytes=256, region="arena", offset=0)
    first = replace(base, shape=(1, 4, 4, 8), aliases="x", view=(("Transpose", (0, 2, 3, 1)),))
    rows = composed(first, (), (16, 8))  # a Reshape of `first` to [16, 8]
    expected = np.arange(128).reshape(1, 8, 4, 4).transpose(0, 2, 3, 1).reshape(16, 8)
    assert np.array_equal(viewed_indices((1, 8, 4, 4), (16, 8), rows), expected)
    # Reshapes of a Reshape are one Reshape: the empty view
    assert composed(replace(base, shape=(1, 8, 16), aliases="x"), (), (1, 8, 16, 1)) == ()


def test_an_alias_of_a_cpu_result_converted_for_the_npu_is_rebuilt_as_its_view(save):
    """TopK runs on the CPU; its scores' NPU copy (a host step) is unsqueezed into an alias the
    Concat reads (RT-DETR's query selection). The float reference runs a host step as the identity
    its conversion is on real values, but the alias after it still needs its Reshape."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "rows"], ["scores"], name="rows"),
             helper.make_node("TopK", ["scores", "k"], ["top", "indices"], name="topk", axis=-1),
             helper.make_node("Unsqueeze", ["top", "last"], ["column"], name="unsqueeze"),
             helper.make_node("Sigmoid", ["column"], ["gate"], name="gate"),
             helper.make_node("Concat", ["gate", "column"], ["y"], name="concat", axis=-1)]
    model = make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 6, 16, 2])],
                       [weight("w", RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)),
                        weight("rows", np.array([1, 6, 64], np.int64)), weight("k", np.array([16], np.int64)),
                        weight("last", np.array([-1], np.int64))])
    plan = rkcompile.compile(save(model), "rk3588")
    record = plan.record
    host_written = {name for step in record.steps if step.device == "host" for name in step.outputs}
    assert any(t.aliases in host_written for t in record.tensors.values()), "the case needs an alias of a host step"
    nodes, devices = with_views(record, plan.reference_nodes)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    rebuilt = FloatReference(nodes, devices, record.model.opset, ["y"]).run({"x": x}, adjust=lambda name, value: None)
    np.testing.assert_allclose(rebuilt["y"], onnxruntime_outputs(save(model), {"x": x})["y"], rtol=1e-5, atol=1e-5)
