"""The training clock: the seconds a user pays to train a model, not the seconds a study spends measuring it.

A run defined by a training-time budget (`MetricPointsCallback(train_time=TrainTime(max_seconds=...))`) is compared
with another at equal wall-clock; that is only fair when both clocks count the same things, whatever each run
measures on the side. The clock is driven by the `MetricPointsCallback` (registered first) and its `clock_end`
(registered last).

What the clock counts. From the first `on_step_begin` of a training session on, the clock runs through everything
the training loop does: the optimizer steps (forward, backward, optimizer, the Trainer's logging), the pruning
method's own work in the callbacks (importance at pruning points, masks, shrinks with their optimizer slicing,
Hard-Concrete gates) and data loading (fetching and collating the next batch, a new epoch's iterator).

What it does not count:
- measurements: work done inside `measuring()`. The scheduled callbacks bracket each point they act at that is a
  measurement (`ScheduledCallback.is_measurement`): test metrics (`MetricPointsCallback`), pruning-curve sweeps
  (`PruningCurveCallback`), importance points that prune and shrink nothing (`HeadPruningCallback`). Any other code
  can bracket its own measurement the same way;
- the Trainer's checkpoint writes and its own evaluation: each from the end of the callbacks' hook that precedes it
  (step end, epoch end, log) to the end of the `on_save` / `on_evaluate` hook (the callbacks' state files included).
  The end of every hook is seen by `TrainingClockEnd`, which must be the *last* callback registered (a budget or
  time point refuses to run without it);
- what lies before the first step of a session (model and dataloader set-up, a resumed run's batch skipping) and
  after its last step's end (the final save, the end of training).

Each excluded interval is measured with `time.perf_counter` and subtracted once (a measurement inside a checkpoint
window is not subtracted twice). The clock's value `seconds` is settled at the end of every optimizer step: the
counted time up to then. Work the other callbacks do after that step (a pruning step) is counted with the next step.

Resume: a checkpoint keeps the value at the start of its write window (the step's pruning work included); the
resumed session counts on from its first step (the one batch fetched before it is not counted).

Distributed (DDP, FSDP): each rank keeps its own clock; with `sync`, every settle replaces it on all ranks by the
minimum over ranks of the time counted since the previous settle. A rank that waits in a collective for another
rank's measurement or checkpoint write counts the wait as training; the rank that did that work excluded it; the
minimum keeps the latter. Every rank then holds the same value, so a budget stops them at the same step, time points
fire at the same step and a cooldown gives them the same learning rate. Without a budget or time point the clock is
informational (recorded with every metric point) and costs no collective.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from prunetrain.training.distributed import world_size
from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_positive_float

__all__ = ["TrainTime", "TrainingClock", "TrainingClockEnd", "measured_seconds", "measuring", "min_over_ranks"]


@checked(own=("max_seconds", "at_seconds"))
@dataclass(frozen=True)
class TrainTime:
    """A training-time budget and points, in seconds of the training clock (`MetricPointsCallback(train_time=...)`).

    Args:
        max_seconds: stop training after the step at which the clock reaches this many seconds (None: no budget).
        at_seconds: evaluate at the first step at which the clock reaches each of these (increasing).
    """

    max_seconds: float | None = None
    at_seconds: Sequence[float] = ()

    def __post_init__(self):
        if self.max_seconds is not None:
            object.__setattr__(self, "max_seconds", check_positive_float("train_time.max_seconds", self.max_seconds))
        if isinstance(self.at_seconds, (str, bytes)):
            raise ValueError(f"train_time.at_seconds: {self.at_seconds!r} is not a list of training seconds.")
        points = [check_positive_float("train_time.at_seconds", value) for value in self.at_seconds]
        for earlier, later in zip(points, points[1:]):
            if later <= earlier:
                raise ValueError(f"train_time.at_seconds: {list(self.at_seconds)!r} is out of order; give increasing "
                                 f"training seconds, each once.")
        object.__setattr__(self, "at_seconds", tuple(points))

    @property
    def active(self) -> bool:
        """Whether anything depends on the clock (then it is synchronised over ranks at every step)."""
        return self.max_seconds is not None or bool(self.at_seconds)


class _Tally:
    """Seconds spent inside `measuring()` in this process (nested brackets counted once)."""

    def __init__(self):
        self.seconds, self.depth, self.since = 0.0, 0, 0.0

    def total(self, now: float) -> float:
        return self.seconds + (now - self.since if self.depth else 0.0)


_TALLY = _Tally()


@contextlib.contextmanager
def measuring(active: bool = True):
    """Bracket a measurement: its wall time is excluded from every training clock of this process. With
    `active=False` a no-op (so callers can decide per call)."""
    if not active:
        yield
        return
    if _TALLY.depth == 0:
        _TALLY.since = time.perf_counter()
    _TALLY.depth += 1
    try:
        yield
    finally:
        _TALLY.depth -= 1
        if _TALLY.depth == 0:
            _TALLY.seconds += time.perf_counter() - _TALLY.since


def measured_seconds() -> float:
    """All seconds this process has spent inside `measuring()` so far."""
    return _TALLY.total(time.perf_counter())


def min_over_ranks(value: float) -> float:
    """The minimum of `value` over the ranks (a collective: every rank calls it); `value` itself in one process."""
    if world_size() == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return float(tensor.item())


class TrainingClock:
    """The clock of the module docstring. Driven by the first callback of the run (`start` at `on_step_begin`,
    `settle` at `on_step_end`: `MetricPointsCallback` does both) and by `TrainingClockEnd`, registered last.

    Attributes:
        seconds: training seconds up to the end of the last optimizer step (the value budgets and points use).
        measured_seconds: seconds excluded as measurements while the clock ran.
        trainer_io_seconds: seconds excluded as the Trainer's checkpoint writes and evaluations.
        settled_at: `time.perf_counter()` at the last settle: between two settles, `seconds` grows by the wall time
            less what `measured_seconds` and `trainer_io_seconds` grew by.
        end_registered: whether a `TrainingClockEnd` serves this clock (without it the Trainer's checkpoint writes
            and evaluations are counted).
    """

    def __init__(self):
        self.seconds = 0.0
        self.measured_seconds = 0.0
        self.trainer_io_seconds = 0.0
        self.end_registered = False
        self.settled_at: float | None = None
        self._base = 0.0  # counted up to `_since`
        self._since: float | None = None  # when counting last (re)started; None before the session's first step
        self._tally_at = 0.0  # the measurement tally at `_since`
        self._hook_end: tuple[float, float] | None = None  # (time, tally) at the end of the last hook

    def _counted(self, now: float, tally: float) -> float:
        if self._since is None:
            return self._base
        return self._base + (now - self._since) - (tally - self._tally_at)

    def _restart(self, base: float, now: float, tally: float) -> None:
        self._base, self._since, self._tally_at = base, now, tally

    def start(self) -> None:
        """At a step's begin: the clock runs from the session's first step on."""
        if self._since is None:
            now = time.perf_counter()
            self._restart(self._base, now, _TALLY.total(now))

    def settle(self, sync: bool = False) -> float:
        """At a step's end: `seconds` becomes the time counted so far (the minimum over ranks since the previous
        settle with `sync`, a collective)."""
        if self._since is None:
            return self.seconds
        now = time.perf_counter()
        tally = _TALLY.total(now)
        self.measured_seconds += tally - self._tally_at
        counted = self._counted(now, tally)
        if sync:  # every rank held the same `seconds` after the previous settle (or the checkpoint it resumed from)
            counted = self.seconds + min_over_ranks(counted - self.seconds)
        self._restart(counted, now, tally)
        self.seconds, self.settled_at = counted, now
        return counted

    def hook_ended(self) -> None:
        """`TrainingClockEnd`: every callback has run the hook (the start of a possible checkpoint window)."""
        now = time.perf_counter()
        self._hook_end = (now, _TALLY.total(now))

    def exclude_since_hook_end(self) -> None:
        """`TrainingClockEnd` at the end of `on_save` / `on_evaluate`: the time since the preceding hook ended is not
        training (its measurements, already tallied, are not subtracted twice)."""
        if self._since is None or self._hook_end is None:
            return
        now = time.perf_counter()
        tally = _TALLY.total(now)
        start, tally_start = self._hook_end
        if start < self._since:  # no hook ended since counting restarted: the window starts there
            start, tally_start = self._since, self._tally_at
        self.trainer_io_seconds += (now - start) - (tally - tally_start)
        self.measured_seconds += tally - self._tally_at
        self._restart(self._counted(start, tally_start), now, tally)

    def checkpoint_value(self) -> float:
        """The value a checkpoint written now keeps: the time counted up to the start of its write window."""
        if self._hook_end is None:
            return self._counted(time.perf_counter(), measured_seconds())
        return max(self.seconds, self._counted(*self._hook_end))

    def state_dict(self) -> dict:
        return {"seconds": self.checkpoint_value(), "measured_seconds": self.measured_seconds,
                "trainer_io_seconds": self.trainer_io_seconds, "end_registered": self.end_registered}

    def load_state_dict(self, state: dict) -> None:
        self.seconds = self._base = float(state.get("seconds", 0.0))
        self.measured_seconds = float(state.get("measured_seconds", 0.0))
        self.trainer_io_seconds = float(state.get("trainer_io_seconds", 0.0))
        self._since, self._hook_end = None, None


class TrainingClockEnd(TrainerCallback):
    """The end of every hook for a `TrainingClock`: register it as the *last* callback of the Trainer (after the
    pruning callbacks, the cooldown and the time cap), so that its hooks run when every other callback is done."""

    def __init__(self, clock: TrainingClock):
        self.clock = clock

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.end_registered = True

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.hook_ended()

    def on_substep_end(self, args, state, control, **kwargs):
        self.clock.hook_ended()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.clock.hook_ended()

    def on_log(self, args, state, control, **kwargs):
        self.clock.hook_ended()

    def on_evaluate(self, args, state, control, **kwargs):
        self.clock.exclude_since_hook_end()
        self.clock.hook_ended()

    def on_save(self, args, state, control, **kwargs):
        self.clock.exclude_since_hook_end()
        self.clock.hook_ended()
