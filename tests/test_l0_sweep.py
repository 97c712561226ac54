"""The `l0-sweep` recipe kind (Voita et al. 2019 §6 sweeps): a reduced sweep end to end on a smoke run of
wmt-small-deen, resume, outputs read back (JSON, TensorBoard, figures), and clear errors."""

import json
import re

import pytest

from conftest import run_cli
from prunetrain.engine.heads import find_heads
from prunetrain.mt.run.l0_sweep import ALL_KINDS, BUDGET, budget_comparison
from prunetrain.engine.mask import HeadMask
from prunetrain.mt.config.recipe import GateSweepRecipe, load_recipe, recipe_from_dict
from prunetrain.utils.plots import read_image_tags, read_scalars
from prunetrain.mt.evaluation.translation import load_translation_model


def _one_line_error(result, pattern):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-2000:]
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture(scope="module")
def sweep_run(full_smoke_run, multi30k_dir, tmp_path_factory):
    source, made = full_smoke_run
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path_factory.mktemp("l0") / "sweep"
    result = run_cli("recipe", "wmt-small-deen-l0", "--smoke", "--set", f"source={source}", "--data-dir",
                     multi30k_dir, "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    return source, out, result


@pytest.mark.slow
def test_reduced_sweep_runs_end_to_end(sweep_run):
    source, out, result = sweep_run
    summary = json.loads(result.stdout)
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["label"] for r in summary["runs"]] == [r["label"] for r in sweep["runs"]] == [
        "encoder-only_lam0", "encoder-only_lam1", "all-kinds_lam1", "budget_keep0.5"]
    runs = {r["label"]: r for r in sweep["runs"]}
    for label in ("encoder-only_lam0", "encoder-only_lam1"):  # only encoder heads are gated
        assert runs[label]["kept_per_kind"]["decoder_self"] == 8 and runs[label]["kept_per_kind"]["cross"] == 8
        assert runs[label]["kinds"] == ["encoder_self"] and runs[label]["freeze"] == "decoder"
    assert runs["all-kinds_lam1"]["heads_kept"] < 24  # λ = 1 is huge against a per-token loss: heads go
    layout = find_heads(load_translation_model(source / "full"))
    for record in sweep["runs"]:
        mask = HeadMask.from_json(out / "runs" / record["label"] / "final_mask.json", layout)
        assert mask.num_kept == record["heads_kept"] == sum(record["kept_per_kind"].values())
        assert {k: sum(v) for k, v in record["kept_per_layer"].items()} == record["kept_per_kind"]
        assert sum(len(v) for v in record["survivors"].values()) == record["heads_kept"]
        assert record["trace"] and all("open_per_kind" in t for t in record["trace"])
        assert 0 <= record["bleu"] <= 100 and record["bleu_signature"].startswith("nrefs:1")
    # which heads survive is recorded per site with original head indices
    assert all(set(v) <= set(range(4)) for v in runs["budget_keep0.5"]["survivors"].values())
    comparison = sweep["budget_comparison"][0]
    assert comparison["budget_run"] == "budget_keep0.5" and comparison["closest_lambda_run"]["label"] == "all-kinds_lam1"
    scratch = sweep["scratch"]
    assert scratch["from_run"] == "budget_keep0.5" and scratch["steps_done"] == 4
    assert scratch["heads_kept"] == runs["budget_keep0.5"]["heads_kept"]
    # the equal-steps reference: the source's own 0 %-pruned curve point at epoch 2 = step 40 (1000 pairs / 50)
    assert [(c["epoch"], c["step"]) for c in scratch["source_curve"]] == [(2, 40)]
    assert [b["encoder_heads"] for b in sweep["importance_baseline"]] == sorted(
        {runs["encoder-only_lam0"]["kept_per_kind"]["encoder_self"],
         runs["encoder-only_lam1"]["kept_per_kind"]["encoder_self"]})
    for name in ("fig7_encoder_sweep.png", "fig9_heads_per_kind.png", "fig10_decoder_layers.png"):
        assert (out / name).stat().st_size > 1000
    note = (out / "results.md").read_text()
    assert "Encoder-only gates, decoder frozen" in note and "Table 2" in note and "From scratch" in note
    # TensorBoard: sweep-level scalars (x = heads kept) and figures, per-run heads alive by step
    scalars = read_scalars(out / "tensorboard")
    assert len(scalars["sweep/encoder-only/bleu"]) == 2
    assert {step for step, _ in scalars["sweep/all-kinds/heads/cross"]} == {runs["all-kinds_lam1"]["heads_kept"]}
    assert {"sweep/fig7", "sweep/fig9", "sweep/fig10"} <= set(read_image_tags(out / "tensorboard"))
    by_step = read_scalars(out / "runs" / "all-kinds_lam1" / "tensorboard")["prunetrain/heads_alive_by_step"]
    assert [step for step, _ in by_step] == [t["step"] for t in runs["all-kinds_lam1"]["trace"]]


@pytest.mark.slow
def test_resume_skips_finished_runs_and_refuses_a_used_directory(sweep_run, multi30k_dir):
    source, out, _ = sweep_run
    before = json.loads((out / "sweep.json").read_text())
    finished = run_cli("recipe", "wmt-small-deen-l0", "--smoke", "--set", f"source={source}", "--data-dir",
                       multi30k_dir, "--output", out, "--resume")
    _one_line_error(finished, r"--resume: .* holds a finished run \(run_complete.json\); there is nothing to resume")
    (out / "run_complete.json").unlink()  # a sweep stopped after its last gate run: the resume skips every run
    again = run_cli("recipe", "wmt-small-deen-l0", "--smoke", "--set", f"source={source}", "--data-dir",
                    multi30k_dir, "--output", out, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("done before") == 4
    after = json.loads((out / "sweep.json").read_text())
    assert [(r["label"], r["heads_kept"], r["bleu"]) for r in after["runs"]] == [
        (r["label"], r["heads_kept"], r["bleu"]) for r in before["runs"]]
    assert after["scratch"] == before["scratch"]
    assert (before["resumed_runs"], after["resumed_runs"]) == (0, 4)
    assert after["run_minutes"] == pytest.approx(before["run_minutes"])  # the runs' own times, kept from the first
    assert "4 gate runs were done before and skipped" in (out / "results.md").read_text()
    _one_line_error(run_cli("recipe", "wmt-small-deen-l0", "--smoke", "--set", f"source={source}", "--data-dir",
                            multi30k_dir, "--output", out), r"--output: .* already holds a finished run; pass --overwrite")
    stored = (out / "recipe.yaml").read_text()
    changed = run_cli("recipe", "wmt-small-deen-l0", "--smoke", "--set", f"source={source}", "--set", "train.steps=7",
                      "--data-dir", multi30k_dir, "--output", out, "--resume")
    _one_line_error(changed, r"--resume: the recipe differs from the one .* was started with in train.steps;")
    assert (out / "recipe.yaml").read_text() == stored  # the run's record is never rewritten


def test_budget_comparison_interpolates_the_lambda_sweep_at_equal_heads():
    runs = [{"group": ALL_KINDS, "label": "a", "heads_kept": 40, "bleu": 30.0},
            {"group": ALL_KINDS, "label": "b", "heads_kept": 20, "bleu": 20.0},
            {"group": BUDGET, "label": "k", "target_heads": 0.25, "heads_kept": 35, "bleu": 29.0},
            {"group": BUDGET, "label": "k2", "target_heads": 0.1, "heads_kept": 10, "bleu": 5.0}]
    first, second = budget_comparison(runs)
    assert first["bleu_lambda_interpolated"] == pytest.approx(27.5)
    assert first["closest_lambda_run"]["label"] == "a"
    assert second["bleu_lambda_interpolated"] is None and second["closest_lambda_run"]["label"] == "b"


def test_sweep_recipe_validation(tmp_path, multi30k_dir):
    recipe = load_recipe("wmt-small-deen-l0", ["sweep.budgets=[0.5]", "train.steps=3"])
    assert isinstance(recipe, GateSweepRecipe) and recipe.sweep.budgets == [0.5] and recipe.train.steps == 3
    with pytest.raises(ValueError, match=r"sweep.budget: unknown key; valid keys in sweep are encoder_lambdas, "):
        recipe_from_dict({"kind": "l0-sweep", "sweep": {"budget": [0.5]}})
    with pytest.raises(ValueError, match=r"kind: 'nope' is not a recipe kind; allowed: translation, l0-sweep"):
        recipe_from_dict({"kind": "nope"})
    missing = tmp_path / "no-run"
    _one_line_error(run_cli("recipe", "wmt-small-deen-l0", "--set", f"source={missing}", "--output", tmp_path / "o"),
                    r"source: '.*no-run' holds no trained model .* run the full model first "
                    r"\(`prunetrain recipe wmt-small-deen --set 'pruning.schedule_steps=\{\}'")
    assert not (tmp_path / "o").exists()  # nothing written before the inputs are checked


@pytest.mark.parametrize("override, pattern", [
    ("sweep.budgets=[1.5]", r"sweep.budgets: 1.5 is not allowed; expected a finite number in \(0, 1\]"),
    ("sweep.encoder_lambdas=[-1]", r"sweep.encoder_lambdas: -1.0 is not allowed; expected a finite number in \[0, "),
    ("sweep.scratch_run=lambda:7", r"sweep.scratch_run: λ 7.0 is not in sweep.all_lambdas"),
    ("train.steps=0", r"train.steps: 0 is not allowed; expected an integer >= 1"),
    ("train.gate_lr=0", r"train.gate_lr: 0.0 is not allowed; expected a finite number > 0"),
    ("eval.num_beams=0", r"eval.num_beams: 0 is not allowed; expected an integer >= 1"),
])
def test_bad_sweep_values_are_one_line_errors(override, pattern, tmp_path):
    result = run_cli("recipe", "wmt-small-deen-l0", "--set", override, "--set", f"source={tmp_path}",
                     "--output", tmp_path / "o")
    _one_line_error(result, pattern)
    assert not (tmp_path / "o").exists()
