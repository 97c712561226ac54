"""`prunetrain` command line (typer). Every command is a thin layer over a library function.

Every input is checked before any work or any write, and errors in what the user gave (unknown recipe or key, a
value out of range, missing or damaged files, an output directory that already holds something, ...) are one line
on stderr naming the flag or recipe key, with exit code 2 and no traceback (`PRUNETRAIN_DEBUG=1` re-raises the
original exception instead). Where a command may write, and what it may replace, is decided in one place
(`prunetrain.utils.output_paths`): never over, into or around what it reads; `--overwrite` replaces only prunetrain's
own directories, crash-safe at any signal. Model directories are read by `prunetrain.engine.model_dir` only.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from prunetrain.utils import output_paths
from prunetrain.utils.validate import check_choice, check_fractions, check_int

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Prune attention heads during training of transformer models (Michel et al. 2019, "
                       "Voita et al. 2019).")
TOKENIZER_HELP = "Tokenizer directory, when it is not inside the model directory (never guessed from elsewhere)."
TOKENIZER_ENTRIES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                     "vocab.json", "merges.txt", "chat_template.jinja", "tokenizer")
"""What `shrink` carries from the model directory into the shrunk one (besides `*.model` sentencepiece files)."""


class UserError(Exception):
    """A mistake in the user's input: reported in one line, exit code 2."""


def _emit(result: dict, output: Optional[Path], what: str = "result") -> None:
    """Print `result` as standard JSON (a NaN is an error naming its key, never a `NaN` token) and write it to
    `output` (checked by the command before any work) atomically."""
    from prunetrain.utils.files import dumps_strict

    text = dumps_strict(result, what, indent=1, default=str)
    if output is not None:
        output_paths.write_file(output, text)
    typer.echo(text)


def _progress(message: str) -> None:
    typer.echo(message, err=True)


# -------------------------------------------------------------------------------------------------------------------
# checks of what the user gave, made before any work (each names its flag)
# -------------------------------------------------------------------------------------------------------------------
def _check_output_file(output: Path, flag: str = "--output", **inputs: Optional[Path]) -> None:
    """A file may be written at `output`: not a directory, its directory exists, and it is none of `inputs`
    (`name=path`, underscores spell dashes) nor inside one of them."""
    output_paths.check_output_file(output, flag=flag, inputs=_named(inputs))


def _check_output_dir(output: Path, overwrite: bool, flag: str = "--output", in_place: Optional[str] = None,
                      **inputs: Optional[Path]) -> None:
    """A directory may be written at `output`: absent or empty, or with `--overwrite` one prunetrain wrote; never
    one of `inputs`, inside one or holding one (except the input named `in_place`, replaced with --overwrite)."""
    output_paths.check_output_dir(output, overwrite=overwrite, flag=flag, inputs=_named(inputs), in_place=in_place)


def _named(inputs: dict) -> dict:
    """{"model": p, "data_dir": q} -> {"model": p, "--data-dir": q} (how the user typed them)."""
    return {(name if name in ("model", "model_a", "model_b", "source") else "--" + name.replace("_", "-")): path
            for name, path in inputs.items()}


def _check_data_dir(data_dir: Path, flag: str = "--data-dir") -> Path:
    if not data_dir.is_dir():
        raise UserError(f"{flag}: {str(data_dir)!r} is not a directory.")
    return data_dir


def _model(path: Path, argument: str = "model"):
    from prunetrain.engine.model_dir import load_model_dir

    return load_model_dir(path, argument=argument)


def _translation_model_dir(path: Path, argument: str = "model") -> Path:
    """A checked model directory whose config is an encoder-decoder (translation) model."""
    from prunetrain.engine.model_dir import check_model_dir, config_dict

    check_model_dir(path, argument)
    config = config_dict(path, argument)
    if not config.get("is_encoder_decoder"):
        kind = (config.get("architectures") or [config.get("model_type")])[0]
        raise UserError(f"{argument}: {str(path)!r} holds a {kind}, not a translation (encoder-decoder) model; this "
                        f"command translates parallel text with it.")
    return path


def _tokenizer(model: Path, tokenizer: Optional[Path]):
    from prunetrain.mt.translation import load_model_tokenizer

    if tokenizer is not None and not (tokenizer / "tokenizer.json").is_file():
        raise UserError(f"--tokenizer: {str(tokenizer)!r} holds no tokenizer.json.")
    return load_model_tokenizer(model, tokenizer)


def _fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--fractions: {text!r} is not a comma-separated list of numbers.") from None
    return check_fractions("--fractions", values)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a comma-separated list of integers.") from None
    if not values:
        raise UserError(f"{flag}: {text!r} holds no integer.")
    for value in values:
        check_int(flag, value, 1)
    return values


def _positive(**flags: int) -> None:
    """Each `flag=value` (underscores spell dashes) must be an integer >= 1."""
    for name, value in flags.items():
        check_int("--" + name.replace("_", "-"), value, 1)


# -------------------------------------------------------------------------------------------------------------------
# recipes
# -------------------------------------------------------------------------------------------------------------------
@app.command()
def recipe(
    name: Optional[str] = typer.Argument(None, help="Recipe name (see --list) or path to a recipe .yaml."),
    set_: List[str] = typer.Option([], "--set", help="Override a field: section.key=value (repeatable)."),
    data_dir: Optional[Path] = typer.Option(None, help="Parallel-text directory (train|valid|test.{de,en})."),
    output: Optional[Path] = typer.Option(None, help="Run directory (default checkpoints/<recipe>)."),
    resume: bool = typer.Option(False, help="Continue the unfinished run in --output (same recipe)."),
    overwrite: bool = typer.Option(False, help="Delete what --output holds and start again."),
    smoke: bool = typer.Option(False, help="The recipe's small preset: the whole pipeline in a few minutes."),
    list_: bool = typer.Option(False, "--list", help="List the available recipes."),
    show: bool = typer.Option(False, help="Validate the recipe (with overrides), print it as YAML and exit."),
):
    """Run a recipe end to end (e.g. `prunetrain recipe wmt-small-deen`)."""
    from prunetrain.mt.recipe import available_recipes, load_recipe, recipe_to_yaml

    if list_:
        for item in available_recipes():
            typer.echo(item)
        return
    if name is None:
        raise UserError("recipe: give a recipe name (one of: " + ", ".join(available_recipes()) + ") or --list.")
    if resume and overwrite:
        raise UserError("--resume and --overwrite: choose one (resume continues the run, overwrite deletes it).")
    overrides = (_smoke_overrides(name) if smoke else []) + list(set_)
    config = load_recipe(name, overrides)  # fully validated: types, ranges and cross-field rules
    from prunetrain.mt.run_checks import check_with_local_data
    from prunetrain.mt.run_record import with_data_dir

    config = with_data_dir(config, data_dir)  # --data-dir is data.dir: recipe.yaml and results.json record it
    check_with_local_data(config)  # what the run checks against its data, where the data is here already
    if show:
        typer.echo(recipe_to_yaml(config))
        return
    out = output or Path("checkpoints") / (config.name + ("-smoke" if smoke else ""))
    run_kwargs = dict(data_dir=str(data_dir) if data_dir else None, resume=resume, overwrite=overwrite,
                      progress=_progress)
    if config.kind == "l0-sweep":
        from prunetrain.mt.l0_sweep import run_gate_sweep
        from prunetrain.mt.ranks import launched_world_size

        if launched_world_size() > 1:
            raise UserError(f"recipe: {config.name!r} is an l0-sweep recipe, which runs in one process; start it "
                            f"without torchrun (the translation recipes run under torchrun).")

        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout carries only the JSON
            results = run_gate_sweep(config, out, **run_kwargs)
        summary = {"output": str(out), "full_bleu": results["full_bleu"], "minutes": round(results["minutes"], 2),
                   "runs": [{k: r[k] for k in ("label", "heads_kept", "kept_per_kind", "bleu")}
                            for r in results["runs"]]}
        if results["scratch"]:
            summary["scratch_bleu"] = results["scratch"]["bleu"]
        _emit(summary, None)
        return
    from prunetrain.mt.runner import run_recipe

    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout carries only the JSON
        results = run_recipe(config, out, **run_kwargs)
    if results is None:  # a rank other than 0 under torchrun: rank 0 prints the summary
        return
    summary = {"output": str(out), "test_bleu": results["test_pruned"]["bleu"],
               "test_bleu_trained": results["test_full"]["bleu"], "heads_trained": results["heads_trained"],
               "heads_kept": results["heads_kept"], "heads_total": results["heads_total"],
               "steps": results["steps"], "train_minutes": round(results["train_minutes"], 2),
               "train_step_minutes": round(results["train_step_minutes"], 2)}
    _emit(summary, None)


@app.command()
def compare(
    runs: List[Path] = typer.Argument(..., help="Finished recipe run directories; the first is the reference."),
    output: Path = typer.Option(..., help="New directory for compare.md, compare.json and compare.png."),
    names: Optional[str] = typer.Option(None, help="Comma-separated run names (default: the directory names); runs "
                                                   "sharing a name are seeds of one arm (mean ± sd, paired tests)."),
    bootstrap_samples: int = typer.Option(1000, help="Resamples of the paired bootstrap between final models."),
):
    """Recipe runs side by side: BLEU at equal training FLOPs, equal steps and equal training time, seeds as mean ±
    sd, paired bootstrap between final models, speed, heads (e.g. pruning during training vs pruning off)."""
    from prunetrain.mt.compare import comparison_markdown, write_comparison

    _positive(bootstrap_samples=bootstrap_samples)
    output_paths.check_disjoint(output, {f"run {str(run)!r}": run for run in runs})  # never into or around a run
    labels = [n.strip() for n in names.split(",")] if names else None
    result = write_comparison(runs, output, labels, samples=bootstrap_samples)
    typer.echo(comparison_markdown(result), err=True)
    _emit({"output": str(output), "arms": result["arms"], "equal_flops": result["equal_flops"],
           "paired_tests": result["paired_tests"], "equal_steps": result["equal_steps"],
           "equal_time": result["equal_time"]}, None)


def _smoke_overrides(name: str) -> list[str]:
    from prunetrain.mt.data import read_lines
    from prunetrain.mt.recipe import RECIPES_DIR, recipe_path

    path = recipe_path(name)
    preset = path.with_suffix(".smoke")
    if not preset.is_file():
        preset = RECIPES_DIR / f"{path.stem}.smoke"
    if not preset.is_file():
        raise UserError(f"--smoke: recipe {name!r} has no small preset ({path.stem}.smoke).")
    lines = read_lines(preset, argument="--smoke")
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


# -------------------------------------------------------------------------------------------------------------------
# translation models: translate / evaluate
# -------------------------------------------------------------------------------------------------------------------
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

    _positive(beams=beams, batch_size=batch_size, **({"limit": limit} if limit is not None else {}))
    _translation_model_dir(model)
    _check_data_dir(data_dir)
    if output is not None:
        _check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    if tokenizer is not None:
        _tokenizer(model, tokenizer)
    result = evaluate_directory(model, data_dir, split, src=src, tgt=tgt, limit=limit, num_beams=beams,
                                batch_size=batch_size, autocast_bf16=bf16, tokenizer_path=tokenizer)
    _emit({k: v for k, v in result.items() if k != "hypotheses"}, output, "evaluate")


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

    _positive(beams=beams, batch_size=batch_size)
    _translation_model_dir(model)
    if output is not None:
        _check_output_file(output, model=model, input=input, tokenizer=tokenizer)
    if str(input) == "-":
        lines = split_lines(decode_utf8(sys.stdin.buffer.read(), "--input: stdin"))
    else:
        lines = read_lines(input, argument="--input")
    tok = _tokenizer(model, tokenizer)
    hypotheses = []
    if lines:
        net = _model(model)
        hypotheses = run_translate(net, tok, lines, batch_size=batch_size, num_beams=beams, autocast_bf16=bf16)
    hypotheses = [h.replace("\r", " ").replace("\n", " ") for h in hypotheses]  # one output line per input line
    if output is None:
        sys.stdout.write(format_lines(hypotheses))
        sys.stdout.flush()
    else:
        write_lines(output, hypotheses)


# -------------------------------------------------------------------------------------------------------------------
# the head engine and importance on saved models
# -------------------------------------------------------------------------------------------------------------------
def _translation_batches(model_dir: Path, tokenizer_dir: Optional[Path], data_dir: Path, split: str,
                         num_batches: int, batch_size: int, net):
    from prunetrain.mt.data import build_dataset, collate_batches, make_collator, read_parallel

    tokenizer = _tokenizer(model_dir, tokenizer_dir)
    pairs = read_parallel(data_dir, split, limit=num_batches * batch_size)
    dataset = build_dataset(pairs, tokenizer)
    batches = collate_batches(dataset, make_collator(tokenizer, net), batch_size)
    return tokenizer, pairs, batches


@app.command()
def importance(
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    data_dir: Path = typer.Option(..., help="Parallel-text directory."),
    split: str = typer.Option("valid"),
    num_batches: int = typer.Option(8), batch_size: int = typer.Option(64),
    scorer: str = typer.Option("gradient", help="gradient | ablation | confidence | random"),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    output: Optional[Path] = typer.Option(None, help="Write the scores JSON here."),
):
    """Head importance (Michel et al. 2019 by default) of a saved translation model on a data split."""
    from prunetrain.methods.importance import SCORERS, get_scorer

    _positive(num_batches=num_batches, batch_size=batch_size)
    check_choice("--scorer", scorer, tuple(SCORERS))
    _translation_model_dir(model)
    _check_data_dir(data_dir)
    if output is not None:
        _check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    score = get_scorer(scorer)
    net = _model(model)
    _, _, batches = _translation_batches(model, tokenizer, data_dir, split, num_batches, batch_size, net)
    _emit(score(net, batches).to_dict(), output, "importance")


@app.command()
def prune(
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    output: Path = typer.Option(..., help="Directory for the shrunk model."),
    amount: float = typer.Option(0.5, help="Fraction of all heads to prune (0..1), or a count >= 1 with --count."),
    count: bool = typer.Option(False, help="Read --amount as a number of heads."),
    data_dir: Path = typer.Option(..., help="Parallel-text directory for importance."),
    split: str = typer.Option("valid"),
    num_batches: int = typer.Option(8), batch_size: int = typer.Option(64),
    scope: str = typer.Option("global", help="global | layer | kind"),
    min_heads_per_layer: int = typer.Option(1),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    overwrite: bool = typer.Option(False, help="Replace --output if it holds a model prunetrain wrote (it may be the "
                                               "model itself); the old one stays whole until the new one is "
                                               "complete."),
):
    """Prune the least important heads of a saved model and save it shrunk (with its tokenizer and mask.json)."""
    from prunetrain.engine.shrink import shrink as do_shrink
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.mt.translation import save_translation_model
    from prunetrain.utils.validate import check_amount

    _positive(num_batches=num_batches, batch_size=batch_size)
    check_int("--min-heads-per-layer", min_heads_per_layer, 0)
    check_choice("--scope", scope, ("global", "layer", "kind"))
    value = _amount(amount, count)
    check_amount("--amount", value)
    _translation_model_dir(model)
    _check_data_dir(data_dir)
    _check_output_dir(output, overwrite, in_place="model", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = _model(model)
    tok, _, batches = _translation_batches(model, tokenizer, data_dir, split, num_batches, batch_size, net)
    mask = select_heads(head_importance(net, batches), value, scope=scope, min_heads_per_layer=min_heads_per_layer)
    layout = do_shrink(net, mask)
    with output_paths.staging_directory(output) as staging:  # everything read; output may be the model itself
        save_translation_model(net, tok, staging / "model")
        mask.to_json(staging / "model" / "mask.json")
        output_paths.replace_directory(staging / "model", output)  # the old one whole until the new one is
    _emit({"output": str(output), "heads_kept": layout.total_heads, "per_kind": layout.heads_per_kind()}, None)


def _amount(amount: float, count: bool) -> int | float:
    if not count:
        return amount
    if amount != int(amount) or amount < 0:
        raise UserError(f"--amount: {amount:g} is not a whole number of heads >= 0 (with --count).")
    return int(amount)


@app.command()
def shrink(
    model: Path = typer.Argument(..., help="A saved model directory."),
    mask: Path = typer.Option(..., help="HeadMask JSON (site -> keep list), e.g. from prune or a callback."),
    output: Path = typer.Option(..., help="Directory for the shrunk model."),
    overwrite: bool = typer.Option(False, help="Replace --output if it holds a model prunetrain wrote (it may be the "
                                               "model itself); the old one stays whole until the new one is "
                                               "complete."),
):
    """Physically remove the heads a mask zeroes and save the result (the tokenizer's files copied along)."""
    from prunetrain.engine.mask import HeadMask
    from prunetrain.engine.model_dir import check_model_dir
    from prunetrain.engine.persist import save_pruned
    from prunetrain.engine.shrink import shrink as do_shrink
    from prunetrain.utils.files import read_json

    check_model_dir(model)
    read_json(mask, "--mask")  # a regular file holding a strict JSON object
    _check_output_dir(output, overwrite, in_place="model", model=model, mask=mask)
    net = _model(model)
    keep = HeadMask.from_json(mask, net, argument="--mask")
    layout = do_shrink(net, keep)
    with output_paths.staging_directory(output) as staging:  # everything read; output may be the model itself
        save_pruned(net, staging / "model")
        _copy_tokenizer(model, staging / "model")
        output_paths.replace_directory(staging / "model", output)  # the old one whole until the new one is
    _emit({"output": str(output), "heads_kept": layout.total_heads, "per_kind": layout.heads_per_kind()}, None)


def _copy_tokenizer(model: Path, target: Path) -> None:
    """The tokenizer's files and folder of a model directory, copied into `target`."""
    import shutil

    for item in sorted(model.iterdir()):
        if item.name in TOKENIZER_ENTRIES or (item.suffix == ".model" and item.is_file()):
            if item.is_dir():
                shutil.copytree(item, target / item.name)
            else:
                shutil.copy2(item, target / item.name)


@app.command()
def curve(
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    data_dir: Path = typer.Option(..., help="Parallel-text directory."),
    split: str = typer.Option("valid"),
    sentences: int = typer.Option(500, help="Evaluation sentences."),
    fractions: str = typer.Option("0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="Comma-separated fractions."),
    order: str = typer.Option("importance", help="importance | random"),
    iterative: bool = typer.Option(False), beams: int = typer.Option(1), batch_size: int = typer.Option(100),
    bf16: bool = typer.Option(False), num_batches: int = typer.Option(8),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    output: Optional[Path] = typer.Option(None),
):
    """BLEU of the model with 0…90 % of its heads masked (importance or random order)."""
    from prunetrain.methods.curve import ORDERS, pruning_curve
    from prunetrain.mt.data import read_parallel
    from prunetrain.mt.metrics import bleu_metric

    _positive(sentences=sentences, beams=beams, batch_size=batch_size, num_batches=num_batches)
    check_choice("--order", order, ORDERS)
    grid = _fractions(fractions)
    _translation_model_dir(model)
    _check_data_dir(data_dir)
    if output is not None:
        _check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = _model(model)
    tok, _, batches = _translation_batches(model, tokenizer, data_dir, "train" if split == "valid" else split,
                                           num_batches, 64, net)
    pairs = read_parallel(data_dir, split, limit=sentences)
    result = pruning_curve(net, bleu_metric(tok, pairs, batch_size=batch_size, num_beams=beams, autocast_bf16=bf16),
                           fractions=grid, batches=batches, order=order, iterative=iterative, key="bleu",
                           metric_name="bleu")
    _emit(result.to_dict(), output, "curve")


@app.command()
def bench(
    model_a: Path = typer.Argument(..., help="Original model directory."),
    model_b: Path = typer.Argument(..., help="Pruned model directory."),
    batch_sizes: str = typer.Option("1,8,32,64"), seq_lens: str = typer.Option("32"),
    dtype: str = typer.Option("fp32", help="fp32 | bf16"),
    generate: str = typer.Option("", help="Comma-separated: greedy, beam4 (seq2seq / LMs)."),
    repeats: int = typer.Option(10), warmup: int = typer.Option(1),
    output: Optional[Path] = typer.Option(None),
):
    """A/B latency and throughput of two saved models (alternating runs), with FLOP-ideal speedups."""
    from prunetrain.bench import run_bench
    from prunetrain.bench.runner import DTYPES, GENERATE_MODES
    from prunetrain.engine.model_dir import check_model_dir

    sizes, lens = _ints("--batch-sizes", batch_sizes), _ints("--seq-lens", seq_lens)
    check_choice("--dtype", dtype, DTYPES)
    modes = [g.strip() for g in generate.split(",") if g.strip()]
    for mode in modes:
        check_choice("--generate", mode, GENERATE_MODES)
    _positive(repeats=repeats)
    check_int("--warmup", warmup, 0)
    for argument, path in (("model_a", model_a), ("model_b", model_b)):
        check_model_dir(path, argument)
        _check_positions(path, argument, lens)
    if output is not None:
        _check_output_file(output, model_a=model_a, model_b=model_b)
    result = run_bench(model_a, model_b, batch_sizes=sizes, seq_lens=lens, dtype=dtype, generate=modes or None,
                       repeats=repeats, warmup=warmup, json_path=output)
    typer.echo(result.table())


POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_target_positions")


def _check_positions(path: Path, argument: str, seq_lens: list[int]) -> None:
    """Every --seq-lens fits the model's positions (its config's max_position_embeddings or the like)."""
    from prunetrain.engine.model_dir import config_dict

    config = config_dict(path, argument)
    field = next((f for f in POSITION_FIELDS if isinstance(config.get(f), int) and config[f] > 0), None)
    if field is not None and max(seq_lens) > config[field]:
        raise UserError(f"--seq-lens: {max(seq_lens)} is beyond {argument}'s {config[field]} positions "
                        f"({field} in its config.json); use lengths up to {config[field]}.")


def _one_line(err: BaseException) -> str:
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(message).split()) or type(err).__name__


def main() -> None:
    """Entry point: usage errors are typer's (exit code 2, with usage); errors in what the user gave become one
    line on stderr and exit code 2 (`PRUNETRAIN_DEBUG=1`: the original exception and its traceback instead)."""
    debug = os.environ.get("PRUNETRAIN_DEBUG") == "1"
    from prunetrain.utils import progress

    progress.enable()  # bars on stderr when it is a terminal (or PRUNETRAIN_PROGRESS=1)
    try:
        app()
    except (UserError, ValueError, TypeError, KeyError, OSError, RecursionError) as err:
        if debug:
            raise
        typer.echo(f"prunetrain: error: {_one_line(err)}", err=True)
        sys.exit(2)


from prunetrain.cli import export as _export  # noqa: E402,F401  (registers `prunetrain export`)
from prunetrain.cli import study as _study  # noqa: E402,F401  (registers `prunetrain study ...`)

if __name__ == "__main__":  # pragma: no cover
    main()
