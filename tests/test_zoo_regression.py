"""Zoo regression: the shipped small zoo (examples/zoo) and ../shared/zoo, planned for rk3588 and
rk3576, against the golden summaries committed in tests/goldens; the diff and the exit status
of `rkcompile zoo` when a target rule changes; what counts as a regression."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkcompile.commands import zoo
from rkcompile.cli import main
from rkcompile.targets import get_target
from rkcompile.targets.constraints import plan_dtype
from rkcompile.targets.model import OpRule, Rule

REPO = Path(__file__).resolve().parents[1]
SMALL_ZOO = REPO / "examples" / "zoo"
SHARED_ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
GOLDENS = REPO / "tests" / "goldens"
TARGETS = ("rk3588", "rk3576")
needs_shared_zoo = pytest.mark.skipif(not SHARED_ZOO.is_dir(), reason="../shared/zoo is not present")


def results(folder: Path, run: bool, workers: int = 2) -> list[zoo.Result]:
    jobs = [zoo.Job(path, name, target, run) for path, name in zoo.discover(folder) for target in TARGETS]
    return zoo.run_jobs(jobs, workers)


def assert_no_regression(found: list[zoo.Result], goldens: Path) -> None:
    diffs, missing = zoo.compare_with_goldens(found, goldens, zoo.DEFAULT_ARENA_TOLERANCE, zoo.DEFAULT_MIN_COSINE)
    assert not missing, f"no golden for {missing}: rkcompile zoo ... --golden {goldens} --update-golden"
    regressions = [d for d in diffs if d.regressions]
    assert not regressions, zoo.render_diffs(regressions)


def test_small_zoo_plans_emulates_and_matches_its_goldens():
    found = results(SMALL_ZOO, run=True)
    assert {r.name for r in found} == {"attention", "detection_head", "recurrent_state", "shape_arithmetic"}
    for result in found:
        assert result.error is None, result.error
        assert result.cosine_reference == "npz" and result.golden["worst_cosine"] >= 0.9999, result.key
    assert_no_regression(found, GOLDENS / "small_zoo")


@needs_shared_zoo
def test_shared_zoo_plans_and_matches_its_goldens():
    found = results(SHARED_ZOO, run=False)
    assert len(found) == 2 * len(list(SHARED_ZOO.glob("*.onnx")))
    assert all(r.error is None for r in found), [r.error for r in found if r.error]
    assert_no_regression(found, GOLDENS / "shared_zoo")


@pytest.mark.slow
@needs_shared_zoo
def test_shared_zoo_emulates_and_matches_its_goldens_cosines():
    assert_no_regression(results(SHARED_ZOO, run=True), GOLDENS / "shared_zoo")


def test_a_tightened_target_rule_shows_as_moved_nodes_and_fails_the_run(monkeypatch, capsys):
    """Edit rk3588's Sigmoid rule (float16 no longer allowed): the detection head's class
    sigmoids move to the CPU, the diff names them and the new reason, and the run exits 1."""
    target = get_target("rk3588")
    old = target.ops["Sigmoid"]
    int8_only = Rule(plan_dtype, {"dtypes": ("int8",), "source": "an edited rule in test_zoo_regression"})
    monkeypatch.setitem(target.ops, "Sigmoid", OpRule(old.kernel, old.rules + (int8_only,), old.multi_core))

    status = main(["zoo", str(SMALL_ZOO), "--target", "rk3588", "--jobs", "1", "--golden", str(GOLDENS / "small_zoo")])

    out = capsys.readouterr().out
    moved = [line for line in out.splitlines() if "REGRESSION" in line and "moved npu->cpu" in line]
    assert status == 1
    assert len(moved) == 2 and all(line.startswith("detection_head@rk3588: REGRESSION: Sigmoid_") for line in moved), out
    assert all("an edited rule in test_zoo_regression" in line for line in moved), moved
    assert "detection_head@rk3588: conversions 2 -> 6" in out


def test_update_golden_writes_summaries_that_the_next_run_matches(tmp_path, capsys):
    goldens = tmp_path / "goldens"
    folder = tmp_path / "zoo"
    folder.mkdir()
    for name in ("attention", "recurrent_state"):
        (folder / f"{name}.onnx").write_bytes((SMALL_ZOO / f"{name}.onnx").read_bytes())
    report = tmp_path / "report.json"
    assert main(["zoo", str(folder), "--jobs", "1", "--golden", str(goldens), "--update-golden"]) == 0
    assert sorted(p.name for p in goldens.iterdir()) == ["attention@rk3588.json", "recurrent_state@rk3588.json"]
    capsys.readouterr()
    assert main(["zoo", str(folder), "--jobs", "1", "--golden", str(goldens), "--json", str(report)]) == 0
    assert "no changes against the goldens" in capsys.readouterr().out
    rows = json.loads(report.read_text())["results"]
    assert [(r["model"], r["regressions"], r["notes"]) for r in rows] == [("attention", [], []), ("recurrent_state", [], [])]


def test_a_model_that_fails_is_a_row_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    (tmp_path / "good.onnx").write_bytes((SMALL_ZOO / "attention.onnx").read_bytes())
    assert main(["zoo", str(tmp_path), "--jobs", "2"]) == 0
    captured = capsys.readouterr()
    rows = {line.split()[0]: line for line in captured.out.splitlines() if "@rk3588" in line}
    assert "plan: " in rows["broken@rk3588"] and len(rows["broken@rk3588"].splitlines()) == 1
    assert "100.0" in rows["good@rk3588"]
    assert "2/2" in captured.err  # the progress bar


def test_a_model_that_used_to_plan_and_now_fails_is_a_regression(tmp_path, capsys):
    goldens = tmp_path / "goldens"
    model = tmp_path / "zoo" / "model.onnx"
    model.parent.mkdir()
    model.write_bytes((SMALL_ZOO / "attention.onnx").read_bytes())
    assert main(["zoo", str(model.parent), "--jobs", "1", "--golden", str(goldens), "--update-golden"]) == 0
    model.write_bytes(b"truncated")
    capsys.readouterr()
    assert main(["zoo", str(model.parent), "--jobs", "1", "--golden", str(goldens)]) == 1
    assert "model@rk3588: REGRESSION: now fails: plan: " in capsys.readouterr().out


GOLDEN = {"schema": zoo.GOLDEN_SCHEMA, "model": "m", "target": "rk3588", "sha256": "a", "nodes": 3, "placed": 3,
          "npu": 2, "off_npu": {"Cast_1": {"device": "cpu", "reason": "Cast is not listed"}},
          "cpu_by_reason": {"Cast is not listed": 1}, "partitions": {"npu": 1, "cpu": 1}, "conversions": 2,
          "fused": {}, "steps": 5, "arena_bytes": 1000, "weight_bytes": 10, "worst_cosine": 0.99999}


def changed(**fields) -> dict:
    return {**GOLDEN, **fields}


@pytest.mark.parametrize("new, regression", [
    (changed(arena_bytes=1020), None),
    (changed(arena_bytes=1031), "arena +3.1% (1000 -> 1031 bytes), beyond the 2% tolerance"),
    (changed(worst_cosine=0.9998), "worst cosine 0.99999 -> 0.9998, below the 0.9999 tolerance"),
    (changed(worst_cosine=0.99995), None),
    (changed(off_npu={**GOLDEN["off_npu"], "Relu_2": {"device": "cpu", "reason": "why"}}),
     "Relu_2 moved npu->cpu (why)"),
    (changed(off_npu={}), None),
    ({k: GOLDEN[k] for k in ("schema", "model", "target")} | {"error": "plan: boom"}, "now fails: plan: boom"),
])
def test_what_counts_as_a_regression(new, regression):
    diff = zoo.diff_golden("m@rk3588", GOLDEN, new)
    assert diff.regressions == ([regression] if regression else [])
    assert diff.regressions or diff.notes  # every change shows, as a regression or a note


def test_improvements_are_notes():
    diff = zoo.diff_golden("m@rk3588", GOLDEN, changed(off_npu={}, arena_bytes=900))
    assert diff.regressions == []
    assert "Cast_1 moved cpu->npu" in diff.notes and "arena -10.0% (1000 -> 900 bytes)" in diff.notes


def test_zoo_command_errors_are_one_line(tmp_path, capsys):
    assert main(["zoo", str(tmp_path / "absent")]) == 1
    assert main(["zoo", str(tmp_path)]) == 1
    assert main(["zoo", str(SMALL_ZOO), "--update-golden"]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors), errors
