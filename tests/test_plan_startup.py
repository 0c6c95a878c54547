"""What a plan process pays before and around the passes (issue 18, tools/bench_plan.py): the
modules a float16 plan imports, and the CPU backend check, asked once per distinct node."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from conftest import make_model, value_info, weight
from onnx import TensorProto, helper

from rkcompile.emulator import reference

#: modules only int8 calibration, --auto-float16, the emulator or a CPU step need
NOT_FOR_A_FLOAT16_PLAN = ("rkcompile.api", "rkcompile.auto_float16", "rkcompile.emulator.executor",
                          "rkcompile.emulator.kernels", "rkcompile.emulator.int8", "onnx.reference", "onnxruntime",
                          "tqdm")

PROBE_IMPORTS = """
import json, sys
from rkcompile.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": [name for name in %r if name in sys.modules]}))
"""


def test_a_float16_plan_imports_nothing_it_does_not_run(save):
    """Conv -> Relu, all on the NPU: nothing is calibrated, emulated, folded or left to the CPU."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    path = save(make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16])],
                           [weight("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32))]))
    finished = subprocess.run([sys.executable, "-c", PROBE_IMPORTS % (NOT_FOR_A_FLOAT16_PLAN,), "plan", str(path),
                               "--target", "rk3588", "--quiet"], capture_output=True, text=True, check=True)
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "loaded": []}


def _node(op: str, dtypes, attrs=None, outputs: int = 1, names: str = "a", domain: str | None = None,
          omitted: tuple[int, ...] = ()) -> gs.Node:
    """A one-op node whose tensors are named after `names`; inputs at `omitted` left out ('')."""
    inputs = [gs.Variable.empty() if index in omitted else gs.Variable(f"{names}_in{index}", dtype=dtype)
              for index, dtype in enumerate(dtypes)]
    return gs.Node(op, name=f"{names}_{op}", attrs=dict(attrs or {}), inputs=inputs, domain=domain,
                   outputs=[gs.Variable(f"{names}_out{index}") for index in range(outputs)])


#: ops onnxruntime takes and refuses (no Erf kernel for int64, Sin of an integer type, an
#: unknown domain), optional inputs left out, tensor attributes
BACKEND_CASES = [
    ("Erf", [np.float32], {}), ("Erf", [np.int64], {}), ("Sin", [np.int32], {}), ("Relu", [np.int8], {}),
    ("Add", [np.float16, np.float16], {}), ("TopK", [np.int8, np.int64], {"outputs": 2}),
    ("Clip", [np.float32, np.float32, np.float32], {"omitted": (1,)}),
    ("Resize", [np.float32, np.float32, np.float32], {"omitted": (1,), "attrs": {"mode": "nearest"}}),
    ("ConstantOfShape", [np.int64], {"attrs": {"value": gs.Constant("v", np.array([2], np.int64))}}),
    ("Bogus", [np.float32], {"domain": "org.example"}),
]


@pytest.mark.parametrize("op,dtypes,extra", BACKEND_CASES, ids=[f"{op}-{dt[0].__name__}" for op, dt, _ in BACKEND_CASES])
def test_the_cached_backend_check_agrees_with_a_session_on_the_node_itself(monkeypatch, op, dtypes, extra):
    monkeypatch.setattr(reference, "_ONNXRUNTIME_TAKES", {})
    opsets = {"": 17}
    first, second = (_node(op, dtypes, names=names, **extra) for names in ("a", "b"))
    types = [reference.numpy_dtype(t.dtype) for t in reference.node_inputs(first)]
    probed = reference.onnxruntime_session(reference.node_model(first, types, opsets)) is not None
    assert reference.runs_on_onnxruntime(first, opsets) == probed
    assert reference.runs_on_onnxruntime(second, opsets) == probed


def test_nodes_differing_only_in_names_share_one_session(monkeypatch):
    monkeypatch.setattr(reference, "_ONNXRUNTIME_TAKES", {})
    probed = []
    session = reference.onnxruntime_session
    monkeypatch.setattr(reference, "onnxruntime_session", lambda model: probed.append(model) or session(model))
    opsets = {"": 17}
    same = [_node("Mul", [np.float32, np.float32], names=f"n{index}") for index in range(5)]
    same += [_node("ConstantOfShape", [np.int64], {"value": gs.Constant(f"c{index}_value", np.array([0], np.int64))},
                   names=f"c{index}") for index in range(2)]  # exporters name the value after its node
    for node in same:
        assert reference.cpu_backend(node, opsets) == reference.ONNXRUNTIME
    assert len(probed) == 2
    differing = [_node("Mul", [np.int32, np.int32]),  # another type
                 _node("Mul", [np.float32, np.float32], names="d"),  # the same, once more: no session
                 _node("ConstantOfShape", [np.int64], {"value": gs.Constant("v", np.array([1], np.int64))})]
    for node in differing:
        assert reference.cpu_backend(node, opsets) == reference.ONNXRUNTIME
    assert len(probed) == 4


def test_a_node_with_a_subgraph_is_asked_about_by_itself(monkeypatch):
    """An If's branches name tensors of the graph around it: renaming its inputs would change
    what they read, so it is never matched to another node."""
    monkeypatch.setattr(reference, "_ONNXRUNTIME_TAKES", {})
    probed = []
    session = reference.onnxruntime_session
    monkeypatch.setattr(reference, "onnxruntime_session", lambda model: probed.append(model) or session(model))
    for names in ("a", "b"):
        outer = gs.Variable(f"{names}_outer", dtype=np.float32)
        branch = gs.Graph(nodes=[gs.Node("Neg", inputs=[outer], outputs=[gs.Variable(f"{names}_neg", dtype=np.float32)])])
        branch.outputs = branch.nodes[0].outputs
        other = gs.Graph(nodes=[gs.Node("Abs", inputs=[outer], outputs=[gs.Variable(f"{names}_abs", dtype=np.float32)])])
        other.outputs = other.nodes[0].outputs
        node = gs.Node("If", name=f"{names}_if", inputs=[gs.Variable(f"{names}_cond", dtype=np.bool_)],
                       outputs=[gs.Variable(f"{names}_out")], attrs={"then_branch": branch, "else_branch": other})
        assert reference.cpu_backend(node, {"": 17}) == reference.ONNXRUNTIME
    assert len(probed) == 2
    assert reference._ONNXRUNTIME_TAKES == {}
