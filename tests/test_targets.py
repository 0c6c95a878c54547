"""The targets' data against the documents it was copied from, and the zoo plans it produces.

The oplist JSON and the seeds live in ../shared, which is not shipped; tests that read them skip
when it is absent.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rkcompile.errors import CompileError
from rkcompile.compiler.pipeline import compile_model
from rkcompile.targets import TARGET_MODULES, all_targets, get_target
from rkcompile.targets.transpose_limits import FULL_TABLE, NARROW, RK3566_TABLE, WIDE

SHARED = Path(__file__).resolve().parents[2] / "shared"
OPLIST = SHARED / "oplist" / "npu_ops_by_platform_v2.3.2.json"
ZOO = SHARED / "zoo"
needs_oplist = pytest.mark.skipif(not OPLIST.is_file(), reason="../shared/oplist is not present")
needs_zoo = pytest.mark.skipif(not ZOO.is_dir(), reason="../shared/zoo is not present")

#: Kernels the seeds add to the oplist (seed 001: Sin and Cos on RK3576/RV1126B).
SEED_KERNELS = {"RK3576/RV1126B": {"Sin", "Cos"}}


@pytest.fixture(scope="module")
def oplist():
    return json.loads(OPLIST.read_text(encoding="utf-8"))


def _not_supported(entry) -> bool:
    """The oplist lists a few kernels only to say "不支持"/"尚不支持" (not supported)."""
    return entry["text"].strip().lstrip("• ").startswith(("不支持", "尚不支持"))


def test_every_platform_of_the_oplist_has_a_target():
    platforms = {t.oplist_platform for t in all_targets()}
    assert platforms == {"RK3566/RK3568", "RK3588", "RK3562", "RV1103/RV1106", "RK3576/RV1126B", "RK2118",
                         "RV1103B/RV1106B"}


@pytest.mark.parametrize("name", ["rk3568", "RK3568", "rv1103", "rv1103b", "rk3588s", " rk3576 "])
def test_aliases_resolve(name):
    assert get_target(name).name in {t.name for t in all_targets()}


def test_each_module_is_named_as_its_target_and_every_name_finds_its_own():
    """get_target looks in the module of the name asked for first, and the command line's help
    lists TARGET_MODULES as the target names: both rest on this."""
    assert [t.name for t in all_targets()] == list(TARGET_MODULES)
    for target in all_targets():
        for name in (target.name, *target.aliases):
            assert get_target(name) is target


def test_unknown_target_is_a_clear_error():
    with pytest.raises(CompileError, match="unknown target 'rk9999' .known targets: rk3588, rk3576"):
        get_target("rk9999")


@needs_oplist
@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_kernel_lists_match_the_oplist(oplist, target):
    listed = {k for k, v in oplist[target.oplist_platform].items() if not _not_supported(v)}
    assert set(target.kernels) == listed | SEED_KERNELS.get(target.oplist_platform, set())


@needs_oplist
@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_multi_core_kernels_match_the_oplist(oplist, target):
    flagged = {k for k, v in oplist[target.oplist_platform].items()
               if v["multi_core"] in ("supported", "RK3576: supported / RV1126B: not supported")}
    assert set(target.multi_core_kernels) == (flagged if target.npu_cores > 1 else set())
    for op_rule in target.ops.values():
        assert op_rule.multi_core == (op_rule.kernel in target.multi_core_kernels)


def test_rv1126b_shares_rk3576_rules_but_has_one_core():
    rk3576, rv1126b = get_target("rk3576"), get_target("rv1126b")
    assert (rk3576.npu_cores, rv1126b.npu_cores) == (2, 1)
    assert rv1126b.multi_core_kernels == frozenset() and "exSDPAttention" in rk3576.multi_core_kernels
    assert {op: [r.describe() for r in rule.rules] for op, rule in rk3576.ops.items()} == \
           {op: [r.describe() for r in rule.rules] for op, rule in rv1126b.ops.items()}


@pytest.mark.parametrize("name, int8, float16", [
    ("rk2118", None, 4), ("rk3566", 8, 4), ("rk3588", 16, 8), ("rk3576", 16, 8), ("rv1126b", 16, 8),
    ("rv1106b", 8, None), ("rv1106", 16, 8), ("rk3562", 16, 8),
])
def test_c2_follows_seed_003_table_3_1(name, int8, float16):
    assert dict(get_target(name).c2) == {"int8": int8, "float16": float16}


def _oplist_perm_table(text: str) -> tuple[dict[str, int], dict[tuple[int, ...], str]]:
    """Each perm's float16 line of an oplist Transpose page: T2, else "T1, T2", else the only
    line (RK2118's T1 is its float16 line; RK3566 prints bare "不支持" or "无限制")."""
    p, q = re.search(r"p=(\d+), q=(\d+)", text).groups()
    lines: dict[tuple[int, ...], dict[str, str]] = {}
    perm = None
    for line in text.split("数据类型约束")[0].splitlines():
        found = re.search(r"perm=\[([\d,]+)\]", line)
        if found:
            perm = tuple(int(x) for x in found.group(1).split(","))
            lines[perm] = {}
            continue
        found = re.match(r"\s*\*\s*(?:(T1, T2|T1|T2)\s*:\s*)?(.*)", line)
        if perm is not None and found:
            lines[perm][found.group(1) or "bare"] = found.group(2).strip()
    table = {perm: next(found[k] for k in ("T2", "T1, T2", "T1", "bare") if k in found) for perm, found in lines.items()}
    return {"p": int(p), "q": int(q)}, table


def _as_python(printed: str) -> str:
    """An oplist condition line in the spelling of targets/transpose_limits.py, spaces removed."""
    text = printed.replace(" ", "").replace("，", ",").replace("c1*h1*w1p", "c1*h1*w1<p")  # the oplist's dropped '<'
    text = text.replace("n<8192", "n1<8192").replace("h1=w1=1,", "h1==1andw1==1and").replace("n1=h1=1,", "n1==1andh1==1and")
    return re.sub(r"%(\d+)=0", r"%\1==0", text)


@needs_oplist
@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_transpose_tables_match_the_oplist(oplist, target):
    rule = next(r for r in target.ops["Transpose"].rules if r.check.__name__ == "transpose_perm")
    pq, printed = _oplist_perm_table(oplist[target.oplist_platform]["Transpose"]["text"])
    assert {"p": rule.params["p"], "q": rule.params["q"]} == pq
    assert len(printed) == 24
    for perm, text in printed.items():
        if text == "不支持":
            assert perm not in rule.params["table"], perm
        else:
            ours = ",".join(rule.params["table"][perm]).replace(" ", "")
            assert ours == ("" if text == "无限制" else _as_python(text)), perm


def test_transpose_p_and_q_differ_between_rk3588_and_rk3576():
    def params(name):
        rule = next(r for r in get_target(name).ops["Transpose"].rules if r.check.__name__ == "transpose_perm")
        return rule.params
    assert {k: params("rk3588")[k] for k in "pq"} == NARROW
    assert {k: params("rk3576")[k] for k in "pq"} == WIDE
    assert params("rk3566")["table"] is RK3566_TABLE and params("rk3588")["table"] is FULL_TABLE


@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_every_rule_renders_and_cites_its_source(target):
    for op, op_rule in target.ops.items():
        for rule in op_rule.rules + target.common_rules:
            text = rule.describe()  # a placeholder the target gives no parameter for raises KeyError
            assert re.search(r"oplist V2\.3\.2|seed 00\d", text), (op, text)


# ---- the zoo ------------------------------------------------------------------------------

def _zoo_models():
    return sorted(ZOO.glob("*.onnx")) if ZOO.is_dir() else []


@pytest.fixture(scope="module")
def zoo_plans():
    plans = {}
    for path in _zoo_models():
        for target in ("rk3588", "rk3576"):
            plans[path.stem, target] = compile_model(path, target)
    return plans


@needs_zoo
def test_no_zoo_node_is_on_the_cpu_without_a_cited_reason(zoo_plans):
    for (model, target), (plan, ctx) in zoo_plans.items():
        for node in plan.nodes:
            if node.device == "cpu":
                assert node.reason, (model, target, node.name)
        for name, failures in ctx.failures.items():
            for failure in failures:
                assert re.search(r"oplist V2\.3\.2|seed 00\d", failure.rule), (model, target, name, failure.rule)


@needs_zoo
def test_rk3588_and_rk3576_plans_differ_where_the_sources_do(zoo_plans):
    """transformer_encoder's [1,4,64,32] Transpose with perm [2,0,1,3] needs n1*c1*h1*w1 < p:
    8192 fails RK3588's p = 8192 and fits RK3576's p = 268435456 (oplist V2.3.2 Transpose). On
    rk3588 the rewrite pass therefore runs it on another view or in slices; on rk3576 it runs as it
    is: the head merge the attention kernel writes through (simplify_layout.attention_operands)."""
    plan3588, _ = zoo_plans["transformer_encoder", "rk3588"]
    plan3576, _ = zoo_plans["transformer_encoder", "rk3576"]
    def rewritten(plan):
        return {name for r in plan.rewrites if r.rule == "transpose_as_legal_view" for name in r.nodes}

    sliced = rewritten(plan3588) - rewritten(plan3576)
    assert sliced
    steps_3576 = {n.name: plan3576.steps[n.step] for n in plan3576.nodes if n.name in sliced}
    assert {step.kernel for step in steps_3576.values()} == {"exSDPAttention"}
    for name, step in steps_3576.items():
        members = step.operation.attributes["body"]["graph"]["nodes"]
        assert [m["op"] for m in members if m["name"] == name] == ["Transpose"]


def test_rules_of_one_check_read_its_signature_and_docstring_once(monkeypatch):
    """A target binds one check in many rules: each rule still gets only the facts its check
    names beyond its own parameters, and its text from the check's docstring with its own
    values, while the check's signature and docstring are read once for all of them."""
    import inspect

    from rkcompile.targets import model

    def within(node, target, limit: int, plan_dtype: str = "float16"):
        """At most {limit} elements."""
        return node <= limit, f"{node} in {plan_dtype}"

    signatures, cleaned = [], []
    real_signature, real_cleandoc = inspect.signature, inspect.cleandoc
    monkeypatch.setattr(inspect, "signature", lambda f, *a, **k: signatures.append(f) or real_signature(f, *a, **k))
    monkeypatch.setattr(inspect, "cleandoc", lambda doc: cleaned.append(doc) or real_cleandoc(doc))
    rules = [model.Rule(within, {"limit": 4}), model.Rule(within, {"limit": 8}),
             model.Rule(within, {"limit": 8, "plan_dtype": "int8"})]
    assert [rule.evaluate(5, None, plan_dtype="float32", opset=17) for rule in rules] == [
        (False, "5 in float32"), (True, "5 in float32"), (True, "5 in int8")]
    assert [rule.describe() for rule in rules] == ["At most 4 elements.", "At most 8 elements.", "At most 8 elements."]
    assert signatures.count(within) == 1 and cleaned.count(within.__doc__) == 1
