"""Compress a trained model (`prunetrain recipe wmt-small-deen-compress`): the run starts from a trained full model's
weights and tokenizer (`model.init_from`) and distils from its unpruned copy (`distill`) while it prunes; refusals of
a starting model or teacher that is not the recipe's model, each one line before the run directory is touched."""

import json
import re

import pytest
import torch

from conftest import run_cli
from prunetrain.mt.config.recipe import load_recipe
from prunetrain.utils.plots import read_scalars


def _one_line_error(result, pattern):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-2000:]
    assert re.search(pattern, lines[0]), lines[0]


def test_the_recipe_refuses_what_cannot_start_or_teach():
    load_recipe("wmt-small-deen-compress")  # as shipped
    with pytest.raises(ValueError, match=r"model.init_from: .* starts from a trained model, pruning.init_layout"):
        load_recipe("wmt-small-deen-compress", ["pruning.init_layout=x"])
    with pytest.raises(ValueError, match=r"distill.alpha: 0.5 .* a fresh initialisation, which teaches nothing"):
        load_recipe("wmt-small-deen-compress", ["model.init_from="])
    with pytest.raises(ValueError, match=r"distill.teacher: 'x' is given but distill.alpha and "):
        load_recipe("wmt-small-deen-compress", ["distill.alpha=0", "distill.teacher=x"])
    for key, value, allowed in (("alpha", "1.5", r"\[0, 1\]"), ("temperature", "0", r"\(0, inf\)"),
                                ("hidden_weight", "-1", r"\[0, inf\)")):
        with pytest.raises(ValueError, match=rf"distill.{key}: .* expected a finite number in {allowed}"):
            load_recipe("wmt-small-deen-compress", [f"distill.{key}={value}"])
    load_recipe("wmt-small-deen", ["distill.alpha=0.5", "distill.teacher=x"])  # from scratch, a trained teacher


@pytest.fixture(scope="module")
def compress_run(full_smoke_run, multi30k_dir, tmp_path_factory):
    source, made = full_smoke_run
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path_factory.mktemp("compress") / "run"
    result = run_cli("recipe", "wmt-small-deen-compress", "--smoke", "--set", f"model.init_from={source}",
                     "--data-dir", multi30k_dir, "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    return source, out


def test_the_run_starts_from_the_trained_weights(full_smoke_run, m30k_tokenizer):
    """Every weight of the starting model, bit for bit, in the model the recipe builds (its dropout, its attention
    implementation): the first training step continues the trained model."""
    from prunetrain.mt.text.data import load_tokenizer
    from prunetrain.mt.run.runner import build_model
    from prunetrain.mt.run.starting import load_starting_model, run_tokenizer_dir
    from prunetrain.mt.evaluation.translation import load_translation_model

    source, made = full_smoke_run
    assert made.returncode == 0, made.stderr[-3000:]
    recipe = load_recipe("wmt-small-deen-compress", ["model.layers=2", "model.heads=4", "model.d_model=32",
                                                     "model.ffn_dim=64", f"model.init_from={source}"])
    assert run_tokenizer_dir(recipe) == source / "full"
    tokenizer = load_tokenizer(run_tokenizer_dir(recipe))
    fresh = build_model(recipe, tokenizer)
    trained = load_translation_model(source / "full")
    model = load_starting_model(recipe, build_model(recipe, tokenizer))
    expected = trained.state_dict()
    assert model.state_dict().keys() == expected.keys()
    assert all(torch.equal(value, expected[name]) for name, value in model.state_dict().items())
    assert not all(torch.equal(value, expected[name]) for name, value in fresh.state_dict().items())
    ids = tokenizer(["Ein Mann fährt Fahrrad."], return_tensors="pt")
    decoder = torch.tensor([[trained.config.decoder_start_token_id, 5, 9]])
    with torch.no_grad():
        assert torch.equal(model.eval()(**ids, decoder_input_ids=decoder).logits,
                           trained(**ids, decoder_input_ids=decoder).logits)
    wider = load_recipe("wmt-small-deen-compress", ["model.layers=2", "model.heads=4", "model.d_model=64",
                                                    "model.ffn_dim=64", f"model.init_from={source}"])
    with pytest.raises(ValueError, match=r"model.init_from: .* is not the recipe's model \(d_model: 32 \(the "
                                         r"recipe's model: 64\)"):
        load_starting_model(wider, build_model(wider, tokenizer))


@pytest.mark.slow
def test_the_compress_smoke_prunes_a_trained_model_while_it_distils(compress_run):
    source, out = compress_run
    results = json.loads((out / "results.json").read_text())
    assert results["heads_kept"] == 12 and results["heads_original"] == 24
    distill = results["distillation"]
    assert distill["alpha"] == 0.5 and distill["temperature"] == 2.0 and "frozen copy of the starting" in \
        distill["teacher"]
    assert distill["teacher_forward_flops"] > 0
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (source / "full" / "tokenizer.json").read_bytes()
    scalars = read_scalars(out)  # the run's TensorBoard event files, read back
    assert scalars["distill/kl"] and all(value >= 0 for _, value in scalars["distill/kl"])
    assert scalars["distill/teacher_flops"][-1][1] == pytest.approx(distill["teacher_forward_flops"])
    report = (out / "report.md").read_text()
    assert "## Distillation" in report and f"{distill['teacher_forward_flops']:.4g}" in report
    assert f"Started from the trained model `{source}`" in report


@pytest.mark.slow
def test_compare_shows_the_teachers_flops_apart(compress_run, tmp_path):
    source, out = compress_run
    compared = run_cli("compare", out, source, "--names", "distilled,full", "--output", tmp_path / "cmp")
    assert compared.returncode == 0, compared.stderr[-3000:]
    table = (tmp_path / "cmp" / "compare.md").read_text().split("## Arms")[1].split("\n\n")[1].splitlines()
    assert "teacher FLOPs" in table[0] and len(table[0].split("|")) == len(table[1].split("|"))
    rows = {row.split("|")[1].strip(): row for row in table[2:]}
    assert "no teacher" in rows["full"] and "no teacher" not in rows["distilled"]
    arms = {a["arm"]: a for a in json.loads((tmp_path / "cmp" / "compare.json").read_text())["arms"]}
    teacher = json.loads((out / "results.json").read_text())["distillation"]["teacher_forward_flops"]
    assert arms["distilled"]["teacher_flops"]["mean"] == teacher and arms["full"]["teacher_flops"]["n"] == 0


@pytest.mark.slow
def test_the_scratch_arm_distils_a_fresh_smaller_model_from_the_full_teacher(compress_run, multi30k_dir, tmp_path):
    """scripts/compress_study.sh's scratch-distill arm: the distilled run's final architecture freshly initialised
    (pruning.init_layout), the full starting model as the given teacher. The teacher has every head, the student
    fewer: a teacher is checked on what changes its function apart from its heads, so it is taken. As in the study,
    it trains for the distilled run's student FLOPs (a FLOP budget with a teacher: the teacher's forwards are
    counted apart, never in the budget), so it ends on that budget, after more steps than the larger student took."""
    source, out = compress_run
    layout = out / "pruned" / "prunetrain_layout.json"
    distilled = json.loads((out / "results.json").read_text())
    run = tmp_path / "scratch"
    result = run_cli("recipe", "wmt-small-deen-compress", "--smoke", "--set", "model.init_from=", "--set",
                     f"distill.teacher={source}", "--set", f"pruning.init_layout={layout}", "--set",
                     "pruning.schedule_steps={}", "--set", "pruning.shrink_steps=[]", "--set", "pruning.curve_steps=[]",
                     "--set", "eval.bench=false", "--set", "train.max_steps=0", "--set", "train.epochs=20", "--set",
                     f"train.max_flops={float(distilled['train_flops'])}", "--data-dir", multi30k_dir, "--output", run)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["heads_kept"] == distilled["heads_kept"] == 12
    steps = results["steps"]
    assert results["flop_budget_reached_at_step"] == steps > distilled["steps"]
    # stopped by the budget (not the epochs) on the step that spent it: over it by less than a few steps' FLOPs
    assert distilled["train_flops"] <= results["train_flops"] < distilled["train_flops"] * (1 + 4 / steps)
    assert results["distillation"]["teacher"] == "given" or str(source) in results["distillation"]["teacher"]
    assert results["distillation"]["teacher_forward_flops"] > 0


def test_a_starting_model_that_is_not_the_recipes_is_refused_before_the_run(full_smoke_run, smoke_recipe_run,
                                                                             multi30k_dir, tmp_path):
    from prunetrain.cli.recipes import _smoke_overrides
    from prunetrain.mt.run.runner import run_recipe

    source, made = full_smoke_run
    pruned_run, pruned_made = smoke_recipe_run
    assert made.returncode == 0 and pruned_made.returncode == 0
    out = tmp_path / "run"
    refused = run_cli("recipe", "wmt-small-deen-compress", "--smoke", "--set", f"model.init_from={pruned_run}",
                      "--data-dir", multi30k_dir, "--output", out)
    _one_line_error(refused, r"model.init_from: .* holds no trained full model .*it has pruned/ only")
    smoke = _smoke_overrides("wmt-small-deen-compress") + [f"model.init_from={source}"]
    with pytest.raises(ValueError, match=r"model.init_from: .* is not the recipe's model \(decoder_ffn_dim: 64 \(the "
                                         r"recipe's model: 128\)"):
        run_recipe(load_recipe("wmt-small-deen-compress", smoke + ["model.ffn_dim=128"]), out, data_dir=multi30k_dir)
    with pytest.raises(ValueError, match=r"distill.teacher: .* holds no trained full model"):
        run_recipe(load_recipe("wmt-small-deen-compress", smoke + [f"distill.teacher={tmp_path}"]), out,
                   data_dir=multi30k_dir)
    assert not out.exists()  # nothing written
