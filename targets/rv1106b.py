"""RV1103B / RV1106B: one NPU core, int8 only.

Kernel list: oplist V2.3.2, platform RV1103B/RV1106B, without AveragePool, GlobalAveragePool and
exSoftmaxMask, which it marks "不支持" (the toolkit rewrites average pools as convolutions).
C2: seed 003, table 3-1 (column RV1103B/RV1106B: int8 8, float16 "/"), so no float16 tensor
lives on this NPU. One core: seed 003 3.1.1 and seed 004 name multi-core for RK3588 and RK3576
only.
"""
from rkcompile.targets.common import SHARED_KERNELS, Figures, build_target
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.transpose_limits import WIDE

KERNELS = SHARED_KERNELS + (
    "ConvTranposeClip", "ConvTranposePRelu/LeakyRelu", "ConvTranposeRelu", "Softmax", "exSoftmax13",
)

#: T1 per kernel (oplist V2.3.2 RV1103B/RV1106B): Div is float16 only, every other data kernel
#: int8 only; Where's T1 is its bool mask and Transpose's T1 its int8 input.
KERNEL_DTYPES = {kernel: ("float16",) if kernel == "Div" else ("int8",)
                 for kernel in KERNELS if kernel not in ("Where", "Transpose")}

TARGET = build_target(
    name="rv1106b", aliases=("rv1103b",), description="RV1103B/RV1106B, 1-core RKNPU2 (int8)",
    npu_cores=1, c2={"int8": 8, "float16": None}, oplist_platform="RV1103B/RV1106B", kernels=KERNELS,
    figures=Figures(transpose_pq=WIDE, deconv_strides=(1, 2, 3, 4, 5, 6, 7, 8), max_pool_extent=(7, 7)),
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=1.0, ddr_gb_per_second=2.1,
                            source="marketed 1 TOPS; 16-bit DDR3L-1066 (assumed)",
                            cpu=CpuFigures(
                                cores="1x Cortex-A7 @ 1.2 GHz", clock_ghz=1.2, fp32_macs_per_cycle=1,
                                thread_gb_per_second=0.8,
                                source="RV1106B: 1x A7, clock and rates assumed as RV1106 (1 MAC/cycle, 0.8 GB/s on 16-bit DDR3L)")),
)
