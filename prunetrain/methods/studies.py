"""The studies of Michel et al. (2019), each a library function that returns JSON-able results and writes figures.

1. `ablate_each_head`         §3.2 Table 1 / Fig. 1: the metric with each head alone removed, as a change Δ from
                              the full model; how many heads change it by more than `threshold`, how many
                              significantly (`PairedTest`), how many improve it.
2. `keep_one_head_per_layer`  §3.3 Table 2: for each site (layer × kind), all heads but the best one removed.
3. `cross_dataset`            §3.4 Fig. 2: the ablation Δ of every head on two datasets, Pearson and Spearman.
4. `pruning_curves_study`     §4.2 Fig. 3: metric vs % heads pruned, importance order (re-estimated after every
                              step) against random order (mean and spread over seeds); the largest fraction whose
                              metric stays within `threshold` of the full model.
5. `per_kind_curves`          §5 Fig. 4: the same, pruning only one attention kind at a time.
6. `speed_study`              §4.3: the benchmark (`prunetrain.bench.benchmark`) of the shrunk model at each fraction.

`metric(model) -> float | dict` is any callable (see `prunetrain.methods.curve`: `loss_metric`, `accuracy_metric`,
or `prunetrain.mt.metrics.bleu_metric`); with a dict, `key` names the value to use. Higher is better unless
`higher_is_better=False` (a loss). A metric whose dict holds per-sentence statistics (`sentence_stats`) and that
carries `score_from_stats` (`bleu_metric(..., sentence_stats=True)`) gets every change of studies 1–3 tested by a
paired bootstrap (`prunetrain.methods.significance`), as the paper marks significance at p < 0.01.

Every study with an `out_dir` writes `<out_dir>/<name>.json`, PNG figures and TensorBoard events
(`<out_dir>/tensorboard`), shows a progress bar (`prunetrain.utils.progress`), and is **resumable**: each unit of
work (one masked evaluation, one curve point, one benchmark) is saved to `<name>.partial.json` as soon as it is
done; calling the study again with the same arguments skips the saved units and returns the same result (with a
finished `<name>.json` it returns that file's result without any work). Other arguments are refused (ValueError
naming them) rather than mixed with the saved units.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.engine.mask import HeadMask
from prunetrain.methods.curve import check_fractions, metric_value, pruning_curve
from prunetrain.methods.significance import (DEFAULT_ALPHA, DEFAULT_SAMPLES, SENTENCE_STATS, paired_bootstrap,
                                             significant)
from prunetrain.utils.plots import TensorBoardLog, curves_figure, pyplot
from prunetrain.utils.progress import bar
from prunetrain.utils.validate import check_int, check_level, check_positive_float

Metric = Callable[[nn.Module], Any]
AfterUnit = Callable[[str, Any], None]
PAPER_SPEEDUP_AT_HALF = 1.175
"""Michel et al. §4.3 / Table 4: up to +17.5 % inference speed with 50 % of BERT's heads pruned (larger batches)."""


# -------------------------------------------------------------------------------------------------------------------
# resumable record of the units of work
# -------------------------------------------------------------------------------------------------------------------
class Journal:
    """Units of a study's work saved as they finish (`<out_dir>/<name>.partial.json`), and the finished result
    (`<out_dir>/<name>.json`), both tagged with the study's arguments.

    Args:
        out_dir: the study's directory (None: nothing is saved, nothing resumes).
        name: the file stem.
        args: JSON-able arguments that determine the result; a saved run with other arguments is refused.
    """

    def __init__(self, out_dir: str | Path | None, name: str, args: Mapping[str, Any]):
        self.args = json.loads(json.dumps(dict(args)))
        self.units: dict[str, Any] = {}
        self.finished: dict | None = None
        self.out = Path(out_dir) if out_dir is not None else None
        if self.out is None:
            return
        self.partial = self.out / f"{name}.partial.json"
        self.final = self.out / f"{name}.json"
        for path in (self.final, self.partial):
            if not path.is_file():
                continue
            try:
                data = json.loads(path.read_text())
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ValueError(f"out_dir: {str(path)!r} is not valid JSON ({err.__class__.__name__}); delete it "
                                 f"to start again.") from err
            self._check_args(path, data.get("args"))
            if path == self.final:
                self.finished = data
                return
            self.units = dict(data.get("units", {}))

    def _check_args(self, path: Path, saved: Any) -> None:
        """A saved argument that is missing counts as None (a journal written before that argument existed)."""
        saved = saved if isinstance(saved, Mapping) else {}
        differ = sorted(k for k in set(saved) | set(self.args) if saved.get(k) != self.args.get(k))
        if not differ:
            return
        named = ", ".join(f"{k} (saved {saved.get(k)!r}, now {self.args.get(k)!r})" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ValueError(f"out_dir: {str(path)!r} holds a run with other arguments: {named}{more}; give another "
                         f"output directory, or the same arguments to resume it.")

    def done(self, unit: str) -> bool:
        return unit in self.units

    def record(self, unit: str, value: Any) -> None:
        self.units[unit] = value
        if self.out is not None:
            _write(self.partial, {"args": self.args, "units": self.units})

    def finish(self, result: dict) -> dict:
        result = {**result, "args": self.args}
        if self.out is not None:
            _write(self.final, result)
            self.partial.unlink(missing_ok=True)
        return result


def _write(path: Path, data) -> None:
    """Atomic JSON write (a temporary file renamed over `path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def _layout_args(model: nn.Module) -> list:
    return [[site.name, site.num_heads] for site in find_heads(model)]


def _evaluate(model: nn.Module, metric: Metric, mask: HeadMask | None = None) -> Any:
    """What the metric returns for the model (masked with `mask`), without gradients."""
    with torch.no_grad(), (mask.applied(model) if mask is not None else contextlib.nullcontext()):
        return metric(model)


def _measure(model: nn.Module, metric: Metric, key: str, mask: HeadMask | None = None) -> float:
    return metric_value(_evaluate(model, metric, mask), key)[0]


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
        result = _evaluate(model, metric, mask)
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


def _p_text(p: float | None) -> str:
    return "—" if p is None else f"{p:.3f}"


def _significance_counts(rows: Sequence[Mapping], test: PairedTest, metric: Metric, sign: int) -> dict:
    """The test and, when it ran, how many rows changed the metric significantly: in all, for the worse, for the
    better (`sign` = +1 when higher is better)."""
    described = test.describe(metric)
    if described is None:
        return {"significance": None}
    hits = [r for r in rows if test.significant(r["p_value"])]
    return {"significance": described, "num_significant": len(hits),
            "num_significant_worse": sum(sign * r["delta"] < 0 for r in hits),
            "num_significant_improving": sum(sign * r["delta"] > 0 for r in hits)}


class _Outputs:
    """PNG files and a TensorBoard log under one study directory (nothing when `out_dir` is None)."""

    def __init__(self, out_dir: str | Path | None, study: str):
        self.out = Path(out_dir) if out_dir is not None else None
        self.study = study
        self.tb = TensorBoardLog(self.out / "tensorboard") if self.out is not None else None

    def figure(self, fig, filename: str) -> None:
        if self.out is None:
            pyplot().close(fig)
            return
        self.out.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.out / filename, dpi=110)
        self.tb.figure(f"{self.study}/{Path(filename).stem}", fig, 0)  # closes the figure

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None and value is not None and math.isfinite(value):
            self.tb.scalar(f"{self.study}/{tag}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _ablation_rows(model, metric, key, journal: Journal, prefix: str, desc: str, after_unit,
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


def _eval_mode(model: nn.Module):
    was_training = model.training
    model.eval()
    return was_training


# -------------------------------------------------------------------------------------------------------------------
# §3.2: ablating one head
# -------------------------------------------------------------------------------------------------------------------
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
    journal = Journal(out_dir, "ablation", {"study": "ablate", "key": key, "layout": _layout_args(model),
                                            **test.args([metric]), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    was_training = _eval_mode(model)
    try:
        base, rows = _ablation_rows(model, metric, key, journal, "", "ablate", after_unit, test)
    finally:
        model.train(was_training)
    deltas = [r["delta"] for r in rows]
    sign = 1 if higher_is_better else -1
    summary = {"num_heads": len(rows), "mean_delta": sum(deltas) / max(1, len(deltas)),
               "min_delta": min(deltas, default=0.0), "max_delta": max(deltas, default=0.0), "threshold": threshold,
               "num_changed": sum(abs(d) > threshold for d in deltas),
               "num_worse": sum(sign * d < -threshold for d in deltas),
               "num_improving": sum(sign * d > 0 for d in deltas),
               "num_improving_beyond_threshold": sum(sign * d > threshold for d in deltas),
               **_significance_counts(rows, test, metric, sign)}
    result = journal.finish({"study": "ablate", "metric": key, "base": base, "heads": rows, "summary": summary,
                             "seconds": time.perf_counter() - start})
    out = _Outputs(out_dir, "ablate")
    if out.out is not None:
        (out.out / "ablation.md").write_text(ablation_table(result), encoding="utf-8")
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
                 f"of {len(rows)})", fontsize=9)
    fig.tight_layout()
    out.figure(fig, "ablation_hist.png")
    out.close()
    return result


def ablation_table(result: Mapping) -> str:
    """Michel Table 1 as Markdown from an `ablate_each_head` result: one grid per attention kind, a row per layer, a
    column per head, each cell the Δ of removing that head alone; cells beyond the result's threshold are bold, and
    with a significance test the significant ones (p < alpha) carry a dagger, as the paper marks them."""
    summary = result["summary"]
    threshold, test = summary["threshold"], summary.get("significance")
    marks = f"**bold**: |Δ| > {threshold:g}"
    if test:
        marks += (f"; †: significant, p < {test['alpha']:g} in a paired bootstrap test with {test['samples']} "
                  f"resamples — {summary['num_significant']} of {summary['num_heads']} heads")
    lines = [f"Base {result['metric']}: {result['base']:.2f}. Each cell: the change when that head alone is removed "
             f"({marks})."]
    rows = result["heads"]

    def cell(row) -> str:
        text = f"{row['delta']:+.2f}"
        text = f"**{text}**" if abs(row["delta"]) > threshold else text
        return text + "†" if test and significant(row.get("p_value"), test["alpha"]) else text

    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        heads = max(r["head"] for r in mine) + 1
        lines += ["", f"**{kind}**", "", "| layer | " + " | ".join(str(h) for h in range(heads)) + " |",
                  "|---|" + "---|" * heads]
        for layer in sorted(dict.fromkeys(r["layer"] for r in mine)):
            cells = {r["head"]: r for r in mine if r["layer"] == layer}
            lines.append(f"| {layer} | " + " | ".join(cell(cells[h]) if h in cells else "" for h in range(heads))
                         + " |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------------------------
# §3.3: all heads but one
# -------------------------------------------------------------------------------------------------------------------
def _ablation_units(ablation: Mapping, layout, prefix: str, test: PairedTest, metric: Metric) -> dict[str, Any]:
    """The units of `_ablation_rows` (`<prefix>base`, `<prefix><site>/<head>` and their p-values `#p`) from an
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


def _best_from_ablation(ablation: Mapping, layout, higher_is_better: bool) -> dict[str, int]:
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
    chosen = _best_from_ablation(ablation, layout, higher_is_better) if ablation is not None else None
    journal = Journal(out_dir, "one_head_per_layer",
                      {"study": "one-head", "key": key, "layout": _layout_args(model), "from_ablation": chosen,
                       **test.args([metric]), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    sites = [site for site in layout if site.num_heads > 0]
    units = [("base", None, None)] + [(f"{site.name}/keep{h}", site, h) for site in sites
                                      for h in ([chosen[site.name]] if chosen else range(site.num_heads))]
    was_training = _eval_mode(model)
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
    base = journal.units["base"]
    sign = 1 if higher_is_better else -1
    rows = []
    for site in sites:
        tried = {h: journal.units[f"{site.name}/keep{h}"]
                 for h in ([chosen[site.name]] if chosen else range(site.num_heads))}
        head = max(tried, key=lambda h: sign * tried[h])
        rows.append({"site": site.name, "kind": site.kind, "layer": site.layer, "kept_head": head,
                     "value": tried[head], "delta": tried[head] - base, "tried": {str(h): v for h, v in tried.items()},
                     "survives": sign * (tried[head] - base) >= -threshold,
                     "p_value": test.p_value(journal, f"{site.name}/keep{head}")})
    summary = {"num_sites": len(rows), "threshold": threshold, "num_surviving": sum(r["survives"] for r in rows),
               "head_choice": "ablation" if chosen else "tried each", **_significance_counts(rows, test, metric, sign)}
    result = journal.finish({"study": "one-head", "metric": key, "base": base, "layers": rows, "summary": summary,
                             "seconds": time.perf_counter() - start})
    out = _Outputs(out_dir, "one-head")
    if out.out is not None:
        lines = [f"| site | kind | layer | kept head | {key} | Δ | within {threshold:g} | p (paired bootstrap) |",
                 "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['site']} | {r['kind']} | {r['layer']} | {r['kept_head']} | {r['value']:.2f} | "
                  f"{r['delta']:+.2f} | {'yes' if r['survives'] else 'no'} | {_p_text(r['p_value'])} |" for r in rows]
        (out.out / "one_head_per_layer.md").write_text(f"Base {key}: {base:.2f}\n\n" + "\n".join(lines) + "\n")
    for i, r in enumerate(rows):
        out.scalar("delta", r["delta"], i)
    out.figure(_sites_figure(rows, key, f"only the best head kept in one site (base {key} {base:.2f})"),
               "one_head_per_layer.png")
    out.close()
    return result


KIND_COLORS = {"encoder_self": "#4477aa", "decoder_self": "#ee6677", "cross": "#228833", "self": "#4477aa"}


def _sites_figure(rows, key: str, title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * len(rows) + 2), 3.6))
    colors = [KIND_COLORS.get(r["kind"], "#999999") for r in rows]
    ax.bar(range(len(rows)), [r["delta"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), labels=[f"{r['kind']} {r['layer']}" for r in rows], rotation=90, fontsize=6)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel(f"{key} change")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# -------------------------------------------------------------------------------------------------------------------
# §3.4: two datasets
# -------------------------------------------------------------------------------------------------------------------
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
    reused = _ablation_units(ablation, find_heads(model), "a:", test, metrics[0]) if ablation is not None else {}
    journal = Journal(out_dir, "cross_dataset", {"study": "cross-dataset", "key": key, "datasets": list(names),
                                                 "layout": _layout_args(model), **test.args(metrics),
                                                 **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    for unit, value in reused.items():
        if not journal.done(unit):
            journal.record(unit, value)
    was_training = _eval_mode(model)
    try:
        base_a, rows_a = _ablation_rows(model, metrics[0], key, journal, "a:", f"ablate on {names[0]}", after_unit,
                                        test)
        base_b, rows_b = _ablation_rows(model, metrics[1], key, journal, "b:", f"ablate on {names[1]}", after_unit,
                                        test)
    finally:
        model.train(was_training)
    a, b = [r["delta"] for r in rows_a], [r["delta"] for r in rows_b]
    heads = [{"site": ra["site"], "kind": ra["kind"], "layer": ra["layer"], "head": ra["head"],
              "delta_a": ra["delta"], "delta_b": rb["delta"], "p_a": ra["p_value"], "p_b": rb["p_value"]}
             for ra, rb in zip(rows_a, rows_b)]
    r, rho = defined(pearson(a, b)), defined(spearman(a, b))
    significance = None
    if test.describe(metrics[0]) is not None and test.describe(metrics[1]) is not None:
        sig_a, sig_b = ([test.significant(h[p]) for h in heads] for p in ("p_a", "p_b"))
        either = [h for h, x, y in zip(heads, sig_a, sig_b) if x or y]
        pair = ([h["delta_a"] for h in either], [h["delta_b"] for h in either])
        significance = {**test.describe(metrics[0]), "num_significant_a": sum(sig_a), "num_significant_b": sum(sig_b),
                        "num_significant_both": sum(x and y for x, y in zip(sig_a, sig_b)),
                        "num_significant_either": len(either),
                        "pearson_significant_either": defined(pearson(*pair)) if len(either) > 2 else None,
                        "spearman_significant_either": defined(spearman(*pair)) if len(either) > 2 else None}
    result = journal.finish({"study": "cross-dataset", "metric": key, "datasets": list(names),
                             "base": [base_a, base_b], "pearson": r, "spearman": rho, "num_heads": len(heads),
                             "significance": significance, "heads": heads, "seconds": time.perf_counter() - start})
    write_cross_dataset_outputs(result, out_dir)
    return result


def write_cross_dataset_outputs(result: Mapping, out_dir: str | Path | None) -> None:
    """The figure (`cross_dataset.png`: one point per head, coloured by kind, ringed when its change is significant
    on either dataset) and TensorBoard entries of a `cross_dataset` result; a pure function of the result."""
    out = _Outputs(out_dir, "cross-dataset")
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


# -------------------------------------------------------------------------------------------------------------------
# §4 and §5: pruning curves
# -------------------------------------------------------------------------------------------------------------------
def _resumable_curve(model, metric, key, journal: Journal, name: str, fractions: list[float], after_unit,
                     **curve_kwargs) -> dict:
    """`pruning_curve` whose points are saved units: a saved point is not evaluated again (its mask still is
    computed, deterministically), a finished curve is not computed again."""
    if journal.done(f"curve:{name}"):
        return journal.units[f"curve:{name}"]
    calls = iter(fractions)

    def cached(m):
        unit = f"{name}@{next(calls):g}"
        if not journal.done(unit):
            value, details = metric_value(metric(m), key)
            journal.record(unit, {key: value, **details})
            if after_unit is not None:
                after_unit(unit, journal.units[unit])
        return journal.units[unit]

    curve = pruning_curve(model, cached, fractions=fractions, key=key, metric_name=key, **curve_kwargs).to_dict()
    for point in curve["points"]:
        point["seconds"] = None  # a resumed point has no time of its own: none is kept, so results compare equal
    journal.record(f"curve:{name}", curve)
    return curve


def within(fractions: Sequence[float], values: Sequence[float], base: float, threshold: float,
           higher_is_better: bool = True) -> float:
    """The largest fraction f such that the metric at f and at every smaller fraction is no worse than
    `base − threshold` (0.0 if already the first point is worse)."""
    sign = 1 if higher_is_better else -1
    best = 0.0
    for f, v in sorted(zip(fractions, values)):
        if sign * (v - base) < -threshold:
            break
        best = f
    return best


def _spread(curves: Sequence[dict]) -> dict:
    """Mean, standard deviation, min and max over curves, per fraction."""
    fractions = [p["fraction"] for p in curves[0]["points"]]
    out = {"fractions": fractions, "mean": [], "std": [], "min": [], "max": []}
    for i in range(len(fractions)):
        vals = [c["points"][i]["value"] for c in curves]
        mean = sum(vals) / len(vals)
        out["mean"].append(mean)
        out["std"].append(math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0)
        out["min"].append(min(vals))
        out["max"].append(max(vals))
    return out


def _base_value(model, metric, key, journal: Journal, curves: Mapping[str, dict], after_unit) -> float:
    """The full model's value: the curves' point at fraction 0 when there is one, else one saved evaluation."""
    for curve in curves.values():
        if curve["points"] and curve["points"][0]["fraction"] == 0:
            return curve["points"][0]["value"]
    if not journal.done("base"):
        journal.record("base", _measure(model, metric, key))
        if after_unit is not None:
            after_unit("base", journal.units["base"])
    return journal.units["base"]


def pruning_curves_study(model: nn.Module, metric: Metric, batches: Iterable, *, key: str = "value",
                         fractions: Sequence[float] = tuple(round(0.1 * i, 1) for i in range(10)),
                         random_seeds: Sequence[int] = (0, 1, 2), iterative: bool = True,
                         higher_is_better: bool = True, threshold: float = 0.5,
                         out_dir: str | Path | None = None, args: Mapping | None = None,
                         after_unit: AfterUnit | None = None) -> dict:
    """Michel §4.2 / Fig. 3: metric vs % of heads pruned — importance order (re-estimated on the pruned model after
    every step when `iterative`, as in the paper; the grid must then be evenly spaced from 0) against random order
    (one curve per seed; mean, std, min and max per fraction). For each order, `within_threshold` is the largest
    fraction up to which the metric stays within `threshold` of the full model (`within`).

    Writes `pruning_curves.json`, `pruning_curves.png` (importance, random mean ± spread) and a TensorBoard entry.

    Args:
        model: the model.
        metric: `metric(model) -> float | dict`.
        batches: batches for importance.
        key: the entry of a dict-valued metric.
        fractions: shares of all heads to prune.
        random_seeds: seeds of the random-order curves.
        iterative: re-estimate importance between fractions.
        higher_is_better: False for a loss.
        threshold: the tolerated loss of metric for `within_threshold`.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metric and batches; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
    """
    fractions = check_fractions(fractions)
    check_positive_float("threshold", threshold, allow_zero=True)
    seeds = [int(s) for s in random_seeds]
    journal = Journal(out_dir, "pruning_curves",
                      {"study": "curves", "key": key, "fractions": fractions, "seeds": seeds, "iterative": iterative,
                       "layout": _layout_args(model), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    batches = list(batches)
    specs = [("importance", dict(batches=batches, iterative=iterative))]
    specs += [(f"random_seed{s}", dict(order="random", seed=s)) for s in seeds]
    curves = {name: _resumable_curve(model, metric, key, journal, name, fractions, after_unit, **kw)
              for name, kw in bar(specs, total=len(specs), desc="pruning curves", unit="curve")}
    base = _base_value(model, metric, key, journal, curves, after_unit)
    randoms = [curves[f"random_seed{s}"] for s in seeds]
    spread = _spread(randoms) if randoms else None
    imp = curves["importance"]
    summary = {"base": base, "threshold": threshold,
               "importance_within_threshold": within(fractions, [p["value"] for p in imp["points"]], base,
                                                     threshold, higher_is_better),
               "random_mean_within_threshold": (within(fractions, spread["mean"], base, threshold, higher_is_better)
                                                if spread else None)}
    result = journal.finish({"study": "curves", "metric": key, "curves": curves, "random": spread,
                             "summary": summary, "seconds": time.perf_counter() - start})
    out = _Outputs(out_dir, "curves")
    for name, curve in curves.items():
        for p in curve["points"]:
            out.scalar(name, p["value"], round(100 * p["fraction"]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    xs = [100 * f for f in fractions]
    ax.plot(xs, [p["value"] for p in imp["points"]], marker="o", ms=3, label="importance" +
            (" (iterative)" if iterative else ""))
    if spread:
        ax.plot(xs, spread["mean"], marker="s", ms=3, label=f"random (mean of {len(seeds)})")
        ax.fill_between(xs, spread["min"], spread["max"], alpha=0.25, label="random (min–max)")
    ax.axhline(base - threshold if higher_is_better else base + threshold, color="k", lw=0.6, ls="--",
               label=f"full − {threshold:g}" if higher_is_better else f"full + {threshold:g}")
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(key)
    ax.set_title("iterative pruning: importance vs random order", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.figure(fig, "pruning_curves.png")
    out.close()
    return result


def per_kind_curves(model: nn.Module, metric: Metric, batches: Iterable, *, key: str = "value",
                    fractions: Sequence[float] = tuple(round(0.1 * i, 1) for i in range(10)),
                    higher_is_better: bool = True, threshold: float = 0.5, out_dir: str | Path | None = None,
                    args: Mapping | None = None, after_unit: AfterUnit | None = None) -> dict:
    """Michel §5 / Fig. 4: pruning only one attention kind at a time (e.g. encoder self, decoder self, cross), the
    fraction counting that kind's heads, in importance order (one-shot importance of the full model); which kind is
    most sensitive (`most_sensitive`) is the one leaving the threshold first (ties: the worst mean
    metric over the fractions). Writes `per_kind_curves.json`, `.png`, TensorBoard.

    Args:
        model: the model (with more than one attention kind).
        metric: `metric(model) -> float | dict`.
        batches: batches for importance.
        key: the entry of a dict-valued metric.
        fractions: shares of one kind's heads to prune.
        higher_is_better: False for a loss.
        threshold: the tolerated loss of metric for `within_threshold`.
        out_dir: where the files go (None: nothing written, no resume).
        args: the caller's settings that determine the metric and batches; saved and compared on resume.
        after_unit: called as `after_unit(unit, value)` after each unit is saved.
    """
    fractions = check_fractions(fractions)
    check_positive_float("threshold", threshold, allow_zero=True)
    kinds = list(find_heads(model).kinds)
    if len(kinds) < 2:
        raise ValueError(f"model: has one attention kind ({', '.join(kinds) or 'none'}); per-kind curves need an "
                         f"encoder-decoder model with several.")
    journal = Journal(out_dir, "per_kind_curves", {"study": "per-kind", "key": key, "fractions": fractions,
                                                   "layout": _layout_args(model), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
    batches = list(batches)
    curves = {kind: _resumable_curve(model, metric, key, journal, kind, fractions, after_unit, batches=batches,
                                     kinds=[kind], scope="kind")
              for kind in bar(kinds, total=len(kinds), desc="per-kind curves", unit="kind")}
    base = _base_value(model, metric, key, journal, curves, after_unit)
    summary = {"base": base, "threshold": threshold,
               "within_threshold": {k: within(fractions, [p["value"] for p in c["points"]], base, threshold,
                                              higher_is_better) for k, c in curves.items()}}
    sign = 1 if higher_is_better else -1
    mean = {k: sum(p["value"] for p in c["points"]) / len(c["points"]) for k, c in curves.items()}
    summary["mean_value"] = mean
    # the first kind to leave the threshold; among equals, the one with the worst mean metric over the fractions
    summary["most_sensitive"] = min(curves, key=lambda k: (summary["within_threshold"][k], sign * mean[k]))
    result = journal.finish({"study": "per-kind", "metric": key, "curves": curves, "summary": summary,
                             "seconds": time.perf_counter() - start})
    out = _Outputs(out_dir, "per-kind")
    for kind, curve in curves.items():
        for p in curve["points"]:
            out.scalar(kind, p["value"], round(100 * p["fraction"]))
    series = {k: ([p["fraction"] for p in c["points"]], [p["value"] for p in c["points"]]) for k, c in curves.items()}
    out.figure(curves_figure(series, ylabel=key, title="pruning one attention kind (% of that kind's heads)"),
               "per_kind_curves.png")
    out.close()
    return result


# -------------------------------------------------------------------------------------------------------------------
# §4.3: speed
# -------------------------------------------------------------------------------------------------------------------
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
    from dataclasses import asdict

    from prunetrain.bench import BenchConfig, benchmark
    from prunetrain.engine.shrink import shrink
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads

    fractions = [f for f in check_fractions(fractions) if f > 0]
    if not fractions:
        raise ValueError("fractions: needs at least one fraction > 0 (0 is the full model, the baseline).")
    config = BenchConfig.with_options(config, bench_options)
    settings = {k: v for k, v in asdict(config).items() if k not in ("inputs", "device")}
    settings = json.loads(json.dumps(settings, default=str))
    journal = Journal(out_dir, "speed", {"study": "speed", "fractions": fractions, "bench": settings,
                                         "layout": _layout_args(model), **dict(args or {})})
    if journal.finished is not None:
        return journal.finished
    start = time.perf_counter()
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
    points = [journal.units[f"{f:g}"] for f in fractions]
    table = [{"fraction": p["fraction"], "heads_kept": p["heads_kept"], "task": r["task"], "batch": r["batch"],
              "seq_len": r["seq_len"], "speedup": r["speedup"], "flop_ideal_speedup": r.get("flop_ideal_speedup"),
              "ms_full": 1e3 * r["a"]["median"], "ms_pruned": 1e3 * r["b"]["median"]}
             for p in points for r in p["rows"]]
    result = journal.finish({"study": "speed", "fractions": fractions, "points": points, "table": table,
                             "paper": {"fraction": 0.5, "speedup": PAPER_SPEEDUP_AT_HALF,
                                       "what": "Michel et al. §4.3 Table 4: BERT on MNLI, up to +17.5 % with 50 % "
                                               "of heads pruned"},
                             "seconds": time.perf_counter() - start})
    out = _Outputs(out_dir, "speed")
    lines = ["| pruned | heads kept | task | batch×len | full ms | pruned ms | speed-up | FLOP-ideal |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {100 * t['fraction']:.0f} % | {t['heads_kept']} | {t['task']} | {t['batch']}×{t['seq_len']} | "
              f"{t['ms_full']:.2f} | {t['ms_pruned']:.2f} | {t['speedup']:.3f} | "
              f"{'n/a' if t['flop_ideal_speedup'] is None else format(t['flop_ideal_speedup'], '.3f')} |"
              for t in table]
    lines.append(f"\nPaper (Michel et al. §4.3, BERT): up to ×{PAPER_SPEEDUP_AT_HALF} with 50 % of heads pruned.")
    if out.out is not None:
        (out.out / "speed.md").write_text("\n".join(lines) + "\n")
    cases = list(dict.fromkeys((t["task"], t["batch"], t["seq_len"]) for t in table))
    for i, case in enumerate(cases):
        for t in table:
            if (t["task"], t["batch"], t["seq_len"]) == case:
                out.scalar(f"speedup/{case[0]}_b{case[1]}_l{case[2]}", t["speedup"], round(100 * t["fraction"]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for case in cases:
        rows = [t for t in table if (t["task"], t["batch"], t["seq_len"]) == case]
        ax.plot([100 * t["fraction"] for t in rows], [t["speedup"] for t in rows], marker="o", ms=3,
                label=f"{case[0]} {case[1]}×{case[2]}")
    ax.scatter([50], [PAPER_SPEEDUP_AT_HALF], marker="*", s=90, color="k", label="paper (BERT, Table 4)", zorder=5)
    ax.axhline(1, color="k", lw=0.6)
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel("speed-up over the full model")
    ax.set_title("speed of the shrunk model", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.figure(fig, "speed.png")
    out.close()
    return result


__all__ = ["Journal", "PAPER_SPEEDUP_AT_HALF", "ablate_each_head", "ablation_table", "cross_dataset", "defined",
           "keep_one_head_per_layer",
           "pearson", "per_kind_curves", "pruning_curves_study", "speed_study", "spearman", "within"]
