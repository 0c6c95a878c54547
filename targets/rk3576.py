"""RK3576: two NPU cores.

Kernel and multi-core lists: oplist V2.3.2, platform RK3576/RV1126B (multi-core: the kernels
marked "RK3576: supported"), plus Sin and Cos, which seed 001 (V2.5.0) adds for RK3576/RV1126B.
Operator rules cite seed 001 for the kernels it covers and the oplist otherwise. C2: seed 003,
table 3-1. Cores: seed 004, 4.1.4.1 ("2 cores inside the RK3576 NPU"). No SRAM size is given by
the seeds. RV1126B shares every rule here (rv1126b.py).
"""
from rkcompile.targets.common import (CONV_TRANSPOSE_FUSIONS, SEED_001, SEED_001_KERNELS, SHARED_KERNELS,
    Figures, build_target, seeded)
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.transpose_limits import WIDE

KERNELS = SHARED_KERNELS + CONV_TRANSPOSE_FUSIONS + (
    "AveragePool", "ConvolutionAddRelu", "GRU", "Gather", "GlobalAveragePool", "Greater", "Hardmax",
    "LSTM", "Min", "Pow", "Softmax", "exNorm", "exSDPAttention", "exSoftmax13", "exSoftmaxMask",
    "Sin", "Cos",
)

MULTI_CORE = (
    "Add", "AddRelu", "Convolution", "ConvolutionAdd", "ConvolutionAddRelu", "ConvolutionClip",
    "ConvolutionElu", "ConvolutionHardSigmoid", "ConvolutionHardSwish", "ConvolutionMish",
    "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu", "ConvolutionSigmoid", "ConvolutionSoftplus",
    "ConvolutionSwish", "ConvolutionTanh", "Depthwise Convolution", "Mul", "MulRelu",
    "exSDPAttention",
)

#: Kernels whose T1 is float16 only: Div, GRU, exNorm (oplist V2.3.2 RK3576/RV1126B), Sin and
#: Cos (seed 001).
KERNEL_DTYPES = {kernel: ("float16",) for kernel in ("Div", "GRU", "exNorm", "Sin", "Cos")}

SEEDS = seeded(SEED_001, SEED_001_KERNELS)

FIGURES = Figures(
    transpose_pq=WIDE, deconv_strides=(1, 2, 3, 4, 5, 6, 7, 8),
    global_average_extent=(1, 7), global_max_extent=(0, 8192),
    matmul_k=4096, matmul_k_source="seed 002, V2.5.0 Matmul API: K above 4096 is split on RK3576/RV1126B",
)

TARGET = build_target(
    name="rk3576", description="RK3576, 2-core RKNPU2", npu_cores=2, c2={"int8": 16, "float16": 8},
    oplist_platform="RK3576/RV1126B", kernels=KERNELS, multi_core=MULTI_CORE, seeds=SEEDS,
    figures=FIGURES, kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=6.0, ddr_gb_per_second=17.0,
                            source="marketed 6 TOPS over 2 cores; 32-bit LPDDR4x-4266 (assumed)",
                            cpu=CpuFigures(
                                cores="4x Cortex-A72 @ 2.2 GHz + 4x Cortex-A53 @ 1.8 GHz", clock_ghz=2.2, fp32_macs_per_cycle=8,
                                thread_gb_per_second=3.0,
                                source="RK3576 datasheet: 4x A72 up to 2.2 GHz; 8 MACs/cycle: two 128-bit NEON pipes (assumed sustained like the A76); 3 GB/s per thread assumed")),
)
