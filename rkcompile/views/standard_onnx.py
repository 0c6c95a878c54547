"""The planned graph as standard ONNX, for other compilers (rknn-toolkit2) to build: `rkcompile export`.

Built from the plan alone, as the partitioned ONNX is (partitioned_onnx.py): the steps in order,
each from its node (`rkcompile.api.Plan.reference_nodes`, the model's own weights). The steps
are the graph the pipeline holds after its rewrite passes (folded, simplified, legalized: what
`--dump-after rewrite_late` writes); the passes after those place, order and lay out the nodes
and change none but by adding host conversions. So the file is that graph in plain ONNX: a
fused kernel is written back as its members, the host conversions (storage changes ONNX does
not model) are left out, and an opset above what the toolkit reads is converted down (an op
the converter cannot take down first written in older ops: OLDER_FORMS, which also write an op
the rewrites made that the model's own opset lacks). Then
TOOLKIT_SHAPINGS (toolkit_shapings/, by family) rewrite, keeping the values, the forms rknn-toolkit2
2.5.0 fails on, loops on or runs on its CPU into forms it builds on its NPU (docs/deploy.md
lists them), and an int8 plan's quantization is written as QDQ pairs (qdq.py).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from rkcompile.errors import CompileError
from rkcompile.plan.plain_nodes import Node, fused_body
from rkcompile.plan.schema import QUANTIZED_DTYPES, PlanRecord, TensorSpec
from rkcompile.views.partitioned_onnx import plain_steps, proto_subgraphs
from rkcompile.views.host_tail import HostTail, find_host_tail, reads
from rkcompile.views.proto_graph import drop_unread_initializers, drop_unread_nodes, nodes_within, readers_of
from rkcompile.views.qdq import MIN_QDQ_OPSET, quantize_dequantize
from rkcompile.views.toolkit_shapings import (TOOLKIT_SHAPINGS, added_convs_as_one, channel_norms_as_layer_norms,
                                              linear_layers_as_gemms, mean_biases_apart, small_planes_into_channels)
from rkcompile.views.toolkit_shapings.common import torch_layer_norm


#: the newest ai.onnx opset an export is written in (issue 37: what rknn-toolkit2 2.5.0 is made for);
#: a newer model is converted down
MAX_OPSET = 19


#: the domains of the ONNX standard (ai.onnx under its two names, and the ML operators)
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


@dataclasses.dataclass(frozen=True)
class StandardExport:
    """What `standard_model` writes: the model for rknn-toolkit2 (`model`), how many nodes each
    reshaping for it changed (`shaped`), with a host tail (`host_tail=True` on a graph with
    data-dependent shapes, or with an output the toolkit would reshape on its CPU) the host part
    for onnxruntime (`host`) and where the cut is (`cut`),
    and the tensors whose size the data first decides (`data_dependent`, host tail or not)."""

    model: onnx.ModelProto
    shaped: dict[str, int]
    host: onnx.ModelProto | None = None
    cut: HostTail | None = None
    data_dependent: tuple[str, ...] = ()


def standard_model(plan: PlanRecord, nodes: Sequence[Node], max_opset: int = MAX_OPSET,
                   weight_integers: Mapping[str, np.ndarray] | None = None,
                   host_tail: bool = False) -> StandardExport:
    """The plan's graph as a standard ONNX model, with how many nodes each reshaping for
    rknn-toolkit2 changed (TOOLKIT_SHAPINGS, each exact); `nodes` are the plan's step nodes in
    step order. With `weight_integers` (an int8 plan's quantized weights as its weight region
    stores them, by name) the model carries the plan's quantization as QuantizeLinear and
    DequantizeLinear pairs (`quantize_dequantize`), in opset MIN_QDQ_OPSET at least.

    A graph with outputs of data-dependent shape (views/host_tail.py) is refused unless
    `host_tail` (one with such tensors inside only is written whole, which the toolkit fails
    on); with `host_tail`, `model` is its static NPU part, whose outputs are the model outputs
    it makes and the tensors the host part reads, and `host` the rest, in the model's own opset,
    whose inputs are the model inputs it reads and then the NPU part's outputs, and whose
    outputs are all the model's outputs (one the NPU part makes passes through). A static graph
    gets a host part with `host_tail` only for the Reshapes into its outputs that rknn-toolkit2
    would run on its CPU (`_trailing_layout_to_host`); without one, `host` is None."""
    members, weights = plain_steps(plan, nodes)
    for proto in (proto for protos in members.values() for proto in protos):
        _refuse_custom_domain(proto)
    found = find_host_tail(plan, members)
    if found.steps and not host_tail and any(d < 0 for spec in plan.model.outputs
                                             for d in _planned_shape(spec, plan).shape):
        name = found.first_dynamic[0]
        shape = plan.tensors[name].shape
        raise CompileError(f"{name} has a shape the data decides ({'unknown' if shape is None else list(shape)}; "
                           "rknn-toolkit2 builds static shapes only): export with --host-tail to write the graph "
                           "before it for the toolkit and the rest for onnxruntime on the host (docs/deploy.md)")
    cut = found if host_tail else HostTail(frozenset(), (), ())
    npu_protos = [proto for step in plan.steps if step.id not in cut.steps for proto in members.get(step.id, ())]
    host_protos = [proto for step in plan.steps if step.id in cut.steps for proto in members.get(step.id, ())]
    opsets = _opset_imports(plan, npu_protos)
    name = plan.model.path.rsplit("/", 1)[-1].removesuffix(".onnx")
    made = {output for proto in npu_protos for output in proto.output}
    outputs = [_value_info(_planned_shape(spec, plan)) for spec in plan.model.outputs
               if not cut.steps or spec.name in made]
    host = None
    if host_tail:
        host_reads = reads(host_protos)
        boundary = [output for proto in npu_protos for output in proto.output
                    if output in host_reads and output not in {spec.name for spec in plan.model.outputs}]
        types = _element_types(npu_protos, plan, weights, opsets)
        outputs += [helper.make_tensor_value_info(tensor, types[tensor], list(plan.tensors[tensor].shape))
                    for tensor in boundary]
        host = _checked(_model(helper.make_graph(
            host_protos, f"{name}_host",
            [*(_value_info(spec) for spec in plan.model.inputs if spec.name in host_reads),
             *outputs],
            [_value_info(spec, dynamic=True) for spec in plan.model.outputs],
            [tensor for tensor_name, tensor in weights.items() if tensor_name in host_reads]),
            _opset_imports(plan, host_protos)))
    model = _model(helper.make_graph(
        npu_protos, name, [_value_info(spec) for spec in plan.model.inputs], outputs,
        [tensor for tensor_name, tensor in weights.items() if tensor_name in reads(npu_protos)]), opsets)
    _write_older_forms(model.graph, min(plan.model.opset, max_opset), plan)
    if plan.model.opset > max_opset:
        model = _converted(model, plan.model.opset, max_opset)
    elif weight_integers is not None and plan.model.opset < MIN_QDQ_OPSET:
        model = _converted(model, plan.model.opset, MIN_QDQ_OPSET)
    shaped = {shaping.__name__: shaping(model) if weight_integers is None or shaping not in WEIGHT_WRITING_SHAPINGS
              else 0 for shaping in TOOLKIT_SHAPINGS}
    drop_unread_nodes(model.graph)
    if weight_integers is not None:
        quantize_dequantize(model, plan, weight_integers)
    if host is not None:
        moved = _trailing_layout_to_host(model, host)
        cut = dataclasses.replace(cut, moved=(*cut.moved, *moved))
        if moved:
            host = _checked(host)
        elif not cut.steps:
            host = None   # a static graph has a host part only for the outputs the toolkit would end on its CPU
    return StandardExport(_checked(model), shaped, host, cut if host is not None else None, found.first_dynamic)


#: the shapings that write weights or biases of their own (the sum of two Convs' weights, a
#: Conv's weight as a Gemm's, a one-channel Conv's bias as an Add, a Conv's weights spread over
#: its output positions, a LayerNormalization's unit scale): an int8 export leaves them out, as
#: the plan's stored integers would not reach those weights, and rknn-toolkit2 2.5.0 fails to
#: build an int8 layer with a float weight
#: ("Invalid w_par['dtype'] = float16": timm_repvit_m0_9's two classifier heads; yolo11n_obb's
#: one-channel angle head Conv)
WEIGHT_WRITING_SHAPINGS = frozenset({added_convs_as_one, channel_norms_as_layer_norms, linear_layers_as_gemms,
                                     mean_biases_apart, small_planes_into_channels})

#: ops that only regroup or join values, which the NPU part's last steps hand to the host part
TRAILING_LAYOUT = frozenset({"Reshape", "Concat"})

#: rknn-toolkit2 2.5.0 runs on its CPU a Reshape writing an output of rank 2 or 3 whose last axis
#: merges a 4-D input's H*W when that length is not a multiple of this (a YOLO head at 320x320:
#: [1, 84, 1, 2100] into [1, 84, 2100]; 8400 boxes at 640x640 stay on its NPU)
TOOLKIT_ROW_ALIGNMENT = 8


def _trailing_layout_to_host(model: onnx.ModelProto, host: onnx.ModelProto) -> list[str]:
    """Move the NPU part's last nodes that only regroup or join 4-D tensors (TRAILING_LAYOUT)
    into cut tensors (outputs of the NPU part `model` that only the host part `host` reads, no
    model output) to the start of the host part, last first so that a chain of them goes: the
    NPU part writes the 4-D tensors they read, in place of their results. rknn-toolkit2 2.5.0
    runs on its CPU a Reshape that writes an output of rank 2 or 3, and a Reshape that splits
    the channels of [1, H, W, A*K] into [1, H*W*A, 1, K] (a detector head's anchors and classes,
    at 10x10 and smaller; the Concat of the levels is the Reshapes' only reader); in the host
    part they are a copy at most. A Reshape writing a model output goes too where the toolkit
    would run it on its CPU (`_rows_off_the_toolkit_grid`), alone: the 4-D tensor it reads, the
    NPU part's output in its place, the toolkit keeps on its NPU. Returns the names of the nodes
    moved."""
    inferred = {value.name: value for value in onnx.shape_inference.infer_shapes(model).graph.value_info}
    known = {**inferred, **{value.name: value for value in model.graph.output}}
    constants = {tensor.name: tensor for tensor in model.graph.initializer}
    model_inputs = {value.name for value in model.graph.input}
    host_outputs = {value.name for value in host.graph.output}
    opset = next(entry.version for entry in host.opset_import if entry.domain in ("", "ai.onnx"))
    cut = [value.name for value in model.graph.output]   # the NPU part's outputs, all read by the host part
    ending_outputs: set[str] = set()   # what a model output's moved Reshape reads: the NPU part writes it

    def shape(name: str) -> list[int] | None:
        dims = known[name].type.tensor_type.shape.dim if name in known else ()
        return [d.dim_value for d in dims] if all(d.HasField("dim_value") for d in dims) else None

    def four_d(name: str) -> bool:
        return len(shape(name) or ()) == 4

    moved = []
    for node in reversed(list(model.graph.node)):
        sources = [name for name in node.input if name and name not in constants]
        writes_output = any(name in host_outputs for name in node.output)
        if node.op_type not in TRAILING_LAYOUT or (node.op_type == "Reshape" and opset < 5) \
                or any(name not in cut or name in ending_outputs for name in node.output) \
                or (writes_output and not _rows_off_the_toolkit_grid(node, shape)) \
                or any(name in reads(model.graph.node) for name in node.output) \
                or not all(four_d(name) and name not in model_inputs for name in sources):
            continue
        if writes_output:
            ending_outputs.update(sources)
        at = cut.index(node.output[0])
        cut = [name for name in cut if name not in node.output]
        cut[at:at] = [name for name in dict.fromkeys(sources) if name not in cut]
        host.graph.initializer.extend(constants[name] for name in node.input if name in constants
                                      and name not in {tensor.name for tensor in host.graph.initializer})
        host_nodes = [onnx.NodeProto(), *host.graph.node]
        host_nodes[0].CopyFrom(node)
        del host.graph.node[:]
        host.graph.node.extend(host_nodes)
        moved.append(node.name)
        model.graph.node.remove(node)
    if moved:
        values = [known[name] for name in cut]
        read_inputs = [value for value in host.graph.input if value.name not in known]
        del model.graph.output[:]
        model.graph.output.extend(values)
        del host.graph.input[:]
        host.graph.input.extend([*read_inputs, *values])
    return list(reversed(moved))


def _rows_off_the_toolkit_grid(node: onnx.NodeProto, shape: Callable[[str], list[int] | None]) -> bool:
    """Whether `node` is a Reshape of a 4-D [N, C, H, W] (static `shape`s) into rank 2 or 3 whose
    last axis is H*W, a length not a multiple of TOOLKIT_ROW_ALIGNMENT: rknn-toolkit2 2.5.0
    holds the tensor 4-D and runs that Reshape, ending an output, on its CPU."""
    source, written = shape(node.input[0]), shape(node.output[0])
    if node.op_type != "Reshape" or source is None or written is None or len(source) != 4:
        return False
    merged = source[2] * source[3]
    return len(written) in (2, 3) and written[-1] == merged and merged % TOOLKIT_ROW_ALIGNMENT != 0


def _opset_imports(plan: PlanRecord, protos: Sequence[onnx.NodeProto]) -> list[onnx.OperatorSetIdProto]:
    """The model's standard opsets the nodes use, ai.onnx first: rknn-toolkit2 takes the first
    opset import for the model's opset (an unused ai.onnx.ml 2 first, from tf2onnx, has it
    convert the graph "to opset 2" and fail: `No Adapter To Version $12 for Reshape`)."""
    used = {node.domain or "ai.onnx" for node in nodes_within(protos)}
    return sorted((helper.make_opsetid(domain, version) for domain, version in plan.model.opsets.items()
                   if domain in STANDARD_DOMAINS and (domain or "ai.onnx") in used | {"ai.onnx"}),
                  key=lambda opset: opset.domain not in ("", "ai.onnx"))


def _model(graph: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto]) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=opsets, producer_name="rkcompile export")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _element_types(protos: Sequence[onnx.NodeProto], plan: PlanRecord, weights: Mapping[str, onnx.TensorProto],
                   opsets: list[onnx.OperatorSetIdProto]) -> dict[str, int]:
    """The ONNX element type of each tensor `protos` write, by onnx's inference from the model's
    inputs (the plan's dtype is the NPU's storage, float16 for a float32 tensor). Ops newer than
    the model's opset (OLDER_FORMS) are inferred in their older forms, as they are written: onnx
    infers nothing for an op its opset does not have."""
    read = reads(protos)
    graph = helper.make_graph(protos, "types", [_value_info(spec) for spec in plan.model.inputs], [],
                              [tensor for name, tensor in weights.items() if name in read])
    _write_older_forms(graph, plan.model.opset, plan)
    inferred = onnx.shape_inference.infer_shapes(_model(graph, opsets))
    return {value.name: value.type.tensor_type.elem_type for value in inferred.graph.value_info}


def _converted(model: onnx.ModelProto, opset: int, wanted: int) -> onnx.ModelProto:
    try:
        return version_converter.convert_version(model, wanted)
    except Exception as exc:  # noqa: BLE001  (the converter raises RuntimeError, ValueError, its own)
        raise CompileError(f"cannot convert the exported graph from opset {opset} to {wanted}: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    drop_unread_initializers(model.graph)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise CompileError(f"the exported graph is not valid ONNX: {str(exc).splitlines()[0]}") from None
    return model


def _gelu_older_form(node: onnx.NodeProto, rank: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """Gelu (opset 20) as the nodes it stands for: x/2 * (1 + erf(x / sqrt(2))), the scaling a
    Div (the form rknn-toolkit2 fuses into its GELU), or with approximate="tanh"
    x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    prefix, x = node.name or node.output[0], node.input[0]
    approximate = next((a.s.decode() for a in node.attribute if a.name == "approximate"), "none")
    constants = {what: numpy_helper.from_array(np.array(value, np.float32), f"{prefix}/{what}")
                 for what, value in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5),
                                     ("cubic", 0.044715), ("sqrt_2_over_pi", np.sqrt(2.0 / np.pi)))}
    name = {what: tensor.name for what, tensor in constants.items()}
    if approximate == "tanh":
        nodes = [helper.make_node("Mul", [x, x], [f"{prefix}/square"], f"{prefix}/square"),
                 helper.make_node("Mul", [f"{prefix}/square", x], [f"{prefix}/cube"], f"{prefix}/cube"),
                 helper.make_node("Mul", [f"{prefix}/cube", name["cubic"]], [f"{prefix}/cubic_term"],
                                  f"{prefix}/cubic_term"),
                 helper.make_node("Add", [x, f"{prefix}/cubic_term"], [f"{prefix}/inner"], f"{prefix}/inner"),
                 helper.make_node("Mul", [f"{prefix}/inner", name["sqrt_2_over_pi"]], [f"{prefix}/scaled"],
                                  f"{prefix}/scaled"),
                 helper.make_node("Tanh", [f"{prefix}/scaled"], [f"{prefix}/curve"], f"{prefix}/tanh")]
    else:
        nodes = [helper.make_node("Div", [x, name["sqrt2"]], [f"{prefix}/scaled"], f"{prefix}/scaled"),
                 helper.make_node("Erf", [f"{prefix}/scaled"], [f"{prefix}/curve"], f"{prefix}/erf")]
    nodes += [helper.make_node("Add", [f"{prefix}/curve", name["one"]], [f"{prefix}/gate"], f"{prefix}/gate"),
              helper.make_node("Mul", [x, f"{prefix}/gate"], [f"{prefix}/gated"], f"{prefix}/gated"),
              helper.make_node("Mul", [f"{prefix}/gated", name["half"]], [node.output[0]], f"{prefix}/half")]
    read = {name for new in nodes for name in new.input}
    return [tensor for tensor in constants.values() if tensor.name in read], nodes


def _layer_normalization_older_form(node: onnx.NodeProto,
                                    rank: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """LayerNormalization (opset 17) of an input of `rank` as the nodes torch writes below it,
    which rknn-toolkit2 fuses into its exNorm: (x - mean) / sqrt(mean((x - mean)^2) + epsilon)
    * scale + bias over the axes from `axis` on. The plan makes it only where its Y output alone
    is read (fusion_table's exNorm), so Mean and InvStdDev are not written."""
    x, scale, *bias = [name for name in node.input if name]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis, epsilon = attributes.get("axis", -1), attributes.get("epsilon", 1e-5)
    prefix = node.name or node.output[0]
    return torch_layer_norm(x, range(axis % rank, rank), epsilon, node.output[0], prefix, scale,
                            bias[0] if bias else None)


#: ops a newer opset introduced, which onnx's version converter cannot take down (it knows no
#: previous version) and which a plan may hold in an older model (LayerNormalization, which the
#: rewrites make for exNorm below opset 17), by the opset that introduced them, and their form in
#: older ops
OLDER_FORMS = {"Gelu": (20, _gelu_older_form), "LayerNormalization": (17, _layer_normalization_older_form)}


def _write_older_forms(graph: onnx.GraphProto, opset: int, plan: PlanRecord) -> None:
    """Replace each node of `graph` whose op is newer than `opset` and in OLDER_FORMS by its
    older form (given its data's rank in `plan`, read from its output: the input of a fused
    member is no tensor of the plan), for the version converter to take the rest down."""
    nodes = []
    for node in graph.node:
        since, older_form = OLDER_FORMS.get(node.op_type, (0, None))
        if older_form is None or node.domain not in ("", "ai.onnx") or since <= opset:
            nodes.append(node)
            continue
        constants, replacement = older_form(node, len(plan.tensors[node.output[0]].shape))
        graph.initializer.extend(constants)
        nodes.extend(replacement)
    del graph.node[:]
    graph.node.extend(nodes)


def _refuse_custom_domain(node: onnx.NodeProto) -> None:
    """A node of a domain other than ONNX's, at any depth of its subgraphs, cannot be written as
    standard ONNX (the toolkit knows no custom op)."""
    if node.domain not in STANDARD_DOMAINS:
        raise CompileError(f"node {node.name} is {node.domain}::{node.op_type}, not a standard ONNX op: "
                           "the graph cannot be exported as standard ONNX")
    for graph in proto_subgraphs(node):
        for inner in graph.node:
            _refuse_custom_domain(inner)


def _planned_shape(spec: TensorSpec, plan: PlanRecord) -> TensorSpec:
    """An output declared with a dynamic dim (a symbolic batch left by the exporter) as the shape
    the plan computed for it from the static inputs: rknn-toolkit2 needs every output static."""
    placement = plan.tensors.get(spec.name)
    if placement is None or placement.shape is None or any(d < 0 for d in placement.shape) \
            or len(placement.shape) != len(spec.shape):
        return spec
    return dataclasses.replace(spec, shape=tuple(placement.shape))


def _value_info(spec: TensorSpec, dynamic: bool = False) -> onnx.ValueInfoProto:
    """`spec` as a graph input or output; a dim of unknown extent only where `dynamic`."""
    if not dynamic and any(d < 0 for d in spec.shape):
        raise CompileError(f"{spec.name} has the dynamic shape {list(spec.shape)}: the export needs static shapes "
                           "(fix it with --input-shape)")
    return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)),
                                         [None if d < 0 else d for d in spec.shape])


def export_summary(plan: PlanRecord, nodes: Sequence[Node], model: onnx.ModelProto) -> dict:
    """What the export report says of the graph: the rewrites the plan applied, the fused kernels
    written back as their members, the nodes the plan runs on the CPU and why, the layers
    rknn-toolkit2 adds on its CPU (`toolkit_input_reshapes`), the opsets, and the op counts of
    the file."""
    fused = Counter(step.kernel for step, node in zip(plan.steps, nodes) if fused_body(node) is not None)
    return {
        "opset": {"model": plan.model.opset, "export": next(o.version for o in model.opset_import
                                                            if o.domain in ("", "ai.onnx"))},
        "nodes": {"model": len(plan.nodes), "export": len(model.graph.node)},
        "folded_or_removed": sum(entry.device in ("folded", "removed") for entry in plan.nodes),
        "rewrites": [{"rule": rewrite.rule, "nodes": list(rewrite.nodes), "into": list(rewrite.into),
                      "ops": list(rewrite.ops)} for rewrite in plan.rewrites],
        "fused_kernels_written_back": dict(sorted(fused.items())),
        "cpu_nodes": [{"name": entry.name, "op": entry.op, "reason": entry.reason}
                      for entry in plan.nodes if entry.device == "cpu"],
        "toolkit_input_reshapes": toolkit_input_reshapes(model),
        "op_types": dict(sorted(Counter(node.op_type for node in model.graph.node).items())),
        **({"quantization": _quantization_summary(plan, model)} if plan.dtype in QUANTIZED_DTYPES else {}),
    }


def toolkit_input_reshapes(model: onnx.ModelProto) -> list[dict]:
    """The int64 inputs of rank below 4 that rknn-toolkit2 2.5.0 reshapes to 4-D on its CPU
    itself, one layer each beyond the plan's CPU nodes: its `unsqueeze_to_4d_*` rules give every
    op it runs a 4-D operand, and it runs int64 on its CPU (a transformer's [1, L] attention
    mask read by a Cast: the layer `attention_mask_rs`; by an Equal, the same). An input read only
    as a Gather's indices (the token ids) it leaves as it is."""
    readers = readers_of(model.graph)
    found = []
    for value in model.graph.input:
        tensor = value.type.tensor_type
        reading = [node for node in readers.get(value.name, [])
                   if not (node.op_type == "Gather" and list(node.input).index(value.name) == 1)]
        if tensor.elem_type == onnx.TensorProto.INT64 and len(tensor.shape.dim) < 4 and reading:
            found.append({"input": value.name, "read_by": [node.name for node in reading]})
    return found


def _quantization_summary(plan: PlanRecord, model: onnx.ModelProto) -> dict:
    """What an int8 export carries: the activations written as QuantizeLinear/DequantizeLinear
    pairs, the weights read through a DequantizeLinear, and the NPU tensors the plan computes
    in float16, left without a pair (its techniques say why: --float16, --auto-float16, a
    Softmax output)."""
    constants = {tensor.name for tensor in model.graph.initializer}
    return {
        "activations": sum(node.op_type == "QuantizeLinear" for node in model.graph.node),
        "weights": sum(node.op_type == "DequantizeLinear" and node.input[0] in constants for node in model.graph.node),
        "float16_tensors": sorted(name for name, tensor in plan.tensors.items()
                                  if tensor.dtype == "float16" and tensor.region != "weight"),
    }


def host_tail_summary(plan: PlanRecord, written: StandardExport, path: str) -> dict:
    """What the report says of a host tail: its file, the tensors where the graph is cut (each
    with its shape and the node of the NPU part that makes it), the tensors whose shape the data
    first decides, the nodes that pick entries by value where the host part starts as well
    (views/host_tail.py's SELECTIONS), the static nodes moved to the host part (views/host_tail.py), the nodes the
    plan runs on the CPU left in the NPU part, and the host part's op counts."""
    made_by = {output: node.name for node in written.model.graph.node for output in node.output}
    inputs = {spec.name for spec in plan.model.inputs}
    return {
        "path": path,
        "cut": [{"tensor": value.name, "shape": [d.dim_value for d in value.type.tensor_type.shape.dim],
                 "made_by": made_by.get(value.name)}
                for value in written.host.graph.input if value.name not in inputs],
        "data_dependent_from": list(written.cut.first_dynamic),
        "selections_from": list(dict.fromkeys(written.cut.selections)),
        "static_nodes_moved_to_host": list(dict.fromkeys(written.cut.moved)),
        "cpu_nodes_in_npu_part": list(dict.fromkeys(name for step in plan.steps if step.device == "cpu"
                                                    and step.id not in written.cut.steps for name in step.nodes)),
        "nodes": {"npu_part": len(written.model.graph.node), "host": len(written.host.graph.node)},
        "host_op_types": dict(sorted(Counter(node.op_type for node in written.host.graph.node).items())),
    }
