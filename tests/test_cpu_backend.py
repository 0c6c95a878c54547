"""The backend a CPU step runs on (`emulator.onnx_backends.cpu_backend`, recorded in the plan):
onnxruntime whenever it takes the node, asked once per distinct node."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, value_info
from onnx import TensorProto, helper

from rkcompile import onnx_backends
from rkcompile.plan import plain_nodes as plain
from rkcompile.compiler.pipeline import compile_model


def _node(op: str, dtypes, attrs=None, outputs: int = 1, names: str = "a", domain: str | None = None,
          omitted: tuple[int, ...] = ()) -> plain.Node:
    """A one-op node whose tensors are named after `names`; inputs at `omitted` left out ('')."""
    inputs = [plain.Variable("") if index in omitted else plain.Variable(f"{names}_in{index}", dtype=dtype)
              for index, dtype in enumerate(dtypes)]
    return plain.Node(op, name=f"{names}_{op}", attrs=dict(attrs or {}), inputs=inputs, domain=domain,
                   outputs=[plain.Variable(f"{names}_out{index}") for index in range(outputs)])


#: ops onnxruntime takes and refuses (no Erf kernel for int64, Sin of an integer type, an
#: unknown domain), optional inputs left out, tensor attributes
BACKEND_CASES = [
    ("Erf", [np.float32], {}), ("Erf", [np.int64], {}), ("Sin", [np.int32], {}), ("Relu", [np.int8], {}),
    ("Add", [np.float16, np.float16], {}), ("TopK", [np.int8, np.int64], {"outputs": 2}),
    ("Clip", [np.float32, np.float32, np.float32], {"omitted": (1,)}),
    ("Resize", [np.float32, np.float32, np.float32], {"omitted": (1,), "attrs": {"mode": "nearest"}}),
    ("ConstantOfShape", [np.int64], {"attrs": {"value": plain.Constant("v", np.array([2], np.int64))}}),
    ("Bogus", [np.float32], {"domain": "org.example"}),
]


@pytest.mark.parametrize("op,dtypes,extra", BACKEND_CASES, ids=[f"{op}-{dt[0].__name__}" for op, dt, _ in BACKEND_CASES])
def test_the_cached_backend_check_agrees_with_a_session_on_the_node_itself(monkeypatch, op, dtypes, extra):
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES", {})
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES_BY_KEY", {})
    opsets = {"": 17}
    first, second = (_node(op, dtypes, names=names, **extra) for names in ("a", "b"))
    types = [onnx_backends.numpy_dtype(t.dtype) for t in onnx_backends.node_inputs(first)]
    probed = onnx_backends.onnxruntime_session(onnx_backends.node_model(first, types, opsets)) is not None
    assert onnx_backends.runs_on_onnxruntime(first, opsets) == probed
    assert onnx_backends.runs_on_onnxruntime(second, opsets) == probed


def test_nodes_differing_only_in_names_share_one_session(monkeypatch):
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES", {})
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES_BY_KEY", {})
    probed = []
    session = onnx_backends.onnxruntime_session
    monkeypatch.setattr(onnx_backends, "onnxruntime_session", lambda model: probed.append(model) or session(model))
    opsets = {"": 17}
    same = [_node("Mul", [np.float32, np.float32], names=f"n{index}") for index in range(5)]
    same += [_node("ConstantOfShape", [np.int64], {"value": plain.Constant(f"c{index}_value", np.array([0], np.int64))},
                   names=f"c{index}") for index in range(2)]  # exporters name the value after its node
    for node in same:
        assert onnx_backends.cpu_backend(node, opsets) == onnx_backends.ONNXRUNTIME
    assert len(probed) == 2
    differing = [_node("Mul", [np.int32, np.int32]),  # another type
                 _node("Mul", [np.float32, np.float32], names="d"),  # the same, once more: no session
                 _node("ConstantOfShape", [np.int64], {"value": plain.Constant("v", np.array([0], np.int32))})]
    for node in differing:
        assert onnx_backends.cpu_backend(node, opsets) == onnx_backends.ONNXRUNTIME
    assert len(probed) == 4


def test_a_node_with_a_subgraph_is_asked_about_by_itself(monkeypatch):
    """An If's branches name tensors of the graph around it: renaming its inputs would change
    what they read, so it is never matched to another node."""
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES", {})
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES_BY_KEY", {})
    probed = []
    session = onnx_backends.onnxruntime_session
    monkeypatch.setattr(onnx_backends, "onnxruntime_session", lambda model: probed.append(model) or session(model))
    for names in ("a", "b"):
        outer = plain.Variable(f"{names}_outer", dtype=np.float32)
        neg, absolute = plain.Variable(f"{names}_neg", dtype=np.float32), plain.Variable(f"{names}_abs", dtype=np.float32)
        branch = plain.Graph([plain.Node("Neg", inputs=[outer], outputs=[neg])], [], [neg], "then")
        other = plain.Graph([plain.Node("Abs", inputs=[outer], outputs=[absolute])], [], [absolute], "else")
        node = plain.Node("If", name=f"{names}_if", inputs=[plain.Variable(f"{names}_cond", dtype=np.bool_)],
                       outputs=[plain.Variable(f"{names}_out")], attrs={"then_branch": branch, "else_branch": other})
        assert onnx_backends.cpu_backend(node, {"": 17}) == onnx_backends.ONNXRUNTIME
    assert len(probed) == 2
    assert onnx_backends._ONNXRUNTIME_TAKES == {}


def test_float64_and_a_tensor_read_twice_reach_onnxruntime():
    """numpy's float64 dtype compares equal to None, and a node reading one tensor twice (x * x)
    made a model defining it twice, which onnxruntime refuses: both fell to onnx.reference."""
    opsets = {"": 17}
    square = _node("Mul", [np.int64])
    square.inputs = [square.inputs[0], square.inputs[0]]
    for node in (_node("Sin", [np.float64]), _node("Add", [np.float64, np.float64]), square):
        assert onnx_backends.cpu_backend(node, opsets) == onnx_backends.ONNXRUNTIME


def test_a_plan_records_onnxruntime_for_float64_and_squaring_cpu_steps(save):
    """A float64 Sin and an int64 x * x run on the CPU (no NPU kernel takes either type)."""
    nodes = [helper.make_node("Cast", ["x"], ["wide"], name="widen", to=TensorProto.DOUBLE),
             helper.make_node("Sin", ["wide"], ["sine"], name="sine"),
             helper.make_node("Cast", ["sine"], ["y"], name="narrow", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["n", "n"], ["squared"], name="square")]
    path = save(make_model(nodes, [value_info("x", [1, 8]), value_info("n", [1, 8], TensorProto.INT64)],
                           [value_info("y", [1, 8]), value_info("squared", [1, 8], TensorProto.INT64)]))
    plan, _ = compile_model(path, "rk3588")
    backends = {step.nodes[0]: step.cpu_backend for step in plan.steps if step.device == "cpu"}
    assert backends["sine"] == backends["square"] == onnx_backends.ONNXRUNTIME


def test_a_node_of_a_known_key_builds_no_model(monkeypatch):
    """`anonymous_key` answers a node like one asked about before without building its one-node
    model; a node differing in an attribute value, an input type or its wiring is asked anew,
    but ConstantOfShape's fill value (one element of a type onnxruntime has) never decides."""
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES", {})
    monkeypatch.setattr(onnx_backends, "_ONNXRUNTIME_TAKES_BY_KEY", {})
    built = []
    node_model = onnx_backends.node_model
    monkeypatch.setattr(onnx_backends, "node_model", lambda *args: built.append(args[0]) or node_model(*args))
    opsets = {"": 17}

    def fill(value, names="a", op="ConstantOfShape", domain=None):
        return _node(op, [np.int64], {"value": plain.Constant(f"{names}_value", value)}, names=names, domain=domain)

    alike = [fill(np.array([value], np.float32), names=f"c{index}") for index, value in enumerate((0.5, -0.5, np.nan, 7))]
    for node in alike:
        assert onnx_backends.runs_on_onnxruntime(node, opsets)
    assert len(built) == 1
    square = _node("Mul", [np.float32])
    square.inputs = [square.inputs[0], square.inputs[0]]
    differing = [fill(np.array([0.5], np.float16)), fill(np.array([[0.5]], np.float32)),
                 fill(np.array([0.5], np.float32), domain="org.example"),
                 fill(np.array([1.5], np.float32), op="Bogus", domain="org.example"),
                 fill(np.array([2.5], np.float32), op="Bogus", domain="org.example"),
                 _node("Mul", [np.float32, np.float32]), square, _node("Mul", [np.int32, np.int32])]
    for node in differing:
        onnx_backends.runs_on_onnxruntime(node, opsets)
    assert len(built) == 1 + len(differing)
    keys = {onnx_backends.anonymous_key(node, [onnx_backends.numpy_dtype(t.dtype) for t in onnx_backends.node_inputs(node)], opsets)
            for node in alike + differing}
    assert len(keys) == 1 + len(differing)
