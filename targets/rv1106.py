"""RV1103 / RV1106: one NPU core, int8 first.

Kernel list: oplist V2.3.2, platform RV1103/RV1106. Its convolutions, Add/Sub/Mul, Expand, Pad,
Resize, LSTM and exMatMul take int8 only, so a float16 plan runs little here. C2: seed 003,
table 3-1 (column RV1103/RV1106: int8 16, float16 8). One core: seed 003 3.1.1 and seed 004 name
multi-core for RK3588 and RK3576 only.
"""
from rkcompile.targets.common import CONV_TRANSPOSE_FUSIONS, SHARED_KERNELS, Figures, build_target
from rkcompile.targets.model import CpuFigures, Performance

KERNELS = SHARED_KERNELS + CONV_TRANSPOSE_FUSIONS + (
    "AveragePool", "ConvolutionAddRelu", "GlobalAveragePool", "Hardmax", "LSTM", "Min", "Pow",
    "Softmax", "exSDPAttention", "exSoftmax13", "exSoftmaxMask",
)

#: T1 per kernel where it is not int8 and float16 (oplist V2.3.2 RV1103/RV1106).
KERNEL_DTYPES = {
    "Div": ("float16",),
    **{kernel: ("int8",) for kernel in (
        "Add", "Convolution", "Depthwise Convolution", "ConvTranspose", "Expand", "LSTM", "Mul",
        "Pad", "Resize", "Sub", "exMatMul", "exSDPAttention")},
}

TARGET = build_target(
    name="rv1106", aliases=("rv1103",), description="RV1103/RV1106, 1-core RKNPU2", npu_cores=1,
    c2={"int8": 16, "float16": 8}, oplist_platform="RV1103/RV1106", kernels=KERNELS,
    figures=Figures(deconv_strides=(1, 2, 3, 4, 5, 6, 7, 8), hardmax_volume=8192),
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=0.5, ddr_gb_per_second=2.1,
                            source="marketed 0.5 TOPS; 16-bit DDR3L-1066 (assumed)",
                            cpu=CpuFigures(
                                cores="1x Cortex-A7 @ 1.2 GHz", clock_ghz=1.2, fp32_macs_per_cycle=1,
                                thread_gb_per_second=0.8,
                                source="RV1106 datasheet: 1x A7 up to 1.2 GHz; 1 MAC/cycle: VFPv4 NEON on a 64-bit datapath (assumed); 0.8 GB/s on 16-bit DDR3L assumed")),
)
