"""Saving and loading models with non-uniform heads: standard HF files plus the per-site head layout.

A pruned model directory holds what `save_pretrained` writes (`config.json`, `model.safetensors`, maybe
`generation_config.json`) and `prunetrain_layout.json` (the `HeadLayout`). The config keeps its original head
counts and records, under `prunetrain_heads`, which original heads each shrunk site holds; `load_pruned` builds
the model from the config, shrinks it to that layout and loads the tensors. No pickles are read or written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, HeadLayout, find_heads, unwrap_model
from prunetrain.engine.mask import HeadMask
from prunetrain.engine.shrink import shrink

LAYOUT_FILE = "prunetrain_layout.json"


def save_pruned(model: nn.Module, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write `model` (pruned or not) to directory `path`: HF config + safetensors + `prunetrain_layout.json`.

    The directory is written next to its destination and renamed into place, so a failure leaves nothing
    half-written. An existing non-empty `path` is an error unless `overwrite=True`.
    """
    model = unwrap_model(model)
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(f"path: {str(path)!r} already exists and is not empty; pass overwrite=True to replace it.")
    layout = find_heads(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(staging)
        (staging / LAYOUT_FILE).write_text(layout.to_json())
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    single = path / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(path / shard))
        return tensors
    raise ValueError(f"path: {str(path)!r} has no model.safetensors (or safetensors index); it is not a model "
                     f"saved by prunetrain.save_pruned.")


def load_pruned(
    path: str | os.PathLike, device: str | torch.device | None = None, attn_implementation: str | None = None
) -> nn.Module:
    """Rebuild a model saved by `save_pruned`, with exactly its per-site heads and weights (in eval mode).

    `attn_implementation` ("eager", "sdpa", "flex_attention", ...) chooses the attention backend as in
    `from_pretrained`; by default transformers picks (sdpa on CPU).
    """
    import transformers
    from transformers import AutoConfig, GenerationConfig

    path = Path(path)
    if not (path / LAYOUT_FILE).is_file() or not (path / "config.json").is_file():
        raise ValueError(f"path: {str(path)!r} is not a pruned model directory (expected config.json and "
                         f"{LAYOUT_FILE}, as written by prunetrain.save_pruned).")
    saved_layout = HeadLayout.from_dict(json.loads((path / LAYOUT_FILE).read_text()))
    config = AutoConfig.from_pretrained(path)
    recorded = getattr(config, LAYOUT_CONFIG_KEY, None) or {}
    if hasattr(config, LAYOUT_CONFIG_KEY):
        delattr(config, LAYOUT_CONFIG_KEY)
    architectures = getattr(config, "architectures", None) or []
    model_cls = getattr(transformers, architectures[0], None) if architectures else None
    if model_cls is None:
        raise ValueError(f"path: config.json in {str(path)!r} names no loadable architecture ({architectures!r}).")
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    model = model_cls(config)

    full = find_heads(model)
    remove = {name: [h for h in range(full[name].num_heads) if h not in set(kept)] for name, kept in recorded.items()}
    shrink(model, HeadMask.from_heads(model, remove))
    if find_heads(model).to_dict() != saved_layout.to_dict():
        raise ValueError(f"path: the head layout in {LAYOUT_FILE} does not match the one recorded in config.json.")

    tensors = _read_tensors(path)
    floating = [t.dtype for t in tensors.values() if t.is_floating_point()]
    if floating:
        model.to(floating[0])
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected:
        raise ValueError(f"path: {str(path)!r} holds tensors this model does not have: {unexpected[:3]}.")
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in tensors}
    not_saved = set(getattr(model, "_keys_to_ignore_on_save", None) or ())  # e.g. Marian's sinusoidal positions
    not_saved |= set(getattr(model, "_keys_to_ignore_on_load_missing", None) or ())
    untied = [k for k in missing if state[k].data_ptr() not in loaded and not _matches_any(k, not_saved)]
    if untied:
        raise ValueError(f"path: {str(path)!r} lacks tensors for {untied[:3]}.")
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    if device is not None:
        model.to(device)
    return model.eval()


def _matches_any(key: str, patterns: set[str]) -> bool:
    """HF lists keys it does not save as names or regular expressions."""
    import re

    return any(key == p or re.fullmatch(p, key) or re.search(p, key) for p in patterns)
