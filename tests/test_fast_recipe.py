"""`prunetrain recipe wmt-small-deen-fast`: heads and FFN neurons pruned early in training (issue 64, item 1).

The recipe's stated budget is a count that does not drift (the per-token weight multiply-adds of the recipe's own
model, `prunetrain.methods.flop_budget`), and its smoke preset runs the whole pipeline with both units: masks, two
mid-training shrinks, the final model saved at its per-layer widths and loaded back as what was evaluated.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli

import prunetrain as pt
from prunetrain.mt.config.recipe import available_recipes, load_recipe


def test_the_fast_recipe_removes_the_share_of_multiply_adds_it_states():
    from transformers import MarianMTModel

    from prunetrain.methods.flop_budget import model_cost, unit_costs
    from prunetrain.mt.text.data import marian_config

    recipe = load_recipe("wmt-small-deen-fast")
    assert "wmt-small-deen-fast" in available_recipes()
    p, m = recipe.pruning, recipe.model
    assert (p.mode, sorted(p.shrink_steps)) == ("mask", [300, 500]) and recipe.train.max_flops == 1.78e14
    model = MarianMTModel(marian_config(recipe.data.vocab_size, d_model=m.d_model, ffn_dim=m.ffn_dim,
                                        layers=m.layers, heads=m.heads))
    layout = pt.find_sites(model, ("heads", "neurons"))
    costs = unit_costs(model, ("heads", "neurons"))
    heads = sum(costs[s.name] * s.num_heads for s in layout if s.unit == "heads")
    neurons = sum(costs[s.name] * s.num_heads for s in layout if s.unit == "neurons")
    removed = max(p.schedule_steps.values()) * heads + max(p.ffn_schedule_steps.values()) * neurons
    assert (layout.total_heads, layout.total_neurons) == (144, 12288)
    assert model_cost(model) == 13058048  # per token: 6+6 layers at d 256, FFN 1024, output over 8000 words
    assert removed / model_cost(model) == pytest.approx(0.512, abs=5e-4)  # "51 % of the weight multiply-adds"
    assert max(p.schedule_steps) <= max(p.shrink_steps)  # every masked unit is removed by the last shrink


@pytest.mark.slow
def test_the_fast_smoke_prunes_heads_and_neurons_and_saves_the_small_model(tmp_path, multi30k_dir):
    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen-fast", "--smoke", "--set", "eval.bench=false", "--set",
                   "eval.more_test_splits=[]", "--data-dir", multi30k_dir, "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert (results["heads_kept"], results["heads_original"]) == (6, 24)
    assert results["neurons_kept"] == 128  # half of 4 × 64
    assert sum(results["ffn_widths"].values()) == 128 and len(results["ffn_widths"]) == 4
    steps = [e["step"] for e in results["pruning_events"]]
    assert steps == sorted(steps) and steps[0] == 5 and steps[-1] == 15
    assert (out / "run_complete.json").is_file()
    model = pt.load_pruned(out / "pruned")
    layout = pt.find_sites(model, ("heads", "neurons"))
    assert (layout.total_heads, layout.total_neurons) == (6, 128)
    widths = {s.name: s.num_heads for s in layout if s.unit == "neurons"}
    assert widths == results["ffn_widths"]
    assert sum(p.numel() for p in model.parameters()) == results["parameters_final"]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # the same architecture from scratch (issue 64's baseline): init_layout names heads and FFN neurons
    from transformers import MarianMTModel

    from prunetrain.mt.run.init_architecture import apply_initial_architecture
    from prunetrain.mt.run.preflight import check_initial_architecture
    from prunetrain.mt.text.data import marian_config

    scratch = load_recipe("wmt-small-deen-fast", [f"pruning.init_layout={out}", "pruning.schedule_steps={}",
                                                  "pruning.ffn_schedule_steps={}", "pruning.shrink_steps=[]",
                                                  "model.layers=2", "model.heads=4", "model.d_model=32",
                                                  "model.ffn_dim=64"])
    check_initial_architecture(scratch)  # the preflight builds its narrow model with the FFN's width
    fresh = MarianMTModel(marian_config(500, d_model=32, ffn_dim=64, layers=2, heads=4))
    record = apply_initial_architecture(scratch, fresh)
    assert (record["heads"], record["neurons"]) == (6, 128)
    assert {s.name: s.num_heads for s in pt.find_sites(fresh, ("neurons",))} == results["ffn_widths"]


@pytest.mark.slow
def test_the_fast_smoke_with_serving_constraints_keeps_ffn_tiles_and_one_head_count_per_stack(tmp_path,
                                                                                             multi30k_dir):
    """`pruning.ffn_multiple_of`: every FFN's width after each pruning step is the multiple of 8 nearest what its
    neurons' importance asks (benchmarks/README.md l6: odd widths step slower than their FLOPs say);
    `pruning.same_heads_per_stack`: every encoder attention keeps one head count, every decoder attention (self and
    cross) another (CTranslate2's layout, exported without padding). With no minimum per layer the smoke's 6 heads
    fall unevenly without the constraint (measured: 2 and 0 in the encoder's two layers)."""
    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen-fast", "--smoke", "--set", "pruning.ffn_multiple_of=8", "--set",
                   "pruning.same_heads_per_stack=true", "--set", "pruning.min_heads_per_layer=0", "--set",
                   "eval.bench=false", "--set", "eval.more_test_splits=[]", "--set", "eval.test_steps=[]", "--set",
                   "eval.num_beams=1", "--set", "eval.test_limit=16", "--data-dir", multi30k_dir, "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    widths = results["ffn_widths"]
    assert len(widths) == 4 and all(width % 8 == 0 for width in widths.values())
    assert abs(sum(widths.values()) - 128) <= 16  # half of 4 × 64, each width moved by at most 4
    model = pt.load_pruned(out / "pruned")
    assert {s.name: s.num_heads for s in pt.find_sites(model, ("neurons",))} == widths
    heads = pt.find_heads(model)
    per_stack = {stack: {s.num_heads for s in heads if (s.kind == "encoder_self") == (stack == "encoder")}
                 for stack in ("encoder", "decoder")}
    assert all(len(counts) == 1 for counts in per_stack.values()), per_stack
    assert 0 < heads.total_heads == results["heads_kept"] < results["heads_original"]
