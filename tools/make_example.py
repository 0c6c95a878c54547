"""Build examples/tiny_cnn.onnx, the small model the README plans.

A deterministic conv net with the shapes of a real one: a stem, a residual block, a
depthwise conv with ReLU6, a decomposed SiLU, an exporter-style Shape/Gather/Concat/Reshape
chain that constant folding removes, and one op the NPU lacks (Erf), so the summary shows every
section. Run: python tools/make_example.py [OUT]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    initializers = [
        weight("stem.w", 16, 3, 3, 3), weight("stem.b", 16),
        weight("block.w1", 16, 16, 3, 3), weight("block.w2", 16, 16, 3, 3),
        weight("dw.w", 16, 1, 3, 3), weight("pw.w", 32, 16, 1, 1),
        weight("fc.w", 10, 32), weight("fc.b", 10),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "stem.w", "stem.b"], ["stem"], name="stem_conv", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["stem"], ["stem_relu"], name="stem_relu"),
        helper.make_node("Conv", ["stem_relu", "block.w1"], ["b1"], name="block_conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b1"], ["b1_relu"], name="block_relu1"),
        helper.make_node("Conv", ["b1_relu", "block.w2"], ["b2"], name="block_conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["b2", "stem_relu"], ["res"], name="block_add"),
        helper.make_node("Relu", ["res"], ["res_relu"], name="block_relu2"),
        helper.make_node("Conv", ["res_relu", "dw.w"], ["dw"], name="dw_conv", pads=[1, 1, 1, 1], group=16),
        helper.make_node("Clip", ["dw", "zero", "six"], ["dw_relu6"], name="dw_relu6"),
        helper.make_node("Conv", ["dw_relu6", "pw.w"], ["pw"], name="pw_conv"),
        helper.make_node("Sigmoid", ["pw"], ["pw_sig"], name="silu_sigmoid"),
        helper.make_node("Mul", ["pw", "pw_sig"], ["silu"], name="silu_mul"),
        helper.make_node("GlobalAveragePool", ["silu"], ["pooled"], name="pool"),
        helper.make_node("Shape", ["pooled"], ["pooled_shape"], name="shape"),
        helper.make_node("Gather", ["pooled_shape", "axis0"], ["batch"], name="gather_batch", axis=0),
        helper.make_node("Concat", ["batch", "minus_one"], ["flat_shape"], name="concat_shape", axis=0),
        helper.make_node("Reshape", ["pooled", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits_raw"], name="fc", transB=1),
        helper.make_node("Erf", ["logits_raw"], ["logits"], name="erf"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="rkcompile-tools")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    onnx.save(build(), str(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
