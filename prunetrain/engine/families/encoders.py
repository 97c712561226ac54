"""Adapters of the encoder families: DistilBERT, XLM-RoBERTa, ELECTRA, ALBERT, DeBERTa-v2/v3, ModernBERT.

- DistilBERT, XLM-RoBERTa, ELECTRA: four `nn.Linear` projections, head-major, reshaped with `view(..., -1, d)`; only
  module names differ from BERT.
- ALBERT: one attention module is *shared* by every layer of a layer group (`num_hidden_groups` groups; 1 in the
  released models, so one module serves all layers). A site is a shared module, not a layer: its mask applies in
  every layer that runs the module, its importance sums over them, and `shrink` removes the head from every such
  layer at once. Masked == shrunk stays exact because both act on the same module; what cannot be expressed is a
  different mask per layer of one shared module (that would need unsharing the weights, which ALBERT is not).
- DeBERTa-v2/v3 (disentangled attention): besides q/k/v, the relative-position projections carry the head structure
  (`pos_key_proj` for content→position, `pos_query_proj` for position→content; v3 shares them with `key_proj` /
  `query_proj`, `share_att_key=True`). They are sliced with the same head rows as the query/key projections, so
  every kept head keeps its own c2p/p2c terms. Per head, He et al. (2021, eq. 4) score
  Ã_ij = Q^c_i K^c_j⊤ + Q^c_i K^r_δ(i,j)⊤ + K^c_j Q^r_δ(j,i)⊤, with K^r = P W^{k,r} and Q^r = P W^{q,r} from the
  shared relative embeddings P: each term uses only that head's rows of the five projections. The scale 1/√(3d)
  depends on head_dim only, so it is unchanged.
- ModernBERT: fused `Wqkv` (rows q | k | v, each head-major), output `Wo`, rotary positions, alternating
  global/sliding-window layers; rows of the three blocks are sliced together.
"""

from __future__ import annotations

import torch
from torch import nn

from prunetrain.engine.families.classic import BertAdapter
from prunetrain.engine.families.core import (FeedForward, LinearAttentionAdapter, _get, define_headless, head_rows, register,
                                             select_linear_in, select_linear_out, switch_class)
from prunetrain.engine.heads import AttentionSite


@register
class DistilBertAdapter(LinearAttentionAdapter):
    """DistilBERT: `transformer.layer.i.attention` with `q_lin/k_lin/v_lin/out_lin`."""

    name = "distilbert"
    model_types = ("distilbert",)
    ffn = FeedForward(("FFN",), up=("lin1",), down="lin2", width="hidden_dim")
    module_classes = ("DistilBertSelfAttention",)
    q, k, v, out = "q_lin", "k_lin", "v_lin", "out_lin"
    head_dim_attr = "attention_head_size"
    count_attrs = ("n_heads",)

    def original_num_heads(self, model, kind):
        return model.config.n_heads


@register
class XLMRobertaAdapter(BertAdapter):
    """XLM-RoBERTa: the BERT layout (`self.query/key/value` + `output.dense`)."""

    name = "xlm-roberta"
    model_types = ("xlm-roberta",)
    ffn = FeedForward(("XLMRobertaLayer",), up=("intermediate.dense",), down="output.dense")
    module_classes = ("XLMRobertaAttention",)


@register
class ElectraAdapter(BertAdapter):
    """ELECTRA (discriminator and generator): the BERT layout."""

    name = "electra"
    model_types = ("electra",)
    ffn = FeedForward(("ElectraLayer",), up=("intermediate.dense",), down="output.dense")
    module_classes = ("ElectraAttention",)


@register
class AlbertAdapter(LinearAttentionAdapter):
    """ALBERT: one `AlbertAttention` per layer group, shared by every layer of the group (see the module docstring).

    Site `albert.encoder.albert_layer_groups.g.albert_layers.i.attention` is one shared module; its `layer` is the
    group index g. A mask (and `shrink`) on it applies in each of the `num_hidden_layers / num_hidden_groups` layers
    that run it.
    """

    name = "albert"
    model_types = ("albert",)
    ffn = FeedForward(("AlbertLayer",), up=("ffn",), down="ffn_output")
    module_classes = ("AlbertAttention",)
    q, k, v, out = "query", "key", "value", "dense"
    head_dim_attr = "attention_head_size"
    count_attrs = ("num_attention_heads",)
    width_attrs = ("all_head_size",)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


# ---------------------------------------------------------------------------------------------------------------------
# DeBERTa-v2 / v3
# ---------------------------------------------------------------------------------------------------------------------
def _deberta_self_attention() -> type:
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    return DisentangledSelfAttention


HEADLESS_DEBERTA = define_headless("HeadlessDisentangledSelfAttention", _deberta_self_attention, out=None,
                                   head_dim="attention_head_size")
"""DeBERTa-v2's `DisentangledSelfAttention` with every head removed: its `transpose_for_scores` cannot view an empty
tensor and it divides by the head count, so it returns the empty context `[B, T, 0]` (the engine's head-less forward
with no projection of its own); the site's output projection `attention.output.dense` then adds only its bias."""


@register
class DebertaV2Adapter(LinearAttentionAdapter):
    """DeBERTa-v2 and v3: `encoder.layer.i.attention` (`self.query_proj/key_proj/value_proj`, `output.dense`).

    Relative-position projections (`self.pos_key_proj`, `self.pos_query_proj`, present when `share_att_key=False`)
    are sliced with the same head rows as the content projections; with `share_att_key=True` (v3) the content
    projections serve both, so slicing them is enough. A site with no heads switches its inner attention to
    `HeadlessDisentangledSelfAttention`.
    """

    name = "deberta-v2"
    model_types = ("deberta-v2",)
    ffn = FeedForward(("DebertaV2Layer",), up=("intermediate.dense",), down="output.dense")
    module_classes = ("DebertaV2Attention",)
    q, k, v, out = "self.query_proj", "self.key_proj", "self.value_proj", "output.dense"
    head_dim_attr = "self.attention_head_size"
    count_attrs = ("self.num_attention_heads",)
    width_attrs = ("self.all_head_size",)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    @staticmethod
    def position_projections(attention: nn.Module) -> list[str]:
        """The separate relative-position projections this `DisentangledSelfAttention` holds, from its own flags
        (content→position reads `pos_key_proj`, position→content `pos_query_proj`); a missing one is an error."""
        if not attention.relative_attention or attention.share_att_key:
            return []
        terms = {"c2p": "pos_key_proj", "p2c": "pos_query_proj"}
        return [terms[t] for t in ("c2p", "p2c") if t in attention.pos_att_type]

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        rows = head_rows(keep, site.info.head_dim)
        attention = site.module.self
        for path in self.position_projections(attention):
            select_linear_out(_get(attention, path), rows, select)
        super().remove_heads(site, keep, select)
        if len(keep) == 0:
            switch_class(site.module.self, HEADLESS_DEBERTA)


# ---------------------------------------------------------------------------------------------------------------------
# ModernBERT
# ---------------------------------------------------------------------------------------------------------------------
@register
class ModernBertAdapter(LinearAttentionAdapter):
    """ModernBERT: `layers.i.attn` with a fused `Wqkv` (`nn.Linear`, rows q | k | v, each `[H * d]` head-major),
    reshaped as `view(..., 3, -1, d)`, and output projection `Wo`. The module keeps no head count."""

    name = "modernbert"
    model_types = ("modernbert",)
    ffn = FeedForward(("ModernBertMLP",), up=("Wi",), down="Wo", fused=2)
    module_classes = ("ModernBertAttention",)
    out = "Wo"

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def head_counts(self, module: nn.Module, head_dim: int) -> tuple[int, int]:
        heads = module.Wo.weight.shape[1] // head_dim
        return heads, heads

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        d, width = site.info.head_dim, site.info.num_heads * site.info.head_dim
        rows = head_rows(keep, d)
        select_linear_out(site.module.Wqkv, torch.cat([rows, rows + width, rows + 2 * width]), select)
        select_linear_in(site.module.Wo, rows, select)
