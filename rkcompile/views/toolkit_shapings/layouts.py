"""TOOLKIT_SHAPINGS: rewrites of the exported graph, each keeping the values, from the forms
rknn-toolkit2 2.5.0 fails on, loops on or runs on its CPU into forms it builds on its NPU
(docs/deploy.md lists them, each with the toolkit's error or placement that called for it).
Each takes the model and returns how many places it changed."""
from __future__ import annotations

import functools

import itertools
from typing import NamedTuple, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.partitioned_onnx import proto_subgraphs
from rkcompile.views.proto_graph import all_nodes, drop_unread_nodes, nodes_rewritten, static_shapes


def slices_before_reshapes(model: onnx.ModelProto) -> int:
    """Move each Slice or Split that reads a Reshape before it, where the Reshape keeps the cut
    axis whole (it only regroups the axes around it): Slice(Reshape(x)) becomes
    Reshape(Slice(x)), Split(Reshape(x)) a Split of x and a Reshape per part, the same values.
    rknn-toolkit2 2.5.0 turns parallel Slices after a Reshape of a Conv into a Split and then
    fails on that Conv -> Reshape -> Split (its rule `seperate_conv_rs_split`, IndexError: the
    error it gives on yolov8n's box head), and on the Split our plan makes of such Slices.
    Returns how many Slices and Splits moved."""
    shapes = static_shapes(model)
    opset = _opset(model)
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
    'LayerNormalization' in its rule `convert_layernorm_to_exnorm`). On the ops it rebuilds as
    ONNX of an older opset (REBUILT_IN_AN_OLDER_OPSET), an attribute their first version lacks
    is left out. Returns how many nodes gained an attribute."""
    opset = _opset(model)
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
    shapes = static_shapes(model)
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
    return nodes_rewritten(graph, graph.node, written)


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
    return _reductions_written_back(model, "ReduceMean")


def sums_as_reduce_sums(model: onnx.ModelProto) -> int:
    """Write the plan's sum as a Conv, Reshape x -> [N, K, H, W] then a 1x1 Conv of weights
    all 1, one output channel and no bias, back as the ReduceSum of x over its axes that make
    K, as `means_as_reduce_means` writes a mean: the same values up to rounding. From the
    Conv of [N, K, 1, 1] rows rknn-toolkit2 2.5.0 holds the sums as one row [1, 1, 1, N] and
    runs on its CPU the Reshape that splits it into rows of a length not a multiple of 8
    (RT-DETR's deformable attention, its heads' sums over the sampled points regrouped into
    [1, 256, 1, 300] for the output projection: one CPU Reshape per decoder layer); from the
    ReduceSum it sums along the channels of a Transposed x on its NPU and keeps the Reshape
    there. A sum that is a graph output or that a Reshape or Transpose after it writes to one
    stays a Conv: from the ReduceSum the toolkit runs that Reshape to the output on its CPU,
    from the Conv on its NPU (PicoDet's box sides [1, 2100, 4]). Returns how many it wrote."""
    return _reductions_written_back(model, "ReduceSum", before_outputs=False)


def _reductions_written_back(model: onnx.ModelProto, reduction: str, before_outputs: bool = True) -> int:
    """Write each of the plan's means (`reduction` "ReduceMean") or sums ("ReduceSum") as a
    Conv back as `reduction`, as `means_as_reduce_means` describes, but for one that is a graph
    output or that a Reshape or Transpose writes to one unless `before_outputs`; returns how
    many."""
    shapes = static_shapes(model)
    graph = model.graph
    opset = _opset(model)
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    graph_outputs = _graph_outputs(graph)
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
                or not np.allclose(weights, 1.0 / grouped[1] if reduction == "ReduceMean" else 1.0,
                                   rtol=1e-6, atol=0) \
                or (bias is None and len(node.input) > 2 and node.input[2]) or (bias is not None and bias.any()):
            continue
        axes = _regrouped_axes(source, grouped[0], grouped[1])
        if axes is None:
            continue
        mean = [1 if axis in axes else size for axis, size in enumerate(source)]
        after = readers.get(node.output[0], [])
        if not before_outputs and (node.output[0] in graph_outputs or any(
                r.op_type in ("Reshape", "Transpose") and r.output[0] in graph_outputs for r in after)):
            continue
        replaced = (len(after) == 1 and after[0].op_type in ("Reshape", "Transpose")
                    and shapes.get(after[0].output[0]) == mean and node.output[0] not in graph_outputs)
        prefix = f"{node.name}/{reduction.lower()}"
        reshaped_after = (not replaced and mean != result and len(after) == 1 and after[0].op_type == "Reshape"
                          and node.output[0] not in graph_outputs)
        if replaced:
            target = after[0].output[0]
        elif mean == result:
            target = node.output[0]
        else:
            target = prefix
        written[id(node)] = [_reduce(graph, reduction, reshape.input[0], axes, target, prefix, opset)]
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
    return nodes_rewritten(graph, graph.node, written, removed)


def _reduce(graph: onnx.GraphProto, reduction: str, source: str, axes: Sequence[int], target: str, name: str,
            opset: int) -> onnx.NodeProto:
    """A `reduction` (ReduceMean or ReduceSum) `name` of `source` over `axes` keeping them, into
    `target`: its axes an input from the opset that made them one (18 for ReduceMean, 13 for
    ReduceSum; an initializer added to `graph`), an attribute before."""
    if opset < _AXES_AS_INPUT[reduction]:
        return helper.make_node(reduction, [source], [target], name, axes=list(axes), keepdims=1)
    axes_tensor = numpy_helper.from_array(np.array(axes, np.int64), f"{name}/axes")
    graph.initializer.append(axes_tensor)
    return helper.make_node(reduction, [source, axes_tensor.name], [target], name, keepdims=1)


#: The opset from which each reduction `_reduce` writes takes its axes as an input.
_AXES_AS_INPUT = {"ReduceMean": 18, "ReduceSum": 13}


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


def group_norms_on_their_planes(model: onnx.ModelProto) -> int:
    """Write the plan's norm of groups of channels, a Reshape of x [N, C, H, W] to [N*G, L, 1, 1]
    (G groups of L = C/G*H*W values, one per row), the rows normalized (a LayerNormalization
    over axis 1, or the mean and variance by 1x1 Convs of uniform weights and
    (x - mean) / sqrt(variance + eps)), then Reshapes and Muls and Adds by constants equal
    along each row (the norm's scale and bias) to x's shape, as a norm of the same statistics
    that keeps H and W apart (torchvision's GroupNorm; float32 rounding apart): the Reshape of x
    to [N, G, C/G*H, W], an InstanceNormalization and the Reshape back when C/G or H*W is a
    multiple of 8, else on x's own shape by per-channel means averaged within each group.
    rknn-toolkit2 2.5.0 runs both Reshapes of the plan's form on its CPU where H*W is not a
    multiple of 8 (FCOS's head at 10x10, 5x5, 3x3), and either form here on its NPU (the first
    as one exNorm of [N*G, C/G, H, W], whose Reshapes it runs on its CPU when neither size is a
    multiple of 8). Groups of one channel (an InstanceNormalization, or a norm of rows held
    as channels) stay as planned. Returns how many norms it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    readers = _readers(graph)
    graph_outputs = _graph_outputs(graph)
    opset = _opset(model)
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        source, view = shapes.get(node.input[0]), shapes.get(node.output[0])
        if node.op_type != "Reshape" or source is None or view is None or len(source) != 4 or len(view) != 4 \
                or view[2:] != [1, 1] or view[0] % source[0] or int(np.prod(view)) != int(np.prod(source)):
            continue
        batch, channels, height, width = source
        groups = view[0] // batch
        normed = _row_norm(node.output[0], view[1], readers, constants, graph_outputs)
        affine = _affine_to_shape(normed[0], normed[3:], source, shapes, readers, constants, graph_outputs) \
            if normed else None
        if affine is None or channels % groups or channels == groups:   # one channel a group: a row norm
            continue
        end, scale, bias = affine
        scale, bias = (values.reshape(batch, groups, -1) for values in (scale, bias))
        if any((values != values[:1, :, :1]).any() for values in (scale, bias)):
            continue   # the scale or bias differs within a group or between images
        group_norm = GroupNorm(node.input[0], source, groups, normed[1], scale[0, :, 0].astype(normed[2]),
                               bias[0, :, 0].astype(normed[2]), end.output[0])
        written[id(end)] = (_instance_norm_of_groups(graph, group_norm, f"{node.name}/instance_norm")
                            if channels // groups % 8 == 0 or height * width % 8 == 0
                            else _group_norm_by_channel_means(graph, group_norm, f"{node.name}/channel_means", opset))
    return nodes_rewritten(graph, originals, written)


class GroupNorm(NamedTuple):
    """A norm of `groups` groups of channels of `source` [N, C, H, W] (the mean and variance
    of each group's C/G*H*W values), then each group's scale and bias, into `result`."""
    source: str
    shape: list[int]
    groups: int
    epsilon: float
    scale: np.ndarray
    bias: np.ndarray
    result: str


def _instance_norm_of_groups(graph: onnx.GraphProto, norm: GroupNorm, prefix: str) -> list[onnx.NodeProto]:
    """`norm` as the Reshape of its source to [N, G, C/G*H, W], an InstanceNormalization and
    the Reshape back (rknn-toolkit2 2.5.0 makes it one exNorm of [N*G, C/G, H, W] on its NPU
    when C/G or H*W is a multiple of 8); its initializers added to `graph`."""
    batch, channels, height, width = norm.shape
    tensors = [numpy_helper.from_array(values, f"{prefix}/{what}") for what, values in (
        ("grouped_shape", np.array([batch, norm.groups, channels // norm.groups * height, width], np.int64)),
        ("scale", norm.scale), ("bias", norm.bias), ("shape", np.array(norm.shape, np.int64)))]
    graph.initializer.extend(tensors)
    grouped, normalized = f"{prefix}/grouped", f"{prefix}/normalized"
    return [helper.make_node("Reshape", [norm.source, tensors[0].name], [grouped], grouped),
            helper.make_node("InstanceNormalization", [grouped, tensors[1].name, tensors[2].name], [normalized],
                             prefix, epsilon=norm.epsilon),
            helper.make_node("Reshape", [normalized, tensors[3].name], [norm.result], f"{prefix}/reshape")]


def _group_norm_by_channel_means(graph: onnx.GraphProto, norm: GroupNorm, prefix: str,
                                 opset: int) -> list[onnx.NodeProto]:
    """`norm` on its source's own shape: each channel's mean over H, W (ReduceMean), their mean
    over the channel's group as each channel's group mean (a 1x1 Conv of weights 1/(C/G)
    within each group, 0 across), the same for the variance, then (x - mean) /
    sqrt(variance + eps) and the scale and bias per channel: the same statistics (each channel
    has H*W values). Its initializers added to `graph`."""
    channels = norm.shape[1]
    size = channels // norm.groups
    dtype = norm.scale.dtype
    within_groups = np.kron(np.eye(norm.groups), np.full((size, size), 1.0 / size)).astype(dtype)
    tensors = [numpy_helper.from_array(values, f"{prefix}/{what}") for what, values in (
        ("group_mean_weight", within_groups.reshape(channels, channels, 1, 1)),
        ("epsilon", np.array(norm.epsilon, dtype)),
        ("scale", np.repeat(norm.scale, size).reshape(1, channels, 1, 1)),
        ("bias", np.repeat(norm.bias, size).reshape(1, channels, 1, 1)))]
    graph.initializer.extend(tensors)
    names = {what: f"{prefix}/{what}" for what in ("channel_means", "means", "centred", "squares", "channel_variances",
                                                   "variances", "shifted", "deviations", "normalized", "scaled")}
    return [
        _reduce(graph, "ReduceMean", norm.source, [2, 3], names["channel_means"], names["channel_means"], opset),
        helper.make_node("Conv", [names["channel_means"], tensors[0].name], [names["means"]], names["means"]),
        helper.make_node("Sub", [norm.source, names["means"]], [names["centred"]], names["centred"]),
        helper.make_node("Mul", [names["centred"], names["centred"]], [names["squares"]], names["squares"]),
        _reduce(graph, "ReduceMean", names["squares"], [2, 3], names["channel_variances"], names["channel_variances"],
                opset),
        helper.make_node("Conv", [names["channel_variances"], tensors[0].name], [names["variances"]],
                         names["variances"]),
        helper.make_node("Add", [names["variances"], tensors[1].name], [names["shifted"]], names["shifted"]),
        helper.make_node("Sqrt", [names["shifted"]], [names["deviations"]], names["deviations"]),
        helper.make_node("Div", [names["centred"], names["deviations"]], [names["normalized"]], names["normalized"]),
        helper.make_node("Mul", [names["normalized"], tensors[2].name], [names["scaled"]], names["scaled"]),
        helper.make_node("Add", [names["scaled"], tensors[3].name], [norm.result], f"{prefix}/bias")]


def _row_norm(rows: str, length: int, readers: dict[str, list[onnx.NodeProto]], constants: dict[str, np.ndarray],
              graph_outputs: set[str]) -> tuple[str, float, np.dtype, float, float] | None:
    """(the result, epsilon, the float type, scale, bias) of the plan's norm of each row of `rows`
    [R, length, 1, 1], times a scale plus a bias: a LayerNormalization over axis 1 of one
    scale and one bias value, or centred = rows + Conv(rows) by weights -1/length, then
    centred / Sqrt(the mean of centred * centred by a Conv of weights 1/length, plus epsilon
    as its bias or an Add), of scale 1 and bias 0; None when `rows` is read otherwise or the
    norm's steps are read outside it."""
    def only(name: str, op_type: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type and name not in graph_outputs else None

    def mean(conv: onnx.NodeProto | None, weight: float) -> np.ndarray | None:
        """The weights of `conv` when it is a 1x1 Conv of one channel, every weight `weight`."""
        weights = constants.get(conv.input[1]) if conv is not None and conv.op_type == "Conv" else None
        if weights is None or weights.shape != (1, length, 1, 1) or not _pointwise(conv, weights.shape) \
                or not np.allclose(weights, weight, rtol=1e-6, atol=0):
            return None
        return weights

    first = readers.get(rows, [])
    if len(first) == 1 and first[0].op_type == "LayerNormalization" and rows not in graph_outputs:
        return _layer_norm_of_rows(first[0], constants)
    centring = next((r for r in first if r.op_type == "Conv"), None)
    centre = next((r for r in first if r.op_type == "Add"), None)
    if rows in graph_outputs or len(first) != 2 or mean(centring, -1.0 / length) is None or centre is None \
            or sorted(centre.input) != sorted([rows, centring.output[0]]) \
            or (len(centring.input) > 2 and centring.input[2] and constants.get(centring.input[2], np.ones(1)).any()) \
            or only(centring.output[0], "Add") is not centre:
        return None
    centred = centre.output[0]
    users = list({id(user): user for user in readers.get(centred, [])}.values())   # the square reads it twice
    square = next((r for r in users if r.op_type == "Mul" and list(r.input) == [centred, centred]), None)
    divide = next((r for r in users if r.op_type == "Div" and r.input[0] == centred), None)
    variance = only(square.output[0], "Conv") if square is not None else None
    weights = mean(variance, 1.0 / length)
    if len(users) != 2 or divide is None or weights is None or centred in graph_outputs:
        return None
    if len(variance.input) > 2 and variance.input[2]:
        epsilon, shifted = constants.get(variance.input[2]), variance
    else:
        shifted = only(variance.output[0], "Add")
        epsilon = constants.get(next((n for n in shifted.input if n != variance.output[0]), "")) if shifted else None
    root = only(shifted.output[0], "Sqrt") if epsilon is not None and epsilon.size == 1 else None
    if root is None or only(root.output[0], "Div") is not divide or divide.input[1] != root.output[0]:
        return None
    return divide.output[0], float(epsilon.reshape(-1)[0]), weights.dtype, 1.0, 0.0


def _layer_norm_of_rows(norm: onnx.NodeProto, constants: dict[str, np.ndarray]) -> tuple[str, float, np.dtype, float,
                                                                                            float] | None:
    """(the result, epsilon, the float type, scale, bias) of `norm`, a LayerNormalization over
    the axes from 1 of a [R, L, 1, 1] view, when its scale is one value and its bias one value
    (or none); else None."""
    attributes = {a.name: helper.get_attribute_value(a) for a in norm.attribute}
    scale = constants.get(norm.input[1])
    bias = constants.get(norm.input[2]) if len(norm.input) > 2 and norm.input[2] else np.zeros(1, np.float32)
    if attributes.get("axis", -1) not in (1, -3) or scale is None or bias is None \
            or (scale != scale.reshape(-1)[0]).any() or (bias != bias.reshape(-1)[0]).any():
        return None
    return (norm.output[0], float(attributes.get("epsilon", 1e-5)), scale.dtype, float(scale.reshape(-1)[0]),
            float(bias.reshape(-1)[0]))


def _affine_to_shape(start: str, affine: Sequence[float], shape: list[int], shapes: dict[str, list[int]],
                     readers: dict[str, list[onnx.NodeProto]], constants: dict[str, np.ndarray],
                     graph_outputs: set[str]) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray] | None:
    """(the last node, scale, bias) of the chain of Reshapes and of Muls and Adds by constants
    that `start` alone feeds, up to a Reshape to `shape`: (`start` * a + b, with `affine` (a,
    b)) through that chain is the `start` of the norm * scale + bias, `scale` and `bias` flat
    in the elements' order (Reshapes keep it); None when `start` reaches `shape` otherwise."""
    scale, bias = (np.full(int(np.prod(shape)), value, np.float64) for value in affine)
    name = start
    while len(readers.get(name, [])) == 1 and name not in graph_outputs and name in shapes:
        node, current = readers[name][0], shapes[name]
        if node.op_type == "Reshape" and shapes.get(node.output[0]) == list(shape):
            return node, scale, bias
        if node.op_type in ("Mul", "Add") and list(node.input).count(name) == 1:
            operand = constants.get(next(n for n in node.input if n != name))
            if operand is None or shapes.get(node.output[0]) != current \
                    or list(np.broadcast_shapes(operand.shape, current)) != current:
                return None
            values = np.broadcast_to(operand, current).reshape(-1)
            scale, bias = (scale * values, bias * values) if node.op_type == "Mul" else (scale, bias + values)
        elif node.op_type != "Reshape":
            return None
        name = node.output[0]
    return None


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
    return nodes_rewritten(graph, originals, written)


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
    return nodes_rewritten(graph, originals, written)


def gathers_as_slices(model: onnx.ModelProto) -> int:
    """Write a Gather of one constant non-negative index given as a 1-D array (the axis kept)
    as the Slice of that index: the same values. rknn-toolkit2 2.5.0 runs a Reshape it adds
    after the last of such Gathers on its CPU (tv_swin_nano's qkv split: 6 CPU layers), and
    none after Slices. Returns how many Gathers it wrote."""
    graph = model.graph
    opset = _opset(model)
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
    shapes = static_shapes(model)
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
    return nodes_rewritten(graph, graph.node, written)


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


def _opset(model: onnx.ModelProto) -> int:
    """The version of the ai.onnx opset `model` imports."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 1)


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


def binned_sums_as_grouped_convs(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of one output channel over a Softmax across the K channels of
    T = [1, K, G, N], where T is a chain of Reshapes and Transposes of a tensor X holding the
    values in the order [G, K, N] (YOLOv8's DFL: G box sides of K bins, N boxes), as the Softmax
    along axis 2 of X reshaped to [1, G, K, N], then a Conv of G groups of the Conv's weights
    tiled, and a Reshape to the Conv's shape [1, 1, G, N]: the same values up to float32
    rounding. rknn-toolkit2 2.5.0 runs the Transposed form on its batch axis ([G, K, 1, N]),
    carries that layout down to where the boxes join the class scores, and runs on its CPU the
    Reshape of the scores into it. Returns how many Convs it wrote."""
    if _opset(model) < 13:   # a Softmax of opset < 13 normalizes over every axis from `axis` on
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    made_by = {name: node for node in graph.node for name in node.output}
    readers = _readers(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        weight = constants.get(node.input[1]) if node.op_type == "Conv" else None
        softmax = made_by.get(node.input[0]) if weight is not None else None
        if softmax is None or softmax.op_type != "Softmax" or weight.shape[0] != 1 \
                or not _pointwise(node, weight.shape) or len(readers[softmax.output[0]]) != 1:
            continue
        shape = shapes.get(softmax.input[0])
        axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
        if shape is None or len(shape) != 4 or shape[0] != 1 or axis % 4 != 1 or node.output[0] not in shapes:
            continue
        _, bins, sides, boxes = shape
        source = _moved_from(softmax.input[0], made_by, shapes, constants,
                             np.arange(bins * sides * boxes).reshape(sides, bins, boxes).transpose(1, 0, 2))
        if source is None:
            continue
        prefix = f"{node.name}/grouped"
        tensors = [numpy_helper.from_array(np.array(values, np.int64), f"{prefix}/{what}") for what, values in (
            ("sides_first_shape", [1, sides, bins, boxes]), ("channels_shape", [1, sides * bins, 1, boxes]),
            ("conv_shape", shapes[node.output[0]]))]
        tensors.append(numpy_helper.from_array(np.tile(weight, (sides, 1, 1, 1)), f"{prefix}/weight"))
        bias = [node.input[2]] if len(node.input) > 2 and node.input[2] else []
        if bias:
            tensors.append(numpy_helper.from_array(np.tile(constants[bias[0]], sides), f"{prefix}/bias"))
        graph.initializer.extend(tensors)
        names = [f"{prefix}/{what}" for what in ("sides_first", "softmax", "channels", "conv")]
        written[id(node)] = [
            helper.make_node("Reshape", [source, tensors[0].name], [names[0]], names[0]),
            helper.make_node("Softmax", [names[0]], [names[1]], names[1], axis=2),
            helper.make_node("Reshape", [names[1], tensors[1].name], [names[2]], names[2]),
            helper.make_node("Conv", [names[2], tensors[3].name, *(t.name for t in tensors[4:])], [names[3]], names[3],
                             kernel_shape=[1, 1], group=sides),
            helper.make_node("Reshape", [names[3], tensors[2].name], [node.output[0]], f"{prefix}/reshape")]
    return nodes_rewritten(graph, originals, written)


def _moved_from(name: str, made_by: dict[str, onnx.NodeProto], shapes: dict[str, list[int]],
                constants: dict[str, np.ndarray], order: np.ndarray) -> str | None:
    """The tensor that the chain of Reshapes and Transposes ending at `name` starts from, when
    the chain moves its elements, in order, to the positions `order` gives (the index of each
    element of `name`, in the start's row-major order); else None."""
    chain, start = [], name
    while start in made_by and made_by[start].op_type in ("Reshape", "Transpose") \
            and (made_by[start].op_type == "Transpose" or made_by[start].input[1] in constants):
        chain.append(made_by[start])
        start = made_by[start].input[0]
    if start not in shapes:
        return None
    moved = np.arange(int(np.prod(shapes[start]))).reshape(shapes[start])
    for node in reversed(chain):
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            moved = moved.transpose(perm)
        elif node.output[0] in shapes:
            moved = moved.reshape(shapes[node.output[0]])
        else:
            return None
    return start if chain and moved.size == order.size and (moved.reshape(-1) == order.reshape(-1)).all() else None


def flattened_planes_padded(model: onnx.ModelProto) -> int:
    """Write a Reshape of [1, C, H, W] that merges H and W into its innermost axis (each of the
    C planes one row of the result), when neither C nor H*W is a multiple of 8, as a Pad of
    e zero rows below each plane, the fewest for (H+e)*W to be a multiple of 8, the Reshape to
    rows of (H+e)*W, then a Slice of their first H*W: the same values. rknn-toolkit2 2.5.0 runs
    the Reshape on its CPU (a YOLO head's 10x10 grid of 1 or 51 channels at 320x320), the
    padded one on its NPU. Not for a plane of one row or column ([1, 1, 3234, 1], ssdlite's
    decoded box sides): the toolkit runs that Pad on its CPU. Returns how many Reshapes it wrote."""
    if _opset(model) < 11:   # Pad takes its pads as an input from opset 11
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        source, result = shapes.get(node.input[0]), shapes.get(node.output[0])
        if node.op_type != "Reshape" or source is None or result is None or len(source) != 4:
            continue
        batch, channels, height, width = source
        plane = height * width
        if batch != 1 or result[-1] != plane or int(np.prod(result[:-1])) != channels or channels % 8 == 0 \
                or plane % 8 == 0 or min(height, width) == 1:
            continue
        rows = next(extra for extra in range(1, 8) if (height + extra) * width % 8 == 0)
        prefix = f"{node.name}/padded"
        tensors = [numpy_helper.from_array(np.array(values, np.int64), f"{prefix}/{what}") for what, values in (
            ("pads", [0, 0, 0, 0, 0, 0, rows, 0]), ("shape", [*result[:-1], (height + rows) * width]),
            ("starts", [0]), ("ends", [plane]), ("axes", [len(result) - 1]))]
        graph.initializer.extend(tensors)
        padded, flattened = f"{prefix}/pad", f"{prefix}/reshape"
        written[id(node)] = [
            helper.make_node("Pad", [node.input[0], tensors[0].name], [padded], padded),
            helper.make_node("Reshape", [padded, tensors[1].name], [flattened], flattened),
            helper.make_node("Slice", [flattened, *(t.name for t in tensors[2:])], list(node.output),
                             f"{prefix}/slice")]
    return nodes_rewritten(graph, originals, written)


def splits_of_concats_bypassed(model: onnx.ModelProto) -> int:
    """Let the readers of each part of a Split that cuts a Concat's result back into the
    Concat's inputs (the same axis, the same sizes) read those inputs: the same values.
    torchvision's detectors join the heads' levels and split them again; the plan keeps the
    pair, which ties each level's Reshape of [1, H, W, A*K] into [1, H*W*A, 1, K] (a Reshape
    rknn-toolkit2 2.5.0 runs on its CPU) to the ops after the Split, so that neither
    `reshapes_after_elementwise_ops` nor the host tail can take it off the toolkit's hands. Returns
    how many Splits it bypassed."""
    shapes = static_shapes(model)
    graph = model.graph
    made_by = {name: node for node in graph.node for name in node.output}
    graph_outputs = _graph_outputs(graph)
    bypassed = {}
    for node in graph.node:
        concat = made_by.get(node.input[0]) if node.op_type == "Split" else None
        rank = len(shapes.get(node.input[0], ()))
        if concat is None or concat.op_type != "Concat" or not rank or len(concat.input) != len(node.output) \
                or any(name in graph_outputs for name in node.output):
            continue
        axes = [next((a.i for a in n.attribute if a.name == "axis"), 0) % rank for n in (node, concat)]
        if axes[0] == axes[1] and all(shapes.get(part) is not None and shapes.get(part) == shapes.get(piece)
                                      for part, piece in zip(node.output, concat.input)):
            bypassed.update(zip(node.output, concat.input))
    for node in graph.node:
        node.input[:] = [bypassed.get(name, name) for name in node.input]
    drop_unread_nodes(graph)   # the pairs, so that each Concat input keeps its one reader
    return len(set(made_by[name].name for name in bypassed))


def reshapes_after_elementwise_ops(model: onnx.ModelProto) -> int:
    """Write an element-by-element op whose variable inputs are each a Reshape's result (its
    only reader), its constants of one value or of as many as the result, and whose result
    reaches a graph output through Reshapes and element-by-element ops alone, as that op on
    the Reshapes' inputs (the constants reshaped alike; an input Transposed where that brings
    its elements to the others'), then a Reshape to its result's shape, when each element
    meets the same operands so (`_lifted_layout`): the same values; again,
    until no such op is left. The Reshapes then end the output, where the host tail
    (`--host-tail`) hands them to the host part: rknn-toolkit2 2.5.0 runs on its CPU a Reshape
    that splits the channels of [1, H, W, A*K] into [1, H*W*A, 1, K] (a detector head's anchors
    and classes before their Sigmoid, at 10x10 and smaller), and one into an output of rank 2
    (faster-rcnn's proposal sides before their anchors' scale and offset, FCOS's scores before
    their product with the centreness), and the centreness [1, 1, H, W] Reshaped into
    [1, H*W, 1, 1] to meet the scores, where it runs the Transpose into the scores' layout
    [H, W, 1, 1] on its NPU. Returns how many ops it moved before Reshapes."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    graph_outputs = _graph_outputs(graph)
    moved = 0
    while True:
        nodes = list(graph.node)
        made_by = {name: index for index, node in enumerate(nodes) for name in node.output}
        readers = _readers(graph)

        def reshaped_to_output(name: str) -> bool:
            after = readers.get(name, [])
            return name in graph_outputs or (len(after) == 1 and after[0].op_type in _ELEMENTWISE | {"Reshape"}
                                             and reshaped_to_output(after[0].output[0]))

        def lifted(node: onnx.NodeProto) -> tuple[list[int], list[tuple[int, ...] | None]] | None:
            variables = [name for name in node.input if name and name not in constants]
            reshapes = [nodes[made_by[name]] if name in made_by else None for name in variables]
            if node.op_type not in _ELEMENTWISE or not variables or node.output[0] not in shapes \
                    or any(r is None or r.op_type != "Reshape" or len(readers[r.output[0]]) != 1
                           or r.output[0] in graph_outputs or r.input[0] not in shapes for r in reshapes) \
                    or not reshaped_to_output(node.output[0]):
                return None
            return _lifted_layout(shapes[node.output[0]], [(shapes[name], shapes[r.input[0]])
                                                           for name, r in zip(variables, reshapes)],
                                  [constants[name].size for name in node.input if name in constants])

        found = next(((index, layout) for index, node in enumerate(nodes) if (layout := lifted(node)) is not None),
                     None)
        if found is None:
            return moved
        at, (shape, perms) = found
        node = onnx.NodeProto()
        node.CopyFrom(nodes[at])
        prefix = f"{node.name}/before_reshape/{moved}"
        reshapes = {made_by[name] for name in node.input if name and name not in constants}
        transposes = []
        perm_of = dict(zip([name for name in node.input if name and name not in constants], perms))
        for index, name in enumerate(node.input):
            if name in constants and constants[name].size > 1:
                tensor = numpy_helper.from_array(constants[name].reshape(shape), f"{prefix}/operand_{index}")
                graph.initializer.append(tensor)
                node.input[index] = tensor.name
            elif perm_of.get(name) is not None:   # its elements reach the others' layout by a Transpose
                transposes.append(helper.make_node("Transpose", [nodes[made_by[name]].input[0]],
                                                   [f"{prefix}/transpose_{index}"], f"{prefix}/transpose_{index}",
                                                   perm=list(perm_of[name])))
                node.input[index] = transposes[-1].output[0]
            elif name in perm_of:
                node.input[index] = nodes[made_by[name]].input[0]
        result_shape = numpy_helper.from_array(np.array(shapes[node.output[0]], np.int64), f"{prefix}/shape")
        graph.initializer.append(result_shape)
        reshape = helper.make_node("Reshape", [prefix, result_shape.name], [node.output[0]], f"{prefix}/reshape")
        node.output[0] = prefix
        shapes[prefix] = shape
        written = [new for index, old in enumerate(nodes) if index not in reshapes
                   for new in ([*transposes, node, reshape] if index == at else [old])]
        del graph.node[:]
        graph.node.extend(written)
        moved += 1


def _lifted_layout(result: list[int], operands: list[tuple[list[int], list[int]]],
                   constant_sizes: list[int]) -> tuple[list[int], list[tuple[int, ...] | None]] | None:
    """The shape of an element-by-element op's result on the inputs of the Reshapes that give
    it its operands (`operands`: each operand's shape and its Reshape's input's), and for each
    operand None or the perm of a Transpose of that input: when each element of that result,
    in order, meets the operands' same elements as the op's `result` does (the shape the
    inputs broadcast to, else that of the one input of the result's size), and each constant
    (of `constant_sizes`) has one value or as many as the result; else None."""
    size = int(np.prod(result))
    if any(c not in (1, size) for c in constant_sizes):
        return None
    try:
        shape = list(np.broadcast_shapes(*(source for _, source in operands)))
    except ValueError:
        shape = []
    if int(np.prod(shape)) != size:
        shape = next((list(source) for _, source in operands if int(np.prod(source)) == size), None)
    if shape is None:
        return None
    perms = []
    for operand, source in operands:
        order = np.arange(int(np.prod(operand))).reshape(operand)
        wanted = np.broadcast_to(order, result).reshape(-1)
        candidates = [None, *(p for p in itertools.permutations(range(len(source))) if list(p) != sorted(p))] \
            if len(source) == len(shape) else [None]
        perm = next((p for p in candidates if _meets(order.reshape(source), p, shape, wanted)), False)
        if perm is False:
            return None
        perms.append(perm)
    return shape, perms


def _meets(elements: np.ndarray, perm: tuple[int, ...] | None, shape: list[int], wanted: np.ndarray) -> bool:
    """Whether `elements` (indices), transposed by `perm` if any and broadcast to `shape`, are
    `wanted` in order."""
    moved = elements.transpose(perm) if perm is not None else elements
    try:
        return bool(np.array_equal(np.broadcast_to(moved, shape).reshape(-1), wanted))
    except ValueError:
        return False

#: Ops computing each element of their result from the same place in their inputs (numpy
#: broadcasting), which a unit axis inserted in every input leaves the same: liftable as they are.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Sigmoid", "Relu", "Tanh",
                          "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Sin", "Cos", "Erf", "Identity",
                          "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Clip", "Floor", "Ceil"})
#: Ops with an axis, liftable with that axis renumbered.
_ALONG_AN_AXIS = frozenset({"Concat", "Split", "Softmax", "Slice"})


def rank3_tails_as_rank4(model: onnx.ModelProto) -> int:
    """Give each rank-3 tensor [a, b, c] of a region that starts at Reshapes and ends at graph
    outputs or Reshapes, through element-by-element ops, Concat, Split, Slice and Softmax, a
    unit axis: [a, b, 1, c], its constants reshaped alike, and each such output a Reshape back
    to its shape (the same values: the elements keep their order). rknn-toolkit2 2.5.0 holds a
    rank-3 tensor read by such ops as [b, 1, 1, c] (its rules `unsqueeze_to_4d_*`), one its
    Reshapes write as [a, b, h, c/h], and runs on its CPU the Reshape from one layout to the
    other (a YOLO head at 320x320: the class scores joining the decoded boxes). A region with a
    reader of another kind stays as it is. Returns how many nodes it lifted."""
    shapes = static_shapes(model)
    opset = _opset(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    subgraph_reads = {name for node in graph.node for sub in proto_subgraphs(node) for inner in all_nodes(sub)
                      for name in inner.input}
    region_of: dict[str, int] = {}              # a liftable tensor -> its region (union-find root)
    parent: dict[int, int] = {}
    liftable: list[onnx.NodeProto] = []
    blocked: set[int] = set()

    def root(region: int) -> int:
        while parent[region] != region:
            region = parent[region]
        return region

    for node in graph.node:
        variables = [name for name in node.input if name and name not in constants]
        outputs_rank3 = all(len(shapes.get(name, ())) == 3 for name in node.output if name)
        if node.op_type == "Reshape" and node.input[1] in constants and outputs_rank3:
            regions = []
        elif (node.op_type in _ELEMENTWISE or node.op_type in _ALONG_AN_AXIS) and outputs_rank3 and variables \
                and all(name in region_of for name in variables) and _liftable_constants(node, constants):
            regions = [root(region_of[name]) for name in variables]
        else:
            if not _reads_any_rank(node, constants):
                blocked.update(root(region_of[name]) for name in variables if name in region_of)
            continue
        region = regions[0] if regions else len(parent)
        parent.setdefault(region, region)
        for other in regions[1:]:
            parent[root(other)] = region
        for name in node.output:
            if name:
                region_of[name] = region
        liftable.append(node)
    blocked.update(root(region_of[name]) for name in subgraph_reads if name in region_of)
    kept_nodes = [node for node in liftable if root(region_of[node.output[0]]) not in blocked]
    computing = {root(region_of[node.output[0]]) for node in kept_nodes if node.op_type != "Reshape"}
    kept_nodes = [node for node in kept_nodes if root(region_of[node.output[0]]) in computing]
    for node in kept_nodes:
        _lift(node, shapes, constants, graph, opset)
    lifted = {name for node in kept_nodes for name in node.output if name}
    kept_infos = [info for info in graph.value_info if info.name not in lifted]   # the converter's, of rank 3
    del graph.value_info[:]
    graph.value_info.extend(kept_infos)
    for output in graph.output:
        if output.name in lifted:
            four_d = f"{output.name}/rank4"
            for node in graph.node:
                node.input[:] = [four_d if name == output.name else name for name in node.input]
                node.output[:] = [four_d if name == output.name else name for name in node.output]
            shape = numpy_helper.from_array(np.array(shapes[output.name], np.int64), f"{output.name}/rank3_shape")
            graph.initializer.append(shape)
            graph.node.append(helper.make_node("Reshape", [four_d, shape.name], [output.name], f"{output.name}/rank3"))
    return len(kept_nodes)


def _reads_any_rank(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` is a Reshape to a constant shape that copies no input dimension past the
    second (a 0 there): one that reads its input's elements in order, whatever its rank."""
    if node.op_type != "Reshape" or node.input[1] not in constants:
        return False
    allow_zero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
    return bool(allow_zero) or 0 not in constants[node.input[1]].reshape(-1)[2:].tolist()


def _unit_axis_inserted(shape: Sequence[int]) -> list[int]:
    """`shape` (rank 3, or of lower rank broadcast against one) with a unit axis before its last."""
    return [*shape[:-1], 1, shape[-1]] if len(shape) >= 2 else list(shape)


def _liftable_constants(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether the constant operands of `node` stay right with a unit axis inserted: operands
    of at most rank 3 of an element-by-element op, of rank 3 of a Concat, the bounds of a
    Slice."""
    if node.op_type in _ELEMENTWISE:
        return all(constants[name].ndim <= 3 for name in node.input if name in constants)
    if node.op_type == "Concat":
        return all(constants[name].ndim == 3 for name in node.input if name in constants)
    if node.op_type == "Slice":   # axes absent (every axis from 0) or given as a constant
        return len(node.input) < 4 or not node.input[3] or node.input[3] in constants
    return True


def _rank4_axis(axis: int) -> int:
    """Axis `axis` of a rank-3 tensor numbered in the tensor with a unit axis before its last."""
    return (0, 1, 3)[axis % 3]


def _lift(node: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray],
          graph: onnx.GraphProto, opset: int) -> None:
    """Rewrite `node` for its rank-3 inputs and outputs each given a unit axis before the last."""
    def constant(name: str, value: np.ndarray) -> str:
        tensor = numpy_helper.from_array(value, f"{node.name or node.output[0]}/{name}")
        graph.initializer.append(tensor)
        return tensor.name

    if node.op_type == "Reshape":
        node.input[1] = constant("rank4_shape", np.array(_unit_axis_inserted(shapes[node.output[0]]), np.int64))
        return
    if node.op_type in _ELEMENTWISE or node.op_type == "Concat":
        node.input[:] = [
            constant(f"rank4_operand_{index}", constants[name].reshape(_unit_axis_inserted(constants[name].shape)))
            if name in constants and constants[name].ndim >= 2 else name for index, name in enumerate(node.input)]
        if node.op_type in _ELEMENTWISE:
            return
    attributes = {a.name: a for a in node.attribute}
    if node.op_type == "Slice" and len(node.input) > 1:
        given = len(node.input) > 3 and node.input[3]
        axes = constants[node.input[3]] if given else np.arange(constants[node.input[1]].size)
        axes_input = constant("rank4_axes", np.array([_rank4_axis(int(a)) for a in axes.reshape(-1)], np.int64))
        node.input[:] = [*node.input[:3], axes_input, *node.input[4:]]
    elif node.op_type == "Slice":
        axes = helper.get_attribute_value(attributes["axes"]) if "axes" in attributes \
            else range(len(helper.get_attribute_value(attributes["starts"])))
        _set_attribute(node, "axes", [_rank4_axis(int(a)) for a in axes])
    else:
        default = (-1 if opset >= 13 else 1) if node.op_type == "Softmax" else 0
        axis = helper.get_attribute_value(attributes["axis"]) if "axis" in attributes else default
        _set_attribute(node, "axis", _rank4_axis(axis))


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    """Set attribute `name` of `node` to `value`, replacing the one it has."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def token_rows_as_sequences(model: onnx.ModelProto) -> int:
    """Write the plan's tokens held as rows [R, C, 1, 1] (a transformer's [P, N, C] tokens,
    each Linear a 1x1 Conv) back as the sequences [P, N, C] they were: each region of rows the
    Reshapes into them start and Reshapes out of them end, computed by LayerNormalizations
    over the channels, 1x1 Convs and element-by-element ops of per-channel constants
    (`_TokenRegion`), its Reshapes in writing [P, N, C] (N the axis before the channels of
    the tensor one of them reads), each LayerNormalization over the last axis, each Conv a
    MatMul (then an Add of its bias): the same values up to float32 rounding. From the rows
    rknn-toolkit2 2.5.0 holds the tokens as one row [1, C, 1, R] and runs on its CPU the
    Reshape of the patches into it (MobileViT's unfold of each block, [640, 8, 2, 2] into
    [1, 80, 1, 256]) and the one its fold makes back; from the sequences it holds them as
    [P, C, 1, N] and keeps both on its NPU. Returns how many ops it wrote so."""
    shapes = static_shapes(model)
    graph = model.graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    found = _TokenRegion.all_in(graph, shapes, constants)
    written: dict[int, list[onnx.NodeProto]] = {}
    for region in found:
        for entry in region.entries:
            shape = numpy_helper.from_array(np.array([*region.sequences, shapes[entry.output[0]][1]], np.int64),
                                            f"{entry.name}/sequences_shape")
            graph.initializer.append(shape)
            entry.input[1] = shape.name
        for node in region.ops:
            written[id(node)] = _on_sequences(node, graph, constants)
    return nodes_rewritten(graph, graph.node, written)


class _TokenRegion(NamedTuple):
    """Rows [R, C, 1, 1] that `token_rows_as_sequences` writes as sequences: the Reshapes
    writing them from other shapes (`entries`), the ops computing them from those (`ops`),
    and the sequences' [P, N]."""
    entries: list[onnx.NodeProto]
    ops: list[onnx.NodeProto]
    sequences: tuple[int, int]

    @staticmethod
    def all_in(graph: onnx.GraphProto, shapes: dict[str, list[int]],
               constants: dict[str, np.ndarray]) -> list["_TokenRegion"]:
        """The regions of rows in `graph`: each the tensors of [R, *, 1, 1] that reach one
        another through its ops, none a graph output, each made by a Reshape from another
        shape or by an op a region may hold (`_on_rows`), each read by such ops or by
        Reshapes, a LayerNormalization among the ops (a transformer's tokens: the rows of a
        sum over bins, Reshaped to an output, stay, as `sums_as_reduce_sums` says); its
        [P, N] from an entry's source [..., N, C]."""
        readers = _readers(graph)
        made_by = {name: node for node in graph.node for name in node.output}
        outputs = _graph_outputs(graph)

        def rows(name: str) -> bool:
            return name not in constants and _is_rows(shapes.get(name))

        def entry(node: onnx.NodeProto | None) -> bool:
            return node is not None and node.op_type == "Reshape" and not rows(node.input[0]) \
                and node.input[0] in shapes

        regions, seen = [], set()
        for start in graph.node:
            if not entry(start) or not rows(start.output[0]) or start.output[0] in seen:
                continue
            count = shapes[start.output[0]][0]
            entries, ops, tensors, pending, whole = {}, {}, set(), [start.output[0]], True
            while pending and whole:
                name = pending.pop()
                if name in tensors:
                    continue
                tensors.add(name)
                producer = made_by.get(name)
                if not rows(name) or shapes[name][0] != count or name in outputs or producer is None:
                    whole = False
                elif entry(producer):
                    entries[id(producer)] = producer
                elif _on_rows(producer, shapes, constants):
                    ops[id(producer)] = producer
                    pending.extend(n for n in producer.input if n and n not in constants)
                else:
                    whole = False
                for reader in readers.get(name, []):
                    if reader.op_type == "Reshape" and reader.input[0] == name:
                        continue
                    if not _on_rows(reader, shapes, constants):
                        whole = False
                    pending.extend([*(n for n in reader.input if n and n not in constants), *reader.output])
            seen.update(tensors)
            sources = [shapes[e.input[0]] for e in entries.values()
                       if len(shapes[e.input[0]]) >= 2 and shapes[e.input[0]][-1] == shapes[e.output[0]][1]]
            normalized = any(op.op_type == "LayerNormalization" for op in ops.values())
            if whole and normalized and sources and count % sources[0][-2] == 0 and 1 < sources[0][-2] < count:
                length = sources[0][-2]
                regions.append(_TokenRegion(list(entries.values()), list(ops.values()), (count // length, length)))
        return regions


def _on_rows(node: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` computes each row [C, 1, 1] of its rows [R, C, 1, 1] from that row of
    its variable inputs alone, by an op that works alike on sequences [P, N, C]: a
    LayerNormalization over the channels, a 1x1 Conv of constant weights, or an
    element-by-element op of inputs of its result's shape and constants of one value or one a
    channel."""
    result = shapes.get(node.output[0])
    if result is None or len(node.output) != 1 or len(result) != 4:
        return False
    channels = result[1]
    if node.op_type == "LayerNormalization":
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        return axis in (1, -3) and node.input[0] not in constants \
            and all(name in constants and constants[name].size == channels for name in node.input[1:] if name)
    if node.op_type == "Conv":
        return node.input[0] not in constants and node.input[1] in constants \
            and _pointwise(node, constants[node.input[1]].shape) \
            and all(name in constants for name in node.input[2:] if name)
    return node.op_type in _ELEMENTWISE and all(
        _per_channel(constants[name], channels) if name in constants else shapes.get(name) == result
        for name in node.input if name)


def _per_channel(values: np.ndarray, channels: int) -> bool:
    """Whether `values` broadcast over rows [R, C, 1, 1] gives each channel one value."""
    return values.size == 1 or (values.size == channels and values.shape[-3:] == (channels, 1, 1))


def _on_sequences(node: onnx.NodeProto, graph: onnx.GraphProto,
                  constants: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    """The nodes computing `node`, an op `_on_rows` accepts, on sequences [P, N, C]: its
    constants as vectors (initializers added to `graph`), a Conv as a MatMul then an Add of
    its bias."""
    if node.op_type == "Conv":
        weights = constants[node.input[1]]
        matrix = numpy_helper.from_array(np.ascontiguousarray(weights.reshape(weights.shape[:2]).T),
                                         f"{node.name}/matrix")
        graph.initializer.append(matrix)
        if len(node.input) < 3 or not node.input[2]:
            return [helper.make_node("MatMul", [node.input[0], matrix.name], [node.output[0]], f"{node.name}/matmul")]
        bias = numpy_helper.from_array(constants[node.input[2]], f"{node.name}/bias")
        graph.initializer.append(bias)
        return [helper.make_node("MatMul", [node.input[0], matrix.name], [f"{node.name}/product"],
                                 f"{node.name}/matmul"),
                helper.make_node("Add", [f"{node.name}/product", bias.name], [node.output[0]], f"{node.name}/bias")]
    for index, name in enumerate(node.input):
        if name in constants and constants[name].ndim > 1:
            vector = numpy_helper.from_array(constants[name].reshape(-1), f"{node.name}/vector_{index}")
            graph.initializer.append(vector)
            node.input[index] = vector.name
    if node.op_type == "LayerNormalization":
        _set_attribute(node, "axis", -1)
    return [node]


def _is_rows(shape: list[int] | None) -> bool:
    """Whether `shape` is the plan's rows [R, C, 1, 1], R > 1: tokens, each Linear a 1x1 Conv."""
    return shape is not None and len(shape) == 4 and shape[2:] == [1, 1] and shape[0] > 1


def transposes_from_splits(model: onnx.ModelProto) -> int:
    """Write the plan's Transpose that moves one axis, done as a Split of that axis into unit
    pieces, a Reshape of each moving its unit axis to the new place and a Concat along it,
    back as the Transpose: the same values. With the tokens as sequences
    (`token_rows_as_sequences`) rknn-toolkit2 2.5.0 keeps on its NPU the Transposes of
    MobileViT's unfold and fold; from the Splits it runs on its CPU the Reshape it makes
    before one ([1, 96, 8, 8] into [384, 8, 1, 2]) and the one after the Concat. A Transpose
    read by a Reshape into rows [R, C, 1, 1] keeps the Split form: written back there (Swin's
    window partition, [4, 7, 4, 1344] moved by (0, 2, 1, 3) into [784, 192, 1, 1]) the
    toolkit runs the Transpose itself on its CPU. Returns how many Transposes it wrote."""
    shapes = static_shapes(model)
    graph = model.graph
    readers = _readers(graph)
    made_by = {name: node for node in graph.node for name in node.output}
    written: dict[int, onnx.NodeProto] = {}
    removed: set[int] = set()
    for node in graph.node:
        pieces = [made_by.get(name) for name in node.input] if node.op_type == "Concat" else []
        split = made_by.get(pieces[0].input[0]) if pieces and pieces[0] is not None else None
        if split is None or split.op_type != "Split" or len(pieces) < 2 \
                or any(p is None or p.op_type != "Reshape" or len(readers[p.output[0]]) != 1 for p in pieces) \
                or list(split.output) != [p.input[0] for p in pieces] \
                or any(len(readers[name]) != 1 for name in split.output) \
                or any(r.op_type == "Reshape" and _is_rows(shapes.get(r.output[0]))
                       for r in readers.get(node.output[0], [])):
            continue
        source, result = shapes.get(split.input[0]), shapes.get(node.output[0])
        if source is None or result is None:
            continue
        cut = next((a.i for a in split.attribute if a.name == "axis"), 0) % len(source)
        joined = next(a.i for a in node.attribute if a.name == "axis") % len(source)
        perm = [axis for axis in range(len(source)) if axis != cut]
        perm.insert(joined, cut)
        piece = [source[axis] for axis in perm]
        piece[joined] = 1
        if cut == joined or source[cut] != len(pieces) or [source[axis] for axis in perm] != result \
                or any(shapes.get(p.output[0]) != piece for p in pieces):
            continue
        written[id(node)] = helper.make_node("Transpose", [split.input[0]], [node.output[0]],
                                             f"{node.name}/transpose", perm=perm)
        removed.update([id(split), *(id(p) for p in pieces)])
    nodes = [written.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(written)


#: Exact rewrites of the exported graph into forms rknn-toolkit2 builds, in order: each changes
#: the model in place and returns how many nodes it changed.
TOOLKIT_SHAPINGS = (binned_sums_as_grouped_convs, slices_before_reshapes, erf_of_a_quotient, scale_after_scores,
                    pads_into_convs, squares_before_reshapes, mean_biases_apart, means_as_reduce_means,
                    sums_as_reduce_sums, vectors_into_channels, added_convs_as_one, linear_layers_as_gemms,
                    square_roots_written_back, group_norms_on_their_planes, gathers_as_slices,
                    flattened_planes_padded, rank3_tails_as_rank4,
                    splits_of_concats_bypassed, reshapes_after_elementwise_ops, token_rows_as_sequences,
                    transposes_from_splits, defaults_written)
