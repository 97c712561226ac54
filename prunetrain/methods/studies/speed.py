"""Michel §4.3: the speed of the shrunk model at each pruning fraction against the full model
(`prunetrain.bench.benchmark`), beside the paper's +17.5 % at 50 % (BERT)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from torch import nn

from prunetrain.methods.curve import check_fractions
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import StudyOutputs, fraction_axes
from prunetrain.methods.studies.tables import speed_table
from prunetrain.utils.plots import pyplot
from prunetrain.utils.progress import bar

PAPER_SPEEDUP_AT_HALF = 1.175
"""Michel et al. §4.3 / Table 4: up to +17.5 % inference speed with 50 % of BERT's heads pruned (larger batches)."""

PAPER = {"fraction": 0.5, "speedup": PAPER_SPEEDUP_AT_HALF,
         "what": "Michel et al. §4.3 Table 4: BERT on MNLI, up to +17.5 % with 50 % of heads pruned"}


def speed_study(model: nn.Module, batches: Iterable, *, fractions: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6,
                0.7, 0.8, 0.9), config=None, out_dir: str | Path | None = None, args: Mapping | None = None,
                after_unit: AfterUnit | None = None, **bench_options) -> dict:
    """Michel §4.3: the model shrunk (`shrink`) with the least important `fraction` of heads removed (one-shot
    importance from `batches`) against the full model, for each fraction, with `prunetrain.bench.benchmark`
    (interleaved runs; speed-up = median_full / median_pruned), beside the paper's +17.5 % at 50 % (BERT).
    Writes `speed.json`, `speed.md` (a table), `speed.png` and a TensorBoard entry. Timings need a quiet machine.

    Args:
        model: the full model (left unchanged; each pruned model is a copy).
        batches: batches for importance.
        fractions: shares of all heads to prune (0 is skipped: it is the baseline).
        config: a `BenchConfig` (default: its defaults), `bench_options` override its fields.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the importance batches; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
    """
    fractions, config, journal = _speed_journal(model, fractions, config, bench_options, out_dir, args)
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    _benchmark_fractions(model, batches, fractions, config, journal, after_unit)
    points = [journal.units[f"{f:g}"] for f in fractions]
    table = _speed_rows(points)
    result = journal.finish({"study": "speed", "fractions": fractions, "points": points, "table": table,
                             "paper": dict(PAPER), "seconds": time.perf_counter() - start})
    _write_speed_outputs(table, out_dir)
    return result


def _speed_journal(model: nn.Module, fractions: Sequence[float], config, bench_options: Mapping, out_dir,
                   args: Mapping | None):
    """The fractions > 0 (checked), the benchmark's `BenchConfig` and the study's journal (tagged with both)."""
    from prunetrain.bench import BenchConfig

    fractions = [f for f in check_fractions(fractions) if f > 0]
    if not fractions:
        raise ValueError("fractions: needs at least one fraction > 0 (0 is the full model, the baseline).")
    config = BenchConfig.with_options(config, bench_options)
    settings = {k: v for k, v in config.to_dict().items() if k not in ("inputs", "device")}
    settings = json.loads(json.dumps(settings, default=str))
    journal = Journal(out_dir, "speed", {"study": "speed", "fractions": fractions, "bench": settings,
                                         "layout": layout_args(model), **dict(args or {})})
    return fractions, config, journal


def _benchmark_fractions(model: nn.Module, batches: Iterable, fractions: list[float], config, journal: Journal,
                         after_unit: AfterUnit | None) -> None:
    """One-shot importance of the full model; then per fraction (a saved unit `<fraction>`) a shrunk copy timed
    against the full model."""
    from prunetrain.bench import benchmark
    from prunetrain.engine.shrink import shrink
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads

    scores = head_importance(model, list(batches))
    for fraction in bar(fractions, total=len(fractions), desc="speed", unit="model"):
        unit = f"{fraction:g}"
        if journal.done(unit):
            continue
        mask = select_heads(scores, fraction)
        pruned = copy.deepcopy(model)
        shrink(pruned, mask)
        label = f"pruned {round(100 * fraction)}%"
        bench = benchmark(model, pruned, config, label_b=label)
        journal.record(unit, {"fraction": fraction, "heads_kept": mask.num_kept, "heads_total": mask.num_heads,
                              "kept_per_kind": mask.kept_per_kind(), "rows": bench.rows, "meta": bench.meta})
        del pruned
        if after_unit is not None:
            after_unit(unit, journal.units[unit])


def _speed_rows(points: list[dict]) -> list[dict]:
    """One row per fraction and benchmark case: heads kept, the measured and FLOP-ideal speed-up, times in ms."""
    return [{"fraction": p["fraction"], "heads_kept": p["heads_kept"], "task": r["task"], "batch": r["batch"],
             "seq_len": r["seq_len"], "speedup": r["speedup"], "flop_ideal_speedup": r.get("flop_ideal_speedup"),
             "ms_full": 1e3 * r["a"]["median"], "ms_pruned": 1e3 * r["b"]["median"]}
            for p in points for r in p["rows"]]


def _write_speed_outputs(table: list[dict], out_dir) -> None:
    """`speed.md`, the speed-up per case in TensorBoard and `speed.png` (one line per case, the paper's point)."""
    out = StudyOutputs(out_dir, "speed")
    out.text("speed.md", speed_table(table, PAPER_SPEEDUP_AT_HALF))
    cases = list(dict.fromkeys((t["task"], t["batch"], t["seq_len"]) for t in table))
    for case in cases:
        for t in table:
            if (t["task"], t["batch"], t["seq_len"]) == case:
                out.scalar(f"speedup/{case[0]}_b{case[1]}_l{case[2]}", t["speedup"], round(100 * t["fraction"]))
    fig, ax = pyplot().subplots(figsize=(5.5, 3.8))
    for case in cases:
        rows = [t for t in table if (t["task"], t["batch"], t["seq_len"]) == case]
        ax.plot([100 * t["fraction"] for t in rows], [t["speedup"] for t in rows], marker="o", ms=3,
                label=f"{case[0]} {case[1]}×{case[2]}")
    ax.scatter([50], [PAPER_SPEEDUP_AT_HALF], marker="*", s=90, color="k", label="paper (BERT, Table 4)", zorder=5)
    ax.axhline(1, color="k", lw=0.6)
    fraction_axes(ax, "speed-up over the full model", "speed of the shrunk model")
    fig.tight_layout()
    out.figure(fig, "speed.png")
    out.close()


__all__ = ["PAPER_SPEEDUP_AT_HALF", "speed_study"]
