"""The `rkcompile plan` command as a user runs it: summary, JSON, help, dumps."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import onnx

from rkcompile.cli import build_parser, command_named, main
from rkcompile.plan.schema import PLAN_SCHEMA, PlanRecord, contract_violations

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"


def test_summary_reports_placement_reasons_partitions_and_memory(capsys):
    assert main(["plan", str(EXAMPLE), "--target", "rk3588"]) == 0
    out = capsys.readouterr().out
    assert "target                      rk3588 (float16, batch 1)" in out
    npu = int(re.search(r"NPU ops\s+(\d+) \(", out).group(1))
    cpu = int(re.search(r"CPU ops\s+(\d+) \(", out).group(1))
    placed = int(re.search(r"(\d+) placed", out).group(1))
    assert npu + cpu == placed and cpu >= 1
    assert "Erf on rk3588: Erf is not in rk3588's NPU operator list" in out
    assert re.search(r"partitions\s+\d+ NPU \[[\d, ]*\], \d+ CPU \[[\d, ]*\]", out)
    assert re.search(r"arena\s+[\d,.]+ KiB", out) and re.search(r"weights\s+[\d,.]+ KiB", out)


def test_json_plan_is_written_and_loads(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", str(EXAMPLE), "--target", "rk3576", "--json", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    data = json.loads(out.read_text())
    assert data["schema"] == PLAN_SCHEMA and data["target"] == "rk3576"
    assert list(data)[:4] == ["schema", "target", "dtype", "batch"]
    plan = PlanRecord.from_dict(data)
    assert contract_violations(plan) == []
    folded = {n["name"] for n in data["nodes"] if n["device"] == "folded"}
    assert folded == {"shape", "gather_batch", "concat_shape"}


def test_json_is_byte_identical_across_runs(tmp_path):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--json", str(path), "--quiet"]) == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_help_documents_every_flag():
    parser = build_parser()
    plan_parser = parser._subparsers._group_actions[0].choices["plan"]
    text = plan_parser.format_help()
    for action in plan_parser._actions:
        for flag in action.option_strings:
            assert flag in text
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help text"


def _subcommands(parser):
    return parser._subparsers._group_actions[0].choices


def test_a_parser_built_for_one_command_reads_and_helps_as_the_whole_one():
    """main builds only the named subcommand's arguments; that subcommand's help and the
    top-level help are the same as the whole parser's."""
    whole = build_parser()
    for name, subcommand in _subcommands(whole).items():
        built_for = build_parser(name)
        assert built_for.format_help() == whole.format_help()
        assert _subcommands(built_for)[name].format_help() == subcommand.format_help()
    assert [command_named(argv) for argv in (["-v", "plan", "m.onnx"], ["--version"], ["paln", "m"], ["zoo"])] == [
        "plan", None, None, "zoo"]


def test_dump_after_writes_a_loadable_graph(tmp_path, capsys):
    assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--quiet",
                 "--dump-after", "fold-constants", "--dump-dir", str(tmp_path)]) == 0
    dumped = tmp_path / "tiny_cnn.after-fold-constants.onnx"
    model = onnx.load(str(dumped))
    assert "Shape" not in {n.op_type for n in model.graph.node}
    assert "Conv" in {n.op_type for n in model.graph.node}


def test_dump_dir_is_created_when_missing_and_a_file_there_is_one_error(tmp_path, capsys):
    folder = tmp_path / "dumps" / "run1"
    assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--quiet",
                 "--dump-after", "fuse", "--dump-dir", str(folder)]) == 0
    assert (folder / "tiny_cnn.after-fuse.onnx").is_file()
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    assert main(["plan", str(EXAMPLE), "--target", "rk3588", "--quiet",
                 "--dump-after", "fuse", "--dump-dir", str(blocker)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --dump-dir:") and "is a file" in err[-1]


def test_targets_lists_figures(capsys):
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"rk3588\s+3\s+16\s+8", out)
    assert re.search(r"rk3562\s+1\s+", out)


def test_console_script_exits_nonzero_without_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rkcompile.cli", "plan", str(tmp_path / "missing.onnx"),
                             "--target", "rk3588"], capture_output=True, text=True)
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
