"""The compiler's fast constructors (rkcompile/ir/construct.py) make onnx-graphsurgeon objects
without the library's constructors (their attribute setter is slow): the objects must be the
ones the constructors make, attribute by attribute, linked alike. A node described into a plan
and rebuilt as a plain node (rkcompile/plan/operations.py), or converted to one
(rkcompile/ir/nodes.py plain_nodes), exports the ONNX onnx-graphsurgeon exports for it."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.construct import constant, graph, graph_node, variable
from rkcompile.ir.describe import describe
from rkcompile.ir.nodes import node_proto, plain_nodes
from rkcompile.plan import nodes as plain
from rkcompile.plan.onnx_export import node_proto as plain_proto
from rkcompile.plan.operations import rebuild


def fields(obj) -> dict:
    """An object's attributes, a linked list as the ids of what it holds (its own identity and
    the object it belongs to differ between two objects made alike)."""
    return {key: [id(item) for item in value] if isinstance(value, list) else value
            for key, value in vars(obj).items()}


def test_variable_and_constant_match_the_library_constructors():
    assert fields(variable("x", "float32")) == fields(gs.Variable("x", dtype="float32"))
    shape = [1, "n", 3]
    assert fields(variable("x", "float32", shape=shape)) == fields(gs.Variable("x", dtype="float32", shape=shape))
    assert fields(variable("")) == fields(gs.Variable.empty())
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    made, expected = constant("w", values), gs.Constant("w", values)
    assert fields(made) == fields(expected)
    assert made.values is values and made.shape == (2, 3) and made.dtype == np.float32


def test_graph_node_links_its_tensors_as_gs_node_does():
    x, w, y = variable("x", "float32"), constant("w", np.ones((4, 3, 1, 1), np.float32)), variable("y")
    node = graph_node("Conv", "conv", None, {"group": 1}, [x, w], [y])
    library = gs.Node(op="Conv", name="conv", attrs={"group": 1}, inputs=[gs.Variable("a"), gs.Variable("b")],
                      outputs=[gs.Variable("c")])
    assert set(vars(node)) == set(vars(library))
    assert type(node.inputs) is type(library.inputs) and type(node.outputs) is type(library.outputs)
    assert list(node.inputs) == [x, w] and list(node.outputs) == [y]
    assert list(x.outputs) == [node] and list(w.outputs) == [node] and list(y.inputs) == [node]
    # the list stays synchronized as onnx-graphsurgeon's own does
    node.inputs.pop()
    assert list(w.outputs) == []


def fused_relu_clip(*more_inputs: gs.Tensor) -> gs.Node:
    """A fused Relu then Clip, as passes/fuse.py keeps one: its members in a `body` subgraph."""
    body_x, body_y, body_z = gs.Variable("bx", dtype=np.float32), gs.Variable("by"), gs.Variable("bz")
    low = gs.Constant("low", np.array(0, np.float32))
    members = [gs.Node("Relu", "relu", inputs=[body_x], outputs=[body_y]),
               gs.Node("Clip", "clip", inputs=[body_y, low], outputs=[body_z])]
    body = gs.Graph(nodes=members, inputs=[body_x], outputs=[body_z], name="body")
    return gs.Node(op="ReluClip", name="fused", domain="rkcompile", attrs={"body": body, "alpha": 0.5},
                   inputs=[gs.Variable("x", dtype=np.float32), *more_inputs], outputs=[gs.Variable("z")])


def test_rebuild_of_a_fused_node_exports_the_same_onnx_as_the_described_one():
    original = fused_relu_clip()
    rebuilt = rebuild(describe(original, set()), lambda name: None)
    assert isinstance(rebuilt, plain.Node)
    assert plain_proto(rebuilt) == node_proto(original)
    inner = rebuilt.attrs["body"]
    assert isinstance(inner, plain.Graph) and [n.op for n in inner.nodes] == ["Relu", "Clip"]
    # members connect through shared tensors, as the graph they were described from
    assert inner.nodes[0].outputs[0] is inner.nodes[1].inputs[0]
    assert isinstance(inner.nodes[1].inputs[1], plain.Constant)


def test_rebuild_reads_weights_from_the_lookup_and_exports_what_the_model_node_exports():
    """A weight the plan keeps in its weight region comes from the lookup (the emulator's decoded
    weight region), inside the body too; the ONNX is the original node's, weight included."""
    values = np.ones(3, np.float32)
    original = fused_relu_clip(gs.Constant("w", values))
    weight = plain.Constant("w", values)
    rebuilt = rebuild(describe(original, {"w"}), {"w": weight}.get)
    assert rebuilt.inputs[1] is weight
    assert plain_proto(rebuilt) == node_proto(original)


def test_a_converted_node_exports_what_onnx_graphsurgeon_exports():
    """plain_nodes: the compiler's nodes as the runtime takes them, tensors shared by several
    nodes converted once; a string tensor attribute as ONNX string data."""
    shared = gs.Constant("w", np.arange(3, dtype=np.float32))
    first, second = fused_relu_clip(shared), fused_relu_clip(shared)
    labels = gs.Node("LabelEncoder", "labels", domain="ai.onnx.ml",
                     attrs={"values_int64s": [1, 2],
                            "keys_tensor": gs.Constant("keys_tensor", np.array(["a", "b"], dtype=object))},
                     inputs=[gs.Variable("s", dtype=object)], outputs=[gs.Variable("i")])
    converted = plain_nodes([first, second, labels])
    assert [plain_proto(node) for node in converted] == [node_proto(node) for node in (first, second, labels)]
    assert converted[0].inputs[1] is converted[1].inputs[1]
    assert converted[0].attrs["body"].nodes[0].outputs[0] is converted[0].attrs["body"].nodes[1].inputs[0]


def test_graph_matches_the_library_constructor_nested_graphs_included():
    """operations.graph sets what gs.Graph's constructor sets, and shares the outer graph's
    function list with the graphs nested in its nodes (at any depth), as the constructor's merge
    of function lists leaves graphs that have none."""
    def made(constructor):
        x, y, z = variable("x", "float32"), variable("y"), variable("z")
        innermost = constructor([graph_node("Sigmoid", "s", None, {}, [x], [y])], [x], [y], "innermost")
        inner = constructor([graph_node("exSwish", "w", "rkcompile", {"body": innermost}, [x], [y])], [x], [y], "")
        outer = constructor([graph_node("Loop", "l", None, {"body": inner}, [x], [z])], [x], [z], "outer")
        listed = constructor([graph_node("If", "i", None, {"branches": [outer]}, [x], [z])], [x], [z], "listed")
        return outer, inner, innermost, listed

    def library(nodes, inputs, outputs, name):
        return gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=name)

    ours, theirs = made(graph), made(library)
    for mine, expected in zip(ours, theirs):
        assert set(vars(mine)) == set(vars(expected))
        assert {key: value for key, value in vars(mine).items() if key not in ("nodes", "inputs", "outputs")} == \
            {key: value for key, value in vars(expected).items() if key not in ("nodes", "inputs", "outputs")}
        assert [type(vars(mine)[key]) for key in ("nodes", "inputs", "outputs")] == \
            [type(vars(expected)[key]) for key in ("nodes", "inputs", "outputs")]
    for outer, inner, innermost, listed in (ours, theirs):
        assert inner._functions is outer._functions and innermost._functions is outer._functions
        assert listed._functions is not outer._functions  # a list of graphs is no graph attribute


def test_graph_takes_an_opset_and_gathers_nested_local_functions_as_the_library_does():
    """With a local function in a nested graph, operations.graph is the constructor itself: the
    outer graph lists the function and shares its list with the nested graph."""
    def made(constructor, opset):
        x, y, z = gs.Variable("x", dtype=np.float32), gs.Variable("y"), gs.Variable("z")
        function = gs.Function("Twice", domain="local", nodes=[gs.Node("Add", "a", inputs=[x, x], outputs=[y])],
                               inputs=[x], outputs=[y])
        inner = gs.Graph(nodes=[gs.Node("Twice", "t", domain="local", inputs=[x], outputs=[y])], inputs=[x],
                         outputs=[y], functions=[function])
        outer = constructor([graph_node("Loop", "l", None, {"body": inner}, [x], [z])], [x], [z], "outer", opset)
        return outer, inner, function

    for opset in (13, gs.Graph.DEFAULT_OPSET):
        (outer, inner, function), (expected, _, _) = made(graph, opset), made(
            lambda nodes, inputs, outputs, name, opset: gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs,
                                                                 name=name, opset=opset), opset)
        assert outer.opset == expected.opset == opset
        assert outer.functions == [function] and inner._functions is outer._functions
        assert [f.name for f in expected.functions] == ["Twice"]
    x, y = variable("x", "float32"), variable("y")
    plain = graph([graph_node("Relu", "r", None, {}, [x], [y])], [x], [y], "plain", 13)
    assert plain.opset == 13 and plain.functions == []
