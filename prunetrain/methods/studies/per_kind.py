"""Michel §5 (Fig. 4): the pruning curve of one attention kind at a time (encoder self, decoder self, cross)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.methods.curve import DEFAULT_FRACTIONS, HeadScope, Ranking, check_fractions
from prunetrain.methods.studies.curves import base_value, curve_scalars, resumable_curve, within
from prunetrain.methods.studies.evaluation import Metric
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import StudyOutputs
from prunetrain.utils.plots import curves_figure
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_positive_float


def per_kind_curves(model: nn.Module, metric: Metric, batches: Iterable, *, key: str = "value",
                    fractions: Sequence[float] = DEFAULT_FRACTIONS,
                    higher_is_better: bool = True, threshold: float = 0.5, out_dir: str | Path | None = None,
                    args: Mapping | None = None, after_unit: AfterUnit | None = None) -> dict:
    """Michel §5 / Fig. 4: pruning only one attention kind at a time (e.g. encoder self, decoder self, cross), the
    fraction counting that kind's heads, in importance order (one-shot importance of the full model); which kind is
    most sensitive (`most_sensitive`) is the one leaving the threshold first (ties: the worst mean
    metric over the fractions). Writes `per_kind_curves.json`, `.png`, TensorBoard.

    Args:
        model: the model (with more than one attention kind).
        metric: `metric(model) -> float | dict`.
        batches: batches for importance.
        key: the entry of a dict-valued metric.
        fractions: shares of one kind's heads to prune.
        higher_is_better: False for a loss.
        threshold: the tolerated loss of metric for `within_threshold`.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metric and batches; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
    """
    fractions = check_fractions(fractions)
    check_positive_float("threshold", threshold, allow_zero=True)
    kinds = list(find_heads(model).kinds)
    if len(kinds) < 2:
        raise ValueError(f"model: has one attention kind ({', '.join(kinds) or 'none'}); per-kind curves need an "
                         f"encoder-decoder model with several.")
    journal = Journal(out_dir, "per_kind_curves", {"study": "per-kind", "key": key, "fractions": fractions,
                                                   "layout": layout_args(model), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    ranking = Ranking(batches=list(batches))
    curves = {kind: resumable_curve(model, metric, key, journal, kind, fractions, after_unit, ranking,
                                    HeadScope(scope="kind", kinds=[kind]))
              for kind in bar(kinds, total=len(kinds), desc="per-kind curves", unit="kind")}
    base = base_value(model, metric, key, journal, curves, after_unit)
    result = journal.finish({"study": "per-kind", "metric": key, "curves": curves,
                             "summary": _summary(curves, fractions, base, threshold, higher_is_better),
                             "seconds": time.perf_counter() - start})
    out = StudyOutputs(out_dir, "per-kind")
    curve_scalars(out, curves)
    series = {k: ([p["fraction"] for p in c["points"]], [p["value"] for p in c["points"]]) for k, c in curves.items()}
    out.figure(curves_figure(series, ylabel=key, title="pruning one attention kind (% of that kind's heads)"),
               "per_kind_curves.png")
    out.close()
    return result


def _summary(curves: Mapping[str, dict], fractions: list[float], base: float, threshold: float,
             higher_is_better: bool) -> dict:
    """Per kind the largest fraction within `threshold` and the mean metric; the most sensitive kind."""
    summary = {"base": base, "threshold": threshold,
               "within_threshold": {k: within(fractions, [p["value"] for p in c["points"]], base, threshold,
                                              higher_is_better) for k, c in curves.items()}}
    sign = 1 if higher_is_better else -1
    mean = {k: sum(p["value"] for p in c["points"]) / len(c["points"]) for k, c in curves.items()}
    summary["mean_value"] = mean
    # the first kind to leave the threshold; among equals, the one with the worst mean metric over the fractions
    summary["most_sensitive"] = min(curves, key=lambda k: (summary["within_threshold"][k], sign * mean[k]))
    return summary


__all__ = ["per_kind_curves"]
