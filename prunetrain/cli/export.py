"""`prunetrain export`: write a pruned model in a format other runtimes load (see docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from prunetrain.cli.common import UserError, app, emit
from prunetrain.utils.extras import packages_missing
from prunetrain.utils.validate import check_choice

FORMATS = ("remote-code", "uniform", "padded", "onnx", "gguf", "ctranslate2")  # prunetrain.export.formats.FORMATS (kept import-free here)


@app.command("export")
def export_command(
    source: Path = typer.Argument(..., help="Pruned model directory (written by save_pruned / prunetrain shrink)."),
    destination: Optional[Path] = typer.Argument(None, help="Directory to create (not with --check)."),
    format: str = typer.Option("remote-code", "--format", "-f",
                               help="remote-code (self-contained, trust_remote_code=True) | uniform (standard "
                                    "config, same heads everywhere, one FFN width per config key) | padded "
                                    "(original shapes, removed heads and FFN neurons zero: exact, no speed-up) | "
                                    "onnx (ONNX Runtime graphs) | gguf (llama.cpp: Llama family with per-layer "
                                    "heads; Qwen3, Gemma 2/3, Phi-3, OLMo 2, Granite with zero heads padding every "
                                    "layer to the same count) | ctranslate2 (CTranslate2: Marian, BART, "
                                    "mBART, M2M-100/NLLB, Pegasus; heads padded per stack, per-layer FFN widths)."),
    gguf_type: Optional[str] = typer.Option(None, "--gguf-type", help="With --format gguf: f32 (default, exact), "
                                                                      "f16 or q8_0 (checked within a stated "
                                                                      "tolerance, docs/export.md)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="With --format ctranslate2: "
                                               "CTranslate2's weight type, float32 (default, exact), int8, "
                                               "int8_float32, int16, float16, bfloat16, int8_float16, int8_bfloat16."),
    check: bool = typer.Option(False, "--check", help="List the formats SOURCE can be written in, and why not the "
                                                      "others; writes nothing."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing non-empty DESTINATION."),
) -> None:
    """Export a pruned model so that it runs without prunetrain; prints a JSON summary on stdout."""
    if not check:
        check_choice("--format", format, FORMATS)
        if gguf_type is not None:
            if format != "gguf":
                raise UserError(f"--gguf-type: {gguf_type!r} is only for --format gguf, not {format!r}.")
            check_choice("--gguf-type", gguf_type, ("f32", "f16", "q8_0"))
        if quantization is not None:
            if format != "ctranslate2":
                raise UserError(f"--quantization: {quantization!r} is only for --format ctranslate2, not {format!r}.")
            from prunetrain.export.ctranslate2 import QUANTIZATIONS

            check_choice("--quantization", quantization, QUANTIZATIONS)
    config = source / "config.json"
    if not config.is_file():
        what = ("its config.json is a link that leads nowhere or in a loop" if config.is_symlink()
                else "its config.json is not a regular file" if config.exists() else "no config.json")
        raise UserError(f"source: {str(source)!r} is not a saved model directory ({what}).")
    if check:
        if destination is not None:
            raise UserError("destination: --check writes nothing; give only SOURCE.")
        from prunetrain.export.formats import check_formats

        reasons = check_formats(source)
        formats = {f: {"possible": r is None, **({"why_not": r} if r else {})} for f, r in reasons.items()}
        if reasons.get("gguf") is None and _pads_heads_in_gguf(config):  # the zero heads and neurons it runs
            from prunetrain.export.gguf import gguf_padding

            formats["gguf"]["padding"] = gguf_padding(source)
        emit({"source": str(source), "formats": formats}, None)
        return
    if destination is None:
        raise UserError("destination: missing; usage: prunetrain export SOURCE DESTINATION --format FORMAT.")
    from prunetrain.utils.output_paths import check_output_dir, output_lock

    with output_lock(destination, flag="destination"):  # held until the export is in place; a second writer fails
        check_output_dir(destination, overwrite=overwrite, flag="destination", inputs={"source": source})
        _check_format_installed(format)
        from prunetrain.export.formats import export

        emit(export(source, destination, format, overwrite=overwrite, gguf_type=gguf_type,
                    quantization=quantization), None)


def _check_format_installed(format: str) -> None:
    """The packages a format is written and checked with are installed (one line naming --format if not)."""
    if format == "onnx" and (missing := packages_missing("onnx", "onnxruntime")):
        raise UserError(f"--format: onnx is checked in ONNX Runtime; {missing}")
    if format == "ctranslate2" and (missing := packages_missing("ctranslate2")):
        raise UserError(f"--format: ctranslate2 is checked in CTranslate2; {missing}")
    if format == "gguf":
        from prunetrain.export.llama_cpp import llama_cpp_missing

        missing = llama_cpp_missing()
        if missing is not None:
            raise UserError(f"--format: gguf is checked in llama.cpp; {missing}")


def _pads_heads_in_gguf(config: Path) -> bool:
    """Whether the model of `config` is of a family whose GGUF export pads every layer's heads to the same count."""
    import json

    from prunetrain.engine.remote_code import MODEL_TYPE_SUFFIX
    from prunetrain.export.gguf_families import FAMILY_ARCH

    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(model_type, str) and model_type.removesuffix(MODEL_TYPE_SUFFIX) in FAMILY_ARCH
