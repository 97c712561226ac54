"""`prunetrain evaluate` (sacreBLEU and chrF of a saved translation model) and `prunetrain translate` (a file, line
by line)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from prunetrain.cli.common import (TOKENIZER_HELP, app, check_data_dir, check_output_file, check_positive, emit,
                                   load_model, load_tokenizer, translation_model_dir)


@app.command()
def evaluate(
    model: Path = typer.Argument(..., help="A saved full or pruned model directory (with its tokenizer)."),
    data_dir: Path = typer.Option(..., help="Parallel-text directory."),
    split: str = typer.Option("test", help="Split to score (e.g. test, valid, test_2017_flickr)."),
    src: str = typer.Option("de"), tgt: str = typer.Option("en"),
    beams: int = typer.Option(4, help="Beam size (1 = greedy)."),
    batch_size: int = typer.Option(50),
    limit: Optional[int] = typer.Option(None, help="Only the first N sentences."),
    bf16: bool = typer.Option(False, help="bf16 autocast."),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    output: Optional[Path] = typer.Option(None, help="Write the JSON here too."),
):
    """sacreBLEU (with signature) and chrF of a saved model on a parallel text directory."""
    from prunetrain.mt.translation import evaluate_directory

    check_positive(beams=beams, batch_size=batch_size, **({"limit": limit} if limit is not None else {}))
    translation_model_dir(model)
    check_data_dir(data_dir)
    if output is not None:
        check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    if tokenizer is not None:
        load_tokenizer(model, tokenizer)
    result = evaluate_directory(model, data_dir, split, src=src, tgt=tgt, limit=limit, num_beams=beams,
                                batch_size=batch_size, autocast_bf16=bf16, tokenizer_path=tokenizer)
    emit({k: v for k, v in result.items() if k != "hypotheses"}, output, "evaluate")


@app.command()
def translate(
    model: Path = typer.Argument(..., help="A saved full or pruned model directory (with its tokenizer)."),
    input: Path = typer.Option(..., "--input", help="Source sentences, one per line ('-' for stdin)."),
    output: Optional[Path] = typer.Option(None, help="Write translations here (default stdout)."),
    beams: int = typer.Option(4), batch_size: int = typer.Option(50), bf16: bool = typer.Option(False),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
):
    """Translate a file line by line: line i of the output is the translation of line i of the input (lines end at
    `\\n` only; a line break inside a translation becomes a space)."""
    from prunetrain.mt.data import decode_utf8, format_lines, read_lines, split_lines, write_lines
    from prunetrain.mt.translation import translate as run_translate

    check_positive(beams=beams, batch_size=batch_size)
    translation_model_dir(model)
    if output is not None:
        check_output_file(output, model=model, input=input, tokenizer=tokenizer)
    if str(input) == "-":
        lines = split_lines(decode_utf8(sys.stdin.buffer.read(), "--input: stdin"))
    else:
        lines = read_lines(input, argument="--input")
    tok = load_tokenizer(model, tokenizer)
    hypotheses = []
    if lines:
        net = load_model(model)
        hypotheses = run_translate(net, tok, lines, batch_size=batch_size, num_beams=beams, autocast_bf16=bf16)
    hypotheses = [h.replace("\r", " ").replace("\n", " ") for h in hypotheses]  # one output line per input line
    if output is None:
        sys.stdout.write(format_lines(hypotheses))
        sys.stdout.flush()
    else:
        write_lines(output, hypotheses)
