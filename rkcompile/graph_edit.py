"""The graph edits passes share: rewire a tensor's readers, detach a node.

onnx-graphsurgeon keeps producer and consumer lists on every tensor; these two edits keep them
consistent, so no pass writes its own loop over consumers.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs


def replace_uses(old: gs.Tensor, new: gs.Tensor) -> None:
    """Every node reading `old` reads `new` instead, at the same input positions."""
    for reader in list(old.outputs):
        for index, tensor in enumerate(reader.inputs):
            if tensor is old:
                reader.inputs[index] = new


def detach(node: gs.Node) -> None:
    """Disconnect `node` from every tensor it reads and writes; it reads and makes nothing after."""
    node.inputs.clear()
    node.outputs.clear()
