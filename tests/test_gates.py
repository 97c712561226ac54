"""Hard-Concrete gates: closed forms, deterministic export, hooks, and λ behaviour on a real tiny model."""

import math

import pytest
import torch

import prunetrain as pt
from prunetrain.methods.gates import BETA, LIMIT_L, LIMIT_R, HardConcreteGates, gates_for
from prunetrain.zoo import tiny_inputs, tiny_model


def _gates(log_alpha_values, kinds=None):
    model = tiny_model("marian")
    gates = gates_for(model, kinds=kinds)
    with torch.no_grad():
        for name in gates.site_names:
            gates.site_log_alpha(name).copy_(torch.tensor(log_alpha_values))
    return model, gates


def test_probabilities_match_monte_carlo_and_closed_form():
    _, gates = _gates([-2.0, -0.3, 0.4, 2.5])
    name = gates.site_names[0]
    torch.manual_seed(0)
    samples = torch.stack([gates.sample(name).detach() for _ in range(40000)])
    closed, opened = gates.prob_closed(name).detach(), gates.prob_open(name).detach()
    assert torch.allclose((samples == 0).float().mean(0), closed, atol=0.01)
    assert torch.allclose((samples == 1).float().mean(0), opened, atol=0.01)
    log_alpha = torch.tensor([-2.0, -0.3, 0.4, 2.5])
    expected_closed = torch.sigmoid(BETA * math.log(-LIMIT_L / LIMIT_R) - log_alpha)  # Louizos eq. 12
    assert torch.allclose(closed, expected_closed)
    assert torch.allclose(gates.expected_l0(), (1 - expected_closed).sum() * len(gates.site_names))
    assert torch.allclose(gates.penalty(0.5), 0.5 * gates.expected_l0())


def test_deterministic_rule_is_p_open_greater_than_p_closed():
    _, gates = _gates([-1.0, -0.01, 0.01, 1.0])
    name = gates.site_names[0]
    assert gates.deterministic(name).tolist() == [0.0, 0.0, 1.0, 1.0]
    assert (gates.prob_open(name) > gates.prob_closed(name)).tolist() == [False, False, True, True]


def test_eval_gates_equal_the_exported_mask_and_training_samples_carry_gradients():
    model, gates = _gates([-1.0, 2.0, -3.0, 1.0], kinds=["encoder_self", "cross"])
    mask = gates.to_mask()
    assert mask.num_kept == 24 - 2 * 4  # two gated kinds with 2 of 4 heads closed in each of 4 sites
    assert mask["model.decoder.layers.0.self_attn"].tolist() == [1.0] * 4  # not gated
    inputs = tiny_inputs("marian")
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    gates.attach(model)
    with torch.no_grad():
        gated = model(**inputs).logits
    assert torch.equal(gated, masked)
    model.train()
    loss = model(**inputs).loss
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gates.parameters())
    first = model(**inputs).loss.item()
    second = model(**inputs).loss.item()
    assert first != second  # a fresh sample per forward in training mode
    gates.detach()
    model.eval()
    with torch.no_grad():
        assert not torch.equal(model(**inputs).logits, gated)


BATCH = tiny_inputs("marian", batch=8, seed=5)


@pytest.fixture(scope="module")
def converged_model():
    """Voita et al. gate a converged model: here a tiny Marian that has memorised one batch (its heads matter)."""
    model = tiny_model("marian")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(150):
        optimizer.zero_grad()
        model(**BATCH).loss.backward()
        optimizer.step()
    return model.eval()


def _train_gates_only(model, lam, steps=40):
    for p in model.parameters():
        p.requires_grad_(False)
    gates = gates_for(model, init_log_alpha=3.0).attach(model)
    optimizer = torch.optim.Adam(gates.parameters(), lr=0.1)
    model.train()
    torch.manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(**BATCH).loss + gates.penalty(lam)
        loss.backward()
        optimizer.step()
    gates.detach()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return gates.to_mask()


def test_lambda_zero_prunes_nothing_and_a_large_lambda_prunes_most_heads(converged_model):
    with torch.no_grad():
        assert converged_model(**BATCH).loss < 0.5
    assert _train_gates_only(converged_model, 0.0).num_kept == 24
    assert _train_gates_only(converged_model, 1.0).num_kept <= 6


def test_bad_gate_configuration_is_a_clear_error():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="kinds: 'decoder' is not an attention kind; allowed: encoder_self, "):
        gates_for(model, kinds=["decoder"])
    with pytest.raises(ValueError, match="kinds: this model has no 'cross' attention; its kinds are self"):
        gates_for(model, kinds=["cross"])
    with pytest.raises(ValueError, match="init_log_alpha: nan is not a finite number"):
        HardConcreteGates(pt.find_heads(model), init_log_alpha=float("nan"))
    gates = gates_for(model)
    with pytest.raises(ValueError, match="mask: shaped for another model"):
        gates.attach(tiny_model("roberta", num_hidden_layers=3))
