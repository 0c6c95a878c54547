"""ResNet-50 and YOLOv5s as ONNX graphs with random weights, for calibrating the cost model
against the rknn_model_zoo RK3588 figures (docs/cost-model.md). Only shapes matter to the cost
model, so BatchNormalization is taken as already folded into each convolution's bias.

- resnet50: torchvision's ResNet-50 (v1.5: stride on the 3x3 of each bottleneck), 224x224.
- yolov5s: ultralytics YOLOv5s v6 (depth 0.33, width 0.5), 640x640, ending at the three Detect
  convolutions as rknn_model_zoo exports it, with ReLU activations as its yolov5s_relu model.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Appends nodes and random float32 weights; every tensor name is unique."""

    def __init__(self, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.random = np.random.default_rng(seed)
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def weight(self, shape: tuple[int, ...]) -> str:
        name = self.name("w")
        values = self.random.standard_normal(shape).astype(np.float32) * 0.05
        self.weights.append(numpy_helper.from_array(values, name))
        return name

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int = 1, pad: int | None = None,
             act: str | None = "Relu") -> str:
        pad = kernel // 2 if pad is None else pad
        y = self.node("Conv", [x, self.weight((cout, cin, kernel, kernel)), self.weight((cout,))],
                      kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)
        return self.node(act, [y]) if act else y

    def model(self, x: str, shape: list[int], outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "calibration", [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                                  self.weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 7
        return onnx.shape_inference.infer_shapes(model)


def resnet50() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.conv("input", 3, 64, 7, 2, 3)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            step = stride if index == 0 else 1
            y = b.conv(x, cin, width, 1)
            y = b.conv(y, width, width, 3, step)
            y = b.conv(y, width, width * 4, 1, act=None)
            shortcut = b.conv(x, cin, width * 4, 1, step, act=None) if index == 0 else x
            x = b.node("Relu", [b.node("Add", [y, shortcut])])
            cin = width * 4
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    logits = b.node("Gemm", [x, b.weight((1000, 2048)), b.weight((1000,))], transB=1)
    return b.model("input", [1, 3, 224, 224], [logits])


def yolov5s() -> onnx.ModelProto:
    b = GraphBuilder()

    def c3(x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
        hidden = cout // 2
        y = b.conv(x, cin, hidden, 1)
        for _ in range(n):
            inner = b.conv(b.conv(y, hidden, hidden, 1), hidden, hidden, 3)
            y = b.node("Add", [y, inner]) if shortcut else inner
        return b.conv(b.node("Concat", [y, b.conv(x, cin, hidden, 1)], axis=1), 2 * hidden, cout, 1)

    def sppf(x: str, channels: int) -> str:
        y = b.conv(x, channels, channels // 2, 1)
        pooled = [y]
        for _ in range(3):
            pooled.append(b.node("MaxPool", [pooled[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
        return b.conv(b.node("Concat", pooled, axis=1), channels * 2, channels, 1)

    def upsample(x: str) -> str:
        scales = b.name("scales")
        b.weights.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), scales))
        return b.node("Resize", [x, "", scales], mode="nearest")

    x = b.conv("images", 3, 32, 6, 2, 2)
    x = c3(b.conv(x, 32, 64, 3, 2), 64, 64, 1)
    p3 = c3(b.conv(x, 64, 128, 3, 2), 128, 128, 2)
    p4 = c3(b.conv(p3, 128, 256, 3, 2), 256, 256, 3)
    p5 = sppf(c3(b.conv(p4, 256, 512, 3, 2), 512, 512, 1), 512)
    h10 = b.conv(p5, 512, 256, 1)
    h13 = c3(b.node("Concat", [upsample(h10), p4], axis=1), 512, 256, 1, False)
    h14 = b.conv(h13, 256, 128, 1)
    out3 = c3(b.node("Concat", [upsample(h14), p3], axis=1), 256, 128, 1, False)
    out4 = c3(b.node("Concat", [b.conv(out3, 128, 128, 3, 2), h14], axis=1), 256, 256, 1, False)
    out5 = c3(b.node("Concat", [b.conv(out4, 256, 256, 3, 2), h10], axis=1), 512, 512, 1, False)
    heads = [b.conv(o, c, 255, 1, act=None) for o, c in ((out3, 128), (out4, 256), (out5, 512))]
    return b.model("images", [1, 3, 640, 640], heads)


MODELS = {"resnet50": resnet50, "yolov5s": yolov5s}
