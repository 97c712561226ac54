"""Pruning FFN neurons by importance: costs in multiply-adds (`prunetrain.methods.flop_budget`), one ranking across
heads and neurons by importance per multiply-add saved (a FLOP target), per-kind amounts of neurons, and
`HeadPruningCallback` pruning both during a real Trainer run (mask, shrink, the optimizer state sliced)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.heads import live_sites
from prunetrain.methods.flop_budget import model_cost, select_by_flops, unit_costs
from prunetrain.methods.importance import HeadScores, random_scores
from prunetrain.training.options import Heads, Importance, Schedule
from prunetrain.utils.plots import read_image_tags
from prunetrain.zoo import tiny_model

from test_callbacks import _fixed_batches, _marian, _seq2seq_trainer, tiny_mt  # noqa: F401  (the fixture)

BOTH = ("heads", "neurons")


@pytest.mark.parametrize("name", ["marian", "llama-gqa4", "gpt2", "phi3", "t5"])
def test_a_unit_costs_the_weight_elements_its_removal_frees(name):
    """Shrinking by any mask frees exactly the summed costs of the units it removes (per-token multiply-adds =
    weight elements), for plain, gated, fused and Conv1D FFNs and for grouped-query attention."""
    model = tiny_model(name)
    layout = pt.find_sites(model, BOTH)
    costs = unit_costs(model)
    mask = select_by_flops(random_scores(layout, seed=3), 0.3, model, min_per_site=0)
    removed = sum(costs[s.name] * (s.num_heads - int((mask[s.name] != 0).sum())) for s in layout)
    before = model_cost(model)
    pt.shrink(model, mask, gqa_rounding="error")
    assert before - model_cost(model) == removed >= 0.3 * before
    assert removed - 0.3 * before < max(costs.values()) * max(s.group_size for s in layout)  # one unit's overshoot


def test_costs_follow_the_formulas_of_the_module_docstring():
    model = tiny_model("llama-gqa4")  # gated FFN (3·d per neuron), GQA (k/v rows shared by a group)
    config = model.config
    d, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", d // heads)
    costs = unit_costs(model)
    for site in live_sites(model, BOTH):
        expected = 3 * d if site.info.unit == "neurons" else 2 * d * head_dim * (1 + kv / heads)
        assert costs[site.info.name] == expected
    plain = tiny_model("marian")
    assert all(c == 2 * plain.config.d_model for n, c in unit_costs(plain, "neurons").items())


def test_the_cheapest_units_go_first_across_heads_and_neurons():
    """Neurons scored far below heads go before any head, and the other way round; a share already met by the base
    mask removes nothing more."""
    model = tiny_model("marian")
    layout = pt.find_sites(model, BOTH)
    low_neurons = HeadScores(layout, {s.name: torch.full((s.num_heads,), 1e-6 if s.unit == "neurons" else 1.0)
                                      for s in layout})
    mask = select_by_flops(low_neurons, 0.2, model)
    assert mask.num_kept == mask.num_heads and mask.num_kept_neurons < mask.num_neurons
    low_heads = HeadScores(layout, {s.name: torch.full((s.num_heads,), 1.0 if s.unit == "neurons" else 1e-6)
                                    for s in layout})
    mask = select_by_flops(low_heads, 0.05, model)
    assert mask.num_kept < mask.num_heads and mask.num_kept_neurons == mask.num_neurons
    assert select_by_flops(low_heads, 0.01, model, base_mask=mask) == mask


def test_a_flop_target_out_of_reach_or_malformed_is_one_sentence():
    model = tiny_model("marian")
    scores = random_scores(pt.find_sites(model, BOTH))
    with pytest.raises(ValueError, match=r"^share: 0\.99 of the model's .* cannot be removed from the heads, "
                                         r"neurons in reach with min_per_site=1"):
        select_by_flops(scores, 0.99, model)
    for bad in (1, 1.5, True, float("nan"), "0.5"):
        with pytest.raises(ValueError, match=r"^share: .* is not a fraction of the model's multiply-adds"):
            select_by_flops(scores, bad, model)


def test_per_kind_amounts_of_neurons_and_heads_in_one_selection():
    model = tiny_model("marian")
    layout = pt.find_sites(model, BOTH)
    scores = random_scores(layout, seed=1)
    mask = pt.select_heads(scores, {"encoder_self": 0.5, "encoder_ffn": 0.25, "decoder_ffn": 0.75})
    kept = mask.kept_per_kind()
    per_kind = {**layout.heads_per_kind(), **layout.neurons_per_kind()}
    assert kept == {"encoder_self": per_kind["encoder_self"] // 2, "decoder_self": per_kind["decoder_self"],
                    "cross": per_kind["cross"], "encoder_ffn": per_kind["encoder_ffn"] * 3 // 4,
                    "decoder_ffn": per_kind["decoder_ffn"] // 4}
    neurons_only = pt.select_heads(random_scores(pt.find_neurons(model)), 0.5)  # one unit: a global amount is fine
    assert neurons_only.num_kept_neurons == pt.find_neurons(model).total_neurons // 2
    per_unit = pt.select_heads(scores, {"heads": 0.75, "neurons": 0.5})  # each unit ranked within itself
    assert per_unit.num_kept == layout.total_heads // 4 and per_unit.num_kept_neurons == layout.total_neurons // 2
    per_layer = pt.select_heads(scores, {"heads": 0.5, "neurons": 0.25}, scope="layer")
    assert [int((per_layer[s.name] != 0).sum()) for s in layout] == [
        s.num_heads // 2 if s.unit == "heads" else s.num_heads * 3 // 4 for s in layout]
    with pytest.raises(ValueError, match=r"prunes neurons, which the scores do not cover"):
        pt.select_heads(random_scores(pt.find_heads(model)), {"neurons": 0.5})
    with pytest.raises(ValueError, match=r"mixes per-unit amounts \(heads, neurons\) with per-kind ones"):
        pt.select_heads(scores, {"heads": 0.5, "encoder_ffn": 0.5})
    with pytest.raises(ValueError, match=r"over heads and FFN neurons together with scope='global' would count a "
                                         r"head like a neuron"):
        pt.select_heads(scores, 0.5)
    with pytest.raises(ValueError, match=r"is a FLOP target, which needs the model's weights"):
        pt.select_heads(scores, {"flops": 0.3})
    with pytest.raises(ValueError, match=r"mixes a FLOP target with per-kind amounts"):
        pt.select_heads(scores, {"flops": 0.3, "encoder_ffn": 0.5})
    with pytest.raises(ValueError, match=r"'mlp' is not an attention or FFN kind"):
        pt.select_heads(scores, {"mlp": 0.5})


def test_callback_prunes_heads_and_neurons_to_a_flop_target_and_shrinks_mid_training(tmp_path, tiny_mt):
    """A FLOP target masked at step 4, raised and shrunk at step 8: the model loses heads and neurons physically,
    the optimizer state follows, training goes on, and the events and log name both units."""
    model = _marian(tiny_mt[2])
    before = model_cost(model)
    callback = pt.HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: {"flops": 0.2}, 8: {"flops": 0.35}},
                                               shrink_steps=[8]),
                                      importance=Importance(batches=_fixed_batches(tiny_mt, model)))
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=2, model=model)
    trainer.train()
    layout = pt.find_sites(model)
    assert callback.mask.layout.units == BOTH and callback.mask.layout == layout
    assert model_cost(model) <= 0.65 * before
    assert layout.total_neurons < pt.find_sites(_marian(tiny_mt[2])).total_neurons
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert optimizer.state[p]["exp_avg"].shape == p.shape
    events = json.loads((tmp_path / "prunetrain" / "pruning_events.json").read_text())
    assert [e["mode"] for e in events] == ["mask", "mask", "shrink"]
    tags = read_image_tags(tmp_path / "prunetrain" / "tensorboard")
    assert tags["prunetrain/ffn_widths"] == 2  # a figure of the FFN widths at each pruning step
    assert events[-1]["neurons_after"] == layout.total_neurons and events[-1]["heads_after"] == layout.total_heads
    assert {"encoder_ffn", "decoder_ffn"} <= set(events[-1]["per_kind_after"])
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert all(torch.isfinite(torch.tensor(losses)))
    scores = json.loads(next((tmp_path / "prunetrain").glob("importance_step8*.json")).read_text())
    assert any(name.endswith("fc2") for name in scores["scores"])  # neurons were scored with the heads
    assert scores["layout"]["units"] == list(BOTH) and scores["meta"]["normalize"] is None  # raw, for a FLOP mix


def test_callback_prunes_neurons_by_kind_in_shrink_mode(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    full = pt.find_neurons(model)
    callback = pt.HeadPruningCallback(Schedule(at_epochs=[1], prune={1: {"encoder_ffn": 0.5, "decoder_ffn": 0.5}}),
                                      importance=Importance(batches=_fixed_batches(tiny_mt, model)), mode="shrink")
    _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=2, model=model).train()
    assert pt.find_neurons(model).total_neurons == full.total_neurons // 2
    assert pt.find_heads(model).total_heads == pt.find_heads(_marian(tiny_mt[2])).total_heads
    assert all(s.num_heads >= 1 for s in pt.find_neurons(model))  # min_heads_per_layer 1 holds for FFNs too


def test_unit_options_are_checked_when_the_callback_is_built():
    with pytest.raises(ValueError, match=r"^scorer: 'ablation' scores attention heads only"):
        pt.HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: {"encoder_ffn": 0.5}}),
                               importance=Importance(scorer="ablation"))
    with pytest.raises(ValueError, match=r"^units: \('heads',\) leaves out the FFN neurons that 'encoder_ffn' names"):
        pt.HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: {"encoder_ffn": 0.5}}),
                               heads=Heads(units="heads"))
    with pytest.raises(ValueError, match=r"^iterative: a FLOP target"):
        pt.HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: {"flops": 0.3}}),
                               importance=Importance(iterative=True))
    with pytest.raises(ValueError, match=r"^units: .* is not a non-empty selection of 'heads', 'neurons'"):
        Heads(units=["layers"])
    with pytest.raises(ValueError, match=r"^heads: PruningCurveCallback works on attention heads only"):
        pt.PruningCurveCallback(heads=Heads(units=BOTH), metric=lambda model: 0.0)
    with pytest.raises(ValueError, match=r"^heads: PruningCurveCallback works on attention heads only \(kinds "
                                         r"\['ffn'\]"):
        pt.PruningCurveCallback(heads=Heads(kinds=["ffn"]), metric=lambda model: 0.0)


def test_a_neuron_layout_survives_a_copy_and_a_second_shrink():
    """Shrinking a model whose FFNs were shrunk before (the record holds original neuron indices) keeps the right
    neurons: the second shrink's kept indices are a subset of the first's, recorded by original index."""
    model = tiny_model("llama")
    first = pt.HeadMask.ones(model, units="neurons")
    site = first.layout.sites[0]
    first[site.name] = torch.tensor([float(i % 2) for i in range(site.num_heads)])
    pt.shrink(model, first)
    twin = copy.deepcopy(model)
    second = pt.HeadMask.ones(twin, units="neurons")
    second.set(site.name, 0, 0.0)
    pt.shrink(twin, second)
    assert pt.find_neurons(twin)[site.name].heads == tuple(range(3, site.num_heads, 2))
    assert pt.find_neurons(model)[site.name].heads == tuple(range(1, site.num_heads, 2))
