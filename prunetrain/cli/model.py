"""The commands on saved models: `importance` (head importance on a data split), `prune` (by importance, saved
shrunk), `shrink` (the heads a mask zeroes removed), `curve` (BLEU with 0…90 % of the heads masked) and `bench`
(A/B speed of two models)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from prunetrain.cli.common import (TOKENIZER_HELP, UserError, app, check_data_dir, check_output_dir, check_output_file,
                                   check_positive, emit, load_model, parse_fractions, parse_ints, translation_batches,
                                   translation_model_dir)
from prunetrain.utils import output_paths
from prunetrain.utils.validate import check_choice, check_int

TOKENIZER_ENTRIES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                     "vocab.json", "merges.txt", "chat_template.jinja", "tokenizer")
"""What `shrink` carries from the model directory into the shrunk one (besides `*.model` sentencepiece files)."""
DATA_HELP = "Parallel-text directory ({split}.de and {split}.en, one sentence a line): translation models only."


@app.command()
def importance(
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    data_dir: Path = typer.Option(..., help=DATA_HELP),
    split: str = typer.Option("valid"),
    num_batches: int = typer.Option(8), batch_size: int = typer.Option(64),
    scorer: str = typer.Option("gradient", help="gradient | ablation | confidence | random"),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    output: Optional[Path] = typer.Option(None, help="Write the scores JSON here."),
):
    """Head importance (Michel et al. 2019 by default) of a saved translation model on a split of parallel text.

    Parallel text only (translation models): for a classifier or any other model use the Python API,
    `prunetrain.head_importance(model, batches)`."""
    from prunetrain.methods.importance import SCORERS, get_scorer

    check_positive(num_batches=num_batches, batch_size=batch_size)
    check_choice("--scorer", scorer, tuple(SCORERS))
    translation_model_dir(model)
    check_data_dir(data_dir)
    if output is not None:
        check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    score = get_scorer(scorer)
    net = load_model(model)
    _, _, batches = translation_batches(model, tokenizer, data_dir, split, num_batches, batch_size, net)
    emit(score(net, batches).to_dict(), output, "importance")


@app.command()
def prune(
    model: Path = typer.Argument(..., help="A saved translation model directory (with its tokenizer)."),
    output: Path = typer.Option(..., help="Directory for the shrunk model."),
    amount: float = typer.Option(0.5, help="Fraction of all heads to prune (0..1), or a count >= 1 with --count."),
    count: bool = typer.Option(False, help="Read --amount as a number of heads."),
    ffn_amount: float = typer.Option(0.0, help="Fraction of all FFN neurons to prune as well (0..1), ranked by "
                                               "importance over every FFN (scored in the heads' backward pass)."),
    flops: Optional[float] = typer.Option(None, help="Instead of --amount/--ffn-amount: the share of the model's "
                                                     "per-token weight multiply-adds to remove (0..1), met by the "
                                                     "cheapest mix of heads and FFN neurons."),
    data_dir: Path = typer.Option(..., help=DATA_HELP + " Importance is measured on it."),
    split: str = typer.Option("valid"),
    num_batches: int = typer.Option(8), batch_size: int = typer.Option(64),
    scope: str = typer.Option("global", help="global | layer | kind"),
    min_heads_per_layer: int = typer.Option(1),
    heads_multiple_of: int = typer.Option(1, help="Every attention site keeps a multiple of this many heads (of "
                                                  "key/value groups with grouped-query attention), e.g. a "
                                                  "tensor-parallel degree; 1: no constraint."),
    ffn_multiple_of: int = typer.Option(1, help="Every pruned FFN keeps a multiple of this many neurons (a matmul "
                                                "tile, e.g. 64: bf16 matmuls can run at half speed at odd widths); "
                                                "1: no constraint. Needs --ffn-amount or --flops."),
    same_heads_per_stack: bool = typer.Option(False, help="Every encoder site keeps the same number of heads, and "
                                                          "every decoder site (self and cross) the same: "
                                                          "CTranslate2's layout, exported without padding."),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    overwrite: bool = typer.Option(False, help="Replace --output if it holds a model prunetrain wrote (it may be the "
                                               "model itself); the old one stays whole until the new one is "
                                               "complete."),
):
    """Prune the least important heads (and FFN neurons, with --ffn-amount or --flops) of a saved translation model and
    save it shrunk (with its tokenizer and mask.json).

    --heads-multiple-of, --ffn-multiple-of and --same-heads-per-stack move each site's count to the nearest allowed
    one after the selection (the highest-scoring units stay), so the share removed can move a little from --amount,
    --ffn-amount or --flops.

    Parallel text only (translation models): for a classifier or any other model use the Python API
    (`prunetrain.head_importance`, `select_heads`, `shrink`, `save_pruned`), or `prunetrain shrink` with a mask."""
    from prunetrain.engine.shrink import shrink as do_shrink
    from prunetrain.methods.constraints import apply_constraints
    from prunetrain.methods.flop_budget import select_by_flops
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.mt.evaluation.translation import save_translation_model
    from prunetrain.utils.validate import check_amount, check_fraction

    check_positive(num_batches=num_batches, batch_size=batch_size)
    check_int("--min-heads-per-layer", min_heads_per_layer, 0)
    check_choice("--scope", scope, ("global", "layer", "kind"))
    value = _amount(amount, count)
    check_amount("--amount", value)
    check_fraction("--ffn-amount", ffn_amount)
    if flops is not None:
        check_fraction("--flops", flops)
    units = ("heads", "neurons") if ffn_amount or flops is not None else ("heads",)
    constraints = _serving_constraints(heads_multiple_of, ffn_multiple_of, same_heads_per_stack, units)
    translation_model_dir(model)
    check_data_dir(data_dir)
    with output_paths.output_lock(output):  # held for the whole command: a second writer of --output fails at once
        check_output_dir(output, overwrite, in_place="model", model=model, data_dir=data_dir, tokenizer=tokenizer)
        net = load_model(model)
        tok, _, batches = translation_batches(model, tokenizer, data_dir, split, num_batches, batch_size, net)
        if flops is not None:  # raw scores: a head and a neuron compared by loss per multiply-add
            scores = head_importance(net, batches, normalize=None, units=units)
            mask = select_by_flops(scores, float(flops), net, min_per_site=min_heads_per_layer)
        else:
            scores = head_importance(net, batches, units=units)
            mask = select_heads(scores, {"heads": value, "neurons": ffn_amount} if ffn_amount else value, scope=scope,
                                min_heads_per_layer=min_heads_per_layer)
        if constraints is not None:
            mask = apply_constraints(mask, scores, constraints)
        layout = do_shrink(net, mask)
        with output_paths.staging_directory(output) as staging:  # everything read; output may be the model itself
            save_translation_model(net, tok, staging / "model")
            mask.to_json(staging / "model" / "mask.json")
            output_paths.replace_directory(staging / "model", output, kind="model")  # old one whole until now
    emit(_kept_summary(output, layout), None)


def _serving_constraints(heads_multiple_of: int, ffn_multiple_of: int, same_heads_per_stack: bool, units):
    """The `ServingConstraints` of prune's flags, None when every flag is at its default (no constraint)."""
    from prunetrain.methods.constraints import constraints_if_any

    check_int("--heads-multiple-of", heads_multiple_of, 1)
    check_int("--ffn-multiple-of", ffn_multiple_of, 1)
    if ffn_multiple_of > 1 and "neurons" not in units:
        raise UserError(f"--ffn-multiple-of: {ffn_multiple_of} rounds the widths of pruned FFNs, but no FFN neuron is "
                        f"pruned; give --ffn-amount or --flops.")
    return constraints_if_any(same_heads_per_stack=same_heads_per_stack, heads_multiple_of=heads_multiple_of,
                              neurons_multiple_of=ffn_multiple_of)


def _kept_summary(output: Path, layout) -> dict:
    """What prune and shrink print: the heads kept per kind, and the FFN neurons kept when the layout has them."""
    summary = {"output": str(output), "heads_kept": layout.total_heads, "per_kind": layout.heads_per_kind()}
    if "neurons" in layout.units:
        summary.update(neurons_kept=layout.total_neurons, ffn_per_kind=layout.neurons_per_kind())
    return summary


def _amount(amount: float, count: bool) -> int | float:
    if not count:
        return amount
    if amount != int(amount) or amount < 0:
        raise UserError(f"--amount: {amount:g} is not a whole number of heads >= 0 (with --count).")
    return int(amount)


@app.command()
def shrink(
    model: Path = typer.Argument(..., help="A saved model directory."),
    mask: Path = typer.Option(..., help="HeadMask JSON (site -> keep list), e.g. from prune or a callback: one keep "
                                        "value per head a site holds now, or per original head (a callback's "
                                        "final_mask.json next to the model it shrank; mapped onto the heads left)."),
    output: Path = typer.Option(..., help="Directory for the shrunk model."),
    overwrite: bool = typer.Option(False, help="Replace --output if it holds a model prunetrain wrote (it may be the "
                                               "model itself); the old one stays whole until the new one is "
                                               "complete."),
):
    """Physically remove the heads a mask zeroes and save the result (the tokenizer's files copied along)."""
    from prunetrain.engine.model_dir import check_model_dir
    from prunetrain.engine.persist import save_pruned
    from prunetrain.engine.shrink import shrink as do_shrink
    from prunetrain.utils.files import read_json

    check_model_dir(model)
    read_json(mask, "--mask")  # a regular file holding a strict JSON object
    with output_paths.output_lock(output):  # held for the whole command: a second writer of --output fails at once
        check_output_dir(output, overwrite, in_place="model", model=model, mask=mask)
        net = load_model(model)
        keep = _mask_for_model(net, mask, model)
        layout = do_shrink(net, keep)
        with output_paths.staging_directory(output) as staging:  # everything read; output may be the model itself
            save_pruned(net, staging / "model")
            _copy_tokenizer(model, staging / "model")
            output_paths.replace_directory(staging / "model", output, kind="model")  # old one whole until now
    emit(_kept_summary(output, layout), None)


def _mask_for_model(net, mask: Path, model: Path):
    """The --mask as a HeadMask of `net` as it is now. A site's keep list has one value per head the site holds now
    — or one per head it had originally (`original_num_heads`): what a pruning callback writes for the model it then
    shrinks, next to the directory that holds the shrunk model. Such a list is mapped exactly onto the original
    heads the site still holds; one that keeps a head the model no longer holds is refused."""
    from prunetrain.engine.heads import layout_naming
    from prunetrain.engine.mask import HeadMask
    from prunetrain.utils.files import read_json

    data = read_json(mask, "--mask")
    sites = data.get("sites")
    layout = layout_naming(net, list(sites) if isinstance(sites, dict) else [])
    if isinstance(sites, dict):
        sites = dict(sites)
        for name, values in sites.items():
            if name not in layout or not isinstance(values, list):
                continue
            site = layout[name]
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            if not numbers or len(values) == site.num_heads or len(values) != site.original_num_heads:
                continue  # as given (HeadMask checks the values)
            gone = [head for head, value in enumerate(values) if value != 0 and head not in site.heads]
            if gone:
                raise UserError(f"--mask: {str(mask)!r} keeps head {gone[0]} of site {name!r} (in the original "
                                f"numbering: {len(values)} keep values), which {str(model)!r} no longer holds; use "
                                f"it on the model it was made for, or a mask of the {site.num_heads} heads the site "
                                f"holds now.")
            sites[name] = [values[head] for head in site.heads]
        data = {**data, "sites": sites}
    try:
        return HeadMask.from_dict(data, layout)
    except ValueError as err:
        raise UserError(f"--mask: {str(mask)!r} does not fit {str(model)!r}: {err} A mask holds one keep value per "
                        f"head a site holds now, or per original head (as the pruning callbacks write them).") \
            from None


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
    data_dir: Path = typer.Option(..., help=DATA_HELP),
    split: str = typer.Option("valid"),
    sentences: int = typer.Option(500, help="Evaluation sentences."),
    fractions: str = typer.Option("0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="Comma-separated fractions."),
    order: str = typer.Option("importance", help="importance | random"),
    iterative: bool = typer.Option(False), beams: int = typer.Option(1), batch_size: int = typer.Option(100),
    bf16: bool = typer.Option(False), num_batches: int = typer.Option(8),
    tokenizer: Optional[Path] = typer.Option(None, help=TOKENIZER_HELP),
    output: Optional[Path] = typer.Option(None),
):
    """BLEU of a saved translation model with 0…90 % of its heads masked (importance or random order).

    Parallel text only (translation models): for another model and metric use the Python API,
    `prunetrain.pruning_curve(model, metric, ...)`."""
    from prunetrain.methods.curve import ORDERS, Ranking, pruning_curve
    from prunetrain.mt.evaluation.metrics import bleu_metric
    from prunetrain.mt.text.data import read_parallel

    check_positive(sentences=sentences, beams=beams, batch_size=batch_size, num_batches=num_batches)
    check_choice("--order", order, ORDERS)
    grid = parse_fractions(fractions)
    translation_model_dir(model)
    check_data_dir(data_dir)
    if output is not None:
        check_output_file(output, model=model, data_dir=data_dir, tokenizer=tokenizer)
    net = load_model(model)
    tok, _, batches = translation_batches(model, tokenizer, data_dir, "train" if split == "valid" else split,
                                          num_batches, 64, net)
    pairs = read_parallel(data_dir, split, limit=sentences)
    metric = bleu_metric(tok, pairs, batch_size=batch_size, num_beams=beams, autocast_bf16=bf16)
    result = pruning_curve(net, metric, fractions=grid, ranking=Ranking(order, batches=batches, iterative=iterative),
                           key="bleu", metric_name="bleu")
    emit(result.to_dict(), output, "curve")


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

    sizes, lens = parse_ints("--batch-sizes", batch_sizes), parse_ints("--seq-lens", seq_lens)
    check_choice("--dtype", dtype, DTYPES)
    modes = [g.strip() for g in generate.split(",") if g.strip()]
    for mode in modes:
        check_choice("--generate", mode, GENERATE_MODES)
    check_positive(repeats=repeats)
    check_int("--warmup", warmup, 0)
    for argument, path in (("model_a", model_a), ("model_b", model_b)):
        check_model_dir(path, argument)
        _check_positions(path, argument, lens)
    if output is not None:
        check_output_file(output, model_a=model_a, model_b=model_b)
    import contextlib

    from prunetrain.utils.write_errors import write_errors

    with write_errors("--output", output) if output is not None else contextlib.nullcontext():  # a full disk: one line
        result = run_bench(model_a, model_b, batch_sizes=sizes, seq_lens=lens, dtype=dtype,
                           generate=modes or None, repeats=repeats, warmup=warmup, json_path=output)
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
