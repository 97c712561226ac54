"""The uniform export: a standard config with fewer heads, for layouts where every site keeps the same number.

The config's head-count fields (`num_attention_heads`, `num_key_value_heads`, ... whichever the config has) are set
to the sites' common counts and its head-dimension field to the heads' size (`head_dim` is written into configs that
leave it unset, such as Qwen2's, whose model class reads it when present), so plain `from_pretrained` builds exactly
the shrunk shapes. Families whose config derives the head size from the hidden size (BERT, Marian, GPT-2:
`head_dim = hidden_size / num_heads`) cannot describe fewer heads of the same size; their refusal names the tensor
whose shape would differ.

FFN neurons: a standard config states one FFN width per config key (`intermediate_size`, `encoder_ffn_dim` /
`decoder_ffn_dim`, `d_ff`, GPT-2's `n_inner`, ...; the key that sizes each FFN is the one its family's `FeedForward`
spec names, read from the config of the FFN's tower), so every FFN sized by one key must keep the same number of
neurons; that key is then set to it. FFNs of different widths under one key, or an FFN with no neuron left, are
refused in one sentence naming the sites and widths (the 'padded' format writes them exactly). Every export is
checked against the model on a probe input before it is written.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from prunetrain.engine.families.core import tower_config
from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, find_heads, live_sites, supported_units, unwrap_model

HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads",
               "decoder_attention_heads")
KV_FIELDS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
DIM_FIELDS = ("head_dim", "d_kv", "kv_channels", "attention_head_dim")


TOWERS = ("text_config", "vision_config")
"""Sub-configs that size a two-tower model's modules (`prunetrain.engine.families.core.tower_config`)."""


def _tower(config, path: str) -> str | None:
    """The attribute of `config` holding the sub-config that sizes the module at `path` (None: `config` itself)."""
    sized_by = tower_config(config, path)
    return next((key for key in TOWERS if sized_by is not config and getattr(config, key, None) is sized_by), None)


def _width_key(spec, sized_by, kind: str) -> str:
    """The key of config `sized_by` that states the width of an FFN of `kind` built by `spec` (a `FeedForward`):
    the first of the spec's keys the config holds as an int, as the spec reads it, else its first key (a config
    leaving it None derives the width, e.g. GPT-2's `n_inner`, 4 × n_embd when None)."""
    keys = spec.width.get(kind, spec.width.get("*")) if isinstance(spec.width, dict) else spec.width
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    return next((key for key in keys if _is_count(getattr(sized_by, key, None))), keys[0])


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ffn_width_keys(model: nn.Module) -> dict[tuple[str | None, str], dict[str, tuple[int, int]]]:
    """The FFN sites of `model` grouped by the config key that sizes them: {(tower, key): {site name: (width now,
    original width)}}, `tower` the sub-config holding `key` (`TOWERS`) or None for the model's config; empty for a
    family whose FFN prunetrain does not prune.

    Args:
        model: a (shrunk) transformers model.
    """
    model = unwrap_model(model)
    if "neurons" not in supported_units(model):
        return {}
    paths = {id(module): path for path, module in model.named_modules()}
    groups: dict[tuple[str | None, str], dict[str, tuple[int, int]]] = {}
    for site in live_sites(model, ("neurons",)):
        path = paths[id(site.module)]
        spec = site.adapter.spec_of(path, site.module)
        key = _width_key(spec, tower_config(model.config, path), site.info.kind)
        groups.setdefault((_tower(model.config, path), key), {})[site.info.name] = (site.info.num_heads,
                                                                                   site.info.original_num_heads)
    return groups


def _key_name(tower: str | None, key: str) -> str:
    return key if tower is None else f"{tower}.{key}"


def uniform_ffn_widths(model: nn.Module) -> dict[tuple[str | None, str], int]:
    """{(tower, config key): the one FFN width it must state} for the keys whose FFNs were shrunk; `ValueError`
    (one sentence naming the sites and widths) when FFNs under one key differ or one has no neuron left.

    Args:
        model: a shrunk model.
    """
    widths = {}
    for (tower, key), sites in ffn_width_keys(model).items():
        if all(now == original for now, original in sites.values()):
            continue
        by_width = {}
        for name, (now, _) in sites.items():
            by_width.setdefault(now, name)
        if len(by_width) > 1:
            shown = ", ".join(f"{name!r} {width}" for width, name in list(by_width.items())[:3])
            raise ValueError(f"format: 'uniform' states one FFN width per config key, but the FFNs that "
                             f"{_key_name(tower, key)!r} sizes keep different numbers of neurons ({shown}); use "
                             f"'remote-code' or 'padded', or shrink them to one width.")
        (width, name), = by_width.items()
        if width == 0:
            raise ValueError(f"format: 'uniform' cannot write FFNs with no neurons (those {_key_name(tower, key)!r} "
                             f"sizes, e.g. {name!r}, keep 0); use 'remote-code' or 'padded'.")
        widths[(tower, key)] = width
    return widths


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
    ffn_widths = uniform_ffn_widths(model)
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
    for (tower, key), width in ffn_widths.items():
        setattr(config if tower is None else getattr(config, tower), key, width)
    described = f"{heads} heads per site" + "".join(f", {_key_name(t, k)} {w}" for (t, k), w in ffn_widths.items())
    try:
        with torch.device("meta"):
            plain = type(model)._from_config(config)
    except ValueError as err:  # e.g. "embed_dim must be divisible by num_heads" (BART, Marian)
        first = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"format: a standard {config.model_type} config with {described} cannot be "
                         f"built ({first}); use 'remote-code' or 'padded'.") from None
    want = model.state_dict()
    for name, value in plain.state_dict().items():
        if name in want and tuple(want[name].shape) != tuple(value.shape):
            why = ("" if any(fields.get(f) is not None for f in DIM_FIELDS) else
                   f" (its config derives the head size from the hidden size and the head count)")
            raise ValueError(f"format: a standard {config.model_type} config with {described} gives "
                             f"{name!r} shape {tuple(value.shape)}, but the pruned model holds "
                             f"{tuple(want[name].shape)}{why}; use 'remote-code' or 'padded'.")
    return config


@torch.no_grad()
def uniform_model(model: nn.Module) -> nn.Module:
    """A plain model of the uniform config holding `model`'s weights (eval mode).

    Args:
        model: a shrunk model whose sites all keep the same number of heads, and whose FFNs keep one width per
            config key (`uniform_ffn_widths`).
    """
    model = unwrap_model(model)
    config = uniform_config(model)
    out = type(model)._from_config(config).to(next(model.parameters()).dtype)
    out.load_state_dict(model.state_dict(), strict=True)
    return out.eval()
