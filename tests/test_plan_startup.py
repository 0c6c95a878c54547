"""What a plan process pays before and around the passes (issue 18, tools/bench_plan.py): the
modules a float16 plan imports."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from conftest import make_model, value_info, weight
from onnx import TensorProto, helper

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
