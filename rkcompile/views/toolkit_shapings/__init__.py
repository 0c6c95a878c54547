"""TOOLKIT_SHAPINGS: rewrites of the exported graph, each keeping the values, from the forms
rknn-toolkit2 2.5.0 fails on, loops on or runs on its CPU into forms it builds on its NPU
(docs/deploy.md lists them, each with the toolkit's error or placement that called for it).
Each takes the model, changes it in place and returns how many places it changed.

One module per family, each exporting its `SHAPINGS`: `reductions` (the plan's means, sums and
binned sums as Convs, its square roots as Pows, written back), `norms` (the forms around a
norm's mean, GroupNorm on its planes), `convolutions` (Pads, added Convs, vectors and matrices
the plan runs as Convs), `layouts` (Reshapes, Slices, Gathers and ranks), `sequences` (a
transformer's token rows and Split-form Transposes) and `op_forms` (single ops written as the
toolkit's fusions and readers expect); `common` holds what several of them use. A new shaping
joins its family's `SHAPINGS` and TOOLKIT_SHAPINGS below, in the place its inputs call for.
"""
from __future__ import annotations

from rkcompile.views.toolkit_shapings import convolutions, layouts, norms, op_forms, reductions, sequences
from rkcompile.views.toolkit_shapings.common import Shaping
from rkcompile.views.toolkit_shapings.convolutions import (added_convs_as_one, added_linears_as_one,
                                                           linear_layers_as_gemms, pads_into_convs,
                                                           small_planes_into_channels, vectors_into_channels)
from rkcompile.views.toolkit_shapings.layouts import (attention_operands_in_one_transpose, batched_rows_as_one_image,
                                                      flattened_planes_padded,
                                                      gathers_as_slices, one_transpose_runs_shortened,
                                                      rank3_tails_as_rank4,
                                                      reshapes_after_elementwise_ops, slices_before_reshapes,
                                                      softmaxes_before_layout_runs, splits_of_concats_bypassed,
                                                      token_rows_of_planes_padded, transpose_steps_as_one,
                                                      transposes_before_expands, wide_transposes_as_block_swaps)
from rkcompile.views.toolkit_shapings.norms import (channel_norms_as_layer_norms, group_norms_on_their_planes,
                                                   mean_biases_apart)
from rkcompile.views.toolkit_shapings.op_forms import defaults_written, erf_of_a_quotient, scale_after_scores
from rkcompile.views.toolkit_shapings.reductions import (binned_sums_as_grouped_convs, l2_norms_written_back,
                                                         means_as_reduce_means, radix_sums_as_channel_slices,
                                                         square_roots_written_back, sums_as_reduce_sums)
from rkcompile.views.toolkit_shapings.sequences import (token_rows_as_sequences, transpose_pairs_as_splits,
                                                        transposed_rows_as_planes, transposes_from_splits)

#: The families, each a module exporting its `SHAPINGS`.
FAMILIES = (reductions, norms, convolutions, layouts, sequences, op_forms)

#: The shapings in the order the export runs them. Each reads the forms the ones before it left,
#: so the order interleaves the families.
TOOLKIT_SHAPINGS: tuple[Shaping, ...] = (
    binned_sums_as_grouped_convs,
    slices_before_reshapes,
    erf_of_a_quotient,
    scale_after_scores,
    pads_into_convs,
    # leaves a mean's epsilon an Add after its Conv, the form means_as_reduce_means writes back
    mean_biases_apart,
    # before group_norms_on_their_planes, which reads a norm's Sqrt (the rewrites make it a Pow)
    square_roots_written_back,
    # before means_as_reduce_means, which would write the means of its rows as ReduceMeans
    group_norms_on_their_planes,
    # after mean_biases_apart and square_roots_written_back, whose Add of epsilon and Sqrt it
    # reads, and before means_as_reduce_means, which would write the variance as a ReduceMean
    channel_norms_as_layer_norms,
    # before the Conv shapings below, which would take a mean's or a sum's Conv (with the Reshape
    # before or after it) as any other Conv
    means_as_reduce_means,
    sums_as_reduce_sums,
    # after sums_as_reduce_sums, whose ReduceSums over the radix axis it reads
    radix_sums_as_channel_slices,
    # after square_roots_written_back and mean_biases_apart, whose Sqrt and Add it reads
    l2_norms_written_back,
    vectors_into_channels,
    # before linear_layers_as_gemms, which would make two Gemms of the Convs it adds into one
    added_convs_as_one,
    linear_layers_as_gemms,
    gathers_as_slices,
    flattened_planes_padded,
    rank3_tails_as_rank4,
    batched_rows_as_one_image,
    # before reshapes_after_elementwise_ops: a Split of a Concat ties each level's Reshape to the
    # ops after it, which that shaping cannot move then
    splits_of_concats_bypassed,
    reshapes_after_elementwise_ops,
    # after reshapes_after_elementwise_ops, which leaves the Add of two Gemms reading them
    # without the Reshapes linear_layers_as_gemms writes after each
    added_linears_as_one,
    # after rank3_tails_as_rank4 and reshapes_after_elementwise_ops, whose forms of an output's
    # runs of moves it reads
    softmaxes_before_layout_runs,
    # before the shapings of runs of moves, which a Transpose moved before its Expand may join
    transposes_before_expands,
    # before token_rows_as_sequences, whose rows' source it makes the tokens' sequence
    one_transpose_runs_shortened,
    # before transposes_from_splits, which keeps the Split form of a Transpose that a Reshape into
    # rows reads: rows this one did not write back as sequences
    token_rows_as_sequences,
    # after l2_norms_written_back, whose ReduceSum over the tokens it relabels
    transposed_rows_as_planes,
    # before transposes_from_splits, which writes the Split form back where the toolkit takes it
    transpose_pairs_as_splits,
    transposes_from_splits,
    # after transposes_from_splits, whose Transposes may be among an attention's operands' steps
    attention_operands_in_one_transpose,
    # after the shapings that write Transposes back (transposes_from_splits): a run of them that
    # one Transpose makes becomes that Transpose
    transpose_steps_as_one,
    # after transpose_steps_as_one, which writes a run's one Transpose where the toolkit takes it:
    # the runs left with a Transpose over its extent become swaps within it
    wide_transposes_as_block_swaps,
    # after token_rows_as_sequences, which finds its regions of rows from the Reshapes this one
    # replaces, and after transpose_steps_as_one, whose runs of moves the Pads would cut
    token_rows_of_planes_padded,
    # after the layout shapings, which move and join the Reshapes around its Convs
    small_planes_into_channels,
    # last: writes the defaults of the nodes the other shapings write too
    defaults_written,
)

__all__ = ["FAMILIES", "TOOLKIT_SHAPINGS", "Shaping", *(shaping.__name__ for shaping in TOOLKIT_SHAPINGS)]
