"""The command line: one-line errors with exit code 2 (no traceback), recipe validation, and the thin commands on a
real saved model."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from conftest import run_cli
from prunetrain.mt.config.recipe import load_recipe, recipe_from_dict

REPO = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    return run_cli(*args, cwd=cwd)


def assert_user_error(result, pattern):
    import re

    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_recipe_list_and_show():
    listed = cli("recipe", "--list")
    assert listed.returncode == 0 and "wmt-small-deen" in listed.stdout.split()
    shown = cli("recipe", "wmt-small-deen", "--set", "train.epochs=3", "--show")
    assert shown.returncode == 0 and "epochs: 3" in shown.stdout and "heads: 8" in shown.stdout


@pytest.mark.parametrize("args, pattern", [
    (["recipe", "nope"], r"recipe: 'nope' is not a recipe; available: .*wmt-small-deen"),
    (["recipe", "wmt-small-deen", "--set", "train.epochz=3"],
     r"--set train.epochz: unknown key 'epochz'; valid keys in train are epochs, batch_size"),
    (["recipe", "wmt-small-deen", "--set", "train.epochs=three", "--show"], r"train.epochs: 'three' is not an integer"),
    (["recipe", "wmt-small-deen", "--set", "model=3"], r"--set model: 'model' is a section"),
    (["recipe", "wmt-small-deen", "--set", "epochs"], r"--set: 'epochs' is not of the form section.key=value"),
    (["recipe", "wmt-small-deen", "--data-dir", "/nonexistent/dir"], r"data: '/nonexistent/dir' is not a directory"),
])
def test_bad_recipe_input_is_one_line_and_exit_2(args, pattern):
    assert_user_error(cli(*args), pattern)


RUN_MARKED = {".prunetrain-output.json": '{"kind": "recipe-run", "version": 1, "entries": null}'}  # a run's marker


@pytest.mark.parametrize("files, pattern", [
    ({"recipe.yaml": "name: x\n", "run_complete.json": "{}", **RUN_MARKED},
     r"--output: '.*run' already holds a finished run; pass --overwrite to replace it"),
    ({"recipe.yaml": "name: x\n", "checkpoint-5/trainer_state.json": "{}", **RUN_MARKED},
     r"--output: '.*run' holds an unfinished run with checkpoint-5; pass --resume to continue it or --overwrite"),
    ({"notes.txt": "mine"}, r"--output: '.*run' is not empty and holds no prunetrain run \(no .prunetrain-output.json"
                            r": prunetrain did not write it.*\(--overwrite replaces only run directories prunetrain "
                            r"marked\)"),
    ({"recipe.yaml": "name: x\n", "run_complete.json": "{}"},  # a run's file names without the marker: not a run
     r"--output: '.*run' is not empty and holds no prunetrain run \(no .prunetrain-output.json"),
])
def test_recipe_refuses_an_output_directory_it_would_damage(tmp_path, multi30k_dir, files, pattern):
    out = tmp_path / "run"
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    result = cli("recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--output", out)
    assert_user_error(result, pattern)
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == set(files)  # nothing touched
    for name, text in files.items():
        assert (out / name).read_text() == text
    both = cli("recipe", "wmt-small-deen", "--data-dir", multi30k_dir, "--output", out, "--resume", "--overwrite")
    assert_user_error(both, r"--resume and --overwrite: choose one")


def test_recipe_yaml_validation_lists_valid_keys(tmp_path):
    with pytest.raises(ValueError, match=r"pruning.final: unknown key; valid keys in pruning are importance_epochs, "):
        recipe_from_dict({"pruning": {"final": 0.5}})
    with pytest.raises(ValueError, match=r"train.learning_rate: 'fast' is not a number"):
        recipe_from_dict({"train": {"learning_rate": "fast"}})
    with pytest.raises(ValueError, match=r"pruning.schedule\[5\]: 'x' is not a number"):
        recipe_from_dict({"pruning": {"schedule": {5: "x"}}})
    recipe = load_recipe("wmt-small-deen", ["pruning.schedule={5: 0.2, 8: 0.4}", "train.learning_rate=1"])
    assert recipe.pruning.schedule == {5: 0.2, 8: 0.4} and recipe.train.learning_rate == 1.0
    assert recipe.model.layers == 6 and recipe.model.heads == 8


def test_settings_changed_names_what_a_run_changed_from_the_recipe_as_written(tmp_path):
    from prunetrain.mt.config.recipe import settings_changed

    assert settings_changed(load_recipe("wmt-small-deen").to_dict()) == []
    changed = load_recipe("wmt-small-deen", ["train.seed=3", "pruning.schedule_steps={}", "pruning.shrink_steps=[]",
                                             "model.heads=4", "eval.print_test=false"]).to_dict()
    assert settings_changed(changed) == ["model.heads", "train.seed", "pruning.schedule_steps", "pruning.shrink_steps",
                                         "eval.print_test"]
    setting_the_default = load_recipe("wmt-small-deen", ["train.seed=0"]).to_dict()  # the value as written
    assert settings_changed(setting_the_default) == []
    own = tmp_path / "mine.yaml"  # a recipe file no packaged recipe is named after: nothing to compare with
    own.write_text("name: mine\n")
    assert settings_changed(load_recipe(str(own)).to_dict()) is None


@pytest.fixture(scope="module")
def saved_translation_model(tmp_path_factory, multi30k_dir):
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config, read_parallel, train_tokenizer
    from prunetrain.mt.evaluation.translation import save_translation_model

    pairs = read_parallel(multi30k_dir, "train", limit=300)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4))
    path = tmp_path_factory.mktemp("cli") / "model"
    save_translation_model(model, tokenizer, path)
    return path


def test_importance_prune_shrink_evaluate_on_a_saved_model(tmp_path, saved_translation_model, multi30k_dir):
    scores = cli("importance", saved_translation_model, "--data-dir", multi30k_dir, "--num-batches", "1",
                 "--batch-size", "8", "--output", tmp_path / "scores.json")
    assert scores.returncode == 0, scores.stderr[-2000:]
    data = json.loads((tmp_path / "scores.json").read_text())
    assert data["method"] == "gradient" and len(data["scores"]) == 6
    pruned = cli("prune", saved_translation_model, "--data-dir", multi30k_dir, "--amount", "0.5", "--num-batches",
                 "1", "--batch-size", "8", "--output", tmp_path / "pruned")
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert json.loads(pruned.stdout)["heads_kept"] == 12
    assert pt.find_heads(pt.load_pruned(tmp_path / "pruned")).total_heads == 12
    shrunk = cli("shrink", saved_translation_model, "--mask", tmp_path / "pruned" / "mask.json", "--output",
                 tmp_path / "shrunk")
    assert shrunk.returncode == 0, shrunk.stderr[-2000:]
    evaluated = cli("evaluate", tmp_path / "shrunk", "--data-dir", multi30k_dir, "--split", "valid", "--limit", "8",
                    "--beams", "1", "--output", tmp_path / "eval.json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["num_sentences"] == 8 and result["bleu_signature"].startswith("nrefs:1")
    assert "chrf" in result
    again = cli("prune", saved_translation_model, "--data-dir", multi30k_dir, "--output", tmp_path / "pruned")
    assert_user_error(again, r"--output: '.*pruned' already exists and is not empty; pass --overwrite to replace it")


def test_progress_bars_go_to_stderr_and_stdout_stays_json(saved_translation_model, multi30k_dir):
    args = ("evaluate", saved_translation_model, "--data-dir", multi30k_dir, "--split", "valid", "--limit", "8",
            "--beams", "1", "--batch-size", "2")
    shown = run_cli(*args, env={"PRUNETRAIN_PROGRESS": "1"})
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "translate:" in shown.stderr and "/4 [" in shown.stderr  # 8 sentences in batches of 2
    assert json.loads(shown.stdout)["num_sentences"] == 8
    quiet = run_cli(*args, env={"PRUNETRAIN_PROGRESS": "0"})
    assert quiet.returncode == 0 and "translate:" not in quiet.stderr
    assert json.loads(quiet.stdout)["bleu"] == json.loads(shown.stdout)["bleu"]


def test_thin_commands_reject_bad_input(tmp_path, saved_translation_model, multi30k_dir):
    assert_user_error(cli("evaluate", tmp_path, "--data-dir", multi30k_dir),
                      r"model: '.*' is not a saved model directory \(no config.json\)")
    assert_user_error(cli("evaluate", saved_translation_model, "--data-dir", multi30k_dir, "--beams", "0"),
                      r"--beams: 0 is not allowed; expected an integer >= 1")
    assert_user_error(cli("shrink", saved_translation_model, "--mask", tmp_path / "none.json", "--output",
                          tmp_path / "x"), r"--mask: '.*none.json' is not a file")
    (tmp_path / "bad.json").write_text(json.dumps({"sites": {"nope": [1.0]}}))
    assert_user_error(cli("shrink", saved_translation_model, "--mask", tmp_path / "bad.json", "--output",
                          tmp_path / "x"), r"mask data: unknown site 'nope'")
    assert_user_error(cli("prune", saved_translation_model, "--data-dir", multi30k_dir, "--amount", "1.5",
                          "--output", tmp_path / "y"), r"^prunetrain: error: --amount: 1.5 is not a fraction in \[0, 1\]")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    usage = cli("evaluate")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


@pytest.mark.slow
def test_smoke_recipe_runs_end_to_end(smoke_recipe_run):
    """The main job's path in small: heads masked at step 10, more at 20 and the masked heads removed physically
    there, training continued on the smaller model, masked again at 30 and shrunk at the end; test BLEU over training,
    curves, importance points, benchmark against the full-size architecture, report."""
    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout)
    assert (summary["heads_kept"], summary["heads_trained"], summary["heads_total"], summary["steps"]) == (12, 12, 24, 40)
    assert summary["test_bleu"] == summary["test_bleu_trained"]
    results = json.loads((out / "results.json").read_text())
    assert results["test_masked"] is None  # nothing pruned after training: the trained model is the final one
    assert results["test_pruned"]["bleu_signature"].startswith("nrefs:1")
    assert results["trained_name"] == "trained model (12 of 24 heads, pruned during training)"
    assert [(e["step"], e["mode"], e["heads_after"]) for e in results["pruning_events"]] == [
        (10, "mask", 18), (20, "mask", 15), (20, "shrink", 15), (30, "mask", 12)]
    assert [(r["step"], r["heads"], r["kind"]) for r in results["bleu_over_training"]] == [
        (20, 18, "scheduled"), (30, 15, "scheduled"), (40, 12, "final")]
    # the final record carries the run's training-step clock (the same figure as train_step_minutes)
    assert results["bleu_over_training"][-1]["step_seconds"] == pytest.approx(60 * results["train_step_minutes"])
    assert [(g["from_step"], g["to_step"], g["heads"]) for g in results["step_rate"]] == [(1, 20, 24), (21, 40, 15)]
    assert results["kept_per_kind"] == {"encoder_self": 4, "decoder_self": 4, "cross": 4}
    report = (out / "report.md").read_text()
    # the description is the recipe as written; the smoke preset's changes are named under it
    assert "this run changed 32 of its settings (`data.dir`, `data.train_limit`, `data.vocab_size`," in report
    assert "and 24 more): `recipe.yaml` in the run directory holds every value it ran with." in report
    for heading in ("Final results", "Test BLEU over training", "Training speed between shrinks",
                    "Pruning during training", "Pruned-BLEU curves", "Speed: original vs shrunk"):
        assert f"## {heading}" in report, heading
    assert "| full |" not in report and (out / "figures" / "training.png").is_file()
    first = results["step_rate"][0]["flops"] / results["step_rate"][0]["seconds"]
    for g in results["step_rate"]:  # each stretch's FLOP rate against the first stretch's
        rate = g["flops"] / g["seconds"]
        assert (f"| {g['from_step']}–{g['to_step']} | {g['heads']} | {g['parameters'] / 1e6:.2f} M | "
                f"{g['steps_per_second']:.3f} | {g['flops'] / g['steps']:.4g} | {rate:.3g}/s | {rate / first:.2f} |"
                in report), g
    assert (out / "pruned" / "prunetrain_layout.json").is_file() and not (out / "full").exists()
    assert (out / "run_complete.json").is_file()  # written last: the run is finished
    assert (out / "pruned" / "tokenizer.json").is_file()
    loaded = pt.load_pruned(out / "pruned")
    assert pt.find_heads(loaded).total_heads == 12
    # the Trainer turns use_cache off while training; the saved model says what the model itself says
    assert json.loads((out / "pruned" / "config.json").read_text())["use_cache"] is True
    assert loaded.config.use_cache is True
    curves = json.loads((out / "prunetrain" / "curves.json").read_text())
    (entry,) = curves.values()  # curve_steps [40]: 1000 pairs in batches of 50, so step 40 ends epoch 2
    assert (entry["step"], entry["epoch"], entry["label"]) == (40, 2.0, "step 40 (epoch 2.00)")
    assert len(entry["curves"]["importance"]["points"]) == 3
    points = json.loads((out / "prunetrain" / "importance_points.json").read_text())
    assert [p["step"] for p in points] == [5, 10, 20, 30, 40]
    bench = json.loads((out / "bench.json").read_text())
    assert bench  # the full-size architecture against the final model
    # the same pair in CTranslate2 (a test extra): both exports passed the engine's float32 check against the model
    # in memory, which fails while the Trainer's bf16 autocast wrapper is left on the model's forward
    ct2 = results["bench_ctranslate2"]
    assert ct2 == json.loads((out / "bench_ctranslate2.json").read_text()) and ct2["speedup"] > 0
    assert (ct2["pruned"]["heads_kept"], ct2["full"]["heads_executed"], ct2["sentences"]) == (12, 24, 50)
    assert "## Speed where translation is served: CTranslate2" in report
    assert ct2["gemm_backend"] and f"(matrix multiplies: {ct2['gemm_backend']};" in report
    assert results["time_cap"]["fired"] is False and results["time_cap"]["planned_steps"] == 40
    assert list((out / "runs").rglob("events.out.tfevents.*")) or list(out.rglob("events.out.tfevents.*"))


def test_smoke_recipe_scores_validation_and_every_test_set(smoke_recipe_run, multi30k_dir):
    """eval.valid and eval.more_test_splits: validation BLEU beside test BLEU at every point, and the final model
    scored on validation, the main test set and the two 2017 test sets, each set's translations kept. Each kept
    file is re-scored here against that set's own references (the first eval.valid_limit / eval.test_limit = 50), so
    a set scored on another set's sentences fails."""
    import sacrebleu

    from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats
    from prunetrain.mt.text.data import read_parallel

    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["valid_split"] == "valid"
    assert results["test_splits"] == ["test", "test_2017_flickr", "test_2017_mscoco"]
    assert list(results["final_scores"]) == ["valid", "test", "test_2017_flickr", "test_2017_mscoco"]
    assert results["final_scores"]["test"]["bleu"] == results["test_pruned"]["bleu"]
    for record in results["bleu_over_training"]:
        assert isinstance(record["valid_bleu"], float) and isinstance(record["valid_chrf"], float), record
    final = results["bleu_over_training"][-1]
    assert final["valid_bleu"] == results["final_scores"]["valid"]["bleu"]
    for split, score in results["final_scores"].items():
        assert score["num_sentences"] == 50
        kept = json.loads((out / "final_translations" / f"{split}.json").read_text())
        references = [target for _, target in read_parallel(multi30k_dir, split)[:50]]
        assert len(kept["hypotheses"]) == 50
        assert sacrebleu.corpus_bleu(kept["hypotheses"], [references]).score == pytest.approx(score["bleu"], abs=1e-9)
        assert sacrebleu.corpus_chrf(kept["hypotheses"], [references]).score == pytest.approx(score["chrf"], abs=1e-9)
        assert bleu_from_stats([sum(c) for c in zip(*kept["sentence_stats"])]) == pytest.approx(score["bleu"])
        other = "test" if split != "test" else "valid"  # the check tells the sets apart (BLEU alone is ~0 here)
        elsewhere = [target for _, target in read_parallel(multi30k_dir, other)[:50]]
        assert sacrebleu.corpus_chrf(kept["hypotheses"], [elsewhere]).score != pytest.approx(score["chrf"], abs=1e-6)
    data = json.loads((out / "data_record.json").read_text())
    assert {"test_2017_flickr", "test_2017_mscoco"} <= set(data["splits"])
    report = (out / "report.md").read_text()
    assert "## The final model on every evaluation set" in report and "| test_2017_mscoco | test | 50 |" in report
    # by default the log shows the test scores (the control of the next test, where they must not appear)
    assert _printed_test_scores(result) != []


def _printed_test_scores(result) -> list[str]:
    """The lines of a recipe run's stdout and stderr that show a test score: the metric points' `bleu`, the final
    model's test BLEU, a 2017 test set's BLEU, the summary's test_bleu."""
    pattern = re.compile(r"(?<!valid_)\bbleu -?\d|test BLEU|test_2017_\w+ BLEU|\"test_bleu")
    return [line for line in (result.stdout + result.stderr).splitlines() if pattern.search(line)]


@pytest.mark.slow
def test_a_run_with_print_test_off_prints_no_test_score(tmp_path, multi30k_dir):
    """eval.print_test=false (runs that choose settings): the test scores are computed and written, but no log
    line and not the closing summary shows one; the metric points and the summary show validation instead."""
    out = tmp_path / "run"
    result = run_cli("recipe", "wmt-small-deen", "--smoke", "--set", "eval.print_test=false", "--set",
                     "eval.bench=false", "--set", "pruning.curve_steps=[]", "--set", "eval.test_limit=24",
                     "--data-dir", multi30k_dir, "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _printed_test_scores(result) == []
    results = json.loads((out / "results.json").read_text())
    assert set(results["final_scores"]) == {"valid", "test", "test_2017_flickr", "test_2017_mscoco"}
    assert isinstance(results["test_pruned"]["bleu"], float)  # computed and written
    summary = json.loads(result.stdout)
    assert "test_bleu" not in summary and "test_bleu_trained" not in summary
    assert (summary["valid_bleu"], summary["valid_chrf"]) == (results["final_scores"]["valid"]["bleu"],
                                                              results["final_scores"]["valid"]["chrf"])
    points = [line for line in result.stderr.splitlines() if re.search(r": valid_bleu -?\d+\.\d\d after", line)]
    assert len(points) == len(results["bleu_over_training"]) - 1  # every point but the final record
    assert "valid BLEU of the final model" in result.stderr


@pytest.mark.slow
def test_compare_puts_runs_side_by_side(smoke_recipe_run, tmp_path):
    """`prunetrain compare`: equal steps and equal training time against the reference, the step rate per stretch,
    the figure; an existing output directory and a directory without results are refused."""
    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-4000:]
    # a second run that scored exactly the same (a copy whose results differ only in its total wall time): one run
    # given twice is refused (tests/test_compare_seeds.py)
    twin = tmp_path / "twin"
    shutil.copytree(out, twin, ignore=shutil.ignore_patterns("checkpoint-*", "runs", "pruned", "full"))
    results = json.loads((twin / "results.json").read_text())
    (twin / "results.json").write_text(json.dumps(dict(results, total_minutes=results["total_minutes"] + 0.01)))
    assert_user_error(cli("compare", out, out, "--names", "a,b", "--output", tmp_path / "self"),
                      r"runs: '.*run' is the same directory as '.*run'")
    compared = run_cli("compare", out, twin, "--names", "a,b", "--output", tmp_path / "cmp")
    assert compared.returncode == 0, compared.stderr[-3000:]
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(e["step"], e["delta"]) for e in data["equal_steps"]] == [(20, 0.0), (30, 0.0), (40, 0.0)]
    (same_time,) = data["equal_time"]
    assert same_time["delta"] == pytest.approx(0.0) and same_time["reference"]["before"]["step"] == 40
    assert "## Equal training time" in (tmp_path / "cmp" / "compare.md").read_text()
    assert (tmp_path / "cmp" / "compare.png").is_file()
    assert_user_error(cli("compare", out, twin, "--names", "a,b", "--output", tmp_path / "cmp"),
                      r"output: '.*cmp' already exists and is not empty")
    (tmp_path / "not-a-run").mkdir()
    assert_user_error(cli("compare", out, tmp_path / "not-a-run", "--output", tmp_path / "new"),
                      r"run: '.*' has no results.json")
    assert not (tmp_path / "new").exists()


def test_study_commands_write_json_and_figures(tmp_path, saved_translation_model, multi30k_dir):
    result = cli("study", "curves", saved_translation_model, "--data-dir", multi30k_dir, "--sentences", "4",
                 "--num-batches", "1", "--seeds", "1", "--fractions", "0,0.5", "--output", tmp_path / "curves")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert "importance" in summary["curves"]
    assert (tmp_path / "curves" / "pruning_curves.png").is_file()
    assert (tmp_path / "curves" / "tensorboard").is_dir()  # per-kind curves: `study per-kind` (test_study_cli.py)
    data = json.loads((tmp_path / "curves" / "pruning_curves.json").read_text())
    assert [p["heads_kept"] for p in data["curves"]["importance"]["points"]] == [24, 12]
    cross = cli("study", "cross-dataset", saved_translation_model, "--data-dir", multi30k_dir, "--other-data-dir",
                multi30k_dir, "--other-split", "test", "--sentences", "4", "--output", tmp_path / "cross")
    assert cross.returncode == 0, cross.stderr[-3000:]
    crossed = json.loads(cross.stdout)  # an untrained model: every Δ BLEU may be 0, and then no correlation exists
    assert crossed["num_heads"] == 24
    assert all(c is None or -1 <= c <= 1 for c in (crossed["pearson"], crossed["spearman"]))
    assert (tmp_path / "cross" / "cross_dataset.png").is_file()
    assert_user_error(cli("study", "everything", saved_translation_model, "--data-dir", multi30k_dir),
                      r"study: 'everything' is not one of ablate, one-head, cross-dataset, curves")
