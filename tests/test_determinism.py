"""Planning is deterministic: the same model and target give byte-identical plan JSON, planned
twice in one process and in processes with different string-hash seeds (set and dict orders
that leak into a plan would differ between those)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rkcompile.compiler.pipeline import compile_model

REPO = Path(__file__).resolve().parents[1]
SHARED_ZOO = REPO.parent / "shared" / "zoo"
MODELS = sorted((REPO / "examples" / "zoo").glob("*.onnx")) + sorted(
    SHARED_ZOO / f"{name}.onnx" for name in ("bert_mini",) if (SHARED_ZOO / f"{name}.onnx").is_file())
TARGETS = ("rk3588", "rk3576")

DIGESTS = """
import hashlib, sys
from rkcompile.compiler.pipeline import compile_model
for model in sys.argv[1:]:
    for target in {targets!r}:
        print(hashlib.sha256(compile_model(model, target)[0].to_json().encode()).hexdigest())
"""


def digests_in_subprocess(hash_seed: str) -> list[str]:
    environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", DIGESTS.format(targets=TARGETS), *map(str, MODELS)],
                          env=environment, capture_output=True, text=True, check=True, timeout=300)
    return done.stdout.split()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_planning_twice_gives_identical_json(model, target):
    first = compile_model(model, target)[0].to_json()
    second = compile_model(model, target)[0].to_json()
    assert first == second


def test_plans_do_not_depend_on_the_hash_seed():
    here = [hashlib.sha256(compile_model(m, t)[0].to_json().encode()).hexdigest() for m in MODELS for t in TARGETS]
    assert digests_in_subprocess("1") == here
    assert digests_in_subprocess("2") == here
