"""Matrix-product rewrites: Gemm and MatMul by weights as 1x1 convolutions (absorbing their
bias and residual Adds), MatMul over the target's K limit split along K, and Einsum as a
MatMul between moves."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from rkcompile.ir.graph import constant_value, element_count, static_shape
from rkcompile.ir.nodes import DerivedValues

from rkcompile.passes.fusion_table import conv_activation_kernels
from rkcompile.passes.rewrites.base import Builder, Candidates, RewriteRule, Site, conv_1x1, float_constant, split_node


def gemm_to_conv(node: gs.Node, site: Site) -> Candidates:
    """Gemm with constant B (and C) as Reshape [M,K,1,1] -> 1x1 Conv -> Reshape [M,N]: the oplist
    has no Gemm kernel, fully connected layers run as Convolution (oplist V2.3.2, Convolution;
    rknn-toolkit2's layer tables show Conv for every Gemm). alpha, beta and transB fold into
    the weights; transA is left alone."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a_shape, y_shape = static_shape(a), static_shape(y)
    if not isinstance(b, gs.Constant) or node.attrs.get("transA", 0) or a_shape is None or y_shape is None \
            or len(a_shape) != 2:
        return "B is not constant, transA is set, or A is not 2-D of known shape"
    trans_b, alpha = node.attrs.get("transB", 0), node.attrs.get("alpha", 1.0)
    # B's values are read only when something needs the Conv's weight (Builder.derived)
    dtype = b.dtype if b.dtype in DerivedValues.SOURCE_DTYPES else constant_value(b).dtype
    bias = None
    if len(node.inputs) > 2 and node.inputs[2].name:
        c = constant_value(node.inputs[2])
        n = b.shape[0] if trans_b else b.shape[1]
        if c is None or np.broadcast_shapes(c.shape, (1, n)) != (1, n):
            return "C is not a constant that broadcasts to [1, N]"
        bias = (np.broadcast_to(c, (1, n)).reshape(n) * node.attrs.get("beta", 1.0)).astype(dtype)
    m, n = y_shape
    builder = site.builder(node)

    def conv_weight(values: np.ndarray) -> np.ndarray:  # [N, K, 1, 1]
        return ((values if trans_b else values.T) * alpha).astype(values.dtype)[:, :, None, None]

    # multiplying by 1 leaves every value as it is
    conv = conv_1x1(builder, builder.reshape(a, [m, a_shape[1], 1, 1]),
                    builder.derived(b, conv_weight, [*(b.shape if trans_b else b.shape[::-1]), 1, 1], "weight",
                                    keeps_values=alpha == 1), bias, [m, n, 1, 1])
    builder.reshape(conv, y_shape, out=y)
    yield builder.finish()


def split_linear_as_linears(node: gs.Node, site: Site) -> Candidates:
    """A linear layer x @ W (+ b) whose output a Split alone cuts along its last axis, one part
    read by an activation the Conv it becomes takes in (SwiGLU's gate: silu(x @ W_g) *
    (x @ W_x), as EVA-02 and other gated MLPs pack it in one Linear and chunk it; a GLU's
    sigmoid), as one linear layer per part, with W's (and b's) columns of that part: each
    becomes its own 1x1 Conv (matmul_constant_to_conv), the gate's with its activation fused
    (ConvExSwish, ConvSigmoid) where the Split left Conv, Split, exSwish: one step fewer, the
    same products. The split of a Linear cuts its tokens' last axis, which exGlu (axis 1 of a
    Conv's channels only, seed 001) does not take."""
    split = node.outputs[0].outputs[0] if len(node.outputs[0].outputs) == 1 else None
    bias_add = None
    if split is not None and split.op == "Add":
        bias_add, split = split, (split.outputs[0].outputs[0] if len(split.outputs[0].outputs) == 1 else None)
    x, w = node.inputs[0], node.inputs[1]
    shape = static_shape(node.outputs[0])
    if split is None or split.op != "Split" or not isinstance(w, gs.Constant) or len(w.shape) != 2 or shape is None:
        return "not a linear layer by 2-D weights whose output a Split alone reads"
    if int(split.attrs.get("axis", 0)) % len(shape) != len(shape) - 1:
        return "its Split cuts another axis than the last"
    bias = None
    if bias_add is not None:
        bias = next((constant_value(t) for t in bias_add.inputs if t is not node.outputs[0]), None)
        if bias is None or np.broadcast_shapes(bias.shape, (shape[-1],)) != (shape[-1],) \
                or any(t.name in site.graph_outputs for t in bias_add.outputs):
            return "the Add after it is no bias of its columns"
    if node.outputs[0].name in site.graph_outputs:
        return "its output is a graph output"
    parts = list(split.outputs)
    if any(static_shape(part) is None for part in parts):
        return "a part's shape is unknown"

    def activated(part: gs.Tensor) -> bool:   # an activation the fusion table runs after a Conv
        ops = sorted(reader.op for reader in part.outputs)
        activation = "exSwish" if ops == ["Mul", "Sigmoid"] else ops[0] if len(ops) == 1 else None
        return any(site.target.has_kernel(kernel) for kernel in conv_activation_kernels().get(activation, ()))

    if not any(activated(part) for part in parts):
        return "no part is read by an activation a Conv would take in"
    weights = constant_value(w)   # read only here: a weight nothing splits stays unloaded
    builder = site.builder(node)
    start = 0
    for part in parts:
        width = static_shape(part)[-1]
        columns = builder.const(np.ascontiguousarray(weights[:, start:start + width]), "weight")
        if bias is None:
            builder.op("MatMul", [x, columns], out=part)
        else:
            product = builder.op("MatMul", [x, columns], static_shape(part), part.dtype)
            part_bias = np.broadcast_to(bias, (shape[-1],))[start:start + width].astype(bias.dtype)
            builder.op("Add", [product, builder.const(part_bias, "bias")], out=part)
        start += width
    yield builder.finish(node, *([bias_add] if bias_add is not None else []), split)


def matmul_constant_to_conv(node: gs.Node, site: Site) -> Candidates:
    """MatMul with one constant 2-D operand as a 1x1 Conv whose weights are that operand, as
    rknn-toolkit2 runs it (its bert layer table shows Conv for MatMul by weights): Convolution
    runs on several cores and takes per-channel weights, exMatMul neither (oplist V2.3.2).
    x[..., M, K] @ W[K, N] reads x as [L, K, 1, 1]; W[M, K] @ x[..., K, N] reads x as [L, K, 1, N].
    A constant bias Add that alone reads x @ W becomes the Conv's bias, and a residual Add after
    it is done on the Conv's output layout, so the two fuse as ConvAdd."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    y_shape = static_shape(y)
    if y_shape is None:
        return "the output shape is unknown"
    # the weights' values are read only when something needs them (Builder.derived)
    right, left = (t if isinstance(t, gs.Constant) else None for t in (b, a))
    builder = site.builder(node)
    absorbed = ()
    if right is not None and left is None and len(right.shape) == 2 and static_shape(a) and len(static_shape(a)) >= 2:
        k, n = right.shape
        rows = element_count(static_shape(a)[:-1])
        bias_add, bias = _bias_add(y, n, site)
        if bias_add is not None:
            absorbed, y = (bias_add,), bias_add.outputs[0]
        weight = builder.derived(right, lambda values: values.T[:, :, None, None], [n, k, 1, 1], "weight",
                                 keeps_values=True)
        conv = conv_1x1(builder, builder.reshape(a, [rows, k, 1, 1]), weight, bias, [rows, n, 1, 1])
        residual_add, residual = _residual_add(y, site)
        if residual_add is not None:
            absorbed, y = absorbed + (residual_add,), residual_add.outputs[0]
            conv = builder.op("Add", [conv, builder.reshape(residual, [rows, n, 1, 1])], [rows, n, 1, 1], y.dtype)
    elif left is not None and right is None and len(left.shape) == 2 and static_shape(b) and len(static_shape(b)) >= 2:
        m, k = left.shape
        batch = element_count(static_shape(b)[:-2])
        n = static_shape(b)[-1]
        weight = builder.derived(left, lambda values: values[:, :, None, None], [m, k, 1, 1], "weight",
                                 keeps_values=True)
        conv = conv_1x1(builder, builder.reshape(b, [batch, k, 1, n]), weight, None, [batch, m, 1, n])
    else:
        return "neither operand is a 2-D constant beside a computed operand of rank >= 2"
    builder.reshape(conv, y_shape, out=y)
    yield builder.finish(node, *absorbed)


def _residual_add(y: gs.Tensor, site: Site) -> tuple[gs.Node | None, gs.Tensor | None]:
    """The Add of a computed tensor of y's own shape (a residual connection) that alone reads
    `y`: done on the Conv's [L, N, 1, 1] output, Conv and Add become one ConvAdd kernel (oplist
    V2.3.2, ConvolutionAdd), as rknn-toolkit2 runs transformer blocks."""
    if len(y.outputs) != 1 or y.name in site.graph_outputs:
        return None, None
    add = y.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
        return None, None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if isinstance(other, gs.Constant) or static_shape(other) != static_shape(y):
        return None, None
    return add, other


def _bias_add(y: gs.Tensor, n: int, site: Site) -> tuple[gs.Node | None, np.ndarray | None]:
    """The Add of a constant [N] (or [1, ..., N]) bias that alone reads the MatMul's result `y`:
    it becomes the Conv's bias, which the NPU adds in the same kernel (rknn-toolkit2's ConvAdd)."""
    if len(y.outputs) != 1 or y.name in site.graph_outputs:
        return None, None
    add = y.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or static_shape(add.outputs[0]) != static_shape(y):
        return None, None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    bias = float_constant(other)
    if bias is None or bias.size != n or bias.shape[-1] != n:
        return None, None
    return add, bias.reshape(n)


def matmul_k_split(node: gs.Node, site: Site) -> Candidates:
    """MatMul with K over the target's limit as T = ceil(K / limit) MatMuls over K segments, summed:
    A·B = Σ A[:, seg] · B[seg, :]. Seed 002, 4.1.1.4.1: B is split into T segments when K > 8192
    on RK3588 and K > 4096 on RK3576/RV1126B."""
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    a_shape, b_shape, y_shape = static_shape(a), static_shape(b), static_shape(y)
    if a_shape is None or b_shape is None or y_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return "an operand is below rank 2 or of unknown shape"
    limit = site.target.rule_parameter("MatMul", "matmul_depth", "limit")
    k = a_shape[-1]
    if limit is None:
        return f"{site.target.name} has no MatMul depth rule to split to"
    if k <= limit:
        return f"K = {k} is within the limit {limit}"
    segments = -(-k // limit)
    sizes = [limit] * (segments - 1) + [k - limit * (segments - 1)]
    builder = site.builder(node)
    a_parts = split_node(builder, a, len(a_shape) - 1, sizes)
    b_value = constant_value(b)
    if b_value is None:
        b_parts = split_node(builder, b, len(b_shape) - 2, sizes)
    else:
        bounds = np.cumsum([0] + sizes)
        b_parts = [builder.const(b_value[..., start:end, :], "weight") for start, end in zip(bounds, bounds[1:])]
    partials = [builder.op("MatMul", [pa, pb], y_shape, y.dtype) for pa, pb in zip(a_parts, b_parts)]
    total = partials[0]
    for index, partial in enumerate(partials[1:], start=2):
        total = builder.op("Add", [total, partial], y_shape, y.dtype, out=y if index == segments else None)
    yield builder.finish()


@dataclass(frozen=True)
class EinsumAsMatMul:
    """A two-operand Einsum as one MatMul: A moved by `a_perm` to [batch, free of A, contracted]
    and relabelled to `a_matrix` [B, M, K], B moved by `b_perm` to [batch, contracted, free of B]
    and relabelled to `b_matrix` [B, K, N] (B = 1 without batch letters), their product
    `product` [B, M, N] relabelled to `unmerged` (each batch and free letter its own axis) and
    moved by `out_perm` to the output's order."""

    a_perm: list[int]
    a_matrix: list[int]
    b_perm: list[int]
    b_matrix: list[int]
    product: list[int]
    unmerged: list[int]
    out_perm: list[int]


def einsum_as_matmul_form(node: gs.Node) -> EinsumAsMatMul | str:
    """How the Einsum `node` is one MatMul (`EinsumAsMatMul`), as numpy and torch compute it:
    the letters in both operands and the output are batch axes, those in both operands only are
    contracted, and each operand's own letters are its free rows or columns; or why it is not
    (an ellipsis, a letter repeated within a term, a letter summed out of one operand alone,
    an axis broadcasting against the other operand's, or an unknown shape)."""
    equation = node.attrs.get("equation", "")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if len(node.inputs) != 2 or "..." in equation or "->" not in equation or equation.count(",") != 1:
        return "not an explicit equation of two operands"
    terms, out = equation.split("->")
    lhs, rhs = terms.split(",")
    if any(len(set(term)) != len(term) for term in (lhs, rhs, out)):
        return "a letter repeats within one term (a diagonal or trace)"
    if (set(lhs) ^ set(rhs)) - set(out) or not set(out) <= set(lhs) | set(rhs):
        return "a letter of one operand alone is summed out, or an output letter is in neither operand"
    a_shape, b_shape, y_shape = (static_shape(t) for t in (*node.inputs, node.outputs[0]))
    if a_shape is None or b_shape is None or y_shape is None or len(a_shape) != len(lhs) or len(b_shape) != len(rhs):
        return "a shape is unknown"
    size = dict(zip(lhs, a_shape))
    if any(size.setdefault(letter, extent) != extent for letter, extent in zip(rhs, b_shape)):
        return "an axis broadcasts against the other operand's"
    batch = [letter for letter in out if letter in lhs and letter in rhs]
    contracted = [letter for letter in lhs if letter in rhs and letter not in out]
    free_a = [letter for letter in out if letter in lhs and letter not in rhs]
    free_b = [letter for letter in out if letter in rhs and letter not in lhs]

    def extent(group: list[str]) -> int:
        return int(np.prod([size[letter] for letter in group], dtype=np.int64))

    order = batch + free_a + free_b
    return EinsumAsMatMul(
        a_perm=[lhs.index(letter) for letter in batch + free_a + contracted],
        a_matrix=[extent(batch), extent(free_a), extent(contracted)],
        b_perm=[rhs.index(letter) for letter in batch + contracted + free_b],
        b_matrix=[extent(batch), extent(contracted), extent(free_b)],
        product=[extent(batch), extent(free_a), extent(free_b)],
        unmerged=[size[letter] for letter in order],
        out_perm=[order.index(letter) for letter in out])


def einsum_as_matmul(node: gs.Node, site: Site) -> Candidates:
    """A two-operand Einsum as one MatMul between moves (`einsum_as_matmul_form`): A moved and
    relabelled to [B, M, K], B to [B, K, N] (a constant B moved once, as a constant), their
    product relabelled and moved to the output's order. The same products, summed over the
    contracted axes. Einsum is not in the oplist; MatMul, Transpose and Reshape are. An Einsum
    above rank 4 is lowered so with the rest of its region (rank.collapse_rank_region: MViTv2's
    relative positions, 'byhwc,hkc->byhwk', a product per row h of the query's map)."""
    form = einsum_as_matmul_form(node)
    if isinstance(form, str):
        return form
    builder = site.builder(node)
    einsum_as_matmul_nodes(builder, node, form)
    yield builder.finish()


def einsum_as_matmul_nodes(builder: Builder, node: gs.Node, form: EinsumAsMatMul) -> None:
    """The nodes of `form` for the Einsum `node`, built by `builder`, writing its output."""
    (a, b), y = node.inputs, node.outputs[0]

    def matrix(tensor: gs.Tensor, perm: list[int], shape: list[int]) -> gs.Tensor:
        value = constant_value(tensor) if isinstance(tensor, gs.Constant) else None
        if value is not None:
            return builder.const(np.ascontiguousarray(value.transpose(perm)).reshape(shape), "operand")
        if perm != sorted(perm):
            tensor = builder.op("Transpose", [tensor], [static_shape(tensor)[p] for p in perm], tensor.dtype, perm=perm)
        return builder.reshape(tensor, shape)

    product = builder.op("MatMul", [matrix(a, form.a_perm, form.a_matrix), matrix(b, form.b_perm, form.b_matrix)],
                         form.product, y.dtype)
    if form.out_perm == sorted(form.out_perm):
        builder.reshape(product, static_shape(y), out=y)
    else:
        builder.op("Transpose", [builder.reshape(product, form.unmerged)], out=y, perm=form.out_perm)


RULES: tuple[RewriteRule, ...] = (
    RewriteRule(gemm_to_conv, frozenset({"Gemm"}), always=True),
    RewriteRule(split_linear_as_linears, frozenset({"MatMul"}), always=True),
    RewriteRule(matmul_constant_to_conv, frozenset({"MatMul"}), always=True),
    RewriteRule(matmul_k_split, frozenset({"MatMul"})),
    RewriteRule(einsum_as_matmul, frozenset({"Einsum"})),
)
