"""`prunetrain export`: write a pruned model in a format other runtimes load (see docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from prunetrain.cli.common import UserError, app, emit
from prunetrain.utils.validate import check_choice

FORMATS = ("remote-code", "uniform", "padded", "onnx", "gguf")  # prunetrain.export.formats.FORMATS (kept import-free here)


@app.command("export")
def export_command(
    source: Path = typer.Argument(..., help="Pruned model directory (written by save_pruned / prunetrain shrink)."),
    destination: Optional[Path] = typer.Argument(None, help="Directory to create (not with --check)."),
    format: str = typer.Option("remote-code", "--format", "-f",
                               help="remote-code (self-contained, trust_remote_code=True) | uniform (standard "
                                    "config, same heads everywhere) | padded (original shapes, removed heads zero: "
                                    "exact, no speed-up) | onnx (ONNX Runtime graphs) | gguf (llama.cpp, Llama "
                                    "family, per-layer heads)."),
    gguf_type: Optional[str] = typer.Option(None, "--gguf-type", help="With --format gguf: f32 (default, exact), "
                                                                      "f16 or q8_0 (checked within a stated "
                                                                      "tolerance, docs/export.md)."),
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
    if not (source / "config.json").is_file():
        raise UserError(f"source: {str(source)!r} is not a saved model directory (no config.json).")
    if check:
        if destination is not None:
            raise UserError("destination: --check writes nothing; give only SOURCE.")
        from prunetrain.export.formats import check_formats

        reasons = check_formats(source)
        emit({"source": str(source), "formats": {f: {"possible": r is None, **({"why_not": r} if r else {})}
                                                  for f, r in reasons.items()}}, None)
        return
    if destination is None:
        raise UserError("destination: missing; usage: prunetrain export SOURCE DESTINATION --format FORMAT.")
    from prunetrain.utils.output_paths import check_output_dir

    check_output_dir(destination, overwrite=overwrite, flag="destination", inputs={"source": source})
    if format == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError:
            raise UserError("--format: onnx needs the onnx and onnxruntime packages (pip install "
                            "'prunetrain[onnx]').") from None
    if format == "gguf":
        from prunetrain.export.llama_cpp import llama_cpp_missing

        missing = llama_cpp_missing()
        if missing is not None:
            raise UserError(f"--format: gguf is checked in llama.cpp; {missing}")
    from prunetrain.export.formats import export

    emit(export(source, destination, format, overwrite=overwrite, gguf_type=gguf_type), None)
