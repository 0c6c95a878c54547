"""onnx's shipped pytorch-converted and pytorch-operator backend data through the emulator, via
tools/sweep_backend_data.py: every case the planner accepts must pass at float16. As shipped
(mostly opset 6, which the planner refuses) it is quick; upgraded to opset 13 with the NPU
islands kept, so the NPU kernels run, it is marked slow."""
from __future__ import annotations

import pytest
from conftest import load_tool

sweep_backend_data = load_tool("sweep_backend_data")

COLLECTIONS = ("pytorch-converted", "pytorch-operator")
pytestmark = pytest.mark.skipif(not (sweep_backend_data.DATA / COLLECTIONS[0]).is_dir(),
                                reason="this onnx package ships no backend test data")


def failures(collection: str, upgrade_opset: int | None = None) -> list:
    outcomes = sweep_backend_data.sweep(collection, upgrade_opset)
    assert any(o.status == "pass" for o in outcomes)
    return [o for o in outcomes if o.status == "fail"]


@pytest.mark.parametrize("collection", COLLECTIONS)
def test_backend_cases_the_planner_accepts_pass(collection):
    assert failures(collection) == []


@pytest.mark.slow
@pytest.mark.parametrize("collection", COLLECTIONS)
def test_backend_cases_upgraded_to_opset_13_pass_on_npu_kernels(collection):
    assert failures(collection, upgrade_opset=13) == []
