"""`prunetrain compare` across seeds and test sets: Student's t and the exact sign-flip test against known values and
brute force, and comparisons of run directories written here with real sacreBLEU scores of real Multi30k sentences
(validation, three test sets, per-set translations), of runs written before those fields existed, and the refusals."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hostile import assert_one_line, run_main

from prunetrain.methods.seed_tests import (paired_t_test, regularized_incomplete_beta, sign_flip_p,
                                           smallest_sign_flip_p, t_two_sided_p)
from prunetrain.methods.significance import paired_bootstrap
from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats, bleu_sentence_stats

SPLITS = ("valid", "test", "test_2017_flickr", "test_2017_mscoco")
SENTENCES = 30


# ---------------------------------------------------------------------------------------------------------------------
# the tests across seeds
# ---------------------------------------------------------------------------------------------------------------------
def test_student_t_tails_match_tables_and_closed_forms():
    # tables of Student's t: the two-sided 5 % and 1 % critical values
    for t, df, p in [(2.776, 4, 0.05), (2.571, 5, 0.05), (12.706, 1, 0.05), (4.604, 4, 0.01), (2.228, 10, 0.05)]:
        assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-4), (t, df)
    for t in (0.1, 0.5, 1.0, 3.0, 40.0):
        cauchy = 1 - 2 * math.atan(t) / math.pi  # df = 1
        df2 = 1 - t / math.sqrt(2 + t * t)  # df = 2
        assert t_two_sided_p(t, 1) == pytest.approx(cauchy, rel=1e-12)
        assert t_two_sided_p(-t, 2) == pytest.approx(df2, rel=1e-12)
    assert t_two_sided_p(1.96, 1e7) == pytest.approx(math.erfc(1.96 / math.sqrt(2)), rel=1e-5)  # the normal limit
    assert t_two_sided_p(0.0, 3) == 1.0 and t_two_sided_p(math.inf, 3) == 0.0
    for x, a, b in [(0.3, 1.0, 1.0), (0.7, 2.5, 1.0), (0.2, 3.0, 4.0), (0.9, 0.5, 7.0)]:
        assert regularized_incomplete_beta(x, a, b) == pytest.approx(1 - regularized_incomplete_beta(1 - x, b, a))
    assert regularized_incomplete_beta(0.3, 1.0, 1.0) == pytest.approx(0.3)
    assert regularized_incomplete_beta(0.7, 2.5, 1.0) == pytest.approx(0.7 ** 2.5)
    binomial = sum(math.comb(6, k) * 0.2 ** k * 0.8 ** (6 - k) for k in range(3, 7))  # P(Bin(a + b − 1, x) ≥ a)
    assert regularized_incomplete_beta(0.2, 3.0, 4.0) == pytest.approx(binomial, rel=1e-12)
    with pytest.raises(ValueError, match=r"^t_two_sided_p: needs a number t and df > 0"):
        t_two_sided_p(1.0, 0)


def test_the_paired_t_test_on_per_seed_differences():
    result = paired_t_test([1.0, 2.0, 4.0])  # mean 7/3, sd √(7/3), t = (7/3) / (√(7/3)/√3) = √7, df 2
    assert result["t"] == pytest.approx(math.sqrt(7)) and result["df"] == 2
    assert result["p_value"] == pytest.approx(1 - math.sqrt(7) / math.sqrt(9), rel=1e-12)
    for differences, why in [([0.5, 0.5, 0.5], r"same difference \(sd 0\): t is undefined"),
                             ([0.5], r"1 paired seed; a t-test needs at least 2"), ([], r"0 paired seeds")]:
        result = paired_t_test(differences)
        assert result["t"] is None and result["p_value"] is None
        assert __import__("re").search(why, result["why"]), result["why"]


def _sign_flip_exact(decimals: list[str]) -> float:
    """The sign-flip p counted in exact rational arithmetic (no float ties to worry about)."""
    d = [Fraction(x) for x in decimals]
    observed = abs(sum(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= observed for signs in itertools.product((1, -1),
                                                                                                   repeat=len(d)))
    return hits / 2 ** len(d)


def test_the_sign_flip_test_enumerates_every_sign_vector():
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25  # only +++ and −−− reach |mean| 2
    for decimals in (["0.3", "-0.1", "-0.2", "0.5"], ["0.1", "0.2", "-0.3"], ["0.7", "0.1", "0.2", "-0.3", "0.4"],
                     ["1.1", "2.2", "-3.3", "0.0", "0.55", "0.45"]):
        assert sign_flip_p([float(x) for x in decimals]) == _sign_flip_exact(decimals), decimals  # float ties kept
    rng = np.random.default_rng(0)
    for n in (2, 5, 8):
        values = [f"{v:.2f}" for v in rng.normal(0.3, 1.0, n)]
        assert sign_flip_p([float(x) for x in values]) == _sign_flip_exact(values)
    for n in (1, 3, 5, 17):  # the floor 2/2^n: all differences of one sign, however large
        assert sign_flip_p([0.1 * (k + 1) for k in range(n)]) == smallest_sign_flip_p(n) == 2 / 2 ** n
    assert smallest_sign_flip_p(5) == 0.0625 > 0.05 > smallest_sign_flip_p(6)
    assert sign_flip_p([]) is None and smallest_sign_flip_p(0) is None
    with pytest.raises(ValueError, match=r"^sign_flip_p: 25 differences would need 2\^25 sign vectors"):
        sign_flip_p([1.0] * 25)


# ---------------------------------------------------------------------------------------------------------------------
# run directories: the new fields from real sacreBLEU scores of real sentences, and runs written before them
# ---------------------------------------------------------------------------------------------------------------------
def _references(multi30k_dir: Path, split: str) -> list[str]:
    return (Path(multi30k_dir) / f"{split}.en").read_text(encoding="utf-8").splitlines()[:SENTENCES]


def _hypotheses(references: list[str], drop_every: int, shift: int) -> list[str]:
    """The references with every `drop_every`-th sentence (from `shift`) losing its last word: a system whose
    quality falls as `drop_every` shrinks."""
    return [" ".join(r.split()[:-1]) if (i + shift) % drop_every == 0 else r for i, r in enumerate(references)]


def _write_run(run: Path, seed: int, quality: dict[str, int], multi30k_dir: Path, *, new_format: bool = True,
               sentences: dict[str, int] | None = None, count_key: str = "num_sentences") -> dict:
    """A finished run directory: results.json (every field compare reads) and the translations, scored by sacreBLEU
    on the first sentences of each split. `quality[split]`: every how many sentences one word is dropped; the number
    of sentences under `count_key` (the runner's `evaluate_bleu` writes `num_sentences`)."""
    from sacrebleu.metrics import BLEU, CHRF

    run.mkdir(parents=True)
    (run / "final_translations").mkdir()
    scores = {}
    for split in SPLITS if new_format else ("test",):
        references = _references(multi30k_dir, split)[:(sentences or {}).get(split, SENTENCES)]
        hypotheses = _hypotheses(references, quality[split], seed)
        bleu, chrf = BLEU().corpus_score(hypotheses, [references]), CHRF().corpus_score(hypotheses, [references])
        stats = bleu_sentence_stats(hypotheses, references)
        assert bleu_from_stats(np.sum(stats, axis=0)) == pytest.approx(bleu.score)
        scores[split] = {"bleu": bleu.score, "chrf": chrf.score, count_key: len(references), "num_beams": 1,
                         "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"}
        translations = {"hypotheses": hypotheses, "sentence_stats": stats, "bleu": bleu.score, "chrf": chrf.score}
        if split == "test":
            (run / "test_translations.json").write_text(json.dumps(translations))
        if new_format:
            (run / "final_translations" / f"{split}.json").write_text(json.dumps(translations))
    test = dict(scores["test"])
    results = {"recipe": {"train": {"seed": seed}, "data": {"test_split": "test"}}, "heads_kept": 36, "steps": 20,
               "train_step_minutes": 1.0, "train_minutes": 1.2, "total_minutes": 2.0, "parameters_final": 1000,
               "train_flops": 1e12, "test_pruned": test, "step_rate": [], "pruning_events": [],
               "bleu_over_training": [{"step": 10, "step_seconds": 30.0, "bleu": test["bleu"] - 2.0, "heads": 36,
                                       "flops": 5e11, "flops_target": 5e11},
                                      {"step": 20, "step_seconds": 60.0, "bleu": test["bleu"], "heads": 36,
                                       "flops": 1e12, "flops_target": None}]}
    if new_format:
        results.update(final_scores=scores, valid_split="valid", test_splits=list(SPLITS[1:]))
        results["bleu_over_training"][0].update(valid_bleu=scores["valid"]["bleu"] - 3.0, valid_chrf=50.0)
    (run / "results.json").write_text(json.dumps(results))
    return results


# per arm and seed, every how many sentences a word is dropped (smaller: worse); validation ranks "full" first,
# the main test set ranks "default" first, so a choice made on the test set would differ
QUALITY = {"default": {"valid": 5, "test": 9, "test_2017_flickr": 6, "test_2017_mscoco": 4},
           "full": {"valid": 9, "test": 4, "test_2017_flickr": 3, "test_2017_mscoco": 5},
           "scratch": {"valid": 3, "test": 3, "test_2017_flickr": 8, "test_2017_mscoco": 2}}


@pytest.fixture
def arms(tmp_path, multi30k_dir):
    """default seeds 0–2, full seeds 0–2, scratch seeds 0 and 2 (seed 1 never ran)."""
    runs = {}
    for arm, seeds in (("default", (0, 1, 2)), ("full", (0, 1, 2)), ("scratch", (0, 2))):
        for seed in seeds:
            quality = {split: q + (seed % 2 if arm == "default" else 0) for split, q in QUALITY[arm].items()}
            runs[tmp_path / f"{arm}-s{seed}"] = (arm, _write_run(tmp_path / f"{arm}-s{seed}", seed, quality,
                                                                 multi30k_dir))
    return runs


def test_compare_reports_every_test_set_the_tests_across_seeds_and_the_choice_on_validation(monkeypatch, capsys,
                                                                                          arms, tmp_path):
    dirs, names = list(arms), ",".join(arm for arm, _ in arms.values())
    code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output", tmp_path / "cmp",
                            "--bootstrap-samples", "50")
    assert code == 0, err
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    scores = {(arm, r["recipe"]["train"]["seed"]): r["final_scores"] for arm, r in arms.values()}
    by_arm = {a["arm"]: a for a in data["arms"]}
    valid = [scores["full", s]["valid"]["bleu"] for s in (0, 1, 2)]
    assert by_arm["full"]["valid_bleu"]["values"] == valid and by_arm["full"]["valid_bleu"]["sd"] == \
        pytest.approx(statistics.stdev(valid))
    at = {(row["arm"], row["flops"]): row for row in data["equal_flops"]}
    assert at["scratch", 5e11]["valid_bleu"]["values"] == [scores["scratch", s]["valid"]["bleu"] - 3.0 for s in (0, 2)]
    # every test set, the main one first, BLEU and chrF per seed with mean ± sample sd
    assert [t["split"] for t in data["test_sets"]] == ["test", "test_2017_flickr", "test_2017_mscoco"]
    mscoco = {a["arm"]: a for a in data["test_sets"][2]["arms"]}["default"]
    chrf = [scores["default", s]["test_2017_mscoco"]["chrf"] for s in (0, 1, 2)]
    assert [e["chrf"] for e in mscoco["per_seed"]] == chrf and mscoco["chrf"]["sd"] == pytest.approx(
        statistics.stdev(chrf)) and data["test_sets"][2]["sentences"] == SENTENCES
    # across seeds: scratch against default on the seeds both ran (0 and 2)
    row = next(r for r in data["seed_tests"] if (r["split"], r["metric"], r["arm"]) == ("test_2017_flickr", "chrf",
                                                                                          "scratch"))
    differences = [scores["scratch", s]["test_2017_flickr"]["chrf"] - scores["default", s]["test_2017_flickr"]["chrf"]
                   for s in (0, 2)]
    assert row["seeds"] == [0, 2] and row["differences"] == pytest.approx(differences)
    assert row["t_p_value"] == pytest.approx(paired_t_test(differences)["p_value"])
    assert row["sign_flip_p_value"] == sign_flip_p(differences) and row["smallest_sign_flip_p"] == 0.5
    assert len(data["seed_tests"]) == 3 * 2 * 2  # test sets × metrics × other arms
    # the per-seed bootstrap on every test set, from final_translations/SPLIT.json
    flickr = data["bootstrap_by_split"]["test_2017_flickr"]
    assert [(r["arm"], r["seed"]) for r in flickr] == [("full", 0), ("full", 1), ("full", 2), ("scratch", 0),
                                                       ("scratch", 2)]
    stats = {name: json.loads((tmp_path / name / "final_translations" / "test_2017_flickr.json").read_text())[
        "sentence_stats"] for name in ("default-s1", "full-s1")}
    assert flickr[1]["p_value"] == paired_bootstrap(stats["default-s1"], stats["full-s1"], bleu_from_stats,
                                                    samples=50)
    assert data["paired_tests"] == data["bootstrap_by_split"]["test"]
    # validation chooses "full" (the test set would have chosen "default")
    selection = data["selection"]
    assert (selection["metric"], selection["split"], selection["chosen"]) == ("bleu", "valid", "full")
    assert [r["arm"] for r in selection["ranking"]] == ["full", "default", "scratch"]
    assert max(data["test_sets"][0]["arms"], key=lambda a: a["bleu"]["mean"])["arm"] == "default"
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    for text in ("| arm | seeds | test BLEU | chrF | validation BLEU |", "### Validation BLEU at the same FLOP points",
                 "## Main test set test (final models, 30 sentences", "## Test set test_2017_mscoco",
                 "## Paired tests across seeds", "with 2 seeds it is 2/2^2 = 0.5, which cannot reach 0.05",
                 "with 3 seeds it is 2/2^3 = 0.25", "### Test set test_2017_flickr", "## Paired bootstrap",
                 "Validation (valid, mean BLEU over seeds) chooses **full**."):
        assert text in markdown, text


def test_a_cap_on_training_plus_teacher_flops_chooses_within_it_and_names_the_best_over_it(monkeypatch, capsys,
                                                                                             arms, tmp_path):
    """--max-total-flops: the choice on validation among the arms whose mean training plus teacher FLOPs (word-level
    forwards and sequence-level translations both counted) stay within the budget, in the full and the
    validation-only comparison alike; the best arm over it is named beside the choice."""
    teachers = {"full": {"distillation": {"teacher_forward_flops": 5e11}},  # 1.5e12 in all: over the cap
                "default": {"sequence_distillation": {"generation_flops_estimate": 1e11}}}  # 1.1e12: within
    for run, (arm, results) in arms.items():
        results.update(teachers.get(arm, {}))
        (run / "results.json").write_text(json.dumps(results))
    dirs, names = list(arms), ",".join(arm for arm, _ in arms.values())
    for mode in ((), ("--validation-only",)):
        out = tmp_path / f"cap{len(mode)}"
        code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output", out,
                                "--max-total-flops", "1.2e12", *mode)
        assert code == 0, err
        selection = json.loads((out / "compare.json").read_text())["selection"]
        assert (selection["chosen"], selection["best_over_cap"], selection["max_total_flops"]) == ("default", "full",
                                                                                                   1.2e12)
        rows = {r["arm"]: r for r in selection["ranking"]}
        assert [r["arm"] for r in selection["ranking"]] == ["full", "default", "scratch"]
        assert {a: (r["total_flops"]["mean"], r["within_cap"]) for a, r in rows.items()} == {
            "full": (1.5e12, False), "default": (1.1e12, True), "scratch": (1e12, True)}
        markdown = (out / "compare.md").read_text()
        assert "| full | 1 | " in markdown and "| 1.5e+12 | no |" in markdown, markdown
        assert "chooses **default** among the arms within 1.2e+12 training plus teacher FLOPs; the best arm over " \
               "the cap is full." in markdown
    # without a cap the best arm is chosen, whatever its FLOPs; a cap no arm meets chooses nothing, and says why
    code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output", tmp_path / "nocap",
                            "--validation-only")
    assert code == 0, err
    assert json.loads((tmp_path / "nocap" / "compare.json").read_text())["selection"]["chosen"] == "full"
    code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output", tmp_path / "none",
                            "--validation-only", "--max-total-flops", "9e11")
    assert code == 0, err
    selection = json.loads((tmp_path / "none" / "compare.json").read_text())["selection"]
    assert selection["chosen"] is None and selection["why"] == (
        "no arm's mean training plus teacher FLOPs is within the cap of 9e+11 (the least: scratch at 1e+12)")
    # a run that recorded no training FLOPs: the cap cannot be applied, so nothing is chosen (and it says which run)
    run, (arm, results) = next((d, a) for d, a in arms.items() if a[0] == "scratch")
    del results["train_flops"]
    (run / "results.json").write_text(json.dumps(results))
    code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output",
                            tmp_path / "unmeasured", "--validation-only", "--max-total-flops", "1.2e12")
    assert code == 0, err
    selection = json.loads((tmp_path / "unmeasured" / "compare.json").read_text())["selection"]
    assert selection["chosen"] is None and selection["why"] == (
        f"no training FLOPs recorded by scratch seed {results['recipe']['train']['seed']}, so the cap of 1.2e+12 "
        f"FLOPs cannot be applied")
    for bad in ("0", "-1e12", "nan", "inf"):
        assert_one_line(run_main(monkeypatch, capsys, "compare", *dirs, "--names", names, "--output",
                                 tmp_path / "bad", "--max-total-flops", bad),
                        r"^prunetrain: error: --max-total-flops: .* is not allowed; expected a finite number > 0\.$")
        assert not (tmp_path / "bad").exists()


def test_runs_written_before_validation_and_more_test_sets_still_compare(monkeypatch, capsys, tmp_path,
                                                                         multi30k_dir):
    dirs = [tmp_path / "a0", tmp_path / "a1", tmp_path / "b0", tmp_path / "b1"]
    for path, seed, drop in zip(dirs, (0, 1, 0, 1), (4, 5, 3, 2)):
        _write_run(path, seed, {"test": drop}, multi30k_dir, new_format=False)
    code, _, err = run_main(monkeypatch, capsys, "compare", *dirs, "--names", "a,a,b,b", "--output", tmp_path / "cmp",
                            "--bootstrap-samples", "20")
    assert code == 0, err
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [t["split"] for t in data["test_sets"]] == ["test"] and data["arms"][0]["valid_bleu"]["n"] == 0
    assert data["selection"]["chosen"] is None and data["selection"]["ranking"] == []
    assert data["selection"]["why"] == "none of the 4 runs recorded a validation score"
    assert [r["metric"] for r in data["seed_tests"]] == ["bleu", "chrf"] and data["seed_tests"][0]["seeds"] == [0, 1]
    assert [r["p_value"] is not None for r in data["paired_tests"]] == [True, True]  # from test_translations.json
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| not recorded |" in markdown and "### Validation BLEU" not in markdown
    assert "Nothing is chosen: none of the 4 runs recorded a validation score; a choice is never made on a test " \
           "set." in markdown
    # one new run beside old ones: the main test set only, and still no choice
    _write_run(tmp_path / "c0", 0, QUALITY["full"], multi30k_dir)
    code, _, err = run_main(monkeypatch, capsys, "compare", dirs[0], tmp_path / "c0", "--output", tmp_path / "mixed")
    assert code == 0, err
    data = json.loads((tmp_path / "mixed" / "compare.json").read_text())
    assert [t["split"] for t in data["test_sets"]] == ["test"] and list(data["bootstrap_by_split"]) == ["test"]
    assert data["selection"]["why"] == "no validation score recorded by a0 seed 0"


def test_compare_refuses_test_sets_of_different_sizes_and_damaged_score_fields(monkeypatch, capsys, tmp_path,
                                                                               multi30k_dir):
    _write_run(tmp_path / "a", 0, QUALITY["default"], multi30k_dir)
    _write_run(tmp_path / "b", 0, QUALITY["full"], multi30k_dir, sentences={"test_2017_mscoco": SENTENCES - 1},
               count_key="sentences")
    assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", "--output",
                             tmp_path / "out"),
                    r"^prunetrain: error: runs: arm 'b' seed 0 scored 29 sentences of test set 'test_2017_mscoco' "
                    r"and arm 'a' seed 0 30; a paired test needs the same sentences\.$")
    assert not (tmp_path / "out").exists()
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    for change, pattern in [
        (lambda r: r["final_scores"]["test_2017_flickr"].update(chrf="high"),
         r"field 'final_scores.test_2017_flickr.chrf' is 'high', not a number"),
        (lambda r: r["final_scores"]["valid"].pop("bleu"), r"field 'final_scores.valid.bleu' is missing"),
        (lambda r: r["final_scores"]["test"].update(sentences=29.5), r"field 'final_scores.test.sentences' is 29.5, "
                                                                     r"not a count"),
        (lambda r: r.update(test_splits=["test", "../../etc"]), r"field 'test_splits' names '../../etc', not a split"),
        (lambda r: r.update(valid_split="dev"), r"field 'valid_split' is 'dev', not a key of final_scores"),
        (lambda r: r["bleu_over_training"][0].update(valid_bleu="x"),
         r"field 'bleu_over_training\[0\].valid_bleu' is 'x', not a number"),
        (lambda r: r.update(test_splits=["test_2017_flickr", "test"]),
         r"runs: arm 'b' seed 0 has main test set 'test_2017_flickr' and arm 'a' 'test'; compare runs scored on the "
         r"same main test set\.$"),
    ]:
        damaged = json.loads(json.dumps(results))
        change(damaged)
        (tmp_path / "b" / "results.json").write_text(json.dumps(damaged))
        assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", "--output",
                                 tmp_path / "out"), pattern)
        assert not (tmp_path / "out").exists()


def test_compare_resolves_paths_and_refuses_one_run_twice(monkeypatch, capsys, tmp_path, multi30k_dir):
    """A run given twice (through a symlink, `a/../a`, a copy of its directory, or under two names) is refused in
    both modes before anything is written: comparing a run with itself would pass for two seeds or two arms."""
    import shutil

    _write_run(tmp_path / "a", 0, QUALITY["default"], multi30k_dir)
    _write_run(tmp_path / "b", 1, QUALITY["full"], multi30k_dir)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    for mode in ([], ["--validation-only"]):
        for twice, pattern in [
            (tmp_path / "link", r"runs: '.*link' is the same directory as '.*a' \(both resolve to '.*a'\); give each "
                                r"run once\.$"),
            (tmp_path / "b" / ".." / "a", r"is the same directory as"),
            (tmp_path / "copy", r"runs: '.*copy' holds the same results\.json as '.*a' \(a copy of one run\); give "
                                r"each run once\.$"),
        ]:
            assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", twice,
                                     "--names", "x,y,z", *mode, "--output", tmp_path / "out"), pattern)
            assert not (tmp_path / "out").exists()
        assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "a", "--names", "x,y",
                                 *mode, "--output", tmp_path / "out"), r"is the same directory as")


def test_validation_only_obeys_the_rules_of_the_full_comparison(monkeypatch, capsys, tmp_path, multi30k_dir):
    """`--validation-only` refuses what it would silently ignore (`--bootstrap-samples`: it runs no bootstrap) and
    ranks validation scores only over the same sentences, as the full comparison pairs test sets."""
    _write_run(tmp_path / "a", 0, QUALITY["default"], multi30k_dir)
    _write_run(tmp_path / "b", 0, QUALITY["full"], multi30k_dir, sentences={"valid": 5})
    assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", "--validation-only",
                             "--bootstrap-samples", "50", "--output", tmp_path / "out"),
                    r"^prunetrain: error: samples: 50 given with validation_only; a validation-only comparison runs "
                    r"no bootstrap on a test set, so leave --bootstrap-samples out\.$")
    for mode in ([], ["--validation-only"]):
        assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", *mode,
                                 "--output", tmp_path / "out"),
                        r"^prunetrain: error: runs: arm 'b' seed 0 scored 5 sentences of validation split 'valid' "
                        r"and arm 'a' seed 0 30; a choice on validation compares scores of the same sentences\.$")
        assert not (tmp_path / "out").exists()
