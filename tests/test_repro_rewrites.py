"""The shared repros of the patterns handled by recognisers and the conv, slice and mask
rewrites (../shared/repros/README.md), generated in a temporary folder by the repros' own
script: at rk3588, rk3576 and rk3562 each plan keeps off the CPU what the README says, and
`rkcompile run --check` agrees with onnxruntime (cosine >= 0.9999)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from conftest import PRIMARY_TARGETS, SHARED
from rkcompile.cli import main
from rkcompile.compiler.pipeline import compile_model

MAKE_REPROS = SHARED / "repros" / "make_repros.py"
pytestmark = pytest.mark.skipif(not MAKE_REPROS.is_file(), reason="../shared/repros is not present")

#: repro -> the ops allowed on the CPU (the README's expectation)
EXPECTED_CPU_OPS = {
    "s1_fold_rounds": set(),
    "s3_gelu_x_times_half_inner": set(),
    "s6_if_outer_scope": {"If"},
    "s5_conv_stride16": set(),
    "s5b_conv_stride16_as_s2d": set(),
    "s10_bool_mask_chain": {"Cast"},
    "s11_patch_merge_slice_step2": set(),
}


@pytest.fixture(scope="module")
def repros(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repros")
    subprocess.run([sys.executable, str(MAKE_REPROS), str(folder)], check=True, capture_output=True)
    return folder


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(EXPECTED_CPU_OPS))
def test_repro_plan_keeps_only_the_allowed_ops_on_the_cpu(repros, name, target):
    plan, _ = compile_model(repros / f"{name}.onnx", target)
    on_cpu = Counter(node.op for node in plan.nodes if node.device == "cpu")
    assert set(on_cpu) <= EXPECTED_CPU_OPS[name], on_cpu


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("name", sorted(EXPECTED_CPU_OPS))
def test_repro_run_matches_onnxruntime(repros, tmp_path, name, target, capsys):
    report = tmp_path / "run.json"
    status = main(["run", str(repros / f"{name}.onnx"), "--target", target, "--check", "--json", str(report)])
    result = json.loads(report.read_text())
    assert status == 0 and result["passed"], result["agreement"]
    assert min(a["cosine"] for a in result["agreement"]) >= 0.9999
