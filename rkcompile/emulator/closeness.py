"""How close the emulator's outputs are to a reference: cosine similarity, max absolute error
and max relative error, all computed in float64.

Max relative error is max|a - b| / max|b|, relative to the output's range rather than
element-wise, so outputs that cross zero do not report infinities."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np



@dataclass(frozen=True)
class Agreement:
    output: str
    cosine: float
    max_abs: float
    max_rel: float

    def passes(self, min_cosine: float) -> bool:
        return self.cosine >= min_cosine

    def to_dict(self) -> dict:
        return asdict(self)


def agreement(name: str, actual: np.ndarray, expected: np.ndarray) -> Agreement:
    """Also of a sequence output (a list of arrays, compared as their elements one after the
    other once their shapes agree) and of an empty optional (None)."""
    if any(v is None or isinstance(v, (list, tuple)) for v in (actual, expected)):
        shapes = [[np.shape(item) for item in v] if isinstance(v, (list, tuple)) else v for v in (actual, expected)]
        if shapes[0] != shapes[1]:
            return Agreement(name, float("-inf"), float("inf"), float("inf"))
        actual, expected = (np.concatenate([np.ravel(item) for item in v]) if v else np.zeros(0)
                            for v in (actual, expected))
    a = np.asarray(actual, np.float64).reshape(-1)
    b = np.asarray(expected, np.float64).reshape(-1)
    if a.shape != b.shape:
        return Agreement(name, float("-inf"), float("inf"), float("inf"))
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.all():
        # NaN and infinities must sit in the same places; the rest is compared as usual
        if not np.array_equal(a[~finite], b[~finite], equal_nan=True):
            return Agreement(name, float("-inf"), float("inf"), float("inf"))
        a, b = a[finite], b[finite]
    # scaled first, so outputs of denormal magnitude do not underflow the norms
    peak = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0)))
    if peak:
        a, b = a / peak, b / peak
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    cosine = float(a @ b / norms) if norms else (1.0 if not a.any() and not b.any() else 0.0)
    max_abs = float(np.abs(a - b).max(initial=0)) * (peak or 1.0)
    scale = float(np.abs(b).max(initial=0)) * (peak or 1.0)
    return Agreement(name, cosine, max_abs, max_abs / scale if scale else max_abs)


def onnxruntime_outputs(model_path, inputs: Mapping[str, np.ndarray], optimized: bool = True) -> dict[str, np.ndarray]:
    """The model (a path, or a serialized model's bytes) run by onnxruntime on one thread, the
    reference `--check` uses when the inputs file carries no expected outputs; with `optimized`
    False, its graph as written (onnxruntime's graph optimizations off: fusions that compute in
    another order)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = model_path if isinstance(model_path, bytes) else str(model_path)
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feeds = {i.name: inputs[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feeds)))
