"""Shapings of the plan's reductions written as Convs back into the forms the toolkit builds: a
Softmax over bins then a Conv of one channel as a Conv of one group per box side
(`binned_sums_as_grouped_convs`, YOLOv8's DFL), means and sums as ReduceMean and ReduceSum
(`means_as_reduce_means`, `sums_as_reduce_sums`), the Pows the rewrites made of square roots as
Sqrt (`square_roots_written_back`), and L2 normalizations by a scaled sum as a ReduceSum
(`l2_norms_written_back`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rkcompile.views.proto_graph import ai_onnx_opset, node_attributes, nodes_rewritten, readers_of, static_shapes
from rkcompile.views.toolkit_shapings.common import (Shaping, lookups, pointwise, reduced_axes, reduction_node,
                                                    reshape_node, slice_node, uniform_channel_sum)


def means_as_reduce_means(model: onnx.ModelProto) -> int:
    """Write the plan's mean as a Conv, Reshape x -> [N, K, H, W] then a 1x1 Conv of uniform
    weights 1/K, one output channel and no bias (or that Conv of rows x [R, K, 1, 1] as they
    are), back as the ReduceMean of x over its axes that make K (those of x regroup whole into
    [N | K | H, W]): the same values up to rounding. An RMSNorm on rows, Mul(v, v), the mean
    over the channels, Add, Sqrt, Div(v, ...), the toolkit fuses into one exNorm (from the mean
    of x before its Reshape into rows it runs the five ops apart: hf_llama_tiny_ts). The
    Reshape or Transpose after the Conv that gives the mean the ReduceMean's shape goes too; a
    Reshape to another shape reads the ReduceMean; else a Reshape gives it the Conv's shape.
    rknn-toolkit2 2.5.0 fuses an RMS norm into its exNorm only from the ReduceMean (from the
    Conv its Div runs on its CPU: t5), runs the Reshape of tokens held on the batch axis as a
    Transpose on its CPU (levit) and loops on the Reshape -> Conv pairs around it (swin_tiny).
    Unlike a sum
    (`sums_as_reduce_sums`), a mean written to a graph output is written back too: the toolkit
    takes a ReduceMean as a MatMul, then a Conv, and keeps the Reshape to the output on its NPU;
    from the plan's Conv of a mean over a middle axis ([1, 2100, 8, 4] into [1, 2100, 4]) it runs
    that Reshape on its CPU. Returns how many it wrote."""
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


def radix_sums_as_channel_slices(model: onnx.ModelProto) -> int:
    """Write a sum over R blocks of the channels of x = [N, R*C, ...] (ResNeSt's split
    attention: the radix Conv's R halves, each weighted or not) as R Slices of x along its
    channels and the Adds of them, in x's own shape, where the plan sums them on another
    layout: (a) a Reshape x -> [N, R, M, 1] then a 1x1 Conv of weights all 1, one output channel
    and no bias (a sum `sums_as_reduce_sums` cannot write as a ReduceSum of x: R is not a
    product of x's axes), or (b) with N = 1, a Reshape x -> [R, C, ...] then a ReduceSum over
    axis 0, maybe of its Mul by a factor w of shape [R, C, 1...] or [R, C, ...] (x times w
    Reshaped to [1, R*C, 1...] or x's shape, then the Slices), or in place of that ReduceSum the
    plan's Conv form (a) of it (a sum written to an output). The Reshapes and Transposes after
    the sum that keep its order and give it [N, C, ...] go; else a Reshape gives the Adds' sum
    the shape of the one written before. rknn-toolkit2 2.5.0 runs on its CPU the Reshapes into
    and out of those layouts (ten in timm_resnest14d); the Slices it fuses into one Split and
    keeps all on its NPU. The same values up to float32 rounding (exact for R = 2). Returns how
    many sums it wrote."""
    if ai_onnx_opset(model) < 10:   # a Slice of opset < 10 takes its bounds as attributes
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, made_by, graph_outputs = lookups(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        found = _radix_sum(node, shapes, constants, readers, made_by)
        if found is None or node.output[0] in graph_outputs:
            continue
        source, radix, factor, factor_shape, inputs = found
        shape = shapes[source]
        block = shape[1] // radix
        summed = [shape[0], block, *shape[2:]]
        chain = _order_kept_after(node.output[0], summed, shapes, readers, graph_outputs)
        prefix = f"{node.name}/radix"
        reshaped = not chain and shapes.get(node.output[0]) != summed
        target = chain[-1].output[0] if chain else prefix if reshaped else node.output[0]
        steps = []
        if factor is not None:
            factor_source = made_by.get(factor)
            if factor_source is not None and factor_source.op_type == "Reshape" and len(readers[factor]) == 1:
                removed.add(id(factor_source))   # one Reshape of the factor's source in place of two
                factor = factor_source.input[0]
            steps.append(reshape_node(graph, factor, factor_shape, f"{prefix}/factor", f"{prefix}/factor"))
            # the product keeps its name: it holds the same values in the same order (an int8
            # export quantizes it on the plan's grid)
            product = inputs[0]
            steps.append(helper.make_node("Mul", [source, f"{prefix}/factor"], [product.output[0]], product.name))
            source = product.output[0]
        steps.extend(slice_node(graph, source, index * block, (index + 1) * block, 1, f"{prefix}/block_{index}",
                                f"{prefix}/block_{index}") for index in range(radix))
        total = f"{prefix}/block_0"
        for index in range(1, radix):
            added = target if index == radix - 1 else f"{prefix}/sum_{index}"
            steps.append(helper.make_node("Add", [total, f"{prefix}/block_{index}"], [added], f"{prefix}/add_{index}"))
            total = added
        if reshaped:
            steps.append(reshape_node(graph, prefix, shapes[node.output[0]], node.output[0], f"{prefix}/reshape"))
        written[id(node)] = steps
        removed.update(id(n) for n in (*inputs, *chain))
    return nodes_rewritten(graph, originals, written, removed)


def _radix_sum(node: onnx.NodeProto, shapes: dict[str, list[int]], constants: dict[str, np.ndarray],
               readers: dict[str, list[onnx.NodeProto]], made_by: dict[str, onnx.NodeProto]
               ) -> tuple[str, int, str | None, list[int] | None, list[onnx.NodeProto]] | None:
    """When `node` sums R blocks of the channels of x, in a form `radix_sums_as_channel_slices`
    writes: x, R, the factor multiplying x (None if none) with the shape that lines it up with x,
    and the nodes only the sum read between x and `node` (they go with it; with a factor, its Mul
    first); else None."""
    if node.op_type == "ReduceSum":
        return _stacked_blocks(made_by.get(node.input[0]), shapes, readers, made_by) \
            if reduced_axes(node, constants) == [0] else None
    weights = constants.get(node.input[1]) if node.op_type == "Conv" else None
    regroup = made_by.get(node.input[0])
    if weights is None or regroup is None or regroup.op_type != "Reshape" \
            or len(readers[regroup.output[0]]) != 1 or not pointwise(node, weights.shape) \
            or (len(node.input) > 2 and node.input[2]) or weights.shape[:2] != (1, weights.size) \
            or not (weights == 1).all():
        return None
    source, grouped = shapes.get(regroup.input[0]), shapes.get(regroup.output[0])
    radix = weights.size
    if source is None or grouped is None or len(source) < 3 or radix < 2:
        return None
    if source[1] % radix == 0 and grouped == [source[0], radix, int(np.prod(source[1:])) // radix, 1]:
        return regroup.input[0], radix, None, None, [regroup]
    # the blocks stacked on axis 0 as a ReduceSum over it reads them (a sum written to an output)
    found = _stacked_blocks(made_by.get(regroup.input[0]), shapes, readers, made_by) \
        if grouped == [1, radix, int(np.prod(source[1:])), 1] else None
    return found and found[1] == radix and (*found[:4], [*found[4], regroup])


def _stacked_blocks(product: onnx.NodeProto | None, shapes: dict[str, list[int]],
                    readers: dict[str, list[onnx.NodeProto]], made_by: dict[str, onnx.NodeProto]
                    ) -> tuple[str, int, str | None, list[int] | None, list[onnx.NodeProto]] | None:
    """When `product`, read by the sum alone, is a Reshape of x = [1, R*C, ...] into [R, C, ...]
    or the Mul of one by a factor that lines up with x's channels, what `_radix_sum` gives."""
    if product is None or len(readers[product.output[0]]) != 1:
        return None
    if product.op_type == "Reshape":
        found = _radix_of(product, None, shapes, readers)
        return found and (product.input[0], found[0], None, None, [product])
    if product.op_type != "Mul" or product.input[0] == product.input[1]:
        return None
    for regroup_name, factor in (product.input, reversed(product.input)):
        regroup = made_by.get(regroup_name)
        found = _radix_of(regroup, factor, shapes, readers) if regroup is not None else None
        if found is not None:
            return regroup.input[0], found[0], factor, found[1], [product, regroup]
    return None


def _radix_of(regroup: onnx.NodeProto, factor: str | None, shapes: dict[str, list[int]],
              readers: dict[str, list[onnx.NodeProto]]) -> tuple[int, list[int] | None] | None:
    """When `regroup` is a Reshape of x = [1, R*C, ...] into [R, C, ...] that only the sum (or
    its product with `factor`) reads, and `factor` is None or of shape [R, C, 1...] or
    [R, C, ...]: R and the shape that lines the factor up with x (None without one); else None."""
    if regroup.op_type != "Reshape" or len(readers[regroup.output[0]]) != 1:
        return None
    source, grouped = shapes.get(regroup.input[0]), shapes.get(regroup.output[0])
    if source is None or grouped is None or len(source) < 3 or source[0] != 1 or len(grouped) < 2 \
            or grouped[0] < 2 or grouped[0] * grouped[1] != source[1] \
            or int(np.prod(grouped[2:])) != int(np.prod(source[2:])):
        return None
    if factor is None:
        return grouped[0], None
    weighting = shapes.get(factor)
    if weighting is None or len(weighting) != len(grouped) or weighting[:2] != grouped[:2]:
        return None
    if all(size == 1 for size in weighting[2:]):
        return grouped[0], [1, source[1], *(1 for _ in source[2:])]
    return (grouped[0], source) if weighting == grouped else None


def _order_kept_after(name: str, shape: list[int], shapes: dict[str, list[int]],
                      readers: dict[str, list[onnx.NodeProto]], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """The chain of Reshapes and Transposes, each the only reader of the one before, that
    `name` starts and that keeps its elements' order, up to the last that writes `shape`; empty
    when none does."""
    chain: list[onnx.NodeProto] = []
    ending = 0
    while name not in graph_outputs and len(readers.get(name, [])) == 1:
        step = readers[name][0]
        if step.op_type == "Transpose":
            perm = node_attributes(step).get("perm")
            moved = [axis for axis in perm if shapes.get(name, [0] * len(perm))[axis] != 1] if perm else None
            if moved is None or moved != sorted(moved):
                break
        elif step.op_type != "Reshape":
            break
        chain.append(step)
        name = step.output[0]
        if shapes.get(name) == shape:
            ending = len(chain)
    return chain[:ending]


def _reductions_written_back(model: onnx.ModelProto, reduction: str, before_outputs: bool = True) -> int:
    """Write each of the plan's means (`reduction` "ReduceMean") or sums ("ReduceSum") as a
    Conv back as `reduction`, as `means_as_reduce_means` describes, but for one that is a graph
    output or that a Reshape or Transpose writes to one unless `before_outputs`. The Conv reads
    a Reshape of x, or x itself when x is rows [R, K, 1, 1] (a reduction over their channels,
    written over axis 1); returns how many."""
    shapes = static_shapes(model)
    graph = model.graph
    opset = ai_onnx_opset(model)
    constants, readers, made_by, graph_outputs = lookups(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    removed = set()
    for node in graph.node:
        found = uniform_channel_sum(node, constants)
        if found is None:
            continue
        weight, count = found
        reshape = made_by.get(node.input[0])
        viewed = reshape is not None and reshape.op_type == "Reshape" and len(readers[reshape.output[0]]) == 1
        if not viewed and shapes.get(node.input[0], [])[2:] != [1, 1]:
            continue   # a Conv of uniform weights over a map's channels, not the plan's reduction
        x = reshape.input[0] if viewed else node.input[0]
        source, grouped, result = shapes.get(x), shapes.get(node.input[0]), shapes.get(node.output[0])
        bias = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if source is None or grouped is None or result is None or len(grouped) != 4 \
                or count != grouped[1] or count < 2 \
                or not np.isclose(weight, 1.0 / count if reduction == "ReduceMean" else 1.0, rtol=1e-6, atol=0) \
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
        written[id(node)] = [reduction_node(graph, reduction, x, axes, target, prefix, opset)]
        if reshaped_after:  # a Reshape reads the mean in any shape of the same element order
            after[0].input[0] = prefix
        elif target == prefix:
            shape = numpy_helper.from_array(np.array(result, np.int64), f"{prefix}/shape")
            graph.initializer.append(shape)
            written[id(node)].append(helper.make_node("Reshape", [prefix, shape.name], [node.output[0]],
                                                      f"{prefix}/reshape"))
        if viewed:
            removed.add(id(reshape))
        if replaced:
            removed.add(id(after[0]))
    return nodes_rewritten(graph, graph.node, written, removed)


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


def square_roots_written_back(model: onnx.ModelProto) -> int:
    """Write a Pow by the constant 0.5 that only divisors read as the Sqrt it was (the
    rewrites make Sqrt a Pow), and a Pow by -0.5 that only products read as a Sqrt they
    divide by (x * p^-0.5 = x / sqrt(p): an RMSNorm the plan runs as exNorm from its 1x1 Conv
    form): rknn-toolkit2 2.5.0 fuses a norm, mean -> Add -> Sqrt -> Div, into its exNorm only
    from the Sqrt (from the Pow it runs each Div on its CPU: t5); a Sqrt alone it may run on
    its CPU, so other Pows stay. The values differ by float32 rounding. Returns how many Pows
    it wrote."""
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    readers = readers_of(model.graph)
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


def l2_norms_written_back(model: onnx.ModelProto) -> int:
    """Write the plan's L2 normalization of rows, v / sqrt(s * sum(v^2) + b) * sqrt(s) (the
    sum by a 1x1 Conv of one output channel and uniform weights s, passes/rewrites/reductions.py
    `l2_normalize_on_channel_view`; its bias an Add after `mean_biases_apart`, its Pow a Sqrt
    after `square_roots_written_back`), as v / sqrt(ReduceSum(v^2) + b / s) over the channels:
    the same values up to rounding. rknn-toolkit2 2.5.0 runs the plan's form as five layers
    (Mul, Conv, Sqrt, Div, Mul: timm_edgenext_xx_small's normalized queries and keys, six of
    them) and the ReduceSum form as one exNorm. Returns how many it wrote."""
    graph = model.graph
    opset = ai_onnx_opset(model)
    constants, readers, made_by, graph_outputs = lookups(graph)

    def only_reader(name: str, op_type: str) -> onnx.NodeProto | None:
        found = readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type and name not in graph_outputs else None

    written: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for conv in originals:
        found = uniform_channel_sum(conv, constants)
        if found is None or found[0] <= 0 or (len(conv.input) > 2 and conv.input[2]) \
                or len(readers.get(conv.input[0], [])) != 1:
            continue
        scale = found[0]
        shift = only_reader(conv.output[0], "Add")
        bias = constants.get(next((n for n in shift.input if n != conv.output[0]), "")) if shift is not None else None
        root = only_reader(shift.output[0], "Sqrt") if bias is not None and bias.size == 1 else None
        divide = only_reader(root.output[0], "Div") if root is not None else None
        square = made_by.get(conv.input[0])
        product = only_reader(divide.output[0], "Mul") if divide is not None and square is not None \
            and square.op_type == "Mul" \
            and list(square.input) == [divide.input[0]] * 2 and divide.input[1] == root.output[0] else None
        factor = constants.get(next((n for n in product.input if n != divide.output[0]), "")) if product else None
        if factor is None or factor.size != 1 or not np.isclose(float(factor.flat[0]) ** 2, scale, rtol=1e-6):
            continue
        epsilon = numpy_helper.from_array((bias / scale).astype(bias.dtype), f"{shift.name}/unscaled")
        graph.initializer.append(epsilon)
        written[id(conv)] = [reduction_node(graph, "ReduceSum", conv.input[0], [1], conv.output[0],
                                            f"{conv.name}/reducesum", opset)]
        written[id(shift)] = [helper.make_node("Add", [conv.output[0], epsilon.name], list(shift.output), shift.name)]
        written[id(divide)] = [helper.make_node("Div", list(divide.input), list(product.output), divide.name)]
        removed.add(id(product))
    nodes_rewritten(graph, originals, written, removed)
    return len(removed)


def binned_sums_as_grouped_convs(model: onnx.ModelProto) -> int:
    """Write a 1x1 Conv of one output channel over a Softmax across the K channels of
    T = [1, K, G, N], where T is a chain of Reshapes and Transposes of a tensor X holding the
    values in the order [G, K, N] (YOLOv8's DFL: G box sides of K bins, N boxes), as the Softmax
    along axis 2 of X reshaped to [1, G, K, N], then a Conv of G groups of the Conv's weights
    tiled, and a Reshape to the Conv's shape [1, 1, G, N]: the same values up to float32
    rounding. rknn-toolkit2 2.5.0 runs the Transposed form on its batch axis ([G, K, 1, N]),
    carries that layout down to where the boxes join the class scores, and runs on its CPU the
    Reshape of the scores into it. Returns how many Convs it wrote."""
    if ai_onnx_opset(model) < 13:   # a Softmax of opset < 13 normalizes over every axis from `axis` on
        return 0
    shapes = static_shapes(model)
    graph = model.graph
    constants, readers, made_by, _ = lookups(graph)
    written: dict[int, list[onnx.NodeProto]] = {}
    originals = list(graph.node)  # held, so each node's id stays its own while `written` is keyed by it
    for node in originals:
        weight = constants.get(node.input[1]) if node.op_type == "Conv" else None
        softmax = made_by.get(node.input[0]) if weight is not None else None
        if softmax is None or softmax.op_type != "Softmax" or weight.shape[0] != 1 \
                or not pointwise(node, weight.shape) or len(readers[softmax.output[0]]) != 1:
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


#: this family's shapings, in the order TOOLKIT_SHAPINGS runs them
SHAPINGS: tuple[Shaping, ...] = (
    binned_sums_as_grouped_convs,
    square_roots_written_back,
    means_as_reduce_means,
    sums_as_reduce_sums,
    radix_sums_as_channel_slices,
    l2_norms_written_back,
)
