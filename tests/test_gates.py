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
    with pytest.raises(ValueError, match=r"^init_log_alpha: nan is not allowed; expected a finite number\.$"):
        HardConcreteGates(pt.find_heads(model), init_log_alpha=float("nan"))
    gates = gates_for(model)
    with pytest.raises(ValueError, match="mask: shaped for another model"):
        gates.attach(tiny_model("roberta", num_hidden_layers=3))


# ---------------------------------------------------------------------------------------------------------------------
# grouped-query attention: one gate per key/value group, budgets met exactly in whole groups (issue 24, seam 2)
# ---------------------------------------------------------------------------------------------------------------------
from prunetrain.zoo import ARCHITECTURES, random_mask  # noqa: E402

GQA = [name for name, arch in ARCHITECTURES.items() if arch.shrink
       and any(s.group_size > 1 for s in pt.find_heads(tiny_model(name)))]


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("name", GQA)
def test_gqa_gates_close_whole_groups_and_a_budget_shrinks_exactly(name):
    model = tiny_model(name)
    layout = pt.find_heads(model)
    gates = gates_for(model)
    for site in layout:
        assert gates.site_log_alpha(site.name).numel() == site.num_heads // site.group_size  # a gate per group
    with torch.no_grad():
        for n in gates.site_names:
            gates.site_log_alpha(n).copy_(torch.randn(gates.site_log_alpha(n).shape,
                                                      generator=torch.Generator().manual_seed(len(n))))
    closed = {n: gates.prob_closed(n).repeat_interleave(gates.heads_per_gate[n]) for n in gates.site_names}
    assert torch.allclose(gates.expected_l0(), sum((1 - c).sum() for c in closed.values()))  # counted in heads
    g = max(gates.heads_per_gate.values())
    budget = g * (layout.total_heads // g // 2)
    mask = gates.to_mask(keep=budget)
    assert mask.num_kept == budget
    inputs = tiny_inputs(name)
    with mask.applied(model):
        masked = _forward(model, inputs)
    pt.shrink(model, mask)  # group-aligned: no gqa_rounding needed
    assert pt.find_heads(model).total_heads == budget
    assert (_forward(model, inputs) - masked).abs().max() <= 1e-5
    with pytest.raises(ValueError, match=rf"keep: {budget + 1} heads cannot be kept exactly: grouped-query "
                                         rf"attention removes heads in whole key/value groups \(of .*{g} heads here\), "
                                         rf"so the nearest budgets are {budget} and {budget + g}\."):
        gates.to_mask(keep=budget + 1)


def test_a_budget_over_groups_of_different_sizes_keeps_the_largest_total_log_alpha():
    """llama-gqa4 (8 heads on 2 key/value heads per layer) with layer 0 shrunk to one group: its 4 heads are then
    multi-query (a gate each), layer 1 keeps groups of 4. Budget 6 = one group of 4 + two single heads; the best
    total log α is not the greedy order of the gates (the best gate alone is a group of 4 that cannot be combined)."""
    model = tiny_model("llama-gqa4")
    first = "model.layers.0.self_attn"
    mask = pt.HeadMask.ones(model)
    mask[first] = torch.tensor([1.0] * 4 + [0.0] * 4)
    pt.shrink(model, mask)
    gates = gates_for(model)
    assert gates.heads_per_gate == {first: 1, "model.layers.1.self_attn": 4}
    with torch.no_grad():
        gates.site_log_alpha(first).copy_(torch.tensor([3.0, 2.5, -1.0, -2.0]))
        gates.site_log_alpha("model.layers.1.self_attn").copy_(torch.tensor([4.0, 0.5]))
    kept = gates.to_mask(keep=6)
    assert kept[first].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert kept["model.layers.1.self_attn"].tolist() == [1.0] * 4 + [0.0] * 4  # 3 + 2.5 + 4 beats 4 + 0.5 + ...
    assert gates.to_mask(keep=5).num_kept == 5
    gates.check_budget(7)
    with pytest.raises(ValueError, match=r"keep: 13 is not allowed; expected an int in \[0, 12\] \(gated heads\)"):
        gates.check_budget(13)


def _gqa_trainer(tmp_path, multi30k_dir, callback, steps=6):
    import transformers

    from prunetrain.mt.text.data import read_parallel, train_tokenizer

    pairs = read_parallel(multi30k_dir, "train", limit=64)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=16,
                                          learning_rate=2e-3, save_strategy="no", report_to=[], use_cpu=True,
                                          logging_steps=2, seed=0, disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": i} for i in enc["input_ids"]],
                                data_collator=transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False),
                                callbacks=[callback])


def test_gates_on_a_gqa_model_in_a_trainer_end_on_budget_shrunk_and_logged(tmp_path, multi30k_dir, capsys):
    """The issue's run: Qwen2-style, 8 query heads on 2 key/value heads per layer, a budget with finalize='shrink'.
    It used to train every step and then raise in on_train_end; now it ends shrunk to exactly the budget."""
    from prunetrain.training.hard_concrete import HardConcreteCallback

    gates = HardConcreteCallback(target_heads=8, finalize="shrink", tensorboard=False)
    trainer = _gqa_trainer(tmp_path, multi30k_dir, gates)
    trainer.train()
    layout = pt.find_heads(trainer.model)
    assert layout.total_heads == 8 and all(s.num_heads == 4 * s.num_kv_heads for s in layout)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [e["step"] for e in logged] == [2, 4, 6]
    for entry in logged:
        assert {"gates/expected_l0", "gates/penalty", "gates/lambda_1", "gates/lambda_2"} <= set(entry)
        assert 0 <= entry["gates/expected_l0"] <= 16
    assert "'gates/expected_l0'" in capsys.readouterr().out  # the Trainer's console printer shows them
    # the shrunk model saves alone (the gates' hooks, gone after the shrink, are not in its save record)
    assert trainer.model.config.prunetrain_export.get("standalone", True), trainer.model.config.prunetrain_export
    trainer.model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "modeling_prunetrain.py").is_file()


def test_a_finalisation_that_cannot_be_exact_is_refused_before_the_first_step(tmp_path, multi30k_dir):
    from prunetrain.training.hard_concrete import HardConcreteCallback

    with pytest.raises(ValueError, match=r"target_heads: 6 heads cannot be kept exactly: grouped-query attention "
                                         r"removes heads in whole key/value groups \(of 4 heads here\), so the "
                                         r"nearest budgets are 4 and 8\."):
        _gqa_trainer(tmp_path, multi30k_dir, HardConcreteCallback(target_heads=6))
    with pytest.raises(ValueError, match=r"target_heads: 6 heads cannot be kept exactly"):
        _gqa_trainer(tmp_path, multi30k_dir, HardConcreteCallback(target_heads=0.375))  # 0.375 × 16 heads
    import transformers

    model = tiny_model("falcon-alibi")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"finalize: 'shrink' is refused for site 'transformer.h.0.self_attention': "
                                         r".*ALiBi.* Use finalize='mask'"):
        transformers.Trainer(model=model, args=args, train_dataset=[tiny_inputs("falcon-alibi")],
                             callbacks=[HardConcreteCallback(lam=0.1, finalize="shrink")])
