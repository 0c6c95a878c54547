"""The memory and time pictures (rkcompile/views/charts.py), checked on the SVG they write: arena
rectangles never share area and sit where the plan puts their tensors, the lower bound line is
at its height, and the timeline shows every step, ends at the plan's latency and gives each core
the busy time the plan states. `graph` draws a saved .rkplan like the model it came from."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from itertools import combinations
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import rkcompile
from rkcompile.plan.aliases import storage_of
from rkcompile.views import charts
from rkcompile.cli import main

from conftest import make_model, value_info, weight

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO.parent / "shared" / "zoo"
EXAMPLE = REPO / "examples" / "tiny_cnn.onnx"
SVG = "{http://www.w3.org/2000/svg}"
sys.path.insert(0, str(REPO / "tools"))
import screenshot_html  # noqa: E402  (a tools/ script, not a package)


def _models(mixed: Path) -> list[Path]:
    return [mixed, EXAMPLE] + ([ZOO / "yolov8n.onnx", ZOO / "bert_mini.onnx"] if ZOO.is_dir() else [])


def _rects(svg: str, cls: str) -> list[dict[str, str]]:
    root = ET.fromstring(svg)
    return [r.attrib for r in root.iter(f"{SVG}rect") if r.get("class") == cls]


def _memory_checks(plan: rkcompile.Plan) -> None:
    record = plan.record
    root = ET.fromstring(charts.memory_svg(record))
    arena = next(r for r in root.iter(f"{SVG}rect") if r.get("id") == "arena")
    top, height = float(arena.get("y")), float(arena.get("height"))
    x_scale = float(arena.get("width")) / len(record.steps)
    y_scale = height / record.memory.arena_bytes
    blocks = [r.attrib for r in root.iter(f"{SVG}rect") if r.get("class") == "tensor"]
    # an alias (a relabel's output on its input's bytes) is drawn as the tensor whose bytes it is
    touched = {storage_of(record.tensors, t) for step in record.steps for t in step.inputs + step.outputs
               if record.tensors[t].region == "arena" and record.tensors[t].bytes}
    assert {b["data-tensor"] for b in blocks} == touched
    boxes = []
    for block in blocks:
        placed = record.tensors[block["data-tensor"]]
        x, y, w, h = (float(block[k]) for k in ("x", "y", "width", "height"))
        # where the plan puts the tensor: bottom at its offset, height its bytes
        assert y + h == pytest.approx(top + height - placed.offset * y_scale, abs=2e-3)
        assert h == pytest.approx(placed.bytes * y_scale, abs=2e-3)
        boxes.append((x / x_scale, (x + w) / x_scale, placed.offset, placed.offset + placed.bytes, block["data-tensor"]))
    for (x0, x1, y0, y1, a), (u0, u1, v0, v1, b) in combinations(boxes, 2):
        shared = min(x1, u1) - max(x0, u0) > 1e-3 and min(y1, v1) - max(y0, v0) > 0
        assert not shared, f"{a} and {b} overlap in offset x lifetime"
    line = next(e for e in root.iter(f"{SVG}line") if e.get("id") == "lower-bound")
    expected = top + height * (1 - record.memory.lower_bound_bytes / record.memory.arena_bytes)
    assert float(line.get("y1")) == float(line.get("y2")) == pytest.approx(expected, abs=2e-3)


def test_memory_rectangles_never_overlap_and_sit_at_their_offsets(mixed_model):
    for model in _models(mixed_model):
        _memory_checks(rkcompile.compile(model, "rk3588"))


def test_an_in_place_hand_over_shares_its_step_without_overlapping(tmp_path):
    # a Sigmoid over the model input's NPU copy, read last there: it writes over it in place
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
                        helper.make_node("Conv", ["s", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
                       [value_info("x", [1, 16, 32, 32])], [value_info("y", [1, 16, 32, 32])],
                       [weight("w", rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1)])
    onnx.save(model, tmp_path / "sigmoid_conv.onnx")
    record = rkcompile.compile(tmp_path / "sigmoid_conv.onnx", "rk3588").record
    reusing = [name for name, t in record.tensors.items() if t.reuses]
    assert reusing and all(record.tensors[name].region == "arena" for name in reusing)
    blocks = {b.tensor: b for b in charts.arena_blocks(record)}
    for name in reusing:
        source = blocks[record.tensors[name].reuses]
        assert source.stop == blocks[name].start == int(source.stop) + 0.5
        assert blocks[name].offset == source.offset


def _timeline_checks(plan: rkcompile.Plan) -> None:
    record, multicore = plan.record, plan.record.multicore
    root = ET.fromstring(charts.timeline_svg(record))
    bars = [r.attrib for r in root.iter(f"{SVG}rect") if r.get("class") == "bar"]
    images = multicore.batch if multicore.contexts else 1
    shown = {(int(b["data-step"]), int(b["data-image"])) for b in bars if "data-step" in b}
    assert shown == {(step.id, image) for step in record.steps for image in range(images)}
    lanes: dict[str, list[tuple[float, float]]] = {}
    for bar in bars:
        lanes.setdefault(bar["data-lane"], []).append((float(bar["data-start-ms"]), float(bar["data-stop-ms"])))
    for lane, spans in lanes.items():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:])), f"{lane}: bars overlap"
    assert max(stop for spans in lanes.values() for _, stop in spans) == pytest.approx(
        multicore.est_latency_ms, abs=1e-3)
    for timeline in multicore.per_core:
        busy = sum(float(b["data-stop-ms"]) - float(b["data-start-ms"]) for b in bars
                   if b["data-lane"] == f"NPU core {timeline.core}" and b["data-kind"] == "npu")
        assert busy == pytest.approx(timeline.est_ms, abs=1e-3)
    hosts = [b for b in bars if b["data-kind"] == "host"]
    assert len(hosts) == images * sum(step.device == "host" for step in record.steps)
    assert all(b["data-lane"].startswith("CPU") for b in hosts)
    # the geometry says what the data attributes say: the last bar's right edge is the latency
    lane_rect = next(r for r in root.iter(f"{SVG}rect") if r.get("class") == "lane")
    left, width = float(lane_rect.get("x")), float(lane_rect.get("width"))
    right = max(float(b["x"]) + float(b["width"]) for b in bars)
    assert right == pytest.approx(left + width, abs=1e-2)


@pytest.mark.parametrize("options", [{}, {"batch": 3}, {"batch": 2}, {"core_mask": "0_1_2"}],
                         ids=["batch1", "batch3", "batch2", "mask0_1_2"])
def test_timeline_shows_every_step_and_ends_at_the_plans_latency(mixed_model, options):
    for model in _models(mixed_model):
        _timeline_checks(rkcompile.compile(model, "rk3588", **options))
    two_cores = {**options, "core_mask": "0_1"} if "core_mask" in options else options
    _timeline_checks(rkcompile.compile(mixed_model, "rk3576", **two_cores))


def test_split_parts_run_on_every_core_of_the_mask(mixed_model):
    record = rkcompile.compile(mixed_model, "rk3588", core_mask="0_1_2").record
    assert record.multicore.splits, "the 64-channel 56x56 Conv splits over three cores"
    for split in record.multicore.splits:
        assert all(part.est_ms > 0 for part in split.parts)
        lanes = {bar.lane for bar in charts.timeline_bars(record) if bar.step == split.step}
        assert lanes == {f"NPU core {part.core}" for part in split.parts}


def _graph(*args: str | Path) -> int:
    return main(["graph", *map(str, args)])


def test_graph_writes_the_two_pictures_as_svg(mixed_model, tmp_path):
    for fmt in ("memory-svg", "timeline-svg"):
        out = tmp_path / f"{fmt}.svg"
        assert _graph(mixed_model, "--target", "rk3588", "--format", fmt, "-o", out) == 0
        root = ET.fromstring(out.read_text(encoding="utf-8"))
        assert root.tag == f"{SVG}svg" and root.get("class") == f"rkcompile-{fmt.split('-')[0]}"


def test_html_report_holds_both_pictures(mixed_model, tmp_path):
    out = tmp_path / "g.html"
    assert _graph(mixed_model, "--target", "rk3588", "-o", out) == 0
    page = out.read_text(encoding="utf-8")
    assert 'class="rkcompile-memory"' in page and 'class="rkcompile-timeline"' in page
    assert 'id="lower-bound"' in page and 'data-kind="host"' in page


@pytest.fixture(scope="module")
def saved(mixed_model, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    assert main(["plan", str(mixed_model), "--target", "rk3588", "--quiet", "-o", str(folder / "m.rkplan"),
                 "--json", str(folder / "m.json")]) == 0
    return folder


@pytest.mark.parametrize("fmt", ["dot", "html", "memory-svg", "timeline-svg"])
def test_graph_draws_a_saved_plan_as_it_draws_the_model(mixed_model, saved, tmp_path, fmt):
    from_model, from_artifact, from_json = (tmp_path / name for name in ("model", "artifact", "json"))
    assert _graph(mixed_model, "--target", "rk3588", "--format", fmt, "-o", from_model) == 0
    assert _graph(saved / "m.rkplan", "--format", fmt, "-o", from_artifact) == 0
    assert _graph(saved / "m.json", "--format", fmt, "-o", from_json) == 0
    assert from_artifact.read_text() == from_model.read_text() == from_json.read_text()


def test_graph_onnx_from_a_saved_artifact_runs_like_the_model(mixed_model, saved, tmp_path):
    out = tmp_path / "p.onnx"
    assert _graph(saved / "m.rkplan", "-o", out) == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["NpuPartition", "Erf", "NpuPartition"]
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 64, 56, 56)).astype(np.float32)}
    expected = ort.InferenceSession(mixed_model.read_bytes(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(out.read_bytes(), providers=["CPUExecutionProvider"]).run(None, feeds)
    # the artifact's weights are the weight region's: float16-rounded
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=5e-3)


@pytest.mark.parametrize("args, message", [
    (["m.json", "--format", "onnx"], "has no weight region"),
    (["m.rkplan", "--format", "dot", "--dtype", "int8"], "saved plan, planned with its own flags: drop --dtype"),
    (["m.rkplan", "--format", "dot", "--target", "rk3576"], "was planned for rk3588"),
])
def test_graph_of_a_saved_plan_refuses_what_it_cannot_do_in_one_line(saved, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert _graph(saved / args[0], *args[1:], "-o", out) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not out.exists()


def test_graph_of_a_model_still_needs_a_target(mixed_model, tmp_path, capsys):
    assert _graph(mixed_model, "-o", tmp_path / "g.dot") == 1
    assert "--target is required" in capsys.readouterr().err


@pytest.mark.skipif(screenshot_html.find_chromium() is None, reason="Chromium is not installed")
def test_the_pictures_render_in_headless_chromium(mixed_model, tmp_path):
    image = pytest.importorskip("PIL.Image")
    page, png = tmp_path / "g.html", tmp_path / "g.png"
    assert _graph(mixed_model, "--target", "rk3588", "-o", page) == 0
    screenshot_html.screenshot(page, png, width=1200, height=1100)
    pixels = np.asarray(image.open(png).convert("RGB")).reshape(-1, 3)

    def count(colour: str) -> int:
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
        return int(np.all(np.abs(pixels.astype(int) - rgb) <= 8, axis=1).sum())

    # painted, not just present in the markup: NPU and CPU bars and blocks, the lower bound line
    assert count(charts.FILLS["npu"]) > 500 and count(charts.FILLS["cpu"]) > 100
    red = (pixels[:, 0] > 180) & (pixels[:, 1] < 110) & (pixels[:, 2] < 110)  # the line, antialiased
    assert int(red.sum()) > 300


def test_graph_draws_a_plan1_file_without_operations_or_rules(saved, tmp_path):
    """Plans written before steps carried operations and nodes their rules still draw: steps are
    named by their first node, and a CPU node shows its reason whole."""
    body = json.loads((saved / "m.json").read_text(encoding="utf-8"))
    body["schema"] = "rkcompile.plan/1"
    for step in body["steps"]:
        step.pop("operation"), step.pop("cpu_backend")
    for node in body["nodes"]:
        node.pop("rules")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(body), encoding="utf-8")
    for fmt in ("html", "memory-svg", "timeline-svg", "dot"):
        assert _graph(old, "--format", fmt, "-o", tmp_path / f"old.{fmt}") == 0
    page = (tmp_path / "old.html").read_text(encoding="utf-8")
    erf = next(node for node in body["nodes"] if node["name"] == "erf")
    assert '<div class="reason">' in page and 'id="node-erf"' in page
    assert "Erf is not in rk3588" in erf["reason"] and "<li>" not in page
