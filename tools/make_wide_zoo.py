"""Build the wide zoo: real architectures exported with seeded random weights, the measure of how
rkcompile plans models it was never tuned on (issue 14, "Unseen models").

    python tools/make_wide_zoo.py OUT_DIR [--only NAME,NAME] [--force] [--timeout 900] [--list]

Each model becomes OUT_DIR/NAME.onnx and OUT_DIR/NAME.npz in the format of ../shared/zoo:
the npz holds the graph inputs (seeded random values) and the graph outputs as onnxruntime
computes them, keyed by the graph's names. OUT_DIR/manifest.json describes every model
(source, exporter and opset, inputs, outputs, node and op counts, sha256, checker results,
torch-vs-onnxruntime agreement) and lists the models that failed to export with their reason.
`rkcompile zoo OUT_DIR` then plans the whole folder.

The families: torchvision classification, detection and segmentation; timm; transformers
encoders and decoders built from tiny configs (random init, nothing fetched from a hub);
speech models; ultralytics YOLO models built from their yaml (random init, no weights fetched).
Both torch exporters are used (`torch.onnx.export(dynamo=False)`, the TorchScript exporter, and
the dynamo exporter), with opsets spread over 13..20; ultralytics models go through
`YOLO.export(format="onnx")` as a user would run it.

Every model is exported in its own child process (a crash or hang costs one model, not the
run); a model that fails is skipped with its reason printed and recorded. Models already in
OUT_DIR with a manifest entry are kept unless --force. Weights and inputs come from fixed seeds.

Needs the `wide-zoo` extra (torch, torchvision, timm, transformers, ultralytics, onnxscript,
onnxslim, onnxruntime); rkcompile itself never imports this file.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_export  # noqa: E402

SEED = 1234
TORCHSCRIPT = "torchscript"
DYNAMO = "dynamo"
ULTRALYTICS = "ultralytics"


@dataclass(frozen=True)
class Spec:
    """One wide-zoo model: how to build it and how to export it."""

    name: str
    family: str
    source: str
    exporter: str  # TORCHSCRIPT | DYNAMO | ULTRALYTICS
    opset: int
    build: Callable[[], tuple[Any, dict[str, Any], list[str]]] | None = None  # -> module, inputs, output names
    yolo_yaml: str | None = None
    imgsz: int = 320


# --------------------------------------------------------------------------- model builders
# Each builder runs in the child after torch.manual_seed(SEED); it returns the module in eval
# mode, its named example inputs (in forward's order) and the names of its outputs.

def _image(size: int, channels: int = 3):
    import torch
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(SEED))


def _tokens(vocab: int, length: int, masked_tail: int = 4) -> dict[str, Any]:
    """Token ids and an attention mask whose last `masked_tail` positions are padding, so the
    mask arithmetic an exporter writes is live, not folded away."""
    import torch
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(SEED))
    mask = torch.ones(1, length, dtype=torch.int64)
    mask[:, length - masked_tail:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _returning(module, pick: Callable[[Any], tuple]):
    """`module` wrapped so that it returns the tuple of tensors `pick` takes from its output
    (a dict, as torchvision's segmentation models return)."""
    import torch

    class Picked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *args):
            return pick(self.inner(*args))

    return Picked().eval()


def _classifier(factory: Callable[[], Any], size: int = 224):
    def build():
        return factory().eval(), {"input": _image(size)}, ["logits"]
    return build


def _tv(name: str, size: int = 224, **kwargs):
    def factory():
        import torchvision
        return torchvision.models.get_model(name, weights=None, **kwargs)
    return _classifier(factory, size)


def _timm(name: str, size: int = 224, **kwargs):
    def factory():
        import timm
        return timm.create_model(name, pretrained=False, **kwargs)
    return _classifier(factory, size)


def _tv_vit_tiny():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=112, patch_size=16, num_layers=4, num_heads=3, hidden_dim=192,
                             mlp_dim=768).eval(), {"input": _image(112)}, ["logits"]


def _tv_swin_nano():
    from torchvision.models.swin_transformer import SwinTransformer
    model = SwinTransformer(patch_size=[4, 4], embed_dim=48, depths=[2, 2, 2, 2], num_heads=[3, 3, 6, 12],
                            window_size=[7, 7], stochastic_depth_prob=0.0)
    return model.eval(), {"input": _image(224)}, ["logits"]


def _detection(factory: Callable[[], Any], size: int):
    def build():
        import torch
        model = factory().eval()

        class Batched(torch.nn.Module):  # torchvision detectors take a list of images, return dicts
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, images):
                det = self.model([images[0]])[0]
                return det["boxes"], det["scores"], det["labels"]

        return Batched().eval(), {"images": _image(size)}, ["boxes", "scores", "labels"]
    return build


def _ssdlite():
    import torchvision
    return torchvision.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)


def _fasterrcnn_mobilenet():
    import torchvision
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, min_size=320, max_size=320)


def _resnet18_fpn(extra_p6p7: bool):
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.models import resnet18
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7
    extra = LastLevelP6P7(256, 256) if extra_p6p7 else None
    return _resnet_fpn_extractor(resnet18(weights=None), 5, returned_layers=[2, 3, 4], extra_blocks=extra)


def _retinanet_resnet18():
    from torchvision.models.detection import RetinaNet
    return RetinaNet(_resnet18_fpn(True), num_classes=91, min_size=320, max_size=320)


def _fcos_resnet18():
    from torchvision.models.detection import FCOS
    return FCOS(_resnet18_fpn(True), num_classes=91, min_size=320, max_size=320)


def _segmentation(factory: Callable[[], Any], size: int):
    def build():
        model = factory().eval()
        return _returning(model, lambda out: (out["out"],)), {"input": _image(size)}, ["out"]
    return build


def _deeplabv3_mobilenet():
    import torchvision
    return torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=False)


def _fcn_resnet18():
    from torchvision.models import resnet18
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.segmentation.fcn import FCN, FCNHead
    backbone = IntermediateLayerGetter(resnet18(weights=None), return_layers={"layer4": "out"})
    return FCN(backbone, FCNHead(512, 21))


# ---- transformers: tiny configs, random init, no hub
def _hf_text(model_cls: str, config_cls: str, config: dict, length: int = 32, outputs: tuple = ("last_hidden_state",),
             extra_inputs: Callable[[dict], dict] | None = None):
    def build():
        import transformers
        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg).eval()
        inputs = _tokens(cfg.vocab_size, length)
        if extra_inputs:
            inputs.update(extra_inputs(inputs))
        names = list(inputs)

        import torch

        class Keyword(torch.nn.Module):  # transformers' forwards take these by name
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(names, args)), return_dict=True)
                return tuple(out[k] for k in outputs)

        return Keyword().eval(), inputs, list(outputs)
    return build


_TINY_ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     max_position_embeddings=64)
#: the decoders of the second holdout set: 4 heads, no cache
_TINY_DECODER = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64, use_cache=False)


def _hf_audio(model_cls: str, config_cls: str, config: dict, input_name: str, shape: tuple,
              outputs: tuple = ("last_hidden_state",)):
    def build():
        import torch
        import transformers
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config)).eval()
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(SEED))

        class Audio(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, features):
                out = self.model(**{input_name: features}, return_dict=True)
                return tuple(out[k] for k in outputs)

        return Audio().eval(), {input_name: x}, list(outputs)
    return build


def _whisper_encoder():
    import torch
    import transformers
    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=2, decoder_layers=1,
                                     decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     num_mel_bins=80, max_source_positions=100, vocab_size=256, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    encoder = transformers.WhisperModel(cfg).get_encoder().eval()
    x = torch.randn(1, 80, 200, generator=torch.Generator().manual_seed(SEED))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_features):
            return self.encoder(input_features=input_features, return_dict=True).last_hidden_state

    return Encoder().eval(), {"input_features": x}, ["last_hidden_state"]


def _kws_crnn():
    """A keyword-spotting CRNN over a log-mel spectrogram: conv front end, bidirectional GRU,
    attention pooling, classifier (the shape of the common KWS recipes)."""
    import torch
    from torch import nn

    class KwsCrnn(nn.Module):
        def __init__(self, mels=40, classes=12):
            super().__init__()
            self.front = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                       nn.Conv2d(16, 32, 3, stride=(2, 1), padding=1), nn.BatchNorm2d(32), nn.ReLU())
            self.gru = nn.GRU(32 * (mels // 2), 64, batch_first=True, bidirectional=True)
            self.attn = nn.Linear(128, 1)
            self.head = nn.Linear(128, classes)

        def forward(self, mel):  # [1, 1, mels, frames]
            x = self.front(mel)
            x = x.flatten(1, 2).transpose(1, 2)  # [1, frames, 32 * mels/2]
            x, _ = self.gru(x)
            weights = torch.softmax(self.attn(x), dim=1)
            return self.head((weights * x).sum(dim=1))

    x = torch.randn(1, 1, 40, 98, generator=torch.Generator().manual_seed(SEED))
    return KwsCrnn().eval(), {"mel": x}, ["logits"]


def _bart_decoder_ids(inputs: dict) -> dict:
    return {"decoder_input_ids": inputs["input_ids"][:, :16].clone()}


def _tv_r3d_18():
    import torchvision
    clip = _image(112).unsqueeze(2).repeat(1, 1, 8, 1, 1)  # [1, 3, 8 frames, 112, 112]
    return torchvision.models.video.r3d_18(weights=None).eval(), {"clip": clip}, ["logits"]


def _hf_vision(model_cls: str, config_cls: str, config: dict, size: int, outputs: tuple = ("last_hidden_state",)):
    return _hf_audio(model_cls, config_cls, config, "pixel_values", (1, 3, size, size), outputs)


_TINY_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)


_TV = "torchvision classification"
_TV_DET = "torchvision detection"
_TV_SEG = "torchvision segmentation"
_TIMM = "timm"
_HF = "transformers"
_SPEECH = "speech"
_YOLO = "ultralytics"

SPECS: list[Spec] = [
    # torchvision classification
    Spec("tv_mobilenet_v3_small", _TV, "torchvision mobilenet_v3_small", TORCHSCRIPT, 13, _tv("mobilenet_v3_small")),
    Spec("tv_mobilenet_v3_small_dyn", _TV, "torchvision mobilenet_v3_small", DYNAMO, 18, _tv("mobilenet_v3_small")),
    Spec("tv_mobilenet_v3_large", _TV, "torchvision mobilenet_v3_large", DYNAMO, 19, _tv("mobilenet_v3_large")),
    Spec("tv_efficientnet_b0", _TV, "torchvision efficientnet_b0", TORCHSCRIPT, 14, _tv("efficientnet_b0")),
    Spec("tv_shufflenet_v2_x0_5", _TV, "torchvision shufflenet_v2_x0_5", TORCHSCRIPT, 15, _tv("shufflenet_v2_x0_5")),
    Spec("tv_mnasnet0_5", _TV, "torchvision mnasnet0_5", DYNAMO, 20, _tv("mnasnet0_5")),
    Spec("tv_densenet121", _TV, "torchvision densenet121 at 128x128", TORCHSCRIPT, 16, _tv("densenet121", 128)),
    Spec("tv_regnet_y_400mf", _TV, "torchvision regnet_y_400mf", DYNAMO, 18, _tv("regnet_y_400mf")),
    Spec("tv_resnet50", _TV, "torchvision resnet50 at 160x160", TORCHSCRIPT, 17, _tv("resnet50", 160)),
    Spec("tv_googlenet", _TV, "torchvision googlenet (no aux logits)", TORCHSCRIPT, 13,
         _tv("googlenet", aux_logits=False, init_weights=True)),
    Spec("tv_squeezenet1_0", _TV, "torchvision squeezenet1_0", DYNAMO, 19, _tv("squeezenet1_0")),
    Spec("tv_vit_tiny", _TV, "torchvision VisionTransformer(image 112, patch 16, 4 layers, 3 heads, dim 192)",
         TORCHSCRIPT, 14, _tv_vit_tiny),
    Spec("tv_swin_nano", _TV, "torchvision SwinTransformer(embed 48, depths 2-2-2-2, window 7) at 224",
         TORCHSCRIPT, 17, _tv_swin_nano),
    Spec("tv_maxvit_t", _TV, "torchvision maxvit_t", DYNAMO, 18, _tv("maxvit_t")),
    # torchvision detection and segmentation
    Spec("tv_ssdlite320_mobilenet_v3_large", _TV_DET, "torchvision ssdlite320_mobilenet_v3_large with post-processing",
         TORCHSCRIPT, 13, _detection(_ssdlite, 320)),
    Spec("tv_fasterrcnn_mobilenet_v3_large_320_fpn", _TV_DET,
         "torchvision fasterrcnn_mobilenet_v3_large_320_fpn with post-processing", TORCHSCRIPT, 16,
         _detection(_fasterrcnn_mobilenet, 320)),
    Spec("tv_retinanet_resnet18_fpn", _TV_DET, "torchvision RetinaNet on a resnet18 FPN (P3-P7), 320x320",
         TORCHSCRIPT, 17, _detection(_retinanet_resnet18, 320)),
    Spec("tv_fcos_resnet18_fpn", _TV_DET, "torchvision FCOS on a resnet18 FPN (P3-P7), 320x320",
         TORCHSCRIPT, 14, _detection(_fcos_resnet18, 320)),
    Spec("tv_deeplabv3_mobilenet_v3_large", _TV_SEG, "torchvision deeplabv3_mobilenet_v3_large at 224",
         TORCHSCRIPT, 17, _segmentation(_deeplabv3_mobilenet, 224)),
    Spec("tv_fcn_resnet18", _TV_SEG, "torchvision FCN with a resnet18 backbone at 224", DYNAMO, 19,
         _segmentation(_fcn_resnet18, 224)),
    # timm
    Spec("timm_vit_tiny_patch16_224", _TIMM, "timm vit_tiny_patch16_224", DYNAMO, 18, _timm("vit_tiny_patch16_224")),
    Spec("timm_vit_tiny_patch16_224_ts", _TIMM, "timm vit_tiny_patch16_224", TORCHSCRIPT, 17,
         _timm("vit_tiny_patch16_224")),
    Spec("timm_swin_tiny_patch4_window7_224", _TIMM, "timm swin_tiny_patch4_window7_224", TORCHSCRIPT, 17,
         _timm("swin_tiny_patch4_window7_224")),
    Spec("timm_convnext_atto", _TIMM, "timm convnext_atto", DYNAMO, 19, _timm("convnext_atto")),
    Spec("timm_tf_efficientnet_b0", _TIMM, "timm tf_efficientnet_b0 (TF 'SAME' padding)", TORCHSCRIPT, 15,
         _timm("tf_efficientnet_b0")),
    Spec("timm_mobilenetv3_small_100", _TIMM, "timm mobilenetv3_small_100", DYNAMO, 20, _timm("mobilenetv3_small_100")),
    Spec("timm_regnetx_002", _TIMM, "timm regnetx_002", TORCHSCRIPT, 16, _timm("regnetx_002")),
    Spec("timm_levit_128s", _TIMM, "timm levit_128s", DYNAMO, 18, _timm("levit_128s")),
    Spec("timm_mobilevit_xxs", _TIMM, "timm mobilevit_xxs at 256", TORCHSCRIPT, 17, _timm("mobilevit_xxs", 256)),
    Spec("timm_ghostnet_100", _TIMM, "timm ghostnet_100", TORCHSCRIPT, 13, _timm("ghostnet_100")),
    Spec("timm_poolformer_s12", _TIMM, "timm poolformer_s12", DYNAMO, 19, _timm("poolformer_s12")),
    Spec("timm_efficientformerv2_s0", _TIMM, "timm efficientformerv2_s0", TORCHSCRIPT, 16,
         _timm("efficientformerv2_s0")),
    Spec("timm_edgenext_xx_small", _TIMM, "timm edgenext_xx_small at 256", TORCHSCRIPT, 14,
         _timm("edgenext_xx_small", 256)),
    Spec("timm_fastvit_t8", _TIMM, "timm fastvit_t8", DYNAMO, 18, _timm("fastvit_t8")),
    Spec("timm_hgnetv2_b0", _TIMM, "timm hgnetv2_b0", TORCHSCRIPT, 15, _timm("hgnetv2_b0")),
    Spec("timm_repvit_m0_9", _TIMM, "timm repvit_m0_9", DYNAMO, 20, _timm("repvit_m0_9")),
    # transformers encoders and decoders (tiny configs, random init)
    Spec("hf_bert_tiny", _HF, "transformers BertModel (hidden 64, 2 layers, 2 heads), seq 32", DYNAMO, 18,
         _hf_text("BertModel", "BertConfig", dict(_TINY_ENCODER, vocab_size=512),
                  outputs=("last_hidden_state", "pooler_output"))),
    Spec("hf_distilbert_tiny", _HF, "transformers DistilBertModel (dim 64, 2 layers, 2 heads), seq 32", TORCHSCRIPT, 14,
         _hf_text("DistilBertModel", "DistilBertConfig",
                  dict(vocab_size=512, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=64))),
    Spec("hf_gpt2_tiny", _HF, "transformers GPT2Model (n_embd 64, 2 layers, 2 heads), seq 32, no cache", TORCHSCRIPT, 17,
         _hf_text("GPT2Model", "GPT2Config",
                  dict(vocab_size=512, n_embd=64, n_layer=2, n_head=2, n_positions=64, use_cache=False))),
    Spec("hf_gpt2_tiny_dyn", _HF, "transformers GPT2Model (n_embd 64, 2 layers, 2 heads), seq 32, no cache", DYNAMO, 18,
         _hf_text("GPT2Model", "GPT2Config",
                  dict(vocab_size=512, n_embd=64, n_layer=2, n_head=2, n_positions=64, use_cache=False))),
    Spec("hf_t5_encoder_tiny", _HF, "transformers T5EncoderModel (d_model 64, 2 layers, 4 heads), seq 32", TORCHSCRIPT, 15,
         _hf_text("T5EncoderModel", "T5Config",
                  dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                       relative_attention_num_buckets=16))),
    Spec("hf_llama_tiny", _HF, "transformers LlamaModel (hidden 64, 2 layers, 4 heads, 2 kv heads), seq 32, no cache",
         DYNAMO, 18, _hf_text("LlamaModel", "LlamaConfig",
                              dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_cache=False))),
    Spec("hf_llama_tiny_ts", _HF, "transformers LlamaModel (hidden 64, 2 layers, 4 heads, 2 kv heads), seq 32, no cache",
         TORCHSCRIPT, 17, _hf_text("LlamaModel", "LlamaConfig",
                                   dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        use_cache=False))),
    Spec("hf_deberta_v2_tiny", _HF, "transformers DebertaV2Model (hidden 64, 2 layers, 2 heads), seq 32", TORCHSCRIPT, 15,
         _hf_text("DebertaV2Model", "DebertaV2Config", dict(_TINY_ENCODER, vocab_size=512))),
    Spec("hf_albert_tiny", _HF, "transformers AlbertModel (embedding 32, hidden 64, 2 layers), seq 32", DYNAMO, 20,
         _hf_text("AlbertModel", "AlbertConfig", dict(_TINY_ENCODER, vocab_size=512, embedding_size=32),
                  outputs=("last_hidden_state", "pooler_output"))),
    Spec("hf_bart_tiny", _HF, "transformers BartModel (d_model 64, 2+2 layers), encoder seq 32, decoder seq 16",
         TORCHSCRIPT, 17, _hf_text("BartModel", "BartConfig",
                                   dict(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                                        decoder_ffn_dim=128, max_position_embeddings=64, use_cache=False),
                                   extra_inputs=_bart_decoder_ids)),
    Spec("hf_segformer_tiny", _HF, "transformers SegformerForSemanticSegmentation (hidden 16-32-64-128), 128x128",
         DYNAMO, 18, _hf_audio("SegformerForSemanticSegmentation", "SegformerConfig",
                               dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], decoder_hidden_size=64,
                                    num_attention_heads=[1, 2, 4, 8], num_labels=8),
                               "pixel_values", (1, 3, 128, 128), outputs=("logits",))),
    # speech
    Spec("hf_whisper_encoder_tiny", _SPEECH, "transformers WhisperModel encoder (d_model 64, 2 layers), 80 mels x 200",
         TORCHSCRIPT, 17, _whisper_encoder),
    Spec("hf_wav2vec2_tiny", _SPEECH, "transformers Wav2Vec2Model (hidden 64, 2 layers, 7 conv layers of 32), 8000 samples",
         TORCHSCRIPT, 16, _hf_audio("Wav2Vec2Model", "Wav2Vec2Config",
                                    dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                         conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4),
                                    "input_values", (1, 8000))),
    Spec("hf_hubert_tiny", _SPEECH, "transformers HubertModel (hidden 64, 2 layers, 7 conv layers of 32), 8000 samples",
         DYNAMO, 18, _hf_audio("HubertModel", "HubertConfig",
                               dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                    conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
                               "input_values", (1, 8000))),
    Spec("hf_ast_tiny", _SPEECH, "transformers ASTModel (hidden 64, 2 layers), 128 mels x 100 frames", TORCHSCRIPT, 14,
         _hf_audio("ASTModel", "ASTConfig",
                   dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        max_length=100, num_mel_bins=128),
                   "input_values", (1, 100, 128), outputs=("last_hidden_state", "pooler_output"))),
    Spec("kws_crnn", _SPEECH, "torch keyword-spotting CRNN: conv front end, bidirectional GRU, attention pooling",
         TORCHSCRIPT, 13, _kws_crnn),
    # ultralytics (random init from yaml; exported by YOLO.export)
    Spec("yolo11n", _YOLO, "ultralytics yolo11n.yaml", ULTRALYTICS, 15, yolo_yaml="yolo11n.yaml"),
    Spec("yolov8n_seg", _YOLO, "ultralytics yolov8n-seg.yaml", ULTRALYTICS, 17, yolo_yaml="yolov8n-seg.yaml"),
    Spec("yolov8n_pose", _YOLO, "ultralytics yolov8n-pose.yaml", ULTRALYTICS, 13, yolo_yaml="yolov8n-pose.yaml"),
    Spec("yolov8n_cls", _YOLO, "ultralytics yolov8n-cls.yaml at 224", ULTRALYTICS, 16, yolo_yaml="yolov8n-cls.yaml",
         imgsz=224),
    Spec("yolo11n_obb", _YOLO, "ultralytics yolo11n-obb.yaml", ULTRALYTICS, 19, yolo_yaml="yolo11n-obb.yaml"),
    Spec("yolov10n", _YOLO, "ultralytics yolov10n.yaml (NMS-free head)", ULTRALYTICS, 18, yolo_yaml="yolov10n.yaml"),
    Spec("rtdetr_l", _YOLO, "ultralytics rtdetr-l.yaml", ULTRALYTICS, 17, yolo_yaml="rtdetr-l.yaml"),
    # the holdout set: architectures and forms the zoos above were never tuned on
    Spec("timm_efficientvit_b0", _TIMM, "timm efficientvit_b0 (MIT, ReLU linear attention)", DYNAMO, 18,
         _timm("efficientvit_b0")),
    Spec("timm_mobileone_s0", _TIMM, "timm mobileone_s0 (unreparameterised branches)", TORCHSCRIPT, 13,
         _timm("mobileone_s0")),
    Spec("timm_ghostnetv2_100", _TIMM, "timm ghostnetv2_100 (DFC attention)", TORCHSCRIPT, 16, _timm("ghostnetv2_100")),
    Spec("timm_mixnet_s", _TIMM, "timm mixnet_s (mixed depthwise kernels)", DYNAMO, 20, _timm("mixnet_s")),
    Spec("timm_rexnet_100", _TIMM, "timm rexnet_100", TORCHSCRIPT, 14, _timm("rexnet_100")),
    Spec("timm_resnest14d", _TIMM, "timm resnest14d (split attention) at 160", TORCHSCRIPT, 17,
         _timm("resnest14d", 160)),
    Spec("timm_pvt_v2_b0", _TIMM, "timm pvt_v2_b0 (spatial-reduction attention)", DYNAMO, 18, _timm("pvt_v2_b0")),
    Spec("timm_mobilevitv2_050", _TIMM, "timm mobilevitv2_050 (separable self-attention) at 256", TORCHSCRIPT, 15,
         _timm("mobilevitv2_050", 256)),
    Spec("timm_hrnet_w18_small", _TIMM, "timm hrnet_w18_small at 160", DYNAMO, 19, _timm("hrnet_w18_small", 160)),
    Spec("tv_inception_v3", _TV, "torchvision inception_v3 at 160 (no aux logits)", TORCHSCRIPT, 15,
         _tv("inception_v3", 160, aux_logits=False, init_weights=True)),
    Spec("tv_resnext50_32x4d", _TV, "torchvision resnext50_32x4d at 128", DYNAMO, 19, _tv("resnext50_32x4d", 128)),
    Spec("tv_r3d_18", _TV, "torchvision r3d_18 (3-D convolutions), 8 frames of 112x112", TORCHSCRIPT, 16, _tv_r3d_18),
    Spec("hf_mobilebert_tiny", _HF, "transformers MobileBertModel (hidden 64, 2 layers, bottleneck 32), seq 32",
         TORCHSCRIPT, 14, _hf_text("MobileBertModel", "MobileBertConfig",
                                   dict(_TINY_ENCODER, vocab_size=512, embedding_size=32, intra_bottleneck_size=32,
                                        true_hidden_size=32, num_feedforward_networks=2))),
    Spec("hf_convbert_tiny", _HF, "transformers ConvBertModel (hidden 64, 2 layers, span conv 9), seq 32", DYNAMO, 18,
         _hf_text("ConvBertModel", "ConvBertConfig", dict(_TINY_ENCODER, vocab_size=512, embedding_size=64))),
    Spec("hf_squeezebert_tiny", _HF, "transformers SqueezeBertModel (hidden 64, 2 layers, grouped 1-D convs), seq 32",
         TORCHSCRIPT, 16, _hf_text("SqueezeBertModel", "SqueezeBertConfig",
                                   dict(_TINY_ENCODER, vocab_size=512, embedding_size=64))),
    Spec("hf_clip_vision_tiny", _HF, "transformers CLIPVisionModel (hidden 64, 2 layers, patch 16), 112x112", DYNAMO, 19,
         _hf_vision("CLIPVisionModel", "CLIPVisionConfig", dict(_TINY_VIT, image_size=112, patch_size=16), 112,
                    outputs=("last_hidden_state", "pooler_output"))),
    Spec("hf_dinov2_tiny", _HF, "transformers Dinov2Model (hidden 64, 2 layers, patch 14), 112x112", TORCHSCRIPT, 17,
         _hf_vision("Dinov2Model", "Dinov2Config", dict(_TINY_VIT, mlp_ratio=2, image_size=112, patch_size=14), 112)),
    Spec("hf_beit_tiny", _HF, "transformers BeitModel (hidden 64, 2 layers, relative position bias), 112x112",
         TORCHSCRIPT, 14, _hf_vision("BeitModel", "BeitConfig",
                                     dict(_TINY_VIT, image_size=112, patch_size=16, use_relative_position_bias=True),
                                     112, outputs=("last_hidden_state", "pooler_output"))),
    Spec("hf_yolos_tiny", _HF, "transformers YolosForObjectDetection (hidden 64, 2 layers, 10 detection tokens), 128x128",
         DYNAMO, 18, _hf_vision("YolosForObjectDetection", "YolosConfig",
                                dict(_TINY_VIT, image_size=[128, 128], patch_size=16, num_detection_tokens=10),
                                128, outputs=("logits", "pred_boxes"))),
    Spec("hf_convnextv2_tiny", _HF, "transformers ConvNextV2Model (hidden 16-32-64-128, GRN), 128x128", DYNAMO, 20,
         _hf_vision("ConvNextV2Model", "ConvNextV2Config",
                    dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1]), 128, outputs=("pooler_output",))),
    Spec("yolo12n", _YOLO, "ultralytics yolo12n.yaml (area attention)", ULTRALYTICS, 17, yolo_yaml="yolo12n.yaml"),
    Spec("yolo26n", _YOLO, "ultralytics yolo26n.yaml", ULTRALYTICS, 19, yolo_yaml="yolo26n.yaml"),
    Spec("yolov5nu", _YOLO, "ultralytics yolov5nu.yaml (anchor-free head)", ULTRALYTICS, 13, yolo_yaml="yolov5nu.yaml"),
    Spec("yolov9t", _YOLO, "ultralytics yolov9t.yaml (GELAN)", ULTRALYTICS, 16, yolo_yaml="yolov9t.yaml"),
    Spec("yolo11n_cls", _YOLO, "ultralytics yolo11n-cls.yaml at 224", ULTRALYTICS, 20, yolo_yaml="yolo11n-cls.yaml",
         imgsz=224),
    # the second holdout set (issue 37): architectures and exporter forms that appeared after the
    # first, planned and exported before any change was made for them
    Spec("timm_mobilenetv4_conv_small", _TIMM, "timm mobilenetv4_conv_small (universal inverted bottlenecks)",
         DYNAMO, 18, _timm("mobilenetv4_conv_small")),
    Spec("timm_mobilenetv4_hybrid_medium", _TIMM, "timm mobilenetv4_hybrid_medium (multi-query attention) at 160",
         TORCHSCRIPT, 17, _timm("mobilenetv4_hybrid_medium", 160)),
    Spec("timm_tiny_vit_5m_224", _TIMM, "timm tiny_vit_5m_224 (windowed attention with bias tables)", DYNAMO, 19,
         _timm("tiny_vit_5m_224")),
    Spec("timm_efficientformer_l1", _TIMM, "timm efficientformer_l1 (pool mixers, then attention)", TORCHSCRIPT, 16,
         _timm("efficientformer_l1")),
    Spec("timm_starnet_s050", _TIMM, "timm starnet_s050 (element-wise product of two branches)", DYNAMO, 18,
         _timm("starnet_s050")),
    Spec("timm_inception_next_atto", _TIMM, "timm inception_next_atto (band depthwise kernels)", TORCHSCRIPT, 15,
         _timm("inception_next_atto")),
    Spec("timm_lcnet_050", _TIMM, "timm lcnet_050", DYNAMO, 17, _timm("lcnet_050")),
    Spec("timm_repghostnet_050", _TIMM, "timm repghostnet_050 (unreparameterised)", TORCHSCRIPT, 14,
         _timm("repghostnet_050")),
    Spec("timm_shvit_s1", _TIMM, "timm shvit_s1 (single-head attention on part of the channels)", DYNAMO, 18,
         _timm("shvit_s1")),
    Spec("timm_efficientvit_m0", _TIMM, "timm efficientvit_m0 (cascaded group attention)", TORCHSCRIPT, 17,
         _timm("efficientvit_m0")),
    Spec("timm_mambaout_femto", _TIMM, "timm mambaout_femto (gated CNN, channels-last)", DYNAMO, 19,
         _timm("mambaout_femto")),
    Spec("timm_cs3darknet_focus_s", _TIMM, "timm cs3darknet_focus_s (space-to-depth stem) at 256", TORCHSCRIPT, 13,
         _timm("cs3darknet_focus_s", 256)),
    Spec("timm_xcit_nano_12_p16_224", _TIMM, "timm xcit_nano_12_p16_224 (cross-covariance attention)", DYNAMO, 18,
         _timm("xcit_nano_12_p16_224")),
    Spec("timm_swiftformer_xs", _TIMM, "timm swiftformer_xs (additive attention)", TORCHSCRIPT, 16,
         _timm("swiftformer_xs")),
    Spec("tv_efficientnet_v2_s", _TV, "torchvision efficientnet_v2_s at 128", DYNAMO, 18, _tv("efficientnet_v2_s", 128)),
    Spec("tv_convnext_tiny", _TV, "torchvision convnext_tiny at 128", TORCHSCRIPT, 17, _tv("convnext_tiny", 128)),
    Spec("hf_modernbert_tiny", _HF, "transformers ModernBertModel (hidden 64, 3 layers, local and global attention), seq 32",
         DYNAMO, 18, _hf_text("ModernBertModel", "ModernBertConfig",
                              dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                   num_attention_heads=2, local_attention=16, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2))),
    Spec("hf_qwen3_tiny", _HF, "transformers Qwen3Model (hidden 64, 2 layers, 4 heads, 2 kv heads, q/k norms), seq 32",
         DYNAMO, 18, _hf_text("Qwen3Model", "Qwen3Config", dict(_TINY_DECODER, num_key_value_heads=2, head_dim=16))),
    Spec("hf_gemma_tiny", _HF, "transformers GemmaModel (hidden 64, 2 layers, 4 heads, 1 kv head), seq 32",
         TORCHSCRIPT, 17, _hf_text("GemmaModel", "GemmaConfig", dict(_TINY_DECODER, num_key_value_heads=1, head_dim=16))),
    Spec("hf_gptneox_tiny", _HF, "transformers GPTNeoXModel (hidden 64, 2 layers, partial rotary), seq 32",
         TORCHSCRIPT, 16, _hf_text("GPTNeoXModel", "GPTNeoXConfig", dict(_TINY_DECODER, rotary_pct=0.25))),
    Spec("hf_roformer_tiny", _HF, "transformers RoFormerModel (hidden 64, 2 layers, rotary), seq 32", TORCHSCRIPT, 14,
         _hf_text("RoFormerModel", "RoFormerConfig", dict(_TINY_ENCODER, vocab_size=512, embedding_size=64))),
    Spec("hf_siglip_vision_tiny", _HF, "transformers SiglipVisionModel (hidden 64, 2 layers, attention pooling), 112x112",
         DYNAMO, 19, _hf_vision("SiglipVisionModel", "SiglipVisionConfig", dict(_TINY_VIT, image_size=112, patch_size=16),
                                112, outputs=("last_hidden_state", "pooler_output"))),
    Spec("hf_swinv2_tiny", _HF, "transformers Swinv2Model (embed 16, window 4, cosine attention), 128x128", TORCHSCRIPT, 17,
         _hf_vision("Swinv2Model", "Swinv2Config",
                    dict(image_size=128, patch_size=4, embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8],
                         window_size=4), 128, outputs=("pooler_output",))),
    Spec("yolov6n", _YOLO, "ultralytics yolov6n.yaml", ULTRALYTICS, 13, yolo_yaml="yolov6n.yaml"),
    Spec("yolov8n_ghost", _YOLO, "ultralytics yolov8n-ghost.yaml (ghost modules)", ULTRALYTICS, 17,
         yolo_yaml="yolov8n-ghost.yaml"),
    Spec("yolov3_tinyu", _YOLO, "ultralytics yolov3-tinyu.yaml (a stride-1 max pool after a zero pad)", ULTRALYTICS, 15,
         yolo_yaml="yolov3-tinyu.yaml"),
    # a third holdout, for the shapings of transposed token rows and of token rows of a map
    Spec("timm_xcit_tiny_12_p16_224", _TIMM, "timm xcit_tiny_12_p16_224 (cross-covariance attention)", TORCHSCRIPT,
         17, _timm("xcit_tiny_12_p16_224")),
    Spec("timm_edgenext_x_small", _TIMM, "timm edgenext_x_small (XCA on 100 channels of 14x14)", DYNAMO, 18,
         _timm("edgenext_x_small")),
    Spec("timm_swiftformer_s", _TIMM, "timm swiftformer_s (additive attention)", DYNAMO, 18, _timm("swiftformer_s")),
    # a fourth holdout: architectures none of the zoos had, exported before any change for them
    Spec("timm_gcvit_xxtiny", _TIMM, "timm gcvit_xxtiny (global context attention)", DYNAMO, 18, _timm("gcvit_xxtiny")),
    Spec("timm_hiera_tiny_224", _TIMM, "timm hiera_tiny_224 (mask-unit attention)", TORCHSCRIPT, 17,
         _timm("hiera_tiny_224")),
    Spec("timm_fasternet_t0", _TIMM, "timm fasternet_t0 (partial convolution)", DYNAMO, 18, _timm("fasternet_t0")),
    Spec("timm_convformer_s18", _TIMM, "timm convformer_s18 (separable conv mixer, StarReLU)", TORCHSCRIPT, 17,
         _timm("convformer_s18")),
    Spec("timm_davit_tiny", _TIMM, "timm davit_tiny (channel and window attention)", DYNAMO, 18, _timm("davit_tiny")),
    Spec("timm_focalnet_tiny_srf", _TIMM, "timm focalnet_tiny_srf (focal modulation)", TORCHSCRIPT, 17,
         _timm("focalnet_tiny_srf")),
    Spec("timm_ghostnetv3_050", _TIMM, "timm ghostnetv3_050", DYNAMO, 18, _timm("ghostnetv3_050")),
    Spec("timm_coatnet_nano_rw_224", _TIMM, "timm coatnet_nano_rw_224 (MBConv and relative attention)", TORCHSCRIPT,
         17, _timm("coatnet_nano_rw_224")),
    Spec("timm_twins_svt_small", _TIMM, "timm twins_svt_small (locally grouped and global sub-sampled attention)",
         TORCHSCRIPT, 17, _timm("twins_svt_small")),
    Spec("timm_botnet26t_256", _TIMM, "timm botnet26t_256 (bottleneck self-attention)", TORCHSCRIPT, 16,
         _timm("botnet26t_256", 256)),
    Spec("timm_tresnet_m", _TIMM, "timm tresnet_m (space-to-depth stem, anti-aliased downsampling)", DYNAMO, 18,
         _timm("tresnet_m")),
    Spec("timm_dla34", _TIMM, "timm dla34 (deep layer aggregation)", TORCHSCRIPT, 13, _timm("dla34")),
    # a fifth holdout, planned and checked against onnxruntime only (robustness of the planner)
    Spec("timm_halonet26t", _TIMM, "timm halonet26t (blocked local self-attention)", DYNAMO, 18,
         _timm("halonet26t", 256)),
    Spec("timm_lambda_resnet26t", _TIMM, "timm lambda_resnet26t (lambda layers)", DYNAMO, 18,
         _timm("lambda_resnet26t", 256)),
    Spec("timm_sequencer2d_s", _TIMM, "timm sequencer2d_s (bidirectional LSTMs over rows and columns)", TORCHSCRIPT,
         17, _timm("sequencer2d_s")),
    Spec("timm_visformer_tiny", _TIMM, "timm visformer_tiny", DYNAMO, 18, _timm("visformer_tiny")),
    Spec("timm_pit_ti_224", _TIMM, "timm pit_ti_224 (pooling-based ViT)", TORCHSCRIPT, 17, _timm("pit_ti_224")),
    Spec("timm_crossvit_tiny_240", _TIMM, "timm crossvit_tiny_240 (two branches, cross attention)", DYNAMO, 18,
         _timm("crossvit_tiny_240", 240)),
    Spec("timm_resmlp_12_224", _TIMM, "timm resmlp_12_224 (affine norms, token-mixing MLPs)", TORCHSCRIPT, 17,
         _timm("resmlp_12_224")),
    Spec("timm_nest_tiny", _TIMM, "timm nest_tiny (nested block aggregation)", TORCHSCRIPT, 17, _timm("nest_tiny")),
    Spec("timm_rdnet_tiny", _TIMM, "timm rdnet_tiny (densely connected, revisited)", DYNAMO, 18, _timm("rdnet_tiny")),
    # a sixth holdout: norms, attentions and heads none of the zoos had, in both exporters
    Spec("timm_efficientnet_b0_gn", _TIMM, "timm efficientnet_b0_gn (GroupNorm)", TORCHSCRIPT, 17,
         _timm("efficientnet_b0_gn")),
    Spec("timm_nf_regnet_b0", _TIMM, "timm nf_regnet_b0 (normalizer-free, standardized weights)", DYNAMO, 18,
         _timm("nf_regnet_b0")),
    Spec("timm_cait_xxs24_224", _TIMM, "timm cait_xxs24_224 (talking heads, class attention)", TORCHSCRIPT, 17,
         _timm("cait_xxs24_224")),
    Spec("timm_mvitv2_tiny", _TIMM, "timm mvitv2_tiny (pooling attention, relative positions)", DYNAMO, 18,
         _timm("mvitv2_tiny")),
    Spec("timm_eva02_tiny_patch14_224", _TIMM, "timm eva02_tiny_patch14_224 (rotary, SwiGLU)", DYNAMO, 18,
         _timm("eva02_tiny_patch14_224")),
    Spec("timm_gmlp_ti16_224", _TIMM, "timm gmlp_ti16_224 (spatial gating)", DYNAMO, 18, _timm("gmlp_ti16_224")),
    Spec("timm_convmixer_768_32", _TIMM, "timm convmixer_768_32 (7x7 depthwise on 768 channels)", TORCHSCRIPT, 15,
         _timm("convmixer_768_32")),
    Spec("timm_skresnet18", _TIMM, "timm skresnet18 (selective kernel)", DYNAMO, 18, _timm("skresnet18")),
    Spec("timm_res2net50_14w_8s", _TIMM, "timm res2net50_14w_8s (hierarchical splits)", TORCHSCRIPT, 13,
         _timm("res2net50_14w_8s")),
    Spec("timm_ese_vovnet19b_dw", _TIMM, "timm ese_vovnet19b_dw (one-shot aggregation, eSE)", DYNAMO, 18,
         _timm("ese_vovnet19b_dw")),
    Spec("hf_bloom_tiny", _HF, "transformers BloomModel (hidden 64, 2 layers, ALiBi), seq 32", TORCHSCRIPT, 17,
         _hf_text("BloomModel", "BloomConfig", dict(vocab_size=512, hidden_size=64, n_layer=2, n_head=4))),
    Spec("hf_opt_tiny", _HF, "transformers OPTModel (hidden 64, 2 layers, learned positions), seq 32", DYNAMO, 18,
         _hf_text("OPTModel", "OPTConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                                num_attention_heads=4, max_position_embeddings=64,
                                                word_embed_proj_dim=64))),
    Spec("hf_swin2sr_tiny", _HF, "transformers Swin2SRForImageSuperResolution (x2, pixel shuffle), 32x32",
         TORCHSCRIPT, 17, _hf_vision("Swin2SRForImageSuperResolution", "Swin2SRConfig",
                                     dict(image_size=32, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=8,
                                          upscale=2, upsampler="pixelshuffle"), 32, outputs=("reconstruction",))),
    Spec("hf_dpt_tiny", _HF, "transformers DPTForDepthEstimation (hidden 64, 4 layers), 128x128", DYNAMO, 18,
         _hf_vision("DPTForDepthEstimation", "DPTConfig",
                    dict(_TINY_VIT, num_hidden_layers=4, image_size=128, patch_size=16,
                         backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
                         fusion_hidden_size=32, reassemble_factors=[4, 2, 1, 0.5]), 128,
                    outputs=("predicted_depth",))),
    Spec("hf_w2v2_conformer_tiny", _SPEECH, "transformers Wav2Vec2ConformerModel (hidden 64, 2 layers, relative "
         "positions), 8000 samples", TORCHSCRIPT, 17,
         _hf_audio("Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig",
                   dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                        position_embeddings_type="relative", conv_depthwise_kernel_size=15),
                   "input_values", (1, 8000))),
    Spec("hf_detr_tiny", _HF, "transformers DetrForObjectDetection (timm resnet18, d_model 64, 20 queries), 128x128",
         TORCHSCRIPT, 17, _hf_vision("DetrForObjectDetection", "DetrConfig",
                                     dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                                          d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                          decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                          num_queries=20), 128, outputs=("logits", "pred_boxes"))),
    # a seventh holdout: attentions with convolutional positions, outlookers, relative positions
    Spec("timm_coat_lite_tiny", _TIMM, "timm coat_lite_tiny (factorized attention, conv positions)", TORCHSCRIPT, 17,
         _timm("coat_lite_tiny")),
    Spec("timm_convit_tiny", _TIMM, "timm convit_tiny (gated positional self-attention)", DYNAMO, 18,
         _timm("convit_tiny")),
    Spec("timm_twins_pcpvt_small", _TIMM, "timm twins_pcpvt_small (spatial-reduction attention)", TORCHSCRIPT, 17,
         _timm("twins_pcpvt_small")),
    Spec("timm_levit_conv_128s", _TIMM, "timm levit_conv_128s (LeViT as convolutions)", TORCHSCRIPT, 16,
         _timm("levit_conv_128s")),
    Spec("timm_regnetz_b16", _TIMM, "timm regnetz_b16", DYNAMO, 18, _timm("regnetz_b16")),
    Spec("timm_repvgg_a0", _TIMM, "timm repvgg_a0", TORCHSCRIPT, 15, _timm("repvgg_a0")),
    Spec("timm_volo_d1_224", _TIMM, "timm volo_d1_224 (outlook attention: unfold, fold)", DYNAMO, 18,
         _timm("volo_d1_224")),
    Spec("timm_sebotnet33ts_256", _TIMM, "timm sebotnet33ts_256 (bottleneck self-attention, SE)", TORCHSCRIPT, 17,
         _timm("sebotnet33ts_256", 256)),
    Spec("timm_eca_halonext26ts", _TIMM, "timm eca_halonext26ts (halo attention, ECA)", DYNAMO, 18,
         _timm("eca_halonext26ts", 256)),
    Spec("timm_fastvit_sa12", _TIMM, "timm fastvit_sa12 (reparameterized, attention stage)", TORCHSCRIPT, 17,
         _timm("fastvit_sa12")),
    Spec("timm_vit_relpos_small_patch16_224", _TIMM, "timm vit_relpos_small_patch16_224 (relative positions)",
         TORCHSCRIPT, 17, _timm("vit_relpos_small_patch16_224")),
    Spec("timm_maxxvit_rmlp_nano_rw_256", _TIMM, "timm maxxvit_rmlp_nano_rw_256 (MLP relative positions)",
         TORCHSCRIPT, 17, _timm("maxxvit_rmlp_nano_rw_256", 256)),
    # an eighth holdout: decoders of other families, one encoder
    Spec("hf_phi_tiny", _HF, "transformers PhiModel (hidden 64, 2 layers, partial rotary, parallel MLP), seq 32",
         DYNAMO, 18, _hf_text("PhiModel", "PhiConfig", dict(_TINY_DECODER, partial_rotary_factor=0.5))),
    Spec("hf_mistral_tiny", _HF, "transformers MistralModel (hidden 64, 2 layers, 4 heads, 2 kv heads), seq 32",
         TORCHSCRIPT, 17, _hf_text("MistralModel", "MistralConfig", dict(_TINY_DECODER, num_key_value_heads=2))),
    Spec("hf_falcon_tiny", _HF, "transformers FalconModel (hidden 64, 2 layers, multi-query), seq 32", DYNAMO, 18,
         _hf_text("FalconModel", "FalconConfig", dict(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, use_cache=False))),
    Spec("hf_stablelm_tiny", _HF, "transformers StableLmModel (hidden 64, 2 layers, partial rotary), seq 32",
         TORCHSCRIPT, 17, _hf_text("StableLmModel", "StableLmConfig", dict(_TINY_DECODER, num_key_value_heads=4))),
    Spec("hf_phi3_tiny", _HF, "transformers Phi3Model (hidden 64, 2 layers, fused qkv and gate-up), seq 32", DYNAMO,
         18, _hf_text("Phi3Model", "Phi3Config", dict(_TINY_DECODER, num_key_value_heads=4, pad_token_id=0))),
    Spec("hf_olmo_tiny", _HF, "transformers OlmoModel (hidden 64, 2 layers, non-parametric norms), seq 32",
         TORCHSCRIPT, 17, _hf_text("OlmoModel", "OlmoConfig", dict(_TINY_DECODER, pad_token_id=0))),
    Spec("hf_starcoder2_tiny", _HF, "transformers Starcoder2Model (hidden 64, 2 layers, 2 kv heads), seq 32", DYNAMO,
         18, _hf_text("Starcoder2Model", "Starcoder2Config", dict(_TINY_DECODER, num_key_value_heads=2))),
    Spec("hf_mpt_tiny", _HF, "transformers MptModel (d_model 64, 2 layers, ALiBi), seq 32", TORCHSCRIPT, 17,
         _hf_text("MptModel", "MptConfig", dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=64,
                                               use_cache=False))),
    Spec("hf_codegen_tiny", _HF, "transformers CodeGenModel (n_embd 64, 2 layers, interleaved rotary), seq 32",
         TORCHSCRIPT, 17, _hf_text("CodeGenModel", "CodeGenConfig", dict(vocab_size=512, n_embd=64, n_layer=2,
                                                                       n_head=4, rotary_dim=8, n_positions=64,
                                                                       use_cache=False))),
    Spec("hf_electra_tiny", _HF, "transformers ElectraModel (hidden 64, 2 layers, embedding 32), seq 32", DYNAMO, 18,
         _hf_text("ElectraModel", "ElectraConfig", dict(_TINY_ENCODER, vocab_size=512, embedding_size=32))),
    # a ninth holdout: convolutional networks through the dynamo exporter
    Spec("timm_tinynet_a", _TIMM, "timm tinynet_a", DYNAMO, 18, _timm("tinynet_a", 192)),
    Spec("timm_cspresnet50", _TIMM, "timm cspresnet50 (cross-stage partial)", DYNAMO, 18, _timm("cspresnet50", 256)),
    Spec("timm_dpn68", _TIMM, "timm dpn68 (dual path)", DYNAMO, 18, _timm("dpn68")),
    Spec("timm_seresnext26d_32x4d", _TIMM, "timm seresnext26d_32x4d", DYNAMO, 18, _timm("seresnext26d_32x4d")),
    Spec("timm_edgenext_small", _TIMM, "timm edgenext_small", DYNAMO, 18, _timm("edgenext_small", 256)),
    Spec("timm_mobilenetv3_large_100", _TIMM, "timm mobilenetv3_large_100", DYNAMO, 18,
         _timm("mobilenetv3_large_100")),
    Spec("timm_hardcorenas_a", _TIMM, "timm hardcorenas_a", DYNAMO, 18, _timm("hardcorenas_a")),
    Spec("tv_mnasnet1_0", _TV, "torchvision mnasnet1_0", DYNAMO, 18, _tv("mnasnet1_0")),
    Spec("tv_regnet_x_400mf", _TV, "torchvision regnet_x_400mf", DYNAMO, 18, _tv("regnet_x_400mf")),
]


# --------------------------------------------------------------------------- child: one model
CALIBRATION_BATCHES = 4


def _norm_classes() -> tuple:
    import torch
    return (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)


def exercise_random_weights(module, args: tuple) -> None:
    """Make a randomly initialised model compute something worth comparing.

    Library inits are meant for training, not for use: torchvision's ViT head and several
    residual branches start at exactly zero (the peer then folds the whole model to a constant;
    timm's `zero_init_last` zeroes the scale of a residual block's last norm, which the exporter
    folds into the conv before it, so the whole branch is dead code), and with BatchNorm's initial statistics (mean 0, variance 1) activations shrink layer by
    layer (logits of 1e-9 to 1e-14 for MobileNetV3/EfficientNet, no box above a detector's
    score threshold). So every all-zero weight matrix gets seeded values of scale 1/sqrt(fan_in),
    every all-zero norm scale becomes ones, and every BatchNorm's running statistics become the mean over CALIBRATION_BATCHES seeded
    batches (shaped like the example inputs) of the statistics of its own input. The model stays
    in eval mode: a pre-hook normalises each batch with its statistics as it passes, so later
    norms see normalised inputs, and a channel with a single value (a batch of one pooled to
    1x1) keeps variance 1, where training-mode BatchNorm would refuse."""
    import torch
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() >= 2 and parameter.is_floating_point() and not parameter.any():
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / fan_in ** 0.5)
        for norm in module.modules():
            scale = getattr(norm, "weight", None)
            if isinstance(norm, _norm_classes()) and scale is not None and not scale.any():
                scale.fill_(1.0)
        norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                 and m.track_running_stats]
        sums: dict[Any, list] = {}

        def use_batch_statistics(norm, inputs):
            x = inputs[0].float()
            axes = [0] + list(range(2, x.dim()))
            mean = x.mean(axes)
            var = x.var(axes, unbiased=False) if x.numel() > x.shape[1] else torch.ones_like(mean)
            norm.running_mean.copy_(mean)
            norm.running_var.copy_(var)
            total = sums.setdefault(norm, [torch.zeros_like(mean), torch.zeros_like(var)])
            total[0] += mean
            total[1] += var

        hooks = [norm.register_forward_pre_hook(use_batch_statistics) for norm in norms]
        try:
            for _ in range(CALIBRATION_BATCHES if norms else 0):
                module(*[torch.randn(a.shape, generator=generator) if a.is_floating_point() else a for a in args])
        finally:
            for hook in hooks:
                hook.remove()
        for norm, (mean, var) in sums.items():
            norm.running_mean.copy_(mean / CALIBRATION_BATCHES)
            norm.running_var.copy_(var / CALIBRATION_BATCHES)


def _export_torch(spec: Spec, path: Path) -> dict[str, Any]:
    """Export spec's module to `path` (one file, no external data); returns the torch outputs."""
    import onnx
    import torch
    torch.manual_seed(SEED)
    module, inputs, output_names = spec.build()
    args = tuple(inputs.values())
    exercise_random_weights(module, args)
    with torch.no_grad():
        expected = module(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    raw = path.with_suffix(".raw.onnx")
    if spec.exporter == TORCHSCRIPT:
        torch.onnx.export(module, args, str(raw), dynamo=False, opset_version=spec.opset,
                          input_names=list(inputs), output_names=output_names, do_constant_folding=True)
    else:
        program = torch.onnx.export(module, args, dynamo=True, opset_version=spec.opset,
                                    input_names=list(inputs), output_names=output_names)
        program.save(str(raw), external_data=False)
    model = onnx.load(str(raw))  # pulls in any external data, so the saved model is one file
    onnx.save(model, str(path))
    for leftover in raw.parent.glob(raw.name + "*"):
        leftover.unlink()
    raw.unlink(missing_ok=True)
    return {"inputs": {k: v.numpy() for k, v in inputs.items()},
            "torch_outputs": {n: t.detach().numpy() for n, t in zip(output_names, expected)}}


def _export_ultralytics(spec: Spec, path: Path) -> dict[str, Any]:
    """Build spec's YOLO from its yaml (random init) and export it as a user would; the inputs
    are seeded, the reference comes from onnxruntime (YOLO.export runs its own copy of the model)."""
    import numpy as np
    import torch
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import RTDETR, YOLO
    torch.manual_seed(SEED)
    workdir = Path(tempfile.mkdtemp(prefix="wide_zoo_yolo_"))
    cwd = os.getcwd()
    try:
        os.chdir(workdir)
        model = (RTDETR if spec.yolo_yaml.startswith("rtdetr") else YOLO)(spec.yolo_yaml)
        produced = model.export(format="onnx", imgsz=spec.imgsz, opset=spec.opset, simplify=True,
                                               dynamic=False, batch=1)
        Path(produced).replace(path)
    finally:
        os.chdir(cwd)
    rng = np.random.default_rng(SEED)
    image = rng.random((1, 3, spec.imgsz, spec.imgsz), dtype=np.float32)  # ultralytics feeds 0..1 images
    return {"inputs": {"images": image}, "torch_outputs": {}}


def _describe(spec: Spec, onnx_path: Path, npz_path: Path, arrays: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The model's manifest entry, in the shape of ../shared/zoo/manifest.json."""
    import torch
    exporter = {
        TORCHSCRIPT: f"torch.onnx.export(dynamo=False, TorchScript exporter) torch {torch.__version__}",
        DYNAMO: f"torch.onnx.export(dynamo=True) torch {torch.__version__}",
        ULTRALYTICS: f"ultralytics YOLO.export(format='onnx', opset={spec.opset}, simplify=True) "
                     f"-> torch.onnx.export(dynamo=False) torch {torch.__version__} + onnxslim",
    }[spec.exporter]
    head = {
        "name": spec.name,
        "set": "wide",
        "family": spec.family,
        "file": onnx_path.name,
        "source": spec.source,
        "exporter": exporter,
        "exporter_kind": spec.exporter,
        "weights": (f"ultralytics' own random init (torch seed {SEED})" if spec.exporter == ULTRALYTICS else
                    f"the library's random init (torch seed {SEED}), all-zero matrices re-drawn, BatchNorm "
                    f"statistics from {CALIBRATION_BATCHES} seeded batches (exercise_random_weights)"),
    }

    def compare(outputs: list[str]) -> tuple[str, Any]:
        agreement = zoo_export.agreement(arrays["torch_outputs"].items(), arrays["ort_outputs"])
        return "torch_vs_onnxruntime", agreement or "not compared (the exporter ran its own copy of the model)"

    return zoo_export.describe(
        onnx_path, npz_path, arrays["ort_outputs"], seconds, head,
        f"seed {SEED}: float inputs standard normal (images in [0, 1) for ultralytics), "
        "token ids uniform over the vocabulary, attention masks with 4 padded positions", compare)


def export_one(spec: Spec, out: Path) -> dict[str, Any]:
    """Export, run onnxruntime, write NAME.onnx + NAME.npz atomically; the manifest entry."""
    export = _export_ultralytics if spec.exporter == ULTRALYTICS else _export_torch
    return zoo_export.export_one(spec.name, out, "wide_zoo_", lambda path: export(spec, path),
                                 lambda onnx_path, npz_path, arrays, seconds:
                                 _describe(spec, onnx_path, npz_path, arrays, seconds))


def _child(name: str, out: Path, result: Path) -> int:
    spec = next(s for s in SPECS if s.name == name)
    return zoo_export.child(lambda: export_one(spec, out), result)


# --------------------------------------------------------------------------- parent
def _environment() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    env = {"python": sys.version.split()[0]}
    for package in ("torch", "torchvision", "timm", "transformers", "ultralytics", "onnx", "onnxruntime",
                    "onnxscript", "onnxslim", "numpy"):
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = "not installed"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    zoo_export.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.list:
        for spec in SPECS:
            print(f"{spec.name:42s} {spec.family:28s} {spec.exporter:11s} opset {spec.opset}")
        return 0
    if args.out is None:
        parser.error("OUT is required")
    if args._child:
        return _child(args._child, args.out, args._result)

    wanted = zoo_export.wanted_names(args.only, SPECS)
    if wanted is None:
        return 2
    return zoo_export.run_children(
        args, SPECS, wanted, __file__, "wide_zoo_", python=lambda spec: sys.executable,
        kind=lambda spec: spec.exporter, summary=lambda spec: f"{spec.exporter}, opset {spec.opset}, ",
        write_manifest=lambda entries, failures: _write_manifest(args.out, entries, failures))


def _write_manifest(out: Path, entries: dict[str, Any], failures: dict[str, Any]) -> None:
    zoo_export.write_manifest(
        out, SPECS, entries, failures, "wide",
        "Architectures rkcompile was not tuned on, exported by torchvision, timm, transformers, "
        "torch and ultralytics with seeded random weights (tools/make_wide_zoo.py); each with a "
        "reference input and onnxruntime output in NAME.npz", _environment())


if __name__ == "__main__":
    sys.exit(main())
