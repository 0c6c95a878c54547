"""Every seed and oplist constraint, on both sides of each bound, through compile_model.

Each case plans a one-node model built with onnx.helper and checks the node's verdict: on the
failing side the plan puts it on the CPU with the rule's rendered text and the offending value
in its reason; on the passing side no rule fails for it. (A passing node may still be moved to
the CPU by the partition cost model, which is why the passing side asserts on the rules.) The
rewrite pass is left out: these tests pin legalize's view of the node as written; the rewrites
have their own tests.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from rkcompile.compiler import pipeline
from rkcompile.errors import CompileError
from rkcompile.passes.legalize import evaluate_rules
from rkcompile.targets import get_target

FLOAT = TensorProto.FLOAT


@pytest.fixture(autouse=True)
def no_rewrites(monkeypatch):
    monkeypatch.setattr(pipeline, "PASSES", tuple(p for p in pipeline.PASSES if p.NAME != "rewrite"))


def one_node(op, inputs, weights=None, attrs=None, opset=17):
    """A model of one `op` node named 'n'. `inputs` maps runtime input names to shapes (or to
    (shape, dtype)); `weights` maps initializer names to arrays; node inputs follow the order
    of `inputs` then `weights`, and '' entries of `weights` keep an optional slot empty."""
    weights = weights or {}
    graph_inputs = []
    for name, spec in inputs.items():
        shape, dtype = spec if isinstance(spec[0], tuple) else (spec, FLOAT)
        graph_inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
    names = list(inputs) + [("" if value is None else name) for name, value in weights.items()]
    initializers = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in weights.items() if v is not None]
    node = helper.make_node(op, names, ["y"], name="n", **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", FLOAT, None)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)
    return shape_inference.infer_shapes(model)


#: The pipeline without the legalizing rewrites, so a verdict is the rule's own, not a rewrite's.
WITHOUT_REWRITES = tuple(p for p in pipeline.PASSES if p.NAME not in ("rewrite", "rewrite-late"))


def planned(tmp_path, model, target):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    with mock.patch.object(pipeline, "PASSES", WITHOUT_REWRITES):
        plan, ctx = pipeline.compile_model(path, target)
    entry = next(n for n in plan.nodes if n.name == "n")
    return entry, ctx.failures.get("n", [])


def rule_text(target, op, check):
    rule = next(r for r in get_target(target).ops[op].rules if r.check.__name__ == check)
    return rule.describe().rstrip(".")


def assert_verdict(tmp_path, model, target, op, check, ok, detail=""):
    entry, failures = planned(tmp_path, model, target)
    text = rule_text(target, op, check)
    if ok:
        assert text not in [f.rule.rstrip(".") for f in failures], failures
        assert entry.device == "npu" or text not in (entry.reason or "")
    else:
        assert entry.device == "cpu"
        assert text in entry.reason
        assert detail in entry.reason


def x4(shape=(1, 8, 8, 8)):
    return {"x": shape}


# ---- seed 000 (RK3562) ---------------------------------------------------------------------

@pytest.mark.parametrize("exponent, ok", [(0, True), (1, True), (2, True), (3, True), (0.5, True), (-0.5, True),
                                          (4, False), (1.5, False), (-1, False)])
def test_pow_exponent(tmp_path, exponent, ok):
    model = one_node("Pow", x4(), {"e": np.array([exponent], np.float32)})
    assert_verdict(tmp_path, model, "rk3562", "Pow", "pow_exponent", ok, f"exponent {exponent:g}")


def test_pow_exponent_computed_at_run_time(tmp_path):
    model = one_node("Pow", {"x": (1, 2, 2, 2), "e": (1,)})
    assert_verdict(tmp_path, model, "rk3562", "Pow", "pow_exponent", False, "computed at run time")


POOL_CASES = [
    ({"kernel_shape": [7, 7]}, True, ""),
    ({"kernel_shape": [8, 3]}, False, "kernel=8"),
    ({"kernel_shape": [3, 3], "strides": [8, 8]}, True, ""),
    ({"kernel_shape": [3, 3], "strides": [1, 9]}, False, "stride=9"),
    ({"kernel_shape": [7, 7], "pads": [7, 0, 0, 0]}, True, ""),
    ({"kernel_shape": [7, 7], "pads": [0, 0, 0, 8]}, False, "pad=8"),
]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs, ok, detail", POOL_CASES)
def test_pool_window(tmp_path, op, attrs, ok, detail):
    if op == "AveragePool" and "pads" in attrs:
        attrs = {**attrs, "count_include_pad": 1}
    model = one_node(op, x4((1, 2, 20, 20)), attrs=attrs)
    assert_verdict(tmp_path, model, "rk3562", op, "pool_window", ok, detail)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("check, attrs, ok, detail", [
    ("floor_rounding", {"ceil_mode": 0}, True, ""),
    ("floor_rounding", {"ceil_mode": 1}, False, "ceil_mode=1"),
    ("explicit_padding", {"auto_pad": "NOTSET"}, True, ""),
    ("explicit_padding", {"auto_pad": "SAME_UPPER"}, False, "auto_pad=SAME_UPPER"),
])
def test_pool_padding_modes(tmp_path, op, check, attrs, ok, detail):
    model = one_node(op, x4((1, 2, 9, 9)), attrs={"kernel_shape": [2, 2], "strides": [2, 2], **attrs})
    assert_verdict(tmp_path, model, "rk3562", op, check, ok, detail)


@pytest.mark.parametrize("order, ok", [(0, True), (1, False)])
def test_max_pool_storage_order(tmp_path, order, ok):
    model = one_node("MaxPool", x4(), attrs={"kernel_shape": [2, 2], "storage_order": order})
    assert_verdict(tmp_path, model, "rk3562", "MaxPool", "row_major_indices", ok, "storage_order=1")


@pytest.mark.parametrize("include, ok", [(1, True), (0, False)])
def test_average_pool_counts_pads(tmp_path, include, ok):
    model = one_node("AveragePool", x4(), attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                 "count_include_pad": include})
    assert_verdict(tmp_path, model, "rk3562", "AveragePool", "padded_average_counts_pads", ok, "count_include_pad=0")


@pytest.mark.parametrize("shape, ok, detail", [((1, 1, 8192, 1), True, ""), ((1, 1, 8193, 1), False, "height=8193"),
                                               ((1, 8193, 1, 1), False, "channel=8193")])
def test_max_pool_input_extent(tmp_path, shape, ok, detail):
    model = one_node("MaxPool", {"x": shape}, attrs={"kernel_shape": [1, 1]})
    assert_verdict(tmp_path, model, "rk3562", "MaxPool", "feature_extent", ok, detail)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape, ok, detail", [((1, 4, 7, 7), True, ""), ((1, 4, 8, 7), False, "height=8"),
                                               ((1, 4, 7, 8), False, "width=8"), ((1, 8192, 1, 1), True, ""),
                                               ((1, 8193, 1, 1), False, "channel=8193")])
def test_global_pool_extent(tmp_path, op, shape, ok, detail):
    assert_verdict(tmp_path, one_node(op, {"x": shape}), "rk3562", op, "feature_extent", ok, detail)


@pytest.mark.parametrize("axis, shape, check, ok, detail", [
    (1, (1, 4, 127, 129), "hardmax_extent", True, ""),             # h*w = 16383
    (1, (1, 4, 128, 128), "hardmax_extent", False, "height*width=16384"),
    (3, (1, 127, 129, 4), "hardmax_extent", True, ""),             # c*h = 16383
    (-1, (1, 128, 128, 4), "hardmax_extent", False, "channel*height=16384"),
    (2, (1, 4, 4, 4), "reduction_axis", False, "axis 2"),
    (1, (1, 4, 4, 4), "reduction_axis", True, ""),
])
def test_hardmax(tmp_path, axis, shape, check, ok, detail):
    model = one_node("Hardmax", {"x": shape}, attrs={"axis": axis})
    assert_verdict(tmp_path, model, "rk3562", "Hardmax", check, ok, detail)


def recurrent(op, sequence=3, batch=1, features=4, hidden=2, attrs=None, peephole=False):
    gates = 4 if op == "LSTM" else 3
    weights = {"W": np.zeros((1, gates * hidden, features), np.float32),
               "R": np.zeros((1, gates * hidden, hidden), np.float32)}
    if peephole:
        weights.update({"B": None, "sequence_lens": None, "initial_h": None, "initial_c": None,
                        "P": np.zeros((1, 3 * hidden), np.float32)})
    return one_node(op, {"x": (sequence, batch, features)}, weights, attrs={"hidden_size": hidden, **(attrs or {})})


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("size, ok, detail", [
    ({"batch": 1}, True, ""), ({"batch": 4}, True, ""), ({"batch": 8}, True, ""),
    ({"batch": 2}, False, "batch_size=2 is not a multiple of 4"), ({"batch": 6}, False, "batch_size=6"),
    ({"sequence": 8192}, True, ""), ({"sequence": 8193}, False, "seq_length=8193"),
    ({"features": 8192}, True, ""), ({"features": 8193}, False, "input_size=8193"),
])
def test_recurrent_extent(tmp_path, op, size, ok, detail):
    assert_verdict(tmp_path, recurrent(op, **size), "rk3562", op, "recurrent_extent", ok, detail)


@pytest.mark.parametrize("kwargs, ok, detail", [({}, True, ""), ({"attrs": {"input_forget": 1}}, False, "input_forget=1"),
                                                ({"peephole": True}, False, "peephole input P")])
def test_lstm_variant(tmp_path, kwargs, ok, detail):
    assert_verdict(tmp_path, recurrent("LSTM", **kwargs), "rk3562", "LSTM", "lstm_variant", ok, detail)


@pytest.mark.parametrize("indices, ok, detail", [([0, 2], True, ""), ([[0, 2]], False, "indices rank 2"),
                                                 (1, False, "indices rank 0")])
def test_gather_indices(tmp_path, indices, ok, detail):
    model = one_node("Gather", {"x": (1, 3, 4, 5)}, {"i": np.array(indices, np.int64)}, attrs={"axis": 2})
    assert_verdict(tmp_path, model, "rk3562", "Gather", "gather_indices", ok, detail)


EXPAND_CASES = [
    ((1, 3, 1, 5), (1, 3, 8192, 5), True),
    ((1, 3, 1, 5), (1, 3, 8193, 5), False),
    ((1, 1, 1, 5), (1, 3, 8192, 5), True),
    ((1, 3, 4, 1), (1, 3, 4, 8192), True),
    ((1, 1, 4, 1), (1, 3, 4, 8193), False),
    ((1, 3, 1, 1), (1, 3, 4, 5), True),
    ((1, 1, 4, 5), (1, 3, 4, 5), False),    # [b,1,h,w] is not a listed pattern
    ((1, 3, 4, 5), (2, 3, 4, 5), False),    # batch never broadcasts
]


@pytest.mark.parametrize("source, result, ok", EXPAND_CASES)
def test_expand_patterns(tmp_path, source, result, ok):
    model = one_node("Expand", {"x": source}, {"s": np.array(result, np.int64)})
    assert_verdict(tmp_path, model, "rk3562", "Expand", "expand_target", ok, f"{list(source)} -> {list(result)}")


@pytest.mark.parametrize("op", ["Mul", "Div", "Max"])
@pytest.mark.parametrize("other, ok", [((1, 3, 1, 1), True), ((1, 3, 4, 5), True), ((1, 1, 4, 5), False),
                                       ((1, 1, 1, 5), True), ((1, 3, 4, 1), True)])
def test_binary_ops_inherit_expand_broadcasts(tmp_path, op, other, ok):
    model = one_node(op, {"a": (1, 3, 4, 5), "b": other})
    assert_verdict(tmp_path, model, "rk3562", op, "expand_broadcast", ok, f"{list(other)} -> [1, 3, 4, 5]")


@pytest.mark.parametrize("op", ["Mul", "Div", "Max"])
def test_one_element_constant_is_a_scalar_operand(tmp_path, op):
    model = one_node(op, {"a": (1, 3, 4, 5)}, {"c": np.array([2.0], np.float32)})
    assert_verdict(tmp_path, model, "rk3562", op, "expand_broadcast", True)


@pytest.mark.parametrize("weight, ok", [(np.full((1, 1, 1, 1), 2.0, np.float32), True),
                                        (np.ones((1, 1, 4, 5), np.float32), False)])
def test_broadcast_check_tells_a_scalar_weight_by_its_shape(weight, ok):
    """A weight not yet read (onnx-graphsurgeon's LazyValues) stays unread by the broadcast
    check: one element or not is in its shape, and loading a large weight to count it cost
    more than the check."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    constant = gs.Constant("c", LazyValues(numpy_helper.from_array(weight, "c")))
    node = gs.Node("Mul", "n", inputs=[gs.Variable("a", np.float32, [1, 3, 4, 5]), constant],
                   outputs=[gs.Variable("y", np.float32, [1, 3, 4, 5])])
    with mock.patch.object(LazyValues, "load", side_effect=AssertionError("weight read")):
        verdicts = {v.rule.rstrip("."): v for v in evaluate_rules(node, get_target("rk3562"))}
    verdict = verdicts[rule_text("rk3562", "Mul", "expand_broadcast")]
    assert verdict.ok is ok
    assert ok or "[1, 1, 4, 5] -> [1, 3, 4, 5]" in verdict.detail


@pytest.mark.parametrize("mask, ok", [((1, 3, 1, 1), True), ((1, 1, 4, 5), False)])
def test_where_inherits_expand_broadcasts(tmp_path, mask, ok):
    model = one_node("Where", {"m": (mask, TensorProto.BOOL), "a": (1, 3, 4, 5), "b": (1, 3, 4, 5)})
    assert_verdict(tmp_path, model, "rk3576", "Where", "expand_broadcast", ok, f"{list(mask)} -> [1, 3, 4, 5]")


@pytest.mark.parametrize("mode, width, ok, detail", [
    ("constant", 9000, True, ""), ("reflect", 8176, True, ""), ("reflect", 8177, False, "width=8177"),
    ("edge", 8, False, "mode=edge"),
])
def test_pad_mode(tmp_path, mode, width, ok, detail):
    model = one_node("Pad", {"x": (1, 2, 3, width)}, {"p": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)},
                     attrs={"mode": mode})
    assert_verdict(tmp_path, model, "rk3562", "Pad", "pad_mode", ok, detail)


# ---- seed 001 (RK3576/RV1126B) -------------------------------------------------------------

@pytest.mark.parametrize("alpha, beta, ok", [(1 / 6, 0.5, True), (0.2, 0.5, False), (1 / 6, 0.6, False)])
def test_hard_sigmoid_constants(tmp_path, alpha, beta, ok):
    model = one_node("HardSigmoid", x4(), attrs={"alpha": alpha, "beta": beta})
    assert_verdict(tmp_path, model, "rk3576", "HardSigmoid", "hard_sigmoid_constants", ok, f"alpha={alpha:.6g}")


@pytest.mark.parametrize("alpha, ok", [(1.0, True), (0.5, False)])
def test_elu_alpha(tmp_path, alpha, ok):
    model = one_node("Elu", x4(), attrs={"alpha": alpha})
    assert_verdict(tmp_path, model, "rk3576", "Elu", "elu_alpha", ok, "alpha=0.5")


@pytest.mark.parametrize("shape, axis, ok, detail", [
    ((1, 8, 4, 4), 1, True, ""), ((1, 8, 1, 1), 1, True, ""),
    ((1, 8, 4, 4), -1, False, "axes [3]"), ((1, 8, 4, 4), 2, False, "axes [2, 3]"),
    ((16, 8), -1, False, "axes [3]"),
])
def test_layer_norm_axes(tmp_path, shape, axis, ok, detail):
    channels = shape[axis:]
    model = one_node("LayerNormalization", {"x": shape}, {"scale": np.ones(channels, np.float32)}, attrs={"axis": axis})
    assert_verdict(tmp_path, model, "rk3576", "LayerNormalization", "norm_axes", ok, detail)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_cos_are_rk3576_kernels_in_float16(tmp_path, op):
    entry, failures = planned(tmp_path, one_node(op, x4()), "rk3576")
    assert failures == []
    entry, failures = planned(tmp_path, one_node(op, x4()), "rk3588")
    assert entry.device == "cpu" and f"{op} is not in rk3588's NPU operator list" in entry.reason


@pytest.mark.parametrize("target, op, tensors", [("rk3576", "Sin", {"x": (1, 2, 2, 2)}),
                                                 ("rk3576", "Cos", {"x": (1, 2, 2, 2)}),
                                                 ("rk3562", "Div", {"a": (1, 2, 2, 2), "b": (1, 2, 2, 2)}),
                                                 ("rk3562", "GRU", None)])
@pytest.mark.parametrize("plan_dtype, ok", [("float16", True), ("int8", False)])
def test_float16_only_kernels(tmp_path, target, op, tensors, plan_dtype, ok):
    # Plans compute in float16 only for now, so the int8 side is checked on the rules directly.
    model = recurrent("GRU") if tensors is None else one_node(op, tensors)
    node = next(n for n in gs.import_onnx(model).nodes if n.name == "n")
    verdicts = {v.rule.split(" (")[0]: v for v in evaluate_rules(node, get_target(target), plan_dtype=plan_dtype)}
    verdict = verdicts["The NPU runs this operator only in {float16}"]
    assert verdict.ok is ok and (ok or verdict.detail == "plan dtype int8")


# ---- oplist V2.3.2, and where rk3588 and rk3576 differ -------------------------------------

@pytest.mark.parametrize("target, k, ok", [("rk3588", 8192, True), ("rk3588", 8193, False),
                                           ("rk3576", 4096, True), ("rk3576", 4097, False)])
def test_matmul_depth(tmp_path, target, k, ok):
    model = one_node("MatMul", {"a": (1, 1, 2, k)}, {"b": np.ones((k, 2), np.float32)})
    assert_verdict(tmp_path, model, target, "MatMul", "matmul_depth", ok, f"K={k}")


@pytest.mark.parametrize("target, shape, perm, ok, detail", [
    ("rk3588", (1, 4, 64, 32), (2, 0, 1, 3), False, "n1*c1*h1*w1 < p"),   # 8192 is not < p=8192
    ("rk3576", (1, 4, 64, 32), (2, 0, 1, 3), True, ""),                   # p = 268435456
    ("rk3588", (1, 4, 62, 32), (2, 0, 1, 3), True, ""),
    ("rk3588", (1, 2, 8, 5), (0, 1, 3, 2), True, ""),
    ("rk3588", (1, 2, 12, 5), (0, 1, 3, 2), False, "h1 % 8 == 0"),
    ("rk3588", (1, 2, 64, 64), (0, 1, 3, 2), False, "h1*w1 < 2*q"),        # 4096 is not < 2*2048
    ("rk3576", (1, 2, 64, 64), (0, 1, 3, 2), True, ""),
    ("rk3566", (1, 2, 8, 5), (0, 1, 3, 2), False, "perm [0, 1, 3, 2] not supported"),
    ("rk3566", (1, 2, 8, 1), (0, 1, 3, 2), True, ""),                     # moves a size-1 axis only
    ("rk3588", (64, 4, 32), (1, 0, 2), False, "perm [0, 2, 1, 3] on [1, 64, 4, 32]"),  # rank 3 read as 4-D
])
def test_transpose_perm(tmp_path, target, shape, perm, ok, detail):
    model = one_node("Transpose", {"x": shape}, attrs={"perm": list(perm)})
    assert_verdict(tmp_path, model, target, "Transpose", "transpose_perm", ok, detail)


@pytest.mark.parametrize("opset, axis, shape, ok, detail", [
    (17, 1, (1, 4, 2, 2), True, ""), (17, 3, (1, 4, 2, 2), True, ""), (17, -1, (2, 6), True, ""),
    (17, 2, (1, 4, 2, 2), False, "axis 2"), (17, 0, (2, 6), False, "axis 2"),
    (11, 3, (1, 4, 2, 2), True, ""), (11, 1, (1, 4, 2, 2), False, "reduces axes 1..3 together"),
    (11, 1, (1, 4, 1, 1), True, ""),
])
def test_softmax_axis(tmp_path, opset, axis, shape, ok, detail):
    model = one_node("Softmax", {"x": shape}, attrs={"axis": axis}, opset=opset)
    assert_verdict(tmp_path, model, "rk3588", "Softmax", "reduction_axis", ok, detail)


def conv(shape=(1, 2, 16, 16), kernel=(3, 3), group=1, out=2, **attrs):
    weight = np.ones((out, shape[1] // group, *kernel), np.float32)
    return one_node("Conv", {"x": shape}, {"w": weight}, attrs={"group": group, **attrs})


@pytest.mark.parametrize("model_args, ok, detail", [
    ({"shape": (1, 1, 40, 40), "kernel": (31, 31)}, True, ""),
    ({"shape": (1, 1, 40, 40), "kernel": (32, 1)}, False, "kernel=32"),
    ({"strides": [7, 7]}, True, ""), ({"strides": [8, 1]}, False, "stride=8"),
    ({"pads": [15, 15, 15, 15]}, True, ""), ({"pads": [0, 16, 0, 0]}, False, "pad=16"),
    ({"shape": (1, 1, 80, 80), "dilations": [31, 31]}, True, ""),
    ({"shape": (1, 1, 80, 80), "dilations": [32, 1]}, False, "dilation=32"),
    ({"shape": (1, 4, 16, 16), "group": 4, "out": 4, "kernel": (8, 8)}, True, ""),
    ({"shape": (1, 4, 16, 16), "group": 4, "out": 4, "kernel": (9, 1)}, False, "kernel=9"),
    ({"shape": (1, 1, 3, 16382)}, True, ""),
    ({"shape": (1, 1, 3, 16383)}, False, "width=16383 with dilated kernel height 3"),
])
def test_conv_window(tmp_path, model_args, ok, detail):
    assert_verdict(tmp_path, conv(**model_args), "rk3588", "Conv", "conv_window", ok, detail)


@pytest.mark.parametrize("target, stride, ok", [("rk3588", 4, True), ("rk3588", 3, False), ("rk3576", 3, True),
                                                ("rk3576", 9, False)])
def test_deconv_strides_differ_between_rk3588_and_rk3576(tmp_path, target, stride, ok):
    model = one_node("ConvTranspose", {"x": (1, 2, 4, 4)}, {"w": np.ones((2, 2, 3, 3), np.float32)},
                     attrs={"strides": [stride, stride]})
    assert_verdict(tmp_path, model, target, "ConvTranspose", "deconv_window", ok, f"stride={stride}")


def resize(scale=2.0, **attrs):
    return one_node("Resize", {"x": (1, 2, 4, 4)}, {"roi": None, "scales": np.array([1, 1, scale, scale], np.float32)},
                    attrs=attrs)


@pytest.mark.parametrize("attrs, check, ok, detail", [
    ({"mode": "nearest"}, "resize_mode", True, ""),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, "resize_mode", True, ""),
    ({"mode": "cubic"}, "resize_mode", False, "mode=cubic"),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, "resize_mode", False,
     "coordinate_transformation_mode=asymmetric"),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, "resize_mode", True, ""),
])
def test_resize_mode(tmp_path, attrs, check, ok, detail):
    assert_verdict(tmp_path, resize(**attrs), "rk3588", "Resize", check, ok, detail)


@pytest.mark.parametrize("scale, ok, detail", [(2.0, True, ""), (8.0, True, ""), (9.0, True, ""), (16.0, True, ""),
                                               (32.0, True, ""), (11.0, False, "height 4 -> 44"),
                                               (1.5, False, "height 4 -> 6"), (0.5, False, "height 4 -> 2")])
def test_resize_scale(tmp_path, scale, ok, detail):
    assert_verdict(tmp_path, resize(scale), "rk3588", "Resize", "resize_scale", ok, detail)


@pytest.mark.parametrize("step, ok", [(1, True), (2, False)])
def test_slice_steps(tmp_path, step, ok):
    model = one_node("Slice", {"x": (1, 2, 8, 8)}, {"s": np.array([0], np.int64), "e": np.array([8], np.int64),
                                                    "a": np.array([3], np.int64), "t": np.array([step], np.int64)})
    assert_verdict(tmp_path, model, "rk3588", "Slice", "unit_slice_steps", ok, "steps [2]")


@pytest.mark.parametrize("other, ok", [((1, 3, 1, 1), True), ((1, 3, 4, 5), True), ((1, 1, 1, 5), False)])
def test_sub_broadcasts_per_channel_only(tmp_path, other, ok):
    model = one_node("Sub", {"a": (1, 3, 4, 5), "b": other})
    assert_verdict(tmp_path, model, "rk3588", "Sub", "channel_broadcast", ok, f"{list(other)} -> [1, 3, 4, 5]")


@pytest.mark.parametrize("shape, ok", [((2, 3), True), ((1, 2, 3, 4), True), ((1, 1, 2, 3, 4), False)])
def test_npu_is_four_dimensional(tmp_path, shape, ok):
    entry, failures = planned(tmp_path, one_node("Relu", {"x": shape}), "rk3588")
    rank_rule = get_target("rk3588").common_rules[1].describe().rstrip(".")
    assert (rank_rule in (entry.reason or "")) is not ok
    if not ok:
        assert "has rank 5" in entry.reason


def test_hardmax_volume_on_rv1106(tmp_path):
    fits = one_node("Hardmax", {"x": (1, 16, 16, 32)}, attrs={"axis": 1})
    assert_verdict(tmp_path, fits, "rv1106", "Hardmax", "hardmax_volume", True)
    too_big = one_node("Hardmax", {"x": (1, 16, 16, 33)}, attrs={"axis": 1})
    assert_verdict(tmp_path, too_big, "rv1106", "Hardmax", "hardmax_volume", False, "channel*height*width=8448")
    narrow_plane = one_node("Hardmax", {"x": (1, 16, 2, 2)}, attrs={"axis": 1})
    assert_verdict(tmp_path, narrow_plane, "rv1106", "Hardmax", "hardmax_volume", False, "plane=4")


def test_int8_only_convolutions_of_rv1106_refuse_float16_plans(tmp_path):
    assert_verdict(tmp_path, conv(), "rv1106", "Conv", "plan_dtype", False, "plan dtype float16")
    assert_verdict(tmp_path, conv(), "rk3562", "Conv", "float_data", True)


def test_rv1106b_has_no_float16_storage(tmp_path):
    with pytest.raises(CompileError, match=r"rv1106b.s NPU runs int8 only: it has no float16 tensors \(seed 003, table 3-1"):
        planned(tmp_path, one_node("Relu", x4()), "rv1106b")


def test_every_failing_rule_is_reported(tmp_path):
    model = one_node("MaxPool", x4((1, 2, 30, 30)), attrs={"kernel_shape": [9, 9], "strides": [9, 9], "ceil_mode": 1})
    entry, failures = planned(tmp_path, model, "rk3562")
    assert [f.rule for f in failures] == [rule_text("rk3562", "MaxPool", "pool_window") + ".",
                                          rule_text("rk3562", "MaxPool", "floor_rounding") + "."]
    assert "kernel=9, kernel=9, stride=9, stride=9" in entry.reason and "ceil_mode=1" in entry.reason
