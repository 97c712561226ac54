"""The uniform export: a standard config with fewer heads, for layouts where every site keeps the same number.

The config's head-count fields (`num_attention_heads`, `num_key_value_heads`, ... whichever the config has) are set
to the sites' common counts and its head-dimension field to the heads' size (`head_dim` is written into configs that
leave it unset, such as Qwen2's, whose model class reads it when present), so plain `from_pretrained` builds exactly
the shrunk shapes. Families whose config derives the head size from the hidden size (BERT, Marian, GPT-2:
`head_dim = hidden_size / num_heads`) cannot describe fewer heads of the same size; their refusal names the tensor
whose shape would differ. Every export is checked against the model on a probe input before it is written.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, find_heads, unwrap_model

HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
               "decoder_attention_heads")
KV_FIELDS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
DIM_FIELDS = ("head_dim", "d_kv", "kv_channels", "attention_head_dim")


def uniform_config(model: nn.Module):
    """The standard config that describes `model`'s (uniform) shrunk shapes; `ValueError` says why not.

    Args:
        model: a shrunk model.
    """
    model = unwrap_model(model)
    layout = find_heads(model)
    counts = {}
    for site in layout:
        counts.setdefault((site.num_heads, site.num_kv_heads), site.name)
    if len(counts) > 1:
        shown = ", ".join(f"{name!r} {h} heads ({kv} key/value)" for (h, kv), name in list(counts.items())[:3])
        raise ValueError(f"format: 'uniform' needs the same number of heads at every site, but the sites differ "
                         f"({shown}); use 'remote-code' or 'padded', or select heads with constraints="
                         f"ServingConstraints(same_heads_per_kind=True).")
    (heads, kv_heads), = counts
    if heads == 0:
        raise ValueError("format: 'uniform' cannot write sites with no heads; use 'remote-code' or 'padded'.")
    config = copy.deepcopy(model.config)
    for key in (LAYOUT_CONFIG_KEY, "prunetrain_export", "auto_map"):
        if hasattr(config, key):
            delattr(config, key)
    fields = config.to_dict()
    for name in HEAD_FIELDS:
        if name in fields and isinstance(fields[name], int):
            setattr(config, name, heads)
    for name in KV_FIELDS:
        if name in fields and isinstance(fields[name], int):
            setattr(config, name, kv_heads)
    dim_fields = [name for name in DIM_FIELDS if fields.get(name) is not None] or ["head_dim"]
    for name in dim_fields:  # a config without a head size gets `head_dim` (Qwen2's class reads it when set); it
        setattr(config, name, layout.sites[0].head_dim)  # is kept only if the model built from it has the shapes
    try:
        with torch.device("meta"):
            plain = type(model)._from_config(config)
    except ValueError as err:  # e.g. "embed_dim must be divisible by num_heads" (BART, Marian)
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"format: a standard {config.model_type} config with {heads} heads per site cannot be "
                         f"built ({first}); use 'remote-code' or 'padded'.") from None
    want = model.state_dict()
    for name, value in plain.state_dict().items():
        if name in want and tuple(want[name].shape) != tuple(value.shape):
            why = ("" if any(fields.get(f) is not None for f in DIM_FIELDS) else
                   f" (its config derives the head size from the hidden size and the head count)")
            raise ValueError(f"format: a standard {config.model_type} config with {heads} heads per site gives "
                             f"{name!r} shape {tuple(value.shape)}, but the pruned model holds "
                             f"{tuple(want[name].shape)}{why}; use 'remote-code' or 'padded'.")
    return config


@torch.no_grad()
def uniform_model(model: nn.Module) -> nn.Module:
    """A plain model of the uniform config holding `model`'s weights (eval mode).

    Args:
        model: a shrunk model whose sites all keep the same number of heads.
    """
    model = unwrap_model(model)
    config = uniform_config(model)
    out = type(model)._from_config(config).to(next(model.parameters()).dtype)
    out.load_state_dict(model.state_dict(), strict=True)
    return out.eval()
