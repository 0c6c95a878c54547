"""`attention_operands` and `matmul_operands`, after the kernel fusions: the ops that only select
or place the operands of an exSDPAttention or a matrix multiply of two computed tensors, and its
result, become members of the kernel, which reads and writes the projections' tensors as
strided views of whole rows. `kernel_path` and `kernel_exit_problem` tell `move_layout_down`
when such a kernel can take a move in."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, set_input, unlinked_node
from rkcompile.ir.graph import constant_value, element_count, fused_body, is_onnx_domain, static_shape
from rkcompile.numerics.nc1hwc2 import as_nchw
from rkcompile.plan.schema import FUSED_DOMAIN

from rkcompile.passes.fold_constants import evaluate_on
from rkcompile.passes.fuse import body_graph
from rkcompile.passes.simplify_layout.driver import Simplifier, layout_node


# --- attention_operands, matmul_operands ------------------------------------------------------

#: The fused attention kernel, and the matrix multiply every ONNX MatMul runs as (targets/common.py).
ATTENTION, MATMUL = "exSDPAttention", "exMatMul"
#: Ops every output element of which is one element of their first input, in an order fixed by
#: constant operands: the head merge after attention is made of these.
RELABELLING = frozenset({"Flatten", "Identity", "Reshape", "Squeeze", "Transpose", "Unsqueeze"})
#: ... and those that also leave elements out, or repeat them: the q/k/v split before it is made
#: of these too, and grouped-query attention's repeat of the key and value heads (Expand, Gather).
SELECTING = RELABELLING | {"Expand", "Gather", "Slice", "Split"}


def attention_operands(node: gs.Node, simplifier: Simplifier):
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


def matmul_operands(node: gs.Node, simplifier: Simplifier):
    """A matrix multiply of two computed tensors, fused or not, reads and writes its operands
    as `attention_operands` describes; it runs after the kernel fusions (SimplifyLayout.run)."""
    return _absorb_operands(node, simplifier, (MATMUL, "MatMul"))


def _absorb_operands(node: gs.Node, simplifier: Simplifier, kernels: tuple[str, ...]):
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


def _staging(tensor: gs.Tensor, row_axis: int, reads: list[gs.Node], simplifier: Simplifier):
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


def _stage(chain: list[gs.Node], source: gs.Tensor, shape: tuple[int, ...], rule: str, simplifier: Simplifier) -> gs.Node:
    """The staging relabel of `source` into `shape`, a step of its own carrying the chain's
    original nodes; and the member relabelling it back, which the chain now reads: the kernel
    reads its operand from the staged tensor."""
    fresh = simplifier.fresh
    staged = gs.Variable(fresh(f"{source.name}/staged"), source.dtype, list(shape))
    relabel = layout_node(source, staged, None, f"{chain[0].name}/staged", fresh)
    back = gs.Variable(fresh(f"{source.name}/unstaged"), source.dtype, static_shape(source))
    member = layout_node(staged, back, None, f"{chain[0].name}/unstaged", fresh)
    set_input(chain[0], next(i for i, t in enumerate(chain[0].inputs) if t is source), back)
    simplifier.add(rule, relabel, tuple(dict.fromkeys(
        o for node in chain for o in simplifier.ctx.origins.get(node.name, (node.name,)))))
    simplifier.ctx.origins[member.name] = ()
    return member


def _kernel_core(node: gs.Node, simplifier: Simplifier, kernels: tuple[str, ...]):
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
                      simplifier: Simplifier) -> list[gs.Node]:
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


def _absorbable_writes(node: gs.Node, simplifier: Simplifier) -> list[gs.Node]:
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


def _write_problem(result: gs.Tensor, writes: list[gs.Node], row_axis: int, simplifier: Simplifier) -> str | None:
    """Why the kernel cannot write `result` through `writes` (None when it can)."""
    written = _written(result, writes, simplifier.graph_outputs)
    if written is None:
        return "the ops after it leave more than one tensor, or share one"
    values, _ = _element_indices(writes, simplifier.ctx.graph.opset)
    placed = values[written.name].reshape(-1)
    size = element_count(static_shape(result))
    # each element once: `size` indices in [0, size) that mark every one (np.unique sorted or
    # hashed them: 4.9 s of timm_mvitv2_tiny's 9 s plan, 79 results of up to 1.2M elements)
    marked = np.zeros(size, bool)
    in_range = placed.size == size and (size == 0 or (placed.min() >= 0 and placed.max() < size))
    if in_range:
        marked[placed] = True
    if not in_range or not marked.all():
        return f"{written.name} does not hold each element of {result.name} once"
    offsets = np.empty(size, dtype=np.int64)
    offsets[placed] = np.arange(size)
    return _row_problem(offsets.reshape(static_shape(result)), row_axis, static_shape(written),
                        f"{result.name} in {written.name}")


def _absorb(node: gs.Node, kernel: str, core: list[gs.Node], outer: dict[str, gs.Tensor], reads: list[gs.Node],
            writes: list[gs.Node], simplifier: Simplifier) -> None:
    """One `kernel` node in place of `node` (whose members are `core`) and the ops it absorbs;
    a fused node keeps its name and attributes."""
    members = [*reads, *core, *writes]
    made = {t.name for member in members for t in member.outputs if t.name}
    # what the members read from outside, by the name they read it by: the body's inputs, and
    # the tensors the node reads for them (a fused body may name an input otherwise: `outer`)
    read: dict[str, gs.Tensor] = {}
    for member in members:
        read.update((t.name, t) for t in member.inputs if t.name and t.name not in made)
    inputs = [outer.get(name, t) for name, t in read.items()]
    outputs = [_written(node.outputs[0], writes, simplifier.graph_outputs)] if writes else list(node.outputs)
    fused = node.domain == FUSED_DOMAIN
    name = node.name if fused else simplifier.fresh(f"{kernel}:{node.name}")
    attrs = dict(node.attrs if fused else {}, members=[member.op for member in members],
                 body=body_graph(name, members, list(read.values()), outputs, simplifier.ctx.graph.opset))
    for old in [node, *reads, *writes]:
        detach(old)
    made = gs.Node(op=kernel, name=name, domain=FUSED_DOMAIN, attrs=attrs, inputs=inputs, outputs=outputs)
    simplifier.replace("attention_operands" if kernel == ATTENTION else "matmul_operands", [node, *reads, *writes], [made])


# --- a move into the kernel (move_layout_down) ------------------------------------------------


def kernel_path(reader: gs.Node) -> tuple[list[gs.Node], gs.Node] | None:
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


def kernel_exit_problem(reader: gs.Node, position: int, unmoved, perm, simplifier: Simplifier) -> str | None:
    """Why the kernel `reader` leads to could not read its operand through the move made in
    front of `reader`'s input `position` (unmoved shape `unmoved`) and the ops between, as
    whole rows (`_row_problem`); None when it can, so matmul_operands takes the move in."""
    chain, kernel = kernel_path(reader)
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
    probe = layout_node(source, moved, perm, read.name, lambda name: name, unlinked_node)
    values, _ = _element_indices([probe, *chain], simplifier.ctx.graph.opset)
    return _row_problem(values[fed.name], row_axis, tuple(unmoved), f"{fed.name} in {read.name}")
