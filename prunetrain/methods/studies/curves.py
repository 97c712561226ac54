"""Michel §4.2 (Fig. 3): metric vs % of heads pruned, importance order against random order; and the resumable
curve (`resumable_curve`) and threshold rule (`within`) that §5's per-kind curves share."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from torch import nn

from prunetrain.methods.curve import (DEFAULT_FRACTIONS, HeadScope, Ranking, check_fractions, metric_value,
                                      pruning_curve)
from prunetrain.methods.studies.evaluation import Metric, measure
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import StudyOutputs, fraction_axes
from prunetrain.utils.plots import pyplot
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_positive_float

def resumable_curve(model, metric, key, journal: Journal, name: str, fractions: list[float], after_unit,
                    ranking: Ranking, heads: HeadScope | None = None) -> dict:
    """`pruning_curve` whose points are saved units: a saved point is not evaluated again (its mask still is
    computed, deterministically), a finished curve is not computed again."""
    if journal.done(f"curve:{name}"):
        return journal.units[f"curve:{name}"]
    calls = iter(fractions)

    def cached(m):
        unit = f"{name}@{next(calls):g}"
        if not journal.done(unit):
            value, details = metric_value(metric(m), key)
            journal.record(unit, {key: value, **details})
            if after_unit is not None:
                after_unit(unit, journal.units[unit])
        return journal.units[unit]

    curve = pruning_curve(model, cached, fractions=fractions, ranking=ranking, heads=heads, key=key,
                          metric_name=key).to_dict()
    for point in curve["points"]:
        point["seconds"] = None  # a resumed point has no time of its own: none is kept, so results compare equal
    journal.record(f"curve:{name}", curve)
    return curve


def within(fractions: Sequence[float], values: Sequence[float], base: float, threshold: float,
           higher_is_better: bool = True) -> float:
    """The largest fraction f such that the metric at f and at every smaller fraction is no worse than
    `base − threshold` (0.0 if already the first point is worse)."""
    sign = 1 if higher_is_better else -1
    best = 0.0
    for f, v in sorted(zip(fractions, values)):
        if sign * (v - base) < -threshold:
            break
        best = f
    return best


def spread(curves: Sequence[dict]) -> dict:
    """Mean, standard deviation, min and max over curves, per fraction."""
    fractions = [p["fraction"] for p in curves[0]["points"]]
    out = {"fractions": fractions, "mean": [], "std": [], "min": [], "max": []}
    for i in range(len(fractions)):
        vals = [c["points"][i]["value"] for c in curves]
        mean = sum(vals) / len(vals)
        out["mean"].append(mean)
        out["std"].append(math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0)
        out["min"].append(min(vals))
        out["max"].append(max(vals))
    return out


def base_value(model, metric, key, journal: Journal, curves: Mapping[str, dict], after_unit) -> float:
    """The full model's value: the curves' point at fraction 0 when there is one, else one saved evaluation."""
    for curve in curves.values():
        if curve["points"] and curve["points"][0]["fraction"] == 0:
            return curve["points"][0]["value"]
    if not journal.done("base"):
        journal.record("base", measure(model, metric, key))
        if after_unit is not None:
            after_unit("base", journal.units["base"])
    return journal.units["base"]


def curve_scalars(out: StudyOutputs, curves: Mapping[str, dict]) -> None:
    """Every curve's points in TensorBoard, one series per curve, the step being the % of heads pruned."""
    for name, curve in curves.items():
        for p in curve["points"]:
            out.scalar(name, p["value"], round(100 * p["fraction"]))


def pruning_curves_study(model: nn.Module, metric: Metric, batches: Iterable, *, key: str = "value",
                         fractions: Sequence[float] = DEFAULT_FRACTIONS,
                         random_seeds: Sequence[int] = (0, 1, 2), iterative: bool = True,
                         higher_is_better: bool = True, threshold: float = 0.5,
                         out_dir: str | Path | None = None, args: Mapping | None = None,
                         after_unit: AfterUnit | None = None) -> dict:
    """Michel §4.2 / Fig. 3: metric vs % of heads pruned — importance order (re-estimated on the pruned model after
    every step when `iterative`, as in the paper; the grid must then be evenly spaced from 0) against random order
    (one curve per seed; mean, std, min and max per fraction). For each order, `within_threshold` is the largest
    fraction up to which the metric stays within `threshold` of the full model (`within`).

    Writes `pruning_curves.json`, `pruning_curves.png` (importance, random mean ± spread) and a TensorBoard entry.

    Args:
        model: the model.
        metric: `metric(model) -> float | dict`.
        batches: batches for importance.
        key: the entry of a dict-valued metric.
        fractions: shares of all heads to prune.
        random_seeds: seeds of the random-order curves.
        iterative: re-estimate importance between fractions.
        higher_is_better: False for a loss.
        threshold: the tolerated loss of metric for `within_threshold`.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metric and batches; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
    """
    fractions = check_fractions(fractions)
    check_positive_float("threshold", threshold, allow_zero=True)
    seeds = [int(s) for s in random_seeds]
    journal = Journal(out_dir, "pruning_curves",
                      {"study": "curves", "key": key, "fractions": fractions, "seeds": seeds, "iterative": iterative,
                       "layout": layout_args(model), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    batches = list(batches)
    specs = [("importance", Ranking(batches=batches, iterative=iterative))]
    specs += [(f"random_seed{s}", Ranking(order="random", seed=s)) for s in seeds]
    curves = {name: resumable_curve(model, metric, key, journal, name, fractions, after_unit, ranking)
              for name, ranking in bar(specs, total=len(specs), desc="pruning curves", unit="curve")}
    base = base_value(model, metric, key, journal, curves, after_unit)
    randoms = [curves[f"random_seed{s}"] for s in seeds]
    random_spread = spread(randoms) if randoms else None
    imp = curves["importance"]
    summary = {"base": base, "threshold": threshold,
               "importance_within_threshold": within(fractions, [p["value"] for p in imp["points"]], base,
                                                     threshold, higher_is_better),
               "random_mean_within_threshold": (within(fractions, random_spread["mean"], base, threshold,
                                                       higher_is_better) if random_spread else None)}
    result = journal.finish({"study": "curves", "metric": key, "curves": curves, "random": random_spread,
                             "summary": summary, "seconds": time.perf_counter() - start})
    _write_curves_outputs(result, out_dir, fractions, len(seeds), iterative, higher_is_better)
    return result


def _write_curves_outputs(result: Mapping, out_dir, fractions: list[float], seeds: int, iterative: bool,
                          higher_is_better: bool) -> None:
    """TensorBoard series of every curve and `pruning_curves.png` (importance, random mean and min–max, the
    threshold line)."""
    key, curves, random_spread = result["metric"], result["curves"], result["random"]
    base, threshold = result["summary"]["base"], result["summary"]["threshold"]
    out = StudyOutputs(out_dir, "curves")
    curve_scalars(out, curves)
    fig, ax = pyplot().subplots(figsize=(5.5, 3.8))
    xs = [100 * f for f in fractions]
    ax.plot(xs, [p["value"] for p in curves["importance"]["points"]], marker="o", ms=3, label="importance" +
            (" (iterative)" if iterative else ""))
    if random_spread:
        ax.plot(xs, random_spread["mean"], marker="s", ms=3, label=f"random (mean of {seeds})")
        ax.fill_between(xs, random_spread["min"], random_spread["max"], alpha=0.25, label="random (min–max)")
    ax.axhline(base - threshold if higher_is_better else base + threshold, color="k", lw=0.6, ls="--",
               label=f"full − {threshold:g}" if higher_is_better else f"full + {threshold:g}")
    fraction_axes(ax, key, "iterative pruning: importance vs random order")
    fig.tight_layout()
    out.figure(fig, "pruning_curves.png")
    out.close()


__all__ = ["base_value", "pruning_curves_study", "resumable_curve", "spread", "within"]
