"""RK3566 / RK3568: one NPU core, the oldest RKNPU2 in the oplist.

Kernel list: oplist V2.3.2, platform RK3566/RK3568; it has no Softmax, Hardmax or exSDPAttention,
and its Transpose runs 5 of the 24 perms. C2: seed 003, table 3-1 (column RK3566/RK3568: int8 8,
float16 4). One core: seed 003 3.1.1 and seed 004 name multi-core for RK3588 and RK3576 only.
"""
from rkcompile.targets.common import CONV_TRANSPOSE_FUSIONS, SHARED_KERNELS, Figures, build_target
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.transpose_limits import NARROW, RK3566_TABLE

KERNELS = SHARED_KERNELS + CONV_TRANSPOSE_FUSIONS + (
    "AveragePool", "ConvolutionAddRelu", "GRU", "Gather", "GlobalAveragePool", "LSTM", "Min", "Pow",
    "exNorm", "exSwooshL", "exSwooshR",
)

#: Kernels whose T1 is float16 only (oplist V2.3.2 RK3566/RK3568).
KERNEL_DTYPES = {"Div": ("float16",), "GRU": ("float16",), "exNorm": ("float16",)}

TARGET = build_target(
    name="rk3566", aliases=("rk3568",), description="RK3566/RK3568, 1-core RKNPU2", npu_cores=1,
    c2={"int8": 8, "float16": 4}, oplist_platform="RK3566/RK3568", kernels=KERNELS,
    figures=Figures(transpose_table=RK3566_TABLE, transpose_pq=NARROW, global_max_extent=(1, 7)),
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=0.8, ddr_gb_per_second=8.5,
                            source="marketed 0.8 TOPS; 32-bit LPDDR4-2133 (assumed)",
                            cpu=CpuFigures(
                                cores="4x Cortex-A55 @ 1.8 GHz", clock_ghz=1.8, fp32_macs_per_cycle=2,
                                thread_gb_per_second=2.0,
                                source="RK3566 datasheet: 4x A55 up to 1.8 GHz (RK3568: 2.0 GHz); 2 MACs/cycle like the A53 (assumed); 2 GB/s per thread assumed")),
)
