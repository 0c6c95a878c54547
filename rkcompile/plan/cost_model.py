"""The cost model: a roofline time per step, and what a batch or a core mask makes of it.

docs/cost-model.md gives every figure's source and the calibration against published fps. In
short, an NPU step takes max(MACs / MAC rate, bytes / bandwidth) plus a fixed issue cost; a
CPU-fallback step the same with the CPU's rates; a host conversion its bytes over the CPU's
strided-copy rate; every inference run pays a fixed submit-and-sync cost. Cores share the DDR:
when several are busy at once, each gets at most its share of what the DDR delivers.

Everything here works on `StepWork` records (MACs and bytes per step), so the model knows
nothing of graphs or passes; `passes/multicore.py` builds the records and the schedules.
"""
from __future__ import annotations


from dataclasses import dataclass
from rkcompile.errors import CompileError
from rkcompile.targets.model import Target

# --- calibrated against the rknn_model_zoo RK3588 single-core fps and the multi-core
#     ratios (docs/cost-model.md, "Calibration"); shared by every target ------------------------

#: Share of peak MAC rate a convolution sustains (tiling, channel padding to C2, pipeline fill).
MAC_EFFICIENCY = 0.50
#: Share of the DDR's theoretical bandwidth one NPU core can pull on its own.
CORE_DDR_SHARE = 0.33
#: Share of the DDR's theoretical bandwidth all NPU cores together get.
DDR_EFFICIENCY = 0.90
#: Seconds to issue one NPU step (register programming, task descriptors, completion).
STEP_SECONDS = 3e-6
#: Seconds per inference run: job submission, cache flush/invalidate, completion interrupt.
RUN_SECONDS = 730e-6
#: Extra seconds per step split across cores: the cores are started and joined per step.
SPLIT_SECONDS = 150e-6

# --- CPU side: the rates come from each target's CPU figures (`Target.performance.cpu`); these
#     shares turn peak figures into what a fallback op sustains (docs/cost-model.md) -------------

#: Share of a CPU core's peak fp32 NEON MAC rate a fallback op sustains: about a quarter
#: (assumed; with RK3588's A76 figures, 2.4 GHz x 8 MACs x 0.26 = 5 GMAC/s as calibrated before).
CPU_MAC_EFFICIENCY = 0.26
#: Share of one thread's streaming rate a host layout/dtype conversion reaches: it is a strided
#: copy (assumed; 3.3 of 4 GB/s, the low end of RK3588's measured memcpy range).
CONVERSION_SHARE = 0.825


@dataclass(frozen=True)
class Hardware:
    """The published figures of one SoC the model needs."""

    name: str
    int8_macs_per_core: float  # per second
    fp16_macs_per_core: float  # per second
    ddr_bytes_per_second: float  # theoretical peak
    source: str
    cpu_macs_per_second: float  # one fallback thread, sustained fp32
    cpu_bytes_per_second: float  # one thread, read plus written

    @property
    def conversion_bytes_per_second(self) -> float:
        return self.cpu_bytes_per_second * CONVERSION_SHARE

    def macs_per_second(self, dtype: str) -> float:
        if dtype in ("int8", "uint8"):
            return self.int8_macs_per_core
        if dtype in ("float16", "bfloat16"):
            return self.fp16_macs_per_core
        raise CompileError(f"the cost model has no NPU MAC rate for dtype {dtype} on {self.name}")

    @property
    def core_bytes_per_second(self) -> float:
        return self.ddr_bytes_per_second * CORE_DDR_SHARE

    def bandwidth_per_core(self, active: int) -> float:
        """What one core gets while `active` cores stream from the DDR at once."""
        return min(self.core_bytes_per_second, self.ddr_bytes_per_second * DDR_EFFICIENCY / max(active, 1))


#: fp16 runs at a quarter of the int8 MAC rate, 256 fp16 MACs per cycle per core on RK3588: an
#: assumption, reading a published "0.5 TFLOPS fp16" as per core (docs/cost-model.md), applied
#: to every RKNPU2.
FP16_SHARE = 0.25


def hardware_for(target: Target) -> Hardware:
    """The cost model's view of `target`, from the figures its own file gives
    (`Target.performance`): the marketed int8 TOPS spread over its cores (one MAC is two ops),
    and one thread of its CPU complex for fallback steps and host conversions."""
    figures = target.performance
    if figures is None:
        raise CompileError(f"the cost model has no figures for target {target.name}")
    int8 = figures.int8_tops * 1e12 / 2 / target.npu_cores
    cpu = figures.cpu
    return Hardware(target.name, int8, int8 * FP16_SHARE, figures.ddr_gb_per_second * 1e9,
                    f"{figures.source}; CPU: {cpu.cores}, {cpu.source}",
                    cpu_macs_per_second=cpu.clock_ghz * 1e9 * cpu.fp32_macs_per_cycle * CPU_MAC_EFFICIENCY,
                    cpu_bytes_per_second=cpu.thread_gb_per_second * 1e9)


@dataclass(frozen=True)
class StepWork:
    """What one plan step does: where it runs, its MACs, and the bytes it reads and writes
    (weights apart, since a batch or a split reads them differently)."""

    device: str  # "npu", "cpu" or "host"
    macs: int
    weight_bytes: int
    input_bytes: int
    output_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.input_bytes + self.output_bytes


@dataclass(frozen=True)
class Share:
    """One core's part of a split step: `fraction` of the outputs, reading all or `fraction`
    of the weights and inputs (what the split axis leaves whole is read whole)."""

    fraction: float
    divides_weights: bool
    divides_inputs: bool


WHOLE = Share(1.0, True, True)


def npu_seconds(work: StepWork, hardware: Hardware, dtype: str, share: Share = WHOLE, active: int = 1) -> float:
    """Roofline time of (a share of) an NPU step on one core while `active` cores stream."""
    f = share.fraction
    moved = (work.weight_bytes * (f if share.divides_weights else 1.0)
             + work.input_bytes * (f if share.divides_inputs else 1.0) + work.output_bytes * f)
    compute = f * work.macs / (hardware.macs_per_second(dtype) * MAC_EFFICIENCY)
    return max(compute, moved / hardware.bandwidth_per_core(active)) + STEP_SECONDS


def cpu_seconds(work: StepWork, hardware: Hardware) -> float:
    """A CPU-fallback step on one thread: compute- or memory-bound, whichever is slower."""
    return max(work.macs / hardware.cpu_macs_per_second, work.bytes / hardware.cpu_bytes_per_second)


def host_seconds(work: StepWork, hardware: Hardware) -> float:
    return work.bytes / hardware.conversion_bytes_per_second


def step_seconds(work: StepWork, hardware: Hardware, dtype: str, active: int = 1) -> float:
    """One unsplit step; only NPU steps feel the other cores' traffic (the CPU has its own
    cache hierarchy in front of the DDR, a simplification)."""
    if work.device == "npu":
        return npu_seconds(work, hardware, dtype, active=active)
    return cpu_seconds(work, hardware) if work.device == "cpu" else host_seconds(work, hardware)


def image_seconds(works: list[StepWork], hardware: Hardware, dtype: str, active: int = 1) -> float:
    """One image through every step on one core, without the run's fixed cost."""
    return sum(step_seconds(w, hardware, dtype, active) for w in works)


def one_core_seconds(works: list[StepWork], hardware: Hardware, dtype: str) -> float:
    """The reference every speedup is against: one image, one run, one core."""
    return RUN_SECONDS + image_seconds(works, hardware, dtype)
