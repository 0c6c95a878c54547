"""Fold constants: evaluate every node whose inputs are all known, until nothing changes.

Exporters emit long Shape -> Gather -> Concat -> Reshape chains; folding them leaves the NPU
only the real work. Nodes are evaluated with onnx.reference's implementation of their op (the
source of op semantics the emulator's CPU fallback runs too), not a hand-written one, except the
few ops in NUMPY_EVALUATORS whose reference kernel fails on valid models; a node neither can
evaluate stays a node (logged), and runs as a step. The op's class runs on the node directly, as
onnx's ReferenceEvaluator runs each node of a graph, without building an evaluator and a
one-node graph per folded node (2.1 s of a 6,000-node transformer's 5.2 s plan); the evaluator
itself only runs the few ops whose implementation depends on context.
Constant and Identity, four folds in five over the zoos, are read off the node as onnx.reference
reads them (`_trivial_outputs`): a Constant's value is its attribute, an Identity's its input.
Shape and Size of statically shaped tensors fold from shape inference alone. ConstantOfShape
folds to a broadcast view, so even a huge fill never allocates memory.

Folding a node can make new shapes known: a Reshape whose target just folded has a known
output, so the Shape of it folds too, and so on down a chain of blocks each shaped by the one
before. Each sweep therefore infers, in topological order, the output shapes of every node
whose inputs are all known, and a chain folds in one sweep. Whole-graph shape inference then
runs between sweeps for what one node alone does not show. There is no round limit. One sweep
folds every node whose values it can know, so another runs only when whole-graph inference
has made the input of a Shape or Size static; each sweep that runs removes at least one node
from the graph, so the pass ends after at most as many sweeps as the graph has nodes.
"""
from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import shape_inference

from rkcompile.compiler.context import CompileContext
from rkcompile.errors import CompileError
from rkcompile.ir.edits import detach
from rkcompile.ir.graph import (FLOAT_DTYPES, SHAPE_DATA_MAX_ELEMENTS, constant_value, dtype_name,
    element_count, is_onnx_domain, node_proto, stored_elements,
    node_shape_model, present_inputs, shape_only_model, single_node_graph, static_shape, subgraphs,
    topological_nodes)
from rkcompile.ir.nodes import peeked_values, plain_attribute_key

NAME = "fold-constants"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"graph", "model_info", "origins"})
PROVIDES = frozenset({"fates", "graph", "origins"})

log = logging.getLogger("rkcompile")
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})
#: Outputs larger than this stay as nodes: folding them would only bloat the weights.
MAX_FOLDED_ELEMENTS = 1 << 24


def run(ctx: CompileContext) -> None:
    opset = ctx.model_info.opset
    inferences: dict[tuple, list] = {}  # _infer_node_shapes's answers, for this graph's opsets
    while True:
        before = len(ctx.graph.nodes)
        folded = _fold_sweep(ctx, opset, inferences)
        if not folded:
            return
        # The folded nodes, already retired and unlinked, leave the graph here rather than in
        # onnx-graphsurgeon's cleanup, which formats each node it drops for its log, constants
        # printed in full (a sixth of a 3,600-fold pass).
        ctx.graph.nodes = [node for node in ctx.graph.nodes if id(node) not in folded]
        ctx.cleanup_graph()
        if len(ctx.graph.nodes) >= before:
            # cannot happen (a folded node loses its outputs and cleanup drops it), and would loop
            raise AssertionError(f"constant folding folded nodes but the graph kept {before} nodes")
        # A sweep folds every node whose values it can know: in topological order, a node comes
        # after what its inputs' producers became (every Shape of a static input folded). So
        # another sweep folds only a Shape or Size whose input's shape whole-graph inference
        # finds, and that inference runs only while a shape is unknown. A second sweep that
        # folded nothing took 1-2 ms of most models' pass, 25 ms of
        # tv_ssdlite320_mobilenet_v3_large's, 6 ms of tv_fcos_resnet18_fpn's.
        if not any(static_shape(t) is None for n in ctx.graph.nodes for t in n.outputs):
            return
        _reinfer_shapes(ctx)
        if not any(map(_measures_static_shape, ctx.graph.nodes)):
            return


def _fold_sweep(ctx: CompileContext, opset: int, inferences: dict) -> set[int]:
    """Fold every node whose values can be known, in topological order; the ids of those folded.
    `inferences` keeps the per-node shape inferences' answers (`_infer_node_shapes`)."""
    folded = set()
    for node in topological_nodes(ctx.graph):
        unknown = any(static_shape(t) is None for t in node.outputs if t.name)
        if unknown and _evaluates_small(node):
            # Its values give its shapes: inferred only if it stays a node.
            values = _evaluate(node, opset)
            if values is None:
                _infer_node_shapes(ctx.graph, node, opset, inferences)
        else:
            if unknown:
                _infer_node_shapes(ctx.graph, node, opset, inferences)
            values = _evaluate(node, opset)
        if values is None:
            continue
        for tensor, value in zip(node.outputs, values):
            tensor.to_constant(value)
        detach(node)
        ctx.retire(node, "folded", "constant folded")
        folded.add(id(node))
    return folded


def _measures_static_shape(node: gs.Node) -> bool:
    """A Shape or Size node `_evaluate` folds: its input's shape is static."""
    return node.op in ("Shape", "Size") and is_onnx_domain(node) and static_shape(node.inputs[0]) is not None


#: Ops whose every output has at most as many elements as the product of their inputs' element
#: counts, Concat the sum (element-wise with broadcasting, selections, relabels, reductions, Shape,
#: Size).
BOUNDED_OUTPUT_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Mod", "Pow", "Min", "Max", "Neg", "Abs", "Ceil", "Floor", "Sqrt",
    "Reciprocal", "Sin", "Cos", "Log", "Exp", "Sign", "Clip", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where", "Cast", "Identity", "Concat", "Gather",
    "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Slice", "Transpose", "ScatterND", "ReduceMax",
    "ReduceMin", "ReduceSum", "ReduceProd", "ReduceMean", "ReduceL2", "CumSum", "Shape", "Size",
})


def _evaluates_small(node: gs.Node) -> bool:
    """Whether `node` can be evaluated before its output shapes are inferred, as inference would
    let it be: its outputs are bound to at most MAX_FOLDED_ELEMENTS elements by its op and its
    inputs (constants, or a Shape's or Size's input of static shape), so inference, whose only
    part in folding a node of known inputs is refusing larger outputs, would refuse nothing. A
    ConstantOfShape is never refused, and folds to a view. (A third of the per-node inferences of
    a sweep were for nodes folded right after: tv_swin_nano 507 of 885.)"""
    inputs = present_inputs(node)
    if node.op in ("Shape", "Size"):
        return len(inputs) == 1 and static_shape(inputs[0]) is not None
    if node.op not in BOUNDED_OUTPUT_OPS | {"ConstantOfShape"} or not all(isinstance(t, gs.Constant) for t in inputs):
        return False
    if node.op == "ConstantOfShape":
        return True
    bound = len(inputs)  # a Concat's sum of its inputs' counts is at most this many times their product
    for tensor in inputs:
        bound *= max(1, element_count(tensor.shape))
    return bound <= MAX_FOLDED_ELEMENTS


def _evaluate(node: gs.Node, opset: int) -> list[np.ndarray] | None:
    """The node's output values when they can be known now, else None."""
    if not is_onnx_domain(node) or node.op in NONDETERMINISTIC or subgraphs(node):
        return None
    if node.op in ("Shape", "Size"):
        shape = static_shape(node.inputs[0])
        if shape is None:
            return None
        if node.op == "Size":
            return [np.array(element_count(shape), dtype=np.int64)]
        start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
        return [np.array(shape[start:end], dtype=np.int64)]
    inputs = present_inputs(node)
    if not all(isinstance(t, gs.Constant) for t in inputs):
        return _product_by_zeros(node)
    known = [static_shape(t) for t in node.outputs]
    if any(s is not None and element_count(s) > MAX_FOLDED_ELEMENTS for s in known):
        if node.op != "ConstantOfShape":
            return None
    if node.op == "ConstantOfShape":
        fill = node.attrs.get("value")
        fill = np.asarray(fill.values).reshape(-1)[0] if fill is not None else np.float32(0)
        shape = tuple(int(d) for d in np.asarray(inputs[0].values).reshape(-1))
        return [np.broadcast_to(np.asarray(fill), shape)]
    feeds = {t.name: np.asarray(t.values) for t in inputs}
    if node.op in NUMPY_EVALUATORS:
        try:
            return NUMPY_EVALUATORS[node.op](node, *feeds.values())
        except (ValueError, IndexError) as exc:  # indices out of range: left to the step to report
            log.warning("fold-constants: %s node %s is not folded: %s", node.op, node.name, exc)
            return None
    try:
        results = _reference_outputs(node, opset)
    except Exception as exc:  # noqa: BLE001  (onnx.reference raises its own classes, or numpy's)
        # onnx.reference lacks some cases onnxruntime runs: the node stays, and runs as a step.
        log.warning("fold-constants: %s node %s is not folded: onnx.reference cannot evaluate it (%s)",
                    node.op, node.name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    return [np.asarray(r) for r in results]


#: products whose result a constant operand of zeros decides, with the positions of the operands
#: that may be that constant (a Conv's or Gemm's weight; either side of a MatMul or Mul)
ZERO_DECIDED = {"Conv": (1,), "ConvTranspose": (1,), "Gemm": (0, 1), "MatMul": (0, 1), "Mul": (0, 1)}


def _product_by_zeros(node: gs.Node) -> list[np.ndarray] | None:
    """The output of a product by an all-zero constant, known without its computed operand: a
    Conv or ConvTranspose whose weights are zero writes its bias on every position, a Gemm
    beta*C, a MatMul or Mul zeros. Random-init exports are full of these: timm and torchvision
    zero-initialise the last norm of each residual branch, so the branch adds zeros, and
    rknn-toolkit2 folds it away (efficientvit_m0: 28 NPU layers). Exact for every finite
    input; an inf or NaN input, which would have made NaNs, gives the same values as a finite
    one. A broadcast view, so a large output allocates nothing; None when the node is no such
    product or its output shape is not static."""
    positions = ZERO_DECIDED.get(node.op)
    shape = static_shape(node.outputs[0]) if positions and len(node.outputs) == 1 else None
    if shape is None or not is_onnx_domain(node) or len(node.inputs) < 2:
        return None
    dtype = dtype_name(node.outputs[0].dtype)
    zero_operands = [p for p in positions if _all_zeros(node.inputs[p])]
    if dtype not in FLOAT_DTYPES or not zero_operands:
        return None
    result = np.zeros((), dtype=dtype)
    offset = constant_value(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    if node.op in ("Conv", "ConvTranspose") and offset is not None:
        result = offset.astype(dtype).reshape((-1,) + (1,) * (len(shape) - 2))
    elif node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2].name:
        if offset is None:
            return None
        result = (offset * np.asarray(node.attrs.get("beta", 1.0), dtype=offset.dtype)).astype(dtype)
    elif len(node.inputs) > 2 and node.inputs[2].name:
        return None  # a bias that is computed: its values are not known
    return [np.broadcast_to(result, tuple(shape))]


def _all_zeros(tensor: gs.Tensor) -> bool:
    """Whether `tensor` is a float constant of zeros only; read without keeping a copy (a float16
    plan never reads most weights again)."""
    values = peeked_values(tensor) if isinstance(tensor, gs.Constant) else None
    return values is not None and values.dtype.kind == "f" and values.size > 0 and not stored_elements(values).any()


def _gather_elements(node: gs.Node, data: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    """GatherElements by its definition, out[i..][j][k..] = data[i..][indices[i..][j][k..]][k..]
    on `axis` (negative indices count from the end). onnx.reference's kernel builds it with
    np.choose, which takes at most 64 choices (32 on older numpy), and fails on any gathered
    axis longer than that; its fallback fails whenever the indices are narrower than the data
    (transformers' token_type_ids buffer, [1, max_positions] gathered to [1, sequence])."""
    axis = int(node.attrs.get("axis", 0)) % data.ndim
    if indices.ndim != data.ndim:
        raise ValueError(f"indices of rank {indices.ndim} for data of rank {data.ndim}")
    size = data.shape[axis]
    if np.any((indices < -size) | (indices >= size)):
        raise IndexError(f"an index is outside [-{size}, {size - 1}]")
    if any(n > d for a, (n, d) in enumerate(zip(indices.shape, data.shape)) if a != axis):
        raise ValueError(f"indices {list(indices.shape)} are wider than the data {list(data.shape)}")
    # The output is the indices' shape: on every other axis the data is read from 0 only as far
    # as the indices reach.
    window = tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(indices.shape))
    return [np.take_along_axis(data[window], np.where(indices < 0, indices + size, indices).astype(np.int64), axis)]


#: Ops folded by numpy instead of onnx.reference, whose kernel for them fails on valid models.
NUMPY_EVALUATORS = {"GatherElements": _gather_elements}


def _reference_outputs(node: gs.Node, opset: int) -> list:
    """onnx.reference's values for the named outputs of `node`, whose inputs are constants:
    the op's implementation run as ReferenceEvaluator.run runs a node (an omitted optional
    input is None), or the evaluator itself for an op whose implementation needs context."""
    known = _trivial_outputs(node)
    if known is not None:
        return known
    values = evaluate_on(node, [np.asarray(t.values) if t.name else None for t in node.inputs], opset)
    if values is not None:
        return values
    from onnx.reference import ReferenceEvaluator

    feeds = {t.name: np.asarray(t.values) for t in present_inputs(node)}
    return ReferenceEvaluator(single_node_graph(node), opsets={"": opset}).run(None, feeds)


def evaluate_on(node: gs.Node, values: list[np.ndarray | None], opset: int) -> list[np.ndarray] | None:
    """onnx.reference's values of `node`'s named outputs on `values` (one per input, None for an
    omitted one) rather than on its inputs' own, or None when its op's implementation needs the
    evaluator's context. The attention rule of passes/simplify_layout/kernel_operands.py runs
    layout ops on arrays of element indices with it, to see where each element comes from."""
    implementation = _implementation(node.op, opset)
    if implementation is None:
        return None
    instance = implementation(node_proto(node), _run_parameters(opset))
    if instance.need_context():
        return None
    results = instance.run(*values)
    return [np.asarray(value) for tensor, value in zip(node.outputs, results) if tensor.name]


#: Constant attributes holding a list or scalar, and the dtype onnx.reference's Constant gives them
_CONSTANT_LISTS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


def _trivial_outputs(node: gs.Node) -> list[np.ndarray] | None:
    """What onnx.reference's Constant and Identity return, without it: a Constant's dense numeric
    value (its `value` tensor as numpy_helper.to_array reads it, or a value_float(s)/value_int(s)
    list as np.array of float32/int64) and a copy of Identity's input. None for anything else
    (strings, sparse values, non-numpy element types, other ops): onnx.reference runs those."""
    if node.op == "Identity" and len(node.inputs) == 1:
        value = np.asarray(node.inputs[0].values)
        return [value.copy()] if value.dtype.kind in "biuf" else None
    if node.op != "Constant" or len(node.attrs) != 1:
        return None
    (name, value), = node.attrs.items()
    if name == "value" and isinstance(value, gs.Constant):
        array = np.asarray(value.values)
        return [array] if array.dtype.kind in "biuf" else None
    if name in _CONSTANT_LISTS and isinstance(value, (int, float, list)):
        return [np.array(value, dtype=_CONSTANT_LISTS[name])]
    return None


@functools.cache
def _implementation(op: str, opset: int):
    """onnx.reference's class for an ai.onnx op at `opset` (as ReferenceEvaluator loads it),
    or None when it depends on the node's context."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import RuntimeContextError
    from onnx.reference.ops import load_op

    try:
        return load_op("", op, opset, evaluator_cls=ReferenceEvaluator)
    except RuntimeContextError:
        return None


@functools.cache
def _run_parameters(opset: int) -> dict:
    """What ReferenceEvaluator hands each op it builds, for a graph importing only ai.onnx."""
    from onnx.reference import ReferenceEvaluator

    return {"log": lambda pattern, *args: None, "opsets": {"": opset}, "verbose": 0, "new_ops": {},
            "existing_functions": {}, "evaluator_cls": ReferenceEvaluator}


def _infer_node_shapes(graph: gs.Graph, node: gs.Node, opset: int, inferences: dict) -> None:
    """`node`'s unknown output shapes from its inputs' shapes and its constant inputs' values,
    when all of those are known. What inference cannot tell is left unknown: whole-graph
    inference after the sweep says why, if anything needs it.

    `inferences` holds the answers found so far for `graph`'s opsets, by `_inference_key`:
    nodes alike but for their names get the same answer from the same one-node model, asked
    once (tv_ssdlite320_mobilenet_v3_large: 935 one-node inferences before, 422 now, most of
    them in its 90 classes' identical post-processing chains and again in a second sweep that
    folds nothing; timm_swin_tiny: 612 before, 220 now)."""
    inputs = present_inputs(node)
    if not is_onnx_domain(node) or subgraphs(node) or any(
            not isinstance(t, gs.Constant) and (static_shape(t) is None or t.dtype is None) for t in inputs):
        return
    key, params = _inference_key(node)
    answer = inferences.get(key) if key is not None else None
    if answer is None:
        try:
            model = shape_inference.infer_shapes(node_shape_model(node, opset, graph.import_domains), data_prop=True)
        except shape_inference.InferenceError:
            found = {}
        else:
            found = _inferred_types(model)
        answer = [(position, _numbered_dims(found[t.name][0], params), found[t.name][1])
                  for position, t in enumerate(node.outputs) if t.name in found]
        if key is not None and _UNNUMBERED not in (dims for _, dims, _ in answer):
            inferences[key] = answer
        else:  # written as found
            _set_types(((position, found[node.outputs[position].name]) for position, _, _ in answer), node.outputs)
            return
    names = list(params)
    _set_types(((position, (None if dims is None else [names[d.index] if isinstance(d, _Param) else d for d in dims],
                            elem_type)) for position, dims, elem_type in answer), node.outputs)


class _Param(NamedTuple):
    """The `index`-th distinct symbolic dim of a node's outputs, as `_inference_key` numbers them."""
    index: int


#: `_numbered_dims` of dims holding a symbolic dim the node's outputs did not have
_UNNUMBERED = "unnumbered"


def _numbered_dims(dims: list | None, params: dict[str, int]) -> tuple | str | None:
    """Inferred `dims` (None: no shape) with each symbolic dim written as its `_Param` in
    `params`, or _UNNUMBERED for a dim shape inference named itself: it picks a fresh unk__ name
    clear of the model's own, so two nodes of one key need not get the same one."""
    if dims is None:
        return None
    numbered = []
    for dim in dims:
        if isinstance(dim, str):
            if dim not in params:
                return _UNNUMBERED
            dim = _Param(params[dim])
        numbered.append(dim)
    return tuple(numbered)


def _inference_key(node: gs.Node) -> tuple[tuple | None, dict[str, int]]:
    """What `node_shape_model(node)` is made of except names, and the symbolic dims of its
    outputs numbered in order of appearance. Two nodes of one key make one model up to the names
    of their tensors, node and attribute tensors, which shape inference only matches up, and up
    to the spelling of those symbolic dims, which it keeps or tells apart but never reads (a
    node's inputs, inferred only when static, have none): the node's op, domain and attributes
    (`_attributes_key`); where each tensor name first appears among its inputs then outputs;
    each input's kind (a constant's dtype, shape and, when the model holds its data, its
    values; a variable's dtype and shape), each named output's dtype and shape, symbolic dims
    by number; a dtype by its type and value, as numpy's float64 dtype equals None. The key is
    None for a tensor of another kind (a sparse or sequence type, a non-numeric constant
    written into the model, a dim neither int, str nor None): such a node is inferred alone."""
    params: dict[str, int] = {}
    tensors = []
    positions: dict[str, int] = {"": -1}
    for tensor in (*node.inputs, *node.outputs):
        if positions.setdefault(tensor.name, len(positions)) != len(positions) - 1:
            continue  # omitted (''), or described where it first appears
        if isinstance(tensor, gs.Constant):
            if type(tensor) is not gs.Constant:  # a sparse constant
                return None, params
            shape = tuple(tensor.shape)
            small = element_count(shape) <= SHAPE_DATA_MAX_ELEMENTS
            values = np.asarray(tensor.values) if small else None
            if values is not None and values.dtype.kind not in "biuf":
                return None, params
            tensors.append((gs.Constant, type(tensor.dtype), tensor.dtype, type(tensor.export_dtype),
                            tensor.export_dtype, shape, tensor.data_location, values.tobytes() if small else None))
            continue
        if type(tensor) is not gs.Variable or tensor.type != "tensor_type":
            return None, params
        shape = None
        if tensor.shape is not None:
            shape = []
            for dim in tensor.shape:
                if isinstance(dim, str):
                    dim = _Param(params.setdefault(dim, len(params)))
                elif dim is not None and not isinstance(dim, (int, np.integer)):
                    return None, params
                shape.append(dim)
            shape = tuple(shape)
        tensors.append((gs.Variable, type(tensor.dtype), tensor.dtype, shape))
    wiring = tuple(positions[t.name] for t in (*node.inputs, *node.outputs))
    return (node.op, node.domain, _attributes_key(node), wiring, tuple(tensors)), params


def _attributes_key(node: gs.Node) -> tuple:
    """The node's attributes as a key: plain values, and lists of them, by name, type and
    value (`plain_attribute_key`); when any is of another kind (a tensor), all of them as
    exported, tensors without their names (exporters name ConstantOfShape's value after the node)."""
    plain = [plain_attribute_key(name, value) for name, value in node.attrs.items()]
    if None not in plain:
        return ("plain", *plain)
    proto = node_proto(node)
    for attribute in proto.attribute:
        for tensor in ([attribute.t] if attribute.HasField("t") else []) + list(attribute.tensors):
            tensor.ClearField("name")
    return ("exported", *(attribute.SerializeToString() for attribute in proto.attribute))


def _reinfer_shapes(ctx: CompileContext) -> None:
    """Shape inference over the folded graph, carried back onto the gs tensors."""
    model = shape_only_model(ctx.graph, ctx.model_info.opset)
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except shape_inference.InferenceError as exc:
        raise CompileError(f"shape inference after constant folding failed: {str(exc).splitlines()[0]}") from None
    _carry_back(inferred, ctx.graph.tensors().values())


def _carry_back(inferred: onnx.ModelProto, tensors) -> None:
    """Shapes and dtypes `inferred` found, onto those of `tensors` whose shape is not yet known
    (only theirs read off `inferred`: after folding, most tensors' shapes are known)."""
    unknown = {t.name: t for t in tensors if isinstance(t, gs.Variable) and static_shape(t) is None}
    found = _inferred_types(inferred, unknown)
    _set_types(((unknown[name], types) for name, types in found.items()), None)


def _inferred_types(inferred: onnx.ModelProto, wanted=None) -> dict[str, tuple]:
    """Tensor name -> (its dims, None for no shape; its element type, 0 for none) as `inferred`
    types it in its value_info and outputs (an output's entry over a value_info's), for the
    names in `wanted` (a container; None: all)."""
    found = {}
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        if wanted is not None and info.name not in wanted:
            continue
        tensor_type = info.type.tensor_type
        dims = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor_type.shape.dim]
                if tensor_type.HasField("shape") else None)
        found[info.name] = (dims, tensor_type.elem_type)
    return found


def _set_types(typed, outputs) -> None:
    """Each (tensor, or its position among `outputs`; (dims, element type)) of `typed` onto that
    tensor, if it is a variable whose shape is not yet known."""
    for which, (dims, elem_type) in typed:
        tensor = which if outputs is None else outputs[which]
        if isinstance(tensor, gs.Variable) and static_shape(tensor) is None:
            if dims is not None:
                tensor.shape = list(dims)
            if elem_type:
                tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
