"""Michel's significance marks for the studies: each masked evaluation against the study's base evaluation by a
paired bootstrap test (`prunetrain.methods.significance`), recorded in the study's journal."""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import nn

from prunetrain.engine.mask import HeadMask
from prunetrain.methods.curve import metric_value
from prunetrain.methods.significance import (DEFAULT_ALPHA, DEFAULT_SAMPLES, SENTENCE_STATS, paired_bootstrap,
                                             significant)
from prunetrain.methods.studies.evaluation import Metric, evaluate
from prunetrain.methods.studies.journal import Journal
from prunetrain.utils.validate import check_int, check_level


class PairedTest:
    """Michel's significance marks: each masked evaluation against the study's base evaluation by a paired
    bootstrap test (`prunetrain.methods.significance`), when the metric gives per-sentence statistics (it carries
    `score_from_stats`, e.g. `bleu_metric(..., sentence_stats=True)`); otherwise every p-value is None.

    In the journal, a base unit `U` is preceded by `U#stats` (its per-sentence statistics) and a masked unit `U` by
    `U#p` (its p-value), so a unit that is done has what belongs to it.

    Args:
        samples: bootstrap resamples B (0: no test).
        alpha: a change is significant when p < alpha.
    """

    def __init__(self, samples: int = DEFAULT_SAMPLES, alpha: float = DEFAULT_ALPHA):
        self.samples = check_int("bootstrap_samples", samples, 0)
        self.alpha = check_level("alpha", alpha)

    def enabled(self, metric: Metric) -> bool:
        return self.samples > 0 and callable(getattr(metric, "score_from_stats", None))

    def args(self, metrics: Sequence[Metric]) -> dict:
        """What the journal must match on resume: the resamples (None where no metric can be tested)."""
        return {"bootstrap_samples": self.samples if any(self.enabled(m) for m in metrics) else None}

    def measure(self, model: nn.Module, metric: Metric, key: str, journal: Journal, unit: str, base_unit: str,
                mask: HeadMask | None) -> float:
        """Evaluate (masked with `mask`, or the base when `unit == base_unit`) and record the unit."""
        result = evaluate(model, metric, mask)
        value = metric_value(result, key)[0]
        if self.enabled(metric):
            stats = result.get(SENTENCE_STATS) if isinstance(result, Mapping) else None
            if stats is None:
                raise ValueError(f"metric: it carries score_from_stats but returned no {SENTENCE_STATS!r}.")
            if unit == base_unit:
                journal.record(f"{unit}#stats", stats)
            else:
                journal.record(f"{unit}#p", paired_bootstrap(journal.units[f"{base_unit}#stats"], stats,
                                                             metric.score_from_stats, samples=self.samples))
        journal.record(unit, value)
        return value

    def p_value(self, journal: Journal, unit: str) -> float | None:
        return journal.units.get(f"{unit}#p")

    def significant(self, p: float | None) -> bool:
        return significant(p, self.alpha)

    def describe(self, metric: Metric) -> dict | None:
        """The test as recorded in a result (None when it did not run)."""
        if not self.enabled(metric):
            return None
        return {"test": "paired bootstrap (Koehn 2004), two-sided", "samples": self.samples, "alpha": self.alpha}


def significance_counts(rows: Sequence[Mapping], test: PairedTest, metric: Metric, sign: int) -> dict:
    """The test and, when it ran, how many rows changed the metric significantly: in all, for the worse, for the
    better (`sign` = +1 when higher is better)."""
    described = test.describe(metric)
    if described is None:
        return {"significance": None}
    hits = [r for r in rows if test.significant(r["p_value"])]
    return {"significance": described, "num_significant": len(hits),
            "num_significant_worse": sum(sign * r["delta"] < 0 for r in hits),
            "num_significant_improving": sum(sign * r["delta"] > 0 for r in hits)}


__all__ = ["PairedTest", "significance_counts"]
