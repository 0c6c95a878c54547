"""Fusion: every row of the fusion table fuses its pattern, and declines when it must.

Positive cases run import -> legalize -> fuse on a tiny model and check the kernel, the members
and that the fused node's `body` computes what the original model computes (onnx.reference).
Negative cases: per-element PRelu slope, an intermediate read twice or a graph output, a target
without the kernel, members breaking their own rules, and a diamond around a candidate chain.
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from conftest import make_model, value_info, weight
from rkcompile.compiler.context import CompileContext
from rkcompile.options import Options
from rkcompile.ir.dag import is_acyclic
from rkcompile.ir.patterns import FUSED_DOMAIN, Match
from rkcompile.ir.graph import dataflow_graph
from rkcompile.passes import assign, fuse, import_model, legalize
from rkcompile.passes.fusion_table import FUSED_KERNELS, KERNEL_FUSIONS, RECOGNISERS
from rkcompile.compiler.pipeline import compile_model, verify
from rkcompile.plan.schema import contract_violations
from rkcompile.targets import get_target

SHARED = Path(__file__).resolve().parents[2] / "shared"
ZOO = SHARED / "zoo"
PEER = SHARED / "peer" / "zoo_rk3588.json"
RNG = np.random.default_rng(0)
X4 = (1, 4, 8, 8)


def node(op, inputs, output, **attrs):
    outputs = output if isinstance(output, list) else [output]
    return helper.make_node(op, inputs, outputs, name=f"n_{outputs[0]}", **attrs)


def const(name, value):
    return weight(name, np.asarray(value, dtype=np.float32))


def conv(x="x", out="c"):
    return [node("Conv", [x, "w", "b"], out, pads=[1, 1, 1, 1])], [
        const("w", RNG.standard_normal((4, 4, 3, 3)) * 0.2), const("b", RNG.standard_normal(4))]


def conv_then(op, *extra, **attrs):
    nodes, inits = conv()
    return nodes + [node(op, ["c", *extra], "y", **attrs)], inits


def case(nodes, inits=(), inputs=(("x", X4),), opset=17):
    return nodes, list(inits), list(inputs), opset


def _gelu_erf():
    return case([node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "a"),
                 node("Mul", ["x", "a"], "m"), node("Mul", ["m", "half"], "y")],
                [const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)])


def _gelu_tanh():
    return case([node("Mul", ["x", "half"], "h"), node("Pow", ["x", "three"], "p"),
                 node("Mul", ["p", "k"], "q"), node("Add", ["x", "q"], "r"), node("Mul", ["r", "s2pi"], "s"),
                 node("Tanh", ["s"], "t"), node("Add", ["t", "one"], "u"), node("Mul", ["h", "u"], "y")],
                [const("half", 0.5), const("three", 3.0), const("k", 0.044715),
                 const("s2pi", np.sqrt(2 / np.pi)), const("one", 1.0)])


def _gelu_tanh_jax():
    """jax's gelu(approximate=True) as jax2tf and tf2onnx write it (the magika model): the cubic
    term nested as x * (x * (0.044715 * x)), constants on the left."""
    return case([node("Mul", ["k", "x"], "kx"), node("Mul", ["x", "kx"], "kx2"), node("Mul", ["x", "kx2"], "kx3"),
                 node("Add", ["x", "kx3"], "r"), node("Mul", ["s2pi", "r"], "s"), node("Tanh", ["s"], "t"),
                 node("Add", ["one", "t"], "u"), node("Mul", ["half", "u"], "h"), node("Mul", ["x", "h"], "y")],
                [const("half", 0.5), const("k", np.float32(0.044715)), const("s2pi", np.float32(np.sqrt(2 / np.pi))),
                 const("one", 1.0)])


def _layer_norm(axes=(1,), shape=(1, 16, 4, 4)):
    affine = (16, 1, 1) if axes == (1,) else shape[-1:]
    return case([node("ReduceMean", ["x"], "m", axes=list(axes)), node("Sub", ["x", "m"], "d"),
                 node("Pow", ["d", "two"], "p"), node("ReduceMean", ["p"], "v", axes=list(axes)),
                 node("Add", ["v", "eps"], "ve"), node("Sqrt", ["ve"], "s"), node("Div", ["d", "s"], "n"),
                 node("Mul", ["n", "gamma"], "g"), node("Add", ["g", "beta"], "y")],
                [const("two", 2.0), const("eps", 1e-5), const("gamma", RNG.standard_normal(affine)),
                 const("beta", RNG.standard_normal(affine))], [("x", shape)])


def _rms_norm():
    return case([node("Pow", ["x", "two"], "p"), node("ReduceMean", ["p"], "m", axes=[1]),
                 node("Add", ["m", "eps"], "me"), node("Sqrt", ["me"], "s"), node("Div", ["x", "s"], "n"),
                 node("Mul", ["n", "gamma"], "y")],
                [const("two", 2.0), const("eps", 1e-6), const("gamma", RNG.standard_normal((16, 1, 1)))],
                [("x", (1, 16, 4, 4))])


def _rms_norm_by_channel_conv():
    """RMSNorm on the [L, C, 1, 1] view as rewrites.reductions writes it: the mean square by a 1x1
    Conv of weights 1/C and bias epsilon, Pow -0.5, the product, then the scale."""
    return case([node("Mul", ["x", "x"], "sq"), node("Conv", ["sq", "w", "eps"], "ms"),
                 node("Pow", ["ms", "minus_half"], "inv"), node("Mul", ["x", "inv"], "n"),
                 node("Mul", ["n", "gamma"], "y")],
                [const("w", np.full((1, 16, 1, 1), 1 / 16)), const("eps", [1e-6]), const("minus_half", -0.5),
                 const("gamma", RNG.standard_normal((16, 1, 1)))], [("x", (6, 16, 1, 1))])


def _moments_layer_norm(centred: bool):
    """LayerNorm as tf2onnx writes Keras': x * m + (-mean) * m with m = gamma / sqrt(var + eps),
    or x * m + (beta - mean * m) with a centre."""
    nodes = [node("ReduceMean", ["x"], "m", axes=[1]), node("Sub", ["x", "m"], "d"), node("Mul", ["d", "d"], "sq"),
             node("ReduceMean", ["sq"], "v", axes=[1]), node("Add", ["v", "eps"], "ve"), node("Sqrt", ["ve"], "s"),
             node("Reciprocal", ["s"], "r"), node("Mul", ["r", "gamma"], "k"), node("Mul", ["x", "k"], "a")]
    if centred:
        nodes += [node("Mul", ["m", "k"], "b"), node("Sub", ["beta", "b"], "c"), node("Add", ["a", "c"], "y")]
    else:
        nodes += [node("Neg", ["m"], "nm"), node("Mul", ["nm", "k"], "b"), node("Add", ["a", "b"], "y")]
    return case(nodes, [const("eps", 1e-3), const("gamma", RNG.standard_normal((16, 1, 1))),
                        const("beta", RNG.standard_normal((16, 1, 1)))][:3 if centred else 2], [("x", (1, 16, 4, 4))])


def _attention(mask: bool):
    nodes = [node("Mul", ["q", "qs"], "qq"), node("Mul", ["kt", "ks"], "kk"), node("MatMul", ["qq", "kk"], "s")]
    scores = "s"
    if mask:
        nodes.append(node("Add", ["s", "mask"], "sm"))
        scores = "sm"
    nodes += [node("Softmax", [scores], "p", axis=-1), node("MatMul", ["p", "v"], "y")]
    inputs = [("q", (1, 2, 8, 4)), ("kt", (1, 2, 4, 8)), ("v", (1, 2, 8, 4))] + ([("mask", (1, 1, 8, 8))] if mask else [])
    return case(nodes, [const("qs", 0.5 ** 0.5), const("ks", 0.5 ** 0.5)], inputs)


def _recurrent(op, gates, with_layout):
    """A bidirectional cell of batch 1: its layout Transpose only moves a size-1 axis, which the
    rewrite pass relabels before fusion (the relabelled row fuses it)."""
    nodes = [node(op, ["x", "W", "R"], ["Y" if with_layout else "y"], hidden_size=4, direction="bidirectional")]
    if with_layout:
        nodes += [node("Transpose", ["Y"], "t", perm=[0, 2, 1, 3]), node("Reshape", ["t", "shape"], "y")]
    inits = [const("W", RNG.standard_normal((2, gates * 4, 8)) * 0.3),
             const("R", RNG.standard_normal((2, gates * 4, 4)) * 0.3),
             weight("shape", np.array([5, 1, 8], dtype=np.int64))]
    return case(nodes, inits if with_layout else inits[:2], [("x", (5, 1, 8))])


POSITIVE = {
    "ConvRelu": (lambda: case(*conv_then("Relu")), 2),
    "ConvClip": (lambda: case(*map(list.__add__, conv_then("Clip", "lo", "hi"), ([], [const("lo", 0.0), const("hi", 6.0)]))), 2),
    "ConvPRelu": (lambda: case(*map(list.__add__, conv_then("PRelu", "slope"), ([], [const("slope", [[[0.1]], [[0.2]], [[0.3]], [[0.4]]])]))), 2),
    "ConvLeakyRelu": (lambda: case(*conv_then("LeakyRelu", alpha=0.1)), 2),
    "ConvSigmoid": (lambda: case(*conv_then("Sigmoid")), 2),
    "ConvTanh": (lambda: case(*conv_then("Tanh")), 2),
    "ConvHardSigmoid": (lambda: case(*conv_then("HardSigmoid", alpha=1 / 6)), 2),
    "ConvHardSwish": (lambda: case(*conv_then("HardSwish")), 2),
    "ConvElu": (lambda: case(*conv_then("Elu")), 2),
    "ConvSoftplus": (lambda: case(*conv_then("Softplus")), 2),
    "ConvExSwish": (lambda: case(conv()[0] + [node("Sigmoid", ["c"], "s"), node("Mul", ["c", "s"], "y")], conv()[1]), 3),
    "ConvExGelu": (lambda: case(conv()[0] + [node("Div", ["c", "sqrt2"], "d"), node("Erf", ["d"], "e"),
                                             node("Add", ["e", "one"], "a"), node("Mul", ["c", "a"], "m"),
                                             node("Mul", ["m", "half"], "y")],
                                conv()[1] + [const("sqrt2", np.sqrt(2)), const("one", 1.0), const("half", 0.5)]), 6),
    "ConvExMish": (lambda: case(conv()[0] + [node("Softplus", ["c"], "sp"), node("Tanh", ["sp"], "t"),
                                             node("Mul", ["c", "t"], "y")], conv()[1]), 4),
    "ConvAdd": (lambda: case(conv()[0] + [node("Add", ["c", "x"], "y")], conv()[1]), 2),
    "ConvAddRelu": (lambda: case(conv()[0] + [node("Add", ["x", "c"], "a"), node("Relu", ["a"], "y")], conv()[1]), 3),
    "AddRelu": (lambda: case([node("Add", ["x", "x2"], "a"), node("Relu", ["a"], "y")], (), [("x", X4), ("x2", X4)]), 2),
    "MulRelu": (lambda: case([node("Mul", ["x", "x2"], "a"), node("Relu", ["a"], "y")], (), [("x", X4), ("x2", X4)]), 2),
    "exMatMul": (lambda: case([node("MatMul", ["x", "wm"], "m"), node("Add", ["bias", "m"], "y")],
                              [const("wm", RNG.standard_normal((16, 32))), const("bias", RNG.standard_normal(32))],
                              [("x", (1, 8, 16))]), 2),
    "exGelu": (_gelu_erf, 5),
    "exGelu/tanh": (_gelu_tanh, 8),
    "exGelu/tanh_jax": (_gelu_tanh_jax, 9),
    "exMish": (lambda: case([node("Softplus", ["x"], "sp"), node("Tanh", ["sp"], "t"), node("Mul", ["t", "x"], "y")]), 3),
    "HardSwish": (lambda: case([node("HardSigmoid", ["x"], "h", alpha=1 / 6), node("Mul", ["x", "h"], "y")]), 2),
    "HardSwish/relu6": (lambda: case([node("Add", ["x", "three"], "a"), node("Clip", ["a", "zero", "six"], "r"),
                                      node("Mul", ["x", "r"], "m"), node("Div", ["m", "six"], "y")],
                                     [const("three", 3.0), const("zero", 0.0), const("six", 6.0)]), 4),
    "exSwish": (lambda: case([node("Sigmoid", ["x"], "s"), node("Mul", ["s", "x"], "y")]), 2),
    "exGlu": (lambda: case([node("Split", ["x", "halves"], ["a", "b"], axis=1), node("Sigmoid", ["b"], "s"),
                            node("Mul", ["a", "s"], "y")], [weight("halves", np.array([2, 2], dtype=np.int64))]), 3),
    "exNorm": (_layer_norm, 9),
    "exNorm/rms": (_rms_norm, 6),
    "exNorm/rms_conv": (_rms_norm_by_channel_conv, 5),
    "exNorm/moments": (lambda: _moments_layer_norm(centred=False), 12),
    "exNorm/moments_centred": (lambda: _moments_layer_norm(centred=True), 12),
    "exNorm/op": (lambda: case([node("LayerNormalization", ["x", "gamma", "beta"], "y", axis=1)],
                               [const("gamma", RNG.standard_normal((16, 4, 4))), const("beta", np.zeros((16, 4, 4)))],
                               [("x", (1, 16, 4, 4))]), 1),
    "exSDPAttention": (lambda: _attention(mask=True), 6),
    "exSDPAttention/nomask": (lambda: _attention(mask=False), 5),
    "exLSTM": (lambda: _recurrent("LSTM", 4, with_layout=True), 3),
    "exLSTM/plain": (lambda: _recurrent("LSTM", 4, with_layout=False), 1),
    "exGRU": (lambda: _recurrent("GRU", 3, with_layout=True), 3),
    "exGRU/plain": (lambda: _recurrent("GRU", 3, with_layout=False), 1),
}


def with_inferred_outputs(nodes, inputs, inits, outputs, opset=17) -> onnx.ModelProto:
    """The model with `outputs` declared as shape inference infers them."""
    model = make_model(nodes, inputs, [], inits, opset=opset)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend(inferred[name] for name in outputs)
    return model


def build(tmp_path: Path, spec, name="case") -> Path:
    nodes, inits, inputs, opset = spec
    model = with_inferred_outputs(nodes, [value_info(n, s) for n, s in inputs], inits, ["y"], opset)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def fused_context(path: Path, target="rk3588") -> CompileContext:
    target = get_target(target) if isinstance(target, str) else target
    ctx = CompileContext(model_path=path, target=target, options=Options())
    for compiler_pass in (import_model, legalize, fuse):
        compiler_pass.run(ctx)
        assert not verify(ctx), verify(ctx)
    return ctx


def fused_nodes(ctx: CompileContext) -> list[gs.Node]:
    return [n for n in ctx.graph.nodes if n.domain == FUSED_DOMAIN]


def random_inputs(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    initialized = {i.name for i in model.graph.initializer}
    return {v.name: RNG.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
            for v in model.graph.input if v.name not in initialized}


def inline_fused(graph: onnx.GraphProto) -> None:
    """Replace each fused node by its body's nodes; bodies keep the outer tensor names."""
    nodes = []
    for member in graph.node:
        if member.domain != FUSED_DOMAIN:
            nodes.append(member)
            continue
        body = next(helper.get_attribute_value(a) for a in member.attribute if a.name == "body")
        inline_fused(body)
        nodes.extend(body.node)
        graph.initializer.extend(body.initializer)
    del graph.node[:]
    graph.node.extend(nodes)


def run_body(fused: gs.Node, feeds: dict[str, np.ndarray]) -> np.ndarray:
    body = fused.attrs["body"].copy()
    body.outputs = body.outputs[:1]
    model = gs.export_onnx(body, do_type_check=False)
    inline_fused(model.graph)
    return ReferenceEvaluator(model).run(None, {i.name: feeds[i.name] for i in model.graph.input})[0]


def test_table_rows_are_all_exercised():
    kernels = {rule.kernel for rule in RECOGNISERS + KERNEL_FUSIONS}
    assert kernels == {name.split("/")[0] for name in POSITIVE}


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_row_fuses_and_its_body_computes_the_original(tmp_path, name):
    builder, member_count = POSITIVE[name]
    path = build(tmp_path, builder())
    ctx = fused_context(path)
    (fused,) = fused_nodes(ctx)
    assert fused.op == name.split("/")[0]
    originals = [n for n, _ in ctx.original_nodes]
    assert ctx.origins[fused.name] == tuple(originals)  # every original node, in graph order
    assert len(originals) == member_count
    assert ctx.failures[fused.name] == []
    assert [n.name for n in ctx.graph.nodes] == [fused.name]
    feeds = random_inputs(path)
    expected = ReferenceEvaluator(onnx.load(str(path))).run(None, feeds)[0]
    np.testing.assert_allclose(run_body(fused, feeds), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_fused_members_have_an_op_of_each_set_their_pattern_requires(tmp_path, name):
    """`Pattern.required_ops` is a promise about every match: were it too strong, the fuse pass
    would skip a rule that fits (and every row case above would then not fuse)."""
    (fused,) = fused_nodes(fused_context(build(tmp_path, POSITIVE[name][0]())))
    members = set(fused.attrs["members"])
    rows = [rule for rule in RECOGNISERS + KERNEL_FUSIONS if rule.kernel == fused.op]
    assert any(all(not ops.isdisjoint(members) for ops in rule.pattern.required_ops()) for rule in rows)


def test_required_ops_of_chains_and_alternatives():
    from rkcompile.ir.patterns import ALT_REQUIREMENTS, Alt, Any, Chain, Const, Op

    assert Any().required_ops() == Const(1.0).required_ops() == ()
    assert Op("Relu", Op("Conv")).required_ops() == (frozenset({"Relu"}), frozenset({"Conv"}))
    assert Chain("Mul", Any(), Const(0.5)).required_ops() == (frozenset({"Mul"}),)
    assert Chain("Mul", Op("Erf")).required_ops() == (frozenset({"Erf"}),)  # one term: no Mul node
    shared = Op("Sqrt")
    needs = Alt(Op("Div", shared), Op("Reciprocal", shared)).required_ops()
    assert frozenset({"Sqrt"}) in needs and frozenset({"Div", "Reciprocal"}) in needs
    assert frozenset({"Div"}) not in needs and frozenset({"Reciprocal"}) not in needs
    assert Alt(Op("Relu"), Any()).required_ops() == ()  # the bare tensor needs no member
    wide = Alt(*(Op(f"A{i}", Op(f"B{i}"), Op(f"C{i}")) for i in range(4)))  # 3 ** 4 choices of a set each
    assert 3 ** 4 > ALT_REQUIREMENTS
    assert wide.required_ops() == (frozenset(f"{op}{i}" for op in "ABC" for i in range(4)),)


def test_a_rule_needing_an_op_the_graph_lacks_is_tried_at_no_root(tmp_path, monkeypatch):
    tried = Counter()
    find = fuse.find_fusion

    def counted(ctx, rule, root, dag, rank=None):
        tried[rule.kernel] += 1
        return find(ctx, rule, root, dag, rank)

    monkeypatch.setattr(fuse, "find_fusion", counted)
    (fused,) = fused_nodes(fused_context(build(tmp_path, POSITIVE["exSwish"][0]())))
    assert fused.op == "exSwish" and tried["exSwish"] == 1
    assert tried["exGelu"] == tried["exMish"] == tried["HardSwish"] == 0  # no Erf, Tanh, HardSigmoid or Clip


def test_conv_then_recognised_activation_nests_the_recognised_node(tmp_path):
    ctx = fused_context(build(tmp_path, POSITIVE["ConvExSwish"][0]()))
    (fused,) = fused_nodes(ctx)
    inner = [n for n in fused.attrs["body"].nodes if n.op == "exSwish"]
    assert len(inner) == 1 and [m.op for m in inner[0].attrs["body"].nodes] == ["Sigmoid", "Mul"]
    assert ctx.origins[fused.name] == ("n_c", "n_s", "n_y")


def test_erf_member_reaches_the_npu_only_through_the_fusion(tmp_path):
    path = build(tmp_path, _gelu_erf())
    ctx = CompileContext(model_path=path, target=get_target("rk3588"))
    import_model.run(ctx)
    legalize.run(ctx)
    assert ctx.failures["n_e"], "Erf is not an rk3588 NPU op on its own"
    fuse.run(ctx)
    assign.run(ctx)
    assert [(p.device, p.kernel) for p in ctx.placement.values()] == [("npu", "exGelu")]
    plan, _ = compile_model(path, "rk3588")
    (step,) = [s for s in plan.steps if s.kernel == "exGelu"]
    assert len(step.nodes) == 5
    assert {n.name: n.step for n in plan.nodes} == {name: step.id for name in step.nodes}
    assert not contract_violations(plan, [n.name for n in onnx.load(str(path)).graph.node])


def test_per_element_slope_does_not_fuse_and_the_plan_says_why(tmp_path):
    nodes, inits = conv_then("PRelu", "slope")
    path = build(tmp_path, case(nodes, inits + [const("slope", RNG.standard_normal((4, 8, 8)))]))
    plan, _ = compile_model(path, "rk3588")
    assert not [s for s in plan.steps if s.kernel in FUSED_KERNELS]
    (prelu,) = [s for s in plan.steps if s.nodes == ("n_y",)]
    assert prelu.note.startswith("not fused as ConvPRelu: PRelu's slope is one value or one value per output channel")
    assert "slope shape (4, 8, 8)" in prelu.note
    assert json.loads(plan.to_json())["steps"][prelu.id]["note"] == prelu.note


def _fused_conv_chain(tmp_path, nodes, inits, outputs):
    path = tmp_path / "chain.onnx"
    onnx.save(with_inferred_outputs(nodes, [value_info("x", X4)], inits, outputs), str(path))
    return fused_context(path)


def test_intermediate_read_outside_the_chain_does_not_fuse(tmp_path):
    nodes, inits = conv()
    nodes += [node("Relu", ["c"], "y"), node("Sigmoid", ["c"], "y2")]
    ctx = _fused_conv_chain(tmp_path, nodes, inits, ["y", "y2"])
    assert fused_nodes(ctx) == []
    assert "is also read by" in ctx.notes["n_y"]


def test_intermediate_that_is_a_graph_output_does_not_fuse(tmp_path):
    ctx = _fused_conv_chain(tmp_path, *conv_then("Relu"), ["y", "c"])
    assert fused_nodes(ctx) == []
    assert "is a graph output" in ctx.notes["n_y"]


@pytest.mark.parametrize("name, kernel", [("ConvRelu", "ConvolutionRelu"), ("exSDPAttention", "exSDPAttention"),
                                          ("exGelu", "exGelu"), ("MulRelu", "MulRelu")])
def test_target_without_the_kernel_does_not_fuse(tmp_path, name, kernel):
    rk3588 = get_target("rk3588")
    lacking = dataclasses.replace(rk3588, kernels=rk3588.kernels - {kernel})
    path = build(tmp_path, POSITIVE[name][0]())
    assert fused_nodes(fused_context(path, lacking)) == []
    assert [n.op for n in fused_nodes(fused_context(path, rk3588))] == [name]


def test_members_breaking_their_rules_do_not_fuse(tmp_path):
    # int32 data: Mul and Relu both break the NPU's float-data rule, so MulRelu must not form
    model = with_inferred_outputs([node("Mul", ["x", "x2"], "a"), node("Relu", ["a"], "y")],
                                  [value_info("x", X4, TensorProto.INT32), value_info("x2", X4, TensorProto.INT32)],
                                  [], ["y"])
    path = tmp_path / "int.onnx"
    onnx.save(model, str(path))
    ctx = fused_context(path)
    assert fused_nodes(ctx) == []
    assert ctx.notes["n_y"].startswith("not fused as MulRelu: member n_")


def test_kernel_fusion_member_breaking_its_own_rule_does_not_fuse(tmp_path):
    # the NPU's HardSigmoid takes alpha 1/6 only; ConvHardSigmoid runs it as itself
    path = build(tmp_path, case(*conv_then("HardSigmoid", alpha=0.2)))
    ctx = fused_context(path)
    assert fused_nodes(ctx) == []
    assert ctx.notes["n_y"].startswith("not fused as ConvHardSigmoid: member n_y breaks")


def test_norm_over_an_unsupported_axis_is_not_recognised(tmp_path):
    path = build(tmp_path, _layer_norm(axes=(-1,), shape=(1, 8, 16)))
    ctx = fused_context(path)
    assert "exNorm" not in [n.op for n in fused_nodes(ctx)]
    assert "only [1] and [1,2,3]" in ctx.notes["n_y"]


def test_op_missing_member_must_still_meet_the_common_rules(tmp_path):
    # GELU on a rank-5 tensor: Erf lacks an NPU kernel (covered by exGelu), but rank 5 breaks a
    # rule every NPU node obeys, so the exemption must not apply
    nodes, inits, _, opset = _gelu_erf()
    path = build(tmp_path, (nodes, inits, [("x", (1, 2, 3, 4, 5))], opset))
    ctx = fused_context(path)
    assert fused_nodes(ctx) == []
    assert "member" in ctx.notes["n_y"]


def test_diamond_around_a_candidate_chain_never_creates_a_cycle(tmp_path):
    # x -> Conv -> c -> Add(c, s) -> Relu, with c -> Sigmoid -> s outside the chain: fusing
    # Conv+Add(+Relu) would need Sigmoid both after and before the fused node
    nodes, inits = conv()
    nodes += [node("Sigmoid", ["c"], "s"), node("Add", ["c", "s"], "a"), node("Relu", ["a"], "y")]
    path = build(tmp_path, case(nodes, inits))
    ctx = fused_context(path)
    assert [n.op for n in fused_nodes(ctx)] == ["AddRelu"]  # the Add+Relu tail alone is safe
    assert is_acyclic(dataflow_graph(ctx.graph))

    # the cycle check on its own: members {Conv, Add} with Sigmoid between them
    ctx = CompileContext(model_path=path, target=get_target("rk3588"))
    import_model.run(ctx)
    by_name = {n.name: n for n in ctx.graph.nodes}
    match = Match(members=(by_name["n_a"], by_name["n_c"]))
    problem = fuse.cycle_problem(match, dataflow_graph(ctx.graph))
    assert problem == "n_s both reads a member and feeds one"


def test_fusion_applies_on_every_primary_target(tmp_path):
    path = build(tmp_path, POSITIVE["ConvAddRelu"][0]())
    for target in ("rk3588", "rk3576", "rk3562"):
        assert [n.op for n in fused_nodes(fused_context(path, target))] == ["ConvAddRelu"]


def test_dump_after_fuse_writes_the_body_as_a_subgraph(tmp_path):
    path = build(tmp_path, _layer_norm())
    compile_model(path, "rk3588", Options(dump_after=("fuse",), dump_dir=tmp_path))
    dumped = onnx.load(str(tmp_path / "case.after-fuse.onnx"))
    (fused,) = [n for n in dumped.graph.node if n.domain == FUSED_DOMAIN]
    attrs = {a.name: helper.get_attribute_value(a) for a in fused.attribute}
    assert fused.op_type == "exNorm" and attrs["mode"] == b"layer" and attrs["axes"] == [1]
    assert [n.op_type for n in attrs["body"].node][:3] == ["ReduceMean", "Sub", "Pow"]


# --- the zoo, against rknn-toolkit2 ---------------------------------------------------------

EXPECTED_ON_ZOO = {
    "resnet18_halfwidth": {"ConvRelu", "ConvAddRelu"},
    "mobilenet_v2": {"ConvClip", "ConvAdd"},
    "lraspp_mobilenet_v3_large": {"ConvHardSwish", "ConvHardSigmoid", "ConvRelu", "ConvAdd"},
    "transformer_encoder": {"exNorm", "ConvExGelu", "exSDPAttention"},
    "bert_mini": {"exNorm", "ConvExGelu"},
    "lstm_textcls": {"exLSTM"},
    "yolov8n": {"ConvExSwish"},
}


@pytest.mark.skipif(not ZOO.is_dir() or not PEER.is_file(), reason="../shared/zoo or the peer results are not present")
@pytest.mark.parametrize("model", sorted(EXPECTED_ON_ZOO))
def test_zoo_shows_the_expected_fused_kernels(model):
    plan, ctx = compile_model(ZOO / f"{model}.onnx", "rk3588")
    fused = Counter(s.kernel for s in plan.steps if s.kernel in FUSED_KERNELS)
    assert EXPECTED_ON_ZOO[model] <= set(fused), fused
    assert not contract_violations(plan, [name for name, _ in ctx.original_nodes])
    peer = json.loads(PEER.read_text())["models"][model]
    peer_counts = Counter(layer["op"] for layer in peer["layers"] if layer["target"] == "NPU")
    for kernel in EXPECTED_ON_ZOO[model] & set(peer_counts):
        assert fused[kernel] >= peer_counts[kernel], (kernel, fused, peer_counts)


def test_a_fused_weight_is_read_only_when_needed_and_then_once_for_graph_and_body(tmp_path):
    """Fusion copies a Conv's weight into the fused node's body without reading it; reading
    either the graph's constant or the body's copy reads it once, and both hold that array;
    the copy exports what it holds."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(w, "w")]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "conv_relu.onnx"
    onnx.save(model, path)
    _, ctx = compile_model(path, "rk3588")
    fused, = [node for node in ctx.graph.nodes if node.op == "ConvRelu"]
    graph_weight = next(t for t in fused.inputs if t.name == "w")
    body_weight = fused.attrs["body"].nodes[0].inputs[1]
    assert body_weight is not graph_weight
    assert not isinstance(graph_weight._values, np.ndarray) and body_weight._values is graph_weight._values
    assert body_weight.values is graph_weight.values
    np.testing.assert_array_equal(graph_weight.values, w)
    graph_weight.values[0, 0, 0, 0] = 5.0  # a pass changing the array in place: both see it, and export it
    exported = gs.exporters.onnx_exporter.OnnxExporter.export_tensor_proto(body_weight)
    assert numpy_helper.to_array(exported)[0, 0, 0, 0] == 5.0


def test_patterns_yield_every_match_in_order_and_none_where_they_cannot_fit():
    """Each pattern's matches, in the order the fuse pass takes them: both input orders of a
    commutative op, every split of a chain, an alternative's options in turn, nothing for a
    producer of another op or a label bound to another tensor or node."""
    from rkcompile.ir.patterns import Alt, Any, Chain, Op, matches

    x, y, z = (gs.Variable(name, np.float32, [1, 4]) for name in "xyz")
    add = gs.Node("Add", name="add", inputs=[x, y], outputs=[gs.Variable("s", np.float32, [1, 4])])
    mul = gs.Node("Mul", name="mul", inputs=[add.outputs[0], z], outputs=[gs.Variable("p", np.float32, [1, 4])])
    square = gs.Node("Mul", name="square", inputs=[x, x], outputs=[gs.Variable("q", np.float32, [1, 4])])

    def bound(pattern, root, *labels):
        return [tuple(m.tensors[label].name for label in labels) for m in matches(pattern, root)]

    assert bound(Op("Add", Any("a"), Any("b"), commutative=True), add, "a", "b") == [("x", "y"), ("y", "x")]
    assert bound(Op("Add", Any("a"), Any("b")), add, "a", "b") == [("x", "y")]
    assert bound(Op("Mul", Any("a"), Any("b")), add, "a", "b") == []
    assert bound(Op("Mul", Any("a"), Any("a")), mul, "a") == []
    assert bound(Op("Mul", Any("a"), Any("a")), square, "a") == [("x",)]
    inner = Op("Add", Any("a"), Any("b"), label="sum")
    assert bound(Op("Mul", inner, Any("c")), mul, "a", "b", "c") == [("x", "y", "z")]
    assert bound(Op("Mul", Any("c"), inner), mul, "a", "b", "c") == []
    assert bound(Alt(Op("Mul", Any("a"), Any("b")), Op("Mul", Any("b"), Any("a"))), square, "a", "b") == [
        ("x", "x"), ("x", "x")]
    assert bound(Alt(Op("Add", Any("a"), Any("b")), Any("a")), mul, "a") == [("p",)]
    assert [tuple(n.name for n in m.members) for m in matches(Chain("Mul", Any("u"), Any("v")), mul)] == [
        ("mul",), ("mul",)]
