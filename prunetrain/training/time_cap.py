"""`TimeCapCallback`: a wall-clock guard on a run that is defined by its number of steps.

A run's length is its step count (`max_steps`, or epochs × steps per epoch): two machines give the same model. The
cap only guards against a run that would take far too long; when it fires, the run is shorter than defined and depends
on the machine, and that is said (log line, `fired`, `stopped_at_step`). After `measure_steps` steps it estimates from
the measured step rate where the cap will stop training and tells the scheduled callbacks (`expect_end`), so the
points that will not be reached are listed while training runs, not discovered at the end. A run defined by a FLOP
budget (`budget=` the clock) ends where the budget runs out: the cap is compared with that expected end, and the
start-up line names the budget when it, not the cap, will end the run.
"""

from __future__ import annotations

import logging
import math
import time

from transformers import TrainerCallback

from prunetrain.training.distributed import any_rank
from prunetrain.training.points import label
from prunetrain.utils.validate import check_int, check_positive_float

logger = logging.getLogger("prunetrain")


class TimeCapCallback(TrainerCallback):
    """Stop training gracefully once `max_minutes` have passed (checked after every step).

    Args:
        max_minutes: the cap in minutes; 0 means no cap.
        watch: callbacks with an `expect_end(step)` method (the scheduled prunetrain callbacks), told the step the
            cap is expected to stop training at once the step rate is measured.
        measure_steps: steps to measure the rate over (counted from the first step of this session; the time of the
            callbacks' own work at points is included, as it is in the real run).
        budget: the run's clock when a FLOP budget ends the run (an object with `flops` and `max_flops`, e.g. a
            `MetricPointsCallback(max_flops=...)` registered before this callback): the expected end is then where
            the budget runs out at the FLOPs per step measured so far, and the cap is compared with that, not with
            the planned steps.
    """

    def __init__(self, max_minutes: float, watch=(), measure_steps: int = 20, budget=None):
        self.max_minutes = check_positive_float("max_minutes", max_minutes, allow_zero=True)
        self.watch = list(watch)
        self.measure_steps = check_int("measure_steps", measure_steps)
        self.start: float | None = None
        self.start_step = 0
        self.fired = False
        self.stopped_at: float | None = None  # epoch (kept for existing readers)
        self.stopped_at_step: int | None = None
        self.planned_steps: int | None = None
        self.expected_end_step: int | None = None
        self.steps_per_second: float | None = None
        self.last_step: int | None = None  # where training ended (set at train end)
        self.last_epoch: float | None = None
        self.budget = budget
        self.budget_end_step: int | None = None  # where the FLOP budget is expected to end the run
        self._start_flops = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.start_step = time.time(), int(state.global_step)
        self.planned_steps = int(state.max_steps) if state.max_steps else None
        self._start_flops = self.budget.flops if self.budget is not None else 0

    def _expected_budget_end(self, step: int, done: int) -> int | None:
        """The step at which the FLOP budget runs out at the FLOPs per step of this session so far. Usually an
        early estimate: pruning only makes later steps cheaper, and the Trainer's length-grouped sampler starts with
        its longest batches (the main recipe's full model: near step 1388 after 20 steps, where its budget ends at
        1800), so the run goes further."""
        if self.budget is None or not self.budget.max_flops:
            return None
        per_step = (self.budget.flops - self._start_flops) / done
        if per_step <= 0:
            return None
        return step + max(0, math.ceil((self.budget.max_flops - self.budget.flops) / per_step))

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_minutes <= 0:
            return control
        elapsed = time.time() - self.start
        done = int(state.global_step) - self.start_step
        if self.expected_end_step is None and done >= self.measure_steps and elapsed > 0:
            self.steps_per_second = done / elapsed
            remaining = max(0.0, 60 * self.max_minutes - elapsed)
            expected = int(state.global_step + self.steps_per_second * remaining)
            self.budget_end_step = self._expected_budget_end(int(state.global_step), done)
            ends = [s for s in (self.planned_steps, self.budget_end_step) if s]
            self.expected_end_step = min([expected, *ends])
            self._announce(expected, ends)
        if any_rank(elapsed > 60 * self.max_minutes):  # every rank stops at the same step (DDP, FSDP)
            control.should_training_stop = True
            self.fired = True
            self.stopped_at, self.stopped_at_step = float(state.epoch or 0), int(state.global_step)
            logger.warning("prunetrain: the time cap of %.1f min fired at %s, before the planned step %s: this run "
                           "is shorter than its definition and depends on the machine", self.max_minutes,
                           label(self.stopped_at_step, self.stopped_at), self.planned_steps)
        return control

    def _announce(self, expected: int, ends: list[int]) -> None:
        """One line on what ends the run: the cap (then the watched callbacks learn the step) or the FLOP budget."""
        if ends and expected < min(ends):
            by_budget = (f"; the FLOP budget would end it near step {self.budget_end_step}"
                         if self.budget_end_step else "")
            logger.warning("prunetrain: time cap %.1f min: at %.2f steps/s training is expected to stop near step %d "
                           "of the %d planned%s", self.max_minutes, self.steps_per_second, self.expected_end_step,
                           self.planned_steps or self.budget_end_step, by_budget)
            for callback in self.watch:
                callback.expect_end(self.expected_end_step)
        elif self.budget_end_step and (not self.planned_steps or self.budget_end_step < self.planned_steps):
            logger.warning("prunetrain: the FLOP budget of %.4g training FLOPs is expected to end the run near step "
                           "%d (at the FLOPs per step of the first %d steps: a lower bound when a length-grouped "
                           "sampler starts with its longest batches, as the Trainer's does, or pruning makes later "
                           "steps cheaper); the time cap of %.1f min would come later (near step %d at %.2f steps/s)",
                           self.budget.max_flops, self.budget_end_step, self.measure_steps, self.max_minutes,
                           expected, self.steps_per_second)

    def on_train_end(self, args, state, control, **kwargs):
        self.last_step, self.last_epoch = int(state.global_step), float(state.epoch or 0)

    def to_dict(self) -> dict:
        return {"max_minutes": self.max_minutes, "fired": self.fired, "stopped_at_step": self.stopped_at_step,
                "stopped_at_epoch": self.stopped_at, "planned_steps": self.planned_steps,
                "expected_end_step": self.expected_end_step, "budget_end_step": self.budget_end_step,
                "measured_steps_per_second": self.steps_per_second,
                "last_step": self.last_step, "last_epoch": self.last_epoch}


__all__ = ["TimeCapCallback"]
