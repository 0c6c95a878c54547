"""Every bad input gets one `error: ...` line on stderr, a non-zero exit, and no plan file."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from rkcompile.cli import main

from conftest import make_model, value_info, weight

X = value_info("x", [1, 3, 8, 8])
Y = value_info("y", [1, 3, 8, 8])


def _relu_model(input_shape):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [value_info("x", input_shape)], [Y])


def _cycle():
    return make_model([helper.make_node("Relu", ["b"], ["a"], name="first"),
                       helper.make_node("Add", ["x", "a"], ["b"], name="second"),
                       helper.make_node("Relu", ["b"], ["y"], name="third")], [X], [Y])


def _external_data_model(tmp_path, location: str):
    conv = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [X], [value_info("y", [1, 4, 6, 6])],
                      [weight("w", np.ones((4, 3, 3, 3), np.float32))])
    path = tmp_path / "ext.onnx"
    onnx.save(conv, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, str(path))
    return path


BAD_MODELS = {
    "cycle": (_cycle, "cycle"),
    "undefined tensor": (lambda: make_model([helper.make_node("Relu", ["nope"], ["y"])], [X], [Y]), "never defined"),
    "duplicate output": (lambda: make_model([helper.make_node("Relu", ["x"], ["y"]),
                                             helper.make_node("Sigmoid", ["x"], ["y"])], [X], [Y]),
                         "produced more than once"),
    "unsupported opset": (lambda: make_model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y], opset=99),
                          "unsupported opset 99"),
    "negative dim": (lambda: _relu_model([1, -3, 8, 8]), "dims must not be negative"),
    "dynamic dim": (lambda: _relu_model(["batch", 3, 8, 8]), "input 'x' has dynamic dim 0 ('batch')"),
    "weight contradicts op": (lambda: make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [X], [Y],
                                                 [weight("w", np.zeros((4, 5, 3, 3), np.float32))]),
                              "shape inference failed"),
}


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_one_line_error(code, err, expected):
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_is_one_line_error_and_no_plan(case, save, tmp_path, capsys):
    build, expected = BAD_MODELS[case]
    path = save(build())
    plan_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", str(path), "--target", "rk3588", "--json", str(plan_path))
    _assert_one_line_error(code, err, expected)
    assert not plan_path.exists()
    assert list(tmp_path.glob(".plan.json*")) == []


@pytest.mark.parametrize("content,expected", [
    (b"", "empty file"),
    (b"this is not protobuf\n", "not a valid ONNX model"),
])
def test_non_onnx_file(content, expected, tmp_path, capsys):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk3588")
    _assert_one_line_error(code, err, expected)


def test_truncated_protobuf(save, tmp_path, capsys):
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [X], [value_info("y", [1, 4, 6, 6])],
                       [weight("w", np.ones((4, 3, 3, 3), np.float32))])
    data = model.SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk3588")
    _assert_one_line_error(code, err, "not a valid ONNX model")


def test_external_data_outside_model_folder_is_refused(tmp_path, capsys):
    path = _external_data_model(tmp_path, "../outside.bin")
    (tmp_path.parent / "outside.bin").write_bytes(b"\0" * 432)
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk3588")
    _assert_one_line_error(code, err, "points outside the model's folder")


def test_external_data_inside_model_folder_loads(tmp_path, capsys):
    path = _external_data_model(tmp_path, "ext.bin")
    code, out, err = _run(capsys, "plan", str(path), "--target", "rk3588")
    assert code == 0, err
    assert "NPU ops" in out


def test_missing_file(tmp_path, capsys):
    code, _, err = _run(capsys, "plan", str(tmp_path / "nope.onnx"), "--target", "rk3588")
    _assert_one_line_error(code, err, "no such file")


def test_unreadable_file(save, capsys, monkeypatch):
    """A read the system refuses (no permission, an I/O error) is the user's error line, not
    an internal error."""
    from pathlib import Path

    path = save(make_model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y]))

    def refused(name, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(name))

    monkeypatch.setattr(Path, "read_bytes", refused)
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk3588")
    _assert_one_line_error(code, err, "cannot read it (Permission denied)")


def test_unknown_target(save, capsys):
    path = save(make_model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y]))
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk9999")
    _assert_one_line_error(code, err, "unknown target 'rk9999'")


def test_bad_flag_value_is_one_line(save, capsys):
    path = save(make_model([helper.make_node("Relu", ["x"], ["y"])], [X], [Y]))
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(path), "--target", "rk3588", "--input-shape", "x:1,a"])
    assert exit_info.value.code != 0
    _, err = capsys.readouterr()
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_input_shape_override_fixes_dynamic_dim(save, capsys):
    path = save(_relu_model(["batch", 3, 8, 8]))
    code, out, err = _run(capsys, "plan", str(path), "--target", "rk3588", "--input-shape", "x:2,3,8,8")
    assert code == 0, err
    code, _, err = _run(capsys, "plan", str(path), "--target", "rk3588", "--input-shape", "z:2,3,8,8")
    _assert_one_line_error(code, err, "not a model input")


def test_custom_domain_op_falls_back_with_reason_and_plan_is_produced(save, tmp_path, capsys):
    model = make_model([helper.make_node("Foo", ["x"], ["z"], domain="my.custom"),
                        helper.make_node("Relu", ["z"], ["y"])], [X], [Y], extra_opsets=[("my.custom", 1)])
    path = save(model)
    plan_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", str(path), "--target", "rk3588", "--json", str(plan_path))
    assert code == 0, err
    import json
    nodes = {n["op"]: n for n in json.loads(plan_path.read_text())["nodes"]}
    assert nodes["Foo"]["device"] == "cpu"
    assert "my.custom::Foo" in nodes["Foo"]["reason"] and "rk3588" in nodes["Foo"]["reason"]
