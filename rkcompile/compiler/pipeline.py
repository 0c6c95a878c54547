"""The pass pipeline, read top to bottom, and the plan assembled from what the passes recorded."""
from __future__ import annotations

import dataclasses
import logging
import time
import types
from itertools import chain
from pathlib import Path
from typing import Sequence

import onnx
import onnx_graphsurgeon as gs

from rkcompile.errors import CompileError
from rkcompile.compiler.context import CompileContext, Placement
from rkcompile.options import CHOOSE, INT8_SETTINGS, Options
from rkcompile.compiler.cost_estimate import node_macs
from rkcompile.onnx_backends import cpu_backend
from rkcompile.ir.graph import (fused_body, node_inputs, present_inputs, static_shape, subgraphs,
    topological_nodes)
from rkcompile.ir.describe import describe
from rkcompile.ir.nodes import plain_node
from rkcompile.passes import (alias, assign, boundaries, epilogues, fold_constants, fuse, import_model, layout,
    legalize, memory, multicore, partition, remove_noops, rewrite, rewrite_late, simplify_layout)
from rkcompile.plan.schema import QUANTIZED_DTYPES, NodeEntry, Partition, PlanRecord, Step
from rkcompile.targets import get_target

log = logging.getLogger("rkcompile")


class _QuantizePass:
    """passes/quantize.py, imported by the plans that quantize: for any other dtype its run only
    leaves `ctx.quantization` empty, which this does without importing it and the int8 modules
    it brings (rkcompile/quantization/params.py, passes/int8_accuracy.py: 4-8 ms of a 0.4 s plan process)."""

    NAME = "quantize"
    NEEDS = frozenset({"calibration", "calibration_samples", "graph", "kept_draws", "model_info", "options", "order",
                       "placement", "runtime", "target", "tensors"})
    # the graph: bias copies and corrections, float16 islands' relabelled conversions
    PROVIDES = frozenset({"calibration", "calibration_samples", "graph", "int8_techniques", "kept_draws", "options",
                          "placement", "quantization", "reference_constants", "tensors"})

    @staticmethod
    def run(ctx: CompileContext) -> None:
        if ctx.options.dtype not in QUANTIZED_DTYPES:
            ctx.quantization = {}
            return
        from rkcompile.passes import quantize

        quantize.run(ctx)


PASSES = (
    import_model,    # load, validate, infer shapes
    fold_constants,  # evaluate what is already known
    remove_noops,    # Identity, Dropout, a Cast to the type it already has
    simplify_layout.EARLY,  # the exporter's Transposes/relabels moved through element-wise ops until they cancel
    rewrite,         # nodes the NPU cannot run -> equivalent nodes it can
    epilogues,       # element-wise work after a relabelled Conv output moved next to the Conv
    legalize,        # every rule every node breaks
    fuse,            # chains the NPU runs as one kernel, per the fusion table
    rewrite_late,    # legalizing rewrites that would have hidden a fusion pattern
    simplify_layout.LATE,  # the same for the relabels the rewrites wrapped around Convs, through fused kernels
    assign,          # NPU, or CPU with a reason
    partition,       # convex single-device partitions, execution order
    boundaries,      # host steps converting tensors that cross devices
    layout,          # dtype, NC1HWC2/NCHW, bytes, region per tensor
    _QuantizePass,   # int8 plans: calibrated scale/zero point per tensor, int32 biases
    alias,           # relabels that move no stored byte: their outputs become views, not steps
    memory,          # arena offsets, lower bound
    multicore,       # batch contexts or core-mask splits, per-core timeline, cost estimate
)
PASS_NAMES = tuple(p.NAME for p in PASSES)
#: Where the back half starts: the passes an int8 plan's choices (its settings, its float16
#: steps) change are quantize and every one after it; the front half before it runs once
QUANTIZE_AT = PASS_NAMES.index("quantize")
#: the CompileContext fields a caller sets before the first pass (the int8 calibration, its
#: samples and kept positions optionally: an --auto-float16 Planner reuses them); every other field a pass NEEDS,
#: a pass before it PROVIDES (tests/test_pipeline_contracts.py). The graph is a field like the
#: others: the import pass provides it, and a pass that changes it lists it in its PROVIDES.
CONTEXT_INPUTS = frozenset({"model_path", "target", "options", "calibration", "calibration_samples", "kept_draws",
                            "runtime"})
#: the fields `check_contract` watches
CONTEXT_FIELDS = tuple(f.name for f in dataclasses.fields(CompileContext))


def compile_model(model_path: str | Path, target: str, options: Options | None = None, *,
                  cpu_backends: bool = True, runtime=None, choose_int8: bool = False) -> tuple[PlanRecord, CompileContext]:
    """The plan and its compile context. `cpu_backends=False` leaves every step's `cpu_backend`
    unset (see `assemble_plan`), for a plan that is neither written nor run (an int8 plan whose
    settings are chosen decides them: its candidates run). `runtime`: what an int8 plan
    calibrates and judges its candidates on (rkcompile/compiler/context.py; rkcompile.api passes
    the emulator's). The front half runs once; with `choose_int8` (rkcompile.compile and the
    command line), an int8 plan that leaves a setting to choose or asks --auto-float16 then goes
    through that stage (rkcompile/compiler/int8_choice.py), which plans candidates from there;
    every other plan runs the back half once (int8 settings left to choose at their preferred
    values: passes/quantize.py). The plan's int8 warnings are logged here, once: the quantize
    pass only records them, once per candidate. With --val (`Options.validation`), the plan is
    then judged on those inputs (rkcompile/compiler/validation.py), and --auto-float16 meets its
    target on them."""
    options = options or Options()
    choosing = _chooses_int8(options) and choose_int8
    ctx = front_half(model_path, target, options, runtime)
    validation = _validation_samples(ctx)
    if choosing:
        from rkcompile.compiler.int8_choice import int8_stage  # int8 plans only

        record, ctx = int8_stage(ctx, finish_plan, validation)
    else:
        run_passes(ctx, PASSES[QUANTIZE_AT:])
        record = assemble_plan(ctx, cpu_backends)
    if validation is not None:
        from rkcompile.compiler.validation import validated

        record = validated(record, ctx, validation)
    for quant in record.quantization.values():
        if quant.warning:
            log.warning("int8: %s", quant.warning)
    return record, ctx


def _validation_samples(ctx: CompileContext) -> list | None:
    """The --val inputs of an int8 plan, read before it calibrates (a bad path fails at once);
    None without --val, which only an int8 plan takes."""
    if ctx.options.validation is None:
        return None
    if ctx.options.dtype not in QUANTIZED_DTYPES:
        raise CompileError("--val judges an int8 plan on inputs it was not calibrated on; add --dtype int8")
    from rkcompile.quantization.params import validation_samples

    return validation_samples(ctx.options, ctx.model_info.inputs)


def front_half(model_path: str | Path, target: str, options: Options, runtime=None) -> CompileContext:
    """The context after the passes before quantize, which every plan of the model with these
    options shares, whatever its int8 settings and float16 steps."""
    ctx = CompileContext(model_path=Path(model_path), target=get_target(target), options=options, runtime=runtime)
    run_passes(ctx, PASSES[:QUANTIZE_AT])
    return ctx


def finish_plan(ctx: CompileContext) -> PlanRecord:
    """The back half on `ctx`, a context after the front half, and its plan: each int8 candidate's."""
    run_passes(ctx, PASSES[QUANTIZE_AT:])
    return assemble_plan(ctx)


def _chooses_int8(options: Options) -> bool:
    """Whether the plan goes through the int8 choice stage: an int8 plan that leaves a setting
    to choose, or asks --auto-float16 (only of an int8 plan, for a cosine in (0, 1])."""
    if options.auto_float16 is not None:
        if options.dtype != "int8":
            raise CompileError("--auto-float16 chooses float16 steps of an int8 plan; add --dtype int8")
        if not 0 < options.auto_float16 <= 1:
            raise CompileError(f"--auto-float16 {options.auto_float16}: a cosine in (0, 1]")
        return True
    return options.dtype == "int8" and any(getattr(options, name) == CHOOSE for name in INT8_SETTINGS)


class PassInstrument:
    """What the pass manager calls around every pass, as MLIR's PassInstrumentation: `before`
    gives the context the pass is handed (the one it was given, or a stand-in watching it),
    `after` sees the context once the pass has run. `instruments` picks them from the Options."""

    def before(self, compiler_pass, ctx: CompileContext) -> CompileContext:
        return ctx

    def after(self, compiler_pass, ctx: CompileContext) -> None:
        pass


class ContractCheck(PassInstrument):
    """Options.verify_passes: after each pass, the graph invariants (`verify`) and the pass's
    contract: it changed no field (the graph included) its PROVIDES leaves out
    (`check_contract`) and read none its NEEDS and PROVIDES leave out (the pass is handed a
    `_ReadRecorder`). Raises AssertionError naming the pass."""

    def __init__(self):
        self.records: dict[str, tuple] = {}
        self.recorder: _ReadRecorder | None = None

    def before(self, compiler_pass, ctx: CompileContext) -> CompileContext:
        self.records = context_records(ctx)
        self.recorder = _ReadRecorder(ctx)
        return self.recorder

    def after(self, compiler_pass, ctx: CompileContext) -> None:
        problems = verify(ctx) + check_contract(compiler_pass, self.records, context_records(ctx))
        problems += check_reads(compiler_pass, self.recorder.reads)
        if problems:
            raise AssertionError(f"after pass {compiler_pass.NAME}: " + "; ".join(problems[:5]))


class GraphDump(PassInstrument):
    """Options.dump_after: the graph as ONNX after each pass named there (`dump_graph`)."""

    def after(self, compiler_pass, ctx: CompileContext) -> None:
        if compiler_pass.NAME in ctx.options.dump_after:
            dump_graph(ctx, compiler_pass.NAME)


class PassTimer(PassInstrument):
    """Each pass's time and the graph's size after it, logged at debug level (`-v`)."""

    def __init__(self):
        self.started = 0.0

    def before(self, compiler_pass, ctx: CompileContext) -> CompileContext:
        self.started = time.perf_counter()
        return ctx

    def after(self, compiler_pass, ctx: CompileContext) -> None:
        log.debug("pass %s: %.1f ms, %d nodes", compiler_pass.NAME, (time.perf_counter() - self.started) * 1e3,
                  len(ctx.graph.nodes))


def instruments(options: Options) -> list[PassInstrument]:
    """The instruments `options` ask for: the contract check with verify_passes, the graph dump
    with dump_after, the timer when debug logging is on."""
    chosen: list[PassInstrument] = []
    if options.verify_passes:
        chosen.append(ContractCheck())
    if options.dump_after:
        chosen.append(GraphDump())
    if log.isEnabledFor(logging.DEBUG):  # last: its before runs last and its after first, timing the pass alone
        chosen.append(PassTimer())
    return chosen


def run_passes(ctx: CompileContext, passes: Sequence = PASSES) -> None:
    """`passes` in order on `ctx` (a slice of PASSES: --auto-float16 plans the passes before
    quantize once and the rest once per candidate), with the instruments its options ask for."""
    chosen = instruments(ctx.options)
    for compiler_pass in passes:
        handed = ctx
        for instrument in chosen:
            handed = instrument.before(compiler_pass, handed)
        compiler_pass.run(handed)
        for instrument in reversed(chosen):
            instrument.after(compiler_pass, ctx)


class _ReadRecorder:
    """A CompileContext as a pass sees it under ContractCheck: it records the name of every
    field read and hands on the field; its methods run on the recorder, so what they read
    counts too. Setting a field sets the context's."""

    def __init__(self, ctx: CompileContext):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "reads", set())

    def __getattr__(self, name: str):
        method = getattr(type(self._ctx), name, None)
        if isinstance(method, types.FunctionType):
            return types.MethodType(method, self)
        self.reads.add(name)
        return getattr(self._ctx, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._ctx, name, value)


def context_records(ctx: CompileContext) -> dict[str, tuple]:
    """Each CompileContext field as `check_contract` compares it: the value, and the keys and
    values of a dict or the items of a list (so changes in place count); the graph as
    `graph_record` gives it."""
    records = {}
    for name in CONTEXT_FIELDS:
        value = getattr(ctx, name)
        if name == "graph":
            records[name] = graph_record(value)
            continue
        held = (tuple(chain.from_iterable(value.items())) if isinstance(value, dict)
                else tuple(value) if isinstance(value, list) else ())
        records[name] = (value, *held)
    return records


def graph_record(graph: gs.Graph | None) -> tuple:
    """The objects `graph` is made of, in order: its node, input and output lists and what they
    hold, and each node's op, name, attribute dict, input and output lists and their tensors,
    and each variable's dtype and shape. A pass that adds, removes, reorders, renames or relinks
    a node, or gives a tensor another dtype or shape, changes one of them (a value inside an
    attribute dict or a constant's array is not looked at)."""
    if graph is None:
        return (None,)
    record = [graph, graph.nodes, *graph.nodes, graph.inputs, *graph.inputs, graph.outputs, *graph.outputs]
    variables = {}
    for node in graph.nodes:
        record += (node.op, node.name, node.attrs, node.inputs, *node.inputs, node.outputs, *node.outputs)
        variables.update((id(t), t) for t in (*node.inputs, *node.outputs) if isinstance(t, gs.Variable))
    for tensor in variables.values():
        record += (tensor.dtype, tensor.shape)
    return tuple(record)


def check_contract(compiler_pass, before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """The fields `compiler_pass` changed (replaced, or a dict, list or graph holding other
    objects, compared by identity) without listing them in its PROVIDES."""
    return [f"pass {compiler_pass.NAME} changed ctx.{name}, which its PROVIDES does not list"
            for name, record in after.items() if name not in compiler_pass.PROVIDES
            and (len(record) != len(before[name]) or any(a is not b for a, b in zip(record, before[name])))]


def check_reads(compiler_pass, reads: set[str]) -> list[str]:
    """The fields `compiler_pass` read without listing them in its NEEDS or PROVIDES."""
    return [f"pass {compiler_pass.NAME} read ctx.{name}, which its NEEDS does not list"
            for name in sorted(reads - compiler_pass.NEEDS - compiler_pass.PROVIDES)]


def verify(ctx: CompileContext) -> list[str]:
    """Graph invariants every pass must keep: unique names, consistent edges, no cycle, and
    known shapes for every node placed on the NPU. Checked after every pass when
    `Options.verify_passes` is on (tests, debugging), as torch.fx's run_checks_after_each_pass:
    it costs about a tenth of a plan, and a plan's own contract (`plan.contract_violations`,
    `allocation.verify_allocation`) is checked wherever a plan is used anyway."""
    graph = ctx.graph
    problems = []
    names = [node.name for node in graph.nodes]
    if len(set(names)) != len(names):
        problems.append("duplicate node names")
    defined = {t.name for t in graph.inputs}
    for node in graph.nodes:
        for tensor in node.outputs:
            if not tensor.name:  # an omitted optional output: ONNX's '' placeholder, not a tensor
                continue
            if tensor.name in defined:
                problems.append(f"tensor {tensor.name} produced twice")
            defined.add(tensor.name)
            if not any(producer is node for producer in tensor.inputs):
                problems.append(f"tensor {tensor.name} does not know its producer {node.name}")
    consumers: dict[int, set[int]] = {}  # per tensor, built once: a weight may feed thousands of nodes
    for node in graph.nodes:
        for tensor in node_inputs(node):
            if not isinstance(tensor, gs.Constant) and tensor.name not in defined:
                problems.append(f"node {node.name} reads undefined tensor {tensor.name}")
        for tensor in present_inputs(node):
            known = consumers.get(id(tensor))
            if known is None:
                known = consumers[id(tensor)] = {id(consumer) for consumer in tensor.outputs}
            if id(node) not in known:
                problems.append(f"tensor {tensor.name} does not know its consumer {node.name}")
    problems += stray_links(graph)
    problems += [problem for node in graph.nodes if node.attrs for problem in fused_body_reads_outside(node)]
    try:
        topological_nodes(graph)
    except ValueError as exc:
        problems.append(str(exc))
    by_name = {node.name: node for node in graph.nodes}
    for name, placed in ctx.placement.items():
        if placed.device != "npu":
            continue
        node = by_name.get(name)
        if node is None:
            problems.append(f"placement for missing node {name}")
        elif any(static_shape(t) is None for t in node.outputs):
            problems.append(f"NPU node {name} has an unknown output shape")
    return problems


def fused_body_reads_outside(node: gs.Node) -> list[str]:
    """Members of the fused kernel `node` (nested ones too) that list, among their inputs, a
    tensor that is none of the body's inputs, its members' results or a constant. passes/fuse.py
    builds bodies that read nothing else, and `nodes.outer_scope_reads` relies on it: it looks
    for outer-scope reads only in members carrying subgraphs of their own."""
    body = fused_body(node)
    if body is None:
        return []
    local = {t.name for t in body.inputs} | {t.name for member in body.nodes for t in member.outputs}
    problems = [f"fused node {node.name}: member {member.name} reads {tensor.name} from outside its body"
                for member in body.nodes for tensor in present_inputs(member)
                if tensor.name not in local and not isinstance(tensor, gs.Constant)]
    return problems + [problem for member in body.nodes if member.attrs for problem in fused_body_reads_outside(member)]


def stray_links(graph: gs.Graph) -> list[str]:
    """Tensors of `graph` that name, as producer or reader, a node that is neither in the graph
    nor inside a subgraph of one of its nodes: a node a pass built and then abandoned without
    detaching it. Every later pass that walks a tensor's readers would meet a node it does not
    know."""
    known = set(map(id, graph.nodes))
    pending = [inner for node in graph.nodes if node.attrs for sub in subgraphs(node) for inner in sub.nodes]
    while pending:
        node = pending.pop()
        known.add(id(node))
        pending.extend(inner for sub in subgraphs(node) for inner in sub.nodes)
    tensors = {id(t): t for t in graph.inputs}
    for node in graph.nodes:
        tensors.update((id(t), t) for t in (*node.inputs, *node.outputs))
    problems = []
    for tensor in tensors.values():
        for role, linked in (("written", tensor.inputs), ("read", tensor.outputs)):
            if known.issuperset(map(id, linked)):  # the common case, checked without a Python loop
                continue
            stray = next(node for node in linked if id(node) not in known)
            problems.append(f"tensor {tensor.name} is {role} by {stray.name or stray.op}, which is not in the graph")
    return problems


def dump_graph(ctx: CompileContext, pass_name: str) -> Path:
    path = ctx.options.dump_dir / f"{ctx.model_path.stem}.after-{pass_name}.onnx"
    model = gs.export_onnx(ctx.graph, do_type_check=False)
    path.parent.mkdir(parents=True, exist_ok=True)  # created on the first dump, as other outputs' folders
    onnx.save(model, str(path))
    return path


def assemble_plan(ctx: CompileContext, cpu_backends: bool = True) -> PlanRecord:
    """The plan of the passes' results. Each CPU step's `cpu_backend` is decided by asking
    onnxruntime for a session on the node (`onnx_backends.cpu_backend`): importing
    onnxruntime alone takes about 20 ms. With `cpu_backends=False` it stays None, as in a plan
    written before the field existed, which the emulator decides when it runs the step: for a
    plan only summarized (`rkcompile plan` writing no file), which never reads it."""
    step_of = {name: index for index, name in enumerate(ctx.order)}
    partition_of = {name: pid for pid, (_, members) in enumerate(ctx.partitions) for name in members}
    nodes = {node.name: node for node in ctx.graph.nodes}
    weights = {name for name, tensor in ctx.tensors.items() if tensor.region == "weight"}
    opsets = ctx.model_info.opsets
    steps = []
    for index, name in enumerate(ctx.order):
        node, placed = nodes[name], ctx.placement[name]
        steps.append(Step(
            id=index, device=placed.device, kernel=placed.kernel, nodes=ctx.origins[name],
            inputs=tuple(t.name for t in node_inputs(node)),
            outputs=tuple(t.name for t in node.outputs if t.name),
            cores=ctx.step_cores.get(name, ()), partition=partition_of[name],
            note=ctx.notes.get(name),
            macs=node_macs(node) if placed.device != "host" else 0,
            operation=describe(node, weights),
            cpu_backend=cpu_backend(plain_node(node), opsets) if cpu_backends and placed.device == "cpu" else None,
        ))
    runs_in = {original: name for name in ctx.order for original in ctx.origins[name]}
    entries = []
    for original, op in ctx.original_nodes:
        if original in runs_in:
            current = runs_in[original]
            placed = ctx.placement[current]
            entries.append(NodeEntry(original, op, placed.device, step_of[current],
                                     _reason(op, placed, ctx.target.name),
                                     tuple(str(failure) for failure in ctx.failures.get(current, ()))))
        else:
            fate, reason = ctx.fates[original]
            entries.append(NodeEntry(original, op, fate, None, reason))
    partitions = tuple(Partition(pid, device, tuple(step_of[n] for n in members))
                       for pid, (device, members) in enumerate(ctx.partitions))
    return PlanRecord(
        target=ctx.target.name, dtype=ctx.options.dtype, batch=ctx.options.batch, model=ctx.model_info,
        nodes=tuple(entries), steps=tuple(steps), tensors=dict(ctx.tensors), partitions=partitions,
        memory=ctx.memory, multicore=ctx.multicore,
        rewrites=tuple(ctx.rewrites), quantization=dict(ctx.quantization),
        int8_techniques=tuple(ctx.int8_techniques),
    )


def _reason(op: str, placed: Placement, target: str) -> str | None:
    """A placement's reason as the plan states it: naming the original op and the target, and
    the kernel the op ran as when a rewrite or fusion changed it."""
    if placed.reason is None:
        return None
    runs_as = f" (runs as {placed.kernel})" if placed.kernel != op else ""
    return f"{op} on {target}{runs_as}: {placed.reason}"
