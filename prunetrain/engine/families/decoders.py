"""Adapters for decoder-only language models beyond Llama: separate q/k/v/o with grouped-query attention (Qwen3,
Gemma 2/3, Granite, OLMo 2, Mixtral, Qwen-MoE), fused projections (Phi-3 `qkv_proj`, GPT-NeoX `query_key_value`,
Falcon `query_key_value` in its three layouts) and OPT.

Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) have ordinary attention: only the attention modules are
sites, and shrink never touches an expert.
"""

from __future__ import annotations

import torch

from prunetrain.engine.families.core import (FeedForward, LinearAttentionAdapter, _get, define_headless,
                                             define_subclass, head_rows, register, select_linear_in,
                                             select_linear_out, switch_class)
from prunetrain.engine.heads import AttentionSite


def _attention_class(module: str, name: str):
    def load() -> type:
        import importlib

        return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    return load


class _Decoder(LinearAttentionAdapter):
    """Llama-style attention: `self_attn` with `q_proj/k_proj/v_proj/o_proj`, `head_dim` may differ from width / heads
    (Gemma, Qwen3), `num_key_value_groups` query heads per key/value head. Per-head q/k norms (Qwen3, Gemma 3) act on
    `head_dim` only and soft-capping / sliding windows act per logit, so slicing whole heads keeps them exact."""

    out = "o_proj"
    groups_attr = "num_key_value_groups"

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


@register
class Qwen3Adapter(_Decoder):
    """Qwen3 and Qwen3-MoE: per-head q/k RMSNorm over `head_dim`; head_dim independent of the width."""

    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe")
    ffn = FeedForward(("Qwen3MLP",), up=("gate_proj", "up_proj"), down="down_proj", width_attrs=("intermediate_size",))
    moe_model_types = ("qwen3_moe",)
    module_classes = ("Qwen3Attention", "Qwen3MoeAttention")


@register
class GemmaAdapter(_Decoder):
    """Gemma 2 (logit soft-capping, alternating sliding-window layers) and Gemma 3 text (q/k norms per head)."""

    name = "gemma"
    model_types = ("gemma", "gemma2", "gemma3_text")
    ffn = FeedForward(("GemmaMLP", "Gemma2MLP", "Gemma3MLP"), up=("gate_proj", "up_proj"), down="down_proj",
                      width_attrs=("intermediate_size",))
    module_classes = ("GemmaAttention", "Gemma2Attention", "Gemma3Attention")


@register
class LlamaLikeAdapter(_Decoder):
    """Other decoders with Llama's attention layout: OLMo (optional q/k/v clipping), StarCoder2 (biases, sliding
    window), SmolLM3 (layers without rotary), EXAONE 4 (per-head q/k norms, hybrid sliding window), GLM (partial
    rotary)."""

    name = "llama-like"
    model_types = ("olmo", "starcoder2", "smollm3", "exaone4", "glm")
    ffn = (FeedForward(("OlmoMLP", "SmolLM3MLP", "Exaone4MLP"), up=("gate_proj", "up_proj"), down="down_proj",
                       width_attrs=("intermediate_size",)),
           FeedForward(("Starcoder2MLP",), up=("c_fc",), down="c_proj"),
           FeedForward(("GlmMLP",), up=("gate_up_proj",), down="down_proj", fused=2))
    module_classes = ("OlmoAttention", "Starcoder2Attention", "SmolLM3Attention", "Exaone4Attention", "GlmAttention")


@register
class GraniteAdapter(_Decoder):
    """Granite: Llama layout with an `attention_multiplier` scaling."""

    name = "granite"
    model_types = ("granite",)
    ffn = FeedForward(("GraniteMLP",), up=("gate_proj", "up_proj"), down="down_proj",
                      width_attrs=("intermediate_size",))
    module_classes = ("GraniteAttention",)


@register
class MoEAdapter(_Decoder):
    """Mixtral and Qwen2-MoE: ordinary GQA attention; the experts are not sites and are never touched."""

    name = "moe"
    model_types = ("mixtral", "qwen2_moe")
    moe_model_types = ("mixtral", "qwen2_moe")
    module_classes = ("MixtralAttention", "Qwen2MoeAttention")


def _olmo2_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, cache=None,
                   **kwargs):
    """OLMo 2 attention after shrink: q/k are projected and normalised over the *full* width (the norms' statistics
    span all heads), then the kept heads' features (`_pt_q_rows`, `_pt_k_rows`) are selected; v and o are sliced."""
    from transformers.models.olmo2 import modeling_olmo2 as olmo2

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q_rows, k_rows = (torch.tensor(rows, dtype=torch.long, device=hidden_states.device)
                      for rows in (self._pt_q_rows, self._pt_k_rows))
    query = self.q_norm(self.q_proj(hidden_states)).index_select(-1, q_rows)
    key = self.k_norm(self.k_proj(hidden_states)).index_select(-1, k_rows)
    query, key, value = (x.view(hidden_shape).transpose(1, 2) for x in (query, key, self.v_proj(hidden_states)))
    cos, sin = position_embeddings
    query, key = olmo2.apply_rotary_pos_emb(query, key, cos, sin)
    cache = cache if cache is not None else past_key_values  # `cache` from transformers 5.24
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx)
    attention = olmo2.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                            olmo2.eager_attention_forward)
    out, weights = attention(self, query, key, value, attention_mask,
                             dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                             **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


PRUNABLE_OLMO2 = define_subclass("PrunableOlmo2Attention", _attention_class("olmo2", "Olmo2Attention"),
                                 forward=_olmo2_forward)


@register
class Olmo2Adapter(_Decoder):
    """OLMo 2: q/k RMSNorm over the *whole* query/key width (all heads at once), so slicing q/k rows would change
    the norm's statistics for the heads that stay. Shrink keeps `q_proj`/`k_proj` (and the norms) whole and selects
    the kept heads' features after the norm (`PrunableOlmo2Attention`): exact, and v/o projections, attention and
    the KV cache shrink; the q/k projections do not."""

    name = "olmo2"
    ffn = FeedForward(("Olmo2MLP",), up=("gate_proj", "up_proj"), down="down_proj", width_attrs=("intermediate_size",))
    model_types = ("olmo2",)
    module_classes = ("Olmo2Attention",)

    def head_counts(self, module, d):
        return module.o_proj.weight.shape[1] // d, module.v_proj.weight.shape[0] // d

    def remove_heads(self, site, keep, select):
        module, d = site.module, site.info.head_dim
        kv = self.kv_heads_kept(site, keep)
        q_rows, kv_rows = head_rows(keep, d), head_rows(kv, d)
        # feature indices into the full q/k width, as plain ints: no device (models may be built on "meta")
        full_q = getattr(module, "_pt_q_rows", tuple(range(module.q_proj.out_features)))
        full_k = getattr(module, "_pt_k_rows", tuple(range(module.k_proj.out_features)))
        module._pt_q_rows = tuple(full_q[i] for i in q_rows.tolist())
        module._pt_k_rows = tuple(full_k[i] for i in kv_rows.tolist())
        select_linear_out(module.v_proj, kv_rows, select)
        select_linear_in(module.o_proj, q_rows, select)
        self.set_counts(site, len(keep), len(kv))
        switch_class(module, PRUNABLE_OLMO2)


@register
class OPTAdapter(LinearAttentionAdapter):
    """OPT: `self_attn` with `q_proj/k_proj/v_proj/out_proj`, reshapes with `num_heads`. OPT's `view(B, -1, H, d)`
    cannot run with H = 0, so a site with no heads switches to `HeadlessOPTAttention`."""

    name = "opt"
    model_types = ("opt",)
    ffn = FeedForward(("OPTDecoderLayer",), up=("fc1",), down="fc2", width="ffn_dim")
    module_classes = ("OPTAttention",)
    count_attrs = ("num_heads",)
    headless_class = define_headless("HeadlessOPTAttention", _attention_class("opt", "OPTAttention"),
                                     out="out_proj", head_dim="head_dim")

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


def _phi3_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, cache=None,
                  **kwargs):
    """Phi-3 attention for any number of heads: the fused `qkv_proj` output is split with this module's own head
    counts (`num_heads`, `num_key_value_heads`) instead of the shared config's `num_attention_heads`."""
    from transformers.models.phi3 import modeling_phi3 as phi3

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    qkv = self.qkv_proj(hidden_states)
    q_width, kv_width = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
    query = qkv[..., :q_width].view(hidden_shape).transpose(1, 2)
    key = qkv[..., q_width:q_width + kv_width].view(hidden_shape).transpose(1, 2)
    value = qkv[..., q_width + kv_width:].view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query, key = phi3.apply_rotary_pos_emb(query, key, cos, sin)
    cache = cache if cache is not None else past_key_values  # `cache` from transformers 5.24
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx)
    attention = phi3.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                           phi3.eager_attention_forward)
    out, weights = attention(self, query, key, value, attention_mask,
                             dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                             sliding_window=getattr(self.config, "sliding_window", None), **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


PRUNABLE_PHI3 = define_subclass("PrunablePhi3Attention", _attention_class("phi3", "Phi3Attention"),
                                forward=_phi3_forward)


class _FusedAdapter(LinearAttentionAdapter):
    """Families with one fused q/k/v projection `fused`: subclasses give `fused_rows(site, keep, kv)`, the rows of
    the fused weight that stay."""

    fused: str = "query_key_value"

    def head_counts(self, module, head_dim):  # pragma: no cover - per family
        raise NotImplementedError

    def fused_rows(self, site: AttentionSite, keep: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover

    def remove_heads(self, site, keep, select):
        kv = self.kv_heads_kept(site, keep)
        select_linear_out(_get(site.module, self.fused), self.fused_rows(site, keep, kv), select)
        select_linear_in(_get(site.module, self.out), head_rows(keep, site.info.head_dim), select)
        self.set_counts(site, len(keep), len(kv))


@register
class Phi3Adapter(_FusedAdapter):
    """Phi-3: fused `qkv_proj` = [q (H·d) | k (H_kv·d) | v (H_kv·d)], GQA. A shrunk site switches to
    `PrunablePhi3Attention` (Phi-3's forward splits with the shared config's head count)."""

    name = "phi3"
    ffn = FeedForward(("Phi3MLP",), up=("gate_up_proj",), down="down_proj", fused=2)
    model_types = ("phi3",)
    module_classes = ("Phi3Attention",)
    fused, out = "qkv_proj", "o_proj"
    groups_attr = "num_key_value_groups"
    count_attrs = ("num_heads",)
    kv_count_attrs = ("num_key_value_heads",)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def head_counts(self, module, d):
        heads = module.o_proj.weight.shape[1] // d
        return heads, (module.qkv_proj.weight.shape[0] // d - heads) // 2

    def fused_rows(self, site, keep, kv):
        d, h, h_kv = site.info.head_dim, site.info.num_heads, site.info.num_kv_heads
        return torch.cat([head_rows(keep, d), h * d + head_rows(kv, d), (h + h_kv) * d + head_rows(kv, d)])

    def remove_heads(self, site, keep, select):
        super().remove_heads(site, keep, select)
        switch_class(site.module, PRUNABLE_PHI3)


@register
class GPTNeoXAdapter(_FusedAdapter):
    """GPT-NeoX / Pythia: fused `query_key_value` interleaved per head, rows `[H, 3 (q, k, v), d]`; `dense` out."""

    name = "gpt_neox"
    ffn = FeedForward(("GPTNeoXMLP",), up=("dense_h_to_4h",), down="dense_4h_to_h")
    model_types = ("gpt_neox",)
    module_classes = ("GPTNeoXAttention",)
    out = "dense"
    head_dim_attr = "head_size"

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def head_counts(self, module, d):
        heads = module.dense.weight.shape[1] // d
        return heads, heads

    def fused_rows(self, site, keep, kv):
        return head_rows(keep, 3 * site.info.head_dim)


@register
class GPTBigCodeAdapter(_FusedAdapter):
    """GPTBigCode / StarCoder: fused `c_attn`; multi-query `[q (H·d) | k (d) | v (d)]` (one key/value head shared by
    every query head, so heads go one by one) or, without multi-query, interleaved per head `[H, 3, d]`. Its
    multi-query forward cannot run with no query heads, so a site with none switches to
    `HeadlessGPTBigCodeAttention`."""

    name = "gpt_bigcode"
    ffn = FeedForward(("GPTBigCodeMLP",), up=("c_fc",), down="c_proj", width="n_inner",
                      default_width=lambda config: 4 * config.n_embd)
    model_types = ("gpt_bigcode",)
    module_classes = ("GPTBigCodeAttention",)
    fused, out = "c_attn", "c_proj"
    count_attrs = ("num_heads",)
    width_attrs = ("embed_dim",)
    kv_count_attrs = ("kv_heads",)
    groups_attr = "num_key_value_groups"
    cache_kwargs = ("layer_past",)
    headless_class = define_headless("HeadlessGPTBigCodeAttention",
                                     _attention_class("gpt_bigcode", "GPTBigCodeAttention"), out="c_proj",
                                     head_dim="head_dim", cache_kwargs=("layer_past",), post="resid_dropout")

    def sites(self, model):
        if getattr(model.config, "add_cross_attention", False):
            raise ValueError("model: GPTBigCode with add_cross_attention=True is not supported; only its "
                             "self-attention is.")
        return super().sites(model)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def head_counts(self, module, d):
        heads = module.c_proj.weight.shape[1] // d
        return heads, (1 if module.multi_query else heads)

    def fused_rows(self, site, keep, kv):
        d, h = site.info.head_dim, site.info.num_heads
        if site.module.multi_query:
            return torch.cat([head_rows(keep, d), h * d + torch.arange(2 * d)[:2 * d * len(kv)]])
        return head_rows(keep, 3 * d)

    def set_counts(self, site, heads, kv_heads):
        super().set_counts(site, heads, kv_heads)
        site.module.kv_dim = kv_heads * site.info.head_dim


@register
class FalconAdapter(_FusedAdapter):
    """Falcon, all three layouts of the fused `query_key_value`:

    - new decoder architecture (Falcon-40B/180B): per key/value group `[g query heads, k, v]`, rows
      `[H_kv, g + 2, d]`; GQA with `g = H / H_kv` (a single group reports group_size 1: its query heads go one by one);
    - multi-query (Falcon-7B): `[H query heads, k, v]`, one key/value head shared by all query heads;
    - classic multi-head: rows interleaved per head, `[H, 3, d]`.

    Falcon's forward divides by the head counts, so a site with no heads switches to `HeadlessFalconAttention`.
    ALiBi variants are refused by shrink (the model builds its ALiBi bias for the configured head count).
    """

    name = "falcon"
    ffn = FeedForward(("FalconMLP",), up=("dense_h_to_4h",), down="dense_4h_to_h", width="ffn_hidden_size",
                      default_width=lambda config: 4 * config.hidden_size)
    model_types = ("falcon",)
    module_classes = ("FalconAttention",)
    out = "dense"
    count_attrs = ("num_heads",)
    cache_kwargs = ("layer_past",)
    headless_class = define_headless("HeadlessFalconAttention", _attention_class("falcon", "FalconAttention"),
                                     out="dense", head_dim="head_dim", cache_kwargs=("layer_past",))

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def head_counts(self, module, d):
        heads = module.dense.weight.shape[1] // d
        return heads, (module.num_kv_heads if module.new_decoder_architecture else (1 if module.multi_query else heads))

    def group_size(self, module, num_heads, num_kv):
        return num_heads // num_kv if module.new_decoder_architecture and num_kv > 1 else 1

    def fused_rows(self, site, keep, kv):
        module, d = site.module, site.info.head_dim
        h, h_kv = site.info.num_heads, site.info.num_kv_heads
        if module.new_decoder_architecture:  # rows [H_kv, g + 2, d]
            g = h // h_kv
            block = (g + 2) * d
            within = keep % g if h_kv > 1 else keep
            groups = keep // g if h_kv > 1 else torch.zeros_like(keep)
            q = groups * block  # start of each kept head's group
            rows = [head_rows(within, d) + q.repeat_interleave(d)]
            for group in kv.tolist():
                rows.append(group * block + g * d + torch.arange(2 * d))  # that group's k and v
            order = torch.cat(rows)
            return torch.sort(order).values  # group-major, as the fused layout is
        if module.multi_query:  # rows [H + 2, d]
            return torch.cat([head_rows(keep, d), h * d + torch.arange(2 * d)[:2 * d * len(kv)]])
        return head_rows(keep, 3 * d)  # [H, 3, d]

    def set_counts(self, site, heads, kv_heads):
        if site.module.new_decoder_architecture or not site.module.multi_query:
            site.module.num_kv_heads = kv_heads
        super().set_counts(site, heads, kv_heads)

    def shrink_refusal(self, site):
        if getattr(site.root.config, "alibi", False):
            return "Falcon with ALiBi builds one bias per configured head for every layer."
        return None
