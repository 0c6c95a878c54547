"""rkcompile.ir.onnx_import.import_onnx makes the graph onnx-graphsurgeon's importer makes, field by
field: every tensor and node, their links, the attributes (subgraphs included) and the graph's
own fields. Checked on onnx's operator test cases (the models as written and after shape
inference: value_info given), onnx's shipped models, the dev zoo, and one case per rule of the
importer that those may not reach."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import light_models, load_tool, make_model, value_info, weight, zoo_models
from onnx import TensorProto, helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from rkcompile.ir import onnx_import as graph_import



def same_graph(ours: gs.Graph, theirs: gs.Graph) -> None:
    """Walk both graphs side by side from their graph objects, matching the library's objects
    to ours one to one as they are met, and compare every field of each pair once."""
    matched: dict[int, object] = {}  # id of the library's object -> ours
    claimed: set[int] = set()  # ids of ours already matched
    pending = [(ours, theirs)]

    def pair(mine, expected) -> None:
        if id(expected) in matched:
            assert matched[id(expected)] is mine, f"{expected!r} is two objects of ours"
            return
        assert id(mine) not in claimed, f"{mine!r} stands for two of the library's objects"
        matched[id(expected)] = mine
        claimed.add(id(mine))
        pending.append((mine, expected))

    def same_list(mine, expected) -> None:
        assert type(mine) is type(expected) and len(mine) == len(expected)
        for item, other in zip(mine, expected):
            value(item, other)

    def value(mine, expected) -> None:
        if isinstance(expected, (gs.Graph, gs.Node, gs.Tensor)):
            pair(mine, expected)
        elif isinstance(expected, (list, tuple)):
            same_list(mine, expected)
        else:
            assert type(mine) is type(expected) and (mine == expected or (mine != mine and expected != expected))

    matched[id(theirs)] = ours
    claimed.add(id(ours))
    while pending:
        mine, expected = pending.pop()
        assert type(mine) is type(expected) and set(vars(mine)) == set(vars(expected)), expected
        for key, other in vars(expected).items():
            held = vars(mine)[key]
            if key == "_functions":
                assert [f.unique_id for f in held] == [f.unique_id for f in other]
            elif key == "attrs":
                assert list(held) == list(other)
                for name, item in other.items():
                    value(held[name], item)
            elif key in ("nodes", "inputs", "outputs"):
                same_list(held, other)
            elif key == "_values" and isinstance(other, LazyValues):
                assert type(held) is type(other) and held.tensor is other.tensor
                assert (list(held.shape), held.dtype, held.nbytes) == (list(other.shape), other.dtype, other.nbytes)
            elif key == "_values":
                assert np.array_equal(held, other)
            else:
                assert type(held) is type(other) and held == other, (expected, key, held, other)


def check(model: onnx.ModelProto) -> None:
    same_graph(graph_import.import_onnx(model), gs.import_onnx(model))


def inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (a case inference refuses is checked as written)
        return model


@pytest.fixture(scope="module")
def node_cases():
    return load_tool("sweep_backend_data").node_cases()


def test_every_onnx_operator_test_case_imports_as_the_library_imports_it(node_cases):
    assert len(node_cases) > 1000
    for case in node_cases:
        check(case.model)
        check(inferred(case.model))


@pytest.mark.parametrize("path", light_models() + zoo_models(), ids=lambda p: p.stem)
def test_shipped_and_zoo_models_import_as_the_library_imports_them(path):
    check(inferred(onnx.load(str(path))))


def _conv_model(**graph_changes) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, [value_info("x", [1, 2, 4, 4])], [value_info("y", [1, 2, 4, 4])],
                       [weight("w", np.ones((2, 2, 1, 1), np.float32))])
    for field, values in graph_changes.items():
        getattr(model.graph, field).extend(values)
    return model


def test_repeated_value_info_adds_only_what_the_first_entry_lacked():
    model = _conv_model(value_info=[helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None),
                                    helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 2, 4, 4]),
                                    helper.make_tensor_value_info("c", TensorProto.INT64, [7]),
                                    helper.ValueInfoProto(name="c")])
    check(model)
    assert graph_import.import_onnx(model).tensors()["c"].shape == [1, 2, 4, 4]


def test_scalar_and_symbolic_shapes_inputs_that_are_initializers_and_duplicate_initializers():
    model = _conv_model(value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, []),
                                    helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 2, None, 4])],
                        input=[helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2, 1, 1])],
                        initializer=[weight("w", np.zeros((3,), np.float32))])
    model.graph.initializer[0].data_location = TensorProto.DEFAULT  # set, so HasField holds
    check(model)


def test_omitted_optionals_unknown_tensors_domains_and_attribute_kinds():
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),
             helper.make_node("Dropout", ["c"], ["d", ""], name="drop"),
             helper.make_node("Constant", [], ["k"], name="k", value=helper.make_tensor("kv", TensorProto.FLOAT, [1], [2.0])),
             helper.make_node("Mul", ["d", "k"], ["m"], name="mul", domain=""),
             helper.make_node("Custom", ["m"], ["y"], name="custom", domain="my.domain", text="a", texts=["b", "c"],
                              numbers=[1.5, 2.5], counts=[1, 2])]
    model = make_model(nodes, [value_info("x", [2])], [value_info("y", [2])],
                       [weight("hi", np.array(6, np.float32))], extra_opsets=[("my.domain", 1)])
    check(model)


def test_if_branches_read_the_tensors_made_so_far():
    then_branch = helper.make_graph([helper.make_node("Add", ["a", "b"], ["t"], name="then_add")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_branch = helper.make_graph([helper.make_node("Sub", ["a", "later"], ["e"], name="else_sub")], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Neg", ["x"], ["later"], name="neg")]
    model = make_model(nodes, [value_info("x", [2]), value_info("cond", [], TensorProto.BOOL)],
                       [value_info("y", [2]), value_info("later", [2])], [weight("b", np.ones(2, np.float32))])
    check(model)


def test_sequences_and_types_numpy_lacks_are_the_library_s():
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"], name="seq"),
             helper.make_node("Cast", ["x"], ["b"], name="cast", to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["b"], ["y"], name="back", to=TensorProto.FLOAT)]
    model = make_model(nodes, [value_info("x", [2])], [value_info("y", [2])],
                       extra_opsets=[])
    model.graph.output.append(helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2]))
    model.graph.value_info.append(helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2]))
    check(model)


def test_a_model_with_local_functions_or_no_ai_onnx_opset_is_the_library_s_own(monkeypatch):
    called = []
    monkeypatch.setattr(gs, "import_onnx", lambda model: called.append(model) or "library")
    function = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                    [helper.make_opsetid("", 17)])
    with_function = _conv_model()
    with_function.functions.append(function)
    without_opset = _conv_model()
    del without_opset.opset_import[:]
    assert graph_import.import_onnx(with_function) == graph_import.import_onnx(without_opset) == "library"
    assert called == [with_function, without_opset]
    assert isinstance(graph_import.import_onnx(_conv_model()), gs.Graph) and len(called) == 2
