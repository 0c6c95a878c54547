"""RK3562: one NPU core.

Kernel list: oplist V2.3.2, platform RK3562. Operator rules cite seed 000 (V2.5.0 RK3562) for
the kernels it covers and the oplist otherwise. C2: seed 003, table 3-1 (RK3562 column: int8 16,
float16 8). One core: seed 003 3.1.1 and seed 004 name core selection and multi-core batching
for RK3588 and RK3576 only. No SRAM size is given by the seeds.
"""
from rkcompile.targets.common import (CONV_TRANSPOSE_FUSIONS, SEED_000, SEED_000_KERNELS, SHARED_KERNELS,
    Figures, build_target, seeded)
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.transpose_limits import WIDE

KERNELS = SHARED_KERNELS + CONV_TRANSPOSE_FUSIONS + (
    "AveragePool", "ConvolutionAddRelu", "GRU", "Gather", "GlobalAveragePool", "Hardmax", "LSTM",
    "Pow", "Softmax", "exNorm", "exSDPAttention", "exSoftmax13", "exSoftmaxMask",
)

#: Kernels whose T1 is float16 only: Div and GRU (seed 000), exNorm (oplist V2.3.2 RK3562).
KERNEL_DTYPES = {"Div": ("float16",), "GRU": ("float16",), "exNorm": ("float16",)}

TARGET = build_target(
    name="rk3562", description="RK3562, 1-core RKNPU2", npu_cores=1, c2={"int8": 16, "float16": 8},
    oplist_platform="RK3562", kernels=KERNELS, seeds=seeded(SEED_000, SEED_000_KERNELS),
    figures=Figures(transpose_pq=WIDE, deconv_strides=(1, 2, 3, 4, 5, 6, 7, 8)),
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=1.0, ddr_gb_per_second=8.5,
                            source="marketed 1 TOPS; 32-bit LPDDR4-2133 (assumed)",
                            cpu=CpuFigures(
                                cores="4x Cortex-A53 @ 2.0 GHz", clock_ghz=2.0, fp32_macs_per_cycle=2,
                                thread_gb_per_second=2.0,
                                source="RK3562 datasheet: 4x A53 up to 2.0 GHz; 2 MACs/cycle: a 64-bit NEON datapath issues a 4-lane FMA every 2 cycles (assumed); 2 GB/s per thread assumed")),
)
