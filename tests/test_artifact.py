"""The plan artifact (.rkplan): written by `rkcompile plan -o`, executed by `rkcompile run --plan`
without the model, bit-identical to `rkcompile run MODEL`; weights come from the weight region
at their planned offsets, so tampering with it shows."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, ZOO, needs_zoo, zoo_models

import rkcompile
from rkcompile.cli import main
from rkcompile.errors import CompileError
from rkcompile.plan.schema import PlanRecord

TINY = REPO / "examples" / "tiny_cnn.onnx"
RKCOMPILE = Path(sys.executable).with_name("rkcompile")


def rkcompile_cli(*argv: str) -> subprocess.CompletedProcess:
    """The command in a fresh process, as a user runs it."""
    return subprocess.run([str(RKCOMPILE), *argv], capture_output=True, text=True, check=False)


def plan_and_compare(model: Path, tmp_path: Path, *options: str, inputs: Path | None = None) -> None:
    """plan -o, then run --plan in a fresh process, against run MODEL: bit-identical outputs."""
    artifact, saved, direct = tmp_path / "m.rkplan", tmp_path / "saved.npz", tmp_path / "direct.npz"
    given = ["--inputs", str(inputs)] if inputs is not None else []
    planned = rkcompile_cli("plan", str(model), "--target", "rk3588", *options, "--quiet", "-o", str(artifact))
    assert planned.returncode == 0, planned.stderr
    ran = rkcompile_cli("run", "--plan", str(artifact), *given, "--outputs", str(saved))
    assert ran.returncode == 0, ran.stderr
    assert main(["run", str(model), "--target", "rk3588", *options, *given, "--outputs", str(direct)]) == 0
    with np.load(saved) as a, np.load(direct) as b:
        assert a.files == b.files
        for name in a.files:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("options", [(), ("--dtype", "int8")], ids=["float16", "int8"])
def test_a_saved_plan_runs_without_the_model_bit_identical_to_run_model(tmp_path, options):
    plan_and_compare(TINY, tmp_path, *options)


@pytest.mark.slow
@needs_zoo
@pytest.mark.parametrize("model", zoo_models(), ids=lambda path: path.stem)
def test_every_zoo_model_saved_loaded_and_run_is_bit_identical(model, tmp_path):
    plan_and_compare(model, tmp_path, inputs=model.with_suffix(".npz"))


def test_the_artifact_holds_the_plan_and_the_weight_region(tmp_path):
    path = rkcompile.compile(TINY, "rk3588").save(tmp_path / "tiny.rkplan")
    with zipfile.ZipFile(path) as archive:
        data = json.loads(archive.read("plan.json"))
        weights = archive.read("weights.bin")
    plan = PlanRecord.from_dict(data)
    assert data["schema"] == "rkcompile.plan/2" and len(weights) == plan.memory.weight_bytes
    assert all(step.operation is not None and step.operation.outputs for step in plan.steps)
    fused = [step for step in plan.steps if "body" in step.operation.attributes]
    assert fused and all(step.operation.attributes["body"]["graph"]["nodes"] for step in fused)
    # each weight's bytes are where the plan says, in its planned dtype: an NPU conv weight in float16
    conv = next(s for s in plan.steps if s.device == "npu" and s.operation.op in ("Conv", "ConvRelu"))
    name = conv.operation.inputs[1]
    placed = plan.tensors[name]
    assert placed.region == "weight" and placed.dtype == "float16"
    stored = np.frombuffer(weights[placed.offset:placed.offset + placed.bytes], np.float16)
    assert np.isfinite(stored).all() and np.abs(stored).max() > 0


def weight_of_first_conv(plan: PlanRecord) -> str:
    step = next(s for s in plan.steps if s.device == "npu" and len(s.operation.inputs) > 1
                and plan.tensors[s.operation.inputs[1]].region == "weight")
    return step.operation.inputs[1]


def rewrite_artifact(source: Path, target: Path, edit_plan=None, edit_weights=None) -> None:
    with zipfile.ZipFile(source) as archive:
        data = json.loads(archive.read("plan.json"))
        weights = bytearray(archive.read("weights.bin"))
    if edit_plan:
        edit_plan(data)
    if edit_weights:
        edit_weights(data, weights)
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("plan.json", json.dumps(data))
        archive.writestr("weights.bin", bytes(weights))


@pytest.fixture
def saved_tiny(tmp_path):
    """The saved example and its loaded plan; runs take seeded random inputs (the same each run)."""
    path = rkcompile.compile(TINY, "rk3588").save(tmp_path / "tiny.rkplan")
    return path, {}, rkcompile.load(path)


def test_a_corrupted_weight_byte_changes_the_output(saved_tiny, tmp_path):
    path, inputs, plan = saved_tiny
    good = rkcompile.run(plan, inputs)
    name = weight_of_first_conv(plan.record)
    offset = plan.record.tensors[name].offset

    def corrupt(data, weights):
        weights[offset + 1] ^= 0x40  # the high byte of the first float16: its exponent

    rewrite_artifact(path, tmp_path / "corrupt.rkplan", edit_weights=corrupt)
    bad = rkcompile.run(rkcompile.load(tmp_path / "corrupt.rkplan"), inputs)
    assert any(not np.array_equal(good[k], bad[k]) for k in good)


def test_a_moved_weight_offset_is_refused_or_changes_the_output(saved_tiny, tmp_path):
    path, inputs, plan = saved_tiny
    good = rkcompile.run(plan, inputs)
    name = weight_of_first_conv(plan.record)
    other = next(n for n, t in plan.record.tensors.items() if t.region == "weight" and n != name
                 and t.bytes >= plan.record.tensors[name].bytes)

    def move(data):
        data["tensors"][name]["offset"] = data["tensors"][other]["offset"]

    rewrite_artifact(path, tmp_path / "moved.rkplan", edit_plan=move)
    try:
        bad = rkcompile.run(rkcompile.load(tmp_path / "moved.rkplan"), inputs)
    except CompileError as refused:
        assert "overlap" in str(refused) or "outside" in str(refused)
    else:
        assert any(not np.array_equal(good[k], bad[k]) for k in good)


def test_a_plan_1_json_file_still_loads_and_runs_with_its_model(tmp_path, capsys):
    saved = tmp_path / "plan.json"
    assert main(["plan", str(TINY), "--target", "rk3588", "--quiet", "--json", str(saved)]) == 0
    data = json.loads(saved.read_text())
    data["schema"] = "rkcompile.plan/1"
    for step in data["steps"]:
        del step["operation"]
    saved.write_text(json.dumps(data))
    old = rkcompile.load(saved)
    assert old.record.steps[0].operation is None and old.record.schema == "rkcompile.plan/2"
    with pytest.raises(CompileError, match="no weight region"):
        rkcompile.run(old, {})
    outputs = tmp_path / "out.npz"
    assert main(["run", str(TINY), "--target", "rk3588", "--plan", str(saved), "--outputs", str(outputs)]) == 0
    assert outputs.is_file()


def test_run_refuses_an_artifact_of_another_model_and_bad_files_in_one_line(tmp_path, capsys):
    artifact = tmp_path / "tiny.rkplan"
    rkcompile.compile(TINY, "rk3588").save(artifact)
    other = ZOO / "squeezenet1_1.onnx" if ZOO.is_dir() else REPO / "pyproject.toml"
    assert main(["run", str(other), "--plan", str(artifact)]) == 1
    assert "planned from another model" in capsys.readouterr().err
    assert main(["run", "--plan", str(artifact), "--target", "rk3576"]) == 1
    assert "planned for rk3588, not rk3576" in capsys.readouterr().err
    assert main(["run", "--plan", str(artifact), "--accuracy-analysis"]) == 0
    assert "worst 5 steps by cosine" in capsys.readouterr().out
    broken = tmp_path / "broken.rkplan"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("plan.json", "{}")
    assert main(["run", "--plan", str(broken)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no weights.bin" in err and err.count("\n") == 1
    assert main(["run"]) == 1
    assert "run needs MODEL and --target" in capsys.readouterr().err


def test_plan_output_writes_nothing_when_planning_fails(tmp_path, capsys):
    artifact = tmp_path / "tiny.rkplan"
    assert main(["plan", str(TINY), "--target", "rk3588", "--strict", "-o", str(artifact)]) == 1
    assert not artifact.exists() and not list(tmp_path.iterdir())


def test_each_cpu_partition_is_a_standalone_onnx_model_that_computes_what_the_emulator_did(tmp_path):
    """cpu/partition_<id>.onnx, run by onnx.reference on the values the emulator fed the partition,
    gives what the emulator's CPU steps wrote."""
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from rkcompile.emulator.session import emulate, make_inputs

    scale = helper.make_tensor("scale", TensorProto.FLOAT, [1, 4, 1, 1], [0.5, 1.5, -2.0, 3.0])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 1, 1], np.linspace(-1, 1, 12).tolist())
    model = helper.make_model(helper.make_graph([
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Erf", ["c"], ["e"], name="erf"),
        helper.make_node("Mul", ["e", "scale"], ["m"], name="mul"),
        helper.make_node("Erf", ["m"], ["y"], name="erf2"),
    ], "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [scale, weight]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "chain.onnx")
    for source in (TINY, tmp_path / "chain.onnx"):
        plan = rkcompile.load(rkcompile.compile(source, "rk3588").save(tmp_path / f"{source.stem}.rkplan"))
        with zipfile.ZipFile(tmp_path / f"{source.stem}.rkplan") as archive:
            saved = {int(name[len("cpu/partition_"):-len(".onnx")]): onnx.load_from_string(archive.read(name))
                     for name in archive.namelist() if name.startswith("cpu/")}
        assert set(saved) == {p.id for p in plan.record.partitions if p.device == "cpu"} != set()
        inputs = make_inputs(plan.record, {})
        seen = dict(inputs)
        emulate(plan.prepared(), inputs, lambda step, values: seen.update(values))
        for partition_model in saved.values():
            onnx.checker.check_model(partition_model)
            feeds = {i.name: seen[i.name] for i in partition_model.graph.input}
            results = ReferenceEvaluator(partition_model).run(None, feeds)
            for output, value in zip(partition_model.graph.output, results):
                np.testing.assert_allclose(value, seen[output.name], rtol=1e-6, atol=1e-6)


def test_run_refuses_planning_flags_that_contradict_a_saved_artifact(tmp_path, capsys):
    """A saved artifact runs as planned: --dtype, --batch, --calib... that differ from it would be
    silently ignored, so they are refused in one line; restating the artifact's own is harmless."""
    artifact, calib = tmp_path / "tiny.rkplan", tmp_path / "calib.npz"
    rkcompile.compile(TINY, "rk3588").save(artifact)
    np.savez(calib, **{spec.name: np.zeros(spec.shape, np.float32) for spec in PlanRecord.from_dict(
        json.loads(zipfile.ZipFile(artifact).read("plan.json"))).model.inputs})
    refused = [(["--dtype", "int8"], "--dtype int8 contradicts"), (["--batch", "2"], "--batch 2 contradicts"),
               (["--dtype", "int8", "--calib", str(calib)], "--dtype int8 contradicts"),
               (["--input-shape", "x:1,3,8,8"], "--input-shape")]
    for flags, message in refused:
        assert main(["run", "--plan", str(artifact), *flags]) == 1, flags
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and "runs as planned" in err and err.count("\n") == 1
    assert main(["run", "--plan", str(artifact), "--dtype", "float16", "--batch", "1"]) == 0
    assert "ran" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_accuracy_analysis_of_a_loaded_artifact_equals_the_in_process_one(tmp_path, dtype):
    """The artifact keeps the model's own weights (reference_weights.npz), so the float reference
    a loaded plan compares with is the compiled one: the same rows, to the bit."""
    plan = rkcompile.compile(TINY, "rk3588", dtype=dtype)
    loaded = rkcompile.load(plan.save(tmp_path / "tiny.rkplan"))
    inputs = {spec.name: np.random.default_rng(3).standard_normal(spec.shape).astype(np.float32)
              for spec in plan.record.model.inputs}
    expected = rkcompile.accuracy_analysis(plan, inputs)
    assert expected and rkcompile.accuracy_analysis(loaded, inputs) == expected
