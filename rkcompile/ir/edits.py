"""The graph edits passes share: rewire a tensor's readers or one input or output of a node,
detach a node.

onnx-graphsurgeon keeps producer and consumer lists on every tensor; these two edits keep them
consistent, so no pass writes its own loop over consumers.

Both find a node in a tensor's list by identity. onnx-graphsurgeon's own lists remove it with
`list.remove`, which compares with `==`: its Node.__eq__ compares names, attributes and tensors,
after formatting a log line, for every node ahead of the one removed (a tensor read by many
nodes), and would remove the first node equal to it rather than the node itself.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs


def replace_uses(old: gs.Tensor, new: gs.Tensor) -> None:
    """Every node reading `old` reads `new` instead, at the same input positions."""
    for reader in list(old.outputs):
        for index, tensor in enumerate(reader.inputs):
            if tensor is old:
                _drop(old.outputs, reader)
                list.__setitem__(reader.inputs, index, new)
                list.append(new.outputs, reader)


def set_input(node: gs.Node, index: int, tensor: gs.Tensor) -> None:
    """`node` reads `tensor` as its input `index`, in place of what it read there."""
    _drop(node.inputs[index].outputs, node)
    list.__setitem__(node.inputs, index, tensor)
    list.append(tensor.outputs, node)


def set_output(node: gs.Node, index: int, tensor: gs.Tensor) -> None:
    """`node` writes `tensor` as its output `index`, in place of what it wrote there."""
    _drop(node.outputs[index].inputs, node)
    list.__setitem__(node.outputs, index, tensor)
    list.append(tensor.inputs, node)


def unlinked_node(op: str, name: str | None = None, attrs: dict | None = None, inputs=(), outputs=(),
                  domain: str | None = None) -> gs.Node:
    """gs.Node(op, name, attrs, inputs, outputs, domain) that no tensor lists as its producer or
    reader: a probe a pass checks against the target's rules and drops, which no graph walk may
    meet. Its lists are filled as the edits above fill them, without telling the tensors."""
    node = gs.Node(op=op, name=name, attrs=attrs, domain=domain)
    list.extend(node.inputs, inputs)
    list.extend(node.outputs, outputs)
    return node


def detach(node: gs.Node) -> None:
    """Disconnect `node` from every tensor it reads and writes; it reads and makes nothing after."""
    for tensor in node.inputs:
        _drop(tensor.outputs, node)
    list.clear(node.inputs)
    for tensor in node.outputs:
        _drop(tensor.inputs, node)
    list.clear(node.outputs)


def _drop(nodes: list[gs.Node], node: gs.Node) -> None:
    """Remove one entry of `node` itself from a tensor's producers or readers; only that list
    changes (`list`'s own methods: the node's side is the caller's)."""
    for index, listed in enumerate(nodes):
        if listed is node:
            list.__delitem__(nodes, index)
            return
    raise ValueError(f"node {node.name} is not linked to the tensor it lists")
