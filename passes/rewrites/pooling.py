"""Pooling rewrites: auto_pad, ceil mode and excluded pads as the NPU's floor-mode pools, MaxPool
kernels over the window limit as cascades of smaller MaxPools, pools whose windows tile the map
as stages of smaller such pools, global pools
over the window limit as staged pools, and ReduceMean over the spatial axes as global pooling."""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import FLOAT_DTYPES, constant_value, dtype_name, static_shape
from rkcompile.plan.schema import QUANTIZED_DTYPES

from rkcompile.passes.rewrites.base import Candidates, RewriteRule, Site, scalar
from rkcompile.passes.rewrites.conv_windows import factors_within


def pool_auto_pad_to_pads(node: gs.Node, site: Site) -> Candidates:
    """MaxPool/AveragePool with auto_pad as the same pool with the explicit pads ONNX defines for
    it: per axis, total = max(0, (ceil(in / stride) - 1) * stride + (kernel - 1) * dilation + 1 - in),
    the odd one at the end for SAME_UPPER, at the start for SAME_LOWER, none for VALID. Exact: the
    window positions are the same, and count_include_pad applies to the pads however they were
    given (ONNX AveragePool), so an AveragePool keeps its own. The NPU takes only explicit pads
    (oplist V2.3.2, Pooling), where a pad over its limit or an excluded pad is left to the rules
    that legalize those."""
    mode = node.attrs.get("auto_pad", "NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "NOTSET":
        return "auto_pad is NOTSET"
    if len([t for t in node.outputs if t.name]) != 1:
        return "its Indices output is read"
    shape = static_shape(node.inputs[0])
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ())]
    if shape is None or len(shape) != len(kernel) + 2:
        return "the input's shape is unknown"
    if int(node.attrs.get("ceil_mode", 0)):
        return "ceil_mode is set too: with explicit pads it could round the output size up"
    spatial = len(kernel)
    strides = [int(v) for v in node.attrs.get("strides", [1] * spatial)]
    dilations = [int(v) for v in node.attrs.get("dilations", [1] * spatial)]
    begins, ends = [], []
    for size, k, stride, dilation in zip(shape[2:], kernel, strides, dilations):
        total = 0 if mode == "VALID" else max(0, (-(-size // stride) - 1) * stride + (k - 1) * dilation + 1 - size)
        begins.append(total - total // 2 if mode == "SAME_LOWER" else total // 2)
        ends.append(total - begins[-1])
    attrs = {**node.attrs, "pads": begins + ends}
    del attrs["auto_pad"]
    builder = site.builder(node)
    builder.op(node.op, list(node.inputs), out=node.outputs[0], **attrs)
    yield builder.finish()


def maxpool_ceil_to_pads(node: gs.Node, site: Site) -> Candidates:
    """MaxPool with ceil_mode = 1 as floor mode with the extra end padding that yields the same
    output size; padding never wins a max. The NPU does not support ceil_mode (seed 000, MaxPool)."""
    return (yield from _ceil_to_pads(node, site))


def average_pool_ceil_to_pads(node: gs.Node, site: Site) -> Candidates:
    """AveragePool with ceil_mode = 1 as floor mode with the extra end padding that yields the
    same output size, where the average cannot tell: no pad is needed (ResNet-D's and ResNeSt's
    2x2 stride-2 average downsampling of an even map), or the pool excludes pads from its count
    (count_include_pad = 0), as ONNX excludes the part of a ceil-mode window past the input
    (average_pool_excluding_pads then legalizes its pads). The NPU does not support ceil_mode
    (oplist V2.3.2, AveragePool)."""
    return (yield from _ceil_to_pads(node, site))


def _ceil_to_pads(node: gs.Node, site: Site) -> Candidates:
    """The pool in floor mode with end pads for the output size ceil mode gives (see the rules)."""
    if not node.attrs.get("ceil_mode", 0) or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "ceil_mode is 0, or auto_pad is set"
    if len([t for t in node.outputs if t.name]) != 1:
        return "its Indices output is read"
    in_shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if in_shape is None or out_shape is None:
        return "a shape is unknown"
    kernel = list(node.attrs["kernel_shape"])
    spatial = len(kernel)
    strides = list(node.attrs.get("strides", [1] * spatial))
    dilations = list(node.attrs.get("dilations", [1] * spatial))
    pads = list(node.attrs.get("pads", [0] * 2 * spatial))
    before = list(pads)
    for axis in range(spatial):
        covered = (out_shape[axis + 2] - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1
        missing = covered - (in_shape[axis + 2] + pads[axis] + pads[axis + spatial])
        pads[axis + spatial] += max(0, missing)
    if node.op == "AveragePool" and int(node.attrs.get("count_include_pad", 0)) and pads != before:
        return "count_include_pad is 1 and floor mode needs more end padding, which the average would count"
    builder = site.builder(node)
    builder.op(node.op, list(node.inputs), out=node.outputs[0], **{**node.attrs, "ceil_mode": 0, "pads": pads})
    yield builder.finish()


def maxpool_kernel_to_cascade(node: gs.Node, site: Site) -> Candidates:
    """A MaxPool whose kernel is over the target's limit (YOLO's SPP: 9x9, 13x13, stride 1) as a
    cascade of MaxPools within it, the first ones of stride 1 and the last of the pool's stride:
    a max over k = k1 + k2 - 1 neighbours is the max over k2 neighbouring maxes over k1 (max is
    associative, and a window of k2 windows of k1 spans k1 + k2 - 1). The pads are shared out
    over the stages, none over its stage's kernel - 1, so every stage's window keeps an element
    of the input and padding, never a max, only removes windows off the edge: exact."""
    if len([t for t in node.outputs if t.name]) != 1:
        return "its Indices output is read"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET" or int(node.attrs.get("ceil_mode", 0)):
        return "auto_pad or ceil_mode is set"
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ())]
    spatial = len(kernel)
    if any(int(d) != 1 for d in node.attrs.get("dilations", [1] * spatial)):
        return "dilations are set"
    shape = static_shape(node.inputs[0])
    if shape is None:
        return "the input's shape is unknown"
    limit = site.target.rule_parameter("MaxPool", "pool_window", "kernel")
    pad_limit = site.target.rule_parameter("MaxPool", "pool_window", "pad")
    if limit is None or pad_limit is None or limit < 2:
        return f"{site.target.name} has no MaxPool window to cascade with"
    if all(k <= limit for k in kernel):
        return "its kernel is within the limit"
    pads = [int(p) for p in node.attrs.get("pads", [0] * 2 * spatial)]
    count = max(-(-(k - 1) // (limit - 1)) for k in kernel)
    # per axis, the stages' kernels (as even as can be) and their start and end pads
    stage_kernels, stage_pads = [], []
    for axis, k in enumerate(kernel):
        steps = [(k - 1) // count + (stage < (k - 1) % count) for stage in range(count)]
        stage_kernels.append([step + 1 for step in steps])
        shares = []
        for total in (pads[axis], pads[axis + spatial]):
            share = []
            for step in steps:
                share.append(min(step, pad_limit, total - sum(share)))
            if sum(share) != total:
                return f"pads {pads} do not share out over stages of kernels {stage_kernels[-1]}"
            shares.append(share)
        stage_pads.append(shares)
    strides = list(node.attrs.get("strides", [1] * spatial))
    builder = site.builder(node)
    current = node.inputs[0]
    for stage in range(count):
        last = stage == count - 1
        stage_kernel = [stage_kernels[axis][stage] for axis in range(spatial)]
        stage_strides = strides if last else [1] * spatial
        begins = [stage_pads[axis][0][stage] for axis in range(spatial)]
        ends = [stage_pads[axis][1][stage] for axis in range(spatial)]
        if not last:
            shape = [*shape[:2], *(size + b + e - k + 1 for size, b, e, k in zip(shape[2:], begins, ends, stage_kernel))]
        current = builder.op("MaxPool", [current], shape, node.inputs[0].dtype, out=node.outputs[0] if last else None,
                             kernel_shape=stage_kernel, strides=stage_strides, pads=begins + ends)
    yield builder.finish()


def average_pool_excluding_pads(node: gs.Node, site: Site) -> Candidates:
    """AveragePool with pads and count_include_pad = 0 (ONNX's default) as the NPU's pooling,
    which counts the pads (oplist V2.3.2, AveragePool), times a constant map of
    window size / valid elements per output position: near the border the NPU divides by the
    whole window, ONNX by the elements inside the image."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = static_shape(x), static_shape(y)
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ())]
    if in_shape is None or out_shape is None or len(in_shape) != 4 or len(kernel) != 2:
        return "not a 2-D pool of known shape"
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET" or any(int(d) != 1 for d in node.attrs.get("dilations", [1, 1])):
        return "auto_pad or dilations are set"
    pads = [int(p) for p in node.attrs.get("pads", [0, 0, 0, 0])]
    if int(node.attrs.get("count_include_pad", 0)) or not any(pads):
        return "count_include_pad is 1, or there are no pads"
    strides = [int(v) for v in node.attrs.get("strides", [1, 1])]
    valid = []
    for axis in range(2):
        starts = np.arange(out_shape[axis + 2]) * strides[axis] - pads[axis]
        valid.append(np.minimum(starts + kernel[axis], in_shape[axis + 2]) - np.maximum(starts, 0))
    counts = np.outer(valid[0], valid[1]).astype(np.float64)
    correction = (kernel[0] * kernel[1] / counts).astype(dtype_name(x.dtype) or "float32")
    builder = site.builder(node)
    pooled = builder.op("AveragePool", [x], out_shape, x.dtype, **{**node.attrs, "count_include_pad": 1})
    # Full-sized: the NPU's Mul broadcasts [1, 1, h, w] to [1, c, h, w] by none of its Expand patterns.
    border = np.broadcast_to(correction, (1, out_shape[1], *counts.shape))
    builder.op("Mul", [pooled, builder.const(border, "border")], out=y)
    yield builder.finish()


def pool_stage_kernels(size: int, limit: int) -> list[int]:
    """Kernels (each its own stride) whose stages reduce `size` to 1 in the fewest stages,
    preferring exact divisors, else the kernel that needs the least end padding."""
    kernels = []
    while size > 1:
        stages = 1
        while limit ** stages < size:
            stages += 1
        reach = limit ** (stages - 1)
        fitting = [k for k in range(limit, 1, -1) if -(-size // k) <= reach]
        kernel = min(fitting, key=lambda k: (-(-size // k) * k - size, -k))
        kernels.append(kernel)
        size = -(-size // kernel)
    return kernels


def global_pool_to_stages(node: gs.Node, site: Site) -> Candidates:
    """GlobalAveragePool/GlobalMaxPool over more than 7x7 (seed 000: height, width ∈ (0,7]) as
    pools with kernel = stride <= 7 that tile the map. Averages pad with zeros and count them
    (count_include_pad = 1, seed 000), so a final Mul rescales by padded area / true area. A
    float plan pools a map one depthwise Conv covers, of a power-of-two area (8x8), as that Conv.

    In an int8 plan every stage's output is rounded to its 256 levels, and a stage's rounding
    reaches the mean divided by the area the later stages average over (its noise variance by
    that area). Where the mean is a model output (through moves only: a classifier's logits),
    that is the error the user sees, so the smallest kernels go first and the largest last
    (13x13: a 2x2 stage, then 7x7, where 7x7 then 2x2 left the first rounding only 4 values to
    average out; the total padding and the correction are the same in any order). Where more
    int8 steps read the mean (a squeeze-excitation block's scale), the 15 zoo CNNs with such
    pools answered the other order with output cosine changes of up to +-0.007 in both
    directions (noise the network amplifies, docs/quantization.md), so they keep the order that
    stores the smallest intermediate, as float16 plans do (their stages round at 2^-11).

    A pool over a sequence is staged after fusion (`sequence_pool_to_stages`): tf2onnx writes a
    LayerNorm's means over [N, L, C] as GlobalAveragePools, which the norm rewrites take whole."""
    shape = static_shape(node.inputs[0])
    if shape is None or len(shape) != 4:
        return ("a pool over a sequence is staged after fusion" if shape is not None and len(shape) == 3
                else "the input is not 4-D of known shape")
    return (yield from _pool_stages(node, site, shape))


def sequence_pool_to_stages(node: gs.Node, site: Site) -> Candidates:
    """A global pool over a sequence's (N, C, L), left as it is by the norm rewrites and fusion,
    as 1-D pools along L (`global_pool_to_stages`), as rknn-toolkit2 runs magika's GlobalMaxPool
    over 508 positions in four MaxPool layers."""
    shape = static_shape(node.inputs[0])
    if shape is None or len(shape) != 3:
        return "the input is not a sequence (N, C, L) of known shape"
    return (yield from _pool_stages(node, site, shape))


def _pool_stages(node: gs.Node, site: Site, shape: list[int]) -> Candidates:
    """The staged pools of `global_pool_to_stages`, for a 2-D or 1-D map."""
    x = node.inputs[0]
    average = node.op == "GlobalAveragePool"
    limit = site.target.rule_parameter("AveragePool" if average else "MaxPool", "pool_window", "kernel")
    if limit is None:
        return f"{site.target.name} has no {'AveragePool' if average else 'MaxPool'} kernel to stage with"
    spatial = shape[2:]
    per_axis = [pool_stage_kernels(size, limit) for size in spatial]
    count = max(len(stages) for stages in per_axis)
    if count == 0:
        return "the input is already 1x1"
    per_axis = [stages + [1] * (count - len(stages)) for stages in per_axis]
    if average and site.facts.get("plan_dtype") in QUANTIZED_DTYPES and _reaches_only_outputs(node.outputs[0], site):
        per_axis = [sorted(stages) for stages in per_axis]
    correction = math.prod(math.prod(stages) for stages in per_axis) / math.prod(spatial)
    depthwise_limit = site.target.rule_parameter("Conv", "conv_window", "depthwise_kernel") or 0
    area = math.prod(spatial)
    if (average and len(spatial) == 2 and site.facts.get("plan_dtype") in FLOAT_DTYPES and area & (area - 1) == 0
            and max(spatial) <= depthwise_limit):
        # A map a depthwise Conv covers whole (8x8 after a 256-pixel input's stride 32) with
        # weights 1/area, which float16 holds exactly for a power-of-two area: one step and one
        # rounding where the stages take two of each (stride 1: the one window is the map)
        builder = site.builder(node)
        weights = np.full([shape[1], 1, *spatial], 1 / area, dtype_name(x.dtype))
        builder.op("Conv", [x, builder.const(weights, "pool_weights")], out=node.outputs[0], group=shape[1],
                   kernel_shape=list(spatial), strides=[1, 1], pads=[0] * 4)
        yield builder.finish()
        return
    # A float plan's last stage takes the correction into its weights: one depthwise Conv of
    # weights correction / window (the sum over the window, padding zeros counted, as the
    # AveragePool's), instead of the pool and a Mul, as rknn-toolkit2 plans a global average
    # pool. An int8 plan keeps the pool, whose grid the stage order above is chosen for.
    weighted_last = (average and correction != 1 and site.facts.get("plan_dtype") in FLOAT_DTYPES
                     and all(stages[-1] <= depthwise_limit for stages in per_axis))
    builder = site.builder(node)
    current, sizes = x, list(spatial)
    for index in range(count):
        kernel = [stages[index] for stages in per_axis]
        out = [-(-size // k) for size, k in zip(sizes, kernel)]
        pads = [0] * len(kernel) + [o * k - size for o, k, size in zip(out, kernel, sizes)]
        last = index == count - 1
        attrs = {"kernel_shape": kernel, "strides": kernel, "pads": pads}
        if last and weighted_last:
            weights = np.full([shape[1], 1, *kernel], correction / math.prod(kernel), dtype_name(x.dtype))
            builder.op("Conv", [current, builder.const(weights, "pool_weights")], out=node.outputs[0],
                       group=shape[1], **attrs)
            break
        if average:
            attrs["count_include_pad"] = 1
        current = builder.op("AveragePool" if average else "MaxPool", [current], [*shape[:2], *out],
                             x.dtype, out=node.outputs[0] if last and (not average or correction == 1) else None,
                             **attrs)
        sizes = out
    if average and correction != 1 and not weighted_last:
        builder.op("Mul", [current, scalar(builder, correction, x)], out=node.outputs[0])
    yield builder.finish()


def _reaches_only_outputs(tensor: gs.Tensor, site: Site) -> bool:
    """Whether nothing but data-movement nodes (Reshape, Flatten, ...) lie between `tensor` and
    the model outputs it reaches, and it reaches at least one."""
    from rkcompile.quantization.params import is_movement  # int8 plans only: a float16 plan imports no int8 module

    if not tensor.outputs:
        return tensor.name in site.graph_outputs
    return all(is_movement(reader) and all(_reaches_only_outputs(t, site) for t in reader.outputs if t.name)
               for reader in tensor.outputs)


def reducemean_to_global_pool(node: gs.Node, site: Site) -> Candidates:
    """ReduceMean over height and width of a 4-D tensor as GlobalAveragePool (then a Reshape
    when keepdims = 0): the oplist V2.3.2 has no ReduceMean kernel, it has GlobalAveragePool;
    torch exports adaptive_avg_pool2d(1) as this ReduceMean (mobilenet_v2 in the zoo)."""
    x, y = node.inputs[0], node.outputs[0]
    shape, y_shape = static_shape(x), static_shape(y)
    axes = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1].name:
        axes = constant_value(node.inputs[1])
    if shape is None or y_shape is None or len(shape) != 4 or axes is None:
        return "not a 4-D input of known shape with constant axes"
    if sorted(int(a) % 4 for a in np.ravel(axes)) != [2, 3]:
        return "the axes are not height and width"
    builder = site.builder(node)
    keep = node.attrs.get("keepdims", 1)
    pooled = builder.op("GlobalAveragePool", [x], [*shape[:2], 1, 1], x.dtype, out=y if keep else None)
    if not keep:
        builder.reshape(pooled, y_shape, out=y)
    yield builder.finish()


def tiling_pool_to_stages(node: gs.Node, site: Site) -> Candidates:
    """A pool whose windows tile the map (kernel = stride, no pads, floor mode: paddle's
    adaptive_avg_pool2d to 2x2 of an 8x16 map is kernel [4, 8]) with a kernel over the window
    limit as pools whose kernels, each its own stride, multiply to it: a window of the pool is
    exactly a window of windows of the stages, all of one size, so the mean of the stage means
    (or the max of the maxima) is the pool's, and floor(floor(n / a) / b) = floor(n / ab) keeps
    its output size."""
    x = node.inputs[0]
    shape = static_shape(x)
    kernel = [int(k) for k in node.attrs.get("kernel_shape", ())]
    if shape is None or len(shape) != len(kernel) + 2:
        return "the input shape is unknown"
    if (list(node.attrs.get("strides", [1] * len(kernel))) != kernel or any(node.attrs.get("pads", ()))
            or node.attrs.get("ceil_mode", 0) or any(d != 1 for d in node.attrs.get("dilations", ()))
            or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")):
        return "its windows do not tile the map (stride != kernel, pads, dilations or ceil mode)"
    limit = site.target.rule_parameter(node.op, "pool_window", "kernel")
    if limit is None or all(k <= limit for k in kernel):
        return "its kernel is within the limit"
    per_axis = [factors_within(k, limit) for k in kernel]
    if any(factors is None for factors in per_axis):
        return f"a kernel in {kernel} has a prime factor above the limit {limit}"
    count = max(len(factors) for factors in per_axis)
    per_axis = [factors + [1] * (count - len(factors)) for factors in per_axis]
    builder = site.builder(node)
    current, sizes = x, list(shape[2:])
    for index in range(count):
        stage = [factors[index] for factors in per_axis]
        sizes = [size // k for size, k in zip(sizes, stage)]
        current = builder.op(node.op, [current], [*shape[:2], *sizes], x.dtype,
                             out=node.outputs[0] if index == count - 1 else None,
                             kernel_shape=stage, strides=stage, pads=[0] * 2 * len(stage))
    yield builder.finish()


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(pool_auto_pad_to_pads, frozenset({"MaxPool", "AveragePool"})),
    RewriteRule(maxpool_ceil_to_pads, frozenset({"MaxPool"})),
    RewriteRule(average_pool_ceil_to_pads, frozenset({"AveragePool"})),
    RewriteRule(maxpool_kernel_to_cascade, frozenset({"MaxPool"})),
    RewriteRule(average_pool_excluding_pads, frozenset({"AveragePool"})),
    RewriteRule(tiling_pool_to_stages, frozenset({"MaxPool", "AveragePool"})),
    RewriteRule(global_pool_to_stages, frozenset({"GlobalAveragePool", "GlobalMaxPool"})),
    RewriteRule(sequence_pool_to_stages, frozenset({"GlobalAveragePool", "GlobalMaxPool"}), late=True),
    RewriteRule(reducemean_to_global_pool, frozenset({"ReduceMean"})),
)
