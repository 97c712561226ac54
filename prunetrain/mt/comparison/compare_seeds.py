"""Every test set, tests across seeds and the choice on validation, for `prunetrain compare`'s arms.

A recipe run records its final model's scores on every evaluation set in `results.json` (`final_scores`: {split:
{"bleu", "chrf", "sentences", ...}}, `valid_split` naming the validation one, `test_splits` the test sets, the main
test set first) and its translations in `final_translations/SPLIT.json`. Runs written before those fields existed
have only the main test set (`test_pruned`, `test_translations.json`) and no validation score; they still compare,
and the tables say "not recorded" where they need what such runs lack.

- **test sets**: for every test set all runs scored (the main one first), BLEU and chrF per arm, mean ± sample sd
  (n − 1) over seeds, and each seed's value;
- **across seeds**: per test set and metric, the per-seed differences arm − reference arm on the seeds both ran, a
  paired t-test and an exact sign-flip permutation test on them (`prunetrain.methods.seed_tests`: t = mean(d) /
  (sd(d)/√n), df = n − 1; p = share of the 2^n sign vectors whose |mean| reaches the observed one, at least 2/2^n);
- **selection on validation**: the arms ranked by mean final validation BLEU and the arm it chooses. Runs without a
  validation score choose nothing: a choice is never made on a test set.
"""

from __future__ import annotations

import re
from pathlib import Path

from prunetrain.mt.comparison.arm_stats import TRANSLATIONS_FILE, cell, fmt_stat, mean_sd, run_seed, total_flops
from prunetrain.utils.files import read_json

FINAL_TRANSLATIONS_DIR = "final_translations"
METRICS = ("bleu", "chrf")
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_score_fields(data: dict, fail) -> None:
    """`final_scores`, `valid_split` and `test_splits` of a results.json, where present, have the shapes the
    comparison reads (`fail(field, what)` raises the one-line error naming the file)."""
    scores = data.get("final_scores")
    if scores is not None:
        if not isinstance(scores, dict):
            fail("final_scores", f"is {scores!r}, not an object")
        for split, score in scores.items():
            if not isinstance(score, dict):
                fail(f"final_scores.{split}", f"is {score!r}, not an object")
            for key in ("bleu", "chrf", "sentences", "num_sentences"):
                value, count = score.get(key), key.endswith("sentences")
                if (value is None and key == "bleu") or (value is not None and (
                        isinstance(value, bool) or not isinstance(value, int if count else (int, float)))):
                    fail(f"final_scores.{split}.{key}", "is missing" if value is None else f"is {value!r}, not a "
                         f"{'count' if count else 'number'}")
    valid, tests = data.get("valid_split"), data.get("test_splits")
    if valid is not None and not (isinstance(valid, str) and valid in (scores or {})):
        fail("valid_split", f"is {valid!r}, not a key of final_scores")
    if tests is not None:
        if not isinstance(tests, list) or not tests or len(set(map(str, tests))) != len(tests):
            fail("test_splits", f"is {tests!r}, not a list of distinct split names")
        for split in tests:
            if not (isinstance(split, str) and _SPLIT_NAME.fullmatch(split) and split in (scores or {})):
                fail("test_splits", f"names {split!r}, not a split name that is a key of final_scores")


def main_split(results: dict) -> str:
    """The run's main test set: the first of `test_splits`, else the recipe's `data.test_split` (older runs)."""
    if results.get("test_splits"):
        return results["test_splits"][0]
    return ((results.get("recipe") or {}).get("data") or {}).get("test_split") or "test"


def test_scores(results: dict) -> dict[str, dict]:
    """{test split: final score}, the main test set first (`test_pruned` where `final_scores` does not hold it)."""
    main = main_split(results)
    scores = results.get("final_scores") or {}
    out = {main: scores.get(main) or results["test_pruned"]}
    out.update({split: scores[split] for split in (results.get("test_splits") or [])[1:]})
    return out


def valid_score(results: dict) -> dict | None:
    """The final model's score on the validation split, None when the run did not record one."""
    split = results.get("valid_split")
    return (results.get("final_scores") or {}).get(split) if split else None


def sentence_count(score: dict) -> int | None:
    return score.get("sentences", score.get("num_sentences"))


def shared_test_splits(arms: dict[str, list[dict]]) -> list[str]:
    """The test sets every run scored, in the reference run's order (its main test set first). Runs whose main test
    sets differ, or that scored one test set on different numbers of sentences, are refused: the paired tests
    compare the same sentences."""
    every = [(name, r) for name, runs in arms.items() for r in runs]
    reference_name, reference = every[0]
    splits = list(test_scores(reference))
    for name, results in every[1:]:
        if main_split(results) != splits[0]:
            raise ValueError(f"runs: arm {name!r} seed {run_seed(results)} has main test set "
                             f"{main_split(results)!r} and arm {reference_name!r} {splits[0]!r}; compare runs "
                             f"scored on the same main test set.")
        splits = [s for s in splits if s in test_scores(results)]
    for split in splits:
        counted = [(name, r, sentence_count(test_scores(r)[split])) for name, r in every]
        counted = [c for c in counted if c[2] is not None]
        for name, results, count in counted[1:]:
            if count != counted[0][2]:
                raise ValueError(f"runs: arm {name!r} seed {run_seed(results)} scored {count} sentences of test set "
                                 f"{split!r} and arm {counted[0][0]!r} seed {run_seed(counted[0][1])} "
                                 f"{counted[0][2]}; a paired test needs the same sentences.")
    return splits


def test_set_tables(arms: dict[str, list[dict]], splits: list[str]) -> list[dict]:
    """Per test set: {"split", "main", "sentences", "arms": [{"arm", "seeds", "bleu", "chrf" (mean_sd),
    "per_seed": [{"seed", "bleu", "chrf"}]}]}."""
    tables = []
    for index, split in enumerate(splits):
        rows = []
        for name, runs in arms.items():
            scores = [test_scores(r)[split] for r in runs]
            rows.append({"arm": name, "seeds": [run_seed(r) for r in runs],
                         **{m: mean_sd([s.get(m) for s in scores]) for m in METRICS},
                         "per_seed": [{"seed": run_seed(r), **{m: s.get(m) for m in METRICS}}
                                      for r, s in zip(runs, scores)]})
        first = next(iter(arms.values()))[0]
        tables.append({"split": split, "main": index == 0, "sentences": sentence_count(test_scores(first)[split]),
                       "arms": rows})
    return tables


def seed_tests(arms: dict[str, list[dict]], splits: list[str]) -> list[dict]:
    """Per test set, metric and other arm: the paired tests across the seeds it shares with the reference arm."""
    from prunetrain.methods.seed_tests import paired_t_test, sign_flip_p, smallest_sign_flip_p

    names = list(arms)
    reference = {run_seed(r): r for r in arms[names[0]]}
    rows = []
    for split in splits:
        for metric in METRICS:
            for name in names[1:]:
                pairs = [(run_seed(r), test_scores(r)[split].get(metric), test_scores(reference[run_seed(r)])[split]
                          .get(metric)) for r in arms[name] if run_seed(r) in reference]
                pairs = [(seed, a, b) for seed, a, b in pairs if a is not None and b is not None]
                differences = [a - b for _, a, b in pairs]
                t_test = paired_t_test(differences)
                rows.append({"split": split, "metric": metric, "arm": name, "reference": names[0],
                             "seeds": [seed for seed, _, _ in pairs], "differences": differences,
                             "mean_difference": t_test["mean"], "t": t_test["t"], "df": t_test["df"],
                             "t_p_value": t_test["p_value"], "t_why": t_test.get("why"),
                             "sign_flip_p_value": sign_flip_p(differences),
                             "smallest_sign_flip_p": smallest_sign_flip_p(len(differences))})
    return rows


def read_split_translations(run_dir: str | Path, split: str, main: bool) -> dict | None:
    """`final_translations/SPLIT.json` of a run; for the main test set `test_translations.json` where that is
    missing (older runs). None when the run kept no translations of the split."""
    path = Path(run_dir) / FINAL_TRANSLATIONS_DIR / f"{split}.json"
    if not path.is_file() and main:
        path = Path(run_dir) / TRANSLATIONS_FILE
    return read_json(path, "translations", allow_nan=True) if path.is_file() else None


def validation_selection(arms: dict[str, list[dict]], max_total_flops: float | None = None) -> dict:
    """{"metric": "bleu", "split", "ranking": [{"arm", "valid_bleu" (mean_sd), "total_flops" (mean_sd), "within_cap"}],
    "chosen", "why", "max_total_flops", "best_over_cap"}: the arms ranked by mean final validation BLEU (ties keep the
    order given) and the first chosen; nothing chosen, with the reason, when a run has no validation score or the
    runs scored different validation splits.

    With `max_total_flops` (a budget that counts the teacher's work: an arm's mean training FLOPs plus its teacher's,
    `arm_stats.total_flops`), the choice is the best arm within it; every arm is still ranked, marked within the cap
    or not, and the best arm over the cap, when it ranks above the chosen one, is named beside it ("best_over_cap").
    Nothing is chosen when no arm is within the cap or a run recorded no training FLOPs."""
    runs = [(name, r) for name, group in arms.items() for r in group]
    out = {"metric": "bleu", "split": None, "ranking": [], "chosen": None, "why": None,
           "max_total_flops": max_total_flops, "best_over_cap": None}
    lacking = [f"{name} seed {run_seed(r)}" for name, r in runs if valid_score(r) is None]
    splits = sorted({r["valid_split"] for _, r in runs if valid_score(r) is not None})
    if len(lacking) == len(runs):
        return dict(out, why=f"none of the {len(runs)} runs recorded a validation score")
    if lacking:
        return dict(out, why=f"no validation score recorded by {', '.join(lacking)}")
    if len(splits) > 1:
        return dict(out, why=f"the runs scored different validation splits ({', '.join(splits)})")
    counted = [(name, r, sentence_count(valid_score(r))) for name, r in runs]
    counted = [c for c in counted if c[2] is not None]
    for name, results, count in counted[1:]:
        if count != counted[0][2]:  # as for the test sets: a ranking compares scores of the same sentences
            raise ValueError(f"runs: arm {name!r} seed {run_seed(results)} scored {count} sentences of validation "
                             f"split {splits[0]!r} and arm {counted[0][0]!r} seed {run_seed(counted[0][1])} "
                             f"{counted[0][2]}; a choice on validation compares scores of the same sentences.")
    ranking = [{"arm": name, "valid_bleu": mean_sd([valid_score(r)["bleu"] for r in group]),
                "total_flops": mean_sd([total_flops(r) for r in group]), "within_cap": None}
               for name, group in arms.items()]
    ranking.sort(key=lambda row: -row["valid_bleu"]["mean"])
    out.update(split=splits[0], ranking=ranking)
    if max_total_flops is None:
        return dict(out, chosen=ranking[0]["arm"])
    unmeasured = [f"{name} seed {run_seed(r)}" for name, r in runs if total_flops(r) is None]
    if unmeasured:
        return dict(out, why=f"no training FLOPs recorded by {', '.join(unmeasured)}, so the cap of "
                             f"{max_total_flops:.3g} FLOPs cannot be applied")
    for row in ranking:
        row["within_cap"] = row["total_flops"]["mean"] <= max_total_flops
    within = [row["arm"] for row in ranking if row["within_cap"]]
    if not within:
        least = min(ranking, key=lambda row: row["total_flops"]["mean"])
        return dict(out, why=f"no arm's mean training plus teacher FLOPs is within the cap of {max_total_flops:.3g} "
                             f"(the least: {least['arm']} at {least['total_flops']['mean']:.3g})")
    best = ranking[0]["arm"]
    return dict(out, chosen=within[0], best_over_cap=None if best == within[0] else best)


def _p(value) -> str:
    return "" if value is None else f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}"


def _per_seed(entries: list[dict], metric: str) -> str:
    return ", ".join(f"s{e['seed']}: {e[metric]:.2f}" for e in entries if e[metric] is not None) or "not recorded"


def test_sets_markdown(comparison: dict) -> list[str]:
    """The test-set tables and the tests across seeds as Markdown lines."""
    lines = []
    for table in comparison.get("test_sets") or []:
        what = "main test set" if table["main"] else "test set"
        size = "" if table["sentences"] is None else f", {table['sentences']} sentences"
        lines += ["", f"## {what.capitalize()} {cell(table['split'])} (final models{size}; mean ± sd over seeds)", "",
                  "| arm | seeds | BLEU | chrF | BLEU per seed | chrF per seed |", "|---|---|---|---|---|---|"]
        for a in table["arms"]:
            lines.append(f"| {cell(a['arm'])} | {len(a['seeds'])} | {fmt_stat(a['bleu']) or 'not recorded'} | "
                         f"{fmt_stat(a['chrf']) or 'not recorded'} | {_per_seed(a['per_seed'], 'bleu')} | "
                         f"{_per_seed(a['per_seed'], 'chrf')} |")
    if comparison.get("seed_tests"):
        floors = {len(row["seeds"]): row["smallest_sign_flip_p"] for row in comparison["seed_tests"] if row["seeds"]}
        floor = "; ".join(f"with {n} seed{'s' if n > 1 else ''} it is 2/2^{n} = {p:.4g}"
                          + (", which cannot reach 0.05" if p >= 0.05 else "") for n, p in sorted(floors.items()))
        reference = cell(comparison["seed_tests"][0]["reference"])
        lines += ["", f"## Paired tests across seeds (reference arm: {reference}; differences arm − reference on the "
                  "seeds both ran)", "",
                  "Paired t-test: t = mean(d) / (sd(d)/√n), df = n − 1, two-sided. Exact sign-flip test: the share of "
                  "all 2^n sign vectors whose |mean| reaches the observed one, two-sided; its smallest possible p is "
                  f"2/2^n ({floor or 'no paired seeds'}), however large and steady the differences."]
        for split in dict.fromkeys(row["split"] for row in comparison["seed_tests"]):
            lines += ["", f"### Test set {cell(split)}", "", "| arm | metric | seeds | Δ per seed | mean Δ | t (df) "
                      "| t-test p | sign-flip p | smallest sign-flip p |", "|---|---|---|---|---|---|---|---|---|"]
            for row in (r for r in comparison["seed_tests"] if r["split"] == split):
                deltas = ", ".join(f"s{s}: {d:+.2f}" for s, d in zip(row["seeds"], row["differences"]))
                mean = "" if row["mean_difference"] is None else f"{row['mean_difference']:+.2f}"
                t = row["t_why"] or f"{row['t']:.2f} ({row['df']})"
                lines.append(f"| {cell(row['arm'])} | {'BLEU' if row['metric'] == 'bleu' else 'chrF'} | "
                             f"{len(row['seeds'])} | {deltas or 'no shared seed'} | {mean} | {t} | "
                             f"{_p(row['t_p_value'])} | {_p(row['sign_flip_p_value'])} | "
                             f"{_p(row['smallest_sign_flip_p'])} |")
    return lines


def selection_markdown(selection: dict | None) -> list[str]:
    """The arms ranked on validation and the one it chooses (or why nothing is chosen) as Markdown lines; with a cap on
    FLOPs, each arm's training plus teacher FLOPs and whether it is within the cap."""
    if selection is None:
        return []
    lines = ["", "## Selection on validation (final models; the test sets play no part in it)", ""]
    cap = selection.get("max_total_flops")
    if selection["chosen"] is None:
        return lines + [f"Nothing is chosen: {selection['why']}; a choice is never made on a test set."]
    capped = cap is not None
    lines += ["| arm | rank | validation BLEU |" + (" training + teacher FLOPs | within the cap |" if capped else ""),
              "|---|---|---|" + ("---|---|" if capped else "")]
    for rank, row in enumerate(selection["ranking"], 1):
        lines.append(f"| {cell(row['arm'])} | {rank} | {fmt_stat(row['valid_bleu'])} |"
                     + (f" {row['total_flops']['mean']:.3g} | {'yes' if row['within_cap'] else 'no'} |" if capped
                        else ""))
    chosen = (f"Validation ({cell(selection['split'])}, mean BLEU over seeds) chooses "
              f"**{cell(selection['chosen'])}**")
    if not capped:
        return lines + ["", chosen + "."]
    over = selection["best_over_cap"]
    return lines + ["", chosen + f" among the arms within {cap:.3g} training plus teacher FLOPs"
                    + (f"; the best arm over the cap is {cell(over)}." if over else ".")]


__all__ = ["FINAL_TRANSLATIONS_DIR", "check_score_fields", "main_split", "read_split_translations", "seed_tests",
           "selection_markdown", "shared_test_splits", "test_scores", "test_set_tables", "test_sets_markdown",
           "valid_score", "validation_selection"]
