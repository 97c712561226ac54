"""Metric as a function of the share of heads pruned (Michel et al. 2019, §4.2 Fig. 3 and §6 Fig. 5).

`pruning_curve` masks the lowest-scoring fraction p of the heads for each p in `fractions` (one-shot from one set of
scores, or iteratively re-estimated, or in random order as a baseline) and evaluates the masked model. How the heads
are ranked is a `Ranking`, which heads may go a `HeadScope`. It needs no Trainer; `PruningCurveCallback` and
`prunetrain curve` call it.

Metrics are callables `metric(model) -> float | dict` (a dict must hold the key named by `key`); helpers build
the common ones: `loss_metric`, `accuracy_metric` (here) and `prunetrain.mt.evaluation.metrics.bleu_metric` (sacreBLEU of a
translation model, part of the translation application).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from prunetrain.engine.mask import HeadMask
from prunetrain.methods.importance import (HeadScores, Scorer, batch_to, get_scorer, is_causal_lm, loss_token_count,
                                          random_scores)
from prunetrain.methods.selection import iterative_prune, select_heads
from prunetrain.utils.device import device_of
from prunetrain.utils.door import checked
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_fractions as _check_fractions

DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))
"""0, 10, ..., 90 % of heads pruned (Michel et al. 2019 prune in steps of 10 %)."""
ORDERS = ("importance", "random")

Metric = Callable[[nn.Module], "float | dict"]


@dataclass
class CurvePoint:
    """One point: the fraction asked for, heads kept (in total and per kind), the metric value and its cost."""

    fraction: float
    heads_kept: int
    heads_total: int
    kept_per_kind: dict[str, int]
    value: float
    seconds: float
    details: dict = field(default_factory=dict)


@checked
@dataclass
class Curve:
    """A pruning curve: points in increasing fraction, with how it was made."""

    metric: str
    order: str
    iterative: bool
    points: list[CurvePoint]
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "order": self.order, "iterative": self.iterative,
                "points": [asdict(p) for p in self.points], "meta": self.meta}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Curve":
        return cls(data["metric"], data["order"], data["iterative"], [CurvePoint(**p) for p in data["points"]],
                   dict(data.get("meta", {})))

    @property
    def fractions(self) -> list[float]:
        return [p.fraction for p in self.points]

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]


def check_fractions(fractions: Sequence[float], argument: str = "fractions") -> list[float]:
    """Validate and sort a list of fractions of heads in [0, 1] (`prunetrain.utils.validate.check_fractions`)."""
    return _check_fractions(argument, fractions)


def metric_value(result, key: str) -> tuple[float, dict]:
    """`(value, details)` from what a metric returned: a number, or a dict holding `key` (its other scalar entries
    are the details).

    Args:
        result: the metric's return value.
        key: the entry of a dict result to use.
    """
    if isinstance(result, Mapping):
        if key not in result:
            raise ValueError(f"key: {key!r} is not among the metric's results {sorted(result)}; give key= one of them.")
        details = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and k != key}
        return float(result[key]), details
    return float(result), {}


@checked
@dataclass(frozen=True, eq=False)
class Ranking:
    """How `pruning_curve` orders the heads (the lowest-ranked go first).

    Args:
        order: "importance" (ranked by `scores`, or by the `scorer` on `batches`) or "random" (a seeded baseline;
            `scores` and `batches` are then not needed).
        scores: importance to rank by (default: computed from `batches` with `scorer`, on the model as it is).
        batches: batches for importance (needed unless `scores` is given or `order="random"`).
        iterative: re-estimate importance on the masked model between fractions (Michel §4: steps of the fraction
            grid, which must then be evenly spaced from 0); needs `batches`.
        seed: seed of the random order.
        scorer: the importance scorer (registry name or callable).
        scorer_options: keyword options of a named scorer.
    """

    order: str = "importance"
    scores: HeadScores | None = None
    batches: Iterable[Mapping[str, Any]] | None = None
    iterative: bool = False
    seed: int = 0
    scorer: str | Scorer = "gradient"
    scorer_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order: {self.order!r} is not one of {', '.join(map(repr, ORDERS))}.")
        if self.iterative and self.order == "random":
            raise ValueError("iterative: re-estimating importance has no meaning for order='random'; use one of "
                             "them.")


@checked
@dataclass(frozen=True, eq=False)
class HeadScope:
    """Which heads `pruning_curve` may mask and what a fraction counts (the options of `select_heads`).

    Args:
        scope: "global" (one ranking over all heads in `kinds`), "kind" (the fraction of each kind's heads) or
            "layer" (the fraction of each site's heads).
        kinds: prune only these attention kinds (None: all kinds of the model).
        min_heads_per_layer: every site keeps at least this many heads.
        base_mask: heads already removed (e.g. by training-time pruning) stay removed and count toward each fraction.
    """

    scope: str = "global"
    kinds: str | Iterable[str] | None = None
    min_heads_per_layer: int = 0
    base_mask: HeadMask | None = None


RANKING_KEYWORDS = tuple(f.name for f in fields(Ranking))
SCOPE_KEYWORDS = tuple(f.name for f in fields(HeadScope))
"""The keyword arguments `pruning_curve` took before `Ranking` and `HeadScope` (deprecated, removed in 0.2)."""


@checked(own=("metric", "ranking", "heads"))
def pruning_curve(
    model: nn.Module,
    metric: Metric,
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    ranking: Ranking | None = None,
    heads: HeadScope | None = None,
    key: str = "value",
    metric_name: str = "metric",
    **deprecated: Any,
) -> Curve:
    """Evaluate `metric` with the lowest-ranked `fraction` of heads masked, for every fraction (Michel et al. 2019
    §4.2 Fig. 3, §6 Fig. 5). The model is left as it was: no mask stays attached and its train/eval mode is restored.

        pruning_curve(model, bleu, ranking=Ranking(batches=train_batches, iterative=True),
                      heads=HeadScope(kinds=["encoder_self"]), key="bleu")

    Args:
        model: the model.
        metric: `metric(model) -> float | dict` (e.g. `loss_metric`, `prunetrain.mt.evaluation.metrics.bleu_metric`).
        fractions: shares of all heads to prune (default 0, 0.1, ..., 0.9).
        ranking: how the heads are ordered (`Ranking`; default: importance from `Ranking.batches`).
        heads: which heads may go and what a fraction counts (`HeadScope`; default: every head, one global ranking).
        key: the entry of a dict-valued metric to plot (e.g. "bleu").
        metric_name: the metric's name in the result.
        **deprecated: the former keyword form (`order`, `scores`, `batches`, `iterative`, `seed`, `scorer`,
            `scorer_options`, `scope`, `kinds`, `min_heads_per_layer`, `base_mask`): still accepted with a
            DeprecationWarning until prunetrain 0.2.
    """
    unknown = [name for name in deprecated if name not in RANKING_KEYWORDS + SCOPE_KEYWORDS]
    if unknown:
        raise TypeError(f"pruning_curve() got an unexpected keyword argument {unknown[0]!r}")
    fractions = check_fractions(fractions)
    ranking, heads = _options(ranking, heads, deprecated)
    was_training = model.training
    model.eval()
    try:
        masks = _masks_for(model, fractions, ranking, heads)
        points = []
        for fraction, mask in bar(list(zip(fractions, masks)), desc="curve points", unit="point"):
            start = time.perf_counter()
            with torch.no_grad(), mask.applied(model):
                value, details = metric_value(metric(model), key)
            points.append(CurvePoint(fraction, mask.num_kept, mask.num_heads, mask.kept_per_kind(), value,
                                     time.perf_counter() - start, details))
    finally:
        model.train(was_training)
    return Curve(metric_name, ranking.order, ranking.iterative, points,
                 {"scope": heads.scope, "seed": ranking.seed if ranking.order == "random" else None})


def _options(ranking: Ranking | None, heads: HeadScope | None, deprecated: Mapping[str, Any]
             ) -> tuple[Ranking, HeadScope]:
    """`ranking` and `heads`, or the same built from the deprecated keyword arguments (with one warning line)."""
    old_ranking = {k: v for k, v in deprecated.items() if k in RANKING_KEYWORDS}
    old_scope = {k: v for k, v in deprecated.items() if k in SCOPE_KEYWORDS}
    for argument, given, old, cls in (("ranking", ranking, old_ranking, Ranking), ("heads", heads, old_scope,
                                                                                  HeadScope)):
        if given is not None and old:
            raise ValueError(f"{argument}: give either {argument}={cls.__name__}(...) or the deprecated keyword "
                             f"arguments {', '.join(old)}, not both.")
        if given is not None and not isinstance(given, cls):
            raise TypeError(f"{argument}: expected a prunetrain.methods.curve.{cls.__name__}, got "
                            f"{type(given).__name__}.")
    if deprecated:
        warnings.warn(f"pruning_curve: the keyword arguments {', '.join(deprecated)} are deprecated and stop working "
                      f"in prunetrain 0.2; pass ranking=Ranking(...) and heads=HeadScope(...) instead.",
                      DeprecationWarning, stacklevel=4)  # the caller of pruning_curve, above its door (@checked)
    return ranking or Ranking(**old_ranking), heads or HeadScope(**old_scope)


def _masks_for(model: nn.Module, fractions: list[float], ranking: Ranking, heads: HeadScope) -> list[HeadMask]:
    """The mask of every fraction: from one ranking (scores given, computed once, or random) or, with
    `ranking.iterative`, from Michel's iterative pruning (importance re-estimated after each step)."""
    select = dict(scope=heads.scope, kinds=heads.kinds, min_heads_per_layer=heads.min_heads_per_layer,
                  base_mask=heads.base_mask)
    scorer, scorer_options, batches = ranking.scorer, ranking.scorer_options, ranking.batches
    base_mask = heads.base_mask
    if ranking.iterative:
        if batches is None:
            raise ValueError("batches: iterative curves re-estimate importance and need batches.")
        steps = [b - a for a, b in zip([0.0] + fractions[:-1], fractions)]
        step = fractions[1] - fractions[0] if len(fractions) > 1 else fractions[0]
        if fractions[0] != 0 or any(abs(s - step) > 1e-9 for s in steps[1:]):
            raise ValueError(f"fractions: iterative curves need an evenly spaced grid from 0, got {fractions}.")
        result = iterative_prune(model, list(batches), step=step, target=fractions[-1], scorer=scorer,
                                 scorer_options=scorer_options, **select)
        start = base_mask.copy() if base_mask is not None else HeadMask.ones(model)
        return [start] + [s.mask for s in result.history][: len(fractions) - 1]
    scores = ranking.scores
    if ranking.order == "random":
        scores = random_scores(model, seed=ranking.seed)
    elif scores is None:
        if batches is None:
            raise ValueError("scores: give importance scores, or batches to compute them from.")
        if base_mask is not None:
            with base_mask.applied(model):
                scores = get_scorer(scorer, **dict(scorer_options or {}))(model, batches)
        else:
            scores = get_scorer(scorer, **dict(scorer_options or {}))(model, batches)
    return [select_heads(scores, f, **select) for f in fractions]


# -------------------------------------------------------------------------------------------------------------------
# metrics
# -------------------------------------------------------------------------------------------------------------------
def _ratio_metric(batches: Iterable[Mapping[str, Any]], per_batch, name: str, count_name: str) -> Metric:
    """A metric `Σ numerator / Σ count` over `batches` (read once into a list), each batch moved to the model's
    device and scored by `per_batch(model, batch) -> (numerator, count)` without gradients."""
    batches = list(batches)

    def metric(model: nn.Module) -> dict:
        total, count = 0.0, 0
        device = device_of(model)
        with torch.no_grad():
            for batch in batches:
                value, n = per_batch(model, batch_to(batch, device))
                total += value
                count += n
        return {name: total / max(count, 1), count_name: count}

    return metric


def loss_metric(batches: Iterable[Mapping[str, Any]]) -> Metric:
    """Token-weighted mean of the model's own loss over `batches` (batches need `labels`).

    Args:
        batches: batches with `labels`; read once into a list.
    """
    def per_batch(model: nn.Module, batch: dict) -> tuple[float, int]:
        n = loss_token_count(model, batch)
        return float(model(**batch).loss) * n, n

    return _ratio_metric(batches, per_batch, "loss", "tokens")


def accuracy_metric(batches: Iterable[Mapping[str, Any]]) -> Metric:
    """Accuracy of argmax predictions against `labels` (sequence classification, or tokens with labels != -100;
    causal LMs are compared with the next token).

    Args:
        batches: batches with `labels`; read once into a list.
    """
    def per_batch(model: nn.Module, batch: dict) -> tuple[int, int]:
        labels = batch["labels"]
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        if is_causal_lm(model):  # position t predicts token t + 1
            logits, labels = logits[:, :-1], labels[:, 1:]
        valid = labels != -100
        return int(((logits.argmax(-1) == labels) & valid).sum()), int(valid.sum())

    return _ratio_metric(batches, per_batch, "accuracy", "items")


__all__ = ["Curve", "CurvePoint", "DEFAULT_FRACTIONS", "HeadScope", "Metric", "Ranking", "accuracy_metric",
           "check_fractions", "loss_metric", "metric_value", "pruning_curve"]
