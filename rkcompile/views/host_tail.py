"""Where `rkcompile export --host-tail` cuts a graph whose post-processing has data-dependent
shapes: which steps go to the NPU part (for rknn-toolkit2) and which to the host part (for
onnxruntime on the board's CPU).

rknn-toolkit2 builds static shapes only. A detector's post-processing makes tensors whose size
the data decides (NonZero's indices, a TopK of a computed k, NMS's selection); everything
computed from one of those is data-dependent too, whatever its own shape. So a step goes to the
host part when it writes a tensor of data-dependent shape or reads one the host part computes;
the NPU part keeps the rest, every tensor static, as rknn_model_zoo's detectors run the network
on the NPU and the post-processing on the CPU. In a graph with such a tail, a step that picks
entries by comparing values (SELECTIONS: a TopK of a constant k, as a two-stage detector's
proposals are picked) goes to the host part too, with what reads it: on the NPU part's float16
values it picks other entries than the original does on float32 ones where scores nearly tie,
and each box it picks differently is wholly different (faster-rcnn's proposals: cosine 0.92
against onnxruntime with the TopK before the cut).

A static step whose results only the host part reads goes to the host part too, last step
first so that a chain of them goes, when the plan puts it on the CPU or it only moves values
(HOST_MOVES): in the NPU part the toolkit would run the first as a CPU layer, a round trip out
of the NPU for a step the host runs anyway; the second computes nothing there, and cut after
it the NPU part would write each piece it selects as an output of its own (a detector's score
per class: 90 Slices, which rknn-toolkit2 2.5.0 joins into one Split and then fails on, asking
for a 294294 x 294294 Conv in its rule `gather_to_conv`), or the toolkit runs it on its CPU
(the Reshapes and Concat that gather a detector's per-level box regressions, retinanet). Every
other step the plan puts on the NPU stays in the NPU part, so the NPU part holds no CPU layer the
plan does not have. One exception: element-wise arithmetic with constants on values that only
moves computed (ARITHMETIC_ON_MOVES: a detector's box codes scaled and shifted by the anchors'
sizes and centres, a clip) goes to the host part with those moves when only the host part reads
it: in the NPU part it would keep there the moves that bring each level's codes into rows, and
rknn-toolkit2 2.5.0 runs on its CPU the Reshape of the levels' joined rows (faster-rcnn's
proposals; ssdlite's box decoding); on the host it is a few operations per box.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import onnx

from rkcompile.plan.schema import PlanRecord, Step
from rkcompile.quantization.params import MOVEMENT_OPS
from rkcompile.views.proto_graph import nodes_within

#: ops that only move, select or join values, without computing (the movements of int8
#: quantization, less the max pools, which compute a maximum, and Expand and Tile, whose output
#: is larger than what they read; and Concat): a step of these ops feeding only the host part
#: goes there
HOST_MOVES = MOVEMENT_OPS - {"MaxPool", "GlobalMaxPool", "Expand", "Tile"} | {"Concat"}

#: cheap element-wise arithmetic that goes to the host part with the moves feeding it, when
#: only the host part reads it and what it reads is constant or computed by moves alone
ARITHMETIC_ON_MOVES = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Clip"})

#: ops whose results are entries picked by comparing values: in a graph with a host tail they
#: start it, as a tensor of data-dependent size does
SELECTIONS = frozenset({"TopK", "ArgMax", "ArgMin"})


@dataclasses.dataclass(frozen=True)
class HostTail:
    """The cut: the steps of the host part (`steps`, by id), the static steps moved there
    (`moved`: their nodes' names), the tensors of data-dependent shape made from static ones
    (`first_dynamic`: where the data starts deciding the sizes), and the nodes of SELECTIONS
    that start the host part as well (`selections`)."""

    steps: frozenset[int]
    moved: tuple[str, ...]
    first_dynamic: tuple[str, ...]
    selections: tuple[str, ...] = ()


def data_dependent(plan: PlanRecord, name: str) -> bool:
    """Whether the plan could not give `name` a static shape: every input is static when the
    plan is made, so its size depends on the data."""
    placement = plan.tensors.get(name)
    return placement is not None and (placement.shape is None or any(d < 0 for d in placement.shape))


def reads(protos: Sequence[onnx.NodeProto]) -> set[str]:
    """The tensors `protos` read, also from the scope around their subgraphs."""
    return {name for node in nodes_within(protos) for name in node.input if name}


def find_host_tail(plan: PlanRecord, members: Mapping[int, Sequence[onnx.NodeProto]]) -> HostTail:
    """The host part of the plan's steps as written (`members`: each step's nodes, by id, as
    `plain_steps` gives them); no step when every tensor is static."""
    steps = [step for step in plan.steps if step.id in members]
    tail = any(data_dependent(plan, name) for step in steps for proto in members[step.id] for name in proto.output)
    host: set[int] = set()
    host_written: set[str] = set()
    of_dynamic: set[str] = set()   # tensors of data-dependent shape and those computed from them
    first_dynamic, selections = [], []
    for step in steps:
        written = [name for proto in members[step.id] for name in proto.output if name]
        dynamic = [name for name in written if data_dependent(plan, name)]
        read = reads(members[step.id])
        selects = tail and any(proto.op_type in SELECTIONS for proto in members[step.id])
        if dynamic and not read & of_dynamic:
            first_dynamic.extend(dynamic)
        if dynamic or read & of_dynamic:
            of_dynamic.update(written)
        if selects and not read & host_written:
            selections.extend(step.nodes)
        if dynamic or selects or read & host_written:
            host.add(step.id)
            host_written.update(written)
    moved = []
    if host:
        readers: dict[str, set[int]] = {}
        for step in steps:
            for name in reads(members[step.id]):
                readers.setdefault(name, set()).add(step.id)
        on_moves = _computed_by_moves(plan, steps, members)
        for step in reversed(steps):
            written = [name for proto in members[step.id] for name in proto.output if name]
            if step.id in host or (step.device == "npu" and not set(written) <= on_moves
                                   and not all(proto.op_type in HOST_MOVES for proto in members[step.id])):
                continue
            # a tensor between a step's own nodes is read by that step
            if all(readers.get(name, set()) - {step.id} <= host for name in written):
                host.add(step.id)
                moved.extend(reversed(step.nodes))
    return HostTail(frozenset(host), tuple(reversed(moved)), tuple(first_dynamic), tuple(selections))


def _computed_by_moves(plan: PlanRecord, steps: Sequence[Step],
                       members: Mapping[int, Sequence[onnx.NodeProto]]) -> set[str]:
    """The tensors written by steps whose nodes (the model's, by op: the plan writes a strided
    Slice as a Conv that picks) only move values (HOST_MOVES), or also do ARITHMETIC_ON_MOVES,
    reading constants, model inputs and tensors of this set only."""
    ops = {node.name: node.op for node in plan.nodes}
    written = {name: step.id for step in steps for proto in members[step.id] for name in proto.output if name}
    on_moves: set[str] = set()
    for step in steps:
        kinds = {ops.get(name) for name in step.nodes}
        computed = [name for name in reads(members[step.id]) if name in written and written[name] != step.id]
        if kinds <= HOST_MOVES or (kinds <= HOST_MOVES | ARITHMETIC_ON_MOVES
                                   and all(name in on_moves for name in computed)):
            on_moves.update(name for proto in members[step.id] for name in proto.output if name)
    return on_moves
