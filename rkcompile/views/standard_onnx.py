"""The planned graph as standard ONNX, for other compilers (rknn-toolkit2) to build: `rkcompile export`.

Built from the plan alone, as the partitioned ONNX is (partitioned_onnx.py): the steps in order,
each from its node (`rkcompile.api.Plan.reference_nodes`, the model's own weights). The steps
are the graph the pipeline holds after its rewrite passes (folded, simplified, legalized: what
`--dump-after rewrite_late` writes); the passes after those place, order and lay out the nodes
and change none but by adding host conversions. So the file is that graph in plain ONNX: a
fused kernel is written back as its members, the host conversions (storage changes ONNX does
not model) are left out, and an opset above what the toolkit reads is converted down.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
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
        [_value_info(spec) for spec in plan.model.inputs], [_value_info(spec) for spec in plan.model.outputs],
        [tensor for name, tensor in weights.items() if name in read])
    opsets = [helper.make_opsetid(domain, version) for domain, version in plan.model.opsets.items()
              if domain in STANDARD_DOMAINS]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="rkcompile export")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    if plan.model.opset > max_opset:
        model = _converted(model, plan.model.opset, max_opset)
    elif weight_integers is not None and plan.model.opset < MIN_QDQ_OPSET:
        model = _converted(model, plan.model.opset, MIN_QDQ_OPSET)
    shaped = {shaping.__name__: shaping(model) for shaping in TOOLKIT_SHAPINGS}
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
                          replace(quant, scales=tuple(float(s) for s in scales)))
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


def _refuse_custom_domain(node: onnx.NodeProto) -> None:
    """A node of a domain other than ONNX's, at any depth of its subgraphs, cannot be written as
    standard ONNX (the toolkit knows no custom op)."""
    if node.domain not in STANDARD_DOMAINS:
        raise CompileError(f"node {node.name} is {node.domain}::{node.op_type}, not a standard ONNX op: "
                           "the graph cannot be exported as standard ONNX")
    for graph in proto_subgraphs(node):
        for inner in graph.node:
            _refuse_custom_domain(inner)


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
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
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
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
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


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove the initializers no node reads, in `graph` or in a subgraph at any depth (which may
    name one without listing it): those a shaping left behind."""
    read = set()
    pending = [graph]
    while pending:
        for node in pending.pop().node:
            read.update(node.input)
            pending.extend(proto_subgraphs(node))
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
TOOLKIT_SHAPINGS = (slices_before_reshapes, erf_of_a_quotient)
