"""What defines a translation recipe's length, checked across its sections: a FLOP budget (`train.max_flops`, equal
compute), a training-time budget (`train.max_minutes` is only a guard; `train.max_train_minutes` is the budget, in
minutes of the training clock, `prunetrain.training.training_clock`: optimizer steps, the pruning method's own work
and data loading, never the measurements or checkpoint writes — equal wall-clock), or neither (epochs / max_steps).

A run has at most one budget. `train.cooldown` is a share of whichever it has; `eval.test_flops` are shares of the FLOP
budget and `eval.test_times` shares of the training-time budget (test BLEU where the clock first reaches them).
"""

from __future__ import annotations

from prunetrain.utils.validate import check_positive_float

__all__ = ["check_budgets", "check_test_times"]


def check_test_times(shares) -> None:
    """`eval.test_times`: shares of the training-time budget, each in (0, 1), increasing."""
    for share in shares:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
            raise ValueError(f"eval.test_times: {share!r} is not allowed; give shares of train.max_train_minutes "
                             f"strictly between 0 and 1 (0.25: a quarter of the budget).")
    if any(later <= earlier for earlier, later in zip(shares, shares[1:])):
        raise ValueError(f"eval.test_times: {shares!r} is out of order; give increasing shares of "
                         f"train.max_train_minutes, each once.")


def check_budgets(recipe) -> None:
    """The budget fields of a translation recipe against each other (ValueError naming the field)."""
    t, ev = recipe.train, recipe.eval
    minutes = check_positive_float("train.max_train_minutes", t.max_train_minutes, allow_zero=True)
    if minutes and t.max_flops:
        raise ValueError(f"train.max_train_minutes: {minutes!r} is a training-time budget, but train.max_flops="
                         f"{t.max_flops:.4g} is set too; a run has one budget — set train.max_flops=0 for a run "
                         f"defined by its training time, or train.max_train_minutes=0.")
    if minutes and t.max_minutes and not t.max_minutes > minutes:
        raise ValueError(f"train.max_minutes: {t.max_minutes!r} is not more than train.max_train_minutes={minutes!r}; "
                         f"the guard (wall time, measurements and checkpoints included) would end the run before its "
                         f"training-time budget — give more minutes or 0 (no guard).")
    if t.cooldown and not t.max_flops and not minutes:
        raise ValueError(f"train.cooldown: {t.cooldown!r} is a share of train.max_flops, which is 0; set a FLOP "
                         f"budget (train.max_flops), a training-time budget (train.max_train_minutes) or leave the "
                         f"cooldown at 0.")
    from prunetrain.training.cooldown import NOT_LAMBDA_SCHEDULERS

    if t.cooldown and t.scheduler in NOT_LAMBDA_SCHEDULERS:
        raise ValueError(f"train.scheduler: {t.scheduler!r} is not allowed with train.cooldown; the cooldown scales a "
                         f"schedule that computes each rate from its base rate (any other transformers "
                         f"lr_scheduler_type).")
    if ev.test_flops and not t.max_flops:
        raise ValueError(f"eval.test_flops: {ev.test_flops!r} are shares of train.max_flops, which is 0; set a FLOP "
                         f"budget (train.max_flops) or use eval.test_steps"
                         + (" (with train.max_train_minutes, give the shares as eval.test_times)." if minutes else "."))
    check_test_times(ev.test_times)
    if ev.test_times and not minutes:
        raise ValueError(f"eval.test_times: {ev.test_times!r} are shares of train.max_train_minutes, which is 0; set "
                         f"a training-time budget (train.max_train_minutes) or use eval.test_steps.")
