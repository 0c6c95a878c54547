"""Differential fuzzing in CI: random graphs from tools/fuzz.py's hypothesis strategy, each planned
for a random target (sometimes with a batch or a core mask), must keep every plan invariant and `verify_allocation`, and the float16
emulation must match onnxruntime (unless the graph is too ill-conditioned for float16 at all). Then every shrunk failure saved under tests/regressions
(WHAT@TARGET[@batch=N|@core_mask=M].onnx) is replayed the same way."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from conftest import load_tool
from hypothesis import HealthCheck, given, settings

fuzz = load_tool("fuzz")

#: stem of a saved failure whose root cause another engineer owns -> its kind, and why it still fails
ELSEWHERE = {known.regression: (kind, known.reason) for kind, known in fuzz.ELSEWHERE.items()}
REGRESSIONS = [pytest.param(path, id=path.stem,
                            marks=[pytest.mark.xfail(reason=ELSEWHERE[path.stem][1], strict=True, raises=AssertionError)]
                            if path.stem in ELSEWHERE else [])
               for path in sorted((Path(__file__).resolve().parent / "regressions").glob("*@*.onnx"))]


@settings(max_examples=100, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(model=fuzz.graphs(), setting=fuzz.plan_settings())
def test_random_graphs_plan_soundly_and_match_onnxruntime(model, setting, tmp_path_factory):
    problem = fuzz.check(model, setting, tmp_path_factory.mktemp("fuzz"))
    assert problem is None or problem.startswith(fuzz.NOT_FAILURES) or fuzz.signature(problem, model) in fuzz.ELSEWHERE, \
        f"{setting}: {problem}\n{onnx.printer.to_text(model.graph)}"


def test_the_strategy_builds_valid_models_of_varied_ops():
    seen = set()

    @settings(max_examples=400, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(model=fuzz.graphs())
    def collect(model):
        onnx.checker.check_model(model, full_check=True)
        # the strategy's own shapes, declared on the outputs, must be what onnx infers
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
        seen.update(node.op_type for node in model.graph.node)

    collect()
    wanted = {"Conv", "ConvTranspose", "Concat", "MatMul", "Transpose", "Softmax", "LayerNormalization",
              "ReduceMean", "Pow", "Sqrt", "Erf", "Tanh", "Gather", "Slice", "Split", "Pad", "Resize", "MaxPool",
              "AveragePool", "Shape", "Cast", "Reshape", "Flatten", "QuantizeLinear", "Round"}
    assert wanted <= seen and len(seen) >= 40, (wanted - seen, seen)


@pytest.mark.parametrize("path", REGRESSIONS)
def test_saved_fuzz_failure_now_passes(path, tmp_path):
    setting = path.stem.split("@", 1)[1]  # TARGET, maybe @batch=N or @core_mask=M
    model = onnx.load(str(path))
    problem = fuzz.check(model, setting, tmp_path)
    if problem is not None and path.stem in ELSEWHERE and fuzz.signature(problem, model) != ELSEWHERE[path.stem][0]:
        pytest.fail(f"a known failure now fails otherwise: {problem}")  # not the xfail's AssertionError
    assert problem is None, problem


def test_every_failure_known_elsewhere_is_saved():
    saved = {path.stem for path in (Path(__file__).resolve().parent / "regressions").glob("*@*.onnx")}
    assert set(ELSEWHERE) <= saved
