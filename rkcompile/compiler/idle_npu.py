"""A plan whose dtype leaves the NPU idle, or all but idle, is refused before anyone runs it."""
from __future__ import annotations

from rkcompile.errors import CompileError
from rkcompile.plan.schema import PlanRecord
from rkcompile.targets import get_target

#: The kernel every RKNPU2 is built around: a target whose Conv takes another dtype than the
#: plan's computes the plan's heavy steps on the CPU whatever else its NPU would take
CORE_KERNEL = "Conv"


def refuse_idle_npu(plan: PlanRecord) -> None:
    """Refuse a plan that puts nothing on the NPU because the NPU's kernels do not compute in the
    plan's dtype (a float16 plan on an SoC whose convolutions take int8 only, say rv1106: oplist
    V2.3.2 data-type constraint T1), naming the dtypes the SoC runs (issue 17: rknn-toolkit2 refuses
    these too); and one whose dtype the target's convolutions do not compute in, whatever the
    model (rv1106 and rv1103 at float16 put an activation or two on the NPU and the rest on the
    CPU: rknn-toolkit2 builds only int8 models for them, as for rv1106b). Reading the target's
    own plan_dtype rules keeps this free of SoC names."""
    target = get_target(plan.target)
    convolution = target.rule_parameter(CORE_KERNEL, "plan_dtype", "dtypes")
    if convolution and plan.dtype not in convolution and any(target.supports_dtype(d) for d in convolution):
        runs = " and ".join(sorted(convolution))
        npu = sum(n.device == "npu" for n in plan.nodes)
        raise CompileError(f"{target.name}'s NPU runs {CORE_KERNEL} in {runs} only, so a {plan.dtype} plan "
                           f"runs on the CPU ({npu} of {sum(n.device in ('npu', 'cpu') for n in plan.nodes)} ops "
                           f"on the NPU): use --dtype {sorted(convolution)[0]}")
    placed = [n for n in plan.nodes if n.device in ("npu", "cpu")]
    if not placed or any(n.device == "npu" for n in placed):
        return
    refused = {n.op: target.rule_parameter(n.op, "plan_dtype", "dtypes") for n in placed}
    refused = {op: dtypes for op, dtypes in refused.items() if dtypes and plan.dtype not in dtypes}
    dtypes = {dtype for allowed in refused.values() for dtype in allowed if target.supports_dtype(dtype)}
    if dtypes:
        ops = sorted(refused)
        runs = " and ".join(sorted(dtypes))
        raise CompileError(f"{target.name}'s NPU runs {', '.join(ops)} in {runs} only, so a {plan.dtype} plan "
                           f"puts nothing on it: use --dtype {sorted(dtypes)[0]}")
