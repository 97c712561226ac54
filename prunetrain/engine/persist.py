"""Saving and loading models with non-uniform heads: standard HF files plus the per-site head layout.

A pruned model directory holds what `save_pretrained` writes (`config.json`, `model.safetensors`, maybe
`generation_config.json`) and `prunetrain_layout.json` (the `HeadLayout`, and the attention implementation the model
ran). The config keeps its original head counts and records, under `prunetrain_heads`, which original heads each
shrunk site holds; `load_pruned` builds the model from the config, shrinks it to that layout (checked against the
layout file and the tensors' shapes first) and loads the tensors with transformers' own loader. A shrunk model's
directory is also self-contained (`modeling_prunetrain.py` + `auto_map`, and a guard that makes a plain
`from_pretrained` refuse it; see `prunetrain.engine.remote_code` and docs/export.md). Any save of a shrunk model
writes all of it (`save_pretrained`, `Trainer.save_model`, Trainer checkpoints): `shrink` records it on the config.
So does any save of a model with a HeadMask (or gates) attached that removes or scales heads: the weights stay
whole, the masks are recorded in `config.json`, and `load_pruned` attaches them again (or shrinks with them).
No pickles are read or written.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from prunetrain.engine.heads import (LAYOUT_CONFIG_KEY, HeadLayout, find_sites, layout_naming, layout_record,
                                     unwrap_model)
from prunetrain.engine.peft_support import merged_weights
from prunetrain.engine.read_only import config_kept
from prunetrain.engine.mask import HeadMask, attach_saved_masks
from prunetrain.engine.remote_code import LAYOUT_FILE, PORTABLE_ATTENTION, SPEC_KEY, mark_pruned, running_attention
from prunetrain.engine.shrink import shrink
from prunetrain.utils.door import checked
from prunetrain.utils.files import read_json
from prunetrain.utils.output_paths import check_output_dir, output_lock, replace_directory, staging_directory
from prunetrain.utils.validate import check_choice


@checked
def save_pruned(model: nn.Module, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write `model` (pruned or not) to directory `path`: HF config + safetensors + `prunetrain_layout.json`.

    A shrunk model's directory is self-contained: it also holds `modeling_prunetrain.py` (torch + transformers
    only), registered in `config.json` under `auto_map`, so `AutoModelFor....from_pretrained(path,
    trust_remote_code=True)` loads it where prunetrain is not installed, and a plain `from_pretrained` refuses it
    (see `prunetrain.engine.remote_code`). The directory is written next to its destination and renamed into
    place, so a failure leaves nothing half-written. An existing non-empty `path` is an error unless
    `overwrite=True`, which replaces only what the CLI's `--overwrite` replaces (an empty directory or one prunetrain
    wrote; never the current, home or root directory: `prunetrain.utils.output_paths.check_output_dir`); another
    process writing `path` at the same time is refused (`output_lock`).

    Args:
        model: the model (a DDP/FSDP-style `.module` wrapper or a peft `PeftModel` is unwrapped; LoRA adapters are
            saved merged into the base architecture's weights, exactly what `merge_and_unload()` then a save writes,
            the model itself left unmerged). Attached HeadMasks (and Hard-Concrete
            gates, as the model evaluates) that remove or scale heads are recorded with the whole weights, as every
            save of the model records them: `load_pruned` (and the modeling file) attach them again.
        path: the directory to write.
        overwrite: replace an existing non-empty `path`.
    """
    model = unwrap_model(model)
    path = Path(path)
    # one writer at a time, what `path` holds checked under the lock; the model's config is left as it was given
    # (save_pretrained sets its dtype and architectures, mark_pruned refreshes the record it writes)
    with output_lock(path, flag="path"), config_kept(model):
        check_output_dir(path, overwrite=overwrite, flag="path", overwrite_flag="overwrite=True")
        mark_pruned(model)  # the record every save_pretrained of a shrunk model writes, from the model as it is now
        with staging_directory(path) as staging:  # the old directory stays whole until the new one is complete
            model.save_pretrained(staging, **merged_weights(model))  # a peft model: as merge_and_unload() gives it
            attn = running_attention(model.config)
            record = {**layout_record(model), "attn_implementation": attn}
            (staging / LAYOUT_FILE).write_text(json.dumps(record, indent=1))
            replace_directory(staging, path, kind="model")  # marked, then swapped in (prunetrain.utils.output_paths)
    return path


def shrink_to_layout(model: nn.Module, layout_or_config) -> HeadLayout:
    """Shrink `model` so each site holds exactly the original units (heads, FFN neurons) a recorded layout names
    (in place).

    The one way to rebuild a recorded shape: `load_pruned`, resuming a run that shrank mid-training, and building a
    fresh model with a pruned model's heads all use it. Sites the record does not name are left as they are; a model
    already shrunk part of the way is shrunk the rest of the way.

    Args:
        model: the model (a DDP/FSDP-style `.module` wrapper is unwrapped).
        layout_or_config: a `HeadLayout`, a mapping {site name: original heads kept}, a config (object or dict)
            holding that mapping under `prunetrain_heads`, or None (nothing to do).

    Returns:
        The model's layout afterwards: its heads, and its neurons when the record names an FFN site.
    """
    net = unwrap_model(model)
    recorded = layout_or_config
    if isinstance(recorded, HeadLayout):
        recorded = {site.name: list(site.heads) for site in recorded}
    elif recorded is not None and not isinstance(recorded, Mapping) and hasattr(recorded, "to_dict"):  # a config
        recorded = getattr(recorded, LAYOUT_CONFIG_KEY, None)
    elif isinstance(recorded, Mapping) and LAYOUT_CONFIG_KEY in recorded:
        recorded = recorded[LAYOUT_CONFIG_KEY]
    if recorded is not None and not isinstance(recorded, Mapping):
        raise ValueError(f"layout: {recorded!r} is not a mapping {{site name: [original head indices kept]}}.")
    layout = layout_naming(net, list(recorded or {}))
    remove = {}
    for name, kept in (recorded or {}).items():
        if name not in layout:
            raise ValueError(f"layout: site {name!r} is not in this model; its sites are "
                             f"{', '.join(layout.names[:4])}, ...")
        kept = set(check_kept_heads(name, kept, layout[name].original_num_heads))
        missing = kept - set(layout[name].heads)
        if missing:
            raise ValueError(f"layout: site {name!r} keeps heads {sorted(missing)} that the model no longer has.")
        remove[name] = [i for i, head in enumerate(layout[name].heads) if head not in kept]
    if any(remove.values()):
        mask = HeadMask.ones(layout)
        for name, positions in remove.items():
            for position in positions:
                mask.set(name, position, 0.0)
        shrink(net, mask)
    return find_sites(net, layout.units)


def check_kept_heads(site: str, kept, original_heads: int) -> list[int]:
    """The original head indices a layout keeps at `site`: a list of ints (not bools, strings or floats) in
    [0, original_heads), strictly increasing (each once, in the order shrinking keeps them), as layouts record them."""
    if isinstance(kept, (str, bytes)) or not isinstance(kept, (list, tuple)):
        raise ValueError(f"layout: site {site!r} keeps {kept!r}, which is not a list of head indices.")
    for head in kept:
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < original_heads:
            raise ValueError(f"layout: site {site!r} keeps head {head!r}, which is not an index in "
                             f"0..{original_heads - 1} (the site's original heads).")
    if list(kept) != sorted(set(kept)):
        raise ValueError(f"layout: site {site!r} keeps heads {list(kept)!r}; give each index once, in increasing "
                         f"order.")
    return list(kept)


@checked
def load_pruned(
    path: str | os.PathLike, device: str | int | torch.device | None = None, attn_implementation: str | None = None,
    masks: str = "attach",
) -> nn.Module:
    """Rebuild a model saved by `save_pruned`, with exactly its per-site heads and weights (in eval mode).

    Refused with one sentence: recorded head indices outside a site's heads, a layout file that differs from the
    config's record, tensors whose shapes do not fit the recorded layout (naming the site, tensor and shapes),
    missing or unexpected tensors, and a saved mask that does not fit the model.

    Args:
        path: a directory written by `save_pruned`, or by any save of a shrunk model (`save_pretrained`,
            `Trainer.save_model`, a Trainer checkpoint).
        device: move the model there (default: the CPU).
        attn_implementation: "eager", "sdpa", "flex_attention", ... as in `from_pretrained`; by default the one the
            saved model ran (recorded in the layout file), so the loaded model computes bit-identically (kernels
            differ in the last bits: a T5 saved while running eager and reloaded with sdpa differs by ~1e-6).
        masks: what to do with the masks saved with the model (a save taken while a HeadMask or gates were
            attached): "attach" them again (the model as it was saved, whole weights, bit-identical; what resuming
            needs), or "shrink" the model with them (removed heads go, soft keep values are folded into the output
            projections: a smaller model that computes the same up to rounding; what inference and export want).
    """
    import transformers

    check_choice("masks", masks, MASK_CHOICES)
    path = Path(path)
    if not (path / LAYOUT_FILE).is_file() or not (path / "config.json").is_file():
        raise ValueError(f"path: {str(path)!r} is not a pruned model directory (expected config.json and "
                         f"{LAYOUT_FILE}, as written by prunetrain.save_pruned).")
    saved = read_json(path / LAYOUT_FILE, "path")  # strict: a key given twice is refused, not read as the last
    saved_layout = HeadLayout.from_dict(saved)
    if isinstance(saved.get("discovered"), dict):  # an adapter discovered when the model was pruned
        from prunetrain.engine.families.discovery import register_description

        register_description(saved["discovered"])
    recorded_attn = saved.get("attn_implementation")
    attn_implementation = attn_implementation or (recorded_attn if recorded_attn in PORTABLE_ATTENTION else None)
    config = read_config(path)
    recorded = getattr(config, LAYOUT_CONFIG_KEY, None) or {}
    if hasattr(config, LAYOUT_CONFIG_KEY):
        delattr(config, LAYOUT_CONFIG_KEY)
    architectures = getattr(config, "architectures", None) or []
    model_cls = getattr(transformers, architectures[0], None) if architectures else None
    if model_cls is None:
        raise ValueError(f"path: config.json in {str(path)!r} names no loadable architecture ({architectures!r}).")
    with torch.device("meta"):  # the recorded shapes, checked before any weight is read
        probe = model_cls(copy.deepcopy(config))
    _check_recorded(path, layout_naming(probe, list(recorded) if isinstance(recorded, dict) else []), recorded)
    with torch.device("cpu"):
        probe_layout = shrink_to_layout(probe, recorded)
    if probe_layout.to_dict() != saved_layout.to_dict():
        raise ValueError(f"path: the head layout in {LAYOUT_FILE} does not match the one recorded in config.json.")
    _check_shapes(path, probe, _saved_shapes(path), saved_layout)
    saved_masks = saved_masks_of(read_json(path / "config.json", "path"), probe, f"path: {str(path)!r}")
    del probe

    # transformers' own loader (it converts checkpoint key formats, e.g. fused MoE experts), on a class whose
    # constructor shrinks the freshly built model to the recorded layout before the weights are loaded
    loader = type(model_cls.__name__, (model_cls,), {"__init__": _shrinking_init(recorded),
                                                     "__module__": model_cls.__module__, "_prunetrain_loader": True})
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model, info = _quiet_from_pretrained(loader, path, config=config, output_loading_info=True, **kwargs)
    model.__class__ = model_cls
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                                "error_msgs")}
    if problems:
        kind, keys = next(iter(problems.items()))
        raise ValueError(f"path: {str(path)!r} does not fit its recorded layout ({kind.replace('_', ' ')}: "
                         f"{sorted(map(str, keys))[:3]}).")
    _own_aligned_storage(model)
    apply_saved_masks(model, saved_masks, masks)
    if device is not None:
        model.to(device)
    return model.eval()


ALIGNMENT = 64  # bytes: PyTorch's CPU allocator aligns every tensor it allocates to 64 bytes (one AVX-512 vector)


def _own_aligned_storage(model: nn.Module) -> None:
    """Give every parameter and buffer read from the safetensors file memory of its own, aligned as PyTorch aligns
    what it allocates. The loader's tensors may be views into the memory-mapped file at any 8-byte offset, and CPU
    kernels take other code paths on unaligned data: on a 2-core AMD EPYC (AVX-512) a shrunk Qwen2 reloaded from its
    save computed 1.5e-8 away from the model that was saved, with every tensor equal, until its tensors were copied.
    A copy of each unaligned tensor makes the loaded model compute bit-identically to the one saved."""
    for module in model.modules():
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.device.type == "cpu" and tensor.data_ptr() % ALIGNMENT:
                tensor.data = tensor.data.clone()


MASK_CHOICES = ("attach", "shrink")


def saved_masks_of(config: dict, model: nn.Module, where: str) -> list[dict]:
    """The masks a directory's `config.json` (a dict) records (`prunetrain.engine.mask.saved_mask_record`),
    checked against `model` (built with the directory's layout): a damaged record is one ValueError naming `where`
    and the problem, before any weight is read."""
    record = (config.get(SPEC_KEY) or {}).get("masks") if isinstance(config.get(SPEC_KEY), dict) else None
    if record is None:
        return []
    problem = _mask_record_problem(record)
    if problem is None:
        try:
            _masks_from_record(model, record)
        except ValueError as err:
            problem = str(err).rstrip(".")
    if problem is not None:
        raise ValueError(f"{where}: the masks recorded in its config.json do not fit the model ({problem}).")
    return record


def _mask_record_problem(record) -> str | None:
    if not isinstance(record, list):
        return f"'masks' is {type(record).__name__}, expected a list"
    for entry in record:
        sites = entry.get("sites") if isinstance(entry, dict) else None
        if not isinstance(sites, dict) or not all(isinstance(s, dict) and isinstance(s.get("keep"), list)
                                                  for s in sites.values()):
            return "an entry is not {'owner': ..., 'sites': {site: {'keep': [...]}}}"
        if not (entry.get("owner") is None or isinstance(entry.get("owner"), str)):
            return f"owner {entry.get('owner')!r} is not a name"
    return None


def _masks_from_record(model: nn.Module, record: list[dict]) -> list[HeadMask]:
    masks = []
    for entry in record:
        mask = HeadMask.ones(layout_naming(model, list(entry["sites"])))
        for name, site in entry["sites"].items():
            mask[name] = site["keep"]  # checks the site, the head count and the values
        masks.append(mask)
    return masks


def apply_saved_masks(model: nn.Module, record: list[dict], masks: str = "attach") -> None:
    """Attach the recorded masks to `model` again (`masks="attach"`), or shrink `model` with their product
    (`"shrink"`: a group-aligned shrink under grouped-query attention keeps a group any head of which is kept, its
    other heads zeroed in the output projection, so the result is exact)."""
    if not record:
        return
    if masks == "attach":
        attach_saved_masks(model, record)
        return
    product = HeadMask.ones(layout_naming(model, [name for entry in record for name in entry["sites"]]))
    for mask in _masks_from_record(model, record):
        for name, values in mask.items():
            product[name] = product[name] * values
    shrink(model, product, gqa_rounding="keep")


def _quiet_from_pretrained(cls, path, **kwargs):
    """`cls.from_pretrained` without transformers' progress bar (prunetrain's commands keep stderr for one-line
    errors and their own progress)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return cls.from_pretrained(path, **kwargs)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _shrinking_init(recorded: dict):
    def __init__(self, config, *args, **kwargs):
        super(type(self), self).__init__(config, *args, **kwargs)
        with torch.device("cpu"):  # index tensors the hooks keep live on the CPU, not on the loader's meta device
            shrink_to_layout(self, recorded)
    return __init__


def _saved_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    files = [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if not files[0].exists() and index.exists():
        files = [path / f for f in sorted(set(read_json(index, "path")["weight_map"].values()))]
    if not files[0].exists():
        raise ValueError(f"path: {str(path)!r} has no model.safetensors (or safetensors index); it is not a model "
                         f"saved by prunetrain.save_pruned.")
    shapes = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():
                shapes[key] = tuple(handle.get_slice(key).get_shape())
    return shapes


def read_config(path: str | os.PathLike):
    """The transformers config of a saved (pruned) directory, as the original architecture's config class: the
    remote-code guard and `auto_map` of a self-contained directory are undone (`prunetrain.engine.remote_code`).

    Args:
        path: a directory holding `config.json`.
    """
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from prunetrain.engine.remote_code import is_guarded, plain_config_dict

    path = Path(path)
    data = read_json(path / "config.json", "path")  # strict JSON object: a key given twice is refused
    if not is_guarded(data):
        return AutoConfig.from_pretrained(path)
    data = plain_config_dict(data)
    model_type = data.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"path: config.json in {str(path)!r} has model_type {model_type!r}, which this "
                         f"transformers does not know.")
    return CONFIG_MAPPING[model_type].from_dict(data)


def _check_recorded(path: Path, layout: HeadLayout, recorded: dict) -> None:
    """Each recorded site names strictly increasing original head indices within the site's heads."""
    if not isinstance(recorded, dict):
        raise ValueError(f"path: config.json in {str(path)!r} records {LAYOUT_CONFIG_KEY} as "
                         f"{type(recorded).__name__}; expected {{site: [head indices]}}.")
    for name, kept in recorded.items():
        if name not in layout:
            continue  # shrink_to_layout names the unknown site
        n = layout[name].num_heads
        ok = isinstance(kept, (list, tuple)) and all(isinstance(h, int) and not isinstance(h, bool) for h in kept)
        if not ok or any(not 0 <= h < n for h in kept) or list(kept) != sorted(set(kept)):
            raise ValueError(f"path: config.json in {str(path)!r} records heads {kept!r} for site {name!r}, which "
                             f"has {n} heads; expected increasing indices in 0..{n - 1}.")


def _check_shapes(path: Path, model: nn.Module, tensors: dict[str, tuple[int, ...]], layout: HeadLayout) -> None:
    """Every saved tensor has the shape the recorded layout gives it (else: name the site and shapes)."""
    state = model.state_dict()
    for key, shape in tensors.items():
        if key in state and tuple(state[key].shape) != tuple(shape):
            site = max((s for s in layout if key.startswith(s.name + ".")), key=lambda s: len(s.name), default=None)
            where = (f" of site {site.name!r} ({site.num_heads} heads × {site.head_dim}, "
                     f"{site.num_kv_heads} key/value heads in the recorded layout)") if site else ""
            raise ValueError(f"path: {str(path)!r} does not match its recorded layout: tensor {key!r}{where} has "
                             f"shape {tuple(shape)} but the layout needs {tuple(state[key].shape)}.")
