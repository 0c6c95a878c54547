"""Import, constant folding and no-op removal on small hand-built graphs."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rkcompile.compiler.pipeline import compile_model
from rkcompile.plan.schema import contract_violations

from conftest import make_model, value_info, weight


def _devices(plan):
    return {n.name: n.device for n in plan.nodes}


def test_exporter_shape_chain_folds_and_reshape_gets_a_static_shape(save):
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus_one"], ["target_shape"], name="concat", axis=0),
        helper.make_node("Cast", ["target_shape"], ["target_shape64"], name="cast", to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "target_shape64"], ["y"], name="reshape"),
    ]
    model = make_model(nodes, [value_info("x", [2, 3, 4, 5])], [value_info("y", None)],
                       [weight("zero", np.array(0, np.int64)), weight("minus_one", np.array([-1], np.int64))])
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "a"
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "b"
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert [devices[n] for n in ("shape", "gather", "unsqueeze", "concat", "cast")] == ["folded"] * 5
    assert devices["reshape"] in ("npu", "cpu")
    assert plan.tensors["y"].shape == (2, 60)
    assert contract_violations(plan) == []


def test_huge_constant_of_shape_folds_without_allocating(save):
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("Add", ["x", "big"], ["y"], name="add")]
    dims = [1, 64, 100_000, 100_000]
    model = make_model(nodes, [value_info("x", dims)], [value_info("y", dims)],
                       [weight("shape", np.array(dims, np.int64))])
    plan, _ = compile_model(save(model), "rk3588")
    assert _devices(plan)["fill"] == "folded"
    assert plan.tensors["big"].region == "weight"
    width = {"float16": 2, "float32": 4}
    assert plan.tensors["big"].bytes == 64 * 100_000 * 100_000 * width[plan.tensors["big"].dtype]
    assert plan.tensors["x"].bytes == 64 * 100_000 * 100_000 * 4


def test_identity_and_dropout_are_removed_and_output_names_survive(save):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["i"], name="identity"),
             helper.make_node("Dropout", ["i"], ["d"], name="dropout"),
             helper.make_node("Sigmoid", ["d"], ["s"], name="sigmoid"),
             helper.make_node("Identity", ["s"], ["y"], name="identity_out")]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])], [value_info("y", [1, 3, 4, 4])])
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["identity"] == devices["dropout"] == devices["identity_out"] == "removed"
    compute = [s for s in plan.steps if s.device != "host"]
    assert [o.split("@")[0] for o in compute[-1].outputs] == ["y"]
    assert [s.kernel for s in compute] == ["Relu", "Sigmoid"]
    assert contract_violations(plan) == []


def test_cast_to_the_type_it_already_has_is_removed_and_a_real_cast_stays(save):
    """An RMSNorm's float32 round trip (`x.to(float32)` ... `.to(input_dtype)`) in a float32
    model: both Casts are no-ops; a Cast that changes the type is kept."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["c"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("CastLike", ["s", "x"], ["y"], name="like_x"),
             helper.make_node("Cast", ["y"], ["z"], name="to_int", to=TensorProto.INT32)]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])],
                       [value_info("y", [1, 3, 4, 4]), value_info("z", [1, 3, 4, 4], TensorProto.INT32)])
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["to_float"] == devices["like_x"] == "removed"
    assert devices["to_int"] != "removed"
    assert contract_violations(plan) == []


def test_swish_with_a_beta_of_one_loses_its_mul_and_fuses_with_the_conv(save):
    """paddle2onnx's swish, x * sigmoid(1.0 * x), after a Conv: the Mul by one is a no-op, so
    the Conv and the swish are one kernel; a Mul by ones that broadcasts its input larger and
    a Div by two stay."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Mul", ["one", "c"], ["b"], name="beta"),
             helper.make_node("Sigmoid", ["b"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="swish"),
             helper.make_node("Mul", ["y", "ones_wide"], ["wide"], name="broadcast_ones"),
             helper.make_node("Div", ["y", "two"], ["half"], name="halve")]
    inits = [weight("w", np.full((4, 3, 3, 3), 0.1, np.float32)), weight("one", np.array([1.0], np.float32)),
             weight("ones_wide", np.ones((2, 4, 4, 4), np.float32)), weight("two", np.array(2.0, np.float32))]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])],
                       [value_info("wide", [2, 4, 4, 4]), value_info("half", [1, 4, 4, 4])], inits)
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["beta"] == "removed"
    assert devices["broadcast_ones"] != "removed" and devices["halve"] != "removed"
    assert [s.kernel for s in plan.steps if s.device == "npu"][0] == "ConvExSwish"
    assert contract_violations(plan) == []


def test_an_expand_or_tile_to_the_shape_it_has_is_removed(save):
    """jax2tf writes BroadcastTo to the shape a tensor has already: every element once, as it was."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Expand", ["r", "same"], ["e"], name="expand_same"),
             helper.make_node("Tile", ["e", "ones"], ["t"], name="tile_once"),
             helper.make_node("Expand", ["t", "wider"], ["y"], name="expand_wider")]
    inits = [weight("same", np.array([1, 4, 4, 4], np.int64)), weight("ones", np.ones(4, np.int64)),
             weight("wider", np.array([2, 4, 4, 4], np.int64))]
    model = make_model(nodes, [value_info("x", [1, 4, 4, 4])], [value_info("y", [2, 4, 4, 4])], inits)
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["expand_same"] == devices["tile_once"] == "removed"
    assert devices["expand_wider"] != "removed"
    assert contract_violations(plan) == []


def test_a_slice_keeping_every_element_is_removed(save):
    """timm's GhostNet cuts its Concat back to the width it has: a step-1 Slice whose output has
    its input's shape returns its input; a Slice that cuts, or reverses, stays."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Slice", ["r", "zero", "four", "one_axis", "step_one"], ["s"], name="slice_all"),
             helper.make_node("Slice", ["s", "minus_one", "before_all", "one_axis", "step_back"], ["b"],
                              name="slice_reversed"),
             helper.make_node("Slice", ["b", "zero", "two", "one_axis"], ["y"], name="slice_cut")]
    inits = [weight(name, np.array([value], np.int64)) for name, value in (
        ("zero", 0), ("four", 4), ("two", 2), ("one_axis", 1), ("step_one", 1), ("minus_one", -1),
        ("before_all", -5), ("step_back", -1))]
    model = make_model(nodes, [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 2, 3, 3])], inits)
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["slice_all"] == "removed"
    assert devices["slice_reversed"] != "removed" and devices["slice_cut"] != "removed"
    assert contract_violations(plan) == []


def test_a_pad_of_zero_widths_is_removed(save):
    """HF Swin pads every block's map to its window size, by zero where the size divides: a Pad
    of all-zero widths (input or, before opset 11, attribute) returns its input; a Pad that
    widens stays."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Pad", ["r", "nothing"], ["p"], name="pad_nothing", mode="constant"),
             helper.make_node("Pad", ["p", "one_each"], ["y"], name="pad_one", mode="reflect")]
    inits = [weight("nothing", np.zeros(8, np.int64)), weight("one_each", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))]
    model = make_model(nodes, [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 4, 5, 5])], inits)
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["pad_nothing"] == "removed" and devices["pad_one"] != "removed"
    assert contract_violations(plan) == []
    old = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                      helper.make_node("Pad", ["r"], ["y"], name="pad_nothing", pads=[0] * 8)],
                     [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 4, 3, 3])], opset=10)
    plan, _ = compile_model(save(old), "rk3588")
    assert _devices(plan)["pad_nothing"] == "removed"


def test_a_concat_or_sum_of_one_input_is_removed(save):
    """torchvision's DenseNet concatenates each block's first feature map alone: that Concat, and
    a Sum of one input, return their input; a Concat of two stays."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["r"], ["c"], name="concat_one", axis=1),
             helper.make_node("Sum", ["c"], ["s"], name="sum_one"),
             helper.make_node("Concat", ["s", "r"], ["y"], name="concat_two", axis=1)]
    model = make_model(nodes, [value_info("x", [1, 4, 3, 3])], [value_info("y", [1, 8, 3, 3])])
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert devices["concat_one"] == devices["sum_one"] == "removed"
    assert devices["concat_two"] != "removed"
    assert contract_violations(plan) == []


def test_identity_of_a_graph_input_to_an_output_stays(save):
    model = make_model([helper.make_node("Identity", ["x"], ["y"], name="copy")],
                       [value_info("x", [1, 3, 4, 4])], [value_info("y", [1, 3, 4, 4])])
    plan, _ = compile_model(save(model), "rk3588")
    assert _devices(plan)["copy"] in ("npu", "cpu")
    assert contract_violations(plan) == []


def test_unnamed_nodes_get_stable_unique_names(save):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"], name="dup"),
             helper.make_node("Sigmoid", ["b"], ["y"], name="dup")]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])], [value_info("y", [1, 3, 4, 4])])
    path = save(model)
    first, _ = compile_model(path, "rk3588")
    second, _ = compile_model(path, "rk3588")
    names = [n.name for n in first.nodes]
    assert names == ["Relu_0", "dup", "dup_1"]
    assert names == [n.name for n in second.nodes]


def test_out_of_order_file_is_sorted(save):
    nodes = [helper.make_node("Sigmoid", ["a"], ["y"], name="second"), helper.make_node("Relu", ["x"], ["a"], name="first")]
    model = make_model(nodes, [value_info("x", [1, 3, 4, 4])], [value_info("y", [1, 3, 4, 4])])
    path = save(model)
    plan, _ = compile_model(path, "rk3588")
    assert [s.nodes for s in plan.steps if s.device != "host"] == [("first",), ("second",)]


def test_rank5_and_integer_tensors_fall_back_with_reasons(save):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu5"),
             helper.make_node("Add", ["i", "i"], ["j"], name="int_add")]
    model = make_model(nodes, [value_info("x", [1, 2, 3, 4, 5]), value_info("i", [4], TensorProto.INT64)],
                       [value_info("y", [1, 2, 3, 4, 5]), value_info("j", [4], TensorProto.INT64)])
    plan, _ = compile_model(save(model), "rk3588")
    reasons = {n.name: n.reason for n in plan.nodes}
    assert "at most 4 dimensions" in reasons["relu5"] and "rank 5" in reasons["relu5"]
    assert "floating point" in reasons["int_add"] and "int64" in reasons["int_add"]


def _chained_shape_blocks(blocks: int):
    """`blocks` blocks, each reshaping by targets computed from the Shape of the block before
    (Shape -> Gather -> Mod/Sub/Div -> Unsqueeze -> Concat), as exporters write them. Shape
    inference's data propagation stops at Mod, so a block's shapes are known only once the block
    before has folded."""
    nodes, x = [], "x"
    for b in range(blocks):
        p = f"b{b}_"
        nodes += [helper.make_node("Shape", [x], [p + "s"], name=p + "shape"),
                  helper.make_node("Gather", [p + "s", "two"], [p + "l"], name=p + "gather", axis=0),
                  helper.make_node("Mod", [p + "l", "two"], [p + "odd"], name=p + "mod"),
                  helper.make_node("Sub", [p + "l", p + "odd"], [p + "even"], name=p + "sub"),
                  helper.make_node("Div", [p + "even", "two"], [p + "half"], name=p + "div"),
                  helper.make_node("Unsqueeze", [p + "half", "axis0"], [p + "hu"], name=p + "unsqueeze"),
                  helper.make_node("Concat", ["lead", p + "hu", "pair"], [p + "t"], name=p + "concat", axis=0),
                  helper.make_node("Mul", [p + "half", "two"], [p + "whole"], name=p + "mul"),
                  helper.make_node("Unsqueeze", [p + "whole", "axis0"], [p + "wu"], name=p + "unsqueeze_back"),
                  helper.make_node("Concat", ["lead", p + "wu"], [p + "back"], name=p + "concat_back", axis=0),
                  helper.make_node("Reshape", [x, p + "t"], [p + "r"], name=p + "split"),
                  helper.make_node("Relu", [p + "r"], [p + "a"], name=p + "relu"),
                  helper.make_node("Reshape", [p + "a", p + "back"], [p + "y"], name=p + "merge")]
        x = p + "y"
    nodes.append(helper.make_node("Sigmoid", [x], ["y"], name="out"))
    consts = [weight("two", np.array(2, np.int64)), weight("axis0", np.array([0], np.int64)),
              weight("lead", np.array([1, 16], np.int64)), weight("pair", np.array([2], np.int64))]
    return make_model(nodes, [value_info("x", [1, 16, 64])], [value_info("y", [1, 16, 64])], consts)


def test_constant_folding_runs_to_a_fixpoint_however_long_the_chain(save):
    """Every block's shape arithmetic folds however many blocks there are (there used to be a
    silent limit of 8 rounds, one block folding per round)."""
    blocks = 20
    plan, _ = compile_model(save(_chained_shape_blocks(blocks)), "rk3588")
    devices = _devices(plan)
    for b in range(blocks):
        assert [devices[f"b{b}_{op}"] for op in ("shape", "gather", "mod", "sub", "div", "unsqueeze", "concat", "mul",
                                                 "unsqueeze_back", "concat_back")] == ["folded"] * 10, b
    assert not [name for name, device in devices.items() if device == "cpu"]
    assert contract_violations(plan) == []


def _gather_elements_model(data: np.ndarray, index: np.ndarray, axis: int):
    nodes = [helper.make_node("GatherElements", ["data", "index"], ["picked"], name="pick", axis=axis),
             helper.make_node("Cast", ["picked"], ["picked_f"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "picked_f"], ["y"], name="add")]
    return make_model(nodes, [value_info("x", list(index.shape))], [value_info("y", list(index.shape))],
                      [weight("data", data), weight("index", index)])


def test_constant_gather_elements_onnx_reference_fails_on_folds_to_onnxruntime_value(save):
    """GatherElements over an axis longer than 64, with indices narrower than the data on
    another axis (transformers' token_type_ids buffer), is valid ONNX whose onnx.reference
    kernel fails (np.choose); it folds by its definition, to what onnxruntime computes, and the
    Gather of the embedding it indexes folds after it."""
    import onnxruntime as ort
    rng = np.random.default_rng(0)
    data = rng.integers(-50, 50, size=(3, 80), dtype=np.int64)
    index = rng.integers(-80, 80, size=(2, 40), dtype=np.int64)
    model = _gather_elements_model(data, index, axis=1)
    path = save(model)
    x = rng.standard_normal((2, 40)).astype(np.float32)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert not np.array_equal(expected, x + data[:2, :40])  # the indices really reorder
    plan, _ = compile_model(path, "rk3588")
    devices = _devices(plan)
    assert devices["pick"] == "folded" and devices["cast"] == "folded"
    import rkcompile
    got = rkcompile.run(rkcompile.compile(path, target="rk3588"), {"x": x})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=0.05)  # float16 on the NPU


def test_a_constant_node_no_evaluator_can_evaluate_stays_a_node(save, caplog):
    """A GatherElements index out of range cannot be folded: the model still plans, the node
    stays as a step and the log says why it did not fold."""
    model = _gather_elements_model(np.arange(64, dtype=np.int64).reshape(1, 64),
                                   np.full((1, 32), 64, dtype=np.int64), axis=1)
    plan, _ = compile_model(save(model), "rk3588")
    assert _devices(plan)["pick"] in ("npu", "cpu")
    assert "GatherElements node pick is not folded" in caplog.text


def test_verify_passes_names_the_pass_that_broke_the_graph_only_when_asked(save, monkeypatch):
    """Options.verify_passes (on in the test suite through RKCOMPILE_VERIFY_PASSES) checks the
    graph after every pass; off, as for users, a plan pays for no such check."""
    import pytest

    from rkcompile.compiler import pipeline
    from rkcompile.options import Options
    from rkcompile.passes import remove_noops

    path = save(make_model([helper.make_node("Relu", ["x"], ["r"], name="a"), helper.make_node("Relu", ["r"], ["y"], name="b")],
                           [value_info("x", [1, 4, 8, 8])], [value_info("y", [1, 4, 8, 8])]))
    assert Options().verify_passes  # tests/conftest.py turns it on for the whole suite
    original = remove_noops.run

    def duplicate_a_name(ctx):
        original(ctx)
        ctx.graph.nodes[1].name = ctx.graph.nodes[0].name

    monkeypatch.setattr(remove_noops, "run", duplicate_a_name)
    with pytest.raises(AssertionError, match="after pass remove-noops: duplicate node names"):
        pipeline.compile_model(path, "rk3588", Options(verify_passes=True))
    monkeypatch.setattr(remove_noops, "run", original)
    calls = []
    monkeypatch.setattr(pipeline, "verify", lambda ctx: calls.append(ctx) or [])
    pipeline.compile_model(path, "rk3588", Options(verify_passes=False))
    assert calls == []
    pipeline.compile_model(path, "rk3588", Options(verify_passes=True))
    assert len(calls) == len(pipeline.PASSES)


def test_constant_and_identity_fold_exactly_as_onnx_reference():
    """fold-constants reads Constant and Identity off the node; every value, dtype and shape is
    what onnx.reference's evaluator returns, and what it does not read (strings, bfloat16) is
    left to onnx.reference."""
    import onnx
    import onnx_graphsurgeon as gs
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    from rkcompile.passes.fold_constants import _reference_outputs, _trivial_outputs

    constants = [dict(value=numpy_helper.from_array(np.arange(6, dtype=np.float16).reshape(2, 3))),
                 dict(value=numpy_helper.from_array(np.array(3, dtype=np.int64))),
                 dict(value=numpy_helper.from_array(np.array([True, False]))),
                 dict(value_float=0.1), dict(value_floats=[0.1, 1e-7]), dict(value_int=7), dict(value_ints=[1, -1]),
                 dict(value_strings=["a"]),
                 dict(value=helper.make_tensor("v", TensorProto.BFLOAT16, [2], [1.5, 2.0]))]
    nodes = [helper.make_node("Constant", [], ["y"], **attributes) for attributes in constants]
    nodes += [helper.make_node("Identity", ["c"], ["y"])]
    read_off = 0
    for proto in nodes:
        initializers = [numpy_helper.from_array(np.array([[1.5, -2]], np.float32), "c")] if proto.input else []
        model = helper.make_model(helper.make_graph([proto], "g", [], [helper.make_value_info("y", onnx.TypeProto())],
                                                    initializers), opset_imports=[helper.make_opsetid("", 17)])
        node = gs.import_onnx(model).nodes[0]
        expected = ReferenceEvaluator(model).run(None, {})[0]
        ours = _trivial_outputs(node)
        read_off += ours is not None
        got = _reference_outputs(node, 17)[0]
        assert got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)
    assert read_off == len(nodes) - 2  # value_strings and the bfloat16 tensor went to onnx.reference


def test_shapes_inferred_without_large_weights_match_whole_model_inference():
    """Import infers shapes on a copy whose large weights are typed inputs, and writes what it
    found back: the result is the model onnx's inference of the whole file gives, byte for byte,
    here with a large MatMul weight, a shape built from Shape/Gather/Concat for a Reshape, a
    declared output type inference refines, and an If whose branches inference annotates."""
    import onnx
    from onnx import shape_inference

    from rkcompile.passes.import_model import (_infer_shapes, _scan_tensors, _with_inferred_shapes,
        _without_large_weights)

    then_branch = helper.make_graph([helper.make_node("Relu", ["m"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Neg", ["m"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Shape", ["m"], ["s"]),
        helper.make_node("Gather", ["s", "last"], ["n"], axis=0),
        helper.make_node("Concat", ["minus_one", "n"], ["target"], axis=0),
        helper.make_node("Reshape", ["m", "target"], ["r"]),
        helper.make_node("If", ["flag"], ["branch"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["r", "branch"], ["y"]),
    ]
    model = make_model(nodes, [value_info("x", [4, 64]), value_info("flag", [], TensorProto.BOOL)],
                       [value_info("y", None)],
                       [weight("w", np.ones((64, 96), np.float32)), weight("last", np.array([1], np.int64)),
                        weight("minus_one", np.array([-1], np.int64))])
    serialized = model.SerializeToString()
    light = _without_large_weights(model)
    assert light is not None  # the weightless path is the one taken
    whole = shape_inference.infer_shapes(serialized, check_type=True, strict_mode=True, data_prop=True)
    loaded = onnx.load_model_from_string(serialized)
    _, carriers = _scan_tensors(loaded)
    assert carriers == [5]  # the If, whose annotated branches are copied back
    inferred = _infer_shapes(light.SerializeToString(), 17)
    found = _with_inferred_shapes(loaded, inferred, carriers)
    assert found.SerializeToString(deterministic=True) == whole.SerializeToString(deterministic=True)
    unknown = _with_inferred_shapes(onnx.load_model_from_string(serialized), inferred, None)  # after a sort
    assert unknown.SerializeToString(deterministic=True) == whole.SerializeToString(deterministic=True)
    assert [d.dim_value for d in found.graph.output[0].type.tensor_type.shape.dim] == [4, 96]


def test_the_plan_names_the_model_files_sha256(save):
    """Worked out on a thread beside parsing and checking (passes/import_model._Digest): the
    digest of the file's own bytes, external data or not."""
    import hashlib

    path = save(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [value_info("x", [1, 4, 8, 8])],
                           [value_info("y", [1, 4, 8, 8])]))
    plan, _ = compile_model(path, "rk3588")
    assert plan.model.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_checker_still_judges_every_large_weight_it_is_not_given(save, capsys):
    """The checker reads the model without its large weights, each checked as the checker would
    (numeric, in raw_data alone, exactly its dims' bytes); a large weight stored otherwise, or
    an IR 3 model's initializer that is not a graph input, still reaches the checker and is
    refused with its one error line."""
    from onnx import numpy_helper

    from rkcompile.cli import main
    from rkcompile.passes.import_model import _plainly_stored

    def conv_model(w: onnx.TensorProto, ir_version: int = 8) -> onnx.ModelProto:
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [value_info("x", [1, 8, 16, 16])],
                           [value_info("y", [1, 8, 14, 14])], [w])
        model.ir_version = ir_version
        return model

    plain = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    assert _plainly_stored(plain)
    short = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    short.raw_data = short.raw_data[:-4]
    as_floats = helper.make_tensor("w", TensorProto.FLOAT, [8, 8, 3, 3], np.ones(576).tolist())
    assert not _plainly_stored(short) and not _plainly_stored(as_floats)
    assert main(["plan", str(save(conv_model(plain))), "--target", "rk3588", "--quiet"]) == 0
    assert main(["plan", str(save(conv_model(as_floats))), "--target", "rk3588", "--quiet"]) == 0
    for model in (conv_model(short), conv_model(plain, ir_version=3)):
        capsys.readouterr()
        assert main(["plan", str(save(model)), "--target", "rk3588", "--quiet"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: invalid ONNX model: ") and len(err.strip().splitlines()) == 1


def _folded_with_shapes_erased(path, monkeypatch, evaluate_first: bool):
    """fold-constants on the imported graph of `path` with every node output's shape forgotten
    (as a node whose inputs fold in the same sweep has them), evaluating small nodes before
    inferring their shapes or, as before, inferring first; the graph and how often a node's
    shapes were inferred."""
    import onnx_graphsurgeon as gs

    from rkcompile.compiler.context import CompileContext
    from rkcompile.passes import fold_constants, import_model
    from rkcompile.targets import get_target

    inferred = []
    infer = fold_constants._infer_node_shapes
    monkeypatch.setattr(fold_constants, "_infer_node_shapes",
                        lambda graph, node, *rest: inferred.append(node.name) or infer(graph, node, *rest))
    if not evaluate_first:
        monkeypatch.setattr(fold_constants, "_evaluates_small", lambda node: False)
    ctx = CompileContext(model_path=path, target=get_target("rk3588"))
    import_model.run(ctx)
    for node in ctx.graph.nodes:
        for tensor in node.outputs:
            if isinstance(tensor, gs.Variable) and tensor.name != "x":
                tensor.shape = None
    fold_constants.run(ctx)
    monkeypatch.undo()
    graph = [(n.op, n.name, [(t.name, t.shape, str(t.dtype)) for t in n.inputs + n.outputs]) for n in ctx.graph.nodes]
    constants = {name: np.asarray(t.values).tolist() for name, t in ctx.graph.tensors().items() if isinstance(t, gs.Constant)}
    return graph, constants, inferred


def test_small_constant_nodes_fold_from_their_values_as_from_inferred_shapes(save, monkeypatch):
    """A node of small constant inputs folds from its values without its shapes inferred first,
    to the graph inference-first folding gave: a shape chain, broadcasting and a Gather that
    folds, a Concat just over the folding bound (stays a node, shapes inferred), a Gather whose
    index is out of range (stays, shapes inferred), a ConstantOfShape (folds to a view)."""
    import rkcompile.passes.fold_constants as fold_constants

    monkeypatch.setattr(fold_constants, "MAX_FOLDED_ELEMENTS", 256)
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "zeros"], ["n1"], name="unsqueeze"),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Add", ["column", "row"], ["grid"], name="broadcast"),  # [5, 1] + [1, 6]
             helper.make_node("Gather", ["grid", "picks"], ["picked"], name="pick", axis=1),
             helper.make_node("Concat", ["wide", "wide"], ["too_wide"], name="too_wide", axis=0),  # 2 x 200 > 256
             helper.make_node("Gather", ["column", "outside"], ["nowhere"], name="out_of_range", axis=0),
             helper.make_node("ConstantOfShape", ["dims"], ["fill"], name="fill",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]))]
    model = make_model(nodes, [value_info("x", [2, 3, 4])],
                       [value_info(name, shape) for name, shape in (("r", [2, 12]), ("picked", [5, 2, 2]),
                        ("too_wide", [400]), ("nowhere", [1, 1]), ("fill", [4, 100]))],
                       [weight("zero", np.array(0, np.int64)), weight("zeros", np.array([0], np.int64)),
                        weight("minus_one", np.array([-1], np.int64)),
                        weight("column", np.arange(5, dtype=np.float32).reshape(5, 1)),
                        weight("row", np.arange(6, dtype=np.float32).reshape(1, 6)),
                        weight("picks", np.array([[5, 0], [1, 1]], np.int64)),
                        weight("wide", np.ones(200, np.float32)), weight("outside", np.array([7], np.int64)),
                        weight("dims", np.array([4, 100], np.int64))])
    path = save(model)
    graph, constants, inferred = _folded_with_shapes_erased(path, monkeypatch, evaluate_first=True)
    monkeypatch.setattr(fold_constants, "MAX_FOLDED_ELEMENTS", 256)
    before = _folded_with_shapes_erased(path, monkeypatch, evaluate_first=False)
    assert (graph, constants) == before[:2]
    assert [op for op, _, _ in graph] == ["Reshape", "Concat", "Gather"]  # too_wide, out_of_range stay
    assert sorted(inferred) == ["out_of_range", "reshape", "too_wide"]
    assert len(before[2]) > len(inferred)
    assert constants["picked"] == np.take(np.arange(5.0)[:, None] + np.arange(6.0), [[5, 0], [1, 1]], axis=1).tolist()


def _alike_nodes(op: str, declared: list, attrs=None) -> list:
    """gs nodes `op` alike but for their names, each reading a static [2, 3] float input and a
    small constant, each output declared with `declared` dims, its symbolic ones suffixed per
    node ("n" -> "n_0", "n_1")."""
    import onnx_graphsurgeon as gs

    nodes = []
    for index in range(2):
        dims = None if declared is None else [f"{d}_{index}" if isinstance(d, str) else d for d in declared]
        x = gs.Variable(f"x{index}", np.float32, [2, 3])
        k = gs.Constant(f"k{index}", np.array([2], np.int64))
        outputs = [gs.Variable(f"{name}{index}", dtype, dims) for name, dtype in (("values", np.float32),
                                                                                  ("indices", np.int64))]
        inputs = [x, k] if op == "TopK" else [x]
        nodes.append(gs.Node(op, f"{op}{index}", attrs=dict(attrs or {}), inputs=inputs,
                             outputs=outputs if op == "TopK" else outputs[1:]))
    return nodes


def test_per_node_inference_answers_nodes_alike_but_for_names_as_inferring_each(monkeypatch):
    """fold-constants infers one node of each kind and writes its answer onto the others in
    their own symbolic dims, each node getting what inferring it alone gives: a declared
    symbolic dim kept (NonZero's count) next to an inferred one (its rank), a dim refined from
    symbolic to a value (TopK's k), a declaration inference contradicts (nothing written). A
    dim inference names itself (no shape declared) is not shared: each node is inferred."""
    import onnx_graphsurgeon as gs
    from onnx import shape_inference

    from rkcompile.passes import fold_constants

    graph = gs.Graph(opset=17)
    cases = [("NonZero", ["rank", "count"], None, 1), ("TopK", [2, "k"], {"axis": 1}, 1),
             ("NonZero", [5, "count"], None, 1), ("NonZero", None, None, 2)]
    calls = []
    infer = shape_inference.infer_shapes
    monkeypatch.setattr(shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or infer(*a, **k))
    second = []
    for op, declared, attrs, inferences in cases:
        alone = _alike_nodes(op, declared, attrs)
        for node in alone:
            fold_constants._infer_node_shapes(graph, node, 17, {})
        calls.clear()
        shared, answers = _alike_nodes(op, declared, attrs), {}
        for node in shared:
            fold_constants._infer_node_shapes(graph, node, 17, answers)
        assert len(calls) == inferences, op
        for one, other in zip(alone, shared):
            assert [(t.shape, t.dtype) for t in one.outputs] == [(t.shape, t.dtype) for t in other.outputs], op
        second.append([t.shape for t in shared[1].outputs])
    assert second[:3] == [[[2, "count_1"]], [[2, 2], [2, 2]], [[5, "count_1"]]]
    assert second[3][0][0] == 2 and isinstance(second[3][0][1], str)  # inference's own name


def test_tensor_scan_finds_external_data_where_onnxs_loader_reads_it():
    """`_scan_tensors` says a model uses external data exactly when one of the tensors onnx's
    loader reads (external_data_helper._get_all_tensors) does: main-graph and If-branch
    initializers, Constant values and `tensors` attributes at any depth, function nodes'
    attributes; not an initializer of a graph inside a function, which the loader skips. It
    also lists the main-graph nodes that carry a graph."""
    import onnx
    from onnx import external_data_helper

    from rkcompile.passes.import_model import _scan_tensors

    def model_with_places() -> onnx.ModelProto:
        constant = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", TensorProto.FLOAT, [1], [1.0]))
        inner_if = helper.make_node(
            "If", ["flag"], ["deep"], name="inner_if",
            then_branch=helper.make_graph([helper.make_node("Constant", [], ["d"], value=helper.make_tensor(
                "dv", TensorProto.FLOAT, [1], [2.0]))], "deep_then", [], [value_info("d", [1])]),
            else_branch=helper.make_graph([helper.make_node("Identity", ["b"], ["e"])], "deep_else", [],
                                          [value_info("e", [1])], [weight("b", np.ones(1, np.float32))]))
        then_branch = helper.make_graph([constant, inner_if, helper.make_node("Add", ["c", "deep"], ["t"])], "then", [],
                                        [value_info("t", [1])])
        else_branch = helper.make_graph([helper.make_node("Identity", ["a"], ["f"])], "else", [], [value_info("f", [1])],
                                        [weight("a", np.ones(1, np.float32))])
        listed = helper.make_attribute("values", [helper.make_tensor("lv", TensorProto.FLOAT, [1], [3.0])])
        custom = helper.make_node("Custom", ["x"], ["z"], domain="local")
        custom.attribute.append(listed)
        nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch), custom]
        model = make_model(nodes, [value_info("flag", [], TensorProto.BOOL), value_info("x", [1])],
                           [value_info("y", [1]), value_info("z", [1])], [weight("w", np.ones(1, np.float32))])
        function_if = helper.make_node(
            "If", ["cond"], ["out"],
            then_branch=helper.make_graph([helper.make_node("Identity", ["g"], ["o1"])], "fthen", [], [value_info("o1", [1])],
                                          [weight("g", np.ones(1, np.float32))]),
            else_branch=helper.make_graph([helper.make_node("Constant", [], ["o2"], value=helper.make_tensor(
                "fv", TensorProto.FLOAT, [1], [4.0]))], "felse", [], [value_info("o2", [1])]))
        model.functions.append(helper.make_function("local", "Fn", ["cond"], ["out"], [function_if],
                                                    [helper.make_opsetid("", 17)]))
        return model

    def loader_reads_external(model) -> bool:
        return any(external_data_helper.uses_external_data(t) for t in external_data_helper._get_all_tensors(model))

    plain = model_with_places()
    assert _scan_tensors(plain) == (False, [0])
    names = [t.name for t in external_data_helper._get_all_tensors(plain)]
    assert {"w", "a", "b", "cv", "dv", "lv", "fv"} <= set(names) and "g" not in names
    for name in ("w", "a", "b", "cv", "dv", "lv", "fv", "g"):
        model = model_with_places()
        tensors = [t for t in _every_tensor(model) if t.name == name]
        assert len(tensors) == 1, name
        tensors[0].data_location = TensorProto.EXTERNAL
        assert _scan_tensors(model)[0] == loader_reads_external(model) == (name != "g"), name

    flat = make_model([helper.make_node("Relu", ["x"], ["y"])], [value_info("x", [1])], [value_info("y", [1])])
    flat.functions.extend(model_with_places().functions)  # a graph inside a function is not the main graph's
    assert _scan_tensors(flat) == (False, [])


def _every_tensor(model):
    """Every TensorProto in `model`: initializers and tensor attributes of every graph and function."""
    def in_graph(graph):
        yield from graph.initializer
        yield from in_nodes(graph.node)

    def in_nodes(nodes):
        for node in nodes:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from in_graph(graph)

    yield from in_graph(model.graph)
    for function in model.functions:
        yield from in_nodes(function.node)


def _node_list_cases():
    """Graphs (nodes, inputs, outputs) for the in-order check: valid ones listed in order, and
    every kind of graph the full search reports or sorts."""
    def relu(src, dst, name):
        return helper.make_node("Relu", [src], [dst], name=name)

    drop = helper.make_node("Dropout", ["x", "", ""], ["d", ""], name="drop")  # omitted input and output
    drop_again = helper.make_node("Dropout", ["d"], ["e", ""], name="drop_again")
    return {
        "in order": ([relu("x", "a", "r0"), relu("a", "y", "r1")], ["x"], ["y"], True),
        "omitted optionals": ([drop, relu("d", "y", "r1")], ["x"], ["y"], True),
        "two omitted outputs": ([drop, drop_again], ["x"], ["e"], None),
        "omitted output as a graph output": ([drop], ["x"], [""], False),
        "out of order": ([relu("a", "y", "r1"), relu("x", "a", "r0")], ["x"], ["y"], False),
        "undefined": ([relu("nope", "y", "r0")], ["x"], ["y"], False),
        "produced twice": ([relu("x", "y", "r0"), relu("x", "y", "r1")], ["x"], ["y"], False),
        "twice by one node": ([helper.make_node("Split", ["x"], ["y", "y"], name="s", axis=0)], ["x"], ["y"], False),
        "overwrites an input": ([relu("x", "x", "r0")], ["x"], ["x"], False),
        "output never produced": ([relu("x", "a", "r0")], ["x"], ["y"], False),
        "cycle": ([relu("b", "a", "r0"), relu("a", "b", "r1"), relu("b", "y", "r2")], ["x"], ["y"], False),
    }


@pytest.mark.parametrize("case", sorted(_node_list_cases()))
def test_in_order_check_passes_only_what_the_full_search_passes_unsorted(case, monkeypatch):
    """`_valid_and_in_order` lets a graph skip the search for undefined tensors, cycles and a
    topological order: only a graph the search leaves as it is without an error may skip it,
    and a valid graph listed in order (omitted optional inputs and outputs too) does."""
    import onnx

    from rkcompile.errors import CompileError
    from rkcompile.passes import import_model

    nodes, inputs, outputs, expected = _node_list_cases()[case]
    graph = helper.make_graph(nodes, "g", [value_info(n, [1]) for n in inputs], [value_info(n, [1]) for n in outputs])
    skips = import_model._valid_and_in_order(graph)
    if expected is not None:
        assert skips == expected
    monkeypatch.setattr(import_model, "_valid_and_in_order", lambda graph: False)
    searched = onnx.GraphProto()
    searched.CopyFrom(graph)
    try:
        reordered = import_model._check_tensors_defined_and_acyclic(searched)
    except CompileError:
        reordered = None
    assert not skips or reordered is False


def test_a_sorted_file_keeps_each_node_and_its_annotated_branches(save):
    """A file listed out of order with an If and a large weight: the If moves when the graph is
    sorted, and what inference of the weightless copy annotated is copied back onto the If at
    its new place, every other node as it was."""
    from rkcompile.compiler.context import CompileContext
    from rkcompile.passes import import_model
    from rkcompile.targets import get_target

    then_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Not", ["flag"], ["c"], name="not"),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul")]
    model = make_model(nodes, [value_info("x", [4, 64]), value_info("flag", [], TensorProto.BOOL)],
                       [value_info("y", [4, 64]), value_info("m", [4, 96])], [weight("w", np.ones((64, 96), np.float32))])
    ctx = CompileContext(model_path=save(model), target=get_target("rk3588"))
    import_model.run(ctx)
    assert ctx.original_nodes == [("not", "Not"), ("branch", "If"), ("matmul", "MatMul")]
    assert [node.outputs[0].name for node in ctx.graph.nodes] == ["c", "y", "m"]
    branch = ctx.graph.nodes[1]
    assert [graph.outputs[0].shape for graph in (branch.attrs["then_branch"], branch.attrs["else_branch"])] == [[4, 64]] * 2


def _counted_sweeps(monkeypatch) -> list:
    """The nodes each constant-folding sweep of the next plans folds, sweep by sweep."""
    from rkcompile.passes import fold_constants

    sweeps = []
    sweep = fold_constants._fold_sweep
    monkeypatch.setattr(fold_constants, "_fold_sweep", lambda *args: sweeps.append(sweep(*args)) or sweeps[-1])
    return sweeps


def test_one_sweep_folds_everything_when_no_shape_is_left_unknown(save, monkeypatch):
    """A sweep visits nodes in topological order, so each sees its inputs as folded as they get:
    with every shape known after it, a second could fold nothing, and none runs."""
    sweeps = _counted_sweeps(monkeypatch)
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["sf"], ["si"], name="to_int", to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "si"], ["y"], name="reshape")]
    plan, _ = compile_model(save(make_model(nodes, [value_info("x", [1, 4])], [value_info("y", [1, 4])])), "rk3588")
    assert [_devices(plan)[name] for name in ("shape", "to_float", "to_int")] == ["folded"] * 3
    assert [len(folded) for folded in sweeps] == [3]


def test_a_shape_only_whole_graph_inference_finds_folds_in_a_second_sweep(save, monkeypatch):
    """An If's result has no shape until its branches' outer read (a Reshape's result, whose
    target shape the first sweep folds) has one: per-node inference leaves nodes carrying
    graphs alone, whole-graph inference after the sweep finds it, and the Shape of it folds in
    a second sweep; a third, which could fold nothing, does not run."""
    sweeps = _counted_sweeps(monkeypatch)
    then_branch = helper.make_graph([helper.make_node("Identity", ["r"], ["t"], name="then_id")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Neg", ["r"], ["e"], name="else_neg")], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["sf", "one"], ["sf1"], name="times_one"),  # past import's data propagation
             helper.make_node("Cast", ["sf1"], ["si"], name="to_int", to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "si"], ["r"], name="reshape"),
             helper.make_node("If", ["flag"], ["b"], name="branch", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Shape", ["b"], ["bs"], name="measure"),
             helper.make_node("Cast", ["bs"], ["bsf"], name="measure_float", to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "bsf"], ["y"], name="add")]
    model = make_model(nodes, [value_info("x", [1, 2]), value_info("flag", [], TensorProto.BOOL)],
                       [value_info("y", [1, 2])], [weight("one", np.ones(1, np.float32))])
    plan, _ = compile_model(save(model), "rk3588")
    devices = _devices(plan)
    assert [devices[name] for name in ("times_one", "measure", "measure_float")] == ["folded"] * 3
    assert [len(folded) for folded in sweeps] == [4, 2]
    assert contract_violations(plan) == []


def test_folding_stops_when_reinference_makes_no_shape_static(save, monkeypatch):
    """After a sweep that folds, whole-graph inference runs for the tensors still unknown; when
    it makes none of them static (a NonZero's count is data), no second sweep runs: every node
    of constant inputs folded in the first, and nothing else changed."""
    from rkcompile.passes import fold_constants

    sweeps = []
    sweep = fold_constants._fold_sweep
    monkeypatch.setattr(fold_constants, "_fold_sweep", lambda *args: sweeps.append(sweep(*args)) or sweeps[-1])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Reshape", ["x", "shape"], ["same"], name="reshape"),
             helper.make_node("NonZero", ["same"], ["where"], name="nonzero"),
             helper.make_node("Cast", ["where"], ["y"], name="cast", to=TensorProto.FLOAT)]
    plan, _ = compile_model(save(make_model(nodes, [value_info("x", [1, 4])], [value_info("y", [2, "count"])])), "rk3588")
    assert _devices(plan)["shape"] == "folded"
    assert [len(folded) for folded in sweeps] == [1]
    assert contract_violations(plan) == []
