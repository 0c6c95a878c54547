"""NPU ops the emulator computes with onnx.reference in float32 and stores in the NPU dtype:
data movement whose result is exact whatever the arithmetic (Cast, DepthToSpace,
SpaceToDepth; Gather, Expand, Tile and Where have numpy kernels in indexing.py). Each is listed so `tests/test_emulator_registry.py` can see every plannable op is covered."""
from __future__ import annotations

from rkcompile.emulator.reference import run_reference
from rkcompile.emulator.registry import register

REFERENCE_OPS = ("Cast", "DepthToSpace", "SpaceToDepth")

register(*REFERENCE_OPS)(run_reference)
