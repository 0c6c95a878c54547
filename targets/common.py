"""What every target shares: the ONNX-op to kernel table, the kernels every platform lists, the
per-op rules with their default figures, and `build_target`, which a SoC file calls with only
what differs on that SoC.

The RKNN compiler operator list (oplist V2.3.2) names kernels, not ONNX ops. `ONNX_TO_KERNEL`
says which kernel runs each ONNX op; a target offers the op when its kernel list (copied per SoC
from the oplist) contains that kernel. Where the V2.5.0 seeds cover a platform's operator they
win over the oplist, and the rule cites the seed instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from rkcompile.targets import constraints as c
from rkcompile.targets.model import OpRule, Performance, Rule, Target
from rkcompile.targets.transpose_limits import FULL_TABLE, NARROW

#: ONNX op -> (oplist kernel, inputs that carry integer indices rather than data)
ONNX_TO_KERNEL: Mapping[str, tuple[str, tuple[int, ...]]] = {
    "Add": ("Add", ()),
    "Sub": ("Sub", ()),
    "Mul": ("Mul", ()),
    "Div": ("Div", ()),
    "Max": ("Max", ()),
    "Min": ("Min", ()),
    "Pow": ("Pow", ()),
    "Relu": ("Relu", ()),
    "LeakyRelu": ("LeakyRelu", ()),
    "PRelu": ("PRelu", ()),
    "Sigmoid": ("Sigmoid", ()),
    "Tanh": ("Tanh", ()),
    "HardSigmoid": ("HardSigmoid", ()),
    "HardSwish": ("HardSwish", ()),
    "Elu": ("Elu", ()),
    "Softplus": ("Softplus", ()),
    "Mish": ("exMish", ()),
    "Gelu": ("exGelu", ()),
    "Sin": ("Sin", ()),
    "Cos": ("Cos", ()),
    "Clip": ("Clip/ReLU6", ()),
    "Conv": ("Convolution", ()),
    "ConvTranspose": ("ConvTranspose", ()),
    "Gemm": ("Convolution", ()),
    "MatMul": ("exMatMul", ()),
    "BatchNormalization": ("BatchNormalization", ()),
    "LayerNormalization": ("exNorm", ()),
    "Concat": ("Concat", ()),
    "Split": ("Split", (1,)),
    "Slice": ("Slice", (1, 2, 3, 4)),
    "Reshape": ("Reshape", (1,)),
    "Flatten": ("Reshape", ()),
    "Squeeze": ("Reshape", (1,)),
    "Unsqueeze": ("Reshape", (1,)),
    "Transpose": ("Transpose", ()),
    "Tile": ("Tile", (1,)),
    "Expand": ("Expand", (1,)),
    "Gather": ("Gather", (1,)),
    "Pad": ("Pad", (1, 2, 3)),
    "Resize": ("Resize", (1, 2, 3)),
    "MaxPool": ("MaxPool", ()),
    "AveragePool": ("AveragePool", ()),
    "GlobalAveragePool": ("GlobalAveragePool", ()),
    "GlobalMaxPool": ("GlobalMaxPool", ()),
    "Softmax": ("Softmax", ()),
    "Hardmax": ("Hardmax", ()),
    "LSTM": ("LSTM", (4,)),
    "GRU": ("GRU", (4,)),
    "Where": ("Where", (0,)),
    "Greater": ("Greater", ()),
}

#: Kernels the oplist V2.3.2 lists on every platform (fused forms included).
SHARED_KERNELS: tuple[str, ...] = (
    "Add", "AddRelu", "BatchNormalization", "Clip/ReLU6", "Concat", "ConvTranspose", "Convolution",
    "ConvolutionAdd", "ConvolutionClip", "ConvolutionElu", "ConvolutionHardSigmoid",
    "ConvolutionHardSwish", "ConvolutionMish", "ConvolutionPRelu/LeakyRelu", "ConvolutionRelu",
    "ConvolutionSigmoid", "ConvolutionSoftplus", "ConvolutionSwish", "ConvolutionTanh",
    "Depthwise Convolution", "Div", "Elu", "Expand", "GlobalMaxPool", "HardSigmoid", "HardSwish",
    "LeakyRelu", "Max", "MaxPool", "Mul", "MulRelu", "PRelu", "Pad", "Relu", "Reshape", "Resize",
    "Sigmoid", "Slice", "Softplus", "Split", "Sub", "Tanh", "Tile", "Transpose", "Where", "exGelu",
    "exGlu", "exMatMul", "exMish", "exSwish", "exWindow",
)

#: The ConvTranspose fusions the larger platforms list.
CONV_TRANSPOSE_FUSIONS: tuple[str, ...] = (
    "ConvTranposeAdd", "ConvTranposeClip", "ConvTranposeElu", "ConvTranposeHardSigmoid",
    "ConvTranposeHardSwish", "ConvTranposeMish", "ConvTranposePRelu/LeakyRelu", "ConvTranposeRelu",
    "ConvTranposeSigmoid", "ConvTranposeSoftplus", "ConvTranposeSwish", "ConvTranposeTanh",
)

SEED_000 = "seed 000, V2.5.0 RK3562"
SEED_001 = "seed 001, V2.5.0 RK3576/RV1126B"
#: Kernels whose constraints seed 000 (RK3562) and seed 001 (RK3576/RV1126B) give.
SEED_000_KERNELS = ("Div", "Expand", "GRU", "Gather", "Hardmax", "LSTM", "Max", "Mul", "MulRelu",
                    "Pad", "MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool", "Pow")
SEED_001_KERNELS = ("Sigmoid", "Tanh", "Softplus", "HardSigmoid", "HardSwish", "Elu", "exSwish",
                    "exMish", "exGelu", "Sin", "Cos", "Where", "exConvStreaming", "exGlu",
                    "exMatMul", "exNorm", "exSDPAttention", "exWindow")

@dataclass(frozen=True)
class Figures:
    """The per-op numbers that differ between platforms; the defaults are RK3588's oplist."""

    transpose_table: Mapping[tuple[int, ...], tuple[str, ...]] = field(default_factory=lambda: FULL_TABLE)
    transpose_pq: Mapping[str, int] = field(default_factory=lambda: NARROW)
    matmul_k: int = 8192
    matmul_k_source: str = ""
    deconv_strides: tuple[int, ...] = (1, 2, 4, 8)
    max_pool_extent: tuple[int, int] = (8192, 8192)
    global_average_extent: tuple[int, int] = (0, 7)
    global_max_extent: tuple[int, int] = (0, 7)
    hardmax_volume: int | None = None


@dataclass(frozen=True)
class Sources:
    """Which document each kernel's constraints come from on one platform."""

    oplist_platform: str
    seeded: Mapping[str, str] = field(default_factory=dict)

    def cite(self, kernel: str) -> str:
        seed = self.seeded.get(kernel)
        return f"{seed} {kernel}" if seed else f"oplist V2.3.2 {self.oplist_platform} {kernel}"


def seeded(seed: str, kernels: Iterable[str]) -> dict[str, str]:
    return {kernel: seed for kernel in kernels}


def op_rules(figures: Figures, sources: Sources) -> dict[str, tuple[Rule, ...]]:
    """The shape, attribute and broadcast rules per ONNX op, with this platform's figures."""
    cite = sources.cite
    pool_height, pool_width = figures.max_pool_extent

    def pool(kernel: str) -> tuple[Rule, ...]:
        return (Rule(c.feature_extent, {"channel": 8192, "height": pool_height, "width": pool_width,
                                        "spatial_floor": 0, "source": cite(kernel)}),
                Rule(c.pool_window, {"kernel": 7, "stride": 8, "pad": 7, "source": cite(kernel)}),
                Rule(c.explicit_padding, {"source": cite(kernel)}),
                Rule(c.floor_rounding, {"source": cite(kernel)}))

    def global_pool(kernel: str, extent: tuple[int, int]) -> tuple[Rule, ...]:
        floor, side = extent
        return (Rule(c.feature_extent, {"channel": 8192, "height": side, "width": side,
                                        "spatial_floor": floor, "source": cite(kernel)}),)

    def broadcast(kernel: str) -> tuple[Rule, ...]:
        return (Rule(c.expand_broadcast, {"limit": 8192, "source": cite(kernel) + " (as Expand)"}),)

    recurrent = {"limit": 8192, "batch_multiple": 4}
    return {
        "Add": broadcast("Add"),
        "Mul": broadcast("Mul"),
        "Div": broadcast("Div"),
        "Max": broadcast("Max"),
        "Min": broadcast("Min"),
        "Where": broadcast("Where"),
        "Sub": (Rule(c.channel_broadcast, {"source": cite("Sub")}),),
        "Expand": (Rule(c.expand_target, {"limit": 8192, "source": cite("Expand")}),),
        "Pow": (Rule(c.pow_exponent, {"exponents": (0, 1, 2, 3, 0.5, -0.5), "source": cite("Pow")}),),
        "HardSigmoid": (Rule(c.hard_sigmoid_constants, {"alpha": 1 / 6, "beta": 0.5, "source": cite("HardSigmoid")}),),
        "Elu": (Rule(c.elu_alpha, {"alpha": 1.0, "source": cite("Elu")}),),
        "MaxPool": pool("MaxPool") + (Rule(c.row_major_indices, {"source": cite("MaxPool")}),),
        "AveragePool": pool("AveragePool") + (Rule(c.padded_average_counts_pads, {"source": cite("AveragePool")}),),
        "GlobalAveragePool": global_pool("GlobalAveragePool", figures.global_average_extent),
        "GlobalMaxPool": global_pool("GlobalMaxPool", figures.global_max_extent),
        "Softmax": (Rule(c.reduction_axis, {"axes": (1, 3), "source": cite("Softmax")}),),
        "Hardmax": (Rule(c.reduction_axis, {"axes": (1, 3), "source": cite("Hardmax")}),
                    Rule(c.hardmax_extent, {"limit": 16384, "source": cite("Hardmax")}))
        + ((Rule(c.hardmax_volume, {"volume": figures.hardmax_volume, "source": cite("Hardmax")}),)
           if figures.hardmax_volume else ()),
        "LSTM": (Rule(c.recurrent_extent, {**recurrent, "source": cite("LSTM")}),
                 Rule(c.lstm_variant, {"source": cite("LSTM")})),
        "GRU": (Rule(c.recurrent_extent, {**recurrent, "source": cite("GRU")}),),
        "Gather": (Rule(c.gather_indices, {"axes": (0, 1, 2, 3), "source": cite("Gather")}),),
        "Pad": (Rule(c.pad_mode, {"modes": ("constant", "reflect"), "channel": 8192, "height": 8192,
                                  "width": 8176, "source": cite("Pad")}),),
        "Slice": (Rule(c.unit_slice_steps, {"source": cite("Slice")}),),
        "Transpose": (Rule(c.transpose_perm, {"table": figures.transpose_table, **figures.transpose_pq,
                                              "source": cite("Transpose")}),),
        "LayerNormalization": (Rule(c.norm_axes, {"allowed": ((1,), (1, 2, 3)), "source": cite("exNorm")}),),
        "MatMul": (Rule(c.matmul_depth, {"limit": figures.matmul_k,
                                         "source": figures.matmul_k_source or cite("exMatMul")}),),
        "Conv": (Rule(c.conv_window, {"kernel": 31, "depthwise_kernel": 8, "stride": 7, "pad": 15,
                                      "dilation": 31, "depthwise_dilation": 32, "dilated_width": 16383,
                                      "source": cite("Convolution")}),),
        "ConvTranspose": (Rule(c.deconv_window, {"strides": figures.deconv_strides, "kernel": 31, "pad": 15,
                                                 "dilation": 32, "source": cite("ConvTranspose")}),),
        "Resize": (Rule(c.resize_mode, {"modes": ("nearest", "linear"),
                                        "coordinate_modes": ("half_pixel", "pytorch_half_pixel", "align_corners"),
                                        "source": cite("Resize")}),
                   Rule(c.resize_scale, {"largest": 8, "source": cite("Resize")})),
    }


def build_ops(kernels: Iterable[str], multi_core: Iterable[str], rules: Mapping[str, tuple[Rule, ...]],
              kernel_dtypes: Mapping[str, tuple[str, ...]], sources: Sources) -> dict[str, OpRule]:
    """The target's op table: every ONNX op whose kernel the target lists, with its rules.

    `kernel_dtypes` names the kernels whose T1 is not int8 and float16; they get a rule on the
    plan's dtype.
    """
    kernels, multi_core = set(kernels), set(multi_core)
    table = {}
    for op, (kernel, index_inputs) in ONNX_TO_KERNEL.items():
        if kernel not in kernels:
            continue
        checks = [Rule(c.float_data, {"index_inputs": index_inputs})]
        if kernel in kernel_dtypes:
            checks.append(Rule(c.plan_dtype, {"dtypes": kernel_dtypes[kernel], "source": sources.cite(kernel)}))
        checks += rules.get(op, ())
        table[op] = OpRule(kernel=kernel, rules=tuple(checks), multi_core=kernel in multi_core)
    return table


def build_target(*, name: str, aliases: tuple[str, ...] = (), description: str, npu_cores: int,
                 c2: Mapping[str, int | None], oplist_platform: str, kernels: Iterable[str],
                 multi_core: Iterable[str] = (), seeds: Mapping[str, str] | None = None,
                 figures: Figures = Figures(), kernel_dtypes: Mapping[str, tuple[str, ...]] | None = None,
                 sram_bytes: int | None = None, performance: Performance) -> Target:
    """A Target from one SoC's data. Multi-core flags only matter on a multi-core NPU."""
    kernels = frozenset(kernels)
    multi_core = frozenset(multi_core) if npu_cores > 1 else frozenset()
    sources = Sources(oplist_platform, dict(seeds or {}))
    common = (Rule(c.static_shapes), Rule(c.max_rank, {"limit": 4}))
    return Target(
        name=name, aliases=aliases, npu_cores=npu_cores, c2=dict(c2), sram_bytes=sram_bytes,
        ops=build_ops(kernels, multi_core, op_rules(figures, sources), kernel_dtypes or {}, sources),
        common_rules=common, kernels=kernels, multi_core_kernels=multi_core,
        description=description, oplist_platform=oplist_platform, performance=performance,
    )


