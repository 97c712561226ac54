"""The head engine directly on fairseq models: `wrap_fairseq(model)` is an `nn.Module` view that `find_heads`,
`HeadMask`, `head_importance` and `shrink` accept (its `FairseqAdapter` hooks fairseq's own
`MultiheadAttention.out_proj`), and `fairseq_importance` scores heads from fairseq samples."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Iterable, Mapping

import torch
from torch import nn

from prunetrain.engine.families import FeedForward, LinearAttentionAdapter, register
from prunetrain.engine.families.core import ENCODER_DECODER_FFN_WIDTH
from prunetrain.engine.families.core import define_subclass, switch_class

FAIRSEQ_MODEL_TYPE = "fairseq_transformer"
_CONFIG_ATTR = "_prunetrain_head_config"


class FairseqHeadConfig(SimpleNamespace):
    """The little `config` prunetrain's engine reads (`model_type`, `is_encoder_decoder`, head counts, FFN widths);
    `shrink` records the kept heads and neurons on it like on a transformers config."""


class FairseqTransformer(nn.Module):
    """A view of a fairseq encoder-decoder model that prunetrain's engine accepts (`find_heads`, `HeadMask`,
    `head_importance`, `shrink`, ...). It *shares* the fairseq model's modules (as `.model`): masks attached to the
    view hook fairseq's own `out_proj` modules and act in `fairseq_model(...)`, `SequenceGenerator` and training;
    `shrink(view, mask)` shrinks the fairseq model in place. `forward` is fairseq's.

    Site names are `model.encoder.layers.{i}.self_attn`, `model.decoder.layers.{i}.self_attn` and
    `model.decoder.layers.{i}.encoder_attn`, the names of the same sites in the imported FSMT model.
    """

    def __init__(self, fairseq_model: nn.Module):
        super().__init__()
        encoder, decoder = getattr(fairseq_model, "encoder", None), getattr(fairseq_model, "decoder", None)
        if encoder is None or decoder is None or not hasattr(encoder, "layers") or not hasattr(decoder, "layers"):
            raise ValueError(f"model: {type(fairseq_model).__name__} is not a fairseq encoder-decoder Transformer "
                             f"(expected .encoder.layers and .decoder.layers, as fairseq's TransformerModel has).")
        self.model = fairseq_model
        attentions = [m for m in fairseq_model.modules() if _is_fairseq_attention(m)]
        if not attentions:
            raise ValueError(f"model: {type(fairseq_model).__name__} has no fairseq MultiheadAttention modules.")
        for module in attentions:
            # fairseq's fast path (F.multi_head_attention_forward) reads out_proj.weight directly, so hooks on
            # out_proj would not fire there, and it cannot run with fewer heads; this flag selects fairseq's own
            # Python path (the one fairseq's head pruning uses).
            if hasattr(module, "skip_embed_dim_check"):
                module.skip_embed_dim_check = True
        enc_heads = [m.num_heads for m in encoder.modules() if _is_fairseq_attention(m)]
        dec_heads = [m.num_heads for m in decoder.modules() if _is_fairseq_attention(m)]
        enc_ffn = [layer.fc1.out_features for layer in encoder.layers if hasattr(layer, "fc1")]
        dec_ffn = [layer.fc1.out_features for layer in decoder.layers if hasattr(layer, "fc1")]
        args = getattr(fairseq_model, "args", None) or getattr(fairseq_model, "cfg", None)
        config = fairseq_model.__dict__.get(_CONFIG_ATTR)
        if config is None:  # kept on the fairseq model, so that every view shares shrink's record of kept heads
            config = FairseqHeadConfig(
                model_type=FAIRSEQ_MODEL_TYPE,
                is_encoder_decoder=True,
                encoder_attention_heads=int(getattr(args, "encoder_attention_heads", None)
                                            or max(enc_heads, default=0)),
                decoder_attention_heads=int(getattr(args, "decoder_attention_heads", None)
                                            or max(dec_heads, default=0)),
                encoder_ffn_dim=int(getattr(args, "encoder_ffn_embed_dim", None) or max(enc_ffn, default=0)),
                decoder_ffn_dim=int(getattr(args, "decoder_ffn_embed_dim", None) or max(dec_ffn, default=0)),
            )
            fairseq_model.__dict__[_CONFIG_ATTR] = config
        self.config = config

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _is_fairseq_attention(module: nn.Module) -> bool:
    """fairseq's `MultiheadAttention` (or our empty form of it); torch's own `nn.MultiheadAttention` is not."""
    cls = type(module)
    return cls.__name__ in FairseqAdapter.module_classes and any(
        c.__module__.startswith("fairseq.") for c in cls.__mro__)


def wrap_fairseq(fairseq_model: nn.Module) -> FairseqTransformer:
    """The engine view of a fairseq Transformer (see `FairseqTransformer`); cheap, shares every module."""
    if isinstance(fairseq_model, FairseqTransformer):
        return fairseq_model
    return FairseqTransformer(fairseq_model)


def _empty_forward(self, query, key=None, value=None, *args, **kwargs):
    """Every head removed: the site adds only its output-projection bias (`out_proj` of a `[T, B, 0]` input, so
    hooks on `out_proj` still run). Nothing is cached; the inherited incremental-state methods see empty buffers."""
    tgt_len, bsz, _ = query.size()  # fairseq is time-first: [T, B, E]
    return self.out_proj(query.new_zeros(tgt_len, bsz, 0)), None


def _multihead_attention() -> type:
    from fairseq.modules.multihead_attention import MultiheadAttention

    return MultiheadAttention


EMPTY_FAIRSEQ = define_subclass("EmptyFairseqAttention", _multihead_attention, forward=_empty_forward)
"""`EmptyFairseqAttention`: fairseq's `MultiheadAttention` for a site with no heads left (fairseq's forward cannot
reshape zero heads), declared with the engine's one class-switch mechanism (`prunetrain.engine.families.core`);
built lazily because fairseq is optional, and resolvable by name for pickles."""


@register
class FairseqAdapter(LinearAttentionAdapter):
    """fairseq's `MultiheadAttention` (via `wrap_fairseq`): `q_proj/k_proj/v_proj/out_proj`, reshapes with
    `num_heads`, output width `embed_dim` (both updated on shrink, as fairseq's own head pruning does)."""

    name = "fairseq"
    model_types = (FAIRSEQ_MODEL_TYPE,)
    time_first = True
    module_classes = ("MultiheadAttention", "EmptyFairseqAttention")
    count_attrs = ("num_heads",)
    width_attrs = ("embed_dim",)
    ffn = FeedForward(("TransformerEncoderLayerBase", "TransformerDecoderLayerBase"), up=("fc1",), down="fc2",
                      width=ENCODER_DECODER_FFN_WIDTH)  # fc1 → activation → dropout → fc2, element-wise between

    def sites(self, model):
        return [s for s in super().sites(model) if _is_fairseq_attention(s.module)]

    def original_num_heads(self, model, kind):
        c = model.config
        return c.encoder_attention_heads if kind == "encoder_self" else c.decoder_attention_heads

    def remove_heads(self, site, keep, select):
        super().remove_heads(site, keep, select)
        if len(keep) == 0:
            # fairseq's MultiheadAttention cannot reshape zero heads (`view(-1, 0, d)`): same object, new class
            switch_class(site.module, EMPTY_FAIRSEQ)


def fairseq_loss(model: nn.Module, sample: Mapping) -> tuple[torch.Tensor, float]:
    """`(mean token NLL, number of target tokens)` of a fairseq translation sample: the unsmoothed cross-entropy over
    non-pad targets (the loss an imported model's `labels` give). Usable as `loss_fn` of `prunetrain.methods.importance`."""
    net = model.model if isinstance(model, FairseqTransformer) else model
    device = next(net.parameters()).device
    net_input = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["net_input"].items()}
    target = sample["target"].to(device)
    pad = net.decoder.dictionary.pad() if hasattr(net.decoder, "dictionary") else 1
    output = net(**net_input)
    lprobs = net.get_normalized_probs(output, log_probs=True)
    n = int(target.ne(pad).sum())
    loss = nn.functional.nll_loss(lprobs.reshape(-1, lprobs.size(-1)).float(), target.reshape(-1),
                                  ignore_index=pad, reduction="sum")
    return loss / max(n, 1), float(n)


def fairseq_importance(fairseq_model: nn.Module, samples: Iterable[Mapping], **options):
    """Michel et al. (2019) head importance of a fairseq Transformer from fairseq samples (`net_input` + `target`),
    computed by `prunetrain.importance.head_importance` through hooks on fairseq's `out_proj` modules.

    `options` are `head_importance`'s (`normalize`, `reduction`, `max_batches`, `autocast`, ...); `per="example"` is
    refused because fairseq's attention is time-first. Returns `HeadScores` whose site names equal the imported FSMT
    model's, so they compare (and select masks) directly.
    """
    from prunetrain.methods.importance import head_importance

    if options.get("per", "batch") != "batch":
        raise ValueError(f"per: {options['per']!r} is not supported for fairseq models (time-first attention); "
                         f"use per='batch'.")
    options.pop("per", None)
    loss_fn = options.pop("loss_fn", fairseq_loss)
    return head_importance(wrap_fairseq(fairseq_model), samples, loss_fn=loss_fn, per="batch", **options)


__all__ = ["EMPTY_FAIRSEQ", "FAIRSEQ_MODEL_TYPE", "FairseqAdapter", "FairseqHeadConfig", "FairseqTransformer",
           "fairseq_importance", "fairseq_loss", "wrap_fairseq"]
