"""`rkcompile graph`: DOT, SVG (or a clear message without Graphviz), offline HTML rendered in
headless Chromium, and the partitioned ONNX checked by onnx.checker and run by onnxruntime."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rkcompile
from rkcompile.cli import main
from rkcompile.views.partitioned_onnx import partitioned_model
from rkcompile.compiler.pipeline import compile_model

REPO = Path(__file__).resolve().parents[1]
ZOO = Path(__file__).resolve().parents[2] / "shared" / "zoo"
sys.path.insert(0, str(REPO / "tools"))
import screenshot_html  # noqa: E402  (a tools/ script, not a package)


def _graph(model: Path, fmt: str, out: Path) -> int:
    return main(["graph", str(model), "--target", "rk3588", "--format", fmt, "-o", str(out)])


def test_dot_has_one_cluster_per_partition_and_every_step(mixed_model, tmp_path):
    out = tmp_path / "g.dot"
    assert _graph(mixed_model, "dot", out) == 0
    text = out.read_text()
    plan, ctx = compile_model(mixed_model, "rk3588")
    assert text.startswith("digraph ")
    assert len(re.findall(r"subgraph cluster_\d+", text)) == len(plan.partitions)
    for name in ctx.order:
        assert f'"{name}" [label=' in text
    cpu = next(p for p in plan.partitions if p.device == "cpu")
    assert f"partition {cpu.id}: cpu (1)" in text


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_svg_through_graphviz(mixed_model, tmp_path):
    out = tmp_path / "g.svg"
    assert _graph(mixed_model, "svg", out) == 0
    assert "<svg" in out.read_text()


def test_svg_without_graphviz_is_one_clear_line(mixed_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "g.svg"
    assert _graph(mixed_model, "svg", out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --format svg needs Graphviz's 'dot'") and "\n" not in err
    assert not out.exists()


def test_html_is_self_contained_and_shows_every_failing_rule(mixed_model, tmp_path):
    out = tmp_path / "g.html"
    assert _graph(mixed_model, "html", out) == 0
    page = out.read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page must not load anything"
    assert "<script" not in page
    plan, ctx = compile_model(mixed_model, "rk3588")
    assert page.count('<details class="partition"') == len(plan.partitions)
    for failure in ctx.failures["erf"]:
        assert f"<li>{failure}</li>".replace("'", "&#x27;") in page
    assert "ConvolutionSigmoid" in page or "Sigmoid" in page


def test_large_partitions_start_collapsed():
    from rkcompile.views.html_report import OPEN_LIMIT, _partition_html
    from rkcompile.views.partition_view import NodeView, PartitionView

    node = NodeView("n", "Relu", "npu", "Relu", (), (), ("n",), (), None)
    small = _partition_html(PartitionView(0, "npu", (node,) * OPEN_LIMIT, ()))
    large = _partition_html(PartitionView(1, "npu", (node,) * (OPEN_LIMIT + 1), ()))
    assert " open>" in small and " open>" not in large


@pytest.mark.skipif(screenshot_html.find_chromium() is None, reason="Chromium is not installed")
def test_html_renders_in_headless_chromium(mixed_model, tmp_path):
    page, png = tmp_path / "g.html", tmp_path / "g.png"
    assert _graph(mixed_model, "html", page) == 0
    screenshot_html.screenshot(page, png, width=900, height=700)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def _outputs(model_bytes: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_partitioned_onnx_checks_and_computes_the_same(mixed_model, tmp_path):
    out = tmp_path / "g.onnx"
    assert _graph(mixed_model, "onnx", out) == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    calls = [n for n in model.graph.node if n.op_type == "NpuPartition"]
    assert [n.domain for n in calls] == ["rkcompile", "rkcompile"]
    assert {f.overload for f in model.functions} == {n.overload for n in calls}
    assert [n.op_type for n in model.graph.node] == ["NpuPartition", "Erf", "NpuPartition"]
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 64, 56, 56)).astype(np.float32)}
    expected = _outputs(mixed_model.read_bytes(), feeds)
    np.testing.assert_allclose(_outputs(out.read_bytes(), feeds)[0], expected[0], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not ZOO.is_dir(), reason="../shared/zoo is absent")
@pytest.mark.parametrize("name", sorted(p.stem for p in ZOO.glob("*.onnx")) if ZOO.is_dir() else [])
def test_zoo_partitioned_onnx_passes_the_checker_and_matches_the_reference(name):
    plan = rkcompile.compile(ZOO / f"{name}.onnx", "rk3588")
    model = partitioned_model(plan.record, plan.reference_nodes)
    onnx.checker.check_model(model, full_check=True)
    npu_partitions = sum(1 for p in plan.record.partitions if p.device == "npu")
    assert sum(1 for n in model.graph.node if n.op_type == "NpuPartition") == npu_partitions
    reference = np.load(ZOO / f"{name}.npz")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: reference[i.name] for i in session.get_inputs()})
    for value, output in zip(got, session.get_outputs()):
        np.testing.assert_allclose(value, reference[output.name], rtol=1e-4, atol=1e-4)


def test_graph_creates_a_missing_output_folder(mixed_model, tmp_path):
    assert _graph(mixed_model, "dot", tmp_path / "absent" / "g.dot") == 0
    assert (tmp_path / "absent" / "g.dot").read_text(encoding="utf-8").startswith("digraph")
