"""A plan whose dtype leaves the NPU idle is refused before anyone runs it."""
from __future__ import annotations

from rkcompile.errors import CompileError
from rkcompile.plan.schema import Plan
from rkcompile.targets import get_target


def refuse_idle_npu(plan: Plan) -> None:
    """Refuse a plan that puts nothing on the NPU because the NPU's kernels do not compute in the
    plan's dtype (a float16 plan on an SoC whose convolutions take int8 only, say rv1106: oplist
    V2.3.2 data-type constraint T1), naming the dtypes the SoC runs (issue 17: rknn-toolkit2 refuses
    these too). Reading the target's own plan_dtype rules keeps this free of SoC names."""
    target = get_target(plan.target)
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
