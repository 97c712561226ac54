"""The settings a recipe run measures on this machine before training: `train.precision: measure` (bf16 autocast or
fp32) and `model.attn_implementation: measure` (eager or sdpa), timed together by
`prunetrain.bench.precision.time_training` and recorded in the run directory, so a resumed run trains on with what it
started with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from prunetrain.mt.config.recipe import MEASURED_ATTENTIONS, Recipe
from prunetrain.mt.run import ranks
from prunetrain.utils.device import use_bf16

if TYPE_CHECKING:
    from prunetrain.mt.run.inputs import RunInputs

PRECISION_RECORD = "precision_record.json"
SETTINGS_IN_CHECKPOINT = "prunetrain_run_settings.json"
"""Written into every checkpoint: the precision and attention the run trained it with (`RunSettingsRecord`)."""


def measures_settings(recipe: Recipe) -> bool:
    """Whether the run times its precision and/or attention kernel before training (`measured_settings`)."""
    return recipe.train.precision == "measure" or recipe.model.attn_implementation == "measure"


def measured_settings(recipe: Recipe, model, inputs: RunInputs, out_dir: Path,
                      progress: Callable[[str], None]) -> RunInputs:
    """`train.precision=measure` (the faster of bf16 autocast and fp32 on this machine) and/or
    `model.attn_implementation=measure` (the faster of eager and sdpa), timed together on a copy of the model over
    the run's first training batches (`prunetrain.bench.precision.time_training`) and recorded in
    `precision_record.json`; the model gets the chosen attention. A resumed run trains on with what it started with
    (the record), never measuring again."""
    import dataclasses

    from prunetrain.bench.precision import time_training
    from prunetrain.mt.text import data as D
    from prunetrain.utils.files import read_json

    path = out_dir / PRECISION_RECORD
    if not path.is_file() and any(out_dir.glob("checkpoint-*")):  # a run that started: its record is gone
        raise ValueError(f"--resume: {str(path)!r} is missing, but the run has checkpoints: it measured its precision "
                         f"and attention when it started and cannot go on without that record (put it back, or "
                         f"start again with --overwrite).")
    if path.is_file():
        record = read_json(path, "--resume")
        if record.get("chosen") not in ("bf16", "fp32"):
            raise ValueError(f"--resume: {str(path)!r} names no precision ('bf16' or 'fp32'); the run cannot go on "
                             f"in the precision it started with.")
        record.setdefault("attention", recipe.model.built_attention)  # a record from before attention was timed
        if record["attention"] not in MEASURED_ATTENTIONS:
            raise ValueError(f"--resume: {str(path)!r} names the attention {record['attention']!r}, not one of "
                             f"{', '.join(map(repr, MEASURED_ATTENTIONS))}; the run cannot go on as it started.")
        progress(f"precision: {record['chosen']}, attention: {record['attention']}, as measured when the run "
                 f"started ({PRECISION_RECORD})")
    else:
        if ranks.launched_world_size() > 1:
            raise ValueError("train.precision / model.attn_implementation: 'measure' times one process; under "
                             "torchrun give the precision and the attention (measure them first in one process).")
        t, m = recipe.train, recipe.model
        precisions = None if t.precision == "measure" else ["bf16" if use_bf16(t.precision) else "fp32"]
        attentions = list(MEASURED_ATTENTIONS) if m.attn_implementation == "measure" else [m.attn_implementation]
        size = t.batch_size
        sample = D.collate_batches(inputs.train_set, D.make_collator(inputs.tokenizer, model), size, limit=2 * size)
        record = time_training(model, sample, precisions=precisions, attentions=attentions)
        if ranks.is_main():
            path.write_text(json.dumps(record, indent=1))
        timings = ", ".join(f"{k} {v:.3f} s" for k, v in record["candidates"].items()) or record.get("why", "")
        progress(f"measured per training step: {timings}; training in {record['chosen']} with "
                 f"{record['attention']} attention")
    model.set_attn_implementation(record["attention"])
    return dataclasses.replace(inputs, bf16=record["chosen"] == "bf16", precision=record)


def settings_record(recipe: Recipe, inputs: RunInputs, model, checkpoint=None):
    """A Trainer callback that writes the precision and attention the run trains with into every checkpoint it
    saves (rank 0, `SETTINGS_IN_CHECKPOINT`); resuming from `checkpoint`, first refuse to go on in other settings
    than it was trained with (`check_checkpoint_settings`), whatever the run directory's records say now.

    Args:
        recipe: the run's recipe.
        inputs: the run's inputs (`bf16`; `precision`: its `precision_record.json`, None when `train.precision`
            chose).
        model: the model about to train (its attention implementation is recorded).
        checkpoint: the checkpoint the run resumes from (None: a run from the start).
    """
    from transformers import TrainerCallback

    settings = {"precision": "bf16" if inputs.bf16 else "fp32", "attention": model.config._attn_implementation}
    if checkpoint is not None:
        source = PRECISION_RECORD if inputs.precision is not None else (
            f"train.precision={recipe.train.precision} and model.attn_implementation="
            f"{recipe.model.attn_implementation} on this machine")
        check_checkpoint_settings(Path(checkpoint), settings, source)

    class RunSettingsRecord(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / SETTINGS_IN_CHECKPOINT
                path.write_text(json.dumps(settings, indent=1))

    return RunSettingsRecord()


def check_checkpoint_settings(checkpoint: Path, settings: dict, source: str) -> None:
    """Refuse to resume from `checkpoint` in other settings than it was trained with (`SETTINGS_IN_CHECKPOINT`; a
    checkpoint written before the record has nothing to compare).

    Args:
        checkpoint: the checkpoint the run resumes from.
        settings: {"precision": "bf16" | "fp32", "attention": implementation} of the resumed run.
        source: what chose the resumed run's settings, for the message (e.g. "precision_record.json").
    """
    from prunetrain.utils.files import read_json

    path = Path(checkpoint) / SETTINGS_IN_CHECKPOINT
    if not path.is_file():
        return
    saved = read_json(path, "--resume")
    for key, value in settings.items():
        if saved.get(key) != value:
            raise ValueError(f"--resume: {Path(checkpoint).name} was trained with {key} {saved.get(key)!r}, but the "
                             f"run would go on with {value!r} (chosen by {source}); a resume goes on as the run "
                             f"started (put its record back, or start again with --overwrite).")
