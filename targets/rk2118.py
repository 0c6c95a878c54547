"""RK2118: one NPU core, float16 only.

Kernel list: oplist V2.3.2, platform RK2118, without AveragePool, GlobalAveragePool and
exSoftmaxMask, which it marks "不支持"; it adds exConvStreaming for streaming audio. C2: seed 003,
table 3-1 (column RK2118: int8 "/", float16 4). Every data kernel's T1 is float16 only, which
float16 plans meet. One core: seed 003 3.1.1 and seed 004 name multi-core for RK3588 and RK3576
only.
"""
from rkcompile.targets.common import SHARED_KERNELS, Figures, build_target
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.transpose_limits import WIDE

KERNELS = SHARED_KERNELS + (
    "LSTM", "Pow", "Softmax", "exConvStreaming", "exConvStreamingPRelu/LeakyRelu", "exSoftmax13",
)

#: T1 per kernel (oplist V2.3.2 RK2118): float16 only, except Where (bool mask) and Transpose.
KERNEL_DTYPES = {kernel: ("float16",) for kernel in KERNELS if kernel not in ("Where", "Transpose")}

TARGET = build_target(
    name="rk2118", description="RK2118, 1-core RKNPU2 (float16)", npu_cores=1,
    c2={"int8": None, "float16": 4}, oplist_platform="RK2118", kernels=KERNELS,
    figures=Figures(transpose_pq=WIDE, deconv_strides=(1, 2, 3, 4, 5, 6, 7, 8)),
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=0.3, ddr_gb_per_second=1.0,
                            source="no published figure: assumed",
                            cpu=CpuFigures(
                                cores="Cortex-M class MCU with HiFi4 DSPs (no published CPU figure)", clock_ghz=0.4, fp32_macs_per_cycle=1,
                                thread_gb_per_second=0.5,
                                source="no published CPU figure: every number assumed (a 400 MHz microcontroller-class core, 1 MAC/cycle, 0.5 GB/s)")),
)
