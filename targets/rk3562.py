"""RK3562: one NPU core.

Kernel and multi-core lists: oplist V2.3.2, platform RK3562. C2: seed 003, table 3-1 (RK3562
column: int8 16, float16 8). Single core: seed 004 names multi-batch cores only for RK3588 and
RK3576. No SRAM size is given by the seeds.
"""
from .common import COMMON_RULES, build_ops
from .model import Target

KERNELS = (
    "Add", "AddRelu", "AveragePool", "BatchNormalization", "Clip/ReLU6", "Concat", "ConvTranspose",
    "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip", "ConvolutionElu",
    "ConvolutionHardSigmoid", "ConvolutionHardSwish", "ConvolutionMish",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "ConvolutionSigmoid", "ConvolutionSoftplus",
    "ConvolutionSwish", "ConvolutionTanh", "Depthwise Convolution", "Div", "Elu", "Expand", "GRU",
    "Gather", "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "HardSwish", "Hardmax", "LSTM",
    "LeakyRelu", "Max", "MaxPool", "Mul", "MulRelu", "PRelu", "Pad", "Pow", "Relu", "Reshape",
    "Resize", "Sigmoid", "Slice", "Softmax", "Softplus", "Split", "Sub", "Tanh", "Tile",
    "Transpose", "Where", "exGelu", "exGlu", "exMatMul", "exMish", "exNorm", "exSDPAttention",
    "exSoftmax13", "exSoftmaxMask", "exSwish", "exWindow",
)

MULTI_CORE = ("AddRelu", "MulRelu")

TARGET = Target(
    name="rk3562",
    aliases=(),
    npu_cores=1,
    c2={"int8": 16, "float16": 8},
    sram_bytes=None,
    ops=build_ops(KERNELS, MULTI_CORE),
    common_rules=COMMON_RULES,
    kernels=frozenset(KERNELS),
    multi_core_kernels=frozenset(MULTI_CORE),
    description="RK3562, 1-core RKNPU2, 1 TOPS int8",
)
