"""Concat along one axis."""
from __future__ import annotations

import numpy as np

from rkcompile.emulator.registry import attr, register


@register("Concat")
def concat(node, inputs, opset):
    return [np.concatenate([v for v in inputs if v is not None], axis=int(attr(node, "axis")))]
