"""Convolution rewrites: a Conv whose stride, kernel or pads are over the target's window limits
as convolutions within them (pads: after a zero Pad), exactly, a zero Pad before a Conv as the
Conv's own pads, and a Slice with steps over 1 as the 1x1 convolutions that
pick its rows, columns and channels.

Space-to-depth is the common tool. A one-hot grouped convolution with kernel = stride = f moves
each f x f block of a channel into f*f channels, so a convolution of stride s on the input is a
convolution of stride s/f on the blocks, with its weights regrouped. The limits are the
target's own `conv_window` rule (oplist V2.3.2, Convolution: kernel, stride, pad ranges), read
through `Target.rule_parameter`.
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape

from rkcompile.passes.rewrites.base import Builder, Candidates, RewriteRule, Site, producer


@dataclass(frozen=True)
class ConvLimits:
    """The target's largest Conv kernel, depthwise kernel and stride (its conv_window rule)."""

    kernel: int
    depthwise_kernel: int
    stride: int


def conv_limits(site: Site) -> ConvLimits | None:
    values = [site.target.rule_parameter("Conv", "conv_window", name)
              for name in ("kernel", "depthwise_kernel", "stride")]
    return None if None in values else ConvLimits(*values)


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-D Conv's input and output shapes and its window, pads as [top, left, bottom, right]."""

    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    weight: np.ndarray
    bias: gs.Tensor | None
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    group: int

    @property
    def depthwise(self) -> bool:
        return self.group > 1 and self.weight.shape[1] == 1 and self.weight.shape[0] == self.group


def conv_geometry(node: gs.Node, dilated: bool = False) -> ConvGeometry | str:
    """The Conv's geometry, or why a rewrite cannot read it (dilations only when `dilated`)."""
    x_shape, y_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    weight = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if x_shape is None or y_shape is None or len(x_shape) != 4 or weight is None or weight.ndim != 4:
        return "not a 2-D convolution of known shapes with constant weights"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad is set"
    if not dilated and any(int(d) != 1 for d in node.attrs.get("dilations", [1, 1])):
        return "dilations other than 1"
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    return ConvGeometry(x_shape, y_shape, weight, bias, tuple(int(k) for k in weight.shape[2:]),
                        tuple(int(s) for s in node.attrs.get("strides", [1, 1])),
                        tuple(int(p) for p in node.attrs.get("pads", [0, 0, 0, 0])), int(node.attrs.get("group", 1)))


def _geometry_and_limits(node: gs.Node, site: Site) -> tuple[ConvGeometry, ConvLimits, int] | str:
    """The Conv's geometry, the target's limits and the kernel limit that applies to it."""
    conv = conv_geometry(node)
    if isinstance(conv, str):
        return conv
    limits = conv_limits(site)
    if limits is None:
        return f"{site.target.name} has no convolution window rule to work to"
    return conv, limits, limits.depthwise_kernel if conv.depthwise else limits.kernel


def factors_within(value: int, limit: int) -> list[int] | None:
    """`value` as a product of factors each at most `limit`, few of them; None when a prime
    factor is over the limit."""
    primes, rest, p = [], value, 2
    while p * p <= rest:
        while rest % p == 0:
            primes.append(p)
            rest //= p
        p += 1
    if rest > 1:
        primes.append(rest)
    if any(p > limit for p in primes):
        return None
    factors: list[int] = []
    for prime in sorted(primes, reverse=True):  # first fit, largest primes first
        for index, factor in enumerate(factors):
            if factor * prime <= limit:
                factors[index] *= prime
                break
        else:
            factors.append(prime)
    return factors


def block_factor(stride: int, kernel: int, limits: ConvLimits, kernel_limit: int) -> list[int] | None:
    """The stages (each a factor <= the stride limit) of the smallest block size A dividing
    `stride` after which stride/A and the kernel's ceil(kernel/A) are within the limits."""
    for block in range(1, stride + 1):
        if stride % block or stride // block > limits.stride or -(-kernel // block) > kernel_limit:
            continue
        stages = factors_within(block, limits.stride)
        if stages is not None:
            return [f for f in stages if f > 1]
    return None


def space_to_depth(builder: Builder, x: gs.Tensor, shape: list[int], stages: list[tuple[int, int]],
                   pads: list[int], ungrouped_first: bool = False) -> tuple[gs.Tensor, list[int], np.ndarray]:
    """Blocks of `x` moved into channels by one-hot grouped convolutions, one per stage
    (kernel = stride = the stage's factors; `pads` on the first). Returns the result, its
    shape and, per result channel, (source channel, row offset, column offset): result channel
    ch at block (I, J) holds x[source, A_h*I + row, A_w*J + column] of the padded input, with
    A the product of the stages' factors. Channels stay source-major, so groups stay contiguous.
    `ungrouped_first`: the first stage is one ungrouped convolution whose weight is zero across
    channels (the same sums, channels times the MACs), for an input the NPU reads as an image
    only into an ungrouped Conv (`Target.image_input_channels`)."""
    mapping = np.array([(c, 0, 0) for c in range(shape[1])], dtype=np.int64)
    reach = [1, 1]
    current, (n, channels, height, width) = x, shape
    height, width = height + pads[0] + pads[2], width + pads[1] + pads[3]
    for index, (fh, fw) in enumerate(stages):
        dense = ungrouped_first and index == 0
        one_hot = np.zeros((channels * fh * fw, channels if dense else 1, fh, fw), dtype=dtype_name(x.dtype) or "float32")
        blocks = np.arange(fh * fw)
        for c in range(channels):
            one_hot[c * fh * fw + blocks, c if dense else 0, blocks // fw, blocks % fw] = 1
        rows, columns = np.divmod(blocks, fw)
        mapping = np.concatenate([
            np.stack([np.full(fh * fw, source), row + reach[0] * rows, column + reach[1] * columns], axis=1)
            for source, row, column in mapping])
        reach = [reach[0] * fh, reach[1] * fw]
        channels, height, width = channels * fh * fw, height // fh, width // fw
        current = builder.op("Conv", [current, builder.const(one_hot, "space_to_depth")], [n, channels, height, width],
                             x.dtype, kernel_shape=[fh, fw], strides=[fh, fw],
                             group=1 if dense else channels // (fh * fw),
                             pads=list(pads) if index == 0 else [0, 0, 0, 0])
    return current, [n, channels, height, width], mapping


def conv_stride_to_space_to_depth(node: gs.Node, site: Site) -> Candidates:
    """A Conv whose stride (or, with a stride over 1, kernel) is over the target's limits as a
    space-to-depth by A (one-hot convolutions, each stage's factor within the stride limit) then
    a Conv of stride s/A and kernel ceil(k/A) on the blocks, whose weight at block tap (I, J) of
    block channel (c, i, j) is the original's at (A*I + i, A*J + j), zero past the kernel. The
    padding becomes the space-to-depth's, extended at the end so the blocks cover exactly the
    rows the original reads; groups stay groups, since blocks keep their channel's group. Exact
    (every output is the same sum of the same products). Patch embeddings (ViT's 16x16 stride 16)
    need it: the oplist V2.3.2 Convolution bounds the stride well below 16."""
    read = _geometry_and_limits(node, site)
    if isinstance(read, str):
        return read
    conv, limits, kernel_limit = read
    if all(s <= limits.stride for s in conv.strides) and all(k <= kernel_limit for k in conv.kernel):
        return "its stride and kernel are within the limits"
    per_axis = [block_factor(s, k, limits, limits.kernel) for s, k in zip(conv.strides, conv.kernel)]
    if None in per_axis:
        return (f"no block size divides stride {list(conv.strides)} into factors within {limits.stride} "
                f"and brings the kernel {list(conv.kernel)} within {limits.kernel}")
    if not any(per_axis):
        return "the stride is 1, so there is no block to move into channels (a kernel tiling may apply)"
    count = max(len(stages) for stages in per_axis)
    stages = list(zip(*(axis + [1] * (count - len(axis)) for axis in per_axis)))
    blocks = [math.prod(axis) for axis in per_axis]
    out_size = conv.y_shape[2:]
    taps = [-(-k // a) for k, a in zip(conv.kernel, blocks)]
    # The padded extent the blocks must cover: the last output's window, rounded up to blocks.
    covered = [s * (o - 1) + a * t for s, o, a, t in zip(conv.strides, out_size, blocks, taps)]
    begin = conv.pads[:2]
    end = [max(0, cover - size - start) for cover, size, start in zip(covered, conv.x_shape[2:], begin)]
    builder = site.builder(node)
    # a model input the NPU reads as an image (passes/layout.py, reads_as_image) stays one when
    # the first stage reads it ungrouped, as the original ungrouped Conv did (which mixes the
    # channels anyway, so a NaN in one reaches the same outputs)
    as_image = (conv.group == 1 and conv.x_shape[1] in site.target.image_input_channels
                and any(node.inputs[0] is t for t in site.graph.inputs))
    blocked, blocked_shape, mapping = space_to_depth(builder, node.inputs[0], list(conv.x_shape), stages,
                                                     [*begin, *end], ungrouped_first=as_image)
    out_channels, in_per_group = conv.weight.shape[:2]
    padded = np.zeros((out_channels, in_per_group, blocks[0] * taps[0], blocks[1] * taps[1]), conv.weight.dtype)
    padded[:, :, :conv.kernel[0], :conv.kernel[1]] = conv.weight
    group_map = mapping[:in_per_group * blocks[0] * blocks[1]]  # group 0's channels; every group maps alike
    rows = blocks[0] * np.arange(taps[0])[None, :] + group_map[:, 1:2]
    columns = blocks[1] * np.arange(taps[1])[None, :] + group_map[:, 2:3]
    regrouped = padded[:, group_map[:, 0, None, None], rows[:, :, None], columns[:, None, :]]
    inputs = [blocked, builder.const(regrouped, "weight")] + ([conv.bias] if conv.bias is not None else [])
    builder.op("Conv", inputs, out=node.outputs[0], kernel_shape=taps, group=conv.group,
               strides=[s // a for s, a in zip(conv.strides, blocks)], pads=[0, 0, 0, 0])
    yield builder.finish()


def _kernel_tiles(conv: ConvGeometry, kernel_limit: int) -> list[list[tuple[int, int]]]:
    """Per axis, the (start, size) of the kernel's tiles: runs of at most `kernel_limit` taps."""
    return [[(start, min(kernel_limit, size - start)) for start in range(0, size, kernel_limit)]
            for size in conv.kernel]


def _windows_within_pads(conv: ConvGeometry, kernel_limit: int) -> list[list[tuple[int, int, int, int]]] | None:
    """Per axis and tile, (window start, window size, pad before, pad after): the window of taps,
    the tile and zeros beside it, that a Conv reading the unpadded input through its own pads
    computes the tile with. A window starting at tap w reads the input from w - pad_before, so
    w must not pass the pad before; it must reach far enough that the last output's taps end
    inside the pad after, or short of the input's end by less than a stride (the output count
    rounds down alike). None when a window would be over `kernel_limit`."""
    axes = []
    for axis, tiles in enumerate(_kernel_tiles(conv, kernel_limit)):
        before, size, stride = conv.pads[axis], conv.x_shape[2 + axis], conv.strides[axis]
        span = stride * (conv.y_shape[2 + axis] - 1)
        windows = []
        for start, tile in tiles:
            begin, end = min(start, before), max(start + tile, size + before - span - (stride - 1))
            if end - begin > kernel_limit:
                return None
            windows.append((begin, end - begin, before - begin, max(0, span + end - size - before)))
        axes.append(windows)
    return axes


def _sum_of_tile_convs(builder: Builder, node: gs.Node, conv: ConvGeometry,
                       parts: list[tuple[gs.Tensor, np.ndarray, list[int]]]) -> None:
    """Conv(input, weight, pads) per part, the first with the bias, added in order into the
    node's output."""
    total = None
    for index, (window, weight, pads) in enumerate(parts):
        last = index == len(parts) - 1
        bias = [conv.bias] if conv.bias is not None and total is None else []
        part = builder.op("Conv", [window, builder.const(weight, "weight"), *bias], conv.y_shape, window.dtype,
                          out=node.outputs[0] if last and total is None else None,
                          kernel_shape=list(weight.shape[2:]), strides=list(conv.strides), group=conv.group,
                          **({"pads": pads} if any(pads) else {}))
        if total is not None:
            part = builder.op("Add", [total, part], out=node.outputs[0] if last else None,
                              shape=conv.y_shape, dtype=window.dtype)
        total = part


def conv_kernel_to_tiles(node: gs.Node, site: Site) -> Candidates:
    """A Conv whose kernel is over the target's limit (a separate, smaller one depthwise: oplist
    V2.3.2, Convolution and Depthwise Convolution) as the sum of convolutions of kernel tiles within it:
    sum over tiles of the taps in the tile is the sum over all taps. Preferred: each tile's Conv
    reads the input itself through its own pads, its weight the tile within a window of at most
    the limit (zeros beside the tile) placed so the pads stay between zero and the original's;
    no copies of the input, one step per tile. Where a window would be over the limit (pads
    smaller than the kernel's overhang), the padding becomes one Pad and each tile reads a Slice
    of it from its tile's offset. Exact: the zeros add nothing."""
    read = _geometry_and_limits(node, site)
    if isinstance(read, str):
        return read
    conv, limits, kernel_limit = read
    if all(k <= kernel_limit for k in conv.kernel):
        return "its kernel is within the limit"
    tiles = _kernel_tiles(conv, kernel_limit)
    windows = _windows_within_pads(conv, kernel_limit)
    if windows is not None:
        builder = site.builder(node)
        parts = []
        for (row, tile_h), (top, height, pad_top, pad_bottom) in zip(tiles[0], windows[0]):
            for (column, tile_w), (left, width, pad_left, pad_right) in zip(tiles[1], windows[1]):
                weight = np.zeros((*conv.weight.shape[:2], height, width), conv.weight.dtype)
                weight[:, :, row - top:row - top + tile_h, column - left:column - left + tile_w] = \
                    conv.weight[:, :, row:row + tile_h, column:column + tile_w]
                parts.append((node.inputs[0], weight, [pad_top, pad_left, pad_bottom, pad_right]))
        _sum_of_tile_convs(builder, node, conv, parts)
        yield builder.finish()
    x, (n, channels, height, width) = node.inputs[0], conv.x_shape
    builder = site.builder(node)
    if any(conv.pads):
        top, left, bottom, right = conv.pads
        height, width = height + top + bottom, width + left + right
        pads = builder.const(np.array([0, 0, top, left, 0, 0, bottom, right], dtype=np.int64), "pads")
        x = builder.op("Pad", [x, pads], [n, channels, height, width], x.dtype, mode="constant")
    out_h, out_w = conv.y_shape[2:]
    parts = []
    for (row, tile_h) in tiles[0]:
        for (column, tile_w) in tiles[1]:
            extent = [conv.strides[0] * (out_h - 1) + tile_h, conv.strides[1] * (out_w - 1) + tile_w]
            window = x
            if (row, column) != (0, 0) or extent != [height, width]:
                bounds = [builder.const(np.array(v, dtype=np.int64), name) for v, name in (
                    ([row, column], "starts"), ([row + extent[0], column + extent[1]], "ends"), ([2, 3], "axes"))]
                window = builder.op("Slice", [x, *bounds], [n, channels, *extent], x.dtype)
            parts.append((window, conv.weight[:, :, row:row + tile_h, column:column + tile_w], [0, 0, 0, 0]))
    _sum_of_tile_convs(builder, node, conv, parts)
    yield builder.finish()


def slice_picks(node: gs.Node) -> tuple[list[int], list[tuple[int, int, int]]] | str:
    """The Slice's input on the 4-D view (leading 1s for lower ranks) and, per axis of that view,
    (start, step, count) with positive steps; or why a rewrite cannot read it."""
    shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if shape is None or out_shape is None or not 1 <= len(shape) <= 4:
        return "not a tensor of rank 1 to 4 and known shape"
    if len(node.inputs) < 5 or not node.inputs[4].name:
        return "no steps (all 1)"
    starts, axes, steps = (constant_value(node.inputs[i]) if node.inputs[i].name else None for i in (1, 3, 4))
    if starts is None or steps is None or (node.inputs[3].name and axes is None):
        return "starts, axes or steps are computed"
    axes = range(len(shape)) if axes is None else np.ravel(axes)
    lead = 4 - len(shape)
    view = [1] * lead + list(shape)
    picks = [(0, 1, size) for size in view]
    for start, axis, step in zip(np.ravel(starts), axes, np.ravel(steps)):
        axis, step, start = int(axis) % len(shape), int(step), int(start)
        if step < 1:
            return f"step {step} on axis {axis} runs backwards"
        start = min(max(start + shape[axis] if start < 0 else start, 0), shape[axis])
        picks[axis + lead] = (start, step, out_shape[axis])
    if all(step == 1 for _, step, _ in picks):
        return "every step is 1"
    if any(count == 0 for _, _, count in picks):
        return "the result is empty"
    return view, picks


def _cropped(builder: Builder, x: gs.Tensor, view: list[int], spans: list[tuple[int, int]]) -> tuple[gs.Tensor, list[int]]:
    """`x` on its 4-D view, cut by a step-1 Slice to `spans` ([begin, end) per axis) where they cut."""
    current = x if len(static_shape(x)) == 4 else builder.reshape(x, view)
    cut = [axis for axis, (begin, end) in enumerate(spans) if (begin, end) != (0, view[axis])]
    shape = [end - begin for begin, end in spans]
    if cut:
        bounds = [builder.const(np.array(values, dtype=np.int64), name) for values, name in (
            ([spans[a][0] for a in cut], "starts"), ([spans[a][1] for a in cut], "ends"), (cut, "axes"))]
        current = builder.op("Slice", [current, *bounds], shape, x.dtype)
    return current, shape


def _stepped_chain(tensor: gs.Tensor, site: Site) -> tuple[gs.Tensor, list[tuple[int, int, int]], list[gs.Node]] | None:
    """The source of the chain of stepped Slices of a 4-D tensor that ends in `tensor`, with the
    picks they make together per axis (start, step, count); None when `tensor` is not such a
    chain's end. A link may be shared with other chains (HF Swin's patch merging takes
    x[:, 0::2] once for two of its four parts): the caller checks who reads the links."""
    chain = []
    while (node := producer(tensor)) is not None and node.op == "Slice" and tensor.name not in site.graph_outputs:
        chain.append(node)
        tensor = node.inputs[0]
    read = [slice_picks(node) for node in reversed(chain)]
    if not chain or any(isinstance(r, str) for r in read) or len(static_shape(tensor)) != 4:
        return None
    picks = [(0, 1, size) for size in static_shape(tensor)]
    for _, link in read:
        picks = [(start + step * inner_start, step * inner_step, count)
                 for (start, step, _), (inner_start, inner_step, count) in zip(picks, link)]
    return tensor, picks, chain


#: per memory order of a 4-D map, the Concat axis of its channels and its axes as (N, C, H, W)
_MAP_AXES = {"NCHW": (1, (0, 1, 2, 3)), "NHWC": (3, (0, 3, 1, 2))}


def stepped_slices_concat_as_conv(node: gs.Node, site: Site) -> Candidates:
    """A channel Concat of stepped Slices of one map, each taking every channel and, along
    height and width, every (sh, sw)-th value from an offset inside the step (YOLOv5's Focus,
    a space-to-depth written as x[..., ::2, ::2], x[..., 1::2, ::2], ... and a Concat), as one
    convolution of kernel = stride = (sh, sw) whose one-hot weights pick, for each output
    channel, its slice's offset in its channel's window: every output is one input times 1, so
    exact, and one step where the Slices' own rewrites (`strided_slice_to_convs`) make a crop
    and a picking Conv per Slice, then the Concat. A channels-last map (Swin's patch merging,
    x[:, 0::2, 0::2, :] and three more, joined on the last axis) is the same Conv between a
    Transpose to channels-first and one back: three steps where the Slices and their Convs were
    thirteen."""
    tensor = node.outputs[0]
    while tensor.outputs and all(r.op == "Slice" for r in tensor.outputs) and tensor.name not in site.graph_outputs:
        tensor = tensor.outputs[0].outputs[0]
    concat = tensor.outputs[0] if len(tensor.outputs) == 1 and tensor.name not in site.graph_outputs else None
    layout = None if concat is None or concat.op != "Concat" or len(static_shape(concat.outputs[0]) or ()) != 4 \
        else next((name for name, (axis, _) in _MAP_AXES.items() if int(concat.attrs.get("axis", 0)) % 4 == axis), None)
    if layout is None:
        return "its Slices do not end in a channel Concat of 4-D maps, first or last"
    order = _MAP_AXES[layout][1]
    operands = [_stepped_chain(t, site) for t in concat.inputs]
    if None in operands or len({id(source) for source, _, _ in operands}) != 1:
        return "the Concat reads something other than stepped Slices of one map"
    links = {id(link): link for _, _, chain in operands for link in chain}
    if any(reader is not concat and id(reader) not in links
           for link in links.values() for reader in link.outputs[0].outputs):
        return "a Slice's result is read outside the Concat's Slices"
    x = operands[0][0]
    n, c, h, w = (static_shape(x)[axis] for axis in order)
    operands = [(source, [picks[axis] for axis in order], chain) for source, picks, chain in operands]
    steps = {tuple(step for _, step, _ in picks[2:]) for _, picks, _ in operands}
    if len(steps) != 1:
        return "its Slices step differently"
    (sh, sw), = steps
    whole = [(0, 1, n), (0, 1, c)]
    if any(picks[:2] != whole or picks[2][0] >= sh or picks[3][0] >= sw or (picks[2][2], picks[3][2]) != (h // sh, w // sw)
           for _, picks, _ in operands):
        return "a Slice cuts the batch or channels, starts past its step, or leaves a remainder a window would drop"
    limits = conv_limits(site)
    if limits is None or max(sh, sw) > min(limits.stride, limits.kernel) or dtype_name(x.dtype) not in FLOAT_DTYPES:
        return "the steps are over the target's convolution limits, or the map is not floating point"
    weight = np.zeros((len(operands) * c, c, sh, sw), dtype_name(x.dtype))
    for index, (_, picks, _) in enumerate(operands):
        weight[index * c + np.arange(c), np.arange(c), picks[2][0], picks[3][0]] = 1
    builder = site.builder(node)
    picker = builder.const(weight, "picker")
    if layout == "NCHW":
        builder.op("Conv", [x, picker], out=concat.outputs[0], kernel_shape=[sh, sw], strides=[sh, sw])
    else:
        first = builder.op("Transpose", [x], [n, c, h, w], x.dtype, perm=list(order))
        picked = builder.op("Conv", [first, picker], [n, weight.shape[0], h // sh, w // sw], x.dtype,
                            kernel_shape=[sh, sw], strides=[sh, sw])
        builder.op("Transpose", [picked], out=concat.outputs[0], perm=[0, 2, 3, 1])
    yield builder.finish(*links.values(), concat)


def strided_slice_to_convs(node: gs.Node, site: Site) -> Candidates:
    """A Slice with steps over 1 as the step-1 Slice of what it spans (on the 4-D view), then 1x1
    convolutions with strides = the height and width steps (in stages of factors within the
    target's stride limit) whose weights pick every step-th channel (one-hot) or copy each
    channel (depthwise ones). Every output is one input times 1: exact. Swin's patch merging,
    x[:, r::2, q::2, :], needs it: the oplist V2.3.2 Slice takes steps of 1 only. The second
    candidate picks the stepped axes with Gathers (oplist V2.3.2 Gather), for the first axis or
    steps with a prime factor over the stride limit."""
    read = slice_picks(node)
    if isinstance(read, str):
        return read
    view, picks = read
    x, y = node.inputs[0], node.outputs[0]
    dtype = dtype_name(x.dtype)
    four_d = len(static_shape(y)) == 4
    limits = conv_limits(site)
    stages = [factors_within(step, limits.stride) for _, step, _ in picks[2:]] if limits else [None]
    if dtype in FLOAT_DTYPES and picks[0][1] == 1 and None not in stages:
        builder = site.builder(node)
        spans = [(start, start + step * (count - 1) + 1) for start, step, count in picks]
        current, shape = _cropped(builder, x, view, spans)
        count = max(1, *(len(axis) for axis in stages))
        strides = list(zip(*(axis + [1] * (count - len(axis)) for axis in stages)))
        _, step, channels = picks[1]
        if step == 1:
            weight, group = np.ones((channels, 1, 1, 1), dtype), channels
        else:
            weight, group = np.zeros((channels, shape[1], 1, 1), dtype), 1
            weight[np.arange(channels), step * np.arange(channels), 0, 0] = 1
        for index, stride in enumerate(strides):
            shape = [shape[0], channels, *((size - 1) // f + 1 for size, f in zip(shape[2:], stride))]
            last = index == len(strides) - 1
            current = builder.op("Conv", [current, builder.const(weight, "picker")], shape, x.dtype,
                                 out=y if last and four_d else None, kernel_shape=[1, 1], strides=list(stride),
                                 group=group)
            weight, group = np.ones((channels, 1, 1, 1), dtype), channels
        if not four_d:
            builder.reshape(current, static_shape(y), out=y)
        yield builder.finish()
    gather = site.builder(node)
    spans = [(start, start + count) if step == 1 else (0, size) for (start, step, count), size in zip(picks, view)]
    current, shape = _cropped(gather, x, view, spans)
    stepped = [axis for axis, (_, step, _) in enumerate(picks) if step > 1]
    for axis in stepped:
        start, step, count = picks[axis]
        shape[axis] = count
        indices = gather.const(start + step * np.arange(count, dtype=np.int64), "indices")
        current = gather.op("Gather", [current, indices], shape, x.dtype, axis=axis,
                            out=y if axis == stepped[-1] and four_d else None)
    if not four_d:
        gather.reshape(current, static_shape(y), out=y)
    yield gather.finish()


def _live_taps(size: int, out: int, stride: int, dilation: int, kernel: int, pad: int) -> tuple[int, int] | None:
    """The first and last kernel tap along one axis that reads the input (not only padding) for
    some output; None when none does."""
    live = [tap for tap in range(kernel)
            if any(0 <= y * stride + tap * dilation - pad < size for y in range(out))]
    return (live[0], live[-1]) if live else None


def conv_padding_only_taps_dropped(node: gs.Node, site: Site) -> Candidates:
    """A Conv whose outer kernel taps read only padding for every output (a dilated 3x3 whose
    dilation reaches past a small feature map: DeepLab's atrous pyramid) without those taps:
    they multiply zeros, so the smaller kernel, with the padding shrunk by what they spanned,
    computes the same; its pads and dilation then fit the oplist V2.3.2 Convolution limits
    where the original's did not."""
    conv = conv_geometry(node, dilated=True)
    if isinstance(conv, str):
        return conv
    dilations = [int(d) for d in node.attrs.get("dilations", [1, 1])]
    spans = [_live_taps(size, out, stride, dilation, kernel, pad) for size, out, stride, dilation, kernel, pad in
             zip(conv.x_shape[2:], conv.y_shape[2:], conv.strides, dilations, conv.kernel, conv.pads[:2])]
    if None in spans:
        return "no tap reads the input along an axis (the output is the bias alone)"
    if all((first, last) == (0, kernel - 1) for (first, last), kernel in zip(spans, conv.kernel)):
        return "every tap reads the input for some output"
    kernel = [last - first + 1 for first, last in spans]
    begin = [pad - first * dilation for pad, (first, _), dilation in zip(conv.pads[:2], spans, dilations)]
    # End padding up to the last output's window; a window ending inside the input needs none
    # (the output count rounds down to the same number).
    end = [max(0, (out - 1) * stride + (k - 1) * dilation + 1 - size - start) for out, stride, k, dilation, size, start
           in zip(conv.y_shape[2:], conv.strides, kernel, dilations, conv.x_shape[2:], begin)]
    counts = [(size + start + stop - (k - 1) * dilation - 1) // stride + 1 for size, start, stop, k, dilation, stride
              in zip(conv.x_shape[2:], begin, end, kernel, dilations, conv.strides)]
    if min(begin) < 0 or counts != list(conv.y_shape[2:]):
        return "the live taps start inside the input, which pads cannot express"
    weight = conv.weight[:, :, spans[0][0]:spans[0][1] + 1, spans[1][0]:spans[1][1] + 1]
    builder = site.builder(node)
    inputs = [node.inputs[0], builder.const(weight, "weight")] + ([conv.bias] if conv.bias is not None else [])
    builder.op("Conv", inputs, out=node.outputs[0], kernel_shape=kernel, strides=list(conv.strides), group=conv.group,
               pads=[*begin, *end], dilations=[d if k > 1 else 1 for d, k in zip(dilations, kernel)])
    yield builder.finish()


def conv_pads_to_pad(node: gs.Node, site: Site) -> Candidates:
    """A Conv whose pads are over the target's limit (a dilated 1-D convolution of a speech or
    time-series model, pads = dilation > 15) as a zero Pad of the excess and then the Conv with
    pads within the limit: zero padding is zero padding whether the Pad or the Conv adds it, so
    every window reads the same values. Only where the target runs a constant Pad on the NPU."""
    x, shape = node.inputs[0], static_shape(node.inputs[0])
    if shape is None or len(shape) < 3:
        return "the input's shape is unknown"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad is set"
    limit = site.target.rule_parameter("Conv", "conv_window", "pad")
    if limit is None:
        return f"{site.target.name} has no convolution window rule to work to"
    if "constant" not in (site.target.rule_parameter("Pad", "pad_mode", "modes") or ()):
        return f"{site.target.name} runs no constant Pad on the NPU"
    spatial = len(shape) - 2
    pads = [int(p) for p in node.attrs.get("pads", [0] * 2 * spatial)]
    if all(p <= limit for p in pads):
        return "its pads are within the limit"
    kept = [min(p, limit) for p in pads]
    excess = [p - k for p, k in zip(pads, kept)]
    builder = site.builder(node)
    widths = builder.const(np.array([0, 0, *excess[:spatial], 0, 0, *excess[spatial:]], dtype=np.int64), "pads")
    padded = builder.op("Pad", [x, widths], [*shape[:2], *(s + b + e for s, b, e in
                                                          zip(shape[2:], excess[:spatial], excess[spatial:]))],
                        x.dtype, mode="constant")
    builder.op("Conv", [padded, *node.inputs[1:]], out=node.outputs[0], **{**node.attrs, "pads": kept})
    yield builder.finish()


def conv_1d_as_2d(node: gs.Node, site: Site) -> Candidates:
    """A 1-D Conv ([N, C, L] input) over the window limits as the 2-D Conv of kernel [1, k] on
    the input viewed as [N, C, 1, L], between two Reshapes: the same windows over the same
    values, so exact. The 2-D Conv is then legalized as any other (space-to-depth for a large
    stride, kernel tiles, a Pad): an STFT front end's kernel 256, stride 128 becomes NPU work."""
    x_shape, y_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if x_shape is None or y_shape is None or len(x_shape) != 3 or constant_value(weight) is None:
        return "not a 1-D convolution of known shapes with constant weights"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "auto_pad is set"
    builder = site.builder(node)
    begin, end = (int(p) for p in node.attrs.get("pads", [0, 0]))
    lifted = builder.derived(weight, lambda w: w[:, :, None, :], [*weight.shape[:2], 1, weight.shape[2]],
                             "weight_2d", keeps_values=True)
    attrs = {"kernel_shape": [1, int(weight.shape[2])], "pads": [0, begin, 0, end],
             "strides": [1, int(node.attrs.get("strides", [1])[0])],
             "dilations": [1, int(node.attrs.get("dilations", [1])[0])], "group": int(node.attrs.get("group", 1))}
    x4 = builder.reshape(node.inputs[0], [x_shape[0], x_shape[1], 1, x_shape[2]])
    y4 = builder.op("Conv", [x4, lifted, *node.inputs[2:]], [y_shape[0], y_shape[1], 1, y_shape[2]],
                    node.outputs[0].dtype, **attrs)
    builder.reshape(y4, list(y_shape), out=node.outputs[0])
    yield builder.finish()


def _zero_pads(node: gs.Node) -> list[int] | None:
    """A Pad's pads when it adds constant zeros on every axis (no `axes` input), none negative;
    else None. The attribute form (opset < 11) and the input form both."""
    if node.attrs.get("mode", "constant") not in ("constant", b"constant"):
        return None
    if len(node.inputs) == 1:
        pads, value = node.attrs.get("pads"), float(node.attrs.get("value", 0.0))
    else:
        if len(node.inputs) > 3 and node.inputs[3].name:
            return None
        pads = constant_value(node.inputs[1])
        given = len(node.inputs) > 2 and node.inputs[2].name
        value = constant_value(node.inputs[2]) if given else np.zeros(1)
        if value is None:
            return None
        value = float(np.asarray(value).reshape(-1)[0])
    if pads is None or value != 0.0:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    return pads if min(pads, default=0) >= 0 else None


def zero_pad_into_conv(node: gs.Node, site: Site) -> Candidates:
    """A zero Pad of the spatial axes whose result only a Conv reads, as that Conv's input,
    folded into the Conv's pads: zero padding is zero padding whether the Pad or the Conv adds
    it, so every window reads the same values, and the Pad's pass over the map is gone.
    tf2onnx and timm's TF-ported models write a strided convolution's "same" padding so
    (tf_efficientnet_b0: five of them). Only while the sum stays within the target's pad limit,
    where `conv_pads_to_pad` would split it again."""
    pads = _zero_pads(node)
    if pads is None:
        return "not a Pad of constant zeros on every axis, none negative"
    y = node.outputs[0]
    conv = y.outputs[0] if len(y.outputs) == 1 and y.name not in site.graph_outputs else None
    if conv is None or conv.op != "Conv" or conv.inputs[0] is not y:
        return "its result is not read by one Conv alone, as that Conv's input"
    rank = len(pads) // 2
    if rank < 3 or any(pads[:2]) or any(pads[rank:rank + 2]):
        return "it pads the batch or channel axis"
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "the Conv sets auto_pad"
    spatial = rank - 2
    old = [int(p) for p in conv.attrs.get("pads", [0] * 2 * spatial)]
    summed = [a + b for a, b in zip(old, [*pads[2:rank], *pads[rank + 2:]])]
    limit = site.target.rule_parameter("Conv", "conv_window", "pad")
    if limit is None or max(summed) > limit:
        return f"the Conv's pads would be {summed}, over the target's limit of {limit}"
    builder = site.builder(node)
    builder.op("Conv", [node.inputs[0], *conv.inputs[1:]], out=conv.outputs[0], **{**conv.attrs, "pads": summed})
    yield builder.finish(node, conv)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(zero_pad_into_conv, frozenset({"Pad"}), always=True),
    RewriteRule(conv_padding_only_taps_dropped, frozenset({"Conv"})),
    RewriteRule(conv_stride_to_space_to_depth, frozenset({"Conv"})),
    RewriteRule(conv_kernel_to_tiles, frozenset({"Conv"})),
    RewriteRule(conv_pads_to_pad, frozenset({"Conv"})),
    RewriteRule(conv_1d_as_2d, frozenset({"Conv"})),
    RewriteRule(stepped_slices_concat_as_conv, frozenset({"Slice"})),
    RewriteRule(strided_slice_to_convs, frozenset({"Slice"})),
)
