"""Time to quality: from the runs' own records, the training minutes each arm needs to reach a validation BLEU —
by default the final validation BLEU of the arm with the largest final model (the full model, in a proof) — and
validation BLEU over training minutes per arm, mean ± sd over seeds.

A run's curve is its validation BLEU at each evaluation point over training (`bleu_over_training`: the point's
`train_seconds`, the training-time clock the equal-time budget counts, and `valid_bleu`), ending with the final model
at the run's `train_seconds`. The minutes to reach a target are those of the first point at or above it, linearly
interpolated from the point before it (the first point itself when it is already there); a run that never reaches
it has none and is counted apart. The curves of an arm's seeds are averaged point by point: the points share their
budget share (`train_seconds_target` or `flops_target`) across seeds, and the final points are averaged together.
"""

from __future__ import annotations

from pathlib import Path

from prunetrain.mt.comparison.arm_stats import cell, fmt_stat, mean_sd
from prunetrain.mt.comparison.compare_seeds import valid_score


FIGURE = "time_to_quality.png"


def arms_time_to_quality(names: list[str], runs: list[dict]) -> dict | None:
    """`time_to_quality` of runs named as `prunetrain compare` names them (runs sharing a name are seeds of one
    arm); None for a single arm."""
    arms: dict[str, list[dict]] = {}
    for name, results in zip(names, runs):
        arms.setdefault(name, []).append(results)
    return time_to_quality(arms) if len(arms) > 1 else None


def time_to_quality_section(result: dict | None) -> str:
    """The comparison's Markdown section with its figure, "" when there is nothing to show."""
    if not result:
        return ""
    return "\n" + "\n".join(time_to_quality_markdown(result)) + f"\n![Validation BLEU over training minutes]({FIGURE})\n"


def run_curve(results: dict) -> list[dict]:
    """[{"key", "minutes", "bleu"}] of one run in training order: `key` is the point's budget share (its
    `train_seconds_target` or `flops_target`), "final" for the final model."""
    curve = []
    for record in results.get("bleu_over_training") or []:
        bleu = record.get("valid_bleu")
        if bleu is None:
            continue
        if record.get("kind") == "final":
            seconds, key = results.get("train_seconds"), "final"
        else:
            seconds = record.get("train_seconds")
            key = record.get("train_seconds_target") or record.get("flops_target") or record.get("step")
        if seconds is not None:
            curve.append({"key": key, "minutes": seconds / 60, "bleu": bleu})
    return curve


def minutes_to_reach(curve: list[dict], target: float) -> float | None:
    """The training minutes at which `curve` first reaches `target` (interpolated), None if it never does."""
    previous = None
    for point in curve:
        if point["bleu"] >= target:
            if previous is None or point["bleu"] == previous["bleu"]:
                return point["minutes"]
            share = (target - previous["bleu"]) / (point["bleu"] - previous["bleu"])
            return previous["minutes"] + share * (point["minutes"] - previous["minutes"])
        previous = point
    return None


def time_to_quality(arms: dict[str, list[dict]], target: float | None = None) -> dict | None:
    """Minutes to `target` and the mean curve of every arm ({arm: its seeds' results}), or None when no run
    recorded validation BLEU over training.

    Returns:
        {"target", "target_arm" (None for a given target), "arms": [{"arm", "minutes": mean_sd over the runs that
        reached it, "reached", "runs", "per_run"}], "curves": {arm: [{"key", "minutes", "bleu": mean_sd}]}}.
    """
    curves = {name: [run_curve(r) for r in runs] for name, runs in arms.items()}
    if not any(curve for runs in curves.values() for curve in runs):
        return None
    target_arm = None
    if target is None:
        sizes = {name: mean_sd([r.get("parameters_final") for r in runs])["mean"] or 0 for name, runs in arms.items()}
        target_arm = max(arms, key=lambda name: sizes[name])  # the first of the largest
        target = mean_sd([(valid_score(r) or {}).get("bleu") for r in arms[target_arm]])["mean"]
        if target is None:
            return None
    rows, means = [], {}
    for name, runs in curves.items():
        per_run = [minutes_to_reach(curve, target) for curve in runs]
        rows.append({"arm": name, "minutes": mean_sd(per_run), "reached": sum(m is not None for m in per_run),
                     "runs": len(runs), "per_run": per_run})
        keys = list(dict.fromkeys(point["key"] for curve in runs for point in curve))
        means[name] = [{"key": key,
                        "minutes": mean_sd([p["minutes"] for c in runs for p in c if p["key"] == key])["mean"],
                        "bleu": mean_sd([p["bleu"] for c in runs for p in c if p["key"] == key])} for key in keys]
    return {"target": target, "target_arm": target_arm, "arms": rows, "curves": means}


def time_to_quality_markdown(result: dict | None) -> list[str]:
    if not result:
        return []
    whose = (f"the final validation BLEU of `{result['target_arm']}`, the largest final model"
             if result["target_arm"] is not None else "the given target")
    lines = ["## Time to quality (validation BLEU over training minutes)", "",
             f"Training minutes to reach validation BLEU {result['target']:.2f} ({whose}; interpolated between "
             f"evaluation points; runs that never reach it counted apart).", "",
             "| arm | minutes to the target (mean ± sd) | runs that reach it | per run |", "|---|---|---|---|"]
    for row in result["arms"]:
        per_run = ", ".join("—" if m is None else f"{m:.1f}" for m in row["per_run"])
        lines.append(f"| {cell(row['arm'])} | {fmt_stat(row['minutes'], 1) or 'not reached'} | "
                     f"{row['reached']} of {row['runs']} | {per_run} |")
    return lines + [""]


def time_to_quality_figure(result: dict, path: str | Path) -> Path:
    """Validation BLEU over training minutes, one line per arm (mean over seeds) with a ± sd band, and the target."""
    from prunetrain.utils.plots import pyplot, save_figure

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, (name, points) in enumerate(result["curves"].items()):
        minutes = [p["minutes"] for p in points]
        bleu = [p["bleu"]["mean"] for p in points]
        spread = [p["bleu"]["sd"] or 0.0 for p in points]
        color = f"C{index % 10}"
        axes.plot(minutes, bleu, marker="o", markersize=3, color=color, label=name)
        axes.fill_between(minutes, [b - s for b, s in zip(bleu, spread)], [b + s for b, s in zip(bleu, spread)],
                          color=color, alpha=0.15)
    axes.axhline(result["target"], color="grey", linestyle="--", linewidth=1, label=f"target {result['target']:.2f}")
    axes.set_xlabel("training minutes")
    axes.set_ylabel("validation BLEU (mean ± sd over seeds)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    return save_figure(figure, path)


__all__ = ["FIGURE", "arms_time_to_quality", "minutes_to_reach", "time_to_quality_section", "run_curve", "time_to_quality", "time_to_quality_figure", "time_to_quality_markdown"]
