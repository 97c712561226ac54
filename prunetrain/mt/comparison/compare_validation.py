"""`prunetrain compare --validation-only`: what a choice between arms may look at, and nothing else.

The proof's selection runs (recipes/wmt-small-deen.md) choose the default schedule on validation; their test scores
must stay unread until the choice is made, or the test set chooses again. This comparison reads each run's
`results.json` but keeps from it only the validation side: per arm its seeds, heads, steps and training FLOPs, the
final models' validation BLEU and chrF (mean ± sd over seeds), validation BLEU at the FLOP points every run reached,
and the arms ranked by mean final validation BLEU (`prunetrain.mt.comparison.compare_seeds.validation_selection`). No test
score, test translation or bootstrap on a test set is computed, written or printed.
"""

from __future__ import annotations

from prunetrain.mt.comparison.compare_arms import (cell, equal_flops_table, flops_scale, fmt_stat, group_arms, mean_sd,
                                                   summarize_arm)
from prunetrain.mt.comparison.compare_seeds import selection_markdown, validation_selection

ARM_FIELDS = ("arm", "seeds", "heads", "steps", "train_flops", "valid_bleu", "valid_chrf")


def validation_comparison(names: list[str], runs: list[dict], max_total_flops: float | None = None) -> dict:
    """{"validation_only": True, "arms": [{ARM_FIELDS}], "valid_at_flops": [{"flops", "arm", "valid_bleu"}],
    "selection"} of the arms named by `names` (runs sharing a name are seeds of one arm; the choice within
    `max_total_flops` training plus teacher FLOPs when given)."""
    arms = group_arms(names, runs)
    return {"validation_only": True,
            "arms": [{k: v for k, v in summarize_arm(name, group).items() if k in ARM_FIELDS}
                     for name, group in arms.items()],
            "valid_at_flops": [{k: row[k] for k in ("flops", "arm", "valid_bleu")} for row in equal_flops_table(arms)],
            "selection": validation_selection(arms, max_total_flops)}


def validation_markdown(comparison: dict) -> str:
    """The validation-only comparison as Markdown (an arm's `|` escaped)."""
    scale, unit = flops_scale([a["train_flops"]["mean"] for a in comparison["arms"]])
    lines = ["# Arms on validation only (no test score is read into this comparison)", "",
             f"| arm | seeds | heads | steps | training FLOPs ({unit}) | validation BLEU | validation chrF |",
             "|---|---|---|---|---|---|---|"]
    for a in comparison["arms"]:
        lines.append(f"| {cell(a['arm'])} | {', '.join(map(str, a['seeds']))} | {fmt_stat(a['heads'], 0)} | "
                     f"{fmt_stat(a['steps'], 0)} | {fmt_stat(a['train_flops'], 3, scale)} | "
                     f"{fmt_stat(a['valid_bleu']) or 'not recorded'} | {fmt_stat(a['valid_chrf']) or 'not recorded'} |")
    points = comparison["valid_at_flops"]
    if any(row["valid_bleu"]["n"] for row in points):
        targets = sorted({row["flops"] for row in points})
        point_scale, point_unit = flops_scale(targets)
        lines += ["", "## Validation BLEU at the same training FLOPs", "",
                  "| arm | " + " | ".join(f"{t / point_scale:.4g}{point_unit}" for t in targets) + " |",
                  "|---|" + "---|" * len(targets)]
        for a in comparison["arms"]:
            cells = {row["flops"]: row["valid_bleu"] for row in points if row["arm"] == a["arm"]}
            lines.append(f"| {cell(a['arm'])} | "
                         + " | ".join(fmt_stat(cells.get(t, mean_sd([]))) or "not recorded" for t in targets) + " |")
    return "\n".join(lines + selection_markdown(comparison["selection"]) + [""])


__all__ = ["ARM_FIELDS", "validation_comparison", "validation_markdown"]
