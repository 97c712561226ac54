"""Family adapters: the one place that knows Hugging Face module names.

An adapter answers two questions for one model family:

1. `sites(model)`: which modules are multi-head attention sites, their kind and layer, and which module's input is
   the concatenation of the heads (the output projection).
2. `remove_heads(site, keep, select)`: how to slice the weights so that only the heads in `keep` remain.

Adding a family is one small subclass registered with `@register` (see `LinearAttentionAdapter` for the common
q/k/v/out layout: most families only name their modules and head-count attributes).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from prunetrain.heads import LAYOUT_CONFIG_KEY, AttentionSite, HeadSite

Select = Callable[[nn.Parameter, int, torch.Tensor], None]
"""`select(param, dim, index)`: keep `index` along `dim` of `param`, in place (and in the optimizer state)."""

CROSS_ATTENTION_NAMES = {"encoder_attn", "EncDecAttention", "crossattention"}

_ADAPTERS: list["FamilyAdapter"] = []


def register(cls: type["FamilyAdapter"]) -> type["FamilyAdapter"]:
    """Class decorator: make a family adapter available to `find_heads`, `HeadMask` and `shrink`."""
    _ADAPTERS.append(cls())
    return cls


def supported_families() -> list[str]:
    return [a.name for a in _ADAPTERS]


def adapter_for(model: nn.Module) -> "FamilyAdapter":
    """The adapter for `model`, chosen by `model.config.model_type`; a clear error for anything else."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    for adapter in _ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    supported = ", ".join(f"{a.name} ({'/'.join(a.model_types)})" for a in _ADAPTERS)
    raise ValueError(
        f"model: {type(model).__name__} (model_type={model_type!r}) is not supported; "
        f"supported families: {supported}. Adding one is a small adapter in prunetrain/families.py."
    )


def head_rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Row indices of the given heads in a head-major `[num_heads * head_dim]` axis."""
    return (heads[:, None] * head_dim + torch.arange(head_dim, device=heads.device)).reshape(-1)


def _get(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        module = getattr(module, part)
    setattr(module, last, value)


def _layer_index(path: str) -> int:
    numbers = re.findall(r"\.(\d+)(?:\.|$)", path)
    return int(numbers[0]) if numbers else 0  # the block index: first number in the path


def select_linear_out(linear: nn.Linear, rows: torch.Tensor, select: Select) -> None:
    """Keep output features `rows` of an `nn.Linear` (weight rows and bias)."""
    select(linear.weight, 0, rows)
    if linear.bias is not None:
        select(linear.bias, 0, rows)
    linear.out_features = len(rows)


def select_linear_in(linear: nn.Linear, cols: torch.Tensor, select: Select) -> None:
    """Keep input features `cols` of an `nn.Linear` (weight columns; the bias is untouched)."""
    select(linear.weight, 1, cols)
    linear.in_features = len(cols)


class FamilyAdapter:
    """Base class. Subclasses set `name` and `model_types` and implement `sites` and `remove_heads`."""

    name: str = ""
    model_types: tuple[str, ...] = ()

    def sites(self, model: nn.Module) -> list[AttentionSite]:  # pragma: no cover - abstract
        raise NotImplementedError

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:  # pragma: no cover
        """Slice `site`'s weights so that only query heads `keep` (current positions, sorted) remain."""
        raise NotImplementedError

    # helpers shared by the adapters
    @staticmethod
    def kind_of(model: nn.Module, path: str) -> str:
        leaf = path.rsplit(".", 1)[-1]
        if leaf in CROSS_ATTENTION_NAMES:
            return "cross"
        if getattr(model.config, "is_encoder_decoder", False):
            parts = path.split(".")
            return "encoder_self" if "encoder" in parts else "decoder_self"
        return "self"

    @staticmethod
    def original_heads(model: nn.Module, path: str, num_heads: int) -> tuple[int, ...]:
        recorded = (getattr(model.config, LAYOUT_CONFIG_KEY, None) or {}).get(path)
        return tuple(recorded) if recorded is not None else tuple(range(num_heads))


class LinearAttentionAdapter(FamilyAdapter):
    """Families whose attention is four `nn.Linear` projections q, k, v and out (head-major, `view(..., -1, d)`).

    Subclasses give the attention module classes, the attribute paths of the projections relative to the attention
    module, where head_dim lives, and which head-count attributes to update after a shrink.
    """

    module_classes: tuple[str, ...] = ()
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    out: str = "out_proj"
    head_dim_attr: str = "head_dim"
    count_attrs: tuple[str, ...] = ()  # set to the new number of query heads
    width_attrs: tuple[str, ...] = ()  # set to the new num_heads * head_dim
    leaf_names: tuple[str, ...] | None = None  # only modules whose attribute name is one of these (None: any)

    def original_num_heads(self, model: nn.Module, kind: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def group_size(self, module: nn.Module) -> int:
        return 1

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        found = []
        for path, module in model.named_modules():
            if type(module).__name__ not in self.module_classes:
                continue
            if self.leaf_names is not None and path.rsplit(".", 1)[-1] not in self.leaf_names:
                continue
            head_dim = int(_get(module, self.head_dim_attr))
            out_proj = _get(module, self.out)
            num_heads = out_proj.weight.shape[1] // head_dim
            num_kv = _get(module, self.k).weight.shape[0] // head_dim
            kind = self.kind_of(model, path)
            info = HeadSite(
                name=path,
                kind=kind,
                layer=_layer_index(path),
                num_heads=num_heads,
                head_dim=head_dim,
                num_kv_heads=num_kv,
                heads=self.original_heads(model, path, num_heads),
                original_num_heads=self.original_num_heads(model, kind),
                group_size=self.group_size(module),
            )
            found.append(AttentionSite(info=info, module=module, out_proj=out_proj, adapter=self, root=model))
        return found

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:
        d, g = site.info.head_dim, site.info.group_size
        q_rows = head_rows(keep, d)
        kv_rows = head_rows(keep.view(-1, g)[:, 0] // g, d) if g > 1 else q_rows
        module = site.module
        select_linear_out(_get(module, self.q), q_rows, select)
        select_linear_out(_get(module, self.k), kv_rows, select)
        select_linear_out(_get(module, self.v), kv_rows, select)
        select_linear_in(_get(module, self.out), q_rows, select)
        for attr in self.count_attrs:
            _set(module, attr, len(keep))
        for attr in self.width_attrs:
            _set(module, attr, len(keep) * d)


@register
class BertAdapter(LinearAttentionAdapter):
    """BERT and RoBERTa: `layer.i.attention` (`self.query/key/value` + `output.dense`); `crossattention` in decoders."""

    name = "bert"
    model_types = ("bert", "roberta")
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
    module_classes = ("LlamaAttention", "Qwen2Attention", "MistralAttention")
    out = "o_proj"

    def original_num_heads(self, model, kind):
        return model.config.num_attention_heads

    def group_size(self, module):
        return int(module.num_key_value_groups)


@register
class T5Adapter(LinearAttentionAdapter):
    """T5: `SelfAttention` / `EncDecAttention` with `q/k/v/o`.

    T5 computes one relative position bias in the first layer of each stack, with one row per *original* head, and
    shares it with every later layer. A shrunk site therefore keeps the full bias table and selects its own heads
    from the shared bias (`T5BiasSelection`); the bias passed on to the next layer stays full.
    """

    name = "t5"
    model_types = ("t5",)
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


@register
class GPT2Adapter(FamilyAdapter):
    """GPT-2: `h.i.attn` with a fused `c_attn` (Conv1D, weight `[in, 3 * E]`: q | k | v) and `c_proj`."""

    name = "gpt2"
    model_types = ("gpt2",)

    def sites(self, model):
        if getattr(model.config, "add_cross_attention", False):
            raise ValueError("model: GPT-2 with add_cross_attention=True is not supported; "
                             "only GPT-2 self-attention is.")
        found = []
        for path, module in model.named_modules():
            if type(module).__name__ not in ("GPT2Attention", "EmptyGPT2Attention"):
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
        if len(keep) == 0 and not isinstance(module, EmptyGPT2Attention):
            # torch's split(0) of an empty axis yields one piece, so GPT-2's own forward cannot run with no heads.
            _set(site.root, site.info.name, EmptyGPT2Attention(module))


class EmptyGPT2Attention(nn.Module):
    """A GPT-2 attention block with every head removed: only the output-projection bias (residual path) remains.

    It keeps the original (now empty) `c_attn` and `c_proj` modules, so parameter identities and state-dict keys
    are unchanged, and it still writes its (0-head) keys/values to the cache, whose length `prunetrain.kv_cache`
    then counts.
    """

    def __init__(self, attention: nn.Module):
        super().__init__()
        self.c_attn, self.c_proj, self.resid_dropout = attention.c_attn, attention.c_proj, attention.resid_dropout
        self.head_dim, self.num_heads, self.split_size = attention.head_dim, 0, 0
        self.layer_idx, self.config = attention.layer_idx, attention.config

    def forward(self, hidden_states, past_key_values=None, **kwargs):
        b, t = hidden_states.shape[:2]
        if past_key_values is not None:
            kv = hidden_states.new_zeros(b, 0, t, self.head_dim)  # [B, 0 heads, T, d]
            past_key_values.update(kv, kv, self.layer_idx)
        # Conv1D's own forward cannot flatten a 0-wide input, so compute bias + [B*T, 0] @ [0, E] directly.
        empty = hidden_states.new_zeros(b * t, 0)
        out = torch.addmm(self.c_proj.bias, empty, self.c_proj.weight).view(b, t, -1)
        return self.resid_dropout(out), None
