"""Adapters of the vision (and contrastive text+vision) encoders: ViT, DeiT, CLIP, SigLIP.

Heads see the patch tokens plus the class token (ViT, CLIP vision), plus a distillation token (DeiT), or patches
only (SigLIP); the head structure is the same as in text encoders: `q_proj/k_proj/v_proj` rows and the output
projection's columns, head-major, reshaped with `view(..., -1, d)`, so a site with no heads runs as is.

CLIP and SigLIP hold two towers. Every attention module of both towers is a site (kind `self`); the text tower's
sites are `text_model.encoder.layers.i.self_attn`, the vision tower's `vision_model.encoder.layers.i.self_attn`,
and each site's original head count comes from its own tower's config. SigLIP's vision pooling head
(`vision_model.head`, a `torch.nn.MultiheadAttention` with one learned query) is not a site: torch computes its
output projection inside `multi_head_attention_forward` without calling the projection module, so no hook can see
its heads; it is left untouched.
"""

from __future__ import annotations

import dataclasses

from prunetrain.engine.families.core import FeedForward, LinearAttentionAdapter, register


@register
class ViTAdapter(LinearAttentionAdapter):
    """ViT and DeiT: `encoder.layer.i.attention` with `q_proj/k_proj/v_proj/o_proj`."""

    name = "vit"
    model_types = ("vit", "deit")
    ffn = FeedForward(("ViTMLP", "DeiTMLP"), up=("fc1",), down="fc2")
    module_classes = ("ViTAttention", "DeiTAttention")
    out = "o_proj"
    count_attrs = ("num_attention_heads",)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


class _TwoTowerAdapter(LinearAttentionAdapter):
    """CLIP-style attention (`q_proj/k_proj/v_proj/out_proj`, `num_heads`) in one or two towers."""

    count_attrs = ("num_heads",)

    def original_num_heads(self, model, kind):
        return 0  # a placeholder: sites() puts in the count of each site's own tower

    def sites(self, model):
        # each attention module holds its tower's config (text or vision), whose head count is the original one
        return [dataclasses.replace(site, info=dataclasses.replace(
                    site.info, original_num_heads=site.module.config.num_attention_heads))
                for site in super().sites(model)]


@register
class CLIPAdapter(_TwoTowerAdapter):
    """CLIP (`CLIPModel` and the single towers): text and vision encoders, `self_attn` in every layer."""

    name = "clip"
    model_types = ("clip", "clip_text_model", "clip_vision_model")
    ffn = FeedForward(("CLIPMLP",), up=("fc1",), down="fc2")
    module_classes = ("CLIPAttention",)


@register
class SiglipAdapter(_TwoTowerAdapter):
    """SigLIP (`SiglipModel` and the single towers); the vision pooling head is not a site (see the module)."""

    name = "siglip"
    model_types = ("siglip", "siglip_text_model", "siglip_vision_model")
    ffn = FeedForward(("SiglipMLP",), up=("fc1",), down="fc2")
    module_classes = ("SiglipAttention",)
