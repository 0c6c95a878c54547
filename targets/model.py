"""The Target data model: what one SoC's NPU offers, as data the passes read.

A target is figures (cores, C2 per dtype, SRAM) plus an operator table. Each ONNX op the NPU
can run maps to an `OpRule`: the RKNPU2 kernel that runs it and the `Rule`s a node must pass.
A `Rule` binds a constraint function from `constraints.py` to this target's parameters; the
function's docstring, rendered with those parameters, is the text a user reads on fallback.
Facts of the compile rather than the target (the plan dtype, the model's opset) reach a check
only when its signature names them, so most checks stay `check(node, target, **params)`.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


CheckResult = tuple[bool, str]


@dataclass(frozen=True)
class Rule:
    """A check a node must pass to run on the NPU, with this target's parameters for it."""

    check: Callable[..., CheckResult]
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.check.__name__

    def describe(self) -> str:
        """The user-facing rule: the check's docstring rendered with this target's parameters."""
        return self._text

    @functools.cached_property
    def _text(self) -> str:
        text = _cleaned_doc(self.check)
        shown = {key: describe_value(value) if isinstance(value, (tuple, list)) else value
                 for key, value in self.params.items()}
        return " ".join(text.format(**shown).split())

    def evaluate(self, node, target: "Target", **facts: Any) -> CheckResult:
        """Run the check; `facts` (plan_dtype, opset) are passed on only to checks that take them."""
        wanted = self._fact_names
        if not wanted:  # most checks: no dict of facts to build, on every node of every pass
            return self.check(node, target, **self.params)
        return self.check(node, target, **self.params, **{k: v for k, v in facts.items() if k in wanted})

    @functools.cached_property
    def _fact_names(self) -> frozenset[str]:
        """The check's parameters beyond the node, the target and this rule's own `params`."""
        return frozenset(_parameter_names(self.check)[2:]) - set(self.params)


def describe_value(value: Any) -> str:
    """How a rule parameter reads in a rendered rule or a SUPPORTED_OPS page."""
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], (tuple, list)):
        return " or ".join(str(list(v)) for v in value)
    if isinstance(value, (tuple, list)):
        return "{" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) + "}"
    return str(value)


# Per check function, not per Rule: a target binds the same check in many rules (91 rules of 30
# checks on rk3588), and inspect.signature and inspect.cleandoc cost tens of microseconds a call,
# paid in each plan process by the rules its nodes meet.
@functools.lru_cache(maxsize=None)
def _parameter_names(check: Callable[..., CheckResult]) -> tuple[str, ...]:
    """The check's parameters in order, the node and the target first."""
    return tuple(inspect.signature(check).parameters)


@functools.lru_cache(maxsize=None)
def _cleaned_doc(check: Callable[..., CheckResult]) -> str:
    return inspect.cleandoc(check.__doc__ or check.__name__)


@dataclass(frozen=True)
class OpRule:
    """How one ONNX op type runs on the NPU of one target."""

    kernel: str
    rules: tuple[Rule, ...] = ()
    multi_core: bool = False


@dataclass(frozen=True)
class CpuFigures:
    """The CPU complex that runs the plan's CPU-fallback steps and host conversions, as the SoC
    datasheet gives it: the cores (a fallback step runs on one thread of the fastest cluster),
    that cluster's clock, the fp32 NEON multiply-accumulates one of its cores issues per cycle,
    and the bytes per second (read plus written) one thread streams from the DDR. `source` says
    which figures are published and which are assumed (docs/cost-model.md)."""

    cores: str
    clock_ghz: float
    fp32_macs_per_cycle: float
    thread_gb_per_second: float
    source: str


@dataclass(frozen=True)
class Performance:
    """The published figures the cost model (rkcompile/plan/cost_model.py) times steps with:
    marketed int8 TOPS over all NPU cores and the DDR's theoretical bandwidth, with where each
    figure comes from (docs/cost-model.md says which are assumed)."""

    int8_tops: float
    ddr_gb_per_second: float
    source: str
    cpu: CpuFigures


@dataclass(frozen=True)
class Target:
    """One SoC's NPU as the planner sees it: cores, C2 alignment per dtype, SRAM, the ops it
    runs and their rules, its kernels and multi-core kernels, and its performance figures."""

    name: str
    aliases: tuple[str, ...]
    npu_cores: int
    c2: Mapping[str, int | None]
    sram_bytes: int
    ops: Mapping[str, OpRule]
    common_rules: tuple[Rule, ...]
    kernels: frozenset[str] = frozenset()
    multi_core_kernels: frozenset[str] = frozenset()
    description: str = ""
    oplist_platform: str = ""
    performance: Performance | None = None
    #: Channel counts of a model input that an ungrouped Conv reads as it is, dense NHWC, rather
    #: than as C2-padded NC1HWC2 blocks: RKNN's native input layout for 1, 3 and 4 channels.
    #: rknn-toolkit2 2.5.0's internal memory shows it on rk3588, rk3576, rk3568 and rk3562 (a
    #: (1,C,64,64) float16 input into a Conv costs C x 8 KiB for C = 1, 3, 4 and the 8-channel
    #: 64 KiB for C = 2, 5); a grouped Conv or another reader gets a converting layer first.
    image_input_channels: frozenset[int] = frozenset({1, 3, 4})
    #: Whether an int8 plan may give an activation zero point 0. rknn-toolkit2 2.5.0 reads an
    #: int8 activation of a QDQ model whose zero point is 0 as symmetric ("zero_point are all
    #: zero, change qtype from 'asym' to 'sym'", its step made 128/127 of the file's) and its
    #: readers then compute on another scale than the file's: tv_mnasnet0_5's first convolution,
    #: on an input of zero point 0, came out 0.6% large (13% of its int8 outputs one step off
    #: onnxruntime on the same QDQ file); with that zero point 1, all 200704 were equal. So the
    #: plan moves such a grid to zero point -1 or 1 (`activation_params`), and the toolkit
    #: builds the plan the emulator runs.
    allows_activation_zero_point_0: bool = False
    #: Whether the toolkit builds an int8 attention: an int8 MatMul of two activations whose
    #: result a Softmax reads and whose Softmax a MatMul reads. rknn-toolkit2 2.5.0's librknnc
    #: crashes (signal 11) building such a QDQ model: yolo11n's C2PSA attention, and a 10-node
    #: Conv -> Split -> softmax(s * q^T k) -> v @ attn^T whatever its scales (all set to 0.01 it
    #: crashes too; with a Sigmoid for the Softmax it builds; disable_rules of its sdpa fusion
    #: moves the crash to a later pass). With the score MatMul in float16 (its hybrid
    #: quantization: exMatMul and exSoftmax13 in FLOAT16, the second exMatMul INT8) both build,
    #: so an int8 plan computes such scores in float16 (passes/quantize.py). An attention the
    #: plan fuses into one exSDPAttention step, written all float inside, crashes it as well
    #: (transformer_encoder; a fused 24-token, 4-head attention, tests/test_export.py); with its
    #: probabilities int8 (a QDQ pair on the Softmax output) it builds, so the plan quantizes
    #: those inside the step.
    builds_int8_attention_scores: bool = False

    def has_kernel(self, kernel: str) -> bool:
        """Whether the oplist names `kernel` (fused ones included, e.g. ConvolutionRelu) here."""
        return kernel in self.kernels

    def c2_for(self, dtype: str) -> int:
        value = self.c2.get(dtype)
        if value is None:
            raise ValueError(f"{self.name} has no NPU storage for dtype {dtype}")
        return value

    def supports_dtype(self, dtype: str) -> bool:
        return self.c2.get(dtype) is not None

    def rule_parameter(self, op: str, check: str, parameter: str) -> Any:
        """One parameter of one of `op`'s rules here (the K limit of MatMul's `matmul_depth`, say):
        the very number the rule checks, so a rewrite working to a limit never copies it. None when
        the target lacks the op or the rule."""
        op_rule = self.ops.get(op)
        rule = next((r for r in op_rule.rules if r.name == check), None) if op_rule else None
        return None if rule is None else rule.params.get(parameter)
