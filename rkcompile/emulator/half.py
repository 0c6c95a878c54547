"""float32 <-> float16 conversion of whole maps, the emulator's largest single cost.

numpy converts in software, element by element (about 3.4 ns per element float32 -> float16 on
the 2-core test machine, 1.3 ns back); onnxruntime's Cast kernel uses the CPU's conversion
instructions and was 16x and 6x faster on a 400k-element map. Both round to nearest even and agree bit for bit on every
non-NaN value (`tests/test_emulator_half.py` checks all float16 values, the rounding ties
between them, the subnormal and overflow edges, and random bit patterns), so the emulator uses
onnxruntime when it is installed and numpy otherwise, and the results do not depend on which.
Small arrays stay with numpy: a session call costs more than converting them.
"""
from __future__ import annotations

import os

import numpy as np

#: below this many elements numpy's conversion is cheaper than an onnxruntime call
ONNXRUNTIME_MIN_ELEMENTS = 4096
_CONVERTIBLE = {(np.dtype(np.float32), np.dtype(np.float16)), (np.dtype(np.float16), np.dtype(np.float32))}
_sessions: dict = {"pid": None}


def cast(values: np.ndarray, dtype) -> np.ndarray:
    """`values` converted to `dtype` (a new array), rounding to nearest even."""
    dtype = np.dtype(dtype)
    if values.size >= ONNXRUNTIME_MIN_ELEMENTS and (values.dtype, dtype) in _CONVERTIBLE:
        session = _cast_session(dtype)
        if session is not None:
            return session.run(None, {"x": np.ascontiguousarray(values)})[0]
    return values.astype(dtype)


def _cast_session(dtype: np.dtype):
    """A one-node Cast model to `dtype` on one thread, made once per process (a forked worker
    makes its own), or None without onnxruntime."""
    if _sessions["pid"] != os.getpid():
        _sessions.clear()
        _sessions["pid"] = os.getpid()
    if dtype not in _sessions:
        _sessions[dtype] = _make_cast_session(dtype)
    return _sessions[dtype]


def _make_cast_session(dtype: np.dtype):
    try:
        import onnxruntime
    except ImportError:
        return None
    from onnx import TensorProto, helper

    target = helper.np_dtype_to_tensor_dtype(dtype)
    source = TensorProto.FLOAT if target == TensorProto.FLOAT16 else TensorProto.FLOAT16
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=target)], "cast",
                              [helper.make_tensor_value_info("x", source, None)],
                              [helper.make_tensor_value_info("y", target, None)])
    # IR 8 loads in every onnxruntime the test extra allows
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
