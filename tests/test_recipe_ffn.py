"""FFN neurons in the recipe and the CLI. The recipe prunes them during training beside the heads
(`pruning.ffn_schedule_steps`): the smoke preset end to end with FFN masks, a mid-training shrink of both units, the
final model's FFN widths in results.json, the report and the summary, and the saved model loading with them; bad FFN
settings (and bad serving constraints) are one line, exit 2. `prunetrain prune --ffn-amount/--flops` and `prunetrain
shrink` with a mask over both units; `prunetrain prune --heads-multiple-of/--ffn-multiple-of`."""

from __future__ import annotations

import json
import re

import pytest

import prunetrain as pt
from conftest import run_cli
from hostile import assert_one_line, run_main
from prunetrain.mt.run.runner import unit_amounts


def test_unit_amounts_carry_each_schedule_forward():
    assert unit_amounts({200: 0.25, 500: 0.75}, {300: 0.5}) == {
        200: {"heads": 0.25, "neurons": 0.0}, 300: {"heads": 0.25, "neurons": 0.5},
        500: {"heads": 0.75, "neurons": 0.5}}


@pytest.mark.slow
def test_the_smoke_recipe_prunes_and_shrinks_ffn_neurons_during_training(tmp_path, multi30k_dir):
    out = tmp_path / "run"
    result = run_cli("recipe", "wmt-small-deen", "--smoke", "--set", "pruning.ffn_schedule_steps={10: 0.25, 20: 0.5}",
                     "--set", "eval.bench=false", "--set", "eval.test_limit=16", "--set", "eval.num_beams=1",
                     "--data-dir", multi30k_dir, "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["neurons_kept"] == 128 == sum(results["ffn_widths"].values())  # half of 4 FFNs × 64
    assert all(width >= 1 for width in results["ffn_widths"].values())
    shrink = [e for e in results["pruning_events"] if e["mode"] == "shrink"]
    assert shrink and shrink[0]["neurons_before"] == 256 and shrink[0]["neurons_after"] == 128
    assert json.loads(result.stdout)["neurons_kept"] == 128
    assert "FFN neurons kept: 128" in (out / "report.md").read_text()
    model = pt.load_pruned(out / "pruned")
    assert pt.find_neurons(model).total_neurons == 128 and pt.find_heads(model).total_heads == results["heads_kept"]


@pytest.mark.slow
def test_the_smoke_recipe_gates_heads_and_ffn_neurons_to_a_flop_share(tmp_path, multi30k_dir):
    """`pruning.method=l0` with `pruning.l0_target_flops`: Hard-Concrete gates on heads and FFN neurons, the final
    model shrunk to remove at least that share of the multiply-adds."""
    from prunetrain.methods.flop_budget import model_cost, original_cost

    out = tmp_path / "run"
    result = run_cli("recipe", "wmt-small-deen", "--smoke", "--set", "pruning.method=l0", "--set",
                     "pruning.l0_target_flops=0.3", "--set", "pruning.l0_start_step=5", "--set", "eval.bench=false",
                     "--set", "eval.test_limit=16", "--set", "eval.num_beams=1", "--data-dir", multi30k_dir,
                     "--output", out)
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    model = pt.load_pruned(out / "pruned")
    layout = pt.find_sites(model)
    assert sum(results["ffn_widths"].values()) == layout.total_neurons < 256  # 4 FFNs × 64 before
    assert model_cost(model) <= 0.7 * original_cost(model, layout)  # at least 30 % of the multiply-adds gone
    history = json.loads((out / "prunetrain" / "gates_history.json").read_text())
    assert "p_open_neurons" in history[-1] and "expected_flops_share" in history[-1]


@pytest.mark.parametrize("overrides, pattern", [
    (["pruning.ffn_schedule_steps={10: 1.5}"], r"pruning.ffn_schedule_steps: 1.5 is not a fraction in \[0, 1\]"),
    (["pruning.ffn_schedule_steps={20: 0.5, 10: 0.75}"], r"pruning.ffn_schedule_steps \(steps\): \[20, 10\] is out of "
                                                          r"order"),
    (["pruning.ffn_schedule_steps={10: 0.75, 20: 0.5}"], r"pruning.ffn_schedule_steps: .* fractions are cumulative"),
    (["pruning.schedule={1: 0.25}", "pruning.schedule_steps={}", "pruning.shrink_steps=[]",
      "pruning.ffn_schedule_steps={10: 0.5}"],
     r"pruning.ffn_schedule_steps: .* goes with the heads' pruning.schedule_steps, not with pruning.schedule"),
    (["pruning.method=l0", "pruning.ffn_schedule_steps={10: 0.5}"],
     r"pruning.ffn_schedule_steps: .* but pruning.method=l0 lets the gates choose; gate FFN neurons with "
     r"pruning.l0_target_flops"),
    (["pruning.l0_target_flops=0.3"], r"pruning.l0_target_flops: 0.3 needs pruning.method=l0"),
    (["pruning.ffn_multiple_of=8"], r"pruning.ffn_multiple_of: 8 rounds the widths of pruned FFNs, but no FFN neuron "
                                    r"is pruned; give pruning.ffn_schedule_steps"),
    (["pruning.ffn_multiple_of=0", "pruning.ffn_schedule_steps={10: 0.5}"],
     r"pruning.ffn_multiple_of: 0 is not allowed; expected an integer >= 1"),
    (["pruning.same_heads_per_stack=1"], r"pruning.same_heads_per_stack: 1 is not a boolean \(true/false\)"),
    (["pruning.kept_per_kind={encoder_self: 6, decoder_self: 12, cross: 18}", "pruning.same_heads_per_stack=true"],
     r"pruning.same_heads_per_stack: true would move the counts pruning.kept_per_kind=.* fixes for each attention "
     r"kind; give one or the other"),
    (["pruning.method=l0", "pruning.l0_target_flops=1.0"],
     r"pruning.l0_target_flops: 1.0 is not allowed; expected a finite number in \[0, 1\)"),
    (["pruning.shrink_steps=[15]", "pruning.ffn_schedule_steps={10: 0.5}"],
     r"pruning.shrink_steps: 15 is not a step of pruning.schedule_steps or pruning.ffn_schedule_steps "
     r"\[10, 20, 30\]"),
])
def test_bad_ffn_settings_are_one_line(monkeypatch, capsys, overrides, pattern):
    args = [arg for override in overrides for arg in ("--set", override)]
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", *args, "--show"), pattern)


@pytest.fixture(scope="module")
def tiny_translation_model(tmp_path_factory, multi30k_dir):
    from hostile import save_tiny_translation_model

    return save_tiny_translation_model(tmp_path_factory.mktemp("tiny") / "model", multi30k_dir)


def test_cli_prune_removes_ffn_neurons_by_amount_or_flop_share(tmp_path, tiny_translation_model, multi30k_dir):
    """`prunetrain prune --ffn-amount` prunes that share of the FFN neurons with the heads; `--flops` a share of the
    weight multiply-adds with the cheapest mix; the saved model loads with its FFN widths, and `prunetrain shrink`
    takes the mask.json it wrote (both units)."""
    from prunetrain.methods.flop_budget import model_cost

    from transformers import MarianMTModel

    full = MarianMTModel.from_pretrained(tiny_translation_model)
    neurons = pt.find_neurons(full).total_neurons
    from hostile import write_small_data

    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=4)  # short sentences: the model has 64 positions
    common = ["--data-dir", data, "--num-batches", "1", "--batch-size", "4"]
    done = run_cli("prune", tiny_translation_model, "--output", tmp_path / "half", "--amount", "0.5",
                   "--ffn-amount", "0.5", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["neurons_kept"] == neurons // 2 and set(summary["ffn_per_kind"]) == {"encoder_ffn", "decoder_ffn"}
    assert pt.find_neurons(pt.load_pruned(tmp_path / "half")).total_neurons == neurons // 2
    flop = run_cli("prune", tiny_translation_model, "--output", tmp_path / "flops", "--flops", "0.3", *common)
    assert flop.returncode == 0, flop.stderr[-3000:]
    assert model_cost(pt.load_pruned(tmp_path / "flops")) <= 0.7 * model_cost(full)
    again = run_cli("shrink", tiny_translation_model, "--mask", tmp_path / "half" / "mask.json", "--output",
                    tmp_path / "again")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["neurons_kept"] == neurons // 2
    for args, pattern in ((["--ffn-amount", "1.5"], r"--ffn-amount: 1.5 is not a fraction in \[0, 1\]"),
                          (["--flops", "nan"], r"--flops: nan is not a fraction in \[0, 1\]")):
        bad = run_cli("prune", tiny_translation_model, "--output", tmp_path / "bad", *args, *common)
        assert bad.returncode == 2 and re.search(pattern, bad.stderr), bad.stderr[-2000:]
        assert not (tmp_path / "bad").exists()


def test_cli_prune_keeps_head_counts_and_ffn_widths_in_multiples(tmp_path, tiny_translation_model, multi30k_dir):
    """`prunetrain prune --heads-multiple-of 2 --ffn-multiple-of 8`: 3 of the 6 heads and 45 of the 64 neurons asked
    for (odd counts no multiples can sum to), every site ends at a multiple (an FFN may stay whole), in the saved
    model and in its mask.json; the flags' bad values are one line, exit 2, before anything is written."""
    from hostile import write_small_data

    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=4)
    common = ["--data-dir", data, "--num-batches", "1", "--batch-size", "4"]
    done = run_cli("prune", tiny_translation_model, "--output", tmp_path / "tiles", "--amount", "0.5",
                   "--min-heads-per-layer", "0", "--heads-multiple-of", "2", "--ffn-amount", "0.3",
                   "--ffn-multiple-of", "8", *common)
    assert done.returncode == 0, done.stderr[-3000:]
    model = pt.load_pruned(tmp_path / "tiles")
    heads, neurons = pt.find_heads(model), pt.find_neurons(model)
    assert [site.num_heads % 2 for site in heads] == [0, 0, 0]
    assert all(site.num_heads % 8 == 0 or site.num_heads == 32 for site in neurons)
    assert 0 < neurons.total_neurons < 64
    saved = json.loads((tmp_path / "tiles" / "mask.json").read_text())["sites"]
    assert {name: sum(1 for v in keep if v != 0) for name, keep in saved.items()} == \
        {site.name: site.num_heads for site in (*heads, *neurons)}
    for args, pattern in ((["--ffn-multiple-of", "8"], r"--ffn-multiple-of: 8 rounds the widths of pruned FFNs, but "
                                                       r"no FFN neuron is pruned; give --ffn-amount or --flops\."),
                          (["--heads-multiple-of", "0"], r"--heads-multiple-of: 0 is not allowed; expected an integer "
                                                         r">= 1")):
        bad = run_cli("prune", tiny_translation_model, "--output", tmp_path / "bad", *args, *common)
        assert bad.returncode == 2 and re.search(pattern, bad.stderr), bad.stderr[-2000:]
        assert not (tmp_path / "bad").exists()
