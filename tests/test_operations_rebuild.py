"""A probe node (rkcompile/ir/edits.py unlinked_node) is onnx-graphsurgeon's node that no tensor
lists. A compiler node described into a plan
and rebuilt as a plain node (rkcompile/plan/operations.py), or converted to one
(rkcompile/ir/nodes.py plain_nodes), exports the ONNX onnx-graphsurgeon exports for it."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import unlinked_node
from rkcompile.ir.describe import describe
from rkcompile.ir.nodes import node_proto, plain_nodes
from rkcompile.plan import plain_nodes as plain
from rkcompile.plan.onnx_protos import node_proto as plain_proto
from rkcompile.plan.operations import rebuild


def test_an_unlinked_node_is_the_library_node_that_no_tensor_lists():
    """unlinked_node (a probe a pass evaluates and drops): the node gs.Node makes, and no tensor
    records it as producer or consumer."""
    x, y = gs.Variable("x", "float32"), gs.Variable("y")
    w = gs.Constant("w", np.ones(3, np.float32))
    node = unlinked_node(op="Mul", name="mul", inputs=[x, w], outputs=[y])
    assert node_proto(node) == node_proto(gs.Node(op="Mul", name="mul", inputs=[gs.Variable("x"), gs.Variable("w")],
                                                  outputs=[gs.Variable("y")]))
    assert list(node.inputs) == [x, w] and list(node.outputs) == [y]
    assert all(not t.inputs and not t.outputs for t in (x, w, y))


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
