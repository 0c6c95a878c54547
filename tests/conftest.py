"""Shared fixtures: tiny models built with onnx.helper, and the paths of the shared zoo."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# Every plan the tests make, in this process or a child, checks the graph after every pass.
os.environ.setdefault("RKCOMPILE_VERIFY_PASSES", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ZOO = SHARED / "zoo"
LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
PRIMARY_TARGETS = ("rk3588", "rk3576", "rk3562")
TOOLS = REPO / "tools"


@functools.cache
def load_tool(name: str) -> types.ModuleType:
    """tools/NAME.py imported as the module NAME, once per test process; registered in
    sys.modules, where its dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def zoo_models() -> list[Path]:
    return sorted(ZOO.glob("*.onnx")) if ZOO.is_dir() else []


def light_models() -> list[Path]:
    return sorted(LIGHT.glob("*.onnx")) if LIGHT.is_dir() else []


needs_zoo = pytest.mark.skipif(not zoo_models(), reason="../shared/zoo is not present")


def value_info(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def weight(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name=name)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, extra_opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return model


@pytest.fixture
def save(tmp_path):
    """save(model, name) -> path of the model written under tmp_path."""

    def _save(model: onnx.ModelProto, name: str = "model.onnx", **kwargs) -> Path:
        path = tmp_path / name
        onnx.save(model, str(path), **kwargs)
        return path

    return _save


@pytest.fixture(scope="session")
def mixed_model(tmp_path_factory) -> Path:
    """Conv -> Erf (no NPU kernel) -> Conv -> Sigmoid: NPU, CPU and NPU partitions with host
    conversions between them, an in-place hand-over in the CPU region (Erf over its converted input),
    and a Conv large enough that core mask 0_1_2 splits it."""
    rng = np.random.default_rng(0)
    weights = [weight(name, rng.standard_normal((64, 64, 3, 3)).astype(np.float32) * 0.1) for name in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Erf", ["a"], ["b"], name="erf"),
             helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    model = make_model(nodes, [value_info("x", [1, 64, 56, 56])], [value_info("y", [1, 64, 56, 56])], weights)
    path = tmp_path_factory.mktemp("mixed") / "mixed.onnx"
    onnx.save(model, str(path))
    return path
