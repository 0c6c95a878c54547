"""The legalizing rewrites, one module per family, each exporting its `RULES`.

`RULES` concatenates the families in the order below. For one node the pass tries the rules of
its op in this order and keeps the first legal candidate, so the order is a preference: rules
that remove work (folding a BatchNormalization into its Conv, a constant into a cheaper op)
come before rules that only reshape it, and relabel clean-up comes last, after every family has
wrapped its ops in relabels. A new family adds its module here, in the place its preference
calls for.
"""
from __future__ import annotations

from rkcompile.passes.rewrites import (affine, channels, conv_windows, elementwise, layout_ops, masks,
    matmul_as_conv, norm, pooling, rank, reductions, resize_as_matmul, signed_moves)
from rkcompile.passes.rewrites.base import RESHAPE_LIKE, Candidates, Replacement, RewriteRule, Site

FAMILIES = (
    masks,        # Wheres reading masks where they are made, mask movement done on the float values a
                  # Where selects, Wheres over combined masks, identity And/Or/Gather, Casts before
                  # integer relabels: first, they remove work
    affine,       # constant scales and shifts (Mul/Add/Sub/Div, BatchNormalization) folded into the
                  # weights of the Conv, ConvTranspose, Gemm or MatMul before or after them: removes work
    norm,         # BatchNormalization, LRN, LayerNormalization, Softmax
    reductions,   # norms written out over trailing axes, InstanceNormalization; late: Reduce*, Sqrt
    elementwise,  # constants into cheaper ops, exponents, activation parameters, ranks, broadcasts
    signed_moves,  # a rotary embedding's moves and negations along the last axis as one Gather or
                   # MatMul (before conv_windows, whose stepped-Slice rule would take the region apart)
    matmul_as_conv,  # Gemm/MatMul by weights as 1x1 Conv, K splits, Einsum as one MatMul
    conv_windows,    # Conv strides, kernels and pads over the window limits (space-to-depth, kernel
                     # tiles, Pad);
                     # after matmul_as_conv, whose Convs it may have to legalize
    pooling,      # auto_pad, ceil mode, MaxPool cascades, excluded pads, staged global pools,
                  # ReduceMean as pooling
    resize_as_matmul,  # Resize scales the NPU's kernel lacks as constant-weight MatMuls
                       # (matmul_as_conv's rules then make 1x1 Convs of them)
    channels,     # channel shuffles as channel-picking 1x1 Convs, folded into the Convs reading them,
                  # and patch unfolds as strided picks (before rank and layout, whose rules would
                  # break the shuffle's chain apart)
    rank,         # regions of tensors above rank 4 redone on merged axes (before layout: whole regions
                  # first, so no lone rank-5 relabel is left for layout's rules)
    layout_ops,   # DepthToSpace/SpaceToDepth as Transposes, Transpose limits, Gather of one index,
                  # relabels, Conv layouts
)

RULES: tuple[RewriteRule, ...] = tuple(rule for family in FAMILIES for rule in family.RULES)

__all__ = ["FAMILIES", "RULES", "RESHAPE_LIKE", "Candidates", "Replacement", "RewriteRule", "Site"]
