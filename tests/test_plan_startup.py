"""What a plan process pays around the passes (issue 18, tools/bench_plan.py): the modules a
float16 plan imports, the collections its start-up skips, the interpreter teardown the command
skips, and the BLAS threads it does without."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, value_info, weight
from onnx import TensorProto, helper


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"
#: modules only int8 calibration, --auto-float16, the emulator or a CPU step need
NOT_FOR_A_FLOAT16_PLAN = ("rkcompile.api", "rkcompile.compiler.auto_float16", "rkcompile.emulator.executor",
                          "rkcompile.emulator.kernels", "rkcompile.emulator.int8", "onnx.reference", "onnxruntime",
                          "tqdm", "rkcompile.quantization.params", "rkcompile.passes.quantize", "rkcompile.passes.int8_accuracy")

PROBE_IMPORTS = """
import json, sys
from rkcompile.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": [name for name in %r if name in sys.modules]}))
"""


def _conv_relu() -> list:
    return [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"], name="relu")]


def _conv_reshaped_by_shape_arithmetic() -> list:
    """The exporter's shape chain around a Reshape: Shape -> Gather -> Unsqueeze, Slice, Mul,
    Cast, Concat, all folded by onnx.reference."""
    return [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Shape", ["c"], ["s"], name="shape"),
            helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
            helper.make_node("Unsqueeze", ["n", "zeros"], ["n1"], name="unsqueeze"),
            helper.make_node("Slice", ["s", "one", "two"], ["channels"], name="slice"),
            helper.make_node("Slice", ["s", "two", "four"], ["hw"], name="slice_hw"),
            helper.make_node("Mul", ["hw", "one"], ["hw1"], name="mul"),
            helper.make_node("Cast", ["hw1"], ["hw2"], name="cast", to=TensorProto.INT64),
            helper.make_node("Concat", ["n1", "channels", "hw2"], ["target"], name="concat", axis=0),
            helper.make_node("Reshape", ["c", "target"], ["r"], name="reshape"),
            helper.make_node("Relu", ["r"], ["y"], name="relu")]


def _conv_plus_folded_position_code() -> list:
    """A position code computed from constants, as vision transformers' exporters leave it
    (edgenext: CumSum over a mask, then a Conv): both folded by onnx.reference."""
    return [helper.make_node("CumSum", ["mask", "axis"], ["rows"], name="cumsum"),
            helper.make_node("Conv", ["rows", "wp"], ["code"], name="position_conv"),
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "code"], ["r"], name="add"),
            helper.make_node("Relu", ["r"], ["y"], name="relu")]


@pytest.mark.parametrize("nodes, folds", [(_conv_relu, False), (_conv_reshaped_by_shape_arithmetic, True),
                                          (_conv_plus_folded_position_code, True)])
def test_a_float16_plan_imports_nothing_it_does_not_run(save, tmp_path, nodes, folds):
    """All on the NPU: nothing is calibrated, emulated or left to the CPU; onnx.reference,
    what folds with, only where something folds."""
    rng = np.random.default_rng(0)
    constants = [weight("w", rng.standard_normal((8, 8, 3, 3)).astype(np.float32)),
                 weight("zero", np.array(0, np.int64)), weight("zeros", np.array([0], np.int64))]
    constants += [weight(name, np.array([value], np.int64)) for name, value in (("one", 1), ("two", 2), ("four", 4))]
    constants += [weight("mask", np.ones((1, 1, 16, 16), np.float32)), weight("axis", np.array(2, np.int32)),
                  weight("wp", rng.standard_normal((8, 1, 1, 1)).astype(np.float32))]
    path = save(make_model(nodes(), [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16])], constants))
    plan_path = tmp_path / "plan.json"
    finished = subprocess.run([sys.executable, "-c", PROBE_IMPORTS % (NOT_FOR_A_FLOAT16_PLAN,), "plan", str(path),
                               "--target", "rk3588", "--quiet", "--json", str(plan_path)],
                              capture_output=True, text=True, check=True)
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "loaded": ["onnx.reference"] if folds else []}
    devices = {node["name"]: node["device"] for node in json.loads(plan_path.read_text())["nodes"]}
    assert {node.name for node in nodes() if devices[node.name] == "folded"} == (
        {node.name for node in nodes()} - {"conv", "reshape", "add", "relu"})


@pytest.mark.parametrize("written", [None, "--json", "--output"])
def test_a_plan_only_summarized_leaves_its_cpu_steps_backends_undecided(save, tmp_path, written):
    """Deciding a CPU step's backend asks onnxruntime (importing it takes about 20 ms); the
    summary never shows it, a written plan records it."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("IsNaN", ["c"], ["y"], name="isnan")]
    w = weight("w", np.ones((8, 8, 3, 3), np.float32))
    path = save(make_model(nodes, [value_info("x", [1, 8, 16, 16])], [value_info("y", [1, 8, 16, 16], TensorProto.BOOL)], [w]))
    written_to = tmp_path / ("plan.json" if written == "--json" else "plan.rkplan")
    finished = subprocess.run([sys.executable, "-c", PROBE_IMPORTS % (("onnxruntime",),), "plan", str(path),
                               "--target", "rk3588", *([written, str(written_to)] if written else [])],
                              capture_output=True, text=True, check=True)
    assert "isnan" in finished.stdout  # the summary names the CPU step
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "loaded": [] if written is None else ["onnxruntime"]}
    if written == "--json":
        steps = json.loads(written_to.read_text())["steps"]
        assert [step["cpu_backend"] for step in steps if step["device"] == "cpu"] == ["onnxruntime"]


#: `at_exit(callback)`: the callback registered as an exit handler once the command runs, as the
#: modules it imports register theirs (logging, tempfile): console_main ends the process after
#: the handlers registered from its start on
AT_EXIT = """
import atexit
import rkcompile.cli as cli


def at_exit(callback):
    execute = cli._execute

    def registering(args):
        atexit.register(callback)
        return execute(args)

    cli._execute = registering
"""

EXIT_PROBE = AT_EXIT + """
import sys


class Teardown:
    def __del__(self):
        print("torn down", flush=True)


kept = Teardown()  # freed by the interpreter's teardown only
at_exit(lambda: print("exit handler ran"))
cli.console_main() if sys.argv.pop(1) == "console_main" else sys.exit(cli.main())
"""


@pytest.mark.parametrize("entry", ["console_main", "main"])
def test_the_command_exits_after_its_exit_handlers_without_the_teardown(tmp_path, entry):
    """console_main (the `rkcompile` script, `python -m rkcompile`) skips the teardown that
    `sys.exit(main())` runs; the summary, the plan file, the exit handlers and the exit code
    are the same."""
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    finished = subprocess.run([sys.executable, "-c", EXIT_PROBE, entry, "plan", str(model), "--target", "rk3588",
                               "--json", str(tmp_path / "plan.json")], capture_output=True, text=True)
    assert finished.returncode == 0
    assert finished.stdout.startswith("Network summary for tiny_cnn.onnx")
    assert json.loads((tmp_path / "plan.json").read_text())["target"] == "rk3588"
    lines = finished.stdout.splitlines()
    assert lines[-1 if entry == "console_main" else -2] == "exit handler ran"
    assert ("torn down" in finished.stdout) == (entry == "main")
    missing = subprocess.run([sys.executable, "-c", EXIT_PROBE, entry, "plan", str(tmp_path / "missing.onnx"),
                              "--target", "rk3588"], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ")


def test_the_command_under_a_profiler_exits_normally_so_the_profile_is_written(tmp_path):
    """`python -m cProfile -o OUT -m rkcompile plan ...` writes OUT at the normal exit, which
    console_main would otherwise skip."""
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    profile = tmp_path / "plan.prof"
    finished = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "rkcompile", "plan",
                               str(model), "--target", "rk3588", "--quiet"], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    assert profile.stat().st_size > 0


COLLECTION_PROBE = AT_EXIT + """
import gc
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
before = len(collections)
at_exit(lambda: print(len(collections) - before, gc.get_freeze_count() > 0))
cli.console_main()
"""


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_float16_plan_process_runs_no_collection(tmp_path, dtype):
    """The imports of a plan process (numpy, onnx, onnx-graphsurgeon, the pipeline) triggered
    ~75 cyclic collections, each walking all they had made so far, and the pipeline's paused
    collector, back on after it, walked everything the plan had made (291 ms on tv_maxvit_t).
    console_main pauses the collector while the modules load and freezes what they made, and a
    float16 plan keeps it off to the exit. An int8 plan runs
    and drops candidate plans, so it collects."""
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    finished = subprocess.run([sys.executable, "-c", COLLECTION_PROBE, "plan", str(model), "--target", "rk3588",
                               "--dtype", dtype, "--quiet"], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    collections, frozen = finished.stdout.split()
    assert frozen == "True"
    assert int(collections) == 0 if dtype == "float16" else int(collections) > 0


BLAS_PROBE = AT_EXIT + """
import os, sys
loaded_with = []
class WatchNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not loaded_with:
            loaded_with.append(os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
        return None
sys.meta_path.insert(0, WatchNumpy())
at_exit(lambda: print(loaded_with[0] if loaded_with else "numpy never loaded"))
cli.console_main()
"""


@pytest.mark.parametrize("dtype", ["float16", "int8"])
@pytest.mark.parametrize("preset, loaded_with", [(None, "1"), ("3", "3")])
def test_a_plan_process_loads_openblas_with_one_thread(tmp_path, preset, loaded_with, dtype):
    """OpenBLAS starts a spinning worker per core as numpy loads it, and a plan multiplies no
    large matrices (an int8 plan's are small float32 ones): console_main sets
    OPENBLAS_NUM_THREADS=1 before anything imports numpy, unless the caller chose a number."""
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        environment["OPENBLAS_NUM_THREADS"] = preset
    finished = subprocess.run([sys.executable, "-c", BLAS_PROBE, "plan", str(model), "--target", "rk3588", "--quiet",
                               "--dtype", dtype], capture_output=True, text=True, env=environment)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split()[-1] == loaded_with
