"""Shapings of single ops into the forms rknn-toolkit2 2.5.0's fusions and readers expect: GELU's
scaling written back as the Div it fuses (`erf_of_a_quotient`), an attention's scale moved onto
its scores (`scale_after_scores`), and every attribute left to its default written
(`defaults_written`)."""
from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import ai_onnx_opset, nodes_rewritten, readers_of
from rkcompile.views.toolkit_shapings.common import Shaping


def erf_of_a_quotient(model: onnx.ModelProto) -> int:
    """Write each Mul by a constant scalar whose only reader is an Erf as the Div by its
    reciprocal: GELU's x / sqrt(2), which the rewrites made a Mul (div_constant_to_mul).
    rknn-toolkit2 2.5.0 fuses GELU (ConvExGelu) only in the Div form; from the Mul it leaves
    each Erf on the CPU (bert_mini: 4 CPU layers). The values differ by float32 rounding.
    Returns how many Muls it wrote back."""
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers = readers_of(graph)
    changed = 0
    for node in graph.node:
        if node.op_type != "Mul" or [r.op_type for r in readers.get(node.output[0], [])] != ["Erf"]:
            continue
        factors = [name for name in node.input if name in constants]
        factor = numpy_helper.to_array(constants[factors[0]]) if len(factors) == 1 else None
        if factor is None or factor.size != 1 or factor.dtype.kind != "f" or not factor.any():
            continue
        divisor = numpy_helper.from_array((1.0 / factor.astype(np.float64)).astype(factor.dtype),
                                          f"{node.name}/divisor")
        graph.initializer.append(divisor)
        variable = next(name for name in node.input if name != factors[0])
        node.op_type = "Div"
        node.input[:] = [variable, divisor.name]
        changed += 1
    return changed


def defaults_written(model: onnx.ModelProto) -> int:
    """Write each attribute a node of the main graph leaves to its ONNX default (in the
    model's opset) with that default, as exporters from PyTorch do (last, for the nodes the
    other shapings write too): rknn-toolkit2 2.5.0 reads
    some without a default of its own (a LayerNormalization without `epsilon`: KeyError
    'LayerNormalization' in its rule `convert_layernorm_to_exnorm`). On the ops it rebuilds as
    ONNX of an older opset (REBUILT_IN_AN_OLDER_OPSET), an attribute their first version lacks
    is left out. Returns how many nodes gained an attribute."""
    opset = ai_onnx_opset(model)
    changed = 0
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        present = {attribute.name for attribute in node.attribute}
        if node.op_type in REBUILT_IN_AN_OLDER_OPSET:
            present |= _added_later(node.op_type)
        missing = [a.default_value for name, a in sorted(schema.attributes.items())
                   if name not in present and a.default_value.HasField("type") and a.default_value.name]
        node.attribute.extend(missing)
        changed += bool(missing)
    return changed


#: the recurrent ops rknn-toolkit2 2.5.0 infers through its own extend ops, which write them as
#: ONNX of an older opset: with the `layout` of opset 14 written out, its fold_constant fails
#: ("Unrecognized attribute: layout for operator LSTM", silero-vad)
REBUILT_IN_AN_OLDER_OPSET = frozenset({"LSTM", "GRU", "RNN"})


@functools.cache
def _added_later(op_type: str) -> frozenset[str]:
    """The attributes of ai.onnx's `op_type` that its first version did not have."""
    versions = [schema for schema in onnx.defs.get_all_schemas_with_history()
                if schema.name == op_type and schema.domain in ("", "ai.onnx")]
    first = min(versions, key=lambda schema: schema.since_version).attributes if versions else {}
    return frozenset(name for schema in versions for name in schema.attributes if name not in first)


def scale_after_scores(model: onnx.ModelProto) -> int:
    """Move a Mul by a constant scalar on one operand of an attention's score MatMul (one whose
    only reader is a Softmax), through the Transposes between them, onto the MatMul's result:
    softmax((s*q)^T k) becomes softmax(s*(q^T k)), the form the toolkit's attention fusion is
    written for. rknn-toolkit2 2.5.0 matches MatMul -> Softmax -> MatMul with the scale on q in
    its rule `fuse_exmatmul_add_mul_exsoftmax13_exmatmul_to_sdpa` and fails in it (IndexError:
    list index out of range, yolo11n's C2PSA attention). The values differ by float32 rounding.
    Returns how many Muls moved."""
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers = readers_of(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    originals = list(graph.node)
    written: dict[int, list[onnx.NodeProto]] = {}   # id(score MatMul) -> it and the Mul now on its result
    removed = set()
    for node in originals:
        if node.op_type != "MatMul" or [r.op_type for r in readers.get(node.output[0], [])] != ["Softmax"]:
            continue
        for operand in node.input:
            path, source = [], made_by.get(operand)
            while source is not None and source.op_type == "Transpose" and len(readers[source.output[0]]) == 1:
                path.append(source)
                source = made_by.get(source.input[0])
            if source is None or source.op_type != "Mul" or len(readers[source.output[0]]) != 1:
                continue
            scalars = [name for name in source.input
                       if name in constants and int(np.prod(constants[name].dims)) == 1]
            if len(scalars) != 1 or source.input[0] == source.input[1]:
                continue
            first = path[-1] if path else node
            first.input[list(first.input).index(source.output[0])] = next(n for n in source.input if n != scalars[0])
            scores = node.output[0]
            node.output[0] = f"{scores}/unscaled"
            written[id(node)] = [node, helper.make_node("Mul", [node.output[0], scalars[0]], [scores], f"{source.name}/on_scores")]
            removed.add(id(source))
            break
    return nodes_rewritten(graph, originals, written, removed)


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    erf_of_a_quotient,
    scale_after_scores,
    defaults_written,
)
