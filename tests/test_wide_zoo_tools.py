"""The wide-zoo tools (tools/make_wide_zoo.py, tools/run_peer_zoo.py, tools/wide_zoo_table.py):
the measure tolerates a crashing model, groups CPU causes by op, reduces the peer's report to the
committed shape, and the committed peer results cover the generator's models. None of this needs
torch or the peer: the exporters and rknn-toolkit2 run only in tools/."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import REPO, TOOLS, load_tool

PEER_RESULTS = TOOLS / "wide_zoo" / "peer_rk3588.json"


@pytest.fixture(scope="module")
def table():
    return load_tool("wide_zoo_table")


def test_table_reports_a_model_that_fails_to_plan_and_goes_on(table, tmp_path, capsys):
    shutil.copy(REPO / "examples" / "tiny_cnn.onnx", tmp_path / "good.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    out = tmp_path / "rows.json"
    assert table.main([str(tmp_path), "--target", "rk3588", "--peer", str(tmp_path / "none.json"),
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {r["model"]: r["plans"]["rk3588"] for r in json.loads(out.read_text())["rows"]}
    assert rows["broken"]["error"] and "broken@rk3588:" in text
    good = rows["good"]
    assert good["error"] is None and good["cpu"] == len(good["cpu_nodes"]) >= 1  # tiny_cnn keeps an Erf on the CPU
    assert "| good |" in text and "Erf x1" in text
    assert table.main(["unused", "--rows-from", str(out), "--peer", str(tmp_path / "none.json")]) == 0
    assert capsys.readouterr().out == text  # the same table, re-rendered without planning


def test_top_causes_group_cpu_nodes_by_op_most_first(table):
    nodes = ([{"op": "Reshape", "reason": "Reshape on t: rule A (oplist)"}] * 3
             + [{"op": "Cast", "reason": "Cast on t: not listed"}] * 2
             + [{"op": "Reshape", "reason": "Reshape on t: rule B"}]
             + [{"op": "Erf", "reason": "Erf on t: x"}, {"op": "Abs", "reason": "Abs on t: y"}])
    causes = table.top_causes(nodes)
    assert [(op, n) for op, n, _ in causes] == [("Reshape", 4), ("Cast", 2), ("Abs", 1)]
    assert causes[0][2] == "Reshape on t: rule A (oplist)"
    assert table.short_reason(causes[0][2]) == "rule A"


def test_an_internal_error_names_its_type_and_innermost_frame(table):
    def fails():
        raise KeyError("tensor_7")
    try:
        fails()
    except KeyError as exc:
        text = table._describe_exception(exc)
    assert text.startswith("KeyError: 'tensor_7' (at ") and "in fails)" in text


def test_peer_report_is_reduced_to_the_shared_shape():
    peer = load_tool("run_peer_zoo")
    built = peer.summarize({"ok": True, "steps": {"build": 0}, "build_seconds": 2.5,
                            "counts": {"compute_by_target": {"NPU": 5, "CPU": 1}, "cpu_layers": ["Gather (Gather:g)"]},
                            "fused_op_types": ["ConvRelu"]})
    assert built == {"built": True, "error": None, "compute_layers_by_target": {"NPU": 5, "CPU": 1},
                     "cpu_layers": ["Gather (Gather:g)"], "fused_kernels": ["ConvRelu"],
                     "simulator_min_cosine": None, "build_seconds": 2.5}
    traceback_text = "exception: ValueError: Traceback (most recent call last):\n  File x\nIndexError: out of range\n"
    failed = peer.summarize({"ok": False, "steps": {"load_onnx": 0, "build": traceback_text}, "errors": []})
    assert failed["built"] is False and failed["error"] == "build: IndexError: out of range"


def test_peer_runner_needs_the_peer_python(tmp_path, capsys):
    peer = load_tool("run_peer_zoo")
    assert peer.main([str(tmp_path), "--python", str(tmp_path / "missing-python")]) == 2
    assert capsys.readouterr().err.startswith("error: the peer venv's python is needed")


def test_committed_peer_results_cover_the_generators_models():
    generator = load_tool("make_wide_zoo")
    names = {spec.name for spec in generator.SPECS}
    assert len(names) == len(generator.SPECS) >= 40
    results = json.loads(PEER_RESULTS.read_text())
    assert results["target"] == "rk3588" and results["dtype"] == "float16"
    assert set(results["models"]) <= names
    for entry in results["models"].values():
        assert entry["built"] == (entry["error"] is None)
        assert entry["compute_layers_by_target"].get("CPU", 0) == len(entry["cpu_layers"])


def test_generator_rejects_an_unknown_model(tmp_path, capsys):
    generator = load_tool("make_wide_zoo")
    assert generator.main([str(tmp_path), "--only", "no_such_model"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown model(s): no_such_model")


FAKE_PEER = '''
import json, sys
import onnx
model = sys.argv[1]
opset = max(o.version for o in onnx.load(model).opset_import if o.domain in ("", "ai.onnx"))
if opset > 19:
    print(json.dumps({"ok": False, "steps": {"config": 0, "load_onnx": -1},
                      "errors": [f"load_onnx: Unsupport onnx opset {opset}, need <= 19!"]}))
else:
    print(json.dumps({"ok": True, "steps": {"build": 0}, "build_seconds": 1.0, "fused_op_types": ["ConvRelu"],
                      "counts": {"compute_by_target": {"NPU": opset}, "cpu_layers": []}}))
'''


def test_a_model_the_peer_refuses_for_its_opset_is_built_again_down_converted(tmp_path):
    import onnx
    from onnx import version_converter
    peer = load_tool("run_peer_zoo")
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    tiny = onnx.load(str(REPO / "examples" / "tiny_cnn.onnx"))
    onnx.save(version_converter.convert_version(tiny, 20), str(zoo / "new_opset.onnx"))
    onnx.save(tiny, str(zoo / "old_opset.onnx"))
    (tmp_path / "fake_peer.py").write_text(FAKE_PEER)
    out = tmp_path / "peer.json"
    assert peer.main([str(zoo), "--python", sys.executable, "--peer", str(tmp_path / "fake_peer.py"),
                      "--out", str(out)]) == 0
    models = json.loads(out.read_text())["models"]
    assert models["new_opset"]["built"] and models["new_opset"]["compute_layers_by_target"] == {"NPU": 19}
    assert models["new_opset"]["error_as_exported"] == "load_onnx: Unsupport onnx opset 20, need <= 19!"
    assert "converted to opset 19" in models["new_opset"]["note"]
    assert models["old_opset"]["built"] and "note" not in models["old_opset"]


def test_random_weights_are_exercised_zero_heads_redrawn_and_batchnorm_calibrated():
    torch = pytest.importorskip("torch")  # a tool dependency (the wide-zoo extra), not the project's
    generator = load_tool("make_wide_zoo")
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 4)
    torch.nn.init.zeros_(head.weight)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), head).eval()
    x = torch.randn(1, 3, 16, 16)
    generator.exercise_random_weights(model, (x,))
    assert head.weight.abs().min() > 0 and not model.training and not model[1].training
    assert not torch.allclose(model[1].running_var, torch.ones(8))  # statistics of the calibration batches
    assert not torch.allclose(model[1].running_mean, torch.zeros(8))
    pooled = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.BatchNorm2d(3)).eval()
    generator.exercise_random_weights(pooled, (x,))  # one value per channel: train-mode BatchNorm refuses it
    assert torch.equal(pooled[1].running_var, torch.ones(3))
    with torch.no_grad():
        assert model(x).abs().max() > 1e-3


def test_peer_inputs_are_the_peer_simulators_draws_and_the_cosine_column_flags_a_lower_one(tmp_path, capsys):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    peer_table = load_tool("peer_table")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["ids_float"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "bias"], ["sum"]), helper.make_node("Mul", ["sum", "ids_float"], ["y"])],
        "two_inputs",
        [helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 4]),  # an initializer listed as input
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "bias")])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), model)
    inputs = peer_table.peer_inputs(model)
    rng = np.random.default_rng(0)  # rknn_peer.py's gen(): per input in order, dynamic dims as 1
    assert list(inputs) == ["x", "ids"]
    np.testing.assert_array_equal(inputs["x"], (rng.random([1, 4]) * 2 - 1).astype(np.float32))
    np.testing.assert_array_equal(inputs["ids"], rng.integers(0, 4, [1, 4]).astype(np.int64))
    assert peer_table.peer_cosine([1.0, 2.0], [2.0, 4.0]) == pytest.approx(1.0)
    assert peer_table.peer_cosine([0.0], [1.0]) is None
    assert np.isnan(peer_table.peer_cosine([np.nan, 1.0], [1.0, 1.0]))

    def row(ours, theirs):
        return {"model": "m", "ours": {"error": None, "npu_steps": 1, "layout_steps": 0, "arena_bytes": 64,
                                      "cpu_nodes": 0},
                "cosine": {"error": None, "min_cosine": ours, "cosines": {"y": ours}},
                "peer": {"built": True, "npu_layers": 1, "cpu_layers": 0, "layout_layers": 0,
                         "internal_bytes": 64, "simulator_min_cosine": theirs}}
    assert "LOW" not in peer_table.render([row(0.999995, 0.999999)])
    low = peer_table.render([row(0.99998, 0.999999)])
    assert "0.99998000 / 0.99999900 LOW" in low and "below the peer's simulator - 1e-05 on 1 of 1 models" in low
    assert "LOW" in peer_table.render([row(float("nan"), 0.999999)])


def test_cosine_row_runs_our_plan_on_the_peer_inputs_against_onnxruntime():
    peer_table = load_tool("peer_table")
    row = peer_table.cosine_row(sys.executable, None, REPO / "examples" / "tiny_cnn.onnx", "rk3588", 600)
    assert row["error"] is None and set(row["cosines"]) and 0.9999 < row["min_cosine"] <= 1.0 + 1e-12
