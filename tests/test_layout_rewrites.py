"""Layout rewrites on shapes and perms of their own (not the repros'): Transposes over their
perm's limits on another 4-D view or in slices along any axis, regions of tensors above rank 4
collapsed onto merged axes, and the Conv/MatMul residual that once made `plan` run forever.
Each case is planned at the three primary targets: no CPU node, and `rkcompile run --check`
agrees with onnxruntime."""
from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import helper

from rkcompile.cli import main
from rkcompile.passes.legalize import check_node
from rkcompile.numerics.nc1hwc2 import nc1hwc2_bytes
from rkcompile.passes.rewrites.layout_ops import (MAX_TRANSPOSE_VIEWS, SLICED_VIEWS, _placements,
    _stores_no_more, _transpose_views, _two_transposes, next_refinements, transpose_groups, transpose_views)
from rkcompile.compiler.pipeline import compile_model
from rkcompile.targets import get_target

from conftest import PRIMARY_TARGETS, SHARED, make_model, value_info, weight
from test_rewrites import assert_same_outputs, feed, ops_of, rewritten, rules_fired, shape_of, with_refusals

RNG = np.random.default_rng(11)


def transpose_model(shape, perm) -> onnx.ModelProto:
    return make_model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=list(perm))],
                      [value_info("x", shape)], [value_info("y", [shape[p] for p in perm])])


def planned_on_npu(model: onnx.ModelProto, tmp_path, target: str) -> None:
    """Every node of `model` planned on the NPU at `target`, and its emulation agrees with onnxruntime."""
    path = tmp_path / f"model_{target}.onnx"
    onnx.save(model, path)
    plan, _ = compile_model(path, target)
    on_cpu = [(n.name, n.op, n.reason) for n in plan.nodes if n.device == "cpu"]
    assert not on_cpu, on_cpu
    report = tmp_path / f"report_{target}.json"
    assert main(["run", str(path), "--target", target, "--check", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["passed"] and min(a["cosine"] for a in data["agreement"]) >= 0.9999


def refused_as_given(model: onnx.ModelProto, target: str) -> bool:
    node = gs.import_onnx(onnx.shape_inference.infer_shapes(model)).nodes[0]
    return bool(check_node(node, get_target(target)))


# --- Gathers of constant indices of rank 2 or more -------------------------------------------

@pytest.mark.parametrize("shape, axis, indices", [
    ([1, 40, 6], 1, np.arange(40)[::-1].reshape(1, 40) % 40),   # positions reordered, indices [1, 40]
    ([12, 8], 0, np.array([[3, -1, 0], [5, 5, 2]])),              # repeats and a negative index
    ([2, 10, 7], 2, np.arange(6).reshape(3, 2)),                   # the last axis, rank grows to 4
])
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_gather_of_constant_multi_axis_indices_runs_flat_on_the_npu(tmp_path, shape, axis, indices, target):
    out = list(np.take(np.zeros(shape), indices, axis=axis).shape)
    model = make_model([helper.make_node("Gather", ["x", "idx"], ["g"], name="gather", axis=axis),
                        helper.make_node("Relu", ["g"], ["y"], name="relu")],
                       [value_info("x", shape)], [value_info("y", out)], [weight("idx", indices.astype(np.int64))])
    assert refused_as_given(model, target)
    planned_on_npu(model, tmp_path, target)



# --- the parts of a Split joined in another order ----------------------------------------------

def split_rejoined(order: list[int], axis: int = 3) -> onnx.ModelProto:
    sizes = [3, 5, 8]
    parts = [f"p{i}" for i in range(3)]
    shape = [1, 2, 6, 16]
    return make_model([helper.make_node("Split", ["x", "sizes"], parts, name="split", axis=axis),
                       helper.make_node("Concat", [parts[i] for i in order], ["c"], name="concat", axis=axis),
                       helper.make_node("Relu", ["c"], ["y"], name="relu")],
                      [value_info("x", shape)], [value_info("y", shape)],
                      [weight("sizes", np.array(sizes, dtype=np.int64))])


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_a_split_rejoined_in_another_order_is_one_gather(tmp_path, target):
    """rotate_half's halves swapped, here in three parts of unequal widths."""
    model = split_rejoined([2, 0, 1])
    planned_on_npu(model, tmp_path, target)
    plan, _ = compile_model(tmp_path / f"model_{target}.onnx", target)
    assert [step.kernel for step in plan.steps if step.device == "npu"][:2] == ["Gather", "Relu"]


def test_a_split_rejoined_in_its_own_order_is_no_gather(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(split_rejoined([0, 1, 2]), path)
    plan, ctx = compile_model(path, "rk3588")
    assert "Gather" not in [step.kernel for step in plan.steps]
    outcomes = {a.rule: a.outcome for a in ctx.rewrite_attempts["concat"]}
    assert "in their own order" in outcomes["reordered_split_as_gather"]


# --- Transposes over their perm's limits ------------------------------------------------------

@pytest.mark.parametrize("shape, perm", [
    ([1, 300, 200], [0, 2, 1]),       # token transpose over h1*w1 < 2q on rk3588
    ([2, 96, 136], [0, 2, 1]),
    ([1, 8, 128, 96], [0, 1, 3, 2]),  # a key transposed for q @ k^T
    ([1, 6, 72, 80], [0, 2, 1, 3]),   # heads moved, h1 not a multiple of 8
    ([546, 400], [1, 0]),             # a merged detection head
])
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_refused_transposes_run_on_the_npu_on_another_view(tmp_path, shape, perm, target):
    model = transpose_model(shape, perm)
    if target == "rk3588":
        assert refused_as_given(model, target)  # the case is one the old plan put on the CPU
    planned_on_npu(model, tmp_path, target)


@pytest.mark.parametrize("shape, perm", [([64, 48], [1, 0]), ([3, 40, 24], [2, 0, 1]), ([1, 2, 30, 16], [0, 3, 2, 1])])
def test_a_transpose_no_view_admits_runs_in_slices_even_along_a_moved_axis(tmp_path, shape, perm):
    """A limit on the element count holds for every view, so only slices help; every axis of
    these perms moves (the [64, 48] swap has no axis left in place at all)."""
    limit = int(np.prod(shape)) // 3
    small = with_refusals(Transpose=lambda n: int(np.prod(shape_of(n))) >= limit)
    ctx = rewritten(transpose_model(shape, perm), tmp_path, small)
    assert rules_fired(ctx) == ["transpose_as_legal_view"]
    transposes = [n for n in ctx.graph.nodes if n.op == "Transpose"]
    assert len(transposes) >= 3 and not any(check_node(t, small) for t in transposes)
    assert_same_outputs(transpose_model(shape, perm), ctx, {"x": feed(shape)})


@pytest.mark.parametrize("shape, perm", [
    ([8, 8, 7, 336], [0, 2, 1, 3]),  # a Swin window reverse: the swapped axis of 7 is no multiple of 8
    ([16, 16, 2, 16], [0, 2, 1, 3]),  # windows' tokens and 2 heads swapped for the attention
    ([4, 4, 7, 672], [0, 2, 1, 3]),  # the next stage's reverse: 4 windows of 7 rows
])
def test_a_transpose_no_view_admits_whole_runs_as_two_legal_transposes(tmp_path, shape, perm):
    """Two Transposes, each legal on rk3588, where slices take a Split, a step per slice and a
    Concat."""
    model = transpose_model(shape, perm)
    assert refused_as_given(model, "rk3588")
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert rules_fired(ctx) == ["transpose_as_legal_view"]
    assert [n.op for n in ctx.graph.nodes if n.op not in ("Reshape",)] == ["Transpose", "Transpose"]
    assert not [n.name for n in ctx.graph.nodes if check_node(n, get_target("rk3588"))]
    assert_same_outputs(model, ctx, {"x": feed(shape)})
    planned_on_npu(model, tmp_path, "rk3588")


@pytest.mark.parametrize("shape, perm", [([3, 5, 7, 11], perm) for perm in itertools.permutations(range(4))]
                         + [([2, 3, 4], [2, 0, 1]), ([6, 1, 5], [2, 1, 0])])
def test_two_transposes_move_data_as_the_perm_does(shape, perm):
    """Whatever pair a probe lets through, the second completes the first into `perm`, on the
    merged view, and nothing in between is stored in more bytes than both ends."""
    found = _two_transposes(shape, perm, lambda in4, perm4: perm4 != tuple(range(4)), {8, 16})
    if transpose_groups(shape, perm) is None:
        assert found is None
        return
    (in4, first), second = found
    x = np.arange(np.prod(shape)).reshape(shape)
    moved = x.reshape(in4).transpose(first).transpose(second.perm)
    np.testing.assert_array_equal(moved.reshape(-1), x.transpose(perm).reshape(-1))
    between = tuple(in4[a] for a in first)
    for c2 in (8, 16):
        ends = max(nc1hwc2_bytes(in4, c2, 1), nc1hwc2_bytes(moved.shape, c2, 1))
        assert nc1hwc2_bytes(between, c2, 1) <= ends


def test_two_transposes_never_pass_through_a_padded_tensor():
    """[1, 64, 3, 64] -> [1, 64, 64, 3] keeps 64 channels at both ends; once the probe lets
    through only pairs with the 3 on the channels (padded to C2 there), no pair is taken."""
    three_on_channels = lambda in4, perm4: 3 in (in4[1], in4[perm4[1]])  # noqa: E731
    assert _two_transposes([1, 64, 3, 64], [0, 1, 3, 2], three_on_channels, {8}) is None
    assert _two_transposes([1, 64, 3, 64], [0, 1, 3, 2], lambda in4, perm4: True, {8}) is not None


@pytest.mark.parametrize("shape, perm", [([6, 35], [1, 0]), ([2, 3, 10, 4], [0, 3, 1, 2]), ([4, 1, 6, 5], [2, 1, 3, 0])])
def test_transpose_views_all_move_data_as_the_perm_does(shape, perm):
    x = RNG.normal(size=shape)
    want = np.transpose(x, perm).reshape(-1)
    views = transpose_views(shape, perm)
    assert len(views) > 1
    for in4, perm4 in views:
        np.testing.assert_array_equal(np.transpose(x.reshape(in4), perm4).reshape(-1), want)


def _all_views_at_once(shape, perm) -> list:
    """transpose_views as it was written before it listed lazily: every refinement first, then
    their placements (the oracle for the lazy listing)."""
    groups = transpose_groups(shape, perm)
    if groups is None:
        return []
    layer, seen, refinements = [groups], set(), []
    while layer and len(refinements) < MAX_TRANSPOSE_VIEWS:
        refinements.extend(layer)
        layer = next_refinements(layer, seen)
    views: dict[tuple, None] = {}
    for leading_only in (True, False):
        for dims, gperm in refinements:
            for view in _placements(dims, gperm, leading_only):
                views[view] = None
                if len(views) >= MAX_TRANSPOSE_VIEWS:
                    return list(views)
    return list(views)


def test_transpose_views_listed_lazily_are_all_views_in_the_same_order():
    """Random shapes of rank 2 to 6 with size-1 axes and many-factor dims (720 = 2^4*3^2*5 fills
    the MAX_TRANSPOSE_VIEWS cap), random perms, a perm that moves nothing: the same views in the
    same order, read whole or first in part."""
    rng = np.random.default_rng(5)
    cases = [([720, 1, 6], [2, 0, 1]), ([4, 5], [0, 1]), ([1, 1], [1, 0]), ([7, 11, 13], [2, 1, 0])]
    for _ in range(60):
        rank = int(rng.integers(2, 7))
        cases.append(([int(rng.choice([1, 2, 3, 4, 6, 12, 35, 64, 720])) for _ in range(rank)],
                      [int(p) for p in rng.permutation(rank)]))
    capped = 0
    for shape, perm in cases:
        expected = _all_views_at_once(shape, perm)
        capped += len(expected) == MAX_TRANSPOSE_VIEWS
        views = _transpose_views(tuple(shape), tuple(perm))
        assert views.first(3) == expected[:3], (shape, perm)
        assert transpose_views(shape, perm) == expected, (shape, perm)
        assert list(views) == expected and views.first(SLICED_VIEWS) == expected[:SLICED_VIEWS]
    assert capped >= 3


def test_transpose_views_hands_each_caller_its_own_list():
    """The views are remembered per (shape, perm): a caller editing its list changes no later answer."""
    views = transpose_views([2, 3, 10, 4], [0, 3, 1, 2])
    expected = list(views)
    views.clear()
    assert transpose_views((2, 3, 10, 4), (0, 3, 1, 2)) == expected


def test_equal_transposes_are_made_legal_alike_with_the_target_probed_once(tmp_path, monkeypatch):
    """Two Transposes of one shape and perm (a model's repeated blocks) get the same legal view,
    found once per rewrite run: the second asks the target's rules nothing."""
    import rkcompile.passes.rewrites.layout_ops as layout

    probes = []

    def counted(node, *args, **kwargs):
        probes.append(node.name)
        return check_node(node, *args, **kwargs)

    monkeypatch.setattr(layout, "check_node", counted)
    shape, perm = [1, 300, 200], [0, 2, 1]  # refused as written on rk3588 (h1*w1 < 2q)
    out = [shape[p] for p in perm]

    def model(copies: int) -> onnx.ModelProto:
        nodes = [helper.make_node("Transpose", ["x"], [f"y{k}"], name=f"t{k}", perm=perm) for k in range(copies)]
        return make_model(nodes, [value_info("x", shape)], [value_info(f"y{k}", out) for k in range(copies)])

    rewritten(model(1), tmp_path, get_target("rk3588"))
    once = len(probes)
    probes.clear()
    ctx = rewritten(model(2), tmp_path, get_target("rk3588"))
    assert once > 0 and len(probes) == once
    assert rules_fired(ctx) == ["transpose_as_legal_view"] * 2
    built = [[(n.op, tuple(n.outputs[0].shape), str(n.attrs.get("perm"))) for n in ctx.graph.nodes
              if ctx.origins[n.name] == (f"t{k}",)] for k in range(2)]
    assert built[0] == built[1] and len(built[0]) > 1
    assert_same_outputs(model(2), ctx, {"x": feed(shape)})



def test_a_refused_transpose_after_a_relabel_takes_the_view_the_relabel_read(tmp_path):
    """A relabel [1, 32, 20, 98] -> [1, 640, 98] then a Transpose refused as written (a
    recurrent layer's input made time-major): of its legal views, the one reading [1, 32, 20,
    98] leaves the relabel before it nothing to do, one step where the first legal view took two."""
    shape, perm = [1, 32, 20, 98], [2, 0, 1]
    model = make_model([helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
                        helper.make_node("Transpose", ["f"], ["y"], name="t", perm=perm)],
                       [value_info("x", shape)], [value_info("y", [98, 1, 640])],
                       [weight("flat", np.array([1, 640, 98], np.int64))])
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "transpose_as_legal_view" in rules_fired(ctx)
    transposes = [n for n in ctx.graph.nodes if n.op == "Transpose"]
    assert len(transposes) == 1 and transposes[0].inputs[0].name == "x"
    assert [n.op for n in ctx.graph.nodes] == ["Transpose", "Reshape"]
    assert_same_outputs(model, ctx, {"x": feed(shape)})


def test_a_view_joining_a_relabel_but_storing_more_is_not_taken():
    """[1, 256, 40] -> [40, 1, 256] after a relabel from [1, 256, 1, 40]: the view reading
    [1, 256, 1, 40] and writing [1, 1, 40, 256] pads one channel to C2 at every position, more
    bytes than the first legal view's two tensors; a view joining the relabel with as many
    channels is taken."""
    first_legal = ((1, 2, 128, 40), (0, 3, 1, 2))
    neighbours = ((1, 256, 1, 40), None)
    assert not _stores_no_more(((1, 256, 1, 40), (0, 2, 3, 1)), first_legal, neighbours, {8, 16})
    assert _stores_no_more(((1, 256, 1, 40), (0, 3, 1, 2)), first_legal, neighbours, {8, 16})

# --- regions above rank 4 ---------------------------------------------------------------------

def qkv_unbind_model(tokens, heads, dim, windows=1) -> onnx.ModelProto:
    """Reshape [W, T, 3*H*D] -> [W, T, 3, H, D] -> perm (2, 0, 3, 1, 4) -> Gather 0/1/2 (timm's
    qkv; W windows in windowed attention)."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4]),
             *[helper.make_node("Gather", ["t5", f"i{k}"], [name], axis=0) for k, name in enumerate("qkv")],
             helper.make_node("Mul", ["q", "k"], ["qk"]),
             helper.make_node("Add", ["qk", "v"], ["y"])]
    return make_model(nodes, [value_info("x", [windows, tokens, 3 * heads * dim])],
                      [value_info("y", [windows, heads, tokens, dim])],
                      [weight("s5", np.array([windows, tokens, 3, heads, dim], np.int64)),
                       *[weight(f"i{k}", np.array(k, np.int64)) for k in range(3)]])


def head_flatten_model(anchors, classes, height, width) -> onnx.ModelProto:
    """[1, A*C, H, W] -> [1, A, C, H, W] -> perm (0, 3, 4, 1, 2) -> [1, H*W*A, C] (SSD/YOLO heads)."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 3, 4, 1, 2]),
             helper.make_node("Reshape", ["t5", "s3"], ["y"])]
    return make_model(nodes, [value_info("x", [1, anchors * classes, height, width])],
                      [value_info("y", [1, height * width * anchors, classes])],
                      [weight("s5", np.array([1, anchors, classes, height, width], np.int64)),
                       weight("s3", np.array([1, height * width * anchors, classes], np.int64))])


def grouped_elementwise_model(groups, per_group, size) -> onnx.ModelProto:
    """Element-wise ops on a rank-5 [1, G, P, S, S] with a constant per-group scale and a computed
    operand broadcast over the groups, then back to 4-D."""
    channels = groups * per_group
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
             helper.make_node("Mul", ["r5", "scale"], ["m5"]),
             helper.make_node("Add", ["m5", "bias"], ["a5"]),
             helper.make_node("Sigmoid", ["a5"], ["g5"]),
             helper.make_node("Reshape", ["g5", "s4"], ["y"])]
    return make_model(nodes, [value_info("x", [1, channels, size, size]), value_info("bias", [per_group, size, size])],
                      [value_info("y", [1, channels, size, size])],
                      [weight("s5", np.array([1, groups, per_group, size, size], np.int64)),
                       weight("s4", np.array([1, channels, size, size], np.int64)),
                       weight("scale", RNG.normal(size=[1, groups, 1, 1, 1]).astype(np.float32))])


def rank6_shuffle_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["r6"]),
             helper.make_node("Transpose", ["r6"], ["t6"], perm=[0, 2, 1, 3, 4, 5]),
             helper.make_node("Reshape", ["t6", "s4"], ["y"])]
    return make_model(nodes, [value_info("x", [1, 24, 6, 7])], [value_info("y", [1, 24, 6, 7])],
                      [weight("s6", np.array([1, 2, 12, 1, 6, 7], np.int64)), weight("s4", np.array([1, 24, 6, 7], np.int64))])


def qkv_split_model(tokens, heads, dim, unbind: str, windows=1) -> onnx.ModelProto:
    """The same q/k/v unbind written as torch exports `unbind(0)`: a Split (or three Slices) along
    the moved axis, each piece squeezed. With windows > 1 (Swin, MobileViT) the transposed tensor
    keeps 5 groups: the pieces are selected before the Transpose."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4])]
    initializers = [weight("s5", np.array([windows, tokens, 3, heads, dim], np.int64)),
                    weight("axis0", np.array([0], np.int64))]
    if unbind == "split":
        nodes.append(helper.make_node("Split", ["t5", "ones"], ["p0", "p1", "p2"], axis=0))
        initializers.append(weight("ones", np.array([1, 1, 1], np.int64)))
    else:
        for k in range(3):
            nodes.append(helper.make_node("Slice", ["t5", f"b{k}", f"b{k + 1}", "axis0"], [f"p{k}"]))
        initializers += [weight(f"b{k}", np.array([k], np.int64)) for k in range(4)]
    nodes += [helper.make_node("Squeeze", [f"p{k}", "axis0"], [name]) for k, name in enumerate("qkv")]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Sub", ["qk", "v"], ["y"])]
    return make_model(nodes, [value_info("x", [windows, tokens, 3 * heads * dim])],
                      [value_info("y", [windows, heads, tokens, dim])], initializers)


def grouped_softmax_concat_model(groups, per_group, size) -> onnx.ModelProto:
    """A Softmax over one axis of a rank-5 [1, G, P, S, S], concatenated with the input along the
    groups, back to 4-D."""
    channels = groups * per_group
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["r5"]),
             helper.make_node("Softmax", ["r5"], ["sm5"], axis=2),
             helper.make_node("Concat", ["sm5", "r5"], ["c5"], axis=1),
             helper.make_node("Reshape", ["c5", "s4"], ["y"])]
    return make_model(nodes, [value_info("x", [1, channels, size, size])], [value_info("y", [1, 2 * channels, size, size])],
                      [weight("s5", np.array([1, groups, per_group, size, size], np.int64)),
                       weight("s4", np.array([1, 2 * channels, size, size], np.int64))])


def rank5_attention_model(groups, heads, tokens, dim, product: str) -> onnx.ModelProto:
    """maxvit's block/grid attention on [1, G, H, N, D]: scores by Einsum (or MatMul of a
    transposed key), a relative-position bias [H, N, N] broadcast over the groups, Softmax, and
    the product with v, back to 4-D."""
    shape5 = np.array([1, groups, heads, tokens, dim], np.int64)
    nodes = [helper.make_node("Reshape", [name, "s5"], [f"{name}5"]) for name in "qkv"]
    if product == "einsum":
        nodes += [helper.make_node("Einsum", ["q5", "k5"], ["s"], equation="bghid,bghjd->bghij"),
                  helper.make_node("Add", ["s", "bias"], ["sb"]),
                  helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
                  helper.make_node("Einsum", ["p", "v5"], ["o5"], equation="bghij,bghjd->bghid")]
    else:
        nodes += [helper.make_node("Transpose", ["k5"], ["kt5"], perm=[0, 1, 2, 4, 3]),
                  helper.make_node("MatMul", ["q5", "kt5"], ["s"]),
                  helper.make_node("Add", ["s", "bias"], ["sb"]),
                  helper.make_node("Softmax", ["sb"], ["p"], axis=-1),
                  helper.make_node("MatMul", ["p", "v5"], ["o5"])]
    nodes.append(helper.make_node("Reshape", ["o5", "s4"], ["y"]))
    shape4 = [groups, heads, tokens, dim]
    return make_model(nodes, [value_info(name, shape4) for name in "qkv"], [value_info("y", shape4)],
                      [weight("s5", shape5), weight("s4", np.array(shape4, np.int64)),
                       weight("bias", RNG.normal(size=[heads, tokens, tokens]).astype(np.float32))])


def window_partition_model(channels, windows_h, windows_w, size, reverse=False) -> onnx.ModelProto:
    """maxvit's window partition [1, C, H/p, p, W/p, p] -> perm (0, 2, 4, 3, 5, 1): five groups
    that move independently, done in steps (and its reverse with reverse=True)."""
    height, width = windows_h * size, windows_w * size
    six = [1, channels, windows_h, size, windows_w, size]
    perm = [0, 2, 4, 3, 5, 1]
    moved = [six[p] for p in perm]
    if reverse:
        six, perm = moved, list(np.argsort(perm))
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["r6"]),
             helper.make_node("Transpose", ["r6"], ["t6"], perm=perm),
             helper.make_node("Reshape", ["t6", "s4"], ["y"])]
    out = [1, channels, height, width] if reverse else [windows_h * windows_w, size * size, channels]
    return make_model(nodes, [value_info("x", [1, channels, height, width])], [value_info("y", out)],
                      [weight("s6", np.array(six, np.int64)), weight("s4", np.array(out, np.int64))])


def repeat_kv_model(kv_heads, repeats, tokens, dim) -> onnx.ModelProto:
    """llama's grouped-query repeat_kv: Unsqueeze [B, KV, T, D] -> [B, KV, 1, T, D], Expand to
    [B, KV, R, T, D], Reshape to [B, KV*R, T, D], then a scale."""
    nodes = [helper.make_node("Unsqueeze", ["x", "axis2"], ["u5"]),
             helper.make_node("Expand", ["u5", "e5"], ["x5"]),
             helper.make_node("Reshape", ["x5", "s4"], ["r4"]),
             helper.make_node("Mul", ["r4", "half"], ["y"])]
    out = [1, kv_heads * repeats, tokens, dim]
    return make_model(nodes, [value_info("x", [1, kv_heads, tokens, dim])], [value_info("y", out)],
                      [weight("axis2", np.array([2], np.int64)),
                       weight("e5", np.array([1, kv_heads, repeats, tokens, dim], np.int64)),
                       weight("s4", np.array(out, np.int64)), weight("half", np.array([0.5], np.float32))])


def split_attention_model(radix, channels, size, op="ReduceSum") -> onnx.ModelProto:
    """ResNeSt's split attention: the radix groups of a conv output as [1, R, C, H, W], weighted
    per channel by attention [1, R, C, 1, 1] and summed (or averaged) over the radix; opset 13,
    where ReduceSum takes its axes as an input and ReduceMean as an attribute."""
    nodes = [helper.make_node("Reshape", ["x", "s5"], ["x5"]),
             helper.make_node("Reshape", ["a", "a5"], ["att5"]),
             helper.make_node("Mul", ["x5", "att5"], ["m5"])]
    if op == "ReduceSum":
        nodes.append(helper.make_node(op, ["m5", "axis1"], ["y"], keepdims=0))
    else:
        nodes.append(helper.make_node(op, ["m5"], ["y"], axes=[1], keepdims=0))
    return make_model(nodes, [value_info("x", [1, radix * channels, size, size]),
                              value_info("a", [1, radix * channels, 1, 1])],
                      [value_info("y", [1, channels, size, size])],
                      [weight("s5", np.array([1, radix, channels, size, size], np.int64)),
                       weight("a5", np.array([1, radix, channels, 1, 1], np.int64)),
                       weight("axis1", np.array([1], np.int64))], opset=13)


def relative_position_model(heads, side, channels) -> onnx.ModelProto:
    """MViTv2's decomposed relative positions: queries [1, heads, side*side, C] viewed as
    [1, heads, h, w, C], one Einsum with a per-row table 'byhwc,hkc->byhwk' and one with a
    per-column table 'byhwc,wkc->byhwk', each added to the scores [1, heads, h, w, kh, kw]
    along its own key axis (an Unsqueeze of the last or the one before), then viewed back."""
    tokens = side * side
    nodes = [helper.make_node("Reshape", ["q", "map5"], ["q5"]),
             helper.make_node("Einsum", ["q5", "rows"], ["by_row"], equation="byhwc,hkc->byhwk"),
             helper.make_node("Einsum", ["q5", "columns"], ["by_column"], equation="byhwc,wkc->byhwk"),
             helper.make_node("Reshape", ["scores", "map6"], ["s6"]),
             helper.make_node("Unsqueeze", ["by_row", "last"], ["row6"]),
             helper.make_node("Unsqueeze", ["by_column", "before_last"], ["column6"]),
             helper.make_node("Add", ["s6", "row6"], ["with_rows"]),
             helper.make_node("Add", ["with_rows", "column6"], ["with_both"]),
             helper.make_node("Reshape", ["with_both", "flat"], ["y"])]
    rng = np.random.default_rng(3)
    return make_model(nodes, [value_info("q", [1, heads, tokens, channels]),
                              value_info("scores", [1, heads, tokens, tokens])],
                      [value_info("y", [1, heads, tokens, tokens])],
                      [weight("rows", rng.standard_normal((side, side, channels)).astype(np.float32)),
                       weight("columns", rng.standard_normal((side, side, channels)).astype(np.float32)),
                       weight("map5", np.array([1, heads, side, side, channels], np.int64)),
                       weight("map6", np.array([1, heads, side, side, side, side], np.int64)),
                       weight("last", np.array([-1], np.int64)), weight("before_last", np.array([-2], np.int64)),
                       weight("flat", np.array([1, heads, tokens, tokens], np.int64))], opset=17)


@pytest.mark.parametrize("equation, a_shape, b_shape, constant_b", [
    ("bij,bjk->bik", [3, 5, 8], [3, 8, 6], False),        # a batched product as it stands
    ("bhqd,bhkd->bhqk", [1, 2, 9, 8], [1, 2, 7, 8], False),  # B's matrix transposed
    ("bqd,kd->bkq", [2, 6, 16], [4, 16], True),            # a constant B, the result transposed
    ("bn,bn->b", [4, 24], [4, 24], False),                 # contracted alone: rows of one
    ("bij,bjk->ik", [2, 5, 8], [2, 8, 3], False),          # a batch letter summed out too
])
def test_an_einsum_is_one_matmul_between_moves(tmp_path, equation, a_shape, b_shape, constant_b):
    """einsum_as_matmul: no Einsum left, one MatMul, every node legal on rk3588, the same outputs."""
    rng = np.random.default_rng(4)
    out_letters = equation.split("->")[1]
    sizes = dict(zip(equation.split("->")[0].replace(",", ""), a_shape + b_shape))
    inputs = [value_info("a", a_shape)] + ([] if constant_b else [value_info("b", b_shape)])
    constants = [weight("b", rng.standard_normal(b_shape).astype(np.float32))] if constant_b else []
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation, name="einsum")], inputs,
                       [value_info("y", [sizes[letter] for letter in out_letters])], constants, opset=17)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert any(rule.startswith("einsum_as_matmul") for rule in rules_fired(ctx))
    assert "Einsum" not in ops_of(ctx)
    assert not [n.name for n in ctx.graph.nodes if check_node(n, get_target("rk3588"))]
    feeds = {i.name: feed([d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    assert_same_outputs(model, ctx, feeds)


@pytest.mark.parametrize("equation, why", [
    ("ii,ij->ij", "a letter repeats within one term (a diagonal or trace)"),
    ("ij,jk", "not an explicit equation of two operands"),
    ("ij,kl->ik", "a letter of one operand alone is summed out, or an output letter is in neither operand"),
])
def test_an_einsum_one_matmul_cannot_make_says_why(tmp_path, equation, why):
    from rkcompile.passes.rewrites.matmul_as_conv import einsum_as_matmul_form
    node = gs.Node("Einsum", attrs={"equation": equation},
                   inputs=[gs.Variable("a", np.float32, [4, 4]), gs.Variable("b", np.float32, [4, 4])],
                   outputs=[gs.Variable("y", np.float32, [4, 4])])
    assert einsum_as_matmul_form(node) == why


def unfold_by_gathers_model(channels, size, kernel) -> onnx.ModelProto:
    """The dynamo exporter's Unfold (VOLO's outlook attention): the k x k windows of a map
    [1, C, S, S] picked by two Gathers of indices [k, S - k + 1] (rank 2), [1, C, k, O, k, O],
    moved to [1, O, O, C, k, k] and flattened to [1, O*O, C, k*k]."""
    out = size - kernel + 1
    rows = (np.arange(kernel)[:, None] + np.arange(out)[None, :]).astype(np.int64)
    nodes = [helper.make_node("Gather", ["x", "rows"], ["g1"], axis=2),
             helper.make_node("Gather", ["g1", "rows"], ["g2"], axis=4),
             helper.make_node("Transpose", ["g2"], ["t"], perm=[0, 3, 5, 1, 2, 4]),
             helper.make_node("Reshape", ["t", "s4"], ["y"])]
    return make_model(nodes, [value_info("x", [1, channels, size, size])],
                      [value_info("y", [1, out * out, channels, kernel * kernel])],
                      [weight("rows", rows), weight("s4", np.array([1, out * out, channels, kernel * kernel], np.int64))])


REGION_CASES = {
    "repeat_kv_2x4x8x16": lambda: repeat_kv_model(2, 4, 8, 16),
    "repeat_kv_1x3x5x8": lambda: repeat_kv_model(1, 3, 5, 8),
    "window_partition_64x4x4x7": lambda: window_partition_model(64, 4, 4, 7),
    "window_partition_24x2x3x4": lambda: window_partition_model(24, 2, 3, 4),
    "window_reverse_32x2x2x7": lambda: window_partition_model(32, 2, 2, 7, reverse=True),
    "attention_einsum_8x2x16x8": lambda: rank5_attention_model(8, 2, 16, 8, "einsum"),
    "attention_matmul_4x3x10x16": lambda: rank5_attention_model(4, 3, 10, 16, "matmul"),
    "qkv_split_16x2x8": lambda: qkv_split_model(16, 2, 8, "split"),
    "qkv_slice_12x3x16": lambda: qkv_split_model(12, 3, 16, "slice"),
    "windows_split_4x16x2x8": lambda: qkv_split_model(16, 2, 8, "split", windows=4),
    "windows_slice_3x12x3x8": lambda: qkv_split_model(12, 3, 8, "slice", windows=3),
    "windows_gather_2x9x2x4": lambda: qkv_unbind_model(9, 2, 4, windows=2),
    "softmax_concat": lambda: grouped_softmax_concat_model(3, 4, 6),
    "qkv_49x4x32": lambda: qkv_unbind_model(49, 4, 32),
    "qkv_10x3x6": lambda: qkv_unbind_model(10, 3, 6),
    "head_6x91x20x20": lambda: head_flatten_model(6, 91, 20, 20),
    "head_3x85x8x8": lambda: head_flatten_model(3, 85, 8, 8),
    "head_2x7x5x3": lambda: head_flatten_model(2, 7, 5, 3),
    "grouped_elementwise": lambda: grouped_elementwise_model(3, 4, 5),
    "rank6_shuffle": rank6_shuffle_model,
    "split_attention_sum_2x16x8": lambda: split_attention_model(2, 16, 8),
    "split_attention_mean_4x8x5": lambda: split_attention_model(4, 8, 5, "ReduceMean"),
    "relative_positions_2x7x16": lambda: relative_position_model(2, 7, 16),
    "unfold_by_gathers_8x10x3": lambda: unfold_by_gathers_model(8, 10, 3),
    "unfold_by_gathers_6x7x2": lambda: unfold_by_gathers_model(6, 7, 2),
}


@pytest.mark.parametrize("case", sorted(REGION_CASES))
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_rank_above_4_regions_collapse_onto_merged_axes(tmp_path, case, target):
    model = REGION_CASES[case]()
    ctx = rewritten(model, tmp_path, get_target(target))
    assert any(rule.startswith("collapse_rank_region") for rule in rules_fired(ctx))
    assert all(len(t.shape) <= 4 for n in ctx.graph.nodes for t in n.inputs + n.outputs if t.shape is not None)
    assert not [n.name for n in ctx.graph.nodes if check_node(n, get_target(target))]
    feeds = {i.name: feed([d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    assert_same_outputs(model, ctx, feeds)
    planned_on_npu(model, tmp_path, target)


def pooled_query_attention_model(tokens, windows, heads, dim, stride) -> onnx.ModelProto:
    """Hiera's mask-unit attention with query pooling: q, k and v cut from [1, T*W, 3*H*D] as
    [1, T, W, 3, H, D] moved to [3, 1, H, W, T, D], q pooled by a ReduceMax over `stride` tokens
    of each unit, the products batched over heads and windows, and the result moved to
    [1, T/stride, W, H, D]: the heads pass the windows there."""
    pooled = tokens // stride
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["r6"]),
             helper.make_node("Transpose", ["r6"], ["t6"], perm=[3, 0, 4, 2, 1, 5]),
             helper.make_node("Split", ["t6", "ones"], ["p0", "p1", "p2"], axis=0)]
    nodes += [helper.make_node("Squeeze", [f"p{k}", "axis0"], [name]) for k, name in enumerate("qkv")]
    nodes += [helper.make_node("Reshape", ["q", "units"], ["qu"]),
              helper.make_node("ReduceMax", ["qu"], ["qp"], axes=[3], keepdims=0),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 2, 4, 3]),
              helper.make_node("MatMul", ["qp", "kt"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["attention"], axis=-1),
              helper.make_node("MatMul", ["attention", "v"], ["o5"]),
              helper.make_node("Transpose", ["o5"], ["moved"], perm=[0, 3, 2, 1, 4]),
              helper.make_node("Reshape", ["moved", "s3"], ["y"])]
    return make_model(nodes, [value_info("x", [1, tokens * windows, 3 * heads * dim])],
                      [value_info("y", [1, pooled * windows, heads * dim])],
                      [weight("s6", np.array([1, tokens, windows, 3, heads, dim], np.int64)),
                       weight("ones", np.array([1, 1, 1], np.int64)), weight("axis0", np.array([0], np.int64)),
                       weight("units", np.array([1, heads, windows, stride, pooled, dim], np.int64)),
                       weight("s3", np.array([1, pooled * windows, heads * dim], np.int64))], opset=13)


@pytest.mark.parametrize("tokens, windows, heads, dim", [(64, 49, 2, 96), (16, 5, 3, 8)])
def test_a_pooled_query_attention_runs_on_the_npu_but_its_max(tmp_path, tokens, windows, heads, dim):
    """The region of rank 5 and 6 collapses onto at most 4 groups: the ReduceMax (no NPU kernel)
    is its one CPU node, at rank 4; the Transpose after the products moves heads and windows as
    one block first, so they merge as the products' batch; q, k and v are cut along the height
    of [1, T*W, 3, H*D], not along 3 channels padded to a block of 8. Emulated as onnxruntime
    computes it."""
    model = pooled_query_attention_model(tokens, windows, heads, dim, stride=4)
    path = tmp_path / "pooled.onnx"
    onnx.save(model, path)
    plan, compiled = compile_model(path, "rk3588")
    assert [(n.op, n.device) for n in plan.nodes if n.device == "cpu"] == [("ReduceMax", "cpu")]
    assert all(len(t.shape) <= 4 for n in compiled.graph.nodes for t in n.inputs + n.outputs if t.shape is not None)
    split = next(n for n in compiled.graph.nodes if n.op == "Split")
    assert list(split.inputs[0].shape) == [1, tokens * windows, 3, heads * dim] and split.attrs["axis"] == 2
    report = tmp_path / "report.json"
    assert main(["run", str(path), "--target", "rk3588", "--check", "--json", str(report)]) == 0
    assert min(a["cosine"] for a in json.loads(report.read_text())["agreement"]) >= 0.9999


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("channels, windows, size", [(64, 4, 7), (256, 2, 7), (24, 3, 4)])
def test_a_window_partition_moves_in_two_transposes_the_target_accepts(tmp_path, channels, windows, size, reverse):
    """Five groups [C, H/p, p, W/p, p] -> [H/p, W/p, p, p, C]: steps of 3 groups judged without
    the target take three Transposes; searched against rk3588's perm table, two legal whole."""
    model = window_partition_model(channels, windows, windows, size, reverse=reverse)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    transposes = [n for n in ctx.graph.nodes if n.op == "Transpose"]
    assert len(transposes) == 2
    assert not [n.name for n in ctx.graph.nodes if check_node(n, get_target("rk3588"))]
    feeds = {i.name: feed([d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    assert_same_outputs(model, ctx, feeds)


@pytest.mark.parametrize("product", ["einsum", "matmul"])
def test_a_bias_broadcast_over_windows_is_stored_whole_and_the_attention_is_one_kernel(tmp_path, product):
    """The relative-position bias [H, N, N] added over the G windows of [1, G, H, N, N] scores:
    [1, H, N, N] broadcast over the batch is no Expand pattern, so the bias is stored at the
    scores' size on the grouped view rather than the scores relabelled to [G, H*N*N] and back;
    the attention is then one exSDPAttention, without relabels around its bias, which reads the
    bias at its own size again: the kernel broadcasts its mask along any axis."""
    groups, heads, tokens, dim = 8, 2, 16, 8
    model = rank5_attention_model(groups, heads, tokens, dim, product)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    add = next(n for n in ctx.graph.nodes if n.op == "Add")
    assert [list(t.shape) for t in add.inputs] == [[groups, heads, tokens, tokens]] * 2
    assert "Reshape" not in {r.op for r in add.outputs[0].outputs}
    feeds = {i.name: feed([d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input}
    assert_same_outputs(model, ctx, feeds)
    path = tmp_path / "attention.onnx"
    onnx.save(model, path)
    plan, compiled = compile_model(path, "rk3588")
    assert [step.kernel for step in plan.steps if step.device == "npu"] == ["exSDPAttention"]
    attention = next(n for n in compiled.graph.nodes if n.op == "exSDPAttention")
    masks = [list(t.shape) for t in attention.inputs if isinstance(t, gs.Constant) and t.values.dtype.kind == "f"]
    assert masks == [[1, heads, tokens, tokens]]
    planned_on_npu(model, tmp_path, "rk3588")


def test_a_region_with_an_op_it_cannot_merge_says_which(tmp_path):
    model = head_flatten_model(2, 7, 5, 3)
    model.graph.node.insert(1, helper.make_node("Hardmax", ["r5"], ["sm5"], axis=2))
    model.graph.node[2].input[0] = "sm5"
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert "collapse_rank_region" not in rules_fired(ctx)
    reasons = [a.outcome for attempts in ctx.rewrite_attempts.values() for a in attempts
               if a.rule == "collapse_rank_region"]
    assert any("Hardmax has no form on merged axes" in r for r in reasons), reasons


# --- the Conv + MatMul residual that never finished -------------------------------------------

@contextmanager
def deadline(seconds: int):
    def expire(*_):
        raise TimeoutError(f"planning took over {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("channels, height, width, k", [(8, 4, 16, 16), (16, 2, 24, 40), (4, 1, 8, 8)])
@pytest.mark.parametrize("matmul_first", [False, True])
def test_conv_plus_matmul_by_weights_of_equal_shape_plans_in_seconds(tmp_path, channels, height, width, k,
                                                                     matmul_first):
    """Add(Conv(x), MatMul(y, W)): the MatMul becomes a Conv whose residual Add is the other Conv's
    output; the Add, moved into one Conv's layout, must not be pulled back into the other's."""
    operands = ["m", "c"] if matmul_first else ["c", "m"]
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("MatMul", ["y", "mw"], ["m"]),
             helper.make_node("Add", operands, ["z"])]
    model = make_model(nodes, [value_info("x", [1, channels, height, width]), value_info("y", [1, channels, height, k])],
                       [value_info("z", [1, channels, height, width])],
                       [weight("cw", RNG.normal(size=[channels, channels, 1, 1]).astype(np.float32)),
                        weight("mw", RNG.normal(size=[k, width]).astype(np.float32))])
    with deadline(30):
        for target in PRIMARY_TARGETS:
            planned_on_npu(model, tmp_path, target)


# --- the shared repros ------------------------------------------------------------------------

REPROS = SHARED / "repros" / "make_repros.py"
#: README expectations for the layout repros: the ops that may stay on the CPU.
REPRO_CPU_ALLOWED = {
    "s4_attention_kT": {"IsNaN"},
    "s4b_attention_kT_no_isnan": set(),
    "s7_tokens_transpose": set(),
    "s8_qkv_rank5_unbind": set(),
    "s9_head_rank5_flatten": set(),
}


@pytest.fixture(scope="module")
def repro_dir(tmp_path_factory):
    if not REPROS.is_file():
        pytest.skip("../shared/repros is not present")
    folder = tmp_path_factory.mktemp("repros")
    subprocess.run([sys.executable, str(REPROS), str(folder)], check=True, capture_output=True)
    return folder


@pytest.mark.parametrize("repro", sorted(REPRO_CPU_ALLOWED))
@pytest.mark.parametrize("target", PRIMARY_TARGETS)
def test_layout_repros_do_what_their_readme_asks(repro_dir, tmp_path, repro, target):
    path = repro_dir / f"{repro}.onnx"
    plan, _ = compile_model(path, target)
    on_cpu = {n.op for n in plan.nodes if n.device == "cpu"}
    assert on_cpu <= REPRO_CPU_ALLOWED[repro], [(n.name, n.reason) for n in plan.nodes if n.device == "cpu"]
    report = tmp_path / "report.json"
    assert main(["run", str(path), "--target", target, "--check", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["passed"] and min(a["cosine"] for a in data["agreement"]) >= 0.9999


def video_model(channels=8, frames=4, size=6, group=1, depth_stride=1, depth_dilation=1, extra_frames=0) -> onnx.ModelProto:
    """R3D's shape on a clip [1, 3, T, H, W]: a 3-D stem, a residual block of 3x3x3 Convs (the
    second strided and dilated in depth as asked, grouped as asked) with a 1x1x1 shortcut,
    Relus, a global pool and a Flatten."""
    frames += extra_frames

    def conv(name, x, out, inputs, kernel, pads, strides=(1, 1, 1), dilations=(1, 1, 1), conv_group=1):
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [out], name=name, kernel_shape=list(kernel),
                                pads=list(pads), strides=list(strides), dilations=list(dilations), group=conv_group), [
            weight(f"{name}_w", (RNG.standard_normal((channels, inputs // conv_group, *kernel)) * 0.2).astype(np.float32)),
            weight(f"{name}_b", RNG.standard_normal(channels).astype(np.float32))]

    stem, w0 = conv("stem", "x", "s", 3, (3, 3, 3), [1] * 6)
    first, w1 = conv("c1", "r0", "c1o", channels, (3, 3, 3), [depth_dilation, 1, 1] * 2, (depth_stride, 1, 1),
                     (depth_dilation, 1, 1), group)
    second, w2 = conv("c2", "r1", "c2o", channels, (3, 3, 3), [1] * 6, conv_group=group)
    short, w3 = conv("sc", "r0", "sco", channels, (1, 1, 1), [0] * 6, (depth_stride, 1, 1))
    nodes = [stem, helper.make_node("Relu", ["s"], ["r0"]), first, helper.make_node("Relu", ["c1o"], ["r1"]), second,
             short, helper.make_node("Add", ["c2o", "sco"], ["a"]), helper.make_node("Relu", ["a"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    return make_model(nodes, [value_info("x", [1, 3, frames, size, size])], [value_info("y", [1, channels])],
                      w0 + w1 + w2 + w3)


@pytest.mark.parametrize("case", [{}, {"group": 4}, {"depth_stride": 2}, {"depth_dilation": 2, "extra_frames": 2}])
def test_a_3d_conv_network_on_a_clip_runs_as_2d_convs_with_depth_in_the_channels(tmp_path, case):
    model = video_model(**case)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    assert any(rule.startswith("collapse_rank_region_from_input") for rule in rules_fired(ctx))
    illegal = [n for n in ctx.graph.nodes if check_node(n, get_target("rk3588"))]
    # the clip's relabel onto [1, 3*T, H, W] alone stays on the CPU
    assert [(n.op, n.inputs[0].name) for n in illegal] == [("Reshape", "x")]
    assert all(len(t.shape) <= 4 for n in ctx.graph.nodes if n not in illegal for t in n.inputs + n.outputs
               if t.shape is not None)
    assert_same_outputs(model, ctx, {"x": feed([1, 3, 4 + case.get("extra_frames", 0), 6, 6])}, rtol=1e-4, atol=1e-4)


def test_a_3d_conv_over_a_clip_too_long_for_its_kernel_says_why(tmp_path):
    model = video_model(frames=30)
    ctx = rewritten(model, tmp_path, get_target("rk3588"))
    outcomes = {a.rule: a.outcome for a in ctx.rewrite_attempts["stem"]}
    assert "depth 30 folded into channels computes 30/3 of its taps, over 8" in outcomes["collapse_rank_region_from_input"]
