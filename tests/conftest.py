"""Shared fixtures: tiny models built with onnx.helper, and the paths of the shared zoo."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
ZOO = SHARED / "zoo"
LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
PRIMARY_TARGETS = ("rk3588", "rk3576", "rk3562")


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
