"""Correlations of two series (Michel §3.4 compares the heads' effects on two datasets with them)."""

from __future__ import annotations

import math
from typing import Sequence


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation r = cov(a, b) / (σ_a σ_b) (NaN when either sequence is constant)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"pearson: need two sequences of the same length >= 2, got {len(a)} and {len(b)}.")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    var = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return cov / var if var else float("nan")


def defined(correlation: float | None) -> float | None:
    """A correlation for JSON: None where it is undefined (NaN: one series is constant)."""
    return None if correlation is None or math.isnan(correlation) else correlation


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson's r of the ranks (average ranks for ties)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"spearman: need two sequences of the same length >= 2, got {len(a)} and {len(b)}.")

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    return pearson(ranks(list(a)), ranks(list(b)))


__all__ = ["defined", "pearson", "spearman"]
