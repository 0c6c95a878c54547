"""What several families of toolkit shapings read or write alike: a shaping's type (`Shaping`),
the graph's lookups (`lookups`), whether a Conv is the plan's 1x1 matrix product (`pointwise`),
a ReduceMean or ReduceSum in its opset's form (`reduction_node`) and the axes a reduction reduces
(`reduced_axes`), a Reshape to a constant shape (`reshape_node`), a Slice of constant bounds
(`slice_node`), a Split of constant sizes in its opset's form (`split_node`), the
element-by-element ops (`ELEMENTWISE`) and the toolkit's channel block (`TOOLKIT_BLOCK`)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import node_attributes, output_names, readers_of

#: A toolkit shaping: it rewrites the model in place and returns how many places it changed.
Shaping = Callable[[onnx.ModelProto], int]


def lookups(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto] | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, list[onnx.NodeProto]], dict[str, onnx.NodeProto], set[str]]:
    """What a shaping looks a graph's tensors up by, as the graph stands: each constant's values,
    each tensor's readers and the node that makes it (from `nodes`, the graph's nodes as a list
    the shaping keeps, when it rewrites them with `nodes_rewritten`, which keys them by id()),
    and the graph's outputs."""
    nodes = graph.node if nodes is None else nodes
    return ({tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}, readers_of(graph),
            {name: node for node in nodes for name in node.output}, output_names(graph))


def reduction_node(graph: onnx.GraphProto, reduction: str, source: str, axes: Sequence[int], target: str, name: str,
                   opset: int) -> onnx.NodeProto:
    """A `reduction` (ReduceMean or ReduceSum) `name` of `source` over `axes` keeping them, into
    `target`: its axes an input from the opset that made them one (18 for ReduceMean, 13 for
    ReduceSum; an initializer added to `graph`), an attribute before."""
    if opset < _AXES_AS_INPUT[reduction]:
        return helper.make_node(reduction, [source], [target], name, axes=list(axes), keepdims=1)
    axes_tensor = numpy_helper.from_array(np.array(axes, np.int64), f"{name}/axes")
    graph.initializer.append(axes_tensor)
    return helper.make_node(reduction, [source, axes_tensor.name], [target], name, keepdims=1)


def reduced_axes(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> list[int] | None:
    """The axes the reduction `node` reduces, from its input or its attribute; None when they
    are not constant or it reduces every axis."""
    if len(node.input) > 1 and node.input[1]:
        return [int(axis) for axis in constants[node.input[1]].reshape(-1)] if node.input[1] in constants else None
    axes = node_attributes(node).get("axes")
    return list(axes) if axes else None


#: The opset from which each reduction `reduction_node` writes takes its axes as an input.
_AXES_AS_INPUT = {"ReduceMean": 18, "ReduceSum": 13}


def torch_layer_norm(source: str, axes: Sequence[int], epsilon: float, result: str, prefix: str,
                     scale: str | None = None, bias: str | None = None
                     ) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    """A LayerNormalization of `source` over `axes` into `result` in the nodes torch writes for
    one below opset 17, which rknn-toolkit2 fuses into its exNorm: (x - mean) / sqrt(mean((x -
    mean)^2) + epsilon), times `scale` and plus `bias` where given; its constants, named from
    `prefix`, and its nodes (ReduceMean's axes an attribute, as below opset 18)."""
    constants = [numpy_helper.from_array(np.array(2.0, np.float32), f"{prefix}/two"),
                 numpy_helper.from_array(np.array(epsilon, np.float32), f"{prefix}/epsilon")]
    normed = result if scale is None else f"{prefix}/normed"
    nodes = [helper.make_node("ReduceMean", [source], [f"{prefix}/mean"], f"{prefix}/mean", axes=list(axes)),
             helper.make_node("Sub", [source, f"{prefix}/mean"], [f"{prefix}/centred"], f"{prefix}/centred"),
             helper.make_node("Pow", [f"{prefix}/centred", f"{prefix}/two"], [f"{prefix}/square"], f"{prefix}/square"),
             helper.make_node("ReduceMean", [f"{prefix}/square"], [f"{prefix}/variance"], f"{prefix}/variance",
                              axes=list(axes)),
             helper.make_node("Add", [f"{prefix}/variance", f"{prefix}/epsilon"], [f"{prefix}/shifted"],
                              f"{prefix}/shifted"),
             helper.make_node("Sqrt", [f"{prefix}/shifted"], [f"{prefix}/deviation"], f"{prefix}/deviation"),
             helper.make_node("Div", [f"{prefix}/centred", f"{prefix}/deviation"], [normed], f"{prefix}/normed")]
    if scale is not None:
        scaled = result if bias is None else f"{prefix}/scaled"
        nodes.append(helper.make_node("Mul", [normed, scale], [scaled], f"{prefix}/scale"))
        if bias is not None:
            nodes.append(helper.make_node("Add", [scaled, bias], [result], f"{prefix}/bias"))
    return constants, nodes


def reshape_node(graph: onnx.GraphProto, source: str, shape: Sequence[int], result: str, name: str) -> onnx.NodeProto:
    """A Reshape of `source` to `shape` named `name`, its shape constant added to `graph`."""
    graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), f"{name}/shape"))
    return helper.make_node("Reshape", [source, f"{name}/shape"], [result], name)


def slice_node(graph: onnx.GraphProto, source: str, start: int, end: int, axis: int, result: str,
               name: str) -> onnx.NodeProto:
    """A Slice `name` of `source` from `start` to `end` along `axis` (opset >= 10: its bounds
    are inputs), its constants added to `graph`."""
    bounds = [numpy_helper.from_array(np.array([value], np.int64), f"{name}/{what}")
              for what, value in (("starts", start), ("ends", end), ("axes", axis))]
    graph.initializer.extend(bounds)
    return helper.make_node("Slice", [source, *(b.name for b in bounds)], [result], name)


def split_node(source: str, sizes: Sequence[int], results: Sequence[str], name: str, axis: int,
               opset: int) -> tuple[list[onnx.TensorProto], onnx.NodeProto]:
    """A Split `name` of `source` along `axis` into `results` of `sizes`, and the constant it reads
    its sizes from (opset >= 13: an input `name`/split; before, the attribute)."""
    if opset >= 13:
        sizes_constant = numpy_helper.from_array(np.array(sizes, np.int64), f"{name}/split")
        return [sizes_constant], helper.make_node("Split", [source, sizes_constant.name], list(results), name,
                                                  axis=axis)
    return [], helper.make_node("Split", [source], list(results), name, axis=axis, split=list(sizes))


def pointwise(conv: onnx.NodeProto, weight_shape: Sequence[int]) -> bool:
    """Whether `conv` (of weights of `weight_shape`) is a 1x1 Conv of one group, no padding and
    stride 1: a matrix product over the channels at each position."""
    attributes = node_attributes(conv)
    return (tuple(weight_shape[2:]) == (1, 1) and attributes.get("group", 1) == 1
            and not any(attributes.get("pads", ())) and all(v == 1 for v in attributes.get("strides", ()))
            and attributes.get("auto_pad", b"NOTSET") in (b"NOTSET", b""))


def uniform_channel_sum(conv: onnx.NodeProto, constants: dict[str, np.ndarray]) -> tuple[float, int] | None:
    """(w, K) when `conv` is a 1x1 Conv of one output channel (`pointwise`) whose K weights are
    all w: the plan's reductions over the channels (a mean's w = 1/K, a sum's 1, an L2
    normalization's scale); else None."""
    weights = constants.get(conv.input[1]) if conv.op_type == "Conv" and len(conv.input) > 1 else None
    if weights is None or weights.ndim != 4 or weights.shape[0] != 1 or not pointwise(conv, weights.shape) \
            or not np.all(weights == weights.flat[0]):
        return None
    return float(weights.flat[0]), weights.size


#: The channels of one float16 NC1HWC2 block (the C2 of every RKNPU2 target): rknn-toolkit2 2.5.0
#: keeps on its NPU the regroupings of a 4-D tensor's axes that keep its channels in whole blocks.
TOOLKIT_BLOCK = 8

#: Ops computing each element of their result from the same place in their inputs (numpy
#: broadcasting), which a unit axis inserted in every input leaves the same: liftable as they are.
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Sigmoid", "Relu", "Tanh",
                         "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Sin", "Cos", "Erf", "Identity",
                         "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Clip", "Floor", "Ceil"})
