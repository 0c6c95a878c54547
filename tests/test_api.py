"""The public Python API: the script in docs/api.md runs as written, options are a dataclass or
keywords, and the API runs what it saves."""
from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import REPO

import rkcompile
from rkcompile.options import PREFERRED_INT8
from rkcompile.errors import CompileError

TINY = REPO / "examples" / "tiny_cnn.onnx"


def run_examples(document: str, tmp_path) -> subprocess.CompletedProcess:
    """Every ```python block of `document`, as one script, from a folder beside examples/."""
    text = (REPO / document).read_text(encoding="utf-8")
    script = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert script.strip()
    (tmp_path / "examples").symlink_to(REPO / "examples")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def test_the_script_in_docs_api_md_runs(tmp_path):
    done = run_examples("docs/api.md", tmp_path)
    assert "Network summary for tiny_cnn.onnx" in done.stdout and "rk3588" in done.stdout
    assert (tmp_path / "tiny_cnn.rkplan").is_file()
    script = re.search(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S).group(1)
    assert len(script.strip().splitlines()) <= 10


def test_the_readme_examples_run(tmp_path):
    run_examples("README.md", tmp_path)
    assert (tmp_path / "tiny_cnn.rkplan").is_file()


def test_the_package_exports_the_api():
    assert {"compile", "load", "run", "Runtime", "accuracy_analysis", "targets", "Plan", "Options"} <= set(dir(rkcompile))
    assert "rk3588" in [t.name for t in rkcompile.targets()]


def test_options_as_keywords_or_a_dataclass_agree_and_unknown_ones_are_refused():
    by_keyword = rkcompile.compile(TINY, "rk3588", dtype="int8", **PREFERRED_INT8)
    by_options = rkcompile.compile(TINY, "rk3588", rkcompile.Options(dtype="int8", **PREFERRED_INT8))
    assert by_keyword.to_dict() == by_options.to_dict() and by_keyword.dtype == "int8"
    with pytest.raises(CompileError, match="unknown option 'dtpye'"):
        rkcompile.compile(TINY, "rk3588", dtpye="int8")


def test_run_on_a_compiled_plan_equals_run_on_its_saved_copy(tmp_path):
    plan = rkcompile.compile(TINY, "rk3588")
    x = {"image": np.ones((1, 3, 64, 64), np.float32)}
    direct = rkcompile.run(plan, x)
    loaded = rkcompile.run(rkcompile.load(plan.save(tmp_path / "p.rkplan")), x)
    assert direct.keys() == loaded.keys()
    for name in direct:
        np.testing.assert_array_equal(direct[name], loaded[name])


def test_a_runtime_runs_as_run_does_and_keeps_what_the_plan_prepared(tmp_path):
    saved = rkcompile.compile(TINY, "rk3588").save(tmp_path / "p.rkplan")
    plan = rkcompile.load(saved)
    runtime = rkcompile.Runtime(plan)
    cache = plan.prepared().weight_cache
    nodes = cache.nodes
    assert nodes is not None  # made when the runtime was
    xs = [{"image": np.random.default_rng(seed).standard_normal((1, 3, 64, 64)).astype(np.float32)} for seed in range(3)]
    for x in xs:
        expected = rkcompile.run(rkcompile.load(saved), x)  # a fresh plan each time
        for _ in range(2):
            outputs = runtime.run(x)
            assert outputs.keys() == expected.keys()
            for name in expected:
                np.testing.assert_array_equal(outputs[name], expected[name])
    assert cache.nodes is nodes and plan.prepared().weight_cache is cache and cache.cpu is not None


def test_a_runtime_shared_between_threads_gives_each_run_its_own_outputs(tmp_path):
    """Runs of one plan from several threads take turns; the float16 conversions each thread
    makes are its own, so two plans may run at once."""
    saved = rkcompile.compile(TINY, "rk3588").save(tmp_path / "p.rkplan")
    shared, other = rkcompile.Runtime(rkcompile.load(saved)), rkcompile.Runtime(rkcompile.load(saved))
    xs = [{"image": np.random.default_rng(seed).standard_normal((1, 3, 64, 64)).astype(np.float32)} for seed in range(8)]
    expected = [rkcompile.run(rkcompile.load(saved), x) for x in xs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda job: (shared if job[0] % 2 else other).run(job[1]), enumerate(xs * 3)))
    for outputs, wanted in zip(got, expected * 3):
        for name in wanted:
            np.testing.assert_array_equal(outputs[name], wanted[name])


#: A fresh process runs a saved plan on inputs saved beside it, then says whether numpy.random
#: was imported
RUN_ON_GIVEN_INPUTS = """
import sys
import numpy as np
import rkcompile
rkcompile.Runtime(rkcompile.load(sys.argv[1])).run(dict(np.load(sys.argv[2])))
print('numpy.random' in sys.modules)
"""


def test_a_run_on_given_inputs_draws_none_and_skips_numpy_random(tmp_path):
    """Random inputs are drawn only for the inputs not given, so a first run on given inputs
    spends nothing on numpy.random (its import was about 9 ms of CPU in a fresh process)."""
    saved = rkcompile.compile(TINY, "rk3588").save(tmp_path / "p.rkplan")
    np.savez(tmp_path / "x.npz", image=np.ones((1, 3, 64, 64), np.float32))
    done = subprocess.run([sys.executable, "-c", RUN_ON_GIVEN_INPUTS, str(saved), str(tmp_path / "x.npz")],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.split() == ["False"]


def test_accuracy_analysis_of_an_int8_plan_lists_every_step_output():
    plan = rkcompile.compile(TINY, "rk3588", dtype="int8")
    rows = rkcompile.accuracy_analysis(plan)
    assert rows and all(-1.0 <= row.cosine <= 1.0 + 1e-6 for row in rows)
    assert {row.step for row in rows} <= {step.id for step in plan.record.steps}


def test_an_input_name_the_model_lacks_is_refused():
    plan = rkcompile.compile(TINY, "rk3588")
    with pytest.raises(CompileError, match="'input' is not an input of the model \\(inputs: image\\)"):
        rkcompile.run(plan, {"input": np.ones((1, 3, 64, 64), np.float32)})
