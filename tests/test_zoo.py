"""The exactness suite over the whole zoo (`prunetrain.zoo.ARCHITECTURES`), one parametrized case per architecture.

Every architecture is a real transformers model built from a tiny random config (no downloads). For each one:
find_heads describes it consistently; an all-ones mask is bit-identical in forward and backward; a random mask
(whole key/value groups, one site with no heads left, soft values) gives masked == shrunk (max |Δ| ≤ 1e-5) on every
attention backend the architecture supports; generative ones generate the same tokens, greedy and beam, with a
head-less first self-attention layer; save/load round-trips; architectures whose shrink is refused refuse it cleanly.
Michel importance is checked against a hand-written reference gradient, and mid-training shrink against the
optimizer state, on a few. The README's table of architectures is `support_table()`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.heads import attention_sites
from prunetrain.zoo import ARCHITECTURES, random_mask, support_table, tiny_inputs, tiny_model

NAMES = list(ARCHITECTURES)
SHRINKABLE = [n for n in NAMES if ARCHITECTURES[n].shrink]
REFUSED = [n for n in NAMES if not ARCHITECTURES[n].shrink]
GENERATIVE = [n for n in SHRINKABLE if ARCHITECTURES[n].generative]
TOL = 1e-5
NOT_MODEL_INPUTS = ("labels", "decoder_input_ids", "decoder_attention_mask")


def _output(out) -> torch.Tensor:
    """The tensor a task's model is judged by (LM / classifier logits, CLIP-style similarity, or hidden states)."""
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0]


def _forward(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return _output(model(**inputs))


def _expected_heads(config) -> int | None:
    """Total heads from the config alone (an independent count), for the config shapes it knows; None otherwise."""
    c = config.to_dict()
    if c.get("is_encoder_decoder"):
        enc = c.get("encoder_layers") or c.get("num_layers")
        dec = c.get("decoder_layers") or c.get("num_decoder_layers") or c.get("num_layers")
        enc_h = c.get("encoder_attention_heads") or c.get("num_heads")
        dec_h = c.get("decoder_attention_heads") or c.get("num_heads")
        return enc * enc_h + 2 * dec * dec_h if all((enc, dec, enc_h, dec_h)) else None
    layers = c.get("num_hidden_layers") or c.get("n_layer")
    heads = c.get("num_attention_heads") or c.get("n_head")
    if not isinstance(layers, int) or not isinstance(heads, int) or c.get("num_hidden_groups", 1) != 1:
        return None
    return layers * heads


@pytest.mark.parametrize("name", NAMES)
def test_find_heads_describes_every_site(name):
    model = tiny_model(name)
    layout = pt.find_heads(model)
    assert len(layout) > 0
    expected = _expected_heads(model.config)
    if expected is not None:
        assert layout.total_heads == expected
    assert len(set(layout.names)) == len(layout)
    for site in attention_sites(model):
        info = site.info
        assert info.num_heads == info.original_num_heads >= 2
        assert info.heads == tuple(range(info.num_heads))
        assert info.num_heads % info.num_kv_heads == 0 or info.num_kv_heads == 1
        width = site.out_proj.weight.shape[1 if isinstance(site.out_proj, torch.nn.Linear) else 0]
        assert width == info.num_heads * info.head_dim  # the out projection's input is the concatenated heads
    assert layout.total_heads == sum(s.num_heads for s in layout)


@pytest.mark.parametrize("name", NAMES)
def test_all_ones_mask_is_bit_identical_forward_and_backward(name):
    model = tiny_model(name).train()  # train mode: any dropout / layer drop draws the same numbers in both runs
    inputs = tiny_inputs(name)

    def run():
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        out = model(**inputs)
        out.loss.backward()
        return _output(out).detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_out, ref_grads = run()
    with pt.HeadMask.ones(model).applied(model):
        out, grads = run()
    assert torch.equal(out, ref_out)
    assert ref_grads.keys() == grads.keys() and len(grads) > 0
    assert all(torch.equal(grads[n], ref_grads[n]) for n in grads)


def _masked_and_shrunk(name, attn_implementation, seed, soft, empty_site):
    model = tiny_model(name, attn_implementation=attn_implementation)
    inputs = tiny_inputs(name)
    mask = random_mask(model, seed=seed, soft=soft, empty_site=empty_site)
    with mask.applied(model):
        masked = _forward(model, inputs)
    pt.shrink(model, mask)
    return model, mask, masked, _forward(model, inputs)


@pytest.mark.parametrize("name", SHRINKABLE)
def test_masked_equals_shrunk_on_every_backend(name):
    for impl in ARCHITECTURES[name].backends:
        for seed, soft, empty in ((1, False, 0), (2, True, -1)):
            probe = tiny_model(name)
            empty_site = len(pt.find_heads(probe)) - 1 if empty == -1 else empty
            model, mask, masked, shrunk = _masked_and_shrunk(name, impl, seed, soft, empty_site)
            layout = pt.find_heads(model)
            assert layout.total_heads == mask.num_kept < mask.num_heads
            assert layout.sites[empty_site].num_heads == 0  # one site has no heads left
            assert (masked - shrunk).abs().max().item() <= TOL, (impl, seed)


@pytest.mark.parametrize("name", GENERATIVE)
def test_cached_generation_is_identical_greedy_and_beam(name):
    model = tiny_model(name)
    inputs = {k: v for k, v in tiny_inputs(name, length=6).items() if k not in NOT_MODEL_INPUTS}
    layout = pt.find_heads(model)
    first_name = next(s.name for s in layout if s.kind in ("self", "decoder_self"))  # first layer that caches
    mask = random_mask(model, seed=4, empty_site=None)
    mask[first_name] = torch.zeros(layout[first_name].num_heads)  # a head-less first self-attention layer
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    assert pt.find_heads(shrunk)[first_name].num_heads == 0
    for options in (dict(num_beams=1), dict(num_beams=2, num_return_sequences=2)):
        kwargs = dict(inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, **options)
        with torch.no_grad():
            with mask.applied(model):
                expected = model.generate(**kwargs)
            got = shrunk.generate(**kwargs)
        assert torch.equal(got, expected), options


@pytest.mark.parametrize("name", SHRINKABLE)
def test_save_and_load_round_trip(name, tmp_path):
    impl = ARCHITECTURES[name].backends[0]
    model, mask, masked, shrunk = _masked_and_shrunk(name, impl, seed=3, soft=True, empty_site=0)
    pt.save_pruned(model, tmp_path / "pruned")
    loaded = pt.load_pruned(tmp_path / "pruned", attn_implementation=impl)
    assert pt.find_heads(loaded) == pt.find_heads(model)
    assert torch.equal(_forward(loaded, tiny_inputs(name)), shrunk)


@pytest.mark.parametrize("name", REFUSED)
def test_refused_shrink_is_a_clear_error_and_changes_nothing(name):
    model = tiny_model(name)
    inputs = tiny_inputs(name)
    mask = random_mask(model, seed=1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with mask.applied(model):
        masked = _forward(model, inputs)
    assert not torch.equal(masked, _forward(model, inputs))  # the mask itself works
    with pytest.raises(ValueError, match=r"model: shrink of site '.+' is refused: .+ Masks and importance work"):
        pt.shrink(model, mask)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert pt.find_heads(model).total_heads == mask.num_heads


IMPORTANCE = [n for n in ("llama-mqa", "qwen3", "phi3", "gpt_neox", "falcon", "falcon-alibi", "olmo2", "fsmt")
              if n in ARCHITECTURES]


@pytest.mark.parametrize("name", IMPORTANCE)
def test_michel_importance_equals_a_reference_gradient(name):
    """I_h = |∂L/∂ξ_h| at ξ = 1 for one batch, against gates written here by hand (pre-hooks scaling heads)."""
    model = tiny_model(name)
    inputs = tiny_inputs(name)
    scores = pt.head_importance(model, [inputs], normalize=None)
    gates, handles = {}, []
    for site in attention_sites(model):
        xi = torch.ones(site.info.num_heads, requires_grad=True)
        d = site.info.head_dim
        gates[site.info.name] = xi

        def hook(module, args, xi=xi, d=d):
            x = args[0]
            return (x * xi.repeat_interleave(d),)
        handles.append(site.out_proj.register_forward_pre_hook(hook))
    model.eval()
    model(**inputs).loss.backward()
    for handle in handles:
        handle.remove()
    for site_name, xi in gates.items():
        torch.testing.assert_close(scores[site_name].double(), xi.grad.abs().double(), rtol=1e-5, atol=1e-8)
    assert any(bool((xi.grad != 0).any()) for xi in gates.values())


MID_TRAINING = [n for n in ("qwen3", "falcon", "phi3", "olmo2") if n in ARCHITECTURES]


@pytest.mark.parametrize("name", MID_TRAINING)
def test_mid_training_shrink_keeps_the_optimizer_state_of_kept_heads(name):
    model = tiny_model(name).train()
    inputs = tiny_inputs(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad()
        model(**inputs).loss.backward()
        optimizer.step()
    site = next(s for s in attention_sites(model))
    out_weight = site.out_proj.weight
    before = optimizer.state[out_weight]["exp_avg"].clone()
    mask = random_mask(model, seed=5, empty_site=None)
    g = site.info.group_size
    mask[site.info.name] = torch.tensor([0.0] * g + [1.0] * (site.info.num_heads - g))  # the first kv group goes
    pt.shrink(model, mask, optimizer=optimizer)
    kept_cols = torch.arange(site.info.group_size * site.info.head_dim, before.shape[1])
    assert torch.equal(optimizer.state[out_weight]["exp_avg"], before[:, kept_cols])
    for param in model.parameters():
        for value in optimizer.state[param].values():
            if torch.is_tensor(value) and value.dim():
                assert value.shape == param.shape
    optimizer.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)


MOE = [n for n in ("mixtral", "qwen2_moe", "qwen3_moe") if n in ARCHITECTURES]


@pytest.mark.parametrize("name", MOE)
def test_shrink_leaves_the_experts_untouched(name):
    model = tiny_model(name)
    experts = {k: v.clone() for k, v in model.state_dict().items() if "expert" in k or "gate" in k}
    assert experts
    pt.shrink(model, random_mask(model, seed=1))
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in experts.items())


def test_a_renamed_attention_class_fails_loudly_instead_of_pruning_nothing(monkeypatch):
    """What a later transformers renaming a module would do: the adapter matches no module, and find_heads raises."""
    from prunetrain.engine.families.decoders import Qwen3Adapter

    model = tiny_model("qwen3")
    monkeypatch.setattr(Qwen3Adapter, "module_classes", ("Qwen3RenamedAttention",))
    with pytest.raises(ValueError,
                       match=r"model_type='qwen3'\) is handled by adapter 'qwen3', but none of its modules"):
        pt.find_heads(model)


def test_the_zoo_covers_at_least_thirty_architectures():
    assert len(ARCHITECTURES) >= 30, sorted(ARCHITECTURES)


def test_readme_lists_the_zoo():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "engine.md").read_text()  # the README's table moved there
    found = re.search(r"<!-- architectures:begin -->\n(.*?)\n<!-- architectures:end -->", readme, re.S)
    assert found, "docs/engine.md lacks the <!-- architectures:begin/end --> section"
    assert found.group(1).strip() == support_table().strip(), (
        "docs/engine.md's architectures table is out of date; regenerate it with "
        "python -c 'import prunetrain.zoo as z; print(z.support_table())'")
