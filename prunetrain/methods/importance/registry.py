"""The scorer protocol (`scorer(model, batches) -> HeadScores`), one configurable scorer class per method, and the
registry that builds them by name (`get_scorer`, `register_scorer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

import torch
from torch import nn

from prunetrain.engine.heads import check_units
from prunetrain.methods.importance.gradient import NORMALIZE, PER, REDUCTION, head_importance
from prunetrain.methods.importance.loop import LossFn
from prunetrain.methods.importance.scorers import ablation_scores, confidence_scores, random_scores
from prunetrain.methods.importance.scores import HeadScores
from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_bool, check_choice, check_int


def check_scorer_options(scorer) -> None:
    """The options every loss-based scorer shares, checked when it is built (not at its first use, which may be
    hours into training): `loss_fn` a callable or None, `autocast` a torch dtype or None, `max_batches` an int >= 1
    or None, `sync` True, False or None (a string such as 'no' is refused, never read as its truth value)."""
    loss_fn = getattr(scorer, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn: {loss_fn!r} is not a callable (model, batch) -> loss, or None.")
    if scorer.autocast is not None and not isinstance(scorer.autocast, torch.dtype):
        raise ValueError(f"autocast: {scorer.autocast!r} is not a torch dtype (e.g. torch.bfloat16) or None.")
    if scorer.max_batches is not None:
        check_int("max_batches", scorer.max_batches, 1)
    if scorer.sync is not None:
        check_bool("sync", scorer.sync)


@runtime_checkable
class Scorer(Protocol):
    """Anything that scores heads: `scorer(model, batches) -> HeadScores` (low score = prune first)."""

    def __call__(self, model: nn.Module, batches: Iterable[Mapping[str, Any]]) -> HeadScores: ...


@checked(own=("loss_fn", "autocast"))
@dataclass
class GradientScorer:
    """Michel et al. (2019) I_h = E_x |∂L(x)/∂ξ_h| (`head_importance`). Cost: 1 forward + 1 backward per batch."""

    loss_fn: LossFn | None = None
    per: str = "batch"
    normalize: str | None = "layer"
    reduction: str = "mean"
    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None
    units: tuple[str, ...] = ("heads",)

    def __post_init__(self) -> None:
        check_choice("per", self.per, PER)
        check_choice("normalize", self.normalize, NORMALIZE)
        check_choice("reduction", self.reduction, REDUCTION)
        check_scorer_options(self)
        self.units = check_units(self.units)

    def __call__(self, model, batches) -> HeadScores:
        return head_importance(model, batches, loss_fn=self.loss_fn, per=self.per, normalize=self.normalize,
                               reduction=self.reduction, autocast=self.autocast, max_batches=self.max_batches,
                               sync=self.sync, units=self.units)


@checked(own=("loss_fn", "autocast"))
@dataclass
class AblationScorer:
    """Loss change when each head alone is removed (`ablation_scores`). Cost: 1 + H forward passes per batch."""

    loss_fn: LossFn | None = None
    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None

    def __post_init__(self) -> None:
        check_scorer_options(self)

    def __call__(self, model, batches) -> HeadScores:
        return ablation_scores(model, batches, loss_fn=self.loss_fn, autocast=self.autocast,
                               max_batches=self.max_batches, sync=self.sync)


@checked(own=("autocast",))
@dataclass
class ConfidenceScorer:
    """Voita et al. (2019) mean maximum attention weight (`confidence_scores`). Cost: 1 forward per batch (eager)."""

    autocast: torch.dtype | None = None
    max_batches: int | None = None
    sync: bool | None = None

    def __post_init__(self) -> None:
        check_scorer_options(self)

    def __call__(self, model, batches) -> HeadScores:
        return confidence_scores(model, batches, autocast=self.autocast, max_batches=self.max_batches, sync=self.sync)


@checked
@dataclass
class RandomScorer:
    """Seeded uniform scores (`random_scores`): the baseline. Ignores the batches; no forward pass."""

    seed: int = 0
    units: tuple[str, ...] = ("heads",)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: {self.seed!r} is not allowed; expected an integer.")
        self.units = check_units(self.units)

    def __call__(self, model, batches=None) -> HeadScores:
        from prunetrain.engine.heads import find_sites

        return random_scores(find_sites(model, self.units), seed=self.seed)


UNIT_SCORERS = ("gradient", "random")
"""The built-in scorers that score FFN neurons too (their `units` option); the others score heads only."""

SCORERS: dict[str, Callable[..., Scorer]] = {
    "gradient": GradientScorer,
    "ablation": AblationScorer,
    "confidence": ConfidenceScorer,
    "random": RandomScorer,
}
"""Scorer factories by name; `get_scorer(name, **options)` builds one. Add your own with `register_scorer`."""


@checked
def register_scorer(name: str, factory: Callable[..., Scorer]) -> None:
    """Make `get_scorer(name, **options)` return `factory(**options)`.

    Args:
        name: the registry name.
        factory: `factory(**options) -> Scorer` (a callable `scorer(model, batches) -> HeadScores`).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}.")
    SCORERS[name] = factory


@checked
def get_scorer(name: str | Scorer, **options) -> Scorer:
    """A scorer by registry name (`gradient`, `ablation`, `confidence`, `random`, or registered), built with
    `options`; a callable scorer is returned as is (options must then be empty).

    Args:
        name: a registry name or a callable `scorer(model, batches) -> HeadScores`.
        **options: keyword options of the scorer (e.g. `per="example"` for "gradient").
    """
    if callable(name) and not isinstance(name, str):
        if options:
            raise ValueError(f"options: {', '.join(options)} can only be given with a scorer name, not with a "
                             f"scorer object.")
        return name
    if name not in SCORERS:
        raise ValueError(f"scorer: {name!r} is not one of {', '.join(map(repr, SCORERS))} (or a callable "
                         f"scorer(model, batches) -> HeadScores).")
    try:
        return SCORERS[name](**options)
    except TypeError as err:
        raise ValueError(f"options for scorer {name!r}: {err}") from None


__all__ = ["AblationScorer", "ConfidenceScorer", "GradientScorer", "RandomScorer", "SCORERS", "Scorer", "UNIT_SCORERS",
           "get_scorer", "register_scorer"]
