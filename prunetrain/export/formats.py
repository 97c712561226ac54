"""`export(source, destination, format)` and `check_formats(source)`: one entry point for every export format.

Each format writes into a staging directory beside `destination` and is renamed into place only after its output
was checked against the model on a probe input, so a refused or failed export leaves nothing behind. Files of the
source directory that are not model files (tokenizer, recipe, ...) are copied along.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
from contextlib import nullcontext
from pathlib import Path

from torch import nn

from prunetrain.engine.heads import (find_heads, find_neurons, find_sites, recorded_units, supported_units,
                                     unwrap_model)
from prunetrain.engine.read_only import left_as_given
from prunetrain.export.source import load_source
from prunetrain.utils.door import checked
from prunetrain.utils.extras import packages_missing
from prunetrain.utils.output_paths import (MARKER_FILE, check_output_dir, output_lock, replace_directory,
                                           staging_directory)
from prunetrain.utils.validate import check_choice
from prunetrain.utils.write_errors import write_failure

FORMATS = ("remote-code", "uniform", "padded", "onnx", "gguf", "ctranslate2")
MODEL_FILES = ("config.json", "generation_config.json", "prunetrain_layout.json", "modeling_prunetrain.py")
TOLERANCE = {"remote-code": 0.0, "uniform": 0.0, "padded": 1e-5}


def _is_shrunk(model: nn.Module) -> bool:
    """Whether some site (heads, or FFN neurons where the family's FFN is prunable) lost units."""
    return any(s.num_heads != s.original_num_heads for s in find_sites(model, supported_units(model)))


@checked
def check_formats(source: str | os.PathLike | nn.Module) -> dict[str, str | None]:
    """For each format, None if `source` can be written in it, else one sentence saying why not.

    Args:
        source: a model or a saved model directory.
    """
    from prunetrain.engine.remote_code import remote_spec
    from prunetrain.export.uniform import uniform_config

    from prunetrain.export.probe import probe_inputs

    model = load_source(source)
    try:
        probe_inputs(model)
    except ValueError as err:  # every export is checked on token inputs
        return {fmt: str(err).removeprefix("model: ") for fmt in FORMATS}
    out: dict[str, str | None] = {}
    for fmt, probe in (("remote-code", remote_spec), ("uniform", uniform_config)):
        try:
            probe(model)
            out[fmt] = None
        except ValueError as err:
            out[fmt] = str(err).removeprefix("format: ").removeprefix("model: ")
    out["padded"] = None
    out["onnx"] = packages_missing("onnx", "onnxruntime")
    from prunetrain.export.gguf import gguf_reason

    out["gguf"] = gguf_reason(model, source if isinstance(source, (str, os.PathLike)) else None)
    from prunetrain.export.ctranslate2 import ctranslate2_reason

    out["ctranslate2"] = ctranslate2_reason(model, source if isinstance(source, (str, os.PathLike)) else None)
    return out


@checked
def export(source: str | os.PathLike | nn.Module, destination: str | os.PathLike, format: str,
           overwrite: bool = False, gguf_type: str | None = None, quantization: str | None = None) -> dict:
    """Write `source` (a pruned model or directory) to `destination` in `format`; returns a summary dict.

    Args:
        source: a model, or a directory written by `save_pruned` (or `save_pretrained`).
        destination: the directory to create.
        format: one of `FORMATS`: "remote-code" (self-contained directory, `trust_remote_code=True`), "uniform"
            (standard config, every site the same heads, one FFN width per config key), "padded" (original shapes,
            removed heads and FFN neurons zero: exact, no speed-up), "onnx" (ONNX graphs checked with ONNX
            Runtime), "gguf" (llama.cpp: the Llama family, and Qwen3, Phi-3, OLMo 2, Granite, Gemma 2/3 padded per
            layer; checked in llama.cpp; `max_abs_diff` is then relative to the largest logit), "ctranslate2" (CTranslate2: Marian, BART, mBART, M2M-100/NLLB and Pegasus translation
            models, heads padded per stack, each FFN at its own width; `max_abs_diff` is on log-probabilities in the
            engine; the source must be a directory that carries the tokenizer).
        overwrite: replace an existing non-empty `destination` (only what the CLI's `--overwrite` replaces: an empty
            directory or one prunetrain wrote, never the current, home or root directory).
        gguf_type: "f32" (default), "f16" or "q8_0", for format "gguf" only.
        quantization: CTranslate2's weight type ("float32", the default and exact; "int8", ...), for format
            "ctranslate2" only.

    Returns:
        {"format", "destination", "files", "max_abs_diff", "heads"}, + "neurons" (FFN neurons per kind) once an FFN
        was shrunk; for padded + "heads_kept", "heads_executed" (+ "neurons_kept", "neurons_executed" where FFN
        neurons are prunable): the units kept and the units the export runs, removed ones as zeros; for gguf +
        "gguf_type"; for ctranslate2 + "quantization", "max_abs_diff_quantized", "heads_kept", "heads_executed",
        "neurons_kept", "neurons_executed" (one zero neuron runs in each FFN with none left).
    """
    check_choice("format", format, FORMATS)
    if gguf_type is not None and format != "gguf":
        raise ValueError(f"gguf_type: {gguf_type!r} is only for format 'gguf', not {format!r}.")
    if quantization is not None and format != "ctranslate2":
        raise ValueError(f"quantization: {quantization!r} is only for format 'ctranslate2', not {format!r}.")
    if format == "ctranslate2":
        from prunetrain.export.ctranslate2 import QUANTIZATIONS

        quantization = quantization or "float32"
        check_choice("quantization", quantization, QUANTIZATIONS)
        if missing := packages_missing("ctranslate2"):
            raise ValueError(f"format: ctranslate2 is checked in CTranslate2; {missing}")
    if format == "onnx" and (missing := packages_missing("onnx", "onnxruntime")):
        raise ValueError(f"format: onnx is checked in ONNX Runtime; {missing}")
    if format == "gguf":
        from prunetrain.export.gguf import GGUF_TYPES

        gguf_type = gguf_type or "f32"
        check_choice("gguf_type", gguf_type, GGUF_TYPES)
    destination = Path(destination)
    with output_lock(destination, flag="destination"):  # one writer at a time, checked under the lock
        check_output_dir(destination, overwrite=overwrite, flag="destination", overwrite_flag="overwrite=True "
                         "(--overwrite)", inputs={"source": source} if isinstance(source, (str, os.PathLike)) else {})
        # inputs are read-only: the modes and config of a given model are put back, whatever the export did
        with left_as_given(unwrap_model(source)) if isinstance(source, nn.Module) else nullcontext():
            return _export_locked(source, destination, format, gguf_type, quantization)


def _export_locked(source, destination: Path, format: str, gguf_type: str | None, quantization: str | None) -> dict:
    """`export` once `destination` is checked and locked."""
    model = load_source(source).eval()
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # stderr is for one-line errors
    try:  # staged beside the destination and removed at any error or signal; the old destination stays whole
        with staging_directory(destination) as staging:  # until the new one is complete (utils/output_paths.py)
            out = staging / "out"
            tokenizer_dir = source if isinstance(source, (str, os.PathLike)) else None
            extra: dict = {"gguf_type": gguf_type} if format == "gguf" else {}
            if format == "gguf":
                from prunetrain.export.gguf import export_gguf, gguf_plan, padding_report

                diff = export_gguf(model, out, gguf_type, tokenizer_dir)
                extra.update(padding_report(gguf_plan(model)))
            elif format == "ctranslate2":
                from prunetrain.export.ctranslate2 import export_ctranslate2, padding_report

                diffs = export_ctranslate2(model, out, tokenizer_dir, quantization)
                diff = diffs["max_abs_diff"]
                report = padding_report(model)
                extra = {"quantization": quantization, "max_abs_diff_quantized": diffs["max_abs_diff_quantized"],
                         **{key: report[key] for key in ("heads_kept", "heads_executed", "neurons_kept",
                                                         "neurons_executed")}}
            else:
                diff = _write(model, out, format)
                if format == "padded":
                    from prunetrain.export.padded import padding_report

                    extra = padding_report(model)
            if isinstance(source, (str, os.PathLike)):
                _copy_extras(Path(source), out)
            replace_directory(out, destination, kind="export", format=format)  # marked as prunetrain's
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    summary = {"format": format, "destination": str(destination),
               "files": sorted(p.name for p in destination.iterdir() if p.name != MARKER_FILE), "max_abs_diff": diff,
               "heads": find_heads(model).summary()}
    if "neurons" in recorded_units(model):
        summary["neurons"] = find_neurons(model).summary()
    return {**summary, **extra}


def _write(model: nn.Module, out: Path, fmt: str) -> float:
    from prunetrain.export.probe import verify

    if fmt == "onnx":
        from prunetrain.export.onnx import check_onnx, export_onnx

        out.mkdir()
        try:
            export_onnx(model, out)
            diff = check_onnx(model, out)
        except ValueError:
            raise
        except Exception as err:  # e.g. a family whose cache the KV-cache graph cannot rebuild: one line, no traceback
            if write_failure(err, out) is not None:  # a full or read-only disk: named with the destination by the
                raise  # caller's output_lock (prunetrain.utils.write_errors)
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise ValueError(f"format: {type(model).__name__} could not be exported to ONNX ({type(err).__name__}: "
                             f"{first}).") from err
        if model.can_generate():  # decoder start, EOS and pad ids for generation loops
            model.generation_config.save_pretrained(out)
        return diff
    if fmt == "remote-code":
        from prunetrain.engine.persist import save_pruned
        from prunetrain.engine.remote_code import remote_spec

        remote_spec(model)  # refuses what the standalone modeling file cannot rebuild
        save_pruned(model, out)
        return verify(_load_remote(out, model), model, fmt, TOLERANCE[fmt]) if _is_shrunk(model) else 0.0
    if fmt == "uniform":
        from prunetrain.export.uniform import uniform_model

        exported = uniform_model(model)
    else:
        from prunetrain.export.padded import padded_model

        exported = padded_model(model)
    diff = verify(exported, model, fmt, TOLERANCE[fmt])
    if model.can_generate():  # the source's generation settings (a config saved by a Trainer says use_cache=False,
        exported.generation_config = copy.deepcopy(model.generation_config)  # its generation config says True)
    exported.save_pretrained(out)
    return diff


def _load_remote(path: Path, model: nn.Module) -> nn.Module:
    """The written directory loaded as a user without prunetrain would (through its `auto_map`)."""
    import transformers

    from prunetrain.engine.persist import _quiet_from_pretrained
    from prunetrain.engine.remote_code import auto_classes

    autos = auto_classes(model)
    auto = next((a for a, cls in autos.items() if cls == type(model).__name__), "AutoModel")
    attn = getattr(model.config, "_attn_implementation", None)
    return _quiet_from_pretrained(getattr(transformers, auto), path, trust_remote_code=True,
                                  attn_implementation=attn).eval()


OTHER_WEIGHTS = re.compile(r"^(pytorch_model.*\.bin(\.index\.json)?|model\.bin|tf_model\.h5|flax_model\.msgpack"
                           r"|.*\.(pt|pth|ckpt|pkl|pickle))$")
"""Weights of the source in other formats (pickles among them): never copied beside the export's own weights."""


def _copy_extras(source: Path, out: Path) -> None:
    for item in source.iterdir():
        if item.name in MODEL_FILES or item.name.startswith("model") and ".safetensors" in item.name:
            continue
        if item.name.startswith(".") or OTHER_WEIGHTS.match(item.name):
            continue
        target = out / item.name
        if target.exists():
            continue
        try:
            if item.is_dir():
                shutil.copytree(item, target)
            else:
                shutil.copy2(item, target)
        except (OSError, shutil.Error) as err:  # shutil.Error lists every failed file: name the first one
            if write_failure(err, out) is not None:  # the export's disk, not the source, failed
                raise
            first = err.args[0][0] if isinstance(err, shutil.Error) and err.args and err.args[0] else None
            why = err.strerror or type(err).__name__
            if first:  # the failing file named inside the source folder, so its reason is never cut off
                name = os.path.relpath(first[0], item)
                why = f"{name}: {str(first[2]).replace(str(first[0]), name)}"
            raise ValueError(f"source: {str(item)!r} could not be copied into the export ({str(why)[:200]}).") \
                from None


__all__ = ["FORMATS", "check_formats", "export", "load_source"]
