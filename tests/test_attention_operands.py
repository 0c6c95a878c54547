"""The attention kernel reads its query, keys and values straight from the projections and writes
straight into the next one's layout (passes/simplify_layout/kernel_operands.py, `attention_operands`), on the
forms torch.onnx and paddle2onnx write: separate projections each split into heads by Reshape
and Transpose, one projection split into q/k/v by Gather or by Slice and Squeeze, and the head
merge after it. Each plan is checked for its steps and, run in the emulator, against
onnxruntime; a head split that does not read whole rows of the projection stays."""
from __future__ import annotations

import numpy as np
from onnx import helper

from conftest import make_model, value_info, weight
from test_simplify_layout import attempts, npu_kernels

RNG = np.random.default_rng(36)
TOKENS, HEADS, HEAD = 24, 4, 16
WIDTH = HEADS * HEAD
LAYOUT = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def ints(name: str, values) -> object:
    return weight(name, np.array(values, dtype=np.int64))


def linear(x: str, y: str, name: str, outputs: int) -> tuple[list, list]:
    """x @ W + b, as both exporters write a linear layer on [1, tokens, width]."""
    nodes = [helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_mm"], name=name),
             helper.make_node("Add", [f"{name}_mm", f"{name}_b"], [y], name=f"{name}_bias")]
    return nodes, [weight(f"{name}_w", RNG.normal(0, 0.2, (WIDTH, outputs)).astype(np.float32)),
                   weight(f"{name}_b", RNG.normal(0, 0.1, (outputs,)).astype(np.float32))]


def core(q: str, kt: str, v: str, merged: str) -> tuple[list, list]:
    """softmax(q kT / sqrt(D)) v on [1, H, S, D], then the head merge to [1, S, H*D]."""
    nodes = [helper.make_node("MatMul", [q, kt], ["scores"], name="scores"),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scaling"),
             helper.make_node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["probs", v], ["context"], name="context"),
             helper.make_node("Transpose", ["context"], ["merged_t"], name="merge_t", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["merged_t", "merged_shape"], [merged], name="merge")]
    return nodes, [weight("scale", np.array(HEAD ** -0.5, np.float32)), ints("merged_shape", [1, TOKENS, WIDTH])]


def attention_model(split: list, split_weights: list, projections: list, projection_weights: list):
    """x -> projections -> q/k/v split -> attention -> head merge -> output projection."""
    body, body_weights = core("q", "kt", "v", "merged")
    out, out_weights = linear("merged", "y", "out", WIDTH)
    return make_model([*projections, *split, *body, *out], [value_info("x", [1, TOKENS, WIDTH])],
                      [value_info("y", [1, TOKENS, WIDTH])],
                      [*projection_weights, *split_weights, *body_weights, *out_weights])


def separate_projections(key_perm: list[int]) -> object:
    """torch.onnx's and paddle2onnx's BERT/ViT form: three projections, each Reshape to
    [1, S, H, D] and Transpose to [1, H, S, D] (the keys straight to [1, H, D, S])."""
    projections, weights = [], [ints("heads_shape", [1, TOKENS, HEADS, HEAD])]
    split = []
    for name, perm in (("q", [0, 2, 1, 3]), ("kt", key_perm), ("v", [0, 2, 1, 3])):
        nodes, made = linear("x", f"{name}_p", f"{name}_proj", WIDTH)
        projections += nodes
        weights += made
        split += [helper.make_node("Reshape", [f"{name}_p", "heads_shape"], [f"{name}_h"], name=f"{name}_heads"),
                  helper.make_node("Transpose", [f"{name}_h"], [name], name=f"{name}_t", perm=perm)]
    return attention_model(split, [], projections, weights)


def test_separate_projections_feed_the_kernel_without_layout_steps(tmp_path):
    kernels, ctx = npu_kernels(separate_projections([0, 2, 3, 1]), tmp_path)
    assert kernels.count("exSDPAttention") == 1
    assert not LAYOUT & set(kernels[kernels.index("exSDPAttention"):-1]), kernels
    attention = next(n for n in ctx.graph.nodes if n.op == "exSDPAttention")
    assert {"q_heads", "q_t", "kt_t", "merge_t", "merge"} <= set(ctx.origins[attention.name])


def shifted_window_scores(model, inner_read_twice: bool = False):
    """`model` with its scaled scores taking a relative position bias per head, then a mask per
    query and key (Swin's shifted-window attention), before the Softmax; `inner_read_twice`
    writes the biased scores to a graph output too."""
    nodes = list(model.graph.node)
    softmax = next(n for n in nodes if n.op_type == "Softmax")
    softmax.input[0] = "masked"
    at = nodes.index(softmax)
    added = [helper.make_node("Add", ["scaled", "position_bias"], ["biased"], name="position_bias_add"),
             helper.make_node("Add", ["biased", "window_mask"], ["masked"], name="mask_add")]
    del model.graph.node[:]
    model.graph.node.extend(nodes[:at] + added + nodes[at:])
    model.graph.initializer.extend([
        weight("position_bias", RNG.normal(0, 1, (HEADS, TOKENS, TOKENS)).astype(np.float32)),
        weight("window_mask", np.where(RNG.random((1, 1, TOKENS, TOKENS)) < 0.3, -100.0, 0.0).astype(np.float32))])
    if inner_read_twice:
        model.graph.output.append(value_info("biased", [1, HEADS, TOKENS, TOKENS]))
    return model


def test_a_bias_and_a_mask_added_to_the_scores_are_one_mask_of_the_kernel(tmp_path):
    """The two constant addends become one (`constant_operands_as_one`), which exSDPAttention
    takes as its mask: one kernel, where the two Adds had kept the attention apart."""
    kernels, ctx = npu_kernels(shifted_window_scores(separate_projections([0, 2, 3, 1])), tmp_path)
    assert kernels.count("exSDPAttention") == 1 and "Add" not in kernels, kernels
    assert any(record.rule == "constant_operands_as_one" for record in ctx.rewrites)


def test_biased_scores_read_elsewhere_keep_both_adds(tmp_path):
    kernels, ctx = npu_kernels(shifted_window_scores(separate_projections([0, 2, 3, 1]), inner_read_twice=True),
                               tmp_path)
    assert "exSDPAttention" not in kernels
    assert not any(record.rule == "constant_operands_as_one" for record in ctx.rewrites)


def test_keys_transposed_twice_feed_the_kernel(tmp_path):
    # torch.onnx writes k.transpose(-1, -2) after the head Transpose: [0, 2, 1, 3] then [0, 1, 3, 2];
    # the early layout pass joins the two, the kernel reads the result
    model = separate_projections([0, 2, 1, 3])
    graph = model.graph
    transposed = next(n for n in graph.node if n.name == "kt_t")
    transposed.output[0] = "k_heads"
    graph.node.insert(list(graph.node).index(transposed) + 1,
                      helper.make_node("Transpose", ["k_heads"], ["kt"], name="k_swap", perm=[0, 1, 3, 2]))
    kernels, _ = npu_kernels(model, tmp_path)
    assert "exSDPAttention" in kernels and "Transpose" not in kernels, kernels


def fused_projection_split(by: str) -> object:
    """timm's and paddle2onnx's ViT form: one projection to [1, S, 3*H*D], Reshape to
    [1, S, 3, H, D], Transpose to [3, 1, H, S, D], then q/k/v by Gather (timm) or by Slice and
    Squeeze (paddle2onnx); the keys Transposed to [1, H, D, S]."""
    projection, weights = linear("x", "qkv", "qkv_proj", 3 * WIDTH)
    split = [helper.make_node("Reshape", ["qkv", "qkv_shape"], ["qkv_h"], name="qkv_heads"),
             helper.make_node("Transpose", ["qkv_h"], ["qkv_t"], name="qkv_t", perm=[2, 0, 3, 1, 4])]
    constants = [ints("qkv_shape", [1, TOKENS, 3, HEADS, HEAD]), ints("axis0", [0])]
    for index, name in enumerate(("q", "k", "v")):
        if by == "Gather":
            constants.append(ints(f"{name}_index", index))
            split.append(helper.make_node("Gather", ["qkv_t", f"{name}_index"], [f"{name}_g"], name=f"{name}_pick", axis=0))
        else:
            constants += [ints(f"{name}_start", [index]), ints(f"{name}_end", [index + 1])]
            split += [helper.make_node("Slice", ["qkv_t", f"{name}_start", f"{name}_end", "axis0"], [f"{name}_s"],
                                       name=f"{name}_pick"),
                      helper.make_node("Squeeze", [f"{name}_s", "axis0"], [f"{name}_g"], name=f"{name}_squeeze")]
    split += [helper.make_node("Identity", ["q_g"], ["q"], name="q_id"), helper.make_node("Identity", ["v_g"], ["v"], name="v_id"),
              helper.make_node("Transpose", ["k_g"], ["kt"], name="k_t", perm=[0, 1, 3, 2])]
    return attention_model(split, constants, projection, weights)


def test_one_projection_split_by_gather_feeds_the_kernel_whole(tmp_path):
    kernels, ctx = npu_kernels(fused_projection_split("Gather"), tmp_path)
    assert kernels == ["Reshape", "Conv", "exSDPAttention", "Conv", "Reshape"], kernels
    attention = next(n for n in ctx.graph.nodes if n.op == "exSDPAttention")
    assert [t.shape for t in attention.inputs if not hasattr(t, "values")] == [[TOKENS, 3 * WIDTH, 1, 1]]


def test_one_projection_split_by_slices_feeds_the_kernel_whole(tmp_path):
    kernels, _ = npu_kernels(fused_projection_split("Slice"), tmp_path)
    assert kernels == ["Reshape", "Conv", "exSDPAttention", "Conv", "Reshape"], kernels


def interleaved_query_heads(model):
    """`model` with the query's head channels every HEADS-th channel of its projection:
    Reshape to [1, S, D, H], Transpose to [1, H, S, D]."""
    for node in model.graph.node:
        if node.name == "q_heads":
            node.input[1] = "interleaved_shape"
        if node.name == "q_t":
            node.attribute[0].ints[:] = [0, 3, 1, 2]
    model.graph.initializer.append(ints("interleaved_shape", [1, TOKENS, HEAD, HEADS]))
    return model


def test_a_head_split_that_does_not_read_whole_rows_is_one_staging_relabel(tmp_path):
    # the query's head channels are every HEADS-th channel of its projection ([1, S, D, H] ->
    # [1, H, S, D]): no row of the projection holds a head, so the kernel reads it from the
    # projection relabelled to [1, S*H*D / H, H], whose channels hold them; that relabel stays
    # a step, the head split's Transpose does not
    model = interleaved_query_heads(separate_projections([0, 2, 3, 1]))
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels == ["Reshape", "Conv", "Conv", "Conv", "Reshape", "exSDPAttention", "Conv", "Reshape"], kernels
    attention = next(n for n in ctx.graph.nodes if n.op == "exSDPAttention")
    staged = next(t for t in attention.inputs if list(t.shape) == [1, TOKENS * WIDTH // HEADS, HEADS])
    assert {"q_heads", "q_t"} <= set(ctx.origins[attention.name]) & set(ctx.origins[staged.inputs[0].name])
    outcomes = [outcome for rule, outcome in attempts(ctx, "softmax") if rule == "attention_operands"]
    assert "applied" in outcomes, outcomes


def guarded_attention(scaled_after_split: bool) -> object:
    """torch.onnx dynamo's form of HF attention: a mask added to the scores, and a NaN guard
    after the Softmax (Where(IsNaN(p), 0, p)) that keeps it from being one attention kernel.
    With `scaled_after_split`, GPT-2's form: one projection Split into q/k/v, q and the
    transposed keys each scaled by a scalar after their head split."""
    split, weights = [], [ints("heads_shape", [1, TOKENS, HEADS, HEAD]), weight("zero", np.array(0.0, np.float32)),
                          weight("root_scale", np.array(HEAD ** -0.25, np.float32)),
                          weight("mask", np.where(RNG.random((1, 1, 1, TOKENS)) < 0.2, -1e4, 0).astype(np.float32))]
    if scaled_after_split:
        projections, made = linear("x", "qkv", "qkv_proj", 3 * WIDTH)
        weights += [*made, ints("thirds", [WIDTH] * 3)]
        projections.append(helper.make_node("Split", ["qkv", "thirds"], ["q_p", "kt_p", "v_p"], name="qkv_split", axis=-1))
    else:
        projections = []
        for name in ("q", "kt", "v"):
            nodes, made = linear("x", f"{name}_p", f"{name}_proj", WIDTH)
            projections += nodes
            weights += made
    for name, perm in (("q", [0, 2, 1, 3]), ("kt", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        head = f"{name}_s" if scaled_after_split and name != "v" else name
        split += [helper.make_node("Reshape", [f"{name}_p", "heads_shape"], [f"{name}_h"], name=f"{name}_heads"),
                  helper.make_node("Transpose", [f"{name}_h"], [head], name=f"{name}_t", perm=perm)]
        if head != name:
            split.append(helper.make_node("Mul", [head, "root_scale"], [name], name=f"{name}_scale"))
    body = [helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
            helper.make_node("Add", ["scores", "mask"], ["masked"], name="masking"),
            helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
            helper.make_node("IsNaN", ["probs"], ["nan"], name="nan"),
            helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"], name="guard"),
            helper.make_node("MatMul", ["guarded", "v"], ["context"], name="context"),
            helper.make_node("Transpose", ["context"], ["merged_t"], name="merge_t", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["merged_t", "merged_shape"], ["merged"], name="merge")]
    out, out_weights = linear("merged", "y", "out", WIDTH)
    return make_model([*projections, *split, *body, *out], [value_info("x", [1, TOKENS, WIDTH])],
                      [value_info("y", [1, TOKENS, WIDTH])],
                      [*weights, ints("merged_shape", [1, TOKENS, WIDTH]), *out_weights])


def test_matrix_multiplies_of_an_unfused_attention_read_the_projections(tmp_path):
    kernels, ctx = npu_kernels(guarded_attention(scaled_after_split=False), tmp_path)
    scores = next(n for n in ctx.graph.nodes if "scores" in ctx.origins.get(n.name, ()))
    assert scores.op == "exMatMul" and {"q_heads", "q_t", "kt_heads", "kt_t", "masking"} <= set(ctx.origins[scores.name])
    # the values' reduced axis (the tokens) runs across rows of their projection: the product
    # reads them from the projection relabelled to [1, S, H*D], its tokens as channels (one
    # Reshape step for the head split); it writes the merge's Transpose ([1, S, H, D] stores
    # the tokens as channels, the result's rows n)
    context = next(n for n in ctx.graph.nodes if "context" in ctx.origins.get(n.name, ()))
    assert {"merge_t", "v_heads", "v_t"} <= set(ctx.origins[context.name])
    staged = [t for t in context.inputs if list(t.shape) == [1, TOKENS, WIDTH]]
    assert len(staged) == 1 and staged[0].inputs[0].op == "Reshape", context.inputs
    assert "Transpose" not in kernels and kernels.count("Reshape") == 4, kernels


def test_scalings_after_one_projections_split_fold_into_its_weights(tmp_path):
    # GPT-2: the scalar scalings of q and k fold into their thirds of the projection (passes/
    # rewrites/affine.py, through the Split), then the product reads the Split's parts
    kernels, ctx = npu_kernels(guarded_attention(scaled_after_split=True), tmp_path)
    assert "Mul" not in kernels, kernels
    scores = next(n for n in ctx.graph.nodes if "scores" in ctx.origins.get(n.name, ()))
    assert scores.op == "exMatMul" and "q_t" in ctx.origins[scores.name]


def test_one_tensor_relabelled_for_two_linear_layers_is_relabelled_once(tmp_path):
    # the residual and the projection both read x in the 1x1 Conv layout: one relabel serves both
    first, first_weights = linear("x", "h", "fc", WIDTH)
    model = make_model([*first, helper.make_node("MatMul", ["x", "skip_w"], ["s"], name="skip"),
                        helper.make_node("Add", ["h", "s"], ["y"], name="residual")],
                       [value_info("x", [1, TOKENS, WIDTH])], [value_info("y", [1, TOKENS, WIDTH])],
                       [*first_weights, weight("skip_w", RNG.normal(0, 0.2, (WIDTH, WIDTH)).astype(np.float32))])
    kernels, ctx = npu_kernels(model, tmp_path)
    assert kernels.count("Reshape") == 2, kernels  # into the Convs' layout once, and out
    assert "shared_layout" in {r.rule for r in ctx.rewrites}


def test_conv_attention_reads_heads_along_the_feature_maps_channels(tmp_path):
    # EfficientViT's cascaded group attention on a [B, D, H, W] feature map: q, k, v are channel
    # groups of a 1x1 Conv, flattened to [B, D, H*W]; q is transposed to [B, H*W, D]. The head
    # dimension D is the feature map's channel axis, which its stored NC1HWC2 view keeps whole
    side, channels = 4, 16
    tokens = side * side
    model = make_model(
        [helper.make_node("Conv", ["x", "qkv_w"], ["qkv"], name="qkv"),
         helper.make_node("Split", ["qkv", "thirds"], ["q4", "k4", "v4"], name="split", axis=1),
         *[helper.make_node("Reshape", [f"{n}4", "flat"], [n], name=f"{n}_flat") for n in ("q", "k", "v")],
         helper.make_node("Transpose", ["q"], ["qt"], name="q_t", perm=[0, 2, 1]),
         helper.make_node("MatMul", ["qt", "k"], ["scores"], name="scores"),
         helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
         helper.make_node("Transpose", ["probs"], ["probs_t"], name="probs_t", perm=[0, 2, 1]),
         helper.make_node("MatMul", ["v", "probs_t"], ["context"], name="context"),
         helper.make_node("Reshape", ["context", "map"], ["y"], name="unflat")],
        [value_info("x", [1, channels, side, side])], [value_info("y", [1, channels, side, side])],
        [weight("qkv_w", RNG.normal(0, 0.3, (3 * channels, channels, 1, 1)).astype(np.float32)),
         ints("thirds", [channels] * 3), ints("flat", [1, channels, tokens]), ints("map", [1, channels, side, side])])
    kernels, _ = npu_kernels(model, tmp_path)
    assert kernels == ["Conv", "Split", "exMatMul", "Softmax", "exMatMul"], kernels


def test_heads_unbound_and_stacked_feed_and_leave_the_kernel(tmp_path):
    # the head split as separate heads stacked again (Split, Reshape per head, Concat), the
    # form the rewrite pass gives a Transpose the NPU cannot run, and the same for the merge
    model = separate_projections([0, 2, 3, 1])
    graph = model.graph
    q_t = next(n for n in graph.node if n.name == "q_t")
    graph.node.remove(q_t)
    heads = [f"q_head{h}" for h in range(HEADS)]
    stacked = [helper.make_node("Split", ["q_h", "ones"], [f"{h}_s" for h in heads], name="q_unbind", axis=2),
               *[helper.make_node("Reshape", [f"{h}_s", "head_shape"], [h], name=f"{h}_r") for h in heads],
               helper.make_node("Concat", heads, ["q"], name="q_stack", axis=1)]
    merge_t = next(n for n in graph.node if n.name == "merge_t")
    graph.node.remove(merge_t)
    parts = [f"c_head{h}" for h in range(HEADS)]
    merged = [helper.make_node("Split", ["context", "ones"], [f"{p}_s" for p in parts], name="c_unbind", axis=1),
              *[helper.make_node("Reshape", [f"{p}_s", "token_shape"], [p], name=f"{p}_r") for p in parts],
              helper.make_node("Concat", parts, ["merged_t"], name="c_stack", axis=2)]
    for before, made in (("scores", stacked), ("merge", merged)):
        at = list(graph.node).index(next(n for n in graph.node if n.name == before))
        for offset, node in enumerate(made):
            graph.node.insert(at + offset, node)
    graph.initializer.extend([ints("ones", [1] * HEADS), ints("head_shape", [1, 1, TOKENS, HEAD]),
                              ints("token_shape", [1, TOKENS, 1, HEAD])])
    kernels, ctx = npu_kernels(model, tmp_path)
    attention = next(n for n in ctx.graph.nodes if n.op == "exSDPAttention")
    assert {"q_unbind", "q_stack", "c_unbind", "c_stack"} <= set(ctx.origins[attention.name])
    assert not {"Split", "Concat", "Transpose"} & set(kernels), kernels


KV_HEADS = 2


def rotary_constants() -> list:
    """cos and sin [1, 1, S, D] of rotary embedding's angles, and the Slices' bounds."""
    half = HEAD // 2
    angles = np.arange(TOKENS)[:, None] * (0.5 ** np.arange(half))[None, :]
    angles = np.concatenate([angles, angles], axis=1)[None, None].astype(np.float32)
    return [weight("cos", np.cos(angles)), weight("sin", np.sin(angles)), ints("d_axis", [3]),
            ints("zero_at", [0]), ints("half_at", [half]), ints("end_at", [HEAD])]


def rotary(x: str, y: str) -> list:
    """Rotary embedding as torch.onnx writes HF llama's on [1, heads, S, D]: x * cos +
    rotate_half(x) * sin, rotate_half by two Slices, a Neg and a Concat."""
    return [helper.make_node("Mul", [x, "cos"], [f"{x}_cos"], name=f"{x}_mul_cos"),
            helper.make_node("Slice", [x, "zero_at", "half_at", "d_axis"], [f"{x}_x1"], name=f"{x}_slice1"),
            helper.make_node("Slice", [x, "half_at", "end_at", "d_axis"], [f"{x}_x2"], name=f"{x}_slice2"),
            helper.make_node("Neg", [f"{x}_x2"], [f"{x}_neg"], name=f"{x}_neg"),
            helper.make_node("Concat", [f"{x}_neg", f"{x}_x1"], [f"{x}_rot"], name=f"{x}_rotate", axis=-1),
            helper.make_node("Mul", [f"{x}_rot", "sin"], [f"{x}_sin"], name=f"{x}_mul_sin"),
            helper.make_node("Add", [f"{x}_cos", f"{x}_sin"], [y], name=f"{x}_rotary")]


def llama_attention(guarded: bool = False, repeat_by: str = "Expand") -> object:
    """torch.onnx's (TorchScript) form of HF llama attention with grouped-query heads: q, k, v
    projections without bias, each split into heads (Reshape, Transpose), rotary embedding on q
    and k, the key/value heads repeated for the query heads (Unsqueeze, Expand, Reshape), a
    causal mask added to the scaled scores, and the head merge. `guarded`: the NaN guard after
    the Softmax (Where(IsNaN(p), 0, p)) HF's exports write, which keeps it from being one
    attention kernel. `repeat_by` "Gather": the heads repeated by one Gather of [0, 0, 1, 1]."""
    constants = [ints("q_shape", [1, TOKENS, HEADS, HEAD]), ints("kv_shape", [1, TOKENS, KV_HEADS, HEAD]),
                 ints("unit_axis", [2]), ints("repeat", [1, KV_HEADS, HEADS // KV_HEADS, TOKENS, HEAD]),
                 ints("heads", [1, HEADS, TOKENS, HEAD]), weight("scale", np.array(HEAD ** -0.5, np.float32)),
                 weight("causal", np.triu(np.full((1, 1, TOKENS, TOKENS), -1e4, np.float32), 1)),
                 ints("merged_shape", [1, TOKENS, WIDTH])]
    nodes = []
    for name, heads in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        nodes += [helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_p"], name=f"{name}_proj"),
                  helper.make_node("Reshape", [f"{name}_p", "q_shape" if name == "q" else "kv_shape"], [f"{name}_h"],
                                   name=f"{name}_heads"),
                  helper.make_node("Transpose", [f"{name}_h"], [f"{name}_t"], name=f"{name}_t", perm=[0, 2, 1, 3])]
        constants.append(weight(f"{name}_w", RNG.normal(0, 0.2, (WIDTH, heads * HEAD)).astype(np.float32)))
    nodes += rotary("q_t", "q") + rotary("k_t", "k")
    constants += rotary_constants()
    constants.append(ints("repeated_heads", np.arange(HEADS) // (HEADS // KV_HEADS)))
    for name in ("k", "v"):
        source = name if name == "k" else "v_t"
        if repeat_by == "Gather":
            nodes.append(helper.make_node("Gather", [source, "repeated_heads"], [f"{name}_all"], name=f"{name}_repeat",
                                          axis=1))
            continue
        nodes += [helper.make_node("Unsqueeze", [source, "unit_axis"], [f"{name}_u"], name=f"{name}_unsqueeze"),
                  helper.make_node("Expand", [f"{name}_u", "repeat"], [f"{name}_e"], name=f"{name}_expand"),
                  helper.make_node("Reshape", [f"{name}_e", "heads"], [f"{name}_all"], name=f"{name}_repeat")]
    nodes += [helper.make_node("Transpose", ["k_all"], ["kt"], name="k_swap", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scaling"),
              helper.make_node("Add", ["scaled", "causal"], ["masked"], name="masking"),
              helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1)]
    if guarded:
        nodes += [helper.make_node("IsNaN", ["probs"], ["nan"], name="nan"),
                  helper.make_node("Where", ["nan", "zero", "probs"], ["weights"], name="guard")]
        constants.append(weight("zero", np.array(0.0, np.float32)))
    nodes += [helper.make_node("MatMul", ["weights" if guarded else "probs", "v_all"], ["context"], name="context"),
              helper.make_node("Transpose", ["context"], ["merged_t"], name="merge_t", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["merged_t", "merged_shape"], ["merged"], name="merge"),
              helper.make_node("MatMul", ["merged", "o_w"], ["y"], name="o_proj")]
    constants.append(weight("o_w", RNG.normal(0, 0.2, (WIDTH, WIDTH)).astype(np.float32)))
    return make_model(nodes, [value_info("x", [1, TOKENS, WIDTH])], [value_info("y", [1, TOKENS, WIDTH])], constants)


def test_rotary_runs_on_the_projections_and_the_scores_read_them(tmp_path):
    # the head splits of q and k move down through their rotary embedding (its rotate-half a
    # Gather, re-indexed for the projection's [S, H*D, 1, 1] layout) into the scores' matrix
    # multiply (here the attention kernel), which reads the repeated key and value heads in
    # place: from the projections to the kernel no layout step and no Expand
    kernels, ctx = npu_kernels(llama_attention(), tmp_path)
    attention = next(n for n in ctx.graph.nodes if "scores" in ctx.origins.get(n.name, ()))
    assert attention.op == "exSDPAttention"
    assert {"q_heads", "q_t", "k_heads", "k_t", "k_expand", "k_repeat", "k_swap", "v_expand"} <= set(
        ctx.origins[attention.name])
    assert kernels == ["Reshape", "Conv", "Conv", "Conv", *["Mul", "Gather", "Mul", "Add"] * 2, "exSDPAttention",
                       "Conv", "Reshape"], kernels
    rotations = [n for n in ctx.graph.nodes if n.op == "Gather" and n.outputs[0].shape[2:] == [1, 1]]
    assert sorted(n.outputs[0].shape[1] for n in rotations) == [KV_HEADS * HEAD, WIDTH], kernels


def test_heads_repeated_by_a_gather_are_read_in_place(tmp_path):
    kernels, ctx = npu_kernels(llama_attention(repeat_by="Gather"), tmp_path)
    attention = next(n for n in ctx.graph.nodes if n.op == "exSDPAttention")
    assert {"k_repeat", "v_repeat"} <= set(ctx.origins[attention.name])
    assert kernels == ["Reshape", "Conv", "Conv", "Conv", *["Mul", "Gather", "Mul", "Add"] * 2, "exSDPAttention",
                       "Conv", "Reshape"], kernels


def test_rotary_runs_on_the_projections_when_the_scores_are_their_own_kernel(tmp_path):
    # HF's exports: the NaN guard leaves the scores' exMatMul on its own; it reads q and the
    # repeated keys straight from their rotary embedding on the projections' layout
    kernels, ctx = npu_kernels(llama_attention(guarded=True), tmp_path)
    scores = next(n for n in ctx.graph.nodes if "scores" in ctx.origins.get(n.name, ()))
    assert scores.op == "exMatMul"
    assert {"q_heads", "q_t", "k_heads", "k_t", "k_expand", "k_repeat", "k_swap"} <= set(ctx.origins[scores.name])
    assert not LAYOUT & set(kernels[1:kernels.index("exMatMul")]), kernels
    # the values: one Reshape staging their tokens as channels, read by the second product
    assert "Expand" not in kernels and kernels.count("Reshape") == 4, kernels
    rotations = [n for n in ctx.graph.nodes if n.op == "Gather" and n.outputs[0].shape[2:] == [1, 1]]
    assert sorted(n.outputs[0].shape[1] for n in rotations) == [KV_HEADS * HEAD, WIDTH]


def test_a_head_split_into_a_matrix_multiply_that_cannot_read_it_stays(tmp_path):
    # the query's heads are every HEADS-th channel of its projection ([1, S, D, H] -> [1, H, S, D]):
    # the move would reach the scores, which cannot read rows of interleaved channels
    model = interleaved_query_heads(llama_attention())
    _, ctx = npu_kernels(model, tmp_path)
    outcomes = [outcome for rule, outcome in attempts(ctx, "q_t") if rule == "move_layout_down"]
    assert any("cannot take the move in" in outcome and "is not whole rows" in outcome for outcome in outcomes), outcomes


def test_a_kernel_whose_body_names_an_input_otherwise_absorbs_reads_under_both_names():
    """A fused kernel's body may read an input under another name than the tensor the node
    reads (a move into the kernel renamed it: timm's gcvit_xxtiny, whose global query
    crashed the planner, KeyError 'mul_14/moved'). Absorbing a read keeps the body's name for
    the body and the node's tensor for the node, input by input."""
    from types import SimpleNamespace

    import onnx_graphsurgeon as gs

    from rkcompile.passes.simplify_layout.kernel_operands import _absorb
    from rkcompile.plan.schema import FUSED_DOMAIN

    outer_q, keys_source = gs.Variable("q/moved", np.float32, [1, 2, 4, 8]), gs.Variable("k", np.float32, [1, 2, 8, 4])
    inner_q, keys, out = (gs.Variable("q/moved_2", np.float32, [1, 2, 4, 8]),
                          gs.Variable("kT", np.float32, [1, 2, 4, 8]), gs.Variable("y", np.float32, [1, 2, 4, 4]))
    product = gs.Node("MatMul", "scores", inputs=[inner_q, gs.Variable("kT", np.float32, [1, 2, 4, 8])],
                      outputs=[gs.Variable("y", np.float32, [1, 2, 4, 4])])
    kernel = gs.Node("exMatMul", "exMatMul:scores", domain=FUSED_DOMAIN, inputs=[outer_q, keys], outputs=[out],
                     attrs={"body": gs.Graph(nodes=[product], inputs=list(product.inputs), outputs=product.outputs)})
    read = gs.Node("Transpose", "keys", attrs={"perm": [0, 1, 3, 2]}, inputs=[keys_source], outputs=[keys])
    made = []
    simplifier = SimpleNamespace(graph_outputs=set(), fresh=lambda name: name,
                                 ctx=SimpleNamespace(graph=SimpleNamespace(opset=17)),
                                 replace=lambda rule, old, new: made.extend(new))
    _absorb(kernel, "exMatMul", [product], {"q/moved_2": outer_q, "kT": keys}, [read], [], simplifier)
    (node,) = made
    assert [(t.name, inner.name) for t, inner in zip(node.inputs, node.attrs["body"].inputs)] == [
        ("k", "k"), ("q/moved", "q/moved_2")]
