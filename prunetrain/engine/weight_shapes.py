"""Does a plain Hugging Face directory's `config.json` describe the weights beside it? Checked before any weight
is read, from the safetensors headers.

A config that states more (or fewer) attention heads than the weights hold — `num_attention_heads × head_dim` query
rows where `q_proj.weight` has fewer, a pruned model saved without its prunetrain layout, a config copied from
another size — makes transformers either fail with a multi-line load report or, with `ignore_mismatched_sizes`,
initialise the mismatched tensors at random: a different model. prunetrain's loaders refuse it in one sentence
naming the attention site, the head count the config states and the count the weights hold.

What no shape can tell is not caught here: a config that splits the same width into a different number of heads
(8 heads of 4 instead of 4 of 8 in a 32-wide BERT) gives every tensor the same shape.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from torch import nn


def config_model(config, cls=None) -> nn.Module:
    """The model `config` describes, built on the meta device (no memory, no weights): its tensors' shapes."""
    import transformers

    with torch.device("meta"):
        return cls(config) if cls is not None else transformers.AutoModel.from_config(config)


def _saved_key(key: str, wanted: dict, prefix: str) -> str | None:
    """The model's name for the checkpoint tensor `key` (a base model's checkpoint in a head model, or back)."""
    for name in (key, f"{prefix}.{key}" if prefix else None,
                 key.removeprefix(prefix + ".") if prefix and key.startswith(prefix + ".") else None):
        if name is not None and name in wanted:
            return name
    return None


KEY_VALUE_NAME = re.compile(r"(^|\.)(k|v|k_proj|v_proj|key|value|kv_proj|k_lin|v_lin)\.")
"""A key or value projection inside an attention site (HF names), whose rows count key/value heads."""


def _head_counts(site, key: str, wanted_size: int, saved_size: int, grouped: bool
                 ) -> tuple[str, int, int | None] | None:
    """(what is counted, the config's count, the weights' count or None) along a dimension of a site's tensor that
    the config sizes as `wanted_size`: query heads (q, o, fused q/k/v) or, where the config counts them apart
    (`grouped`: num_key_value_heads), key/value heads (k, v)."""
    counts = [("heads", site.num_heads), ("key/value heads", site.num_kv_heads)]
    if (grouped or site.num_kv_heads != site.num_heads) and KEY_VALUE_NAME.search(key[len(site.name):]):
        counts.reverse()
    for label, count in counts:
        unit = count * site.head_dim
        if count and unit and wanted_size % unit == 0 and wanted_size // unit <= 3:
            per_head = wanted_size // count
            return label, count, saved_size // per_head if saved_size % per_head == 0 else None
    return None


def _site_of(key: str, sites) -> object | None:
    return max((s for s in sites if key.startswith(s.name + ".")), key=lambda s: len(s.name), default=None)


def _mismatch_message(where: str, key: str, saved: tuple, wanted: tuple, sites, grouped: bool) -> str:
    """One sentence for a tensor whose shape in the weights differs from what the config gives it."""
    site = _site_of(key, sites)
    dims = [i for i, (a, b) in enumerate(zip(saved, wanted)) if a != b] if len(saved) == len(wanted) else []
    counts = _head_counts(site, key, wanted[dims[0]], saved[dims[0]], grouped) if site is not None and dims else None
    shapes = f"tensor {key!r} has shape {saved}, the config needs {wanted}"
    if counts is None:
        return (f"{where}: its config.json does not describe its weights ({shapes}); transformers would fail or "
                f"initialise that tensor at random, so the model is refused.")
    label, stated, held = counts
    holds = f"its weights hold {held}" if held is not None else "its weights hold a different number"
    return (f"{where}: its config.json states {stated} {label} × {site.head_dim} at site {site.name!r}, but "
            f"{holds} ({shapes}); the config does not describe these weights, so the model is refused rather than "
            f"loaded as a different one.")


def check_weight_shapes(path: str | os.PathLike, config, cls, headers: dict[str, dict],
                        argument: str = "model") -> None:
    """Every tensor of the weights has the shape the model `config` describes gives it; else one `ValueError`
    naming the site and both head counts (or the tensor and both shapes, outside attention).

    Args:
        path: the model directory (for the message).
        config: its transformers config.
        cls: the model class it names (None: `AutoModel`).
        headers: {tensor name: safetensors header entry} of all its weight files.
        argument: how the message names the directory.
    """
    from prunetrain.engine.heads import find_heads

    try:
        probe = config_model(config, cls)
    except Exception:  # a class that cannot be built on the meta device: transformers' own load decides
        return
    wanted = {name: tuple(t.shape) for name, t in probe.state_dict().items()}
    prefix = getattr(probe, "base_model_prefix", "") or ""
    try:
        sites = list(find_heads(probe))
    except Exception:  # a family prunetrain has no adapter for: tensors and shapes are still named
        sites = []
    saved = {}
    for key, entry in headers.items():
        name = _saved_key(key, wanted, prefix)
        if name is not None:
            saved[name] = tuple(entry["shape"])
    where = f"{argument}: {str(Path(path))!r}"
    for name, shape in wanted.items():  # module order: a site's query projection before its keys and values
        if name in saved and saved[name] != shape:
            grouped = getattr(config, "num_key_value_heads", None) is not None
            raise ValueError(_mismatch_message(where, name, saved[name], shape, sites, grouped))


__all__ = ["check_weight_shapes", "config_model"]
