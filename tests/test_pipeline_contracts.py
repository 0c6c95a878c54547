"""Each pass states the CompileContext fields it reads (NEEDS) and those it sets or changes
(PROVIDES), the graph among them: the pipeline's order must provide every need first, and a pass
that changes a field or reads one it does not list is named by the checks run after every pass in
the tests (pipeline.ContractCheck)."""
from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest

from rkcompile.compiler.context import CompileContext

from rkcompile.options import Options
from rkcompile.compiler.pipeline import (CONTEXT_INPUTS, PASSES, ContractCheck, GraphDump, PassTimer,
                                         instruments, run_passes)
from rkcompile.targets import get_target

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"
FIELDS = {field.name for field in dataclasses.fields(CompileContext)}


def test_every_pass_names_real_fields_and_its_needs_come_first():
    provided = set(CONTEXT_INPUTS)
    for compiler_pass in PASSES:
        assert isinstance(compiler_pass.NEEDS, frozenset) and isinstance(compiler_pass.PROVIDES, frozenset)
        assert compiler_pass.NEEDS | compiler_pass.PROVIDES <= FIELDS, compiler_pass.NAME
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
    ctx = _planned(tmp_path)
    run_passes(ctx, (_Undeclared(lambda ctx: None),))  # notes is declared: no complaint
    with pytest.raises(AssertionError, match=rf"after pass undeclared: pass undeclared changed ctx.{field}, which"):
        run_passes(ctx, (_Undeclared(change),))


def _planned(tmp_path) -> CompileContext:
    model = tmp_path / "tiny_cnn.onnx"
    shutil.copy(EXAMPLE, model)
    ctx = CompileContext(model_path=model, target=get_target("rk3588"), options=Options(verify_passes=True))
    run_passes(ctx)
    return ctx


def _reordered(ctx: CompileContext) -> None:
    ctx.graph.nodes.reverse()


@pytest.mark.parametrize("change", [
    lambda ctx: ctx.graph.nodes.pop(),                                             # a node dropped
    _reordered,                                                                    # the same nodes, reordered
    lambda ctx: setattr(ctx.graph.nodes[0], "name", "renamed"),                   # a node renamed
    lambda ctx: ctx.graph.nodes[0].outputs[0].__setattr__("shape", [1]),          # a tensor reshaped
    lambda ctx: setattr(ctx, "graph", type(ctx.graph)(nodes=list(ctx.graph.nodes))),  # replaced
])
def test_a_pass_changing_the_graph_without_providing_it_is_named(tmp_path, change):
    ctx = _planned(tmp_path)

    class ReadsTheGraph(_Undeclared):
        NEEDS = frozenset({"graph"})

    # `verify` may name what the change broke first (a dropped node's tensors link to it still)
    with pytest.raises(AssertionError, match="after pass undeclared: .*pass undeclared changed ctx.graph, which"):
        run_passes(ctx, (ReadsTheGraph(change),))
    ctx = _planned(tmp_path)

    class ChangesTheGraph(_Undeclared):
        PROVIDES = frozenset({"notes", "graph"})

    try:
        run_passes(ctx, (ChangesTheGraph(change),))
    except AssertionError as broken:  # declared: only the graph's own invariants may fail
        assert "changed ctx.graph" not in str(broken)


@pytest.mark.parametrize("read, field", [
    (lambda ctx: len(ctx.placement), "placement"),             # a field read
    (lambda ctx: ctx.graph.nodes, "graph"),                     # the graph read
    (lambda ctx: ctx.retire(ctx.graph.nodes[0], "removed", "-"), "origins"),  # read by a context method it calls
])
def test_a_pass_reading_a_field_it_does_not_need_is_named(tmp_path, read, field):
    ctx = _planned(tmp_path)
    with pytest.raises(AssertionError, match=rf"after pass undeclared: .*pass undeclared read ctx.{field}, which its NEEDS"):
        run_passes(ctx, (_Undeclared(read),))


def test_a_field_read_under_needs_or_provides_is_no_complaint(tmp_path):
    ctx = _planned(tmp_path)

    class Declared(_Undeclared):
        NEEDS = frozenset({"placement"})

    run_passes(ctx, (Declared(lambda ctx: len(ctx.placement) and len(ctx.notes)),))


def test_the_options_pick_the_instruments(tmp_path, caplog):
    assert instruments(Options(verify_passes=False)) == []
    chosen = instruments(Options(verify_passes=True, dump_after=("fuse",), dump_dir=tmp_path))
    assert [type(instrument) for instrument in chosen] == [ContractCheck, GraphDump]
    with caplog.at_level(logging.DEBUG, logger="rkcompile"):
        assert [type(instrument) for instrument in instruments(Options(verify_passes=False))] == [PassTimer]
        ctx = CompileContext(model_path=tmp_path / "tiny_cnn.onnx", target=get_target("rk3588"),
                             options=Options(verify_passes=False, dump_after=("fuse",), dump_dir=tmp_path))
        shutil.copy(EXAMPLE, ctx.model_path)
        run_passes(ctx)
    assert any(record.getMessage().startswith("pass fuse: ") and record.getMessage().endswith(" nodes")
               for record in caplog.records)
    assert (tmp_path / "tiny_cnn.after-fuse.onnx").is_file()
