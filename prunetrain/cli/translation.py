"""`prunetrain evaluate` (sacreBLEU and chrF of a saved translation model) and `prunetrain translate` (a file, line
by line)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from prunetrain.cli.common import (TOKENIZER_HELP, app, check_data_dir, check_output_file, check_positive, emit,
                                   load_model, load_tokenizer, translation_model_dir)

MAX_LINE_BYTES = 1 << 20
"""The longest input line `translate` reads (1 MiB): far beyond any sentence a translation model's positions hold."""
MAX_INPUT_BYTES = 256 << 20
"""The most input `translate` reads in one run (256 MiB): an endless stream is refused instead of filling memory."""


def read_input_lines(stream, name: str) -> list[str]:
    """The lines of a binary `stream` (split at `\\n` only, as `prunetrain.mt.text.data.split_lines`), read line by line
    and bounded: a line longer than `MAX_LINE_BYTES`, a NUL byte (binary input such as /dev/zero) or more than
    `MAX_INPUT_BYTES` in all is refused as soon as it is read, naming the line."""
    from prunetrain.mt.text.data import decode_utf8, split_lines

    chunks, total = [], 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            break
        number = len(chunks) + 1
        if b"\0" in raw:
            raise ValueError(f"{name}: line {number} holds a NUL byte; the input is binary, not text with one "
                             f"sentence per line.")
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise ValueError(f"{name}: line {number} is longer than {MAX_LINE_BYTES} bytes; give one sentence per "
                             f"line.")
        total += len(raw)
        if total > MAX_INPUT_BYTES:
            raise ValueError(f"{name}: more than {MAX_INPUT_BYTES >> 20} MiB of input (at line {number}); translate "
                             f"it in parts.")
        chunks.append(raw)
    return split_lines(decode_utf8(b"".join(chunks), name))


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
    from prunetrain.mt.evaluation.translation import evaluate_directory

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
    from prunetrain.mt.evaluation.translation import translate as run_translate
    from prunetrain.mt.text.data import format_lines, write_lines

    check_positive(beams=beams, batch_size=batch_size)
    translation_model_dir(model)
    if output is not None:
        check_output_file(output, model=model, input=input, tokenizer=tokenizer)
    if str(input) == "-":
        lines = read_input_lines(sys.stdin.buffer, "--input: stdin")
    else:
        from prunetrain.utils.files import check_regular_file

        with open(check_regular_file(input, "--input"), "rb") as stream:  # not a FIFO or device such as /dev/zero
            lines = read_input_lines(stream, f"--input: {input}")
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
        from prunetrain.utils.write_errors import write_errors

        with write_errors("--output", output):  # a full or read-only disk: one line naming --output
            write_lines(output, hypotheses)
