"""What every `prunetrain` command shares: the typer application the command modules register on, the one-line
user error (`UserError`), JSON output (`emit`), progress lines, and the checks of what the user gave (each names its
flag) made before any work or any write. Where a command may write is decided by `prunetrain.utils.output_paths`;
model directories are read by `prunetrain.engine.model_dir` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from prunetrain.utils import output_paths
from prunetrain.utils.validate import check_fractions, check_int

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Prune attention heads during training of transformer models (Michel et al. 2019, "
                       "Voita et al. 2019).")
TOKENIZER_HELP = "Tokenizer directory, when it is not inside the model directory (never guessed from elsewhere)."


class UserError(Exception):
    """A mistake in the user's input: reported in one line, exit code 2."""


def emit(result: dict, output: Optional[Path], what: str = "result") -> None:
    """Print `result` as standard JSON (a NaN is an error naming its key, never a `NaN` token) and write it to
    `output` (checked by the command before any work) atomically."""
    from prunetrain.utils.files import dumps_strict
    from prunetrain.utils.write_errors import write_errors

    text = dumps_strict(result, what, indent=1, default=str)
    if output is not None:
        with write_errors("--output", output):  # a full or read-only disk: one line naming --output
            output_paths.write_file(output, text)
    typer.echo(text)


def progress_line(message: str) -> None:
    typer.echo(message, err=True)


# -------------------------------------------------------------------------------------------------------------------
# checks of what the user gave, made before any work (each names its flag)
# -------------------------------------------------------------------------------------------------------------------
def check_output_file(output: Path, flag: str = "--output", **inputs: Optional[Path]) -> None:
    """A file may be written at `output`: not a directory, its directory exists, and it is none of `inputs`
    (`name=path`, underscores spell dashes) nor inside one of them."""
    output_paths.check_output_file(output, flag=flag, inputs=_named(inputs))


def check_output_dir(output: Path, overwrite: bool, flag: str = "--output", in_place: Optional[str] = None,
                      **inputs: Optional[Path]) -> None:
    """A directory may be written at `output`: absent or empty, or with `--overwrite` one prunetrain wrote; never
    one of `inputs`, inside one or holding one (except the input named `in_place`, replaced with --overwrite)."""
    output_paths.check_output_dir(output, overwrite=overwrite, flag=flag, inputs=_named(inputs), in_place=in_place)


def _named(inputs: dict) -> dict:
    """{"model": p, "data_dir": q} -> {"model": p, "--data-dir": q} (how the user typed them)."""
    return {(name if name in ("model", "model_a", "model_b", "source") else "--" + name.replace("_", "-")): path
            for name, path in inputs.items()}


def check_data_dir(data_dir: Path, flag: str = "--data-dir") -> Path:
    if not data_dir.is_dir():
        raise UserError(f"{flag}: {str(data_dir)!r} is not a directory.")
    return data_dir


def load_model(path: Path, argument: str = "model"):
    from prunetrain.engine.model_dir import load_model_dir

    return load_model_dir(path, argument=argument)


def translation_model_dir(path: Path, argument: str = "model") -> Path:
    """A checked model directory whose config is an encoder-decoder (translation) model."""
    from prunetrain.engine.model_dir import check_model_dir, config_dict

    check_model_dir(path, argument)
    config = config_dict(path, argument)
    if not config.get("is_encoder_decoder"):
        kind = (config.get("architectures") or [config.get("model_type")])[0]
        raise UserError(f"{argument}: {str(path)!r} holds a {kind}, not a translation (encoder-decoder) model; this "
                        f"command translates parallel text with it.")
    return path


def load_tokenizer(model: Path, tokenizer: Optional[Path]):
    from prunetrain.mt.evaluation.translation import load_model_tokenizer

    if tokenizer is not None and not (tokenizer / "tokenizer.json").is_file():
        raise UserError(f"--tokenizer: {str(tokenizer)!r} holds no tokenizer.json.")
    return load_model_tokenizer(model, tokenizer)


def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--fractions: {text!r} is not a comma-separated list of numbers.") from None
    return check_fractions("--fractions", values)


def parse_ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a comma-separated list of integers.") from None
    if not values:
        raise UserError(f"{flag}: {text!r} holds no integer.")
    for value in values:
        check_int(flag, value, 1)
    return values


def check_positive(**flags: int) -> None:
    """Each `flag=value` (underscores spell dashes) must be an integer >= 1."""
    for name, value in flags.items():
        check_int("--" + name.replace("_", "-"), value, 1)


def translation_batches(model_dir: Path, tokenizer_dir: Optional[Path], data_dir: Path, split: str,
                         num_batches: int, batch_size: int, net):
    from prunetrain.mt.text.data import build_dataset, collate_batches, make_collator, read_parallel

    tokenizer = load_tokenizer(model_dir, tokenizer_dir)
    pairs = read_parallel(data_dir, split, limit=num_batches * batch_size)
    dataset = build_dataset(pairs, tokenizer, max_length=SENTENCE_TOKENS)
    _check_positions(dataset, net, data_dir, split)
    batches = collate_batches(dataset, make_collator(tokenizer, net), batch_size)
    return tokenizer, pairs, batches


SENTENCE_TOKENS = 128
"""Where `translation_batches` cuts a longer sentence (keeping its final `</s>`), as it always has."""


def _check_positions(dataset, net, data_dir: Path, split: str) -> None:
    """A sentence with more tokens than the model has positions cannot be scored (the position embedding has no row
    for it): refused before any work, naming the file, the line, its length and the model's positions."""
    limit = getattr(getattr(net, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int):
        return
    for index in range(len(dataset)):
        example = dataset[index]
        for field, lang in (("input_ids", "de"), ("labels", "en")):
            length = len(example[field])
            if length > limit:
                shown = f"{length}" if length < SENTENCE_TOKENS else f"{SENTENCE_TOKENS} or more"
                raise UserError(f"--data-dir: line {index + 1} of {str(data_dir / f'{split}.{lang}')!r} has {shown} "
                                f"tokens, more than the model's {limit} positions (max_position_embeddings); shorten "
                                f"or remove it.")


__all__ = ["TOKENIZER_HELP", "UserError", "app", "check_data_dir", "check_output_dir", "check_output_file",
           "check_positive", "emit", "load_model", "load_tokenizer", "parse_fractions", "parse_ints", "progress_line",
           "translation_batches", "translation_model_dir"]
