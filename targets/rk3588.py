"""RK3588 / RK3588S: three NPU cores.

Kernel and multi-core lists: oplist V2.3.2, platform RK3588. C2: seed 003, table 3-1 (column
RK3588/RK3576/RV1126B). Cores: seed 004, 4.1.4.1 ("There are 3 cores inside the RK3588 NPU").
The seeds name the NPU SRAM feature (seed 002, chapter 15) but give no size, so none is claimed.
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
    "LeakyRelu", "Max", "MaxPool", "Min", "Mul", "MulRelu", "PRelu", "Pad", "Pow", "Relu",
    "Reshape", "Resize", "Sigmoid", "Slice", "Softmax", "Softplus", "Split", "Sub", "Tanh", "Tile",
    "Transpose", "Where", "exGelu", "exGlu", "exMatMul", "exMish", "exNorm", "exSDPAttention",
    "exSoftmax13", "exSoftmaxMask", "exSwish", "exSwooshL", "exSwooshR", "exWindow",
)

MULTI_CORE = (
    "Add", "AddRelu", "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "Depthwise Convolution", "Mul", "MulRelu",
)

TARGET = Target(
    name="rk3588",
    aliases=("rk3588s",),
    npu_cores=3,
    c2={"int8": 16, "float16": 8},
    sram_bytes=None,
    ops=build_ops(KERNELS, MULTI_CORE),
    common_rules=COMMON_RULES,
    kernels=frozenset(KERNELS),
    multi_core_kernels=frozenset(MULTI_CORE),
    description="RK3588/RK3588S, 3-core RKNPU2, 6 TOPS int8",
)
