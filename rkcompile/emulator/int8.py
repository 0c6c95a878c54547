"""int8 execution of one NPU step: integer operands, int32 accumulation, one requantization.

Operands arrive as `QTensor`s, the stored integers with their plan parameters (real =
(q - zero_point) * scale). A step runs one of four ways (docs/quantization.md):

1. **accumulate** (Conv, MatMul, Add, Sub, Mul, GlobalAveragePool; `INT8_KERNELS`): the kernel
   computes an exact integer `Accumulator` from zero-point-subtracted operands (the int32 the
   NPU holds before its output conversion) and its real scale. `requantize` turns it into int8
   with a fixed-point multiplier; a fused Relu or Clip that follows is the clamp of that same
   conversion, so ConvolutionRelu/ConvolutionClip stay all-integer.
2. **lookup** (element-wise functions of one tensor): a 256-entry table, entry q holding
   quantize(f(dequantize(q))), indexed by the input's integers.
3. **move** (Reshape, Transpose, Slice, Split, Concat, MaxPool, nearest Resize, ...): the
   integers are moved as they are; an input whose parameters differ from the output's (a
   Concat operand) is first rescaled with the same fixed-point requantization.
4. **anything else** (fused chains past a clamp, Softmax, Resize linear, AveragePool,
   Sigmoid in a fused body...): exact dequantization, the float32 kernels, one quantization of
   each output. Where a chain starts with an accumulating op, its accumulator is dequantized
   exactly, so the int32 arithmetic still happens first.

Rounding is round-half-to-even everywhere, as ONNX QuantizeLinear specifies, so the emulator
and a QDQ model's onnx.reference agree; saturation clamps to [-128, 127] (int32 accumulators
to the int32 range).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Sequence

import numpy as np

from rkcompile.plan.plain_nodes import Constant, Node, fused_body
from rkcompile.plan.schema import Quantization
from rkcompile.quantization.params import INT8, INT32, dequantize, quantize, scaled_float32
from rkcompile.targets.common import ONNX_TO_KERNEL

from rkcompile.emulator.fused import run_fused
from rkcompile.emulator.reference import run_reference
from rkcompile.emulator.registry import KERNELS, Unsupported

#: Bits of the fixed-point multiplier's mantissa: an int32 holding a value in [2^30, 2^31).
MULTIPLIER_BITS = 31


@dataclass(frozen=True)
class QTensor:
    values: np.ndarray
    quant: Quantization
    #: what kernels derive from the values, by key (`derived`)
    derivations: dict = field(default_factory=dict, compare=False, repr=False)

    def derived(self, key: str, make: Callable[["QTensor"], object]):
        """`make(self)`, made once: a weight's QTensor lives as long as its plan's weight cache
        (rkcompile/emulator/executor.py), so its kernels' forms of it are made once per plan."""
        if key not in self.derivations:
            self.derivations[key] = make(self)
        return self.derivations[key]

    def real(self) -> np.ndarray:
        return dequantize(self.values, self.quant)

    def centered(self, dtype: type = np.int64) -> np.ndarray:
        """q - zero point, exact (an int8 difference, |q - zero point| <= 255), as `dtype`."""
        zero = np.asarray(self.quant.zero_points, dtype)
        if self.quant.axis is not None and self.values.ndim:
            shape = [1] * self.values.ndim
            shape[self.quant.axis] = -1
            zero = zero.reshape(shape)
        else:
            zero = zero.reshape(())
        # one pass, in the values' memory order: the integers convert to `dtype` exactly inside
        # the subtraction (an array even for rank 0, where numpy's arithmetic gives a scalar)
        return np.asarray(np.subtract(self.values, zero, dtype=dtype))

    def largest_centered(self) -> int:
        """max |q - zero point| over the tensor (0 for an empty one), from the integers' own
        extremes: no centered copy is made."""
        if not self.values.size:
            return 0
        zero = np.asarray(self.quant.zero_points, np.int64)
        low, high = int(self.values.min()), int(self.values.max())
        return int(max(high - zero.min(), zero.max() - low, 0))

    def scales(self, ndim: int, axis: int | None = None) -> np.ndarray:
        """The scales shaped to broadcast along `axis` (default: the tensor's own axis) of a
        rank-`ndim` result."""
        scales = np.asarray(self.quant.scales, np.float64)
        if self.quant.axis is None:
            return scales.reshape(())
        shape = [1] * ndim
        shape[self.quant.axis if axis is None else axis] = -1
        return scales.reshape(shape)


@dataclass(frozen=True)
class Accumulator:
    """An exact integer result and its real scale: real = values * scale."""

    values: np.ndarray  # int64 or float64 holding int32-range integers (each kernel saturates its own)
    scale: np.ndarray  # broadcastable to values

    def real(self) -> np.ndarray:
        return scaled_float32(self.values, self.scale)


AccumulateKernel = Callable[[Node, Sequence["QTensor | np.ndarray | None"], int], Accumulator]
INT8_KERNELS: dict[str, AccumulateKernel] = {}


def register_int8(*ops: str) -> Callable[[AccumulateKernel], AccumulateKernel]:
    def add(kernel: AccumulateKernel) -> AccumulateKernel:
        for op in ops:
            INT8_KERNELS[op] = kernel
        return kernel
    return add


def saturate_int32(values: np.ndarray) -> np.ndarray:
    """`values` clipped to the int32 range, as a new int64 array (clip's own result when it is
    int64 already: one pass, not two)."""
    return np.clip(values, *INT32).astype(np.int64, copy=False)


# ---- requantization -----------------------------------------------------------------------

def fixed_point(multiplier: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """multiplier = mantissa * 2^-shift with an int32 mantissa in [2^30, 2^31)."""
    fraction, exponent = np.frexp(np.asarray(multiplier, np.float64))
    mantissa = np.rint(fraction * 2.0 ** MULTIPLIER_BITS).astype(np.int64)
    carry = mantissa == 2 ** MULTIPLIER_BITS  # the fraction rounded up to 1.0
    mantissa = np.where(carry, mantissa // 2, mantissa)
    shift = MULTIPLIER_BITS - (exponent + carry)
    return mantissa, shift.astype(np.int64)


#: The widest shift of a 64-bit product: an int32 magnitude times a mantissa below 2^31 is
#: below 2^62, so any wider shift leaves less than a half.
WIDEST_SHIFT = 62


def rounding_shift(product: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """product / 2^shift rounded half to even, in integers, for a product of magnitude below
    2^62 (either sign: half to even is symmetric, so -x rounds as x does). A shift above
    WIDEST_SHIFT (a multiplier below about 2^-32: a step whose inputs are ~1e-10 of its output's
    range, as in a random-weight network whose features collapse) rounds every product to 0; a
    shift below 1 (a multiplier of 2^30 or more) leaves any non-zero product at 2^30 or more,
    which saturates every int8 result, so the product stands for it. Both were clipped into
    [1, 62] before, which scaled such results by a power of two."""
    bounded = np.clip(shift, 1, WIDEST_SHIFT)
    # half to even in one shift: half - 1, plus 1 when the floor is odd, carries into the floor
    # exactly when the remainder is above half, or is half and the floor odd (the sum stays
    # below 2^63). The shift is arithmetic, a floor for either sign, so the remainder is in
    # [0, 2^shift) for a negative product too. In place on one new array: the requantization
    # of every accumulating step is this, over its whole output
    odd = np.right_shift(product, bounded)
    odd &= 1
    rounded = product + ((np.int64(1) << (bounded - 1)) - 1)
    rounded += odd
    rounded >>= bounded
    if (shift > WIDEST_SHIFT).any() or (shift < 1).any():
        rounded = np.where(shift > WIDEST_SHIFT, 0, np.where(shift < 1, product, rounded))
    return rounded


#: The widest shift whose fixed-point result a float64 product gives exactly (`requantize`).
FLOAT_EXACT_SHIFT = 44
#: Accumulators below this in magnitude times an int32 mantissa are float64-exact products.
FLOAT_EXACT_ACCUMULATOR = 2 ** 22


def requantize(acc: Accumulator, quant: Quantization, low: int = INT8[0], high: int = INT8[1]) -> np.ndarray:
    """int8 = saturate(round(acc * scale / out_scale) + zero point) with the multiplier in fixed
    point: int32 mantissa times the int32 accumulator in 64 bits, then a rounding shift.

    That is round(acc * m) for the multiplier m = mantissa * 2^-shift, exact in float64, and a
    float64 product rounds to the same integer (half to even) when either it is exact (acc
    below 2^22) or the shift is at most 44: a product that is a tie is exact, and any other lies
    at least 2^-shift from one, more than float64 rounding moves a product below 2^9 (one
    beyond saturates either way, as does the fixed point's for a shift below 1). The float64
    path does the same in a third of the passes over the accumulator."""
    mantissa, shift = fixed_point(np.asarray(acc.scale, np.float64) / quant.scales[0])
    if int(np.max(shift)) <= FLOAT_EXACT_SHIFT or _largest(acc.values) < FLOAT_EXACT_ACCUMULATOR:
        multiplier = np.ldexp(mantissa.astype(np.float64), -shift)
        values = acc.values
        # in place on a float64 accumulator, which requantize is the last to read (a new array
        # of a map's size costs its fresh pages: mobilenet_v2's 56x56x144 took 2.2 ms against
        # 0.6 in place); an array even for a rank-0 accumulator (numpy's arithmetic on those
        # gives scalars)
        in_place = (isinstance(values, np.ndarray) and values.dtype == np.float64
                    and np.broadcast_shapes(values.shape, multiplier.shape) == values.shape)
        scaled = np.asarray(np.multiply(values, multiplier, out=values if in_place else None, dtype=np.float64))
        np.rint(scaled, out=scaled)
    else:
        scaled = np.asarray(rounding_shift(saturate_int32(acc.values) * mantissa, shift))
    scaled += quant.zero_points[0]
    return np.clip(scaled, max(low, INT8[0]), min(high, INT8[1]), out=scaled).astype(np.int8)


def _largest(values: np.ndarray) -> float:
    """max |values| (0 for none)."""
    return float(max(-values.min(), values.max())) if values.size else 0.0


def rescale(q: QTensor, quant: Quantization) -> np.ndarray:
    """int8 values under other parameters: the identity when they are the same."""
    if q.quant.scales == quant.scales and q.quant.zero_points == quant.zero_points:
        return q.values.astype(np.int8, copy=False)
    return requantize(Accumulator(q.centered(), q.scales(q.values.ndim)), quant)


# ---- one step -------------------------------------------------------------------------------

#: Element-wise functions of one tensor: a 256-entry table computes them exactly.
LOOKUP_OPS = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
                        "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Abs",
                        "Neg", "Sin", "Cos", "Floor", "Ceil", "Sign", "Clip"})
#: Fused activations that are only a clamp of the output conversion.
CLAMP_OPS = frozenset({"Relu", "Clip"})


def run_int8(node: Node, operands: Sequence["QTensor | np.ndarray | None"],
             out_quants: Sequence[Quantization | None], opset: int, is_movement: Callable[[Node], bool],
             rounding: "tuple[Collection[str], Callable] | None" = None) -> list:
    """The step's outputs: int8 arrays for quantized outputs, as computed arrays otherwise.
    `rounding`: the intermediates of a fused float16 step rounded as they are made and how
    (run_fused's `rounded` and `round_value`)."""
    quant = out_quants[0] if len(out_quants) == 1 else None
    if quant is not None:
        chain = list(node.attrs["body"].nodes) if fused_body(node) is not None else [node]
        head, tail = chain[0], chain[1:]
        if fused_body(node) is not None:
            head_operands = _body_operands(node, head, operands)
        else:
            head_operands = operands
        if (head.op in INT8_KERNELS and all(member.op in CLAMP_OPS for member in tail)
                and _chained(chain) and _accumulates(head, head_operands)):
            low, high = INT8
            for member in tail:
                low, high = _clamp(member, quant, low, high)
            return [requantize(INT8_KERNELS[head.op](head, head_operands, opset), quant, low, high)]
        if fused_body(node) is None and node.op in LOOKUP_OPS and _one_tensor(node, operands):
            return [lookup_table(node, operands[0].quant, quant, opset, operands)[operands[0].values.astype(np.int64)
                                                                                - INT8[0]]]
    if (is_movement(node) or node.op == "Concat") and all(q is not None for q in out_quants):
        return move(node, operands, out_quants, opset)
    results = run_real(node, operands, opset, rounding)
    return [quantize(value, q) if q is not None else value for value, q in zip(results, out_quants)]


def _accumulates(head: Node, operands: Sequence) -> bool:
    """Whether the head's data operands are all quantized (its kernel needs their integers)."""
    data = [v for v in operands[:2] if v is not None]
    return all(isinstance(v, QTensor) for v in data)


def _chained(chain: Sequence[Node]) -> bool:
    """Each member reads the previous member's output as its data input."""
    return all(member.inputs[0].name == previous.outputs[0].name for previous, member in zip(chain, chain[1:]))


def _body_operands(node: Node, head: Node, operands: Sequence) -> list:
    """The head member's operands, looked up by the body's input names."""
    body = node.attrs["body"]
    variables = [v for t, v in zip(node.inputs, operands) if t.name and not isinstance(t, Constant)]
    env = {inner.name: value for inner, value in zip(body.inputs, variables)}
    env.update((t.name, v) for t, v in zip(node.inputs, operands) if isinstance(t, Constant))
    # a constant's own value only where the operands lack it: an int8 weight's is made when read
    return [None if not t.name else env[t.name] if t.name in env
            else np.asarray(t.values) if isinstance(t, Constant) else None for t in head.inputs]


def _clamp(member: Node, quant: Quantization, low: int, high: int) -> tuple[int, int]:
    """A Relu or Clip after the accumulator as integer bounds of the output conversion."""
    if member.op == "Relu":
        bounds = (0.0, None)
    else:
        # opset 11 moved the bounds from attributes to (constant) inputs
        values = [np.asarray(t.values) if isinstance(t, Constant) else None for t in member.inputs[1:]]
        bounds = (_scalar(values, 0, member.attrs.get("min")), _scalar(values, 1, member.attrs.get("max")))
    lower, upper = bounds
    if lower is not None:
        low = max(low, int(quantize(np.float64(lower), quant)))
    if upper is not None:
        high = min(high, int(quantize(np.float64(upper), quant)))
    return low, high


def _scalar(values: list, index: int, attribute) -> float | None:
    if index < len(values) and values[index] is not None:
        return float(values[index].reshape(-1)[0])
    return None if attribute is None else float(attribute)


def _one_tensor(node: Node, operands: Sequence) -> bool:
    """One quantized input; any others are constants (Clip's bounds)."""
    return (isinstance(operands[0], QTensor)
            and all(isinstance(t, Constant) or not t.name for t in node.inputs[1:]))


def lookup_table(node: Node, source: Quantization, quant: Quantization, opset: int, operands: Sequence) -> np.ndarray:
    """quantize(f(dequantize(q))) for every int8 q, in index order q + 128."""
    every = np.arange(INT8[0], INT8[1] + 1)
    real = dequantize(every, source)
    others = [v.real() if isinstance(v, QTensor) else v for v in operands[1:]]
    return quantize(run_float(node, [real] + others, opset)[0], quant)


def move(node: Node, operands: Sequence, out_quants: Sequence[Quantization], opset: int) -> list:
    """Integers moved as they are, inputs rescaled to the output's parameters first; a data
    input the plan holds as float (a model output an NPU step also reads) is quantized to them."""
    quant = out_quants[0]
    parameters = ONNX_TO_KERNEL.get(node.op, ("", ()))[1]

    def as_output_integers(position: int, value):
        if isinstance(value, QTensor):
            return rescale(value, quant).astype(np.float32)
        if value is not None and position not in parameters and value.dtype.kind == "f":
            return quantize(value, quant).astype(np.float32)
        return value

    moved = [as_output_integers(position, value) for position, value in enumerate(operands)]
    return [np.rint(value).astype(np.int8) for value in run_float(node, moved, opset)]


def run_real(node: Node, operands: Sequence, opset: int,
             rounding: "tuple[Collection[str], Callable] | None" = None) -> list:
    """Exact dequantization, float32 kernels; a fused body's accumulating head keeps its int32
    arithmetic and is dequantized exactly after it."""
    if fused_body(node) is not None:
        rounded, round_value = rounding or ((), None)
        return run_fused(node, list(operands), lambda member, values: _member_real(member, values, opset),
                         rounded=rounded, round_value=round_value)
    return run_float(node, [v.real() if isinstance(v, QTensor) else v for v in operands], opset)


def _member_real(member: Node, values: Sequence, opset: int) -> list:
    if member.op in INT8_KERNELS and _accumulates(member, values):
        return [INT8_KERNELS[member.op](member, values, opset).real()]
    if fused_body(member) is not None:
        return run_real(member, values, opset)
    return run_float(member, [v.real() if isinstance(v, QTensor) else v for v in values], opset)


def run_float(node: Node, values: Sequence, opset: int) -> list:
    operands = [v.astype(np.float32, copy=False) if v is not None and v.dtype.kind == "f" else v for v in values]
    kernel = KERNELS.get(node.op)
    if kernel is not None:
        try:
            return list(kernel(node, operands, opset))
        except Unsupported:
            pass
    return run_reference(node, operands, opset)
