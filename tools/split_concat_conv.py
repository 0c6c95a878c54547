"""Rewrite an ONNX model so that a Conv reading a channel Concat computes one Conv per operand
and adds them (rknn-toolkit2 2.5.0's form for yolov8n's upsampling Concats, seen in its
accuracy analysis: `[Conv] /model.10/Resize_output_0_conv`, `[Add] /model.12/cv1/conv/...`),
to measure what that form does to an int8 plan (docs/quantization.md, yolov8n's last
0.0000156). The float outputs do not change beyond float32 rounding: conv(concat(a, b), W) =
conv(a, W_a) + conv(b, W_b), the bias added once.

    python tools/split_concat_conv.py MODEL.onnx OUT.onnx [--all]

By default only Concats with a Resize operand (the toolkit's case); --all takes every Concat on
axis 1 whose only reader is an ungrouped Conv. Copy the model's NAME.npz beside OUT.onnx to
measure it with tools/int8_table.py --zoo.
"""
from __future__ import annotations

import argparse
import sys

import onnx
from onnx import helper, numpy_helper


def split_concat_convs(model: onnx.ModelProto, every: bool) -> list[str]:
    """Rewrite `model` in place; the names of the Convs rewritten."""
    graph = model.graph
    weights = {i.name: i for i in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    channels = {v.name: v.type.tensor_type.shape.dim[1].dim_value
                for v in onnx.shape_inference.infer_shapes(model).graph.value_info
                if len(v.type.tensor_type.shape.dim) > 1}
    outputs = {v.name for v in graph.output}
    replaced: dict[str, list[onnx.NodeProto]] = {}  # by the node's first output
    rewritten: list[str] = []
    for concat in graph.node:
        axis = {a.name: helper.get_attribute_value(a) for a in concat.attribute}.get("axis")
        if concat.op_type != "Concat" or axis not in (1, -3) or concat.output[0] in outputs:
            continue
        if not every and not any(getattr(producers.get(name), "op_type", "") == "Resize" for name in concat.input):
            continue
        (conv, *others) = readers.get(concat.output[0], [None])
        attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute} if conv is not None else {}
        if (others or conv is None or conv.op_type != "Conv" or attributes.get("group", 1) != 1
                or conv.input[1] not in weights or any(name not in channels for name in concat.input)):
            continue
        weight = numpy_helper.to_array(weights[conv.input[1]])
        parts, start = [], 0
        for k, operand in enumerate(concat.input):
            part = numpy_helper.from_array(weight[:, start:start + channels[operand]], f"{conv.name}/weight_{k}")
            graph.initializer.append(part)
            start += channels[operand]
            bias = list(conv.input[2:3]) if k == 0 else []
            parts.append(helper.make_node("Conv", [operand, part.name, *bias], [f"{conv.output[0]}/part_{k}"],
                                          name=f"{conv.name}/part_{k}", **attributes))
        sums, total = [], parts[0].output[0]
        for k, part in enumerate(parts[1:], 1):
            last = k == len(parts) - 1
            sums.append(helper.make_node("Add", [total, part.output[0]],
                                         [conv.output[0] if last else f"{conv.output[0]}/sum_{k}"],
                                         name=f"{conv.name}/sum_{k}"))
            total = sums[-1].output[0]
        replaced[conv.output[0]] = [*parts, *sums]
        replaced[concat.output[0]] = []
        rewritten.append(conv.name)
    nodes = [new for node in graph.node for new in replaced.get(node.output[0] if node.output else "", [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--all", action="store_true", help="every Concat read by one Conv, not only upsampling ones")
    args = parser.parse_args()
    try:
        model = onnx.load(args.model)
    except Exception as exc:  # noqa: BLE001  (a missing file or not an ONNX protobuf)
        print(f"error: cannot read {args.model}: {exc}", file=sys.stderr)
        return 1
    rewritten = split_concat_convs(model, args.all)
    onnx.checker.check_model(model)
    onnx.save(model, args.out)
    print(f"{len(rewritten)} Conv(s) split: {', '.join(rewritten) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
