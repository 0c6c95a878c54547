"""Affine folds: a constant scale and shift applied to the output of a weighted op (Conv,
ConvTranspose, Gemm, MatMul by weights) moved into its weights and bias, a constant scale
(and, where the Conv does not pad, shift) applied to a Conv's input moved into its weights, as
is a scalar scale applied to any weighted op's input, across relabels (a dropout's 1 - p); and
scalars moved into the constants of the products around them (a rotary embedding's cos and
sin take the attention scale and rotate_half's negation), so that the attention absorption
meets no step between the projection and the product.

Exporters write a batch norm as BatchNormalization, or, once folded by hand or by a framework
converter, as a Mul and an Add by per-channel constants (tf2onnx, paddle2onnx); attention
scales its query by a scalar after the projection's relabels. Each of these is one more pass
over a feature map on the NPU, where rknn-toolkit2 runs none: the peer's layer tables show
one Conv for each.

Every fold is worked out in float64 and cast once to the weight's dtype, so the folded op
computes the same value to within one rounding of that dtype (float32 weights: within float16
rounding once the NPU computes in float16); it is never a change of formula.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import constant_value, static_shape
from rkcompile.ir.patterns import matches

from rkcompile.passes.fusion_table import RECOGNISERS
from rkcompile.passes.rewrites.base import RESHAPE_LIKE, Candidates, RewriteRule, Site, producer
from rkcompile.passes.rewrites.conv_windows import conv_limits

#: ops that compute x*W (+ bias) with constant W, and the axis of their output that indexes W's
#: output channels (-1: the last)
WEIGHTED = {"Conv": 1, "ConvTranspose": 1, "Gemm": -1, "MatMul": -1}
#: ops that only relabel their input's elements: a scale or shift of one channel stays one
#: channel's, on the axis `_axis_after` finds
RELABELS = RESHAPE_LIKE | {"Transpose"}
AFFINE_OPS = frozenset({"Mul", "Add", "Sub", "Div", "BatchNormalization"})


def batchnorm_affine(node: gs.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) with BN(x) = scale*x + shift per channel, in float64, when the statistics
    are constant and the node is in inference mode with one output."""
    if node.attrs.get("training_mode", 0) or len([t for t in node.outputs if t.name]) != 1:
        return None
    params = [constant_value(t) for t in node.inputs[1:5]]
    if any(p is None for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    return scale, beta - mean * scale


def affine_of(node: gs.Node) -> tuple[gs.Tensor, np.ndarray, np.ndarray] | str:
    """(x, scale, shift) with node(x) = scale*x + shift, scale and shift float64 arrays laid out
    to broadcast against x as ONNX broadcasts; else why node is not such an op."""
    if node.op == "BatchNormalization":
        affine, shape = batchnorm_affine(node), static_shape(node.inputs[0])
        if affine is None or shape is None or len(shape) < 2:
            return "its statistics are not constant (or training mode), or the input is below rank 2 or unknown"
        on_channels = (-1,) + (1,) * (len(shape) - 2)
        return node.inputs[0], *(v.reshape(on_channels) for v in affine)
    if len(node.inputs) != 2:
        return "not a binary op"
    values = [constant_value(t) for t in node.inputs]
    if (values[0] is None) == (values[1] is None):
        return "not one constant operand and one computed"
    constant_first = values[0] is not None
    x, c = node.inputs[1 if constant_first else 0], values[0 if constant_first else 1]
    # one value per channel at most: a constant larger than every axis of x varies along
    # several (a folded ConstantOfShape may be a broadcast view far too large to copy)
    if c.dtype.kind != "f":
        return "the constant is not floating point"
    if c.size > max(static_shape(x) or (1,), default=1):
        return "the constant varies on more than one axis"
    c = c.astype(np.float64)
    if not np.all(np.isfinite(c)):
        return "the constant holds an infinity or NaN, which weights would spread (0 * inf)"
    one, zero = np.ones_like(c), np.zeros_like(c)
    if node.op == "Mul":
        return x, c, zero
    if node.op == "Add":
        return x, one, c
    if node.op == "Sub":
        return (x, -one, c) if constant_first else (x, one, -c)
    if node.op == "Div" and not constant_first and np.all(c != 0):
        return x, 1 / c, zero
    return "a division of a constant, or by zero"


def per_channel_values(values: np.ndarray, rank: int, axis: int | None, channels: int) -> np.ndarray | None:
    """`values` as one value per channel of axis `axis` of a rank-`rank` tensor with `channels`
    channels, or None when they vary along any other axis, or would broadcast the tensor to
    a higher rank. `axis` None: the values may be one scalar only."""
    if values.ndim > rank:
        if values.size != 1:
            return None
        values = values.reshape(())
    if values.size == 1:
        return np.full(channels, float(values.reshape(-1)[0]))
    if axis is None:
        return None
    aligned = values.reshape((1,) * (rank - values.ndim) + values.shape)
    varying = [a for a, size in enumerate(aligned.shape) if size != 1]
    if varying != [axis % rank] or aligned.shape[axis % rank] != channels:
        return None
    return aligned.reshape(channels)


def _axis_after(relabel: gs.Node, axis: int | None) -> int | None:
    """Where the channel axis `axis` of the relabel's input is in its output, or None when the
    relabel spreads it over several axes or merges it with others: a row-major relabel keeps
    an axis when the elements before it and the axis's own size are the same on both sides."""
    if axis is None:
        return None
    shape_in, shape_out = static_shape(relabel.inputs[0]), static_shape(relabel.outputs[0])
    if shape_in is None or shape_out is None:
        return None
    axis %= len(shape_in)
    if relabel.op == "Transpose":
        perm = list(relabel.attrs.get("perm", range(len(shape_in) - 1, -1, -1)))
        return perm.index(axis)
    before = int(np.prod(shape_in[:axis]))
    for candidate, size in enumerate(shape_out):
        if int(np.prod(shape_out[:candidate])) == before and size == shape_in[axis]:
            return candidate
    return None


def _sole_reader(tensor: gs.Tensor, site: Site) -> bool:
    return len(tensor.outputs) == 1 and tensor.name not in site.graph_outputs


def _weighted_producer(x: gs.Tensor, site: Site) -> tuple[gs.Node, list[gs.Node], int | None, tuple[int, int] | None] | str:
    """The weighted op whose output reaches `x` through relabels, and at most one Split along
    its channel axis, each read by the next alone (a Split's other parts may go anywhere); those
    nodes, in order; where the channel axis is in `x`; and (first channel, channels) of the
    part `x` is, None without a Split. Else why not."""
    chain = []
    tensor = x
    while True:
        node = producer(tensor)
        if node is None:
            return "its input is not computed by a node"
        if not _sole_reader(tensor, site):
            return f"{tensor.name} is read by other nodes too, or is a graph output"
        if node.op in WEIGHTED:
            break
        splits_again = node.op == "Split" and any(link.op == "Split" for link in chain)
        if node.op not in RELABELS | {"Split"} or splits_again:
            return f"its input comes from a {node.op}, not a weighted op, a relabel or one Split of one"
        chain.append(node)
        tensor = node.inputs[0]
    chain.reverse()
    made = static_shape(node.outputs[0])
    axis = None if made is None else WEIGHTED[node.op] % len(made)
    part = None
    for link, read in zip(chain, [*chain[1:], None]):
        if link.op != "Split":
            axis = _axis_after(link, axis)
            continue
        shape, path = static_shape(link.inputs[0]), next(t for t in link.outputs if t is (read.inputs[0] if read else x))
        if axis is None or shape is None or int(link.attrs.get("axis", 0)) % len(shape) != axis:
            return "its input is one part of a Split along an axis other than the weighted op's channels"
        sizes = [static_shape(t) for t in link.outputs]
        if any(size is None for size in sizes):
            return "a part of the Split has an unknown shape"
        index = list(link.outputs).index(path)
        part = (sum(size[axis] for size in sizes[:index]), sizes[index][axis])
    return node, chain, axis, part


def _weights(node: gs.Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The weight and bias arrays of a weighted op when both are constants (bias None when
    absent); None otherwise. A MatMul's weight is its right operand."""
    weight = constant_value(node.inputs[1])
    has_bias = node.op != "MatMul" and len(node.inputs) > 2 and node.inputs[2].name
    bias = constant_value(node.inputs[2]) if has_bias else None
    if weight is None or (has_bias and bias is None) or weight.dtype.kind != "f":
        return None
    return weight, bias


#: the largest weight or bias a fold may make: the NPU stores float weights as float16 at most,
#: and a folded value beyond its range would saturate where the unfolded ops need not
FLOAT16_LARGEST = float(np.finfo(np.float16).max)


def _storable(*arrays: np.ndarray) -> bool:
    return all(np.all(np.abs(a) <= FLOAT16_LARGEST) for a in arrays)


def scaled_weighted_op(builder, node: gs.Node, scale: np.ndarray, shift: np.ndarray,
                       out: gs.Tensor | None) -> gs.Tensor | str:
    """Append `node` with its weights and bias folded so that it writes scale*y + shift (float64
    vectors, one value per output channel) into `out` (None: a new tensor like its output);
    the tensor written, or why it cannot be."""
    weights = _weights(node)
    if weights is None:
        return f"the {node.op}'s weights or bias are not constant"
    weight, bias = weights
    w, attrs, inputs = weight.astype(np.float64), dict(node.attrs), list(node.inputs)
    if node.op == "Conv":
        folded = w * scale.reshape(-1, *[1] * (w.ndim - 1))
    elif node.op == "ConvTranspose":  # W is [C_in, C_out / group, k...]
        groups = int(attrs.get("group", 1))
        grouped = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
        folded = (grouped * scale.reshape(groups, 1, w.shape[1], *[1] * (w.ndim - 2))).reshape(w.shape)
    elif node.op == "Gemm":  # Y = alpha*A*B + beta*C: alpha and beta go into B and C
        folded = w * float(attrs.pop("alpha", 1.0)) * (scale[:, None] if attrs.get("transB", 0) else scale[None, :])
        if bias is not None:
            if np.broadcast_shapes(bias.shape, (1, scale.size)) != (1, scale.size):
                return "Gemm's C varies along its rows"
            bias = np.broadcast_to(bias, (1, scale.size)).reshape(-1) * float(attrs.get("beta", 1.0))
        attrs.pop("beta", None)
    elif w.ndim == 2 and not shift.any():  # MatMul by a [K, N] weight: N output channels
        folded = w * scale[None, :]
    else:
        return "a MatMul takes a scale into a 2-D weight only, and has no bias to take a shift"
    if node.op != "MatMul":
        bias = np.zeros(scale.size) if bias is None else np.broadcast_to(bias.astype(np.float64), (scale.size,))
        bias = bias * scale + shift
    if not _storable(folded, *([] if node.op == "MatMul" else [bias])):
        return "the folded weights or bias would leave float16's range"
    inputs[1] = builder.const(folded.astype(weight.dtype), "weight")
    if node.op != "MatMul":
        inputs[2:] = [builder.const(bias.astype(weight.dtype), "bias")]
    made = node.outputs[0]
    return builder.op(node.op, inputs, static_shape(made), made.dtype, out=out, **attrs)


def fold_affine_into_weighted_op(node: gs.Node, site: Site) -> Candidates:
    """scale*y + shift by constants (Mul, Add, Sub, Div by a constant; BatchNormalization)
    after a Conv, ConvTranspose, Gemm or MatMul by weights whose output it alone reads, folded
    into that op's weights and bias: W' = W*scale per output channel, b' = b*scale + shift.
    The constant is one value, or one per output channel on the axis that indexes them; a
    scalar also crosses relabels (Reshape, Transpose, ...) between the two, as a per-channel
    constant does where the relabel keeps the channel axis whole, and a Split along the output
    channels (the part's channels alone take it: GPT-2's q and k scalings after its one
    projection's Split). One kernel instead of two
    passes over the feature map, as rknn-toolkit2 does. Within one rounding of the weight's
    dtype (module docstring); a chain folds one op at a time, each into the op the last made."""
    affine = affine_of(node)
    if isinstance(affine, str):
        return affine
    x, scale, shift = affine
    found = _weighted_producer(x, site)
    if isinstance(found, str):
        return found
    weighted, chain, axis, part = found
    shape, made = static_shape(x), static_shape(weighted.outputs[0])
    if shape is None or made is None or static_shape(node.outputs[0]) != shape:
        return "the constant broadcasts its input to another shape, or a shape is unknown"
    channels = made[WEIGHTED[weighted.op]]
    scale, shift = (per_channel_values(v, len(shape), axis, channels if part is None else part[1]) for v in (scale, shift))
    if scale is None or shift is None:
        return f"the constant varies on an axis other than the {weighted.op}'s output channels"
    if part is not None:  # the other parts' channels are scaled by 1 and shifted by 0: unchanged
        first, count = part
        scale = np.concatenate([np.ones(first), scale, np.ones(channels - first - count)])
        shift = np.concatenate([np.zeros(first), shift, np.zeros(channels - first - count)])
    builder = site.builder(node)
    tensor = scaled_weighted_op(builder, weighted, scale, shift, None if chain else node.outputs[0])
    if isinstance(tensor, str):
        return tensor
    for index, link in enumerate(chain):
        out = node.outputs[0] if index == len(chain) - 1 else None
        read = chain[index + 1].inputs[0] if index + 1 < len(chain) else x
        if link.op == "Split":  # the same Split of the scaled output: its other parts keep their tensors
            path = out or gs.Variable(site.fresh(f"{node.name}/part"), read.dtype, static_shape(read))
            outputs = [path if t is read else t for t in link.outputs]
            builder.nodes.append(gs.Node("Split", site.fresh(f"{node.name}/split"), attrs=dict(link.attrs),
                                         inputs=[tensor, *link.inputs[1:]], outputs=outputs))
            tensor = path
            continue
        was = link.outputs[0]
        tensor = builder.op(link.op, [tensor, *link.inputs[1:]], static_shape(was), was.dtype, out=out, **link.attrs)
    yield builder.finish(weighted, *chain, node)


def fold_affine_into_concatenated_convs(node: gs.Node, site: Site) -> Candidates:
    """scale*y + shift by constants (as `fold_affine_into_weighted_op` takes them) after a
    Concat along the channels of Convs or ConvTransposes whose outputs it alone reads, each
    part's channels folded into the Conv that makes them: MixNet's mixed kernels (a Split's
    parts each through a depthwise Conv of its own size, joined, then one BatchNormalization)
    run as the Convs and the Concat, as rknn-toolkit2 builds them (its layer table for timm's
    mixnet_s has no BatchNormalization layer). Within one rounding of the weights' dtype."""
    affine = affine_of(node)
    if isinstance(affine, str):
        return affine
    x, scale, shift = affine
    concat, shape = producer(x), static_shape(x)
    if concat is None or concat.op != "Concat" or not _sole_reader(x, site):
        return "its input is not a Concat that it alone reads"
    if shape is None or len(shape) < 2 or int(concat.attrs.get("axis", 0)) % len(shape) != 1 \
            or static_shape(node.outputs[0]) != shape:
        return "not a Concat along the channels of a shape it keeps"
    parts = [producer(t) for t in concat.inputs]
    if len({id(t) for t in concat.inputs}) != len(concat.inputs) or any(
            part is None or part.op not in ("Conv", "ConvTranspose") or not _sole_reader(t, site)
            or static_shape(t) is None for part, t in zip(parts, concat.inputs)):
        return "a part of the Concat is not a Conv that the Concat alone reads, once"
    scale, shift = (per_channel_values(v, len(shape), 1, shape[1]) for v in (scale, shift))
    if scale is None or shift is None:
        return "the constant varies on an axis other than the channels"
    builder, folded, start = site.builder(node), [], 0
    for part, t in zip(parts, concat.inputs):
        count = static_shape(t)[1]
        made = scaled_weighted_op(builder, part, scale[start:start + count], shift[start:start + count], None)
        if isinstance(made, str):
            builder.discard()
            return made
        folded.append(made)
        start += count
    builder.op("Concat", folded, out=node.outputs[0], **concat.attrs)
    yield builder.finish(*parts, concat, node)


def _branch_node(tensor: gs.Tensor, site: Site) -> gs.Node | str:
    """The Conv (auto_pad unset) or BatchNormalization computing a term of a sum that the sum
    alone reads; else why not. Reads no weights, which stay unloaded where the rule declines."""
    node = producer(tensor)
    if node is None or not _sole_reader(tensor, site):
        return f"{tensor.name} is not computed by a node, or is read by other nodes too"
    if node.op != "BatchNormalization" and (node.op != "Conv" or node.attrs.get("auto_pad", "NOTSET") != "NOTSET"):
        return f"a term comes from a {node.op}, not a Conv (auto_pad unset) or a BatchNormalization"
    return node


def _conv_branch(node: gs.Node | gs.Tensor) -> tuple[gs.Node | gs.Tensor, gs.Tensor, np.ndarray, np.ndarray] | str:
    """(node, x, W, b) for a _branch_node: a Conv by constant weights of x or a
    BatchNormalization of x with constant statistics, W in float64, a BatchNormalization's as
    [C, 1] per-channel scales to place on the diagonal; for x itself (an identity branch) scales
    of 1; else why not."""
    if isinstance(node, gs.Tensor):
        shape = static_shape(node)
        if shape is None or len(shape) < 3:
            return "the identity term's shape is unknown or has no channels and map"
        return node, node, np.ones((shape[1], 1)), np.zeros(shape[1])
    if node.op == "BatchNormalization":
        affine = batchnorm_affine(node)
        if affine is None:
            return "a BatchNormalization's statistics are not constant"
        return node, node.inputs[0], affine[0].reshape(-1, 1), affine[1]
    weights = _weights(node)
    if weights is None:
        return "a Conv's weights or bias are not constant"
    weight, bias = weights
    bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
    return node, node.inputs[0], weight.astype(np.float64), bias


def _merged_window(convs: list[gs.Node], spatial: int) -> tuple[list[int], list[int], list[int]] | str:
    """(kernel, begin pads, end pads) of one Conv whose taps cover every Conv's taps at the same
    input positions: they share strides and dilations, and their begin pads differ by whole
    dilations; else why not."""
    ones = [1] * spatial
    strides, dilations = ({tuple(c.attrs.get(a, ones)) for c in convs} for a in ("strides", "dilations"))
    if len(strides) != 1 or len(dilations) != 1:
        return "the Convs' strides or dilations differ"
    dilation = list(next(iter(dilations)))
    kernels = [list(constant_value(c.inputs[1]).shape[2:]) for c in convs]
    pads = [list(c.attrs.get("pads", [0] * 2 * spatial)) for c in convs]
    begin = [max(p[axis] for p in pads) for axis in range(spatial)]
    if any((begin[axis] - p[axis]) % dilation[axis] for p in pads for axis in range(spatial)):
        return "the Convs' windows are offset by less than a dilation"
    # every tap of a Conv, counted from the merged window's first: (begin - pad) / dilation + j
    kernel = [max((begin[axis] - p[axis]) // dilation[axis] + k[axis] for p, k in zip(pads, kernels))
              for axis in range(spatial)]
    end = [max(p[spatial + axis] + (kernel[axis] - k[axis]) * dilation[axis] - (begin[axis] - p[axis])
               for p, k in zip(pads, kernels)) for axis in range(spatial)]
    return kernel, begin, end


def sum_of_convs_of_one_input(node: gs.Node, site: Site) -> Candidates:
    """Add(Conv_a(x), Conv_b(x)) as one Conv of x whose weights are the sum of both: W = W_a +
    W_b with each placed in the merged window where its taps read (a 1x1 branch at the centre
    of a 3x3), b = b_a + b_b; a BatchNormalization of x as a branch adds its per-channel scale
    on the window's diagonal and its shift to the bias, and x itself (the identity branch of
    RepVGG and RepViT) a scale of 1. Training-time branches (RepVGG, MobileOne, DBB, ACNet)
    written out as one Conv per branch and a chain of Adds become the one Conv they stand for,
    as rknn-toolkit2 merges them (its layer table for timm's mobileone_s0: 62 Conv layers for
    191 Convs; its `fuse_branch_add_into_conv` folds the identity, and fails to build that fold
    from an int8 QDQ file: "Invalid w_par['dtype'] = float16", timm_repvit_m0_9's export, which
    this fold in the plan leaves nothing to fold). Exact but for one rounding of the summed
    weights (module docstring). Both Convs share x, group, strides and dilations, their
    windows align, the sum does not broadcast, and the merged kernel has no more taps than the
    branches together and is within the target's kernel limit (conv_windows' tiles of a kernel
    over it are such a sum)."""
    if len(node.inputs) != 2:
        return "not a sum of two tensors"
    branches = [_branch_node(t, site) for t in node.inputs]
    for index, (term, other) in enumerate(zip(node.inputs, reversed(branches))):
        if isinstance(other, gs.Node) and other.op == "Conv" and other.inputs[0] is term:
            branches[index] = term   # the Conv's own input: an identity branch
    reasons = [b for b in branches if isinstance(b, str)]
    if reasons:
        return reasons[0]
    convs = [b for b in branches if isinstance(b, gs.Node) and b.op == "Conv"]
    if not convs:
        return "neither term is a Conv"
    terms = [_conv_branch(b) for b in branches]
    reasons = [t for t in terms if isinstance(t, str)]
    if reasons:
        return reasons[0]
    if terms[0][1] is not terms[1][1]:
        return "the terms read different tensors"
    x = terms[0][1]
    shape, made = static_shape(x), static_shape(node.outputs[0])
    if shape is None or made is None or any(static_shape(t) != made for t in node.inputs):
        return "the sum broadcasts, or a shape is unknown"
    groups = {int(c.attrs.get("group", 1)) for c in convs}
    if len(groups) != 1:
        return "the Convs' groups differ"
    group, spatial = groups.pop(), len(shape) - 2
    if any(w.ndim == 2 for _, _, w, _ in terms) and made[1] != shape[1]:
        return "a BatchNormalization or identity branch beside a Conv that changes the channel count"
    window = _merged_window(convs, spatial)
    if isinstance(window, str):
        return window
    kernel, begin, end = window
    if np.prod(kernel) > sum(np.prod(constant_value(c.inputs[1]).shape[2:]) for c in convs) + (len(terms) - len(convs)):
        return f"the merged kernel {kernel} has more taps than the branches together"
    limits = conv_limits(site)
    per_group = shape[1] // group
    if limits is not None:
        depthwise = group > 1 and per_group == 1 and made[1] == group
        limit = limits.depthwise_kernel if depthwise else limits.kernel
        if max(kernel) > limit:  # conv_kernel_to_tiles would split it into these terms again
            return f"the merged kernel {kernel} is over {site.target.name}'s limit of {limit}"
    dilation = list(convs[0].attrs.get("dilations", [1] * spatial))
    if any(begin[axis] % dilation[axis] for axis in range(spatial)) and len(convs) < len(terms):
        return "a BatchNormalization or identity branch's position falls between the merged window's taps"
    weight, bias = np.zeros((made[1], per_group, *kernel)), np.zeros(made[1])
    for branch, _, w, b in terms:
        if w.ndim == 2:  # x[c] * scale[c]: the diagonal, at x's own position
            channels = np.arange(made[1])
            weight[(channels, channels % per_group, *(begin[axis] // dilation[axis] for axis in range(spatial)))] += w[:, 0]
        else:
            pads = list(branch.attrs.get("pads", [0] * 2 * spatial))
            start = [(begin[axis] - pads[axis]) // dilation[axis] for axis in range(spatial)]
            weight[(slice(None), slice(None), *(slice(s, s + k) for s, k in zip(start, w.shape[2:])))] += w
        bias += b
    dtype = constant_value(convs[0].inputs[1]).dtype
    if not _storable(weight, bias):
        return "the summed weights or bias would leave float16's range"
    builder = site.builder(node)
    attrs = {key: value for key, value in convs[0].attrs.items() if key not in ("kernel_shape", "pads")}
    builder.op("Conv", [x, builder.const(weight.astype(dtype), "weight"), builder.const(bias.astype(dtype), "bias")],
               out=node.outputs[0], **attrs, kernel_shape=kernel, pads=begin + end)
    yield builder.finish(*(b for b in branches if isinstance(b, gs.Node)), node)


def _scaled_constant_product(tensor: gs.Tensor, scale: float, builder, site: Site) -> tuple[gs.Node, gs.Tensor] | str:
    """The Mul by a constant that makes `tensor` (read by nothing else), rebuilt with its constant
    times `scale`: (that Mul, the tensor the new Mul writes); else why not."""
    node = producer(tensor)
    if node is None or node.op != "Mul" or not _sole_reader(tensor, site):
        return f"{tensor.name} is not a Mul by a constant that the sum alone reads"
    values = [constant_value(t) for t in node.inputs]
    constant_at = [i for i, v in enumerate(values) if v is not None and v.dtype.kind == "f"]
    if len(constant_at) != 1:
        return f"{node.name} does not multiply by one floating-point constant"
    index = constant_at[0]
    scaled = values[index].astype(np.float64) * scale
    if not _storable(scaled):
        return "the scaled constant would leave float16's range"
    inputs = list(node.inputs)
    inputs[index] = builder.const(scaled.astype(values[index].dtype), "scaled")
    return node, builder.op("Mul", inputs, static_shape(tensor), tensor.dtype)


def scale_into_constant_products(node: gs.Node, site: Site) -> Candidates:
    """A scalar scale s of a sum of two products by constants, s*(a*c1 + b*c2), moved into the
    constants: a*(s*c1) + b*(s*c2). The scale may be applied after relabels and Expands of the
    sum, each read by the next alone, which move its elements without changing them, so a scalar
    crosses them unchanged. This is the attention scale that a rotary embedding
    (x*cos + rotate_half(x)*sin, cos and sin constant for a fixed sequence) leaves between the
    query's or key's projection and the product: with it gone, the product reads the rotary's
    output straight away and the attention absorption can take the head split's relabels
    (passes/simplify_layout/), as rknn-toolkit2 runs no step for the scale. One rounding of the
    constants' dtype instead of a rounding of the sum: within float16 rounding (exact for a
    power-of-two scale such as a head size's 1/sqrt(sqrt(d)))."""
    affine = affine_of(node)
    if isinstance(affine, str):
        return affine
    x, scale, shift = affine
    if node.op not in ("Mul", "Div") or scale.size != 1 or static_shape(node.outputs[0]) != static_shape(x):
        return "not a scale by one constant value that keeps its input's shape"
    chain, tensor = [], x
    while (made_by := producer(tensor)) is not None and made_by.op in RELABELS | {"Expand"}:
        if not _sole_reader(tensor, site):
            return f"{tensor.name} is read by other nodes too, or is a graph output"
        chain.append(made_by)
        tensor = made_by.inputs[0]
    add = producer(tensor)
    if add is None or add.op != "Add" or not _sole_reader(tensor, site):
        return "its input is not a sum that it alone reads (through relabels and Expands)"
    builder = site.builder(node)
    products, terms = [], []
    for term in add.inputs:
        found = _scaled_constant_product(term, float(scale.reshape(-1)[0]), builder, site)
        if isinstance(found, str):
            return found
        products.append(found[0])
        terms.append(found[1])
    if products[0] is products[1]:
        return "the sum adds one product to itself"
    chain.reverse()
    tensor = builder.op("Add", terms, static_shape(add.outputs[0]), add.outputs[0].dtype,
                        out=None if chain else node.outputs[0])
    for index, link in enumerate(chain):
        was = link.outputs[0]
        out = node.outputs[0] if index == len(chain) - 1 else None
        tensor = builder.op(link.op, [tensor, *link.inputs[1:]], static_shape(was), was.dtype, out=out, **link.attrs)
    yield builder.finish(*products, add, *chain, node)


def _scalar_factor(tensor: gs.Tensor, site: Site) -> tuple[gs.Tensor, float] | None:
    """(x, c) when `tensor` is x*c by a one-value floating-point constant c that only one node
    reads; else None."""
    node = producer(tensor)
    if node is None or node.op != "Mul" or not _sole_reader(tensor, site):
        return None
    values = [constant_value(t) for t in node.inputs]
    for index, value in enumerate(values):
        if value is not None and value.dtype.kind == "f" and value.size == 1 and values[1 - index] is None:
            return node.inputs[1 - index], float(value.reshape(-1)[0])
    return None


def scalar_factors_out_of_concat(node: gs.Node, site: Site) -> Candidates:
    """A Concat of parts some of which are scaled by a scalar constant, then multiplied by a
    constant k: the scalars move into k, on the positions their parts fill along the Concat's
    axis: Concat(a*c, b)*k = Concat(a, b)*k' with k' = k*c over a's positions. A rotary
    embedding's rotate_half(x)*sin = Concat(-x2, x1)*sin, its negation folded into sin: one
    step less for each query and key. k must already vary along the axis (sin does, stored
    full-sized by broadcast_by_concat): spreading a constant to fold a scalar would trade a
    cheap step for weight bytes. Exact for c = -1 (a sign); otherwise one rounding of k's
    dtype, within float16 rounding."""
    concat = None
    for index, tensor in enumerate(node.inputs):
        value = constant_value(node.inputs[1 - index]) if len(node.inputs) == 2 else None
        made_by = producer(tensor)
        if value is not None and made_by is not None and made_by.op == "Concat":
            concat, constant_index, k = made_by, 1 - index, value
    if concat is None or not _sole_reader(concat.outputs[0], site) or k.dtype.kind != "f":
        return "not a Mul by a floating-point constant of a Concat that it alone reads"
    shape, out_shape = static_shape(concat.outputs[0]), static_shape(node.outputs[0])
    if shape is None or out_shape != shape or k.ndim > len(shape):
        return "the constant broadcasts the Concat to another shape, or a shape is unknown"
    factors = [_scalar_factor(t, site) for t in concat.inputs]
    if not any(factors):
        return "no part of the Concat is scaled by a one-value constant"
    axis = int(concat.attrs["axis"]) % len(shape)
    folded = k.astype(np.float64).reshape((1,) * (len(shape) - k.ndim) + k.shape)
    if folded.shape[axis] != shape[axis]:
        # it would be stored spread along the axis: more weight bytes for one scalar Mul
        return "the constant does not vary along the Concat's axis"
    folded = folded.copy()
    start = 0
    for tensor, factor in zip(concat.inputs, factors):
        width = static_shape(tensor)[axis]
        if factor is not None:
            folded[(slice(None),) * axis + (slice(start, start + width),)] *= factor[1]
        start += width
    if not _storable(folded):
        return "the folded constant would leave float16's range"
    builder = site.builder(node)
    parts = [tensor if factor is None else factor[0] for tensor, factor in zip(concat.inputs, factors)]
    joined = builder.op("Concat", parts, shape, concat.outputs[0].dtype, **concat.attrs)
    inputs = list(node.inputs)
    inputs[1 - constant_index] = joined
    inputs[constant_index] = builder.const(folded.astype(k.dtype), "folded")
    builder.op("Mul", inputs, out=node.outputs[0])
    yield builder.finish(*(producer(t) for t, factor in zip(concat.inputs, factors) if factor), concat, node)


def _input_channel_vector(values: np.ndarray, x_shape: tuple[int, ...]) -> np.ndarray | None:
    return per_channel_values(values, len(x_shape), 1, x_shape[1])


def _recognised_only_with(node: gs.Node, x: gs.Tensor) -> str | None:
    """The kernel a fusion-table recogniser finds ending at `node` and not at `x`'s producer:
    folding `node` away would leave an unrecognised remainder (GELU's x*(1+erf(...)) without its
    0.5), while a LayerNorm's affine folds away leaving the norm exNorm still reads."""
    made_by = x.inputs[0] if len(x.inputs) == 1 else None
    for rule in RECOGNISERS:
        ops = rule.pattern.root_ops()
        if ops is not None and node.op not in ops or next(matches(rule.pattern, node), None) is None:
            continue
        if made_by is None or next(matches(rule.pattern, made_by), None) is None:
            return rule.kernel
    return None


def _weighted_reader(y: gs.Tensor, site: Site) -> tuple[gs.Node, list[gs.Node]] | None:
    """The weighted op that reads `y` as its data input, directly or through relabels, each
    read by the next alone; and those relabels, in order. None when there is none."""
    chain, tensor = [], y
    while _sole_reader(tensor, site):
        reader = tensor.outputs[0]
        if reader.inputs[0] is not tensor or not (reader.op in WEIGHTED or reader.op in RELABELS):
            return None
        if reader.op in WEIGHTED:
            return reader, chain
        chain.append(reader)
        tensor = reader.outputs[0]
    return None


def fold_affine_into_next_weighted_op(node: gs.Node, site: Site) -> Candidates:
    """scale*x + shift by constants whose result only a Conv reads (as its input), folded into
    that Conv: W'[o, i] = W[o, i]*scale[i], b' = b + sum over i and the kernel of W[o, i]*shift[i].
    The scale is exact under the Conv's zero padding (a padded zero stays zero); a shift is
    folded only when the Conv does not pad, since it would have shifted the padding too. The
    constant is one value or one per input channel. A scalar scale alone also folds into the
    weights of a MatMul, Gemm or ConvTranspose reading x, and across relabels (Reshape,
    Flatten, Transpose, ...) before any of them: paddle2onnx's inference dropout, a Mul by
    1 - p before the classifier's Flatten and MatMul, which rknn-toolkit2 folds into the
    MatMul (its fuse_mul_exmatmul), so the scaled feature map is never rounded to float16 on
    its own. Within one rounding of the weight's dtype."""
    affine = affine_of(node)
    if isinstance(affine, str):
        return affine
    x, scale, shift = affine
    found = _weighted_reader(node.outputs[0], site)
    if found is None:
        return "its result is not read by one weighted op alone, as its data input, directly or through relabels"
    reader, chain = found
    kernel = _recognised_only_with(node, x)
    if kernel:
        return f"it ends a pattern the fusion table runs as {kernel}, which the fold would hide"
    shape = static_shape(x)
    if shape is None or static_shape(node.outputs[0]) != shape:
        return "the constant broadcasts its input to another shape, or the shape is unknown"
    if reader.op == "Conv" and not chain:
        return (yield from _folded_into_conv_input(node, x, scale, shift, reader, site))
    if scale.size != 1 or shift.any():
        return f"only a scalar scale folds into a {reader.op}'s weights, or across relabels"
    weights = _weights(reader)
    if weights is None:
        return f"the {reader.op}'s weights are not constant"
    folded = weights[0].astype(np.float64) * float(scale.reshape(-1)[0])
    if not _storable(folded):
        return "the folded weights would leave float16's range"
    builder = site.builder(node)
    tensor = x
    for link in chain:  # the same relabels, of x itself
        tensor = builder.op(link.op, [tensor, *link.inputs[1:]], out=link.outputs[0], **link.attrs)
    builder.op(reader.op, [tensor, builder.const(folded.astype(weights[0].dtype), "weight"), *reader.inputs[2:]],
               out=reader.outputs[0], **reader.attrs)
    yield builder.finish(node, *chain, reader)


def _folded_into_conv_input(node: gs.Node, x: gs.Tensor, scale: np.ndarray, shift: np.ndarray,
                            conv: gs.Node, site: Site) -> Candidates:
    """`fold_affine_into_next_weighted_op`'s per-channel fold into the Conv that reads its result."""
    shape = static_shape(x)
    if len(shape) < 3:
        return "the Conv's input is below rank 3"
    scale_c, shift_c = (_input_channel_vector(v, shape) for v in (scale, shift))
    if scale_c is None or shift_c is None:
        return "the constant varies on an axis other than the channels"
    pads = conv.attrs.get("pads", [0]) or [0]
    padding = any(pads) or conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
    if shift_c.any() and padding:
        return "a shift before a padding Conv would shift its padding too"
    weights = _weights(conv)
    if weights is None:
        return "the Conv's weights or bias are not constant"
    weight, bias = weights
    w = weight.astype(np.float64)
    groups = int(conv.attrs.get("group", 1))
    per_group = w.shape[1]
    # input channel g*per_group + i feeds the outputs of group g through W[:, i]
    scale_g, shift_g = (v.reshape(groups, per_group) for v in (scale_c, shift_c))
    outputs_per_group = w.shape[0] // groups
    scale_o, shift_o = (np.repeat(v, outputs_per_group, axis=0) for v in (scale_g, shift_g))
    spatial = (1,) * (w.ndim - 2)
    folded = w * scale_o.reshape(w.shape[:2] + spatial)
    bias = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
    bias = bias + (w * shift_o.reshape(w.shape[:2] + spatial)).reshape(w.shape[0], -1).sum(axis=1)
    if not _storable(folded, bias):
        return "the folded weights or bias would leave float16's range"
    builder = site.builder(node)
    builder.op("Conv", [x, builder.const(folded.astype(weight.dtype), "weight"),
                        builder.const(bias.astype(weight.dtype), "bias")], out=conv.outputs[0], **conv.attrs)
    yield builder.finish(node, conv)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(sum_of_convs_of_one_input, frozenset({"Add"}), always=True),
    RewriteRule(fold_affine_into_weighted_op, AFFINE_OPS, always=True),
    RewriteRule(fold_affine_into_concatenated_convs, AFFINE_OPS, always=True),
    RewriteRule(fold_affine_into_next_weighted_op, AFFINE_OPS, always=True),
    # again after fusion, for the weighted ops late rules make: a ReduceSum becomes a Conv of
    # ones only then (passes/rewrites/reductions.py), and the 1/n a written-out mean or variance
    # scales it by folds into its weights, so the float16 Conv stores the mean, not a sum of
    # squares that overflows float16 where the mean does not (a LayerNorm's variance over 512 values)
    RewriteRule(fold_affine_into_weighted_op, AFFINE_OPS, always=True, late=True),
    # late: the products a rotary embedding scales by cos and sin broadcast over the heads, which
    # only the late broadcast_by_concat makes legal (passes/rewrites/elementwise.py); its scaled
    # copies of them are legal then
    RewriteRule(scale_into_constant_products, frozenset({"Mul", "Div"}), always=True, late=True),
    # late for the same reason: rotate_half(x)*sin broadcasts sin over the heads
    RewriteRule(scalar_factors_out_of_concat, frozenset({"Mul"}), always=True, late=True),
)
