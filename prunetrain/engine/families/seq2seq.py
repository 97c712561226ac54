"""Adapters of the encoder–decoder families: mBART, M2M-100 (NLLB), Pegasus, mT5, Whisper.

- mBART, M2M-100 (NLLB-200 checkpoints are `m2m_100`), Pegasus: the BART layout (`self_attn` / `encoder_attn` with
  `q_proj/k_proj/v_proj/out_proj`), reshaped with `view(..., -1, d)`, so a site with no heads runs as is.
- mT5: the T5 layout, including the relative position bias computed once per stack with one row per *original*
  head (the T5 adapter's bias selection is reused).
- Whisper: an audio encoder (inputs are log-mel `input_features`) and a text decoder with cross attention. Its
  attention reshapes keys/values with its own `num_heads` (`view(B, -1, num_heads, d)`), which cannot infer a length
  from an empty tensor, so a site with no heads switches to `HeadlessWhisperAttention` (the engine's head-less
  forward: only the output projection's bias; a decoder self-attention site still writes empty keys/values to the
  cache, a cross-attention site writes nothing).
"""

from __future__ import annotations

import torch

from prunetrain.engine.families.classic import T5Adapter
from prunetrain.engine.families.core import (CACHE_KWARGS, ENCODER_DECODER_FFN_WIDTH, FeedForward,
                                             LinearAttentionAdapter, define_headless, define_subclass,
                                             headless_forward, register, switch_class)
from prunetrain.engine.heads import AttentionSite


class _EncoderDecoderAdapter(LinearAttentionAdapter):
    """BART-style attention: `q_proj/k_proj/v_proj/out_proj`, head count in `num_heads`."""

    count_attrs = ("num_heads",)

    def original_num_heads(self, model, kind):
        c = model.config
        return c.encoder_attention_heads if kind == "encoder_self" else c.decoder_attention_heads


def _layer_ffn(prefix: str) -> FeedForward:
    """The FFN of BART-style layers (`fc1` → `fc2` inside `<prefix>EncoderLayer` / `<prefix>DecoderLayer`)."""
    return FeedForward((f"{prefix}EncoderLayer", f"{prefix}DecoderLayer"), up=("fc1",), down="fc2",
                       width=ENCODER_DECODER_FFN_WIDTH)


@register
class MBartAdapter(_EncoderDecoderAdapter):
    """mBART (and mBART-50): pre-norm BART."""

    name = "mbart"
    model_types = ("mbart",)
    ffn = _layer_ffn("MBart")
    module_classes = ("MBartAttention",)


@register
class M2M100Adapter(_EncoderDecoderAdapter):
    """M2M-100 and NLLB-200 (`model_type="m2m_100"`): sinusoidal positions, BART-style attention."""

    name = "m2m-100"
    model_types = ("m2m_100",)
    ffn = _layer_ffn("M2M100")
    module_classes = ("M2M100Attention",)


@register
class PegasusAdapter(_EncoderDecoderAdapter):
    """Pegasus: BART-style attention, sinusoidal positions."""

    name = "pegasus"
    model_types = ("pegasus",)
    ffn = _layer_ffn("Pegasus")
    module_classes = ("PegasusAttention",)


@register
class MT5Adapter(T5Adapter):
    """mT5: the T5 layout (`q/k/v/o`, shared relative position bias; gated-GELU feed-forward, untied head)."""

    name = "mt5"
    model_types = ("mt5",)
    ffn = (FeedForward(("MT5DenseActDense",), up=("wi",), down="wo", width="d_ff"),
           FeedForward(("MT5DenseGatedActDense",), up=("wi_0", "wi_1"), down="wo", width="d_ff"))
    module_classes = ("MT5Attention",)


def _whisper_attention() -> type:
    from transformers.models.whisper.modeling_whisper import WhisperAttention

    return WhisperAttention


HEADLESS_WHISPER = define_headless("HeadlessWhisperAttention", _whisper_attention, out="out_proj",
                                   head_dim="head_dim")
"""Whisper self-attention with every head removed (its `view(B, -1, 0, d)` cannot run on an empty tensor): the output
projection's bias; a decoder site still writes empty keys/values to the cache, so positions keep counting."""

HEADLESS_WHISPER_CROSS = define_subclass("HeadlessWhisperCrossAttention", _whisper_attention, forward=headless_forward,
                                         _pt_out="out_proj", _pt_head_dim="head_dim",
                                         _pt_cache_kwargs=CACHE_KWARGS, _pt_time_first=False, _pt_post=None,
                                         _pt_cross=True)
"""Whisper cross attention with every head removed: the output projection's bias, and no cache entry (`_pt_cross`:
the decoder's self-attention cache is not this site's)."""


@register
class WhisperAdapter(_EncoderDecoderAdapter):
    """Whisper: `encoder.layers.i.self_attn` (audio frames), `decoder.layers.i.self_attn` / `encoder_attn`.

    The key projection has no bias (only its rows are sliced). A site with no heads becomes `HeadlessWhisperAttention`
    (`HeadlessWhisperCrossAttention` for cross attention, which leaves the decoder's self-attention cache alone).
    """

    name = "whisper"
    model_types = ("whisper",)
    ffn = _layer_ffn("Whisper")
    module_classes = ("WhisperAttention",)

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        super().remove_heads(site, keep, select)
        if len(keep) == 0:
            switch_class(site.module, HEADLESS_WHISPER_CROSS if site.info.kind == "cross" else HEADLESS_WHISPER)
