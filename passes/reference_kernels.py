"""onnx.reference's kernels for the ops exporters build shapes from, written out in numpy so that
folding them does not import onnx.reference: its op list, which any of its op modules pulls in,
is about 0.1 s of a plan process (tools/bench_plan.py), for folds that take microseconds.

Each kernel is the op's `_run` in onnx/reference/ops/op_<op>.py together with the checks the
class it derives from makes around it in onnx/reference/op_run.py and ops/_op.py (OpRunBinary:
both inputs of one dtype; OpRunBinaryNum and OpRunUnaryNum: the result keeps that dtype; a
scalar result becomes a 0-d array), for the op version `load_op` picks at the model's opset.
A kernel returns None for anything it does not write out (another op version, an attribute
it does not know, an element type outside bool, integers and floats, a case the reference
refuses or handles apart), and `outputs` also gives None when a kernel raises: fold-constants
then asks onnx.reference itself, so every folded value, dtype and shape is the reference's own
(tests/test_import.py compares them op by op).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

Kernel = Callable[[gs.Node, int, list], "list[np.ndarray] | None"]
#: element kinds the kernels take: bool, signed and unsigned integers, floats
_NUMERIC = "biuf"
#: Cast targets whose cast is numpy's astype (float8, bfloat16, int4, strings: onnx.reference)
_PLAIN_CAST_TARGETS = frozenset({
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL,
    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})


def outputs(node: gs.Node, opset: int) -> list[np.ndarray] | None:
    """The values onnx.reference gives `node`'s named outputs (its inputs all constants), or
    None when the kernels here do not cover this node."""
    kernel = KERNELS.get(node.op)
    if kernel is None:
        return None
    inputs = [np.asarray(t.values) if t.name else None for t in node.inputs]
    if any(value is not None and value.dtype.kind not in _NUMERIC for value in inputs):
        return None
    try:
        values = kernel(node, opset, inputs)
    except Exception:  # noqa: BLE001  the reference decides what this input means, and says why
        return None
    if values is None:
        return None
    return [np.array(v) if np.isscalar(v) else v
            for tensor, v in zip(node.outputs, values) if tensor.name]


def _attributes(node: gs.Node, **defaults) -> dict | None:
    """The node's attributes over the op's defaults; None when it has one the op does not know."""
    if not set(node.attrs) <= set(defaults):
        return None
    return {**defaults, **node.attrs}


def _binary(function) -> Kernel:
    """An OpRunBinaryNum op (Add, Sub, Mul, ops/_op.py): one dtype in and out."""
    def kernel(node, opset, inputs):
        if node.attrs or len(inputs) != 2 or inputs[0].dtype != inputs[1].dtype:
            return None
        result = np.asarray(function(*inputs))
        return [result] if result.dtype == inputs[0].dtype else None
    return kernel


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """op_div.py's Div: integers truncated toward zero in integer arithmetic, floats divided,
    the result cast back to x's dtype."""
    if issubclass(x.dtype.type, np.integer):
        quotient = np.floor_divide(x, y)
        remainder = np.remainder(x, y)
        result = quotient + ((remainder != 0) & ((x < 0) ^ (y < 0))).astype(quotient.dtype)
    else:
        result = np.divide(x, y)
    result = np.asarray(result)
    return result if result.dtype == x.dtype else result.astype(x.dtype)


def _comparison(function) -> Kernel:
    """An OpRunBinary op (Equal, Less, And, ...): one dtype in, the comparison out."""
    def kernel(node, opset, inputs):
        if node.attrs or len(inputs) != 2 or inputs[0].dtype != inputs[1].dtype:
            return None
        return [function(*inputs)]
    return kernel


def _unary(function) -> Kernel:
    """An OpRunUnaryNum op (Neg, Ceil, Sqrt, ...): its dtype kept. Floating-point warnings are
    off, as op_sqrt.py and op_reciprocal.py have them (a warning never changes a value)."""
    def kernel(node, opset, inputs):
        if node.attrs or len(inputs) != 1:
            return None
        with np.errstate(all="ignore"):
            result = np.asarray(function(inputs[0]))
        return [result] if result.dtype == inputs[0].dtype else None
    return kernel


def _power(node, opset, inputs):
    """op_pow.py: numpy's power in the base's dtype (no dtype check: the exponent may differ)."""
    if node.attrs or len(inputs) != 2:
        return None
    with np.errstate(all="ignore"):
        return [np.power(*inputs).astype(inputs[0].dtype)]


def _not(node, opset, inputs):
    return [np.logical_not(inputs[0])] if not node.attrs and len(inputs) == 1 else None


def _extremum(function) -> Kernel:
    """op_min.py / op_max.py: one input copied, two as a binary op, more folded pairwise."""
    binary = _binary(function)

    def kernel(node, opset, inputs):
        if node.attrs or not inputs or any(value is None for value in inputs):
            return None
        if len(inputs) == 1:
            return [inputs[0].copy()]
        if len(inputs) == 2:
            return binary(node, opset, inputs)
        result = inputs[0]
        for value in inputs[1:]:
            result = function(result, value)
        return [result]
    return kernel


def _mod(node, opset, inputs):
    attributes = _attributes(node, fmod=0)
    if attributes is None or len(inputs) != 2:
        return None
    return [np.fmod(*inputs) if attributes["fmod"] == 1 else np.mod(*inputs)]


def _where(node, opset, inputs):
    if node.attrs or len(inputs) != 3 or inputs[1].dtype != inputs[2].dtype:
        return None
    condition, x, y = inputs
    return [np.where(condition, x, y).astype(x.dtype)]


#: Cast's attributes by opset (Cast_1, Cast_19, Cast_24), defaults as the schemas give them
_CAST_ATTRIBUTES = ((24, dict(to=None, saturate=1, round_mode="up")), (19, dict(to=None, saturate=1)),
                    (1, dict(to=None)))


def _cast(node, opset, inputs):
    attributes = _attributes(node, **next(names for since, names in _CAST_ATTRIBUTES if opset >= since))
    if attributes is None or attributes["to"] not in _PLAIN_CAST_TARGETS or len(inputs) != 1:
        return None
    return [inputs[0].astype(helper.tensor_dtype_to_np_dtype(attributes["to"]))]


def _concat(node, opset, inputs):
    attributes = _attributes(node, axis=None)
    if attributes is None or attributes["axis"] is None or not inputs or any(v is None for v in inputs):
        return None
    axis = attributes["axis"]
    if any(v.ndim == 0 or not -v.ndim <= axis < v.ndim for v in inputs):
        return None  # the reference raises its own error
    return [np.concatenate(tuple(inputs), axis)]


def _gather(node, opset, inputs):
    attributes = _attributes(node, axis=0)
    if attributes is None or len(inputs) != 2:
        return None
    # made contiguous only when they are not: np.ascontiguousarray makes a 0-d index 1-d
    data, indices = (v if v.flags["C_CONTIGUOUS"] else np.ascontiguousarray(v) for v in inputs)
    return [np.take(data, indices, axis=attributes["axis"])]


def _unsqueeze(node, opset, inputs):
    if opset < 13:  # Unsqueeze_1: axes an attribute, inserted one by one in the order listed
        attributes = _attributes(node, axes=None)
        if attributes is None or not attributes["axes"] or len(inputs) != 1:
            return None
        result = inputs[0]
        for axis in attributes["axes"]:
            result = np.expand_dims(result, axis=axis)
        return [result]
    if node.attrs or len(inputs) != 2 or inputs[1] is None or inputs[1].ndim != 1:
        return None
    return [np.expand_dims(inputs[0], axis=tuple(inputs[1]))]


def _squeeze(node, opset, inputs):
    if opset < 13:  # Squeeze_1: axes an attribute, removed last first
        attributes = _attributes(node, axes=None)
        if attributes is None or len(inputs) != 1:
            return None
        axes = attributes["axes"]
        if not axes:
            return [np.squeeze(inputs[0], axis=None)]
        result = inputs[0]
        for axis in reversed(axes):
            result = np.squeeze(result, axis=axis)
        return [result]
    if node.attrs or not 1 <= len(inputs) <= 2:
        return None
    axes = inputs[1] if len(inputs) == 2 else None
    if axes is None:
        return [np.squeeze(inputs[0])]
    return [np.squeeze(inputs[0], axis=tuple(axes))] if axes.ndim == 1 else None


def _reshape(node, opset, inputs):
    """op_reshape.py's reshape_reference_implementation: a 0 copies the input's dim unless
    allowzero (opset 14)."""
    attributes = _attributes(node, allowzero=0) if opset >= 14 else _attributes(node)
    if opset < 5 or attributes is None or len(inputs) != 2:
        return None
    data, shape = inputs
    new_shape = np.copy(shape)
    if attributes.get("allowzero", 0) != 1:
        zeros = np.where(shape == 0)
        new_shape[zeros] = np.array(data.shape)[zeros]
    return [np.reshape(data, new_shape)]


def _slice(node, opset, inputs):
    """op_slice.py's _slice (Slice_10): Python slices on the listed axes, whole dims elsewhere."""
    if opset < 10 or node.attrs or not 3 <= len(inputs) <= 5:
        return None
    data, starts, ends, axes, steps = (inputs + [None, None])[:5]
    starts, ends = (value.reshape(1) if value.ndim == 0 else value for value in (starts, ends))
    if axes is None:
        bounds = zip(starts, ends) if steps is None else zip(starts, ends, steps)
        slices = [slice(*bound) for bound in bounds]
    else:
        slices = [slice(0, dim) for dim in data.shape]
        bounds = zip(starts, ends, axes) if steps is None else zip(starts, ends, axes, steps)
        for start, end, axis, *step in bounds:
            slices[axis] = slice(start, end, *step)
    return [data[tuple(slices)]]


def _expand(node, opset, inputs):
    if node.attrs or len(inputs) != 2:
        return None
    data, shape = inputs
    return [data * np.ones(shape, dtype=data.dtype)]


def _range(node, opset, inputs):
    if node.attrs or len(inputs) != 3 or inputs[0].dtype == np.float16:
        return None  # stash_type: the reference's low-precision path
    start, limit, delta = inputs
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _transpose(node, opset, inputs):
    attributes = _attributes(node, perm=None)
    if attributes is None or len(inputs) != 1:
        return None
    perm = attributes["perm"] or None
    if perm is None:
        return [np.transpose(inputs[0])]
    if len(perm) != inputs[0].ndim:
        return None
    return [np.transpose(inputs[0], axes=perm)]


def _flatten(node, opset, inputs):
    attributes = _attributes(node, axis=1)
    if attributes is None or len(inputs) != 1:
        return None
    axis, shape = attributes["axis"], inputs[0].shape
    new_shape = (1, -1) if axis == 0 else (np.prod(shape[:axis]).astype(int), -1)
    return [inputs[0].reshape(new_shape)]


def _tile(node, opset, inputs):
    return [np.tile(*inputs)] if not node.attrs and len(inputs) == 2 else None


def _clip(node, opset, inputs):
    """Clip_11: optional min and max inputs, the result in the data's dtype."""
    if opset < 11 or node.attrs or not 1 <= len(inputs) <= 3:
        return None
    data = inputs[0]
    low, high = (inputs[1:] + [None, None])[:2]
    result = data if low is None and high is None else np.clip(data, low, high)
    return [result if result.dtype == data.dtype else result.astype(data.dtype)]


def _scatter_nd(node, opset, inputs):
    """op_scatternd.py without a reduction: the updates written one index tuple at a time."""
    attributes = _attributes(node, reduction="none")
    if attributes is None or attributes["reduction"] != "none" or len(inputs) != 3:
        return None
    data, indices, updates = inputs
    output = np.copy(data)
    for position in np.ndindex(indices.shape[:-1]):
        output[tuple(indices[position])] = updates[position]
    return [output]


def _reduce(reduction) -> Kernel:
    """ReduceMax, ReduceMin and ReduceL2 (op_reduce_max.py, op_reduce_min.py, op_reduce_l2.py) of
    non-empty data: axes an attribute before opset 18 (ReduceMax_1), an input from 18
    (ReduceMax_18); `reduction(data, axes, keepdims)` is the op's own expression."""
    def kernel(node, opset, inputs):
        if not inputs or inputs[0].size == 0:
            return None  # an empty reduction fills a constant the reference picks per dtype
        data = inputs[0]
        if opset < 18:
            attributes = _attributes(node, axes=None, keepdims=1)
            if attributes is None or len(inputs) != 1:
                return None
            axes = tuple(attributes["axes"]) if attributes["axes"] else None
            keepdims = attributes["keepdims"] == 1
        else:
            attributes = _attributes(node, keepdims=1, noop_with_empty_axes=0)
            if attributes is None or len(inputs) > 2:
                return None
            axes = inputs[1] if len(inputs) == 2 else None
            if axes is None or 0 in axes.shape:
                if attributes["noop_with_empty_axes"]:
                    return None  # the reference's empty tuple of axes
                axes = None
            elif axes.ndim == 0:
                axes = int(axes)
            else:
                axes = tuple(axes.ravel().tolist())
            keepdims = attributes["keepdims"] != 0
        result = reduction(data, axes, keepdims)
        return [result if isinstance(result, np.ndarray) else np.array(result)]
    return kernel


def _l2_norm(data: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """op_reduce_l2.py: the square root of the sum of squares, in the data's dtype."""
    return np.sqrt(np.sum(np.square(data), axis=axes, keepdims=keepdims)).astype(dtype=data.dtype)


def _cumulative_sum(node, opset, inputs):
    """op_cum_sum.py: numpy's cumsum in the data's dtype on a 0-d axis, the data reversed around
    it for `reverse`, and shifted by one into zeros for `exclusive`."""
    attributes = _attributes(node, exclusive=0, reverse=0)
    if attributes is None or len(inputs) != 2 or inputs[1].ndim != 0:
        return None
    x, axis = inputs[0], int(inputs[1])
    reversed_axis = tuple(slice(None, None, -1) if a == axis % x.ndim else slice(None) for a in range(x.ndim))
    if attributes["reverse"]:
        x = x[reversed_axis]
    if attributes["exclusive"]:
        head = tuple(slice(0, -1) if a == axis % x.ndim else slice(None) for a in range(x.ndim))
        tail = tuple(slice(1, None) if a == axis % x.ndim else slice(None) for a in range(x.ndim))
        result = np.zeros(x.shape, dtype=x.dtype)
        np.cumsum(x[head], axis=axis, out=result[tail])
    else:
        result = np.cumsum(x, axis=axis, dtype=x.dtype)
    return [result[reversed_axis] if attributes["reverse"] else result]


def _conv(node, opset, inputs):
    """op_conv.py's Conv, step for step so that its one matmul sees the same operands: a
    dilated kernel spread out with zeros, auto_pad's pads, the zero-padded input's columns
    gathered by index arrays (im2col), one matmul per group, the bias added, the result cast
    to the input's dtype."""
    attributes = _attributes(node, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                             strides=None)
    if attributes is None or not 2 <= len(inputs) <= 3 or inputs[0] is None or inputs[1] is None:
        return None
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) == 3 else None
    if x.ndim < 3:
        return None  # the reference refuses it, with its own message
    spatial = x.ndim - 2
    group = attributes["group"]
    dilations = attributes["dilations"] or [1] * spatial
    kernel_shape = tuple(attributes["kernel_shape"] or w.shape[2:])
    pads = attributes["pads"] or [0] * (2 * spatial)
    strides = attributes["strides"] or [1] * spatial
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group != 0:
        return None
    if any(d != 1 for d in dilations):
        dilated = np.zeros((*w.shape[:2], *((k + (k - 1) * (d - 1)) for k, d in zip(w.shape[2:], dilations))),
                           dtype=w.dtype)
        dilated[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = w
        w = dilated
        kernel_shape = tuple(k + (k - 1) * (d - 1) for k, d in zip(kernel_shape, dilations))
    if attributes["auto_pad"] == "VALID":
        pads = [0] * (2 * spatial)
    elif attributes["auto_pad"] in ("SAME_LOWER", "SAME_UPPER"):
        heads, tails = [], []
        for size, stride, kernel in zip(x.shape[2:], strides, kernel_shape):
            needed = max(0, ((size + stride - 1) // stride - 1) * stride + kernel - size)
            heads.append((needed + 1) // 2 if attributes["auto_pad"] == "SAME_LOWER" else needed // 2)
            tails.append(needed - heads[-1])
        pads = heads + tails
    columns, out_shape = _im2col(x, kernel_shape, pads, strides)
    kernel_size = int(np.prod(kernel_shape))
    flattened_kernel = w.shape[1] * kernel_size
    columns = columns.reshape((group, flattened_kernel, x.shape[0] * int(np.prod(out_shape))))
    product = w.reshape((group, w.shape[0] // group, flattened_kernel)) @ columns
    product = product.reshape((group, w.shape[0] // group, x.shape[0], *out_shape))
    product = product.transpose((2, 0, 1, *range(3, product.ndim))).reshape((x.shape[0], w.shape[0], *out_shape))
    if bias is not None:
        if bias.size == 1:
            product = product + bias
        else:
            product += bias.reshape((1, -1) + (1,) * (product.ndim - 2))
    return [product.astype(x.dtype)]


def _im2col(x: np.ndarray, kernel_shape: tuple, pads: list, strides: list) -> tuple[np.ndarray, tuple]:
    """op_conv.py's im2col (no dilation: `_conv` spreads the kernel out first): [C*K, N*L]
    columns of the zero-padded input, and the output's spatial shape."""
    spatial = len(kernel_shape)
    batch, channels = x.shape[:2]
    out_shape = tuple((size + pads[i] + pads[i + spatial] - kernel) // strides[i] + 1
                      for i, (size, kernel) in enumerate(zip(x.shape[2:], kernel_shape)))
    indices = [np.tile(_axis_positions(i, kernel_shape).ravel(), channels).reshape(-1, 1)
               + (_axis_positions(i, out_shape) * strides[i]).reshape(1, -1) for i in range(spatial)]
    channel = np.repeat(np.arange(channels), np.prod(kernel_shape)).reshape(-1, 1)
    padded = np.pad(x, ((0, 0), (0, 0), *((pads[i], pads[i + spatial]) for i in range(spatial))), mode="constant")
    gathered = padded[(slice(0, batch), channel, *indices)]
    gathered = gathered.transpose((1, 0, *range(2, gathered.ndim)))
    return gathered.reshape((gathered.shape[0], batch * int(np.prod(out_shape)))), out_shape


def _axis_positions(axis: int, shape: tuple) -> np.ndarray:
    """An int64 array of `shape` holding each element's index along `axis` (op_conv.py's _make_ind)."""
    along = [1] * len(shape)
    along[axis] = shape[axis]
    return np.broadcast_to(np.arange(shape[axis]).reshape(along), shape).astype(np.int64)


KERNELS: dict[str, Kernel] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(_divide),
    "Mod": _mod, "Min": _extremum(np.minimum), "Max": _extremum(np.maximum),
    "Equal": _comparison(np.equal), "Less": _comparison(np.less), "Greater": _comparison(np.greater),
    "LessOrEqual": _comparison(np.less_equal), "GreaterOrEqual": _comparison(np.greater_equal),
    "And": _comparison(np.logical_and), "Or": _comparison(np.logical_or), "Xor": _comparison(np.logical_xor),
    "Not": _not, "Neg": _unary(np.negative), "Abs": _unary(np.absolute), "Ceil": _unary(np.ceil),
    "Floor": _unary(np.floor), "Sqrt": _unary(lambda x: np.sqrt(x).astype(x.dtype)),
    "Reciprocal": _unary(lambda x: np.reciprocal(x).astype(x.dtype)), "Sin": _unary(np.sin), "Cos": _unary(np.cos),
    "Log": _unary(lambda x: np.log(x).astype(x.dtype)), "Exp": _unary(lambda x: np.exp(x).astype(x.dtype)),
    "Pow": _power,
    "Where": _where, "Cast": _cast, "Concat": _concat, "Gather": _gather, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Reshape": _reshape, "Slice": _slice, "Expand": _expand, "Range": _range,
    "Transpose": _transpose, "Flatten": _flatten, "Tile": _tile, "Clip": _clip,
    "ReduceMax": _reduce(lambda data, axes, keepdims: np.maximum.reduce(data, axis=axes, keepdims=keepdims)),
    "ReduceMin": _reduce(lambda data, axes, keepdims: np.minimum.reduce(data, axis=axes, keepdims=keepdims)),
    "ReduceL2": _reduce(_l2_norm), "ScatterND": _scatter_nd, "CumSum": _cumulative_sum, "Conv": _conv,
}
