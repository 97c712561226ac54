"""Adapters for the first families: BERT/RoBERTa, Marian/BART, Llama-style GQA (Llama, Qwen2, Mistral), T5, GPT-2."""

from __future__ import annotations

import torch
from torch import nn

from prunetrain.engine.families.core import (ENCODER_DECODER_FFN_WIDTH, FamilyAdapter, FeedForward,
                                             LinearAttentionAdapter, _layer_index, class_names, define_headless,
                                             define_subclass, head_rows, headless_forward, register, switch_class)
from prunetrain.engine.heads import AttentionSite, HeadSite


@register
class BertAdapter(LinearAttentionAdapter):
    """BERT and RoBERTa: `layer.i.attention` (`self.query/key/value` + `output.dense`); `crossattention` in decoders."""

    name = "bert"
    model_types = ("bert", "roberta")
    ffn = FeedForward(("BertLayer", "RobertaLayer"), up=("intermediate.dense",), down="output.dense")
    module_classes = ("BertAttention", "RobertaAttention")
    q, k, v, out = "self.query", "self.key", "self.value", "output.dense"
    head_dim_attr = "self.attention_head_size"
    count_attrs = ("self.num_attention_heads",)
    width_attrs = ("self.all_head_size",)

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


@register
class MarianBartAdapter(LinearAttentionAdapter):
    """Marian and BART: `self_attn` / `encoder_attn` with `q_proj/k_proj/v_proj/out_proj`."""

    name = "marian-bart"
    model_types = ("marian", "bart")
    ffn = FeedForward(("MarianEncoderLayer", "MarianDecoderLayer", "BartEncoderLayer", "BartDecoderLayer"),
                      up=("fc1",), down="fc2", width=ENCODER_DECODER_FFN_WIDTH)
    module_classes = ("MarianAttention", "BartAttention")
    count_attrs = ("num_heads",)

    def original_num_heads(self, model, kind):
        c = model.config
        return c.encoder_attention_heads if kind == "encoder_self" else c.decoder_attention_heads


@register
class LlamaAdapter(LinearAttentionAdapter):
    """Llama-style decoders with grouped-query attention (Llama, Qwen2, Mistral): `self_attn` with `o_proj`.

    Query head h reads key/value head h // group_size (HF `repeat_kv`), so heads are removed in whole groups.
    """

    name = "llama"
    model_types = ("llama", "qwen2", "mistral")
    ffn = FeedForward(("LlamaMLP", "Qwen2MLP", "MistralMLP"), up=("gate_proj", "up_proj"), down="down_proj",
                      width_attrs=("intermediate_size",))
    module_classes = ("LlamaAttention", "Qwen2Attention", "MistralAttention")
    out = "o_proj"
    groups_attr = "num_key_value_groups"

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads


@register
class T5Adapter(LinearAttentionAdapter):
    """T5: `SelfAttention` / `EncDecAttention` with `q/k/v/o`.

    T5 computes one relative position bias in the first layer of each stack, with one row per *original* head, and
    shares it with every later layer. A shrunk site therefore keeps the full bias table and selects its own heads
    from the shared bias (`T5BiasSelection`); the bias passed on to the next layer stays full.
    """

    name = "t5"
    model_types = ("t5",)
    ffn = (FeedForward(("T5DenseActDense",), up=("wi",), down="wo", width="d_ff"),
           FeedForward(("T5DenseGatedActDense",), up=("wi_0", "wi_1"), down="wo", width="d_ff"))
    module_classes = ("T5Attention",)
    q, k, v, out = "q", "k", "v", "o"
    head_dim_attr = "key_value_proj_dim"
    count_attrs = ("n_heads",)
    width_attrs = ("inner_dim",)

    def original_num_heads(self, model, kind):
        return model.config.num_heads

    def remove_heads(self, site, keep, select):
        super().remove_heads(site, keep, select)
        kept_original = torch.tensor([site.info.heads[i] for i in keep.tolist()], dtype=torch.long)
        T5BiasSelection.install(site.module, kept_original, site.info.original_num_heads)


class T5BiasSelection:
    """Hooks on a shrunk T5 attention module that select its heads from the shared (full) position bias.

    - forward pre-hook: a full `position_bias [1, H, q, k]` coming in is kept aside and replaced by `[:, kept]`;
    - forward hook on `relative_attention_bias` (first layer only): the full `[q, k, H]` table is kept aside and
      `[..., kept]` is used by this layer;
    - forward hook: the bias handed to the next layer is the full one again (zeros of full width when the module
      made its own zero bias).
    """

    def __init__(self, kept: torch.Tensor, full_heads: int):
        self.kept = kept
        self.full_heads = full_heads
        self._full: torch.Tensor | None = None
        self.handles: list = []

    @classmethod
    def install(cls, module: nn.Module, kept: torch.Tensor, full_heads: int) -> None:
        existing = getattr(module, "_prunetrain_t5_bias", None)
        if existing is not None:
            existing.kept = kept
            return
        hooks = cls(kept, full_heads)
        hooks.handles.append(module.register_forward_pre_hook(hooks.pre_forward, with_kwargs=True))
        hooks.handles.append(module.register_forward_hook(hooks.post_forward))
        if getattr(module, "has_relative_attention_bias", False):
            hooks.handles.append(module.relative_attention_bias.register_forward_hook(hooks.bias_table))
        module._prunetrain_t5_bias = hooks

    def pre_forward(self, module, args, kwargs):
        self._full = None
        bias = kwargs.get("position_bias")
        if bias is not None and bias.shape[1] == self.full_heads:
            self._full = bias
            kwargs["position_bias"] = bias.index_select(1, self.kept.to(bias.device))
        return args, kwargs

    def bias_table(self, embedding, inputs, values):  # values: [q, k, H]
        self._full = values.permute([2, 0, 1]).unsqueeze(0)
        return values.index_select(-1, self.kept.to(values.device))

    def post_forward(self, module, args, output):
        attn_output, bias, *rest = output
        if self._full is not None:
            bias, self._full = self._full, None
        elif bias is not None and bias.shape[1] != self.full_heads:
            bias = bias.new_zeros((bias.shape[0], self.full_heads, *bias.shape[2:]))
        return (attn_output, bias, *rest)


def _gpt2_attention() -> type:
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    return GPT2Attention


HEADLESS_GPT2 = define_headless("HeadlessGPT2Attention", _gpt2_attention, out="c_proj", head_dim="head_dim",
                               post="resid_dropout")
"""GPT-2 attention with every head removed (torch's `split(0)` of an empty axis yields one piece, so GPT-2's own
forward cannot run): the output projection's bias remains, the cache records empty keys/values."""


def _gpt2_mlp() -> type:
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    return GPT2MLP


EMPTY_GPT2_MLP = define_subclass("EmptyGPT2MLP", _gpt2_mlp, forward=headless_forward, _pt_out="c_proj",
                                 _pt_head_dim="c_proj.nx", _pt_cache_kwargs=(), _pt_time_first=False,
                                 _pt_post="dropout", _pt_tensor_only=True)
"""GPT-2's MLP with every neuron removed (its `Conv1D` cannot flatten a 0-wide input): the down projection's bias,
through the MLP's dropout, as the masked model computes."""


@register
class GPT2Adapter(FamilyAdapter):
    """GPT-2: `h.i.attn` with a fused `c_attn` (Conv1D, weight `[in, 3 * E]`: q | k | v) and `c_proj`."""

    name = "gpt2"
    model_types = ("gpt2",)
    ffn = FeedForward(("GPT2MLP",), up=("c_fc",), down="c_proj", width="n_inner",
                      default_width=lambda config: 4 * config.n_embd, empty_class="EmptyGPT2MLP")

    def sites(self, model):
        if getattr(model.config, "add_cross_attention", False):
            raise ValueError("model: GPT-2 with add_cross_attention=True is not supported; "
                             "only GPT-2 self-attention is.")
        found = []
        for path, module in model.named_modules():
            if "GPT2Attention" not in class_names(module):
                continue
            d = module.head_dim
            num_heads = module.c_proj.weight.shape[0] // d
            info = HeadSite(
                name=path, kind="self", layer=_layer_index(path), num_heads=num_heads, head_dim=d,
                num_kv_heads=num_heads, heads=self.original_heads(model, path, num_heads),
                original_num_heads=model.config.n_head,
            )
            found.append(AttentionSite(info=info, module=module, out_proj=module.c_proj, adapter=self, root=model))
        return found

    def remove_heads(self, site, keep, select):
        module, d = site.module, site.info.head_dim
        width = site.info.num_heads * d
        rows = head_rows(keep, d)
        cols = torch.cat([rows, rows + width, rows + 2 * width])
        select(module.c_attn.weight, 1, cols)  # Conv1D weight is [in, out]
        select(module.c_attn.bias, 0, cols)
        module.c_attn.nf = len(cols)
        select(module.c_proj.weight, 0, rows)
        module.c_proj.nx = len(rows)
        module.num_heads = len(keep)
        module.split_size = len(rows)
        if len(keep) == 0:
            switch_class(module, HEADLESS_GPT2)
