"""Simplify layout: fewer Reshape and Transpose steps, by moving each through the ops that do
not care how a tensor is laid out until it meets, and merges with, another of its kind.

Exporters and the rewrite pass leave layout ops on both sides of element-wise work: a MatMul run
as a 1x1 Conv is wrapped in relabels to and from the Conv's [L, C, 1, 1] layout, so a GELU
between two such Convs runs between a relabel out of that layout and one back into it. An
element-wise op computes the same values in any layout when all its operands are laid out
alike, so the relabel before it can go after it, where it meets the next relabel: the two
become one, or none when they are inverse. The pass runs after fusion and the late rewrites
on the recognised kernels (exGelu, exSwish, HardSwish, ...: their members are element-wise
too), and then joins the kernels that became adjacent (fusion_table.KERNEL_FUSIONS); it runs
before the rewrites as well (`EARLY`), on the exporter's own Transposes.

Each rule is exact: every value is computed by the same arithmetic on the same operands, only
stored in another order. A rule applies only when every node it leaves passes the target's
rules that the nodes it replaces passed, and it always leaves fewer nodes, or moves a relabel or
Transpose down past work into the matrix multiply that takes it in, or leaves one relabel fewer
that moves stored bytes, so the pass ends.

- `move_layout_down`: a relabel or Transpose (with any others doing the same move to the other
  operands) leaves the graph, and the region below it, of element-wise ops, and Splits and
  Softmaxes along an axis the move keeps whole, runs on the layout before the move; each
  relabel or Transpose reading the region takes the move into its own (one node for two, none
  when they cancel). A Transpose also passes ops that work along named axes (Pad, Reduce*
  keeping their axes: the axes are renamed) and element-wise ops broadcasting an operand of
  its rank that the same Transpose made, directly or through element-wise ops of constants
  (tf2onnx's squeeze-and-excite in NHWC). A
  Transpose to channels-last also passes the ops that work on the channels it moved last
  (`CHANNEL_OPS`): a LayerNormalization over them becomes the same normalization over the
  channel axis, written out as ReduceMean arithmetic (LayerNormalization normalizes trailing
  axes only; the fusion table's exNorm reads the arithmetic), and a MatMul by constant weights
  a 1x1 Conv. torch's ConvNeXt and timm's blocks permute to channels-last around exactly this
  work; SegFormer's decode head turns a flattened feature map [N, C, H*W] into tokens
  [N, H*W, C] around a linear layer, which then runs as a 1x1 Conv on [N, C, 1, H*W]. A
  Gather of constant indices along one axis, keeping its extent (rotary embedding's
  rotate-half), passes too, re-indexed. After fusion, a region may also end in a matrix
  multiply of two computed tensors (exSDPAttention, exMatMul, MatMul), directly or through ops
  that only select elements, when that kernel can read its operand through the move: the move
  is made again in front of it, and `attention_operands`/`matmul_operands` take it in (the
  head split of q and k before rotary embedding, in HF llama, then costs no step).
- `move_relabel_up`: a relabel after an element-wise op whose operands are relabels read by it
  alone is made on the operands instead (one relabel for two); an operand that broadcasts
  follows when the relabel only adds or removes axes of extent 1.
- `relabels_above_split`: relabels of more than half the outputs of a Split, whose input a
  relabel read by it alone makes, are made once with that relabel: the Split cuts the
  relabelled tensor, and its other outputs are relabelled back below it (timm's
  cross-covariance attention: q and k relabelled to [C, L, 1, 1] after the q/k/v unbinding).
- `transpose_with_unit_relabel`: a relabel moving only axes of extent 1, beside a Transpose, is
  one Transpose with it.
- `transposes_across_relabel`: two Transposes with a relabel between them that only merges
  axes, or only cuts them, are one Transpose (after a relabel cutting the first's input, or
  before one to the second's result): the second moves the merged axes whole, or each cut
  axis' pieces (maxvit's grid partition and its reverse).
- `transpose_beside_relabel`, after the rewrites: a relabel cutting axes and the Transpose
  reading it, or a Transpose and the relabel merging what it put together, are the Transpose on
  the other side of a relabel that moves no stored byte (an alias), when the target takes that
  Transpose whole: one data movement between a 1x1 Conv's tokens [L, C, 1, 1] and a feature
  map [1, C, H, W] instead of two.
- `slices_as_split`: Slices of one tensor along one axis, covering it once, are one Split.
- `identity_layout`: a Transpose keeping every axis in place, or a relabel to the shape it
  reads, is no node.
- `shared_layout`: relabels or Transposes of one tensor making the same result are one node.
- `attention_operands` and `matmul_operands`, after the kernel fusions: the head split and
  q/k/v split before an exSDPAttention or a matrix multiply of two computed tensors, and the
  head merge after it, become members of the kernel, which reads its operands from the
  projections and writes its result in the next projection's layout, where each is then a
  strided view read as whole rows of the channels the kernel reads together (grouped-query
  attention's repeated key and value heads read each head again). The members only choose
  where elements are read and written; the emulator runs them.
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext, Failure, RewriteAttempt
from rkcompile.ir.edits import detach, replace_uses, set_input, set_output, unlinked_node
from rkcompile.ir.graph import (constant_value, element_count, fused_body, is_onnx_domain, static_shape,
    topological_nodes, unique_name)
from rkcompile.ir.nodes import itemsize
from rkcompile.ir.patterns import matches
from rkcompile.numerics.nc1hwc2 import as_nchw, nc1hwc2_bytes, stored_positions
from rkcompile.plan.schema import FUSED_DOMAIN, Rewrite

from rkcompile.passes.fold_constants import evaluate_on
from rkcompile.passes.fuse import body_graph, fuse_table
from rkcompile.passes.fusion_table import KERNEL_FUSIONS, layer_norm_core, rms_norm_core
from rkcompile.passes.legalize import check_node, compile_facts
from rkcompile.passes.rewrites.base import RESHAPE_LIKE


class SimplifyLayout:
    """The pass at one place in the pipeline (rkcompile/compiler/pipeline.py): before the
    rewrites, on the exporter's own Transposes and relabels, before the rewrite pass cuts a
    Transpose into legal views; and after fusion, on the relabels the rewrites wrapped around
    Convs, through the recognised kernels, then joining the kernels that became adjacent."""

    def __init__(self, name: str, fused: bool):
        self.NAME, self.fused = name, fused
        #: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
        self.NEEDS = frozenset({"graph", "options", "origins", "target"}
                               | ({"failures", "notes", "original_nodes"} if fused else set()))
        self.PROVIDES = frozenset({"failures", "fates", "graph", "origins", "rewrite_attempts", "rewrites"}
                                  | ({"notes"} if fused else set()))

    def run(self, ctx: CompileContext) -> None:
        if _Simplifier(ctx, self.fused, RULES).run() and self.fused:
            # A Conv and the activation a relabel pair kept apart may now be one kernel.
            fuse_table(ctx, KERNEL_FUSIONS)
        if self.fused:
            # after the kernel fusions, so an exMatMul takes its MatMul and the Add after it
            # first, and after every move into a kernel (move_layout_down), so each kernel
            # takes in the whole of what its operands are read through
            _Simplifier(ctx, self.fused, (attention_operands, matmul_operands)).run()


EARLY = SimplifyLayout("simplify-layout-early", fused=False)
LATE = SimplifyLayout("simplify-layout", fused=True)

#: ONNX ops whose every output element is computed from the elements at the same position of
#: their operands (after broadcasting), whatever the shape: they commute with any relabel or
#: Transpose applied to every operand alike.
ELEMENTWISE_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Clip", "Cos", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu",
    "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "Max", "Min", "Mish", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu",
    "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Sub", "Tanh", "Where", "Xor",
})
LAYOUT_OPS = RESHAPE_LIKE | {"Transpose"}
#: what the plan says of an original node a rule took out, with nothing left carrying it
REMOVED_BECAUSE = {
    "identity_layout": "it moves no element",
    "move_layout_down": "its move is made, or undone, by the relabel or Transpose after it",
    "transpose_with_unit_relabel": "one Transpose makes its move and the relabel's of unit axes",
    "transposes_across_relabel": "one Transpose makes its move and the other Transpose's, across the relabel between them",
    "move_relabel_up": "the relabel is made once, on the operands of the element-wise op it was next to",
    "slices_as_split": "one Split cuts the tensor it sliced",
    "relabels_above_split": "one relabel before the Split makes its relabel and that of the Split's outputs",
    "attention_operands": "the attention kernel reads or writes its operand in that layout",
    "matmul_operands": "the matrix multiply reads or writes its operand in that layout",
    "shared_layout": "another node lays out the same tensor the same way",
}


# --- what a layout op does ------------------------------------------------------------------


def layout_move(node: gs.Node) -> tuple[gs.Tensor, gs.Tensor, tuple[int, ...] | None] | None:
    """(source, result, perm) of a relabel (perm None) or Transpose of known shapes, else None."""
    if not is_onnx_domain(node) or node.op not in LAYOUT_OPS or not node.inputs or len(node.outputs) != 1:
        return None
    source, result = node.inputs[0], node.outputs[0]
    shape = static_shape(source)
    if shape is None or static_shape(result) is None:
        return None
    if node.op != "Transpose":
        return source, result, None
    return source, result, tuple(int(p) for p in node.attrs.get("perm", range(len(shape) - 1, -1, -1)))


def unmoved_axis(old: tuple[int, ...], new: tuple[int, ...], axis: int, perm) -> int | None:
    """The axis of the unmoved layout `new` holding what `axis` holds in the moved layout `old`:
    the Transpose's own axis, or for a relabel an axis of the same extent after the same
    number of elements (so each slice along it is the same block of elements); None if none."""
    if perm is not None:
        return perm[axis]
    before = element_count(old[:axis])
    return next((a for a in range(len(new)) if new[a] == old[axis] and element_count(new[:a]) == before), None)


# --- the pass ---------------------------------------------------------------------------------


class _Simplifier:
    """One run of the rules over a graph, with the records a replacement keeps current."""

    def __init__(self, ctx: CompileContext, fused: bool, rules: tuple):
        self.ctx, self.facts, self.rules = ctx, compile_facts(ctx), rules
        #: after fusion: the fuse pass's notes name nodes, which a removed node takes with it
        self.fused = fused
        self.graph_outputs = {t.name for t in ctx.graph.outputs}
        self.carriers = Counter(o for names in ctx.origins.values() for o in names)
        self.declined: dict[str, dict[str, str]] = {}  # layout node -> {rule: why} when each last declined
        self.taken = {n.name for n in ctx.graph.nodes} | set(ctx.graph.tensors())
        #: the nodes the rules took out of the graph, by id; held, so no new node takes an id of theirs
        self.removed: dict[int, gs.Node] = {}

    def run(self) -> bool:
        """Apply the rules to every node until none applies; whether any did."""
        progress, rounds = True, 0
        while progress:
            progress = False
            for node in topological_nodes(self.ctx.graph):
                if id(node) in self.removed:
                    continue  # replaced earlier in this round; its replacements wait for the next
                for rule in self.rules:
                    outcome = rule(node, self)
                    if outcome is True:
                        progress = True
                        break
                    if outcome is not None:
                        self.declined.setdefault(node.name, {})[rule.__name__] = outcome
            rounds += 1
        for name, reasons in self.declined.items():
            for rule, why in reasons.items():
                self.record_attempt(name, rule, f"declined: {why}")
        if rounds > 1:
            self.ctx.graph.nodes = [n for n in self.ctx.graph.nodes if id(n) not in self.removed]
        return rounds > 1

    # bookkeeping shared by the rules

    def fresh(self, base: str) -> str:
        name = unique_name(base, self.taken)
        self.taken.add(name)
        return name

    def failures(self, node: gs.Node) -> list[Failure]:
        if node.domain == FUSED_DOMAIN:  # only the common rules apply: the fusion checked the rest
            return [Failure(rule.describe(), detail) for rule in self.ctx.target.common_rules
                    for ok, detail in [rule.evaluate(node, self.ctx.target, **self.facts)] if not ok]
        return check_node(node, self.ctx.target, **self.facts)

    def stored_bytes(self, shape) -> float:
        """The bytes an NPU tensor of `shape` takes in NC1HWC2 (infinite above rank 4)."""
        if len(shape) > 4:
            return float("inf")
        dtype = self.ctx.options.dtype
        return nc1hwc2_bytes(as_nchw(tuple(shape)), self.ctx.target.c2_for(dtype), itemsize(dtype))

    def record_attempt(self, name: str, rule: str, outcome: str) -> None:
        for original in self.ctx.origins.get(name, (name,)):
            self.ctx.rewrite_attempts.setdefault(original, []).append(RewriteAttempt(name, rule, outcome))

    def replace(self, rule: str, old: list[gs.Node], new: list[gs.Node]) -> None:
        """`old` (detached already) leave the graph for `new` (placed where the first of `old`
        stood), which carry the origins of the old."""
        ctx = self.ctx
        origins = tuple(dict.fromkeys(o for n in old for o in ctx.origins.get(n.name, (n.name,))))
        for node in old:
            self.removed[id(node)] = node
            self.carriers.subtract(ctx.origins.pop(node.name, (node.name,)))
            self.forget(node.name)
        for node in new:
            ctx.origins[node.name] = origins
            ctx.failures[node.name] = self.failures(node)
            self.carriers.update(origins)
        self.release(origins, rule)
        position = next(i for i, n in enumerate(ctx.graph.nodes) if n is old[0])
        ctx.graph.nodes[position:position] = new
        ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=tuple(n.name for n in new),
                                    ops=tuple(n.op for n in new)))
        for name in {n.name for n in new} | {n.name for n in old}:
            self.declined.pop(name, None)
        for node in new:
            self.record_attempt(node.name, rule, "applied")

    def add(self, rule: str, node: gs.Node, origins: tuple[str, ...]) -> None:
        """`node`, made and linked by `rule`, joins the graph carrying `origins`."""
        ctx = self.ctx
        ctx.origins[node.name] = origins
        ctx.failures[node.name] = self.failures(node)
        self.carriers.update(origins)
        ctx.graph.nodes.append(node)
        ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=(node.name,), ops=(node.op,)))
        self.record_attempt(node.name, rule, "applied")

    def forget(self, name: str) -> None:
        """The records that name a node leaving the graph."""
        self.ctx.failures.pop(name, None)
        if self.fused:
            self.ctx.notes.pop(name, None)

    def release(self, origins, rule: str) -> None:
        for original in origins:
            if self.carriers[original] <= 0:
                self.ctx.fates[original] = ("removed", f"{REMOVED_BECAUSE[rule]} ({rule})")

    def drop(self, node: gs.Node, rule: str) -> None:
        """`node` (detached already) leaves the graph; what it stood for, if nothing else
        carries it, was removed."""
        self.removed[id(node)] = node
        self.declined.pop(node.name, None)
        origins = self.ctx.origins.pop(node.name, (node.name,))
        self.carriers.subtract(origins)
        self.forget(node.name)
        self.release(origins, rule)
        self.ctx.rewrites.append(Rewrite(rule=rule, nodes=origins, into=(), ops=()))

    def passes_as_before(self, old: gs.Node, probe: gs.Node) -> str | None:
        """Why `probe`, standing for `old`, is worse on the target: it breaks a rule while `old`
        broke none."""
        failures = self.failures(probe)
        if failures and not self.failures(old):
            return f"{old.name} would break: {failures[0]}"
        return None


# --- identity_layout --------------------------------------------------------------------------


def identity_layout(node: gs.Node, simplifier: _Simplifier):
    """A Transpose that keeps every axis in place, or a relabel to the shape it reads, moves no
    element: its readers read its input. One writing a graph output has its input's producer
    write the output instead, so the output keeps its name (as passes/remove_noops.py does)."""
    move = layout_move(node)
    if move is None:
        return None
    source, result, perm = move
    if perm is not None and list(perm) != sorted(perm) or static_shape(source) != static_shape(result):
        return None
    if result.name in simplifier.graph_outputs:
        made_by = source.inputs[0] if len(source.inputs) == 1 else None
        if made_by is None or source.name in simplifier.graph_outputs or len(source.outputs) != 1:
            return "it writes a graph output from a tensor it cannot rename"
        detach(node)
        position = made_by.outputs.index(source)
        made_by.outputs[position] = result
        body = fused_body(made_by)
        if body is not None:  # a kernel's body names its results as the kernel does
            body.outputs[position].name = result.name
    else:
        replace_uses(result, source)
        detach(node)
    simplifier.drop(node, "identity_layout")
    return True


# --- shared_layout ----------------------------------------------------------------------------


def _same_layout(one: gs.Node, other: gs.Node) -> bool:
    """Both lay out the same tensor by the same op, attributes and constant operands."""
    if (other.op != one.op or other.domain != one.domain or other.attrs != one.attrs
            or len(other.inputs) != len(one.inputs) or len(other.outputs) != 1
            or static_shape(other.outputs[0]) != static_shape(one.outputs[0])):
        return False
    for mine, theirs in zip(one.inputs[1:], other.inputs[1:]):
        if mine is theirs:
            continue
        values, others = constant_value(mine), constant_value(theirs)
        if values is None or others is None or not np.array_equal(values, others) or values.shape != others.shape:
            return False
    return one.inputs[0] is other.inputs[0]


def shared_layout(node: gs.Node, simplifier: _Simplifier):
    """Relabels or Transposes of one tensor that make the same result are one node, read by
    the readers of all of them: a tensor read by two linear layers (the residual and the
    projection, or the q, k and v projections) is relabelled into the 1x1 Conv layout once."""
    if layout_move(node) is None:
        return None
    twins = [reader for reader in node.inputs[0].outputs
             if reader is not node and id(reader) not in simplifier.removed and _same_layout(node, reader)]
    twins = [twin for twin in twins if twin.outputs[0].name not in simplifier.graph_outputs]
    if not twins:
        return None
    inputs, result = list(node.inputs), node.outputs[0]
    for old in (node, *twins):
        made = old.outputs[0]
        detach(old)
        if made is not result:
            replace_uses(made, result)
    kept = gs.Node(op=node.op, name=node.name, domain=node.domain, attrs=dict(node.attrs), inputs=inputs,
                   outputs=[result])
    simplifier.replace("shared_layout", [node, *twins], [kept])
    return True


# --- slices_as_split --------------------------------------------------------------------------


def _slice_range(node: gs.Node, shape) -> tuple[int, int, int] | None:
    """(axis, start, end) of a Slice of constant bounds along one axis with step 1, normalized."""
    values = [constant_value(t) if t.name else None for t in node.inputs[1:5]]
    if len(node.inputs) < 3 or values[0] is None or values[1] is None:
        return None
    starts, ends = values[0].reshape(-1), values[1].reshape(-1)
    axes = values[2].reshape(-1) if len(values) > 2 and values[2] is not None else np.arange(starts.size)
    if len(values) > 2 and node.inputs[3].name and values[2] is None:
        return None
    if len(values) > 3 and node.inputs[4].name and (values[3] is None or np.any(values[3] != 1)):
        return None
    if starts.size != 1 or ends.size != 1 or axes.size != 1:
        return None
    axis = int(axes[0]) % len(shape)
    dim = shape[axis]
    start, end = int(starts[0]), int(ends[0])
    start = min(max(start + dim if start < 0 else start, 0), dim)
    end = min(max(end + dim if end < 0 else end, 0), dim)
    return axis, start, end


def slices_as_split(node: gs.Node, simplifier: _Simplifier):
    """Slices of one tensor along one axis whose ranges cover it, each element once, are one
    Split of it: one step instead of one per Slice (rknn-toolkit2 runs attention's q/k/v
    unbinding as one Split)."""
    if node.op != "Slice" or not is_onnx_domain(node) or simplifier.ctx.graph.opset < 10:
        return None
    x = node.inputs[0]
    shape = static_shape(x)
    own = None if shape is None else _slice_range(node, shape)
    if own is None:
        return "its bounds are not constant, on one axis with step 1, of a known shape"
    group = []
    for reader in x.outputs:
        if reader.op == "Slice" and is_onnx_domain(reader) and reader.inputs[0] is x:
            found = _slice_range(reader, shape)
            if found is not None and found[0] == own[0] and all(r is not reader for _, _, r in group):
                group.append((found[1], found[2], reader))
    group.sort(key=lambda item: item[0])
    axis, covered = own[0], 0
    for start, end, _ in group:
        if start != covered or end <= start:
            return f"the Slices of {x.name} along axis {axis} do not cover it once"
        covered = end
    if covered != shape[axis] or len(group) < 2:
        return f"the Slices of {x.name} along axis {axis} do not cover it once"
    slices = [reader for _, _, reader in group]
    if any(simplifier.ctx.failures.get(s.name) for s in slices):
        return "a Slice of the group runs on the CPU"
    sizes = np.array([end - start for start, end, _ in group], dtype=np.int64)
    outputs = [s.outputs[0] for s in slices]
    name = simplifier.fresh(f"{slices[0].name}/split")
    if simplifier.ctx.graph.opset >= 13:
        inputs, attrs = [x, gs.Constant(simplifier.fresh(f"{name}/sizes"), sizes)], {"axis": axis}
    else:
        inputs, attrs = [x], {"axis": axis, "split": sizes.tolist()}
    probe = unlinked_node(op="Split", name=name, attrs=attrs, inputs=inputs, outputs=outputs)
    problem = simplifier.failures(probe)
    if problem:
        return f"the Split would break: {problem[0]}"
    for s in slices:
        detach(s)
    split = gs.Node(op="Split", name=name, attrs=attrs, inputs=inputs, outputs=outputs)
    simplifier.replace("slices_as_split", slices, [split])
    return True


# --- move_layout_down -------------------------------------------------------------------------


def _elementwise_fused(node: gs.Node) -> bool:
    """A fused kernel of element-wise members only (exGelu, exSwish, AddRelu, ...), each
    constant one value and each tensor of the kernel's output shape: it computes the same
    values in any layout."""
    body = fused_body(node)
    if body is None or len(node.outputs) != 1:
        return False
    shape = static_shape(node.outputs[0])
    for member in body.nodes:
        if member.op not in ELEMENTWISE_OPS or not is_onnx_domain(member):
            return False
        for t in (*member.inputs, *member.outputs):
            if isinstance(t, gs.Constant):
                if element_count(t.shape) != 1:
                    return False
            elif t.name and static_shape(t) != shape:
                return False
    return True


#: ops `move_layout_down` passes, re-written, when a Transpose moved the channel axis (axis 1)
#: of a 4-D tensor, or of a 3-D [N, C, L] one, last and they work on that last axis: a Transpose
#: to channels-last undone after them leaves a channel normalization and 1x1 Convs on the NCHW
#: tensor the NPU keeps anyway (a 3-D one, a feature map's flattened [N, C, H*W] before its
#: tokens [N, H*W, C], as [N, C, 1, L]).
CHANNEL_OPS = frozenset({"LayerNormalization", "MatMul"})


class _Region:
    """The nodes a layout move passes through, with the shape each of their tensors gets."""

    def __init__(self, entry: gs.Node, perm, fresh, opset: int, into_kernels: bool):
        self.perm, self.fresh, self.opset = perm, fresh, opset
        self.entries: list[gs.Node] = [entry]
        self.nodes: list[gs.Node] = []
        self.exits: list[gs.Node] = []
        #: after fusion: readers leading, through selecting ops, to a matrix multiply kernel
        #: that reads the move's result as part of its operand (`_kernel_exit_problem`)
        self.into_kernels = into_kernels
        self.kernel_exits: list[gs.Node] = []
        self.shapes: dict[int, tuple[int, ...]] = {id(entry.outputs[0]): static_shape(entry.inputs[0])}
        self.constants: dict[tuple[int, int], gs.Constant] = {}  # (id(node), position) -> re-laid constant
        self.attrs: dict[int, dict] = {}  # id(node) -> its attributes that name axes, for the unmoved layout
        self.channel_ops: set[int] = set()  # ids of CHANNEL_OPS nodes re-written on the channel axis
        self.classified = {id(entry)}

    def same_move(self, node: gs.Node, moved_shape, unmoved) -> bool:
        """Whether `node` moves `unmoved`-shaped tensors to `moved_shape` as the entry does."""
        move = layout_move(node)
        return (move is not None and move[2] == self.perm and static_shape(move[0]) == tuple(unmoved)
                and static_shape(move[1]) == tuple(moved_shape))


def move_layout_down(node: gs.Node, simplifier: _Simplifier):
    """A relabel or Transpose moves its tensor's elements; element-wise ops and Splits compute
    the same values wherever the elements are, so the move can be made after them instead,
    where the relabels or Transposes reading the region take it into their own. The entry
    leaves (with any twin doing the same move to another operand); each exit becomes one
    node, or none when the moves cancel (Reshape -> GELU -> Reshape around a Conv's layout)."""
    move = layout_move(node)
    if move is None:
        return None
    source, result, perm = move
    region = _Region(node, perm, simplifier.fresh, simplifier.ctx.graph.opset, simplifier.fused)
    problem = _grow(region, simplifier)
    if problem:
        return problem
    if not region.exits and not region.kernel_exits:
        return "no relabel or Transpose reads what follows it"
    if region.kernel_exits and not region.nodes:
        return "the matrix multiply reading it is next to it already"
    probes = _probes(region, simplifier)
    if isinstance(probes, str):
        return probes
    _apply(region, probes, simplifier)
    return True


def _grow(region: _Region, simplifier: _Simplifier) -> str | None:
    """Classify every reader of the region's tensors as a region node or an exit, adding twin
    entries; why not, when one is neither."""
    frontier = [region.entries[0].outputs[0]]
    waiting: dict[int, gs.Node] = {}
    while frontier:
        tensor = frontier.pop()
        if tensor.name in simplifier.graph_outputs:
            return f"{tensor.name}, in the region it would move through, is a graph output"
        for reader in list(tensor.outputs):
            if id(reader) in region.classified:
                continue
            outcome = _classify(reader, tensor, region)
            if outcome is None:
                waiting[id(reader)] = reader  # an operand is not reached yet
                continue
            if isinstance(outcome, str):
                return outcome
            waiting.pop(id(reader), None)
            region.classified.add(id(reader))
            frontier.extend(outcome)
    if waiting:
        stuck = next(iter(waiting.values()))
        return f"{stuck.name} reads a tensor the move does not reach"
    return None


def _classify(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """The tensors `reader` adds to the region (none for an exit), None to wait for another
    operand, or why the move cannot pass it."""
    perm = region.perm
    unmoved = region.shapes[id(tensor)]
    exit_move = layout_move(reader)
    if exit_move is not None and exit_move[0] is tensor and (exit_move[2] is None) == (perm is None):
        region.exits.append(reader)
        return []
    if region.into_kernels and _kernel_path(reader) is not None:
        region.kernel_exits.append(reader)
        return []
    if reader.op == "Gather" and is_onnx_domain(reader) and reader.inputs[0] is tensor:
        return _gather_moved(reader, tensor, region)
    if perm is not None and is_onnx_domain(reader) and reader.op in AXIS_NAMING_OPS and reader.inputs[0] is tensor:
        return _axes_renamed(reader, tensor, region)
    along = _along_one_axis(reader, tensor, region.opset)
    if along is not None:
        moved = static_shape(tensor)
        axis = along % len(moved)
        new_axis = unmoved_axis(moved, unmoved, axis, perm)
        if new_axis is None or any(static_shape(t) is None for t in reader.outputs):
            return f"{reader.name} ({reader.op}) works along an axis the move does not keep"
        region.attrs[id(reader)] = {"axis": new_axis}
        region.nodes.append(reader)
        for part in reader.outputs:
            size = static_shape(part)[axis]
            region.shapes[id(part)] = tuple(size if a == new_axis else d for a, d in enumerate(unmoved))
        return list(reader.outputs)
    if is_onnx_domain(reader) and reader.op in CHANNEL_OPS:
        return _classify_channel_op(reader, tensor, region)
    fused = reader.domain == FUSED_DOMAIN and _elementwise_fused(reader)
    if not fused and not (is_onnx_domain(reader) and reader.op in ELEMENTWISE_OPS and len(reader.outputs) == 1):
        return f"{reader.name} ({reader.op}) is neither element-wise, a Split, a Softmax nor a relabel or Transpose"
    moved = static_shape(reader.outputs[0])
    if moved != static_shape(tensor):
        # A Transpose moves an operand that broadcasts (a LayerNorm's mean) as it moves the
        # result: the output's unmoved shape is its own axes put back, each operand checked below.
        if perm is None or moved is None:
            return f"{reader.name} broadcasts {tensor.name} to {moved}"
        unmoved = _unmoved_shape(moved, None, None, perm)
    constants, twins = {}, []
    for position, operand in enumerate(reader.inputs):
        if not operand.name:
            continue
        if id(operand) in region.shapes:
            if region.shapes[id(operand)] != _unmoved_shape(static_shape(operand), moved, unmoved, perm):
                return f"{reader.name} reads {operand.name}, laid out unlike {tensor.name}"
            continue
        if isinstance(operand, gs.Constant):
            relaid = _relaid_constant(operand, moved, unmoved, perm, fused, region.fresh)
            if isinstance(relaid, str):
                return f"{reader.name}: {relaid}"
            if relaid is not operand:
                constants[(id(reader), position)] = relaid
            continue
        twin = operand.inputs[0] if len(operand.inputs) == 1 else None
        operand_unmoved = _unmoved_shape(static_shape(operand), moved, unmoved, perm)
        chain = _broadcast_chain(operand, operand_unmoved, region) if perm is not None and operand_unmoved else None
        if twin is not None and operand_unmoved and region.same_move(twin, static_shape(operand), operand_unmoved):
            twins.append((twin, operand))
        elif chain is not None:
            chain_twin, chain_nodes, chain_constants = chain
            twins.append((chain_twin, chain_twin.outputs[0]))
            for node in chain_nodes:
                region.classified.add(id(node))
                region.nodes.append(node)
                region.shapes[id(node.outputs[0])] = operand_unmoved
            region.constants.update(chain_constants)
        elif twin is not None and twin.op not in LAYOUT_OPS and id(twin) not in region.classified:
            return None  # perhaps a region node the search has not reached yet
        else:
            return f"{reader.name} reads {operand.name}, which is not moved as {tensor.name} is"
    region.constants.update(constants)
    for twin, operand in twins:
        if id(twin) not in region.classified:
            region.classified.add(id(twin))
            region.entries.append(twin)
            region.shapes[id(operand)] = static_shape(twin.inputs[0])
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = tuple(unmoved)
    return [operand for _, operand in twins] + [reader.outputs[0]]


#: ops that compute each slice along one axis from that slice alone (opset 13 on for the
#: Softmax family: before it they normalize every axis from `axis` on together)
ONE_AXIS_OPS = {"Split": 0, "Softmax": -1, "LogSoftmax": -1}


def _along_one_axis(reader: gs.Node, tensor: gs.Tensor, opset: int) -> int | None:
    """The axis `reader`, one of ONE_AXIS_OPS reading `tensor` as its data, works along; None
    for any other reader. A move passes it when it keeps that axis whole: each slice is then
    the same elements in the same order, and the op computes the same values from it."""
    if (not is_onnx_domain(reader) or reader.op not in ONE_AXIS_OPS or reader.inputs[0] is not tensor
            or (reader.op != "Split" and (opset < 13 or len(reader.outputs) != 1))):
        return None
    return int(reader.attrs.get("axis", ONE_AXIS_OPS[reader.op]))


def _unmoved_shape(shape, moved, unmoved, perm) -> tuple[int, ...] | None:
    """The unmoved layout's shape of a region operand of `shape` beside a region tensor moved from
    `unmoved` to `moved`: for a relabel only `moved` itself has one; for a Transpose any shape
    of its rank does (an operand that broadcasts), its axes put back."""
    if perm is None:
        return tuple(unmoved) if shape == tuple(moved) else None
    if shape is None or len(shape) != len(perm):
        return None
    restored = [0] * len(perm)
    for axis, source in enumerate(perm):
        restored[source] = shape[axis]
    return tuple(restored)


def _broadcast_chain(operand: gs.Tensor, unmoved, region: _Region):
    """(Transpose, nodes, re-laid constants) when `operand` is made from a Transpose doing the
    region's move by element-wise ops of it and constants, each tensor of `operand`'s shape and
    read by the next alone, so the chain can run on the unmoved layout with the region; else None."""
    shape, nodes, constants = static_shape(operand), [], {}
    tensor = operand
    while True:
        maker = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if maker is None or id(maker) in region.classified or len(tensor.outputs) != 1:
            return None
        if region.same_move(maker, shape, unmoved) and nodes:
            return maker, nodes[::-1], constants
        if not (is_onnx_domain(maker) and maker.op in ELEMENTWISE_OPS and len(maker.outputs) == 1):
            return None
        variables = [t for t in maker.inputs if t.name and not isinstance(t, gs.Constant)]
        if len(variables) != 1 or static_shape(variables[0]) != shape:
            return None
        for position, constant_input in enumerate(maker.inputs):
            if isinstance(constant_input, gs.Constant):
                relaid = _relaid_constant(constant_input, shape, unmoved, region.perm, False, region.fresh)
                if isinstance(relaid, str):
                    return None
                if relaid is not constant_input:
                    constants[(id(maker), position)] = relaid
        nodes.append(maker)
        tensor = variables[0]


#: ops whose attributes or constant inputs name the axes they work along; a Transpose passes
#: them with the axes renamed (Reduce* only when they keep the reduced axes, so ranks agree)
AXIS_NAMING_OPS = frozenset({"Pad", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd",
                             "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"})


def _axes_renamed(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """`reader` (Pad or a Reduce*) run on the unmoved layout, its axes or pads renamed: what
    it does along moved axis a it does along the unmoved layout's perm[a]. Exact: every output
    is computed from the same elements by the same arithmetic."""
    perm, rank = region.perm, len(region.perm)
    out_shape = static_shape(reader.outputs[0])
    if out_shape is None or len(out_shape) != rank or len(reader.outputs) != 1:
        return f"{reader.name} ({reader.op}) changes the rank or its output shape is unknown"
    constant_inputs = {}
    if reader.op == "Pad":
        if reader.attrs.get("mode", "constant") not in ("constant", "reflect", "edge") or len(reader.inputs) > 3:
            return f"{reader.name} pads with a mode or an axes input the move does not rename"
        if len(reader.inputs) > 2 and reader.inputs[2].name and constant_value(reader.inputs[2]) is None:
            return f"{reader.name}'s pad value is not a constant"
        pads = reader.attrs.get("pads") if len(reader.inputs) < 2 else constant_value(reader.inputs[1])
        if pads is None or len(pads) != 2 * rank:
            return f"{reader.name}'s pads are not a constant of two per axis"
        pads = np.asarray(pads, dtype=np.int64)
        renamed = np.zeros_like(pads)
        renamed[list(perm)], renamed[[rank + p for p in perm]] = pads[:rank], pads[rank:]
        if len(reader.inputs) < 2:
            region.attrs[id(reader)] = {"pads": renamed.tolist()}
        else:
            constant_inputs[1] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), renamed)
    else:
        if not reader.attrs.get("keepdims", 1):
            return f"{reader.name} drops the axes it reduces"
        from_input = len(reader.inputs) > 1 and reader.inputs[1].name
        axes = constant_value(reader.inputs[1]) if from_input else reader.attrs.get("axes")
        if axes is None:
            return f"{reader.name} reduces every axis or its axes are not a constant"
        renamed = np.array(sorted(perm[int(a) % rank] for a in np.asarray(axes).reshape(-1)), dtype=np.int64)
        if from_input:
            constant_inputs[1] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), renamed)
        else:
            region.attrs[id(reader)] = {"axes": renamed.tolist()}
    region.constants.update({(id(reader), position): c for position, c in constant_inputs.items()})
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = _unmoved_shape(out_shape, None, None, perm)
    return [reader.outputs[0]]


def _classify_channel_op(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """A LayerNormalization over the last axis or a MatMul by a constant [C, D] of a 3-D or 4-D
    tensor whose last axis is the channel axis before the move: the region's tensors it adds, or
    why the move cannot pass it."""
    moved, unmoved = static_shape(tensor), region.shapes[id(tensor)]
    rank = len(moved)
    if region.perm is None or rank not in (3, 4) or region.perm[-1] != 1 or reader.inputs[0] is not tensor:
        return f"{reader.name} ({reader.op}) does not work on the channels a Transpose moved last"
    if reader.op == "LayerNormalization":
        if int(reader.attrs.get("axis", -1)) % rank != rank - 1 or any(t.name for t in reader.outputs[1:]):
            return f"{reader.name} normalizes more than the last axis, or its statistics are read"
        if any(t.name and not isinstance(t, gs.Constant) for t in reader.inputs[1:]):
            return f"{reader.name}: its scale or bias is not constant"
        out = tuple(unmoved)
    else:
        weights = reader.inputs[1] if len(reader.inputs) == 2 else None
        if not isinstance(weights, gs.Constant) or len(weights.shape) != 2 or weights.shape[0] != moved[-1]:
            return f"{reader.name} does not multiply by constant weights [C, D]"
        out = tuple(int(weights.shape[1]) if a == 1 else d for a, d in enumerate(unmoved))
    region.channel_ops.add(id(reader))
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = out
    return [reader.outputs[0]]


def _gather_moved(reader: gs.Node, tensor: gs.Tensor, region: _Region):
    """A Gather of constant indices along one axis keeping its extent (rotary embedding's
    rotate-half, a reordered Split) run on the unmoved layout: along the Transpose's own axis
    with the same indices, or, after a relabel, along the unmoved axis holding the gathered
    axis' blocks, each block's elements gathered as before. Exact: every output is the same
    element of the same tensor."""
    moved, unmoved = static_shape(tensor), region.shapes[id(tensor)]
    indices = constant_value(reader.inputs[1]) if len(reader.inputs) == 2 else None
    axis = int(reader.attrs.get("axis", 0)) % len(moved)
    if indices is None or indices.ndim != 1 or indices.size != moved[axis] or static_shape(reader.outputs[0]) != moved:
        return f"{reader.name} does not gather constant indices along one axis keeping its extent"
    indices = np.where(indices < 0, indices + moved[axis], indices).astype(np.int64)
    if region.perm is not None:
        new_axis, new_indices = region.perm[axis], indices
    else:
        found = _gathered_axis(moved, unmoved, axis, indices)
        if found is None:
            return f"{reader.name} gathers along an axis the relabel splits"
        new_axis, new_indices = found
    region.constants[(id(reader), 1)] = gs.Constant(region.fresh(f"{reader.inputs[1].name}/unmoved"), new_indices)
    region.attrs[id(reader)] = {"axis": new_axis}
    region.nodes.append(reader)
    region.shapes[id(reader.outputs[0])] = tuple(unmoved)
    return [reader.outputs[0]]


def _gathered_axis(moved, unmoved, axis: int, indices: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(axis, indices) of the Gather along `unmoved` doing what a Gather of `indices` along
    `axis` of the relabelled `moved` does: the unmoved axis whose elements step over the moved
    axis' ones, when every block of the moved axis lies within one run of it; else None."""
    inner = element_count(moved[axis + 1:])
    for candidate, extent in enumerate(unmoved):
        step = element_count(unmoved[candidate + 1:])
        if extent == 1 or not step <= inner < step * extent:
            continue
        block = moved[axis] * inner
        if inner % step or (step * extent) % block:
            return None
        positions = np.arange(extent).reshape(step * extent // block, moved[axis], inner // step)
        return candidate, positions[:, indices, :].reshape(-1)
    return None


def _kernel_path(reader: gs.Node) -> tuple[list[gs.Node], gs.Node] | None:
    """(the selecting ops from `reader` on, the matrix multiply they lead to) when `reader` is
    such a kernel (exSDPAttention, exMatMul, MatMul) or starts a chain of ops that only select
    elements, each result read by the next alone; else None."""
    chain, current = [], reader
    while not (current.op in (ATTENTION, MATMUL) and current.domain == FUSED_DOMAIN
               or current.op == "MatMul" and is_onnx_domain(current)):
        if not _selects(current, SELECTING) or len(current.outputs) != 1 or len(current.outputs[0].outputs) != 1:
            return None
        chain.append(current)
        current = current.outputs[0].outputs[0]
    return chain, current


def _kernel_exit_problem(reader: gs.Node, position: int, unmoved, perm, simplifier: _Simplifier) -> str | None:
    """Why the kernel `reader` leads to could not read its operand through the move made in
    front of `reader`'s input `position` (unmoved shape `unmoved`) and the ops between, as
    whole rows (`_row_problem`); None when it can, so matmul_operands takes the move in."""
    chain, kernel = _kernel_path(reader)
    core = _kernel_core(kernel, simplifier, (ATTENTION, MATMUL, "MatMul"))
    fed = chain[-1].outputs[0] if chain else reader.inputs[position]
    if core is None or fed.name in simplifier.graph_outputs or any(
            t.name in simplifier.graph_outputs for node in chain for t in node.outputs):
        return f"{kernel.name} does not read its operands through the ops it absorbs"
    row_axis = next((axis for tensor, axis in core[3] if tensor is fed), None)
    if row_axis is None:
        return f"{kernel.name} does not read {fed.name} as an operand"
    read = reader.inputs[position]
    source = gs.Variable(f"{read.name}/unmoved", read.dtype, list(unmoved))
    moved = gs.Variable(read.name, read.dtype, static_shape(read))
    probe = _layout_node(source, moved, perm, read.name, lambda name: name, unlinked_node)
    values, _ = _element_indices([probe, *chain], simplifier.ctx.graph.opset)
    return _row_problem(values[fed.name], row_axis, tuple(unmoved), f"{fed.name} in {read.name}")


def _layout_node(source: gs.Tensor, result: gs.Tensor, perm, base: str, fresh, new_node=gs.Node) -> gs.Node:
    """A Transpose by `perm` (a Reshape when None) of `source` into `result`, named after `base`."""
    if perm is None:
        shape = gs.Constant(fresh(f"{base}/shape"), np.array(static_shape(result), dtype=np.int64))
        return new_node(op="Reshape", name=fresh(f"{base}/moved"), inputs=[source, shape], outputs=[result])
    return new_node(op="Transpose", name=fresh(f"{base}/moved"), attrs={"perm": list(perm)}, inputs=[source],
                    outputs=[result])


def _on_channel_axis(node: gs.Node, x: gs.Tensor, y: gs.Tensor, simplifier: _Simplifier,
                     linked: bool) -> list[gs.Node]:
    """The nodes computing CHANNEL_OPS `node`'s work on NCHW (or [N, C, L]) `x` into `y`,
    reducing axis 1: a 1x1 Conv with the MatMul's weights transposed (the same products and
    sums; [N, C, L] relabelled to [N, C, 1, L] around it), or LayerNormalization's arithmetic as
    ONNX defines it, mean, centred values, mean square, epsilon, square root, division, then scale
    and bias as [C, 1, 1] (or [C, 1]) constants."""
    fresh = simplifier.fresh
    base = node.name or y.name

    new_node = gs.Node if linked else unlinked_node

    def make(op, inputs, out=None, **attrs):
        made = out or gs.Variable(fresh(f"{base}/{op.lower()}"), x.dtype, list(static_shape(x)))
        nodes.append(new_node(op=op, name=fresh(f"{base}/{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[made]))
        return made

    def const(label, values):
        return gs.Constant(fresh(f"{base}/{label}"), np.ascontiguousarray(values))

    nodes: list[gs.Node] = []
    x_shape = static_shape(x)
    if node.op == "MatMul":
        weights = constant_value(node.inputs[1])
        if len(x_shape) == 4:
            make("Conv", [x, const("weights", weights.T[:, :, None, None])], y, kernel_shape=[1, 1])
            return nodes
        batch, _, length = x_shape
        planar = make("Reshape", [x, const("planar", np.array([batch, -1, 1, length], np.int64))])
        planar.shape = [batch, x_shape[1], 1, length]
        convolved = make("Conv", [planar, const("weights", weights.T[:, :, None, None])], kernel_shape=[1, 1])
        convolved.shape = [batch, int(weights.shape[1]), 1, length]
        make("Reshape", [convolved, const("flat", np.array(static_shape(y), np.int64))], y)
        return nodes
    dtype = constant_value(node.inputs[1]).dtype
    channels = x_shape[1]

    def mean(value):
        if simplifier.ctx.graph.opset >= 18:
            made = make("ReduceMean", [value, const("axes", np.array([1], dtype=np.int64))], keepdims=1)
        else:
            made = make("ReduceMean", [value], axes=[1], keepdims=1)
        made.shape = [*made.shape[:1], 1, *made.shape[2:]]
        return made

    average = mean(x)
    centred = make("Sub", [x, average])
    variance = mean(make("Pow", [centred, const("two", np.array(2.0, dtype))]))
    epsilon = np.array(node.attrs.get("epsilon", 1e-5), dtype)
    root = make("Sqrt", [make("Add", [variance, const("epsilon", epsilon)])])
    root.shape = list(variance.shape)
    affine = [t for t in node.inputs[1:] if t.name]
    value = make("Div", [centred, root], None if affine else y)
    for position, (op, param) in enumerate(zip(("Mul", "Add"), affine)):
        last = position == len(affine) - 1
        channel = np.broadcast_to(constant_value(param), (channels,)).reshape(channels, *[1] * (len(x_shape) - 2))
        value = make(op, [value, const(op.lower(), channel)], y if last else None)
    return nodes


def _relaid_constant(operand: gs.Constant, moved, unmoved, perm, fused: bool, fresh):
    """`operand` for the unmoved layout: itself when one value of rank the unmoved layout
    takes, a Transpose's inverse of it, or for a relabel, the same values relabelled when it
    has the moved shape; else why not."""
    shape = tuple(operand.shape)
    if element_count(shape) == 1 and len(shape) <= len(unmoved):
        return operand
    if fused:
        return f"constant {operand.name} is not one value"
    values = constant_value(operand)
    if perm is not None and len(shape) <= len(moved):
        aligned = values.reshape((1,) * (len(moved) - len(shape)) + shape)
        return gs.Constant(fresh(f"{operand.name}/unmoved"), np.ascontiguousarray(aligned.transpose(np.argsort(perm))))
    if perm is None and shape == tuple(moved):
        return gs.Constant(fresh(f"{operand.name}/unmoved"), np.ascontiguousarray(values.reshape(unmoved)))
    return f"constant {operand.name} {list(shape)} cannot follow the move"


def _composed(exit_node: gs.Node, region: _Region) -> tuple[int, ...] | None:
    """The exit's new perm (Transposes) or None (relabels)."""
    if region.perm is None:
        return None
    own = layout_move(exit_node)[2]
    return tuple(region.perm[q] for q in own)


#: a LayerNorm and an RMSNorm as exporters write them out (fusion_table's exNorm rows)
NORM_CORES = (layer_norm_core(), rms_norm_core())


def _channel_norm_members(region: _Region, simplifier: _Simplifier) -> set[int]:
    """Ids of the region's nodes that, moved, are a LayerNorm or RMSNorm written out over the
    channel axis alone, on a target with exNorm: the fusion table's exNorm rows absorb them
    (their own rules, such as Div's broadcast of [1, 1, H, W], then do not apply; the rows'
    predicate checks the axes), as it absorbs the arithmetic `_on_channel_axis` writes for a
    LayerNormalization."""
    if not simplifier.ctx.target.has_kernel("exNorm"):
        return set()
    in_region = {id(n) for n in region.nodes}
    members: set[int] = set()
    for root in region.nodes:
        if root.op not in ("Div", "Mul") or id(root) in members:
            continue
        for match in (m for core in NORM_CORES for m in matches(core, root)):
            reductions = [n for n in match.members if n.op == "ReduceMean"]
            if (id(match.tensors["x"]) in region.shapes and all(id(n) in in_region for n in match.members)
                    and all(_unmoved_axes(n, region) == [1] for n in reductions)):
                members.update(id(n) for n in match.members)
                break
    return members


def _unmoved_axes(reduction: gs.Node, region: _Region) -> list[int] | None:
    """The axes a region's Reduce* reduces on the unmoved layout (`_axes_renamed`)."""
    renamed = region.attrs.get(id(reduction), {}).get("axes")
    if renamed is None and (id(reduction), 1) in region.constants:
        renamed = constant_value(region.constants[(id(reduction), 1)])
    return None if renamed is None else [int(a) for a in np.asarray(renamed).reshape(-1)]


def _probes(region: _Region, simplifier: _Simplifier):
    """Unlinked copies of the region's nodes and exits as they will be, each checked against
    the target; why not when one passes fewer rules than before, or the move stores more in
    the NPU's NC1HWC2 layout (fewer channels padded to C2: a move is not worth a larger arena):
    a tensor of the entry's size in more bytes, or the smaller ones (one value per position,
    padded from one channel to C2) in more bytes than the entries' and the cancelled exits'
    tensors that leave with the move. A norm's statistics that exNorm absorbs are never stored.
    A move into a matrix multiply kernel is judged by the layout at the top of the moves above
    it (`_layout_chain_top`): they follow it down, each the next one's entry, into the kernel,
    so the region's tensors of the entry's size end in that layout, not in the one between."""
    shapes = region.shapes
    full_size = element_count(static_shape(region.entries[0].outputs[0]))
    absorbed = _channel_norm_members(region, simplifier)
    top = _layout_chain_top(region, simplifier)
    growth = 0.0
    for node in region.nodes:
        if id(node) in absorbed and element_count(static_shape(node.outputs[0])) < full_size:
            continue
        for t in node.outputs:
            eventual = top if top is not None and element_count(static_shape(t)) == full_size else shapes[id(t)]
            before, after = simplifier.stored_bytes(static_shape(t)), simplifier.stored_bytes(eventual)
            if after > before and element_count(static_shape(t)) >= full_size:
                return f"{t.name} would take {after} bytes on the NPU instead of {before}"
            growth += after - before

    def probe_tensor(t):
        if isinstance(t, gs.Constant) or not t.name:
            return t
        return gs.Variable(t.name, t.dtype, list(shapes.get(id(t), static_shape(t) or [])))

    for node in region.nodes:
        if id(node) in absorbed:
            continue
        if id(node) in region.channel_ops:
            for probe in _on_channel_axis(node, probe_tensor(node.inputs[0]), probe_tensor(node.outputs[0]),
                                          simplifier, linked=False):
                problem = simplifier.passes_as_before(node, probe)
                if problem:
                    return problem
            continue
        inputs = [region.constants.get((id(node), i)) or probe_tensor(t) for i, t in enumerate(node.inputs)]
        attrs = dict(node.attrs, **region.attrs.get(id(node), {}))
        probe = unlinked_node(op=node.op, name=node.name, attrs=attrs, inputs=inputs,
                              outputs=[probe_tensor(t) for t in node.outputs], domain=node.domain)
        problem = simplifier.passes_as_before(node, probe)
        if problem:
            return problem
    exits = []
    for exit_node in region.exits:
        read = exit_node.inputs[0]
        unmoved, out = shapes[id(read)], exit_node.outputs[0]
        perm = _composed(exit_node, region)
        cancels = (list(perm) == sorted(perm)) if perm is not None else tuple(unmoved) == static_shape(out)
        if cancels and out.name not in simplifier.graph_outputs:
            growth -= simplifier.stored_bytes(static_shape(out))
            exits.append(None)
            continue
        reshaped = gs.Variable(read.name, read.dtype, list(unmoved))
        made = _layout_node(reshaped, out, perm, exit_node.name, simplifier.fresh, unlinked_node)
        problem = simplifier.passes_as_before(exit_node, made)
        if problem:
            return problem
        exits.append(made)
    for reader in region.kernel_exits:
        for position in _region_reads(reader, region):
            problem = _kernel_exit_problem(reader, position, shapes[id(reader.inputs[position])], region.perm, simplifier)
            if problem:
                return f"{reader.name} leads to a matrix multiply that cannot take the move in: {problem}"
    growth -= sum(simplifier.stored_bytes(static_shape(entry.outputs[0])) for entry in region.entries)
    if growth > 0:
        return f"the tensors it passes would take {growth:g} bytes more on the NPU than the moves it removes"
    return exits


def _layout_chain_top(region: _Region, simplifier: _Simplifier) -> tuple[int, ...] | None:
    """The shape the moves above a lone entry with kernel exits start from: the input of the
    first of the relabels and Transposes each read by the next alone that end in the entry;
    None without kernel exits, twins, or a move above it."""
    if not region.kernel_exits or len(region.entries) != 1:
        return None
    top, tensor = None, region.entries[0].inputs[0]
    while len(tensor.inputs) == 1 and len(tensor.outputs) == 1 and tensor.name not in simplifier.graph_outputs:
        move = layout_move(tensor.inputs[0])
        if move is None:
            break
        tensor = move[0]
        top = static_shape(tensor)
    return top


def _region_reads(reader: gs.Node, region: _Region) -> list[int]:
    """The input positions at which `reader` reads a tensor of the region."""
    return [position for position, t in enumerate(reader.inputs) if id(t) in region.shapes]


def _apply(region: _Region, exits: list, simplifier: _Simplifier) -> None:
    """Make the move: entries out, region re-laid, exits composed, and the move made again in
    front of each kernel exit, carrying the entries' original nodes until the kernel takes it
    in. As when the rewrite pass collapses relabels (rewrites.layout_ops.collapse_relabels), an
    exit carries its own original nodes and an entry's are otherwise reported removed."""
    kernel_reads = [(reader, position, static_shape(reader.inputs[position]))
                    for reader in region.kernel_exits for position in _region_reads(reader, region)]
    for entry in region.entries:
        replace_uses(entry.outputs[0], entry.inputs[0])
        detach(entry)
    for node in region.nodes:
        if id(node) in region.channel_ops:
            x, y = node.inputs[0], node.outputs[0]
            y.shape = list(region.shapes[id(y)])
            made = _on_channel_axis(node, x, y, simplifier, linked=True)
            detach(node)
            simplifier.replace("move_layout_down", [node], made)
            continue
        for (node_id, position), relaid in region.constants.items():
            if node_id == id(node):
                set_input(node, position, relaid)
        if id(node) in region.attrs:
            node.attrs = dict(node.attrs, **region.attrs[id(node)])
        for t in node.outputs:
            t.shape = list(region.shapes[id(t)])
        body = fused_body(node)
        if body is not None:  # its tensors all have its output's shape (_elementwise_fused)
            for t in (*body.inputs, *(t for member in body.nodes for t in member.outputs)):
                t.shape = list(node.outputs[0].shape)
        simplifier.ctx.failures[node.name] = simplifier.failures(node)
    for exit_node, made in zip(region.exits, exits):
        read, out = exit_node.inputs[0], exit_node.outputs[0]
        detach(exit_node)
        if made is None:
            replace_uses(out, read)
            simplifier.drop(exit_node, "move_layout_down")
        else:
            node = gs.Node(op=made.op, name=made.name, attrs=made.attrs, inputs=[read, *made.inputs[1:]], outputs=[out])
            simplifier.replace("move_layout_down", [exit_node], [node])
    moves = []
    for reader, position, moved_shape in kernel_reads:
        read = reader.inputs[position]
        result = gs.Variable(simplifier.fresh(f"{read.name}/moved"), read.dtype, list(moved_shape))
        moves.append(_layout_node(read, result, region.perm, region.entries[0].name, simplifier.fresh))
        body = fused_body(reader)
        if body is not None:  # its body reads the input it had there by name
            computed = [t for t in reader.inputs[:position] if t.name and not isinstance(t, gs.Constant)]
            body.inputs[len(computed)].name = result.name
        set_input(reader, position, result)
    if moves:
        simplifier.replace("move_layout_down", list(region.entries), moves)
        return
    for entry in region.entries:
        simplifier.drop(entry, "move_layout_down")


# --- move_relabel_up --------------------------------------------------------------------------


def _unit_axes_relabelled(shape: tuple[int, ...], operand: tuple[int, ...], target: tuple[int, ...]):
    """The shape `operand` (broadcasting to `shape`) takes when `shape` is relabelled to
    `target` by adding or removing axes of extent 1 only: each axis of `target` of extent above
    1 is the next such axis of `shape`, and takes the operand's extent there; None when the
    relabel moves more than unit axes."""
    if [d for d in shape if d != 1] != [d for d in target if d != 1]:
        return None
    aligned = (1,) * (len(shape) - len(operand)) + tuple(operand)
    kept = iter(a for a, d in enumerate(shape) if d != 1)
    return tuple(aligned[next(kept)] if d != 1 else 1 for d in target)


def move_relabel_up(node: gs.Node, simplifier: _Simplifier):
    """A relabel after an element-wise op whose operands are relabels read by it alone (or
    constants) can be made on the operands instead: each operand's relabel then goes straight
    to the new layout (one node for two), and the relabel after the op leaves. An operand that
    broadcasts follows when the relabel only adds or removes axes of extent 1. Exact: the op
    computes the same values from the same elements. The rewrite pass leaves this form where
    two ops it wraps in relabels meet at an element-wise op (a Softmax's attention weights
    times a sequence, then a ReduceSum run as a Conv)."""
    move = layout_move(node)
    if move is None or move[2] is not None:
        return None
    source, result, _ = move
    made_by = source.inputs[0] if len(source.inputs) == 1 else None
    if (made_by is None or not is_onnx_domain(made_by) or made_by.op not in ELEMENTWISE_OPS
            or len(made_by.outputs) != 1 or len(source.outputs) != 1 or source.name in simplifier.graph_outputs):
        return None
    shape, target = static_shape(source), static_shape(result)
    plan = []  # (input position, operand, its new shape, the relabel making it or None)
    for position, operand in enumerate(made_by.inputs):
        if not operand.name:
            continue
        operand_shape = static_shape(operand)
        if operand_shape is None or len(operand_shape) > len(shape):
            return f"{made_by.name}'s operand {operand.name} has no known shape of its rank"
        if tuple(operand_shape) == shape:
            relabelled = target
        else:
            relabelled = _unit_axes_relabelled(shape, operand_shape, target)
            if relabelled is None:
                return f"{made_by.name} broadcasts {operand.name}, and the relabel moves more than unit axes"
        if relabelled == tuple(operand_shape):
            continue
        if isinstance(operand, gs.Constant):
            plan.append((position, operand, relabelled, None))
            continue
        maker = operand.inputs[0] if len(operand.inputs) == 1 else None
        maker_move = layout_move(maker) if maker is not None else None
        if (maker_move is None or maker_move[2] is not None or len(operand.outputs) != 1
                or operand.name in simplifier.graph_outputs):
            return f"{made_by.name} reads {operand.name}, which no relabel read by it alone makes"
        plan.append((position, operand, relabelled, maker))
    probe_inputs = list(made_by.inputs)
    growth = -simplifier.stored_bytes(shape)
    relabels = []
    for position, operand, relabelled, maker in plan:
        if isinstance(operand, gs.Constant):
            probe_inputs[position] = gs.Constant(simplifier.fresh(f"{operand.name}/relabelled"),
                                                 np.ascontiguousarray(constant_value(operand).reshape(relabelled)))
            continue
        probe_inputs[position] = gs.Variable(operand.name, operand.dtype, list(relabelled))
        if maker is None:
            continue
        growth += simplifier.stored_bytes(relabelled) - simplifier.stored_bytes(static_shape(operand))
        origin = maker.inputs[0]
        if static_shape(origin) == relabelled:
            relabels.append((position, maker, None))
            continue
        shape_input = gs.Constant(simplifier.fresh(f"{maker.name}/shape"), np.array(relabelled, dtype=np.int64))
        made = unlinked_node(op="Reshape", name=simplifier.fresh(f"{maker.name}/relabelled"),
                             inputs=[origin, shape_input], outputs=[probe_inputs[position]])
        problem = simplifier.passes_as_before(maker, made)
        if problem:
            return problem
        relabels.append((position, maker, made))
    if growth > 0:
        return f"its operands would take {growth:g} bytes more on the NPU than the tensor it removes"
    probe = unlinked_node(op=made_by.op, name=made_by.name, attrs=dict(made_by.attrs), inputs=probe_inputs,
                          outputs=[result], domain=made_by.domain)
    problem = simplifier.passes_as_before(made_by, probe)
    if problem:
        return problem
    for position, maker, made in relabels:
        operand, origin = made_by.inputs[position], maker.inputs[0]
        detach(maker)
        if made is None:
            set_input(made_by, position, origin)
            simplifier.drop(maker, "move_relabel_up")
            continue
        relabelled = made.outputs[0]
        kept = gs.Node(op="Reshape", name=made.name, inputs=[origin, made.inputs[1]], outputs=[relabelled])
        set_input(made_by, position, relabelled)
        simplifier.replace("move_relabel_up", [maker], [kept])
    for position, operand in enumerate(probe_inputs):
        if isinstance(operand, gs.Constant) and operand is not made_by.inputs[position]:
            set_input(made_by, position, operand)
    detach(node)
    set_output(made_by, 0, result)
    simplifier.ctx.failures[made_by.name] = simplifier.failures(made_by)
    simplifier.drop(node, "move_relabel_up")
    return True


# --- relabels_above_split ---------------------------------------------------------------------


def _split_family(pieces, inner: int, relabelled: dict[int, tuple[int, ...]]):
    """(axis, moved pieces) of the largest set of `relabelled` pieces (piece -> target shape)
    that are the pieces of one tensor cut along `axis`: their shapes agree off it, every axis
    before it has extent 1, and each piece keeps its count of elements past the cut; None."""
    best = None
    for template in relabelled.values():
        for axis in range(len(template)):
            if element_count(template[:axis]) != 1:
                break
            past = element_count(template[axis + 1:])
            moved = [i for i, shape in relabelled.items()
                     if len(shape) == len(template) and shape[:axis] == template[:axis]
                     and shape[axis + 1:] == template[axis + 1:] and shape[axis] * past == pieces[i] * inner]
            if best is None or len(moved) > len(best[1]):
                best = (axis, moved)
    return best


def relabels_above_split(node: gs.Node, simplifier: _Simplifier):
    """Relabels of most outputs of a Split, whose input a relabel read by it alone makes, are
    made once on the Split's input instead: the Split then cuts the relabelled tensor along the
    axis each piece's cut becomes, and the other outputs are relabelled back below it. Exact
    when the cut is in whole blocks of contiguous elements on both sides (the axes before each
    cut have extent 1): every piece holds the same elements in the same order. The input's
    relabel and the moved one are one node, so more than half the outputs moving leaves fewer
    nodes (timm's cross-covariance attention: q and k relabelled to a 1x1 Conv's tokens after
    the q/k/v unbinding, which then take one Transpose before it)."""
    if node.op != "Split" or not is_onnx_domain(node) or len(node.outputs) < 2:
        return None
    x = node.inputs[0]
    shape = static_shape(x)
    maker = _relabel_making(x)
    if shape is None or maker is None or len(x.outputs) != 1 or x.name in simplifier.graph_outputs:
        return None
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    outputs = [static_shape(out) for out in node.outputs]
    if any(out is None for out in outputs) or element_count(shape[:axis]) != 1:
        return "its cut is not in whole blocks of elements of known shapes"
    relabelled = {}
    for i, out in enumerate(node.outputs):
        readers = out.outputs
        if (len(readers) == 1 and out.name not in simplifier.graph_outputs and readers[0].inputs[0] is out
                and readers[0].outputs and _relabel_making(readers[0].outputs[0])):
            relabelled[i] = tuple(static_shape(readers[0].outputs[0]))
    inner = element_count(shape[axis + 1:])
    pieces = [out[axis] for out in outputs]
    family = _split_family(pieces, inner, relabelled) if relabelled else None
    if family is None or 2 * len(family[1]) <= len(node.outputs):
        return "no more than half its outputs take one relabel of their pieces"
    cut, moved = family
    template = relabelled[moved[0]]
    past = element_count(template[cut + 1:])
    if any(pieces[i] * inner % past for i in range(len(pieces))):
        return "an output it keeps is not a whole number of pieces along the moved cut"
    sizes = [pieces[i] * inner // past for i in range(len(pieces))]
    whole = template[:cut] + (sum(sizes),) + template[cut + 1:]
    kept_shapes = {i: template[:cut] + (sizes[i],) + template[cut + 1:] for i in range(len(pieces)) if i not in moved}
    growth = (simplifier.stored_bytes(whole) + sum(simplifier.stored_bytes(s) for s in kept_shapes.values())
              - simplifier.stored_bytes(shape) - sum(simplifier.stored_bytes(outputs[i]) for i in moved))
    if growth > 0:
        return f"its tensors would take {growth:g} bytes more on the NPU than those it removes"
    origin = maker.inputs[0]
    relabels = [node.outputs[i].outputs[0] for i in moved]
    new_outputs = [relabels[moved.index(i)].outputs[0] if i in moved
                   else gs.Variable(simplifier.fresh(f"{node.outputs[i].name}/cut"), node.outputs[i].dtype,
                                    list(kept_shapes[i]))
                   for i in range(len(pieces))]
    source = origin
    checks = []  # (node the probe stands for, probe)
    if tuple(static_shape(origin)) != whole:
        source = gs.Variable(simplifier.fresh(f"{x.name}/relabelled"), x.dtype, list(whole))
        shape_input = gs.Constant(simplifier.fresh(f"{maker.name}/shape"), np.array(whole, dtype=np.int64))
        checks.append((maker, unlinked_node(op="Reshape", name=simplifier.fresh(f"{maker.name}/relabelled"),
                                            inputs=[origin, shape_input], outputs=[source])))
    name = simplifier.fresh(f"{node.name}/moved")
    if simplifier.ctx.graph.opset >= 13:
        sizes_input = gs.Constant(simplifier.fresh(f"{name}/sizes"), np.array(sizes, dtype=np.int64))
        inputs, attrs = [source, sizes_input], {"axis": cut}
    else:
        inputs, attrs = [source], {"axis": cut, "split": sizes}
    checks.append((node, unlinked_node(op="Split", name=name, attrs=attrs, inputs=inputs, outputs=new_outputs)))
    for i in kept_shapes:
        shape_input = gs.Constant(simplifier.fresh(f"{node.outputs[i].name}/shape"),
                                  np.array(outputs[i], dtype=np.int64))
        back = unlinked_node(op="Reshape", name=simplifier.fresh(f"{node.outputs[i].name}/relabelled"),
                             inputs=[new_outputs[i], shape_input], outputs=[node.outputs[i]])
        checks.append((relabels[0], back))
    for old, probe in checks:
        problem = simplifier.passes_as_before(old, probe)
        if problem:
            return problem
    for old in [maker, node, *relabels]:
        detach(old)
    linked = [gs.Node(op=n.op, name=n.name, attrs=n.attrs, inputs=list(n.inputs), outputs=list(n.outputs))
              for _, n in checks]
    simplifier.replace("relabels_above_split", [maker, node, *relabels], linked)
    return True


# --- transpose_with_unit_relabel --------------------------------------------------------------


def _moves_unit_axes_only(shape: tuple[int, ...], relabelled: tuple[int, ...]) -> bool:
    return [d for d in shape if d != 1] == [d for d in relabelled if d != 1]


def _composed_perm(source: tuple[int, ...], order: list[int], result: tuple[int, ...]) -> list[int]:
    """The perm of `source` making `result`, taking `source`'s axes of extent above 1 in
    `order` and its unit axes, in turn, where `result` has one."""
    kept, units = iter(order), iter(a for a, d in enumerate(source) if d == 1)
    return [next(units) if d == 1 else next(kept) for d in result]


def transpose_with_unit_relabel(node: gs.Node, simplifier: _Simplifier):
    """A relabel that only adds, drops or moves axes of extent 1, next to a Transpose (before it
    or after it, read by it alone), of the same rank at the two far ends: together they are one
    Transpose, taking the axes of extent above 1 in the Transpose's order, since axes of extent 1
    do not change where any element is. The rewrite pass leaves this form where a Transpose meets
    the relabel into a MatMul's 1x1 Conv layout ([1, L, C, 1] -> [L, C, 1, 1])."""
    move = layout_move(node)
    if move is None or move[2] is not None:
        return None
    source, result, _ = move
    if not _moves_unit_axes_only(static_shape(source), static_shape(result)):
        return None
    before = source.inputs[0] if len(source.inputs) == 1 else None
    after = result.outputs[0] if len(result.outputs) == 1 and result.name not in simplifier.graph_outputs else None
    for transpose, first, last in ((before, before, node), (after, node, after)):
        transpose_move = layout_move(transpose) if transpose is not None and transpose.op == "Transpose" else None
        if transpose_move is None or transpose_move[2] is None:
            continue
        between = first.outputs[0]
        if len(between.outputs) != 1 or between.name in simplifier.graph_outputs:
            continue
        start, end = static_shape(first.inputs[0]), static_shape(last.outputs[0])
        if len(start) != len(end):
            continue
        perm = transpose_move[2]
        if transpose is first:
            order = [p for p in perm if start[p] != 1]
        else:  # the relabel first: the Transpose's axes of extent above 1 are the source's, in order
            kept = [a for a, d in enumerate(start) if d != 1]
            mid = static_shape(between)
            rank_of = {a: i for i, a in enumerate(a for a, d in enumerate(mid) if d != 1)}
            order = [kept[rank_of[p]] for p in perm if mid[p] != 1]
        composed = _composed_perm(start, order, end)
        probe = unlinked_node(op="Transpose", name=transpose.name, attrs={"perm": composed},
                              inputs=[first.inputs[0]], outputs=[last.outputs[0]])
        problem = simplifier.passes_as_before(transpose, probe)
        if problem:
            return problem
        x, y = first.inputs[0], last.outputs[0]
        detach(first)
        detach(last)
        joined = gs.Node(op="Transpose", name=simplifier.fresh(f"{transpose.name}/joined"),
                         attrs={"perm": composed}, inputs=[x], outputs=[y])
        simplifier.replace("transpose_with_unit_relabel", [first, last], [joined])
        return True
    return None


# --- transposes_across_relabel -----------------------------------------------------------------


def _regrouping(shape: tuple[int, ...], relabelled: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """The relabel of `shape` to `relabelled` as blocks (axes of extent above 1 it reads, those
    it makes, of equal products), each one axis cut into several or several merged into one;
    None when a block does neither (a [6, 4] read as [4, 6])."""
    kept_in = [a for a, d in enumerate(shape) if d != 1]
    kept_out = [a for a, d in enumerate(relabelled) if d != 1]
    blocks, i, o = [], 0, 0
    while i < len(kept_in) and o < len(kept_out):
        ins, outs = [kept_in[i]], [kept_out[o]]
        have, want = shape[kept_in[i]], relabelled[kept_out[o]]
        i, o = i + 1, o + 1
        while have != want:
            if have < want and i < len(kept_in):
                have *= shape[kept_in[i]]
                ins.append(kept_in[i])
                i += 1
            elif want < have and o < len(kept_out):
                want *= relabelled[kept_out[o]]
                outs.append(kept_out[o])
                o += 1
            else:
                return None
        if len(ins) > 1 and len(outs) > 1:
            return None
        blocks.append((ins, outs))
    return blocks if i == len(kept_in) and o == len(kept_out) else None


def transposes_across_relabel(node: gs.Node, simplifier: _Simplifier):
    """A Transpose, a relabel read by it alone and a Transpose reading that alone, where the
    relabel only merges axes (maxvit's grid partition: a rank-6 Transpose, [1, 7, 7, 8, 8, C]
    merged to [1, 49, 64, C], and the swap of its two middle axes) or only cuts them (the grid's
    reverse): the second Transpose moves the merged axes whole, or the pieces of each cut one,
    so both moves are one Transpose of the first's input (its axes cut first when the relabel
    cuts), and a relabel to the result (none when the relabel cut). Two nodes for three, moving
    the same elements once instead of twice. Exact: only where elements are stored changes."""
    move = layout_move(node)
    if move is None or move[2] is None:
        return None
    between, y, second_perm = move
    relabel = _relabel_making(between)
    if relabel is None:
        return None
    made = relabel.inputs[0]
    first = made.inputs[0] if len(made.inputs) == 1 else None
    first_move = layout_move(first) if first is not None and first.op == "Transpose" else None
    if first_move is None:
        return None
    inner = (made, between)
    if any(len(t.outputs) != 1 or t.name in simplifier.graph_outputs for t in inner):
        return "the tensors between the Transposes are read elsewhere"
    blocks = _regrouping(static_shape(made), static_shape(between))
    if blocks is None:
        return "the relabel between the Transposes neither only merges nor only cuts axes"
    x, first_perm = first.inputs[0], first_move[2]
    x_shape, between_shape, y_shape = (static_shape(t) for t in (x, between, y))
    cuts = any(len(outs) > 1 for _, outs in blocks)
    if cuts and any(len(ins) > 1 for ins, _ in blocks):
        return "the relabel between the Transposes both merges and cuts axes"
    # the pieces: x's axes, or with cuts, the relabel's axes of extent above 1 in x's order
    block_of = {o: b for b, (_, outs) in enumerate(blocks) for o in outs}
    if cuts:
        by_x_order = sorted(range(len(blocks)), key=lambda b: first_perm[blocks[b][0][0]])
        pieces = [o for b in by_x_order for o in blocks[b][1]]
        cut_shape = [1] * sum(d == 1 for d in y_shape) + [between_shape[o] for o in pieces]
        units = len(cut_shape) - len(pieces)
        order = [units + pieces.index(o) for o in second_perm if between_shape[o] != 1]
        perm = _composed_perm(tuple(cut_shape), order, y_shape)
        moved_shape = list(y_shape)
    else:
        order = [first_perm[a] for o in second_perm if between_shape[o] != 1 for a in blocks[block_of[o]][0]]
        perm = [a for a, d in enumerate(x_shape) if d == 1] + order
        moved_shape = [x_shape[a] for a in perm]
    transpose = unlinked_node(op="Transpose", name=node.name, attrs={"perm": perm},
                              inputs=[gs.Variable("probe_in", x.dtype, cut_shape if cuts else x_shape)],
                              outputs=[gs.Variable("probe_out", y.dtype, moved_shape)])
    # Before the rewrites, a joined Transpose breaking a rule one of the two broke is legalized
    # as that one would have been (a rank-6 move in legal steps); after them, only where both broke one.
    broke = [bool(simplifier.failures(old)) for old in (first, node)]
    breaks = simplifier.failures(transpose)
    if breaks and not (all(broke) if simplifier.fused else any(broke)):
        return f"the joined Transpose would break: {breaks[0]}"
    for old in (first, relabel, node):
        detach(old)
    new = []
    source = x
    if cuts:
        source = gs.Variable(simplifier.fresh(f"{first.name}/cut"), x.dtype, cut_shape)
        shape = gs.Constant(simplifier.fresh(f"{first.name}/cut_shape"), np.array(cut_shape, np.int64))
        new.append(gs.Node(op="Reshape", name=simplifier.fresh(f"{first.name}/cut"), inputs=[x, shape], outputs=[source]))
    moved = y if list(moved_shape) == list(y_shape) else gs.Variable(simplifier.fresh(f"{node.name}/moved"), x.dtype, moved_shape)
    new.append(gs.Node(op="Transpose", name=simplifier.fresh(f"{node.name}/joined"), attrs={"perm": perm},
                       inputs=[source], outputs=[moved]))
    if moved is not y:
        shape = gs.Constant(simplifier.fresh(f"{node.name}/shape"), np.array(y_shape, np.int64))
        new.append(gs.Node(op="Reshape", name=simplifier.fresh(f"{node.name}/relabel"), inputs=[moved, shape], outputs=[y]))
    simplifier.replace("transposes_across_relabel", [first, relabel, node], new)
    return True


# --- transpose_beside_relabel -------------------------------------------------------------------


def transpose_beside_relabel(node: gs.Node, simplifier: _Simplifier):
    """After the rewrites, a relabel that only cuts axes, read by a Transpose alone that keeps
    each cut axis' pieces together and in order, is a Transpose of the relabel's input moving
    the uncut axes, then a relabel cutting them; and a Transpose read by a relabel alone that
    only merges axes the Transpose put next to each other in their order is a relabel merging
    them first, then the Transpose. Taken when the relabel so placed leaves the NPU's stored
    bytes as they are (an alias, no step: passes/alias.py) where it did not before, and the
    Transpose passes the target's rules as the old one did: one data movement instead of two.
    A MatMul's 1x1 Conv layout [L, C, 1, 1] relabelled to tokens [1, H, W, C] and Transposed to
    the feature map [1, C, H, W] becomes one Transpose to [1, C, 1, L], stored as [1, C, H, W] is
    (SegFormer's switch from tokens to its depthwise Conv); [1, C, H, W] to tokens the same way
    back. Exact: only where elements are stored changes."""
    if not simplifier.fused:
        return None
    move = layout_move(node)
    if move is None or move[2] is None:
        return None
    x, t, _ = move
    made, outcome = _relabel_making(x), None
    if made is not None and len(x.outputs) == 1 and x.name not in simplifier.graph_outputs:
        outcome = _relabel_then_transpose(made, node, simplifier)
    read = t.outputs[0] if len(t.outputs) == 1 and t.name not in simplifier.graph_outputs else None
    after = layout_move(read) if read is not None else None
    if outcome is not True and after is not None and after[2] is None:
        outcome = _transpose_then_relabel(node, read, simplifier) or outcome
    return outcome


def _relabel_making(tensor: gs.Tensor) -> gs.Node | None:
    """The relabel (of known shapes) that makes `tensor`, if one does."""
    maker = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    move = layout_move(maker) if maker is not None else None
    return maker if move is not None and move[2] is None else None


def _stores_alike(shape: tuple[int, ...], relabelled: tuple[int, ...], simplifier: _Simplifier,
                  elements: np.ndarray | None = None) -> bool:
    """Whether a relabel of `shape` to `relabelled` (or the move placing, at each element of
    `relabelled` in row-major order, the element `elements` numbers of `shape`) leaves each
    element where the NPU stores it (NC1HWC2, as numerics.nc1hwc2.stored_positions places it)."""
    if len(shape) > 4 or len(relabelled) > 4:
        return False
    c2 = simplifier.ctx.target.c2_for(simplifier.ctx.options.dtype)
    stored = stored_positions(shape, "NC1HWC2", c2).reshape(-1)
    return np.array_equal(stored if elements is None else stored[elements],
                          stored_positions(relabelled, "NC1HWC2", c2).reshape(-1))


def _joined_blocks(blocks, first: list[int]) -> list[int] | None:
    """The blocks in the order `first` (axes of extent above 1) lists their axes, each block's
    axes one run in their own order; None when a block's axes are apart or out of order."""
    block_of = {a: b for b, axes in enumerate(blocks) for a in axes}
    order, i = [], 0
    while i < len(first):
        axes = blocks[block_of[first[i]]]
        if first[i:i + len(axes)] != axes:
            return None
        order.append(block_of[first[i]])
        i += len(axes)
    return order


def _relabel_then_transpose(relabel: gs.Node, transpose: gs.Node, simplifier: _Simplifier):
    source, between = relabel.inputs[0], relabel.outputs[0]
    s_shape, b_shape = static_shape(source), static_shape(between)
    y_shape = static_shape(transpose.outputs[0])
    perm = layout_move(transpose)[2]
    blocks = _regrouping(s_shape, b_shape)
    if blocks is None or any(len(ins) > 1 for ins, _ in blocks):
        return None
    order = _joined_blocks([outs for _, outs in blocks], [p for p in perm if b_shape[p] != 1])
    if order is None:
        return "the Transpose splits or reorders the pieces the relabel cuts"
    axes = [blocks[b][0][0] for b in order]
    moved = _placement([s_shape[a] for a in axes], len(s_shape),
                       lambda shape: _stores_alike(shape, y_shape, simplifier))
    return _swap(relabel, transpose, source, moved, axes, False, simplifier)


def _transpose_then_relabel(transpose: gs.Node, relabel: gs.Node, simplifier: _Simplifier):
    x, t = transpose.inputs[0], transpose.outputs[0]
    x_shape, t_shape, y_shape = static_shape(x), static_shape(t), static_shape(relabel.outputs[0])
    perm = layout_move(transpose)[2]
    blocks = _regrouping(t_shape, y_shape)
    if blocks is None or any(len(outs) > 1 for _, outs in blocks):
        return None
    # the x axes each block's elements come from, in t's order: one run of x's axes above extent 1
    sources = [[perm[a] for a in ins] for ins, _ in blocks]
    if _joined_blocks(sources, [a for a in range(len(x_shape)) if x_shape[a] != 1]) is None:
        return "the relabel merges axes the Transpose does not put together in their order"
    in_x_order = sorted(range(len(blocks)), key=lambda b: sources[b][0])
    merged = _placement([element_count([x_shape[a] for a in sources[b]]) for b in in_x_order], len(y_shape),
                        lambda shape: _stores_alike(x_shape, shape, simplifier))
    kept = [a for a, d in enumerate(merged or ()) if d != 1]
    order = [kept[in_x_order.index(b)] for b in range(len(blocks))] if merged else []
    return _swap(relabel, transpose, x, merged, order, True, simplifier)


def _placement(extents: list[int], rank: int, fits) -> tuple[int, ...] | None:
    """The first shape of `rank` holding `extents` in order, on axes of extent 1 otherwise, that
    `fits`; None when none does."""
    for places in itertools.combinations(range(rank), len(extents)):
        shape = [1] * rank
        for place, extent in zip(places, extents):
            shape[place] = extent
        if fits(tuple(shape)):
            return tuple(shape)
    return None


def _swap(relabel: gs.Node, transpose: gs.Node, x: gs.Tensor, middle: tuple[int, ...] | None, order: list[int],
          relabel_first: bool, simplifier: _Simplifier):
    """`relabel` and `transpose` (adjacent, from `x`) made again in the other order through a
    tensor of shape `middle`: the relabel first (of `x` to `middle`) when `relabel_first`, else
    the Transpose (to `middle`); the Transpose takes the axes above extent 1 in `order`. Why
    not, when the relabel, or the two together, move no stored byte already, `middle` is None (no
    shape makes the new relabel move none) or the Transpose would break a rule the old one passed."""
    if _stores_alike(static_shape(relabel.inputs[0]), static_shape(relabel.outputs[0]), simplifier):
        return "the relabel moves no stored byte already"
    first, second = (transpose, relabel) if relabel_first else (relabel, transpose)
    y = second.outputs[0]
    x_shape, y_shape = static_shape(x), static_shape(y)
    elements = np.arange(element_count(x_shape)).reshape(x_shape)
    for node in (first, second):
        perm = layout_move(node)[2]
        elements = elements.transpose(perm) if perm is not None else elements.reshape(static_shape(node.outputs[0]))
    if _stores_alike(x_shape, y_shape, simplifier, elements.reshape(-1)):
        return "the two together move no stored byte (an alias: passes/alias.py)"
    if middle is None:
        return "no shape the Transpose could make or read is a relabel moving no stored byte"
    start, end = (middle, y_shape) if relabel_first else (x_shape, middle)
    perm = _composed_perm(start, order, end)
    probe = unlinked_node(op="Transpose", name=transpose.name, attrs={"perm": perm},
                          inputs=[gs.Variable("probe_in", x.dtype, list(start))],
                          outputs=[gs.Variable("probe_out", y.dtype, list(end))])
    problem = simplifier.passes_as_before(transpose, probe)
    if problem:
        return problem
    detach(first)
    detach(second)
    between = gs.Variable(simplifier.fresh(f"{transpose.name}/swapped"), x.dtype, list(middle))
    shape = gs.Constant(simplifier.fresh(f"{relabel.name}/shape"),
                        np.array(middle if relabel_first else y_shape, np.int64))
    moved = gs.Node(op="Transpose", name=simplifier.fresh(f"{transpose.name}/swapped"), attrs={"perm": perm},
                    inputs=[between if relabel_first else x], outputs=[y if relabel_first else between])
    relabelled = gs.Node(op="Reshape", name=simplifier.fresh(f"{relabel.name}/swapped"),
                         inputs=[x if relabel_first else between, shape], outputs=[between if relabel_first else y])
    simplifier.replace("transpose_beside_relabel", [first, second],
                       [relabelled, moved] if relabel_first else [moved, relabelled])
    return True


# --- matmul_operands --------------------------------------------------------------------------

#: The fused attention kernel, and the matrix multiply every ONNX MatMul runs as (targets/common.py).
ATTENTION, MATMUL = "exSDPAttention", "exMatMul"
#: Ops every output element of which is one element of their first input, in an order fixed by
#: constant operands: the head merge after attention is made of these.
RELABELLING = frozenset({"Flatten", "Identity", "Reshape", "Squeeze", "Transpose", "Unsqueeze"})
#: ... and those that also leave elements out, or repeat them: the q/k/v split before it is made
#: of these too, and grouped-query attention's repeat of the key and value heads (Expand, Gather).
SELECTING = RELABELLING | {"Expand", "Gather", "Slice", "Split"}


def attention_operands(node: gs.Node, simplifier: _Simplifier):
    """An exSDPAttention reads its query, keys and values straight from the projections that
    make them, and writes its result straight into the layout the next projection reads: the
    head split (Reshape [.., S, H*D] -> [.., S, H, D], Transpose to [.., H, S, D]; the keys to
    [.., H, D, S]), the q/k/v split of one projection (Split, Slice, Gather) and the head merge
    after it (Transpose, Reshape) become members of the kernel, which reads and writes the
    projection's tensors whole. rknn-toolkit2 runs the same attention between a Reshape (and a
    Split) before and a Reshape after it; its exSDPAttention reads heads along the batch axis
    of the projection's NCHW layout, this kernel along its rows. Where the attention is not
    one kernel (a NaN guard after its Softmax), each matrix multiply of two computed tensors
    (exMatMul, alone or fused with its mask) reads its operands the same way.

    A member may only choose where the kernel reads or writes, never what it computes, so the
    rule absorbs only ops that select or place elements, and only when each operand is then a
    strided view of one tensor read as whole rows of the channels the kernel reads together:
    they run contiguously, within the tensor's innermost axis, every row starting on a
    multiple of their count. For exSDPAttention those are the head dimension D (seed 001: query,
    key, value and output all carry D as their channels): the last axis of the query, values
    and result, the second last of the transposed keys. For exMatMul they are the reduced axis
    K of both operands and the rows n of the result (seed 001, exMatMul: A [b,k,1,n],
    B [b,k,1,m], Y [b,n,1,m]): the last axis of A, the second last of B and of the result. The
    emulator runs the members, so the values are those of the ops absorbed (exact). An operand
    whose rows step over its source by a fixed stride other than the channels' (the values'
    tokens, the reduced axis of the second product, on a [L, C, 1, 1] projection) is read from
    one relabel of the source that stores them as channels (`_staging`): that step stays, the
    rest of the chain is absorbed."""
    return _absorb_operands(node, simplifier, (ATTENTION,))


def matmul_operands(node: gs.Node, simplifier: _Simplifier):
    """A matrix multiply of two computed tensors, fused or not, reads and writes its operands
    as `attention_operands` describes; it runs after the kernel fusions (SimplifyLayout.run)."""
    return _absorb_operands(node, simplifier, (MATMUL, "MatMul"))


def _absorb_operands(node: gs.Node, simplifier: _Simplifier, kernels: tuple[str, ...]):
    core = _kernel_core(node, simplifier, kernels)
    if core is None:
        return None
    kernel, members, outer, operands, result_axis = core
    opset = simplifier.ctx.graph.opset
    kept: list[gs.Tensor] = []  # operands read as they are: no view of their source is rows
    staged: dict[int, tuple] = {}  # operands read from their source relabelled (`_staging`)
    why = None
    while True:  # each round keeps one more operand as it is, stages it, or absorbs
        reads = _absorbable_reads(node, [t for t, _ in operands if all(t is not k for k in kept)], kept, simplifier)
        problems = [(t, problem) for t, problem in (_read_problems(reads, operands, opset) if reads else [])
                    if id(t) not in staged]
        if not problems:
            break
        why = why or problems[0][1]
        for tensor, _ in problems:
            stage = _staging(tensor, dict((id(t), axis) for t, axis in operands)[id(tensor)], reads, simplifier)
            if stage is None:
                kept.append(tensor)
            else:
                staged[id(tensor)] = stage
    after = writes = _absorbable_writes(node, simplifier)
    while writes and _write_problem(node.outputs[0], writes, result_axis, simplifier):
        writes = writes[:-1]
    if not reads and not writes:
        return why or (f"writing through {after[0].name}: {_write_problem(node.outputs[0], after, result_axis, simplifier)}"
                       if after else None)
    rule = "attention_operands" if kernel == ATTENTION else "matmul_operands"
    reads = [*(_stage(chain, source, shape, rule, simplifier) for chain, source, shape in staged.values()), *reads]
    _absorb(node, kernel, members, outer, reads, writes, simplifier)
    return True


def _staging(tensor: gs.Tensor, row_axis: int, reads: list[gs.Node], simplifier: _Simplifier):
    """(the chain of `reads` making operand `tensor` from one source, the source, its staged
    shape) when the chain is a strided view of the source whose rows step over it by a fixed
    stride s, but not along its channels (the values' tokens of a [L, C, 1, 1] projection, read
    by the scores' product as its reduced axis): the source relabelled to [1, size / s, s]
    stores those rows as channels, so one relabel step stays for a chain of two or more; None
    otherwise. rknn-toolkit2 likewise keeps one Reshape or Transpose before such an exMatMul."""
    made = {id(t): member for member in reads for t in member.outputs}
    chain, source = [], tensor
    while id(source) in made:
        producer = made[id(source)]
        computed = _computed_inputs(producer)
        if len(computed) != 1 or len(producer.outputs) != 1 or len(source.outputs) != 1:
            return None
        chain.insert(0, producer)
        source = computed[0]
    if len(chain) < 2:
        return None
    offsets = _element_indices(chain, simplifier.ctx.graph.opset)[0][tensor.name]
    stride, size = _stride(offsets, row_axis % offsets.ndim), element_count(static_shape(source))
    if stride < 1 or size % stride:
        return None
    shape = (1, size // stride, stride)
    if _row_problem(offsets, row_axis, shape, tensor.name) is not None:
        return None
    probe = unlinked_node(op="Reshape", name=f"{source.name}/staged", outputs=[gs.Variable(f"{source.name}/staged",
                          source.dtype, list(shape))], inputs=[source, gs.Constant(f"{source.name}/staged/shape",
                                                                                 np.array(shape, dtype=np.int64))])
    return None if simplifier.failures(probe) else (chain, source, shape)


def _stage(chain: list[gs.Node], source: gs.Tensor, shape: tuple[int, ...], rule: str, simplifier: _Simplifier) -> gs.Node:
    """The staging relabel of `source` into `shape`, a step of its own carrying the chain's
    original nodes; and the member relabelling it back, which the chain now reads: the kernel
    reads its operand from the staged tensor."""
    fresh = simplifier.fresh
    staged = gs.Variable(fresh(f"{source.name}/staged"), source.dtype, list(shape))
    relabel = _layout_node(source, staged, None, f"{chain[0].name}/staged", fresh)
    back = gs.Variable(fresh(f"{source.name}/unstaged"), source.dtype, static_shape(source))
    member = _layout_node(staged, back, None, f"{chain[0].name}/unstaged", fresh)
    set_input(chain[0], next(i for i, t in enumerate(chain[0].inputs) if t is source), back)
    simplifier.add(rule, relabel, tuple(dict.fromkeys(
        o for node in chain for o in simplifier.ctx.origins.get(node.name, (node.name,)))))
    simplifier.ctx.origins[member.name] = ()
    return member


def _kernel_core(node: gs.Node, simplifier: _Simplifier, kernels: tuple[str, ...]):
    """(kernel, its members, the outer tensor of each member's input by name, the operands with
    the axis their channels run along, the result's) for an exSDPAttention, an exMatMul, or a
    MatMul of two computed tensors on the NPU; None for any other node."""
    body = fused_body(node)
    if body is not None and node.domain == FUSED_DOMAIN and node.op in kernels:
        members = list(body.nodes)
        outer = dict(zip((t.name for t in body.inputs),
                         (t for t in node.inputs if t.name and not isinstance(t, gs.Constant))))
        outer.update((t.name, t) for t in node.inputs if isinstance(t, gs.Constant))
    elif (is_onnx_domain(node) and node.op in kernels and simplifier.ctx.target.has_kernel(MATMUL)
          and not simplifier.ctx.failures.get(node.name)):
        members, outer = [node], {t.name: t for t in node.inputs}
    else:
        return None
    roles = _operand_roles(members, {name for name, t in outer.items() if not isinstance(t, gs.Constant)},
                           node.op == ATTENTION)
    if not roles:
        return None
    operands = [(outer[name], axis) for name, axis in roles]
    return (ATTENTION if node.op == ATTENTION else MATMUL), members, outer, operands, -1 if node.op == ATTENTION else -2


def _operand_roles(members: list[gs.Node], computed: set[str], attention: bool) -> list[tuple[str, int]] | None:
    """(input name, the axis its channels run along) for the query, the transposed keys and the
    values of an attention, each traced through the constant scalings its pattern allows; or
    for the operands of a matrix multiply of two computed tensors (None when one is constant:
    weights are read as the kernel stores them). Only operands the kernel reads from outside."""
    made = {t.name: member for member in members for t in member.outputs if t.name}

    def source(tensor: gs.Tensor) -> str | None:
        name = tensor.name
        while name in made and made[name].op == "Mul":
            variables = [t for t in made[name].inputs if not isinstance(t, gs.Constant)]
            if len(variables) != 1:
                return None
            name = variables[0].name
        return name if name in computed else None

    matmuls = [member for member in members if member.op == "MatMul"]
    if not attention:
        if len(matmuls) != 1 or any(isinstance(t, gs.Constant) or t.name not in computed | set(made)
                                    for t in matmuls[0].inputs):
            return None
        roles = [(matmuls[0].inputs[0].name, -1), (matmuls[0].inputs[1].name, -2)]
    else:
        values = [m for m in matmuls if m.inputs[0].name in made and made[m.inputs[0].name].op == "Softmax"]
        scores = [m for m in matmuls if m not in values]
        if len(values) != 1 or len(scores) != 1:
            return None
        roles = [(source(scores[0].inputs[0]), -1), (source(scores[0].inputs[1]), -2), (source(values[0].inputs[1]), -1)]
    # an operand a member makes was absorbed already (an earlier application), or is computed
    # inside the kernel: nothing more to read for it
    return [(name, axis) for name, axis in roles if name in computed]


def _selects(node: gs.Node, ops: frozenset[str]) -> bool:
    """`node` is one of `ops` on computed tensors of known shape (a Concat's operands, any
    other op's first), its other operands constant."""
    data = len(node.inputs) if node.op == "Concat" else 1
    return (is_onnx_domain(node) and node.op in ops and bool(node.inputs)
            and all(not isinstance(t, gs.Constant) and static_shape(t) is not None for t in node.inputs[:data])
            and all(isinstance(t, gs.Constant) or not t.name for t in node.inputs[data:])
            and all(static_shape(t) is not None for t in node.outputs if t.name))


def _computed_inputs(node: gs.Node) -> list[gs.Tensor]:
    return [t for t in node.inputs if t.name and not isinstance(t, gs.Constant)]


def _in_order(members: list[gs.Node]) -> list[gs.Node]:
    """`members` in an order that runs them: each after the members making its inputs."""
    ordered, made, pending = [], set(), list(members)
    produced = {id(t) for member in members for t in member.outputs}
    while pending:
        ready = [m for m in pending if all(id(t) not in produced or id(t) in made for t in _computed_inputs(m))]
        ordered += ready
        made.update(id(t) for m in ready for t in m.outputs)
        pending = [m for m in pending if all(m is not r for r in ready)]
    return ordered


def _absorbable_reads(node: gs.Node, operands: list[gs.Tensor], kept: list[gs.Tensor],
                      simplifier: _Simplifier) -> list[gs.Node]:
    """The selecting ops between the operands and whatever computes them, each with all its
    results read by the kernel or by another of them (none of them an operand `kept` as it
    is), in an order that runs them."""
    inside: dict[int, gs.Node] = {}

    def read_inside(tensor: gs.Tensor) -> bool:
        return tensor.name not in simplifier.graph_outputs and all(tensor is not k for k in kept) and all(
            reader is node or id(reader) in inside for reader in tensor.outputs)

    grown = True
    while grown:
        grown = False
        for tensor in [*operands, *(t for member in list(inside.values()) for t in _computed_inputs(member))]:
            producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
            if (producer is not None and id(producer) not in inside and _selects(producer, SELECTING | {"Concat"})
                    and all(read_inside(t) for t in producer.outputs if t.name)):
                inside[id(producer)] = producer
                grown = True
    return _in_order(list(inside.values()))


def _absorbable_writes(node: gs.Node, simplifier: _Simplifier) -> list[gs.Node]:
    """The placing ops after the kernel (relabels, Splits and the Concats joining their parts)
    reading only its result or what another of them made, in an order that runs them."""
    inside: list[gs.Node] = []
    available = {id(node.outputs[0])}
    grown = True
    while grown:
        grown = False
        for tensor in [node.outputs[0], *(t for member in inside for t in member.outputs)]:
            for reader in tensor.outputs:
                if (all(reader is not member for member in inside)
                        and _selects(reader, RELABELLING | {"Concat", "Split"})
                        and all(id(t) in available for t in _computed_inputs(reader))):
                    inside.append(reader)
                    available.update(id(t) for t in reader.outputs)
                    grown = True
    return inside


def _written(result: gs.Tensor, writes: list[gs.Node], graph_outputs: set[str]) -> gs.Tensor | None:
    """The one tensor `writes` (run after the kernel making `result`) leave for other readers,
    when every other tensor they read or make is theirs alone; else None."""
    members = {id(member) for member in writes}
    tensors = [result, *(t for member in writes for t in member.outputs if t.name)]
    leaving = [t for t in tensors if t.name in graph_outputs or any(id(r) not in members for r in t.outputs)
               or not t.outputs]
    return leaving[0] if len(leaving) == 1 else None


def _element_indices(members: list[gs.Node], opset: int) -> tuple[dict[str, np.ndarray], list]:
    """Each tensor of `members` (run in order) as the global index of the element it holds of
    the tensors they read, numbered one after another; and those tensors with their first index."""
    values: dict[str, np.ndarray] = {}
    sources = []
    made = {t.name for member in members for t in member.outputs}
    start = 0
    for member in members:
        for source in _computed_inputs(member):
            if source.name not in made and source.name not in values:
                shape = static_shape(source)
                values[source.name] = np.arange(start, start + element_count(shape), dtype=np.int64).reshape(shape)
                sources.append((source, start))
                start += element_count(shape)
        operands = [values[t.name] if t.name in values else (constant_value(t) if t.name else None)
                    for t in member.inputs]
        results = evaluate_on(member, operands, opset)
        if results is None:
            raise ValueError(f"onnx.reference cannot run {member.op} on its own")
        values.update(zip((t.name for t in member.outputs if t.name), results))
    return values, sources


def _row_problem(offsets: np.ndarray, row_axis: int, shape: tuple[int, ...], what: str) -> str | None:
    """Why element offsets into a tensor of `shape` are no strided view of whole rows along
    `row_axis` (see matmul_operands); None when they are. A row runs along one axis of the
    tensor's stored 4-D view (numerics.nc1hwc2.as_nchw): its channels, each row starting on a
    multiple of its length (a [tokens, H*D, 1, 1] projection's heads; a feature map's channels
    in conv attention), or its spatial plane, within one plane. An axis other than the row's
    may read each of its blocks several times in turn (`_repeats_split`)."""
    if len(shape) > 4:
        return f"{what} is read from a tensor of rank {len(shape)}, which the NPU does not store"
    if offsets.ndim == 0:
        return None
    row_axis %= offsets.ndim
    view = _repeats_split(offsets, row_axis)
    base = int(view.flat[0])
    strides = [_stride(view, axis) for axis in range(view.ndim)]
    if not np.array_equal(view, base + np.tensordot(np.array(strides), np.indices(view.shape, dtype=np.int64), axes=1)):
        return f"{what} is not a strided view"
    row = offsets.shape[row_axis]
    if row == 1:
        return None
    _, channels, height, width = as_nchw(tuple(shape))
    plane = height * width
    starts = np.take(offsets, 0, axis=row_axis)
    row_stride = _stride(offsets, row_axis)
    if row_stride == plane and channels % row == 0 and not np.any((starts // plane) % channels % row):
        return None  # whole runs of channels (on a [L, C, 1, 1] tensor, plane 1: its rows)
    if row_stride == 1 and not np.any(starts % plane + row > plane):
        return None  # runs within one spatial plane
    return f"{what} is not whole rows of its {row} head channels"


def _stride(offsets: np.ndarray, axis: int) -> int:
    """The step of `offsets` from index 0 to 1 along `axis` (0 when the axis has one index)."""
    if offsets.shape[axis] == 1:
        return 0
    return int(offsets[tuple(1 if a == axis else 0 for a in range(offsets.ndim))]) - int(offsets.flat[0])


def _repeats_split(offsets: np.ndarray, row_axis: int) -> np.ndarray:
    """`offsets` with each axis but `row_axis` that reads every index r times in turn (r > 1
    dividing its extent) split into [extent / r, r]: grouped-query attention's key and value
    heads, each read by r query heads (Expand of an inserted axis, or Gather [0, 0, 1, 1, ...]),
    are then a strided view whose inner axis has step 0, read again for each of the r heads."""
    shape = []
    for axis, extent in enumerate(offsets.shape):
        profile = offsets[tuple(slice(None) if a == axis else 0 for a in range(offsets.ndim))]
        differs = np.flatnonzero(profile != profile[0])
        run = int(differs[0]) if differs.size else extent
        split = axis != row_axis and 1 < run < extent and extent % run == 0
        shape += [extent // run, run] if split else [extent]
    return offsets.reshape(shape)


def _read_problems(reads: list[gs.Node], operands: list[tuple[gs.Tensor, int]], opset: int) -> list[tuple[gs.Tensor, str]]:
    """Each operand the kernel cannot read through `reads`, with why."""
    values, sources = _element_indices(reads, opset)
    problems = []
    for tensor, row_axis in operands:
        indices = values.get(tensor.name)
        if indices is None:
            continue  # made outside: read as it is
        first = int(indices.flat[0])
        source, start = next((s, begin) for s, begin in reversed(sources) if begin <= first)
        offsets = indices - start
        if offsets.min() < 0 or offsets.max() >= element_count(static_shape(source)):
            problems.append((tensor, f"{tensor.name} reads more than one tensor"))
            continue
        problem = _row_problem(offsets, row_axis, static_shape(source), f"{tensor.name} in {source.name}")
        if problem:
            problems.append((tensor, problem))
    return problems


def _write_problem(result: gs.Tensor, writes: list[gs.Node], row_axis: int, simplifier: _Simplifier) -> str | None:
    """Why the kernel cannot write `result` through `writes` (None when it can)."""
    written = _written(result, writes, simplifier.graph_outputs)
    if written is None:
        return "the ops after it leave more than one tensor, or share one"
    values, _ = _element_indices(writes, simplifier.ctx.graph.opset)
    placed = values[written.name].reshape(-1)
    size = element_count(static_shape(result))
    if placed.size != size or np.unique(placed).size != size:
        return f"{written.name} does not hold each element of {result.name} once"
    offsets = np.empty(size, dtype=np.int64)
    offsets[placed] = np.arange(size)
    return _row_problem(offsets.reshape(static_shape(result)), row_axis, static_shape(written),
                        f"{result.name} in {written.name}")


def _absorb(node: gs.Node, kernel: str, core: list[gs.Node], outer: dict[str, gs.Tensor], reads: list[gs.Node],
            writes: list[gs.Node], simplifier: _Simplifier) -> None:
    """One `kernel` node in place of `node` (whose members are `core`) and the ops it absorbs;
    a fused node keeps its name and attributes."""
    members = [*reads, *core, *writes]
    made = {t.name for member in members for t in member.outputs if t.name}
    inputs: dict[str, gs.Tensor] = {}
    for member in members:
        inputs.update((t.name, outer.get(t.name, t)) for t in member.inputs if t.name and t.name not in made)
    outputs = [_written(node.outputs[0], writes, simplifier.graph_outputs)] if writes else list(node.outputs)
    fused = node.domain == FUSED_DOMAIN
    name = node.name if fused else simplifier.fresh(f"{kernel}:{node.name}")
    attrs = dict(node.attrs if fused else {}, members=[member.op for member in members],
                 body=body_graph(name, members, list(inputs.values()), outputs, simplifier.ctx.graph.opset))
    for old in [node, *reads, *writes]:
        detach(old)
    made = gs.Node(op=kernel, name=name, domain=FUSED_DOMAIN, attrs=attrs, inputs=list(inputs.values()), outputs=outputs)
    simplifier.replace("attention_operands" if kernel == ATTENTION else "matmul_operands", [node, *reads, *writes], [made])


#: The rules, in the order each node tries them; attention_operands and matmul_operands run after
#: the kernel fusions (SimplifyLayout.run).
RULES = (identity_layout, shared_layout, slices_as_split, move_layout_down, move_relabel_up, relabels_above_split,
         transpose_with_unit_relabel, transposes_across_relabel, transpose_beside_relabel)
