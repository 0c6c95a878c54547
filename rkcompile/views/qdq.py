"""An int8 plan written into the exported graph as QDQ (QuantizeLinear/DequantizeLinear pairs),
the form rknn-toolkit2 builds without calibrating: `quantize_dequantize` (`rkcompile export
--dtype int8`)."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.plan.schema import QUANTIZED_DTYPES, PlanRecord, Quantization
from rkcompile.views.partitioned_onnx import host_renames, proto_subgraphs, rename_tensors
from rkcompile.views.proto_graph import static_shapes


#: the oldest ai.onnx opset a quantized export is written in: QuantizeLinear and DequantizeLinear
#: take a per-channel scale (`axis`) from opset 13; an older model is converted up
MIN_QDQ_OPSET = 13


INT32 = np.iinfo(np.int32)


#: the largest int8 weight, the one a constant weight is stored as (symmetric grids)
WEIGHT_INT8_MAX = 127


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
    toolkit fuses them again; an intermediate the plan quantizes all the same (a fused
    attention's probabilities, rounded to their grid inside the step) gets its pair. The tensors are renamed as the export renames them (the host
    conversions left out, `host_renames`)."""
    graph = model.graph
    renames = host_renames(plan)
    activations: dict[str, Quantization] = {}
    for name, quant in plan.quantization.items():
        placed = plan.tensors.get(name)  # None for a fused step's intermediate the plan quantizes
        if (placed is None or placed.region != "weight") and quant.dtype in QUANTIZED_DTYPES:
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
    """Write each average pool with int8 input and output of different parameters as the
    depthwise convolution it is (every weight 1 / the window's size, int8 127 at a scale of 1/127
    of it, exact to float32 rounding). rknn-toolkit2 2.5.0 gives an average pool's output its
    input's parameters (its rule `adjust_avgpool`, on GlobalAveragePool and AveragePool alike),
    dropping the plan's: on timm_regnetx_002's head, a 7.7 times coarser grid for the pooled
    features; on timm_repvit_m0_9's staged squeeze-and-excitation means, values up to 3.5 steps of
    the plan's grid away after the first stage, its output 0.0058 of cosine above what the
    emulator promised on a 7-input mean. A convolution keeps its output's parameters. The plan
    computes the pool exactly and rounds once, as the convolution does. An AveragePool whose
    windows are not all of one size (padding it does not count, a window cut short by ceil_mode)
    is no convolution and stays. The windows' weights are returned by name, for
    `quantize_dequantize` to store."""
    shapes = static_shapes(model)
    converted = {}
    for node in model.graph.node:
        if node.op_type not in ("GlobalAveragePool", "AveragePool"):
            continue
        source, result = node.input[0], node.output[0]
        if (source not in activations or result not in activations or activations[source] == activations[result]
                or len(shapes.get(source, ())) < 3 or len(shapes.get(result, ())) < 3):
            continue
        channels, *sizes = shapes[source][1:]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "AveragePool":
            window = list(attributes["kernel_shape"])
            if not _windows_of_one_size(attributes, sizes, window, shapes[result][2:]):
                continue
            kept = {name: attributes[name] for name in ("strides", "pads", "dilations") if name in attributes}
        else:
            window, kept = sizes, {}
        name = f"{node.name}/window"
        scale = 1.0 / float(np.prod(window)) / WEIGHT_INT8_MAX
        converted[name] = (np.full([channels, 1, *window], WEIGHT_INT8_MAX, np.int8),
                           Quantization("int8", (scale,), (0,), None, "weights"))
        node.op_type = "Conv"
        node.input[:] = [source, name]
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute("group", channels), helper.make_attribute("kernel_shape", window),
                               *(helper.make_attribute(key, value) for key, value in kept.items())])
    return converted


def _windows_of_one_size(attributes: Mapping, sizes: list[int], window: list[int], out_sizes: list[int]) -> bool:
    """Whether every window of an AveragePool averages its full size: padding, if any, counted
    (count_include_pad, the zeros a convolution's padding adds), and no window cut short by the
    map's end (ceil_mode's last window, when it starts inside the map but ends past the padding)."""
    pads = list(attributes.get("pads", [0] * 2 * len(window)))
    if attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
        return False
    if any(pads) and not attributes.get("count_include_pad", 0):
        return False
    strides = list(attributes.get("strides", [1] * len(window)))
    dilations = list(attributes.get("dilations", [1] * len(window)))
    rank = len(window)
    reach = zip(sizes, out_sizes, window, strides, dilations)
    return all((out - 1) * stride + (k - 1) * dilation + 1 <= size + pads[axis] + pads[axis + rank]
               for axis, (size, out, k, stride, dilation) in enumerate(reach))


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
