"""rkcompile: plan ONNX models for Rockchip RKNPU2 NPUs, and execute the plans on an emulator.

The public API (docs/api.md) is `compile`, `load`, `run`, `Runtime`, `accuracy_analysis`,
`targets`, `Plan` and `Options`, and `export` with its `ExportOptions`. They load on first use (PEP 562), so `import rkcompile.plan.schema` stays a
JSON-only import for tools that read plans.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_API = ("Options", "Plan", "Runtime", "accuracy_analysis", "compile", "load", "run")
_EXPORT_API = ("ExportOptions", "export")  # rkcompile/onnx_export.py
__all__ = [*_API, *_EXPORT_API, "PLAN_SCHEMA", "targets", "__version__"]

if TYPE_CHECKING:
    from rkcompile.api import Options, Plan, Runtime, accuracy_analysis, compile, load, run  # noqa: F401
    from rkcompile.onnx_export import ExportOptions, export  # noqa: F401
    from rkcompile.plan.schema import PLAN_SCHEMA  # noqa: F401


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(".api", __name__), name)
    if name in _EXPORT_API:
        return getattr(importlib.import_module(".onnx_export", __name__), name)
    if name == "PLAN_SCHEMA":
        return importlib.import_module(".plan.schema", __name__).PLAN_SCHEMA
    if name == "targets":  # the subpackage, callable: rkcompile.targets() lists the SoCs
        return importlib.import_module(".targets", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
