"""The small pieces every comparison table shares: a run's seed, its teacher's FLOPs, mean ± sd over seeds, a
statistic's text, a Markdown cell, and the name of a run's test translations file."""

from __future__ import annotations

import statistics

TRANSLATIONS_FILE = "test_translations.json"


def cell(text) -> str:
    """`text` as one Markdown table cell: a `|` in a run's name is escaped so that it does not split the row."""
    return str(text).replace("|", "\\|")


def run_seed(results: dict) -> int | None:
    return ((results.get("recipe") or {}).get("train") or {}).get("seed")


def teacher_flops(results: dict) -> float | None:
    """The teacher's FLOPs beside a run's training FLOPs: its forwards on the training batches (word-level
    distillation, counted) plus its translations of the training sources (sequence-level, estimated); None for a
    run without a teacher."""
    forward = (results.get("distillation") or {}).get("teacher_forward_flops")
    translations = (results.get("sequence_distillation") or {}).get("generation_flops_estimate")
    if forward is None and translations is None:
        return None
    return (forward or 0) + (translations or 0)


def total_flops(results: dict) -> float | None:
    """A run's training FLOPs plus its teacher's (`teacher_flops`, 0 without a teacher): what a budget that counts
    the teacher's work is measured in; None when the run recorded no training FLOPs."""
    train = results.get("train_flops")
    return None if train is None else train + (teacher_flops(results) or 0)


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
