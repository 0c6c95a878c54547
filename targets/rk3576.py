"""RK3576: two NPU cores.

Kernel and multi-core lists: oplist V2.3.2, platform RK3576/RV1126B (multi-core entries marked
"RK3576: supported"). C2: seed 003, table 3-1. Cores: seed 004, 4.1.4.1 ("2 cores inside the
RK3576 NPU"). No SRAM size is given by the seeds.
"""
from .common import COMMON_RULES, build_ops
from .model import Target

KERNELS = (
    "Add", "AddRelu", "AveragePool", "BatchNormalization", "Clip/ReLU6", "Concat", "ConvTranspose",
    "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip", "ConvolutionElu",
    "ConvolutionHardSigmoid", "ConvolutionHardSwish", "ConvolutionMish",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "ConvolutionSigmoid", "ConvolutionSoftplus",
    "ConvolutionSwish", "ConvolutionTanh", "Depthwise Convolution", "Div", "Elu", "Expand", "GRU",
    "Gather", "GlobalAveragePool", "GlobalMaxPool", "Greater", "HardSigmoid", "HardSwish",
    "Hardmax", "LSTM", "LeakyRelu", "Max", "MaxPool", "Min", "Mul", "MulRelu", "PRelu", "Pad",
    "Pow", "Relu", "Reshape", "Resize", "Sigmoid", "Slice", "Softmax", "Softplus", "Split", "Sub",
    "Tanh", "Tile", "Transpose", "Where", "exGelu", "exGlu", "exMatMul", "exMish", "exNorm",
    "exSDPAttention", "exSoftmax13", "exSoftmaxMask", "exSwish", "exWindow",
)

MULTI_CORE = (
    "Add", "AddRelu", "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip",
    "ConvolutionElu", "ConvolutionHardSigmoid", "ConvolutionHardSwish", "ConvolutionMish",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "ConvolutionSigmoid", "ConvolutionSoftplus",
    "ConvolutionSwish", "ConvolutionTanh", "Depthwise Convolution", "Mul", "MulRelu",
    "exSDPAttention",
)

TARGET = Target(
    name="rk3576",
    aliases=(),
    npu_cores=2,
    c2={"int8": 16, "float16": 8},
    sram_bytes=None,
    ops=build_ops(KERNELS, MULTI_CORE),
    common_rules=COMMON_RULES,
    kernels=frozenset(KERNELS),
    multi_core_kernels=frozenset(MULTI_CORE),
    description="RK3576, 2-core RKNPU2, 6 TOPS int8",
)
