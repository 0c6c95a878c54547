"""RV1126B: one NPU core, with RK3576's operator list and rules.

The oplist V2.3.2 and seed 001 document RK3576 and RV1126B together; every multi-core flag there
reads "RV1126B: not supported", and RV1126B has one core (seed 004 names multi-core batching for
RK3588 and RK3576 only). C2: seed 003, table 3-1 (column RK3588/RK3576/RV1126B).
"""
from rkcompile.targets.common import build_target
from rkcompile.targets.model import CpuFigures, Performance
from rkcompile.targets.rk3576 import FIGURES, KERNEL_DTYPES, KERNELS, SEEDS

TARGET = build_target(
    name="rv1126b", description="RV1126B, 1-core RKNPU2", npu_cores=1, c2={"int8": 16, "float16": 8},
    oplist_platform="RK3576/RV1126B", kernels=KERNELS, seeds=SEEDS, figures=FIGURES,
    kernel_dtypes=KERNEL_DTYPES,
    performance=Performance(int8_tops=3.0, ddr_gb_per_second=8.5,
                            source="marketed 3 TOPS; 16-bit LPDDR4x-4266 (assumed)",
                            cpu=CpuFigures(
                                cores="4x Cortex-A53 @ 1.6 GHz", clock_ghz=1.6, fp32_macs_per_cycle=2,
                                thread_gb_per_second=1.6,
                                source="RV1126B datasheet: 4x A53 up to 1.6 GHz; 2 MACs/cycle (assumed, as RK3562); 1.6 GB/s per thread assumed")),
)
