"""FSMT (fairseq's Transformer ported to transformers, `model_type="fsmt"`): adapter and its prunable attention.

FSMT's attention is time-first (`[T, B, E]`), receives its KV cache as `layer_state`, and reshapes its output with
the *input* width (`view(tgt_len, bsz, embed_dim)`), which only works with every head present. A shrunk FSMT site
therefore switches class (the one mechanism, see `prunetrain.engine.families.core`) to `PrunableFSMTAttention`,
whose forward is the same computation written per head for any number of heads, zero included.
"""

from __future__ import annotations

import torch
from torch import nn

from prunetrain.engine.families.core import (ENCODER_DECODER_FFN_WIDTH, FeedForward, LinearAttentionAdapter,
                                             define_subclass, register, switch_class)
from prunetrain.engine.heads import AttentionSite


def _cache_for(module: nn.Module, layer_state):
    from transformers.cache_utils import EncoderDecoderCache

    if isinstance(layer_state, EncoderDecoderCache):
        is_updated = layer_state.is_updated.get(module.layer_idx)
        cache = layer_state.cross_attention_cache if module.encoder_decoder_attention \
            else layer_state.self_attention_cache
        return cache, is_updated
    return layer_state, False


def _prunable_fsmt_forward(self, query, key, key_padding_mask=None, layer_state=None, attn_mask=None,
                           output_attentions=False, **kwargs):
    """FSMT's attention for any number of heads H (zero included), written per head: `[B, H, T, d]`."""
    tgt_len, bsz, _ = query.size()  # FSMT is time-first: [T, B, E]
    h, d = self.num_heads, self.head_dim
    cache, is_updated = _cache_for(self, layer_state) if layer_state is not None else (None, False)
    current = key if self.encoder_decoder_attention else query
    if self.encoder_decoder_attention and cache is not None and is_updated:
        keys, values = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
    else:
        src = current.size(0)
        keys = self.k_proj(current).view(src, bsz, h, d).permute(1, 2, 0, 3)  # [B, H, S, d]
        values = self.v_proj(current).view(src, bsz, h, d).permute(1, 2, 0, 3)
        if cache is not None:  # also with H = 0: cached generation reads positions from the cache length
            keys, values = cache.update(keys, values, self.layer_idx)
            if self.encoder_decoder_attention:
                layer_state.is_updated[self.layer_idx] = True
    q = (self.q_proj(query) * self.scaling).view(tgt_len, bsz, h, d).permute(1, 2, 0, 3)  # [B, H, T, d]
    weights = q @ keys.transpose(-1, -2)  # [B, H, T, S]
    if attn_mask is not None:
        weights = weights + attn_mask
    if key_padding_mask is not None and key_padding_mask.dim() != 0:
        weights = weights.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(weights.dtype).min)
    weights = nn.functional.softmax(weights, dim=-1)
    probs = nn.functional.dropout(weights, p=self.dropout, training=self.training)
    heads = (probs @ values).permute(2, 0, 1, 3).reshape(tgt_len, bsz, h * d)  # [T, B, H*d], head-major
    return self.out_proj(heads), (weights if output_attentions else None)


def _fsmt_attention() -> type:
    from transformers.models.fsmt.modeling_fsmt import Attention

    return Attention


PRUNABLE_FSMT = define_subclass("PrunableFSMTAttention", _fsmt_attention, forward=_prunable_fsmt_forward)
"""`PrunableFSMTAttention`: FSMT's `Attention` with any number of heads, zero included (what `shrink` turns a pruned
FSMT site into). With no heads the site outputs only its output-projection bias and still records empty keys/values in
the cache, so cached generation keeps its positions."""


def __getattr__(name: str):
    if name == PRUNABLE_FSMT:  # pickles name the class here
        from prunetrain.engine.families.core import declared_subclass

        return declared_subclass(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@register
class FSMTAdapter(LinearAttentionAdapter):
    """FSMT: `self_attn` / `encoder_attn` with `q_proj/k_proj/v_proj/out_proj`.

    FSMT reshapes with `self.num_heads` (updated on shrink) and its output with the input width, so a shrunk
    site becomes a `PrunableFSMTAttention`. Its attention is time-first: the output projection's input is
    `[T, B, H*d]`, head-major in the last axis, which is all `HeadMask` needs.
    """

    name = "fsmt"
    model_types = ("fsmt",)
    ffn = FeedForward(("EncoderLayer", "DecoderLayer"), up=("fc1",), down="fc2",
                      width=ENCODER_DECODER_FFN_WIDTH)
    module_classes = ("Attention",)
    count_attrs = ("num_heads",)
    time_first = True
    cache_kwargs = ("layer_state",)

    def original_num_heads(self, model, kind):
        c = model.config
        return c.encoder_attention_heads if kind == "encoder_self" else c.decoder_attention_heads

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        super().remove_heads(site, keep, select)
        switch_class(site.module, PRUNABLE_FSMT)
