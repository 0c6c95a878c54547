"""Channel permutations as 1x1 convolutions that pick channels, and those picks folded away.

A channel shuffle (ShuffleNet's Reshape [N, g, C/g, H, W] -> Transpose -> Reshape [N, C, H, W],
in any exporter's spelling) only reorders channels, and the NPU runs a reorder of channels as
one 1x1 Conv whose weights are one-hot rows (rknn-toolkit2 turns the shuffle into one Conv)
where the relabels and the Transpose are three layout steps. A Split of such a pick is picks of
the pick's input, one per part (a Split of another Conv is a Conv per part, its weight and
bias rows), and a Conv reading a pick reads the pick's input with its weight columns moved
instead: the pick goes. Relabels and Transposes that cut a map into b x b blocks and stack
each block's offsets on the channels (MobileViT's unfold of patches, SpaceToDepth written out)
are a Conv of kernel and stride b picking one input per output: one step and a relabel where
the chain is five steps once its 6-D Transpose is cut to 4-D. Every output of a pick is one
input times 1 and a moved weight column is the same weights in other places: all of it is
exact.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape

from rkcompile.passes.rewrites.base import (RESHAPE_LIKE, Builder, Candidates, Replacement, RewriteRule, Site,
    producer)

MOVEMENT = RESHAPE_LIKE | {"Transpose"}


def _moved_indices(chain: list[gs.Node], shape: tuple[int, ...]) -> np.ndarray:
    """Where each element of the chain's output comes from: the chain run on element numbers."""
    values = np.arange(int(np.prod(shape))).reshape(shape)
    for node in chain:
        if node.op == "Transpose":
            values = values.transpose([int(p) for p in node.attrs.get("perm", range(values.ndim - 1, -1, -1))])
        else:
            values = values.reshape(static_shape(node.outputs[0]))
    return values


def _movement_chains(node: gs.Node, site: Site) -> list[tuple[gs.Tensor, list[gs.Node]]]:
    """The runs of relabels and Transposes ending at `node` that start from a tensor of known
    shape, each tensor inside a run read by the next node alone, longest first."""
    chain, found = [node], []
    while True:
        source = chain[0].inputs[0]
        if static_shape(source) is None:
            break
        found.insert(0, (source, list(chain)))
        earlier = producer(source)
        if (earlier is None or earlier.op not in MOVEMENT or len(source.outputs) != 1
                or source.name in site.graph_outputs or len(earlier.outputs) != 1):
            break
        chain.insert(0, earlier)
    return found


def _movement_chain(node: gs.Node, site: Site) -> tuple[gs.Tensor, list[gs.Node]] | None:
    """The longest of `_movement_chains` that starts from a 4-D tensor of `node`'s output shape."""
    shape = static_shape(node.outputs[0])
    return next(((source, chain) for source, chain in _movement_chains(node, site)
                 if static_shape(source) == shape), None)


def _pick(builder: Builder, x: gs.Tensor, picked: np.ndarray, out: gs.Tensor | None = None) -> gs.Tensor:
    """A 1x1 Conv whose output channel j is `x`'s channel picked[j]."""
    shape = static_shape(x)
    weight = np.zeros((len(picked), shape[1], 1, 1), dtype_name(x.dtype))
    weight[np.arange(len(picked)), picked, 0, 0] = 1
    return builder.op("Conv", [x, builder.const(weight, "channel_pick")], [shape[0], len(picked), *shape[2:]],
                      x.dtype, out=out, kernel_shape=[1, 1])


def channel_picks(conv: gs.Node) -> np.ndarray | None:
    """The input channel each output channel of `conv` copies when it only picks channels (1x1,
    one-hot weight rows, no bias, stride 1, no pads, one group), each input at most once."""
    weight = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    bias = constant_value(conv.inputs[2]) if len(conv.inputs) > 2 else None
    attrs = conv.attrs
    if (weight is None or weight.ndim != 4 or weight.shape[2:] != (1, 1) or attrs.get("group", 1) != 1
            or any(s != 1 for s in attrs.get("strides", [1, 1])) or any(attrs.get("pads", [0] * 4))
            or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
            or (len(conv.inputs) > 2 and (bias is None or np.any(bias)))):
        return None
    rows = weight[:, :, 0, 0]
    picked = rows.argmax(axis=1)
    if not (np.array_equal(rows, np.eye(rows.shape[1], dtype=rows.dtype)[picked])
            and len(set(picked.tolist())) == len(picked)):
        return None
    return picked


def channel_shuffle_to_pick(node: gs.Node, site: Site) -> Candidates:
    """Relabels and Transposes that take a 4-D tensor back to its own shape with only its
    channels reordered (a channel shuffle) as one channel-picking 1x1 Conv."""
    y = node.outputs[0]
    shape = static_shape(y)
    if shape is None or len(shape) != 4 or y.dtype is None or dtype_name(y.dtype) not in FLOAT_DTYPES:
        return "not a 4-D float tensor of known shape"
    found = _movement_chain(node, site)
    if found is None or not any(n.op == "Transpose" for n in found[1]):
        return "no Transpose between it and a tensor of its shape"
    x, chain = found
    n, c, h, w = shape
    moved = _moved_indices(chain, tuple(shape)).reshape(n, c, h * w)
    picked = moved[0, :, 0] // (h * w)
    if np.any(picked >= c):  # the first image's elements come from another image
        return "it moves elements between images"
    expected = np.arange(n * c * h * w).reshape(n, c, h * w)[:, picked]
    if not np.array_equal(moved, expected):
        return "it moves more than whole channels"
    builder = site.builder(node)
    _pick(builder, x, picked, out=y)
    yield builder.finish(*chain)


#: Largest block side of a patch rearrangement made a Conv (the Conv stride limit is 7 or more
#: on every target; legalize checks the rest).
LARGEST_BLOCK = 7


#: Most multiply-adds per output a one-group pick may spend (a 4-channel map in 2 x 2 blocks, an
#: RGB image's SpaceToDepth takes 12): beyond that the moves cost less than the Conv's
#: arithmetic, and a chain that only reorders channels before a flattening relabel would pass
#: for a pick along the flattened axis.
MOST_PICK_TAPS = 16


def _blocks(size: int) -> list[int]:
    return [b for b in range(1, LARGEST_BLOCK + 1) if size % b == 0]


def _unfold_picks(moved: np.ndarray, source: tuple[int, ...], rows: int,
                  cols: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(input channel, block offset i*cols + j) each output channel of a Conv of kernel and
    stride rows x cols picks, when that Conv's output is `moved` (per output element of the
    Conv's shape, the flat index of the source element it holds), each output one source
    element times 1; None when no such Conv gives it."""
    images, channels, height, width = moved.shape
    # divmod, not np.unravel_index: numpy 2.4's gives wrong rows for a [1, 50176, 2, 1] array
    batch, rest = np.divmod(moved, int(np.prod(source[1:])))
    origin, rest = np.divmod(rest, source[2] * source[3])
    row, col = np.divmod(rest, source[3])
    row_offset = row - np.arange(height)[:, None] * rows
    col_offset = col - np.arange(width) * cols
    per_channel = [a[:1, :, :1, :1] for a in (origin, row_offset, col_offset)]
    if (np.any(batch != np.arange(images)[:, None, None, None])
            or any(np.any(a != first) for a, first in zip((origin, row_offset, col_offset), per_channel))):
        return None
    origin, row_offset, col_offset = (a.reshape(-1) for a in per_channel)
    if np.any(row_offset < 0) or np.any(row_offset >= rows) or np.any(col_offset < 0) or np.any(col_offset >= cols):
        return None
    return origin, row_offset * cols + col_offset


def patches_as_strided_pick(node: gs.Node, site: Site) -> Candidates:
    """Relabels and Transposes that stack each b x b block of a 4-D map's offsets on its channels
    (the unfold of patches, SpaceToDepth written out) as a Conv of kernel and stride b whose
    one-hot weights pick the offset, grouped per channel when each channel's offsets stay
    together, and a relabel where the chain ends in another view of the same data. Tried at the
    end of a chain only (an inner node's shorter chain would take part of the rearrangement, or
    see a view's axes as images), on chains of two Transposes or more (a block's rows and
    columns each move; one Transpose is one step, and attention's fusion reads its head merge),
    and kept only when fewer steps than the chain. The way back (the fold) stays moves: as a
    ConvTranspose it needs one group (the targets' ConvTranspose takes one group or one per
    channel, not b*b channels per output), b*b*C times the MACs of the moves' elements, which
    the cost model puts above the moves it replaces."""
    y = node.outputs[0]
    shape = static_shape(y)
    if shape is None or y.dtype is None or dtype_name(y.dtype) not in FLOAT_DTYPES:
        return "not a float tensor of known shape"
    if len(y.outputs) == 1 and y.outputs[0].op in MOVEMENT and y.name not in site.graph_outputs:
        return "not the end of a chain of relabels and Transposes: its reader continues it"
    chains = [(x, chain) for x, chain in _movement_chains(node, site)
              if len(static_shape(x)) == 4 and sum(n.op == "Transpose" for n in chain) >= 2]
    if not chains:
        return "fewer than two Transposes between it and a 4-D tensor"
    for x, chain in chains:
        source = tuple(static_shape(x))
        n, c, h, w = source
        moved = _moved_indices(chain, source)
        for rows, cols in _block_sides(h, w):
            unfolded = moved.reshape(n, c * rows * cols, h // rows, w // cols)
            # the first image's first row and column of blocks first: most block sides fail there,
            # at a fraction of the whole map's cost
            if any(_unfold_picks(probe, source, rows, cols) is None
                   for probe in (unfolded[:1, :, :1, :], unfolded[:1, :, :, :1])):
                continue
            picks = _unfold_picks(unfolded, source, rows, cols)
            if picks is not None and 1 + (list(unfolded.shape) != list(shape)) < len(chain):
                candidate = _strided_pick(site, node, chain, x, picks, list(unfolded.shape), rows, cols)
                if candidate is not None:
                    yield candidate
    return "it does not stack a 4-D map's blocks on its channels, or not in fewer steps than its own"


def _block_sides(height: int, width: int) -> list[tuple[int, int]]:
    """Block heights and widths up to LARGEST_BLOCK that divide the map, other than 1 x 1."""
    return [(rows, cols) for rows in _blocks(height) for cols in _blocks(width) if rows * cols > 1]


def _strided_pick(site: Site, node: gs.Node, chain: list[gs.Node], x: gs.Tensor,
                  picks: tuple[np.ndarray, np.ndarray], unfolded: list[int], rows: int,
                  cols: int) -> Replacement | None:
    """The unfold's Conv, picking for each output channel its (input channel, block offset) of
    `picks`, and the relabel to the chain's output shape. The Conv has one group per input
    channel when output channel c*b*b + i*b + j picks channel c at offset (i, j), the order the
    exporters' unfold gives (rknn-toolkit2 builds it as one Conv layer); otherwise one group,
    C*b*b multiply-adds per output: None when that is over MOST_PICK_TAPS."""
    y = node.outputs[0]
    channels, offsets = static_shape(x)[1], rows * cols
    origin, offset = picks
    outputs = np.arange(origin.size)
    if np.array_equal(origin, outputs // offsets) and np.array_equal(offset, outputs % offsets):
        group, weight = channels, np.zeros((origin.size, 1, offsets))
        weight[outputs, 0, offset] = 1
    elif channels * offsets <= MOST_PICK_TAPS:
        group, weight = 1, np.zeros((origin.size, channels, offsets))
        weight[outputs, origin, offset] = 1
    else:
        return None
    builder = site.builder(node)
    weight = builder.const(weight.reshape(*weight.shape[:2], rows, cols).astype(dtype_name(y.dtype)), "patch_pick")
    out = y if unfolded == list(static_shape(y)) else None
    conv = builder.op("Conv", [x, weight], unfolded, y.dtype, out=out, kernel_shape=[rows, cols],
                      strides=[rows, cols], group=group)
    if out is None:
        builder.reshape(conv, static_shape(y), out=y)
    return builder.finish(*chain)


def split_of_conv(node: gs.Node, site: Site) -> Candidates:
    """A Split along the channels of a Conv of one group read by nothing else as one Conv per
    part, each with the part's rows of the weight and bias: part j's channels are the Conv's
    output channels in that range, computed alike. No Split step, and each part's Conv can fuse
    with what reads it: rexnet's partial residual (a Split of a 1x1 Conv, an Add on one part,
    a Concat) becomes a ConvAdd, as in rknn-toolkit2's layer table for timm's rexnet_100. A
    channel pick's parts are picks, which fold into their readers; another Conv is split in two
    parts at most, since each part is a step where the Conv and the Split were two, and only
    when a part has one reader for its Conv to fuse with (a Concat of the parts, YOLOv8's C2f,
    moves them in place)."""
    x = node.inputs[0]
    shape = static_shape(x)
    conv = producer(x)
    if shape is None or len(shape) != 4 or node.attrs.get("axis", 0) not in (1, -3):
        return "not a Split of the channels of a 4-D tensor"
    if conv is None or conv.op != "Conv" or len(x.outputs) != 1 or x.name in site.graph_outputs:
        return "its input is not a Conv that only it reads"
    sizes = [static_shape(part)[1] if static_shape(part) else None for part in node.outputs]
    if None in sizes or sum(sizes) != shape[1]:
        return "a part's size is unknown"
    starts = np.cumsum([0] + sizes)
    builder = site.builder(node)
    picked = channel_picks(conv)
    if picked is not None:
        for part, start, end in zip(node.outputs, starts, starts[1:]):
            _pick(builder, conv.inputs[0], picked[start:end], out=part)
        yield builder.finish(node, conv)
        return
    weight = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2].name)
    bias = constant_value(conv.inputs[2]) if has_bias else None
    if weight is None or conv.attrs.get("group", 1) != 1 or (has_bias and bias is None):
        return f"Conv {conv.name} has groups, or weights or a bias that are not constant"
    if len(node.outputs) > 2:
        return f"{len(node.outputs)} parts would be as many Conv steps where the Conv and the Split are two"
    if not any(len(part.outputs) == 1 and part.outputs[0].op != "Concat" and part.name not in site.graph_outputs
               for part in node.outputs):
        return "no part is read by one node alone, other than a Concat, that its Conv could fuse with"
    for part, start, end in zip(node.outputs, starts, starts[1:]):
        rows = [builder.const(weight[start:end], "weight")]
        if has_bias:
            rows.append(builder.const(bias[start:end], "bias"))
        builder.op("Conv", [conv.inputs[0], *rows], out=part, **conv.attrs)
    yield builder.finish(node, conv)


def conv_of_pick(node: gs.Node, site: Site) -> Candidates:
    """A Conv of one group reading a channel pick reads the pick's input, its weight column for
    picked channel j moved to column picked[j] (zero columns for channels not picked); the pick
    goes when this Conv was its only reader."""
    x = node.inputs[0]
    pick = producer(x)
    if pick is None or pick.op != "Conv" or pick is node:
        return "its input is not made by a Conv"
    picked = channel_picks(pick)
    if picked is None:
        return f"Conv {pick.name} does more than pick channels"
    weight = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or node.attrs.get("group", 1) != 1:
        return "its weights are not constant or it has groups"
    source = pick.inputs[0]
    moved = np.zeros((weight.shape[0], static_shape(source)[1], *weight.shape[2:]), weight.dtype)
    moved[:, picked] = weight
    builder = site.builder(node)
    builder.op("Conv", [source, builder.const(moved, "picked_weight"), *node.inputs[2:]], out=node.outputs[0],
               **node.attrs)
    only_reader = len(x.outputs) == 1 and x.name not in site.graph_outputs
    yield builder.finish(*((node, pick) if only_reader else (node,)))


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(channel_shuffle_to_pick, MOVEMENT, always=True),
    RewriteRule(patches_as_strided_pick, MOVEMENT, always=True),
    RewriteRule(split_of_conv, frozenset({"Split"}), always=True),
    RewriteRule(conv_of_pick, frozenset({"Conv"}), always=True),
)
