"""float32 <-> float16 conversion of whole maps, the emulator's largest single cost.

numpy converts in software, element by element (about 3.4 ns per element float32 -> float16 on
the 2-core test machine, 1.3 ns back); onnxruntime's Cast kernel uses the CPU's conversion
instructions and was 16x and 6x faster on a 400k-element map. Both round to nearest even and agree bit for bit on every
non-NaN value (`tests/test_emulator_fast_paths.py::test_onnxruntime_float16_casts_match_numpy_bit_for_bit` checks all float16 values, the rounding ties
between them, the subnormal and overflow edges, and random bit patterns), so the emulator uses
onnxruntime when it is installed and numpy otherwise, and the results do not depend on which.
Small arrays stay with numpy: a session call costs more than converting them. (NaN payloads
are the one thing the two may convert differently; neither numpy nor ONNX defines them.)
"""
from __future__ import annotations

import functools
import os
import threading

import numpy as np

#: (from, to) -> below this many elements numpy's conversion is cheaper than an onnxruntime
#: call, whose fixed cost is 20-40 us (binding both arrays and running the session) on the
#: 2-core test machine. Measured per call on the reads and writes of four first runs replayed
#: (docs/emulator.md, round 4): widening 4,097-8,192 elements numpy 19.5-31.7 us
#: against onnxruntime 32.1-39.7 on three models (a tie on the fourth), 8,193-16,384 a tie;
#: narrowing 4,097-8,192 numpy 24.6-41.2 against 42.6-52.1 on three, but 245 against 49 on
#: tv_shufflenet_v2_x0_5's, so narrowing keeps its threshold
ONNXRUNTIME_MIN_ELEMENTS = {(np.dtype(np.float32), np.dtype(np.float16)): 4096,
                            (np.dtype(np.float16), np.dtype(np.float32)): 8192}
#: up to this many elements an onnxruntime conversion runs between two scratch arrays bound
#: to its session once per element count (`_OnnxruntimeCast.through_scratch`): copying the
#: values in and the result out costs less than binding the caller's arrays at every call
#: (about 10 us). Best of 7x300 calls (us), a transposed float32 map narrowed and a float16
#: one widened: 4,096 elements narrow 16.9 against 36.8 bound per call, widen 13.9 against
#: 27.2; 16,384: 31.6 against 46.7, 20.4 against 32.4; 65,536: 92.6 against 92.3, 31.8
#: against 27.8, where the copies have caught up
SCRATCH_ELEMENTS = 1 << 15
#: each thread's conversions by dtype, with the process they were made in: a conversion's scratch
#: arrays and IO bindings serve one call at a time, so threads (and forked workers) make their own
_per_thread = threading.local()


def cast(values: np.ndarray, dtype, out: np.ndarray | None = None) -> np.ndarray:
    """`values` converted to `dtype`, rounding to nearest even: a new C-contiguous array, or `out` (C-contiguous,
    of `values`' shape and `dtype`) filled in place.

    onnxruntime writes its result into an array numpy allocated (an IO binding), not into memory
    of its own that a new array then wraps: numpy's allocator reuses the blocks earlier steps
    freed, where each onnxruntime result was fresh memory the process faulted in page by page
    (a mobilenet_v2 first run: 7,900 page faults before, 5,400 after, about 2.5-3 us each on the
    test machine)."""
    dtype = np.dtype(dtype)
    if values.size >= ONNXRUNTIME_MIN_ELEMENTS.get((values.dtype, dtype), values.size + 1):
        converter = _converter(dtype)
        if converter is not None:
            if values.size <= SCRATCH_ELEMENTS:
                return converter.through_scratch(values, out)
            if out is None:
                out = np.empty(values.shape, dtype)
            converter(np.ascontiguousarray(values), out)
            return out
    if out is None:
        # C order, as the onnxruntime paths give: a write's channels-last view of an NCHW value
        # is converted and made contiguous in one pass, not converted in its memory order and
        # then copied
        with np.errstate(over="ignore"):  # an overflow is the executor's to report, naming the step
            return values.astype(dtype, order="C")
    with np.errstate(over="ignore"):
        out[...] = values
    return out


class _OnnxruntimeCast:
    """A one-node Cast model to one dtype on one thread, and one IO binding reused by every call:
    a fresh binding per call (`session.io_binding()`, then binding by device name) cost about
    15 us of Python of a 30 us conversion of 4,096 elements, paid twice by most steps of a
    model with small maps. Each call binds the caller's arrays by address, so nothing is copied
    and the result lands in `out`. Arrays of up to SCRATCH_ELEMENTS go through two scratch
    arrays instead, bound once per element count (`through_scratch`), which skips even that
    binding: a small model's maps come in a few sizes, each converted many times."""

    def __init__(self, onnxruntime, dtype: np.dtype):
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
        # one Cast has nothing to optimise, and the optimisers' pass over it was most of making
        # the session: 0.34-0.73 against 0.22-0.27 ms (the widening one is made during a first run)
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])
        self.binding = self.session.io_binding()
        self.source, self.target = np.dtype(np.float32 if target == TensorProto.FLOAT16 else np.float16), dtype
        self.scratch_source = np.empty(SCRATCH_ELEMENTS, self.source)
        self.scratch_target = np.empty(SCRATCH_ELEMENTS, self.target)
        #: element count -> an IO binding of the scratch arrays' first that many elements
        self.scratch_bindings: dict[int, object] = {}

    def through_scratch(self, values: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """`values` (any memory order, at most SCRATCH_ELEMENTS) converted: copied into the
        scratch source, converted by the binding of its element count (made on first use),
        and copied out into `out` or a new array."""
        count = values.size
        binding = self.scratch_bindings.get(count)
        if binding is None:
            binding = self.scratch_bindings[count] = self.session.io_binding()
            for bind, name, dtype, scratch in ((binding.bind_input, "x", self.source, self.scratch_source),
                                               (binding.bind_output, "y", self.target, self.scratch_target)):
                bind(name, "cpu", 0, dtype, (count,), scratch.__array_interface__["data"][0])
        np.copyto(self.scratch_source[:count].reshape(values.shape), values)
        self.session.run_with_iobinding(binding)
        result = self.scratch_target[:count].reshape(values.shape)
        if out is None:
            return result.copy()
        np.copyto(out, result)
        return out

    def __call__(self, values: np.ndarray, out: np.ndarray) -> None:
        """`values` (C-contiguous) converted into `out` (C-contiguous, of its shape)."""
        self.binding.bind_input("x", "cpu", 0, self.source, values.shape, values.__array_interface__["data"][0])
        self.binding.bind_output("y", "cpu", 0, self.target, out.shape, out.__array_interface__["data"][0])
        self.session.run_with_iobinding(self.binding)


def _converter(dtype: np.dtype) -> _OnnxruntimeCast | None:
    """The conversion to `dtype`, made once per thread (a forked worker makes its own), or None
    without onnxruntime."""
    converters = getattr(_per_thread, "converters", None)
    if converters is None or converters["pid"] != os.getpid():
        converters = _per_thread.converters = {"pid": os.getpid()}
    if dtype not in converters:
        try:
            import onnxruntime
        except ImportError:
            converters[dtype] = None
        else:
            converters[dtype] = _OnnxruntimeCast(onnxruntime, dtype)
    return converters[dtype]


def beyond_range(values: np.ndarray, dtype) -> np.ndarray:
    """The finite values of `values` beyond the largest finite value of `dtype` (a float dtype);
    converted as they are, those past its rounding edge (65520 for float16) become infinities."""
    limit = largest(dtype)
    values = np.asarray(values)
    if values.dtype.kind != "f" or largest(values.dtype) <= limit:
        return np.empty(0, values.dtype)
    stored = _stored_elements(values)
    finite = stored[np.isfinite(stored)]
    return finite[np.abs(finite) > limit]


def overflow(values: np.ndarray, dtype) -> tuple[int, float] | None:
    """How many finite values of `values` become infinities when stored as `dtype` (a float
    dtype narrower than theirs: those at or past its rounding edge, 65520 for float16), and the
    largest magnitude among them; None when none does. Two reductions without a copy answer
    the usual case, a map that fits."""
    values = np.asarray(values)
    if values.dtype.kind != "f" or not values.size or largest(values.dtype) <= largest(dtype):
        return None
    edge = rounding_edge(dtype)
    high, low = float(values.max()), float(values.min())
    if -edge < low and high < edge:  # also False for a NaN, which max and min pass on
        return None
    magnitudes = np.abs(values[np.isfinite(values)])
    beyond = magnitudes[magnitudes >= edge]
    return (int(beyond.size), float(beyond.max())) if beyond.size else None


@functools.lru_cache(maxsize=None)
def rounding_edge(dtype) -> float:
    """The smallest magnitude that rounds to infinity in a float dtype: its largest finite value
    plus half the step below it (round to nearest even rounds the tie up, as the largest value's
    last mantissa bit is odd). Worked out once per dtype, as `largest` is."""
    import ml_dtypes

    info = ml_dtypes.finfo(getattr(ml_dtypes, str(dtype), dtype))
    top = float(info.max)
    return top + (top - float(np.nextafter(info.dtype.type(top), info.dtype.type(0)))) / 2


def saturate(values: np.ndarray, dtype) -> np.ndarray:
    """`values` with every finite value beyond `dtype`'s range clamped to its largest finite value
    of the same sign; infinities and NaN stay as they are.

    Constants such as an attention mask's fill of float32's lowest value (torch.finfo.min) would
    otherwise become -inf in float16, and a softmax over a fully masked row would give NaN where
    the float32 model gives a uniform row. Rockchip's compiler does not let that reach the NPU
    either: rknn-toolkit2 2.5.0 rewrites constants beyond +-3e38 to +-10000 ("the value smaller
    than -3e+38 or greater than 3e+38 has been corrected to -10000 or 10000"), and with that
    correction disabled (optimization_level=2) its simulator gives the NaN rows (measured on a
    Where(mask, -3.4e38, scores) -> Softmax graph). onnxconverter-common's float16
    conversion clips the same way (convert_np_to_float16, to +-max_finite_val). Clamping to the
    float16 limit is the nearest value float16 holds, so it leaves every in-range value alone and
    covers every out-of-range constant, not only the ones near float32's limit."""
    limit = largest(dtype)
    values = np.asarray(values)
    if not beyond_range(values, dtype).size:
        return values
    stored = _stored_elements(values)
    clamped = np.where(np.isfinite(stored), np.clip(stored, -limit, limit), stored).astype(values.dtype)
    return np.broadcast_to(clamped, values.shape) if clamped.shape != values.shape else clamped


def _stored_elements(values: np.ndarray) -> np.ndarray:
    """`values` with each axis it repeats by broadcasting (stride 0) kept once: a folded
    ConstantOfShape of any size is one stored element, and must not be expanded to be inspected."""
    return values[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in values.strides)]


@functools.lru_cache(maxsize=None)
def largest(dtype) -> float:
    """The largest finite value of a float dtype, given as a numpy dtype or a plan's dtype name;
    worked out once per dtype (ml_dtypes.finfo took a few microseconds a call, and the emulator
    asks on every float write: `overflow`)."""
    import ml_dtypes  # an onnx dependency; its finfo knows bfloat16 as well as numpy's floats

    return float(ml_dtypes.finfo(getattr(ml_dtypes, str(dtype), dtype)).max)
