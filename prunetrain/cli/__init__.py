"""`prunetrain` command line (typer). Every command is a thin layer over a library function.

Errors in what the user gave (unknown recipe or key, wrong type, missing data, an output directory that already
holds a run, ...) are one line on stderr and exit code 2, never a traceback (set PRUNETRAIN_DEBUG=1 to see one).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Prune attention heads during training of transformer models (Michel et al. 2019, "
                       "Voita et al. 2019).")


class UserError(Exception):
    """A mistake in the user's input: reported in one line, exit code 2."""


def _emit(result: dict, output: Optional[Path]) -> None:
    text = json.dumps(result, indent=1, default=str)
    if output is not None:
        if output.exists() and output.is_dir():
            raise UserError(f"--output: {str(output)!r} is a directory; give a file path for the JSON.")
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_suffix(output.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(output)
    typer.echo(text)


def _progress(message: str) -> None:
    typer.echo(message, err=True)


# -------------------------------------------------------------------------------------------------------------------
# recipes
# -------------------------------------------------------------------------------------------------------------------
@app.command()
def recipe(
    name: Optional[str] = typer.Argument(None, help="Recipe name (see --list) or path to a recipe .yaml."),
    set_: List[str] = typer.Option([], "--set", help="Override a field: section.key=value (repeatable)."),
    data_dir: Optional[Path] = typer.Option(None, help="Parallel-text directory (train|valid|test.{de,en})."),
    output: Optional[Path] = typer.Option(None, help="Run directory (default checkpoints/<recipe>)."),
    resume: bool = typer.Option(False, help="Continue the run in --output from its last checkpoint."),
    overwrite: bool = typer.Option(False, help="Delete what --output holds and start again."),
    smoke: bool = typer.Option(False, help="The recipe's small preset: the whole pipeline in a few minutes."),
    list_: bool = typer.Option(False, "--list", help="List the available recipes."),
    show: bool = typer.Option(False, help="Print the recipe (with overrides) as YAML and exit."),
):
    """Run a recipe end to end (e.g. `prunetrain recipe wmt-small-deen`)."""
    from prunetrain.mt.recipe import available_recipes, load_recipe, recipe_to_yaml

    if list_:
        for item in available_recipes():
            typer.echo(item)
        return
    if name is None:
        raise UserError("recipe: give a recipe name (one of: " + ", ".join(available_recipes()) + ") or --list.")
    overrides = list(set_)
    if smoke:
        overrides = _smoke_overrides(name) + overrides
    config = load_recipe(name, overrides)
    if show:
        typer.echo(recipe_to_yaml(config))
        return
    out = output or Path("checkpoints") / (config.name + ("-smoke" if smoke else ""))
    run_kwargs = dict(data_dir=str(data_dir) if data_dir else None, resume=resume, overwrite=overwrite,
                      progress=_progress)
    if config.kind == "l0-sweep":
        from prunetrain.mt.l0_sweep import run_gate_sweep

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
    summary = {"output": str(out), "test_bleu_full": results["test_full"]["bleu"],
               "test_bleu_pruned": results["test_pruned"]["bleu"], "heads_kept": results["heads_kept"],
               "heads_total": results["heads_total"], "train_minutes": round(results["train_minutes"], 2)}
    _emit(summary, None)


def _smoke_overrides(name: str) -> list[str]:
    from prunetrain.mt.recipe import RECIPES_DIR

    path = RECIPES_DIR / f"{Path(name).stem}.smoke"
    if not path.is_file():
        raise UserError(f"--smoke: recipe {name!r} has no small preset ({path.name}).")
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


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
    output: Optional[Path] = typer.Option(None, help="Write the JSON here too."),
):
    """sacreBLEU (with signature) and chrF of a saved model on a parallel text directory."""
    from prunetrain.mt.translation import evaluate_directory

    _positive("beams", beams)
    _positive("batch-size", batch_size)
    result = evaluate_directory(model, data_dir, split, src=src, tgt=tgt, limit=limit, num_beams=beams,
                                batch_size=batch_size, autocast_bf16=bf16)
    _emit({k: v for k, v in result.items() if k != "hypotheses"}, output)


@app.command()
def translate(
    model: Path = typer.Argument(..., help="A saved full or pruned model directory (with its tokenizer)."),
    input: Path = typer.Option(..., "--input", help="Source sentences, one per line ('-' for stdin)."),
    output: Optional[Path] = typer.Option(None, help="Write translations here (default stdout)."),
    beams: int = typer.Option(4), batch_size: int = typer.Option(50), bf16: bool = typer.Option(False),
):
    """Translate a file line by line."""
    from prunetrain.mt.translation import _find_tokenizer_dir, load_translation_model, translate as run_translate
    from prunetrain.mt.data import load_tokenizer

    _positive("beams", beams)
    lines = sys.stdin.read().splitlines() if str(input) == "-" else _read_text(input)
    net = load_translation_model(model)
    tokenizer = load_tokenizer(_find_tokenizer_dir(Path(model)))
    hypotheses = run_translate(net, tokenizer, lines, batch_size=batch_size, num_beams=beams, autocast_bf16=bf16)
    text = "\n".join(hypotheses) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)


def _read_text(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"--input: {str(path)!r} is not a file.")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise UserError(f"--input: {str(path)!r} is not UTF-8 text (byte {err.start}).") from None


# -------------------------------------------------------------------------------------------------------------------
# the head engine and importance on saved models
# -------------------------------------------------------------------------------------------------------------------
def _load_any(model: Path):
    from prunetrain.engine.persist import LAYOUT_FILE, load_pruned

    if not (model / "config.json").is_file():
        raise UserError(f"model: {str(model)!r} is not a saved model directory (no config.json).")
    if (model / LAYOUT_FILE).is_file():
        return load_pruned(model)
    from transformers import AutoConfig
    import transformers

    config = AutoConfig.from_pretrained(model, local_files_only=True)
    cls = getattr(transformers, (config.architectures or ["AutoModel"])[0])
    return cls.from_pretrained(model, local_files_only=True).eval()


def _translation_batches(model_dir: Path, data_dir: Path, split: str, num_batches: int, batch_size: int, net):
    from prunetrain.mt.data import build_dataset, collate_batches, load_tokenizer, make_collator, read_parallel
    from prunetrain.mt.translation import _find_tokenizer_dir

    tokenizer = load_tokenizer(_find_tokenizer_dir(model_dir))
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
    output: Optional[Path] = typer.Option(None, help="Write the scores JSON here."),
):
    """Head importance (Michel et al. 2019 by default) of a saved translation model on a data split."""
    from prunetrain.methods.importance import get_scorer

    _positive("num-batches", num_batches)
    _positive("batch-size", batch_size)
    net = _load_any(model)
    _, _, batches = _translation_batches(model, data_dir, split, num_batches, batch_size, net)
    scores = get_scorer(scorer)(net, batches)
    _emit(scores.to_dict(), output)


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
    overwrite: bool = typer.Option(False),
):
    """Prune the least important heads of a saved model and save it shrunk (with its tokenizer)."""
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.engine.shrink import shrink as do_shrink
    from prunetrain.mt.translation import save_translation_model

    net = _load_any(model)
    tokenizer, _, batches = _translation_batches(model, data_dir, split, num_batches, batch_size, net)
    value = int(amount) if count else amount
    if count and value != amount:
        raise UserError(f"--amount: {amount} is not a whole number of heads (with --count).")
    mask = select_heads(head_importance(net, batches), value, scope=scope, min_heads_per_layer=min_heads_per_layer)
    layout = do_shrink(net, mask)
    save_translation_model(net, tokenizer, output, overwrite=overwrite)
    mask.to_json(Path(output) / "mask.json")
    _emit({"output": str(output), "heads_kept": layout.total_heads, "per_kind": layout.heads_per_kind()}, None)


@app.command()
def shrink(
    model: Path = typer.Argument(..., help="A saved model directory."),
    mask: Path = typer.Option(..., help="HeadMask JSON (site -> keep list), e.g. from prune or a callback."),
    output: Path = typer.Option(..., help="Directory for the shrunk model."),
    overwrite: bool = typer.Option(False),
):
    """Physically remove the heads a mask zeroes and save the result (tokenizer copied along if present)."""
    from prunetrain.engine.mask import HeadMask
    from prunetrain.engine.persist import save_pruned
    from prunetrain.engine.shrink import shrink as do_shrink

    net = _load_any(model)
    if not mask.is_file():
        raise UserError(f"--mask: {str(mask)!r} is not a file.")
    keep = HeadMask.from_json(mask, net)
    layout = do_shrink(net, keep)
    save_pruned(net, output, overwrite=overwrite)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model / name).is_file():
            (Path(output) / name).write_bytes((model / name).read_bytes())
    _emit({"output": str(output), "heads_kept": layout.total_heads, "per_kind": layout.heads_per_kind()}, None)


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
    output: Optional[Path] = typer.Option(None),
):
    """BLEU of the model with 0…90 % of its heads masked (importance or random order)."""
    from prunetrain.methods.curve import bleu_metric, pruning_curve
    from prunetrain.mt.data import read_parallel

    grid = _fractions(fractions)
    net = _load_any(model)
    tokenizer, _, batches = _translation_batches(model, data_dir, "train" if split == "valid" else split,
                                                 num_batches, 64, net)
    pairs = read_parallel(data_dir, split, limit=sentences)
    result = pruning_curve(net, bleu_metric(tokenizer, pairs, batch_size=batch_size, num_beams=beams,
                                            autocast_bf16=bf16),
                           fractions=grid, batches=batches, order=order, iterative=iterative, key="bleu",
                           metric_name="bleu")
    _emit(result.to_dict(), output)


STUDIES = ("ablate", "one-head", "cross-dataset", "curves")


@app.command()
def study(
    name: str = typer.Argument(..., help="ablate | one-head | cross-dataset | curves (Michel et al. 2019 §3-5)."),
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    data_dir: Path = typer.Option(..., help="Parallel-text directory."),
    split: str = typer.Option("valid", help="Split the metric is computed on."),
    other_data_dir: Optional[Path] = typer.Option(None, help="cross-dataset: the second dataset's directory."),
    other_split: str = typer.Option("test", help="cross-dataset: the second dataset's split."),
    sentences: int = typer.Option(200, help="Sentences for BLEU (ablation evaluates once per head)."),
    beams: int = typer.Option(1), batch_size: int = typer.Option(100), num_batches: int = typer.Option(8),
    seeds: int = typer.Option(3, help="curves: random-order seeds."),
    fractions: str = typer.Option("0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="curves: comma-separated fractions."),
    output: Path = typer.Option(Path("study"), help="Directory for JSON and PNG results."),
):
    """Run one of the paper's studies on a saved translation model; writes JSON + PNG into --output."""
    from prunetrain.methods import studies
    from prunetrain.methods.curve import bleu_metric
    from prunetrain.mt.data import read_parallel
    from prunetrain.methods.importance import head_importance

    if name not in STUDIES:
        raise UserError(f"study: {name!r} is not one of {', '.join(STUDIES)}.")
    _positive("sentences", sentences)
    net = _load_any(model)
    tokenizer, _, batches = _translation_batches(model, data_dir, "train", num_batches, 64, net)
    pairs = read_parallel(data_dir, split, limit=sentences)
    metric = bleu_metric(tokenizer, pairs, batch_size=batch_size, num_beams=beams)
    if name == "ablate":
        result = studies.ablate_each_head(net, metric, key="bleu", out_dir=output, progress=_progress)
    elif name == "one-head":
        result = studies.keep_one_head_per_layer(net, metric, key="bleu", out_dir=output, progress=_progress)
    elif name == "cross-dataset":
        if other_data_dir is None:
            raise UserError("--other-data-dir: cross-dataset needs a second dataset directory.")
        _, _, other = _translation_batches(model, other_data_dir, other_split, num_batches, 64, net)
        _, _, first = _translation_batches(model, data_dir, split, num_batches, 64, net)
        result = studies.cross_dataset(head_importance(net, first), head_importance(net, other),
                                       names=(f"{data_dir.name}/{split}", f"{other_data_dir.name}/{other_split}"),
                                       out_dir=output)
        result = {k: v for k, v in result.items() if k not in ("scores_a", "scores_b")}
    else:
        result = studies.pruning_curves_study(net, metric, batches, key="bleu", random_seeds=range(seeds),
                                              fractions=_fractions(fractions), out_dir=output, progress=_progress)
        result = {"seconds_per_point": result["seconds_per_point"],
                  "curves": {k: v["points"][-1] for k, v in result["curves"].items()}}
    _emit({"study": name, "output": str(output), **{k: v for k, v in result.items() if k != "heads"}}, None)


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

    result = run_bench(model_a, model_b, batch_sizes=_ints("batch-sizes", batch_sizes),
                       seq_lens=_ints("seq-lens", seq_lens), dtype=dtype,
                       generate=[g for g in generate.split(",") if g] or None, repeats=repeats, warmup=warmup,
                       json_path=output)
    typer.echo(result.table())


def _fractions(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--fractions: {text!r} is not a comma-separated list of numbers.") from None


def _ints(argument: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--{argument}: {text!r} is not a comma-separated list of integers.") from None


def _positive(argument: str, value: int) -> None:
    if value < 1:
        raise UserError(f"--{argument}: {value} must be >= 1.")


def main() -> None:
    """Entry point: usage errors are typer's (exit code 2, with usage); errors in what the user gave become one
    line on stderr and exit code 2."""
    debug = os.environ.get("PRUNETRAIN_DEBUG") == "1"
    from prunetrain.utils import progress

    progress.enable()  # bars on stderr when it is a terminal (or PRUNETRAIN_PROGRESS=1)
    try:
        app()
    except (UserError, ValueError, TypeError, KeyError, FileNotFoundError) as err:
        if debug:
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        typer.echo(f"prunetrain: error: {message}", err=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
