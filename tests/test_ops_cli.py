"""`rkcompile ops`, `targets`, `plan --strict` and `plan --explain`, and the committed
SUPPORTED_OPS pages."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rkcompile.cli import main
from rkcompile.views.ops_doc import render_supported_ops
from rkcompile.targets import all_targets, get_target

DOCS = __import__("pathlib").Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("target", all_targets(), ids=lambda t: t.name)
def test_committed_supported_ops_is_current(target):
    committed = DOCS / f"SUPPORTED_OPS_{target.name}.md"
    assert committed.is_file(), "run: python tools/update_supported_ops.py"
    assert committed.read_text(encoding="utf-8") == render_supported_ops(target, "md"), \
        f"{committed.name} is stale; run: python tools/update_supported_ops.py"


def test_ops_prints_every_op_with_its_rules(capsys):
    assert main(["ops", "--target", "rk3562", "--format", "text"]) == 0
    out = capsys.readouterr().out
    target = get_target("rk3562")
    for op, op_rule in target.ops.items():
        assert f"\n{op}\n" in out
        for rule in op_rule.rules:
            assert rule.describe() in out
    assert "seed 000, V2.5.0 RK3562 Pow" in out and "#" not in out.splitlines()[0]


def test_ops_lists_the_transpose_table(capsys):
    assert main(["ops", "--target", "rk3588"]) == 0
    out = capsys.readouterr().out
    assert "  - [0, 2, 3, 1]: c1 < 8192, h1*w1 % 8 == 0, w1*c1 < p*8" in out


def test_ops_writes_a_file(tmp_path, capsys):
    out = tmp_path / "ops.md"
    assert main(["ops", "--target", "rk3568", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_supported_ops(get_target("rk3566"), "md")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("argv, message", [
    (["ops", "--target", "rk9999"], "error: unknown target 'rk9999'"),
    (["ops", "--target", "rk3588", "-o", "/proc/rkcompile-test/x.md"], "error: cannot write /proc/rkcompile-test/x.md"),
    (["ops", "--target", "rk3588", "--format", "pdf"], "error: argument --format: invalid choice"),
])
def test_ops_errors_are_one_line(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as usage_error:  # argparse exits on usage errors, after printing one line
        code = usage_error.code
    assert code != 0
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_targets_lists_every_target_with_its_figures(capsys):
    assert main(["targets"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == {t.name for t in all_targets()}
    assert rows["rk3588"][1:4] == ["3", "16", "8"] and rows["rv1106b"][1:4] == ["1", "8", "-"]
    assert "rk3568" in rows["rk3566"]


def _model(tmp_path, kernel: int):
    """A Conv of kernel = stride that is legal (7) or not (11) on every target: 11 is a prime over
    the stride limit, so no space-to-depth decomposes it either (rewrites/conv_windows.py)."""
    weight = numpy_helper.from_array(np.ones((2, 2, kernel, kernel), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", strides=[kernel, kernel])
    size = 40 // kernel
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 40, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, size, size])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"conv{kernel}.onnx"
    onnx.save(model, str(path))
    return path


def test_strict_fails_without_writing_a_plan(tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    code = main(["plan", str(_model(tmp_path, 11)), "--target", "rk3588", "--strict", "--json", str(plan_file)])
    err = capsys.readouterr().err
    assert code == 1 and not plan_file.exists()
    assert err.startswith("error: --strict: 1 nodes fall back to the CPU on rk3588, no plan written")
    assert "conv (Conv): Conv on rk3588: kernel_h, kernel_w in [1, 31]" in err and "stride=11" in err
    assert "Traceback" not in err


def test_without_strict_the_same_plan_is_written(tmp_path):
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(_model(tmp_path, 11)), "--target", "rk3588", "--json", str(plan_file), "--quiet"]) == 0
    assert plan_file.exists()


def test_explain_prints_every_rule_with_its_verdict(tmp_path, capsys):
    assert main(["plan", str(_model(tmp_path, 11)), "--target", "rk3588", "--explain", "conv"]) == 0
    out = capsys.readouterr().out
    rules = get_target("rk3588").common_rules + get_target("rk3588").ops["Conv"].rules
    assert out.startswith("conv (Conv) on rk3588:")
    assert "inputs x [1, 2, 40, 40] float32, w const [2, 2, 11, 11] float32" in out
    assert out.count("    PASS  ") == len(rules) - 1 and out.count("    FAIL  ") == 1
    assert "FAIL  kernel_h, kernel_w in [1, 31]" in out and "(seen: stride=11, stride=11)" in out
    assert "plan: cpu (Conv on rk3588:" in out


def test_explain_of_a_legal_node_passes_every_rule(tmp_path, capsys):
    assert main(["plan", str(_model(tmp_path, 7)), "--target", "rk3576", "--explain", "conv"]) == 0
    out = capsys.readouterr().out
    rules = get_target("rk3576").common_rules + get_target("rk3576").ops["Conv"].rules
    assert "FAIL" not in out and out.count("    PASS  ") == len(rules)


def test_explain_of_an_unknown_node_is_one_line(tmp_path, capsys):
    assert main(["plan", str(_model(tmp_path, 7)), "--target", "rk3588", "--explain", "nope"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: --explain: no node named 'nope' in conv7.onnx\n" and captured.out == ""
