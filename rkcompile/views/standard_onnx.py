"""The planned graph as standard ONNX, for other compilers (rknn-toolkit2) to build: `rkcompile export`.

Built from the plan alone, as the partitioned ONNX is (partitioned_onnx.py): the steps in order,
each from its node (`rkcompile.api.Plan.reference_nodes`, the model's own weights). The steps
are the graph the pipeline holds after its rewrite passes (folded, simplified, legalized: what
`--dump-after rewrite_late` writes); the passes after those place, order and lay out the nodes
and change none but by adding host conversions. So the file is that graph in plain ONNX: a
fused kernel is written back as its members, the host conversions (storage changes ONNX does
not model) are left out, and an opset above what the toolkit reads is converted down (an op
the converter cannot take down first written in older ops: OLDER_FORMS). Then
TOOLKIT_SHAPINGS rewrite, keeping the values, the forms rknn-toolkit2 2.5.0 fails on, loops on
or runs on its CPU into forms it builds on its NPU (docs/deploy.md lists them).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from rkcompile.errors import CompileError
from rkcompile.plan.plain_nodes import Node, fused_body
from rkcompile.plan.schema import QUANTIZED_DTYPES, PlanRecord, Quantization, TensorSpec
from rkcompile.views.partitioned_onnx import host_renames, plain_steps, proto_subgraphs, rename_tensors

#: the newest ai.onnx opset an export is written in (issue 37: what rknn-toolkit2 2.5.0 is made for);
#: a newer model is converted down
MAX_OPSET = 19
#: the oldest ai.onnx opset a quantized export is written in: QuantizeLinear and DequantizeLinear
#: take a per-channel scale (`axis`) from opset 13; an older model is converted up
MIN_QDQ_OPSET = 13
INT32 = np.iinfo(np.int32)
#: the largest int8 weight, the one a constant weight is stored as (symmetric grids)
WEIGHT_INT8_MAX = 127
#: the domains of the ONNX standard (ai.onnx under its two names, and the ML operators)
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def standard_model(plan: PlanRecord, nodes: Sequence[Node], max_opset: int = MAX_OPSET,
                   weight_integers: Mapping[str, np.ndarray] | None = None) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The plan's graph as a standard ONNX model, and how many nodes each reshaping for
    rknn-toolkit2 changed (TOOLKIT_SHAPINGS, each exact); `nodes` are the plan's step nodes in
    step order. With `weight_integers` (an int8 plan's quantized weights as its weight region
    stores them, by name) the model carries the plan's quantization as QuantizeLinear and
    DequantizeLinear pairs (`quantize_dequantize`), in opset MIN_QDQ_OPSET at least."""
    members, weights = plain_steps(plan, nodes)
    protos = [proto for step in plan.steps for proto in members.get(step.id, ())]
    for proto in protos:
        _refuse_custom_domain(proto)
    read = {name for proto in protos for name in proto.input}
    graph = helper.make_graph(
        protos, plan.model.path.rsplit("/", 1)[-1].removesuffix(".onnx"),
        [_value_info(spec) for spec in plan.model.inputs],
        [_value_info(_planned_shape(spec, plan)) for spec in plan.model.outputs],
        [tensor for name, tensor in weights.items() if name in read])
    # ai.onnx first, and only the domains the nodes use: rknn-toolkit2 takes the first opset
    # import for the model's opset (an unused ai.onnx.ml 2 first, from tf2onnx, has it convert
    # the graph "to opset 2" and fail: `No Adapter To Version $12 for Reshape`)
    used = {node.domain or "ai.onnx" for node in _all_nodes(graph)} | {"ai.onnx"}
    opsets = sorted((helper.make_opsetid(domain, version) for domain, version in plan.model.opsets.items()
                     if domain in STANDARD_DOMAINS and (domain or "ai.onnx") in used),
                    key=lambda opset: opset.domain not in ("", "ai.onnx"))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="rkcompile export")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    if plan.model.opset > max_opset:
        _write_older_forms(model.graph, max_opset)
        model = _converted(model, plan.model.opset, max_opset)
    elif weight_integers is not None and plan.model.opset < MIN_QDQ_OPSET:
        model = _converted(model, plan.model.opset, MIN_QDQ_OPSET)
    shaped = {shaping.__name__: shaping(model) for shaping in TOOLKIT_SHAPINGS}
    _drop_unread_nodes(model.graph)
    if weight_integers is not None:
        quantize_dequantize(model, plan, weight_integers)
    return _checked(model), shaped


def _converted(model: onnx.ModelProto, opset: int, wanted: int) -> onnx.ModelProto:
    try:
        return version_converter.convert_version(model, wanted)
    except Exception as exc:  # noqa: BLE001  (the converter raises RuntimeError, ValueError, its own)
        raise CompileError(f"cannot convert the exported graph from opset {opset} to {wanted}: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def quantize_dequantize(model: onnx.ModelProto, plan: PlanRecord, weight_integers: Mapping[str, np.ndarray]) -> None:
    """Write the int8 plan's quantization into `model` in the QDQ form (ONNX's
    QuantizeLinear/DequantizeLinear pairs, which rknn-toolkit2 builds without calibrating):

    - each quantized weight becomes its stored integers (int8, a convolution's bias int32), read
      through a DequantizeLinear with the plan's scales and zero points (per output channel,
      axis 0, where the plan has one per channel), so the weights are the plan's: after
      equalization and bias correction, rounded as the plan rounded them;
    - each int8 activation the plan stores (a step's output, a model input's NPU copy) is written
      as a QuantizeLinear with its scale and zero point, and each reader reads it through a
      DequantizeLinear of its own. rknn-toolkit2 2.5.0 converts a dequantized tensor to float16
      for a reader it runs in float16 (a Conv and the Add after it, which it fuses into a float16
      ConvAdd where the file has no pair between them), and then hands that float16 tensor to
      every reader of the same DequantizeLinear: an int8 Conv among them fails to build
      ("Invalid w_par['dtype'] = float16", lraspp_mobilenet_v3_large);
    - the tensors an int8 plan keeps in float16 (its float16 islands: --float16, --auto-float16,
      a Softmax output) and those the CPU computes get no pair, so they stay float.

    The members of a fused kernel write no pair between them, as the plan stores none: the
    toolkit fuses them again. The tensors are renamed as the export renames them (the host
    conversions left out, `host_renames`)."""
    graph = model.graph
    renames = host_renames(plan)
    activations: dict[str, Quantization] = {}
    for name, quant in plan.quantization.items():
        placed = plan.tensors.get(name)
        if placed is not None and placed.region != "weight" and quant.dtype in QUANTIZED_DTYPES:
            activations.setdefault(renames.get(name, name), quant)
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    weights = {name: (np.asarray(integers), plan.quantization[name]) for name, integers in weight_integers.items()
               if name in initializers}
    weights.update(_pools_as_convolutions(model, activations))
    weights.update(_float32_bias_scales(graph, activations, weights))
    dequantized_weights = []
    for name, (integers, quant) in weights.items():
        if name in initializers:  # the pools' windows have none
            graph.initializer.remove(initializers[name])
        graph.initializer.append(numpy_helper.from_array(integers, f"{name}/quantized"))
        dequantized_weights.append(_dequantize(graph, f"{name}/quantized", name, quant))
    inputs, outputs = {value.name for value in graph.input}, {value.name for value in graph.output}
    nodes = list(graph.node)
    made_by = {output: index for index, node in enumerate(nodes) for output in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in _reads(node):
            readers.setdefault(name, []).append(node)
    inserted: dict[int, list[onnx.NodeProto]] = {}  # after which node (-1: before all) the pairs go
    for name, quant in activations.items():
        if name not in made_by and name not in inputs:
            continue
        parameters = _parameters(graph, name, quant)
        source = name
        if name in made_by:
            source = f"{name}/float"
            producer = nodes[made_by[name]]
            producer.output[:] = [source if output == name else output for output in producer.output]
        pair = [helper.make_node("QuantizeLinear", [source, *parameters], [f"{name}/quantized"],
                                 f"{name}/QuantizeLinear", **_axis(quant))]
        results = [name] if name in outputs else []
        for index, reader in enumerate(readers.get(name, ())):
            results.append(f"{name}/dequantized_{index}")
            rename_tensors(reader, {name: results[-1]})
        pair += [_dequantize(graph, f"{name}/quantized", result, quant, parameters) for result in results]
        inserted.setdefault(made_by.get(name, -1), []).extend(pair)
    ordered = [*dequantized_weights, *inserted.get(-1, ())]
    for index, node in enumerate(nodes):
        ordered += [node, *inserted.get(index, ())]
    del graph.node[:]
    graph.node.extend(ordered)


def _pools_as_convolutions(model: onnx.ModelProto, activations: Mapping[str, Quantization]
                           ) -> dict[str, tuple[np.ndarray, Quantization]]:
    """Write each GlobalAveragePool with int8 input and output of different parameters as the
    depthwise convolution it is (every weight 1 / the window's size, int8 127 at a scale of 1/127
    of it, exact to float32 rounding). rknn-toolkit2 2.5.0 gives an average pool's output its
    input's parameters (its rule `adjust_avgpool`), dropping the plan's: on timm_regnetx_002's
    head, a 7.7 times coarser grid for the pooled features, 0.00012 of output cosine; a
    convolution keeps its output's. The plan computes the pool exactly and rounds once, as the
    convolution does. An AveragePool (the stages a large global pool is planned as) stays: as a
    strided convolution the toolkit computed tv_regnet_y_400mf worse (0.98872 against 0.99015).
    The windows' weights are returned by name, for `quantize_dequantize` to store."""
    shapes = _static_shapes(model)
    converted = {}
    for node in model.graph.node:
        source, result = (node.input[0], node.output[0]) if node.op_type == "GlobalAveragePool" else ("", "")
        if (source not in activations or result not in activations or activations[source] == activations[result]
                or len(shapes.get(source, ())) < 3):
            continue
        channels, *window = shapes[source][1:]
        name = f"{node.name}/window"
        scale = 1.0 / float(np.prod(window)) / WEIGHT_INT8_MAX
        converted[name] = (np.full([channels, 1, *window], WEIGHT_INT8_MAX, np.int8),
                           Quantization("int8", (scale,), (0,), None, "weights"))
        node.op_type = "Conv"
        node.input[:] = [source, name]
        node.attribute.extend([helper.make_attribute("group", channels), helper.make_attribute("kernel_shape", window)])
    return converted


def _reads(node: onnx.NodeProto) -> set[str]:
    """The tensors `node` reads, its subgraphs' reads from the scope around them included."""
    read = set(node.input) - {""}
    for graph in proto_subgraphs(node):
        for inner in graph.node:
            read |= _reads(inner)
    return read


def _float32_bias_scales(graph: onnx.GraphProto, activations: Mapping[str, Quantization],
                         weights: Mapping[str, tuple[np.ndarray, Quantization]]
                         ) -> dict[str, tuple[np.ndarray, Quantization]]:
    """Each int32 convolution bias with the scale its reader computes: input scale x weight scale
    in float32, as the file stores them. The plan's scale is that product in float64; written
    as such, rknn-toolkit2 2.5.0 finds it differs from its own product in the last bit and
    requantizes the bias ("Adjust scale of bias"), which cost mobilenet_v2 0.0013 of output
    cosine. The integers are requantized to the new scale, a relative change of about 1e-7
    (none moves for a bias below 2^22)."""
    rescaled = {}
    for node in graph.node:
        if node.op_type != "Conv" or len(node.input) < 3 or node.input[2] not in weights:
            continue
        data, weight, bias = node.input[:3]
        integers, quant = weights[bias]
        if quant.dtype != "int32" or data not in activations or weight not in weights:
            continue
        scales = (np.float32(activations[data].scales[0])
                  * np.asarray(weights[weight][1].scales, np.float32)).astype(np.float32)
        scales = np.broadcast_to(scales, (len(quant.scales),))
        real = integers.astype(np.float64) * np.asarray(quant.scales, np.float64)
        rescaled[bias] = (np.clip(np.rint(real / scales.astype(np.float64)), INT32.min, INT32.max).astype(np.int32),
                          dataclasses.replace(quant, scales=tuple(float(s) for s in scales)))
    return rescaled


def _dequantize(graph: onnx.GraphProto, source: str, result: str, quant: Quantization,
                parameters: list[str] | None = None) -> onnx.NodeProto:
    """DequantizeLinear of `source`, integers stored with `quant`'s parameters, into `result`."""
    parameters = parameters or _parameters(graph, result, quant)
    return helper.make_node("DequantizeLinear", [source, *parameters], [result], f"{result}/DequantizeLinear",
                            **_axis(quant))


def _parameters(graph: onnx.GraphProto, result: str, quant: Quantization) -> list[str]:
    """The scale (float32) and zero point (the stored integer type) initializers of `quant`:
    one value each for a per-layer tensor, one per channel along its axis otherwise."""
    per_channel = quant.axis is not None and len(quant.scales) > 1
    scales = np.asarray(quant.scales, np.float32)
    zero_points = np.asarray(quant.zero_points, quant.dtype)
    if not per_channel:
        scales, zero_points = scales.reshape(-1)[0], zero_points.reshape(-1)[0]
    names = [f"{result}/scale", f"{result}/zero_point"]
    graph.initializer.extend([numpy_helper.from_array(np.asarray(scales), names[0]),
                              numpy_helper.from_array(np.asarray(zero_points), names[1])])
    return names


def _axis(quant: Quantization) -> dict[str, int]:
    return {"axis": quant.axis} if quant.axis is not None and len(quant.scales) > 1 else {}


def _checked(model: onnx.ModelProto) -> onnx.ModelProto:
    _drop_unread_initializers(model.graph)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise CompileError(f"the exported graph is not valid ONNX: {str(exc).splitlines()[0]}") from None
    return model


def _gelu_older_form(node: onnx.NodeProto) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
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


#: ops a newer opset introduced, which onnx's version converter cannot take down (it knows no
#: previous version), by the opset that introduced them, and their form in older ops
OLDER_FORMS = {"Gelu": (20, _gelu_older_form)}


def _write_older_forms(graph: onnx.GraphProto, opset: int) -> None:
    """Replace each node of `graph` whose op is newer than `opset` and in OLDER_FORMS by its
    older form, for the version converter to take the rest down."""
    nodes = []
    for node in graph.node:
        since, older_form = OLDER_FORMS.get(node.op_type, (0, None))
        if older_form is None or node.domain not in ("", "ai.onnx") or since <= opset:
            nodes.append(node)
            continue
        constants, replacement = older_form(node)
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


def _value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    if any(d < 0 for d in spec.shape):
        raise CompileError(f"{spec.name} has the dynamic shape {list(spec.shape)}: the export needs static shapes "
                           "(fix it with --input-shape)")
    return helper.make_tensor_value_info(spec.name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)),
                                         list(spec.shape))


def export_summary(plan: PlanRecord, nodes: Sequence[Node], model: onnx.ModelProto) -> dict:
    """What the export report says of the graph: the rewrites the plan applied, the fused kernels
    written back as their members, the nodes the plan runs on the CPU and why, the opsets, and
    the op counts of the file."""
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
        "op_types": dict(sorted(Counter(node.op_type for node in model.graph.node).items())),
        **({"quantization": _quantization_summary(plan, model)} if plan.dtype in QUANTIZED_DTYPES else {}),
    }


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


def slices_before_reshapes(model: onnx.ModelProto) -> int:
    """Move each Slice or Split that reads a Reshape before it, where the Reshape keeps the cut
    axis whole (it only regroups the axes around it): Slice(Reshape(x)) becomes
    Reshape(Slice(x)), Split(Reshape(x)) a Split of x and a Reshape per part, the same values.
    rknn-toolkit2 2.5.0 turns parallel Slices after a Reshape of a Conv into a Split and then
    fails on that Conv -> Reshape -> Split (its rule `seperate_conv_rs_split`, IndexError: the
    error it gives on yolov8n's box head), and on the Split our plan makes of such Slices.
    Returns how many Slices and Splits moved."""
    shapes = _static_shapes(model)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    graph_outputs = {output.name for output in graph.output}
    replaced: dict[str, list[onnx.NodeProto]] = {}   # a Reshape's name -> the nodes written in its place
    dropped: set[str] = set()
    for node in graph.node:
        slices = readers.get(node.output[0], []) if node.op_type == "Reshape" else []
        if not slices or node.output[0] in graph_outputs:
            continue
        moves = [_cut_before(node, s, shapes, constants, opset) for s in slices]
        if all(moves):
            replaced[node.name] = [new for move in moves for new in move[1]]
            graph.initializer.extend(tensor for move in moves for tensor in move[0])
            dropped.update(s.name for s in slices)
    nodes = [new for node in graph.node if node.name not in dropped for new in replaced.get(node.name, [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(dropped)


def erf_of_a_quotient(model: onnx.ModelProto) -> int:
    """Write each Mul by a constant scalar whose only reader is an Erf as the Div by its
    reciprocal: GELU's x / sqrt(2), which the rewrites made a Mul (div_constant_to_mul).
    rknn-toolkit2 2.5.0 fuses GELU (ConvExGelu) only in the Div form; from the Mul it leaves
    each Erf on the CPU (bert_mini: 4 CPU layers). The values differ by float32 rounding.
    Returns how many Muls it wrote back."""
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers = _readers(graph)
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
    'LayerNormalization' in its rule `convert_layernorm_to_exnorm`). Returns how many nodes
    gained an attribute."""
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)
    changed = 0
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        present = {attribute.name for attribute in node.attribute}
        missing = [a.default_value for name, a in sorted(schema.attributes.items())
                   if name not in present and a.default_value.HasField("type") and a.default_value.name]
        node.attribute.extend(missing)
        changed += bool(missing)
    return changed


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
    readers = _readers(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    moved: dict[int, onnx.NodeProto] = {}   # id(score MatMul) -> the Mul now on its result
    removed = set()
    for node in graph.node:
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
            moved[id(node)] = helper.make_node("Mul", [node.output[0], scalars[0]], [scores], f"{source.name}/on_scores")
            removed.add(id(source))
            break
    nodes = [new for node in graph.node if id(node) not in removed
             for new in ([node, moved[id(node)]] if id(node) in moved else [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(moved)


def pads_into_convs(model: onnx.ModelProto) -> int:
    """Fold a zero constant Pad of the spatial axes whose only reader is a Conv (explicit pads)
    into that Conv's pads: the same values. rknn-toolkit2 2.5.0 tries that itself (its rule
    `fuse_pad_into_conv`) and fails on a Pad whose pads are an initializer (ValueError:
    assignment destination is read-only; tf2onnx's "same" padding of a strided Conv). Returns
    how many Pads it folded."""
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    graph_outputs = {output.name for output in graph.output}
    folded = set()
    for node in graph.node:
        conv = readers.get(node.output[0], []) if node.op_type == "Pad" else []
        if len(conv) != 1 or conv[0].op_type != "Conv" or conv[0].input[0] != node.output[0] \
                or node.output[0] in graph_outputs:
            continue
        pads = _zero_constant_pads(node, constants)
        attributes = {a.name: a for a in conv[0].attribute}
        rank = len(pads) // 2 if pads is not None else 0
        if pads is None or any(pads[:2]) or any(pads[rank:rank + 2]) or any(p < 0 for p in pads) \
                or attributes.get("auto_pad", helper.make_attribute("auto_pad", b"NOTSET")).s not in (b"NOTSET", b""):
            continue
        spatial = rank - 2
        old = list(attributes["pads"].ints) if "pads" in attributes else [0] * (2 * spatial)
        new = [a + b for a, b in zip(old, [*pads[2:rank], *pads[rank + 2:]])]
        if "pads" in attributes:
            conv[0].attribute.remove(attributes["pads"])
        conv[0].attribute.append(helper.make_attribute("pads", new))
        conv[0].input[0] = node.input[0]
        folded.add(id(node))
    nodes = [node for node in graph.node if id(node) not in folded]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(folded)


def vectors_into_channels(model: onnx.ModelProto) -> int:
    """Write a Reshape of a one-channel Conv result holding a vector along a spatial axis
    ([N, 1, K, 1], the plan's mean over tokens as a Conv) as a Transpose of that axis into the
    channels, then the Reshape if the result is another shape: the same values. From Conv ->
    Reshape -> Conv (the head after a token mean) rknn-toolkit2 2.5.0 never returns: its rule
    `fuse_rs_conv` rewrites the pair back and forth (swin_tiny, levit). Returns how many Reshapes
    it wrote."""
    shapes = _static_shapes(model)
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        source, shape = made_by.get(node.input[0]) if node.op_type == "Reshape" else None, shapes.get(node.input[0])
        if source is None or source.op_type != "Conv" or shape is None or len(shape) != 4 or shape[1] != 1:
            continue
        axis = next((a for a in (2, 3) if shape[a] > 1 and int(np.prod(shape[1:])) == shape[a]), None)
        if axis is None:
            continue
        perm = [0, axis, *(a for a in (1, 2, 3) if a != axis)]
        moved = [shape[a] for a in perm]
        target = shapes.get(node.output[0])
        if target == moved:
            written[id(node)] = [helper.make_node("Transpose", [node.input[0]], [node.output[0]],
                                                  f"{node.name}/as_transpose", perm=perm)]
        elif target is not None:
            name = f"{node.name}/into_channels"
            written[id(node)] = [helper.make_node("Transpose", [node.input[0]], [name], name, perm=perm),
                                 helper.make_node("Reshape", [name, *node.input[1:]], [node.output[0]], node.name)]
    nodes = [new for node in graph.node for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def means_as_reduce_means(model: onnx.ModelProto) -> int:
    """Write the plan's mean as a Conv, Reshape x -> [N, K, H, W] then a 1x1 Conv of uniform
    weights 1/K, one output channel and no bias, back as the ReduceMean of x over its axes
    that make K (those of x regroup whole into [N | K | H, W]): the same values up to
    rounding. The Reshape or Transpose after the Conv that gives the mean the ReduceMean's
    shape goes too; a Reshape to another shape reads the ReduceMean; else a Reshape gives it
    the Conv's shape. rknn-toolkit2 2.5.0 fuses an RMS
    norm into its exNorm only from the ReduceMean (from the Conv its Div runs on its CPU:
    t5), runs the Reshape of tokens held on the batch axis as a Transpose on its CPU (levit)
    and loops on the Reshape -> Conv pairs around it (swin_tiny). Returns how many it wrote."""
    shapes = _static_shapes(model)
    graph = model.graph
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    removed = set()
    for node in graph.node:
        reshape = made_by.get(node.input[0]) if node.op_type == "Conv" else None
        if reshape is None or reshape.op_type != "Reshape" or len(readers[reshape.output[0]]) != 1 \
                or node.input[1] not in constants or not _pointwise(node, constants[node.input[1]].shape):
            continue
        source, grouped, result = shapes.get(reshape.input[0]), shapes.get(node.input[0]), shapes.get(node.output[0])
        weights = constants[node.input[1]]
        bias = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if source is None or grouped is None or result is None or len(grouped) != 4 \
                or weights.shape != (1, grouped[1], 1, 1) or grouped[1] < 2 \
                or not np.allclose(weights, 1.0 / grouped[1], rtol=1e-6, atol=0) \
                or (bias is None and len(node.input) > 2 and node.input[2]) or (bias is not None and bias.any()):
            continue
        axes = _regrouped_axes(source, grouped[0], grouped[1])
        if axes is None:
            continue
        mean = [1 if axis in axes else size for axis, size in enumerate(source)]
        after = readers.get(node.output[0], [])
        replaced = (len(after) == 1 and after[0].op_type in ("Reshape", "Transpose")
                    and shapes.get(after[0].output[0]) == mean and node.output[0] not in _graph_outputs(graph))
        prefix = f"{node.name}/reduce_mean"
        reshaped_after = (not replaced and mean != result and len(after) == 1 and after[0].op_type == "Reshape"
                          and node.output[0] not in _graph_outputs(graph))
        if replaced:
            target = after[0].output[0]
        elif mean == result:
            target = node.output[0]
        else:
            target = prefix
        if opset >= 18:
            axes_tensor = numpy_helper.from_array(np.array(axes, np.int64), f"{prefix}/axes")
            graph.initializer.append(axes_tensor)
            reduce = helper.make_node("ReduceMean", [reshape.input[0], axes_tensor.name], [target], prefix, keepdims=1)
        else:
            reduce = helper.make_node("ReduceMean", [reshape.input[0]], [target], prefix, axes=axes, keepdims=1)
        written[id(node)] = [reduce]
        if reshaped_after:  # a Reshape reads the mean in any shape of the same element order
            after[0].input[0] = prefix
        elif target == prefix:
            shape = numpy_helper.from_array(np.array(result, np.int64), f"{prefix}/shape")
            graph.initializer.append(shape)
            written[id(node)].append(helper.make_node("Reshape", [prefix, shape.name], [node.output[0]],
                                                      f"{prefix}/reshape"))
        removed.add(id(reshape))
        if replaced:
            removed.add(id(after[0]))
    nodes = [new for node in graph.node if id(node) not in removed for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def _regrouped_axes(shape: list[int], outer: int, size: int) -> list[int] | None:
    """The axes of `shape` that a Reshape to [outer, size, ...] gathers whole into its axis 1:
    a run of axes after those whose product is `outer`, of product `size`; None when there is
    no such run."""
    for start in range(len(shape) + 1):
        if int(np.prod(shape[:start])) != outer:
            continue
        for stop in range(start + 1, len(shape) + 1):
            if int(np.prod(shape[start:stop])) == size:
                return list(range(start, stop))
    return None


def _graph_outputs(graph: onnx.GraphProto) -> set[str]:
    return {output.name for output in graph.output}


def square_roots_written_back(model: onnx.ModelProto) -> int:
    """Write a Pow by the constant 0.5 that only divisors read as the Sqrt it was (the
    rewrites make Sqrt a Pow), and a Pow by -0.5 that only products read as a Sqrt they
    divide by (x * p^-0.5 = x / sqrt(p): an RMSNorm the plan runs as exNorm from its 1x1 Conv
    form): rknn-toolkit2 2.5.0 fuses a norm, mean -> Add -> Sqrt -> Div, into its exNorm only
    from the Sqrt (from the Pow it runs each Div on its CPU: t5); a Sqrt alone it may run on
    its CPU, so other Pows stay. The values differ by float32 rounding. Returns how many Pows
    it wrote."""
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    readers = _readers(model.graph)
    changed = 0
    for node in model.graph.node:
        exponent = constants.get(node.input[1]) if node.op_type == "Pow" else None
        if exponent is None or exponent.size != 1:
            continue
        power, users = float(exponent.reshape(-1)[0]), readers.get(node.output[0], [])
        if power == 0.5 and users and all(r.op_type == "Div" and list(r.input[1:]) == [node.output[0]] for r in users):
            node.CopyFrom(helper.make_node("Sqrt", [node.input[0]], [node.output[0]], node.name))
            changed += 1
        elif power == -0.5 and users and all(r.op_type == "Mul" and list(r.input).count(node.output[0]) == 1
                                             for r in users):
            node.CopyFrom(helper.make_node("Sqrt", [node.input[0]], [node.output[0]], node.name))
            for product in users:
                other = next(name for name in product.input if name != node.output[0])
                product.CopyFrom(helper.make_node("Div", [other, node.output[0]], list(product.output), product.name))
            changed += 1
    return changed


def squares_before_reshapes(model: onnx.ModelProto) -> int:
    """Write the square of a reshaped tensor, Mul(r, r) with r = Reshape(x), as the Reshape of
    Mul(x, x): the same values (the square is element by element), and the Reshape then feeds
    the mean's Conv directly, as `means_as_reduce_means` reads it (an RMSNorm the plan runs
    from its 1x1 Conv form). Returns how many squares it moved."""
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        reshape = made_by.get(node.input[0]) if node.op_type == "Mul" and len(node.input) == 2 else None
        if reshape is None or node.input[0] != node.input[1] or reshape.op_type != "Reshape":
            continue
        squared = f"{node.name}/before_reshape"
        written[id(node)] = [helper.make_node("Mul", [reshape.input[0], reshape.input[0]], [squared], squared),
                             helper.make_node("Reshape", [squared, reshape.input[1]], list(node.output),
                                              f"{node.name}/reshape")]
    nodes = [new for node in originals for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def mean_biases_apart(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of one output channel whose bias is one value b (a mean plus an epsilon,
    as the plan's norms compute a variance) as the Conv without bias, then an Add of b: the same
    sum, added last; `means_as_reduce_means` then writes the Conv back as a ReduceMean, and the
    norm reads mean -> Add -> Sqrt as rknn-toolkit2 fuses it. Returns how many it wrote."""
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        bias = constants.get(node.input[2]) if node.op_type == "Conv" and len(node.input) > 2 and node.input[2] else None
        weight = constants.get(node.input[1]) if bias is not None else None
        if weight is None or bias.size != 1 or weight.shape[0] != 1 \
                or not _pointwise(node, weight.shape) or not bias.any():
            continue
        summed = f"{node.name}/without_bias"
        offset = numpy_helper.from_array(bias.reshape(()), f"{node.name}/bias_value")
        graph.initializer.append(offset)
        bare = onnx.NodeProto()
        bare.CopyFrom(node)
        del bare.input[2:]
        bare.output[0] = summed
        written[id(node)] = [bare, helper.make_node("Add", [summed, offset.name], [node.output[0]], f"{node.name}/add_bias")]
    nodes = [new for node in originals for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def gathers_as_slices(model: onnx.ModelProto) -> int:
    """Write a Gather of one constant non-negative index given as a 1-D array (the axis kept)
    as the Slice of that index: the same values. rknn-toolkit2 2.5.0 runs a Reshape it adds
    after the last of such Gathers on its CPU (tv_swin_nano's qkv split: 6 CPU layers), and
    none after Slices. Returns how many Gathers it wrote."""
    graph = model.graph
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    changed = 0
    for node in graph.node:
        index = constants.get(node.input[1]) if node.op_type == "Gather" and len(node.input) > 1 else None
        if index is None or index.shape != (1,) or index[0] < 0 or opset < 10:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        prefix = f"{node.name}/as_slice"
        bounds = [numpy_helper.from_array(np.array([value], np.int64), f"{prefix}/{what}")
                  for what, value in (("starts", int(index[0])), ("ends", int(index[0]) + 1), ("axes", axis))]
        graph.initializer.extend(bounds)
        node.CopyFrom(helper.make_node("Slice", [node.input[0], *(b.name for b in bounds)], [node.output[0]], prefix))
        changed += 1
    return changed


def added_convs_as_one(model: onnx.ModelProto) -> int:
    """Write the sum of two Convs of the same input with the same attributes, each read by that
    Add alone, as one Conv with the summed weights and biases: the same values in real
    arithmetic (float32 rounding apart). rknn-toolkit2 2.5.0 does that itself (its rule
    `fuse_conv_conv_add`) and fails on the Convs the plan makes of Gemms (TypeError: 'NoneType'
    object is unsliceable: levit's two heads). Returns how many Adds it wrote."""
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers = _readers(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    merged: dict[int, onnx.NodeProto] = {}
    removed = set()
    for node in graph.node:
        convs = [made_by.get(name) for name in node.input] if node.op_type == "Add" else []
        if len(convs) != 2 or any(c is None or c.op_type != "Conv" or len(readers[c.output[0]]) != 1 for c in convs) \
                or convs[0] is convs[1] or _source(convs[0].input[0], made_by, constants) is None \
                or _source(convs[0].input[0], made_by, constants) != _source(convs[1].input[0], made_by, constants) \
                or _conv_attributes(convs[0]) != _conv_attributes(convs[1]):
            continue
        if any(name not in constants for conv in convs for name in conv.input[1:] if name):
            continue
        weights = [numpy_helper.to_array(constants[conv.input[1]]) for conv in convs]
        if weights[0].shape != weights[1].shape:
            continue
        biases = [numpy_helper.to_array(constants[conv.input[2]]) if len(conv.input) > 2 and conv.input[2]
                  else np.zeros(weights[0].shape[0], weights[0].dtype) for conv in convs]
        prefix = f"{node.name}/summed_conv"
        summed = [numpy_helper.from_array(weights[0] + weights[1], f"{prefix}/weight"),
                  numpy_helper.from_array(biases[0] + biases[1], f"{prefix}/bias")]
        graph.initializer.extend(summed)
        merged[id(node)] = helper.make_node("Conv", [convs[0].input[0], *(t.name for t in summed)], [node.output[0]],
                                            prefix, **_conv_attributes(convs[0]))
        removed.update(id(conv) for conv in convs)
    nodes = [merged.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(merged)


def _source(name: str, made_by: dict[str, onnx.NodeProto],
            constants: dict[str, onnx.TensorProto]) -> tuple[str, tuple[int, ...] | None] | None:
    """What tensor `name` is, to tell two names of the same values apart from others: (the
    tensor a Reshape by a constant shape reads, that shape) for a Reshape's result, else
    (name, None). The plan writes a Reshape per reader."""
    node = made_by.get(name)
    if node is None or node.op_type != "Reshape":
        return name, None
    if node.input[1] not in constants:
        return None
    return node.input[0], tuple(numpy_helper.to_array(constants[node.input[1]]).tolist())


def _conv_attributes(conv: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in conv.attribute}


def _pointwise(conv: onnx.NodeProto, weight_shape: Sequence[int]) -> bool:
    """Whether `conv` (of weights of `weight_shape`) is a 1x1 Conv of one group, no padding and
    stride 1: a matrix product over the channels at each position."""
    attributes = _conv_attributes(conv)
    return (tuple(weight_shape[2:]) == (1, 1) and attributes.get("group", 1) == 1
            and not any(attributes.get("pads", ())) and all(v == 1 for v in attributes.get("strides", ()))
            and attributes.get("auto_pad", b"NOTSET") in (b"NOTSET", b""))


def linear_layers_as_gemms(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of a [N, C] matrix reshaped to [N, C, 1, 1] (the plan's Gemm as a Conv)
    as the Gemm it was, with a zero bias if it had none, then the Reshape to the Conv's
    result: the same values. From the plan's form rknn-toolkit2 2.5.0 never returns (its rule
    `fuse_rs_conv` rewrites the Reshape -> Conv pair back and forth: levit's two heads), and
    its rule `fuse_conv_conv_add` fails on two such Convs added without biases (TypeError:
    'NoneType' object is unsliceable). Returns how many Convs it wrote."""
    shapes = _static_shapes(model)
    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, list[onnx.NodeProto]] = {}
    for node in graph.node:
        reshape = made_by.get(node.input[0]) if node.op_type == "Conv" else None
        matrix_shape = shapes.get(reshape.input[0], []) if reshape is not None and reshape.op_type == "Reshape" else []
        if len(matrix_shape) != 2 or shapes.get(reshape.output[0]) != [*matrix_shape, 1, 1] \
                or node.input[1] not in constants or node.output[0] not in shapes:
            continue
        weights = numpy_helper.to_array(constants[node.input[1]])
        if not _pointwise(node, weights.shape):
            continue
        prefix = f"{node.name}/gemm"
        matrix = numpy_helper.from_array(weights.reshape(weights.shape[:2]), f"{prefix}/weight")
        shape = numpy_helper.from_array(np.array(shapes[node.output[0]], np.int64), f"{prefix}/shape")
        bias = [] if len(node.input) > 2 and node.input[2] else \
            [numpy_helper.from_array(np.zeros(weights.shape[0], weights.dtype), f"{prefix}/bias")]
        graph.initializer.extend([matrix, shape, *bias])
        inputs = [reshape.input[0], matrix.name, bias[0].name if bias else node.input[2]]
        written[id(node)] = [helper.make_node("Gemm", inputs, [f"{prefix}/result"], prefix, transB=1),
                             helper.make_node("Reshape", [f"{prefix}/result", shape.name], [node.output[0]],
                                              f"{prefix}/reshape")]
    nodes = [new for node in graph.node for new in written.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


def _zero_constant_pads(pad: onnx.NodeProto, constants: dict[str, np.ndarray]) -> list[int] | None:
    """The pads of `pad`, a Pad node, when it pads every axis (no `axes`) with a constant zero;
    else None. The attribute form (opset < 11) and the input form both."""
    attributes = {a.name: helper.get_attribute_value(a) for a in pad.attribute}
    if attributes.get("mode", b"constant") != b"constant":
        return None
    if len(pad.input) == 1:
        value, pads = attributes.get("value", 0.0), attributes.get("pads")
    else:
        if len(pad.input) > 3 and pad.input[3] or pad.input[1] not in constants:
            return None
        given = len(pad.input) > 2 and pad.input[2]
        if given and pad.input[2] not in constants:
            return None
        value = constants[pad.input[2]].reshape(-1)[0] if given else 0.0
        pads = constants[pad.input[1]].reshape(-1).tolist()
    return [int(p) for p in pads] if pads is not None and value == 0 else None


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """The nodes reading each tensor name of `graph` (its top level)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _cut_before(reshape: onnx.NodeProto, node: onnx.NodeProto, shapes: dict[str, list[int]],
                constants: dict[str, np.ndarray], opset: int) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]] | None:
    """The constants and nodes computing `node`, a Slice or Split of `reshape`'s result, as the
    same cut of its input then a Reshape of each part; None when `node` is neither (a Slice of
    one axis by constant bounds and step 1, a Split with every part's shape known), or the
    reshape does not keep that axis whole."""
    source, result = shapes.get(reshape.input[0]), shapes.get(reshape.output[0])
    if source is None or result is None:
        return None
    prefix = f"{node.name}/before_reshape"
    if node.op_type == "Split":
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(result)
        parts = [shapes.get(name) for name in node.output]
        kept = _kept_axis(source, result, axis)
        if kept is None or any(part is None for part in parts):
            return None
        sizes = numpy_helper.from_array(np.array([part[axis] for part in parts], np.int64), f"{prefix}/split")
        cut = [f"{prefix}/part_{index}" for index in range(len(parts))]
        split = (helper.make_node("Split", [reshape.input[0], sizes.name], cut, prefix, axis=kept) if opset >= 13
                 else helper.make_node("Split", [reshape.input[0]], cut, prefix, axis=kept,
                                       split=[part[axis] for part in parts]))
        tensors, nodes = ([sizes] if opset >= 13 else []), [split]
        for index, (piece, name, part) in enumerate(zip(cut, node.output, parts)):
            shape = numpy_helper.from_array(np.array(part, np.int64), f"{prefix}/shape_{index}")
            tensors.append(shape)
            nodes.append(helper.make_node("Reshape", [piece, shape.name], [name], f"{prefix}/reshape_{index}"))
        return tensors, nodes
    operands = [constants.get(name) for name in node.input[1:]]
    if (node.op_type != "Slice" or len(node.input) < 4
            or any(value is None for value in operands) or any(value.size != 1 for value in operands)):
        return None
    starts, ends, axes, *steps = (int(value.reshape(-1)[0]) for value in operands)
    if steps and steps[0] != 1:
        return None
    axis = axes % len(result)
    kept = _kept_axis(source, result, axis)
    if kept is None:
        return None
    start, end, _ = slice(starts, ends).indices(result[axis])
    shape = list(result)
    shape[axis] = max(end - start, 0)
    tensors = [numpy_helper.from_array(np.array(values, np.int64), f"{prefix}/{what}")
               for what, values in (("starts", [start]), ("ends", [end]), ("axes", [kept]), ("shape", shape))]
    sliced = f"{prefix}/sliced"
    return tensors, [
        helper.make_node("Slice", [reshape.input[0], *(t.name for t in tensors[:3])], [sliced], prefix),
        helper.make_node("Reshape", [sliced, tensors[3].name], [node.output[0]], f"{prefix}/reshape")]


def _kept_axis(source: list[int], result: list[int], axis: int) -> int | None:
    """The axis of a Reshape's input that is `axis` of its result whole (the same size, after
    as many elements), or None when the Reshape regroups it."""
    before = int(np.prod(result[:axis]))
    return next((b for b in range(len(source)) if int(np.prod(source[:b])) == before and source[b] == result[axis]),
                None)


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of `graph` and of its subgraphs at any depth."""
    nodes, pending = [], [graph]
    while pending:
        for node in pending.pop().node:
            nodes.append(node)
            pending.extend(proto_subgraphs(node))
    return nodes


def _drop_unread_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes of `graph` whose results nothing reads (a shaping bypassed them), last
    first, so that a chain of them goes."""
    needed = {output.name for output in graph.output}
    subgraph_reads = {name for node in graph.node for sub in proto_subgraphs(node) for inner in _all_nodes(sub)
                      for name in inner.input}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed or name in subgraph_reads for name in node.output if name):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove the initializers no node reads, in `graph` or in a subgraph at any depth (which may
    name one without listing it): those a shaping left behind."""
    read = {name for node in _all_nodes(graph) for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every tensor's shape onnx's shape inference finds static, by name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    return shapes


#: Exact rewrites of the exported graph into forms rknn-toolkit2 builds, in order: each changes
#: the model in place and returns how many nodes it changed.
TOOLKIT_SHAPINGS = (slices_before_reshapes, erf_of_a_quotient, scale_after_scores, pads_into_convs,
                    squares_before_reshapes, mean_biases_apart, means_as_reduce_means, vectors_into_channels, added_convs_as_one,
                    linear_layers_as_gemms, square_roots_written_back, gathers_as_slices, defaults_written)
