"""When a callback acts: schedule points given as (fractional) epochs or global steps, resolved to global optimizer
steps when training starts, and labelled exactly by the global step AND the fractional epoch reached there.

A point "epoch e" falls on global step `round(e × steps_per_epoch)` (the Trainer's own epoch counter is
`global_step / steps_per_epoch` with one optimizer step per batch): epoch 1 is the end of the first epoch, epoch 1.5
the middle of the second. A point "step s" falls on global step s. Points are planned when training starts, from
`state.max_steps`; a point beyond the run's last step cannot be reached: it is listed up front and at the end, never
moved onto another step and never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from prunetrain.utils.validate import check_amount, check_amount_convention


@dataclass(frozen=True)
class Point:
    """One planned point.

    Args:
        given: how the user gave it: ("epoch", 1.5) or ("step", 300).
        step: the global optimizer step it falls on.
        epoch: the exact fractional epoch at that step (`step / steps_per_epoch`).
    """

    given: tuple[str, float]
    step: int
    epoch: float

    @property
    def spec(self) -> str:
        unit, value = self.given
        return f"{unit} {value:g}"

    def to_dict(self) -> dict:
        return {"given": self.spec, "step": self.step, "epoch": self.epoch}


def label(step: int, epoch: float) -> str:
    """"step 1713 (epoch 3.63)": the exact label of every record."""
    return f"step {step} (epoch {epoch:.2f})"


def file_label(step: int, epoch: float) -> str:
    """"step1713_epoch3.63": the label inside file names (unique by the step)."""
    return f"step{step}_epoch{epoch:.2f}"


def check_epoch_points(argument: str, values: Iterable) -> list[float]:
    """Epoch points: numbers > 0 (ints are whole epochs, floats may be fractional), strictly increasing."""
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{argument}: {value!r} is not valid; epoch points are numbers > 0 (1 is the end of the "
                             f"first epoch, 1.5 the middle of the second).")
        out.append(float(value))
    _check_increasing(argument, out)
    return out


def check_step_points(argument: str, values: Iterable) -> list[int]:
    """Step points: global optimizer steps (ints >= 1), strictly increasing."""
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{argument}: {value!r} is not valid; step points are global optimizer steps "
                             f"(integers >= 1).")
        out.append(value)
    _check_increasing(argument, out)
    return out


def _check_increasing(argument: str, values: list) -> None:
    for earlier, later in zip(values, values[1:]):
        if later <= earlier:
            raise ValueError(f"{argument}: {values!r} is out of order; give the points in increasing order, each "
                             f"once ({later!r} comes after {earlier!r}).")


def check_amount_schedule(argument: str, schedule: Mapping, unit: str) -> dict:
    """A pruning schedule {point: cumulative amount}: points as `check_epoch_points` / `check_step_points` (in
    increasing order as written), amounts valid and not decreasing (pruned heads do not come back)."""
    if not isinstance(schedule, Mapping):
        raise ValueError(f"{argument}: {schedule!r} is not a schedule; give a dict {{{unit}: amount}}.")
    keys = list(schedule)
    (check_epoch_points if unit == "epoch" else check_step_points)(f"{argument} ({unit}s)", keys)
    previous = None
    for key in keys:
        amount = schedule[key]
        if isinstance(amount, Mapping):
            from prunetrain.methods.selection import check_kind_amounts

            amount = check_kind_amounts(f"{argument}[{key}]", amount)
        else:
            amount = check_amount(f"{argument}[{key}]", amount)
        if previous is not None and amount_decreases(previous, amount):
            raise ValueError(f"{argument}[{key}]: {amount!r} is less than the {previous!r} pruned before; the "
                             f"schedule gives cumulative amounts, and pruned heads do not come back.")
        previous = amount
    check_amount_convention(f"{argument} {dict(schedule)!r}", schedule.values())  # 1 is a head, 1.0 all of them
    return dict(schedule)


def amount_decreases(earlier, later, total: int | None = None) -> bool:
    """Whether a cumulative amount goes back: same-typed amounts that decrease, or a per-kind amount {kind: amount}
    that decreases (or drops) a kind the earlier one pruned. A fraction and a count are compared as the head counts
    they mean out of `total` heads (rounded half up, as `select_heads`); without `total` they are not comparable."""
    if isinstance(earlier, Mapping) or isinstance(later, Mapping):
        if not (isinstance(earlier, Mapping) and isinstance(later, Mapping)):
            return False
        return any(kind not in later or amount_decreases(value, later[kind]) for kind, value in earlier.items())
    if type(earlier) is not type(later) and total is not None:
        def count(amount):
            return amount if isinstance(amount, int) else int(math.floor(amount * total + 0.5 + 1e-9))
        return count(later) < count(earlier)
    return type(earlier) is type(later) and later < earlier


def steps_per_epoch(args, train_dataloader) -> int | None:
    """Optimizer steps per epoch as the Trainer counts them (None without a sized dataloader)."""
    try:
        batches = len(train_dataloader)
    except TypeError:
        return None
    accumulation = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
    return max(1, batches // accumulation + int(batches % accumulation > 0))


def resolve(epochs: Iterable[float], steps: Iterable[int], per_epoch: int | None) -> list[Point]:
    """The points on global steps, in step order (a step given twice, e.g. as epoch 1 and as its step, once)."""
    points: dict[int, Point] = {}
    for epoch in epochs:
        if per_epoch is None:
            raise ValueError(f"at_epochs: epoch {epoch:g} cannot be placed on a step: the training dataloader has no "
                             f"length; give the points as steps (at_steps).")
        step = max(1, int(math.floor(epoch * per_epoch + 0.5)))
        points.setdefault(step, Point(("epoch", epoch), step, step / per_epoch))
    for step in steps:
        points.setdefault(step, Point(("step", step), step, step / per_epoch if per_epoch else float("nan")))
    return [points[s] for s in sorted(points)]


def describe(points: Iterable[Point]) -> str:
    return ", ".join(f"{p.spec} → {label(p.step, p.epoch)}" if p.given[0] == "epoch" else label(p.step, p.epoch)
                     for p in points)


__all__ = ["Point", "check_amount_schedule", "check_epoch_points", "check_step_points", "describe", "file_label",
           "label", "resolve", "steps_per_epoch"]


def epoch_spec(spec, argument: str):
    """`(selector, epoch points)` from `at_epochs`: a list of epoch points (ints or fractional floats, increasing),
    an int N ("every N epochs") or a function epoch -> bool (both of these act at whole-epoch ends only)."""
    if callable(spec):
        return spec, []
    if isinstance(spec, bool) or (isinstance(spec, int) and spec < 1):
        raise ValueError(f"{argument}: {spec!r} is not valid; give a list of epochs (> 0, e.g. [0.5, 1, 2]), an int "
                         f"N >= 1 for 'every N epochs', or a function epoch -> bool.")
    if isinstance(spec, int):
        return (lambda epoch: epoch % spec == 0), []
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
        raise ValueError(f"{argument}: {spec!r} is not a list of epochs.")
    return None, check_epoch_points(argument, list(spec))


class Plan:
    """The points of one callback: planned on steps when training starts, fired once each, the unreachable ones
    listed (up front from `max_steps`, expected from a time cap's measured step rate, and at the end).

    Args:
        epochs: epoch points (floats, fractional allowed).
        steps: step points (global optimizer steps).
        selector: optional function whole-epoch -> bool, checked at whole-epoch ends.
    """

    def __init__(self, epochs: Iterable[float] = (), steps: Iterable[int] = (), selector=None):
        self.epochs, self.steps, self.selector = list(epochs), list(steps), selector
        self.points: list[Point] = []
        self.per_epoch: int | None = None
        self.max_steps: int | None = None
        self.unreachable: list[Point] = []
        self.expected_unreachable: list[Point] = []
        self.expected_end: int | None = None

    def start(self, args, state, train_dataloader) -> list[Point]:
        """Place the points on steps; returns those beyond the run's last step (`state.max_steps`)."""
        self.per_epoch = steps_per_epoch(args, train_dataloader)
        self.max_steps = int(state.max_steps) if getattr(state, "max_steps", 0) else None
        self.points = resolve(self.epochs, self.steps, self.per_epoch)
        self.unreachable = [p for p in self.points if self.max_steps is not None and p.step > self.max_steps]
        return self.unreachable

    def due(self, state) -> Point | None:
        """The planned point at the current global step, if any."""
        for point in self.points:
            if point.step == state.global_step:
                return point
        return None

    def selected_at_epoch_end(self, state) -> Point | None:
        """A whole-epoch point chosen by the selector (int N or function), at a whole-epoch end."""
        epoch = float(state.epoch or 0)
        whole = round(epoch)
        if self.selector is None or whole < 1 or abs(epoch - whole) > 1e-9 or not self.selector(whole):
            return None
        return Point(("epoch", float(whole)), int(state.global_step), epoch)

    def expect_end(self, step: int) -> list[Point]:
        """A time cap expects training to end near `step`: the planned points after it (returned and kept)."""
        self.expected_end = step
        self.expected_unreachable = [p for p in self.points if p.step > step and p not in self.unreachable]
        return self.expected_unreachable

    def unreached(self, done_steps: Iterable[int], last_step: int) -> list[Point]:
        done = set(done_steps)
        return [p for p in self.points if p.step not in done and p.step > last_step]

    def to_dict(self, done_steps: Iterable[int] = (), last_step: int | None = None) -> dict:
        out = {"steps_per_epoch": self.per_epoch, "max_steps": self.max_steps,
               "planned": [p.to_dict() for p in self.points],
               "unreachable_up_front": [p.to_dict() for p in self.unreachable]}
        if self.expected_end is not None:
            out["time_cap_expected_end_step"] = self.expected_end
            out["time_cap_expected_unreachable"] = [p.to_dict() for p in self.expected_unreachable]
        if last_step is not None:
            out["last_step"] = last_step
            out["unreached"] = [p.to_dict() for p in self.unreached(done_steps, last_step)]
        return out


def is_whole_epoch(state) -> bool:
    epoch = float(state.epoch or 0)
    return abs(epoch - round(epoch)) <= 1e-9


__all__ += ["Plan", "epoch_spec", "is_whole_epoch"]
