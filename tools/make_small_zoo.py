"""Build the small zoo shipped in examples/zoo: four tiny models (a few KB each) with the shapes of
real ones, so `rkcompile zoo examples/zoo` covers what ../shared/zoo covers without it.

    python tools/make_small_zoo.py [--out examples/zoo]

  detection_head   SiLU conv backbone, two strided levels, per-level box/class heads, sigmoid,
                   reshape + transpose + concat into one [1, anchors, 4 + classes] output
  recurrent_state  GRU then LSTM taking their initial states as inputs and returning the last ones
  attention        one encoder layer: Q/K/V projections, heads split by Reshape + Transpose,
                   scaled QK^T, Softmax, residual + LayerNormalization
  shape_arithmetic Shape -> Gather -> arithmetic -> Concat -> Reshape, as exporters write for
                   flatten and head splits, around a conv

Each model gets NAME.npz beside it: seeded inputs and onnxruntime's outputs, as in ../shared/zoo.
Weights come from a fixed seed, so rerunning writes the same files.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "zoo"


class Model:
    """Nodes and seeded weights of one graph, named in order."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, array, prefix: str = "c") -> str:
        name = f"{prefix}{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weights(self, *shape: int) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 4
        return self.constant((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), "w")

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> list[str]:
        index = len(self.nodes)
        names = [f"{op_type.lower()}{index}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"{op_type}_{index}", **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], **attrs) -> str:
        return self.op(op_type, inputs, **attrs)[0]

    def conv(self, x: str, c_in: int, c_out: int, kernel: int = 3, stride: int = 1) -> str:
        y = self.one("Conv", [x, self.weights(c_out, c_in, kernel, kernel), self.weights(c_out)],
                     kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[kernel // 2] * 4)
        return self.one("Mul", [y, self.one("Sigmoid", [y])])  # SiLU, as ultralytics exports it

    def build(self, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="rkcompile tools/make_small_zoo.py")
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def value(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def detection_head() -> onnx.ModelProto:
    m, classes = Model("detection_head", 1), 3
    x = m.conv("images", 3, 6, stride=2)  # 8x8
    levels = []
    for _ in range(2):
        x = m.conv(x, 6, 6, stride=2)  # 4x4, then 2x2
        box = m.one("Conv", [m.conv(x, 6, 6), m.weights(4, 6, 1, 1), m.weights(4)], kernel_shape=[1, 1])
        cls = m.one("Sigmoid", [m.one("Conv", [m.conv(x, 6, 6), m.weights(classes, 6, 1, 1), m.weights(classes)],
                                      kernel_shape=[1, 1])])
        joined = m.one("Concat", [box, cls], axis=1)  # [1, 4 + classes, h, w]
        flat = m.one("Reshape", [joined, m.constant(np.array([1, 4 + classes, -1], np.int64))])
        levels.append(m.one("Transpose", [flat], perm=[0, 2, 1]))
    m.nodes.append(helper.make_node("Concat", levels, ["detections"], name="Concat_detections", axis=1))
    anchors = 4 * 4 + 2 * 2
    return m.build([value("images", [1, 3, 16, 16])], [value("detections", [1, anchors, 4 + classes])])


def recurrent_state() -> onnx.ModelProto:
    m, hidden, features, steps = Model("recurrent_state", 2), 8, 6, 5
    gru_w, gru_r, gru_b = m.weights(1, 3 * hidden, features), m.weights(1, 3 * hidden, hidden), m.weights(1, 6 * hidden)
    gru_y, gru_h = m.op("GRU", ["sequence", gru_w, gru_r, gru_b, "", "h0"], outputs=2, hidden_size=hidden,
                        linear_before_reset=1)
    y = m.one("Squeeze", [gru_y, m.constant(np.array([1], np.int64))])  # [steps, 1, hidden]
    lstm_w, lstm_r, lstm_b = m.weights(1, 4 * hidden, hidden), m.weights(1, 4 * hidden, hidden), m.weights(1, 8 * hidden)
    m.nodes.append(helper.make_node("LSTM", [y, lstm_w, lstm_r, lstm_b, "", "lstm_h0", "lstm_c0"],
                                    ["lstm_y", "lstm_h", "lstm_c"], name="LSTM_state", hidden_size=hidden))
    m.nodes.append(helper.make_node("Identity", [gru_h], ["gru_h"], name="Identity_gru_h"))
    state = [1, 1, hidden]
    return m.build(
        [value("sequence", [steps, 1, features]), value("h0", state), value("lstm_h0", state), value("lstm_c0", state)],
        [value("lstm_y", [steps, 1, 1, hidden]), value("gru_h", state), value("lstm_h", state), value("lstm_c", state)])


def attention() -> onnx.ModelProto:
    m, tokens, width, heads = Model("attention", 3), 6, 16, 2
    head = width // heads
    x = "tokens"

    def project(source: str) -> str:
        return m.one("Add", [m.one("MatMul", [source, m.weights(width, width)]), m.weights(width)])

    def split_heads(source: str, perm: list[int]) -> str:
        shaped = m.one("Reshape", [source, m.constant(np.array([1, tokens, heads, head], np.int64))])
        return m.one("Transpose", [shaped], perm=perm)

    q = split_heads(project(x), [0, 2, 1, 3])
    k = split_heads(project(x), [0, 2, 3, 1])
    v = split_heads(project(x), [0, 2, 1, 3])
    scores = m.one("Mul", [m.one("MatMul", [q, k]), m.constant(np.float32(1 / np.sqrt(head)))])
    context = m.one("MatMul", [m.one("Softmax", [scores], axis=-1), v])
    merged = m.one("Reshape", [m.one("Transpose", [context], perm=[0, 2, 1, 3]),
                               m.constant(np.array([1, tokens, width], np.int64))])
    residual = m.one("Add", [project(merged), x])
    m.nodes.append(helper.make_node("LayerNormalization", [residual, m.weights(width), m.weights(width)],
                                    ["encoded"], name="LayerNormalization_out", axis=-1))
    return m.build([value("tokens", [1, tokens, width])], [value("encoded", [1, tokens, width])])


def shape_arithmetic() -> onnx.ModelProto:
    m = Model("shape_arithmetic", 4)
    y = m.conv("pixels", 4, 8)
    dims = m.one("Shape", [y])
    dim = {}
    for axis in range(4):
        dim[axis] = m.one("Gather", [dims, m.constant(np.array(axis, np.int64))], axis=0)
    area = m.one("Mul", [dim[2], dim[3]])
    halves = m.one("Div", [dim[1], m.constant(np.array(2, np.int64))])
    unsqueezed = [m.one("Unsqueeze", [value_, m.constant(np.array([0], np.int64))])
                  for value_ in (dim[0], halves, area)]
    two = m.constant(np.array([2], np.int64))
    grouped = m.one("Reshape", [y, m.one("Concat", [unsqueezed[0], two, unsqueezed[1], unsqueezed[2]], axis=0)])
    swapped = m.one("Transpose", [grouped], perm=[0, 2, 1, 3])  # channel shuffle
    back = m.one("Reshape", [swapped, dims])
    pooled = m.one("GlobalAveragePool", [back])
    flat_width = m.one("Mul", [dim[1], m.one("Div", [area, area])])
    new_shape = m.one("Concat", [unsqueezed[0], m.one("Unsqueeze", [flat_width, m.constant(np.array([0], np.int64))])],
                      axis=0)
    m.nodes.append(helper.make_node("Reshape", [pooled, new_shape], ["features"], name="Reshape_features"))
    return m.build([value("pixels", [1, 4, 8, 8])], [value("features", [1, 8])])


MODELS = (detection_head, recurrent_state, attention, shape_arithmetic)


def reference_arrays(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs and onnxruntime's outputs for them."""
    import onnxruntime

    rng = np.random.default_rng(seed)
    feeds = {}
    for graph_input in model.graph.input:
        shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
        feeds[graph_input.name] = rng.standard_normal(shape).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {**feeds, **dict(zip(names, session.run(names, feeds)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed, build in enumerate(MODELS):
        model = build()
        path = args.out / f"{model.graph.name}.onnx"
        onnx.save(model, str(path))
        np.savez(path.with_suffix(".npz"), **reference_arrays(model, seed))
        print(f"{path}: {len(model.graph.node)} nodes, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
