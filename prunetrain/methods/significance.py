"""Paired bootstrap resampling: is the difference between two systems' corpus scores more than sampling noise?

Michel et al. (2019) mark an ablation's change as significant by a paired bootstrap test (p < 0.01). A corpus
metric such as BLEU is not a mean of per-sentence scores, but it is a function of per-sentence statistics summed
over the corpus (BLEU: hypothesis and reference lengths, matched and total n-grams for n = 1…4). So both systems
are scored on the same B resamples of the sentences (drawn with replacement, the pairing), and

    δ = S(Σ_i b'_i) − S(Σ_i a_i),     δ_b = S(Σ_{i∈I_b} b'_i) − S(Σ_{i∈I_b} a_i)   (b = 1…B),

the two-sided p-value is the share of resamples whose difference, shifted to the null hypothesis of no
difference, is at least as far from 0 as the observed one (Koehn 2004; Berg-Kirkpatrick et al. 2012, §2):

    p = (1 + #{b : |δ_b − δ| ≥ |δ|}) / (B + 1).

Identical systems get p = 1. The resamples depend only on the number of sentences and `seed`, so every
comparison against one base in a study uses the same B resamples.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

ScoreFromStats = Callable[[np.ndarray], float]
"""The corpus metric from per-sentence statistics summed over the corpus (a 1-d array)."""

SENTENCE_STATS = "sentence_stats"
"""The entry of a metric's dict that holds per-sentence statistics; such a metric carries `score_from_stats`."""
DEFAULT_SAMPLES = 1000
DEFAULT_ALPHA = 0.01


def significant(p_value: float | None, alpha: float) -> bool:
    """Whether a tested change is significant at level `alpha` (p < alpha); an untested one (None) is not."""
    return p_value is not None and p_value < alpha


def resample_counts(num_sentences: int, samples: int, seed: int) -> np.ndarray:
    """How often each sentence is drawn in each resample: an int array (samples, num_sentences), rows summing to
    `num_sentences`."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, num_sentences, size=(samples, num_sentences))
    flat = (np.arange(samples)[:, None] * num_sentences + drawn).ravel()
    return np.bincount(flat, minlength=samples * num_sentences).reshape(samples, num_sentences)


def paired_bootstrap(base: Sequence[Sequence[float]], other: Sequence[Sequence[float]], score: ScoreFromStats, *,
                     samples: int = DEFAULT_SAMPLES, seed: int = 0) -> float:
    """Two-sided p-value that `other`'s corpus score differs from `base`'s only by chance (the module docstring's
    equation).

    Args:
        base: per-sentence statistics of the base system, one row per sentence.
        other: the same for the other system, on the same sentences in the same order.
        score: the corpus metric from summed statistics (e.g. `prunetrain.mt.evaluation.bleu_stats.bleu_from_stats`).
        samples: B, the number of resamples.
        seed: the resamples' seed.
    """
    a, b = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or len(a) == 0:
        raise ValueError(f"paired_bootstrap: need two equal-shaped (sentences, statistics) arrays, got "
                         f"{a.shape} and {b.shape}.")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples: {samples!r} is not allowed; expected a positive integer.")
    observed = score(b.sum(0)) - score(a.sum(0))
    counts = resample_counts(len(a), samples, seed).astype(np.float64)
    sums_a, sums_b = counts @ a, counts @ b
    deltas = np.array([score(sb) - score(sa) for sa, sb in zip(sums_a, sums_b)])
    # a tolerance so that float noise in equal scores cannot turn "as far from 0" into "farther"
    extreme = np.abs(deltas - observed) >= abs(observed) - 1e-9
    return float((1 + extreme.sum()) / (samples + 1))


__all__ = ["DEFAULT_ALPHA", "DEFAULT_SAMPLES", "SENTENCE_STATS", "ScoreFromStats", "paired_bootstrap", "resample_counts", "significant"]
