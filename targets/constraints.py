"""Constraint checks shared by the targets.

Each check is `check(node, target, **params) -> (ok, detail)`. Its docstring is a template
rendered with the target's `params`; the rendered text is the rule a user reads when a node
falls back to the CPU. `detail` names the offending values; it never contains ';', which
separates the rules in a node's reason.
Every docstring cites where the rule comes from.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from rkcompile.ir import FLOAT_DTYPES, dtype_name, present_inputs, static_shape

from .model import CheckResult


def _runtime_tensors(node: gs.Node):
    """Inputs computed at run time (not weights) followed by the outputs."""
    return [t for t in present_inputs(node) if not isinstance(t, gs.Constant)] + list(node.outputs)


def static_shapes(node: gs.Node, target) -> CheckResult:
    """Every tensor shape is known and static: the NPU runs statically shaped graphs
    (oplist V2.3.2, all operators; dynamic dims are fixed with --input-shape)."""
    unknown = [t.name for t in _runtime_tensors(node) if static_shape(t) is None]
    return not unknown, f"unknown shape for {', '.join(unknown)}" if unknown else ""


def max_rank(node: gs.Node, target, limit: int) -> CheckResult:
    """Tensors have at most {limit} dimensions: every NPU operator takes
    [batch, channel, height, width] (oplist V2.3.2, shape lists of all operators)."""
    over = [f"{t.name} has rank {len(t.shape)}" for t in _runtime_tensors(node)
            if t.shape is not None and len(t.shape) > limit]
    return not over, ", ".join(over)


def float_data(node: gs.Node, target, index_inputs: tuple[int, ...] = ()) -> CheckResult:
    """Data tensors are floating point, computed as int8 or float16 on the NPU; integer and bool
    tensors stay on the CPU (oplist V2.3.2, data-type constraints: T1 int8/float16)."""
    bad = []
    for position, tensor in enumerate(node.inputs):
        if not tensor.name or isinstance(tensor, gs.Constant) or position in index_inputs:
            continue
        name = dtype_name(tensor.dtype)
        if name not in FLOAT_DTYPES:
            bad.append(f"input {tensor.name} is {name}")
    for tensor in node.outputs:
        name = dtype_name(tensor.dtype)
        if name not in FLOAT_DTYPES:
            bad.append(f"output {tensor.name} is {name}")
    return not bad, ", ".join(bad)
