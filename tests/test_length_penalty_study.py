"""scripts/length_penalty_study.py: its rule (the highest mean validation BLEU; within 0.1 of the best, the smaller
penalty), the lengths it reads from sacreBLEU's detail line, and a bad stage refused in one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from prunetrain.mt.evaluation.translation import score_translations

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "length_penalty_study.py"


def _study():
    spec = importlib.util.spec_from_file_location("length_penalty_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rule_prefers_the_smaller_penalty_within_a_tenth_of_the_best():
    study = _study()
    rows = {1.0: [{"bleu": 36.0}, {"bleu": 36.1}], 1.3: [{"bleu": 36.1}, {"bleu": 36.05}],
            1.6: [{"bleu": 36.3}, {"bleu": 36.2}], 2.0: [{"bleu": 30.0}, {"bleu": 30.0}]}
    assert study.choose(rows) == 1.6  # 1.0 (36.05) and 1.3 (36.075) are more than 0.1 below 36.25
    rows[1.3] = [{"bleu": 36.2}, {"bleu": 36.15}]  # 36.175: within 0.1 of 36.25, and smaller
    assert study.choose(rows) == 1.3


def test_lengths_come_from_the_scored_translations():
    score = score_translations(["a small dog runs", "a cat"], ["a small dog is running fast", "the cat"])
    lengths = _study().lengths(score)
    assert (lengths["hyp_len"], lengths["ref_len"]) == (6, 8) and lengths["ratio"] == 6 / 8


def test_a_bad_stage_is_one_line_and_exit_2():
    for args in ([], ["tests"], ["valid", "test"]):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines() == [
            f"length_penalty_study.py: stage: {args!r} is not one of valid, test"]
