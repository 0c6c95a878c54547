"""The NPU kernel registry, in the manner of onnx.reference's op list: each kernel module
registers the ONNX ops it computes, and the executor looks a node's op up here.

A kernel is `kernel(node, inputs, opset) -> outputs`: `node` is the step's plain node
(rkcompile/plan/plain_nodes.py; its `attrs` hold the ONNX attributes), `inputs` the node's inputs in order as float32 arrays (index
and shape tensors keep their integer dtype; an omitted optional input is None), and it returns
one array per node output, computed in float32. Rounding to the stored dtype happens once, when
the executor stores the result, so a fused chain is rounded once however many ops it has.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rkcompile.plan.plain_nodes import Node

Kernel = Callable[[Node, Sequence["np.ndarray | None"], int], Sequence[np.ndarray]]

KERNELS: dict[str, Kernel] = {}
#: in_place(node, inputs, opset, spent) -> outputs or None: the values KERNELS[op] gives, bit
#: for bit, written into one of the operands at the positions in `spent` (ones the caller no
#: longer needs and nothing else sees), or None when none of them can hold the result. A fused
#: step's members use them on the intermediates of its body (fused.run_fused): a ReLU or Clip
#: after a Conv then allocates no second map.
InPlace = Callable[[Node, Sequence["np.ndarray | None"], int, Sequence[int]], "Sequence[np.ndarray] | None"]
IN_PLACE: dict[str, InPlace] = {}


class Unsupported(Exception):
    """A kernel met an attribute combination it does not implement; the executor then runs the
    op through onnx.reference in float32 and counts it as a fallback in the report."""


def register(*ops: str, table: dict = KERNELS) -> Callable:
    """Registers a kernel for `ops` in `table` (KERNELS, or IN_PLACE for in-place variants)."""
    def add(kernel):
        for op in ops:
            if op in table:
                raise ValueError(f"two emulator kernels for {op}")
            table[op] = kernel
        return kernel
    return add


def attr(node: Node, name: str, default=None):
    value = node.attrs.get(name, default)
    return default if value is None else value


def opset_attr_or_input(node: Node, inputs: Sequence, position: int, name: str):
    """An operand that moved from an attribute to an input in a later opset (Split's split,
    Squeeze's axes, Clip's bounds): the input when given, else the attribute, else None."""
    if len(inputs) > position and inputs[position] is not None:
        return [int(v) for v in np.asarray(inputs[position]).reshape(-1)]
    value = node.attrs.get(name)
    return None if value is None else [int(v) for v in np.atleast_1d(value)]
