"""The numpy emulator: executes a plan as planned (arena offsets, NC1HWC2, float16 on the NPU,
fused kernels as one, CPU steps on onnxruntime or onnx.reference) so its outputs can be checked against
onnxruntime. It reads plans and their weight regions, never models or the compiler.
docs/emulator.md describes the choices.

The names below load on first use (PEP 562): a module that needs one of them (the accuracy
check, the closeness of outputs) pays for the executor and every kernel only then.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: public name -> the submodule defining it
_EXPORTS = {"Agreement": "closeness", "agreement": "closeness", "onnxruntime_outputs": "closeness",
            "Execution": "executor", "Executor": "executor",
            "Prepared": "session", "check_plan": "session", "emulate": "session", "make_inputs": "session",
            "EmulationError": "storage", "Storage": "storage"}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from rkcompile.emulator.closeness import Agreement, agreement, onnxruntime_outputs  # noqa: F401
    from rkcompile.emulator.executor import Execution, Executor  # noqa: F401
    from rkcompile.emulator.session import Prepared, check_plan, emulate, make_inputs  # noqa: F401
    from rkcompile.emulator.storage import EmulationError, Storage  # noqa: F401


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
