"""Saved model directories: checked file by file first, then loaded by the one loader every part of prunetrain uses.

`check_model_dir` turns every damaged or foreign file into one `ValueError` that names the file (a config or layout
that is not JSON, truncated or corrupt safetensors, pickle weights that prunetrain will not unpickle), so the CLI
reports one line instead of a loader's traceback. `load_model_dir` checks, then loads (`load_pruned` for a prunetrain
layout, else the Hugging Face class its config names).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

CONFIG_FILE = "config.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "model.bin", "pytorch_model.bin.index.json")


def _read_json(path: Path, argument: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{argument}: {str(path)!r} is not valid JSON ({err.__class__.__name__}: {err}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"{argument}: {str(path)!r} holds JSON {type(data).__name__}, not an object.")
    return data


def _check_safetensors(path: Path, argument: str) -> None:
    """The header parses and the file is as long as the header says (a truncated copy fails here, not at load)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{argument}: {str(path)!r} is truncated ({size} bytes; not a safetensors file).")
        header_len = int.from_bytes(head, "little")
        if header_len <= 0 or 8 + header_len > size:
            raise ValueError(f"{argument}: {str(path)!r} is truncated or not safetensors (header of {header_len} "
                             f"bytes in a {size}-byte file).")
        try:
            header = json.loads(handle.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{argument}: {str(path)!r} is not a safetensors file (its header is not JSON).") from None
    ends = [entry["data_offsets"][1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        raise ValueError(f"{argument}: {str(path)!r} is truncated ({size} of {expected} bytes).")


def _check_architecture(path: Path, config: dict, argument: str) -> None:
    """The config names a model type and class this transformers knows (else loading fails with a long traceback)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"{argument}: {str(path)!r} names model_type {model_type!r}, which transformers "
                         f"{transformers.__version__} does not know.")
    for name in config.get("architectures") or []:
        if not hasattr(transformers, str(name)):
            raise ValueError(f"{argument}: {str(path)!r} names the architecture {name!r}, which transformers "
                             f"{transformers.__version__} does not have.")


def check_model_dir(path: str | os.PathLike, argument: str = "model") -> Path:
    """Check a saved model directory without loading it; returns it as a `Path`.

    Args:
        path: a directory written by `prunetrain.save_pruned` / `save_translation_model` / `save_pretrained`.
        argument: how error messages name it (the CLI passes its argument or flag, e.g. "model" or "--mask").

    Raises:
        ValueError: one sentence naming the file: no directory or `config.json`, a config naming a model type or
            class transformers does not know, a config or
            `prunetrain_layout.json` that is not a JSON object, no safetensors weights (pickle `.bin` weights are
            refused, never unpickled), a truncated or corrupt `.safetensors` file.
    """
    from prunetrain.engine.persist import LAYOUT_FILE

    path = Path(path)
    if not path.is_dir() or not (path / CONFIG_FILE).is_file():
        raise ValueError(f"{argument}: {str(path)!r} is not a saved model directory (no {CONFIG_FILE}).")
    from prunetrain.engine.remote_code import is_guarded, plain_config_dict

    config = _read_json(path / CONFIG_FILE, argument)
    _check_architecture(path / CONFIG_FILE, plain_config_dict(config) if is_guarded(config) else config, argument)
    if (path / LAYOUT_FILE).is_file():
        _read_json(path / LAYOUT_FILE, argument)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = [name for name in PICKLE_WEIGHTS if (path / name).exists()]
        found = f" (it holds {pickles[0]}, pickle weights prunetrain does not unpickle)" if pickles else ""
        raise ValueError(f"{argument}: {str(path)!r} has no .safetensors weights{found}; save the model with "
                         f"save_pretrained(safe_serialization=True) or prunetrain.save_pruned.")
    for file in weights:
        _check_safetensors(file, argument)
    return path


def load_model_dir(path: str | os.PathLike, *, attn_implementation: str | None = None,
                   device: str | torch.device | None = None, argument: str = "model") -> nn.Module:
    """A saved model in eval mode, after `check_model_dir`: `prunetrain.load_pruned` when the directory holds a
    prunetrain layout, else Hugging Face `from_pretrained` with the class named in its config (`architectures[0]`,
    falling back to `AutoModel`).

    Args:
        path: the model directory.
        attn_implementation: attention backend (None: transformers' default).
        device: move the model there (default: where it loads, the CPU).
        argument: how error messages name the directory.
    """
    import transformers

    from prunetrain.engine.persist import LAYOUT_FILE, load_pruned

    path = check_model_dir(path, argument)
    if (path / LAYOUT_FILE).is_file():
        model = load_pruned(path)
    else:
        config = transformers.AutoConfig.from_pretrained(path)
        names = getattr(config, "architectures", None) or []
        cls = getattr(transformers, names[0], None) if names else None
        model = (cls or transformers.AutoModel).from_pretrained(path)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    if device is not None:
        model.to(device)
    return model.eval()
