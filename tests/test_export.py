"""`rkcompile export` and `rkcompile.export`: the planned graph as standard ONNX for rknn-toolkit2."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rkcompile
from rkcompile.cli import main
from rkcompile.errors import CompileError
from rkcompile.emulator.session import RANDOM_INT_HIGH
from rkcompile.plan.schema import FUSED_DOMAIN
from rkcompile.views.proto_graph import static_shapes
from rkcompile.views.toolkit_shapings.convolutions import _reshaped_on_the_toolkit_cpu
from rkcompile.views.toolkit_shapings import (added_convs_as_one, added_linears_as_one,
                                              attention_operands_in_one_transpose,
                                              channel_norms_as_layer_norms,
                                              batched_rows_as_one_image, flattened_planes_padded, small_planes_into_channels,
                                              radix_sums_as_channel_slices, rank3_tails_as_rank4, reshapes_after_elementwise_ops,
                                              softmaxes_before_layout_runs, token_rows_as_sequences,
                                              one_transpose_runs_shortened,
                                              token_rows_of_planes_padded, transpose_pairs_as_splits,
                                              transpose_steps_as_one, transposed_rows_as_planes,
                                              transposes_before_expands, transposes_from_splits,
                                              wide_transposes_as_block_swaps)
from rkcompile.views.toolkit_shapings.layouts import TOOLKIT_TRANSPOSE_EXTENT

from conftest import ZOO, make_model, value_info, weight
from test_quantize import attention_block
from test_rewrites_reductions import decomposed_layer_norm, l2_normalize

PEER_PYTHON = os.environ.get("RKNN_PEER_PYTHON")
PEER = ZOO.parent / "peer" / "rknn_peer.py"
needs_peer = pytest.mark.skipif(not (PEER_PYTHON and Path(PEER_PYTHON).is_file() and PEER.is_file()),
                                reason="rknn-toolkit2 is not installed (RKNN_PEER_PYTHON, ../shared/peer/rknn_peer.py)")


def conv_relu_erf(opset: int = 17) -> onnx.ModelProto:
    """Conv -> Relu (fused into one kernel on the NPU) -> Erf (the CPU on rk3588) -> Add."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Erf", ["r"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "r"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16])],
                      [weight("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2),
                       weight("b", rng.standard_normal(8).astype(np.float32))], opset=opset)


def onnxruntime_run(model: onnx.ModelProto | Path, feeds: dict) -> list[np.ndarray]:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def domains(model: onnx.ModelProto) -> set[str]:
    return {node.domain for node in model.graph.node} | {o.domain for o in model.opset_import}


def test_the_export_is_standard_onnx_equal_to_the_original(save, tmp_path):
    original = save(conv_relu_erf())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    onnx.checker.check_model(exported, full_check=True)
    assert domains(exported) <= {"", "ai.onnx"} and FUSED_DOMAIN not in domains(exported)
    assert exported.opset_import[0].version <= 19
    assert all(d.HasField("dim_value") for v in (*exported.graph.input, *exported.graph.output)
               for d in v.type.tensor_type.shape.dim)
    # the fused Conv+Relu kernel is written back as its members
    assert written.report["fused_kernels_written_back"]
    assert [n.op_type for n in exported.graph.node] == ["Conv", "Relu", "Erf", "Add"]
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0])
    report = json.loads(written.report_path.read_text())
    assert written.report_path == tmp_path / "out.report.json"
    assert [n["name"] for n in report["cpu_nodes"]] == ["erf"] and "Erf" in report["cpu_nodes"][0]["reason"]
    assert report["check"]["outputs"][0]["max_abs"] == 0.0


def test_a_newer_opset_is_converted_down_to_19(save, tmp_path):
    written = rkcompile.export(save(conv_relu_erf(opset=21)), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert exported.opset_import[0].version == 19
    assert written.report["opset"] == {"model": 21, "export": 19}


def test_a_plan_exports_as_its_model_does(save, tmp_path):
    original = save(conv_relu_erf())
    from_model = rkcompile.export(original, tmp_path / "a.onnx", "rk3588")
    from_plan = rkcompile.export(rkcompile.compile(original, "rk3588"), tmp_path / "b.onnx")
    assert from_model.path.read_bytes() == from_plan.path.read_bytes()


def sample_rate_model() -> onnx.ModelProto:
    """y = x * 2 when the `rate` input is 16000, else x * 3: an input that only selects a branch."""
    def branch(name: str, factor: float) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"])], name, [],
                                 [value_info(f"{name}_y", [1, 4, 8, 8])],
                                 [weight(f"{name}_k", np.float32(factor))])
    nodes = [helper.make_node("Equal", ["rate", "expected"], ["is_16k"], name="equal"),
             helper.make_node("If", ["is_16k"], ["y"], name="if", then_branch=branch("then", 2.0),
                              else_branch=branch("else", 3.0))]
    return make_model(nodes, [value_info("x", [1, 4, 8, 8]), value_info("rate", [], TensorProto.INT64)],
                      [value_info("y", [1, 4, 8, 8])], [weight("expected", np.int64(16000))])


def test_a_frozen_input_folds_its_branch_away(save, tmp_path):
    original = save(sample_rate_model())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", freeze_inputs={"rate": 16000})
    exported = onnx.load(str(written.path))
    assert [i.name for i in exported.graph.input] == ["x"]
    assert "If" not in {n.op_type for n in exported.graph.node}
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(exported, {"x": x})[0],
                                  onnxruntime_run(original, {"x": x, "rate": np.array(16000)})[0])
    assert written.report["frozen_inputs"] == {"rate": 16000}


def test_a_branch_reading_a_converted_tensor_reads_it_by_its_own_name(save, tmp_path):
    """An If on the CPU reads the NPU's Relu result inside its branches; the plan's host
    conversion renames that read, which the export undoes inside the branches too."""
    def branch(name: str, factor: float) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Mul", ["r", f"{name}_k"], [f"{name}_y"])], name, [],
                                 [value_info(f"{name}_y", [1, 4, 8, 8])], [weight(f"{name}_k", np.float32(factor))])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("If", ["flag"], ["y"], name="if", then_branch=branch("then", 2.0),
                              else_branch=branch("else", 3.0))]
    original = save(make_model(nodes, [value_info("x", [1, 4, 8, 8]), value_info("flag", [], TensorProto.BOOL)],
                               [value_info("y", [1, 4, 8, 8])]))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    assert [n["name"] for n in written.report["cpu_nodes"]] == ["if"]
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32), "flag": np.array(False)}
    np.testing.assert_array_equal(onnxruntime_run(onnx.load(str(written.path)), feeds)[0],
                                  onnxruntime_run(original, feeds)[0])


def test_slices_of_a_reshape_move_before_it(save, tmp_path):
    """Conv -> Reshape -> two Slices, yolov8's box head that rknn-toolkit2 2.5.0 fails on (the
    plan makes them one Split, which it fails on too), is written as Conv -> Split -> Reshapes,
    the same values."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="reshape"),
             helper.make_node("Slice", ["r", "zero", "two", "one"], ["a"], name="slice_a"),
             helper.make_node("Slice", ["r", "two", "four", "one"], ["b"], name="slice_b"),
             helper.make_node("Sub", ["b", "a"], ["y"], name="sub")]
    model = make_model(nodes, [value_info("x", [1, 16, 4, 64])], [value_info("y", [1, 2, 64])],
                       [weight("w", rng.standard_normal((1, 16, 1, 1)).astype(np.float32)),
                        weight("shape", np.array([1, 4, 64])), weight("zero", np.array([0])),
                        weight("two", np.array([2])), weight("four", np.array([4])), weight("one", np.array([1]))])
    original = save(model)
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node.op_type for node in exported.graph.node for out in node.output}
    cuts = [n for n in exported.graph.node if n.op_type in ("Slice", "Split")]
    assert [(n.op_type, made_by[n.input[0]]) for n in cuts] == [("Split", "Conv")]
    assert written.report["toolkit_shapings"]["slices_before_reshapes"] == 1
    x = rng.standard_normal((1, 16, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0])


def test_a_lone_slice_of_a_reshape_moves_before_it(save, tmp_path):
    """A Slice that is no part of a Split is written as Conv -> Slice -> Reshape."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "shape"], ["r"], name="reshape"),
             helper.make_node("Slice", ["r", "zero", "two", "one"], ["y"], name="slice")]
    model = make_model(nodes, [value_info("x", [1, 16, 4, 64])], [value_info("y", [1, 2, 64])],
                       [weight("w", rng.standard_normal((1, 16, 1, 1)).astype(np.float32)),
                        weight("shape", np.array([1, 4, 64])), weight("zero", np.array([0])),
                        weight("two", np.array([2])), weight("one", np.array([1]))])
    original = save(model)
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node.op_type for node in exported.graph.node for out in node.output}
    assert [made_by[n.input[0]] for n in exported.graph.node if n.op_type == "Slice"] == ["Conv"]
    assert written.report["toolkit_shapings"]["slices_before_reshapes"] == 1
    x = rng.standard_normal((1, 16, 4, 64)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0])


def test_gelu_keeps_its_division_before_erf(save, tmp_path):
    """The rewrites make GELU's x / sqrt(2) a Mul; the export writes the Div back, the form
    rknn-toolkit2 fuses (from the Mul it puts each Erf on the CPU)."""
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
             helper.make_node("Mul", ["m", "half"], ["y"], name="half_mul")]
    original = save(make_model(nodes, [value_info("x", [1, 16, 8, 8])], [value_info("y", [1, 16, 8, 8])],
                               [weight("sqrt2", np.float32(np.sqrt(2))), weight("one", np.float32(1)),
                                weight("half", np.float32(0.5))]))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node.op_type for node in exported.graph.node for out in node.output}
    assert [made_by[n.input[0]] for n in exported.graph.node if n.op_type == "Erf"] == ["Div"]
    assert written.report["toolkit_shapings"]["erf_of_a_quotient"] == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-6


@pytest.mark.parametrize("opset", [15, 16])
def test_a_layer_norm_the_plan_made_below_opset_17_is_written_in_the_models_opset(save, tmp_path, opset):
    """Below opset 17 the rewrites make a LayerNormalization for rk3588's exNorm (the plan's
    kernel holds it); the export keeps the model's opset and writes it as the ops torch writes
    below 17, which rknn-toolkit2 fuses back into its exNorm (wav2vec2's export at opset 16
    was refused as invalid ONNX before)."""
    original = save(decomposed_layer_norm([1, 24, 64], [-1], opset))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert exported.opset_import[0].version == opset
    assert "LayerNormalization" not in {n.op_type for n in exported.graph.node}
    assert {"ReduceMean", "Sqrt", "Div"} <= {n.op_type for n in exported.graph.node}
    x = np.random.default_rng(1).standard_normal((1, 24, 64)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def attention_with_scaled_q() -> onnx.ModelProto:
    """softmax((s*q)^T k) v^T, yolo11's attention."""
    nodes = [helper.make_node("Mul", ["q", "scale"], ["scaled"], name="mul"),
             helper.make_node("Transpose", ["scaled"], ["qt"], name="transpose", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qt", "k"], ["scores"], name="scores"),
             helper.make_node("Softmax", ["scores"], ["attention"], name="softmax", axis=-1),
             helper.make_node("Transpose", ["attention"], ["at"], name="transpose_1", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["v", "at"], ["y"], name="values")]
    return make_model(nodes, [value_info(n, [1, 2, 16, 32]) for n in "qkv"], [value_info("y", [1, 2, 16, 32])],
                      [weight("scale", np.float32(0.25))])


def same_padding_of_a_strided_conv() -> onnx.ModelProto:
    """tf2onnx's "same" padding of a strided depthwise Conv: Pad(0, 1) -> Conv."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads", "zero"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv", strides=[2, 2], group=8)]
    return make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 8, 8])],
                      [weight("pads", np.array([0, 0, 0, 0, 0, 0, 1, 1])), weight("zero", np.float32(0)),
                       weight("w", rng.standard_normal((8, 1, 3, 3)).astype(np.float32))], opset=13)


def token_mean_classifier(normalized: bool) -> onnx.ModelProto:
    """The mean of 49 tokens, then a linear classifier (swin's head); after a LayerNorm without
    its default `epsilon` when `normalized` (the plan then holds the tokens on the batch axis).
    16 classes: the toolkit reshapes an output of 10 on its CPU."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ReduceMean", ["n" if normalized else "x"], ["mean"], name="mean", axes=[1],
                              keepdims=0),
             helper.make_node("Gemm", ["mean", "w", "b"], ["y"], name="fc", transB=1)]
    weights = [weight("w", rng.standard_normal((16, 64)).astype(np.float32)),
               weight("b", rng.standard_normal(16).astype(np.float32))]
    if normalized:
        nodes.insert(0, helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="norm", axis=-1))
        weights += [weight("gamma", np.ones(64, np.float32)), weight("beta", np.zeros(64, np.float32))]
    return make_model(nodes, [value_info("x", [1, 49, 64])], [value_info("y", [1, 16])], weights)


def weighted_token_pooling() -> onnx.ModelProto:
    """A weighted sum of 49 tokens, then a linear classifier: the plan makes the sum a
    one-channel Conv of the tokens ([1, 1, C, 1])."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["pool", "x"], ["pooled"], name="pool"),
             helper.make_node("Reshape", ["pooled", "flat"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="fc", transB=1)]
    return make_model(nodes, [value_info("x", [49, 64])], [value_info("y", [1, 16])],
                      [weight("pool", rng.random((1, 49)).astype(np.float32)), weight("flat", np.array([1, 64])),
                       weight("w", rng.standard_normal((16, 64)).astype(np.float32)),
                       weight("b", rng.standard_normal(16).astype(np.float32))])


def gathers_of_one_index() -> onnx.ModelProto:
    """tv_swin_nano's qkv split: Gathers of index [k], the axis kept."""
    nodes = [helper.make_node("Gather", ["x", f"i{k}"], [f"g{k}"], name=f"gather_{k}", axis=1) for k in range(3)]
    nodes.append(helper.make_node("Concat", ["g2", "g0", "g1"], ["y"], name="concat", axis=1))
    return make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 3, 8, 8])],
                      [weight(f"i{k}", np.array([k])) for k in range(3)])


def two_linear_heads_added() -> onnx.ModelProto:
    """levit's two heads: Gemms of one input, without bias, added."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["a"], name="head", transB=1),
             helper.make_node("Gemm", ["x", "w2"], ["b"], name="head_dist", transB=1),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", [1, 64])], [value_info("y", [1, 16])],
                      [weight("w1", rng.standard_normal((16, 64)).astype(np.float32)),
                       weight("w2", rng.standard_normal((16, 64)).astype(np.float32))])


def detection_head(grids=((10, 10), (6, 6))) -> onnx.ModelProto:
    """A YOLOv8 head on one input per grid: per grid a Conv of 64 box bins, one of 8 class
    scores, one of a single extra value, each flattened to [1, C, H*W] and joined along the
    boxes; the boxes' DFL (Reshape, Transpose, Softmax over 16 bins, a Conv by 0..15), decoded
    against anchors, then [boxes, sigmoid(scores), extra]. 136 boxes, a multiple of 8: the
    toolkit keeps such an output on its NPU."""
    rng = np.random.default_rng(0)
    boxes = sum(h * w for h, w in grids)
    nodes, weights = [], [weight("dfl_w", np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1)),
                          weight("dfl_shape", np.array([1, 4, 16, boxes])),
                          weight("dist_shape", np.array([1, 4, boxes])),
                          weight("anchors", rng.random((1, 2, boxes)).astype(np.float32) * 10),
                          weight("strides", rng.random((1, boxes)).astype(np.float32) * 8),
                          weight("half", np.float32(0.5)), weight("two", np.array([2, 2]))]
    for branch, channels in (("box", 64), ("cls", 8), ("extra", 1)):
        for index, (h, w) in enumerate(grids):
            weights += [weight(f"{branch}{index}_w", rng.standard_normal((channels, 8, 1, 1)).astype(np.float32) * 0.3),
                        weight(f"{branch}{index}_shape", np.array([1, channels, h * w]))]
            nodes += [helper.make_node("Conv", [f"x{index}", f"{branch}{index}_w"], [f"{branch}{index}"],
                                       name=f"{branch}{index}_conv"),
                      helper.make_node("Reshape", [f"{branch}{index}", f"{branch}{index}_shape"],
                                       [f"{branch}{index}_flat"], name=f"{branch}{index}_flat")]
        nodes.append(helper.make_node("Concat", [f"{branch}{index}_flat" for index in range(len(grids))],
                                      [f"{branch}_all"], name=f"{branch}_all", axis=2))
    nodes += [helper.make_node("Reshape", ["box_all", "dfl_shape"], ["bins"], name="dfl_reshape"),
              helper.make_node("Transpose", ["bins"], ["bins_first"], name="dfl_transpose", perm=[0, 2, 1, 3]),
              helper.make_node("Softmax", ["bins_first"], ["probabilities"], name="dfl_softmax", axis=1),
              helper.make_node("Conv", ["probabilities", "dfl_w"], ["expected"], name="dfl_conv"),
              helper.make_node("Reshape", ["expected", "dist_shape"], ["distances"], name="dfl_distances"),
              helper.make_node("Split", ["distances", "two"], ["left_top", "right_bottom"], name="split", axis=1),
              helper.make_node("Sub", ["anchors", "left_top"], ["corner1"], name="corner1"),
              helper.make_node("Add", ["anchors", "right_bottom"], ["corner2"], name="corner2"),
              helper.make_node("Add", ["corner1", "corner2"], ["corners"], name="corners"),
              helper.make_node("Mul", ["corners", "half"], ["centre"], name="centre"),
              helper.make_node("Sub", ["corner2", "corner1"], ["size"], name="size"),
              helper.make_node("Concat", ["centre", "size"], ["box"], name="box", axis=1),
              helper.make_node("Mul", ["box", "strides"], ["scaled"], name="scaled"),
              helper.make_node("Sigmoid", ["cls_all"], ["scores"], name="scores"),
              helper.make_node("Concat", ["scaled", "scores", "extra_all"], ["y"], name="output", axis=1)]
    return make_model(nodes, [value_info(f"x{index}", [1, 8, h, w]) for index, (h, w) in enumerate(grids)],
                      [value_info("y", [1, 13, boxes])], weights)


def test_a_detection_head_is_written_in_four_dimensions(save, tmp_path):
    """The DFL as a grouped Conv, the flattened one-channel 6x6 grid padded to 40 values, and
    the tail from the flattening Reshapes to the output as [1, C, 1, boxes]: the same values."""
    original = save(detection_head())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    shaped = written.report["toolkit_shapings"]
    assert shaped["binned_sums_as_grouped_convs"] == 1
    assert shaped["flattened_planes_padded"] == 2   # the extra value's 10x10 and 6x6 grids
    assert shaped["rank3_tails_as_rank4"] > 0
    exported = onnx.load(str(written.path))
    assert "Transpose" not in {node.op_type for node in exported.graph.node}
    assert [node.op_type for node in exported.graph.node][-1] == "Reshape"
    ranks = {value.name: len(value.type.tensor_type.shape.dim)
             for value in onnx.shape_inference.infer_shapes(exported).graph.value_info}
    assert ranks[exported.graph.node[-1].input[0]] == 4
    rng = np.random.default_rng(1)
    feeds = {"x0": rng.standard_normal((1, 8, 10, 10)).astype(np.float32),
             "x1": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    np.testing.assert_allclose(onnxruntime_run(exported, feeds)[0], onnxruntime_run(original, feeds)[0],
                               rtol=1e-5, atol=1e-4)


def test_a_flattened_plane_of_a_transpose_is_not_padded():
    """An attention map made [1, 49, 7, 7] by a Transpose and flattened to [1, 49, 49] (timm's
    shvit): rknn-toolkit2 moves a Pad above the Transpose and runs it on its CPU, and merges
    the plain Reshape with the Transpose, so the shaping leaves it; the same Reshape of a
    Conv's output is padded."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="transpose"),
             helper.make_node("Reshape", ["t", "flat"], ["y"], name="flatten_transposed"),
             helper.make_node("Conv", ["t", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "flat"], ["z"], name="flatten_conv")]
    model = make_model(nodes, [value_info("x", [1, 7, 7, 49])],
                       [value_info("y", [1, 49, 49]), value_info("z", [1, 49, 49])],
                       [weight("flat", np.array([1, 49, 49], np.int64)),
                        weight("w", np.ones((49, 49, 1, 1), np.float32))])
    assert flattened_planes_padded(model) == 1
    padded = [node for node in model.graph.node if node.op_type == "Pad"]
    assert len(padded) == 1 and padded[0].input[0] == "c"


def rows_of_a_map(channels: int, exit_perm: list[int]) -> onnx.ModelProto:
    """A map [1, C, 3, 5] as the plan holds its tokens: a Transpose to [3, 5, 1, C] and a Reshape
    into rows [15, C, 1, 1], a Relu on the rows, and the map again by a Transpose by `exit_perm`
    (to [1, C, 15, 1] or [1, C, 1, 15]) and a Reshape."""
    nodes = [helper.make_node("Transpose", ["x"], ["by_pixel"], name="into_rows/transpose", perm=[2, 3, 0, 1]),
             helper.make_node("Reshape", ["by_pixel", "rows_shape"], ["rows"], name="into_rows"),
             helper.make_node("Relu", ["rows"], ["activated"], name="relu"),
             helper.make_node("Transpose", ["activated"], ["by_channel"], name="out_of_rows/transpose",
                              perm=exit_perm),
             helper.make_node("Reshape", ["by_channel", "map_shape"], ["y"], name="out_of_rows")]
    return make_model(nodes, [value_info("x", [1, channels, 3, 5])], [value_info("y", [1, channels, 3, 5])],
                      [weight("rows_shape", np.array([15, channels, 1, 1], np.int64)),
                       weight("map_shape", np.array([1, channels, 3, 5], np.int64))], opset=13)


@pytest.mark.parametrize("exit_perm", [[2, 1, 0, 3], [3, 1, 2, 0]])
def test_token_rows_of_a_map_go_through_padded_planes(exit_perm):
    """12 channels of 3x5 (neither a multiple of 8): rknn-toolkit2 2.5.0 merges each Transpose
    and Reshape into one between [1, 12, 3, 5] and [1, 12, 1, 15], which it runs on its CPU
    (swiftformer's last stage); written through planes padded by 5 rows (8 x 5 = 40 values,
    the first multiple of 8), the same values."""
    model = rows_of_a_map(12, exit_perm)
    x = np.random.default_rng(4).standard_normal((1, 12, 3, 5)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert token_rows_of_planes_padded(model) == 2
    pads = [n for n in model.graph.node if n.op_type == "Pad"]
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert [list(constants[p.input[1]]) for p in pads][0] == [0, 0, 0, 0, 0, 0, 5, 0]   # 8 rows of 5: 40
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_token_rows_of_a_map_of_whole_blocks_stay():
    """16 channels: the toolkit keeps those Reshapes on its NPU, so nothing is padded."""
    assert token_rows_of_planes_padded(rows_of_a_map(16, [2, 1, 0, 3])) == 0


def test_a_rank3_tail_gets_a_unit_axis_its_shapes_kept_valid():
    """Reshape -> Concat with a constant -> Sigmoid -> output as [1, 8, 1, 18] and a Reshape
    back; the rank-3 shapes onnx's inference recorded for them go (the version converter
    records them)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "flat"], ["r"], name="flatten"),
             helper.make_node("Concat", ["r", "extra"], ["joined"], name="join", axis=-1),
             helper.make_node("Sigmoid", ["joined"], ["y"], name="sigmoid")]
    model = onnx.shape_inference.infer_shapes(make_model(
        nodes, [value_info("x", [1, 8, 4, 4])], [value_info("y", [1, 8, 18])],
        [weight("w", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)), weight("flat", np.array([1, 8, 16])),
         weight("extra", rng.standard_normal((1, 8, 2)).astype(np.float32))]))
    original = onnx.ModelProto()
    original.CopyFrom(model)
    assert rank3_tails_as_rank4(model) == 3
    onnx.checker.check_model(model, full_check=True)
    join = next(node for node in model.graph.node if node.name == "join")
    assert helper.get_attribute_value(join.attribute[0]) == 3
    assert model.graph.node[-1].op_type == "Reshape" and model.graph.node[-1].output[0] == "y"
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], onnxruntime_run(original, {"x": x})[0])


def rows_with_a_broadcast_bias(reader: str = "Reshape") -> onnx.ModelProto:
    """Scores [1, 2, 36, 36] relabelled to rows [72, 6, 1, 6] plus a per-row bias [72, 6, 1, 1]
    (a Conv's output relabelled), then relabelled back by a Reshape, or read by a Relu."""
    rng = np.random.default_rng(0)
    tail = ([helper.make_node("Reshape", ["summed", "back"], ["y"], name="back")] if reader == "Reshape"
            else [helper.make_node("Relu", ["summed"], ["y"], name="relu")])
    nodes = [helper.make_node("Reshape", ["scores", "rows"], ["r"], name="to_rows"),
             helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "bias_rows"], ["b"], name="bias_rows"),
             helper.make_node("Add", ["r", "b"], ["summed"], name="add"), *tail]
    out = [1, 2, 36, 36] if reader == "Reshape" else [72, 6, 1, 6]
    return make_model(nodes, [value_info("scores", [1, 2, 36, 36]), value_info("x", [1, 8, 6, 9])],
                      [value_info("y", out)],
                      [weight("w", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
                       weight("rows", np.array([72, 6, 1, 6])), weight("bias_rows", np.array([72, 6, 1, 1])),
                       weight("back", np.array([1, 2, 36, 36]))])


def test_batched_rows_are_written_as_one_image():
    """The rows [72, 6, 1, 6] and their bias [72, 6, 1, 1] become [1, 72, 6, 6] and [1, 72, 6, 1]:
    the same elements in the same order, the Add the same sums."""
    model = onnx.shape_inference.infer_shapes(rows_with_a_broadcast_bias())
    original = onnx.ModelProto()
    original.CopyFrom(model)
    assert batched_rows_as_one_image(model) == 2
    onnx.checker.check_model(model, full_check=True)
    shapes = static_shapes(model)
    assert shapes["r"] == [1, 72, 6, 6] and shapes["b"] == [1, 72, 6, 1]
    rng = np.random.default_rng(1)
    feeds = {"scores": rng.standard_normal((1, 2, 36, 36)).astype(np.float32),
             "x": rng.standard_normal((1, 8, 6, 9)).astype(np.float32)}
    np.testing.assert_array_equal(onnxruntime_run(model, feeds)[0], onnxruntime_run(original, feeds)[0])


def test_batched_rows_read_by_another_op_stay():
    model = onnx.shape_inference.infer_shapes(rows_with_a_broadcast_bias(reader="Relu"))
    assert batched_rows_as_one_image(model) == 0


def scaled_boxes() -> onnx.ModelProto:
    """Conv -> Reshape to [1, 4, 64] -> Mul by a stride per box of shape [1, 64], as YOLOv8
    scales its decoded boxes."""
    rng = np.random.default_rng(0)
    strides = np.repeat(np.array([8, 16, 32, 64], np.float32), 16).reshape(1, 64)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "flat"], ["boxes"], name="flatten"),
             helper.make_node("Mul", ["boxes", "strides"], ["y"], name="scale")]
    return make_model(nodes, [value_info("x", [1, 8, 8, 8])], [value_info("y", [1, 4, 64])],
                      [weight("w", rng.standard_normal((4, 8, 1, 1)).astype(np.float32)),
                       weight("flat", np.array([1, 4, 64])), weight("strides", strides)], opset=13)


def test_a_rank3_tails_constant_of_lower_rank_is_written_at_rank_4():
    """The strides [1, 64] broadcast against [1, 4, 64] become [1, 1, 1, 64] against
    [1, 4, 1, 64], not [1, 1, 64] (rknn-toolkit2 2.5.0 crashes building an int8 export that
    broadcasts the lower rank): the same values."""
    model = scaled_boxes()
    original = onnx.ModelProto()
    original.CopyFrom(model)
    assert rank3_tails_as_rank4(model) == 2
    scale = next(node for node in model.graph.node if node.name == "scale")
    constants = {tensor.name: onnx.numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    assert constants[scale.input[1]].shape == (1, 1, 1, 64)
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], onnxruntime_run(original, {"x": x})[0])


def test_a_rank3_region_read_by_a_reshape_copying_its_last_axis_stays():
    """A Reshape by [0, 0, 0, 1] reads the input's third dimension: the region before it keeps
    its rank."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["r"], name="flatten"),
             helper.make_node("Sigmoid", ["r"], ["s"], name="sigmoid"),
             helper.make_node("Reshape", ["s", "copy"], ["y"], name="copy")]
    model = make_model(nodes, [value_info("x", [1, 8, 4, 4])], [value_info("y", [1, 8, 16, 1])],
                       [weight("flat", np.array([1, 8, 16])), weight("copy", np.array([0, 0, 0, 1]))])
    assert rank3_tails_as_rank4(model) == 0


def test_an_attention_scale_moves_onto_its_scores(save, tmp_path):
    """The scale on q moves onto q^T k (rknn-toolkit2 2.5.0 fails in its SDPA fusion from the
    form with the scale on q): the Mul reads the score MatMul, the Softmax reads the Mul."""
    written = rkcompile.export(save(attention_with_scaled_q()), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node for node in exported.graph.node for out in node.output}
    softmax = next(n for n in exported.graph.node if n.op_type == "Softmax")
    assert made_by[softmax.input[0]].op_type == "Mul"
    assert made_by[made_by[softmax.input[0]].input[0]].op_type == "MatMul"
    assert written.report["toolkit_shapings"]["scale_after_scores"] == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-6


def test_a_zero_pad_folds_into_its_conv(save, tmp_path):
    """Pad(0, 1) -> Conv is written as the Conv with those pads (rknn-toolkit2 2.5.0 fails
    folding a Pad whose pads are an initializer): the plan's own rewrite folds it."""
    original = save(same_padding_of_a_strided_conv())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert [n.op_type for n in exported.graph.node] == ["Conv"]
    conv = exported.graph.node[0]
    assert helper.get_attribute_value(next(a for a in conv.attribute if a.name == "pads")) == [0, 0, 1, 1]
    assert "zero_pad_into_conv" in [r["rule"] for r in written.report["rewrites"]]
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_a_gelu_of_opset_20_is_written_in_older_ops(save, tmp_path):
    """onnx's converter knows no Gelu before opset 20; the export writes it as Div -> Erf (the
    form rknn-toolkit2 fuses) before converting down to 19, both approximations, alone and as
    the member of a ConvExGelu (whose input is no tensor of the plan)."""
    rng = np.random.default_rng(0)
    conv = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    weights = [weight("w", rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1),
               weight("b", rng.standard_normal(16).astype(np.float32) * 0.1)]
    for (approximate, core), fused in itertools.product((("none", "Erf"), ("tanh", "Tanh")), (False, True)):
        nodes = [*(conv if fused else ()),
                 helper.make_node("Gelu", ["c" if fused else "x"], ["y"], name="gelu", approximate=approximate)]
        original = save(make_model(nodes, [value_info("x", [1, 16, 8, 8])], [value_info("y", [1, 16, 8, 8])],
                                   weights if fused else (), opset=20), f"{approximate}_{fused}.onnx")
        kernels = [step.kernel for step in rkcompile.compile(original, "rk3588").record.steps if step.device == "npu"]
        assert kernels == (["ConvExGelu"] if fused else ["Gelu"])
        written = rkcompile.export(original, tmp_path / f"{approximate}_{fused}_out.onnx", "rk3588")
        exported = onnx.load(str(written.path))
        ops = [n.op_type for n in exported.graph.node]
        assert "Gelu" not in ops and core in ops and exported.opset_import[0].version == 19
        assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def test_the_export_imports_ai_onnx_first_and_no_unused_domain(save, tmp_path):
    """tf2onnx lists ai.onnx.ml first; rknn-toolkit2 takes the first import for the model's opset."""
    model = conv_relu_erf()
    model.opset_import.insert(0, helper.make_opsetid("ai.onnx.ml", 2))
    written = rkcompile.export(save(model), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert [(o.domain, o.version) for o in exported.opset_import] == [("", 17)]


def test_attributes_left_to_their_defaults_are_written(save, tmp_path):
    """rknn-toolkit2 2.5.0 reads LayerNormalization's `epsilon` with no default of its own."""
    written = rkcompile.export(save(token_mean_classifier(normalized=True)), tmp_path / "out.onnx", "rk3588")
    norm = next(n for n in onnx.load(str(written.path)).graph.node if n.op_type == "LayerNormalization")
    attributes = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    assert attributes["epsilon"] == pytest.approx(1e-5) and attributes["stash_type"] == 1
    assert written.report["toolkit_shapings"]["defaults_written"] >= 1


def test_an_output_with_a_symbolic_batch_is_written_static(save, tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    original = save(make_model(nodes, [value_info("x", [1, 8, 4, 4])], [value_info("y", ["batch", 8, 4, 4])]))
    exported = onnx.load(str(rkcompile.export(original, tmp_path / "out.onnx", "rk3588").path))
    assert [d.dim_value for d in exported.graph.output[0].type.tensor_type.shape.dim] == [1, 8, 4, 4]


def test_a_pooled_vector_reaches_the_classifier_through_a_transpose(save, tmp_path):
    """The plan pools tokens with a one-channel Conv ([1, 1, C, 1]); the export moves that
    vector into the channels with a Transpose, not a Reshape (rknn-toolkit2 2.5.0 loops
    forever on Conv -> Reshape -> Conv)."""
    written = rkcompile.export(save(weighted_token_pooling()), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node.op_type for node in exported.graph.node for out in node.output}
    convs = [n for n in exported.graph.node if n.op_type == "Conv"]
    assert [n.op_type for n in exported.graph.node if made_by.get(n.input[0]) == "Conv"] == ["Transpose", "Reshape"]
    assert made_by[convs[1].input[0]] == "Transpose"
    assert written.report["toolkit_shapings"]["vectors_into_channels"] == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


@pytest.mark.parametrize("normalized", [False, True], ids=["tokens", "tokens_on_the_batch_axis"])
def test_a_mean_made_a_conv_is_written_back_as_a_reduce_mean(normalized, save, tmp_path):
    """The plan takes a mean as Reshape -> Conv(1/K); the export writes the ReduceMean back
    (the toolkit fuses norms from it, loops on Reshape -> Conv, and runs a Reshape of tokens
    on the batch axis on its CPU). After a LayerNorm the tokens are on the batch axis."""
    written = rkcompile.export(save(token_mean_classifier(normalized)), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    made_by = {out: node.op_type for node in exported.graph.node for out in node.output}
    mean = next(n for n in exported.graph.node if n.op_type == "ReduceMean")
    assert made_by.get(mean.input[0]) == ("LayerNormalization" if normalized else None)  # None: the input
    assert [n.op_type for n in exported.graph.node].count("Conv") == 1
    assert written.report["toolkit_shapings"]["means_as_reduce_means"] == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5



def deformable_attention_tail(heads: int = 2, width: int = 16, queries: int = 30) -> onnx.ModelProto:
    """The end of a multi-scale deformable attention (RT-DETR's decoder): the values sampled at
    two levels [heads, width, queries, 4] joined, times each head's attention weights over the
    8 points, summed over them (the plan makes that sum a Conv of weights 1), regrouped into
    [1, heads*width, queries], transposed to tokens and projected."""
    rng = np.random.default_rng(0)
    channels = heads * width
    nodes = [helper.make_node("Concat", ["level0", "level1"], ["sampled"], name="levels", axis=-1),
             helper.make_node("Mul", ["sampled", "attention"], ["weighted"], name="weigh"),
             helper.make_node("ReduceSum", ["weighted", "last"], ["sums"], name="sum", keepdims=0),
             helper.make_node("Reshape", ["sums", "view"], ["heads"], name="view"),
             helper.make_node("Transpose", ["heads"], ["tokens"], name="tokens", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["tokens", "projection"], ["y"], name="output_proj")]
    levels = [value_info(f"level{level}", [heads, width, queries, 4]) for level in range(2)]
    return make_model(nodes, [*levels, value_info("attention", [heads, 1, queries, 8])],
                      [value_info("y", [1, queries, channels])],
                      [weight("last", np.array([-1])), weight("view", np.array([1, channels, queries])),
                       weight("projection", rng.standard_normal((channels, channels)).astype(np.float32) * 0.2)])


def test_a_sum_made_a_conv_is_written_back_as_a_reduce_sum(save, tmp_path):
    """The plan takes the sum over the sampled points as Reshape -> Conv(1); the export writes
    the ReduceSum back (from the Conv rknn-toolkit2 2.5.0 holds the sums as one row and runs
    its Reshape into rows of `queries`, not a multiple of 8, on its CPU), the same values."""
    original = save(deformable_attention_tail())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    sums = [n for n in exported.graph.node if n.op_type == "ReduceSum"]
    assert len(sums) == 1 and written.report["toolkit_shapings"]["sums_as_reduce_sums"] == 1
    weights = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    # the projection and the attention weights' broadcast over the 16 channels (a Conv of ones
    # from one channel); no Conv sums over the points
    assert sorted(weights[n.input[1]].shape[:2] for n in exported.graph.node if n.op_type == "Conv") == [(16, 1),
                                                                                                        (32, 32)]
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.uniform(-1, 1, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in onnx.load(str(original)).graph.input}
    np.testing.assert_allclose(onnxruntime_run(exported, feeds)[0], onnxruntime_run(original, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_a_sum_written_to_an_output_stays_a_conv(save, tmp_path):
    """A sum over the bins that a Reshape writes to an output (PicoDet's box sides) stays the
    plan's Conv: from a ReduceSum rknn-toolkit2 2.5.0 runs that Reshape on its CPU."""
    nodes = [helper.make_node("ReduceSum", ["bins", "last"], ["sides"], name="sum", keepdims=0)]
    model = make_model(nodes, [value_info("bins", [1, 30, 4, 8])], [value_info("sides", [1, 30, 4])],
                       [weight("last", np.array([-1]))])
    written = rkcompile.export(save(model), tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["sums_as_reduce_sums"] == 0
    assert [n.op_type for n in onnx.load(str(written.path)).graph.node].count("Conv") == 1


def split_attention() -> onnx.ModelProto:
    """timm's ResNeSt split attention of radix 2 over x = [1, 32, 6, 6]: the sum of x's two
    channel halves (Reshape [1, 2, 16, 6, 6], ReduceSum over axis 1), its pooled attention as a
    softmax over the radix [1, 2, 1, 16], and the sum of the halves weighted by it."""
    nodes = [helper.make_node("Reshape", ["x", "radix_shape"], ["halves"], name="split"),
             helper.make_node("ReduceSum", ["halves", "radix_axis"], ["gap"], name="sum", keepdims=0),
             helper.make_node("ReduceMean", ["gap"], ["pooled"], name="pool", axes=[2, 3], keepdims=1),
             helper.make_node("Conv", ["pooled", "fc"], ["logits"], name="fc"),
             helper.make_node("Reshape", ["logits", "radix_rows"], ["rows"], name="rows"),
             helper.make_node("Softmax", ["rows"], ["attention"], name="softmax", axis=1),
             helper.make_node("Reshape", ["attention", "weights_shape"], ["weights"], name="weights"),
             helper.make_node("Mul", ["halves", "weights"], ["weighted"], name="mul"),
             helper.make_node("ReduceSum", ["weighted", "radix_axis"], ["y"], name="weighted_sum", keepdims=0)]
    return make_model(nodes, [value_info("x", [1, 32, 6, 6])], [value_info("y", [1, 16, 6, 6])],
                      [weight("radix_shape", np.array([1, 2, 16, 6, 6])), weight("radix_axis", np.array([1])),
                       weight("fc", np.random.default_rng(0).standard_normal((32, 16, 1, 1)).astype(np.float32)),
                       weight("radix_rows", np.array([1, 2, 1, 16])),
                       weight("weights_shape", np.array([1, 2, 16, 1, 1]))])


def test_split_attention_sums_are_channel_slices(save, tmp_path):
    """The plan sums the radix halves on layouts whose Reshapes rknn-toolkit2 2.5.0 runs on its
    CPU ([1, 2, M, 1] into a Conv, [2, 16, 36] into a ReduceSum); the export writes both sums as
    two channel Slices and an Add of x (times the attention Reshaped to [1, 32, 1, 1]), which it
    keeps on its NPU: no Transpose or ReduceSum left, the same values."""
    original = save(split_attention())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    ops = [n.op_type for n in onnx.load(str(written.path)).graph.node]
    assert written.report["toolkit_shapings"]["radix_sums_as_channel_slices"] == 2
    assert ops.count("Slice") == 4 and ops.count("Add") == 2
    assert not {"ReduceSum", "Transpose"} & set(ops)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 32, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(written.path, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)


def test_an_int8_export_writes_split_attention_on_the_plans_grid(save, tmp_path):
    """The weighted radix sum's product keeps its name in its new shape (the same values in the
    same order), so the int8 export quantizes it with the plan's parameters and agrees with the
    emulator (with a new, float product it differed by 0.0024 of cosine and was not written)."""
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).uniform(-1, 1, (1, 32, 6, 6)).astype(np.float32))
    plan = rkcompile.compile(save(split_attention()), "rk3588", dtype="int8", calibration=calib)
    written = rkcompile.export(plan, tmp_path / "int8.onnx")
    assert written.report["toolkit_shapings"]["radix_sums_as_channel_slices"] == 2
    assert "ReduceSum" not in {n.op_type for n in onnx.load(str(written.path)).graph.node}


def regrouped_sum(grouped: list[int], factor: list[int]) -> onnx.ModelProto:
    """x = [1, 8, 4, 4] Reshaped to `grouped`, times a factor input of shape `factor`, summed
    over axis 0 (keepdims) and Reshaped to [1, C, 4, 4] (C = grouped[1])."""
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["regrouped"], name="regroup"),
             helper.make_node("Mul", ["w", "regrouped"], ["weighted"], name="mul"),
             helper.make_node("ReduceSum", ["weighted", "first"], ["summed"], name="sum", keepdims=1),
             helper.make_node("Reshape", ["summed", "planes"], ["y"], name="planes")]
    return make_model(nodes, [value_info("x", [1, 8, 4, 4]), value_info("w", factor)],
                      [value_info("y", [1, grouped[1], 4, 4])],
                      [weight("grouped", np.array(grouped)), weight("first", np.array([0])),
                       weight("planes", np.array([1, grouped[1], 4, 4]))])


@pytest.mark.parametrize("grouped, factor, written", [
    ([2, 4, 16], [2, 4, 1], 1),    # per channel of each radix block
    ([2, 4, 16], [2, 4, 16], 1),   # per element
    ([2, 4, 16], [2, 1, 1], 0),    # per block: no factor of x's channels
    ([4, 2, 16], [4, 2, 1], 1),    # radix 4
    ([2, 16, 4], [2, 16, 1], 0),   # the blocks are not whole channels
])
def test_a_weighted_radix_sum_is_written_when_its_blocks_are_channels(grouped, factor, written):
    """The shaping writes the sum over axis 0 of [R, C, ...] as Slices of x = [1, R*C, ...] only
    when each block is C whole channels of x and the factor lines up with them, and keeps the
    values; otherwise it leaves the graph as it was."""
    model = regrouped_sum(grouped, factor)
    before = model.SerializeToString()
    assert radix_sums_as_channel_slices(model) == written
    if not written:
        assert model.SerializeToString() == before
        return
    assert "ReduceSum" not in [n.op_type for n in model.graph.node]
    rng = np.random.default_rng(2)
    feeds = {"x": rng.uniform(-1, 1, (1, 8, 4, 4)).astype(np.float32),
             "w": rng.uniform(-1, 1, factor).astype(np.float32)}
    expected = onnxruntime_run(regrouped_sum(grouped, factor), feeds)[0]
    np.testing.assert_allclose(onnxruntime_run(model, feeds)[0], expected, rtol=1e-6, atol=1e-6)


def mean_over_a_middle_axis_to_an_output() -> onnx.ModelProto:
    """Box sides [1, 30, 8, 4] (after a Sigmoid) averaged over their 8 bins, axis 2, into the
    output [1, 30, 4]: the plan's Conv of weights 1/8, then a Reshape to the output."""
    nodes = [helper.make_node("Sigmoid", ["bins"], ["scores"], name="act"),
             helper.make_node("ReduceMean", ["scores"], ["sides"], name="mean", axes=[2], keepdims=0)]
    return make_model(nodes, [value_info("bins", [1, 30, 8, 4])], [value_info("sides", [1, 30, 4])])


def test_a_mean_written_to_an_output_is_written_back(save, tmp_path):
    """Unlike a sum, a mean a Reshape writes to an output is written back as a ReduceMean: from
    it rknn-toolkit2 2.5.0 keeps that Reshape on its NPU, from the plan's Conv it ran it on its
    CPU."""
    written = rkcompile.export(save(mean_over_a_middle_axis_to_an_output()), tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["means_as_reduce_means"] == 1
    assert [n.op_type for n in onnx.load(str(written.path)).graph.node] == ["Sigmoid", "ReduceMean", "Reshape"]
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5

def rms_norm() -> onnx.ModelProto:
    """T5's RMS norm: x / sqrt(mean(x^2) + eps) * gamma."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["square"], name="pow"),
             helper.make_node("ReduceMean", ["square"], ["variance"], name="mean", axes=[-1], keepdims=1),
             helper.make_node("Add", ["variance", "eps"], ["shifted"], name="add"),
             helper.make_node("Sqrt", ["shifted"], ["root"], name="sqrt"),
             helper.make_node("Div", ["one", "root"], ["inverse"], name="div"),
             helper.make_node("Mul", ["x", "inverse"], ["normed"], name="mul"),
             helper.make_node("Mul", ["gamma", "normed"], ["y"], name="scale")]
    return make_model(nodes, [value_info("x", [1, 32, 64])], [value_info("y", [1, 32, 64])],
                      [weight("two", np.float32(2)), weight("eps", np.float32(1e-6)), weight("one", np.float32(1)),
                       weight("gamma", np.random.default_rng(0).random(64).astype(np.float32))])


def test_an_rms_norm_keeps_its_reduce_mean_and_sqrt(save, tmp_path):
    """The plan makes the mean a Conv and the Sqrt a Pow; the export writes both back, the form
    rknn-toolkit2 2.5.0 fuses into its exNorm (from the plan's form its Div runs on its CPU)."""
    written = rkcompile.export(save(rms_norm()), tmp_path / "out.onnx", "rk3588")
    ops = [n.op_type for n in onnx.load(str(written.path)).graph.node]
    assert "ReduceMean" in ops and "Sqrt" in ops and "Conv" not in ops
    assert written.report["toolkit_shapings"]["square_roots_written_back"] == 1
    # the plan runs it as exNorm from its Conv form: mean + eps as a biased Conv, over the
    # channels of the square of x's rows view [32, 64, 1, 1], where the export keeps the mean
    assert written.report["toolkit_shapings"]["mean_biases_apart"] == 1
    means = [n for n in onnx.load(str(written.path)).graph.node if n.op_type == "ReduceMean"]
    assert [list(next(a for a in n.attribute if a.name == "axes").ints) for n in means] == [[1]]
    assert "Div" in ops and "Pow" not in ops
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def test_a_gather_of_one_index_is_a_slice(save, tmp_path):
    written = rkcompile.export(save(gathers_of_one_index()), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert "Gather" not in {n.op_type for n in exported.graph.node}
    assert written.report["toolkit_shapings"]["gathers_as_slices"] == 3
    assert written.report["check"]["outputs"][0]["max_abs"] == 0.0


def test_two_linear_heads_added_are_written_as_one_gemm(save, tmp_path):
    """The plan makes each head Reshape -> Conv; the export writes them as one Gemm of the
    summed weights with a (zero) bias, then the Reshape to the Conv's shape (rknn-toolkit2
    2.5.0 fails fusing the two Convs, and loops on Reshape -> Conv)."""
    written = rkcompile.export(save(two_linear_heads_added()), tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert [n.op_type for n in exported.graph.node if n.op_type not in ("Reshape", "Flatten")] == ["Gemm"]
    gemm = next(n for n in exported.graph.node if n.op_type == "Gemm")
    assert len(gemm.input) == 3 and gemm.input[2]
    assert written.report["toolkit_shapings"]["added_convs_as_one"] == 1
    assert written.report["toolkit_shapings"]["linear_layers_as_gemms"] == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def band_tiles_added(dilated: bool = False) -> onnx.ModelProto:
    """A 1x11 depthwise band kernel as the plan tiles it (its depthwise limit is 8 taps): a 1x8
    Conv reading offsets -4..3 and a 1x5 Conv reading 0..4 of the same map, added; `dilated`:
    the 1x5 reads 0, 2, .., 8 instead."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w8", "b8"], ["wide"], name="tile_8", group=6, kernel_shape=[1, 8],
                              pads=[0, 4, 0, 3], strides=[1, 1]),
             helper.make_node("Conv", ["x", "w5"], ["rest"], name="tile_5", group=6, kernel_shape=[1, 5],
                              pads=[0, 0, 0, 8 if dilated else 4], dilations=[1, 2 if dilated else 1]),
             helper.make_node("Add", ["wide", "rest"], ["y"], name="band")]
    return make_model(nodes, [value_info("x", [1, 6, 5, 12])], [value_info("y", [1, 6, 5, 12])],
                      [weight("w8", rng.standard_normal((6, 1, 1, 8)).astype(np.float32)),
                       weight("b8", rng.standard_normal(6).astype(np.float32)),
                       weight("w5", rng.standard_normal((6, 1, 1, 5)).astype(np.float32))])


def test_added_tiles_of_a_window_are_one_conv_of_their_union():
    """The two tiles become one 1x9 Conv over offsets -4..4, the 1x8's weights at the first
    eight taps and the 1x5's added at the last five (rknn-toolkit2 2.5.0 builds the tiles as
    three layers, the union as one: inception_next_atto's export 153 -> 105 layers)."""
    model = band_tiles_added()
    x = np.random.default_rng(6).standard_normal((1, 6, 5, 12)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert added_convs_as_one(model) == 1
    (conv,) = model.graph.node
    attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attributes["kernel_shape"] == [1, 9] and attributes["pads"] == [0, 4, 0, 4] and attributes["group"] == 6
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_a_wide_depthwise_window_the_plan_tiles_is_one_conv_again(save, tmp_path):
    """A 13x13 depthwise Conv, which the plan tiles into four Convs added in a chain (its
    depthwise limit is 8 taps), is exported as the one 13x13 Conv: rknn-toolkit2 2.5.0 builds
    the tiles as 5 layers and the window as 1."""
    rng = np.random.default_rng(7)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=4, kernel_shape=[13, 13], pads=[6] * 4)],
                       [value_info("x", [1, 4, 20, 20])], [value_info("y", [1, 4, 20, 20])],
                       [weight("w", rng.standard_normal((4, 1, 13, 13)).astype(np.float32) * 0.1)])
    written = rkcompile.export(save(model), tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["added_convs_as_one"] == 3
    (conv,) = onnx.load(str(written.path)).graph.node
    attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attributes["kernel_shape"] == [13, 13] and attributes["pads"] == [6, 6, 6, 6]
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def test_added_convs_of_other_dilations_stay_apart():
    model = band_tiles_added(dilated=True)
    onnx.checker.check_model(model, full_check=True)
    assert added_convs_as_one(model) == 0


def test_an_export_that_disagrees_is_not_written(save, tmp_path):
    with pytest.raises(CompileError, match="disagrees .* nothing written"):
        rkcompile.export(save(conv_relu_erf()), tmp_path / "out.onnx", "rk3588", tolerance=-1.0)
    assert list(tmp_path.glob("out*")) == []


def convs_and_channel_softmaxes(layers: int = 10, gain: float = 10.0) -> onnx.ModelProto:
    """Conv, a third of it, and a softmax over the channels in an exporter's own ops (less the
    max, Exp, ReduceSum, Div), `layers` times, random weights of std `gain`: the softmaxes
    nearly select, so float32 rounding anywhere moves the outputs by about 1%. The plan folds
    the third into the weights, and onnxruntime with and without its graph optimizations (its
    blocked Conv kernels) differs by about as much."""
    rng = np.random.default_rng(0)
    nodes, weights, data = [], [], "x"
    for layer in range(layers):
        nodes += [helper.make_node("Conv", [data, f"w{layer}"], [f"q{layer}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Div", [f"q{layer}", "three"], [f"c{layer}"]),
                  helper.make_node("ReduceMax", [f"c{layer}"], [f"m{layer}"], axes=[1]),
                  helper.make_node("Sub", [f"c{layer}", f"m{layer}"], [f"d{layer}"]),
                  helper.make_node("Exp", [f"d{layer}"], [f"e{layer}"]),
                  helper.make_node("ReduceSum", [f"e{layer}", "channels"], [f"t{layer}"]),
                  helper.make_node("Div", [f"e{layer}", f"t{layer}"], [f"s{layer}"])]
        weights.append(weight(f"w{layer}", (rng.standard_normal((16, 16, 3, 3)) * gain).astype(np.float32)))
        data = f"s{layer}"
    return make_model(nodes, [value_info("x", [1, 16, 8, 8])], [value_info(data, [1, 16, 8, 8])],
                      [*weights, weight("channels", np.array([1], np.int64)), weight("three", np.float32(3))])


def test_a_model_that_grows_float32_rounding_is_refused_with_its_own_spread(save, tmp_path, capsys):
    """The refusal gives the original's own difference with onnxruntime's graph optimizations
    off and, where that is beyond the tolerance too, says so; --tolerance of that order writes
    the file."""
    original = save(convs_and_channel_softmaxes())
    arguments = ["export", str(original), "--target", "rk3588", "-o", str(tmp_path / "out.onnx")]
    assert main(arguments) != 0
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "the original's own with onnxruntime's graph optimizations off" in error
    assert "float32 evaluations differ beyond the tolerance" in error and "--tolerance" in error
    assert not (tmp_path / "out.onnx").exists()
    assert main([*arguments, "--tolerance", "0.05"]) == 0
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["check"]["tolerance"] == 0.05
    assert 2.0 ** -10 < report["check"]["outputs"][0]["max_rel"] <= 0.05


def test_a_check_the_seeded_inputs_cannot_run_asks_for_inputs(save, tmp_path):
    """Seeded random token ids (0..99) index past a 2-row table (BERT's token types): the
    export's check names the inputs it drew and asks for real ones, writing nothing; with
    ids the table holds, it exports."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [2, 8], np.arange(16, dtype=np.float32))
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], name="types")], "types",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], [table])
    original = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(CompileError, match="seeded random values for ids .*--inputs"):
        rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    assert list(tmp_path.glob("out*")) == []
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", inputs={"ids": np.array([[0, 1, 1, 0]])})
    assert written.report["check"]["outputs"][0]["max_rel"] == 0


def test_bad_input_is_one_error_line(save, tmp_path, capsys):
    original = save(sample_rate_model())
    cases = [([str(tmp_path / "missing.onnx")], "no such file"),
             ([str(original), "--freeze-input", "sample=1"], "--freeze-input sample: not an input"),
             ([str(original), "--freeze-input", "rate"], "expected NAME=VALUE"),
             ([str(original), "--calib", str(tmp_path)], "apply to int8 plans; add --dtype int8"),
             ([str(original), "--tolerance", "-1"], "expected a number of 0 or more")]
    for arguments, message in cases:
        try:
            code = main(["export", *arguments, "--target", "rk3588", "-o", str(tmp_path / "out.onnx")])
        except SystemExit as usage_error:  # argparse's, for a malformed flag
            code = usage_error.code
        assert code != 0
        error = capsys.readouterr().err
        assert error.startswith("error: ") and message in error and error.count("\n") == 1
    assert list(tmp_path.glob("out*")) == []


def residual_cnn() -> onnx.ModelProto:
    """Conv -> Relu -> Conv + x (a residual Add) -> Erf (the CPU on rk3588) -> Conv: int8 steps,
    a fused kernel, and a CPU step between two NPU partitions."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"], name="add"),
             helper.make_node("Erf", ["s"], ["e"], name="erf"),
             helper.make_node("Conv", ["e", "w3", "b3"], ["y"], name="conv3")]
    weights = [weight(f"w{i}", rng.standard_normal((8, 8, k, k)).astype(np.float32) * 0.3)
               for i, k in ((1, 3), (2, 3), (3, 1))]
    biases = [weight(f"b{i}", rng.standard_normal(8).astype(np.float32) * 0.1) for i in (1, 2, 3)]
    return make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16])],
                      weights + biases, opset=11)


def int8_export(save, tmp_path, **options) -> tuple[rkcompile.Plan, "rkcompile.onnx_export.ExportReport", dict]:
    """residual_cnn's int8 plan calibrated on 4 seeded inputs, its export, and the check's inputs."""
    rng = np.random.default_rng(3)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
    inputs = {"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}
    plan = rkcompile.compile(save(residual_cnn()), "rk3588", dtype="int8", calibration=calib, **options)
    return plan, rkcompile.export(plan, tmp_path / "out.onnx", inputs=inputs), inputs


def test_an_int8_export_carries_the_plan_as_qdq(save, tmp_path):
    """The file is checker-clean QDQ in opset 13 or later: each int8 weight is the plan's stored
    integers read through a DequantizeLinear with the plan's scales (per channel for a Conv's
    weight), each int8 activation a QuantizeLinear/DequantizeLinear pair with the plan's scale
    and zero point; onnxruntime on it computes what the emulator computes for the plan."""
    plan, written, inputs = int8_export(save, tmp_path)
    exported = onnx.load(str(written.path))
    onnx.checker.check_model(exported, full_check=True)
    assert exported.opset_import[0].version == 13 and written.report["opset"] == {"model": 11, "export": 13}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in exported.graph.initializer}
    made_by = {out: node for node in exported.graph.node for out in node.output}
    quant = plan.record.quantization
    for conv in (n for n in exported.graph.node if n.op_type == "Conv"):
        weight_dq, bias_dq, data_dq = (made_by[conv.input[i]] for i in (1, 2, 0))
        assert [weight_dq.op_type, bias_dq.op_type, data_dq.op_type] == ["DequantizeLinear"] * 3
        integers = constants[weight_dq.input[0]]
        assert integers.dtype == np.int8 and constants[bias_dq.input[0]].dtype == np.int32
        assert [a.i for a in weight_dq.attribute if a.name == "axis"] == [0]
        expected = quant[conv.input[1]]
        np.testing.assert_array_equal(constants[weight_dq.input[1]], np.float32(expected.scales))
        np.testing.assert_array_equal(constants[weight_dq.input[2]], expected.zero_points)
        # the bias at the scale its reader computes: input scale x weight scale, in float32
        np.testing.assert_array_equal(constants[bias_dq.input[1]],
                                      constants[data_dq.input[1]] * constants[weight_dq.input[1]])
    activations = {node.input[0].removesuffix("/float"): node for node in exported.graph.node
                   if node.op_type == "QuantizeLinear"}
    assert "s" in activations and "r1" in activations and "c2" not in activations  # Conv + Add fused: no pair
    summary = written.report["quantization"]
    assert summary["activations"] == len(activations) and summary["weights"] == 6 and summary["float16_tensors"] == []
    produced = onnxruntime_run(exported, inputs)[0]
    emulated = rkcompile.run(plan, inputs)["y"]
    assert written.emulated and abs(written.agreements[0].cosine - written.emulated[0].cosine) <= 0.002
    closeness = float(np.abs(produced - emulated).max() / np.abs(emulated).max())
    assert closeness < 0.05, closeness


POOLS = {
    "global": (dict(op_type="GlobalAveragePool"), [1, 8, 1, 1], "Conv"),
    "strided windows": (dict(op_type="AveragePool", kernel_shape=[2, 2], strides=[2, 2]), [1, 8, 3, 3], "Conv"),
    "padding counted": (dict(op_type="AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                        [1, 8, 6, 6], "Conv"),
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_an_average_pool_is_written_as_the_convolution_it_is(save, tmp_path, pool):
    """An int8 average pool whose output the plan quantizes apart from its input becomes a
    depthwise Conv of weights 1/window where every window is of that size (rknn-toolkit2 would
    give a pool's output its input's parameters), and the file still computes the plan."""
    attributes, shape, written_as = POOLS[pool]
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node(inputs=["r"], outputs=["y"], name="pool", **attributes)]
    model = make_model(nodes, [value_info("x", [1, 8, 6, 6])], [value_info("y", shape)],
                       [weight("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3),
                        weight("b", rng.standard_normal(8).astype(np.float32) * 0.1)])
    inputs = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    plan = rkcompile.compile(save(model), "rk3588", dtype="int8")
    assert [step.kernel for step in plan.record.steps if step.device == "npu"][-1] == attributes["op_type"]
    written = rkcompile.export(plan, tmp_path / "out.onnx", inputs=inputs)
    exported = onnx.load(str(written.path))
    (pooled,) = [n for n in exported.graph.node if n.output[0] == "y/float"]
    assert pooled.op_type == written_as
    if written_as == "Conv":
        conv_attributes = {a.name: helper.get_attribute_value(a) for a in pooled.attribute}
        assert conv_attributes["group"] == 8
        assert conv_attributes.get("strides", [1, 1]) == attributes.get("strides", [1, 1])
        assert conv_attributes.get("pads", [0] * 4) == attributes.get("pads", [0] * 4)
    assert written.report["check"]["steps"]["worst"]["differing"] <= 2
    assert abs(written.agreements[0].cosine - written.emulated[0].cosine) < 1e-4


@pytest.mark.parametrize("attributes, sizes, out_sizes, uniform", [
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, [6, 6], [6, 6], True),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [6, 6], [6, 6], False),  # the border windows average fewer
    ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, [5, 5], [3, 3], False),  # the last is 1 wide
    ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, [6, 6], [3, 3], True),
])
def test_only_pools_whose_windows_are_all_full_are_convolutions(attributes, sizes, out_sizes, uniform):
    """The plan's rewrites leave no such pool (passes/rewrites/pooling.py counts the padding
    itself), but a pool the export is given is only written as a convolution when it is one."""
    from rkcompile.views.qdq import _windows_of_one_size

    assert _windows_of_one_size(attributes, sizes, attributes["kernel_shape"], out_sizes) is uniform


def test_an_int8_export_is_compared_with_the_plan_step_by_step(save, tmp_path):
    """Each int8 step of the file, run by onnxruntime, against the plan's step on the file's own
    values of its inputs: every NPU step and both conversions into int8 (the input's, and the
    CPU's Erf output's, which the file quantizes in place) are compared and agree; the CPU step
    is named as not compared."""
    plan, written, _ = int8_export(save, tmp_path)
    steps = written.report["check"]["steps"]
    assert steps["compared"] == 5  # x@npu, r1, s, e@npu, y@npu
    assert steps["worst"]["differing"] <= 2
    assert steps["not_compared"] == ["step 4 (Erf): a cpu step"]


def test_an_int8_exports_rank3_tail_lifted_to_rank4_is_compared_at_the_plans_shape(save, tmp_path):
    """YOLOv8's scaled boxes, which the export writes at rank 4 ([1, 4, 1, 64]) where the plan
    holds [1, 4, 64]: the file's values are read back at the plan's shape, and every step agrees."""
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).standard_normal((1, 8, 8, 8)).astype(np.float32))
    plan = rkcompile.compile(save(scaled_boxes()), "rk3588", dtype="int8", calibration=calib)
    steps = rkcompile.export(plan, tmp_path / "out.onnx").report["check"]["steps"]
    assert steps["not_compared"] == [] and steps["worst"]["differing"] <= 2
    assert steps["compared"] == sum(1 for step in plan.record.steps for name in step.outputs
                                    if name in plan.record.quantization)


def test_an_int8_export_missing_a_quantization_point_is_refused(save, tmp_path, monkeypatch):
    """A file that leaves out the pair of an int8 activation the plan stores (r1, a Conv's
    output the next Conv reads) computes the next step on unrounded values: its outputs' cosine
    stays within 0.002 of the emulator's, but the step differs from the plan's on a sixth of its
    integers, and the check refuses it."""
    from rkcompile.views import standard_onnx

    write_pairs = standard_onnx.quantize_dequantize

    def without_r1(model, plan, weight_integers):
        quantization = {name: quant for name, quant in plan.quantization.items() if name != "r1"}
        write_pairs(model, dataclasses.replace(plan, quantization=quantization), weight_integers)

    monkeypatch.setattr(standard_onnx, "quantize_dequantize", without_r1)
    with pytest.raises(CompileError, match=r"computes step 2 \(ConvAdd\) otherwise than the plan: "
                                           r"\d+ of the 2048 integers of s differ"):
        int8_export(save, tmp_path)
    assert not (tmp_path / "out.onnx").exists()


def test_an_int8_exports_outputs_apart_from_the_emulators_pass_when_every_step_agrees():
    """Outputs further than the tolerance from the emulator's (a plan sensitive to a tie rounded
    apart) pass when every step was compared and agrees, and are refused when a step could not be
    compared; a step that differs is refused whatever the outputs."""
    from rkcompile.emulator.closeness import Agreement
    from rkcompile.onnx_export import StepComparison, refuse_int8_export

    near, far, emulated = (Agreement("y", cosine, 0.1, 0.1) for cosine in (0.9835, 0.9817, 0.9842))
    agree, differ = StepComparison(1, "ConvHardSwish", "h", 1000, 2, 1), StepComparison(1, "Conv", "h", 1000, 100, 1)
    refuse_int8_export(Path("m.onnx"), [far], [emulated], [agree], [], 0.002)
    with pytest.raises(CompileError, match=r"further than 0.002 .* 1 steps could not be compared one by one "
                                           r"\(step 4 \(Erf\): a cpu step\)"):
        refuse_int8_export(Path("m.onnx"), [far], [emulated], [agree], ["step 4 (Erf): a cpu step"], 0.002)
    with pytest.raises(CompileError, match=r"step 1 \(Conv\) otherwise than the plan: 100 of the 1000 integers"):
        refuse_int8_export(Path("m.onnx"), [near], [emulated], [differ], [], 0.002)


def test_float16_islands_of_an_int8_export_stay_float(save, tmp_path):
    """A tensor the int8 plan computes in float16 (--float16) gets no QuantizeLinear, and the
    weights only its step reads stay float."""
    plan, written, _ = int8_export(save, tmp_path, float16_tensors=("s",))
    exported = onnx.load(str(written.path))
    quantized = {node.input[0].removesuffix("/float") for node in exported.graph.node if node.op_type == "QuantizeLinear"}
    assert "s" not in quantized and "r1" in quantized
    assert "s" in written.report["quantization"]["float16_tensors"]
    made = {out for node in exported.graph.node for out in node.output}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in exported.graph.initializer}
    assert "w2" not in made and constants["w2"].dtype == np.float32  # read as it is, not dequantized
    assert "w1" in made and constants["w1/quantized"].dtype == np.int8


def test_the_command_writes_the_file_and_its_report(save, tmp_path, capsys):
    original = save(sample_rate_model())
    assert main(["export", str(original), "--target", "rk3588", "-o", str(tmp_path / "out.onnx"),
                 "--freeze-input", "rate=8000"]) == 0
    assert "wrote" in capsys.readouterr().out
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["frozen_inputs"] == {"rate": 8000}
    onnx.checker.check_model(onnx.load(str(tmp_path / "out.onnx")))


def test_the_report_names_the_int64_inputs_the_toolkit_reshapes_on_its_cpu(save, tmp_path, capsys):
    """Token ids read as a Gather's indices and a [1, L] int64 mask read by a Cast: rknn-toolkit2
    2.5.0 adds a Reshape of the mask to 4-D on its CPU (`attention_mask_rs`), and none of the
    ids; the report and the command name the mask alone."""
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["embedded"], name="embed"),
             helper.make_node("Cast", ["attention_mask"], ["mask"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mask", "last"], ["mask_column"], name="unsqueeze"),
             helper.make_node("Mul", ["embedded", "mask_column"], ["y"], name="masked")]
    model = make_model(nodes, [value_info("input_ids", [1, 8], TensorProto.INT64),
                               value_info("attention_mask", [1, 8], TensorProto.INT64)],
                       [value_info("y", [1, 8, 16])],
                       [weight("table", np.random.default_rng(0).standard_normal((RANDOM_INT_HIGH, 16),
                                                                                 np.float32)),
                        weight("last", np.array([-1], np.int64))])
    assert main(["export", str(save(model)), "--target", "rk3588", "-o", str(tmp_path / "out.onnx")]) == 0
    assert "the Reshape to 4-D of the int64 input(s) attention_mask\n" in capsys.readouterr().out
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert [entry["input"] for entry in report["toolkit_input_reshapes"]] == ["attention_mask"]


@needs_peer
def test_the_toolkit_builds_the_export(save, tmp_path):
    written = rkcompile.export(save(conv_relu_erf()), tmp_path / "out.onnx", "rk3588")
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    assert json.loads(done.stdout.strip().splitlines()[-1])["ok"], done.stdout[-2000:]


@needs_peer
@pytest.mark.parametrize("model", [attention_with_scaled_q, same_padding_of_a_strided_conv, weighted_token_pooling,
                                   lambda: token_mean_classifier(normalized=False),
                                   lambda: token_mean_classifier(normalized=True), rms_norm, gathers_of_one_index,
                                   two_linear_heads_added, detection_head, lambda: group_norm(14, 8),
                                   lambda: group_norm(17, 5), mean_over_a_middle_axis_to_an_output, split_attention],
                         ids=["attention", "same_padding", "pooling", "token_mean", "token_mean_on_batch", "rms_norm",
                              "gathers", "two_heads", "detection_head", "group_norm", "group_norm_of_small_planes",
                              "mean_to_output", "split_attention"])
def test_the_toolkit_builds_each_shaped_graph_on_its_npu(model, save, tmp_path):
    """Each graph the toolkit fails on, loops on or partly runs on its CPU in the plan's form
    builds from the export, no layer on its CPU where the plan has none, within a timeout
    (the forms it loops on never return)."""
    written = rkcompile.export(save(model()), tmp_path / "out.onnx", "rk3588")
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588", "--timeout", "300"],
                          capture_output=True, text=True, timeout=420)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result.get("errors")
    assert result["counts"]["compute_by_target"].get("CPU", 0) <= len(written.report["cpu_nodes"])


@needs_peer
def test_the_toolkit_builds_the_int8_export_without_calibrating(save, tmp_path):
    """rknn-toolkit2 builds the QDQ file with do_quantization=False: the int8 Convs int8, the
    step the plan keeps in float16 (--float16) float16."""
    _, written, _ = int8_export(save, tmp_path, float16_tensors=("s",))
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], done.stdout[-2000:]
    convs = {layer["full_name"].split(":")[-1].split("_")[0]: layer["dtype"] for layer in result["layers"]
             if layer["op_type"].startswith("Conv")}
    assert convs == {"conv1": "INT8", "conv2": "FLOAT16", "conv3": "INT8"}


@needs_peer
def test_the_toolkit_builds_the_int8_export_of_a_scaled_rank3_tail(save, tmp_path):
    """YOLOv8's boxes times their strides, lifted to rank 4, in an int8 export: rknn-toolkit2
    2.5.0 builds it without calibrating (it crashed, signal 11, on the strides at rank 3)."""
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).standard_normal((1, 8, 8, 8)).astype(np.float32))
    plan = rkcompile.compile(save(scaled_boxes()), "rk3588", dtype="int8", calibration=calib)
    written = rkcompile.export(plan, tmp_path / "out.onnx")
    assert written.report["toolkit_shapings"]["rank3_tails_as_rank4"] == 2
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert json.loads(done.stdout.strip().splitlines()[-1])["ok"], done.stdout[-2000:]


@needs_peer
def test_the_toolkit_builds_the_int8_export_of_an_attention(tmp_path):
    """yolo11n's C2PSA attention, int8: rknn-toolkit2 2.5.0 crashed (signal 11) building the
    export with int8 scores, whatever their scales; with them in float16 (the plan's choice,
    `Target.builds_int8_attention_scores`) it builds, the second MatMul in int8."""
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).uniform(-1, 1, (1, 64, 8, 8)).astype(np.float32))
    plan = rkcompile.compile(attention_block(tmp_path / "attention.onnx"), "rk3588", dtype="int8", calibration=calib)
    written = rkcompile.export(plan, tmp_path / "out.onnx")
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], done.stdout[-2000:]
    assert {layer["dtype"] for layer in result["layers"] if layer["op_type"] == "exMatMul"} >= {"INT8", "FLOAT16"}


@needs_peer
def test_the_toolkit_builds_the_int8_export_of_a_fused_attention(tmp_path):
    """transformer_encoder's attention, fused into one exSDPAttention step, int8: rknn-toolkit2
    2.5.0 crashed (signal 11) building the export with the step's inside all float; with the
    probabilities on the plan's int8 grid (their QDQ pair) it builds."""
    from test_attention_operands import TOKENS, WIDTH, fused_projection_split

    path = tmp_path / "attention.onnx"
    onnx.save(fused_projection_split("Gather"), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).uniform(-1, 1, (1, TOKENS, WIDTH)).astype(np.float32))
    plan = rkcompile.compile(path, "rk3588", dtype="int8", calibration=calib)
    written = rkcompile.export(plan, tmp_path / "out.onnx")
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert json.loads(done.stdout.strip().splitlines()[-1])["ok"], done.stdout[-2000:]


def test_an_int8_export_reads_every_weight_through_the_plans_integers(save, tmp_path):
    """levit's two linear heads added: the float export writes them as one Gemm of the summed
    weights, a weight the int8 plan never stored; the int8 export keeps the plan's two, each
    read through a DequantizeLinear of its stored integers (rknn-toolkit2 2.5.0 fails to build
    an int8 Gemm of a float weight)."""
    model = save(two_linear_heads_added())
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).standard_normal((1, 64)).astype(np.float32))
    assert rkcompile.export(model, tmp_path / "float.onnx", "rk3588").report["toolkit_shapings"]["added_convs_as_one"] == 1
    plan = rkcompile.compile(model, "rk3588", dtype="int8", calibration=calib)
    written = onnx.load(str(rkcompile.export(plan, tmp_path / "int8.onnx").path))
    made_by = {name: node.op_type for node in written.graph.node for name in node.output}
    weights = [node.input[1] for node in written.graph.node if node.op_type in ("Conv", "Gemm", "MatMul")]
    assert len(weights) == 2 and all(made_by.get(name) == "DequantizeLinear" for name in weights)


def test_an_int8_export_keeps_a_one_channel_convs_bias_on_its_integers(save, tmp_path):
    """A 1x1 Conv of one output channel with a bias (yolo11n_obb's angle head): the float export
    writes its bias as an Add after it (mean_biases_apart, for a norm's mean), a float value the
    int8 plan never stored; the int8 export keeps the Conv's own bias, read through a
    DequantizeLinear of the plan's int32 integers (rknn-toolkit2 2.5.0 failed to build the Add's
    form: "Invalid w_par['dtype'] = float16")."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="angle")]
    model = save(make_model(nodes, [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 1, 8, 8])],
                            [weight("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.5),
                             weight("b1", rng.standard_normal(8).astype(np.float32) * 0.1),
                             weight("w2", rng.standard_normal((1, 8, 1, 1)).astype(np.float32) * 0.5),
                             weight("b2", np.array([0.3], np.float32))]))
    assert rkcompile.export(model, tmp_path / "float.onnx", "rk3588").report["toolkit_shapings"]["mean_biases_apart"] == 1
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).standard_normal((1, 3, 8, 8)).astype(np.float32))
    plan = rkcompile.compile(model, "rk3588", dtype="int8", calibration=calib)
    written = onnx.load(str(rkcompile.export(plan, tmp_path / "int8.onnx").path))
    made_by = {name: node.op_type for node in written.graph.node for name in node.output}
    angle = next(node for node in written.graph.node if node.op_type == "Conv" and node.input[1].startswith("w2"))
    assert len(angle.input) == 3 and made_by.get(angle.input[2]) == "DequantizeLinear"


@needs_peer
def test_the_toolkit_computes_an_int8_export_of_a_symmetric_input_as_the_file_says(save, tmp_path):
    """An input calibrated on [-1, 1] would have zero point 0, which rknn-toolkit2 reads as a
    symmetric grid on another scale (its first convolution then 0.6% off on tv_mnasnet0_5): the
    plan moves it to zero point -1 or 1, and the toolkit's simulator on the export gives what
    onnxruntime gives on the same file, every int8 output."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    constants = [weight("w1", rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.5),
                 weight("b1", rng.standard_normal(16).astype(np.float32) * 0.1),
                 weight("w2", rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.2),
                 weight("b2", rng.standard_normal(8).astype(np.float32) * 0.1)]
    model = make_model(nodes, [value_info("x", [1, 3, 32, 32])], [value_info("y", [1, 8, 32, 32])], constants)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(4):
        sample = rng.uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
        sample.flat[:2] = [-1.0, 1.0]
        np.save(calib / f"{index}.npy", sample)
    np.savez(tmp_path / "input.npz", x=np.load(calib / "0.npy"))
    plan = rkcompile.compile(save(model), "rk3588", dtype="int8", calibration=calib, calibration_method="minmax")
    (first,) = [step for step in plan.record.steps if "conv1" in step.nodes]
    assert plan.record.quantization[first.inputs[0]].zero_points in ((-1,), (1,))
    written = rkcompile.export(plan, tmp_path / "out.onnx").path
    done = subprocess.run([PEER_PYTHON, str(Path(__file__).parents[1] / "tools" / "peer_int8.py"), str(written),
                           str(calib), str(tmp_path / "input.npz"), "--prequantized", str(written)],
                          capture_output=True, text=True, timeout=900)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["worst_cosine"] > 1 - 1e-9, result


def test_the_table_tool_needs_the_toolkit(tmp_path):
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "tools" / "export_peer_table.py"),
                           str(tmp_path), "--python", str(tmp_path / "none")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: ")


def test_the_table_tool_names_the_exports_that_miss_the_bar():
    """More toolkit CPU layers on the export than on an original it builds, or than the plan's
    CPU nodes (before the cut) on one it fails on: named; at or below: not."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
    from export_peer_table import _missed_bar

    def row(original_cpu, export_cpu, plan_cpu, host_tail_cpu=None):
        original = ({"built": True, "compute_layers_by_target": {"CPU": original_cpu, "NPU": 9}}
                    if original_cpu is not None else {"built": False, "compute_layers_by_target": {}})
        export = {"plan_cpu_nodes": ["Erf (erf)"] * plan_cpu}
        if host_tail_cpu is not None:
            export["host_tail"] = {"plan_cpu_nodes_in_npu_part": host_tail_cpu}
        return {"model": "m", "original": original, "export": export,
                "toolkit_on_export": {"built": True, "compute_layers_by_target": {"CPU": export_cpu}}}

    assert _missed_bar(row(45, 51, 43)) == "51 CPU layers against 45 on the original"
    assert _missed_bar(row(45, 45, 43)) == ""
    assert _missed_bar(row(None, 1, 0)) == "1 CPU layers against the plan's 0 CPU nodes"
    assert _missed_bar(row(None, 2, 300, host_tail_cpu=8)) == ""
    assert _missed_bar(row(None, 9, 300, host_tail_cpu=8)) == "9 CPU layers against the plan's 8 CPU nodes"
    assert _missed_bar({"model": "m", "original": {"built": False}, "export_error": "x"}) == "not exported"
    masked = row(None, 5, 4)
    masked["export"]["toolkit_input_reshapes"] = ["attention_mask"]
    assert _missed_bar(masked) == ("5 CPU layers against the plan's 4 CPU nodes; 1 of them the toolkit's own "
                                   "Reshape of attention_mask, as the report predicts")


def test_the_int8_table_tool_needs_the_toolkit(tmp_path):
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "tools" / "export_int8_table.py"),
                           str(tmp_path), "--python", str(tmp_path / "none")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: ")


def test_the_int8_table_gives_the_toolkit_an_export_its_check_refuses(save, tmp_path, monkeypatch):
    """An export whose check fails (onnxruntime on the file too far from the emulator) is still
    built by the toolkit, and its row says the check refused it."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
    import export_int8_table

    model = save(residual_cnn())
    np.savez(model.with_suffix(".npz"), x=np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32))
    export = rkcompile.export

    def strict(plan, path, **kwargs):
        if "int8_tolerance" not in kwargs:
            raise CompileError("the int8 export's outputs on onnxruntime are further than 0.002 ...; nothing written")
        return export(plan, path, **kwargs)

    monkeypatch.setattr(export_int8_table.rkcompile, "export", strict)
    judged = []
    monkeypatch.setattr(export_int8_table, "toolkit_cosine",
                        lambda python, built, *rest, **options: judged.append(Path(built)) or {"worst_cosine": 0.5})
    row = export_int8_table.row(model, tmp_path / "out", "python", {})
    assert judged[-1].is_file() and row["toolkit_on_export"] == 0.5
    assert row["errors"]["export check"].startswith("refused, written here without it: onnxruntime on the file 0.")


def test_the_int8_table_compares_the_sides_on_more_inputs(save, tmp_path, monkeypatch):
    """--more-inputs: the toolkit runs on the calibration set and the held-out inputs too, the
    emulator on the same 7 inputs, and a second table gives each side's mean and worst; a
    toolkit line run on the npz input alone is not taken for its own int8 there."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
    import export_int8_table

    model = save(residual_cnn())
    np.savez(model.with_suffix(".npz"), x=np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32))
    commands = []

    def toolkit(python, built, calib, sample, original=None, held_out=None):
        commands.append((original, [path.is_file() for path in held_out or []]))
        base = 0.9 if original is None else 0.8
        return {"worst_cosine": base, "calibration_cosines": [base, base + 0.01, base + 0.02, base + 0.03],
                "held_out_cosines": [base + 0.04, base + 0.05, base + 0.06]}

    monkeypatch.setattr(export_int8_table, "toolkit_cosine", toolkit)
    row = export_int8_table.row(model, tmp_path / "out", "python", {model.stem: {"worst_cosine": 0.95}},
                                more_inputs=True)
    assert commands == [(None, [True] * 3), (model, [True] * 3)]  # its own line lacked the other inputs
    assert row["inputs"]["toolkit_own"][-1] == pytest.approx(0.96) and len(row["inputs"]["emulator"]) == 7
    assert row["inputs"]["emulator"][0] == pytest.approx(row["emulator"])
    table = export_int8_table.render([row])
    assert "| 7 | 0.93000 (0.90000) | 0.83000 (0.80000) |" in table and "| -0.10000 (-0.10000) |" in table
    assert export_int8_table.every_input({"worst_cosine": 0.9, "calibration_cosines": [0.9]}) is None


def test_the_int8_table_gives_the_toolkit_no_export_a_step_check_refuses(save, tmp_path, monkeypatch):
    """An export refused for a step the file computes otherwise than the plan (which no tolerance
    lifts) is not given to the toolkit: the row says why, the toolkit's own int8 still judged."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
    import export_int8_table

    model = save(residual_cnn())
    np.savez(model.with_suffix(".npz"), x=np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32))

    def refused(plan, path, **kwargs):
        raise CompileError("the int8 export computes step 2 (ConvAdd) otherwise than the plan: ...; nothing written")

    monkeypatch.setattr(export_int8_table.rkcompile, "export", refused)
    judged = []
    monkeypatch.setattr(export_int8_table, "toolkit_cosine",
                        lambda python, built, *rest, **options: judged.append(Path(built)) or {"worst_cosine": 0.5})
    row = export_int8_table.row(model, tmp_path / "out", "python", {})
    assert judged == [model] and row["toolkit_own"] == 0.5 and row["toolkit_on_export"] is None
    assert row["errors"]["export check"].startswith("refused: the int8 export computes step 2")


def detector_with_nms_like_tail() -> onnx.ModelProto:
    """A Conv network (features: a static output) with a detector's post-processing: a static
    CPU chain (Erf, then TopK of a constant k: top scores and their indices, scaled), then a
    selection by threshold whose size the data decides (NonZero, Gathers), and a TopK of as many
    as pass it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["features"], name="relu"),
             helper.make_node("Reshape", ["features", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Erf", ["flat"], ["scores"], name="erf"),
             helper.make_node("TopK", ["scores", "k"], ["top", "top_indices"], name="topk"),
             helper.make_node("Mul", ["top", "two"], ["scaled"], name="scale"),
             helper.make_node("Greater", ["scaled", "threshold"], ["kept"], name="greater"),
             helper.make_node("NonZero", ["kept"], ["where"], name="nonzero"),
             helper.make_node("Squeeze", ["where", "axis0"], ["selected"], name="squeeze"),
             helper.make_node("Gather", ["top", "selected"], ["boxes"], name="gather_scores"),
             helper.make_node("Gather", ["top_indices", "selected"], ["labels"], name="gather_indices"),
             helper.make_node("Cast", ["kept"], ["kept_count"], name="cast", to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["kept_count"], ["passed"], name="count"),
             helper.make_node("TopK", ["top", "passed"], ["ranked", "ranked_indices"], name="topk_passed")]
    return make_model(nodes, [value_info("x", [1, 8, 16, 16])],
                      [value_info("boxes", [None]), value_info("labels", [None], TensorProto.INT64),
                       value_info("features", [1, 8, 16, 16]), value_info("ranked", [None])],
                      [weight("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2),
                       weight("b", rng.standard_normal(8).astype(np.float32)),
                       weight("flat_shape", np.array([-1], np.int64)), weight("k", np.array([64], np.int64)),
                       weight("threshold", np.array(0.5, np.float32)), weight("axis0", np.array([0], np.int64)),
                       weight("two", np.array(2.0, np.float32))])


def test_a_host_tail_reading_a_layer_norm_the_plan_made_below_opset_17(save, tmp_path):
    """The NPU part hands the host part a LayerNormalization's output (the plan's exNorm, made at
    opset 15 as tf2onnx writes a Keras model): its element type is inferred from the older form
    it is written in, as onnx infers nothing for LayerNormalization at opset 15."""
    model = decomposed_layer_norm([1, 24, 64], [-1], 15)
    model.graph.node.append(helper.make_node("NonZero", ["y"], ["where"], name="where"))
    model.graph.output.append(helper.make_tensor_value_info("where", TensorProto.INT64, [3, "n"]))
    original = save(model)
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    assert [o.type.tensor_type.elem_type for o in npu.graph.output] == [TensorProto.FLOAT]
    assert "LayerNormalization" not in {n.op_type for n in npu.graph.node}
    x = np.random.default_rng(0).standard_normal((1, 24, 64)).astype(np.float32)
    handed = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
    found = onnxruntime_run(host, {i.name: ({"x": x} | handed)[i.name] for i in host.graph.input})
    for got, want in zip(found, onnxruntime_run(original, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_data_dependent_tail_is_refused_without_host_tail(save, tmp_path):
    with pytest.raises(CompileError, match="shape the data decides.*--host-tail"):
        rkcompile.export(save(detector_with_nms_like_tail()), tmp_path / "out.onnx", "rk3588")
    assert list(tmp_path.glob("out*")) == []


def test_a_data_dependent_tail_is_written_for_the_host(save, tmp_path):
    """--host-tail: the static network in out.onnx for the toolkit, the post-processing from
    the first tensor of data-dependent size in out.host.onnx, which reads out.onnx's outputs and
    gives every output of the model; the static CPU chain the plan runs before the cut goes to
    the host part, and so does the flattening before it (it only moves values), so the cut is
    the Relu's output alone; the TopK starts the host part, with what reads it (the scaling of
    its values, an NPU op); the two together compute the original."""
    original = save(detector_with_nms_like_tail())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    assert written.host_path == tmp_path / "out.host.onnx"
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    onnx.checker.check_model(npu, full_check=True)
    onnx.checker.check_model(host, full_check=True)
    assert all(d.HasField("dim_value") for v in (*npu.graph.input, *npu.graph.output)
               for d in v.type.tensor_type.shape.dim)
    assert [n.op_type for n in npu.graph.node] == ["Conv", "Relu"]
    assert {"Erf", "TopK", "NonZero"} <= {n.op_type for n in host.graph.node}
    assert [o.name for o in host.graph.output] == ["boxes", "labels", "features", "ranked"]
    tail = written.report["host_tail"]
    assert tail["static_nodes_moved_to_host"] == ["flatten", "erf"] and tail["selections_from"] == ["topk"]
    assert tail["cpu_nodes_in_npu_part"] == [] and tail["data_dependent_from"] == ["where", "ranked", "ranked_indices"]
    assert tail["cut"] == [{"tensor": "features", "shape": [1, 8, 16, 16], "made_by": "relu"}]
    assert [o.name for o in npu.graph.output] == ["features"]
    # the host part reads the NPU part's outputs last, in their order (docs/deploy.md's board code)
    assert [i.name for i in host.graph.input][-len(npu.graph.output):] == [o.name for o in npu.graph.output]
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 8, 16, 16)).astype(np.float32)
        npu_outputs = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
        feeds = {i.name: ({"x": x} | npu_outputs)[i.name] for i in host.graph.input}
        for found, expected in zip(onnxruntime_run(host, feeds), onnxruntime_run(original, {"x": x})):
            np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)


def test_the_command_writes_the_host_tail_and_names_it(save, tmp_path, capsys):
    original = save(detector_with_nms_like_tail())
    assert main(["export", str(original), "--target", "rk3588", "-o", str(tmp_path / "out.onnx"), "--host-tail"]) == 0
    printed = capsys.readouterr().out
    assert "out.host.onnx" in printed and "the host part starts at topk, where, ranked ...:" in printed
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["host_tail"]["path"] == str(tmp_path / "out.host.onnx")
    assert sorted(p.name for p in tmp_path.glob("out*")) == ["out.host.onnx", "out.onnx", "out.report.json"]


@needs_peer
@pytest.mark.parametrize("model", [detector_with_nms_like_tail, lambda: detection_head_levels(),
                                   lambda: scores_for_a_selection(), lambda: box_decoding_levels(),
                                   lambda: yolo_like_head(6)],
                         ids=["nms_like", "head_levels", "rank3_scores", "box_decoding", "rows_off_grid"])
def test_the_toolkit_builds_the_npu_part_of_a_host_tail(model, save, tmp_path):
    """The toolkit builds the NPU part the original's NonZero keeps it from building, with no
    layer on its CPU (the plan has none before the cut)."""
    written = rkcompile.export(save(model()), tmp_path / "out.onnx", "rk3588", host_tail=True)
    done = subprocess.run([PEER_PYTHON, str(PEER), str(written.path), "--target", "rk3588"],
                          capture_output=True, text=True, timeout=900)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"], result.get("errors")
    assert result["counts"]["compute_by_target"].get("CPU", 0) == 0


def test_a_data_dependent_tensor_inside_is_written_whole_with_a_note(save, tmp_path, capsys):
    """Outputs of static shape computed through a tensor of data-dependent size (the sum of the
    selected scores): the export is written as before, whole, and says where the size depends on
    the data; --host-tail cuts it there."""
    model = detector_with_nms_like_tail()
    model.graph.node.append(helper.make_node("ReduceSum", ["boxes"], ["total"], name="total", keepdims=0))
    del model.graph.output[:]
    model.graph.output.extend([value_info("features", [1, 8, 16, 16]), value_info("total", [])])
    original = save(model)
    assert main(["export", str(original), "--target", "rk3588", "-o", str(tmp_path / "out.onnx")]) == 0
    assert "note: where has a shape the data decides" in capsys.readouterr().err
    assert json.loads((tmp_path / "out.report.json").read_text())["data_dependent"] == ["where"]
    assert "NonZero" in {n.op_type for n in onnx.load(str(tmp_path / "out.onnx")).graph.node}
    written = rkcompile.export(original, tmp_path / "cut.onnx", "rk3588", host_tail=True)
    assert [o.name for o in onnx.load(str(written.host_path)).graph.output] == ["features", "total"]


def group_norm(opset: int, side: int, per_element_scale: bool = False) -> onnx.ModelProto:
    """torchvision's GroupNorm(4, 16) after a Conv: Reshape to [1, 4, -1], InstanceNormalization,
    (with `per_element_scale`, a Mul by a constant that differs within each group,) Reshape
    back, the per-channel affine."""
    rng = np.random.default_rng(0)
    shape, length = [1, 16, side, side], 4 * side * side
    scaled = [helper.make_node("Mul", ["n", "within"], ["s"], name="within")] if per_element_scale else []
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "grouped_shape"], ["g"], name="group"),
             helper.make_node("InstanceNormalization", ["g", "scale", "bias"], ["n"], name="norm", epsilon=1e-5),
             *scaled,
             helper.make_node("Reshape", ["s" if scaled else "n", "shape"], ["r"], name="ungroup"),
             helper.make_node("Mul", ["r", "gamma"], ["m"], name="gamma"),
             helper.make_node("Add", ["m", "beta"], ["y"], name="beta")]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)],
                      [weight("w", rng.standard_normal((16, 16, 1, 1)).astype(np.float32)),
                       weight("grouped_shape", np.array([1, 4, -1])), weight("shape", np.array(shape)),
                       weight("scale", rng.uniform(0.5, 2, 4).astype(np.float32)),
                       weight("bias", rng.uniform(-1, 1, 4).astype(np.float32)),
                       weight("within", rng.uniform(0.5, 2, (1, 1, length)).astype(np.float32)),
                       weight("gamma", rng.uniform(0.5, 2, (16, 1, 1)).astype(np.float32)),
                       weight("beta", rng.uniform(-1, 1, (16, 1, 1)).astype(np.float32))], opset=opset)


@pytest.mark.parametrize("opset, side, form", [(14, 8, "InstanceNormalization"), (14, 5, "ReduceMean"),
                                               (17, 5, "ReduceMean"), (18, 5, "ReduceMean")],
                         ids=["grouped_plane_of_64", "channel_means", "from_layer_normalization", "axes_as_input"])
def test_a_group_norm_keeps_height_and_width_apart(opset, side, form, save, tmp_path):
    """The plan normalizes each group as an image of the [G, C/G, H, W] view (a
    LayerNormalization over axes [1, 2, 3], written in older ops below opset 17); rknn-toolkit2
    2.5.0 runs the Reshapes into and out of that view on its CPU when neither C/G nor H*W is a
    multiple of 8. The export writes the norm on
    [1, G, C/G*H, W] as an InstanceNormalization when C/G or H*W is a multiple of 8 (the
    toolkit's exNorm), else on the input's own shape by per-channel means: no view of merged
    planes either way, the same values."""
    original = save(group_norm(opset, side))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert written.report["toolkit_shapings"]["group_norms_on_their_planes"] == 1
    assert form in {n.op_type for n in exported.graph.node}
    shapes = onnx.shape_inference.infer_shapes(exported).graph.value_info
    view = [4 * side * side, 1, 1]   # a row per group of the plan's form
    assert not [v.name for v in shapes if [d.dim_value for d in v.type.tensor_type.shape.dim][1:] == view]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 16, side, side)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_a_group_norm_scaled_within_its_groups_is_written_up_to_that_scale(save, tmp_path):
    """A scale that differs within a group is no InstanceNormalization's: the norm is written on
    its planes up to that scale, which stays a Mul after it."""
    written = rkcompile.export(save(group_norm(14, 5, per_element_scale=True)), tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["group_norms_on_their_planes"] == 1
    exported = onnx.load(str(written.path))
    within = [n for n in exported.graph.node if n.op_type == "Mul" and any(
        numpy_helper.to_array(t).size == 4 * 5 * 5 for t in exported.graph.initializer if t.name in n.input)]
    assert len(within) == 1
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def scores_for_a_selection() -> onnx.ModelProto:
    """Per-channel scores [1, 8, 16] of a Conv (a Reshape merging its plane, a Softmax over it),
    the entries above a threshold selected (NonZero: a size the data decides)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "rows"], ["flat"], name="flatten"),
             helper.make_node("Softmax", ["flat"], ["scores"], name="softmax", axis=-1),
             helper.make_node("Greater", ["scores", "threshold"], ["kept"], name="greater"),
             helper.make_node("NonZero", ["kept"], ["where"], name="nonzero")]
    return make_model(nodes, [value_info("x", [1, 8, 4, 4])], [value_info("where", [3, None], TensorProto.INT64)],
                      [weight("w", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
                       weight("rows", np.array([1, 8, 16], np.int64)), weight("threshold", np.array(0.5, np.float32))])


def test_a_cut_tensor_of_rank_3_is_written_4d_and_reshaped_on_the_host(save, tmp_path):
    """The NPU part's last step to a cut tensor of rank 3 is a Reshape from 4-D (the shapings
    hold the scores as [1, 8, 1, 16]); rknn-toolkit2 2.5.0 runs a Reshape writing an output of
    rank 2 or 3 on its CPU. The NPU part writes the 4-D tensor and the host part reshapes it:
    the two together compute the original, the moved Reshape counted as moved to the host."""
    original = save(scores_for_a_selection())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in npu.graph.output] == [[1, 8, 1, 16]]
    assert [n.op_type for n in npu.graph.node if n.output[0] == npu.graph.output[0].name] == ["Softmax"]
    assert host.graph.node[0].op_type == "Reshape" and host.graph.node[0].input[0] == npu.graph.output[0].name
    assert host.graph.node[0].name in written.report["host_tail"]["static_nodes_moved_to_host"]
    assert written.report["host_tail"]["cut"][0]["shape"] == [1, 8, 1, 16]
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float32)
    cut = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
    np.testing.assert_array_equal(onnxruntime_run(host, cut)[0], onnxruntime_run(original, {"x": x})[0])


def yolo_like_head(side: int) -> onnx.ModelProto:
    """A YOLO head's output on two levels, `x` [1, 8, side, side] and its 2x2 max pool: each
    level's Conv [1, 12, H, W] Reshaped into rows [1, 12, H*W], the rows joined (Concat) and a
    Sigmoid of them, `output0` [1, 12, 5/4 side^2]; the first level's map is an output too
    (`maps`, as a segmenter's prototypes)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MaxPool", ["x"], ["half"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    for level, features in enumerate(("x", "half")):
        nodes += [helper.make_node("Conv", [features, "w"], [f"head{level}"], name=f"conv{level}"),
                  helper.make_node("Reshape", [f"head{level}", "rows"], [f"rows{level}"], name=f"rows{level}")]
    nodes += [helper.make_node("Concat", ["rows0", "rows1"], ["joined"], name="join", axis=2),
              helper.make_node("Sigmoid", ["joined"], ["output0"], name="sigmoid"),
              helper.make_node("Relu", ["head0"], ["maps"], name="maps")]
    return make_model(nodes, [value_info("x", [1, 8, side, side])],
                      [value_info("output0", [1, 12, side * side * 5 // 4]), value_info("maps", [1, 12, side, side])],
                      [weight("w", rng.standard_normal((12, 8, 1, 1)).astype(np.float32)),
                       weight("rows", np.array([1, 12, -1], np.int64))])


def test_an_output_of_rows_off_the_toolkits_grid_is_reshaped_on_the_host(save, tmp_path):
    """A YOLO head at 320x320 (2100 rows: 45 here, 6x6 and 3x3) ends in a Reshape of the
    shapings' [1, 12, 1, 45] into the output's [1, 12, 45], which rknn-toolkit2 2.5.0 runs on
    its CPU when the rows' length is not a multiple of 8. With --host-tail that Reshape alone
    goes to the host part: the NPU part writes the 4-D Sigmoid (and the 4-D map, which passes
    through the host part), the two together compute the original."""
    original = save(yolo_like_head(6))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    made_by = {output: node.op_type for node in npu.graph.node for output in node.output}
    assert [made_by[o.name] for o in npu.graph.output] == ["Sigmoid", "Relu"]
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in npu.graph.output] == [[1, 12, 1, 45],
                                                                                               [1, 12, 6, 6]]
    assert [n.op_type for n in host.graph.node] == ["Reshape"]
    tail = written.report["host_tail"]
    assert tail["static_nodes_moved_to_host"] == [host.graph.node[0].name] and tail["data_dependent_from"] == []
    assert [i.name for i in host.graph.input] == [o.name for o in npu.graph.output]
    assert [o.name for o in host.graph.output] == ["output0", "maps"]
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype(np.float32)
    cut = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
    for found, expected in zip(onnxruntime_run(host, cut), onnxruntime_run(original, {"x": x})):
        np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)
    written = rkcompile.export(original, tmp_path / "whole.onnx", "rk3588")
    assert written.host_path is None and "host_tail" not in written.report


def test_an_output_of_rows_on_the_toolkits_grid_is_left_whole(save, tmp_path):
    """80 rows (8x8 and 4x4), a multiple of 8, the toolkit reshapes on its NPU (a YOLO head's
    8400 at 640x640): --host-tail writes no host part, the same file as without it."""
    original = save(yolo_like_head(8))
    written = rkcompile.export(original, tmp_path / "tail.onnx", "rk3588", host_tail=True)
    assert written.host_path is None and "host_tail" not in written.report
    assert not (tmp_path / "tail.host.onnx").exists()
    npu = onnx.load(str(written.path))
    assert [len(o.type.tensor_type.shape.dim) for o in npu.graph.output] == [3, 4]
    whole = rkcompile.export(original, tmp_path / "whole.onnx", "rk3588")
    assert written.path.read_bytes() == whole.path.read_bytes()


def head_levels_into_rows() -> list[onnx.NodeProto]:
    """A head's Conv `w` on two levels, `x` [1, 8, 4, 4] and its 2x2 max pool, each level's
    result Transposed channels last and Reshaped (`shape0`, `shape1`) into `rows0`, `rows1`."""
    nodes = [helper.make_node("MaxPool", ["x"], ["half"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    for level, features in enumerate(("x", "half")):
        nodes += [helper.make_node("Conv", [features, "w"], [f"head{level}"], name=f"conv{level}"),
                  helper.make_node("Transpose", [f"head{level}"], [f"last{level}"], name=f"transpose{level}",
                                   perm=[0, 2, 3, 1]),
                  helper.make_node("Reshape", [f"last{level}", f"shape{level}"], [f"rows{level}"], name=f"rows{level}")]
    return nodes


def detection_head_levels() -> onnx.ModelProto:
    """torchvision's classification head on two levels (4x4, 2x2) of 3 anchors x 5 classes:
    each level's Conv [1, 15, H, W] -> Transpose -> Reshape [1, H*W*3, 5], the levels joined
    and split again, a Sigmoid per level, the scores above a threshold selected (NonZero)."""
    rng = np.random.default_rng(0)
    nodes = [*head_levels_into_rows(),
             helper.make_node("Concat", ["rows0", "rows1"], ["joined"], name="join", axis=1),
             helper.make_node("Split", ["joined", "sizes"], ["part0", "part1"], name="split", axis=1)]
    for level in range(2):
        nodes += [helper.make_node("Sigmoid", [f"part{level}"], [f"scores{level}"], name=f"sigmoid{level}"),
                  helper.make_node("Greater", [f"scores{level}", "threshold"], [f"kept{level}"],
                                   name=f"greater{level}"),
                  helper.make_node("NonZero", [f"kept{level}"], [f"where{level}"], name=f"nonzero{level}")]
    return make_model(nodes, [value_info("x", [1, 8, 4, 4])],
                      [value_info(f"where{level}", [3, None], TensorProto.INT64) for level in range(2)],
                      [weight("w", rng.standard_normal((15, 8, 1, 1)).astype(np.float32)),
                       weight("shape0", np.array([1, 48, 5], np.int64)),
                       weight("shape1", np.array([1, 12, 5], np.int64)),
                       weight("sizes", np.array([48, 12], np.int64)), weight("threshold", np.array(0.5, np.float32))])


def test_a_heads_layout_after_its_sigmoid_goes_to_the_host(save, tmp_path):
    """The levels joined and split again are bypassed, each Sigmoid moves before its level's
    Reshapes, and the Reshapes, which only regroup the NPU part's last results (rknn-toolkit2
    2.5.0 runs the Reshape of [1, H, W, A*K] into [1, H*W*A, 1, K] on its CPU), go to the host
    part: the NPU part ends in each level's 4-D Sigmoid, the two parts compute the original."""
    original = save(detection_head_levels())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    shaped = written.report["toolkit_shapings"]
    assert shaped["splits_of_concats_bypassed"] == 1 and shaped["reshapes_after_elementwise_ops"] == 2
    made_by = {output: node.op_type for node in npu.graph.node for output in node.output}
    assert [made_by[o.name] for o in npu.graph.output] == ["Sigmoid", "Sigmoid"]
    assert all(len(o.type.tensor_type.shape.dim) == 4 for o in npu.graph.output)
    assert {"Concat", "Split"}.isdisjoint(made_by.values())
    moved = written.report["host_tail"]["static_nodes_moved_to_host"]
    assert {node.name for node in host.graph.node if node.op_type == "Reshape"} <= set(moved)
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float32)
    cut = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
    for found, expected in zip(onnxruntime_run(host, cut), onnxruntime_run(original, {"x": x})):
        np.testing.assert_array_equal(found, expected)


def box_decoding_levels() -> onnx.ModelProto:
    """torchvision's box decoding of a region-proposal head on two levels (4x4, 2x2) of 3
    anchors: each level's Conv [1, 12, H, W] -> Transpose -> Reshape into rows of 4 codes, the
    levels joined, the x code of every row (a Slice of step 4) scaled and shifted by its anchor's
    width and centre, the width code clipped; the centres right of a threshold selected
    (NonZero), the clipped codes an output."""
    rng = np.random.default_rng(0)
    rows = 4 * 4 * 3 + 2 * 2 * 3
    nodes = [*head_levels_into_rows(),
             helper.make_node("Concat", ["rows0", "rows1"], ["joined"], name="join", axis=0),
             helper.make_node("Slice", ["joined", "x_start", "end", "columns", "step"], ["dx"], name="x_codes"),
             helper.make_node("Slice", ["joined", "w_start", "end", "columns", "step"], ["dw"], name="w_codes"),
             helper.make_node("Mul", ["dx", "widths"], ["shift"], name="scale"),
             helper.make_node("Add", ["shift", "centres"], ["centre"], name="offset"),
             helper.make_node("Clip", ["dw", "", "limit"], ["clipped"], name="clip"),
             helper.make_node("Greater", ["centre", "threshold"], ["right"], name="greater"),
             helper.make_node("NonZero", ["right"], ["where"], name="nonzero")]
    return make_model(nodes, [value_info("x", [1, 8, 4, 4])],
                      [value_info("where", [2, None], TensorProto.INT64), value_info("clipped", [rows, 1])],
                      [weight("w", rng.standard_normal((12, 8, 1, 1)).astype(np.float32)),
                       weight("shape0", np.array([48, 4], np.int64)), weight("shape1", np.array([12, 4], np.int64)),
                       weight("x_start", np.array([0], np.int64)), weight("w_start", np.array([2], np.int64)),
                       weight("end", np.array([4], np.int64)), weight("columns", np.array([1], np.int64)),
                       weight("step", np.array([4], np.int64)),
                       weight("widths", rng.uniform(8, 32, (rows, 1)).astype(np.float32)),
                       weight("centres", rng.uniform(0, 64, (rows, 1)).astype(np.float32)),
                       weight("limit", np.array(4.0, np.float32)), weight("threshold", np.array(32.0, np.float32))])


def test_a_box_decoding_goes_to_the_host_with_the_layout_it_reads(save, tmp_path):
    """The anchors' scaling and shifting (and the clip) of codes that only moves brought into
    rows, only the host part reading them, go to the host part with those moves: rknn-toolkit2
    2.5.0 runs on its CPU the Reshape joining the levels' rows (faster-rcnn's proposals). The NPU
    part ends in each level's Conv, the two parts compute the original."""
    original = save(box_decoding_levels())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588", host_tail=True)
    npu, host = onnx.load(str(written.path)), onnx.load(str(written.host_path))
    made_by = {output: node.op_type for node in npu.graph.node for output in node.output}
    assert [made_by[o.name] for o in npu.graph.output] == ["Conv", "Conv"]
    assert {"scale", "offset", "clip"} <= set(written.report["host_tail"]["static_nodes_moved_to_host"])
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float32)
    cut = dict(zip([o.name for o in npu.graph.output], onnxruntime_run(npu, {"x": x})))
    feeds = {i.name: ({"x": x} | cut)[i.name] for i in host.graph.input}
    for found, expected in zip(onnxruntime_run(host, feeds), onnxruntime_run(original, {"x": x})):
        np.testing.assert_array_equal(found, expected)


def test_scaling_and_offset_move_before_the_reshape_that_ends_an_output():
    """Reshape [1, 6, 1, 1] -> [6, 1], then a Mul by a [6, 1] constant and an Add of a scalar
    (a detector's box sides scaled and offset by their anchors): the two ops move onto the 4-D
    tensor, the [6, 1] constant reshaped alike, and the Reshape ends the output, the same
    values."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["sides"], name="sides"),
             helper.make_node("Mul", ["scale", "sides"], ["scaled"], name="scale"),
             helper.make_node("Add", ["scaled", "offset"], ["y"], name="offset")]
    model = make_model(nodes, [value_info("x", [1, 6, 1, 1])], [value_info("y", [6, 1])],
                       [weight("shape", np.array([6, 1], np.int64)),
                        weight("scale", rng.uniform(1, 2, (6, 1)).astype(np.float32)),
                        weight("offset", np.array(0.5, np.float32))])
    x = rng.standard_normal((1, 6, 1, 1)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert reshapes_after_elementwise_ops(model) == 2
    assert [n.op_type for n in model.graph.node] == ["Mul", "Add", "Reshape"]
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_an_instance_norm_is_no_group_norm_to_write(save, tmp_path):
    """An InstanceNormalization of x [1, 16, 5, 5], on the plan's [16, 25, 1, 1] view, normalizes
    groups of one channel: `group_norms_on_their_planes` leaves it as planned."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], name="norm", epsilon=1e-5)]
    model = make_model(nodes, [value_info("x", [1, 16, 5, 5])], [value_info("y", [1, 16, 5, 5])],
                       [weight("scale", rng.uniform(0.5, 2, 16).astype(np.float32)),
                        weight("bias", rng.uniform(-1, 1, 16).astype(np.float32))], opset=14)
    written = rkcompile.export(save(model), tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["group_norms_on_their_planes"] == 0
    assert written.report["check"]["outputs"][0]["max_rel"] < 1e-5


def test_a_product_with_the_centreness_moves_into_the_scores_layout():
    """FCOS: the class scores [3, 3, 1, 5] (Transposed from NCHW) Reshaped to [9, 5], times the
    centreness [1, 1, 3, 3] Reshaped to [9, 1], then the square root, into the output. The
    product and the root move before the Reshapes, the centreness Transposed into the scores'
    layout [3, 3, 1, 1] (rknn-toolkit2 2.5.0 runs its Reshape into [1, 9, 1, 1] on its CPU, that
    Transpose on its NPU): Reshapes alone end the output, the same values."""
    nodes = [helper.make_node("Reshape", ["scores", "rows_shape"], ["rows"], name="rows"),
             helper.make_node("Reshape", ["rows", "scores_shape"], ["flat_scores"], name="flat_scores"),
             helper.make_node("Reshape", ["centres", "centre_rows_shape"], ["centre_rows"], name="centre_rows"),
             helper.make_node("Reshape", ["centre_rows", "centres_shape"], ["flat_centres"], name="flat_centres"),
             helper.make_node("Mul", ["flat_scores", "flat_centres"], ["product"], name="product"),
             helper.make_node("Sqrt", ["product"], ["y"], name="root")]
    model = make_model(nodes, [value_info("scores", [3, 3, 1, 5]), value_info("centres", [1, 1, 3, 3])],
                       [value_info("y", [9, 5])],
                       [weight("rows_shape", np.array([1, 9, 1, 5], np.int64)),
                        weight("scores_shape", np.array([9, 5], np.int64)),
                        weight("centre_rows_shape", np.array([1, 9, 1, 1], np.int64)),
                        weight("centres_shape", np.array([9, 1], np.int64))])
    rng = np.random.default_rng(0)
    feeds = {"scores": rng.random((3, 3, 1, 5), np.float32), "centres": rng.random((1, 1, 3, 3), np.float32)}
    expected = onnxruntime_run(model, feeds)[0]
    assert reshapes_after_elementwise_ops(model) == 4   # the product and the root, each before two Reshapes
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Mul", "Sqrt", "Reshape", "Reshape"]
    transpose = next(n for n in model.graph.node if n.op_type == "Transpose")
    assert transpose.input[0] == "centres" and list(transpose.attribute[0].ints) == [2, 3, 0, 1]
    np.testing.assert_array_equal(onnxruntime_run(model, feeds)[0], expected)


def test_an_output_computed_from_a_selection_is_judged_by_its_cosine():
    """TopK's indices, and what is gathered with them, may differ between two graphs equal up to
    float32 rounding (near-tied scores): such an output passes at cosine 0.9999, any other only
    within 2^-10 of its largest magnitude or onnxruntime's own absolute error."""
    from rkcompile.emulator.closeness import Agreement
    from rkcompile.onnx_export import _agrees, _selected
    nodes = [helper.make_node("Sigmoid", ["x"], ["scores"]),
             helper.make_node("TopK", ["scores", "k"], ["top", "indices"]),
             helper.make_node("Gather", ["boxes", "indices"], ["picked"]),
             helper.make_node("Add", ["picked", "x"], ["shifted"]),
             helper.make_node("Relu", ["x"], ["plain"])]
    graph = helper.make_graph(nodes, "g", [], [])
    assert _selected(graph) == {"top", "indices", "picked", "shifted"}
    swapped = Agreement("picked", cosine=0.99998, max_abs=0.7, max_rel=0.02)
    assert _agrees(swapped, 2 ** -10, computed_from_a_selection=True)
    assert not _agrees(swapped, 2 ** -10, computed_from_a_selection=False)
    assert not _agrees(Agreement("picked", 0.9990, 0.7, 0.02), 2 ** -10, computed_from_a_selection=True)
    # a sigmoid map of magnitude 1e-4 off by onnxruntime's own error (2.1e-7, 0.0015 of it)
    assert _agrees(Agreement("map", 0.99999, 2.09e-7, 0.00148), 2 ** -10, computed_from_a_selection=False)
    assert not _agrees(Agreement("map", 0.99999, 2e-6, 0.0148), 2 ** -10, computed_from_a_selection=False)


def test_an_lstm_gets_no_attribute_of_a_later_opset(save, tmp_path):
    """defaults_written writes the defaults a node leaves out, but not an LSTM's `layout` (opset
    14): rknn-toolkit2 2.5.0 rebuilds its LSTM as ONNX of an older opset and fails on it
    ("Unrecognized attribute: layout for operator LSTM", silero-vad)."""
    rng = np.random.default_rng(0)
    hidden, features = 8, 4
    nodes = [helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "h"], name="lstm", hidden_size=hidden)]
    model = make_model(nodes, [value_info("x", [5, 1, features])], [value_info("y", [5, 1, 1, hidden])],
                       [weight("w", rng.standard_normal((1, 4 * hidden, features)).astype(np.float32)),
                        weight("r", rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32)),
                        weight("b", rng.standard_normal((1, 8 * hidden)).astype(np.float32))], opset=16)
    written = rkcompile.export(save(model), tmp_path / "out.onnx", "rk3588")
    lstm, = [n for n in onnx.load(str(written.path)).graph.node if n.op_type == "LSTM"]
    written_attributes = {a.name for a in lstm.attribute}
    assert "layout" not in written_attributes
    assert {"direction", "hidden_size"} <= written_attributes   # the first version's defaults are written


def mobilevit_block(channels: int = 16, side: int = 8) -> onnx.ModelProto:
    """MobileViT's transformer block as timm exports it: the map unfolded into 2x2 patches
    (Reshape, Transpose, Reshape, Transpose, Reshape to [4, N, C] tokens), a LayerNorm, a
    Linear, SiLU, a Linear added back, and the tokens folded back into the map."""
    rng = np.random.default_rng(0)
    tokens = side * side // 4
    blocks = channels * side // 2

    def linear(name: str, size_in: int, size_out: int) -> list[onnx.TensorProto]:
        return [weight(f"{name}_w", rng.standard_normal((size_in, size_out)).astype(np.float32) * 0.2),
                weight(f"{name}_b", rng.standard_normal(size_out).astype(np.float32))]

    nodes = [helper.make_node("Reshape", ["x", "rows"], ["rows_of_patches"]),
             helper.make_node("Transpose", ["rows_of_patches"], ["patches"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["patches", "planes"], ["by_channel"]),
             helper.make_node("Transpose", ["by_channel"], ["by_pixel"], perm=[0, 3, 2, 1]),
             helper.make_node("Reshape", ["by_pixel", "sequences"], ["t"]),
             helper.make_node("LayerNormalization", ["t", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "fc1_w"], ["h0"]),
             helper.make_node("Add", ["h0", "fc1_b"], ["h1"]),
             helper.make_node("Sigmoid", ["h1"], ["gate"]),
             helper.make_node("Mul", ["h1", "gate"], ["h"]),
             helper.make_node("MatMul", ["h", "fc2_w"], ["o0"]),
             helper.make_node("Add", ["o0", "fc2_b"], ["o1"]),
             helper.make_node("Add", ["o1", "t"], ["u"]),
             helper.make_node("Reshape", ["u", "by_pixel_shape"], ["u_by_pixel"]),
             helper.make_node("Transpose", ["u_by_pixel"], ["u_by_channel"], perm=[0, 3, 2, 1]),
             helper.make_node("Reshape", ["u_by_channel", "patches_shape"], ["u_patches"]),
             helper.make_node("Transpose", ["u_patches"], ["u_rows"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["u_rows", "map"], ["y"])]
    return make_model(nodes, [value_info("x", [1, channels, side, side])], [value_info("y", [1, channels, side, side])],
                      [weight("rows", np.array([blocks, 2, side // 2, 2], np.int64)),
                       weight("planes", np.array([1, channels, tokens, 4], np.int64)),
                       weight("sequences", np.array([4, tokens, channels], np.int64)),
                       weight("gamma", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
                       weight("beta", rng.uniform(-0.5, 0.5, channels).astype(np.float32)),
                       *linear("fc1", channels, 2 * channels), *linear("fc2", 2 * channels, channels),
                       weight("by_pixel_shape", np.array([1, 4, tokens, channels], np.int64)),
                       weight("patches_shape", np.array([blocks, side // 2, 2, 2], np.int64)),
                       weight("map", np.array([1, channels, side, side], np.int64))])


def test_a_mobilevit_block_keeps_its_tokens_as_sequences(save, tmp_path):
    """The plan holds the tokens as rows [4*N, C, 1, 1], its Linears 1x1 Convs; the export
    writes them back as sequences [4, N, C] (rknn-toolkit2 2.5.0 runs the Reshapes of the
    patches into and out of the rows on its CPU) with the Linears as MatMuls, the same values
    up to rounding."""
    original = save(mobilevit_block())
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert written.report["toolkit_shapings"]["token_rows_as_sequences"] == 6
    ops = [n.op_type for n in exported.graph.node]
    assert ops.count("MatMul") == 2
    # the plan picks the fold's rows with a strided Conv, written with its planes as channels
    shapes = static_shapes(exported)
    assert all(shapes[n.output[0]][2:] == [1, 1] for n in exported.graph.node if n.op_type == "Conv")
    norm = next(n for n in exported.graph.node if n.op_type == "LayerNormalization")
    assert helper.get_attribute_value(next(a for a in norm.attribute if a.name == "axis")) == -1
    x = np.random.default_rng(1).uniform(-1, 1, (1, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_token_rows_written_to_an_output_stay_rows():
    """Rows of tokens normalized into a graph output keep the plan's form; the same rows
    Reshaped to the output are written as sequences."""
    def normalized_rows(reshaped: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["rows"], name="rows"),
                 helper.make_node("LayerNormalization", ["rows", "gamma"], ["normed" if reshaped else "y"],
                                  name="norm", axis=1),
                 *([helper.make_node("Reshape", ["normed", "back"], ["y"], name="back")] if reshaped else [])]
        output = value_info("y", [2, 8, 8] if reshaped else [16, 8, 1, 1])
        return make_model(nodes, [value_info("x", [2, 8, 8])], [output],
                          [weight("shape", np.array([16, 8, 1, 1], np.int64)),
                           weight("gamma", np.ones((8, 1, 1), np.float32)), weight("back", np.array([2, 8, 8]))])

    assert token_rows_as_sequences(normalized_rows(reshaped=False)) == 0
    assert token_rows_as_sequences(normalized_rows(reshaped=True)) == 1


def channel_norm_in_the_plans_form(centred_read_elsewhere: bool = False, opset: int = 18) -> onnx.ModelProto:
    """The plan's exNorm over the 8 channels of x [1, 8, 6, 1] written as standard nodes: x
    plus a 1x1 Conv of weights -1/8, the square, its mean by a Conv of weights 1/8, an Add of
    epsilon, Sqrt and the Div (gMLP's and DaViT's token norms), then a Relu; the centred values
    also a graph output where `centred_read_elsewhere`."""
    nodes = [helper.make_node("Conv", ["x", "negative_mean"], ["minus_mean"], name="mean", kernel_shape=[1, 1]),
             helper.make_node("Add", ["x", "minus_mean"], ["centred"], name="centre"),
             helper.make_node("Mul", ["centred", "centred"], ["square"], name="square"),
             helper.make_node("Conv", ["square", "mean_weight"], ["variance"], name="variance", kernel_shape=[1, 1]),
             helper.make_node("Add", ["variance", "epsilon"], ["shifted"], name="shift"),
             helper.make_node("Sqrt", ["shifted"], ["deviation"], name="deviation"),
             helper.make_node("Div", ["centred", "deviation"], ["normed"], name="normalize"),
             helper.make_node("Relu", ["normed"], ["y"], name="relu")]
    outputs = [value_info("y", [1, 8, 6, 1])]
    if centred_read_elsewhere:
        outputs.append(value_info("centred", [1, 8, 6, 1]))
    return make_model(nodes, [value_info("x", [1, 8, 6, 1])], outputs,
                      [weight("negative_mean", np.full((1, 8, 1, 1), -1 / 8, np.float32)),
                       weight("mean_weight", np.full((1, 8, 1, 1), 1 / 8, np.float32)),
                       weight("epsilon", np.array(1e-5, np.float32))], opset=opset)


def test_a_norm_over_the_channels_is_a_layer_norm_between_transposes():
    """rknn-toolkit2 2.5.0 runs the plan's form as seven layers and loops on gMLP's 61 of them;
    a Transpose to channels last, a LayerNormalization over the last axis and the Transpose back
    it makes one exNorm. The same values up to float32 rounding; a norm whose centred values
    another op reads stays."""
    model = channel_norm_in_the_plans_form()
    x = np.random.default_rng(0).standard_normal((1, 8, 6, 1)).astype(np.float32) * 3 + 1
    expected = onnxruntime_run(model, {"x": x})
    assert channel_norms_as_layer_norms(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Transpose", "LayerNormalization", "Transpose", "Relu"]
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    assert helper.get_attribute_value(next(a for a in norm.attribute if a.name == "epsilon")) == pytest.approx(1e-5)
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected[0], rtol=1e-5, atol=1e-5)
    assert channel_norms_as_layer_norms(channel_norm_in_the_plans_form(centred_read_elsewhere=True)) == 0


@pytest.mark.parametrize("opset", [13, 16])
def test_a_norm_over_the_channels_below_opset_17_is_torchs_norm_between_transposes(opset):
    """Without LayerNormalization, the norm between the Transposes is the nodes torch writes
    for one (rknn-toolkit2 2.5.0 makes them and the Transposes one exNorm too): the same
    values up to float32 rounding, checker-clean at the model's opset."""
    model = channel_norm_in_the_plans_form(opset=opset)
    x = np.random.default_rng(2).standard_normal((1, 8, 6, 1)).astype(np.float32) * 3 + 1
    expected = onnxruntime_run(model, {"x": x})
    assert channel_norms_as_layer_norms(model) == 1
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Transpose", "ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Transpose", "Relu"]
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected[0], rtol=1e-5, atol=1e-5)


def test_token_rows_gathered_and_reshaped_take_the_exits_sequences():
    """Rows normalized, then both picked by a Gather of rows and Reshaped to `[1, 2, 9, 8]`
    (MViTv2's pooled keys: the scores read the second, its relative positions the first): the
    norm runs on the sequences `[2, 9, 8]` the exit reads (so that Reshape only adds a unit
    axis), the Gather on the rows Reshaped back from them. The same values."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["x", "rows_shape"], ["rows"], name="rows"),
             helper.make_node("LayerNormalization", ["rows", "gamma", "beta"], ["normed"], name="norm", axis=1),
             helper.make_node("Reshape", ["normed", "heads_shape"], ["heads"], name="heads"),
             helper.make_node("Gather", ["normed", "order"], ["picked"], name="pick", axis=0),
             helper.make_node("Relu", ["heads"], ["y"], name="relu"),
             helper.make_node("Sigmoid", ["picked"], ["z"], name="sigmoid")]
    model = make_model(nodes, [value_info("x", [2, 3, 3, 8])],
                       [value_info("y", [1, 2, 9, 8]), value_info("z", [18, 8, 1, 1])],
                       [weight("rows_shape", np.array([18, 8, 1, 1], np.int64)),
                        weight("heads_shape", np.array([1, 2, 9, 8], np.int64)),
                        weight("gamma", rng.uniform(0.5, 1.5, (8, 1, 1)).astype(np.float32)),
                        weight("beta", rng.uniform(-0.5, 0.5, (8, 1, 1)).astype(np.float32)),
                        weight("order", rng.permutation(18).astype(np.int64))])
    x = rng.standard_normal((2, 3, 3, 8)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert token_rows_as_sequences(model) == 1
    onnx.checker.check_model(model, full_check=True)
    shapes = static_shapes(model)
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    assert shapes[norm.output[0]] == [2, 9, 8]
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    assert shapes[gather.input[0]] == [18, 8, 1, 1]
    for got, wanted in zip(onnxruntime_run(model, {"x": x}), expected):
        np.testing.assert_allclose(got, wanted, rtol=1e-5, atol=1e-6)


def test_token_rows_take_only_an_exit_of_their_own_channels_as_sequences():
    """Rows of 8 channels normalized, then a Linear into 16 split into two heads of 8,
    [1, 18, 2, 8]: that exit's last axis matches the entry's channels but not its own rows'
    (16), so the sequences come from the entry's source [2, 9, 8] (ALBERT's heads, whose
    exit once set [9, 2, 8] and broke the graph). The same values."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Reshape", ["x", "rows_shape"], ["rows"], name="rows"),
             helper.make_node("LayerNormalization", ["rows", "gamma"], ["normed"], name="norm", axis=1),
             helper.make_node("Conv", ["normed", "w"], ["wide"], name="linear"),
             helper.make_node("Reshape", ["wide", "heads_shape"], ["y"], name="heads")]
    model = make_model(nodes, [value_info("x", [2, 9, 8])], [value_info("y", [1, 18, 2, 8])],
                       [weight("rows_shape", np.array([18, 8, 1, 1], np.int64)),
                        weight("heads_shape", np.array([1, 18, 2, 8], np.int64)),
                        weight("gamma", rng.uniform(0.5, 1.5, (8, 1, 1)).astype(np.float32)),
                        weight("w", rng.standard_normal((16, 8, 1, 1)).astype(np.float32))])
    x = rng.standard_normal((2, 9, 8)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert token_rows_as_sequences(model) == 2
    onnx.checker.check_model(model, full_check=True)
    norm = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    assert static_shapes(model)[norm.output[0]] == [2, 9, 8]
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected[0], rtol=1e-5, atol=1e-5)


def cross_covariance_rows(heads_shape, result_shape, tokens: int = 12, scale=2.0) -> onnx.ModelProto:
    """XCiT's q and k as the plan holds them: token rows [tokens, 16, 1, 1] transposed into
    channel rows [16, tokens, 1, 1], split into q and k, q L2-normalized over the tokens and
    multiplied by `scale`, each Reshaped to `heads_shape` (`result_shape` once its 0 and -1
    are resolved)."""
    nodes = [helper.make_node("Transpose", ["x"], ["channels"], name="transpose", perm=[1, 0, 2, 3]),
             helper.make_node("Split", ["channels", "halves"], ["q", "k"], name="split", axis=0),
             helper.make_node("Mul", ["q", "q"], ["squares"], name="square"),
             helper.make_node("ReduceSum", ["squares", "tokens"], ["sums"], name="sum", keepdims=1),
             helper.make_node("Add", ["sums", "eps"], ["shifted"], name="eps"),
             helper.make_node("Sqrt", ["shifted"], ["norms"], name="sqrt"),
             helper.make_node("Div", ["q", "norms"], ["unit"], name="normalize"),
             helper.make_node("Mul", ["unit", "scale"], ["scaled"], name="scale"),
             helper.make_node("Reshape", ["scaled", "heads"], ["y_q"], name="q_heads"),
             helper.make_node("Reshape", ["k", "heads"], ["y_k"], name="k_heads")]
    return make_model(nodes, [value_info("x", [tokens, 16, 1, 1])],
                      [value_info("y_q", result_shape), value_info("y_k", result_shape)],
                      [weight("halves", np.array([8, 8], np.int64)), weight("tokens", np.array([1], np.int64)),
                       weight("eps", np.array(1e-6, np.float32)),
                       weight("scale", np.asarray(scale, np.float32)),
                       weight("heads", np.array(heads_shape, np.int64))])


def test_channel_rows_are_relabelled_one_plane():
    """The channel rows [16, 12, 1, 1] and all the ops computing from them are relabelled
    [1, 16, 1, 12] (rknn-toolkit2 2.5.0 runs the Reshapes of [C, T, 1, 1] into heads on its
    CPU when T is not a multiple of 8: 36 layers on XCiT-nano): the Transpose moves the tokens
    to the width, the Split cuts the channels, the sum runs over the width, the Reshapes stay,
    and the values are the same."""
    model = cross_covariance_rows([1, 2, 4, 12], [1, 2, 4, 12])
    x = np.random.default_rng(3).standard_normal((12, 16, 1, 1)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert transposed_rows_as_planes(model) == 1
    nodes = {n.name: n for n in model.graph.node}
    assert helper.get_attribute_value(nodes["transpose"].attribute[0]) == [2, 1, 3, 0]
    assert helper.get_attribute_value(nodes["split"].attribute[0]) == 1
    shapes = static_shapes(model)
    assert shapes["channels"] == [1, 16, 1, 12] and shapes["sums"] == [1, 8, 1, 1] and shapes["scaled"] == [1, 8, 1, 12]
    for got, want in zip(onnxruntime_run(model, {"x": x}), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("tokens, heads_shape, result_shape, scale", [
    # whole blocks of tokens: the toolkit keeps the rows' Reshapes on its NPU
    (16, [1, 2, 4, 16], [1, 2, 4, 16], 2.0),
    # a 0 in a Reshape's shape copies an axis, which the relabelling changes
    (12, [0, -1, 1, 1], [8, 12, 1, 1], 2.0),
    # a scale per row: written anew, an int8 export would not find it among the plan's constants
    (12, [1, 2, 4, 12], [1, 2, 4, 12], np.linspace(0.5, 2.0, 8).reshape(8, 1, 1, 1)),
])
def test_channel_rows_stay_rows(tokens, heads_shape, result_shape, scale):
    """Channel rows of a whole number of 8-token blocks, read by a Reshape whose shape copies
    an axis, or scaled by a constant of several values stay as they are."""
    model = cross_covariance_rows(heads_shape, result_shape, tokens, scale)
    onnx.checker.check_model(model, full_check=True)
    assert transposed_rows_as_planes(model) == 0


@pytest.mark.parametrize("read_as, written", [([1, 6, 4, 4], True), ([24, 4, 1, 1], False)])
def test_a_transpose_done_as_a_split_is_written_back_unless_it_makes_rows(read_as, written):
    """Split [6, 2, 4, 2] into its 2 unit pieces along axis 1, each Reshaped to [6, 4, 1, 2],
    joined along axis 2: the Transpose (0, 2, 1, 3), the same values; kept as the Split where
    a Reshape into rows [R, C, 1, 1] reads it (rknn-toolkit2 2.5.0 runs that Transpose, Swin's
    window partition, on its CPU)."""
    nodes = [helper.make_node("Split", ["x"], ["p0", "p1"], name="split", axis=1),
             helper.make_node("Reshape", ["p0", "piece"], ["r0"], name="r0"),
             helper.make_node("Reshape", ["p1", "piece"], ["r1"], name="r1"),
             helper.make_node("Concat", ["r0", "r1"], ["moved"], name="concat", axis=2),
             helper.make_node("Reshape", ["moved", "read_as"], ["y"], name="read")]
    model = make_model(nodes, [value_info("x", [6, 2, 4, 2])], [value_info("y", read_as)],
                       [weight("piece", np.array([6, 4, 1, 2], np.int64)), weight("read_as", np.array(read_as))])
    x = np.random.default_rng(0).standard_normal((6, 2, 4, 2)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert transposes_from_splits(model) == int(written)
    ops = [(n.op_type, list(n.attribute[0].ints) if n.op_type == "Transpose" else None) for n in model.graph.node]
    assert ops == ([("Transpose", [0, 2, 1, 3]), ("Reshape", None)] if written
                   else [("Split", None), ("Reshape", None), ("Reshape", None), ("Concat", None), ("Reshape", None)])
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_a_transpose_done_as_a_split_before_a_gather_stays_a_split():
    """The same Transpose, its result Reshaped to [1, 6, 4, 4] and then rolled by a Gather (Swin's
    window reverse before a shifted window): rknn-toolkit2 2.5.0 moves the Reshape past the
    Gather into rows and runs the Transpose on its CPU, so the Split form stays."""
    nodes = [helper.make_node("Split", ["x"], ["p0", "p1"], name="split", axis=1),
             helper.make_node("Reshape", ["p0", "piece"], ["r0"], name="r0"),
             helper.make_node("Reshape", ["p1", "piece"], ["r1"], name="r1"),
             helper.make_node("Concat", ["r0", "r1"], ["moved"], name="concat", axis=2),
             helper.make_node("Reshape", ["moved", "map"], ["m"], name="read"),
             helper.make_node("Gather", ["m", "rolled"], ["y"], name="roll", axis=2)]
    model = make_model(nodes, [value_info("x", [6, 2, 4, 2])], [value_info("y", [1, 6, 4, 4])],
                       [weight("piece", np.array([6, 4, 1, 2], np.int64)), weight("map", np.array([1, 6, 4, 4])),
                        weight("rolled", np.array([1, 2, 3, 0], np.int64))])
    assert transposes_from_splits(model) == 0
    assert "Transpose" not in [n.op_type for n in model.graph.node]


def patch_unfold_in_steps(second_perm: list[int]) -> onnx.ModelProto:
    """MobileViTv2's unfold of [1, 8, 8, 8] into 2x2 patches, [1, 8, 4, 16], in the plan's two
    4-D steps ([32, 2, 4, 2] -> [32, 4, 2, 2], then [8, 16, 1, 4] moved by `second_perm`), read
    by a Sigmoid and, flattened, by a Relu."""
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["r0"], name="r0"),
             helper.make_node("Transpose", ["r0"], ["t0"], name="t0", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t0", "patches"], ["r1"], name="r1"),
             helper.make_node("Transpose", ["r1"], ["t1"], name="t1", perm=second_perm),
             helper.make_node("Sigmoid", ["t1"], ["y"], name="sigmoid"),
             helper.make_node("Reshape", ["t1", "flat"], ["f"], name="flatten"),
             helper.make_node("Relu", ["f"], ["z"], name="relu")]
    moved = [[8, 16, 1, 4][axis] for axis in second_perm]
    return make_model(nodes, [value_info("x", [1, 8, 8, 8])],
                      [value_info("y", moved), value_info("z", [1, 512, 1, 1])],
                      [weight("rows", np.array([32, 2, 4, 2])), weight("patches", np.array([8, 16, 1, 4])),
                       weight("flat", np.array([1, 512, 1, 1]))])


def test_the_steps_of_a_patch_unfold_are_written_as_its_one_transpose():
    """The two steps become the exporters' rank-6 form, Reshape [1, 8, 4, 2, 4, 2], Transpose
    (0, 1, 3, 5, 2, 4), Reshape [1, 8, 4, 16] (rknn-toolkit2 2.5.0 runs some of the steps'
    Reshapes on its CPU); the flattened tensor, the same elements in the same order, is a
    Reshape of it. The same values."""
    model = patch_unfold_in_steps([2, 0, 3, 1])
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 8)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert transpose_steps_as_one(model) == 2
    onnx.checker.check_model(model, full_check=True)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert [list(n.attribute[0].ints) for n in transposes] == [[0, 1, 3, 5, 2, 4]]
    assert [n.op_type for n in model.graph.node] == ["Reshape", "Transpose", "Reshape", "Sigmoid", "Reshape", "Relu"]
    for got, wanted in zip(onnxruntime_run(model, {"x": x}), expected):
        np.testing.assert_array_equal(got, wanted)


def test_steps_that_no_one_transpose_makes_stay():
    """A second step that moves the unit axis of [8, 16, 1, 4] differently still makes one
    Transpose; steps whose order no Transpose gives (a Reshape that cuts a moved axis apart
    and moves its pieces) stay as they are."""
    assert transpose_steps_as_one(patch_unfold_in_steps([2, 0, 1, 3])) == 2
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 1, 3, 2]),
             helper.make_node("Reshape", ["t0", "cut"], ["r0"], name="r0"),
             helper.make_node("Transpose", ["r0"], ["y"], name="t1", perm=[0, 1, 3, 2])]
    model = make_model(nodes, [value_info("x", [1, 1, 4, 6])], [value_info("y", [1, 4, 3, 2])],
                       [weight("cut", np.array([1, 4, 2, 3]))])
    assert transpose_steps_as_one(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Reshape", "Transpose"]


def test_a_map_moved_into_rows_through_a_grouping_is_its_own_transpose():
    """The plan's move of a map [2, 8, 3, 3] into token rows [18, 8, 1, 1] through its 4-D
    layout ([2, 2, 4, 9], a Transpose to [2, 9, 2, 4], a Reshape) is the Transpose of the map's
    own axes and one Reshape (rknn-toolkit2 2.5.0 runs the grouped form's last Reshape on its
    CPU); a run of one Transpose that no fewer nodes write stays. The same values."""
    nodes = [helper.make_node("Reshape", ["x", "grouped_shape"], ["grouped"], name="group"),
             helper.make_node("Transpose", ["grouped"], ["moved"], name="move", perm=[0, 3, 1, 2]),
             helper.make_node("Reshape", ["moved", "rows_shape"], ["rows"], name="rows"),
             helper.make_node("Relu", ["rows"], ["y"], name="relu")]
    model = make_model(nodes, [value_info("x", [2, 8, 3, 3])], [value_info("y", [18, 8, 1, 1])],
                       [weight("grouped_shape", np.array([2, 2, 4, 9], np.int64)),
                        weight("rows_shape", np.array([18, 8, 1, 1], np.int64))])
    x = np.random.default_rng(0).standard_normal((2, 8, 3, 3)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert one_transpose_runs_shortened(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Reshape", "Relu"]
    assert list(next(n for n in model.graph.node if n.op_type == "Transpose").attribute[0].ints) == [0, 2, 3, 1]
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected[0])
    # a window partition's rank-6 form needs its grouping: nothing shorter
    nodes = [helper.make_node("Reshape", ["x", "windows_shape"], ["windows"], name="group"),
             helper.make_node("Transpose", ["windows"], ["moved"], name="move", perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["moved", "flat_shape"], ["y"], name="flat")]
    model = make_model(nodes, [value_info("x", [1, 4, 6, 6])], [value_info("y", [1, 4, 36])],
                       [weight("windows_shape", np.array([1, 4, 2, 3, 2, 3], np.int64)),
                        weight("flat_shape", np.array([1, 4, 36], np.int64))])
    assert one_transpose_runs_shortened(model) == 0


def test_a_window_reverse_from_windows_as_images_keeps_its_steps():
    """The plan's steps of a window reverse, [4, 8, 3, 3] (the 2x2 windows as images) into
    [1, 8, 6, 6]: one Transpose would need 5 axes and no unit batch axis, which rknn-toolkit2
    2.5.0 runs on its CPU with both its Reshapes; the 4-D steps, on its NPU, stay."""
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 3, 1, 2]),
             helper.make_node("Reshape", ["t0", "rows"], ["r0"], name="r0"),
             helper.make_node("Transpose", ["r0"], ["t1"], name="t1", perm=[2, 0, 3, 1]),
             helper.make_node("Reshape", ["t1", "map"], ["y"], name="r1")]
    model = make_model(nodes, [value_info("x", [4, 8, 3, 3])], [value_info("y", [1, 8, 6, 6])],
                       [weight("rows", np.array([2, 6, 8, 3])), weight("map", np.array([1, 8, 6, 6]))])
    assert transpose_steps_as_one(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Reshape", "Transpose", "Reshape"]


def test_a_window_reverse_with_a_wide_step_is_written_as_block_swaps():
    """NesT's window reverse, tokens [3136, 96] (4x4 windows of 14x14) into the map
    [1, 96, 56, 56], in the plan's steps: [4, 4, 2, 9408] -> [4, 2, 9408, 4] is over the 8192
    elements rknn-toolkit2 2.5.0 runs a Transpose's axis on its NPU. It becomes two swaps of
    neighbouring blocks, Transposes (0, 2, 1, 3) with every axis within the limit. The same
    values."""
    nodes = [helper.make_node("Relu", ["x"], ["tokens"], name="relu_in"),
             helper.make_node("Reshape", ["tokens", "grouped_shape"], ["grouped"], name="group"),
             helper.make_node("Transpose", ["grouped"], ["moved"], name="move", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["moved", "rows_shape"], ["rows"], name="rows"),
             helper.make_node("Transpose", ["rows"], ["planes"], name="move_again", perm=[2, 0, 3, 1]),
             helper.make_node("Reshape", ["planes", "map_shape"], ["map"], name="map"),
             helper.make_node("Relu", ["map"], ["y"], name="relu_out")]
    model = make_model(nodes, [value_info("x", [3136, 96, 1, 1])], [value_info("y", [1, 96, 56, 56])],
                       [weight("grouped_shape", np.array([4, 4, 2, 9408], np.int64)),
                        weight("rows_shape", np.array([56, 14, 96, 4], np.int64)),
                        weight("map_shape", np.array([1, 96, 56, 56], np.int64))])
    x = np.random.default_rng(0).standard_normal((3136, 96, 1, 1)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert wide_transposes_as_block_swaps(model) == 1
    onnx.checker.check_model(model, full_check=True)
    shapes = static_shapes(model)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert len(transposes) == 2
    for transpose in transposes:
        assert list(transpose.attribute[0].ints) == [0, 2, 1, 3]
        assert max(shapes[transpose.input[0]]) <= TOOLKIT_TRANSPOSE_EXTENT
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected[0])


def test_a_wide_transpose_of_one_long_axis_stays():
    """[1, 2, 4, 9408] -> [1, 2, 9408, 4]: every swap moves the 9408 elements of one axis as a
    block, over the limit, so the Transpose stays; one within the limit is left alone."""
    for shape in ([1, 2, 4, 9408], [1, 2, 4, 8192]):
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_in"),
                 helper.make_node("Transpose", ["a"], ["b"], name="move", perm=[0, 1, 3, 2]),
                 helper.make_node("Relu", ["b"], ["y"], name="relu_out")]
        model = make_model(nodes, [value_info("x", shape)], [value_info("y", [1, 2, shape[3], 4])], [])
        assert wide_transposes_as_block_swaps(model) == 0
        assert [n.op_type for n in model.graph.node] == ["Relu", "Transpose", "Relu"]


def test_a_transpose_of_an_expand_moves_before_it():
    """BoTNet's relative position logits: a rank-5 Transpose of an Expand along a unit axis
    (rknn-toolkit2 2.5.0 stops its build on it) becomes the Transpose of the source and the
    Expand to the permuted shape. An Expand another node reads too stays. The same values."""
    def expanded(extra_reader: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Expand", ["x", "shape"], ["wide"], name="expand"),
                 helper.make_node("Transpose", ["wide"], ["moved"], name="move", perm=[0, 3, 1, 4, 2]),
                 helper.make_node("Relu", ["moved"], ["y"], name="relu")]
        outputs = [value_info("y", [2, 4, 3, 5, 4])]
        if extra_reader:
            nodes.append(helper.make_node("Sigmoid", ["wide"], ["z"], name="sigmoid"))
            outputs.append(value_info("z", [2, 3, 4, 4, 5]))
        return make_model(nodes, [value_info("x", [2, 3, 1, 4, 5])], outputs,
                          [weight("shape", np.array([2, 3, 4, 4, 5], np.int64))])

    model = expanded(False)
    x = np.random.default_rng(0).standard_normal((2, 3, 1, 4, 5)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert transposes_before_expands(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Expand", "Relu"]
    assert static_shapes(model)[model.graph.node[0].output[0]] == [2, 4, 3, 5, 1]
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected[0])
    model = expanded(True)
    assert transposes_before_expands(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Expand", "Transpose", "Relu", "Sigmoid"]


def test_two_linear_heads_added_are_one_gemm_of_their_inputs_joined():
    """LeViT's class and distillation heads: two Gemms of different inputs added (rknn-toolkit2
    2.5.0 fails summing them as Convs) become a Concat of the inputs along K and one Gemm of the
    weights joined alike, its bias their sum. Gemms of one input, or one read elsewhere too,
    stay. The same values up to float32 rounding."""
    rng = np.random.default_rng(0)

    def heads(same_input: bool, extra_reader: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Sigmoid", ["x"], ["b"], name="b"),
                 helper.make_node("Gemm", ["a", "w1", "b1"], ["h1"], name="head", transB=1),
                 helper.make_node("Gemm", ["a" if same_input else "b", "w2", "b2"], ["h2"], name="head_dist",
                                  transB=1),
                 helper.make_node("Add", ["h1", "h2"], ["y"], name="add")]
        outputs = [value_info("y", [1, 10])]
        if extra_reader:
            nodes.append(helper.make_node("Relu", ["h2"], ["z"], name="z"))
            outputs.append(value_info("z", [1, 10]))
        return make_model(nodes, [value_info("x", [1, 16])], outputs,
                          [weight(name, rng.standard_normal(shape).astype(np.float32))
                           for name, shape in (("w1", (10, 16)), ("b1", (10,)), ("w2", (10, 16)), ("b2", (10,)))])

    model = heads(False, False)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})
    assert added_linears_as_one(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Sigmoid", "Concat", "Gemm"]
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected[0], rtol=1e-5, atol=1e-5)
    for same_input, extra_reader in ((True, False), (False, True)):
        model = heads(same_input, extra_reader)
        assert added_linears_as_one(model) == 0
        assert [n.op_type for n in model.graph.node].count("Gemm") == 2
    # one head of a single output broadcast over the other's ten: no joined Gemm makes that
    model = heads(False, False)
    for tensor in model.graph.initializer:
        if tensor.name in ("w2", "b2"):
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor)[:1], tensor.name))
    assert added_linears_as_one(model) == 0


def window_partition_in_two_transposes(into_rows: bool) -> onnx.ModelProto:
    """The plan's two legal steps of a Swin window partition whose one Transpose its perm table
    refuses, [4, 7, 4, 64] by (0, 2, 1, 3) (h1 = 4), read by a Reshape into token rows
    [112, 64, 1, 1] (`into_rows`) or by a Relu."""
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 3, 1, 2]),
             helper.make_node("Transpose", ["t0"], ["w"], name="t1", perm=[0, 3, 2, 1])]
    if into_rows:
        nodes.append(helper.make_node("Reshape", ["w", "rows"], ["y"], name="rows"))
    else:
        nodes.append(helper.make_node("Relu", ["w"], ["y"], name="relu"))
    output = value_info("y", [112, 64, 1, 1] if into_rows else [4, 4, 7, 64])
    return make_model(nodes, [value_info("x", [4, 7, 4, 64])], [output],
                      [weight("rows", np.array([112, 64, 1, 1]))] if into_rows else [])


@pytest.mark.parametrize("into_rows", [True, False])
def test_two_transposes_moving_one_axis_take_the_split_form(into_rows):
    """The pair becomes a Split of the 4 windows, a Reshape of each and a Concat (rknn-toolkit2
    2.5.0 merges the pair into the refused Transpose and runs it on its CPU); read by rows the
    Split form stays, as transposes_from_splits keeps it there, else it becomes one Transpose.
    The same values."""
    model = window_partition_in_two_transposes(into_rows)
    x = np.random.default_rng(2).standard_normal((4, 7, 4, 64)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert transpose_pairs_as_splits(model) == 1
    assert transposes_from_splits(model) == (0 if into_rows else 1)
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops == (["Split"] + ["Reshape"] * 4 + ["Concat", "Reshape"] if into_rows else ["Transpose", "Relu"])
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_three_transposes_in_a_row_write_one_pair():
    """Of T0 -> T1 -> T2, the pair T0, T1 takes the Split form and T2 stays to read it: the
    same values, no node reading a tensor the rewrite removed."""
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["t0"], ["t1"], name="t1", perm=[0, 1, 3, 2]),
             helper.make_node("Transpose", ["t1"], ["y"], name="t2", perm=[0, 2, 1, 3])]
    model = make_model(nodes, [value_info("x", [2, 3, 4, 5])], [value_info("y", [2, 5, 4, 3])])
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 5)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert transpose_pairs_as_splits(model) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node].count("Transpose") == 1
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_two_transposes_moving_two_axes_stay():
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 3, 1, 2]),
             helper.make_node("Transpose", ["t0"], ["y"], name="t1", perm=[1, 0, 3, 2])]
    model = make_model(nodes, [value_info("x", [2, 3, 4, 5])], [value_info("y", [5, 2, 4, 3])])
    assert transpose_pairs_as_splits(model) == 0


def patch_fold(padded: bool = False, other_reader: bool = False) -> onnx.ModelProto:
    """MobileViT's fold of 2x2 patches as the plan writes it: a strided Conv picking rows
    ([40, 8, 2, 2] -> [40, 16, 1, 2]) reshaped into the [1, 80, 4, 4] map a 1x1 Conv reads;
    `padded` pads the pick, `other_reader` has a Relu read it too."""
    rng = np.random.default_rng(3)
    pick = helper.make_node("Conv", ["x", "pick", "pick_bias"], ["rows"], name="pick", kernel_shape=[2, 1],
                            strides=[2, 1], **({"pads": [1, 0, 1, 0]} if padded else {}))
    rows = [40, 16, 2, 2] if padded else [40, 16, 1, 2]
    nodes = [pick, helper.make_node("Reshape", ["rows", "map"], ["m"], name="fold"),
             helper.make_node("Conv", ["m", "mix"], ["y"], name="mix")]
    outputs = [value_info("y", [1, 8, 4, 8] if padded else [1, 8, 4, 4])]
    if other_reader:
        nodes.append(helper.make_node("Relu", ["rows"], ["z"], name="relu"))
        outputs.append(value_info("z", rows))
    return make_model(nodes, [value_info("x", [40, 8, 2, 2])], outputs,
                      [weight("pick", rng.standard_normal((16, 8, 2, 1)).astype(np.float32)),
                       weight("pick_bias", rng.standard_normal(16).astype(np.float32)),
                       weight("map", np.array([1, 80, 4, 8] if padded else [1, 80, 4, 4])),
                       weight("mix", rng.standard_normal((8, 80, 1, 1)).astype(np.float32))])


def test_a_conv_into_a_small_plane_writes_its_positions_as_channels():
    """The pick reads its input's 4 positions as 32 channels and writes its 2 positions as 32
    channels, a 1x1 Conv; the fold's Reshape then reads a plane of one position, which
    rknn-toolkit2 2.5.0 reshapes on its NPU (from [40, 16, 1, 2] on its CPU). The same values."""
    model = patch_fold()
    x = np.random.default_rng(4).standard_normal((40, 8, 2, 2)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert small_planes_into_channels(model) == 1
    onnx.checker.check_model(model, full_check=True)
    shapes = static_shapes(model)
    pick = next(n for n in model.graph.node if n.op_type == "Conv" and n.input[0] != "m")
    assert shapes[pick.input[0]] == [40, 32, 1, 1] and shapes[pick.output[0]] == [40, 32, 1, 1]
    np.testing.assert_allclose(onnxruntime_run(model, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("source, result, on_its_cpu", [
    ([640, 16, 1, 2], [1, 80, 16, 16], True),     # probed: a plane of 2 into one of 256
    ([1, 96, 16, 4], [384, 4, 2, 2], True),       # MobileViT-XXS's unfold: 64 positions into planes of 4
    ([640, 32, 1, 1], [1, 80, 16, 16], False),    # probed: from a plane of one position
    ([960, 7, 1, 7], [1, 960, 7, 7], False),      # probed: the batch into the channels, a Transpose
    ([2880, 7, 1, 1], [960, 3, 1, 7], False),     # GhostNetV2's resize: planes of 1 and 7, on its NPU
])
def test_the_reshapes_the_toolkit_runs_on_its_cpu(source, result, on_its_cpu):
    assert _reshaped_on_the_toolkit_cpu(source, result) is on_its_cpu


@pytest.mark.parametrize("padded, other_reader", [(True, False), (False, True)])
def test_a_conv_with_padding_or_another_reader_keeps_its_plane(padded, other_reader):
    model = patch_fold(padded, other_reader)
    assert small_planes_into_channels(model) == 0


def test_steps_that_undo_each_other_are_one_reshape():
    nodes = [helper.make_node("Transpose", ["x"], ["t0"], name="t0", perm=[0, 1, 3, 2]),
             helper.make_node("Reshape", ["t0", "view"], ["r0"], name="r0"),
             helper.make_node("Transpose", ["r0"], ["y"], name="t1", perm=[3, 0, 2, 1])]
    model = make_model(nodes, [value_info("x", [1, 2, 3, 4])], [value_info("y", [1, 2, 3, 4])],
                       [weight("view", np.array([2, 4, 3, 1]))])
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert transpose_steps_as_one(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Reshape"]
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], x)


def class_heads(levels=((2, 2), (1, 1)), anchors: int = 3, classes: int = 5) -> onnx.ModelProto:
    """An SSD's class heads as the export writes them: per level the head's [1, A*K, H, W] (here a
    Relu of the input) moved to [1, H, W, A*K] and Reshaped to [1, H*W*A, 1, K], the levels
    joined along axis 1, a Softmax over the classes, the output."""
    nodes, inputs, inits, parts = [], [], [], []
    for level, (height, width) in enumerate(levels):
        rows = height * width * anchors
        inputs.append(value_info(f"x{level}", [1, anchors * classes, height, width]))
        inits.append(weight(f"rows{level}", np.array([1, rows, 1, classes])))
        nodes += [helper.make_node("Relu", [f"x{level}"], [f"h{level}"], name=f"head{level}"),
                  helper.make_node("Transpose", [f"h{level}"], [f"t{level}"], name=f"t{level}", perm=[0, 2, 3, 1]),
                  helper.make_node("Reshape", [f"t{level}", f"rows{level}"], [f"r{level}"], name=f"r{level}")]
        parts.append((f"r{level}", rows))
    nodes += [helper.make_node("Concat", [name for name, _ in parts], ["joined"], name="join", axis=1),
              helper.make_node("Softmax", ["joined"], ["y"], name="softmax", axis=3)]
    total = sum(rows for _, rows in parts)
    return make_model(nodes, inputs, [value_info("y", [1, total, 1, classes])], inits)


def test_a_softmax_after_joined_class_heads_goes_before_their_moves():
    """Each level's Softmax runs on [A, K, H, W] over its channels (rknn-toolkit2 2.5.0: on its
    NPU), then the moves and the Concat, which end the output (the host tail takes them:
    tv_ssdlite320_mobilenet_v3_large's six Reshapes the toolkit ran on its CPU). The same
    values."""
    model = class_heads()
    rng = np.random.default_rng(0)
    feeds = {"x0": rng.standard_normal((1, 15, 2, 2)).astype(np.float32),
             "x1": rng.standard_normal((1, 15, 1, 1)).astype(np.float32)}
    expected = onnxruntime_run(model, feeds)[0]
    assert softmaxes_before_layout_runs(model) == 1
    onnx.checker.check_model(model, full_check=True)
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert [helper.get_attribute_value(n.attribute[0]) for n in softmaxes] == [1, 1]
    made_by = {n.output[0]: n for n in model.graph.node}
    assert made_by["y"].op_type == "Concat"
    shapes = static_shapes(model)
    assert [shapes[n.input[0]] for n in softmaxes] == [[3, 5, 2, 2], [3, 5, 1, 1]]
    np.testing.assert_allclose(onnxruntime_run(model, feeds)[0], expected, rtol=1e-6, atol=1e-7)


def test_a_softmax_whose_rows_no_view_holds_stays():
    """Rows of 6 of a head's 15 channels a pixel: a row crosses from one pixel into the next, so
    no view of the head holds it on one axis, and nothing changes."""
    model = class_heads(levels=((2, 2),))
    model.graph.initializer[0].CopyFrom(weight("rows0", np.array([1, 10, 1, 6])))
    del model.graph.output[:]
    model.graph.output.append(value_info("y", [1, 10, 1, 6]))
    before = [n.op_type for n in model.graph.node]
    assert softmaxes_before_layout_runs(model) == 0
    assert [n.op_type for n in model.graph.node] == before


def attention_in_steps(k_reader: str = "MatMul") -> onnx.ModelProto:
    """torchvision ViT's attention as the plan's 4-D steps write it (tv_vit_tiny's export): the
    projection's [T, 3 * H * D, 1, 1] rows (T = 5 tokens, H = 2 heads, D = 4) Reshaped to
    [5, 3, 2, 4], moved (1, 0, 2, 3) and split into q, k, v, each then moved on its own into
    [1, H, T, D] (k into [1, H, D, T], scaled), the two products and a Softmax between them.
    `k_reader`, when not "MatMul", reads the scaled k before the first MatMul does."""
    nodes = [helper.make_node("Reshape", ["x", "cut"], ["r"], name="r"),
             helper.make_node("Transpose", ["r"], ["t"], name="t", perm=[1, 0, 2, 3]),
             helper.make_node("Split", ["t", "thirds"], ["q0", "k0", "v0"], name="split", axis=0),
             helper.make_node("Reshape", ["q0", "heads"], ["q1"], name="q1"),
             helper.make_node("Transpose", ["q1"], ["q"], name="q", perm=[2, 1, 0, 3]),
             helper.make_node("Reshape", ["k0", "flat"], ["k1"], name="k1"),
             helper.make_node("Transpose", ["k1"], ["k2"], name="k2", perm=[0, 3, 1, 2]),
             helper.make_node("Reshape", ["k2", "keys"], ["k"], name="k"),
             helper.make_node("Mul", ["k", "scale"], ["ks"], name="scale"),
             helper.make_node("Reshape", ["v0", "heads"], ["v1"], name="v1"),
             helper.make_node("Transpose", ["v1"], ["v"], name="v", perm=[2, 1, 0, 3]),
             *([] if k_reader == "MatMul" else [helper.make_node(k_reader, ["ks"], ["kr"], name="k_reader")]),
             helper.make_node("MatMul", ["q", "ks" if k_reader == "MatMul" else "kr"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="mix")]
    return make_model(nodes, [value_info("x", [5, 24, 1, 1])], [value_info("y", [1, 2, 5, 4])],
                      [weight("cut", np.array([5, 3, 2, 4])), weight("thirds", np.array([1, 1, 1])),
                       weight("heads", np.array([5, 2, 1, 4])), weight("flat", np.array([1, 5, 1, 8])),
                       weight("keys", np.array([1, 2, 4, 5])), weight("scale", np.array(0.5, np.float32))])


def test_an_attentions_operands_from_one_projection_are_one_transpose_and_a_split():
    """q, k and v become Reshape [5, 3, 2, 4], Transpose (1, 2, 0, 3) and the Split of the result
    along its first axis, k then transposed (0, 1, 3, 2): the form rknn-toolkit2 2.5.0 fuses
    into exSDPAttention with no layers around it (tv_vit_tiny: 49 layers, from the steps 77).
    The same values."""
    model = attention_in_steps()
    x = np.random.default_rng(0).standard_normal((5, 24, 1, 1)).astype(np.float32)
    expected = onnxruntime_run(model, {"x": x})[0]
    assert attention_operands_in_one_transpose(model) == 1
    onnx.checker.check_model(model, full_check=True)
    moves = [(n.op_type, list(n.attribute[0].ints) if n.op_type == "Transpose" else None)
             for n in model.graph.node if n.op_type in ("Reshape", "Transpose", "Split")]
    assert moves == [("Reshape", None), ("Transpose", [1, 2, 0, 3]), ("Split", None), ("Transpose", [0, 1, 3, 2])]
    np.testing.assert_array_equal(onnxruntime_run(model, {"x": x})[0], expected)


def test_operands_read_by_more_than_products_stay():
    """Where a part's steps lead to an op other than the products (here a Sigmoid reads k),
    nothing changes."""
    model = attention_in_steps(k_reader="Sigmoid")
    before = [n.op_type for n in model.graph.node]
    assert attention_operands_in_one_transpose(model) == 0
    assert [n.op_type for n in model.graph.node] == before


def patch_block(opset: int = 14) -> onnx.ModelProto:
    """MobileViTv2's patch block on [1, 8, 8, 8]: a 1x1 Conv, the unfold into 2x2 patches
    ([1, 8, 4, 16]), a GroupNorm of one group (Reshape [1, 1, 512], InstanceNormalization,
    Reshape back) whose per-channel scale the plan folds into the next Conv, the fold back to
    [1, 8, 8, 8] and that Conv."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "blocks"], ["b"], name="blocks"),
             helper.make_node("Transpose", ["b"], ["t"], name="unfold", perm=[0, 1, 3, 5, 2, 4]),
             helper.make_node("Reshape", ["t", "patches"], ["p"], name="patches"),
             helper.make_node("Reshape", ["p", "one_group"], ["g"], name="group"),
             helper.make_node("InstanceNormalization", ["g", "one", "zero"], ["n"], name="norm", epsilon=1e-5),
             helper.make_node("Reshape", ["n", "patches"], ["u"], name="ungroup"),
             helper.make_node("Mul", ["u", "gamma"], ["s"], name="gamma"),
             helper.make_node("Reshape", ["s", "offsets"], ["o"], name="offsets"),
             helper.make_node("Transpose", ["o"], ["f"], name="fold", perm=[0, 1, 4, 2, 5, 3]),
             helper.make_node("Reshape", ["f", "image"], ["i"], name="image"),
             helper.make_node("Conv", ["i", "w2"], ["y"], name="project")]
    return make_model(nodes, [value_info("x", [1, 8, 8, 8])], [value_info("y", [1, 8, 8, 8])],
                      [weight("w", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
                       weight("w2", rng.standard_normal((8, 8, 1, 1)).astype(np.float32)),
                       weight("blocks", np.array([1, 8, 4, 2, 4, 2])), weight("patches", np.array([1, 8, 4, 16])),
                       weight("one_group", np.array([1, 1, 512])), weight("offsets", np.array([1, 8, 2, 2, 4, 4])),
                       weight("image", np.array([1, 8, 8, 8])), weight("one", np.ones(1, np.float32)),
                       weight("zero", np.zeros(1, np.float32)),
                       weight("gamma", rng.uniform(0.5, 2, (8, 1, 1)).astype(np.float32))], opset=opset)


def test_a_group_norm_of_patches_is_written_as_the_layer_norm_it_is(save, tmp_path):
    """MobileViTv2's norm: the plan runs it as one exNorm on the patches [1, 8, 4, 16]
    (passes/rewrites/reductions.py `single_group_norm_as_layer_norm`), not as the mean and
    variance of a [1, 512, 1, 1] row by Convs, which rknn-toolkit2 2.5.0 cuts into Convs added up
    (timm_mobilevitv2_050: 62 layers a norm). The export writes LayerNorm's ops at opset 14,
    which the toolkit fuses into exNorm: the same values."""
    original = save(patch_block())
    plan = rkcompile.compile(original, "rk3588")
    (norm,) = [step for step in plan.record.steps if step.kernel == "exNorm"]
    assert list(plan.record.tensors[norm.inputs[0]].shape) == [1, 8, 4, 16]
    written = rkcompile.export(plan, tmp_path / "out.onnx", "rk3588")
    exported = onnx.load(str(written.path))
    assert [n.op_type for n in exported.graph.node].count("ReduceMean") == 2
    weights = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    assert not [n for n in exported.graph.node if n.op_type == "Conv" and weights[n.input[1]].shape[:2] == (1, 512)]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_an_l2_normalize_is_written_with_a_reduce_sum(save, tmp_path):
    """torch's F.normalize: the plan runs it as v / sqrt(s * sum(v^2) + b) * sqrt(s) with the sum
    by a Conv of weights s = 2^15 (one exNorm); rknn-toolkit2 2.5.0 runs that form as five
    layers, and Mul -> ReduceSum -> Add -> Sqrt -> Div as one exNorm. The export writes the
    latter: the same values up to rounding."""
    original = save(l2_normalize([1, 4, 12, 64]))
    written = rkcompile.export(original, tmp_path / "out.onnx", "rk3588")
    assert written.report["toolkit_shapings"]["l2_norms_written_back"] == 1
    exported = onnx.load(str(written.path))
    ops = [n.op_type for n in exported.graph.node]
    assert "ReduceSum" in ops and "Conv" not in ops and ops.count("Mul") == 1   # the square alone
    x = np.random.default_rng(1).uniform(-1, 1, (1, 4, 12, 64)).astype(np.float32)
    np.testing.assert_allclose(onnxruntime_run(exported, {"x": x})[0], onnxruntime_run(original, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
