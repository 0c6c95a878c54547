"""Where the emulator keeps tensors: one byte buffer per plan region, and nothing else.

The arena is exactly `memory.arena_bytes` long; the weight, input and output regions are as
long as their last tensor's end. Every tensor is a typed numpy view at its planned offset, in
its planned dtype and layout: NC1HWC2 views are (N, C1, H, W, C2) with the padding channels
present (and written as zeros), other layouts are the ONNX shape row-major. Reading decodes a
working copy for one step; writing encodes into the view, rounding to the stored dtype. So two
tensors that the plan places on the same bytes really do overwrite each other.

The exceptions are CPU tensors the CPU runtime holds itself: one whose shape the planner could
not know (layout "unknown", 0 bytes), which the runtime sizes when it runs, and a string tensor
(dtype "object": variable-length strings are no fixed bytes). The emulator holds them the same
way, in `dynamic`, and reports how many it held.
"""
from __future__ import annotations

import functools

import numpy as np

from rkcompile.errors import CompileError
from rkcompile.layouts import as_nchw, nc1hwc2_shape
from rkcompile.nodes import element_count
from rkcompile.plan import Plan, TensorPlacement
from rkcompile.targets.model import Target

from .half import cast


class EmulationError(CompileError):
    """The plan cannot be executed as written (a bad size, a missing tensor, no kernel)."""


class Storage:
    def __init__(self, plan: Plan, target: Target):
        self.tensors = plan.tensors
        self.target = target
        sizes = {"arena": plan.memory.arena_bytes, "weight": plan.memory.weight_bytes, "input": 0, "output": 0}
        for tensor in plan.tensors.values():
            sizes[tensor.region] = max(sizes[tensor.region], tensor.offset + tensor.bytes)
        self.regions = {region: np.zeros(size, np.uint8) for region, size in sizes.items()}
        self.dynamic: dict[str, np.ndarray] = {}
        #: each tensor's typed view, checked and made on its first use: a region's buffer is
        #: never replaced, so the view stays on the tensor's planned bytes for every later
        #: read and write (rebuilding it cost a step of a small model about as much as its data)
        self._views: dict[str, np.ndarray] = {}

    def placement(self, name: str) -> TensorPlacement:
        try:
            return self.tensors[name]
        except KeyError:
            raise EmulationError(f"tensor {name} is not in the plan") from None

    def view(self, name: str) -> np.ndarray:
        """The stored tensor as a typed view on its region's bytes."""
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self._make_view(name)
        return view

    def _make_view(self, name: str) -> np.ndarray:
        tensor = self.placement(name)
        stored_shape = self.stored_shape(tensor)
        dtype = np.dtype(tensor.dtype)
        needed = element_count(stored_shape) * dtype.itemsize
        if needed != tensor.bytes:
            raise EmulationError(f"tensor {name}: the plan gives {tensor.bytes} bytes, "
                                 f"{tensor.layout} {tensor.dtype} {list(tensor.shape)} needs {needed}")
        buffer = self.regions[tensor.region]
        if tensor.offset + needed > buffer.size:
            raise EmulationError(f"tensor {name} at {tensor.offset}+{needed} is outside its {buffer.size}-byte "
                                 f"{tensor.region} region")
        raw = buffer[tensor.offset:tensor.offset + needed]
        return raw.view(dtype).reshape(stored_shape)

    def stored_shape(self, tensor: TensorPlacement) -> tuple[int, ...]:
        if tensor.layout == "NC1HWC2":
            return nc1hwc2_shape(as_nchw(tensor.shape), self.target.c2_for(tensor.dtype))
        return tuple(tensor.shape)

    def read(self, name: str, dtype: np.dtype | None = None) -> np.ndarray:
        """A working copy of the tensor in its ONNX shape, in `dtype` (default: the stored
        dtype), decoded and converted in one pass. An NC1HWC2 tensor comes back channels-last in
        memory (an (N, H, W, C) buffer seen through a transposed view): its C2 blocks are runs of
        consecutive channels, so that order is the cheap one to decode, and it is the one the
        conv kernel multiplies in."""
        tensor = self.placement(name)
        if held_by_runtime(tensor):
            if name not in self.dynamic:
                raise EmulationError(f"tensor {name} is read before it is written")
            value = self.dynamic[name]
            return value if dtype is None or not isinstance(value, np.ndarray) else value.astype(dtype, copy=False)
        view = self.view(name)
        dtype = view.dtype if dtype is None else np.dtype(dtype)
        if tensor.layout != "NC1HWC2":
            return cast(view, dtype)
        n, c1, h, w, c2 = view.shape
        channels = as_nchw(tensor.shape)[1]
        channels_last = np.empty((n, h, w, c1), view_as_blocks(view).dtype)
        channels_last[...] = view_as_blocks(view).transpose(0, 2, 3, 1)
        channels_last = channels_last.view(view.dtype)
        if dtype != view.dtype:
            channels_last = cast(channels_last, dtype)
        nchw = channels_last.reshape(n, h, w, c1 * c2)[..., :channels].transpose(0, 3, 1, 2)
        return nchw.reshape(tensor.shape)

    def write(self, name: str, value: np.ndarray) -> None:
        """Store `value` (the tensor's ONNX shape) in its planned dtype and layout."""
        tensor = self.placement(name)
        if held_by_runtime(tensor):  # a sequence stays a list, an empty optional None
            self.dynamic[name] = value if value is None or isinstance(value, list) else np.asarray(value)
            return
        value = np.asarray(value)
        if tuple(value.shape) != tuple(tensor.shape):
            raise EmulationError(f"tensor {name}: computed shape {list(value.shape)}, "
                                 f"planned {list(tensor.shape)}")
        view = self.view(name)
        if not view.flags.writeable:
            raise EmulationError(f"tensor {name} is written, but the plan places it in the {tensor.region} region, "
                                 f"which holds constants")
        if tensor.layout != "NC1HWC2":
            view[...] = cast(value, view.dtype) if value.dtype != view.dtype else value
            return
        n, c1, h, w, c2 = view.shape
        channels_last = value.reshape(as_nchw(tensor.shape)).transpose(0, 2, 3, 1)
        if channels_last.dtype != view.dtype:
            channels_last = cast(channels_last, view.dtype)
        channels_last = np.ascontiguousarray(channels_last)
        whole_blocks, rest = divmod(channels_last.shape[-1], c2)
        whole = channels_last[..., :whole_blocks * c2].reshape(n, h, w, whole_blocks, c2)
        blocks = view_as_blocks(view)
        blocks[:, :whole_blocks] = view_as_blocks(whole).transpose(0, 3, 1, 2)
        if rest:
            # the last block zeroed whole, then its first `rest` lanes written as one item per
            # pixel: lane by lane, numpy moved a few bytes per pixel at a time
            blocks[:, whole_blocks] = np.zeros((), blocks.dtype)
            view_as_blocks(view[:, whole_blocks, ..., :rest])[...] = view_as_blocks(channels_last[..., whole_blocks * c2:])


def held_by_runtime(tensor: TensorPlacement) -> bool:
    """A CPU tensor without planned bytes: of unknown shape, or of strings."""
    return tensor.layout == "unknown" or tensor.dtype == "object"


def view_as_blocks(array: np.ndarray) -> np.ndarray:
    """The array without its last axis (which must be contiguous), each run along that axis
    (one C2 block) seen as a single opaque item: numpy moves a 16-byte item several times
    faster than 8 float16 values."""
    return array.view(_opaque(array.shape[-1] * array.itemsize))[..., 0]


@functools.lru_cache(maxsize=None)
def _opaque(size: int) -> np.dtype:
    """The opaque item dtype of `size` bytes (made once: a few microseconds each time)."""
    return np.dtype((np.void, size))
