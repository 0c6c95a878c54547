"""Recognisers do not depend on operand order: Mul and Add are matched as associative and
commutative chains (fusion_patterns.Chain), so every order and grouping an exporter writes of
GELU, HardSwish or LayerNorm is one fused kernel whose body computes the original."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from rkcompile.ir.patterns import Any, Chain, Const, matches
from test_fusion import RNG, build, case, const, fused_context, fused_nodes, node, random_inputs, run_body


def binary_trees(leaves: tuple[str, ...]):
    """Every binary tree over every order of `leaves`, as nested pairs."""
    if len(leaves) == 1:
        yield leaves[0]
        return
    for order in itertools.permutations(leaves):
        for cut in range(1, len(order)):
            for left in binary_trees(order[:cut]):
                for right in binary_trees(order[cut:]):
                    yield (left, right)


def distinct_trees(leaves):
    """Trees whose leaf order differs (a tree and its mirror are both kept: Mul(a, b) != Mul(b, a) as ONNX)."""
    return list(dict.fromkeys(binary_trees(tuple(leaves))))


def emit(op: str, tree, nodes: list, out: str, counter=itertools.count()) -> str:
    """Nodes computing `tree` with `op`; the last writes `out`."""
    if isinstance(tree, str):
        return tree
    left, right = (emit(op, side, nodes, f"t{next(counter)}") for side in tree)
    nodes.append(node(op, [left, right], out))
    return out


PRODUCTS_OF_THREE = distinct_trees(("x", "half", "p"))


def test_every_grouping_and_order_of_three_factors_is_enumerated():
    assert len(PRODUCTS_OF_THREE) == 12


def gelu_erf(tree, add_swapped: bool, divided: bool):
    nodes = [node("Div", ["x", "sqrt2"], "d") if divided else node("Mul", ["inv_sqrt2", "x"], "d"),
             node("Erf", ["d"], "e"),
             node("Add", ["one", "e"] if add_swapped else ["e", "one"], "p")]
    emit("Mul", tree, nodes, "y")
    return case(nodes, [const("sqrt2", np.sqrt(2)), const("inv_sqrt2", 1 / np.sqrt(2)), const("one", 1.0),
                        const("half", 0.5)])


def gelu_tanh(tree, cube_as_products: bool):
    nodes = ([node("Mul", ["x", "x"], "xx"), node("Mul", ["xx", "x"], "cube")] if cube_as_products
             else [node("Pow", ["x", "three"], "cube")])
    nodes += [node("Mul", ["k", "cube"], "kc"), node("Add", ["kc", "x"], "inner"), node("Mul", ["s2pi", "inner"], "arg"),
              node("Tanh", ["arg"], "t"), node("Add", ["one", "t"], "p")]
    emit("Mul", tree, nodes, "y")
    return case(nodes, [const("three", 3.0), const("k", 0.044715), const("s2pi", np.sqrt(2 / np.pi)),
                        const("one", 1.0), const("half", 0.5)])


def hard_swish(tree):
    nodes = [node("Add", ["three", "x"], "a"), node("Clip", ["a", "zero", "six"], "p")]
    emit("Mul", tree, nodes, "y")
    return case(nodes, [const("three", 3.0), const("zero", 0.0), const("six", 6.0), const("half", 1 / 6)])


def assert_fused_and_exact(tmp_path, spec, kernel, members):
    path = build(tmp_path, spec)
    ctx = fused_context(path)
    (fused,) = fused_nodes(ctx)
    assert fused.op == kernel
    assert len(ctx.origins[fused.name]) == members
    feeds = random_inputs(path)
    expected = ReferenceEvaluator(onnx.load(str(path))).run(None, feeds)[0]
    np.testing.assert_allclose(run_body(fused, feeds), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("index", range(len(PRODUCTS_OF_THREE)))
def test_gelu_erf_in_every_operand_order(tmp_path, index):
    spec = gelu_erf(PRODUCTS_OF_THREE[index], add_swapped=index % 2 == 1, divided=index % 4 < 2)
    assert_fused_and_exact(tmp_path, spec, "exGelu", 5)


@pytest.mark.parametrize("index", range(0, len(PRODUCTS_OF_THREE), 3))
def test_gelu_tanh_in_several_operand_orders(tmp_path, index):
    cube_as_products = index % 2 == 1
    spec = gelu_tanh(PRODUCTS_OF_THREE[index], cube_as_products)
    assert_fused_and_exact(tmp_path, spec, "exGelu", 9 if cube_as_products else 8)


@pytest.mark.parametrize("index", range(1, len(PRODUCTS_OF_THREE), 3))
def test_hard_swish_with_its_sixth_anywhere(tmp_path, index):
    assert_fused_and_exact(tmp_path, hard_swish(PRODUCTS_OF_THREE[index]), "HardSwish", 4)


def test_layer_norm_with_epsilon_first_and_a_reciprocal(tmp_path):
    nodes = [node("ReduceMean", ["x"], "m", axes=[1]), node("Sub", ["x", "m"], "d"), node("Mul", ["d", "d"], "p"),
             node("ReduceMean", ["p"], "v", axes=[1]), node("Add", ["eps", "v"], "ve"), node("Sqrt", ["ve"], "s"),
             node("Reciprocal", ["s"], "r"), node("Mul", ["r", "d"], "n"), node("Mul", ["gamma", "n"], "g"),
             node("Add", ["beta", "g"], "y")]
    inits = [const("eps", 1e-5), const("gamma", RNG.standard_normal((16, 1, 1))),
             const("beta", RNG.standard_normal((16, 1, 1)))]
    assert_fused_and_exact(tmp_path, case(nodes, inits, [("x", (1, 16, 4, 4))]), "exNorm", 10)


def test_a_missing_or_wrong_factor_is_not_gelu(tmp_path):
    nodes = [node("Div", ["x", "sqrt2"], "d"), node("Erf", ["d"], "e"), node("Add", ["e", "one"], "p"),
             node("Mul", ["p", "x"], "m"), node("Mul", ["third", "m"], "y")]
    ctx = fused_context(build(tmp_path, case(nodes, [const("sqrt2", np.sqrt(2)), const("one", 1.0),
                                                    const("third", 1 / 3)])))
    assert not [n for n in fused_nodes(ctx) if n.op == "exGelu"]


def _graph_of(nodes, inits, inputs):
    import onnx_graphsurgeon as gs
    from conftest import make_model, value_info
    model = make_model(nodes, [value_info(n, s) for n, s in inputs], [value_info("y", None)], inits)
    return gs.import_onnx(model)


@pytest.mark.parametrize("tree", distinct_trees(("a", "b", "c", "d")))
def test_chain_matches_four_terms_in_any_grouping_and_binds_each_once(tree):
    nodes = []
    emit("Add", tree, nodes, "y")
    graph = _graph_of(nodes, [], [(name, (2,)) for name in "abcd"])
    root = next(n for n in graph.nodes if n.outputs[0].name == "y")
    pattern = Chain("Add", *(Any(label) for label in ("p", "q", "r", "s")))
    found = next(matches(pattern, root))
    assert len(found.members) == 3
    assert {t.name for t in found.tensors.values()} == set("abcd")
    # the same inputs combined by another op, or a term too few, do not match
    assert next(matches(Chain("Mul", Any("p"), Any("q"), Any("r"), Any("s")), root), None) is None
    assert next(matches(Chain("Add", Any("p"), Any("q"), Const(), Any("s")), root), None) is None
