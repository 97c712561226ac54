"""`MetricPointsCallback`: a metric of the model as it is (e.g. test BLEU) at chosen points of training, each
stamped with the training time spent to reach it, and the step rate of every stretch of training between two changes
of the model's size.

Why a clock of its own: comparing a run that prunes during training with one that does not is only fair at equal
*training* time, and wall time also counts the evaluations, importance passes and checkpoints the two runs do
differently. `step_seconds` sums, over optimizer steps, the time from the Trainer's `on_step_begin` to its
`on_step_end` (forward, backward and optimizer step; data collation, callbacks, evaluation and checkpoint writes are
outside it). Register this callback *before* the other prunetrain callbacks so its `on_step_end` runs first.

Each stretch of training with a constant number of parameters (a mid-training shrink starts a new one) is recorded
with its steps, seconds and steps per second, so the speed-up of every shrink is read off directly.

Compute that does not drift: the clock also counts the matmul FLOPs of every training step (forward + backward) from
the real shape of each batch and the model as it was at that step (`prunetrain.training.compute`). Every record and
every stretch carries them; `at_flops` evaluates when the cumulative count first reaches given values (so runs are
compared at equal compute without interpolation), and `max_flops` stops training once a budget is spent — a run
defined by its compute, identical on every machine.

Time that users pay for: the training clock (`prunetrain.training.training_clock`) counts the optimizer steps, the
pruning method's own work and data loading, never the measurements (this callback's metric points, pruning-curve
sweeps, importance points that prune nothing) nor checkpoint writes. `train_time=TrainTime(at_seconds=...)`
evaluates where it first reaches given values and `TrainTime(max_seconds=...)` stops training once a budget is spent:
runs compared at equal training time. A run has one budget: FLOPs or training time. With `train_time`, register
`clock_end` as the last callback of the Trainer (it closes every hook, so checkpoint writes are left out).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from prunetrain.engine.heads import find_heads, unwrap_model
from prunetrain.training.base import combined_attached
from prunetrain.training.compute import TrainingFlopMeter
from prunetrain.training.points import Plan, Point, check_step_points, epoch_spec, label
from prunetrain.training.scheduled import ScheduledCallback
from prunetrain.training.state import RngState
from prunetrain.training.training_clock import TrainingClock, TrainingClockEnd, TrainTime
from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_positive_float


@checked(own=("train_time", "output_dir"))
class MetricPointsCallback(ScheduledCallback):
    """`metric(model)` at chosen points, with step time, wall time, heads and parameters at each.

    Args:
        metric: a callable `model -> float | dict` (e.g. `prunetrain.mt.evaluation.metrics.bleu_metric(...)`), called with the
            model in eval mode; its train/eval mode and the RNG state are restored afterwards, so training goes on
            exactly as without this callback.
        at_steps: global optimizer steps (increasing).
        at_epochs: epoch points (fractional allowed), as for the other scheduled callbacks.
        metric_key: the entry logged to TensorBoard when the metric returns a dict (default "value").
        record_end: also evaluate at the last step when it is not a planned point.
        at_flops: more points, as cumulative training FLOPs (increasing): each fires at the first step whose
            cumulative count reaches it.
        max_flops: stop training after the step at which the cumulative training FLOPs reach this budget (None: no
            budget). The run overshoots by less than one step's FLOPs; the exact count is recorded.
        train_time: a training-time budget and points (`TrainTime(max_seconds=..., at_seconds=[...])`, in seconds of
            the training clock; see the module docstring); its budget and `max_flops` exclude each other. Needs
            `clock_end` registered as the Trainer's last callback.
        output_dir, tensorboard: see `PrunetrainCallback`.

    Attributes:
        log_key: the entry the log line at each point shows (`metric_key` unless set; another entry of the metric's
            dict, e.g. a validation score in a study whose test scores must not be seen; an entry the metric did not
            return: the line names the point without a score).
    """

    name = "metric-points"

    def __init__(self, metric: Callable, *, at_steps: Iterable[int] = (), at_epochs=(), metric_key: str = "value",
                 record_end: bool = True, at_flops: Iterable[float] = (), max_flops: float | None = None,
                 train_time: TrainTime | None = None, output_dir: str | None = None, tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        if not callable(metric):
            raise ValueError(f"metric: {metric!r} is not a callable model -> float | dict.")
        selector, epochs = epoch_spec(list(at_epochs), "at_epochs")
        self._init_points(Plan(epochs, check_step_points("at_steps", list(at_steps)), selector), record_end)
        self.at_flops = _check_flop_points(list(at_flops))
        self.max_flops = None if max_flops is None else check_positive_float("max_flops", max_flops)
        self.train_time = _check_train_time(train_time, self.max_flops)
        self.clock = TrainingClock()
        self.clock_end = TrainingClockEnd(self.clock)  # the Trainer's last callback
        self._time_points_done: set[float] = set()
        self.budget_reached_at_step: int | None = None
        self.meter = TrainingFlopMeter()
        self._flop_points_done: set[float] = set()
        self.metric, self.metric_key = metric, metric_key
        self.log_key = metric_key
        self.records: list[dict] = []
        self.segments: list[dict] = []  # stretches of constant size: {from_step, to_step, steps, seconds, parameters}
        self.step_seconds = 0.0
        self._step_started: float | None = None
        self._train_started: float | None = None
        self._wall_before = 0.0  # wall seconds of earlier sessions (resume)

    # the clock ------------------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._setup(args, state, model)
        self._restore(args, state)
        if model is not None:
            self.meter.attach(unwrap_model(model))
        self._train_started = time.time()
        self._start_plan(args, state, train_dataloader)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.train_time.active and not self.clock.end_registered:
            raise ValueError("train_time: the training clock needs its end callback; register this "
                             "MetricPointsCallback's clock_end as the Trainer's last callback, so checkpoint writes "
                             "are left out of the training time.")
        self.clock.start()
        if self._step_started is None:
            self._step_started = time.perf_counter()
        self.meter.open()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = int(state.global_step)
        if self._step_started is not None:
            seconds = time.perf_counter() - self._step_started
            self._step_started = None
            self.step_seconds += seconds
            flops = self.meter.close(unwrap_model(model), step) if model is not None else None
            self._refuse_uncounted_budget()
            self._count_step(step, seconds, flops, model)
        self.clock.settle(sync=self.train_time.active)  # every rank the same value: points and budget agree
        self._fire_value_points(state, "flops", self.at_flops, self._flop_points_done, self.flops,
                                model=model, **kwargs)
        self._fire_value_points(state, "train_seconds", self.at_train_seconds, self._time_points_done,
                                self.train_seconds, model=model, **kwargs)
        super().on_step_end(args, state, control, model=model, **kwargs)
        self._check_budget(state, control)
        return control

    def _refuse_uncounted_budget(self) -> None:
        """A FLOP budget or FLOP points need the count: without it the budget would never end the run, which would
        run on to its step or time limit, a run of another length than asked."""
        if not self.meter.counted and (self.max_flops is not None or self.at_flops):
            given = "max_flops" if self.max_flops is not None else "at_flops"
            raise ValueError(f"{given}: the training FLOPs cannot be counted ({self.meter.failure}), so the FLOP "
                             f"budget and FLOP points cannot be kept; give a step or time budget instead.")

    def _check_budget(self, state, control) -> None:
        """Stop training after the step that spends the budget (FLOPs or training seconds), with one log line."""
        spent = {"training FLOPs": (self.flops, self.max_flops),
                 "training seconds": (self.train_seconds, self.max_train_seconds)}
        for unit, (used, budget) in spent.items():
            if budget is not None and self.budget_reached_at_step is None and used >= budget:
                step = int(state.global_step)
                self.budget_reached_at_step = step
                control.should_training_stop = True
                self._log(f"{label(step, float(state.epoch or 0))}: the budget of {budget:.4g} {unit} is spent "
                          f"({used:.4g}); training stops")

    @property
    def train_seconds(self) -> float:
        """Training-clock seconds up to the end of the last optimizer step (`prunetrain.training.training_clock`)."""
        return self.clock.seconds

    @property
    def max_train_seconds(self) -> float | None:
        return self.train_time.max_seconds

    @property
    def at_train_seconds(self) -> tuple[float, ...]:
        return self.train_time.at_seconds

    def is_measurement(self, point: Point, kind: str) -> bool:
        return True  # a metric point is never training

    @property
    def flops(self) -> int:
        """Matmul FLOPs of all training steps so far (forward + backward)."""
        return self.meter.total

    def _fire_value_points(self, state, unit: str, values, done: set, current: float, **kwargs) -> None:
        """Points given as cumulative FLOPs or training seconds: fire once at the first step that reaches them (two
        reached by the same step: one evaluation, recorded for the later one)."""
        due = [value for value in values if value <= current and value not in done]
        if due and int(state.global_step) not in self.done:
            step, epoch = int(state.global_step), float(state.epoch or 0)
            self._fire(Point((unit, due[-1]), step, epoch), unit, state, **kwargs)
        done.update(due)

    def _count_step(self, step: int, seconds: float, flops: int | None, model) -> None:
        size = sum(p.numel() for p in unwrap_model(model).parameters()) if model is not None else None
        last = self.segments[-1] if self.segments else None
        if last is None or last["parameters"] != size:
            heads = find_heads(unwrap_model(model)).total_heads if model is not None else None
            last = {"from_step": step, "to_step": step, "steps": 0, "seconds": 0.0, "flops": 0, "parameters": size,
                    "heads": heads}
            self.segments.append(last)
        last["to_step"] = step
        last["steps"] += 1
        last["seconds"] += seconds
        last["flops"] = None if flops is None or last.get("flops") is None else last["flops"] + flops
        last["steps_per_second"] = last["steps"] / last["seconds"] if last["seconds"] > 0 else None

    def wall_seconds(self) -> float:
        return self._wall_before + (time.time() - self._train_started if self._train_started else 0.0)

    # the points -----------------------------------------------------------------------------------------------------
    def act(self, point: Point, kind: str, state, model=None, **kwargs):
        net = unwrap_model(model)
        was_training = net.training
        rng = RngState.capture()
        started = time.time()
        try:
            net.eval()
            value = self.metric(net)
        finally:
            net.train(was_training)
            rng.restore()
        result = value if isinstance(value, dict) else {self.metric_key: float(value)}
        step, epoch = int(state.global_step), float(state.epoch or 0)
        record = {"step": step, "epoch": epoch, "label": label(step, epoch), "kind": kind, "given": point.spec,
                  "flops_target": point.given[1] if point.given[0] == "flops" else None,
                  "train_seconds_target": point.given[1] if point.given[0] == "train_seconds" else None,
                  "step_seconds": self.step_seconds, "train_seconds": self.train_seconds,
                  "wall_seconds": self.wall_seconds(),
                  "flops": self.flops if self.meter.counted else None,
                  "metric_seconds": time.time() - started, "heads": heads_alive(net),
                  "parameters": sum(p.numel() for p in net.parameters()),
                  **{k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) or v is None}}
        self.records.append(record)
        self._write_json("metric_points.json", self.state_dict())
        if isinstance(record.get(self.metric_key), (int, float)):
            self._tb_scalar(f"prunetrain/{self.metric_key}", record[self.metric_key], step)
            self._tb_scalar(f"prunetrain/{self.metric_key}_vs_step_seconds", record[self.metric_key],
                            int(round(self.step_seconds)))
            if record["flops"] is not None:
                self._tb_scalar(f"prunetrain/{self.metric_key}_vs_training_tflops", record[self.metric_key],
                                int(round(record["flops"] / 1e12)))
        shown = record.get(self.log_key)
        score = f"{self.log_key} {shown:.2f}" if isinstance(shown, (int, float)) else "metric point"
        self._log(f"{label(step, epoch)}: {score} after {self.step_seconds / 60:.1f} min of training steps "
                  f"({record['heads']} heads)")

    def on_train_end(self, args, state, control, **kwargs):
        self.meter.detach()
        self._finish_plan(state)
        self._write_json("metric_points.json", self.state_dict())
        super().on_train_end(args, state, control, **kwargs)

    # checkpoint state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"records": self.records, "segments": self.segments, "step_seconds": self.step_seconds,
                "wall_seconds": self.wall_seconds(), "flops": self.meter.state_dict(), "max_flops": self.max_flops,
                "budget_reached_at_step": self.budget_reached_at_step, "max_train_seconds": self.max_train_seconds,
                "train_clock": self.clock.state_dict(), **self.points_state()}

    def load_state_dict(self, state: dict) -> None:
        self.records = list(state.get("records", []))
        self.segments = list(state.get("segments", []))
        self.step_seconds = float(state.get("step_seconds", 0.0))
        self._wall_before = float(state.get("wall_seconds", 0.0))
        self.meter.load_state_dict(state.get("flops") or {})
        self.budget_reached_at_step = state.get("budget_reached_at_step")
        self._flop_points_done = {value for value in self.at_flops if value <= self.flops}
        self.clock.load_state_dict(state.get("train_clock") or {})
        self._time_points_done = {value for value in self.at_train_seconds if value <= self.train_seconds}
        self.load_points_state(state)


def _check_flop_points(values: list) -> list[float]:
    """FLOP points: finite numbers > 0, strictly increasing."""
    for value in values:
        check_positive_float("at_flops", value)
    for earlier, later in zip(values, values[1:]):
        if later <= earlier:
            raise ValueError(f"at_flops: {values!r} is out of order; give increasing FLOP counts, each once.")
    return [float(v) for v in values]


def _check_train_time(train_time, max_flops) -> TrainTime:
    """`train_time` as a `TrainTime`; its budget and a FLOP budget exclude each other."""
    if train_time is None:
        return TrainTime()
    if not isinstance(train_time, TrainTime):
        raise ValueError(f"train_time: {train_time!r} is not a TrainTime(max_seconds=..., at_seconds=[...]).")
    if train_time.max_seconds is not None and max_flops is not None:
        raise ValueError(f"train_time: a budget of {train_time.max_seconds:g} training seconds and max_flops="
                         f"{max_flops:.4g} were both given; a run has one budget, FLOPs or training time.")
    return train_time


def heads_alive(model) -> int:
    """Heads the model computes with: present and not zeroed by an attached mask."""
    mask = combined_attached(model)
    return find_heads(model).total_heads if mask is None else int(mask.num_kept)


__all__ = ["MetricPointsCallback", "heads_alive"]
