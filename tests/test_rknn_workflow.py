"""The workflow rknn-toolkit2 users expect (issue 38): shapes checked when planning, the batch
counted in images, API errors in the API's terms, artifacts written and checked one way,
per-step performance and memory totals."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import rkcompile
from conftest import REPO, make_model, value_info, weight
from rkcompile.cli import main
from rkcompile.errors import CompileError
from rkcompile.views.summary import render_summary

TINY = REPO / "examples" / "tiny_cnn.onnx"


def _one_error_line(capsys, *argv) -> str:
    """The one `error:` line a failing command prints."""
    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _symbolic(dims: dict[int, str], path) -> str:
    """tiny_cnn with the input dims `dims` (axis -> symbol) left symbolic, saved at `path`."""
    model = onnx.load(str(TINY))
    declared = model.graph.input[0].type.tensor_type.shape.dim
    for axis, symbol in dims.items():
        declared[axis].dim_param = symbol
    onnx.save(model, str(path))
    return str(path)


def test_an_input_shape_changing_a_static_dim_is_refused(capsys):
    err = _one_error_line(capsys, "plan", str(TINY), "--target", "rk3588", "--input-shape", "image:1,5,64,64")
    assert "input 'image'" in err and "dim 1" in err and "5" in err and "3" in err


def test_an_input_shape_restating_the_static_shape_is_accepted(capsys, tmp_path):
    assert main(["plan", str(TINY), "--target", "rk3588", "--input-shape", "image:1,3,64,64", "--quiet"]) == 0
    artifact = tmp_path / "tiny.rkplan"
    rkcompile.compile(TINY, "rk3588").save(artifact)
    assert main(["run", "--plan", str(artifact), "--input-shape", "image:1,3,64,64"]) == 0
    err = _one_error_line(capsys, "run", "--plan", str(artifact), "--input-shape", "image:1,3,32,32")
    assert "image:1,3,32,32" in err and "planned with image:1,3,64,64" in err and "(" + "1, 3" not in err


def test_a_symbolic_dim_given_a_count_the_weights_refuse_is_one_line(capsys, tmp_path):
    model = _symbolic({1: "C"}, tmp_path / "symbolic.onnx")
    err = _one_error_line(capsys, "plan", model, "--target", "rk3588", "--input-shape", "image:1,5,64,64")
    assert "input 'image'" in err and "dim 1" in err and "Conv" in err and "needs 3" in err
    with pytest.raises(CompileError, match="needs 3"):
        rkcompile.compile(model, "rk3588", input_shapes={"image": (1, 5, 64, 64)})
    assert rkcompile.compile(model, "rk3588", input_shapes={"image": (1, 3, 64, 64)}).record.steps


def test_a_failing_shape_inference_names_the_input_shape_given(capsys, save):
    gemm = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [value_info("x", ["N", "K"])],
                      [value_info("y", ["N", 4])], [weight("w", np.zeros((4, 7), np.float32))])
    err = _one_error_line(capsys, "plan", str(save(gemm)), "--target", "rk3588", "--input-shape", "x:1,5")
    assert "shape inference failed with input shape x:1,5" in err


def test_batch_fills_a_symbolic_batch_dim_and_the_summary_says_so(tmp_path):
    model = _symbolic({0: "N"}, tmp_path / "batch_n.onnx")
    plan = rkcompile.compile(model, "rk3588", batch=4)
    assert plan.record.model.inputs[0].shape == (1, 3, 64, 64) and plan.record.model.batch_dims == {"image": "N"}
    assert "batch 4: 4 contexts of 1 image, dim 0 ('N') of input 'image' planned as 1" in plan.summary()
    assert rkcompile.load(plan.save(tmp_path / "n.rkplan")).record.model.batch_dims == {"image": "N"}


def test_a_plan_counts_images_whichever_way_the_batch_was_set(tmp_path):
    """Four images in the graph's batch dim are four images: the fps counts them all."""
    model = _symbolic({0: "N"}, tmp_path / "batch_n.onnx")
    one = rkcompile.compile(model, "rk3588", input_shapes={"image": (1, 3, 64, 64)}).record
    four = rkcompile.compile(model, "rk3588", input_shapes={"image": (4, 3, 64, 64)}).record
    assert (one.images, four.images) == (1, 4)
    assert four.multicore.est_fps == pytest.approx(4e3 / four.multicore.est_latency_ms, rel=1e-3)
    assert "batch 4: 1 context of 4 images" in render_summary(four)
    static = rkcompile.compile(TINY, "rk3588").record  # no batch dim: the JSON is as before
    assert "batch_dims" not in static.to_dict()["model"] and static.images == 1


@pytest.mark.parametrize("batch", [0, -1, 1.5, True])
def test_the_api_refuses_a_batch_that_is_no_positive_integer(batch):
    with pytest.raises(CompileError, match=r"^batch="):
        rkcompile.compile(TINY, "rk3588", batch=batch)


def test_api_errors_name_api_parameters_not_flags(tmp_path):
    with pytest.raises(CompileError) as refused:
        rkcompile.compile(TINY, "rk3588", dtype="int8", calibration=tmp_path / "missing")
    assert str(refused.value).startswith("calibration: ") and "--" not in str(refused.value)
    with pytest.raises(CompileError) as refused:
        rkcompile.compile(_symbolic({0: "N"}, tmp_path / "n.onnx"), "rk3588")
    assert "input_shapes" in str(refused.value) and "--" not in str(refused.value)


@pytest.mark.parametrize("keyword, ours", [("dataset", "calibration="), ("target_platform", "target="),
                                           ("quantized_algorithm", "calibration_method="),
                                           ("do_quantization", "dtype='int8'"), ("rknn_batch_size", "batch=")])
def test_rknn_toolkit_keywords_get_a_hint_naming_ours(keyword, ours):
    with pytest.raises(CompileError, match=f"rknn-toolkit2's {keyword}; rkcompile.compile takes {ours}"):
        rkcompile.compile(TINY, "rk3588", **{keyword: "x"})


def test_rknn_toolkit_mean_values_per_input_are_taken(tmp_path):
    from rkcompile.api import _options

    options = _options(None, {"mean_values": [[123.675, 116.28, 103.53]], "std_values": [[58.395, 57.12, 57.375]]})
    assert options.mean_values == (123.675, 116.28, 103.53) and options.std_values == (58.395, 57.12, 57.375)
    with pytest.raises(CompileError, match="std_values: one number per channel"):
        _options(None, {"std_values": [[1.0, 2.0], [3.0]]})


def test_plan_output_writes_what_plan_save_writes(tmp_path, capsys):
    import zipfile

    written, saved = tmp_path / "cli.rkplan", tmp_path / "api.rkplan"
    assert main(["plan", str(TINY), "--target", "rk3588", "--quiet", "-o", str(written)]) == 0
    rkcompile.compile(TINY, "rk3588").save(saved)
    with zipfile.ZipFile(written) as cli, zipfile.ZipFile(saved) as api:
        assert sorted(cli.namelist()) == sorted(api.namelist())
        assert all(cli.read(name) == api.read(name) for name in api.namelist())
    capsys.readouterr()
    assert main(["run", "--plan", str(written), "--accuracy-analysis"]) == 0
    assert "cosine" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["-v", "targets"], ["targets", "-v"],
                                  ["plan", str(TINY), "-v", "--target", "rk3588", "--quiet"],
                                  ["plan", str(TINY), "--target", "rk3588", "--quiet", "--verbose"]])
def test_verbose_is_taken_anywhere_on_the_command_line(argv, capsys):
    from rkcompile.cli import build_parser, command_named

    assert build_parser(command_named(argv)).parse_args(argv).verbose is True
    assert main(argv) == 0


@pytest.mark.parametrize("target", ["rv1106", "rv1103"])
def test_float16_on_rv1106_is_refused_even_with_an_op_on_the_npu(target, save, capsys):
    """A Conv (int8 only there) and a Relu (any dtype): 1 of 2 ops on the NPU planned before."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                        helper.make_node("Relu", ["c"], ["y"], name="relu")],
                       [value_info("x", [1, 3, 8, 8])], [value_info("y", [1, 4, 6, 6])],
                       [weight("w", np.ones((4, 3, 3, 3), np.float32))])
    path = save(model)
    err = _one_error_line(capsys, "plan", str(path), "--target", target)
    assert "rv1106's NPU runs Conv in int8 only" in err and "1 of 2 ops on the NPU" in err and "--dtype int8" in err
    with pytest.raises(CompileError, match="dtype int8"):
        rkcompile.compile(path, target)
    assert main(["plan", str(path), "--target", target, "--dtype", "int8", "--quiet"]) == 0


def test_run_inputs_reads_an_image_as_calibration_does(tmp_path, capsys):
    from PIL import Image

    from rkcompile.quantization.params import ImagePreprocessing, read_image

    image, array = tmp_path / "cat.png", tmp_path / "cat.npy"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    how = ImagePreprocessing((123.675, 116.28, 103.53), (58.395, 57.12, 57.375), "BGR")
    spec = rkcompile.compile(TINY, "rk3588").record.model.inputs[0]
    np.save(array, read_image(image, spec, how, "test"))
    flags = ["--mean-values", "123.675,116.28,103.53", "--std-values", "58.395,57.12,57.375", "--channel-order", "BGR"]
    from_image, from_array = tmp_path / "image.npz", tmp_path / "array.npz"
    assert main(["run", str(TINY), "--target", "rk3588", "--inputs", str(image), *flags,
                 "--outputs", str(from_image)]) == 0
    assert main(["run", str(TINY), "--target", "rk3588", "--inputs", str(array), "--outputs", str(from_array)]) == 0
    assert np.array_equal(np.load(from_image)["logits"], np.load(from_array)["logits"])
    err = _one_error_line(capsys, "run", str(TINY), "--target", "rk3588", "--inputs", str(tmp_path / "dog.png"))
    assert "--inputs" in err and "dog.png" in err


def _rewrite_artifact(source, target, change) -> None:
    """Copy the artifact `source` to `target`, member by member, through `change(name, data)`:
    the new bytes, or None to leave the member out."""
    import zipfile

    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            data = change(name, old.read(name))
            if data is not None:
                new.writestr(name, data)


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    return rkcompile.compile(TINY, "rk3588").save(tmp_path_factory.mktemp("artifact") / "tiny.rkplan")


def test_an_artifact_member_changed_after_saving_is_refused(saved_tiny, tmp_path, capsys):
    changed = tmp_path / "changed.rkplan"
    _rewrite_artifact(saved_tiny, changed, lambda name, data: bytes([data[0] ^ 1]) + data[1:]
                      if name == "weights.bin" else data)
    with pytest.raises(CompileError, match="weights.bin does not match its sha256"):
        rkcompile.load(changed)
    err = _one_error_line(capsys, "run", "--plan", str(changed))
    assert "weights.bin does not match its sha256" in err


def test_an_artifact_without_digests_still_loads(saved_tiny, tmp_path):
    older = tmp_path / "older.rkplan"
    _rewrite_artifact(saved_tiny, older, lambda name, data: None if name == "digests.json" else data)
    assert rkcompile.load(older).weights == rkcompile.load(saved_tiny).weights


def test_a_weights_member_inflating_past_its_plan_is_refused_without_reading_it(saved_tiny, tmp_path):
    import time
    import tracemalloc
    import zipfile

    bomb = tmp_path / "bomb.rkplan"
    _rewrite_artifact(saved_tiny, bomb, lambda name, data: None if name in ("weights.bin", "digests.json") else data)
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("weights.bin", "w", force_zip64=True) as member:
        zeros = bytes(1 << 20)
        for _ in range(256):
            member.write(zeros)
    assert bomb.stat().st_size < 2 << 20
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(CompileError, match=r"member weights.bin is 268435456 bytes, but its plan allows exactly"):
        rkcompile.load(bomb)
    seconds, (_, peak) = time.perf_counter() - started, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 2 and peak < 32 << 20


def test_the_weight_members_are_stored_and_a_deflated_artifact_loads_alike(saved_tiny, tmp_path):
    """Weights do not deflate, and inflating them was most of a load: both weight members are
    stored as they are; an artifact that deflated them (as older ones did) loads and analyses the same."""
    import zipfile

    with zipfile.ZipFile(saved_tiny) as archive:
        methods = {info.filename: info.compress_type for info in archive.infolist()}
    assert methods["weights.bin"] == methods["reference_weights.npz"] == zipfile.ZIP_STORED
    assert methods["plan.json"] == zipfile.ZIP_DEFLATED
    deflated = tmp_path / "deflated.rkplan"
    _rewrite_artifact(saved_tiny, deflated, lambda name, data: data)
    with zipfile.ZipFile(deflated) as archive:
        assert archive.getinfo("weights.bin").compress_type == zipfile.ZIP_DEFLATED
    stored, older = rkcompile.load(saved_tiny), rkcompile.load(deflated)
    inputs = {spec.name: np.ones(spec.shape, np.float32) for spec in stored.record.model.inputs}
    assert older.weights == stored.weights
    assert rkcompile.accuracy_analysis(older, inputs) == rkcompile.accuracy_analysis(stored, inputs)


def test_the_reference_weights_are_read_on_first_analysis_and_checked_then(saved_tiny, tmp_path):
    """Running a loaded plan needs no reference weights: load reads them only when accuracy
    analysis asks, and then refuses them if the file no longer holds what it held at load time."""
    changed = tmp_path / "changed.rkplan"
    changed.write_bytes(saved_tiny.read_bytes())
    plan = rkcompile.load(changed)
    inputs = {spec.name: np.ones(spec.shape, np.float32) for spec in plan.record.model.inputs}
    assert "nodes" not in vars(plan.reference_nodes)  # not read yet
    rkcompile.run(plan, inputs)
    assert "nodes" not in vars(plan.reference_nodes)
    _rewrite_artifact(saved_tiny, changed, lambda name, data: bytes([data[0] ^ 1]) + data[1:]
                      if name == "reference_weights.npz" else data)
    with pytest.raises(CompileError, match="reference_weights.npz changed since the plan was loaded"):
        rkcompile.accuracy_analysis(plan, inputs)
    with pytest.raises(CompileError, match="reference_weights.npz does not match its sha256"):
        rkcompile.accuracy_analysis(rkcompile.load(changed), inputs)


def test_an_unknown_member_is_refused(saved_tiny, tmp_path):
    extra = tmp_path / "extra.rkplan"
    _rewrite_artifact(saved_tiny, extra, lambda name, data: data)
    import zipfile

    with zipfile.ZipFile(extra, "a") as archive:
        archive.writestr("../../evil.sh", b"rm -rf /")
    with pytest.raises(CompileError, match="unknown member '../../evil.sh'"):
        rkcompile.load(extra)


def test_a_deeply_nested_plan_is_one_error_line(saved_tiny, tmp_path, capsys):
    nested = "[" * 200_000 + "]" * 200_000
    deep = tmp_path / "deep.rkplan"
    _rewrite_artifact(saved_tiny, deep, lambda name, data: None if name == "digests.json" else
                      nested.encode() if name == "plan.json" else data)
    (tmp_path / "deep.json").write_text(nested)
    for path in (deep, tmp_path / "deep.json"):
        err = _one_error_line(capsys, "run", "--plan", str(path), str(TINY), "--target", "rk3588")
        assert "nested too deep" in err


def test_run_refuses_an_arena_beyond_the_memory_available(saved_tiny, capsys, monkeypatch):
    from rkcompile.commands import run

    arena = rkcompile.load(saved_tiny).record.memory.arena_bytes
    monkeypatch.setattr(run, "available_memory", lambda: arena - 1)
    err = _one_error_line(capsys, "run", "--plan", str(saved_tiny))
    assert f"arena is {arena} bytes" in err and f"{arena - 1} bytes" in err
    monkeypatch.undo()
    assert main(["run", "--plan", str(saved_tiny)]) == 0


@pytest.mark.parametrize("options, total_is", [({}, "est_latency_ms"), ({"core_mask": "0_1_2"}, "est_latency_ms"),
                                               ({"batch": 3}, "est_one_core_ms")])
def test_perf_steps_add_up_to_the_summarys_estimate(options, total_is, tmp_path, capsys):
    import csv

    model = REPO.parent / "shared" / "zoo" / "yolov8n.onnx"
    plan = rkcompile.compile(model if model.exists() else TINY, "rk3588", **options)
    saved = plan.save(tmp_path / "p.rkplan")
    table = tmp_path / "perf.csv"
    assert main(["perf", str(saved), "--csv", str(table)]) == 0
    out = capsys.readouterr().out
    total_us = float(next(line for line in out.splitlines() if line.startswith("total")).split()[-2])
    assert total_us == pytest.approx(getattr(plan.record.multicore, total_is) * 1e3, abs=0.1)
    with open(table, newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["Step", "Device", "Kernel", "Nodes", "MAC Count", "Bytes Read", "Bytes Written",
                             "Estimated us", "Network%", "Name"]
    assert len(rows) == len(plan.record.steps) + 1  # and the run's fixed cost
    assert sum(float(row["Estimated us"]) for row in rows) == pytest.approx(total_us, abs=0.1)
    assert sum(float(row["Network%"]) for row in rows) == pytest.approx(100, abs=0.0005 * len(rows))  # 3 decimals
    assert sum(int(row["MAC Count"]) for row in rows) == sum(step.macs for step in plan.record.steps)


def test_perf_plans_a_model_and_plan_csv_writes_the_summary_figures(tmp_path, capsys):
    import csv

    figures = tmp_path / "summary.csv"
    assert main(["perf", str(TINY), "--target", "rk3588"]) == 0
    assert "kernel" in capsys.readouterr().out
    assert main(["plan", str(TINY), "--target", "rk3588", "--quiet", "--csv", str(figures)]) == 0
    with open(figures, newline="") as stream:
        (row,) = list(csv.DictReader(stream))
    plan = rkcompile.compile(TINY, "rk3588").record
    assert (row["target"], int(row["steps"]), float(row["est_fps"])) == ("rk3588", len(plan.steps),
                                                                        plan.multicore.est_fps)


def test_memory_totals_count_every_region_and_context(tmp_path):
    import json

    one = rkcompile.compile(TINY, "rk3588").record
    three = rkcompile.compile(TINY, "rk3588", batch=3).record
    inputs = sum(t.bytes for t in one.tensors.values() if t.region == "input")
    outputs = sum(t.bytes for t in one.tensors.values() if t.region == "output")
    total = one.memory_totals().total_bytes
    assert one.memory.cpu_arena_bytes > 0  # the Erf's tensors, in host memory
    assert total == one.memory.weight_bytes + one.memory.arena_bytes + one.memory.cpu_arena_bytes + inputs + outputs
    assert three.memory_totals().total_bytes == (three.memory.weight_bytes + 3 * three.memory.arena_bytes
                                                 + 3 * three.memory.cpu_arena_bytes + 3 * (inputs + outputs))
    assert json.loads(three.to_json())["memory"]["total_bytes"] == three.memory_totals().total_bytes
    assert "memory total" in render_summary(three) and "x 3 contexts" in render_summary(three)
    older = json.loads(one.to_json())
    del older["memory"]["total_bytes"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    loaded = rkcompile.load(tmp_path / "older.json").record
    assert loaded == one and loaded.memory_totals().total_bytes == total
    assert "memory total" in render_summary(loaded)


def test_memory_totals_name_the_weights_cpu_partitions_read(save):
    """A Conv the NPU cannot run (a 3-D weight: Conv1d) reads its weight on the CPU."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[70])],
                       [value_info("x", [1, 3, 200])], [value_info("y", [1, 4, 60])],
                       [weight("w", np.ones((4, 3, 3), np.float32))])
    plan = rkcompile.compile(save(model), "rk3588").record
    totals = plan.memory_totals()
    cpu_steps = [step for step in plan.steps if step.device == "cpu"]
    assert cpu_steps and totals.cpu_weight_bytes == plan.tensors["w"].bytes
    assert "the CPU partitions read" in render_summary(plan)


def test_partition_graph_holds_partitions_steps_and_what_flows(tmp_path):
    import networkx

    plan = rkcompile.compile(TINY, "rk3588")
    graph = plan.partition_graph()
    record = plan.record
    steps = [n for n, kind in graph.nodes(data="kind") if kind == "step"]
    partitions = [n for n, kind in graph.nodes(data="kind") if kind == "partition"]
    assert (len(steps), len(partitions)) == (len(record.steps), len(record.partitions))
    first = graph.nodes["step:1"]
    assert (first["device"], first["kernel"], first["macs"]) == ("npu", record.steps[1].kernel, record.steps[1].macs)
    assert first["est_us"] > 0 and first["bytes_read"] > 0 and first["partition"] == record.steps[1].partition
    # every tensor a step reads from another step is an edge between them, with its bytes
    for step in record.steps[1:]:
        for name in step.inputs:
            source = next((s for s in record.steps if name in s.outputs), None)
            if source is not None:
                edge = graph.edges[f"step:{source.id}", f"step:{step.id}"]
                assert name in edge["tensors"].split() and edge["bytes"] >= record.tensors[name].bytes
    assert sum(graph.nodes[p]["est_us"] for p in partitions) == pytest.approx(
        record.multicore.est_latency_ms * 1e3 - 730, abs=0.1)
    path = tmp_path / "tiny.graphml"
    assert main(["graph", str(TINY), "--target", "rk3588", "-o", str(path)]) == 0
    back = networkx.read_graphml(path)
    assert set(back.nodes) == set(graph.nodes) and back.number_of_edges() == graph.number_of_edges()


def test_planning_never_imports_networkx(tmp_path):
    import subprocess
    import sys

    code = ("import sys, rkcompile; rkcompile.compile(sys.argv[1], 'rk3588').save(sys.argv[2]); "
            "assert 'networkx' not in sys.modules, 'networkx imported'")
    finished = subprocess.run([sys.executable, "-c", code, str(TINY), str(tmp_path / "t.rkplan")], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
