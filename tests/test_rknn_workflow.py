"""The workflow rknn-toolkit2 users expect (issue 38): shapes checked when planning, the batch
counted in images, API errors in the API's terms, artifacts written and checked one way,
per-step performance and memory totals."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import rkcompile
from conftest import REPO, make_model, value_info, weight
from rkcompile.cli import main
from rkcompile.errors import CompileError

TINY = REPO / "examples" / "tiny_cnn.onnx"


def _one_error_line(capsys, *argv) -> str:
    """The one `error:` line a failing command prints."""
    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _symbolic(dims: dict[int, str], path) -> str:
    """tiny_cnn with the input dims `dims` (axis -> symbol) left symbolic, saved at `path`."""
    model = onnx.load(str(TINY))
    declared = model.graph.input[0].type.tensor_type.shape.dim
    for axis, symbol in dims.items():
        declared[axis].dim_param = symbol
    onnx.save(model, str(path))
    return str(path)


def test_an_input_shape_changing_a_static_dim_is_refused(capsys):
    err = _one_error_line(capsys, "plan", str(TINY), "--target", "rk3588", "--input-shape", "image:1,5,64,64")
    assert "input 'image'" in err and "dim 1" in err and "5" in err and "3" in err


def test_an_input_shape_restating_the_static_shape_is_accepted(capsys, tmp_path):
    assert main(["plan", str(TINY), "--target", "rk3588", "--input-shape", "image:1,3,64,64", "--quiet"]) == 0
    artifact = tmp_path / "tiny.rkplan"
    rkcompile.compile(TINY, "rk3588").save(artifact)
    assert main(["run", "--plan", str(artifact), "--input-shape", "image:1,3,64,64"]) == 0
    err = _one_error_line(capsys, "run", "--plan", str(artifact), "--input-shape", "image:1,3,32,32")
    assert "image:1,3,32,32" in err and "planned with image:1,3,64,64" in err and "(" + "1, 3" not in err


def test_a_symbolic_dim_given_a_count_the_weights_refuse_is_one_line(capsys, tmp_path):
    model = _symbolic({1: "C"}, tmp_path / "symbolic.onnx")
    err = _one_error_line(capsys, "plan", model, "--target", "rk3588", "--input-shape", "image:1,5,64,64")
    assert "input 'image'" in err and "dim 1" in err and "Conv" in err and "needs 3" in err
    with pytest.raises(CompileError, match="needs 3"):
        rkcompile.compile(model, "rk3588", input_shapes={"image": (1, 5, 64, 64)})
    assert rkcompile.compile(model, "rk3588", input_shapes={"image": (1, 3, 64, 64)}).record.steps


def test_a_failing_shape_inference_names_the_input_shape_given(capsys, save):
    gemm = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [value_info("x", ["N", "K"])],
                      [value_info("y", ["N", 4])], [weight("w", np.zeros((4, 7), np.float32))])
    err = _one_error_line(capsys, "plan", str(save(gemm)), "--target", "rk3588", "--input-shape", "x:1,5")
    assert "shape inference failed with input shape x:1,5" in err
