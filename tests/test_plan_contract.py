"""The plan contract (docs/plan-schema.md) on the shared zoo and onnx's shipped light models."""
from __future__ import annotations

import json
from collections import Counter

import onnx
import pytest

from rkcompile.options import Options
from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import PlanRecord, contract_violations

from conftest import PRIMARY_TARGETS, light_models, needs_zoo, zoo_models


def _check_plan(path, target):
    plan, ctx = compile_model(path, target)
    original = onnx.load(str(path), load_external_data=False)
    assert contract_violations(plan, [name for name, _ in ctx.original_nodes]) == []
    assert Counter(n.op for n in plan.nodes) == Counter(n.op_type for n in original.graph.node)
    named = {n.name for n in original.graph.node if n.name}
    assert named <= {n.name for n in plan.nodes}
    assert [i.name for i in plan.model.inputs] == [
        i.name for i in original.graph.input if i.name not in {t.name for t in original.graph.initializer}]
    assert [o.name for o in plan.model.outputs] == [o.name for o in original.graph.output]
    assert plan.memory.arena_bytes >= plan.memory.lower_bound_bytes > 0
    assert PlanRecord.from_dict(json.loads(plan.to_json())) == plan
    return plan


@needs_zoo
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("path", zoo_models(), ids=lambda p: p.stem)
def test_zoo_plans_honour_the_contract(path, target):
    plan = _check_plan(path, target)
    npu = sum(1 for n in plan.nodes if n.device == "npu")
    assert npu > 0


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("path", light_models(), ids=lambda p: p.stem)
def test_light_models_honour_the_contract(path, target):
    plan = _check_plan(path, target)
    assert any(n.op == "Conv" and n.device == "npu" for n in plan.nodes)


@needs_zoo
def test_same_model_and_flags_give_identical_json():
    path = next(p for p in zoo_models() if p.stem == "transformer_encoder")
    first, _ = compile_model(path, "rk3588", Options())
    second, _ = compile_model(path, "rk3588", Options())
    assert first.to_json() == second.to_json()


@needs_zoo
def test_zoo_cpu_nodes_always_have_a_reason_naming_op_and_target():
    for path in zoo_models():
        plan, _ = compile_model(path, "rk3588")
        for node in plan.nodes:
            if node.device == "cpu":
                assert node.reason.startswith(f"{node.op} on rk3588: "), node


def test_contract_violations_catch_a_broken_plan():
    path = light_models()[0]
    plan, ctx = compile_model(path, "rk3588")
    data = json.loads(plan.to_json())
    data["steps"][1]["inputs"].append("not_a_tensor")
    data["nodes"][0]["device"] = "cpu"
    data["nodes"][0]["reason"] = None
    broken = PlanRecord.from_dict(data)
    problems = contract_violations(broken, [name for name, _ in ctx.original_nodes])
    assert any("not_a_tensor" in p for p in problems)
    assert any("without a reason" in p for p in problems)
