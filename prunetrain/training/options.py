"""The callbacks' options, grouped by the question each answers (after HF's `TrainingArguments`, one record read by
the callbacks, and Lightning's `ModelPruning`, whose schedule is a value of its own):

- `Schedule` — *when*: importance/curve points in epochs or steps, the cumulative amounts pruned by each point, the
  steps at which masked heads are removed physically, the "end" point of a run cut short;
- `Heads` — *which heads*: scope, attention kinds, heads every site keeps, serving constraints;
- `Importance` — *how heads are ranked*: scorer, its options and batches, iterative re-estimation (Michel §4);
- `Output` — *where results go*: output directory and TensorBoard;
- `CurveSweep` (`PruningCurveCallback`) — the fractions of each curve and the orders they are taken in;
- `GateTraining` (`HardConcreteCallback`) — how the Hard-Concrete gates are trained.

Each is a frozen dataclass validated once in `__post_init__` (a bad value is one sentence naming the argument, the
value and what is allowed), shared by every callback where the idea is the same; a field that means nothing to a
callback is refused by that callback, never ignored. Every field's name is the keyword the callbacks took before
(`importance_batches` of `PruningCurveCallback` is `Importance.batches`); those keywords still work until
prunetrain 0.2 with one `DeprecationWarning` (`resolve_options`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

from prunetrain.engine.heads import KINDS, check_units
from prunetrain.methods.constraints import ServingConstraints, check_constraints
from prunetrain.methods.curve import DEFAULT_FRACTIONS
from prunetrain.methods.importance import get_scorer
from prunetrain.methods.selection import ALL_KINDS, SCOPES
from prunetrain.training.points import check_amount_schedule, check_step_points, epoch_spec
from prunetrain.utils.door import NonNegativeInt, PositiveFloat, PositiveInt, checked
from prunetrain.utils.validate import (check_amount, check_amount_convention, check_bool, check_choice,
                                       check_fractions, check_int, check_ints, check_kinds)

CURVE_ORDERS = ("importance", "random", "both")


def _points(values: Iterable) -> tuple:
    """A one-shot iterable read once (so a generator is not consumed by the checks), kept as a tuple."""
    return tuple(values)


def _step_list(argument: str, values: Any) -> list:
    """A list of step points as given: a string ('12' is not the steps 1 and 2) or a single number is refused."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{argument}: {values!r} is not a list of global optimizer steps; give e.g. [300, 900].")
    return list(values)


def _set_bool(record, name: str) -> None:
    """Check the bool field `name` of a frozen record (a real bool only; numpy's bool is kept as a bool)."""
    object.__setattr__(record, name, check_bool(name, getattr(record, name)))


@checked(own=("at_epochs", "at_steps", "prune", "prune_steps", "shrink_steps"))
@dataclass(frozen=True)
class Schedule:
    """When a callback acts. Points are epochs (fractional allowed: 0.5 is the middle of the first epoch) or global
    optimizer steps; each record is labelled by both (`prunetrain.training.scheduled`).

        Schedule(at_epochs=[1, 2, 5], prune={5: 0.2, 8: 0.4})
        Schedule(at_epochs=[], prune_steps={450: 0.25, 700: 0.5}, shrink_steps=[700])

    Args:
        at_epochs: importance (or curve) points: a list of epoch points in increasing order (ints or fractional
            floats: `[0.5, 1, 2.25]`), an int N (every N whole epochs) or a function epoch -> bool (whole epochs).
        at_steps: more points, as global optimizer steps (increasing).
        prune: `HeadPruningCallback` only: None (only record), or the cumulative amount pruned by a point: a dict
            {epoch: amount} (epochs may be fractional) or a function whole-epoch -> amount | None. An amount is a
            fraction (float in [0, 1]) or a count (int) of all heads (`select_heads` convention).
        prune_steps: `HeadPruningCallback` only: the same schedule keyed by global step, e.g. {300: 0.25, 900: 0.5}.
        shrink_steps: `HeadPruningCallback` only, with `mode="mask"`: global steps at which the heads masked so far
            are removed physically (optimizer state sliced); each must be a step of `prune_steps`.
        record_end: when training stops part-way through an epoch (time cap, `max_steps`), act at that exact step as
            an "end" point (recording only, no pruning there).
    """

    at_epochs: Sequence[float] | int | Callable[[int], bool] = (1,)
    at_steps: Iterable[int] = ()
    prune: Mapping[float, Any] | Callable[[int], Any] | None = None
    prune_steps: Mapping[int, Any] | None = None
    shrink_steps: Iterable[int] = ()
    record_end: bool = True

    def __post_init__(self) -> None:
        if not callable(self.at_epochs) and not isinstance(self.at_epochs, (int, str, bytes)) \
                and isinstance(self.at_epochs, Iterable):
            object.__setattr__(self, "at_epochs", _points(self.at_epochs))
        epoch_spec(self.at_epochs, "at_epochs")
        object.__setattr__(self, "at_steps", _points(check_step_points("at_steps", _step_list("at_steps",
                                                                                              self.at_steps))))
        if not (self.prune is None or callable(self.prune) or isinstance(self.prune, Mapping)):
            raise ValueError(f"prune: {self.prune!r} is not a schedule; give a dict {{epoch: amount}}, a function "
                             f"epoch -> amount or None.")
        check_amount_convention("prune/prune_steps", [*self.prune_epochs().values(), *self.step_amounts().values()])
        shrink = check_step_points("shrink_steps", _step_list("shrink_steps", self.shrink_steps))
        object.__setattr__(self, "shrink_steps", _points(shrink))
        for shrink_step in shrink:
            if shrink_step not in self.step_amounts():
                raise ValueError(f"shrink_steps: {shrink_step} is not a step of prune_steps "
                                 f"{sorted(self.step_amounts())}; a shrink follows a pruning step.")
        _set_bool(self, "record_end")

    def points(self) -> tuple[Callable[[int], bool] | None, list[float]]:
        """`(whole-epoch selector or None, epoch points)` of `at_epochs`."""
        return epoch_spec(self.at_epochs, "at_epochs")

    def prune_epochs(self) -> dict[float, Any]:
        """`prune` as {epoch (float): amount} ({} when it is None or a function)."""
        if not isinstance(self.prune, Mapping):
            return {}
        return {float(k): v for k, v in check_amount_schedule("prune", self.prune, "epoch").items()}

    def prune_function(self) -> Callable[[int], Any] | None:
        """`prune` when it is a function whole-epoch -> amount | None."""
        return self.prune if callable(self.prune) and not isinstance(self.prune, Mapping) else None

    def step_amounts(self) -> dict[int, Any]:
        """`prune_steps` as {step: amount} ({} when None)."""
        return check_amount_schedule("prune_steps", self.prune_steps or {}, "step")

    @property
    def prunes(self) -> bool:
        """Whether this schedule prunes or shrinks anything (a curve or gates callback refuses one that does)."""
        return self.prune is not None or bool(self.prune_steps) or bool(self.shrink_steps)


@checked(own=("constraints",))
@dataclass(frozen=True)
class Heads:
    """Which units (heads, FFN neurons) a callback may remove and how many each site keeps (the options of
    `select_heads`).

        Heads(kinds=["encoder_self"], min_heads_per_layer=2)
        Heads(units=("heads", "neurons"))          # with Schedule(prune_steps={300: {"flops": 0.5}})

    Args:
        scope: "global" (one ranking over all units in `kinds`), "layer" (the amount of each site's units) or "kind"
            (of each kind's units). `HardConcreteCallback` gates every head of `kinds` and takes no other scope.
        kinds: the attention (or FFN: `encoder_ffn`, `decoder_ffn`, `ffn`) kinds that may be pruned or gated (None:
            all kinds of the units pruned).
        units: the units the callback prunes: "heads", "neurons" (FFN neurons) or both. None (default): heads, plus
            neurons when a scheduled amount names them ({"heads": 0.75, "neurons": 0.5}) or an FFN kind
            ({"encoder_ffn": 0.5, ...}), or is a FLOP target ({"flops": share}: every unit the model has).
            `HeadPruningCallback` only.
        min_heads_per_layer: heads every site keeps; None: the callback's default (`HeadPruningCallback` 1, so no
            layer is emptied; `PruningCurveCallback` 0, as in Michel et al.'s curves). Not for `HardConcreteCallback`.
        constraints: a `prunetrain.methods.constraints.ServingConstraints` every selection (or the final gates) is
            made to satisfy, e.g. `ServingConstraints(same_heads_per_kind=True)` for a layout `prunetrain export
            --format uniform` can write; None: no constraint. Not for `PruningCurveCallback`.
    """

    scope: str = "global"
    kinds: str | Sequence[str] | None = None
    min_heads_per_layer: int | None = None
    constraints: ServingConstraints | None = None
    units: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        check_choice("scope", self.scope, SCOPES)
        kinds = check_kinds("kinds", self.kinds, ALL_KINDS)
        if kinds is not None and len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds: {self.kinds!r} names a kind twice; give each kind once.")
        object.__setattr__(self, "kinds", None if kinds is None else tuple(kinds))
        if self.units is not None:
            object.__setattr__(self, "units", check_units(self.units))
        if self.min_heads_per_layer is not None:
            check_int("min_heads_per_layer", self.min_heads_per_layer, 0)
        check_constraints(self.constraints)

    def refuse_neurons(self, owner: str) -> None:
        """For a callback that handles heads only: FFN units or kinds are one clear error, never ignored."""
        ffn_kinds = [k for k in self.kinds or () if k not in KINDS]
        if (self.units is not None and "neurons" in self.units) or ffn_kinds:
            what = f"units={self.units!r}" if self.units is not None and "neurons" in self.units \
                else f"kinds {ffn_kinds!r}"
            raise ValueError(f"heads: {owner} works on attention heads only ({what} names FFN neurons); prune FFN "
                             f"neurons with HeadPruningCallback.")

    def kept_per_site(self, default: int) -> int:
        """`min_heads_per_layer`, or the calling callback's `default` when it is None."""
        return default if self.min_heads_per_layer is None else self.min_heads_per_layer

    @property
    def kind_list(self) -> list[str] | None:
        """`kinds` as a list (None: all kinds)."""
        return None if self.kinds is None else list(self.kinds)


@checked(own=("scorer", "scorer_options", "batches"))
@dataclass(frozen=True)
class Importance:
    """How heads are ranked at each point: head importance I_h = E_x |∂L(x)/∂ξ_h| (Michel et al. 2019, eq. 2) by
    default, or another scorer.

        Importance(scorer="gradient", batches=dev_batches, iterative=True, step=0.05)

    Args:
        scorer: "gradient" (Michel), "ablation", "confidence", "random" or a callable (`register_scorer`).
        scorer_options: keyword options of the scorer (checked now).
        batches: the batches importance is computed on (a list or DataLoader; under DDP each rank takes its share).
            Default: `num_batches` global batches of the Trainer's training set (one optimizer step's examples
            each: per-process batch × ranks × accumulation), drawn with the run's seed, the same at every point and
            whatever the world size and gradient accumulation (`prunetrain.training.importance_sample`).
        num_batches: how many global batches the default sample holds (see `batches`).
        iterative: re-estimate importance on the pruned model between steps (Michel §4): `HeadPruningCallback` prunes
            in steps of `step`, `PruningCurveCallback` re-estimates between its fractions.
        step: `HeadPruningCallback`'s step of iterative pruning, a fraction or a count of all heads (None: 0.1).
            `PruningCurveCallback` steps along its fractions and takes none.
    """

    scorer: str | Callable = "gradient"
    scorer_options: Mapping[str, Any] | None = None
    batches: Iterable | None = None
    num_batches: PositiveInt = 8
    iterative: bool = False
    step: float | int | None = None

    def __post_init__(self) -> None:
        _set_bool(self, "iterative")
        _check_batches(self.batches)
        if self.scorer_options is not None and not isinstance(self.scorer_options, Mapping):
            raise ValueError(f"scorer_options: {self.scorer_options!r} is not a dict of the scorer's keyword options "
                             f"(or None).")
        if self.step is not None:
            check_amount("step", self.step)
            if self.step == 0:
                raise ValueError("step: 0 would never prune; give a fraction > 0 or a count >= 1.")
        get_scorer(self.scorer, **dict(self.scorer_options or {}))  # validates the name and options now

    @property
    def options(self) -> dict[str, Any]:
        """`scorer_options` as a dict (empty when None)."""
        return dict(self.scorer_options or {})


@checked(own=("output_dir",))
@dataclass(frozen=True)
class Output:
    """Where a callback's files go.

    Args:
        output_dir: the directory of its JSON files, figures and TensorBoard logs (default
            `<Trainer output_dir>/prunetrain`).
        tensorboard: write TensorBoard scalars and figures (TensorBoard step = global step; rank 0 only).
    """

    output_dir: str | os.PathLike | None = None
    tensorboard: bool = True

    def __post_init__(self) -> None:
        if self.output_dir is not None and not isinstance(self.output_dir, (str, os.PathLike)):
            raise ValueError(f"output_dir: {self.output_dir!r} is not a path; give a str, a pathlib.Path or None "
                             f"(<Trainer output_dir>/prunetrain).")
        if self.output_dir is not None and not os.fspath(self.output_dir):
            raise ValueError("output_dir: '' is an empty path (it would mean the current directory); give a directory "
                             "or None (<Trainer output_dir>/prunetrain).")
        _set_bool(self, "tensorboard")


@checked(own=("fractions", "random_seeds"))
@dataclass(frozen=True)
class CurveSweep:
    """The points of each pruning curve (`PruningCurveCallback`, Michel et al. 2019 §6 Fig. 5).

    Args:
        fractions: shares of the heads to mask (default 0, 0.1, …, 0.9).
        relative: fractions of the heads still present (scope "global"; heads removed by training-time pruning stay
            removed and the fraction applies to the rest). False, or scope "kind"/"layer": fractions of the model's
            original heads. A fraction out of reach on the model as it is then is skipped and listed in the record.
        order: "importance", "random" (a seeded baseline, one curve per seed in `random_seeds`) or "both".
        random_seeds: seeds of the random-order curves.
    """

    fractions: Sequence[float] = DEFAULT_FRACTIONS
    relative: bool = True
    order: str = "importance"
    random_seeds: Sequence[int] = (0,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(check_fractions("fractions", self.fractions)))
        check_choice("order", self.order, CURVE_ORDERS)
        _set_bool(self, "relative")
        seeds = check_ints("random_seeds", self.random_seeds, 0)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"random_seeds: {list(seeds)!r} repeats a seed; each seed gives one random-order curve, "
                             f"give each once.")
        object.__setattr__(self, "random_seeds", seeds)


@checked
@dataclass(frozen=True)
class GateTraining:
    """How `HardConcreteCallback` trains its Hard-Concrete gates (Voita et al. 2019 §6; Louizos et al. 2018).

    Args:
        gate_lr: the gates' own learning rate (Adam, no weight decay).
        lagrangian_lr: the multipliers' learning rate with a head budget (Adam, gradient ascent).
        init_log_alpha: initial log α of every gate.
        seed: seed of the gates' initial noise.
    """

    gate_lr: PositiveFloat = 0.1
    lagrangian_lr: PositiveFloat = 0.05
    init_log_alpha: float = 3.0
    seed: NonNegativeInt = 0


def _check_batches(batches: Any) -> None:
    """`Importance.batches`: None, or an iterable of batches that is not a string and, when it has a length, not
    empty (importance over no batch would rank the heads on nothing)."""
    if batches is None:
        return
    if isinstance(batches, (str, bytes, Mapping)) or not isinstance(batches, Iterable):
        raise ValueError(f"batches: {batches!r} is not a list or DataLoader of batches (or None: the Trainer's "
                         f"training dataloader).")
    try:
        empty = len(batches) == 0
    except TypeError:
        return
    if empty:
        raise ValueError("batches: it holds no batch; give at least one (or None: the Trainer's training "
                         "dataloader).")


def resolve_options(owner: str, given: Mapping[str, Any], groups: Mapping[str, type], legacy: Mapping[str, Any],
                    renamed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The option records of a callback: each `given[name]` (None: built from the deprecated keyword arguments in
    `legacy` that are its fields, or its defaults), with one `DeprecationWarning` line when `legacy` is not empty.

    Args:
        owner: the callback's class name (for messages).
        given: parameter name -> the record passed (or None).
        groups: parameter name -> its record class.
        legacy: the deprecated keyword arguments (each the name of a field of one record, or a key of `renamed`).
        renamed: deprecated keyword -> the record field it became (`importance_batches` -> `batches`).
    """
    renamed = dict(renamed or {})
    owners = {f.name: name for name, cls in groups.items() for f in fields(cls)}
    parts: dict[str, dict[str, Any]] = {name: {} for name in groups}
    for keyword, value in legacy.items():
        field_name = renamed.get(keyword, keyword)
        if field_name not in owners:
            raise TypeError(f"{owner}() got an unexpected keyword argument {keyword!r}")
        parts[owners[field_name]][field_name] = value
    out = {}
    for name, cls in groups.items():
        record, old = given.get(name), [k for k in legacy if owners[renamed.get(k, k)] == name]
        if record is not None and old:
            raise ValueError(f"{name}: give either {name}={cls.__name__}(...) or the deprecated keyword arguments "
                             f"{', '.join(old)}, not both.")
        if record is not None and not isinstance(record, cls):
            raise TypeError(f"{name}: {record!r} is not allowed; pass {name}={cls.__name__}(...) (from "
                            f"prunetrain.training.options) or None.")
        out[name] = record if record is not None else cls(**parts[name])
    if legacy:
        touched = [name for name in groups if parts[name]]
        warnings.warn(f"{owner}: the keyword arguments {', '.join(legacy)} are deprecated and stop working in "
                      f"prunetrain 0.2; pass {', '.join(f'{n}={groups[n].__name__}(...)' for n in touched)} instead.",
                      DeprecationWarning, stacklevel=4)  # the callback's caller, above its door (@checked)
    return out


__all__ = ["CURVE_ORDERS", "CurveSweep", "GateTraining", "Heads", "Importance", "Output", "Schedule",
           "resolve_options"]
