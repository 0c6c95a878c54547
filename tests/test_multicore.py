"""The multicore pass: seed 004's batch contexts and their I/O offsets, core-mask splits of
multi-core kernels only, one-line errors for impossible masks, and the zoo's estimates."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import ZOO, make_model, value_info, weight
from onnx import helper

from rkcompile.plan import cost_model
from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.errors import CompileError
from rkcompile.passes.multicore import split_axes
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import PlanRecord, contract_violations
from rkcompile.views.summary import render_summary
from rkcompile.targets import get_target

CNNS = ("resnet18_halfwidth", "mobilenet_v2", "squeezenet1_1", "lraspp_mobilenet_v3_large", "yolov8n")
#: Zoo models whose NPU kernels are mostly not multi-core on rk3588 (MatMul, exNorm, LSTM, ...).
FEW_MULTI_CORE = ("bert_mini", "transformer_encoder", "lstm_textcls")
CHANNELS, SIDE = 64, 64


def _two_convs():
    """Conv+Relu (ConvolutionRelu: multi-core on rk3588 and rk3576), then Conv+Sigmoid
    (ConvolutionSigmoid: multi-core on rk3576 only), each large enough that a split pays."""
    rng = np.random.default_rng(0)
    w = lambda name: weight(name, rng.standard_normal((CHANNELS, CHANNELS, 3, 3)).astype(np.float32) * 0.05)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["y"], name="sigmoid2"),
    ]
    shape = [1, CHANNELS, SIDE, SIDE]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)], [w("w1"), w("w2")])


def _elementwise_chain():
    """Sigmoid, Tanh and Softmax: none multi-core on rk3588."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"], name="sigmoid"),
             helper.make_node("Tanh", ["a"], ["b"], name="tanh"),
             helper.make_node("Softmax", ["b"], ["y"], name="softmax", axis=1)]
    shape = [1, 32, 16, 16]
    return make_model(nodes, [value_info("x", shape)], [value_info("y", shape)])


@pytest.fixture(scope="module")
def two_convs(tmp_path_factory):
    path = tmp_path_factory.mktemp("multicore") / "two_convs.onnx"
    onnx.save(_two_convs(), str(path))
    return path


def _plan(path, target, batch=1, core_mask="auto"):
    plan, _ = compile_model(path, target, Options(batch=batch, core_mask=core_mask))
    assert contract_violations(plan) == []
    return plan


@pytest.mark.parametrize("target,batch,contexts", [
    ("rk3588", 2, 2), ("rk3588", 3, 3), ("rk3588", 8, 3),
    ("rk3576", 2, 2), ("rk3576", 3, 2), ("rk3576", 8, 2),
    ("rk3562", 2, 1), ("rk3562", 8, 1),
])
def test_batch_contexts_follow_seed_004(two_convs, target, batch, contexts):
    """Batch 2 duplicates the context once, 3 or more twice (three contexts on three cores);
    RK3576 uses two cores, RK3562 one; image i runs in context i mod contexts on its core."""
    multicore = _plan(two_convs, target, batch).multicore
    assert multicore.cores == contexts and len(multicore.contexts) == contexts and multicore.batch == batch
    for context in multicore.contexts:
        assert context.core == context.id
        assert context.images == tuple(range(context.id, batch, contexts))
    assert [t.core for t in multicore.per_core] == list(range(contexts))
    assert all(t.steps == multicore.per_core[0].steps and t.steps for t in multicore.per_core)


def test_io_offsets_are_image_times_input_size_over_batch(two_convs):
    """Seed 004, 4.1.4.3: the queried sizes are batch times one image's; each context reads
    image i at i * input_size / batch and writes its outputs likewise."""
    batch = 5
    plan = _plan(two_convs, "rk3588", batch)
    for name, side in (("x", "inputs"), ("y", "outputs")):
        batched = batch * plan.tensors[name].bytes
        slices = sorted((io for c in plan.multicore.contexts for io in getattr(c, side) if io.tensor == name),
                        key=lambda io: io.image)
        assert [io.image for io in slices] == list(range(batch))
        assert [io.offset for io in slices] == [i * batched // batch for i in range(batch)]
        assert slices[-1].offset + slices[-1].bytes == batched
        assert all(io.bytes == plan.tensors[name].bytes == CHANNELS * SIDE * SIDE * 4 for io in slices)


def test_weights_are_shared_by_the_contexts(two_convs):
    one, three = _plan(two_convs, "rk3588", 1), _plan(two_convs, "rk3588", 3)
    assert three.memory == one.memory and three.tensors == one.tensors


def test_a_batch_costs_one_run_per_context_and_its_images_one_after_another(two_convs):
    """Without DDR contention a context with m images takes run + m * image; sharing the DDR
    can only slow that, so the speedup is at most batch * (run + image) / (run + m * image)."""
    run = cost_model.RUN_SECONDS * 1e3
    for target, cores in (("rk3588", 3), ("rk3576", 2), ("rk3562", 1)):
        single = _plan(two_convs, target).multicore
        image = single.est_one_core_ms - run
        for batch in (2, 3, 6):
            multicore = _plan(two_convs, target, batch).multicore
            assert multicore.est_one_core_ms == single.est_one_core_ms
            assert multicore.est_fps == pytest.approx(batch / multicore.est_latency_ms * 1e3, rel=1e-3)
            uncontended = run + -(-batch // cores) * image
            assert multicore.est_latency_ms >= uncontended - 1e-3
            assert multicore.speedup <= batch * single.est_one_core_ms / uncontended + 1e-3
            if cores == 1:  # nothing to contend with
                assert multicore.est_latency_ms == pytest.approx(uncontended, abs=1e-3)


@pytest.mark.parametrize("target,mask", [("rk3588", "0_1_2"), ("rk3576", "0_1")])
def test_core_mask_splits_only_multi_core_kernels_along_allowed_axes(two_convs, target, mask):
    plan = _plan(two_convs, target, 1, mask)
    spec = get_target(target)
    cores = tuple(int(c) for c in mask.split("_"))
    split_steps = {split.step for split in plan.multicore.splits}
    assert split_steps, "conv-sized multi-core steps should split"
    for split in plan.multicore.splits:
        step = plan.steps[split.step]
        assert split.kernel in spec.multi_core_kernels and split.axis in split_axes(split.kernel)
        assert step.cores == cores == tuple(part.core for part in split.parts)
        _, channels, height, _ = plan.tensors[step.outputs[0]].shape
        extent = channels if split.axis == "C" else height
        assert split.parts[0].start == 0 and split.parts[-1].stop == extent
        if split.axis == "C":  # whole C2 blocks per core, so each writes whole NC1HWC2 planes
            assert all(part.start % spec.c2_for(plan.dtype) == 0 for part in split.parts)
    for step in plan.steps:
        if step.device == "npu" and step.id not in split_steps:
            assert step.cores == (cores[0],)
    kernels = {plan.steps[s].kernel for s in split_steps}
    # ConvolutionSigmoid is multi-core on RK3576 (oplist V2.3.2) but not on RK3588.
    assert ("ConvSigmoid" in kernels) == (target == "rk3576") and "ConvRelu" in kernels
    assert 1.0 < plan.multicore.speedup and len(plan.multicore.per_core) == plan.multicore.cores == len(cores)


def test_plan_json_round_trips_contexts_and_splits(two_convs):
    for plan in (_plan(two_convs, "rk3588", 4), _plan(two_convs, "rk3576", 1, "0_1")):
        data = json.loads(plan.to_json())
        assert PlanRecord.from_dict(data) == plan
        assert set(data["multicore"]) >= {"cores", "batch", "contexts", "core_mask", "per_core", "est_latency_ms",
                                          "est_fps", "speedup", "splits"}
        assert set(data["multicore"]["per_core"][0]) >= {"core", "steps", "est_ms"}
    older = json.loads(plan.to_json())
    older["multicore"] = {"cores": 1, "batch": 1}
    assert PlanRecord.from_dict(older).multicore.contexts == ()


def test_no_multi_core_kernel_means_one_core_and_no_speedup(save):
    plan = _plan(save(_elementwise_chain()), "rk3588", 1, "0_1_2")
    assert plan.multicore.splits == () and plan.multicore.cores == 1 and plan.multicore.speedup == 1.0
    assert all(step.cores == (0,) for step in plan.steps if step.device == "npu")


@pytest.mark.parametrize("target,batch,mask,message", [
    ("rk3576", 1, "0_1_2", "--core-mask 0_1_2: rk3576 has 2 NPU cores; use auto, 0, 1, 0_1"),
    ("rk3576", 1, "2", "--core-mask 2: rk3576 has 2 NPU cores"),
    ("rk3562", 1, "1", "--core-mask 1: rk3562 has 1 NPU core; use auto, 0"),
    ("rk3588", 2, "0_1", "--core-mask 0_1 with --batch 2: multi-batch contexts schedule their own cores"),
])
def test_impossible_masks_are_one_line_errors(two_convs, capsys, target, batch, mask, message):
    with pytest.raises(CompileError, match=message):
        compile_model(two_convs, target, Options(batch=batch, core_mask=mask))
    code = main(["plan", str(two_convs), "--target", target, "--batch", str(batch), "--core-mask", mask, "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"error: {message}") and err.count("\n") == 1 and "Traceback" not in err


def test_a_mask_the_cli_does_not_know_is_a_usage_error(two_convs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(two_convs), "--target", "rk3588", "--core-mask", "0_2"])
    assert exit_info.value.code == 2 and "invalid choice: '0_2'" in capsys.readouterr().err


def test_summary_shows_the_per_core_timeline_and_the_speedup(two_convs):
    plan = _plan(two_convs, "rk3588", 3)
    text = render_summary(plan)
    assert "NPU cores                   3 for batch 3 (3 contexts)" in text
    assert f"{plan.multicore.speedup:.2f}x one core" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
    assert [int(row[0]) for row in rows] == [0, 1, 2] and all(row[1] == "1" for row in rows)


needs_zoo_models = pytest.mark.skipif(not all((ZOO / f"{m}.onnx").is_file() for m in CNNS + FEW_MULTI_CORE),
                                      reason="../shared/zoo is not present")


@needs_zoo_models
@pytest.mark.parametrize("model", CNNS)
def test_zoo_cnns_use_three_cores_at_batch_3_on_rk3588(model):
    multicore = _plan(ZOO / f"{model}.onnx", "rk3588", 3).multicore
    assert multicore.cores == 3 and 2.5 <= multicore.speedup <= 3.0


@needs_zoo_models
@pytest.mark.parametrize("model", FEW_MULTI_CORE)
def test_one_input_over_three_cores_gains_little_when_few_kernels_are_multi_core(model):
    plan = _plan(ZOO / f"{model}.onnx", "rk3588", 1, "0_1_2")
    npu = [s for s in plan.steps if s.device == "npu"]
    multi = [s for s in npu if s.id in {split.step for split in plan.multicore.splits}]
    assert len(multi) <= len(npu) / 4 and 1.0 <= plan.multicore.speedup <= 1.3


@needs_zoo_models
def test_rk3562_always_reports_one_core():
    for batch in (1, 3, 8):
        plan = _plan(ZOO / "squeezenet1_1.onnx", "rk3562", batch)
        assert plan.multicore.cores == 1 and len(plan.multicore.per_core) == 1
        assert all(step.cores == (0,) for step in plan.steps if step.device == "npu")


def test_a_fused_activation_saves_its_dram_round_trip_and_time(tmp_path):
    """Conv then Relu run as one ConvRelu: the Conv's output never goes to DRAM, so the plan's
    DRAM traffic is one read and one write of that tensor below the same graph whose Conv
    output is also a graph output (so the two cannot fuse), and the estimate is faster."""
    plans = []
    for conv_output_too in (False, True):
        model = _two_convs()
        if conv_output_too:
            model.graph.output.append(value_info("c1", [1, CHANNELS, SIDE, SIDE]))
        path = tmp_path / f"exposed_{conv_output_too}.onnx"
        onnx.save(model, str(path))
        plans.append(_plan(path, "rk3588"))
    fused, unfused = plans
    assert len(unfused.steps) > len(fused.steps)
    c1 = unfused.tensors["c1"].bytes
    assert unfused.multicore.dram_bytes_per_image - fused.multicore.dram_bytes_per_image >= 2 * c1
    assert unfused.multicore.est_latency_ms > fused.multicore.est_latency_ms
    assert "layout steps                0" in render_summary(fused)
    assert "DRAM traffic" in render_summary(fused)
