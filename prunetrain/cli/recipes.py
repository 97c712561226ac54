"""`prunetrain recipe` (a recipe end to end: the translation pipeline or the L0 sweeps) and `prunetrain compare`
(finished runs side by side)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import List, Optional

import typer

from prunetrain.cli.common import UserError, app, check_positive, emit, progress_line
from prunetrain.utils import output_paths
from prunetrain.utils.validate import check_positive_float


@app.command()
def recipe(
    name: Optional[str] = typer.Argument(None, help="Recipe name (see --list) or path to a recipe .yaml."),
    set_: List[str] = typer.Option([], "--set", help="Override a field: section.key=value (repeatable)."),
    data_dir: Optional[Path] = typer.Option(None, help="Parallel-text directory (train|valid|test.{de,en})."),
    output: Optional[Path] = typer.Option(None, help="Run directory (default checkpoints/<recipe>)."),
    resume: bool = typer.Option(False, help="Continue the unfinished run in --output (same recipe)."),
    overwrite: bool = typer.Option(False, help="Replace the run --output holds (a run prunetrain wrote); it is kept "
                                               "whole beside it until the new run is complete."),
    smoke: bool = typer.Option(False, help="The recipe's small preset: the whole pipeline in a few minutes."),
    list_: bool = typer.Option(False, "--list", help="List the available recipes."),
    show: bool = typer.Option(False, help="Validate the recipe (with overrides), print it as YAML and exit."),
):
    """Run a recipe end to end (e.g. `prunetrain recipe wmt-small-deen`)."""
    from prunetrain.mt.config.recipe import available_recipes, load_recipe, recipe_to_yaml

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
    from prunetrain.mt.run.run_checks import check_with_local_data
    from prunetrain.mt.run.run_record import with_data_dir

    config = with_data_dir(config, data_dir)  # --data-dir is data.dir: recipe.yaml and results.json record it
    check_with_local_data(config)  # what the run checks against its data, where the data is here already
    from prunetrain.mt.run.preflight import check_initial_architecture

    check_initial_architecture(config)  # init_layout's file and fit, init_heads: before --show or any write
    if show:
        typer.echo(recipe_to_yaml(config))
        return
    out = output or Path("checkpoints") / (config.name + ("-smoke" if smoke else ""))
    output_paths.check_not_protected(out)  # never the current, home or root directory, whatever the flags
    run_kwargs = dict(data_dir=str(data_dir) if data_dir else None, resume=resume, overwrite=overwrite,
                      progress=progress_line)
    if config.kind == "l0-sweep":
        from prunetrain.mt.run.l0_sweep import run_gate_sweep
        from prunetrain.mt.run.ranks import launched_world_size

        if launched_world_size() > 1:
            raise UserError(f"recipe: {config.name!r} is an l0-sweep recipe, which runs in one process; start it "
                            f"without torchrun (the translation recipes run under torchrun).")

        from prunetrain.mt.run.run_dir import replaced_run_kept

        # one writer; stdout: JSON; --overwrite: the old run back in place if the sweep does not finish
        with output_paths.output_lock(out), contextlib.redirect_stdout(sys.stderr), \
                replaced_run_kept(out, progress_line):
            results = run_gate_sweep(config, out, **run_kwargs)
        summary = {"output": str(out), "full_bleu": results["full_bleu"], "minutes": round(results["minutes"], 2),
                   "runs": [{k: r[k] for k in ("label", "heads_kept", "kept_per_kind", "bleu")}
                            for r in results["runs"]]}
        if results["scratch"]:
            summary["scratch_bleu"] = results["scratch"]["bleu"]
        emit(summary, None)
        return
    from prunetrain.mt.run.runner import run_recipe

    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout carries only the JSON
        results = run_recipe(config, out, **run_kwargs)
    if results is None:  # a rank other than 0 under torchrun: rank 0 prints the summary
        return
    if config.eval.print_test:
        scores = {"test_bleu": results["test_pruned"]["bleu"], "test_bleu_trained": results["test_full"]["bleu"]}
    else:  # the run's test scores are in its files only; the summary shows what a choice may look at
        valid = results["final_scores"].get("valid")
        scores = {"valid_bleu": valid["bleu"] if valid else None, "valid_chrf": valid["chrf"] if valid else None}
    summary = {"output": str(out), **scores, "heads_trained": results["heads_trained"],
               "heads_kept": results["heads_kept"], "heads_total": results["heads_total"],
               **({"neurons_kept": results["neurons_kept"]} if "neurons_kept" in results else {}),
               "steps": results["steps"], "train_minutes": round(results["train_minutes"], 2),
               "train_step_minutes": round(results["train_step_minutes"], 2)}
    emit(summary, None)


@app.command()
def compare(
    runs: List[Path] = typer.Argument(..., help="Finished recipe run directories; the first is the reference."),
    output: Path = typer.Option(..., help="New directory for compare.md, compare.json and compare.png."),
    names: Optional[str] = typer.Option(None, help="Comma-separated run names (default: the directory names); runs "
                                                   "sharing a name are seeds of one arm (mean ± sd, paired tests)."),
    bootstrap_samples: Optional[int] = typer.Option(None, help="Resamples of the paired bootstrap between final "
                                                               "models [default: 1000; not with --validation-only]."),
    validation_only: bool = typer.Option(False, "--validation-only",
                                         help="Only what a choice may look at: validation BLEU/chrF, validation BLEU "
                                              "at equal FLOPs and the arm validation chooses; no test score is read "
                                              "into the output (for selection runs)."),
    max_total_flops: Optional[float] = typer.Option(None, "--max-total-flops",
                                                    help="Choose on validation among the arms whose mean training "
                                                         "plus teacher FLOPs stay within this budget; the best arm "
                                                         "over it is named beside the choice."),
):
    """Recipe runs side by side: BLEU at equal training FLOPs, equal steps and equal training time, seeds as mean ±
    sd, every test set (BLEU, chrF), paired t-test and sign-flip test across seeds, paired bootstrap between final
    models, the arm validation chooses, speed, heads (e.g. pruning during training vs pruning off)."""
    from prunetrain.mt.comparison.compare import comparison_markdown, write_comparison

    if bootstrap_samples is not None:
        check_positive(bootstrap_samples=bootstrap_samples)
    if max_total_flops is not None:
        check_positive_float("--max-total-flops", max_total_flops)
    output_paths.check_disjoint(output, {f"run {str(run)!r}": run for run in runs})  # never into or around a run
    labels = [n.strip() for n in names.split(",")] if names is not None else None  # '' is refused, not ignored
    result = write_comparison(runs, output, labels, samples=bootstrap_samples, validation_only=validation_only,
                              max_total_flops=max_total_flops)
    if validation_only:
        from prunetrain.mt.comparison.compare_validation import validation_markdown

        typer.echo(validation_markdown(result), err=True)
        emit({"output": str(output), **result}, None)
        return
    typer.echo(comparison_markdown(result), err=True)
    emit({"output": str(output), "arms": result["arms"], "equal_flops": result["equal_flops"],
           "paired_tests": result["paired_tests"], "test_sets": result["test_sets"], "seed_tests": result["seed_tests"],
           "bootstrap_by_split": result["bootstrap_by_split"], "selection": result["selection"],
           "equal_steps": result["equal_steps"], "equal_time": result["equal_time"]}, None)


def _smoke_overrides(name: str) -> list[str]:
    from prunetrain.mt.config.recipe import RECIPES_DIR, recipe_path
    from prunetrain.mt.text.data import read_lines

    path = recipe_path(name)
    preset = path.with_suffix(".smoke")
    if not preset.is_file():
        preset = RECIPES_DIR / f"{path.stem}.smoke"
    if not preset.is_file():
        raise UserError(f"--smoke: recipe {name!r} has no small preset ({path.stem}.smoke).")
    lines = read_lines(preset, argument="--smoke")
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
