"""Consecutive CPU steps run as one onnxruntime session (emulator/cpu_partition.py) give what
the per-node sessions give, bit for bit, observed step by step too; when the session cannot be
made the steps run one by one as before."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkcompile.api import prepare
from rkcompile.options import Options
from rkcompile.emulator import cpu_partition, emulate, make_inputs
from rkcompile.emulator.cpu_partition import CpuPartition, cpu_runs

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Conv on the NPU, then Erf, TopK, Cast and Sin on the CPU at rk3588 (Erf and Sin are not in
    its NPU operator list; TopK's indices are int64), then an NPU Add of two CPU results."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Erf", ["c"], ["e"]),
             helper.make_node("TopK", ["e", "k"], ["v", "i"], axis=-1),
             helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Sin", ["f"], ["s"]),
             helper.make_node("Add", ["v", "s"], ["y"])]
    graph = helper.make_graph(nodes, "cpu_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 3])],
                              [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.array([3], np.int64), "k")])
    path = tmp_path_factory.mktemp("cpu_partition") / "cpu_chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def execute(path, monkeypatch=None, per_node=False):
    """(outputs, every step's observed outputs, the prepared plan)."""
    prepared = prepare(path, "rk3588", Options())
    if per_node:
        monkeypatch.setattr(cpu_partition, "SMALLEST_RUN", len(prepared.plan.steps) + 1)
    observed = {}
    outputs = emulate(prepared, make_inputs(prepared.plan, {}, seed=2),
                      lambda step, values: observed.update({(step, k): v for k, v in values.items()})).outputs
    return outputs, observed, prepared


def assert_same(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for key in first:
        assert first[key].dtype == second[key].dtype
        np.testing.assert_array_equal(first[key], second[key])


def test_a_cpu_run_is_one_session_and_equals_the_per_node_path(model, monkeypatch):
    outputs, observed, prepared = execute(model)
    (partition,) = prepared.weight_cache.partitions.values()
    assert [step.kernel for step in partition.steps] == ["Erf", "TopK", "Cast", "Sin"]
    assert len([s for s in partition.sessions.values() if s is not None]) == 1
    assert not prepared.weight_cache.cpu.sessions  # no per-node session was made
    per_node_outputs, per_node_observed, per_node = execute(model, monkeypatch, per_node=True)
    assert not per_node.weight_cache.partitions and len(per_node.weight_cache.cpu.sessions) == 4
    assert_same(outputs, per_node_outputs)
    assert_same(observed, per_node_observed)  # every CPU step's outputs, as stored, each step


def test_a_run_onnxruntime_refuses_as_a_whole_runs_step_by_step(model, monkeypatch):
    monkeypatch.setattr(CpuPartition, "_session", lambda self, feeds: None)
    outputs, _, prepared = execute(model)
    assert len(prepared.weight_cache.cpu.sessions) == 4
    monkeypatch.undo()
    assert_same(outputs, execute(model)[0])


def test_cpu_runs_are_the_maximal_runs_of_two_or_more_steps():
    kinds = "ccnccchcn"
    assert cpu_runs(list(kinds), lambda kind: kind == "c") == {0: [0, 1], 3: [3, 4, 5]}
    assert cpu_runs(list("ncn"), lambda kind: kind == "c") == {}


def test_cpu_nodes_alike_but_for_their_names_share_one_session_and_values_keep_theirs_apart():
    """A CPU node's session is one of the node renamed by position: two IsNaN steps (one per
    attention layer) make one session; different wiring (x * x against x * y) or a different
    attribute value (ConstantOfShape's fill, which does not decide whether onnxruntime takes
    the node) makes another, and each node gets its own values."""
    from rkcompile.plan import plain_nodes as plain

    from rkcompile.emulator.reference import CpuRuntime
    from rkcompile.onnx_backends import ONNXRUNTIME

    def node(op, name, inputs, outputs, dtype=np.float32, **attrs):
        return plain.Node(op, name, attrs, inputs=[plain.Variable(n, dtype=dtype) for n in inputs],
                       outputs=[plain.Variable(n) for n in outputs])

    runtime = CpuRuntime(17, {})
    x = np.array([1.0, np.nan, 3.0], np.float32)
    (first,) = runtime.run(node("IsNaN", "layer0", ["a"], ["b"]), [x], ONNXRUNTIME, [])
    (second,) = runtime.run(node("IsNaN", "layer1", ["c"], ["d"]), [x[::-1].copy()], ONNXRUNTIME, [])
    assert first.tolist() == [False, True, False] and second.tolist() == [False, True, False]
    assert len(runtime.sessions) == 1
    y = np.array([2.0, 2.0, 2.0], np.float32)
    (square,) = runtime.run(node("Mul", "square", ["x", "x"], ["s"]), [x, x], ONNXRUNTIME, [])
    (product,) = runtime.run(node("Mul", "product", ["x", "y"], ["p"]), [x, y], ONNXRUNTIME, [])
    np.testing.assert_array_equal(square, x * x)
    np.testing.assert_array_equal(product, x * y)
    assert len(runtime.sessions) == 3
    shape = np.array([2], np.int64)
    fills = [runtime.run(node("ConstantOfShape", f"fill{value}", ["shape"], ["out"], np.int64,
                              value=plain.Constant(f"value{value}", np.array([value], np.float32))),
                         [shape], ONNXRUNTIME, [])[0].tolist() for value in (1.0, 7.0)]
    assert fills == [[1.0, 1.0], [7.0, 7.0]] and len(runtime.sessions) == 5
