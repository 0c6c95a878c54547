"""Relabels moved or joined beside the ops next to them: `move_relabel_up` (onto an element-wise
op's operands), `relabels_above_split` (once before a Split instead of after most of its
outputs), `transpose_with_unit_relabel` and `transposes_across_relabel` (into one Transpose),
and `transpose_beside_relabel` (to the side of a Transpose where it moves no stored byte)."""
from __future__ import annotations

import itertools

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.edits import detach, set_input, set_output, unlinked_node
from rkcompile.ir.graph import constant_value, element_count, is_onnx_domain, static_shape

from rkcompile.passes.simplify_layout.driver import ELEMENTWISE_OPS, Simplifier, layout_move


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


def move_relabel_up(node: gs.Node, simplifier: Simplifier):
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


def relabels_above_split(node: gs.Node, simplifier: Simplifier):
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


def transpose_with_unit_relabel(node: gs.Node, simplifier: Simplifier):
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


def transposes_across_relabel(node: gs.Node, simplifier: Simplifier):
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


def transpose_beside_relabel(node: gs.Node, simplifier: Simplifier):
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


def _relabel_then_transpose(relabel: gs.Node, transpose: gs.Node, simplifier: Simplifier):
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
                       lambda shape: simplifier.stores_alike(shape, y_shape))
    return _swap(relabel, transpose, source, moved, axes, False, simplifier)


def _transpose_then_relabel(transpose: gs.Node, relabel: gs.Node, simplifier: Simplifier):
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
                        lambda shape: simplifier.stores_alike(x_shape, shape))
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
          relabel_first: bool, simplifier: Simplifier):
    """`relabel` and `transpose` (adjacent, from `x`) made again in the other order through a
    tensor of shape `middle`: the relabel first (of `x` to `middle`) when `relabel_first`, else
    the Transpose (to `middle`); the Transpose takes the axes above extent 1 in `order`. Why
    not, when the relabel, or the two together, move no stored byte already, `middle` is None (no
    shape makes the new relabel move none) or the Transpose would break a rule the old one passed."""
    if simplifier.stores_alike(static_shape(relabel.inputs[0]), static_shape(relabel.outputs[0])):
        return "the relabel moves no stored byte already"
    first, second = (transpose, relabel) if relabel_first else (relabel, transpose)
    y = second.outputs[0]
    x_shape, y_shape = static_shape(x), static_shape(y)
    elements = np.arange(element_count(x_shape)).reshape(x_shape)
    for node in (first, second):
        perm = layout_move(node)[2]
        elements = elements.transpose(perm) if perm is not None else elements.reshape(static_shape(node.outputs[0]))
    if simplifier.stores_alike(x_shape, y_shape, elements.reshape(-1)):
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
