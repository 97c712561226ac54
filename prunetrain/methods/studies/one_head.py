"""Michel §3.3 (Table 2): for each site (layer × kind), every head but the best one removed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.engine.mask import HeadMask
from prunetrain.methods.significance import DEFAULT_ALPHA, DEFAULT_SAMPLES
from prunetrain.methods.studies.evaluation import Metric, eval_mode
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import StudyOutputs, sites_figure
from prunetrain.methods.studies.paired_test import PairedTest, significance_counts
from prunetrain.methods.studies.tables import one_head_table
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_positive_float


def best_from_ablation(ablation: Mapping, layout, higher_is_better: bool) -> dict[str, int]:
    """Per site, the head whose removal alone hurts most (the most important one)."""
    rows = ablation.get("heads") if isinstance(ablation, Mapping) else None
    if not isinstance(rows, list):
        raise ValueError("ablation: not an ablate_each_head result (no 'heads' list).")
    have = {(r.get("site"), r.get("head")): r.get("delta") for r in rows if isinstance(r, Mapping)}
    best = {}
    for site in layout:
        if site.num_heads == 0:
            continue
        deltas = {h: have.get((site.name, h)) for h in range(site.num_heads)}
        if any(not isinstance(d, (int, float)) for d in deltas.values()):
            raise ValueError(f"ablation: holds no delta for every head of site {site.name!r}; it was computed for "
                             f"another model layout.")
        best[site.name] = min(deltas, key=lambda h: deltas[h] if higher_is_better else -deltas[h])
    return best


def keep_one_head_per_layer(model: nn.Module, metric: Metric, *, key: str = "value",
                            ablation: Mapping | None = None, higher_is_better: bool = True, threshold: float = 0.5,
                            out_dir: str | Path | None = None, args: Mapping | None = None,
                            after_unit: AfterUnit | None = None, bootstrap_samples: int = DEFAULT_SAMPLES,
                            alpha: float = DEFAULT_ALPHA) -> dict:
    """Michel §3.3 / Table 2: for each site, remove every head but one and evaluate (the other sites are full).
    The head kept is the best one: with `ablation` (an `ablate_each_head` result) the head whose removal alone
    hurts most (one evaluation per site), else the best of trying each head as the one kept. With a metric that
    gives per-sentence statistics each site's change has a paired bootstrap `p_value` (as `ablate_each_head`).

    Writes `one_head_per_layer.json`, `.md` (a table), `.png` (Δ per site) and a TensorBoard entry.

    Args:
        model: the model.
        metric: `metric(model) -> float | dict`.
        key: the entry of a dict-valued metric.
        ablation: an `ablate_each_head` result to pick the best head from.
        higher_is_better: False for a loss.
        threshold: a site "survives" with one head when its Δ is no worse than −threshold.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metric; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
        bootstrap_samples: resamples of the significance test (0: no test).
        alpha: the test's level.
    """
    check_positive_float("threshold", threshold, allow_zero=True)
    test = PairedTest(bootstrap_samples, alpha)
    layout = find_heads(model)
    chosen = best_from_ablation(ablation, layout, higher_is_better) if ablation is not None else None
    journal = Journal(out_dir, "one_head_per_layer",
                      {"study": "one-head", "key": key, "layout": layout_args(model), "from_ablation": chosen,
                       **test.args([metric]), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    sites = [site for site in layout if site.num_heads > 0]
    _evaluate_kept_heads(model, metric, key, journal, sites, chosen, test, after_unit)
    base = journal.units["base"]
    rows = _site_rows(journal, sites, chosen, base, threshold, higher_is_better, test)
    summary = {"num_sites": len(rows), "threshold": threshold, "num_surviving": sum(r["survives"] for r in rows),
               "head_choice": "ablation" if chosen else "tried each",
               **significance_counts(rows, test, metric, 1 if higher_is_better else -1)}
    result = journal.finish({"study": "one-head", "metric": key, "base": base, "layers": rows, "summary": summary,
                             "seconds": time.perf_counter() - start})
    out = StudyOutputs(out_dir, "one-head")
    out.text("one_head_per_layer.md", one_head_table(rows, key, base, threshold))
    for i, r in enumerate(rows):
        out.scalar("delta", r["delta"], i)
    out.figure(sites_figure(rows, key, f"only the best head kept in one site (base {key} {base:.2f})"),
               "one_head_per_layer.png")
    out.close()
    return result


def _candidates(site, chosen: dict | None):
    """The heads tried as the one kept in `site`: the ablation's best, or every head."""
    return [chosen[site.name]] if chosen else range(site.num_heads)


def _evaluate_kept_heads(model, metric, key, journal: Journal, sites, chosen, test: PairedTest, after_unit) -> None:
    """The base evaluation and, per site and candidate head, the model with only that head kept in the site (each a
    saved unit `<site>/keep<head>`)."""
    units = [("base", None, None)] + [(f"{site.name}/keep{h}", site, h) for site in sites
                                      for h in _candidates(site, chosen)]
    was_training = eval_mode(model)
    try:
        for unit, site, head in bar(units, total=len(units), desc="one head per layer", unit="eval"):
            if journal.done(unit):
                continue
            mask = None if site is None else HeadMask.from_heads(
                model, {site.name: [h for h in range(site.num_heads) if h != head]})
            value = test.measure(model, metric, key, journal, unit, "base", mask)
            if after_unit is not None:
                after_unit(unit, value)
    finally:
        model.train(was_training)


def _site_rows(journal: Journal, sites, chosen, base: float, threshold: float, higher_is_better: bool,
               test: PairedTest) -> list[dict]:
    """Per site the best kept head, its value, Δ, whether it survives within `threshold`, and its p-value."""
    sign = 1 if higher_is_better else -1
    rows = []
    for site in sites:
        tried = {h: journal.units[f"{site.name}/keep{h}"] for h in _candidates(site, chosen)}
        head = max(tried, key=lambda h: sign * tried[h])
        rows.append({"site": site.name, "kind": site.kind, "layer": site.layer, "kept_head": head,
                     "value": tried[head], "delta": tried[head] - base, "tried": {str(h): v for h, v in tried.items()},
                     "survives": sign * (tried[head] - base) >= -threshold,
                     "p_value": test.p_value(journal, f"{site.name}/keep{head}")})
    return rows


__all__ = ["best_from_ablation", "keep_one_head_per_layer"]
