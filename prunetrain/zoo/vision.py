"""Zoo entries of the vision and contrastive families: ViT, DeiT, CLIP (text + vision), SigLIP (text + vision).

Tiny configs: 16×16 images in 4×4 patches (16 patch tokens, plus the class token in ViT/CLIP and the class and
distillation tokens in DeiT), width 32, 2 layers, 4 heads of 8, no dropout.
"""

from __future__ import annotations

import torch

from prunetrain.zoo.architectures import VOCAB, Architecture, register_architecture

IMAGE, PATCH, LABELS = 16, 4, 3
_TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              attention_dropout=0.0)


def _vit_like(cls_name):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(image_size=IMAGE, patch_size=PATCH, num_channels=3, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, qkv_bias=True,
                                     num_labels=LABELS)
    return make


def _two_towers(cls_name):
    def make():
        import transformers as tf

        text = dict(vocab_size=VOCAB, max_position_embeddings=16, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                    **_TOWER)
        vision = dict(image_size=IMAGE, patch_size=PATCH, num_channels=3, **_TOWER)
        extra = dict(projection_dim=16) if cls_name == "CLIPConfig" else {}
        return getattr(tf, cls_name)(text_config=text, vision_config=vision, **extra)
    return make


def _pixels(batch: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(batch, 3, IMAGE, IMAGE, generator=gen)


def image_inputs(batch: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random images and class labels (`length` is unused: the number of patches is fixed by the config)."""
    gen = torch.Generator().manual_seed(seed)
    return {"pixel_values": _pixels(batch, gen), "labels": torch.randint(0, LABELS, (batch,), generator=gen)}


def image_text_inputs(batch: int = 2, length: int = 7, seed: int = 0) -> dict:
    """Captions (padding in the second row) and images; `return_loss=True` gives the contrastive loss."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, -2:] = 0
        ids[1, -2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": _pixels(batch, gen), "return_loss": True}


for _arch in (
    Architecture("vit", "vit", _vit_like("ViTConfig"), "ViTForImageClassification", "image-classification",
                 "vision encoder: heads see 16 patches + class token", make_inputs=image_inputs),
    Architecture("deit", "deit", _vit_like("DeiTConfig"), "DeiTForImageClassification", "image-classification",
                 "vision encoder: patches + class + distillation tokens", make_inputs=image_inputs),
    Architecture("clip", "clip", _two_towers("CLIPConfig"), "CLIPModel", "contrastive",
                 "two towers (text + vision), one site per attention module of each",
                 note="each tower's sites take their head count from its config; contrastive batches have no "
                      "`labels`: give `head_importance` a `loss_fn`", make_inputs=image_text_inputs),
    Architecture("siglip", "siglip", _two_towers("SiglipConfig"), "SiglipModel", "contrastive",
                 "two towers (text + vision), sigmoid contrastive loss",
                 note="the vision pooling head (torch `nn.MultiheadAttention`) is not a site and is left untouched; "
                      "importance as for CLIP",
                 make_inputs=image_text_inputs),
):
    register_architecture(_arch)
