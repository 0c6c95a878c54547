"""The simplify-layout pass (EARLY and LATE in the pipeline): fewer Reshape and Transpose steps.
Moved as it was; the next commit splits it by rule family."""
from __future__ import annotations

from rkcompile.passes.simplify_layout.move_down import EARLY, LATE, RULES, SimplifyLayout

__all__ = ["EARLY", "LATE", "RULES", "SimplifyLayout"]
