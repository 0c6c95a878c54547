"""The shared graph edits keep both sides of every link (a node's tensors, a tensor's nodes)
consistent, and act on the node given, found by identity."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from rkcompile.ir.edits import detach, replace_uses


def _twins(x: gs.Variable) -> tuple[gs.Node, gs.Node]:
    """Two nodes onnx-graphsurgeon's Node.__eq__ calls equal (same name, op, attributes and
    tensor names), both reading `x`."""
    first = gs.Node("Relu", "twin", inputs=[x], outputs=[gs.Variable("y", np.float32, [2])])
    second = gs.Node("Relu", "twin", inputs=[x], outputs=[gs.Variable("y", np.float32, [2])])
    assert first == second and first is not second
    return first, second


def test_detach_unlinks_the_node_itself_not_an_equal_one():
    x = gs.Variable("x", np.float32, [2])
    first, second = _twins(x)
    output = second.outputs[0]
    detach(second)
    assert [node for node in x.outputs] == [first] and x.outputs[0] is first
    assert list(second.inputs) == [] and list(second.outputs) == [] and list(output.inputs) == []
    assert first.inputs[0] is x and first.outputs[0].inputs[0] is first


def test_detach_drops_one_link_per_input_read_twice():
    x = gs.Variable("x", np.float32, [2])
    square = gs.Node("Mul", "square", inputs=[x, x], outputs=[gs.Variable("y", np.float32, [2])])
    other = gs.Node("Relu", "other", inputs=[x], outputs=[gs.Variable("z", np.float32, [2])])
    detach(square)
    assert list(x.outputs) == [other]


def test_replace_uses_moves_every_read_and_keeps_the_links_consistent():
    x, w = gs.Variable("x", np.float32, [2]), gs.Variable("w", np.float32, [2])
    first, second = _twins(x)
    square = gs.Node("Mul", "square", inputs=[x, x], outputs=[gs.Variable("s", np.float32, [2])])
    replace_uses(x, w)
    assert list(x.outputs) == []
    assert [id(node) for node in w.outputs] == [id(first), id(second), id(square), id(square)]
    for node in (first, second, square):
        assert all(tensor is w for tensor in node.inputs)


def test_detach_of_a_node_a_tensor_does_not_list_is_an_error():
    x = gs.Variable("x", np.float32, [2])
    node = gs.Node("Relu", "relu", inputs=[x], outputs=[gs.Variable("y", np.float32, [2])])
    list.clear(x.outputs)  # one side of the link broken, as no edit here leaves it
    with pytest.raises(ValueError, match="relu"):
        detach(node)
