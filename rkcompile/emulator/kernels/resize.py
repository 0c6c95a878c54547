"""Resize (and the older Upsample) with nearest or (multi-)linear interpolation, separable per
axis: each resized axis maps output coordinates to input coordinates by the ONNX
coordinate_transformation_mode, then gathers (nearest) or blends two neighbours (linear)."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import Unsupported, attr, register
from rkcompile.emulator.kernels._windows import moveaxis


def _text(value, default):
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else value


def source_coordinates(mode: str, out_size: int, in_size: int, scale: float) -> np.ndarray:
    out = np.arange(out_size, dtype=np.float64)
    if mode == "half_pixel":
        return (out + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (out + 0.5) / scale - 0.5 if out_size > 1 else np.zeros(out_size)
    if mode == "align_corners":
        return out * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return out / scale
    if mode == "half_pixel_symmetric":
        adjustment = out_size / (scale * in_size)
        return (in_size / 2) * (1 - adjustment) + (out + 0.5) / scale - 0.5
    raise Unsupported(f"coordinate_transformation_mode {mode}")


def _nearest(coordinates: np.ndarray, rule: str, in_size: int) -> np.ndarray:
    if rule == "round_prefer_floor":
        index = np.ceil(coordinates - 0.5)
    elif rule == "round_prefer_ceil":
        index = np.floor(coordinates + 0.5)
    elif rule == "floor":
        index = np.floor(coordinates)
    elif rule == "ceil":
        index = np.ceil(coordinates)
    else:
        raise Unsupported(f"nearest_mode {rule}")
    return np.clip(index, 0, in_size - 1).astype(np.int64)


def _sizes_and_scales(node, inputs, x, opset):
    if node.op == "Upsample" or opset < 10:
        scales = np.asarray(inputs[1] if len(inputs) > 1 else attr(node, "scales"), np.float64)
        return [int(np.floor(s * f)) for s, f in zip(x.shape, scales)], scales
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else None
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None and inputs[3].size else None
    if attr(node, "axes") is not None or _text(attr(node, "keep_aspect_ratio_policy"), "stretch") != "stretch":
        raise Unsupported("Resize axes or keep_aspect_ratio_policy")
    if sizes is not None:
        sizes = [int(s) for s in sizes]
        return sizes, np.asarray(sizes, np.float64) / np.asarray(x.shape, np.float64)
    scales = np.asarray(scales, np.float64)
    return [int(np.floor(s * f)) for s, f in zip(x.shape, scales)], scales


@register("Resize", "Upsample")
def resize(node, inputs, opset):
    x = inputs[0]
    mode = _text(attr(node, "mode"), "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"Resize mode {mode}")
    if opset < 11:
        transform, rule = "asymmetric", "floor"
    else:
        transform = _text(attr(node, "coordinate_transformation_mode"), "half_pixel")
        rule = _text(attr(node, "nearest_mode"), "round_prefer_floor")
    if transform == "tf_crop_and_resize" or attr(node, "antialias", 0):
        raise Unsupported(f"Resize {transform}")
    sizes, scales = _sizes_and_scales(node, inputs, x, opset)
    # over channels-last memory (as Storage.read hands NC1HWC2 tensors over), resize the
    # channels-last view: each gather then moves whole pixels, where along a channels-first view
    # of that memory it picks elements one by one (a 21x40x40 -> 320x320 linear resize, 10.6 ms
    # -> 3); every element is the same expression of the same two neighbours, axis by axis in the
    # same order, so the values are the same. Adjacent channels are what counts, not a contiguous
    # whole: a channel count short of whole C2 blocks (21 of 24) reads as a slice of the
    # channels-last buffer (mobilenet_v3's 21-class 40x40 -> 320x320 map, 17.5 ms -> 8.5)
    channels_last = x.ndim > 2 and x.strides[1] == x.itemsize and not x.flags.c_contiguous
    position = list(range(x.ndim))  # where each ONNX axis is in the array resized
    if channels_last:
        x, position = moveaxis(x, 1, -1), [0, x.ndim - 1] + list(range(1, x.ndim - 1))
    y = x
    for onnx_axis, (out_size, scale) in enumerate(zip(sizes, scales)):
        axis = position[onnx_axis]
        in_size = x.shape[axis]
        if out_size == in_size and scale == 1:
            continue
        coordinates = source_coordinates(transform, out_size, in_size, scale)
        if mode == "nearest":
            y = np.take(y, _nearest(coordinates, rule, in_size), axis=axis)
            continue
        coordinates = np.clip(coordinates, 0, in_size - 1)
        low = np.floor(coordinates).astype(np.int64)
        high = np.minimum(low + 1, in_size - 1)
        shape = [1] * y.ndim
        shape[axis] = out_size
        weight = (coordinates - low).astype(np.float32).reshape(shape)
        if channels_last and axis == y.ndim - 2:
            # the weights repeated along the last axis (the channels), so the
            # products below run as one inner loop over each row rather than one per pixel
            weight = np.repeat(weight, y.shape[-1], axis=-1)
        # low * (1 - weight) + high * weight, each product and the sum rounded as that
        # expression rounds them, computed in the two gathered arrays (no full-size temporaries)
        blended = np.take(y, low, axis=axis)
        blended *= 1 - weight
        upper = np.take(y, high, axis=axis)
        upper *= weight
        blended += upper
        y = blended
    return [moveaxis(y, -1, 1) if channels_last else y]
