"""RK3588 / RK3588S: three NPU cores.

Kernel and multi-core lists: oplist V2.3.2, platform RK3588 (multi-core: the kernels marked
"多核联合: 支持"). C2: seed 003, table 3-1 (column RK3588/RK3576/RV1126B). Cores: seed 004,
4.1.4.1 ("There are 3 cores inside the RK3588 NPU"). The seeds name the NPU SRAM feature (seed
002, chapter 15) but give no size, so none is claimed. No seed covers RK3588's operators, so its
rules cite the oplist, except the MatMul depth, which seed 002's K split gives.
"""
from rkcompile.targets.common import CONV_TRANSPOSE_FUSIONS, SHARED_KERNELS, Figures, build_target
from rkcompile.targets.model import CpuFigures, Performance

KERNELS = SHARED_KERNELS + CONV_TRANSPOSE_FUSIONS + (
    "AveragePool", "ConvolutionAddRelu", "GRU", "Gather", "GlobalAveragePool", "Hardmax", "LSTM",
    "Min", "Pow", "Softmax", "exNorm", "exSDPAttention", "exSoftmax13", "exSoftmaxMask",
    "exSwooshL", "exSwooshR",
)

MULTI_CORE = (
    "Add", "AddRelu", "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "Depthwise Convolution", "Mul", "MulRelu",
)

#: Kernels whose T1 is float16 only (oplist V2.3.2 RK3588).
KERNEL_DTYPES = {"Div": ("float16",), "GRU": ("float16",), "exNorm": ("float16",)}

TARGET = build_target(
    name="rk3588", aliases=("rk3588s",), description="RK3588/RK3588S, 3-core RKNPU2",
    npu_cores=3, c2={"int8": 16, "float16": 8}, oplist_platform="RK3588",
    kernels=KERNELS, multi_core=MULTI_CORE, kernel_dtypes=KERNEL_DTYPES,
    figures=Figures(matmul_k=8192, matmul_k_source="seed 002, V2.5.0 Matmul API: K above 8192 is split "
                                                   "on RK3588; oplist V2.3.2 RK3588 exMatMul k in (0, 8192]"),
    performance=Performance(int8_tops=6.0, ddr_gb_per_second=34.1,
                            source="TRM: 1024x3 int8 MACs per cycle at 1 GHz; 4x16-bit LPDDR4x-4266",
                            cpu=CpuFigures(
                                cores="4x Cortex-A76 @ 2.4 GHz + 4x Cortex-A55 @ 1.8 GHz", clock_ghz=2.4, fp32_macs_per_cycle=8,
                                thread_gb_per_second=4.0,
                                source="RK3588 datasheet: 4x A76 up to 2.4 GHz; 8 MACs/cycle: two 128-bit NEON FMA pipes; 4 GB/s per thread assumed (Radxa forum memcpy 3.3-22.6 GB/s)")),
)
