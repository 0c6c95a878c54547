"""`rkcompile run --check` on the shared zoo at rk3588 float16: every output at cosine >= 0.9999
against the onnxruntime reference arrays in NAME.npz. The two smallest models run in CI; the
whole zoo is marked slow (8 s in all when measured)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rkcompile.cli import main

ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
MODELS = sorted(p.stem for p in ZOO.glob("*.onnx")) if ZOO.is_dir() else []
FAST = {"lstm_textcls", "transformer_encoder"}

pytestmark = pytest.mark.skipif(not MODELS, reason="../shared/zoo is not present")


def check(model: str, tmp_path: Path) -> dict:
    report = tmp_path / f"{model}.json"
    status = main(["run", str(ZOO / f"{model}.onnx"), "--target", "rk3588", "--inputs", str(ZOO / f"{model}.npz"),
                   "--check", "--json", str(report)])
    data = json.loads(report.read_text())
    assert data["reference"] == "inputs file" and not data["random_inputs"]
    assert status == 0 and data["passed"], data["agreement"]
    assert all(a["cosine"] >= 0.9999 for a in data["agreement"])
    return data


@pytest.mark.parametrize("model", sorted(FAST & set(MODELS)))
def test_small_zoo_models_match_onnxruntime_in_float16(model, tmp_path):
    check(model, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(set(MODELS) - FAST))
def test_zoo_model_matches_onnxruntime_in_float16(model, tmp_path):
    check(model, tmp_path)
