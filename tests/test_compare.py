"""`rkcompile compare MODEL --target all|T1,T2`: one row per SoC with the numbers each plan states,
JSON too, a row saying why for a target that cannot take the model, and one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkcompile.cli import main
from rkcompile.options import Options
from rkcompile.compiler.pipeline import compile_model
from rkcompile.targets import all_targets

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"


def _compare(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["compare", str(EXAMPLE), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def every_target(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("compare") / "rows.json"
    assert main(["compare", str(EXAMPLE), "--target", "all", "--json", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8")), str(out)


def test_all_gives_one_row_per_target_with_the_numbers_of_its_plan(every_target):
    body, _ = every_target
    assert [row["target"] for row in body["rows"]] == [t.name for t in all_targets()]
    assert (body["dtype"], body["batch"]) == ("float16", 1)
    planned = [row for row in body["rows"] if row["error"] is None]
    assert len(planned) >= 2
    for row in planned:
        plan, _ = compile_model(EXAMPLE, row["target"], Options())
        placed = [n for n in plan.nodes if n.device in ("npu", "cpu")]
        cpu = sum(n.device == "cpu" for n in placed)
        assert row["cpu_ops"] == cpu and row["npu_ops"] == len(placed) - cpu
        assert row["npu_percent"] == round(100 * (len(placed) - cpu) / len(placed), 1)
        assert (row["steps"], row["arena_bytes"], row["weight_bytes"]) == (
            len(plan.steps), plan.memory.arena_bytes, plan.memory.weight_bytes)
        assert (row["est_fps"], row["est_latency_ms"]) == (plan.multicore.est_fps, plan.multicore.est_latency_ms)


def test_a_target_that_cannot_take_a_float16_plan_says_why_in_its_row(every_target, capsys):
    body, _ = every_target
    refused = {row["target"]: row["error"] for row in body["rows"] if row["error"] is not None}
    assert "rv1106" in refused and "--dtype int8" in refused["rv1106"]
    code, out, _ = _compare(capsys, "--target", "rk3588,rv1106")
    assert code == 0
    lines = out.splitlines()
    assert lines[2].split()[0] == "rk3588" and lines[3].startswith("rv1106     not planned: ")


def test_the_table_prints_the_rows(capsys):
    code, out, _ = _compare(capsys, "--target", "rk3588,rk3562")
    assert code == 0
    header, *rows = out.splitlines()[1:]
    assert header.split() == ["target", "NPU", "%", "CPU", "ops", "steps", "arena", "KiB", "weights", "KiB", "est", "fps"]
    for row, target in zip(rows, ("rk3588", "rk3562"), strict=True):
        plan, _ = compile_model(EXAMPLE, target, Options())
        cells = row.split()
        assert cells[0] == target and int(cells[3]) == len(plan.steps)
        assert float(cells[6]) == pytest.approx(plan.multicore.est_fps, abs=0.05)


def test_a_comma_list_takes_aliases_and_repeats_once(capsys):
    alias = next(t for t in all_targets() if t.aliases)
    code, out, _ = _compare(capsys, "--target", f"{alias.name},{alias.aliases[0]}, rk3588 ", "--json", "-")
    assert code == 0
    assert [row["target"] for row in json.loads(out)["rows"]] == list(dict.fromkeys([alias.name, "rk3588"]))


@pytest.mark.parametrize("target, message", [
    ("rk3588,nosuchsoc", "unknown target 'nosuchsoc'"),
    ("all,rk3588", "'all' already names every target"),
    (",", "name one target"),
    ("rv1106", "use --dtype int8"),
])
def test_a_bad_target_is_one_error_line(capsys, target, message):
    code, out, err = _compare(capsys, "--target", target)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_bad_model_is_one_error_line(capsys, tmp_path):
    code = main(["compare", str(tmp_path / "absent.onnx"), "--target", "all"])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1
