"""Constraint checks: the RKNPU2 operator constraints as small functions.

Each check is `check(node, target, **params) -> (ok, detail)`. Its docstring is a template
rendered with the target's `params`; the rendered text is the rule a user reads when a node
falls back to the CPU. Every rule that differs between platforms takes a `source` parameter
naming the document and operator it was copied from (seed file, or oplist V2.3.2 with its
platform), so the rendered rule always cites where it comes from. `detail` names the offending
values; it never contains ';', which separates the rules in a node's reason.

The NPU is 4-D: every operator in the oplist and the seeds takes [batch, channel, height,
width]. A tensor of lower rank is read as 4-D by prepending 1s (NumPy-style right alignment,
the rule the seeds' broadcasting and Expand text state), so axes and perms of rank 1-3 ops are
checked on that 4-D view. Rank 5 and above has no 4-D reading and fails `max_rank`.

A check reads only what any ONNX node has (op, attrs, inputs, outputs; a tensor's name, shape,
dtype, a constant's values), so the targets import no graph library: a saved plan runs without
the compiler's.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Mapping

from rkcompile.numerics.dtypes import FLOAT_DTYPES, dtype_name, element_count
from rkcompile.plan.plain_nodes import constant_value, is_constant, present_inputs, static_shape
from rkcompile.targets.model import CheckResult

NPU_RANK = 4
DIM_NAMES = ("batch", "channel", "height", "width")


def _runtime_tensors(node):
    """Inputs computed at run time (not weights) followed by the outputs."""
    return [t for t in present_inputs(node) if not is_constant(t)] + list(node.outputs)


def _as_4d(shape: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    return (1,) * (NPU_RANK - len(shape)) + shape


def _axis_4d(axis: int, rank: int) -> int:
    """An ONNX axis of a rank-`rank` tensor, as an axis of its 4-D view."""
    return (axis + rank if axis < 0 else axis) + NPU_RANK - rank


def _input_shape(node, index: int = 0) -> tuple[int, ...] | None:
    inputs = node.inputs
    if index >= len(inputs) or not inputs[index].name:
        return None
    return static_shape(inputs[index])


def _ints(value, count: int, default: int) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if value is not None else (default,) * count


def _out_of(name: str, values: Iterable[int], low: int, high: int, low_open: bool = False) -> list[str]:
    """`name=value` for every value outside [low, high] (or (low, high] when `low_open`)."""
    return [f"{name}={v}" for v in values if (v <= low if low_open else v < low) or v > high]


def _report(problems: list[str]) -> CheckResult:
    return not problems, ", ".join(problems)


# ---- every op ------------------------------------------------------------------------------

def static_shapes(node, target) -> CheckResult:
    """Every tensor shape is known and static: the NPU runs statically shaped graphs
    (oplist V2.3.2, all operators; dynamic dims are fixed with --input-shape)."""
    unknown = [t.name for t in _runtime_tensors(node) if static_shape(t) is None]
    return not unknown, f"unknown shape for {', '.join(unknown)}" if unknown else ""


def max_rank(node, target, limit: int) -> CheckResult:
    """Tensors have at most {limit} dimensions: every NPU operator takes [batch, channel,
    height, width] (oplist V2.3.2 and seeds 000/001, the shape of every operator). Lower ranks
    are read as 4-D with leading 1s; rank 5 and above must be reshaped to 4-D first."""
    over = [f"{t.name} has rank {len(t.shape)}" for t in _runtime_tensors(node)
            if t.shape is not None and len(t.shape) > limit]
    return _report(over)


def float_data(node, target, index_inputs: tuple[int, ...] = ()) -> CheckResult:
    """Data tensors are floating point, computed as int8 or float16 on the NPU; integer and bool
    tensors stay on the CPU (oplist V2.3.2, data-type constraints: T1 int8/float16)."""
    bad = []
    for position, tensor in enumerate(node.inputs):
        if not tensor.name or is_constant(tensor) or position in index_inputs:
            continue
        name = dtype_name(tensor.dtype)
        if name not in FLOAT_DTYPES:
            bad.append(f"input {tensor.name} is {name}")
    for tensor in node.outputs:
        name = dtype_name(tensor.dtype)
        if name not in FLOAT_DTYPES:
            bad.append(f"output {tensor.name} is {name}")
    return _report(bad)


def plan_dtype(node, target, dtypes: tuple[str, ...], source: str, plan_dtype: str = "float16") -> CheckResult:
    """The NPU runs this operator only in {dtypes} (data-type constraint T1, {source}); the
    plan computes in another dtype."""
    return plan_dtype in dtypes, "" if plan_dtype in dtypes else f"plan dtype {plan_dtype}"


# ---- elementwise ---------------------------------------------------------------------------

def _is_scalar_constant(tensor) -> bool:
    """A constant of one element, told by its shape: a weight's values would be loaded to count them."""
    return is_constant(tensor) and element_count(tensor.shape) == 1


def _broadcast_fits(source: tuple[int, ...], result: tuple[int, ...], limit: int) -> bool:
    """Whether `source` reaches `result` by one of the Expand patterns (or needs no broadcast)."""
    b, c, h, w = result
    if source == result:
        return True
    patterns = (
        ((b, c, 1, w), h <= limit),
        ((b, 1, 1, w), h <= limit),
        ((b, c, h, 1), w <= limit),
        ((b, 1, h, 1), w <= limit),
        ((b, c, 1, 1), h <= limit and w <= limit),
    )
    return any(source == pattern and within for pattern, within in patterns)


def expand_broadcast(node, target, limit: int, source: str,
                     data_inputs: tuple[int, ...] | None = None) -> CheckResult:
    """Each input reaches the output shape by one of the Expand broadcasts only:
    [b,c,1,w], [b,1,1,w] -> [b,c,h,w] with h in [1, {limit}]; [b,c,h,1], [b,1,h,1] ->
    [b,c,h,w] with w in [1, {limit}]; [b,c,1,1] -> [b,c,h,w] with h, w in [1, {limit}].
    Equal shapes need no broadcast, and a one-element constant is a scalar operand (T2
    float const) ({source})."""
    output = static_shape(node.outputs[0]) if node.outputs else None
    if output is None or len(output) > NPU_RANK:
        return True, ""
    result = _as_4d(output)
    bad = []
    for position, tensor in enumerate(node.inputs):
        if (data_inputs is not None and position not in data_inputs) or not tensor.name:
            continue
        shape = static_shape(tensor)
        if shape is None or _is_scalar_constant(tensor):
            continue
        if not _broadcast_fits(_as_4d(shape), result, limit):
            bad.append(f"{list(_as_4d(shape))} -> {list(result)}")
    return _report(bad)


def expand_target(node, target, limit: int, source: str) -> CheckResult:
    """The input reaches the output by one of the Expand broadcasts only: [b,c,1,w],
    [b,1,1,w] -> [b,c,h,w] with h in [1, {limit}]; [b,c,h,1], [b,1,h,1] -> [b,c,h,w] with w in
    [1, {limit}]; [b,c,1,1] -> [b,c,h,w] with h, w in [1, {limit}] ({source})."""
    return expand_broadcast(node, target, limit, source, data_inputs=(0,))


def channel_broadcast(node, target, source: str) -> CheckResult:
    """Operands broadcast only as [b,c,1,1] or as a scalar ({source})."""
    output = static_shape(node.outputs[0]) if node.outputs else None
    if output is None or len(output) > NPU_RANK:
        return True, ""
    b, c, _, _ = result = _as_4d(output)
    bad = []
    for tensor in present_inputs(node):
        shape = static_shape(tensor)
        if shape is None or _as_4d(shape) == result or element_count(shape) == 1:
            continue
        if _as_4d(shape) != (b, c, 1, 1):
            bad.append(f"{list(_as_4d(shape))} -> {list(result)}")
    return _report(bad)


def pow_exponent(node, target, exponents: tuple[float, ...], source: str) -> CheckResult:
    """The exponent Y is a constant of shape [1] with a value in {exponents} ({source})."""
    values = constant_value(node.inputs[1])
    if values is None:
        return False, f"exponent {node.inputs[1].name} is computed at run time"
    if values.size != 1:
        return False, f"exponent has {values.size} values"
    value = float(values.reshape(-1)[0])
    ok = any(math.isclose(value, e) for e in exponents)
    return ok, "" if ok else f"exponent {value:g}"


def hard_sigmoid_constants(node, target, alpha: float, beta: float, source: str) -> CheckResult:
    """Only y = max(0, min(1, alpha*x + beta)) with alpha = {alpha:.6g} (1/6) and beta =
    {beta:g} ({source})."""
    seen = node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)
    ok = math.isclose(seen[0], alpha, rel_tol=1e-5) and math.isclose(seen[1], beta, rel_tol=1e-5)
    return ok, "" if ok else f"alpha={seen[0]:.6g}, beta={seen[1]:.6g}"


def elu_alpha(node, target, alpha: float, source: str) -> CheckResult:
    """Only alpha = {alpha:g} ({source})."""
    seen = node.attrs.get("alpha", 1.0)
    ok = math.isclose(seen, alpha, rel_tol=1e-5)
    return ok, "" if ok else f"alpha={seen:.6g}"


# ---- pools ---------------------------------------------------------------------------------

def feature_extent(node, target, channel: int, height: int, width: int, spatial_floor: int,
                   source: str) -> CheckResult:
    """The input has channel in (0, {channel}], height in ({spatial_floor}, {height}] and width
    in ({spatial_floor}, {width}] ({source})."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    _, c, h, w = _as_4d(shape)
    return _report(_out_of("channel", [c], 0, channel, True)
                   + _out_of("height", [h], spatial_floor, height, True)
                   + _out_of("width", [w], spatial_floor, width, True))


def pool_window(node, target, kernel: int, stride: int, pad: int, source: str) -> CheckResult:
    """kernel_h, kernel_w in (0, {kernel}]; strides in (0, {stride}]; pads top, left, bottom,
    right in [0, {pad}] ({source})."""
    kernel_shape = _ints(node.attrs.get("kernel_shape"), 2, 1)
    strides = _ints(node.attrs.get("strides"), len(kernel_shape), 1)
    pads = _ints(node.attrs.get("pads"), 2 * len(kernel_shape), 0)
    return _report(_out_of("kernel", kernel_shape, 0, kernel, True) + _out_of("stride", strides, 0, stride, True)
                   + _out_of("pad", pads, 0, pad))


def explicit_padding(node, target, source: str) -> CheckResult:
    """auto_pad is NOTSET: only explicit pads ({source})."""
    mode = node.attrs.get("auto_pad", "NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return mode == "NOTSET", "" if mode == "NOTSET" else f"auto_pad={mode}"


def floor_rounding(node, target, source: str) -> CheckResult:
    """ceil_mode is not supported: output sizes round down ({source})."""
    ceil_mode = int(node.attrs.get("ceil_mode", 0))
    return ceil_mode == 0, "" if ceil_mode == 0 else "ceil_mode=1"


def row_major_indices(node, target, source: str) -> CheckResult:
    """storage_order is 0 ({source})."""
    order = int(node.attrs.get("storage_order", 0))
    return order == 0, "" if order == 0 else f"storage_order={order}"


def padded_average_counts_pads(node, target, source: str) -> CheckResult:
    """count_include_pad is 1: a padded window averages over the pads too ({source}); without
    pads the setting makes no difference."""
    padded = any(int(p) for p in node.attrs.get("pads", ()) or ())
    include = int(node.attrs.get("count_include_pad", 0))
    ok = include == 1 or not padded
    return ok, "" if ok else "count_include_pad=0 with pads"


# ---- indexing and layout -------------------------------------------------------------------

def gather_indices(node, target, axes: tuple[int, ...], source: str) -> CheckResult:
    """Indices have rank 1 and axis (on the 4-D view) is one of {axes} ({source})."""
    data, indices = static_shape(node.inputs[0]), static_shape(node.inputs[1])
    problems = []
    if indices is not None and len(indices) != 1:
        problems.append(f"indices rank {len(indices)}")
    if data is not None and len(data) <= NPU_RANK:
        axis = _axis_4d(int(node.attrs.get("axis", 0)), len(data))
        if axis not in axes:
            problems.append(f"axis {axis}")
    return _report(problems)


def _view_perm(perm: Iterable[int], rank: int) -> tuple[int, ...]:
    lead = NPU_RANK - rank
    return tuple(range(lead)) + tuple(p + lead for p in perm)


@functools.cache
def _compiled(condition: str):
    """A perm table's condition compiled once: compiling it on every check was 0.8 s of
    tv_maxvit_t's plan, whose rewrites check thousands of candidate Transposes."""
    return compile(condition, "<perm condition>", "eval")


def transpose_perm(node, target, table: Mapping[tuple[int, ...], tuple[str, ...]],
                   p: int, q: int, source: str) -> CheckResult:
    """perm, read on the 4-D view [n1, c1, h1, w1], is one the NPU implements, within that
    perm's float16 limits (p = {p}, q = {q}; SUPPORTED_OPS lists them) ({source}). A perm that
    only moves axes of size 1 keeps the data order and runs as a Reshape."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    perm = _view_perm(node.attrs.get("perm", tuple(reversed(range(len(shape))))), len(shape))
    moved = [axis for axis in perm if _as_4d(shape)[axis] != 1]
    if moved == sorted(moved):
        return True, ""
    if perm not in table:
        return False, f"perm {list(perm)} not supported"
    n1, c1, h1, w1 = _as_4d(shape)
    names = {"n1": n1, "c1": c1, "h1": h1, "w1": w1, "p": p, "q": q}
    broken = [condition for condition in table[perm]
              if not eval(_compiled(condition), {"__builtins__": {}}, names)]  # conditions are our own data
    detail = f"perm {list(perm)} on {[n1, c1, h1, w1]} breaks {' and '.join(broken)}"
    return not broken, detail if broken else ""


def reduction_axis(node, target, axes: tuple[int, ...], source: str, opset: int = 13) -> CheckResult:
    """axis (on the 4-D view) is one of {axes}: channel or width ({source}). Before opset 13,
    Softmax and Hardmax reduce over every axis from `axis` on, which is one NPU axis only when
    the later dims are all 1."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1))
    axis = axis + len(shape) if axis < 0 else axis
    if opset < 13 and element_count(shape[axis + 1:]) > 1:
        return False, f"opset {opset} reduces axes {axis}..{len(shape) - 1} together"
    axis = _axis_4d(axis, len(shape))
    return axis in axes, "" if axis in axes else f"axis {axis}"


def hardmax_extent(node, target, limit: int, source: str, opset: int = 13) -> CheckResult:
    """With axis 1, height*width < {limit}; with axis 3 (-1), channel*height < {limit}
    ({source})."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    _, c, h, w = _as_4d(shape)
    axis = _axis_4d(int(node.attrs.get("axis", -1 if opset >= 13 else 1)), len(shape))
    plane = {1: ("height*width", h * w), 3: ("channel*height", c * h)}.get(axis)
    if plane is None:
        return True, ""
    return plane[1] < limit, "" if plane[1] < limit else f"{plane[0]}={plane[1]}"


def hardmax_volume(node, target, volume: int, source: str, opset: int = 13) -> CheckResult:
    """channel*height*width <= {volume}, and the plane beside the axis (height*width for axis 1,
    channel*height for axis 3) is 1 or more than 8 ({source})."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    _, c, h, w = _as_4d(shape)
    axis = _axis_4d(int(node.attrs.get("axis", -1 if opset >= 13 else 1)), len(shape))
    plane = h * w if axis == 1 else c * h
    problems = [f"channel*height*width={c * h * w}"] if c * h * w > volume else []
    if not (plane == 1 or plane > 8):
        problems.append(f"plane={plane}")
    return _report(problems)


def pad_mode(node, target, modes: tuple[str, ...], channel: int, height: int, width: int,
             source: str) -> CheckResult:
    """mode is one of {modes}; reflect needs channel in (0, {channel}], height in (0, {height}]
    and width in (0, {width}] ({source})."""
    mode = node.attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in modes:
        return False, f"mode={mode}"
    shape = _input_shape(node)
    if mode != "reflect" or shape is None or len(shape) > NPU_RANK:
        return True, ""
    _, c, h, w = _as_4d(shape)
    return _report(_out_of("channel", [c], 0, channel, True) + _out_of("height", [h], 0, height, True)
                   + _out_of("width", [w], 0, width, True))


def unit_slice_steps(node, target, source: str) -> CheckResult:
    """steps are all 1 ({source}; the oplist's channel-step exception depends on an internal
    sub-channel size it does not give, so it is not claimed)."""
    if len(node.inputs) < 5 or not node.inputs[4].name:
        return True, ""
    steps = constant_value(node.inputs[4])
    if steps is None:
        return False, "steps computed at run time"
    bad = [int(s) for s in steps.reshape(-1) if int(s) != 1]
    return not bad, "" if not bad else f"steps {bad}"


# ---- convolution and matrix multiply -------------------------------------------------------

def _is_depthwise(node) -> bool:
    group = int(node.attrs.get("group", 1))
    weight = static_shape(node.inputs[1]) if len(node.inputs) > 1 else None
    return group > 1 and weight is not None and weight[1] == 1 and weight[0] == group


def conv_window(node, target, kernel: int, depthwise_kernel: int, stride: int, pad: int,
                dilation: int, depthwise_dilation: int, dilated_width: int, source: str) -> CheckResult:
    """kernel_h, kernel_w in [1, {kernel}] ([1, {depthwise_kernel}] depthwise); strides in
    [1, {stride}]; pads in [0, {pad}]; dilations in [1, {dilation}] ([1, {depthwise_dilation}]
    depthwise); when the dilated kernel height exceeds 1, input width < {dilated_width}
    ({source}, Convolution and Depthwise Convolution)."""
    depthwise = _is_depthwise(node)
    weight = static_shape(node.inputs[1])
    kernel_shape = _ints(node.attrs.get("kernel_shape") or (weight[2:] if weight else None), 2, 1)
    strides = _ints(node.attrs.get("strides"), len(kernel_shape), 1)
    pads = _ints(node.attrs.get("pads"), 2 * len(kernel_shape), 0)
    dilations = _ints(node.attrs.get("dilations"), len(kernel_shape), 1)
    problems = (_out_of("kernel", kernel_shape, 1, depthwise_kernel if depthwise else kernel)
                + _out_of("stride", strides, 1, stride) + _out_of("pad", pads, 0, pad)
                + _out_of("dilation", dilations, 1, depthwise_dilation if depthwise else dilation))
    shape = _input_shape(node)
    dilated_height = (kernel_shape[0] - 1) * dilations[0] + 1
    if shape is not None and len(kernel_shape) == 2 and dilated_height > 1 and shape[-1] >= dilated_width:
        problems.append(f"width={shape[-1]} with dilated kernel height {dilated_height}")
    return _report(problems)


def deconv_window(node, target, strides: tuple[int, ...], kernel: int, pad: int, dilation: int,
                  source: str) -> CheckResult:
    """strides in {strides}; kernel in [1, {kernel}]; pads in [0, {pad}]; dilations in
    [1, {dilation}], and a dilation other than 1 only with a 1x1 kernel; group 1, or one group
    per channel ({source})."""
    weight = static_shape(node.inputs[1])
    kernel_shape = _ints(node.attrs.get("kernel_shape") or (weight[2:] if weight else None), 2, 1)
    seen_strides = _ints(node.attrs.get("strides"), len(kernel_shape), 1)
    pads = _ints(node.attrs.get("pads"), 2 * len(kernel_shape), 0)
    dilations = _ints(node.attrs.get("dilations"), len(kernel_shape), 1)
    group = int(node.attrs.get("group", 1))
    problems = [f"stride={s}" for s in seen_strides if s not in strides]
    problems += _out_of("kernel", kernel_shape, 1, kernel) + _out_of("pad", pads, 0, pad)
    problems += _out_of("dilation", dilations, 1, dilation)
    if any(d != 1 for d in dilations) and any(k != 1 for k in kernel_shape):
        problems.append(f"dilation {list(dilations)} with kernel {list(kernel_shape)}")
    channels = static_shape(node.inputs[0])
    if group != 1 and not (channels and weight and channels[1] == group and weight[1] == 1):
        problems.append(f"group={group}")
    return _report(problems)


def matmul_depth(node, target, limit: int, source: str) -> CheckResult:
    """The reduced dimension K is in (0, {limit}] ({source}); a larger K must be split."""
    shape = _input_shape(node)
    if shape is None:
        return True, ""
    depth = shape[-1]
    return 0 < depth <= limit, "" if 0 < depth <= limit else f"K={depth}"


def norm_axes(node, target, allowed: tuple[tuple[int, ...], ...], source: str) -> CheckResult:
    """The normalized axes (on the 4-D view) are one of {allowed} ({source})."""
    shape = _input_shape(node)
    if shape is None or len(shape) > NPU_RANK:
        return True, ""
    first = _axis_4d(int(node.attrs.get("axis", -1)), len(shape))
    axes = tuple(range(first, NPU_RANK))
    return axes in allowed, "" if axes in allowed else f"axes {list(axes)}"


def resize_mode(node, target, modes: tuple[str, ...], coordinate_modes: tuple[str, ...],
                source: str) -> CheckResult:
    """mode is one of {modes} and coordinate_transformation_mode one of {coordinate_modes};
    nearest upsampling by an integer factor with asymmetric coordinates and floor rounding picks
    the same pixels as half_pixel, so it is accepted too ({source})."""
    mode, coordinates = (_text(node.attrs.get("mode", "nearest")),
                         _text(node.attrs.get("coordinate_transformation_mode", "half_pixel")))
    nearest_floor = (mode == "nearest" and coordinates == "asymmetric"
                     and _text(node.attrs.get("nearest_mode", "round_prefer_floor")) == "floor")
    problems = [] if mode in modes else [f"mode={mode}"]
    if coordinates not in coordinate_modes and not nearest_floor:
        problems.append(f"coordinate_transformation_mode={coordinates}")
    return _report(problems)


def resize_scale(node, target, largest: int, source: str) -> CheckResult:
    """Only integer upscaling of height and width, by 1 or by an integer multiple of 2 to
    {largest} (16 = 2 x 8 is one, 11 is not), or [1,c,1,1] to any [1,c,h,w] ({source}: "缩放倍数为
    2-8 的整数倍"; rknn-toolkit2 2.5.0 builds bilinear x16 and x32 as one NPU Resize)."""
    before, after = _input_shape(node), static_shape(node.outputs[0])
    if before is None or after is None or len(before) > NPU_RANK:
        return True, ""
    (n, c, h, w), (n2, c2, h2, w2) = _as_4d(before), _as_4d(after)
    if (n, c) != (n2, c2):
        return False, f"resizes batch or channel {[n, c]} -> {[n2, c2]}"
    if h == w == 1:
        return True, ""
    bad = [f"{name} {a} -> {b}" for name, a, b in (("height", h, h2), ("width", w, w2))
           if b % a or not _multiple_of_one_of(b // a, range(2, largest + 1))]
    return _report(bad)


def _multiple_of_one_of(factor: int, divisors: range) -> bool:
    """1 (no scaling), or a multiple of one of `divisors`."""
    return factor == 1 or any(factor % d == 0 for d in divisors)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---- recurrent -----------------------------------------------------------------------------

def recurrent_extent(node, target, limit: int, batch_multiple: int, source: str) -> CheckResult:
    """seq_length, batch_size, input_size and hidden_size are in (0, {limit}]; a batch_size
    above 1 is a multiple of {batch_multiple}; num_directions is 1 or 2 ({source})."""
    shape = _input_shape(node)
    if shape is None or len(shape) != 3:
        return True, ""
    sequence, batch, features = shape
    hidden = int(node.attrs.get("hidden_size", 0))
    problems = (_out_of("seq_length", [sequence], 0, limit, True) + _out_of("batch_size", [batch], 0, limit, True)
                + _out_of("input_size", [features], 0, limit, True)
                + _out_of("hidden_size", [hidden], 0, limit, True))
    if batch > 1 and batch % batch_multiple:
        problems.append(f"batch_size={batch} is not a multiple of {batch_multiple}")
    return _report(problems)


def lstm_variant(node, target, source: str) -> CheckResult:
    """Plain LSTM only: input_forget (CIFG) is 0 and there is no peephole input P; projection
    is not supported either ({source})."""
    problems = []
    if int(node.attrs.get("input_forget", 0)):
        problems.append("input_forget=1")
    if len(node.inputs) > 7 and node.inputs[7].name:
        problems.append(f"peephole input {node.inputs[7].name}")
    return _report(problems)
