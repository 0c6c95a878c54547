"""Each pass states the CompileContext fields it reads (NEEDS) and those it sets or changes
(PROVIDES): the pipeline's order must provide every need first, and a pass that changes a field
it does not list is named by the checks run after every pass in the tests."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from rkcompile.compiler.context import CompileContext, Options
from rkcompile.compiler.pipeline import CONTEXT_INPUTS, PASSES, run_passes
from rkcompile.targets import get_target

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"
FIELDS = {field.name for field in dataclasses.fields(CompileContext)}


def test_every_pass_names_real_fields_and_its_needs_come_first():
    provided = set(CONTEXT_INPUTS)
    for compiler_pass in PASSES:
        assert isinstance(compiler_pass.NEEDS, frozenset) and isinstance(compiler_pass.PROVIDES, frozenset)
        assert compiler_pass.NEEDS | compiler_pass.PROVIDES <= FIELDS - {"graph"}, compiler_pass.NAME
        assert compiler_pass.NEEDS <= provided, (compiler_pass.NAME, compiler_pass.NEEDS - provided)
        provided |= compiler_pass.PROVIDES


class _Undeclared:
    """A pass changing a field its PROVIDES leaves out, one way or another."""

    NAME, NEEDS, PROVIDES = "undeclared", frozenset(), frozenset({"notes"})

    def __init__(self, change):
        self.change = change

    def run(self, ctx: CompileContext) -> None:
        ctx.notes["x"] = "declared"
        self.change(ctx)


@pytest.mark.parametrize("change, field", [
    (lambda ctx: ctx.order.append("x"), "order"),                                   # a list, in place
    (lambda ctx: ctx.placement.pop(next(iter(ctx.placement))), "placement"),         # a dict, in place
    (lambda ctx: ctx.tensors.update({k: object() for k in ctx.tensors}), "tensors"),  # same keys, other values
    (lambda ctx: setattr(ctx, "memory", None), "memory"),                           # replaced
])
def test_a_pass_changing_a_field_it_does_not_provide_is_named(tmp_path, change, field):
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    ctx = CompileContext(model_path=model, target=get_target("rk3588"), options=Options(verify_passes=True))
    run_passes(ctx)
    run_passes(ctx, (_Undeclared(lambda ctx: None),))  # notes is declared: no complaint
    with pytest.raises(AssertionError, match=rf"after pass undeclared: pass undeclared changed ctx.{field}, which"):
        run_passes(ctx, (_Undeclared(change),))
