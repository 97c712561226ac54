"""Michel §3.4 (Fig. 2): the ablation Δ of every head on two datasets, and how well they agree (Pearson, Spearman)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Sequence

from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.methods.significance import DEFAULT_ALPHA, DEFAULT_SAMPLES, significant
from prunetrain.methods.studies.ablation import ablation_rows, ablation_units
from prunetrain.methods.studies.correlation import defined, pearson, spearman
from prunetrain.methods.studies.evaluation import Metric, eval_mode
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import KIND_COLORS, StudyOutputs
from prunetrain.methods.studies.paired_test import PairedTest
from prunetrain.utils.plots import pyplot


def _num(x: float | None) -> str:
    return "undefined (a constant series)" if x is None else f"{x:.2f}"


def cross_dataset(model: nn.Module, metrics: Sequence[Metric], *, key: str = "value",
                  names: Sequence[str] = ("dataset A", "dataset B"), ablation: Mapping | None = None,
                  out_dir: str | Path | None = None, args: Mapping | None = None,
                  after_unit: AfterUnit | None = None, bootstrap_samples: int = DEFAULT_SAMPLES,
                  alpha: float = DEFAULT_ALPHA) -> dict:
    """Michel §3.4 / Fig. 2: the ablation Δ of every head (as in `ablate_each_head`) on two datasets, and how well
    they agree: Pearson's r of the Δs and Spearman's ρ of their ranks (None when one series is constant). With
    metrics that give per-sentence statistics, each Δ has a paired bootstrap p-value, and the correlations are also
    given over the heads whose removal is significant on at least one dataset (where Δ is more than noise).
    Writes `cross_dataset.json`, `cross_dataset.png` (scatter, one point per head, significant ones ringed) and a
    TensorBoard entry.

    Args:
        model: the model.
        metrics: two metrics, one per dataset.
        key: the entry of dict-valued metrics.
        names: the datasets' names.
        ablation: an `ablate_each_head` result of the same model with the first metric: its values are used instead
            of evaluating them again (that it was made with the same metric is the caller's to check).
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metrics; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
        bootstrap_samples: resamples of the significance test (0: no test).
        alpha: the test's level.
    """
    if len(metrics) != 2 or len(names) != 2:
        raise ValueError(f"metrics: need exactly two metrics and two names, got {len(metrics)} and {len(names)}.")
    test = PairedTest(bootstrap_samples, alpha)
    reused = ablation_units(ablation, find_heads(model), "a:", test, metrics[0]) if ablation is not None else {}
    journal = Journal(out_dir, "cross_dataset", {"study": "cross-dataset", "key": key, "datasets": list(names),
                                                 "layout": layout_args(model), **test.args(metrics),
                                                 **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    for unit, value in reused.items():
        if not journal.done(unit):
            journal.record(unit, value)
    was_training = eval_mode(model)
    try:
        base_a, rows_a = ablation_rows(model, metrics[0], key, journal, "a:", f"ablate on {names[0]}", after_unit,
                                       test)
        base_b, rows_b = ablation_rows(model, metrics[1], key, journal, "b:", f"ablate on {names[1]}", after_unit,
                                       test)
    finally:
        model.train(was_training)
    a, b = [r["delta"] for r in rows_a], [r["delta"] for r in rows_b]
    heads = [{"site": ra["site"], "kind": ra["kind"], "layer": ra["layer"], "head": ra["head"],
              "delta_a": ra["delta"], "delta_b": rb["delta"], "p_a": ra["p_value"], "p_b": rb["p_value"]}
             for ra, rb in zip(rows_a, rows_b)]
    r, rho = defined(pearson(a, b)), defined(spearman(a, b))
    result = journal.finish({"study": "cross-dataset", "metric": key, "datasets": list(names),
                             "base": [base_a, base_b], "pearson": r, "spearman": rho, "num_heads": len(heads),
                             "significance": _significance(heads, test, metrics), "heads": heads,
                             "seconds": time.perf_counter() - start})
    write_cross_dataset_outputs(result, out_dir)
    return result


def _significance(heads: list[dict], test: PairedTest, metrics: Sequence[Metric]) -> dict | None:
    """With both metrics tested: how many heads are significant on either dataset, on both, and the correlations
    over the heads significant on either (None when a metric gives no per-sentence statistics)."""
    if test.describe(metrics[0]) is None or test.describe(metrics[1]) is None:
        return None
    sig_a, sig_b = ([test.significant(h[p]) for h in heads] for p in ("p_a", "p_b"))
    either = [h for h, x, y in zip(heads, sig_a, sig_b) if x or y]
    pair = ([h["delta_a"] for h in either], [h["delta_b"] for h in either])
    return {**test.describe(metrics[0]), "num_significant_a": sum(sig_a), "num_significant_b": sum(sig_b),
            "num_significant_both": sum(x and y for x, y in zip(sig_a, sig_b)),
            "num_significant_either": len(either),
            "pearson_significant_either": defined(pearson(*pair)) if len(either) > 2 else None,
            "spearman_significant_either": defined(spearman(*pair)) if len(either) > 2 else None}


def write_cross_dataset_outputs(result: Mapping, out_dir: str | Path | None) -> None:
    """The figure (`cross_dataset.png`: one point per head, coloured by kind, ringed when its change is significant
    on either dataset) and TensorBoard entries of a `cross_dataset` result; a pure function of the result."""
    out = StudyOutputs(out_dir, "cross-dataset")
    r, rho, key, names = result["pearson"], result["spearman"], result["metric"], result["datasets"]
    heads, significance = result["heads"], result.get("significance")
    out.scalar("pearson", r, 0)
    out.scalar("spearman", rho, 0)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.4, 4.2))
    for kind in dict.fromkeys(h["kind"] for h in heads):
        mine = [h for h in heads if h["kind"] == kind]
        ax.scatter([h["delta_a"] for h in mine], [h["delta_b"] for h in mine], s=12, alpha=0.75,
                   color=KIND_COLORS.get(kind), label=kind)
    title = f"ablating each head on two datasets\nPearson r = {_num(r)}, Spearman ρ = {_num(rho)}"
    if significance is not None:
        alpha = significance["alpha"]
        ringed = [h for h in heads if significant(h["p_a"], alpha) or significant(h["p_b"], alpha)]
        ax.scatter([h["delta_a"] for h in ringed], [h["delta_b"] for h in ringed], s=40, facecolors="none",
                   edgecolors="k", linewidths=0.8, label=f"p < {alpha:g} on either")
        title += (f"\nringed: p < {alpha:g} on either ({significance['num_significant_either']} heads, "
                  f"r = {_num(significance['pearson_significant_either'])})")
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlabel(f"{key} change, {names[0]}")
    ax.set_ylabel(f"{key} change, {names[1]}")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.figure(fig, "cross_dataset.png")
    out.close()


__all__ = ["cross_dataset", "write_cross_dataset_outputs"]
