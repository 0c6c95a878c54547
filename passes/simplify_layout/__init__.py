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
- `moves_as_gather`, last: a run of relabels, Transposes and Gathers of constant indices,
  each read by the next alone, that takes whole slices of one axis of its input, is one Gather
  along that axis (and a relabel), where that takes fewer steps than the run (swin's cyclic
  shift and window partition of token rows: one Gather of rows).

The package holds one module per family of rules: `redundant` (identity_layout, shared_layout,
slices_as_split), `move_down` (move_layout_down and the region it moves through), `relabels`
(move_relabel_up, relabels_above_split, transpose_with_unit_relabel, transposes_across_relabel,
transpose_beside_relabel), `kernel_operands` (attention_operands, matmul_operands) and
`composed` (moves_as_gather); `driver`
runs the rules (`Simplifier`) and holds what they share. A new rule is a function
`rule(node, simplifier)` returning True when it changed the graph, a reason when it declined,
or None when the node is not its kind; it joins RULES below, and REMOVED_BECAUSE (driver.py)
says what the plan reports of a node it takes out.
"""
from __future__ import annotations

from rkcompile.compiler.context import CompileContext

from rkcompile.passes.fuse import fuse_table
from rkcompile.passes.fusion_table import KERNEL_FUSIONS
from rkcompile.passes.simplify_layout.composed import moves_as_gather
from rkcompile.passes.simplify_layout.driver import Simplifier
from rkcompile.passes.simplify_layout.kernel_operands import attention_operands, matmul_operands
from rkcompile.passes.simplify_layout.move_down import move_layout_down
from rkcompile.passes.simplify_layout.redundant import identity_layout, shared_layout, slices_as_split
from rkcompile.passes.simplify_layout.relabels import (move_relabel_up, relabels_above_split, transpose_beside_relabel,
                                                       transpose_with_unit_relabel, transposes_across_relabel)


#: The rules, in the order each node tries them; attention_operands and matmul_operands run after
#: the kernel fusions (SimplifyLayout.run).
RULES = (identity_layout, shared_layout, slices_as_split, move_layout_down, move_relabel_up, relabels_above_split,
         transpose_with_unit_relabel, transposes_across_relabel, transpose_beside_relabel)


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
        if Simplifier(ctx, self.fused, RULES).run() and self.fused:
            # A Conv and the activation a relabel pair kept apart may now be one kernel.
            fuse_table(ctx, KERNEL_FUSIONS)
        if self.fused:
            # after the kernel fusions, so an exMatMul takes its MatMul and the Add after it
            # first, and after every move into a kernel (move_layout_down), so each kernel
            # takes in the whole of what its operands are read through
            Simplifier(ctx, self.fused, (attention_operands, matmul_operands)).run()
            # last, on the moves no rule cancelled and no kernel took in
            Simplifier(ctx, self.fused, (moves_as_gather, identity_layout)).run()


EARLY = SimplifyLayout("simplify-layout-early", fused=False)
LATE = SimplifyLayout("simplify-layout", fused=True)

__all__ = ["EARLY", "LATE", "RULES", "SimplifyLayout", "attention_operands", "matmul_operands", "moves_as_gather",
           *(rule.__name__ for rule in RULES)]
