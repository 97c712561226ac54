"""`prunetrain study ...`: the studies of Michel et al. (2019) on a saved translation model, one subcommand each.

Each subcommand writes `<name>.json`, PNG figures and TensorBoard events (`tensorboard/`) into `--output`, shows a
progress bar, prints a JSON summary on stdout, and resumes: a run that was stopped continues from the units it saved
when the same command is given again (other arguments are refused in one line). The work is done by
`prunetrain.methods.studies`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from prunetrain.cli.common import (TOKENIZER_HELP, UserError, app, check_data_dir, check_positive, emit, load_model,
                                   load_tokenizer, parse_fractions, parse_ints, translation_batches)


class _StudyGroup(TyperGroup):
    """`prunetrain study NAME`: an unknown NAME is a one-line error naming the studies (like every other bad
    argument), not click's usage box."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            raise UserError(f"study: {name!r} is not one of {', '.join(self.list_commands(ctx))}.")
        return super().resolve_command(ctx, args)


study_app = typer.Typer(cls=_StudyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                        help="The studies of Michel et al. (2019) on a saved translation model: ablate (§3.2), "
                             "one-head (§3.3), cross-dataset (§3.4), curves (§4), per-kind (§5), speed (§4.3). "
                             "Each writes JSON, PNG and TensorBoard events into --output and resumes if stopped.")
app.add_typer(study_app, name="study")

ALL_FRACTIONS = "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
MODEL_HELP = "A saved translation model directory (with its tokenizer), e.g. checkpoints/wmt-small-deen-full/full."
OUTPUT_HELP = "Directory for the JSON, PNG and TensorBoard results (default study/<study>); re-run to resume."

# shared options (typer reads the defaults' metadata, so each command lists them again through these objects)
MODEL = typer.Argument(..., help=MODEL_HELP)
DATA_DIR = typer.Option(..., help="Parallel-text directory (train|valid|test.{de,en}).")
SPLIT = typer.Option("valid", help="Split the BLEU is computed on.")
SENTENCES = typer.Option(200, help="Sentences for BLEU (the first N of --split; one decode per masked model).")
BEAMS = typer.Option(1, help="Beam size of the BLEU decodes (1 = greedy).")
BATCH_SIZE = typer.Option(100, help="Sentences per generate call.")
TOKENIZER = typer.Option(None, help=TOKENIZER_HELP)
OUTPUT = typer.Option(None, help=OUTPUT_HELP)
THRESHOLD = typer.Option(0.5, help="BLEU difference counted as a change (the paper's 0.5).")
BOOTSTRAP_SAMPLES = typer.Option(1000, help="Paired bootstrap resamples of the significance test of each BLEU "
                                             "change (0: no test).")
ALPHA = typer.Option(0.01, help="Significance level: a change with p < alpha is significant (the paper's 0.01).")
NUM_BATCHES = typer.Option(8, help="Training batches (64 sentences each) for head importance.")


def _output(output: Optional[Path], name: str, **inputs: Optional[Path]) -> Path:
    """The study's output directory: not a file, and never over, into or around what it reads (`inputs`, named
    as the user typed them: model, --data-dir, ...)."""
    from prunetrain.utils.output_paths import check_disjoint

    out = output if output is not None else Path("study") / name
    if out.exists() and not out.is_dir():
        raise UserError(f"--output: {str(out)!r} is a file, not a directory.")
    check_disjoint(out, {key if key == "model" else "--" + key.replace("_", "-"): path for key, path in inputs.items()})
    return out


def _threshold(value: float) -> float:
    from prunetrain.utils.validate import check_positive_float

    return check_positive_float("--threshold", value, allow_zero=True)


def _significance(bootstrap_samples: int, alpha: float) -> dict:
    """The studies' significance-test arguments, checked under their flag names."""
    from prunetrain.utils.validate import check_int, check_level

    return {"bootstrap_samples": check_int("--bootstrap-samples", bootstrap_samples, 0),
            "alpha": check_level("--alpha", alpha)}


def _bleu(model: Path, tokenizer: Optional[Path], data_dir: Path, split: str, sentences: int, beams: int,
          batch_size: int, sentence_stats: bool = False):
    """(metric, settings): sacreBLEU of the first `sentences` pairs of `split`, and what determines it; with
    `sentence_stats` the metric can be tested for significance."""
    from prunetrain.mt.evaluation.metrics import bleu_metric
    from prunetrain.mt.text.data import read_parallel

    tok = load_tokenizer(model, tokenizer)
    pairs = read_parallel(data_dir, split, limit=sentences)
    settings = {"model": str(model.resolve()), "data": str(data_dir.resolve()), "split": split,
                "sentences": len(pairs), "beams": beams}
    return bleu_metric(tok, pairs, batch_size=batch_size, num_beams=beams, sentence_stats=sentence_stats), settings


def _finish(name: str, output: Path, result: dict, drop: tuple[str, ...]) -> None:
    summary = {k: v for k, v in result.items() if k not in drop + ("args", "study")}
    emit({"study": name, "output": str(output), **summary}, None)


def _read_ablation(path: Optional[Path]) -> Optional[dict]:
    """The ablation.json of `prunetrain study ablate` at `path` (None: none given)."""
    from prunetrain.utils.files import read_json

    if path is None:
        return None
    if not path.is_file():
        raise UserError(f"--ablation: {str(path)!r} is not a file.")
    data = read_json(path, "--ablation", allow_nan=True)  # a key given twice is refused
    if data.get("study") != "ablate":
        raise UserError(f"--ablation: {str(path)!r} is not the ablation.json of `prunetrain study ablate`.")
    return data


ABLATION_HELP = "ablation.json of `study ablate` on this model"


@study_app.command("ablate")
def ablate(model: Path = MODEL, data_dir: Path = DATA_DIR, split: str = SPLIT, sentences: int = SENTENCES,
           beams: int = BEAMS, batch_size: int = BATCH_SIZE, threshold: float = THRESHOLD,
           bootstrap_samples: int = BOOTSTRAP_SAMPLES, alpha: float = ALPHA,
           tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§3.2 Table 1 / Fig. 1: BLEU change when each head alone is masked (every head), each tested for
    significance (paired bootstrap); histogram; how many heads change BLEU by more than --threshold, how many
    significantly, and how many improve it. Writes ablation.json, ablation.md (Table 1), ablation_hist.png."""
    from prunetrain.methods.studies import ablate_each_head

    check_positive(sentences=sentences, beams=beams, batch_size=batch_size)
    _threshold(threshold)
    test = _significance(bootstrap_samples, alpha)
    check_data_dir(data_dir)
    out = _output(output, "ablate", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    metric, settings = _bleu(model, tokenizer, data_dir, split, sentences, beams, batch_size, sentence_stats=True)
    result = ablate_each_head(net, metric, key="bleu", threshold=threshold, out_dir=out, args=settings, **test)
    _finish("ablate", out, result, ("heads",))


@study_app.command("one-head")
def one_head(model: Path = MODEL, data_dir: Path = DATA_DIR, split: str = SPLIT, sentences: int = SENTENCES,
             beams: int = BEAMS, batch_size: int = BATCH_SIZE, threshold: float = THRESHOLD,
             ablation: Optional[Path] = typer.Option(None, help=ABLATION_HELP + ": the best head of each layer "
                                                                "is taken from it (one decode per layer) instead "
                                                                "of trying each head."),
             bootstrap_samples: int = BOOTSTRAP_SAMPLES, alpha: float = ALPHA,
             tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§3.3 Table 2: per layer and kind, BLEU when only the best head of that layer is kept (the others full),
    each change tested for significance (paired bootstrap). Writes one_head_per_layer.json, .md and .png."""
    from prunetrain.methods.studies import keep_one_head_per_layer

    check_positive(sentences=sentences, beams=beams, batch_size=batch_size)
    _threshold(threshold)
    test = _significance(bootstrap_samples, alpha)
    check_data_dir(data_dir)
    previous = _read_ablation(ablation)
    out = _output(output, "one-head", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    metric, settings = _bleu(model, tokenizer, data_dir, split, sentences, beams, batch_size, sentence_stats=True)
    try:
        result = keep_one_head_per_layer(net, metric, key="bleu", ablation=previous, threshold=threshold,
                                         out_dir=out, args=settings, **test)
    except ValueError as err:
        if str(err).startswith("ablation:"):
            raise UserError("--ablation: " + str(err).removeprefix("ablation: ")) from err
        raise
    _finish("one-head", out, result, ())


@study_app.command("cross-dataset")
def cross_dataset(model: Path = MODEL, data_dir: Path = DATA_DIR, split: str = SPLIT,
                  other_data_dir: Path = typer.Option(..., help="The second (e.g. out-of-domain) dataset's "
                                                                "directory, e.g. ../shared/data/wmt_newstest."),
                  other_split: str = typer.Option("test", help="The second dataset's split, e.g. newstest2014."),
                  sentences: int = SENTENCES,
                  other_sentences: Optional[int] = typer.Option(None, help="Sentences of the second dataset (the "
                                                                           "first N of --other-split; default: "
                                                                           "--sentences)."),
                  beams: int = BEAMS, batch_size: int = BATCH_SIZE,
                  ablation: Optional[Path] = typer.Option(None, help=ABLATION_HELP + " with the same --data-dir, "
                                                                     "--split, --sentences and --beams: the first "
                                                                     "dataset's effects are taken from it."),
                  bootstrap_samples: int = BOOTSTRAP_SAMPLES, alpha: float = ALPHA,
                  tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§3.4 Fig. 2: the BLEU change of ablating each head on two datasets, each tested for significance (paired
    bootstrap), their Pearson and Spearman correlation (over all heads and over the significant ones) and a
    scatter plot. Writes cross_dataset.json and cross_dataset.png."""
    from prunetrain.methods.studies import cross_dataset as run

    other_sentences = sentences if other_sentences is None else other_sentences
    check_positive(sentences=sentences, other_sentences=other_sentences, beams=beams, batch_size=batch_size)
    test = _significance(bootstrap_samples, alpha)
    check_data_dir(data_dir)
    check_data_dir(other_data_dir, "--other-data-dir")
    previous = _read_ablation(ablation)
    out = _output(output, "cross-dataset", model=model, data_dir=data_dir, other_data_dir=other_data_dir,
                  tokenizer=tokenizer)
    net = load_model(model)
    first, settings_a = _bleu(model, tokenizer, data_dir, split, sentences, beams, batch_size, sentence_stats=True)
    if previous is not None:
        saved = previous.get("args", {})
        differ = [k for k in settings_a if saved.get(k) != settings_a[k]]
        if differ:
            raise UserError(f"--ablation: {str(ablation)!r} was made with other settings: " + ", ".join(
                f"{k} {saved.get(k)!r} (here {settings_a[k]!r})" for k in differ) + ".")
    second, settings_b = _bleu(model, tokenizer, other_data_dir, other_split, other_sentences, beams, batch_size,
                               sentence_stats=True)
    names = (f"{data_dir.name}/{split}", f"{other_data_dir.name}/{other_split}")
    try:
        result = run(net, [first, second], key="bleu", names=names, ablation=previous, out_dir=out,
                     args={"a": settings_a, "b": settings_b}, **test)
    except ValueError as err:
        if str(err).startswith("ablation:"):
            raise UserError("--ablation: " + str(err).removeprefix("ablation: ")) from err
        raise
    _finish("cross-dataset", out, result, ("heads",))


def _importance_batches(model: Path, tokenizer: Optional[Path], data_dir: Path, num_batches: int, net):
    return translation_batches(model, tokenizer, data_dir, "train", num_batches, 64, net)[2]


@study_app.command("curves")
def curves(model: Path = MODEL, data_dir: Path = DATA_DIR, split: str = SPLIT, sentences: int = SENTENCES,
           beams: int = BEAMS, batch_size: int = BATCH_SIZE, num_batches: int = NUM_BATCHES,
           seeds: int = typer.Option(3, help="Random-order curves (seeds 0..N-1)."),
           fractions: str = typer.Option(ALL_FRACTIONS, help="Comma-separated shares of heads, evenly spaced from "
                                                             "0 (importance is re-estimated after each step)."),
           threshold: float = THRESHOLD, tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§4 Fig. 3: BLEU vs % of heads pruned, importance order re-estimated after each step against random order
    (mean and spread over --seeds), and the largest fraction within --threshold BLEU of the full model. Writes
    pruning_curves.json and pruning_curves.png."""
    from prunetrain.methods.studies import pruning_curves_study

    check_positive(sentences=sentences, beams=beams, batch_size=batch_size, num_batches=num_batches, seeds=seeds)
    grid = parse_fractions(fractions)
    _threshold(threshold)
    check_data_dir(data_dir)
    out = _output(output, "curves", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    metric, settings = _bleu(model, tokenizer, data_dir, split, sentences, beams, batch_size)
    batches = _importance_batches(model, tokenizer, data_dir, num_batches, net)
    result = pruning_curves_study(net, metric, batches, key="bleu", fractions=grid, random_seeds=range(seeds),
                                  threshold=threshold, out_dir=out, args={**settings, "num_batches": num_batches})
    summary = {name: [[p["fraction"], p["value"]] for p in c["points"]] for name, c in result["curves"].items()}
    emit({"study": "curves", "output": str(out), "summary": result["summary"], "curves": summary}, None)


@study_app.command("per-kind")
def per_kind(model: Path = MODEL, data_dir: Path = DATA_DIR, split: str = SPLIT, sentences: int = SENTENCES,
             beams: int = BEAMS, batch_size: int = BATCH_SIZE, num_batches: int = NUM_BATCHES,
             fractions: str = typer.Option(ALL_FRACTIONS, help="Comma-separated shares of one kind's heads."),
             threshold: float = THRESHOLD, tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§5 Fig. 4: the pruning curve of each attention kind alone (encoder self, decoder self, cross; importance
    order), and which kind is most sensitive. Writes per_kind_curves.json and per_kind_curves.png."""
    from prunetrain.methods.studies import per_kind_curves

    check_positive(sentences=sentences, beams=beams, batch_size=batch_size, num_batches=num_batches)
    grid = parse_fractions(fractions)
    _threshold(threshold)
    check_data_dir(data_dir)
    out = _output(output, "per-kind", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    metric, settings = _bleu(model, tokenizer, data_dir, split, sentences, beams, batch_size)
    batches = _importance_batches(model, tokenizer, data_dir, num_batches, net)
    result = per_kind_curves(net, metric, batches, key="bleu", fractions=grid, threshold=threshold, out_dir=out,
                             args={**settings, "num_batches": num_batches})
    summary = {name: [[p["fraction"], p["value"]] for p in c["points"]] for name, c in result["curves"].items()}
    emit({"study": "per-kind", "output": str(out), "summary": result["summary"], "curves": summary}, None)


@study_app.command("speed")
def speed(model: Path = MODEL, data_dir: Path = DATA_DIR, num_batches: int = NUM_BATCHES,
          fractions: str = typer.Option("0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9",
                                        help="Comma-separated shares of heads to prune (one-shot importance)."),
          batch_sizes: str = typer.Option("1,8,32,64"), seq_lens: str = typer.Option("32"),
          generate: str = typer.Option("", help="Comma-separated: greedy, beam4 (timed generation too)."),
          repeats: int = typer.Option(10), warmup: int = typer.Option(1),
          threads: Optional[int] = typer.Option(None, help="torch threads for the timing (default: as is)."),
          tokenizer: Optional[Path] = TOKENIZER, output: Optional[Path] = OUTPUT):
    """§4.3: the benchmark of the shrunk model at each pruning fraction against the full model, beside the paper's
    +17.5 % at 50 %. Writes speed.json, speed.md (table) and speed.png. Take timings on a quiet machine."""
    from prunetrain.bench.runner import GENERATE_MODES
    from prunetrain.methods.studies import speed_study
    from prunetrain.utils.validate import check_choice, check_int

    check_positive(num_batches=num_batches, repeats=repeats, **({"threads": threads} if threads is not None else {}))
    check_int("--warmup", warmup, 0)
    grid = parse_fractions(fractions)
    if not any(f > 0 for f in grid):
        raise UserError(f"--fractions: {fractions!r} holds no fraction > 0 (0 is the full model, the baseline).")
    sizes, lens = parse_ints("--batch-sizes", batch_sizes), parse_ints("--seq-lens", seq_lens)
    modes = [g.strip() for g in generate.split(",") if g.strip()]
    for mode in modes:
        check_choice("--generate", mode, GENERATE_MODES)
    check_data_dir(data_dir)
    out = _output(output, "speed", model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    batches = _importance_batches(model, tokenizer, data_dir, num_batches, net)
    result = speed_study(net, batches, fractions=grid, batch_sizes=sizes, seq_lens=lens, generate=modes or None,
                         repeats=repeats, warmup=warmup, threads=threads, out_dir=out,
                         args={"model": str(model.resolve()), "data": str(data_dir.resolve()),
                               "num_batches": num_batches})
    emit({"study": "speed", "output": str(out), "paper": result["paper"], "table": result["table"]}, None)
    typer.echo((out / "speed.md").read_text(), err=True)
