"""fold-constants folds with onnx.reference, the source of op semantics the emulator's CPU
fallback runs too: every folded value is the reference's own, bit for bit, dtype and shape
included (edge cases of the shape arithmetic exporters fold: negative indices and axes,
truncating integer division, clamped slice ends, 0-d values, broadcasting, old op versions).
A node the reference cannot evaluate stays a node."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkcompile.passes import fold_constants

I64, I32, F32, F16 = np.int64, np.int32, np.float32, np.float16
BIG = np.iinfo(np.int64).max
RANDOM = np.random.default_rng(18)


def a(values, dtype=I64):
    return np.array(values, dtype=dtype)


#: (op, inputs, attributes, opset)
CASES = [
    ("Add", [a([[1], [2]]), a([10, 20, 30])], {}, 17),
    ("Add", [a(1.5, F32), a(2.25, F32)], {}, 17),
    ("Sub", [a([5, -3], I32), a([7, 7], I32)], {}, 17),
    ("Mul", [a([3, -4]), a(-2)], {}, 17),
    ("Div", [a([-7, 7, -8, 9, 0]), a([2, -2, 3, 3, 5])], {}, 17),
    ("Div", [a([1.0, -3.0], F32), a([3.0, 7.0], F32)], {}, 17),
    ("Mod", [a([-7, 7, -8]), a([3, -3, 5])], {}, 17),
    ("Mod", [a([-7.5, 7.25], F32), a([2.0, -2.0], F32)], {"fmod": 1}, 17),
    ("Min", [a([3, 1, 2])], {}, 17),
    ("Min", [a([3, 1, 2]), a([2, 2, 2])], {}, 17),
    ("Max", [a([3, 1, 2]), a([2, 5, 2]), a(4)], {}, 17),
    ("Equal", [a([1, 2, 3]), a([1, 0, 3])], {}, 17),
    ("Less", [a([1, 2, 3]), a(2)], {}, 17),
    ("Greater", [a([1.0, 2.0], F32), a([2.0, 1.0], F32)], {}, 17),
    ("LessOrEqual", [a([1, 2, 3]), a(2)], {}, 17),
    ("GreaterOrEqual", [a([1, 2, 3]), a(2)], {}, 17),
    ("And", [a([True, False, True], bool), a([True, True, False], bool)], {}, 17),
    ("Or", [a([True, False, False], bool), a([False, False, True], bool)], {}, 17),
    ("Xor", [a([True, False, True], bool), a([True, True, False], bool)], {}, 17),
    ("Not", [a([True, False], bool)], {}, 17),
    ("Neg", [a([3, -4])], {}, 17),
    ("Abs", [a([3, -4], I32)], {}, 17),
    ("Ceil", [a([1.2, -1.2, 2.0], F32)], {}, 17),
    ("Floor", [a([1.2, -1.2, 2.0], F32)], {}, 17),
    ("Ceil", [a([1, -2])], {}, 17),
    ("Sqrt", [a([4.0, 2.0, -1.0], F32)], {}, 17),
    ("Sqrt", [a([9, 10])], {}, 17),
    ("Reciprocal", [a([4.0, 0.0, -3.0], F32)], {}, 17),
    ("Sin", [a([0.5, -2.0], F32)], {}, 17),
    ("Cos", [a([0.5, -2.0], F32)], {}, 17),
    ("Log", [a([0.5, 2.0, 0.0], F32)], {}, 17),
    ("Exp", [a([0.5, -2.0], F32)], {}, 17),
    ("Pow", [a([2.0, 3.0], F32), a([0.5, 2.0], F32)], {}, 17),
    ("Pow", [a([2, 3]), a([3, 2])], {}, 17),
    ("Where", [a([[True], [False]], bool), a([1, 2, 3]), a([-1, -2, -3])], {}, 17),
    ("Cast", [a([1.7, -1.7, 300.0], F32)], {"to": TensorProto.INT64}, 13),
    ("Cast", [a([1, 70000])], {"to": TensorProto.FLOAT16}, 19),
    ("Cast", [a([0.0, -0.5], F32)], {"to": TensorProto.BOOL}, 13),
    ("Cast", [a([True, False], bool)], {"to": TensorProto.FLOAT}, 19),
    ("Concat", [a([1, 2]), a([3]), a([4, 5])], {"axis": -1}, 17),
    ("Concat", [a([[1, 2]], F32), a([[3, 4]], F32)], {"axis": 0}, 17),
    ("Concat", [a([1, 2])], {"axis": 0}, 17),
    ("Gather", [a([10, 20, 30]), a(-1)], {}, 17),
    ("Gather", [a([[1, 2, 3], [4, 5, 6]], F32), a([[0, 2], [1, -1]])], {"axis": 1}, 17),
    ("Gather", [a([10, 20, 30]), a([2, 0], I32)], {"axis": -1}, 17),
    ("Unsqueeze", [a([1, 2, 3]), a([0, -1])], {}, 13),
    ("Unsqueeze", [a(7), a([0])], {}, 17),
    ("Unsqueeze", [a([1, 2, 3])], {"axes": [0, 2]}, 11),
    ("Squeeze", [a([[[1], [2]]]), a([0, -1])], {}, 13),
    ("Squeeze", [a([[[1], [2]]])], {}, 13),
    ("Squeeze", [a([[[1], [2]]])], {"axes": [0, 2]}, 11),
    ("Squeeze", [a([[[1], [2]]])], {}, 11),
    ("Reshape", [np.arange(24, dtype=F32).reshape(2, 3, 4), a([0, -1])], {}, 13),
    ("Reshape", [np.arange(6, dtype=I64), a([3, 2])], {}, 5),
    ("Reshape", [np.zeros((0, 3), dtype=F32), a([3, 0])], {"allowzero": 1}, 14),
    ("Slice", [np.arange(10, dtype=I64), a([1]), a([BIG])], {}, 13),
    ("Slice", [np.arange(24, dtype=F32).reshape(2, 3, 4), a([-1, 0]), a([-BIG, 3]), a([-1, 0]), a([-2, 2])], {}, 13),
    ("Slice", [np.arange(24, dtype=I64).reshape(2, 3, 4), a(1), a(2), a([1])], {}, 10),
    ("Expand", [a([[1], [2], [3]], F32), a([2, 1, 4])], {}, 13),
    ("Expand", [a([[1, 2, 3]]), a([3, 1])], {}, 13),
    ("Range", [a(10), a(-3), a(-4)], {}, 17),
    ("Range", [a(0.5, F32), a(2.0, F32), a(0.25, F32)], {}, 17),
    ("Transpose", [np.arange(6, dtype=I64).reshape(1, 2, 3)], {}, 17),
    ("Transpose", [np.arange(6, dtype=I64).reshape(1, 2, 3)], {"perm": [2, 0, 1]}, 17),
    ("Flatten", [np.arange(24, dtype=F32).reshape(2, 3, 4)], {"axis": 0}, 17),
    ("Flatten", [np.arange(24, dtype=F32).reshape(2, 3, 4)], {"axis": -1}, 17),
    ("Flatten", [np.arange(24, dtype=F32).reshape(2, 3, 4)], {}, 17),
    ("Tile", [a([[1, 2]]), a([2, 3])], {}, 17),
    ("Clip", [a([-5.0, 0.5, 5.0], F32), a(0.0, F32)], {}, 13),
    ("Clip", [a([-5, 0, 5]), a(-1), a(1)], {}, 13),
    ("ReduceMax", [a([[1, 5], [7, 2]])], {"axes": [1], "keepdims": 0}, 13),
    ("ReduceMax", [a([[1, 5], [7, 2]], F32)], {}, 13),
    ("ReduceMax", [a([[1, 5], [7, 2]]), a([-1])], {}, 18),
    ("ReduceMin", [a([[1, 5], [7, 2]])], {"keepdims": 0}, 18),
    ("ReduceMin", [a([[1, 5], [7, 2]], F32), a([0])], {"keepdims": 0}, 18),
    ("ScatterND", [np.zeros((3, 4), F32), a([[1], [0]]), a([[1, 2, 3, 4], [5, 6, 7, 8]], F32)], {}, 17),
    ("ReduceL2", [a([[3, 4], [6, 8]], F32)], {"axes": [1]}, 13),
    ("ReduceL2", [a([[3, 4], [6, 8]], F32)], {"keepdims": 0}, 13),
    ("ReduceL2", [RANDOM.standard_normal((2, 3, 5)).astype(F32), a([-1], I64)], {"keepdims": 0}, 18),
    ("CumSum", [np.arange(12, dtype=F32).reshape(3, 4) * 0.1, a(1, I32)], {}, 14),
    ("CumSum", [np.arange(12, dtype=I32).reshape(3, 4), a(-2)], {"reverse": 1}, 14),
    ("CumSum", [np.arange(12, dtype=F32).reshape(3, 4), a(0, I32)], {"exclusive": 1}, 14),
    ("CumSum", [np.arange(12, dtype=I64).reshape(2, 6), a(1)], {"exclusive": 1, "reverse": 1}, 14),
    ("Conv", [RANDOM.standard_normal((1, 3, 7, 6)).astype(F32), RANDOM.standard_normal((4, 3, 3, 3)).astype(F32)],
     {}, 17),
    ("Conv", [RANDOM.standard_normal((2, 4, 9, 8)).astype(F32), RANDOM.standard_normal((6, 2, 3, 2)).astype(F32),
              RANDOM.standard_normal(6).astype(F32)],
     {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [2, 3]}, 11),
    ("Conv", [RANDOM.standard_normal((1, 8, 5, 5)).astype(F32), RANDOM.standard_normal((8, 1, 3, 3)).astype(F32),
              RANDOM.standard_normal(1).astype(F32)],
     {"group": 8, "kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]}, 17),
    ("Conv", [RANDOM.standard_normal((1, 2, 6, 5)).astype(F32), RANDOM.standard_normal((3, 2, 2, 2)).astype(F32)],
     {"auto_pad": "SAME_UPPER"}, 17),
    ("Conv", [RANDOM.standard_normal((1, 2, 11)).astype(F32), RANDOM.standard_normal((3, 2, 4)).astype(F32)],
     {"auto_pad": "VALID", "strides": [3]}, 17),
    ("Conv", [RANDOM.standard_normal((1, 2, 4, 3, 5)).astype(F32), RANDOM.standard_normal((2, 2, 2, 1, 3)).astype(F32)],
     {"pads": [0, 1, 1, 1, 0, 1]}, 17),
]

#: more: an op outside the shape arithmetic, a Cast numpy alone does not do, an old op version,
#: an empty reduction
UNUSUAL = [
    ("Sin", [a([1.0, 2.0], F32)], {}, 17),
    ("Cast", [a([1.5], F32)], {"to": TensorProto.BFLOAT16}, 19),
    ("Slice", [np.arange(6, dtype=I64)], {"starts": [1], "ends": [3]}, 9),
    ("ReduceMax", [np.zeros((0, 2), F32)], {"axes": [1]}, 13),
]


def _node_and_model(op, inputs, attributes, opset):
    names = [f"i{position}" for position in range(len(inputs))]
    proto = helper.make_node(op, names, ["y"], name="node", **attributes)
    graph = helper.make_graph([proto], "g", [], [helper.make_value_info("y", onnx.TypeProto())],
                              [numpy_helper.from_array(value, name) for value, name in zip(inputs, names)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return gs.import_onnx(model).nodes[0], model


@pytest.mark.parametrize("op, inputs, attributes, opset", CASES + UNUSUAL,
                         ids=[f"{case[0]}-{index}" for index, case in enumerate(CASES + UNUSUAL)])
def test_each_fold_gives_onnx_reference_values_bit_for_bit(op, inputs, attributes, opset):
    from onnx.reference import ReferenceEvaluator

    node, model = _node_and_model(op, inputs, attributes, opset)
    with np.errstate(all="ignore"):
        expected = np.asarray(ReferenceEvaluator(model).run(None, {})[0])
        (got,) = fold_constants._evaluate(node, opset)
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    assert got.tobytes() == expected.tobytes()


def test_a_node_onnx_reference_cannot_evaluate_stays_a_node(caplog):
    """A Gather index out of range: the reference raises, and fold-constants says why it did not fold."""
    node, _ = _node_and_model("Gather", [a([1, 2, 3]), a([5])], {}, 17)
    assert fold_constants._evaluate(node, 17) is None
    assert "Gather node node is not folded: onnx.reference cannot evaluate it" in caplog.text
