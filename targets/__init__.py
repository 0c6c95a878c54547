"""The SoCs rkcompile plans for, one module per SoC, looked up by name or alias."""
from __future__ import annotations

import importlib
import sys
import types

from rkcompile.errors import CompileError

from rkcompile.targets.model import OpRule, Rule, Target

#: one module per SoC, named as the target it defines (tests/test_targets.py checks the names)
TARGET_MODULES = ("rk3588", "rk3576", "rv1126b", "rk3562", "rk3566", "rv1106", "rv1106b", "rk2118")


def all_targets() -> list[Target]:
    return [_target_of(module) for module in TARGET_MODULES]


def get_target(name: str) -> Target:
    """The target called `name` or one of its aliases. The module of that name is looked in
    first, so a lookup by name builds that one target, not all of them (a plan process looks
    up one)."""
    wanted = name.strip().lower()
    for module in sorted(TARGET_MODULES, key=lambda module: module != wanted):
        target = _target_of(module)
        if wanted == target.name or wanted in target.aliases:
            return target
    known = ", ".join(t.name for t in all_targets())
    raise CompileError(f"unknown target '{name}' (known targets: {known})")


def _target_of(module: str) -> Target:
    return importlib.import_module(f"{__name__}.{module}").TARGET


__all__ = ["OpRule", "Rule", "Target", "all_targets", "get_target"]


class _CallableModule(types.ModuleType):
    """`rkcompile.targets()` lists the targets (the public API, docs/api.md), while
    `rkcompile.targets` stays this package: Python binds a subpackage to its parent's attribute
    of the same name, so a plain function there would be replaced on first import."""

    def __call__(self) -> list[Target]:
        return all_targets()


sys.modules[__name__].__class__ = _CallableModule
