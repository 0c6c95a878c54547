"""Every NPU kernel of the emulator against onnx.reference, on random shapes with channel
counts that are not multiples of C2 (8 for float16 on rk3588).

Each case is one ONNX node. It is checked twice: the kernel called directly in float32 must
match onnx.reference to float32 precision; and the node planned for rk3588 and executed by the
emulator (NC1HWC2 storage with padding, float16) must run on the NPU and match within float16
tolerance.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rkcompile.options import Options
from rkcompile.api import prepare
from rkcompile.emulator import agreement, emulate, make_inputs
from rkcompile.emulator.registry import KERNELS

OPSET = 17
rng = np.random.default_rng(7)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


class Case:
    """One node: runtime inputs (name -> array), weights (name -> array), attributes."""

    def __init__(self, op, inputs, weights=None, attrs=None, outputs=1, order=None):
        self.op, self.inputs, self.weights = op, inputs, weights or {}
        self.attrs = attrs or {}
        self.outputs = [f"y{i}" for i in range(outputs)]
        self.order = order or list(inputs) + list(self.weights)

    def model(self) -> onnx.ModelProto:
        node = helper.make_node(self.op, self.order, self.outputs, **self.attrs)
        graph = helper.make_graph(
            [node], self.op,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in self.inputs.items()],
            [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in self.outputs],
            [numpy_helper.from_array(v, n) for n, v in self.weights.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model)

    def reference(self):
        feeds = {**self.inputs, **self.weights}
        return ReferenceEvaluator(self.model()).run(None, feeds)


def lstm_weights(cell, gates, hidden, features, directions=1):
    return {"W": normal(directions, gates * hidden, features) * 0.3,
            "R": normal(directions, gates * hidden, hidden) * 0.3,
            "B": normal(directions, 2 * gates * hidden) * 0.1}


CASES = {
    "conv3x3_stride2_pad": Case("Conv", {"x": normal(1, 13, 11, 9)}, {"w": normal(21, 13, 3, 3), "b": normal(21)},
                                {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "conv1x1": Case("Conv", {"x": normal(1, 13, 6, 5)}, {"w": normal(11, 13, 1, 1)}),
    "conv_depthwise_dilated": Case("Conv", {"x": normal(1, 13, 12, 10)}, {"w": normal(13, 1, 3, 3), "b": normal(13)},
                                   {"group": 13, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "conv_grouped_same": Case("Conv", {"x": normal(1, 12, 7, 7)}, {"w": normal(18, 4, 3, 3)},
                              {"group": 3, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "gemm": Case("Gemm", {"a": normal(3, 19)}, {"b": normal(13, 19), "c": normal(13)}, {"transB": 1, "alpha": 0.5}),
    "matmul": Case("MatMul", {"a": normal(2, 5, 19)}, {"b": normal(19, 13)}),
    "maxpool_ceil": Case("MaxPool", {"x": normal(1, 13, 9, 9)},
                         attrs={"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "averagepool_pads": Case("AveragePool", {"x": normal(1, 13, 8, 8)},
                             attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "averagepool_exclude_pad": Case("AveragePool", {"x": normal(1, 13, 8, 8)},
                                    attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0}),
    "global_average_pool": Case("GlobalAveragePool", {"x": normal(1, 13, 7, 5)}),
    "global_max_pool": Case("GlobalMaxPool", {"x": normal(1, 13, 7, 5)}),
    "add_broadcast": Case("Add", {"a": normal(1, 13, 5, 6)}, {"b": normal(1, 13, 1, 1)}),
    "sub_broadcast_rows": Case("Sub", {"a": normal(1, 13, 5, 6)}, {"b": normal(6)}),
    "mul_two_inputs": Case("Mul", {"a": normal(1, 13, 5, 6), "b": normal(1, 13, 5, 6)}),
    "div": Case("Div", {"a": normal(1, 13, 4, 4)}, {"b": (np.abs(normal(1, 13, 1, 1)) + 0.5)}),
    "max": Case("Max", {"a": normal(1, 13, 4, 4), "b": normal(1, 13, 4, 4)}),
    "relu": Case("Relu", {"x": normal(1, 13, 4, 5)}),
    "leaky_relu": Case("LeakyRelu", {"x": normal(1, 13, 4, 5)}, attrs={"alpha": 0.1}),
    "prelu": Case("PRelu", {"x": normal(1, 13, 4, 5)}, {"slope": normal(13, 1, 1) * 0.2}),
    "sigmoid": Case("Sigmoid", {"x": normal(1, 13, 4, 5) * 4}),
    "tanh": Case("Tanh", {"x": normal(1, 13, 4, 5)}),
    "hard_sigmoid": Case("HardSigmoid", {"x": normal(1, 13, 4, 5) * 3}),
    "hard_swish": Case("HardSwish", {"x": normal(1, 13, 4, 5) * 3}),
    "elu": Case("Elu", {"x": normal(1, 13, 4, 5)}),
    "softplus": Case("Softplus", {"x": normal(1, 13, 4, 5)}),
    "clip": Case("Clip", {"x": normal(1, 13, 4, 5) * 4}, {"lo": np.float32(0), "hi": np.float32(6)}),
    "concat": Case("Concat", {"a": normal(1, 13, 4, 5), "b": normal(1, 5, 4, 5)}, attrs={"axis": 1}),
    "split": Case("Split", {"x": normal(1, 13, 4, 6)}, {"sizes": np.array([5, 8], np.int64)},
                  attrs={"axis": 1}, outputs=2),
    "slice": Case("Slice", {"x": normal(1, 13, 8, 6)},
                  {"starts": np.array([1, 2], np.int64), "ends": np.array([12, 100], np.int64),
                   "axes": np.array([1, 2], np.int64), "steps": np.array([1, 1], np.int64)}),
    "slice_step2": Case("Slice", {"x": normal(1, 13, 8, 6)},
                        {"starts": np.array([-1, 2], np.int64), "ends": np.array([-100, 100], np.int64),
                         "axes": np.array([1, 2], np.int64), "steps": np.array([-2, 2], np.int64)}),
    "flatten_negative_axis": Case("Flatten", {"x": normal(2, 3, 4, 5)}, attrs={"axis": -1}),
    # channels into rows, which moves stored bytes (a relabel that moves none is an alias, no step)
    "reshape": Case("Reshape", {"x": normal(1, 13, 4, 6)}, {"shape": np.array([1, 4, 78], np.int64)}),
    "transpose": Case("Transpose", {"x": normal(1, 13, 8, 8)}, attrs={"perm": [0, 1, 3, 2]}),
    "resize_nearest": Case("Resize", {"x": normal(1, 13, 4, 5)},
                           {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
                           attrs={"mode": "nearest"}),
    "resize_linear": Case("Resize", {"x": normal(1, 13, 4, 5)},
                          {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
                          attrs={"mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
    "softmax": Case("Softmax", {"x": normal(1, 13, 4, 6) * 3}, attrs={"axis": -1}),
    "layer_normalization": Case("LayerNormalization", {"x": normal(1, 13, 24)}, {"g": normal(24), "b": normal(24)}),
    "batch_normalization": Case("BatchNormalization", {"x": normal(1, 13, 4, 4)},
                                {"s": normal(13), "bias": normal(13), "mean": normal(13),
                                 "var": np.abs(normal(13)) + 0.5}),
    "gather_negative_indices": Case("Gather", {"x": normal(1, 13, 4, 6)},
                                    {"i": np.array([[0, -1], [5, -13]], np.int64)}, attrs={"axis": 1}),
    "expand_both_ways": Case("Expand", {"x": normal(1, 13, 1, 6)}, {"shape": np.array([2, 1, 5, 1], np.int64)}),
    "tile": Case("Tile", {"x": normal(1, 13, 2, 3)}, {"repeats": np.array([1, 1, 3, 2], np.int64)}),
    "where": Case("Where", {"c": rng.random((1, 13, 4, 1)) < 0.5, "a": normal(1, 13, 4, 6)}, {"b": normal(6)}),
    "lstm": Case("LSTM", {"x": normal(5, 1, 13)}, lstm_weights("LSTM", 4, 11, 13), {"hidden_size": 11}, outputs=3),
    "gru_bidirectional": Case("GRU", {"x": normal(5, 1, 13)}, lstm_weights("GRU", 3, 11, 13, directions=2),
                              {"hidden_size": 11, "direction": "bidirectional", "linear_before_reset": 1},
                              outputs=2),
}
#: Attribute cases the rk3588 rules keep off the NPU (the plan would run them on the CPU), so
#: only the float32 kernel check applies to them.
OFF_THE_NPU = {"averagepool_exclude_pad", "slice_step2", "gather_negative_indices", "expand_both_ways"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_matches_onnx_reference_in_float32(name):
    case = CASES[name]
    graph = gs.import_onnx(case.model())
    node = graph.nodes[0]
    values = [None if not t.name else np.asarray(t.values) if isinstance(t, gs.Constant) else case.inputs[t.name]
              for t in node.inputs]
    results = KERNELS[case.op](node, values, OPSET)
    for result, expected in zip(results, case.reference()):
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gather_negative_indices", "expand_both_ways", "tile", "where"])
def test_selection_kernels_equal_onnx_reference_bit_for_bit(name):
    """They select and repeat elements: exactly, as onnx.reference does, which ran them before."""
    case = CASES[name]
    node = gs.import_onnx(case.model()).nodes[0]
    values = [np.asarray(t.values) if isinstance(t, gs.Constant) else case.inputs[t.name] for t in node.inputs]
    (result,), (expected,) = KERNELS[case.op](node, values, OPSET), case.reference()
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_array_equal(result.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("name", sorted(set(CASES) - OFF_THE_NPU))
def test_planned_node_runs_on_the_npu_in_float16(name, tmp_path):
    case = CASES[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(case.model(), path)
    prepared = prepare(path, "rk3588", Options())
    devices = {step.device for step in prepared.plan.steps}
    assert "npu" in devices and "cpu" not in devices, [(s.device, s.kernel) for s in prepared.plan.steps]
    stored = {prepared.plan.tensors[t].layout for s in prepared.plan.steps if s.device == "npu" for t in s.outputs}
    if case.op not in ("LSTM", "GRU", "Reshape"):
        assert stored == {"NC1HWC2"}
    execution = emulate(prepared, make_inputs(prepared.plan, case.inputs))
    for output, expected in zip(case.outputs, case.reference()):
        result = execution.outputs[output]
        assert result.shape == expected.shape
        assert agreement(output, result, expected).cosine >= 0.9999
        np.testing.assert_allclose(result, expected, rtol=1e-2, atol=1e-2 * max(1.0, np.abs(expected).max()))


def onnxruntime_outputs(case: Case) -> list[np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(case.model().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, case.inputs)


#: Cases onnx.reference gets wrong (it refuses negative pads), checked against onnxruntime.
ONNXRUNTIME_CASES = {
    "pad_crop_and_grow": Case("Pad", {"x": normal(1, 5, 4, 6)},
                              {"pads": np.array([0, -1, 2, -2, 0, 2, -1, 1], np.int64), "value": np.float32(1.5)},
                              attrs={"mode": "constant"}),
    "pad_reflect": Case("Pad", {"x": normal(2, 3, 5)}, {"pads": np.array([0, 0, 2, 1, 2, 4], np.int64)},
                        attrs={"mode": "reflect"}),
    "pad_edge_crop": Case("Pad", {"x": normal(2, 3, 5)}, {"pads": np.array([0, -1, 3, 0, 2, -2], np.int64)},
                          attrs={"mode": "edge"}),
    # a negative step from a start before the first element: ONNX clamps the start to 0 (one
    # element), numpy's slice to "before the first" (none)
    "slice_negative_step_from_before_the_start": Case(
        "Slice", {"x": normal(1, 5, 3, 6)},
        {"starts": np.array([-10, 7], np.int64), "ends": np.array([-100, -8], np.int64),
         "axes": np.array([1, 3], np.int64), "steps": np.array([-1, -2], np.int64)}),
    # windows larger than the padded input along one axis: no output there, as onnx infers
    "max_pool_window_past_the_input": Case("MaxPool", {"x": normal(1, 3, 2, 7)},
                                           attrs={"kernel_shape": [3, 3], "pads": [0, 0, 0, 0]}),
}


@pytest.mark.parametrize("name", sorted(ONNXRUNTIME_CASES))
def test_kernel_matches_onnxruntime_in_float32(name):
    case = ONNXRUNTIME_CASES[name]
    node = gs.import_onnx(case.model()).nodes[0]
    values = [None if not t.name else np.asarray(t.values) if isinstance(t, gs.Constant) else case.inputs[t.name]
              for t in node.inputs]
    for result, expected in zip(KERNELS[case.op](node, values, OPSET), onnxruntime_outputs(case)):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def conv_transpose_case(channels, group, stride, pad, output_padding, dilation=1, kernel=3, out_per_group=2,
                        bias=True) -> Case:
    weights = {"w": normal(channels, out_per_group, kernel, kernel)}
    if bias:
        weights["b"] = normal(group * out_per_group)
    return Case("ConvTranspose", {"x": normal(2, channels, 5, 4)}, weights,
                {"group": group, "strides": [stride, stride], "pads": [pad, pad + 1 if pad else 0, pad, pad],
                 "output_padding": [output_padding, 0], "dilations": [dilation, dilation]})


# Grouped ConvTranspose: every group count (1, 2, a middle divisor, one per channel) with each
# stride, pad and output_padding (< stride, as the operator requires), against onnxruntime:
# onnx.reference adds channel 0's bias to every channel of a depthwise one and crashes on 1 < group < C.
@pytest.mark.parametrize("group", [1, 2, 3, 6])
@pytest.mark.parametrize("stride,output_padding", [(1, 0), (2, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("pad", [0, 1])
def test_conv_transpose_kernel_matches_onnxruntime(group, stride, output_padding, pad):
    case = conv_transpose_case(6, group, stride, pad, output_padding, out_per_group=1 if group == 6 else 2)
    node = gs.import_onnx(case.model()).nodes[0]
    (result,) = KERNELS["ConvTranspose"](node, [case.inputs["x"], case.weights["w"], case.weights["b"]], OPSET)
    np.testing.assert_allclose(result, onnxruntime_outputs(case)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [{"output_shape": [12, 10], "strides": [2, 2]},
                                   {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
                                   {"auto_pad": "SAME_LOWER", "strides": [3, 3], "kernel_shape": [4, 4]},
                                   {"dilations": [2, 2], "strides": [2, 2]}], ids=str)
def test_conv_transpose_kernel_output_shape_and_auto_pad(attrs):
    kernel = attrs.get("kernel_shape", [3, 3])[0]
    case = Case("ConvTranspose", {"x": normal(1, 4, 5, 4)}, {"w": normal(4, 3, kernel, kernel)}, attrs)
    node = gs.import_onnx(case.model()).nodes[0]
    (result,) = KERNELS["ConvTranspose"](node, [case.inputs["x"], case.weights["w"]], OPSET)
    np.testing.assert_allclose(result, onnxruntime_outputs(case)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_transpose_with_bias_on_the_npu(stride, tmp_path):
    """The NPU runs one group per channel; each channel gets its own bias."""
    case = conv_transpose_case(13, 13, stride, 0, 0, out_per_group=1)
    path = tmp_path / "deconv.onnx"
    onnx.save(case.model(), path)
    prepared = prepare(path, "rk3588", Options())
    assert [s.device for s in prepared.plan.steps if s.device != "host"] == ["npu"]
    result = emulate(prepared, make_inputs(prepared.plan, case.inputs)).outputs["y0"]
    expected = onnxruntime_outputs(case)[0]
    np.testing.assert_allclose(result, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
