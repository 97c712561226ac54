"""Saved model directories: checked file by file first, then loaded by the one loader every part of prunetrain uses.

`check_model_dir` reads every file a load would read and turns whatever is damaged or foreign into one `ValueError`
naming the file (and the field): a FIFO or device where a file should be; a config, layout or generation config that
is not a strict JSON object or has fields of the wrong type; a Trainer checkpoint given as a model; pickle weights
(never unpickled); and every `.safetensors` header parsed and checked completely before any tensor is read — the
header an object of objects, each tensor's dtype known and its byte range exactly `numel × itemsize` (a dtype that
lies), the ranges tiling the data without overlap or hole, and the file exactly as long as they say (truncated, or
padded with trailing bytes).
`load_model_dir` checks, loads (`load_pruned` for a prunetrain layout, else the Hugging Face class the config
names, after checking that the config describes the weights: `prunetrain.engine.weight_shapes`), and refuses a model
with a tensor missing from the weights (transformers would initialise it at random) or with parameters that are NaN
or infinite.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import torch
from torch import nn

from prunetrain.utils.files import check_regular_file, parse_json, read_json

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_WEIGHTS = ("pytorch_model.bin", "model.bin", "pytorch_model.bin.index.json")
TRAINER_STATE = "trainer_state.json"  # written by transformers' Trainer into every checkpoint-N directory
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit on the header
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                        "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
SIZE_FIELD = re.compile(r"(^|_)(layers?|heads|size|dim|positions|experts)$|^(num|n)_|^d_model$")
"""Config fields that count or size something: whole numbers >= 0 where the config class's default is an int."""
_LAYOUT_SITE_FIELDS = {"name": str, "kind": str, "layer": int, "num_heads": int, "head_dim": int, "num_kv_heads": int,
                       "heads": list, "original_num_heads": int}


# -------------------------------------------------------------------------------------------------------------------
# safetensors: the whole header is checked before any tensor is read
# -------------------------------------------------------------------------------------------------------------------
def _header_entry(where: str, key: str, entry) -> tuple[int, int]:
    """(begin, end) of one tensor's bytes after checking its header entry."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"{where}: the header entry of tensor {key!r} is {str(entry)[:80]!r}, not an object with "
                         f"exactly dtype, shape and data_offsets.")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in SAFETENSORS_ITEMSIZE:
        raise ValueError(f"{where}: tensor {key!r} has dtype {dtype!r}, which is not one of "
                         f"{', '.join(SAFETENSORS_ITEMSIZE)}.")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    if not isinstance(shape, list) or not all(whole(n) for n in shape):
        raise ValueError(f"{where}: tensor {key!r} has shape {shape!r}; expected a list of whole numbers >= 0.")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(whole(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: tensor {key!r} has data_offsets {offsets!r}; expected [begin, end] with "
                         f"0 <= begin <= end.")
    expected = math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
    if offsets[1] - offsets[0] != expected:
        raise ValueError(f"{where}: tensor {key!r} claims dtype {dtype} and shape {shape} ({expected} bytes) but "
                         f"spans {offsets[1] - offsets[0]} bytes; the header lies about it.")
    return offsets[0], offsets[1]


def read_safetensors_header(path: str | os.PathLike, argument: str = "model") -> dict[str, dict]:
    """The checked header of a `.safetensors` file, {tensor name: {dtype, shape, data_offsets}} (no tensor read).

    Raises:
        ValueError: one sentence naming the file: not a regular file, shorter than its header, a header that is
            not a strict JSON object of objects, an unknown dtype, a shape or byte range that does not fit its dtype,
            overlapping ranges or holes between them, or a file shorter or longer than the ranges say.
    """
    path = check_regular_file(path, argument)
    where = f"{argument}: {str(path)!r}"
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{where} is truncated ({size} bytes; not a safetensors file).")
        header_len = int.from_bytes(head, "little")
        if not 2 <= header_len <= MAX_HEADER_BYTES or 8 + header_len > size:
            raise ValueError(f"{where} is truncated or not safetensors (a header of {header_len} bytes in a "
                             f"{size}-byte file).")
        raw = handle.read(header_len)
    header = parse_json(raw, f"{where} is not a safetensors file: its header", dict)
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError(f"{where}: its __metadata__ is not an object of strings.")
    spans = sorted((_header_entry(where, key, entry), key) for key, entry in header.items())
    position = 0
    for (begin, end), key in spans:
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else f"leaves a hole of {begin - position} bytes"
            raise ValueError(f"{where}: tensor {key!r} at bytes {begin}..{end} {what}; the header's data_offsets "
                             f"are damaged.")
        position = end
    expected = 8 + header_len + position
    if size < expected:
        raise ValueError(f"{where} is truncated ({size} of {expected} bytes).")
    if size > expected:
        raise ValueError(f"{where} has {size - expected} bytes after its last tensor (padding or a damaged copy); "
                         f"expected {expected} bytes.")
    return header


def _check_index(directory: Path, argument: str) -> list[Path]:
    """The shards a `model.safetensors.index.json` names, each present; their tensors are the index's."""
    index = read_json(directory / INDEX_FILE, argument)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{argument}: {str(directory / INDEX_FILE)!r} field 'weight_map' is not an object of "
                         f"tensor name -> file name.")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard:
            raise ValueError(f"{argument}: {str(directory / INDEX_FILE)!r} names the shard {shard!r} outside the "
                             f"model directory.")
    return [directory / shard for shard in shards]


# -------------------------------------------------------------------------------------------------------------------
# config and layout
# -------------------------------------------------------------------------------------------------------------------
def _check_architecture(path: Path, config: dict, argument: str) -> None:
    """The config names a model type and class this transformers knows (else loading fails with a long traceback)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"{argument}: {str(path)!r} names model_type {model_type!r}, which transformers "
                         f"{transformers.__version__} does not know.")
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"{argument}: {str(path)!r} field 'architectures' is {architectures!r}; expected a list of "
                         f"class names.")
    for name in architectures or []:
        if not hasattr(transformers, name):
            raise ValueError(f"{argument}: {str(path)!r} names the architecture {name!r}, which transformers "
                             f"{transformers.__version__} does not have.")


def _type_problem(key: str, value, default) -> str | None:
    """What is wrong with `value` for a config field whose default is `default` (None: nothing)."""
    if value is None or default is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "expected true or false"
    if isinstance(default, int) and SIZE_FIELD.search(key):
        least = min(0, default)  # a class whose default is -1 reads it as "unset" (DeBERTa's max_relative_positions)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
        return None if ok else f"expected a whole number >= {least}"
    if isinstance(default, int):
        return None if number or isinstance(value, list) else "expected a number"
    if isinstance(default, float):
        return None if number and math.isfinite(value) else "expected a finite number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "expected a string"
    return None


def check_config_types(path: Path, config: dict, argument: str) -> None:
    """Every field whose default in the model type's config class is a bool, number or string holds one of that
    type (sizes and counts whole numbers >= 0), so a damaged config is named here, not deep inside a constructor."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        defaults = CONFIG_MAPPING[config["model_type"]]().to_dict()
    except Exception:  # a composite config without defaults: its sub-configs are checked by transformers
        return
    for key, value in config.items():
        problem = _type_problem(key, value, defaults.get(key))
        if problem:
            raise ValueError(f"{argument}: {str(path)!r} field {key!r} is {value!r}; {problem}.")


def _check_layout_file(path: Path, argument: str) -> None:
    """`prunetrain_layout.json`: {"family": str, "sites": [{name, kind, layer, num_heads, head_dim, num_kv_heads,
    heads, original_num_heads}, ...]}, each head list as long as num_heads; a bad field is named."""
    layout = read_json(path, argument)
    where = f"{argument}: {str(path)!r} field"
    if not isinstance(layout.get("family"), str):
        raise ValueError(f"{where} 'family' is {layout.get('family')!r}; expected a string.")
    sites = layout.get("sites")
    if not isinstance(sites, list):
        raise ValueError(f"{where} 'sites' is {str(sites)[:60]!r}; expected a list of sites.")
    for i, site in enumerate(sites):
        if not isinstance(site, dict):
            raise ValueError(f"{where} 'sites[{i}]' is {str(site)[:60]!r}; expected an object.")
        for key, kind in _LAYOUT_SITE_FIELDS.items():
            value = site.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
                raise ValueError(f"{where} 'sites[{i}].{key}' is {str(value)[:60]!r}; expected "
                                 f"{'a whole number >= 0' if kind is int else 'a ' + kind.__name__}.")
        heads = site["heads"]
        if len(heads) != site["num_heads"] or not all(isinstance(h, int) and not isinstance(h, bool) for h in heads):
            raise ValueError(f"{where} 'sites[{i}].heads' is {str(heads)[:60]!r}; expected num_heads="
                             f"{site['num_heads']} head indices.")


def check_trainer_checkpoint(path: Path, argument: str) -> None:
    """A Trainer checkpoint directory is not a saved model: refused with what to give instead."""
    if (path / TRAINER_STATE).exists():
        raise ValueError(f"{argument}: {str(path)!r} is a Trainer checkpoint ({TRAINER_STATE}), not a saved model: "
                         f"its weights do not carry the masks prunetrain's callbacks keep in their state. Resume "
                         f"training from it (--resume), or give a saved model directory (a run's full/ or pruned/, "
                         f"or one written by save_pruned).")


def check_model_dir(path: str | os.PathLike, argument: str = "model") -> Path:
    """Check a saved model directory without loading any tensor; returns it as a `Path`.

    Args:
        path: a directory written by `prunetrain.save_pruned` / `save_translation_model` / `save_pretrained`.
        argument: how error messages name it (the CLI passes its argument or flag, e.g. "model" or "source").

    Raises:
        ValueError: one sentence naming the file: no directory or `config.json`; a Trainer checkpoint; a file that
            is a FIFO or device; a config or `prunetrain_layout.json` that is not a strict JSON object or has a field
            of the wrong type; a model type or class transformers does not know; no safetensors weights (pickle
            weights are refused, never unpickled); a `.safetensors` header that is damaged in any way
            (`read_safetensors_header`).
    """
    from prunetrain.engine.persist import LAYOUT_FILE

    path = Path(path)
    config = path / CONFIG_FILE
    if not path.is_dir() or not (config.exists() or config.is_symlink()):  # a link loop is named by config_dict
        raise ValueError(f"{argument}: {str(path)!r} is not a saved model directory (no {CONFIG_FILE}).")
    check_trainer_checkpoint(path, argument)
    config_dict(path, argument)
    generation = path / GENERATION_FILE
    if generation.exists() or generation.is_symlink():  # else transformers skips a directory, fails on a list
        read_json(generation, argument)
    if (path / LAYOUT_FILE).exists():
        _check_layout_file(path / LAYOUT_FILE, argument)
    weights = _weight_files(path, argument)
    if not weights:
        pickles = [name for name in PICKLE_WEIGHTS if (path / name).exists()]
        found = f" (it holds {pickles[0]}, pickle weights prunetrain does not unpickle)" if pickles else ""
        raise ValueError(f"{argument}: {str(path)!r} has no .safetensors weights{found}; save the model with "
                         f"save_pretrained(safe_serialization=True) or prunetrain.save_pruned.")
    names: set[str] = set()
    for file in weights:
        names |= set(read_safetensors_header(file, argument))
    if (path / INDEX_FILE).exists():
        listed = set(read_json(path / INDEX_FILE, argument)["weight_map"])
        if listed != names:
            odd = sorted(listed ^ names)[0]
            raise ValueError(f"{argument}: {str(path / INDEX_FILE)!r} and its shards disagree about tensor {odd!r}.")
    return path


def config_dict(path: str | os.PathLike, argument: str = "model") -> dict:
    """The checked `config.json` of a model directory as a dict (strict JSON, known model type, field types), as
    the original architecture's config when it is a pruned directory's guarded one (`prunetrain.engine.remote_code`)."""
    from prunetrain.engine.remote_code import is_guarded, plain_config_dict

    path = Path(path) / CONFIG_FILE
    config = read_json(path, argument)
    if is_guarded(config):
        config = plain_config_dict(config)
    _check_architecture(path, config, argument)
    check_config_types(path, config, argument)
    return config


# -------------------------------------------------------------------------------------------------------------------
# loading
# -------------------------------------------------------------------------------------------------------------------
def _quiet_transformers():
    """transformers' load report and progress bars off (stderr is for prunetrain's one-line errors)."""
    import contextlib

    from transformers.utils import logging as hf_logging

    @contextlib.contextmanager
    def quiet():
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()

    return quiet()


def _weight_files(path: Path, argument: str) -> list[Path]:
    return _check_index(path, argument) if (path / INDEX_FILE).exists() else sorted(path.glob("*.safetensors"))


def check_dtypes(model: nn.Module, path: Path, argument: str) -> None:
    """A floating-point weight stored as integers or bools is a header that lies about its dtype (the bytes were
    written as floats): refused, never loaded as numbers of another kind."""
    state = model.state_dict()
    for file in _weight_files(path, argument):
        for key, entry in read_safetensors_header(file, argument).items():
            if key in state and state[key].is_floating_point() and not entry["dtype"].startswith(("F", "BF")):
                raise ValueError(f"{argument}: {str(file)!r} stores the floating-point weight {key!r} as "
                                 f"{entry['dtype']}; its header lies about the dtype.")


def check_finite(model: nn.Module, path: Path, argument: str) -> None:
    """Refuse a model with a NaN or infinite parameter (it would translate to empty strings, score NaN, ...)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.is_floating_point() and not bool(torch.isfinite(param).all()):
                raise ValueError(f"{argument}: {str(path)!r} holds NaN or infinite values in tensor {name!r}; the "
                                 f"weights are damaged.")


def _check_plain_shapes(path: Path, config, cls, argument: str) -> None:
    """The config of a directory without a prunetrain layout describes its weights (`weight_shapes`): a config
    stating more heads than the weights hold is refused, never loaded as a different model."""
    from prunetrain.engine.weight_shapes import check_weight_shapes

    headers: dict[str, dict] = {}
    for file in _weight_files(path, argument):
        headers.update(read_safetensors_header(file, argument))
    check_weight_shapes(path, config, cls, headers, argument)


def _from_pretrained(cls, path: Path, argument: str):
    """`cls.from_pretrained(path)` with its loading info; transformers' size-mismatch report (a shape the check
    above could not match by name) becomes one sentence."""
    try:
        return cls.from_pretrained(path, output_loading_info=True)
    except RuntimeError as err:
        if "mismatched" not in str(err) and "size mismatch" not in str(err):
            raise
        raise ValueError(f"{argument}: {str(path)!r} holds tensors whose shapes differ from what its config.json "
                         f"gives them; the config does not describe these weights, so the model is refused.") \
            from None


def load_model_dir(path: str | os.PathLike, *, attn_implementation: str | None = None,
                   device: str | torch.device | None = None, argument: str = "model") -> nn.Module:
    """A saved model in eval mode, after `check_model_dir`: `prunetrain.load_pruned` when the directory holds a
    prunetrain layout (masks saved with the model shrink it: what they remove is gone), else Hugging Face
    `from_pretrained` with the class named in its config (`architectures[0]`, falling back to `AutoModel`).
    Refused: a tensor of the model missing from the weights, a floating-point weight stored as integers (a header
    that lies about its dtype), and NaN or infinite parameters.

    Args:
        path: the model directory.
        attn_implementation: attention backend (None: transformers' default).
        device: move the model there (default: where it loads, the CPU).
        argument: how error messages name the directory.
    """
    import transformers

    from prunetrain.engine.persist import LAYOUT_FILE, load_pruned

    path = check_model_dir(path, argument)
    with _quiet_transformers():
        if (path / LAYOUT_FILE).is_file():
            try:
                model = load_pruned(path, masks="shrink")  # saved masks made physical: inference and export
            except ValueError as err:  # load_pruned names its argument "path"; name it as the caller does
                raise ValueError(f"{argument}: {str(err).removeprefix('path: ')}") from None
        else:
            config = transformers.AutoConfig.from_pretrained(path)
            names = getattr(config, "architectures", None) or []
            cls = getattr(transformers, names[0], None) if names else None
            _check_plain_shapes(path, config, cls, argument)
            model, info = _from_pretrained(cls or transformers.AutoModel, path, argument)
            missing = sorted(map(str, info.get("missing_keys") or []))
            if missing:
                raise ValueError(f"{argument}: {str(path)!r} lacks tensor {missing[0]!r} ({len(missing)} missing); "
                                 f"transformers would initialise it at random, so the model is refused.")
    check_dtypes(model, path, argument)
    check_finite(model, path, argument)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    if device is not None:
        model.to(device)
    return model.eval()


__all__ = ["check_config_types", "check_dtypes", "check_finite", "check_model_dir", "check_trainer_checkpoint", "config_dict",
           "load_model_dir", "read_safetensors_header"]
