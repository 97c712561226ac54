"""The translation recipe pipeline (`prunetrain recipe wmt-small-deen`).

data → joint subword vocabulary → Transformer (MarianMTModel from config) → `Seq2SeqTrainer` with
`HeadPruningCallback` (importance at chosen epochs, optional pruning schedule) and `PruningCurveCallback`
(pruned-BLEU curves per epoch, Michel et al. §6) → after training: prune by importance to the recipe's target,
`shrink`, `save_pruned`, BLEU of full and pruned model on the test split, benchmark original vs shrunk, and a run
report (`report.md`, `results.json`, figures, TensorBoard).
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import TrainerCallback

from prunetrain.utils.progress import enabled as progress_enabled
from prunetrain.mt.recipe import Recipe, recipe_to_yaml

RUN_MARKER = "recipe.yaml"


class TimeLimitCallback(TrainerCallback):
    """Stop training gracefully once `max_minutes` have passed (checked after every step; 0 = no limit)."""

    def __init__(self, max_minutes: float):
        self.max_minutes = max_minutes
        self.start: float | None = None
        self.stopped_at: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_minutes > 0 and time.time() - self.start > 60 * self.max_minutes:
            control.should_training_stop = True
            self.stopped_at = state.epoch
        return control


def prepare_output_dir(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to reuse a directory that holds a run unless `resume` or `overwrite` is given."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite: choose one (resume continues the run, overwrite deletes it).")
    holds_run = out_dir.exists() and any(out_dir.iterdir())
    if holds_run and not (resume or overwrite):
        raise ValueError(f"output: {str(out_dir)!r} already holds a run; pass --resume to continue it or "
                         f"--overwrite to replace it.")
    if resume and not (out_dir / RUN_MARKER).is_file():
        raise ValueError(f"--resume: {str(out_dir)!r} holds no run to resume (no {RUN_MARKER}).")
    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def load_pairs(recipe: Recipe, data_dir: str | None):
    """(train, valid, test) pairs from the recipe's data source."""
    from prunetrain.mt import data as D

    cfg = recipe.data
    if cfg.hf_dataset:
        train = D.load_hf_parallel(cfg.hf_dataset, split="train", src=cfg.src, tgt=cfg.tgt)
        valid = D.load_hf_parallel(cfg.hf_dataset, split="validation", src=cfg.src, tgt=cfg.tgt)
        test = D.load_hf_parallel(cfg.hf_dataset, split=cfg.test_split, src=cfg.src, tgt=cfg.tgt)
    else:
        directory = Path(data_dir or cfg.dir or D.default_data_dir() / "multi30k")
        if not directory.is_dir():
            raise ValueError(f"data: {str(directory)!r} is not a directory; give --data-dir with "
                             f"train|valid|test.{{{cfg.src},{cfg.tgt}}} files.")
        limit = cfg.train_limit or None
        train = D.read_parallel(directory, "train", cfg.src, cfg.tgt, limit=limit)
        valid = D.read_parallel(directory, "valid", cfg.src, cfg.tgt)
        test = D.read_parallel(directory, cfg.test_split, cfg.src, cfg.tgt)
    return train, valid, test


def training_args(output_dir: str | Path, **settings):
    """`Seq2SeqTrainingArguments` for the translation recipes: the run's `settings` on top of what every recipe
    shares (Adam β2 = 0.98 as in the Transformer paper, length-grouped batches, TensorBoard, the CPU when there is
    no CUDA, progress bars as `prunetrain.utils.progress` decides)."""
    from transformers import Seq2SeqTrainingArguments

    shared = dict(report_to=["tensorboard"], disable_tqdm=not progress_enabled(),
                  use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                  train_sampling_strategy="group_by_length", adam_beta2=0.98)
    return Seq2SeqTrainingArguments(output_dir=str(output_dir), **(shared | settings))


def run_recipe(recipe: Recipe, out_dir: str | Path, *, data_dir: str | None = None, resume: bool = False,
               overwrite: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Run the whole pipeline; returns the results dictionary (also written to `results.json`)."""
    from transformers import MarianMTModel, Seq2SeqTrainer

    from prunetrain.mt import data as D
    from prunetrain.training.callbacks import HeadPruningCallback, PruningCurveCallback, restore_layout
    from prunetrain.engine.heads import find_heads
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.engine.shrink import shrink
    from prunetrain.mt.translation import evaluate_bleu

    out_dir = Path(out_dir)
    started = time.time()
    train_pairs, valid_pairs, test_pairs = load_pairs(recipe, data_dir)  # validate data before touching the output
    prepare_output_dir(out_dir, resume, overwrite)
    (out_dir / RUN_MARKER).write_text(recipe_to_yaml(recipe))
    progress(f"data: {len(train_pairs)} train, {len(valid_pairs)} valid, {len(test_pairs)} test pairs")

    tok_dir = out_dir / "tokenizer"
    if resume and (tok_dir / "tokenizer.json").is_file():
        tokenizer = D.load_tokenizer(tok_dir)
    else:
        tokenizer = D.train_tokenizer(train_pairs, vocab_size=recipe.data.vocab_size, path=tok_dir)
    m = recipe.model
    torch.manual_seed(recipe.train.seed)
    config = D.marian_config(tokenizer, d_model=m.d_model, ffn_dim=m.ffn_dim, layers=m.layers, heads=m.heads,
                             dropout=m.dropout, attn_implementation=m.attn_implementation)
    model = MarianMTModel(config)
    train_set = D.build_dataset(train_pairs, tokenizer, max_length=recipe.data.max_length)
    collator = D.make_collator(tokenizer, model)
    p, t = recipe.pruning, recipe.train
    from prunetrain.utils.device import use_bf16

    bf16 = use_bf16(t.precision)
    importance_pairs = train_pairs[: p.importance_batches * p.importance_batch_size]
    importance_set = D.build_dataset(importance_pairs, tokenizer, max_length=recipe.data.max_length)
    importance_batches = D.collate_batches(importance_set, collator, p.importance_batch_size)
    curve_pairs = valid_pairs[: p.curve_sentences]
    progress(f"precision: {'bf16 autocast' if bf16 else 'fp32'} (train.precision={t.precision})")
    progress(f"model: {sum(x.numel() for x in model.parameters()) / 1e6:.1f} M parameters, "
             f"{find_heads(model).summary()}")

    epochs = [e for e in p.importance_epochs if e <= t.epochs]
    curve_epochs = [e for e in p.curve_epochs if e <= t.epochs]
    callbacks = [HeadPruningCallback(at_epochs=epochs or [t.epochs], prune=p.schedule or None, mode=p.mode,
                                     scope=p.scope, min_heads_per_layer=p.min_heads_per_layer,
                                     batches=importance_batches)]
    if curve_epochs:
        callbacks.append(PruningCurveCallback(
            at_epochs=curve_epochs, fractions=p.curve_fractions, eval_pairs=curve_pairs, tokenizer=tokenizer,
            batch_size=recipe.eval.curve_batch_size, autocast_bf16=bf16, importance_batches=importance_batches,
            order="both" if p.curve_random_baseline else "importance", scope=p.scope,
            min_heads_per_layer=p.min_heads_per_layer))
    time_limit = TimeLimitCallback(t.max_minutes)
    callbacks.append(time_limit)
    args = training_args(
        out_dir, num_train_epochs=t.epochs, per_device_train_batch_size=t.batch_size,
        learning_rate=t.learning_rate, warmup_steps=t.warmup_steps, lr_scheduler_type=t.scheduler,
        weight_decay=t.weight_decay, label_smoothing_factor=t.label_smoothing, max_grad_norm=t.max_grad_norm,
        bf16=bf16, seed=t.seed, logging_steps=t.logging_steps, save_strategy="epoch",
        save_total_limit=t.save_total_limit,
    )
    checkpoint = None
    if resume:
        from prunetrain.training.callbacks import last_complete_checkpoint

        checkpoint = last_complete_checkpoint(out_dir)
        if checkpoint is None:
            raise ValueError(f"--resume: {str(out_dir)!r} has no checkpoint-* directory to resume from.")
        restore_layout(model, checkpoint)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_set, data_collator=collator,
                             processing_class=tokenizer, callbacks=callbacks)
    train_start = time.time()
    trainer.train(resume_from_checkpoint=checkpoint)
    train_minutes = (time.time() - train_start) / 60
    progress(f"training took {train_minutes:.1f} min")

    # ---- after training: prune to the target by importance, shrink, evaluate, benchmark ----
    model = trainer.model
    from prunetrain.engine.mask import attached_masks

    for mask in attached_masks(model):  # training-time masks become physical first
        shrink(model, mask)
    model.eval()
    scores = head_importance(model, importance_batches)
    final_mask = select_heads(scores, p.final_fraction, scope=p.scope, min_heads_per_layer=p.min_heads_per_layer)
    ev = recipe.eval
    if ev.test_limit:
        test_pairs = test_pairs[: ev.test_limit]
    bleu_kw = dict(batch_size=ev.batch_size, num_beams=ev.num_beams, autocast_bf16=bf16)
    full = evaluate_bleu(model, tokenizer, test_pairs, **bleu_kw)
    progress(f"test BLEU full model: {full['bleu']:.2f} ({full['bleu_signature']})")
    with final_mask.applied(model):
        masked = evaluate_bleu(model, tokenizer, test_pairs, **bleu_kw)
    pruned = copy.deepcopy(model)
    shrink(pruned, final_mask)
    shrunk = evaluate_bleu(pruned, tokenizer, test_pairs, **bleu_kw)
    progress(f"test BLEU with {p.final_fraction:.0%} of heads pruned: {shrunk['bleu']:.2f} (masked model: "
             f"{masked['bleu']:.2f})")
    from prunetrain.mt.translation import save_translation_model

    save_translation_model(model, tokenizer, out_dir / "full", overwrite=True)
    save_translation_model(pruned, tokenizer, out_dir / "pruned", overwrite=True)
    final_mask.to_json(out_dir / "final_mask.json")

    bench = None
    if ev.bench:
        from prunetrain.bench import benchmark

        result = benchmark(model, pruned, batch_sizes=(ev.batch_size,), seq_lens=(16,), forward=True,
                           generate=("greedy", "beam4"), new_tokens=20, repeats=ev.bench_repeats,
                           dtype="bf16" if bf16 else "fp32", memory=False)
        result.to_json(out_dir / "bench.json")
        bench = json.loads(result.to_json())
        progress(result.table())

    results = {
        "recipe": recipe.to_dict(), "train_minutes": train_minutes, "total_minutes": (time.time() - started) / 60,
        "stopped_early_at_epoch": time_limit.stopped_at, "heads_total": final_mask.num_heads,
        "heads_kept": final_mask.num_kept, "kept_per_kind": final_mask.kept_per_kind(),
        "test_full": _strip(full), "test_masked": _strip(masked), "test_pruned": _strip(shrunk),
        "bench": bench,
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    from prunetrain.mt.report import write_report

    write_report(out_dir, results)
    progress(f"report: {out_dir / 'report.md'}")
    return results


def _strip(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "hypotheses"}
