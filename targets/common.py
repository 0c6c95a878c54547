"""The ONNX-op to RKNPU2-kernel table every target starts from.

The RKNN compiler operator list (oplist V2.3.2) names kernels, not ONNX ops. This table says
which kernel runs each ONNX op; a target offers the op when its own kernel list (copied per SoC
from the oplist into the target's file) contains that kernel. Per-op rules are added here when
they hold on every platform and in the target files when they differ.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .constraints import float_data, max_rank, static_shapes
from .model import OpRule, Rule

#: ONNX op -> (oplist kernel, inputs that carry integer indices rather than data)
ONNX_TO_KERNEL: Mapping[str, tuple[str, tuple[int, ...]]] = {
    "Add": ("Add", ()),
    "Sub": ("Sub", ()),
    "Mul": ("Mul", ()),
    "Div": ("Div", ()),
    "Max": ("Max", ()),
    "Min": ("Min", ()),
    "Pow": ("Pow", ()),
    "Relu": ("Relu", ()),
    "LeakyRelu": ("LeakyRelu", ()),
    "PRelu": ("PRelu", ()),
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "HardSigmoid": ("HardSigmoid", ()),
    "HardSwish": ("HardSwish", ()),
    "Elu": ("Elu", ()),
    "Softplus": ("Softplus", ()),
    "Mish": ("exMish", ()),
    "Gelu": ("exGelu", ()),
    "Clip": ("Clip/ReLU6", ()),
    "Conv": ("Convolution", ()),
    "ConvTranspose": ("ConvTranspose", ()),
    "Gemm": ("Convolution", ()),
    "MatMul": ("exMatMul", ()),
    "BatchNormalization": ("BatchNormalization", ()),
    "LayerNormalization": ("exNorm", ()),
    "Concat": ("Concat", ()),
    "Split": ("Split", (1,)),
    "Slice": ("Slice", (1, 2, 3, 4)),
    "Reshape": ("Reshape", (1,)),
    "Flatten": ("Reshape", ()),
    "Squeeze": ("Reshape", (1,)),
    "Unsqueeze": ("Reshape", (1,)),
    "Transpose": ("Transpose", ()),
    "Tile": ("Tile", (1,)),
    "Expand": ("Expand", (1,)),
    "Gather": ("Gather", (1,)),
    "Pad": ("Pad", (1, 2, 3)),
    "Resize": ("Resize", (1, 2, 3)),
    "MaxPool": ("MaxPool", ()),
    "AveragePool": ("AveragePool", ()),
    "GlobalAveragePool": ("GlobalAveragePool", ()),
    "GlobalMaxPool": ("GlobalMaxPool", ()),
    "Softmax": ("Softmax", ()),
    "Hardmax": ("Hardmax", ()),
    "LSTM": ("LSTM", (4,)),
    "GRU": ("GRU", (4,)),
    "Where": ("Where", (0,)),
    "Greater": ("Greater", ()),
}

#: Rules every NPU node must pass, whatever its op.
COMMON_RULES: tuple[Rule, ...] = (
    Rule(static_shapes),
    Rule(max_rank, {"limit": 4}),
)


def build_ops(kernels: Iterable[str], multi_core: Iterable[str] = (),
              extra_rules: Mapping[str, tuple[Rule, ...]] | None = None) -> dict[str, OpRule]:
    """The target's op table: every ONNX op whose kernel the target lists.

    `multi_core` names the kernels the oplist marks "多核联合: 支持"; `extra_rules` adds
    target-specific rules per ONNX op.
    """
    kernels = set(kernels)
    multi_core = set(multi_core)
    extra_rules = extra_rules or {}
    table = {}
    for op, (kernel, index_inputs) in ONNX_TO_KERNEL.items():
        if kernel not in kernels:
            continue
        rules = (Rule(float_data, {"index_inputs": index_inputs}),) + tuple(extra_rules.get(op, ()))
        table[op] = OpRule(kernel=kernel, rules=rules, multi_core=kernel in multi_core)
    return table
