"""Time to quality (`prunetrain.mt.comparison.time_to_quality`), on the proof's kept equal-time runs (real records:
recipes/results/wmt-small-deen-proof, five seeds of the default, the full model and the default from scratch)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from prunetrain.mt.comparison.compare import write_comparison
from prunetrain.mt.comparison.time_to_quality import minutes_to_reach, run_curve, time_to_quality

KEPT = Path(__file__).resolve().parents[1] / "recipes" / "results" / "wmt-small-deen-proof"
ARMS = ["early-cooldown-time20min-measure", "off-cooldown-time20min-measure",
        "scratch-of-early-cooldown-time20min-measure"]


def _runs(arm: str, seeds=range(5)) -> list[dict]:
    return [json.loads((KEPT / f"{arm}-s{seed}" / "results.json").read_text()) for seed in seeds]


def test_minutes_to_reach_interpolates_from_the_point_before():
    curve = [{"key": 1, "minutes": 2.0, "bleu": 10.0}, {"key": 2, "minutes": 4.0, "bleu": 20.0},
             {"key": 3, "minutes": 6.0, "bleu": 18.0}, {"key": "final", "minutes": 8.0, "bleu": 25.0}]
    assert minutes_to_reach(curve, 15.0) == 3.0
    assert minutes_to_reach(curve, 5.0) == 2.0  # already there at the first point
    assert minutes_to_reach(curve, 20.0) == 4.0
    assert minutes_to_reach(curve, 22.0) == pytest.approx(6.0 + (22 - 18) / (25 - 18) * 2)  # after a dip
    assert minutes_to_reach(curve, 25.5) is None


def test_the_proofs_equal_time_runs():
    arms = {arm: _runs(arm) for arm in ARMS}
    result = time_to_quality(arms)
    assert result["target_arm"] == "off-cooldown-time20min-measure"  # the largest final model: every head
    finals = [r["final_scores"][r["valid_split"]]["bleu"] for r in arms["off-cooldown-time20min-measure"]]
    assert result["target"] == pytest.approx(statistics.fmean(finals))
    for row in result["arms"]:
        runs = arms[row["arm"]]
        assert row["runs"] == 5 and len(row["per_run"]) == 5
        for results, minutes in zip(runs, row["per_run"]):
            # the same question answered by hand from the run's records
            points = [(p["train_seconds"] / 60 if p.get("kind") != "final" else results["train_seconds"] / 60,
                       p["valid_bleu"]) for p in results["bleu_over_training"] if p.get("valid_bleu") is not None]
            assert len(points) >= 5 and points[-1][1] == results["final_scores"]["valid"]["bleu"]
            first = next((i for i, (_, b) in enumerate(points) if b >= result["target"]), None)
            if first is None:
                assert minutes is None
            else:
                assert points[max(first - 1, 0)][0] <= minutes <= points[first][0]
        assert row["reached"] == sum(m is not None for m in row["per_run"])
    off = next(r for r in result["arms"] if r["arm"] == "off-cooldown-time20min-measure")
    assert 1 <= off["reached"] <= 4  # its own mean: the better seeds reach it at the end, the others never
    curve = result["curves"]["early-cooldown-time20min-measure"]
    assert [p["key"] for p in curve][-1] == "final" and all(p["bleu"]["n"] == 5 for p in curve)
    assert [p["minutes"] for p in curve] == sorted(p["minutes"] for p in curve)
    assert run_curve({"bleu_over_training": [{"step": 5, "bleu": 1.0}]}) == []  # no validation recorded


@pytest.mark.slow
def test_compare_shows_time_to_quality_with_its_figure(tmp_path):
    dirs = [KEPT / f"{arm}-s{seed}" for arm in ARMS[:2] for seed in (0, 1)]
    names = [arm for arm in ARMS[:2] for _ in (0, 1)]
    comparison = write_comparison(dirs, tmp_path / "cmp", names, samples=50)
    assert comparison["time_to_quality"]["target_arm"] == "off-cooldown-time20min-measure"
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "## Time to quality (validation BLEU over training minutes)" in markdown
    assert "![Validation BLEU over training minutes](time_to_quality.png)" in markdown
    assert (tmp_path / "cmp" / "time_to_quality.png").read_bytes()[:4] == b"\x89PNG"
    stored = json.loads((tmp_path / "cmp" / "compare.json").read_text())["time_to_quality"]
    assert stored["target"] == comparison["time_to_quality"]["target"]
