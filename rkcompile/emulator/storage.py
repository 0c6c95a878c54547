"""Where the emulator keeps tensors: one byte buffer per plan region, and nothing else.

The arena is exactly `memory.arena_bytes` long and the `cpu` region (the CPU steps' tensors)
`memory.cpu_arena_bytes`; the weight, input and output regions are as long as their last
tensor's end. Every tensor is a typed numpy view at its planned offset, in its planned dtype
and layout: NC1HWC2 views are (N, C1, H, W, C2) with the padding channels
present (and written as zeros), NHWC views (N, H, W, C), other layouts are the ONNX shape row-major. Reading decodes a
working copy for one step; writing encodes into the view, rounding to the stored dtype. So two
tensors that the plan places on the same bytes really do overwrite each other.

The exceptions are CPU tensors the CPU runtime holds itself: one whose shape the planner could
not know (layout "unknown", 0 bytes), which the runtime sizes when it runs, and a string tensor
(dtype "object": variable-length strings are no fixed bytes). The emulator holds them the same
way, in `dynamic`, and reports how many it held.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from rkcompile.errors import CompileError
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_shape
from rkcompile.plan.schema import PlanRecord, TensorPlacement
from rkcompile.targets.model import Target

from rkcompile.numerics.float16 import cast


class EmulationError(CompileError):
    """The plan cannot be executed as written (a bad size, a missing tensor, no kernel)."""


class Storage:
    def __init__(self, plan: PlanRecord, target: Target):
        self.tensors = plan.tensors
        self.target = target
        sizes = {"arena": plan.memory.arena_bytes, "cpu": plan.memory.cpu_arena_bytes,
                 "weight": plan.memory.weight_bytes, "input": 0, "output": 0}
        for tensor in plan.tensors.values():
            sizes[tensor.region] = max(sizes[tensor.region], tensor.offset + tensor.bytes)
        self.regions = {region: np.zeros(size, np.uint8) for region, size in sizes.items()}
        self.dynamic: dict[str, np.ndarray] = {}
        #: each tensor's typed view and its block views (`_Stored`), checked and made on first
        #: use: a region's buffer is never replaced, so the views stay on the tensor's planned
        #: bytes for every later read and write (rebuilding them cost a step of a small model
        #: about as much as its data)
        self._stored: dict[str, _Stored] = {}

    def reset(self) -> None:
        """The regions as a new Storage holds them: each writable one zeroed (the read-only
        weight region holds weights), no tensor held outside them; the views stay, on the same
        bytes."""
        for region in self.regions.values():
            if region.flags.writeable:
                region.fill(0)
        self.dynamic.clear()

    def placement(self, name: str) -> TensorPlacement:
        try:
            return self.tensors[name]
        except KeyError:
            raise EmulationError(f"tensor {name} is not in the plan") from None

    def view(self, name: str) -> np.ndarray:
        """The stored tensor as a typed view on its region's bytes."""
        return self._stored_of(name).view

    def _stored_of(self, name: str) -> _Stored:
        stored = self._stored.get(name)
        if stored is None:
            stored = self._stored[name] = self._make_stored(name)
        return stored

    def _make_stored(self, name: str) -> _Stored:
        tensor = self.placement(name)
        stored_shape = self.stored_shape(tensor)
        dtype = _dtype(tensor.dtype)
        needed = math.prod(stored_shape) * dtype.itemsize
        if needed != tensor.bytes:
            raise EmulationError(f"tensor {name}: the plan gives {tensor.bytes} bytes, "
                                 f"{tensor.layout} {tensor.dtype} {list(tensor.shape)} needs {needed}")
        buffer = self.regions[tensor.region]
        if tensor.offset + needed > buffer.size:
            raise EmulationError(f"tensor {name} at {tensor.offset}+{needed} is outside its {buffer.size}-byte "
                                 f"{tensor.region} region")
        # one constructor call instead of a slice, a view and a reshape; it shares the region's
        # memory and its writeability (the weight region is read-only)
        view = np.ndarray(stored_shape, dtype, buffer, tensor.offset)
        return _Stored(tensor, view, as_nchw(tensor.shape) if tensor.layout == "NC1HWC2" else None)

    def stored_shape(self, tensor: TensorPlacement) -> tuple[int, ...]:
        if tensor.layout == "NC1HWC2":
            return nc1hwc2_shape(as_nchw(tensor.shape), self.target.c2_for(tensor.dtype))
        if tensor.layout == "NHWC":
            n, c, h, w = tensor.shape
            return n, h, w, c
        return tuple(tensor.shape)

    def read(self, name: str, dtype: np.dtype | None = None) -> np.ndarray:
        """A working copy of the tensor in its ONNX shape, in `dtype` (default: the stored
        dtype), decoded and converted in one pass. An NC1HWC2 tensor comes back channels-last in
        memory (an (N, H, W, C) buffer seen through a transposed view): its C2 blocks are runs of
        consecutive channels, so that order is the cheap one to decode, and it is the one the
        conv kernel multiplies in."""
        stored = self._stored.get(name)
        if stored is None:
            if held_by_runtime(self.placement(name)):
                if name not in self.dynamic:
                    raise EmulationError(f"tensor {name} is read before it is written")
                value = self.dynamic[name]
                return value if dtype is None or not isinstance(value, np.ndarray) else value.astype(dtype,
                                                                                                       copy=False)
            stored = self._stored_of(name)
        view = stored.view
        dtype = view.dtype if dtype is None else np.dtype(dtype)
        if stored.tensor.layout == "NHWC":
            return cast(view, dtype).transpose(0, 3, 1, 2)
        if stored.nchw is None:
            return cast(view, dtype)
        blocks = stored.blocks_channels_last
        if blocks is None:
            blocks = stored.blocks_channels_last = view_as_blocks(view).transpose(0, 2, 3, 1)
        channels_last = blocks.copy().view(view.dtype)  # (N, H, W, C1 * C2)
        if dtype != view.dtype:
            channels_last = cast(channels_last, dtype)
        return channels_last[..., :stored.nchw[1]].transpose(0, 3, 1, 2).reshape(stored.tensor.shape)

    def write(self, name: str, value: np.ndarray) -> None:
        """Store `value` (the tensor's ONNX shape) in its planned dtype and layout."""
        stored = self._stored.get(name)
        if stored is None:
            tensor = self.placement(name)
            if held_by_runtime(tensor):  # a sequence stays a list, an empty optional None
                self.dynamic[name] = value if value is None or isinstance(value, list) else np.asarray(value)
                return
            stored = self._stored_of(name)
        tensor, view = stored.tensor, stored.view
        value = np.asarray(value)
        if value.shape != tensor.shape and tuple(value.shape) != tuple(tensor.shape):
            raise EmulationError(f"tensor {name}: computed shape {list(value.shape)}, "
                                 f"planned {list(tensor.shape)}")
        if not view.flags.writeable:
            raise EmulationError(f"tensor {name} is written, but the plan places it in the {tensor.region} region, "
                                 f"which holds constants")
        if tensor.layout == "NHWC":
            value = value.transpose(0, 2, 3, 1)
        if stored.nchw is None:
            if value.dtype != view.dtype:
                cast(value, view.dtype, out=view)  # converted straight into the region: no copy between
            else:
                view[...] = value
            return
        channels_last = value.reshape(stored.nchw).transpose(0, 2, 3, 1)
        if channels_last.dtype != view.dtype:
            channels_last = cast(channels_last, view.dtype)
        channels_last = np.ascontiguousarray(channels_last)
        n, h, w, channels = channels_last.shape
        c2 = view.shape[-1]
        whole_blocks, rest = divmod(channels, c2)
        if stored.whole_blocks_channels_last is None:
            blocks = view_as_blocks(view)  # (N, C1, H, W)
            stored.whole_blocks_channels_last = blocks[:, :whole_blocks].transpose(0, 2, 3, 1)
            if rest:
                stored.last_block = blocks[:, whole_blocks]
                stored.partial_lanes = view_as_blocks(view[:, whole_blocks, ..., :rest])
        if whole_blocks:
            whole = channels_last[..., :whole_blocks * c2].reshape(n, h, w, whole_blocks, c2)
            stored.whole_blocks_channels_last[...] = view_as_blocks(whole)
        if rest:
            # the last block zeroed whole, then its first lanes written as one item per pixel:
            # lane by lane, numpy moved a few bytes per pixel at a time
            stored.last_block[...] = np.zeros((), stored.last_block.dtype)
            stored.partial_lanes[...] = view_as_blocks(channels_last[..., whole_blocks * c2:])


class _Stored:
    """A tensor's placement, its typed view on the region, and for NC1HWC2 tensors (`nchw`, the
    4-D shape they store) the views of its C2 blocks as opaque items that reads and writes move
    data through, each made on its first use: a read copies the (N, H, W, C1) view of the
    blocks, a write fills the whole blocks through the same view and a partial last block lane
    by lane."""
    __slots__ = ("tensor", "view", "nchw", "blocks_channels_last", "whole_blocks_channels_last", "last_block",
                 "partial_lanes")

    def __init__(self, tensor: TensorPlacement, view: np.ndarray, nchw: tuple[int, int, int, int] | None):
        self.tensor, self.view, self.nchw = tensor, view, nchw
        self.blocks_channels_last = self.whole_blocks_channels_last = self.last_block = self.partial_lanes = None


def held_by_runtime(tensor: TensorPlacement) -> bool:
    """A CPU tensor without planned bytes: of unknown shape, or of strings."""
    return tensor.layout == "unknown" or tensor.dtype == "object"


def view_as_blocks(array: np.ndarray) -> np.ndarray:
    """The array without its last axis (which must be contiguous), each run along that axis
    (one C2 block) seen as a single opaque item: numpy moves a 16-byte item several times
    faster than 8 float16 values."""
    return array.view(_opaque(array.shape[-1] * array.itemsize))[..., 0]


@functools.lru_cache(maxsize=None)
def _dtype(name: str) -> np.dtype:
    """np.dtype(name), made once per name."""
    return np.dtype(name)


@functools.lru_cache(maxsize=None)
def is_float(dtype: str) -> bool:
    """Whether a plan's dtype name is a numpy float dtype (kind "f"), worked out once per name."""
    return np.dtype(dtype).kind == "f"


@functools.lru_cache(maxsize=None)
def _opaque(size: int) -> np.dtype:
    """The opaque item dtype of `size` bytes (made once: a few microseconds each time)."""
    return np.dtype((np.void, size))
