"""The studies of Michel et al. (2019), each a library function that returns JSON-able results and writes figures.

1. `ablate_each_head`      §3.2 / Fig. 1: the metric with each head alone removed, as a change from the full model.
2. `keep_one_head_per_layer` §3.3 / Table 2: for each layer (site), all heads but the best one removed.
3. `cross_dataset`         §3.4 / Fig. 2: head scores on two datasets, Spearman rank correlation and a scatter plot.
4. `pruning_curves_study`  §4.2 / Fig. 3 and §5: metric vs % heads pruned in importance order and in random order
                           (several seeds), overall and per attention kind.

`metric(model) -> float | dict` is any callable (see `prunetrain.methods.curve`: `bleu_metric`, `loss_metric`,
`accuracy_metric`); with a dict, `key` names the value to use. Higher is better unless `higher_is_better=False`
(loss).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from prunetrain.methods.curve import Curve, check_fractions, pruning_curve
from prunetrain.engine.heads import find_heads
from prunetrain.methods.importance import HeadScores
from prunetrain.engine.mask import HeadMask
from prunetrain.utils.plots import _pyplot, curves_figure, save_figure

Metric = Callable[[nn.Module], Any]


def _value(result, key: str) -> float:
    if isinstance(result, Mapping):
        if key not in result:
            raise KeyError(f"metric returned {sorted(result)} but the study needs {key!r}.")
        return float(result[key])
    return float(result)


def _measure(model: nn.Module, metric: Metric, key: str, mask: HeadMask | None = None) -> float:
    with torch.no_grad():
        if mask is None:
            return _value(metric(model), key)
        with mask.applied(model):
            return _value(metric(model), key)


def ablate_each_head(model: nn.Module, metric: Metric, *, key: str = "value", out_dir: str | Path | None = None,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Michel §3.2: remove one head at a time; `delta = metric(without head) − metric(full)`.

    Cost: 1 + (number of heads) evaluations of the metric. Writes `ablation.json` and `ablation_hist.png`.
    """
    was_training = model.training
    model.eval()
    try:
        layout = find_heads(model)
        start = time.perf_counter()
        base = _measure(model, metric, key)
        rows = []
        for site in layout:
            for head in range(site.num_heads):
                mask = HeadMask.from_heads(model, {site.name: [head]})
                value = _measure(model, metric, key, mask)
                rows.append({"site": site.name, "kind": site.kind, "layer": site.layer, "head": head,
                             "value": value, "delta": value - base})
                if progress:
                    progress(f"ablate {site.name} head {head}: {value:.3f} ({value - base:+.3f})")
    finally:
        model.train(was_training)
    deltas = [r["delta"] for r in rows]
    result = {"study": "ablate_each_head", "metric": key, "base": base, "heads": rows,
              "seconds": time.perf_counter() - start,
              "summary": {"num_heads": len(rows), "mean_delta": sum(deltas) / max(1, len(deltas)),
                          "min_delta": min(deltas, default=0.0), "max_delta": max(deltas, default=0.0)}}
    if out_dir is not None:
        out = Path(out_dir)
        _write(out / "ablation.json", result)
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.hist(deltas, bins=min(30, max(5, len(deltas) // 3)), color="#4477aa")
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel(f"{key} change when the head alone is removed")
        ax.set_ylabel("heads")
        ax.set_title(f"ablating each head (base {key} {base:.2f})", fontsize=9)
        fig.tight_layout()
        save_figure(fig, out / "ablation_hist.png")
    return result


def keep_one_head_per_layer(model: nn.Module, metric: Metric, *, key: str = "value",
                            ablation: Mapping | None = None, higher_is_better: bool = True,
                            out_dir: str | Path | None = None,
                            progress: Callable[[str], None] | None = None) -> dict:
    """Michel §3.3: for each site, remove every head but one (the best: the head whose removal alone hurts most,
    from `ablation` or, if not given, by trying each head as the one kept) and evaluate; the other sites are full.
    """
    was_training = model.training
    model.eval()
    try:
        layout = find_heads(model)
        base = _measure(model, metric, key)
        rows = []
        for site in layout:
            if site.num_heads == 0:
                continue
            candidates = range(site.num_heads)
            if ablation is not None:
                deltas = {r["head"]: r["delta"] for r in ablation["heads"] if r["site"] == site.name}
                best = min(deltas, key=lambda h: deltas[h] if higher_is_better else -deltas[h])
                candidates = [best]
            results = []
            for head in candidates:
                mask = HeadMask.from_heads(model, {site.name: [h for h in range(site.num_heads) if h != head]})
                results.append((head, _measure(model, metric, key, mask)))
            head, value = max(results, key=lambda r: r[1] if higher_is_better else -r[1])
            rows.append({"site": site.name, "kind": site.kind, "layer": site.layer, "kept_head": head,
                         "value": value, "delta": value - base})
            if progress:
                progress(f"only head {head} in {site.name}: {value:.3f} ({value - base:+.3f})")
    finally:
        model.train(was_training)
    result = {"study": "keep_one_head_per_layer", "metric": key, "base": base, "layers": rows}
    if out_dir is not None:
        out = Path(out_dir)
        _write(out / "one_head_per_layer.json", result)
        lines = ["| site | kind | layer | kept head | " + key + " | Δ |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['site']} | {r['kind']} | {r['layer']} | {r['kept_head']} | {r['value']:.2f} | "
                  f"{r['delta']:+.2f} |" for r in rows]
        (out / "one_head_per_layer.md").write_text(f"Base {key}: {base:.2f}\n\n" + "\n".join(lines) + "\n")
    return result


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
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

    ra, rb = ranks(list(a)), ranks(list(b))
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


def cross_dataset(scores_a: HeadScores, scores_b: HeadScores, *, names: tuple[str, str] = ("dataset A", "dataset B"),
                  out_dir: str | Path | None = None) -> dict:
    """Michel §3.4: how well head scores (importance, or ablation deltas as HeadScores) agree across two datasets."""
    if scores_a.layout.names != scores_b.layout.names:
        raise ValueError("scores_b: computed for another model layout than scores_a.")
    a, b = scores_a.flat().tolist(), scores_b.flat().tolist()
    rho = spearman(a, b)
    result = {"study": "cross_dataset", "datasets": list(names), "spearman": rho, "num_heads": len(a),
              "scores_a": a, "scores_b": b}
    if out_dir is not None:
        out = Path(out_dir)
        _write(out / "cross_dataset.json", result)
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(4.2, 4))
        ax.scatter(a, b, s=10, alpha=0.7)
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
        ax.set_title(f"head scores across datasets (Spearman ρ = {rho:.2f})", fontsize=9)
        fig.tight_layout()
        save_figure(fig, out / "cross_dataset.png")
    return result


def pruning_curves_study(model: nn.Module, metric: Metric, batches: Iterable, *, key: str = "value",
                         fractions: Sequence[float] = tuple(round(0.1 * i, 1) for i in range(10)),
                         random_seeds: Sequence[int] = (0, 1, 2), iterative: bool = True, by_kind: bool = True,
                         out_dir: str | Path | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Michel §4.2 / §5: metric vs % of heads pruned — importance order (iterative re-estimation by default, as
    in the paper) against random order with several seeds, and, with `by_kind`, pruning only one attention kind at
    a time (fractions of that kind's heads). Reports the mean time per curve point."""
    fractions = check_fractions(fractions)
    batches = list(batches)
    curves: dict[str, Curve] = {}
    curves["importance"] = pruning_curve(model, metric, fractions=fractions, batches=batches, iterative=iterative,
                                         key=key, metric_name=key)
    for seed in random_seeds:
        curves[f"random_seed{seed}"] = pruning_curve(model, metric, fractions=fractions, order="random", seed=seed,
                                                     key=key, metric_name=key)
    layout = find_heads(model)
    if by_kind and len(layout.kinds) > 1:
        for kind in layout.kinds:
            curves[f"kind_{kind}"] = pruning_curve(model, metric, fractions=fractions, batches=batches,
                                                   iterative=False, kinds=[kind], scope="kind", key=key,
                                                   metric_name=key)
    points = [p for c in curves.values() for p in c.points]
    result = {"study": "pruning_curves", "metric": key, "curves": {k: c.to_dict() for k, c in curves.items()},
              "seconds_per_point": sum(p.seconds for p in points) / max(1, len(points))}
    if progress:
        progress(f"{len(points)} curve points, {result['seconds_per_point']:.2f} s per point")
    if out_dir is not None:
        out = Path(out_dir)
        _write(out / "pruning_curves.json", result)
        main = {name: (c.fractions, c.values) for name, c in curves.items() if not name.startswith("kind_")}
        save_figure(curves_figure(main, ylabel=key, title="importance vs random order"), out / "pruning_curves.png")
        kinds = {name.removeprefix("kind_"): (c.fractions, c.values) for name, c in curves.items()
                 if name.startswith("kind_")}
        if kinds:
            fig = curves_figure(kinds, ylabel=key, title="pruning one attention kind (% of that kind's heads)")
            save_figure(fig, out / "pruning_curves_by_kind.png")
    return result


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


__all__ = ["ablate_each_head", "cross_dataset", "keep_one_head_per_layer", "pruning_curves_study", "spearman"]
