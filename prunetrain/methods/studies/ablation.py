"""Michel §3.2 (Table 1 / Fig. 1): the metric with each head alone removed, as a change Δ from the full model.

`ablation_rows` is the measurement (one saved unit per masked evaluation) that §3.4 repeats on two datasets;
`ablation_units` turns a finished `ablate_each_head` result back into those units, so §3.4 can reuse it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.engine.mask import HeadMask
from prunetrain.methods.significance import DEFAULT_ALPHA, DEFAULT_SAMPLES
from prunetrain.methods.studies.evaluation import Metric, eval_mode
from prunetrain.methods.studies.journal import AfterUnit, Journal, layout_args
from prunetrain.methods.studies.outputs import StudyOutputs
from prunetrain.methods.studies.paired_test import PairedTest, significance_counts
from prunetrain.methods.studies.tables import ablation_table
from prunetrain.utils.plots import pyplot
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_positive_float


def ablation_rows(model, metric, key, journal: Journal, prefix: str, desc: str, after_unit,
                  test: PairedTest) -> tuple[float, list]:
    """Base value and one row per head (`value`, `delta`, `p_value`), each masked evaluation a saved unit."""
    layout = find_heads(model)
    base_unit = f"{prefix}base"
    units = [(base_unit, None)] + [(f"{prefix}{site.name}/{head}", (site, head))
                                   for site in layout for head in range(site.num_heads)]
    for unit, spec in bar(units, total=len(units), desc=desc, unit="eval"):
        if journal.done(unit):
            continue
        mask = None if spec is None else HeadMask.from_heads(model, {spec[0].name: [spec[1]]})
        value = test.measure(model, metric, key, journal, unit, base_unit, mask)
        if after_unit is not None:
            after_unit(unit, value)
    base = journal.units[base_unit]
    rows = []
    for unit, spec in units[1:]:
        site, head = spec
        value = journal.units[unit]
        rows.append({"site": site.name, "kind": site.kind, "layer": site.layer, "head": head, "value": value,
                     "delta": value - base, "p_value": test.p_value(journal, unit)})
    return base, rows


def ablation_units(ablation: Mapping, layout, prefix: str, test: PairedTest, metric: Metric) -> dict[str, Any]:
    """The units of `ablation_rows` (`<prefix>base`, `<prefix><site>/<head>` and their p-values `#p`) from an
    `ablate_each_head` result; refused when this study tests significance and the ablation was not tested alike."""
    rows = ablation.get("heads") if isinstance(ablation, Mapping) else None
    if not isinstance(rows, list) or not isinstance(ablation.get("base"), (int, float)):
        raise ValueError("ablation: not an ablate_each_head result (no 'base' and 'heads').")
    wanted, made = test.describe(metric), (ablation.get("summary") or {}).get("significance")
    if wanted is not None and (made or {}).get("samples") != wanted["samples"]:
        how = f"with {made.get('samples')} bootstrap resamples" if made else "without a significance test"
        raise ValueError(f"ablation: it was made {how} and this study tests with {wanted['samples']} resamples; "
                         f"make it again with the same test.")
    have = {(r.get("site"), r.get("head")): r for r in rows if isinstance(r, Mapping)}
    units: dict[str, Any] = {f"{prefix}base": float(ablation["base"])}
    for site in layout:
        for head in range(site.num_heads):
            row = have.get((site.name, head), {})
            if not isinstance(row.get("value"), (int, float)):
                raise ValueError(f"ablation: holds no value for head {head} of site {site.name!r}; it was computed "
                                 f"for another model layout.")
            if wanted is not None:
                units[f"{prefix}{site.name}/{head}#p"] = row.get("p_value")
            units[f"{prefix}{site.name}/{head}"] = float(row["value"])
    return units


def ablate_each_head(model: nn.Module, metric: Metric, *, key: str = "value", higher_is_better: bool = True,
                     threshold: float = 0.5, out_dir: str | Path | None = None, args: Mapping | None = None,
                     after_unit: AfterUnit | None = None, bootstrap_samples: int = DEFAULT_SAMPLES,
                     alpha: float = DEFAULT_ALPHA) -> dict:
    """Michel §3.2: remove one head at a time; `delta = metric(without head) − metric(full)`, and with a metric
    that gives per-sentence statistics its paired bootstrap `p_value` (significant when p < alpha, as the
    paper's Table 1 marks at p < 0.01).

    Cost: 1 + (number of heads) evaluations of the metric. Writes `ablation.json`, `ablation.md` (Table 1),
    `ablation_hist.png` and a TensorBoard entry (Δ per head, in layout order).

    Args:
        model: the model.
        metric: `metric(model) -> float | dict`.
        key: the entry of a dict-valued metric.
        higher_is_better: False for a loss (an improvement is then a negative Δ).
        threshold: |Δ| above this counts as a change (0.5 BLEU in the paper's discussion).
        out_dir: where the JSON, figure and TensorBoard events go (None: nothing written, no resume).
        args: the caller's settings that determine the metric (e.g. data, sentences, beams); saved and compared
            on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
        bootstrap_samples: resamples of the significance test (0: no test).
        alpha: the test's level.
    """
    check_positive_float("threshold", threshold, allow_zero=True)
    test = PairedTest(bootstrap_samples, alpha)
    journal = Journal(out_dir, "ablation", {"study": "ablate", "key": key, "layout": layout_args(model),
                                            **test.args([metric]), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    was_training = eval_mode(model)
    try:
        base, rows = ablation_rows(model, metric, key, journal, "", "ablate", after_unit, test)
    finally:
        model.train(was_training)
    summary = {**_ablation_summary([r["delta"] for r in rows], threshold, higher_is_better),
               **significance_counts(rows, test, metric, 1 if higher_is_better else -1)}
    result = journal.finish({"study": "ablate", "metric": key, "base": base, "heads": rows, "summary": summary,
                             "seconds": time.perf_counter() - start})
    _write_ablation_outputs(result, out_dir)
    return result


def _ablation_summary(deltas: list[float], threshold: float, higher_is_better: bool) -> dict:
    """How many heads change the metric by more than `threshold`, for the worse, for the better; Δ statistics."""
    sign = 1 if higher_is_better else -1
    return {"num_heads": len(deltas), "mean_delta": sum(deltas) / max(1, len(deltas)),
            "min_delta": min(deltas, default=0.0), "max_delta": max(deltas, default=0.0), "threshold": threshold,
            "num_changed": sum(abs(d) > threshold for d in deltas),
            "num_worse": sum(sign * d < -threshold for d in deltas),
            "num_improving": sum(sign * d > 0 for d in deltas),
            "num_improving_beyond_threshold": sum(sign * d > threshold for d in deltas)}


def _write_ablation_outputs(result: Mapping, out_dir: str | Path | None) -> None:
    """`ablation.md` (Table 1), the Δ per head in TensorBoard and the histogram `ablation_hist.png`."""
    key, base, summary = result["metric"], result["base"], result["summary"]
    threshold, deltas = summary["threshold"], [r["delta"] for r in result["heads"]]
    out = StudyOutputs(out_dir, "ablate")
    out.text("ablation.md", ablation_table(result), encoding="utf-8")
    for i, d in enumerate(deltas):
        out.scalar("delta", d, i)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist(deltas, bins=min(30, max(5, len(deltas) // 3)), color="#4477aa")
    ax.axvline(0, color="k", lw=0.8)
    for x in (-threshold, threshold):
        ax.axvline(x, color="#aa3377", lw=0.8, ls="--")
    ax.set_xlabel(f"{key} change when the head alone is removed")
    ax.set_ylabel("heads")
    ax.set_title(f"ablating each head (base {key} {base:.2f}; |Δ| > {threshold:g}: {summary['num_changed']} "
                 f"of {len(deltas)})", fontsize=9)
    fig.tight_layout()
    out.figure(fig, "ablation_hist.png")
    out.close()


__all__ = ["ablate_each_head", "ablation_rows", "ablation_units"]
