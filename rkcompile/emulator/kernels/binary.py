"""Element-wise binary ops with ONNX (numpy) multidirectional broadcasting, in float32, and the
comparisons, whose boolean results are stored as they are."""
from __future__ import annotations

from functools import reduce

import numpy as np

from rkcompile.emulator.registry import IN_PLACE, register

ARITHMETIC = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
    "Max": np.maximum, "Min": np.minimum,
}
COMPARISON = {
    "Greater": np.greater, "Less": np.less, "Equal": np.equal,
    "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _arithmetic(node, inputs, opset):
    # Max and Min are variadic; the others have exactly two operands.
    values = [v for v in inputs if v is not None]
    if node.op == "Div" and np.issubdtype(values[0].dtype, np.integer):
        return [np.trunc(values[0] / values[1]).astype(values[0].dtype)]
    return [reduce(ARITHMETIC[node.op], values)]


def _comparison(node, inputs, opset):
    return [COMPARISON[node.op](inputs[0], inputs[1])]


register(*ARITHMETIC)(_arithmetic)
register(*COMPARISON)(_comparison)


@register(*ARITHMETIC, table=IN_PLACE)
def arithmetic_in_place(node, inputs, opset, spent):
    """A float32 binary op into a spent operand of the result's shape (a broadcast one cannot
    hold it): the values `_arithmetic` gives, operands in the same order."""
    if len(inputs) != 2 or any(v is None or v.dtype != np.float32 for v in inputs):
        return None
    shape = np.broadcast_shapes(inputs[0].shape, inputs[1].shape)
    for position in spent:
        if inputs[position].shape == shape:
            return [ARITHMETIC[node.op](inputs[0], inputs[1], out=inputs[position])]
    return None
