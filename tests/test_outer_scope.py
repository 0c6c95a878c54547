"""If/Loop/Scan subgraphs that read main-graph tensors without listing them (outer-scope reads):
every pass treats such a read as the node's input (ordering, partitions, conversions, lifetimes,
the plan's steps) and the emulator feeds it, at any nesting depth."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from conftest import PRIMARY_TARGETS, make_model, value_info, weight
from onnx import TensorProto, helper

from rkcompile.options import Options
from rkcompile.api import prepare
from rkcompile.emulator import emulate, make_inputs
from rkcompile.emulator.closeness import agreement, onnxruntime_outputs
from rkcompile.ir.graph import dataflow_graph, node_inputs, outer_scope_reads, readers, topological_nodes
from rkcompile.compiler.pipeline import fused_body_reads_outside, stray_links

SHAPE = [1, 8, 4, 4]


def _branch(name: str, nodes, output: str, shape=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [value_info(output, list(shape))])


def if_model() -> onnx.ModelProto:
    """s6's pattern: an NPU Relu writes r, and only the If's branches read it."""
    then = _branch("then", [helper.make_node("ReduceMax", ["r"], ["t_out"], keepdims=0, name="then_max")], "t_out")
    other = _branch("else", [helper.make_node("ReduceMin", ["r"], ["e_out"], keepdims=0, name="else_min")], "e_out")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_r"),
             helper.make_node("Relu", ["r"], ["y"], name="relu_y"),
             helper.make_node("If", ["cond"], ["z"], name="choose", then_branch=then, else_branch=other)]
    return make_model(nodes, [value_info("x", SHAPE), value_info("cond", [], TensorProto.BOOL)],
                      [value_info("y", SHAPE), value_info("z", [])])


def nested_if_model() -> onnx.ModelProto:
    """An If inside an If's branch: the inner one reads the main graph's r and inner_cond
    (two levels out) and the outer branch's own `local` (one level out, not a main-graph read)."""
    inner_then = _branch("inner_then", [helper.make_node("Add", ["r", "local"], ["it"], name="inner_add")], "it", SHAPE)
    inner_else = _branch("inner_else", [helper.make_node("Sub", ["r", "local"], ["ie"], name="inner_sub")], "ie", SHAPE)
    then = _branch("then", [helper.make_node("Neg", ["r"], ["local"], name="then_neg"),
                            helper.make_node("If", ["inner_cond"], ["t_out"], name="inner_if",
                                             then_branch=inner_then, else_branch=inner_else)], "t_out", SHAPE)
    other = _branch("else", [helper.make_node("Abs", ["r"], ["e_out"], name="else_abs")], "e_out", SHAPE)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_r"),
             helper.make_node("If", ["cond"], ["z"], name="outer_if", then_branch=then, else_branch=other)]
    return make_model(nodes, [value_info("x", SHAPE), value_info("cond", [], TensorProto.BOOL),
                              value_info("inner_cond", [], TensorProto.BOOL)], [value_info("z", SHAPE)])


def _adding_r_body() -> onnx.GraphProto:
    """A Loop body adding the main graph's r to the carried value, without listing r."""
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("Add", ["v_in", "r"], ["v_out"], name="body_add")], "body",
        [value_info("i", [], TensorProto.INT64), value_info("cond_in", [], TensorProto.BOOL), value_info("v_in", SHAPE)],
        [value_info("cond_out", [], TensorProto.BOOL), value_info("v_out", SHAPE)])


def loop_model() -> onnx.ModelProto:
    """Loop three times, adding the main graph's NPU-made r to the carried value each time.
    (Its condition is given: onnx.reference's Loop runs no iteration for an omitted one.)"""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_r"),
             helper.make_node("Sigmoid", ["x"], ["start"], name="sigmoid_start"),
             helper.make_node("Loop", ["trips", "keep", "start"], ["v"], name="loop", body=_adding_r_body())]
    return make_model(nodes, [value_info("x", SHAPE)], [value_info("v", SHAPE)],
                      [weight("trips", np.array(3, np.int64)), weight("keep", np.array(True))])


def scan_model() -> onnx.ModelProto:
    """A running sum over the rows of s, each row scaled by the main graph's NPU-made w."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["row", "w"], ["scaled"], name="body_mul"),
         helper.make_node("Add", ["h_in", "scaled"], ["h_out"], name="body_add"),
         helper.make_node("Identity", ["h_out"], ["seen"], name="body_seen")], "body",
        [value_info("h_in", [1, 16]), value_info("row", [1, 16])],
        [value_info("h_out", [1, 16]), value_info("seen", [1, 16])])
    nodes = [helper.make_node("Relu", ["p"], ["w"], name="relu_w"),
             helper.make_node("Scan", ["h0", "s"], ["h", "all"], name="scan", body=body, num_scan_inputs=1)]
    return make_model(nodes, [value_info("p", [1, 16]), value_info("h0", [1, 16]), value_info("s", [5, 1, 16])],
                      [value_info("h", [1, 16]), value_info("all", [5, 1, 16])], opset=17)


MODELS = {"if": (if_model, "choose", "r"), "nested_if": (nested_if_model, "outer_if", "r"),
          "loop": (loop_model, "loop", "r"), "scan": (scan_model, "scan", "w")}


def _graph(model: onnx.ModelProto) -> gs.Graph:
    return gs.import_onnx(model)


def _node(graph: gs.Graph, name: str) -> gs.Node:
    return next(node for node in graph.nodes if node.name == name)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_outer_scope_reads_are_the_nodes_inputs_in_dataflow(kind):
    build, node_name, outer = MODELS[kind]
    graph = _graph(build())
    node = _node(graph, node_name)
    assert outer in [t.name for t in outer_scope_reads(node)]
    assert outer in [t.name for t in node_inputs(node)]
    assert node_name in [reader.name for reader in readers(graph)[outer]]
    producer = next(n.name for n in graph.nodes if any(t.name == outer for t in n.outputs))
    assert dataflow_graph(graph).has_edge(producer, node_name)


def test_nested_reads_count_main_graph_tensors_at_any_depth_but_not_the_branchs_own():
    node = _node(_graph(nested_if_model()), "outer_if")
    assert sorted(t.name for t in outer_scope_reads(node)) == ["inner_cond", "r"]
    assert [t.name for t in node_inputs(node)] == ["cond", "r", "inner_cond"]


def test_topological_order_puts_an_if_after_what_its_branches_read():
    graph = _graph(if_model())
    graph.nodes = [_node(graph, "choose"), _node(graph, "relu_y"), _node(graph, "relu_r")]
    order = [node.name for node in topological_nodes(graph)]
    assert order.index("relu_r") < order.index("choose")


@pytest.mark.parametrize("target", PRIMARY_TARGETS)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_outer_scope_models_plan_and_match_onnxruntime(kind, target, save):
    build, node_name, outer = MODELS[kind]
    path = save(build(), f"{kind}.onnx")
    prepared = prepare(path, target, Options())  # checks the plan's contract and its arena
    plan = prepared.plan
    step = next(s for s in plan.steps if node_name in s.nodes)
    assert step.device == "cpu"
    producer = next(s for s in plan.steps if outer in s.outputs)
    assert producer.device == "npu", "the outer-scope tensor should come from the NPU, so it crosses devices"
    converted = f"{outer}@cpu"
    assert converted in step.inputs, "the step lists the converted outer-scope read as its input"
    assert any(s.device == "host" and s.inputs == (outer,) and s.outputs == (converted,) for s in plan.steps)
    for flags in ((True, False), (False, True), (True, True)):
        given = {"cond": np.array(flags[0]), "inner_cond": np.array(flags[1])}
        inputs = make_inputs(plan, given, seed=sum(flags))
        actual = emulate(prepared, inputs).outputs
        expected = onnxruntime_outputs(path, inputs)
        for name, value in expected.items():
            assert agreement(name, actual[name], value).passes(0.9999), f"{name} with {flags}"


def test_the_arena_keeps_an_outer_scope_read_alive_until_its_reader_runs(save):
    """A Loop reads r@cpu only from its body, after a CPU chain long enough that the arena
    would reuse r@cpu's bytes if its life ended at the conversion that wrote it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_r"),
             helper.make_node("Erf", ["x"], ["e1"], name="erf1"),
             helper.make_node("Erf", ["e1"], ["e2"], name="erf2"),
             helper.make_node("Erf", ["e2"], ["e3"], name="erf3"),
             helper.make_node("Loop", ["trips", "keep", "e3"], ["v"], name="loop", body=_adding_r_body())]
    path = save(make_model(nodes, [value_info("x", SHAPE)], [value_info("v", SHAPE)],
                           [weight("trips", np.array(2, np.int64)), weight("keep", np.array(True))]), "loop_late.onnx")
    prepared = prepare(path, "rk3588", Options())
    plan = prepared.plan
    loop = next(s for s in plan.steps if "loop" in s.nodes)
    assert "r@cpu" in loop.inputs
    inputs = make_inputs(plan, {})
    actual, expected = emulate(prepared, inputs).outputs["v"], onnxruntime_outputs(path, inputs)["v"]
    assert agreement("v", actual, expected).passes(0.9999)


def test_a_node_a_pass_abandoned_while_still_linked_is_reported():
    graph = _graph(if_model())
    r = next(t for t in graph.tensors().values() if t.name == "r")
    assert stray_links(graph) == [], "subgraph nodes linked to r are known nodes"
    gs.Node("Neg", "abandoned", inputs=[r], outputs=[gs.Variable("lost", np.float32, SHAPE)])
    assert stray_links(graph) == ["tensor r is read by abandoned, which is not in the graph"]


def _fused(name: str, members: list[gs.Node], inputs: list[gs.Tensor], outputs: list[gs.Tensor]) -> gs.Node:
    """A fused kernel of `members` as passes/fuse.py builds one: its body over copies of their tensors."""
    from passes.fuse import body_graph
    from rkcompile.ir.graph import FUSED_DOMAIN

    body = body_graph(name, members, inputs, outputs, 17)
    return gs.Node(op=name, name=name, domain=FUSED_DOMAIN, attrs={"members": [m.op for m in members], "body": body},
                   inputs=inputs, outputs=outputs)


def test_a_fused_kernel_reads_what_a_members_subgraph_reads_from_outside_at_any_depth():
    """A fused body's members read only its inputs, each other's results and constants, so
    only a member's own subgraph can read further out: the If's branch reads the main graph's r
    (outside the kernel) and `local`, another member's result (inside it)."""
    main = _graph(if_model())
    r = next(t for t in main.tensors().values() if t.name == "r")
    x = gs.Variable("x2", np.float32, SHAPE)
    local = gs.Variable("local", np.float32, SHAPE)
    b = gs.Variable("b", np.float32, SHAPE)
    branch = gs.Graph(nodes=[gs.Node("Add", "branch_add", inputs=[r, local], outputs=[b])], outputs=[b])
    cond, z = gs.Variable("cond2", np.bool_, []), gs.Variable("z2", np.float32, SHAPE)
    members = [gs.Node("Neg", "neg", inputs=[x], outputs=[local]),
               gs.Node("If", "choose2", attrs={"then_branch": branch, "else_branch": branch}, inputs=[cond], outputs=[z])]
    fused = _fused("NegIf", members, [x, cond], [z])
    assert [t.name for t in outer_scope_reads(fused)] == ["r"]
    assert [t.name for t in node_inputs(fused)] == ["x2", "cond2", "r"]
    outer = _fused("Outer", [fused], [x, cond], [z])  # a fusion taking a fused kernel as a member
    assert [t.name for t in outer_scope_reads(outer)] == ["r"]
    plain = _fused("NegRelu", [gs.Node("Neg", "n", inputs=[x], outputs=[local]),
                               gs.Node("Relu", "rl", inputs=[local], outputs=[z])], [x], [z])
    assert outer_scope_reads(plain) == [] and [t.name for t in node_inputs(plain)] == ["x2"]


def test_the_verifier_names_a_fused_member_reading_from_outside_its_body():
    """outer_scope_reads looks inside a fused body only for members carrying subgraphs, as
    fuse builds bodies whose members read nothing else; the verifier that runs after every pass
    in the tests names a body breaking that, nested or not."""
    x, y, local, z = (gs.Variable(name, np.float32, SHAPE) for name in ("x3", "y3", "local3", "z3"))
    closed = _fused("NegRelu", [gs.Node("Neg", "n3", inputs=[x], outputs=[local]),
                                gs.Node("Relu", "r3", inputs=[local], outputs=[z])], [x], [z])
    assert fused_body_reads_outside(closed) == []
    leaky = _fused("NegAdd", [gs.Node("Neg", "n4", inputs=[x], outputs=[local]),
                              gs.Node("Add", "a4", inputs=[local, y], outputs=[z])], [x, y], [z])
    body = leaky.attrs["body"]
    body.inputs = [t for t in body.inputs if t.name != "y3"]  # y3 read by a member, no longer the body's input
    assert fused_body_reads_outside(leaky) == ["fused node NegAdd: member a4 reads y3 from outside its body"]
    outer = _fused("Outer", [leaky], [x, y], [z])
    inner = outer.attrs["body"].nodes[0]
    inner.attrs["body"].inputs = [t for t in inner.attrs["body"].inputs if t.name != "y3"]
    assert fused_body_reads_outside(outer) == ["fused node NegAdd: member a4 reads y3 from outside its body"]


def test_graphs_in_a_list_attribute_are_subgraphs_and_their_outer_reads_count():
    """A GRAPHS attribute is a list of graphs (beside lists of ints on the same node): each is a
    subgraph, and what it reads from outside is the node's input."""
    from rkcompile.ir.graph import subgraphs

    r = gs.Variable("r", np.float32, SHAPE)
    branches = []
    for index in range(2):
        out = gs.Variable(f"b{index}", np.float32, SHAPE)
        branches.append(gs.Graph(nodes=[gs.Node("Neg", f"neg{index}", inputs=[r], outputs=[out])], outputs=[out]))
    node = gs.Node("Custom", "custom", attrs={"pads": [1, 1], "branches": branches, "axis": 0},
                   inputs=[gs.Variable("x", np.float32, SHAPE)], outputs=[gs.Variable("y", np.float32, SHAPE)])
    assert subgraphs(node) == branches
    assert [t.name for t in node_inputs(node)] == ["x", "r"]
