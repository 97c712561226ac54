"""Arms of a comparison: runs that share a name are seeds of one setting ("arm"), summarised over seeds and tested
against the reference arm — does pruning during training pay, beyond the noise of one seed?

For every arm: the number of seeds, mean ± sample standard deviation (n − 1) of the final test BLEU and chrF, heads,
parameters, training FLOPs, steps and minutes. At equal compute: each arm's test BLEU where every run's training
FLOPs first reached the same values (the recipe's `eval.test_flops` points, read off each run's records by linear
interpolation between the two records around the value, which are at most one step away from it), mean ± sd. Between
final models: for every seed both the reference arm and another arm ran, a paired bootstrap over the test sentences
(`prunetrain.methods.significance`, the studies' test; BLEU from sacreBLEU's per-sentence statistics saved in each
run's `test_translations.json`). Where the runs recorded it, the final validation BLEU beside the test BLEU and the
validation BLEU at the same FLOP points; every test set, the tests across seeds and the choice on validation are
`prunetrain.mt.comparison.compare_seeds`.
"""

from __future__ import annotations

import math
from pathlib import Path

from prunetrain.mt.comparison.arm_stats import TRANSLATIONS_FILE, cell, fmt_stat, mean_sd, run_seed, teacher_flops
from prunetrain.mt.comparison.compare_seeds import (read_split_translations, seed_tests, selection_markdown,
                                                    shared_test_splits, test_set_tables, test_sets_markdown,
                                                    valid_score, validation_selection)
from prunetrain.utils.files import read_json


def group_arms(names: list[str], runs: list[dict]) -> dict[str, list[dict]]:
    """{arm name: [results, ...]} in first-appearance order; two runs of one arm with the same seed are refused."""
    arms: dict[str, list[dict]] = {}
    for name, results in zip(names, runs):
        seeds = [run_seed(r) for r in arms.get(name, [])]
        if run_seed(results) in seeds:
            raise ValueError(f"names: arm {name!r} has two runs with train.seed={run_seed(results)}; runs that share "
                             f"a name are seeds of one setting, so each needs its own seed.")
        arms.setdefault(name, []).append(results)
    return arms


def value_at_flops(records: list[dict], flops: float, key: str = "bleu") -> float | None:
    """The run's `key` after `flops` training FLOPs: the record evaluated where the run's FLOPs first reached
    `flops` (a FLOP point, at most one step past it), else interpolated linearly between the records around it
    (None outside the run's records, without FLOP counts or where no record holds `key`)."""
    records = [r for r in records if r.get(key) is not None]  # e.g. validation, where a run recorded it
    at_point = [r for r in records if r.get("flops_target") == flops]
    if at_point:
        return at_point[0][key]
    records = sorted((r for r in records if r.get("flops") is not None), key=lambda r: r["flops"])
    before = [r for r in records if r["flops"] <= flops]
    after = [r for r in records if r["flops"] >= flops]
    if not before or not after:
        return None
    low, high = before[-1], after[0]
    if high["flops"] == low["flops"]:
        return low[key]
    share = (flops - low["flops"]) / (high["flops"] - low["flops"])
    return low[key] + share * (high[key] - low[key])


def flop_targets(runs: list[dict]) -> list[float]:
    """The FLOP points the runs evaluated at (`eval.test_flops` × `train.max_flops`), shared by all runs."""
    targets = None
    for results in runs:
        given = {r["flops_target"] for r in results.get("bleu_over_training") or []
                 if r.get("flops_target") is not None}
        targets = given if targets is None else targets & given
    return sorted(targets or [])


def summarize_arm(name: str, runs: list[dict]) -> dict:

    finals = [r["test_pruned"] for r in runs]
    valid = [valid_score(r) or {} for r in runs]
    return {"arm": name, "seeds": [run_seed(r) for r in runs], "bleu": mean_sd([f["bleu"] for f in finals]),
            "chrf": mean_sd([f.get("chrf") for f in finals]), "valid_bleu": mean_sd([v.get("bleu") for v in valid]),
            "valid_chrf": mean_sd([v.get("chrf") for v in valid]), "heads": mean_sd([r["heads_kept"] for r in runs]),
            "parameters": mean_sd([r.get("parameters_final") for r in runs]),
            "train_flops": mean_sd([r.get("train_flops") for r in runs]),
            # distillation: the teacher's FLOPs, apart from the training FLOPs (equal student FLOPs)
            "teacher_flops": mean_sd([teacher_flops(r) for r in runs]),
            "steps": mean_sd([r.get("steps") for r in runs]),
            "train_step_minutes": mean_sd([r.get("train_step_minutes") for r in runs]),
            # a resumed run's whole-run minutes cover only its resumed part: left out of the mean
            "total_minutes": mean_sd([None if r.get("resumed_from_step") is not None else r.get("total_minutes")
                                      for r in runs]),
            "num_beams": finals[0].get("num_beams")}


def equal_flops_table(arms: dict[str, list[dict]]) -> list[dict]:
    """Test and validation BLEU of every arm at every shared FLOP point: {"flops", "arm", "bleu": mean_sd,
    "valid_bleu": mean_sd} (validation over the runs that recorded it)."""
    every = [r for runs in arms.values() for r in runs]
    rows = []
    for target in flop_targets(every):
        for name, runs in arms.items():
            rows.append({"flops": target, "arm": name,
                         **{key: mean_sd([value_at_flops(r["bleu_over_training"], target, key) for r in runs])
                            for key in ("bleu", "valid_bleu")}})
    return rows


def read_translations(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / TRANSLATIONS_FILE
    return read_json(path, "translations", allow_nan=True) if path.is_file() else None


def bootstrap_pairs(arms: dict[str, list[dict]], translations: dict[str, list[dict | None]], *, samples: int = 1000,
                    seed: int = 0, split: str = "test") -> list[dict]:
    """Paired bootstrap between the reference arm's final model and each other arm's on test set `split`, for every
    shared seed."""
    from prunetrain.methods.significance import SENTENCE_STATS, paired_bootstrap
    from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats

    names = list(arms)
    reference = names[0]
    ref_by_seed = {run_seed(r): t for r, t in zip(arms[reference], translations[reference])}
    rows = []
    for name in names[1:]:
        for results, other in zip(arms[name], translations[name]):
            base = ref_by_seed.get(run_seed(results))
            row = {"arm": name, "seed": run_seed(results), "reference": reference, "split": split, "p_value": None,
                   "delta": None}
            if base and other and base.get(SENTENCE_STATS) and other.get(SENTENCE_STATS):
                if len(base[SENTENCE_STATS]) != len(other[SENTENCE_STATS]):
                    raise ValueError(f"runs: arm {name!r} seed {row['seed']} scored {len(other[SENTENCE_STATS])} "
                                     f"sentences of test set {split!r} and {reference!r} {len(base[SENTENCE_STATS])}; "
                                     f"a paired test needs the same sentences.")
                row["delta"] = bleu_from_stats([sum(c) for c in zip(*other[SENTENCE_STATS])]) - \
                    bleu_from_stats([sum(c) for c in zip(*base[SENTENCE_STATS])])
                row["p_value"] = paired_bootstrap(base[SENTENCE_STATS], other[SENTENCE_STATS], bleu_from_stats,
                                                  samples=samples, seed=seed)
            rows.append(row)
    return rows


def flops_scale(values) -> tuple[float, str]:
    """(10^k, "×10^k") putting the largest value in [1, 1000)."""
    largest = max((abs(v) for v in values if v), default=1.0)
    exponent = 3 * int(math.floor(math.log10(largest) / 3)) if largest else 0
    return 10.0 ** exponent, f"×10^{exponent}"


def arms_markdown(comparison: dict) -> list[str]:
    """The arms' tables (seeds, equal compute, every test set, tests across seeds, paired bootstrap, the choice on
    validation) as Markdown lines (a `|` in an arm's name escaped)."""

    scale, unit = flops_scale([a["train_flops"]["mean"] for a in comparison["arms"]])
    teachers = any((a.get("teacher_flops") or {}).get("n") for a in comparison["arms"])
    lines = ["## Arms (runs sharing a name are seeds; mean ± sd over seeds)", "",
             f"| arm | seeds | test BLEU | chrF | validation BLEU | heads | parameters (M) | training FLOPs ({unit}) | "
             + (f"teacher FLOPs ({unit}, forwards and translations, apart) | " if teachers else "") +
             "steps | training min (steps only) | whole run min |", "|" + "---|" * (12 if teachers else 11)]
    for a in comparison["arms"]:
        teacher_cell = ""
        if teachers:
            teacher = a.get("teacher_flops") or mean_sd([])
            teacher_cell = (fmt_stat(teacher, 3, scale) if teacher["n"] else "no teacher") + " | "
        valid = a.get("valid_bleu") or mean_sd([])
        valid_cell = (fmt_stat(valid) + (f" ({valid['n']} of {len(a['seeds'])} runs)"
                                         if valid["n"] < len(a["seeds"]) else "")) if valid["n"] else "not recorded"
        lines.append(f"| {cell(a['arm'])} | {', '.join(map(str, a['seeds']))} | {fmt_stat(a['bleu'])} | "
                     f"{fmt_stat(a['chrf'])} | {valid_cell} | "
                     f"{fmt_stat(a['heads'], 0)} | {fmt_stat(a['parameters'], 2, 1e6)} | "
                     f"{fmt_stat(a['train_flops'], 3, scale)} | {teacher_cell}{fmt_stat(a['steps'], 0)} | "
                     f"{fmt_stat(a['train_step_minutes'], 1)} | {fmt_stat(a['total_minutes'], 1)}"
                     + (f" ({a['total_minutes']['n']} of {len(a['seeds'])} runs; resumed runs left out)"
                        if a["total_minutes"]["n"] < len(a["seeds"]) else "") + " |")
    return (lines + equal_flops_markdown(comparison) + test_sets_markdown(comparison) + bootstrap_markdown(comparison)
            + selection_markdown(comparison.get("selection")))


def equal_flops_markdown(comparison: dict) -> list[str]:
    """Test BLEU at the shared FLOP points, and validation BLEU at the same points where the runs recorded it."""
    if not comparison["equal_flops"]:
        return []
    targets = sorted({row["flops"] for row in comparison["equal_flops"]})
    scale, unit = flops_scale(targets)
    header = ["| arm | " + " | ".join(f"{t / scale:.4g}{unit}" for t in targets) + " |",
              "|---|" + "---|" * len(targets)]
    lines = ["", "## Equal training FLOPs (test BLEU where each run's FLOPs first reached the value)", "", *header]
    blocks = [("bleu", lines)]
    if any((row.get("valid_bleu") or {}).get("n") for row in comparison["equal_flops"]):
        blocks.append(("valid_bleu", ["", "### Validation BLEU at the same FLOP points", "", *header]))
    for key, block in blocks:
        for a in comparison["arms"]:
            cells = {row["flops"]: row.get(key) or mean_sd([]) for row in comparison["equal_flops"]
                     if row["arm"] == a["arm"]}
            block.append(f"| {cell(a['arm'])} | " + " | ".join(fmt_stat(cells[t]) or "not recorded" for t in targets)
                         + " |")
    return [line for _, block in blocks for line in block]


def bootstrap_markdown(comparison: dict) -> list[str]:
    """The paired bootstrap between final models, seed by seed, one table per test set."""
    by_split = comparison.get("bootstrap_by_split") or {"test": comparison["paired_tests"]}
    if not any(by_split.values()):
        return []
    lines = ["", f"## Paired bootstrap between final models (reference arm: {cell(comparison['arms'][0]['arm'])}; "
             f"same seed; {comparison['bootstrap_samples']} resamples of the test sentences)"]
    for split, rows in by_split.items():
        lines += ["", f"### Test set {cell(split)}", "", "| arm | seed | Δ BLEU (arm − reference) | p |",
                  "|---|---|---|---|"]
        for row in rows:
            delta = "" if row["delta"] is None else f"{row['delta']:+.2f}"
            p = "no translations kept" if row["p_value"] is None else f"{row['p_value']:.3f}"
            lines.append(f"| {cell(row['arm'])} | {row['seed']} | {delta} | {p} |")
    return lines


def compare_arms(names: list[str], runs: list[dict], run_dirs: list[str | Path], *, samples: int = 1000,
                 max_total_flops: float | None = None) -> dict:
    """Summary, equal-FLOP table, every test set, tests across seeds, paired bootstraps and the choice on validation
    of the arms named by `names` (the first arm is the reference; the choice within `max_total_flops` when given)."""
    arms = group_arms(names, runs)
    splits = shared_test_splits(arms)
    by_split: dict[str, list[dict]] = {}
    for index, split in enumerate(splits):
        translations: dict[str, list[dict | None]] = {}
        for name, run_dir in zip(names, run_dirs):
            translations.setdefault(name, []).append(read_split_translations(run_dir, split, main=index == 0))
        by_split[split] = bootstrap_pairs(arms, translations, samples=samples, split=split) if len(arms) > 1 else []
    return {"arms": [summarize_arm(n, r) for n, r in arms.items()], "equal_flops": equal_flops_table(arms),
            "test_sets": test_set_tables(arms, splits), "seed_tests": seed_tests(arms, splits) if len(arms) > 1 else [],
            "paired_tests": by_split[splits[0]], "bootstrap_by_split": by_split, "bootstrap_samples": samples,
            "selection": validation_selection(arms, max_total_flops)}


__all__ = ["arms_markdown", "compare_arms", "equal_flops_table", "flops_scale", "fmt_stat", "flop_targets", "group_arms",
           "mean_sd", "summarize_arm", "value_at_flops"]
