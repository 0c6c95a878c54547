"""int8 judged on data it did not fit (issue 38): --val / validation= reports the plan's cosines
on held-out inputs, --auto-float16 meets its target on them, few calibration samples without
them are warned about, and `compare --dtype int8` shows the cosines."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import rkcompile
from conftest import REPO
from rkcompile.cli import main
from rkcompile.errors import CompileError
from rkcompile.plan.schema import PlanRecord

TINY = REPO / "examples" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Eight calibration and three validation inputs of tiny_cnn, as .npz files."""
    folder = tmp_path_factory.mktemp("val")
    rng = np.random.default_rng(7)
    for name, count in (("calib", 8), ("val", 3)):
        np.savez(folder / f"{name}.npz", image=rng.random((count, 1, 3, 64, 64), np.float32))
    return folder / "calib.npz", folder / "val.npz"


def test_plan_reports_validation_cosines_in_summary_and_json(data, tmp_path, capsys):
    calib, val = data
    out = tmp_path / "plan.json"
    assert main(["plan", str(TINY), "--target", "rk3588", "--dtype", "int8", "--calib", str(calib),
                 "--val", str(val), "--calib-method", "minmax", "--no-equalization", "--bias-correction",
                 "--json", str(out)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "validation cosine" in line)
    body = json.loads(out.read_text(encoding="utf-8"))["validation"]
    assert body["samples"] == 3 and body["path"] == str(val) and list(body["cosines"]) == ["logits"]
    assert 0.99 < body["cosines"]["logits"] <= 1.0 + 1e-6
    assert f"logits {body['cosines']['logits']:.6f}" in line and "worst over 3 samples" in line
    record = PlanRecord.from_dict(json.loads(out.read_text(encoding="utf-8")))
    assert record.validation.cosines == body["cosines"] and record.to_json() == out.read_text(encoding="utf-8")


def test_the_validation_cosine_is_the_worst_sample_on_the_emulator(data):
    calib, val = data
    plan = rkcompile.compile(TINY, "rk3588", dtype="int8", calibration=calib, validation=val,
                             calibration_method="minmax", equalization=False, bias_correction=True)
    reference = rkcompile.compile(TINY, "rk3588")  # float16: close enough to tell int8's own error apart
    samples = np.load(val)["image"]
    cosines = []
    for sample in samples:
        got, want = rkcompile.run(plan, {"image": sample})["logits"], rkcompile.run(reference, {"image": sample})["logits"]
        cosines.append(float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)))
    assert plan.record.validation.worst == pytest.approx(min(cosines), abs=2e-4)


def test_a_plan_without_validation_writes_and_reads_none():
    record = rkcompile.compile(TINY, "rk3588").record
    body = record.to_dict()
    assert "validation" not in body and PlanRecord.from_dict(body).validation is None


def test_validation_is_an_int8_option_named_in_each_interface(data, capsys):
    _, val = data
    assert main(["plan", str(TINY), "--target", "rk3588", "--val", str(val)]) == 1
    assert "--val" in capsys.readouterr().err
    with pytest.raises(CompileError, match=r"^validation judges an int8 plan.*add dtype int8") as failure:
        rkcompile.compile(TINY, "rk3588", validation=val)
    assert "--" not in str(failure.value)
    with pytest.raises(CompileError, match="validation: .*missing does not exist"):
        rkcompile.compile(TINY, "rk3588", dtype="int8", validation=val.parent / "missing")
    wrong = val.parent / "wrong.npz"
    np.savez(wrong, image=np.zeros((2, 1, 3, 32, 32), np.float32))
    assert main(["plan", str(TINY), "--target", "rk3588", "--dtype", "int8", "--val", str(wrong)]) == 1
    assert capsys.readouterr().err.startswith("error: --val: ")


def test_few_calibration_samples_are_warned_about_unless_validated(data, caplog):
    calib, val = data
    fixed = dict(dtype="int8", calibration=calib, calibration_method="minmax", equalization=False,
                 bias_correction=False)
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        rkcompile.compile(TINY, "rk3588", **fixed)
    assert any("8 samples" in r.message and "--val" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rkcompile"):
        rkcompile.compile(TINY, "rk3588", validation=val, **fixed)
    assert not any("samples;" in r.message for r in caplog.records)


def test_auto_float16_meets_its_target_on_the_validation_data(data):
    calib, val = data
    plan = rkcompile.compile(TINY, "rk3588", dtype="int8", calibration=calib, validation=val, auto_float16=0.9999999,
                             calibration_method="minmax", equalization=False, bias_correction=True)
    (auto,) = [t for t in plan.record.int8_techniques if t.name == "auto_float16"]
    assert "worst validation cosine" in auto.note
    reached = float(auto.note.split(" -> ")[1].split()[0])
    assert plan.record.validation.worst == pytest.approx(reached, abs=1e-6)


def test_compare_int8_prints_calibration_and_validation_cosines(data, capsys, tmp_path):
    calib, val = data
    out = tmp_path / "rows.json"
    assert main(["compare", str(TINY), "--target", "rk3588,rk3576", "--dtype", "int8", "--calib", str(calib),
                 "--val", str(val), "--json", str(out)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[1:]
    assert header.split()[-4:] == ["cal", "cosine", "val", "cosine"]
    body = json.loads(out.read_text(encoding="utf-8"))["rows"]
    for row, line in zip(body, rows, strict=True):
        assert 0.99 < row["calibration_cosine"] <= 1 + 1e-6 and 0.99 < row["validation_cosine"] <= 1 + 1e-6
        assert line.split()[-2:] == [f"{row['calibration_cosine']:.6f}", f"{row['validation_cosine']:.6f}"]
    assert main(["compare", str(TINY), "--target", "rk3588"]) == 0
    assert "cosine" not in capsys.readouterr().out
