"""The small pieces every comparison table shares: a run's seed, mean ± sd over seeds, a statistic's text, a Markdown
cell, and the name of a run's test translations file."""

from __future__ import annotations

import statistics

TRANSLATIONS_FILE = "test_translations.json"


def cell(text) -> str:
    """`text` as one Markdown table cell: a `|` in a run's name is escaped so that it does not split the row."""
    return str(text).replace("|", "\\|")


def run_seed(results: dict) -> int | None:
    return ((results.get("recipe") or {}).get("train") or {}).get("seed")


def mean_sd(values: list[float | None]) -> dict:
    """{"mean", "sd" (sample, n − 1; None for one value), "n", "values"} over the values that are not None."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "sd": None, "n": 0, "values": []}
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values), "values": values}


def fmt_stat(stat: dict, digits: int = 2, scale: float = 1.0) -> str:
    """"mean ± sd" of a `mean_sd` (the mean alone for one value, "" for none)."""
    if stat["mean"] is None:
        return ""
    mean = f"{stat['mean'] / scale:.{digits}f}"
    return mean if stat["sd"] is None else f"{mean} ± {stat['sd'] / scale:.{digits}f}"
