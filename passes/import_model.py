"""Import: load the ONNX file safely, validate it, fix input shapes and infer every shape.

Validation happens here, before any pass sees the graph, so every problem with the user's file
becomes one clear CompileError: unreadable files, external data outside the model's folder,
opsets we do not cover, undefined tensors, cycles, bad or dynamic input dims, and weights whose
shapes contradict their ops (strict shape inference catches those).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from onnx import external_data_helper, shape_inference

from rkcompile.compiler.context import CompileContext
from rkcompile.errors import CompileError
from rkcompile.ir.graph import SHAPE_DATA_MAX_ELEMENTS, dtype_name, element_count, unique_name
from rkcompile.plan.schema import ModelInfo, TensorSpec

NAME = "import"
#: the CompileContext fields this pass reads, and those it sets or changes (pipeline.check_contract)
NEEDS = frozenset({"model_path", "options"})
PROVIDES = frozenset({"graph", "model_info", "original_nodes", "origins"})

MIN_OPSET = 1
MAX_OPSET = onnx.defs.onnx_opset_version()


def run(ctx: CompileContext) -> None:
    model, data, sha256, carriers = _load(ctx.model_path)
    graph = model.graph
    renamed = _name_nodes(graph)
    reordered = _check_tensors_defined_and_acyclic(graph)
    if reordered:
        carriers = None  # their positions changed
    opset = _default_opset(model)
    batch_dims, filled = _batch_dims(graph, ctx.options)
    _set_input_shapes(graph, ctx.options.input_shapes, filled)
    _refuse_optional_outputs(graph)
    # The checker and shape inference read a copy without the large weights when there is one
    # (`_without_large_weights`), else the file's own bytes when nothing above changed the model
    # (serializing a 130 MB model again took 0.8 s; the checker's parse of it 0.1 s). Before IR
    # version 4 every initializer had to be a graph input, which the copy could hide from the
    # checker: it reads the whole model there.
    light = _without_large_weights(model)
    unchanged = data is not None and not (renamed or reordered or ctx.options.input_shapes or filled)
    whole = (lambda: data if unchanged else model.SerializeToString())
    source = whole() if light is None else light.SerializeToString()
    try:
        onnx.checker.check_model(source if light is None or model.ir_version >= 4 else whole())
    except onnx.checker.ValidationError as exc:
        raise CompileError(f"invalid ONNX model: {_first_line(exc)}") from None
    given = ", ".join(f"{name}:{','.join(map(str, dims))}" for name, dims in ctx.options.input_shapes.items())
    inferred = _infer_shapes(source, opset, given)
    model = inferred if light is None else _with_inferred_shapes(model, inferred, carriers)
    if given:
        _refuse_channel_mismatches(model, given)

    ctx.model_info = ModelInfo(
        path=str(ctx.model_path), sha256=sha256, opset=opset,
        inputs=tuple(_spec(v) for v in _true_inputs(model.graph)),
        outputs=tuple(_spec(v) for v in model.graph.output),
        domain_opsets={o.domain: o.version for o in model.opset_import if o.domain not in ("", "ai.onnx")},
        batch_dims=batch_dims,
    )
    ctx.graph = gs.import_onnx(model)
    # read off the imported graph: its nodes are the file's, in order, and cheaper to read than protobuf's
    ctx.original_nodes = [(node.name, node.op) for node in ctx.graph.nodes]
    ctx.origins = {name: (name,) for name, _ in ctx.original_nodes}


def _load(path: Path) -> tuple[onnx.ModelProto, bytes | None, str, list[int] | None]:
    """The model, the file's bytes when they serialize it whole (None when external data was
    read into it), the file's sha256, and the positions of the main graph's nodes that carry a
    graph (If branches, Loop bodies; None when external data was read)."""
    if not path.exists():
        raise CompileError(f"{path}: no such file")
    if not path.is_file():
        raise CompileError(f"{path}: not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CompileError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if not data:
        raise CompileError(f"{path}: empty file, not an ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf raises several unrelated types for garbage input
        raise CompileError(f"{path}: not a valid ONNX model ({_first_line(exc) or type(exc).__name__})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise CompileError(f"{path}: not a valid ONNX model (no graph or no opset_import)")
    external, carriers = _scan_tensors(model)
    whole = not (external and _load_external_data(model, path.parent))
    return model, data if whole else None, hashlib.sha256(data).hexdigest(), carriers


def _scan_tensors(model: onnx.ModelProto) -> tuple[bool, list[int] | None]:
    """Whether a tensor onnx's loader would read external data for uses it, and the positions
    of the main graph's nodes that carry a graph (None when a tensor uses external data).

    The loader's tensors (external_data_helper._get_all_tensors) are the initializers of the
    main graph and of the graphs its nodes carry, at any depth, and every tensor attribute (t,
    tensors) of a node there or in a function, at any depth. Its chained generators took 21 ms
    of tv_ssdlite320_mobilenet_v3_large's import, this walk 6 ms."""
    external = onnx.TensorProto.EXTERNAL
    carriers = []
    # (graph or function, whether its initializers are the loader's, whether it is the main graph)
    pending = [(model.graph, True, True)] + [(function, False, False) for function in model.functions]
    while pending:
        owner, initializers, main = pending.pop()
        if initializers and any(tensor.data_location == external for tensor in owner.initializer):
            return True, None
        for position, node in enumerate(owner.node):
            for attribute in node.attribute:
                if attribute.HasField("t") and attribute.t.data_location == external:
                    return True, None
                if any(tensor.data_location == external for tensor in attribute.tensors):
                    return True, None
                kind = attribute.type
                if kind == onnx.AttributeProto.GRAPH:
                    carried = [attribute.g]
                elif kind == onnx.AttributeProto.GRAPHS:
                    carried = list(attribute.graphs)
                else:
                    continue
                pending.extend((graph, initializers, False) for graph in carried)
                if main and carriers[-1:] != [position]:
                    carriers.append(position)
    return False, carriers


def _load_external_data(model: onnx.ModelProto, folder: Path) -> bool:
    """Read external tensors only from inside the model's own folder; True when there were any."""
    root = folder.resolve()
    external = [t for t in external_data_helper._get_all_tensors(model)
                if external_data_helper.uses_external_data(t)]
    for tensor in external:
        info = external_data_helper.ExternalDataInfo(tensor)
        location = Path(info.location)
        resolved = (root / location).resolve()
        if location.is_absolute() or root not in resolved.parents:
            raise CompileError(
                f"external data for tensor '{tensor.name}' points outside the model's folder ({info.location}); refused")
        if not resolved.is_file():
            raise CompileError(f"external data file for tensor '{tensor.name}' not found: {info.location}")
    if external:
        external_data_helper.load_external_data_for_model(model, str(root))
    return bool(external)


def _name_nodes(graph: onnx.GraphProto) -> bool:
    """Give unnamed nodes stable names (op_index) and make every name unique, keeping the
    exporter's names where they are already unique. True when a name changed."""
    seen: set[str] = set()
    changed = False
    for index, node in enumerate(graph.node):
        name = unique_name(node.name or f"{node.op_type}_{index}", seen)
        if node.name != name:
            node.name, changed = name, True
        seen.add(name)
    return changed


def _check_tensors_defined_and_acyclic(graph: onnx.GraphProto) -> bool:
    """Name an undefined tensor or a cycle plainly; sort a valid graph listed out of order
    (True when it was)."""
    if _valid_and_in_order(graph):
        return False
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    produced: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for output in node.output:
            if not output:
                continue
            if output in produced or output in defined:
                raise CompileError(f"tensor '{output}' is produced more than once (node '{node.name}')")
            produced[output] = node
    for node in graph.node:
        for tensor in node.input:
            if tensor and tensor not in defined and tensor not in produced:
                raise CompileError(f"node '{node.name}' reads tensor '{tensor}', which is never defined")
    for output in graph.output:
        if output.name not in defined and output.name not in produced:
            raise CompileError(f"graph output '{output.name}' is never produced")
    order, done, on_stack = [], set(), set()

    def visit(node: onnx.NodeProto) -> None:
        stack = [(node, iter(node.input))]
        on_stack.add(node.name)
        while stack:
            current, inputs = stack[-1]
            for tensor in inputs:
                producer = produced.get(tensor)
                if producer is None or producer.name in done:
                    continue
                if producer.name in on_stack:
                    raise CompileError(f"graph has a cycle through node '{producer.name}' (tensor '{tensor}')")
                on_stack.add(producer.name)
                stack.append((producer, iter(producer.input)))
                break
            else:
                stack.pop()
                on_stack.discard(current.name)
                done.add(current.name)
                order.append(current)

    for node in graph.node:
        if node.name not in done:
            visit(node)
    if [n.name for n in order] == [n.name for n in graph.node]:
        return False
    sorted_nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
    return True


def _valid_and_in_order(graph: onnx.GraphProto) -> bool:
    """True when each node reads only tensors defined before it (graph inputs, initializers,
    earlier nodes' outputs, or '' for an omitted input), no tensor is defined twice and every
    graph output is defined: then there is nothing to report or sort, which one walk in list
    order shows (the search for the first error and a topological order took 30 ms of
    tv_ssdlite320_mobilenet_v3_large's 3462 nodes). False sends the graph to that search."""
    available = {i.name for i in graph.input}
    available.update(t.name for t in graph.initializer)
    for node in graph.node:
        inputs = node.input
        if not available.issuperset(inputs) and not all(not name or name in available for name in inputs):
            return False
        outputs = node.output
        before = len(available)
        available.update(outputs)
        if len(available) != before + len(outputs):  # defined before, twice here, or an omitted ''
            return False
    available.discard("")  # an omitted output, which defines no graph output
    return available.issuperset(output.name for output in graph.output)


def _default_opset(model: onnx.ModelProto) -> int:
    version = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    if version is None:
        # only other domains' ops (ai.onnx.ml, ai.onnx.preview.training): no ai.onnx op reads the
        # opset, and the checker refuses an ai.onnx node without one
        return MAX_OPSET
    if not MIN_OPSET <= version <= MAX_OPSET:
        raise CompileError(f"unsupported opset {version} (rkcompile supports ai.onnx opsets {MIN_OPSET} to {MAX_OPSET})")
    return version


def _true_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are fed at run time (old exporters also list initializers as inputs)."""
    initializers = {t.name for t in graph.initializer}
    return [v for v in graph.input if v.name not in initializers]


def _batch_dims(graph: onnx.GraphProto, options) -> tuple[dict[str, str], bool]:
    """The inputs whose dim 0 the model leaves symbolic, each with the dim's symbol: the batch
    dim; and whether one was filled. With `options.batch` above 1 and no shape given for the
    input, the dim is set to 1 here: each batch context (passes/multicore.py) takes one image, as
    rknn-toolkit2's rknn_batch_size takes a model of batch 1."""
    found, filled = {}, False
    for value in _true_inputs(graph):
        tensor_type = value.type.tensor_type
        if value.type.WhichOneof("value") != "tensor_type" or not tensor_type.HasField("shape"):
            continue
        dims = tensor_type.shape.dim
        if not dims or (dims[0].HasField("dim_value") and dims[0].dim_value >= 0):
            continue
        found[value.name] = dims[0].dim_param
        if options.batch > 1 and value.name not in options.input_shapes:
            dims[0].dim_value, filled = 1, True
    return found, filled


def _set_input_shapes(graph: onnx.GraphProto, overrides: dict[str, tuple[int, ...]], filled: bool = False) -> None:
    """Give the inputs the shapes in `overrides` and refuse any dim still unknown; with
    overrides or a batch dim `filled`, forget the shapes the model recorded for the old ones."""
    inputs = {v.name: v for v in _true_inputs(graph)}
    for name in overrides:
        if name not in inputs:
            raise CompileError(f"--input-shape names '{name}', which is not a model input (inputs: {', '.join(inputs)})")
    for name, value in inputs.items():
        if value.type.WhichOneof("value") != "tensor_type":
            raise CompileError(f"input '{name}' has type {_type_text(value.type)}, not a tensor type: rkcompile plans "
                               "models whose inputs are tensors (an inputs file holds tensors only)")
        tensor_type = value.type.tensor_type
        if name in overrides:
            dims = overrides[name]
            if tensor_type.HasField("shape"):
                _refuse_changed_static_dims(name, tensor_type.shape.dim, dims)
            tensor_type.shape.Clear()
            for dim in dims:
                tensor_type.shape.dim.add().dim_value = dim
        if not tensor_type.HasField("shape"):
            raise CompileError(f"input '{name}' has no shape; set it with --input-shape {name}:1,3,224,224")
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                continue
            if dim.HasField("dim_value"):
                raise CompileError(f"input '{name}' has dim {axis} = {dim.dim_value}; dims must not be negative")
            label = f" ('{dim.dim_param}')" if dim.dim_param else ""
            batch = " (or dim 0 with --batch N: N images, one per batch context)" if axis == 0 else ""
            raise CompileError(f"input '{name}' has dynamic dim {axis}{label}; set it with --input-shape "
                               f"{name}:d0,d1,...{batch}")
    if overrides or filled:
        # Shapes recorded for the old input shape would contradict the new one: infer them anew.
        del graph.value_info[:]
        for output in graph.output:
            for axis, dim in enumerate(output.type.tensor_type.shape.dim):
                dim.dim_param = f"{output.name}_dim{axis}"
    for tensor in graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise CompileError(f"weight '{tensor.name}' has a negative dim {list(tensor.dims)}")


def _refuse_changed_static_dims(name: str, declared, given: tuple[int, ...]) -> None:
    """An input shape given for `name` may fix the model's symbolic dims, never change a static
    one: the graph was built for it (a Conv's weights for its channels, a Reshape for its size),
    and shape inference does not check every op against it."""
    shown = f"{name}:{','.join(map(str, given))}"
    if len(declared) != len(given):
        raise CompileError(f"input shape {shown}: {len(given)} dims given, the model's input '{name}' has "
                           f"{len(declared)}")
    for axis, (dim, value) in enumerate(zip(declared, given)):
        if dim.HasField("dim_value") and dim.dim_value >= 0 and dim.dim_value != value:
            raise CompileError(f"input shape {shown}: dim {axis} of input '{name}' is {value}, but the model fixes "
                               f"it at {dim.dim_value}, which the graph needs")


def _refuse_channel_mismatches(model: onnx.ModelProto, given: str) -> None:
    """Each Conv and ConvTranspose of the main graph reads as many channels as its weight takes
    (onnx's shape inference does not check it): an input shape that feeds another count is
    refused here, naming the input, the dim and what the graph needs, instead of planning steps
    no kernel could run. `given` shows the input shapes given, for the message."""
    graph = model.graph
    weights = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    shapes = {value.name: value.type.tensor_type.shape.dim for value in (*graph.input, *graph.value_info)}
    inputs = {value.name for value in graph.input}
    for node in graph.node:
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2 or node.input[1] not in weights:
            continue
        weight, dims = weights[node.input[1]], shapes.get(node.input[0])
        if dims is None or len(dims) < 2 or not dims[1].HasField("dim_value") or len(weight) < 2:
            continue
        group = next((attribute.i for attribute in node.attribute if attribute.name == "group"), 1)
        needed = weight[1] * group if node.op_type == "Conv" else weight[0]
        channels = dims[1].dim_value
        if channels == needed:
            continue
        read = (f"dim 1 of input '{node.input[0]}' is {channels}" if node.input[0] in inputs
                else f"it makes tensor '{node.input[0]}' {channels} channels (dim 1)")
        raise CompileError(f"input shape {given}: {read}, but {node.op_type} '{node.name}' needs {needed} "
                           f"(its weight '{node.input[1]}' is {list(weight)})")


def _refuse_optional_outputs(graph: onnx.GraphProto) -> None:
    """Tensor and sequence outputs only: onnx-graphsurgeon, which the planner builds on, drops
    an optional's type (Optional's type_proto attribute), so its value could not be told apart
    from the sequence or tensor inside it."""
    for value in graph.output:
        if value.type.WhichOneof("value") in ("optional_type", "map_type", "sparse_tensor_type"):
            raise CompileError(f"output '{value.name}' has type {_type_text(value.type)}: rkcompile plans models "
                               "whose outputs are tensors or sequences of tensors")


def _infer_shapes(source: bytes, opset: int, given: str = "") -> onnx.ModelProto:
    """Strict shape inference of the serialized model. Where it fails only inside the function
    bodies of ONNX ops (onnx's own definition of the op: MeanVarianceNormalization-13's body
    builds its axes with a Constant whose value is an attribute reference, which inference
    does not resolve), the model is inferred again non-strictly: those nodes' outputs keep the
    shapes the model declares, and a node reading an unknown shape stays on the CPU. The output
    of an op of SHAPE_KEEPING_FUNCTIONS left without a shape takes its input's, and inference
    goes on from there (`_shaped_through_shape_keeping`). `given` shows the input shapes
    given, which a failure names: they are its likeliest cause."""
    def infer(model: bytes, strict: bool) -> onnx.ModelProto:
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=strict, data_prop=True)

    try:
        inferred, strict = infer(source, strict=True), True
    except (shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        failing = re.findall(r"\(op_type:(\w+), node name: [^)]*\)", str(exc))
        if not failing or not all(_has_function_body(op, opset) for op in failing):
            cause = f" with input shape {given}" if given else ""
            raise CompileError(f"shape inference failed{cause}: {_first_line(exc)}") from None
        inferred, strict = infer(source, strict=False), False
    while _shaped_through_shape_keeping(inferred):
        inferred = infer(inferred.SerializeToString(), strict)
    return inferred


#: ONNX ops defined by a function body whose output has their input 0's type and shape, which
#: onnx's inference can leave without a shape (GroupNormalization-21: the type only; it fails
#: inside MeanVarianceNormalization-13's body): without it, every node after one (a UNet's
#: whole decoder) would read an unknown shape and stay on the CPU
SHAPE_KEEPING_FUNCTIONS = frozenset({"GroupNormalization", "MeanVarianceNormalization"})


def _shaped_through_shape_keeping(model: onnx.ModelProto) -> bool:
    """Give each main-graph output of a SHAPE_KEEPING_FUNCTIONS node that inference left
    without a shape the type and shape of its input 0, when that has one (as a value_info,
    which inference then reads); whether any was given."""
    graph = model.graph
    shaped = {value.name: value.type for value in (*graph.input, *graph.value_info, *graph.output)
              if value.type.tensor_type.elem_type and value.type.tensor_type.HasField("shape")}
    wanting = {node.output[0]: shaped[node.input[0]] for node in graph.node
               if node.op_type in SHAPE_KEEPING_FUNCTIONS and node.input[0] in shaped and node.output[0] not in shaped}
    if not wanting:
        return False
    kept = [value for value in graph.value_info if value.name not in wanting]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    graph.value_info.extend(onnx.helper.make_value_info(name, value_type) for name, value_type in wanting.items())
    return True


def _without_large_weights(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` whose initializers over SHAPE_DATA_MAX_ELEMENTS (and not also declared
    as graph inputs, whose declared type inference would read instead) are typed graph inputs,
    as `ir.shape_only_model` does for re-inference; None when there are none. Shape-carrying
    constants (Reshape targets, Slice bounds) are always smaller, and keep their data.

    The checker and shape inference read this copy: inference otherwise copies every weight in
    and out of onnx's C++ side (0.3 s of a 130 MB model's plan), the checker parses every byte
    of them, and their values never decide a shape. Only weights `_plainly_stored` move, which
    the checker could only pass: any other large weight stays in the copy, for the checker to
    judge as it would in the whole model."""
    declared = {value.name for value in model.graph.input}
    large = {tensor.name for tensor in model.graph.initializer
             if tensor.name not in declared and element_count(tensor.dims) > SHAPE_DATA_MAX_ELEMENTS
             and _plainly_stored(tensor)}
    if not large:
        return None
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")
    light.graph.initializer.extend(t for t in model.graph.initializer if t.name not in large)
    light.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer if t.name in large)
    return light


#: bytes per element of the element types onnx's checker takes in raw_data at that size
_RAW_ITEMSIZE = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2,
                 onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT8: 1,
                 onnx.TensorProto.INT16: 2, onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT32: 4,
                 onnx.TensorProto.UINT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.UINT64: 8,
                 onnx.TensorProto.BOOL: 1}
#: TensorProto's value fields besides raw_data (onnx.proto), none of which a plain weight sets
_OTHER_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _plainly_stored(tensor: onnx.TensorProto) -> bool:
    """True for a weight onnx's checker passes whatever else the model holds (its check_tensor):
    a numeric element type, stored in raw_data alone and in place (not external), exactly as
    many bytes as its dims hold."""
    itemsize = _RAW_ITEMSIZE.get(tensor.data_type)
    if itemsize is None or not tensor.HasField("raw_data") or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return False
    if any(len(getattr(tensor, field)) for field in _OTHER_VALUE_FIELDS):
        return False
    return len(tensor.raw_data) == itemsize * element_count(tensor.dims)


def _copy_fields(source, target, skip: str) -> None:
    """Every set field of protobuf message `source` but `skip`, onto `target` (the same type)."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(target, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _with_inferred_shapes(model: onnx.ModelProto, inferred: onnx.ModelProto,
                          carriers: list[int] | None) -> onnx.ModelProto:
    """`model` with what inference of its weightless copy added: the graph's value_info, its
    outputs' types, and the subgraphs of the nodes that carry them (If branches, Loop bodies:
    those at `carriers`, or any node when None), which inference annotates in place. Nothing
    else of a graph does it change."""
    graph, found = model.graph, inferred.graph
    del graph.value_info[:]
    graph.value_info.extend(found.value_info)
    del graph.output[:]
    graph.output.extend(found.output)
    if carriers is None:
        carries_graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        carriers = [position for position, node in enumerate(graph.node)
                    if any(attribute.type in carries_graphs for attribute in node.attribute)]
    for position in carriers:
        graph.node[position].CopyFrom(found.node[position])
    return model


def _has_function_body(op: str, opset: int) -> bool:
    try:
        return onnx.defs.get_schema(op, opset).has_function
    except onnx.defs.SchemaError:
        return False


def _type_text(value_type: onnx.TypeProto) -> str:
    """An ONNX type as the spec writes it: seq(tensor(float)), optional(seq(tensor(int64)))."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({dtype_name(value_type.tensor_type.elem_type) or 'undefined'})"
    if kind in ("sequence_type", "optional_type"):
        inner = getattr(value_type, kind).elem_type
        return f"{kind.split('_')[0].replace('sequence', 'seq')}({_type_text(inner)})"
    if kind == "map_type":
        return f"map({dtype_name(value_type.map_type.key_type)}, {_type_text(value_type.map_type.value_type)})"
    return kind.replace("_type", "") if kind else "value of no type"


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
    return TensorSpec(name=value.name, shape=tuple(dims), dtype=dtype_name(tensor_type.elem_type) or "unknown")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:400] if lines else ""
