"""What every translation recipe's `Seq2SeqTrainer` shares: its arguments, how it is built and run, and a wall-clock
limit."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from prunetrain.utils.progress import enabled as progress_enabled


class TimeLimitCallback(TrainerCallback):
    """Stop training gracefully once `max_minutes` have passed (checked after every step).

    Args:
        max_minutes: the limit in minutes; 0 means no limit. `stopped_at` records the epoch training stopped at.
    """

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


def training_args(output_dir: str | Path, **settings):
    """`Seq2SeqTrainingArguments` for the translation recipes: the run's `settings` on top of what every recipe
    shares (Adam β2 = 0.98 as in the Transformer paper, length-grouped batches, TensorBoard, the CPU when there is
    no CUDA, progress bars as `prunetrain.utils.progress` decides).

    Args:
        output_dir: the Trainer's output directory (checkpoints, TensorBoard runs).
        **settings: any `Seq2SeqTrainingArguments` field; they override the shared ones.
    """
    from transformers import Seq2SeqTrainingArguments

    shared = dict(report_to=["tensorboard"], disable_tqdm=not progress_enabled(),
                  use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                  train_sampling_strategy="group_by_length", adam_beta2=0.98)
    return Seq2SeqTrainingArguments(output_dir=str(output_dir), **(shared | settings))


def finite_guard(recipe):
    """The recipe's `FiniteGuard`, naming the settings a diverged run most likely needs changed."""
    from prunetrain.training.finite import FiniteGuard

    t, d = recipe.train, recipe.distill
    hint = f"train.learning_rate={t.learning_rate:g}, train.max_grad_norm={t.max_grad_norm:g}"
    return FiniteGuard(hint + (f", distill.temperature={d.temperature:g}, distill.alpha={d.alpha:g}" if d.enabled
                               else ""))


def train_seq2seq(model, args, train_set, tokenizer, callbacks=(), resume_from_checkpoint=None,
                  compute_loss_func=None):
    """Build the recipes' `Seq2SeqTrainer` (the project's collator, the tokenizer as processing class) and train.

    The Trainer sets `model.config.use_cache` to `TrainingArguments.use_cache` (False) when it is built, so a model
    saved after training would say `use_cache: false` and a plain `model(...)` would build no cache; the model's own
    value is put back when training ends. With mixed precision, accelerate replaces the model's `forward` by one run
    under autocast (bf16 here) and leaves it there after training: every later use of the model (final BLEU under
    the run's own autocast setting, exports checked against the model in fp32) would silently compute in bf16, so
    the model's own `forward` is put back too. `compute_loss_func` is the Trainer's (e.g. `prunetrain.mt.run.ranks`'s
    loss over the whole step's tokens under torchrun); where none is given and `args.label_smoothing_factor` > 0 it
    is `SmoothedCrossEntropy` (the loss transformers' `LabelSmoother` computes, in one fused kernel: 8–11 % off the
    recipe's bf16 step, `prunetrain.training.loss`). A `FiniteGuard` joins the callbacks unless they have one: a
    non-finite gradient stops training with `TrainingDiverged` before any weight takes it. Returns the trainer.
    """
    from transformers import Seq2SeqTrainer

    from prunetrain.mt.text.data import make_collator
    from prunetrain.training.finite import FiniteGuard
    from prunetrain.training.loss import trainer_loss

    compute_loss_func = trainer_loss(args.label_smoothing_factor, compute_loss_func)
    if not any(isinstance(c, FiniteGuard) for c in callbacks):  # a diverged run stops (one line), never "complete"
        callbacks = [FiniteGuard(), *callbacks]
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_set,
                             data_collator=make_collator(tokenizer, model), processing_class=tokenizer,
                             callbacks=list(callbacks), compute_loss_func=compute_loss_func)
    try:
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    finally:
        current = getattr(model, "config", None)  # a shrink gives the model its own copy of the config (own_config)
        if use_cache is not None and current is not None:
            current.use_cache = use_cache
        remove_autocast_forward(model)
    return trainer


def remove_autocast_forward(model) -> None:
    """Put back the model's own `forward` where accelerate's mixed precision wrapped it (its `_original_forward`
    marks the wrapper); a model without the wrapper is left as it is."""
    from accelerate.utils import extract_model_from_parallel

    if "_original_forward" in getattr(model, "__dict__", {}):
        extract_model_from_parallel(model, keep_fp32_wrapper=False)
