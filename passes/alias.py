"""Alias: relabels whose output holds exactly the stored bytes of what they read run as no step.

NPU tensors are stored NC1HWC2 (passes/layout.py), and many relabels leave those bytes as they
are: [1,C,H,W] -> [1,C,H*W] (stored (1,C,1,H*W) as `as_nchw` maps rank 3), a Squeeze or
Unsqueeze of unit axes that keeps the channels on axis 1, a Transpose moving only unit axes.
So do some chains of relabels whose tensors between them move bytes one step at a time: a
[1,C,H,W] feature map of C <= C2 channels (one block, stored pixel by pixel with its channels
innermost) Transposed to [1,H,W,C] and Reshaped to [H*W,C,1,1] ends where it started. The last
output of such a chain becomes an alias of the chain's input's storage
(`TensorPlacement.aliases`): the chain's steps go, the tensors between them leave the plan (each
was read only by the next relabel) and so do the weights only they read, the memory pass gives the output its source's offset instead
of bytes of its own, and a reader decodes the same bytes under the output's shape. The plan
writes the chain as the alias's `view`: the Reshapes and Transposes that take the source's
elements to the alias's, which plan readers that rebuild the graph run (rkcompile/plan/aliases.py).

Byte identity is proven, not listed: the chain's nodes run on an array of the source's element
indices (`evaluate_on`), so each element of the output is known by the source element it holds;
every one must sit at that element's position in the source's stored array (`stored_positions`,
under both tensors' layouts, dtype and C2), the two holding as many bytes of one dtype and the
same int8 parameters; and the `view` must give the same elements. Only NPU steps between arena
tensors qualify: a model input or output keeps its own region and layout, and a CPU step may run
inside one onnxruntime session with its neighbours.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.compiler.context import CompileContext
from rkcompile.ir.graph import element_count, is_onnx_domain, present_inputs, readers
from rkcompile.numerics.nc1hwc2 import stored_positions
from rkcompile.passes.fold_constants import evaluate_on
from rkcompile.plan.aliases import view_steps, viewed_indices
from rkcompile.plan.schema import Quantization, TensorPlacement
from rkcompile.targets.model import Target

NAME = "alias"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"fates", "graph", "order", "origins", "partitions", "placement", "quantization", "target",
                   "tensors"})
# quantization: the tensors between the relabels of an aliased chain leave the plan with their parameters
PROVIDES = frozenset({"fates", "order", "partitions", "quantization", "tensors"})

#: ops that only relabel or reorder their first input's elements; whether they move bytes is proven
RELABELS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
#: what a plan says of an original node whose every step became part of an alias
ALIASED_BECAUSE = ("relabel moving no stored bytes: its output, or that of the relabels after it, is the bytes "
                   "it reads under a new shape (an alias, no step)")


def run(ctx: CompileContext) -> None:
    nodes = {node.name: node for node in ctx.graph.nodes}
    reading = readers(ctx.graph)
    graph_outputs = {t.name for t in ctx.graph.outputs}
    tensors = dict(ctx.tensors)
    quantization = ctx.quantization
    writer: dict[str, str] = {t.name: name for name in ctx.order for t in nodes[name].outputs if t.name}
    gone: list[str] = []  # aliased relabels, in order
    for name in ctx.order:
        node = nodes[name]
        if not _is_relabel(node, ctx):
            continue
        chain = [node]
        while True:  # the relabels before it whose outputs only the next one reads
            between = chain[0].inputs[0].name
            earlier = nodes.get(writer.get(between, ""))
            if (earlier is None or not _is_relabel(earlier, ctx) or between in graph_outputs
                    or len(reading.get(between, ())) != 1 or tensors.get(between) is None
                    or tensors[between].region != "arena"):
                break
            chain.insert(0, earlier)
        for start in range(len(chain)):  # the longest chain first
            view = stored_as_is(chain[start:], tensors, quantization, ctx.target, ctx.graph.opset)
            if view is None:
                continue
            source = tensors[chain[start].inputs[0].name]
            output = node.outputs[0].name
            if source.aliases is not None:  # the view continues its source's, from the tensor with the bytes
                view = composed(source, view, tensors[output].shape)
            tensors[output] = replace(tensors[output], aliases=source.aliases or chain[start].inputs[0].name,
                                      view=view)
            for member in chain[start:-1]:
                tensors.pop(member.outputs[0].name, None)
            gone += [member.name for member in chain[start:] if member.name not in gone]
            break
    if not gone:
        return
    removed = set(gone)
    ctx.order = [name for name in ctx.order if name not in removed]
    # a weight only the aliased relabels read (a Reshape's shape) leaves the weight region
    still_read = {t.name for name in ctx.order for t in present_inputs(nodes[name])}
    for name in gone:
        for tensor in present_inputs(nodes[name])[1:]:
            if tensor.name not in still_read and tensors.get(tensor.name) is not None \
                    and tensors[tensor.name].region == "weight":
                del tensors[tensor.name]
    ctx.partitions = [(device, kept) for device, members in ctx.partitions
                      if (kept := [name for name in members if name not in removed])]
    running = {original for name in ctx.order for original in ctx.origins[name]}
    fates = dict(ctx.fates)
    for name in gone:
        fates.update((original, ("removed", ALIASED_BECAUSE)) for original in ctx.origins[name]
                     if original not in running)
    ctx.fates = fates
    # a fused step's quantized intermediate (passes/quantize.py) was never a stored tensor: kept
    dropped = set(ctx.tensors) - set(tensors)
    ctx.tensors = tensors
    ctx.quantization = {name: quant for name, quant in quantization.items() if name not in dropped}


def _is_relabel(node: gs.Node, ctx: CompileContext) -> bool:
    return (is_onnx_domain(node) and node.op in RELABELS and len(node.outputs) == 1 and bool(node.inputs)
            and ctx.placement[node.name].device == "npu"
            and all(isinstance(t, gs.Constant) for t in node.inputs[1:] if t.name))


def stored_as_is(chain: list[gs.Node], tensors: dict[str, TensorPlacement], quantization: dict[str, Quantization],
                 target: Target, opset: int) -> tuple | None:
    """The view (`TensorPlacement.view`) taking the first relabel's input to the last one's
    output, when `chain` (relabels, each reading the one before) moves none of its stored bytes
    as `tensors` place them: both arena tensors of one dtype, size and int8 parameters, each
    element of the output at the position the input stores it. None when it moves any."""
    first, last = chain[0].inputs[0].name, chain[-1].outputs[0].name
    source, result = tensors.get(first), tensors.get(last)
    # every tensor of the chain in one dtype and int8 parameters: no relabel rounds or requantizes
    chained = [first, *(node.outputs[0].name for node in chain)]
    if (source is None or result is None or source.region != "arena" or result.region != "arena"
            or source.bytes != result.bytes or not source.bytes or source.shape is None or result.shape is None
            or len({tensors[name].dtype for name in chained if name in tensors}) != 1
            or len({_parameters(quantization.get(name)) for name in chained}) != 1):
        return None
    indices = np.arange(element_count(source.shape), dtype=np.int64).reshape(source.shape)
    moved = indices
    for node in chain:
        results = evaluate_on(node, [moved, *(np.asarray(t.values) if t.name else None for t in node.inputs[1:])],
                              opset)
        if results is None:
            return None
        moved = results[0]
    # every element at its source's stored position: as no two elements of a tensor share one,
    # no source element is then held twice, and the chain is a one-to-one relabel
    if moved.shape != tuple(result.shape):
        return None
    if not np.array_equal(_positions(source, target).reshape(-1)[moved.reshape(-1)],
                          _positions(result, target).reshape(-1)):
        return None
    view = _view(chain)
    return view if np.array_equal(viewed_indices(tuple(source.shape), tuple(result.shape), view), moved) else None


def composed(source: TensorPlacement, view: tuple, shape: tuple[int, ...]) -> tuple:
    """The view from the tensor an alias `source` is the bytes of, through `source`'s view, then
    `view` (from `source` to a tensor of `shape`): an empty view is a Reshape to its tensor's shape."""
    steps = view_steps(tuple(source.shape), source.view) + view_steps(tuple(shape), view)
    return () if all(op == "Reshape" for op, _ in steps) else steps


def _view(chain: list[gs.Node]) -> tuple:
    """The chain as the plan writes an alias's view: ("Transpose", perm) for a Transpose, and
    ("Reshape", shape) for the relabels that keep row-major order; empty when the elements end
    in their row-major order (the alias is a Reshape of its source)."""
    view = []
    for node in chain:
        if node.op == "Transpose":
            rank = len(node.inputs[0].shape)
            view.append(("Transpose", tuple(int(a) for a in node.attrs.get("perm", range(rank - 1, -1, -1)))))
        else:
            view.append(("Reshape", tuple(int(d) for d in node.outputs[0].shape)))
    return () if all(op == "Reshape" for op, _ in view) else tuple(view)


def _positions(tensor: TensorPlacement, target: Target) -> np.ndarray:
    c2 = target.c2_for(tensor.dtype) if tensor.layout == "NC1HWC2" else None
    return stored_positions(tuple(tensor.shape), tensor.layout, c2)


def _parameters(quant: Quantization | None) -> tuple | None:
    """What decides an integer tensor's real values: the same stored bytes mean the same numbers
    only under the same parameters."""
    return None if quant is None else (quant.dtype, quant.scales, quant.zero_points, quant.axis)
