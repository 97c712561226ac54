"""Hard-Concrete gates on FFN neurons beside the heads (CoFi's gates on FFN dimensions): the gate acts where the
neuron mask does, an open gate is a no-op, the expected cost is Σ c_i (1 − P(g_i = 0)), a budget in multiply-adds
is met by the final mask, and `HardConcreteCallback(target_flops=...)` trains to it and shrinks the model."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import prunetrain as pt
from prunetrain.methods.flop_budget import model_cost, unit_costs
from prunetrain.methods.gates import gates_for
from prunetrain.training.options import GateTraining, Heads
from prunetrain.utils.plots import read_image_tags, read_scalars
from prunetrain.zoo import tiny_inputs, tiny_model

from test_callbacks import _marian, _seq2seq_trainer, tiny_mt  # noqa: F401  (the fixture)

BOTH = ("heads", "neurons")


def _set(gates, values_of):
    with torch.no_grad():
        for name in gates.site_names:
            alpha = gates.site_log_alpha(name)
            alpha.copy_(values_of(name, len(alpha)))


@pytest.mark.parametrize("name", ["marian", "llama-gqa4", "gpt2"])
def test_open_gates_on_heads_and_neurons_are_a_no_op_forward_and_backward(name):
    """Eval-mode gates that are all open (log α > 0) multiply by exactly 1: logits and every weight gradient
    bit-identical to the model without gates."""
    model = tiny_model(name)
    plain = copy.deepcopy(model)
    gates = gates_for(model, units=BOTH, init_log_alpha=5.0).attach(model)
    assert gates.gated_units == BOTH and gates.gated_count("neurons") == pt.find_neurons(model).total_neurons
    model.eval(), plain.eval()
    inputs = tiny_inputs(name)
    out, ref = model(**inputs), plain(**inputs)
    assert torch.equal(out.logits, ref.logits)
    out.logits.square().mean().backward()
    ref.logits.square().mean().backward()
    for (key, p), q in zip(model.named_parameters(), plain.parameters()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), key


@pytest.mark.parametrize("name", ["marian", "llama-gqa4", "gpt2", "t5"])
def test_closed_neuron_gates_equal_the_neuron_mask_and_the_shrunk_model(name):
    """Gates closed on some neurons (and heads) in eval mode compute what their `to_mask()` computes attached, and
    what the model shrunk by it computes."""
    model = tiny_model(name)
    gates = gates_for(model, units=BOTH)
    _set(gates, lambda site, n: torch.tensor([(-1.0 if (i + len(site)) % 3 == 0 else 1.0) for i in range(n)]))
    mask = gates.to_mask()
    assert 0 < mask.num_kept_neurons < mask.num_neurons
    inputs = tiny_inputs(name)
    model.eval()
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    gates.attach(model)
    with torch.no_grad():
        gated = model(**inputs).logits
    gates.detach()
    assert torch.equal(gated, masked)
    small = copy.deepcopy(model)
    pt.shrink(small, mask)
    with torch.no_grad():
        shrunk = small(**inputs).logits
    assert torch.allclose(shrunk, masked, rtol=1e-5, atol=1e-5)
    assert pt.find_neurons(small).total_neurons == mask.num_kept_neurons


def test_expected_cost_is_the_cost_weighted_open_probability_and_carries_gradients():
    model = tiny_model("llama-gqa4")
    gates = gates_for(model, units=BOTH)
    _set(gates, lambda site, n: torch.linspace(-2, 2, n))
    costs = unit_costs(model, BOTH)
    expected = sum(costs[n] * gates.heads_per_gate[n] * (1 - gates.prob_closed(n)).sum() for n in gates.site_names)
    assert torch.allclose(gates.expected_cost(), expected)
    gates.expected_cost().backward()
    assert all(p.grad is not None and bool((p.grad > 0).all()) for p in gates.parameters())
    # the head count stays what it was: expected_l0 over heads alone equals the heads-only gates' value
    heads_only = gates_for(model)
    _set(heads_only, lambda site, n: torch.linspace(-2, 2, n))
    assert heads_only.gated_units == ("heads",)
    assert torch.allclose(heads_only.expected_l0(), sum(
        gates.heads_per_gate[n] * (1 - gates.prob_closed(n)).sum() for n in gates.sites_of("heads")))


@pytest.mark.parametrize("share", [0.1, 0.3, 0.55])
def test_the_flop_mask_meets_the_share_with_the_lowest_gates_first(share):
    model = tiny_model("marian")
    gates = gates_for(model, units=BOTH)
    generator = torch.Generator().manual_seed(1)
    _set(gates, lambda site, n: torch.randn(n, generator=generator))
    mask = gates.to_flop_mask(model, share)
    costs = unit_costs(model, BOTH)
    original = model_cost(model)
    removed = sum(float((mask[s.name] == 0).sum()) * costs[s.name] for s in mask.layout)
    assert share * original <= removed < share * original + max(costs.values())
    alphas = {(n, i): float(v) for n in gates.site_names for i, v in enumerate(gates.unit_log_alpha(n).detach())}
    gone = [a for (n, i), a in alphas.items() if mask[n][i] == 0]
    kept = [a for (n, i), a in alphas.items() if mask[n][i] == 1]
    assert max(gone) <= min(kept)  # lowest log α first
    small = copy.deepcopy(model)
    pt.shrink(small, mask)
    assert model_cost(small) == pytest.approx(original - removed)
    with pytest.raises(ValueError, match=r"^share: 1.5 is not a fraction"):
        gates.to_flop_mask(model, 1.5)


def test_a_head_budget_is_refused_once_neurons_are_gated():
    model = tiny_model("marian")
    gates = gates_for(model, units=BOTH)
    with pytest.raises(ValueError, match=r"^keep: a head budget cannot rank gated FFN neurons"):
        gates.to_mask(keep=8)
    with pytest.raises(ValueError, match=r"^kinds: this model has no 'encoder_ffn' FFN neurons in this layout"):
        gates_for(model, kinds=["encoder_ffn"])


def test_callback_gates_heads_and_neurons_to_a_flop_budget_and_shrinks(tmp_path, tiny_mt):
    """`target_flops=0.4`: the Lagrangian drives the expected share of multiply-adds left to 0.6, the final mask
    removes at least 40 % of the multiply-adds (over by less than one unit), the model is shrunk to it, and the logs,
    gate history and TensorBoard show heads and neurons."""
    model = _marian(tiny_mt[2])
    before = model_cost(model)
    callback = pt.HardConcreteCallback(target_flops=0.4, finalize="shrink",
                                       training=GateTraining(gate_lr=0.1, lagrangian_lr=0.1, init_log_alpha=1.0))
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=4, model=model)
    trainer.train()
    assert callback.units == BOTH
    costs = max(unit_costs(_marian(tiny_mt[2]), BOTH).values())
    assert 0.6 * before - costs < model_cost(model) <= 0.6 * before
    sites = pt.find_sites(model)
    assert sites.total_neurons == callback.final_mask.num_kept_neurons < callback.final_mask.num_neurons
    assert sites.total_heads == callback.final_mask.num_kept
    history = json.loads((tmp_path / "prunetrain" / "gates_history.json").read_text())
    shares = [h["expected_flops_share"] for h in history]  # the Lagrangian pulls the expected share down to 0.6
    assert shares[0] > 0.8 and shares == sorted(shares, reverse=True) and min(abs(v - 0.6) for v in shares) < 0.1
    assert history[-1]["lambda_1"] > 0 and len(history[-1]["p_open_neurons"]) == 4  # 2 encoder + 2 decoder FFNs
    assert {"encoder_ffn", "decoder_ffn", "encoder_self", "cross"} <= set(history[-1]["open_per_kind"])
    logged = [log for log in trainer.state.log_history if "gates/neurons_open" in log]
    assert logged and all("gates/expected_flops_share" in log and "gates/heads_open" in log for log in logged)
    tensorboard = tmp_path / "prunetrain" / "tensorboard"
    assert read_image_tags(tensorboard) == {"prunetrain/gate_p_open": 4, "prunetrain/gate_p_open_neurons": 4}
    scalars = read_scalars(tensorboard)
    assert "prunetrain/neurons_alive/encoder_ffn" in scalars and "prunetrain/expected_flops_share" in scalars
    assert scalars["prunetrain/neurons_alive"][-1][1] == history[-1]["open_per_kind"]["encoder_ffn"] + \
        history[-1]["open_per_kind"]["decoder_ffn"]


def test_callback_gates_neurons_alone_of_one_kind(tmp_path, tiny_mt):
    """`Heads(units="neurons", kinds=["encoder_ffn"])`: only the encoder's FFN neurons are gated; heads and the
    decoder's FFNs stay whole."""
    model = _marian(tiny_mt[2])
    full = pt.find_sites(_marian(tiny_mt[2]))
    callback = pt.HardConcreteCallback(target_flops=0.1, finalize="shrink", heads=Heads(units="neurons",
                                                                                       kinds=["encoder_ffn"]))
    _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=1, model=model).train()
    after = pt.find_sites(model)
    assert after.total_heads == full.total_heads
    assert after.neurons_per_kind()["decoder_ffn"] == full.neurons_per_kind()["decoder_ffn"]
    assert after.neurons_per_kind()["encoder_ffn"] < full.neurons_per_kind()["encoder_ffn"]


def test_budgets_that_cannot_weigh_neurons_or_be_met_are_one_sentence(tmp_path, tiny_mt):
    with pytest.raises(ValueError, match=r"^heads: units=\('heads', 'neurons'\) gates FFN neurons, which `lam` and "
                                         r"`target_heads` \(counted in heads\) cannot weigh against heads"):
        pt.HardConcreteCallback(lam=0.1, heads=Heads(units=BOTH))
    with pytest.raises(ValueError, match=r"^heads: kinds \['ffn'\] gates FFN neurons"):
        pt.HardConcreteCallback(target_heads=4, heads=Heads(kinds=["ffn"]))
    with pytest.raises(ValueError, match=r"^lam, target_heads, target_flops: give exactly one"):
        pt.HardConcreteCallback(lam=0.1, target_flops=0.5)
    for bad in (0.0, 1.0, 1):
        with pytest.raises(ValueError, match=r"^target_flops: .* is not a share in \(0, 1\)"):
            pt.HardConcreteCallback(target_flops=bad)
    for bad in (True, float("nan"), "0.5"):  # refused at the door (prunetrain.utils.door), before the range check
        with pytest.raises(ValueError, match=r"^target_flops: .* is not allowed; expected a finite number\.$"):
            pt.HardConcreteCallback(target_flops=bad)
    with pytest.raises(ValueError, match=r"^units: \('heads',\) leaves out the FFN neurons that kind 'encoder_ffn'"):
        pt.HardConcreteCallback(target_flops=0.2, heads=Heads(units="heads", kinds=["encoder_ffn"]))
    callback = pt.HardConcreteCallback(target_flops=0.6, heads=Heads(kinds=["encoder_self"]))
    with pytest.raises(ValueError, match=r"^target_flops: 0.6 of the model's multiply-adds cannot be removed: the "
                                         r"gated units .* carry 0\.\d+ of them"):
        _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=1)


def test_gates_on_neurons_are_saved_as_the_model_evaluates(tmp_path):
    """A save while gates on heads and neurons are attached records what the model computes in eval mode: the
    loaded model (masks re-attached from the record) gives the gated model's logits."""
    model = tiny_model("llama")
    inputs = tiny_inputs("llama")
    gates = gates_for(model, units=BOTH, seed=1)
    _set(gates, lambda site, n: torch.tensor([(-1.0 if i % 4 == 1 else 2.0) for i in range(n)]))
    gates.owner = "hard-concrete"
    gates.attach(model)
    model.eval()
    with torch.no_grad():
        evaluated = model(**inputs).logits
    model.train()
    model.save_pretrained(tmp_path / "m")
    [record] = json.loads((tmp_path / "m" / "config.json").read_text())["prunetrain_export"]["masks"]
    assert any(name.endswith("down_proj") for name in record["sites"])
    loaded = pt.load_pruned(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, evaluated)
