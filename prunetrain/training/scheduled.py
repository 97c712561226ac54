"""`ScheduledCallback`: the part of the importance and curve callbacks that decides *when* they act.

Points given as epochs (fractional allowed) or global steps are planned on steps when training starts
(`prunetrain.training.points`) and fired at the end of that optimizer step. A run that stops part-way through an
epoch (time cap, or `max_steps` mid-epoch) still gets `on_epoch_end` from the Trainer: that is recorded as an "end"
point at the exact step and fractional epoch, never as the whole epoch it did not finish. Points the run cannot reach
are listed when training starts and again at the end (`schedule_<name>.json`), never moved and never dropped silently.
Every record is keyed by its global step, so no point can overwrite another's. A point that only measures
(`is_measurement`) is bracketed by `measuring()`, so the training clock leaves its time out
(`prunetrain.training.training_clock`).
"""

from __future__ import annotations

import math

from prunetrain.training.base import PrunetrainCallback
from prunetrain.training.points import Plan, Point, describe, is_whole_epoch, label
from prunetrain.training.training_clock import measuring


class ScheduledCallback(PrunetrainCallback):
    """Base of the callbacks that act at planned points (see the module docstring).

    Subclasses set `self.plan` (a `Plan`) and implement `act(point, kind, state, **kwargs)`; `kind` is
    "scheduled" or "end". `self.done` maps each acted step to `{"step", "epoch", "label", "kind"}`.
    """

    record_end = True

    def _init_points(self, plan: Plan, record_end: bool = True) -> None:
        self.plan = plan
        self.record_end = record_end
        self.done: dict[int, dict] = {}
        self._last_step: int | None = None

    # the plan -------------------------------------------------------------------------------------------------------
    def _start_plan(self, args, state, train_dataloader) -> None:
        unreachable = self.plan.start(args, state, train_dataloader)
        if unreachable:
            self._log(f"{self.name}: {len(unreachable)} point(s) will not be reached, training ends at step "
                      f"{self.plan.max_steps}: {describe(unreachable)}")
        self._write_json(f"schedule_{self.name}.json", self.plan_record())

    def expect_end(self, step: int) -> None:
        """Called by a time cap with the step it expects training to end at (from the measured step rate)."""
        expected = self.plan.expect_end(step)
        if expected:
            self._log(f"{self.name}: at the measured step rate the time cap will stop training near step {step}; "
                      f"{len(expected)} point(s) are expected out of reach: {describe(expected)}")
        self._write_json(f"schedule_{self.name}.json", self.plan_record())

    def plan_record(self) -> dict:
        out = self.plan.to_dict(self.done, self._last_step)
        out["done"] = [self.done[s] for s in sorted(self.done)]
        return out

    # firing ---------------------------------------------------------------------------------------------------------
    def _fire(self, point: Point, kind: str, state, **kwargs) -> None:
        epoch = float(state.epoch or 0)
        self.done[point.step] = {"step": point.step, "epoch": epoch, "label": label(point.step, epoch), "kind": kind,
                                 "given": point.spec}
        with measuring(self.is_measurement(point, kind)):
            self.act(point, kind, state, **kwargs)
            self._write_json(f"schedule_{self.name}.json", self.plan_record())
            self._flush()

    def act(self, point: Point, kind: str, state, **kwargs) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_measurement(self, point: Point, kind: str) -> bool:
        """Whether acting at `point` only measures the model (left out of the training clock) rather than doing
        the training method's work (counted). Subclasses that measure override it."""
        return False

    def on_step_end(self, args, state, control, **kwargs):
        point = self.plan.due(state)
        if point is not None and point.step not in self.done:
            self._fire(point, "scheduled", state, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        if is_whole_epoch(state):
            point = self.plan.selected_at_epoch_end(state)
            if point is not None and point.step not in self.done:
                self._fire(point, "scheduled", state, **kwargs)
            return
        if not self.record_end or state.global_step in self.done:
            return
        epoch = float(state.epoch or 0)
        self._log(f"{self.name}: training stopped part-way through epoch {math.ceil(epoch)}; recording the end point "
                  f"{label(state.global_step, epoch)} (not a whole epoch)")
        self._fire(Point(("end", epoch), int(state.global_step), epoch), "end", state, **kwargs)

    def _finish_plan(self, state) -> None:
        self._last_step = int(state.global_step)
        unreached = self.plan.unreached(self.done, self._last_step)
        if unreached:
            self._log(f"{self.name}: {len(unreached)} planned point(s) were not reached (training ended at "
                      f"{label(self._last_step, float(state.epoch or 0))}): {describe(unreached)}")
        self._write_json(f"schedule_{self.name}.json", self.plan_record())

    # checkpoint state -----------------------------------------------------------------------------------------------
    def points_state(self) -> dict:
        return {"done": {str(k): v for k, v in self.done.items()}}

    def load_points_state(self, state: dict) -> None:
        self.done = {int(k): v for k, v in state.get("done", {}).items()}


__all__ = ["ScheduledCallback"]
