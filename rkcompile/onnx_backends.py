"""Which ONNX runtime runs a node on the CPU, shared by the compiler and the emulator: the plan
records each CPU step's backend (`cpu_backend`, decided when the plan is assembled) and the
emulator runs the step on it. onnxruntime, the runtime users trust and the one `rkcompile run
--check` compares with, runs what it takes; onnx.reference runs only what onnxruntime cannot (an
op or a type it has no kernel for, or computes against the spec: ONNXRUNTIME_DEVIATIONS).

The answer comes from asking onnxruntime for a session on the node alone (`node_model`), once
per distinct node (`anonymous`); `make_session` is the one way either side makes a session, so
a step decided here runs on the same session options there. Imports neither side: it asks
about the plan layer's plain nodes (rkcompile/plan/plain_nodes.py; the compiler converts its own with
rkcompile.ir.nodes.plain_node).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from rkcompile.plan.plain_nodes import (Constant, Node, expanded_members, is_onnx_domain, node_inputs,
    plain_attribute_key, subgraphs)
from rkcompile.plan.onnx_protos import node_proto, single_node_graph

ONNXRUNTIME = "onnxruntime"
ONNX_REFERENCE = "onnx.reference"
#: the IR version the one-node models declare: one every onnxruntime >= 1.17 reads
NODE_MODEL_IR_VERSION = 9

def node_model(node: Node, input_dtypes: Sequence[np.dtype], opsets: Mapping[str, int],
               input_shapes: Sequence[tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """The node alone as a model: what it reads (`nodes.node_inputs`: its present inputs, then
    what its subgraphs read from outside) typed by element type only, so one session serves any
    shape; its named outputs untyped (onnxruntime infers them). With `input_shapes` the inputs
    are shaped too and onnx's shape inference types the subgraphs' outputs, which onnxruntime
    needs to run a Loop or Scan body (a body rebuilt from a plan names its outputs only)."""
    shapes = input_shapes if input_shapes is not None else [None] * len(input_dtypes)
    inputs: dict[str, onnx.ValueInfoProto] = {}  # once per tensor: x * x reads x twice, a graph defines it once
    for t, dtype, shape in zip(node_inputs(node), input_dtypes, shapes):
        inputs.setdefault(t.name, onnx.helper.make_tensor_value_info(
            t.name, onnx.helper.np_dtype_to_tensor_dtype(dtype), shape))
    outputs = [onnx.helper.make_value_info(t.name, onnx.TypeProto()) for t in node.outputs if t.name]
    graph = onnx.helper.make_graph([node_proto(node)], node.name or "node", list(inputs.values()), outputs)
    imports = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = onnx.helper.make_model(graph, opset_imports=imports, ir_version=NODE_MODEL_IR_VERSION)
    return model if input_shapes is None else onnx.shape_inference.infer_shapes(model)


def make_session(model: onnx.ModelProto):
    """A one-thread CPU onnxruntime session on `model`; raises what onnxruntime raises."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # a refused model is an answer here, not a warning
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def onnxruntime_session(model: onnx.ModelProto):
    """`make_session`, or None when onnxruntime cannot run the model."""
    try:
        return make_session(model)
    except Exception:  # noqa: BLE001  (onnxruntime raises its own classes for every "cannot")
        return None


def cpu_backend(node: Node, opsets: Mapping[str, int]) -> str | None:
    """The backend a CPU step runs on: onnxruntime when it takes the node (every member of a
    fused node) with the types the graph gives, else onnx.reference when it has the op, else
    None: nothing here can run it (`rkcompile run` refuses the plan, naming the op)."""
    members = expanded_members(node)   # a fused member's own members too (a Gemm's exGelu)
    if all(runs_on_onnxruntime(member, opsets) for member in members):
        return ONNXRUNTIME
    if all(reference_has(member, opsets) for member in members):
        return ONNX_REFERENCE
    return None


def onnxruntime_deviates(node: Node) -> bool:
    """Nodes onnxruntime 1.32 runs but computes against the ONNX spec, where onnx's own test
    cases and onnx.reference agree with each other: onnx.reference runs them instead."""
    return any(node.op == op and applies(node) for op, applies in ONNXRUNTIME_DEVIATIONS)


#: (op, the attribute combination onnxruntime gets wrong), each found by onnx's node test cases
ONNXRUNTIME_DEVIATIONS = (
    # test_attention_4d_with_past_and_present_qk_matmul_bias_*_mask_causal: with
    # qk_matmul_output_mode 1 or 2 (after the mask, after the softcap) the qk_matmul_output of
    # a causal Attention comes out without the causal mask's -inf
    ("Attention", lambda node: len(node.outputs) > 3 and bool(node.outputs[3].name)
     and int(node.attrs.get("qk_matmul_output_mode", 0)) != 0),
    # test_maxunpool_export_with_output_shape: given an output_shape larger than the default
    # output, onnxruntime reads the indices as flat positions in that larger output; the spec's
    # expected output (and onnx.reference) reads them as positions in the default output and pads
    ("MaxUnpool", lambda node: len(node.inputs) > 2 and bool(node.inputs[2].name)),
)


def runs_on_onnxruntime(node: Node, opsets: Mapping[str, int]) -> bool:
    if onnxruntime_deviates(node):
        return False
    dtypes = [numpy_dtype(t.dtype) for t in node_inputs(node)]
    # an output's dtype may be unrecorded (a node rebuilt from a plan): onnxruntime infers it;
    # `is None`, as numpy's float64 dtype equals None (np.dtype(None) is float64)
    if any(dtype is None for dtype in dtypes) or any(
            t.name and t.dtype is not None and numpy_dtype(t.dtype) is None for t in node.outputs):
        return False
    key = anonymous_key(node, dtypes, opsets)
    answer = _ONNXRUNTIME_TAKES_BY_KEY.get(key) if key is not None else None
    if answer is not None:
        return answer
    try:
        model = node_model(node, dtypes, opsets)
    except (TypeError, ValueError):  # an attribute ONNX cannot hold
        answer = False
    else:
        if subgraphs(node):  # its subgraphs name outer tensors: renamed, the model would not be the same
            return onnxruntime_session(model) is not None
        signature = anonymous(model).SerializeToString()
        answer = _ONNXRUNTIME_TAKES.get(signature)
        if answer is None:
            answer = _ONNXRUNTIME_TAKES[signature] = onnxruntime_session(model) is not None
    if key is not None:
        _ONNXRUNTIME_TAKES_BY_KEY[key] = answer
    return answer


#: onnxruntime's answer per anonymous one-node model (`anonymous`), for this process: a plan asks
#: about every CPU node, and tv_ssdlite320_mobilenet_v3_large's 1,586 CPU steps are 123 distinct
#: nodes (a session each took 1.5 s of its plan on the loaded test machine, 0.5 s now)
_ONNXRUNTIME_TAKES: dict[bytes, bool] = {}
#: the same answers per `anonymous_key`, which names the anonymous model without building it
#: (building and serializing one per CPU step was 0.3 s of tv_ssdlite320's plan)
_ONNXRUNTIME_TAKES_BY_KEY: dict[tuple, bool] = {}
#: (ai.onnx op, tensor attribute) whose element values never decide whether onnxruntime takes the
#: node, only the tensor's dtype and shape: ConstantOfShape's kernel checks that its value is one
#: element of a type it has (exporters make one per fill value: 90 of tv_ssdlite320's 122
#: distinct CPU nodes). Should it ever refuse one, `CpuRuntime.run` falls back to onnx.reference
#: and says so.
_VALUE_BLIND_TENSOR_ATTRIBUTES = frozenset({("ConstantOfShape", "value")})


def anonymous_key(node: Node, dtypes: Sequence[np.dtype], opsets: Mapping[str, int],
                  value_blind: bool = True) -> tuple | None:
    """What `anonymous(node_model(node, dtypes, opsets))` is made of, as a hashable key, read off
    the node itself: its op and domain, the opsets, where each input and output name first
    appears among the node's inputs then outputs (so which of them are omitted, and which read
    one tensor twice), the input dtypes, and the attributes by name, type and exact value. A
    tensor attribute counts by what its export writes except its name (which `anonymous` leaves
    out), and except its element values where those never decide whether onnxruntime takes the
    node (_VALUE_BLIND_TENSOR_ATTRIBUTES), unless `value_blind` is False: then two nodes of one
    key compute the same function, and may share a session (`CpuRuntime.run`).
    Two nodes of one key make the same anonymous model, so they get the same answer; the key
    may tell apart models that serialize alike (float attributes by repr, not as float32),
    which only costs a second look. None for a node with subgraphs, or an attribute of
    another kind (asked about as before)."""
    attributes = []
    for name, value in node.attrs.items():
        plain = plain_attribute_key(name, value)
        if plain is not None:
            attributes.append(plain)
        elif isinstance(value, Constant):
            array = np.asarray(value.values)
            if array.dtype.kind not in "biufc":  # strings: their bytes would be pointers
                return None
            blind = value_blind and (node.op, name) in _VALUE_BLIND_TENSOR_ATTRIBUTES and is_onnx_domain(node)
            stored = b"" if blind else array.tobytes()
            attributes.append((name, Constant, array.dtype.str, array.shape, stored))
        else:
            return None
    positions: dict[str, int] = {"": -1}
    wiring = tuple(positions.setdefault(t.name, len(positions)) for t in (*node.inputs, *node.outputs))
    return (node.op, node.domain, tuple(opsets.items()), len(node.inputs), wiring,
            tuple(dtype.str for dtype in dtypes), tuple(attributes))


def anonymous(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (a `node_model` of a node without subgraphs, changed in place) with its graph,
    its node and its tensors renamed by position, and its tensor attributes' names (exporters
    name ConstantOfShape's value after the node) left out. Whether onnxruntime builds a session
    on a model depends on its ops, attributes, types, opsets and the way tensors connect, which
    this keeps, never on the names themselves: two nodes whose anonymous models serialize alike
    get the same answer."""
    graph = model.graph
    node = graph.node[0]
    positions = anonymous_names(node.input, node.output)
    for value in (*graph.input, *graph.output):
        value.name = positions[value.name]
    node.input[:] = [positions[name] for name in node.input]
    node.output[:] = [positions[name] for name in node.output]
    node.name = graph.name = "node"
    for attribute in node.attribute:
        for tensor in ([attribute.t] if attribute.HasField("t") else []) + list(attribute.tensors):
            tensor.ClearField("name")
    return model


def anonymous_names(inputs: Sequence[str], outputs: Sequence[str]) -> dict[str, str]:
    """A node's tensor names, each renamed by where it first appears among its inputs and then
    its outputs ("t0", "t1", ...); an omitted optional one ('') stays omitted."""
    positions = {"": ""}
    for name in (*inputs, *outputs):
        positions.setdefault(name, f"t{len(positions) - 1}")
    return positions


def reference_has(node: Node, opsets: Mapping[str, int]) -> bool:
    """Whether onnx.reference has an implementation for the node (it looks them up when built)."""
    from onnx.reference import ReferenceEvaluator

    try:
        ReferenceEvaluator(single_node_graph(node), opsets=dict(opsets))
    except Exception:  # noqa: BLE001  (it raises RuntimeError and its own classes for a missing op)
        return False
    return True


def numpy_dtype(dtype) -> np.dtype | None:
    """`dtype` when onnxruntime's Python API exchanges it (numpy's own bool, integer, float and
    complex types, and strings as object arrays), else None: it has no numpy type for bfloat16,
    the float8s or int4, and the graph leaves the type unknown (None) or as onnx's enum when
    numpy has none."""
    try:
        dtype = np.dtype(dtype) if dtype is not None and not isinstance(dtype, int) else None
    except TypeError:
        return None
    native = dtype is not None and dtype.kind in "biufcO" and dtype.type.__module__ == "numpy"  # not ml_dtypes'
    return dtype if native else None
