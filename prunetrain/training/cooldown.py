"""`FlopCooldownCallback`: the learning rate decays linearly to zero over the last share of a FLOP budget.

A run defined by its compute (`MetricPointsCallback(max_flops=B)`) ends wherever its schedule has the learning rate
then; with `inverse_sqrt` that is still high, the model is taken from a rising, noisy curve, and which step ends the
run differs between a pruned run (more, cheaper steps) and a full one. A cooldown tied to the FLOPs rather than the
steps ends every run the same way at the same compute (warmup–stable–decay, Hägele et al. 2024, "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations"; linear decay to zero at the budget, Li et al. 2020,
"Budgeted Training"). With F_t the cumulative training FLOPs after optimizer step t (the clock's count) and η_s(t) the
scheduler's learning rate, step t + 1 trains with

    η(t + 1) = η_s(t + 1) · c(F_t),   c(F) = min(1, max(0, (B − F) / (share · B)))

so the decay starts once a (1 − share) part of the budget is spent and reaches zero where the budget ends. The factor
is applied to the optimizer's parameter groups at `on_step_end` of step t, after the Trainer's scheduler step (which
set η_s(t + 1)) and after the clock counted step t; the scheduler reports the applied rate, so the Trainer's logged
`learning_rate` is the one the next step uses. The scheduler must compute each rate from its base rates
(`LambdaLR`, which every transformers schedule but `reduce_lr_on_plateau` and `greedy` is), so the factor never
compounds. The factor is a function of the FLOPs alone: a resumed run (the clock restores its count; the optimizer
its scaled rates) continues exactly, and under DDP/FSDP every rank has the same count, hence the same rate.

A run defined by its training time (`MetricPointsCallback(train_time=TrainTime(max_seconds=B))`) cools down the same
way over the last share of that budget (`TrainTimeCooldownCallback`): F_t is then the training clock's seconds after
step t (`prunetrain.training.training_clock`), the same on every rank (the clock is synchronised at every step) and
restored on resume. Time is measured, not computed: a resumed run continues with the same factor function, not with
bit-identical rates.
"""

from __future__ import annotations

from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback

from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_positive_float

__all__ = ["FlopCooldownCallback", "NOT_LAMBDA_SCHEDULERS", "TrainTimeCooldownCallback", "budget_cooldown",
           "cooldown_factor"]

NOT_LAMBDA_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")  # the transformers schedules that are not a LambdaLR


def cooldown_factor(flops: float, budget: float, share: float) -> float:
    """c(F) = min(1, max(0, (B − F) / (share · B))): 1 until (1 − share)·B FLOPs are spent, then linear to 0 at B.
    Computed as ((B − F) / B) / share, so a product share · B too small for a float never divides by zero."""
    return min(1.0, max(0.0, ((budget - flops) / budget) / share))


@checked
class FlopCooldownCallback(TrainerCallback):
    """Scale the learning rate by `cooldown_factor` of the clock's FLOPs (see the module docstring).

    Args:
        clock: the run's `MetricPointsCallback` with a FLOP budget (`max_flops`); register it *before* this callback,
            so step t's FLOPs are counted when the rate of step t + 1 is set.
        share: the last part of the budget over which the rate decays to zero, 0 < share ≤ 1 (0.2: the last 20 %).
    """

    BUDGET = "max_flops"  # the clock's attribute holding the budget
    WHAT = ("FLOP budget", "FLOP cooldown", "FLOPs")  # the budget, the cooldown and what it spans, in messages

    def __init__(self, clock, share: float):
        budget, (name, _, unit) = getattr(clock, self.BUDGET, None), self.WHAT
        if budget is None:
            raise ValueError(f"clock: the learning-rate cooldown follows a {name}; give the MetricPointsCallback "
                             f"a {self.BUDGET}.")
        check_positive_float("share", share)
        if share > 1:
            raise ValueError(f"share: {share!r} is not allowed; expected the part of the {name} the cooldown "
                             f"spans, 0 < share <= 1.")
        if not float(share) * float(budget) > 0:
            raise ValueError(f"share: {share!r} × the clock's {self.BUDGET} {budget!r} is below the smallest "
                             f"float; the cooldown would span no {unit} — give a larger share or budget.")
        self.clock, self.share = clock, float(share)

    def spent(self) -> tuple[float, float]:
        """(what the run has spent of its budget after the last step, the budget)."""
        return self.clock.flops, self.clock.max_flops

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if not isinstance(lr_scheduler, LambdaLR):
            raise ValueError(f"lr_scheduler: {type(lr_scheduler).__name__} is not allowed with a {self.WHAT[1]}; "
                             f"expected a LambdaLR schedule (every transformers lr_scheduler_type but "
                             f"{' and '.join(NOT_LAMBDA_SCHEDULERS)}), which computes each rate from its base rates.")

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        factor = cooldown_factor(*self.spent(), self.share)
        if factor == 1.0:
            return control
        groups = optimizer.param_groups
        for group, rate in zip(groups, lr_scheduler.get_last_lr()):  # η_s(t + 1), set by the scheduler's step
            group["lr"] = rate * factor
        lr_scheduler._last_lr = [g["lr"] for g in groups]  # reported (and logged by the Trainer) as applied
        return control


@checked
class TrainTimeCooldownCallback(FlopCooldownCallback):
    """The same cooldown over the last share of a training-time budget: c(x) with x the training clock's seconds
    (`MetricPointsCallback(train_time=TrainTime(max_seconds=...))`, registered before this callback)."""

    BUDGET = "max_train_seconds"
    WHAT = ("training-time budget", "training-time cooldown", "time")

    def spent(self) -> tuple[float, float]:
        return self.clock.train_seconds, self.clock.max_train_seconds


def budget_cooldown(clock, share: float) -> FlopCooldownCallback:
    """The cooldown over the last `share` of the clock's budget, FLOPs or training time (whichever it has)."""
    if getattr(clock, "max_train_seconds", None) is not None:
        return TrainTimeCooldownCallback(clock, share)
    return FlopCooldownCallback(clock, share)
