"""The interleaved timing loop (`alternate`: every round runs each callable once, the order rotating from round to
round) and the statistics of its measurements (`summarize`, `compare_times`)."""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from prunetrain.utils.validate import check_choice, check_int

ORDERS = ("abba", "abab")
"""`abba`: the order rotates every round (AB, BA, AB, ...); `abab`: one order (AB, AB, ...)."""


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summarize(values: Sequence[float]) -> dict:
    """Median, quartiles, IQR, min, max and n of a list of measurements."""
    if not values:
        raise ValueError("values: empty; expected at least one measurement.")
    s = sorted(float(v) for v in values)
    q1, q3 = _quantile(s, 0.25), _quantile(s, 0.75)
    return {"n": len(s), "median": statistics.median(s), "q1": q1, "q3": q3, "iqr": q3 - q1,
            "min": s[0], "max": s[-1]}


def compare_times(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """Speedup of B over A from paired times (pair i = round i): ratio of medians (the headline), median and
    quartiles of the per-pair ratios, and the ratio of minima (other processes only ever add time, so on a shared
    machine the fastest run of each is the least disturbed one; with few runs it is itself noisy)."""
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError(f"times_a, times_b: need the same non-zero number of paired runs, got "
                         f"{len(times_a)} and {len(times_b)}.")
    pair = [a / b for a, b in zip(times_a, times_b)]
    ps = summarize(pair)
    return {
        "speedup": statistics.median(times_a) / statistics.median(times_b),
        "speedup_min": min(times_a) / min(times_b),
        "speedup_pair_median": ps["median"],
        "speedup_pair_q1": ps["q1"],
        "speedup_pair_q3": ps["q3"],
        "speedup_pairs": pair,
    }


@dataclass
class Alternation:
    """Wall times of interleaved runs: `times[label]` (one per timed round) and the executed order of each round."""

    labels: list[str]
    times: dict[str, list[float]]
    order: list[list[str]]
    warmup_order: list[list[str]]
    cpu_times: dict[str, list[float]] = field(default_factory=dict)

    def order_string(self) -> str:
        """The executed order, one group per round, arms as letters in label order: `AB BA AB` (A = first label)."""
        letter = {label: chr(ord("A") + i) if i < 26 else f"[{label}]" for i, label in enumerate(self.labels)}
        return " ".join("".join(letter[label] for label in r) for r in self.order)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(
    fns: Mapping[str, Callable[[], Any]],
    warmup: int = 1,
    repeats: int = 5,
    order: str = "abba",
    device: torch.device | str | None = None,
    between: Callable[[], Any] | None = None,
) -> Alternation:
    """Time several callables interleaved: `warmup` untimed rounds, then `repeats` timed rounds.

    Every round calls each function once. With `order="abba"` round r runs the labels rotated by r (two arms: AB,
    BA, AB, ...; three: ABC, BCA, CAB, ...) so that no arm is always first; `"abab"` keeps one order. Wall time
    (`time.perf_counter`) around each call, with CUDA synchronisation when `device` is a CUDA device; the process
    CPU time of the call (`time.process_time`, all threads) is recorded too: on a shared machine `cpu / wall`
    below the thread count shows the call did not have the cores to itself. `between()` (untimed) runs before
    every call, e.g. to reset state.

    Args:
        fns: label -> callable without arguments.
        warmup: untimed rounds.
        repeats: timed rounds.
        order: "abba" (rotate every round) or "abab".
        device: synchronise this CUDA device around each call.
        between: untimed callable run before every call.
    """
    check_choice("order", order, ORDERS)
    warmup = check_int("warmup", warmup, 0)
    repeats = check_int("repeats", repeats, 1)
    if not fns:
        raise ValueError("fns: empty; expected at least one callable.")
    labels = list(fns)
    dev = torch.device(device) if device is not None else None
    times: dict[str, list[float]] = {label: [] for label in labels}
    cpu_times: dict[str, list[float]] = {label: [] for label in labels}
    rounds: list[list[str]] = []
    warm: list[list[str]] = []
    gc_was_enabled = gc.isenabled()
    try:
        for r in range(warmup + repeats):
            timed_index = r - warmup if r >= warmup else r  # timed rounds start with the given order
            k = timed_index % len(labels) if order == "abba" else 0
            round_labels = labels[k:] + labels[:k]
            gc.collect()  # once per round; the collector is off during each timed call
            for label in round_labels:
                if between is not None:
                    between()
                gc.disable()
                _sync(dev)
                cpu_start = time.process_time()
                start = time.perf_counter()
                fns[label]()
                _sync(dev)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu_start
                if gc_was_enabled:
                    gc.enable()
                if r >= warmup:
                    times[label].append(elapsed)
                    cpu_times[label].append(cpu)
            (warm if r < warmup else rounds).append(round_labels)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Alternation(labels=labels, times=times, order=rounds, warmup_order=warm, cpu_times=cpu_times)


__all__ = ["ORDERS", "Alternation", "alternate", "compare_times", "summarize"]
