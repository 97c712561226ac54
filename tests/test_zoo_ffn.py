"""FFN neurons as prunable units, over the whole zoo (`prunetrain.zoo.ARCHITECTURES`): the same exactness promises
as heads (tests/test_zoo.py), for neurons alone and together with heads.

For every architecture with a dense FFN: find_sites describes each FFN (its width, the config's width, the down
projection whose input the neurons are); an all-ones mask over heads and neurons is bit-identical in forward and
backward; a random mask over heads and neurons (soft values, one FFN emptied, one left with a single neuron) gives
masked == shrunk on every attention backend; generative ones generate the same tokens, greedy and beam; save/load
round-trips, also through the self-contained modeling file. Mixtures of experts refuse neurons in one sentence.
Michel importance of neurons is checked against a hand-written gradient, and a mid-training shrink against the
optimizer state.
"""

from __future__ import annotations

import copy

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.heads import live_sites, supported_units
from prunetrain.zoo import ARCHITECTURES, random_mask, tiny_inputs, tiny_model

NAMES = list(ARCHITECTURES)
WITH_FFN = [n for n in NAMES if "neurons" in supported_units(tiny_model(n))]
MOE = [n for n in NAMES if n not in WITH_FFN]
SHRINKABLE = [n for n in WITH_FFN if ARCHITECTURES[n].shrink]
GENERATIVE = [n for n in SHRINKABLE if ARCHITECTURES[n].generative]
BOTH = ("heads", "neurons")
TOL = 1e-5
NOT_MODEL_INPUTS = ("labels", "decoder_input_ids", "decoder_attention_mask")


def _output(out) -> torch.Tensor:
    for key in ("logits", "logits_per_image", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0]


def _forward(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return _output(model(**inputs))


def _ffn_mask(model, seed: int, soft: bool = True, units=BOTH):
    """A random mask over `units` (heads: no head-less site here, test_zoo covers those) in which the first FFN
    loses every neuron and the last keeps exactly one."""
    layout = pt.find_sites(model, units)
    mask = random_mask(layout, seed=seed, soft=soft, empty_site=None)
    ffn = [s for s in layout if s.unit == "neurons"]
    mask[ffn[0].name] = torch.zeros(ffn[0].num_heads)
    single = torch.zeros(ffn[-1].num_heads)
    single[ffn[-1].num_heads // 3] = 0.75 if soft else 1.0
    mask[ffn[-1].name] = single
    return mask


def test_the_zoo_has_ffn_neurons_in_all_but_the_mixtures_of_experts():
    assert len(WITH_FFN) >= 45 and sorted(MOE) == ["mixtral", "qwen2_moe", "qwen3_moe"], MOE


@pytest.mark.parametrize("name", WITH_FFN)
def test_find_sites_describes_every_ffn(name):
    model = tiny_model(name)
    neurons = pt.find_neurons(model)
    assert neurons.units == ("neurons",) and len(neurons) >= 2
    assert all(s.unit == "neurons" and s.head_dim == 1 and s.group_size == 1 for s in neurons)
    for site in live_sites(model, ("neurons",)):
        info = site.info
        layer = getattr(site.out_proj, "base_layer", site.out_proj)
        width = layer.weight.shape[1] if isinstance(layer, torch.nn.Linear) else layer.weight.shape[0]
        assert width == info.num_heads == info.original_num_heads == info.num_kv_heads  # the config's width
        assert info.heads == tuple(range(width))
        assert dict(model.named_modules())[info.name] is site.out_proj  # named by its down projection
    both = pt.find_sites(model)
    assert both.units == BOTH and both.total_heads == pt.find_heads(model).total_heads
    assert both.total_neurons == neurons.total_neurons
    assert [s.name for s in both if s.unit == "heads"] == pt.find_heads(model).names  # module order, heads first
    assert set(both.kinds) == set(pt.find_heads(model).kinds) | set(neurons.kinds)
    assert "neurons (" in both.summary() and "neurons" not in pt.find_heads(model).summary()
    assert pt.HeadLayout.from_dict(both.to_dict()) == both
    assert "units" not in pt.find_heads(model).to_dict()  # a heads-only layout keeps its format


@pytest.mark.parametrize("name", MOE)
def test_mixture_of_experts_refuses_neurons_in_one_sentence(name):
    model = tiny_model(name)
    for call in (lambda: pt.find_neurons(model), lambda: pt.find_sites(model),
                 lambda: pt.HeadMask.ones(model, units=BOTH)):
        with pytest.raises(ValueError, match=r"^model: the FFN neurons of \w+ cannot be pruned: its FFNs .* are "
                                             r"mixtures of experts.*Prune its heads only\.$"):
            call()
    assert supported_units(model) == ("heads",)
    pt.find_heads(model)  # heads stay prunable


@pytest.mark.parametrize("name", WITH_FFN)
def test_all_ones_mask_over_heads_and_neurons_is_bit_identical_forward_and_backward(name):
    model = tiny_model(name).train()
    inputs = tiny_inputs(name)

    def run():
        torch.manual_seed(0)
        model.zero_grad(set_to_none=True)
        out = model(**inputs)
        out.loss.backward()
        return _output(out).detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_out, ref_grads = run()
    with pt.HeadMask.ones(model, units=BOTH).applied(model):
        out, grads = run()
    assert torch.equal(out, ref_out)
    assert ref_grads.keys() == grads.keys() and len(grads) > 0
    assert all(torch.equal(grads[n], ref_grads[n]) for n in grads)


@pytest.mark.parametrize("name", SHRINKABLE)
def test_masked_equals_shrunk_for_neurons_alone_and_with_heads_on_every_backend(name):
    for impl in ARCHITECTURES[name].backends:
        for seed, soft, units in ((1, True, BOTH), (2, False, ("neurons",))):
            model = tiny_model(name, attn_implementation=impl)
            inputs = tiny_inputs(name)
            mask = _ffn_mask(model, seed, soft, units)
            with mask.applied(model):
                masked = _forward(model, inputs)
            assert not torch.equal(masked, _forward(model, inputs))  # the mask changes the model
            layout = pt.shrink(model, mask)
            assert layout == pt.find_sites(model, units) and layout.units == units
            ffn = [s for s in layout if s.unit == "neurons"]
            assert ffn[0].num_heads == 0 and ffn[-1].num_heads == 1  # an emptied FFN, a one-neuron FFN
            assert layout.total_neurons == mask.num_kept_neurons and layout.total_heads == mask.num_kept
            assert (masked - _forward(model, inputs)).abs().max().item() <= TOL, (impl, seed)


@pytest.mark.parametrize("name", GENERATIVE)
def test_cached_generation_is_identical_with_pruned_ffns_greedy_and_beam(name):
    model = tiny_model(name)
    inputs = {k: v for k, v in tiny_inputs(name, length=6).items() if k not in NOT_MODEL_INPUTS}
    mask = _ffn_mask(model, seed=4)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask.copy())
    for options in (dict(num_beams=1), dict(num_beams=2, num_return_sequences=2)):
        kwargs = dict(inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=True, **options)
        with torch.no_grad():
            with mask.applied(model):
                expected = model.generate(**kwargs)
            got = shrunk.generate(**kwargs)
        assert torch.equal(got, expected), options


@pytest.mark.parametrize("name", SHRINKABLE)
def test_save_and_load_round_trip_with_neurons(name, tmp_path):
    impl = ARCHITECTURES[name].backends[0]
    model = tiny_model(name, attn_implementation=impl)
    inputs = tiny_inputs(name)
    pt.shrink(model, _ffn_mask(model, seed=3))
    shrunk = _forward(model, inputs)
    pt.save_pruned(model, tmp_path / "pruned")
    loaded = pt.load_pruned(tmp_path / "pruned", attn_implementation=impl)
    assert pt.find_sites(loaded) == pt.find_sites(model)
    assert torch.equal(_forward(loaded, inputs), shrunk)


REMOTE_CODE = [n for n in ("gpt2", "llama", "marian", "t5", "phi3", "mt5", "bert", "modernbert") if n in SHRINKABLE]


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_the_self_contained_directory_loads_the_ffn_layout_without_prunetrain(name, tmp_path):
    """`from_pretrained(trust_remote_code=True)` rebuilds emptied and one-neuron FFNs from the modeling file alone
    (GPT-2's emptied MLP included, which runs the head-less forward)."""
    import transformers

    model = tiny_model(name)
    inputs = tiny_inputs(name)
    pt.shrink(model, _ffn_mask(model, seed=6))
    expected = _forward(model, inputs)
    pt.save_pruned(model, tmp_path / "pruned")
    cls = getattr(transformers, ARCHITECTURES[name].model_class)
    auto = {"causal-lm": transformers.AutoModelForCausalLM, "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "masked-lm": transformers.AutoModelForMaskedLM}[ARCHITECTURES[name].task]
    loaded = auto.from_pretrained(tmp_path / "pruned", trust_remote_code=True).eval()
    assert type(loaded).__name__ == cls.__name__
    assert torch.equal(_forward(loaded, inputs), expected)


@pytest.mark.parametrize("name", ["llama", "marian", "gpt2", "t5"])
def test_a_save_with_a_neuron_mask_attached_loads_masked_or_shrunk(name, tmp_path):
    model = tiny_model(name)
    inputs = tiny_inputs(name)
    mask = _ffn_mask(model, seed=7)
    mask.attach(model)
    masked = _forward(model, inputs)
    model.save_pretrained(tmp_path / "masked")
    pt.save_pruned(model, tmp_path / "pruned")
    for path in (tmp_path / "masked", tmp_path / "pruned"):
        again = pt.load_pruned(path)
        assert torch.equal(_forward(again, inputs), masked)
        small = pt.load_pruned(path, masks="shrink")
        assert pt.find_sites(small).total_neurons < pt.find_sites(model).total_neurons
        assert (_forward(small, inputs) - masked).abs().max().item() <= TOL


@pytest.mark.parametrize("name", ["llama", "marian", "gpt2", "phi3", "t5", "fsmt"])
def test_michel_importance_of_neurons_equals_a_reference_gradient(name):
    """I_j = |∂L/∂ξ_j| at ξ = 1 for one batch, for heads and neurons together, against gates written here by hand
    (pre-hooks scaling each unit's slice of its output projection's input)."""
    model = tiny_model(name)
    inputs = tiny_inputs(name)
    scores = pt.head_importance(model, [inputs], normalize=None, units=BOTH)
    assert scores.layout.units == BOTH
    gates, handles = {}, []
    for site in live_sites(model, BOTH):
        xi = torch.ones(site.info.num_heads, requires_grad=True)
        gates[site.info.name] = xi

        def hook(module, args, xi=xi, d=site.info.head_dim):
            return (args[0] * xi.repeat_interleave(d),)
        handles.append(site.out_proj.register_forward_pre_hook(hook))
    model.eval()
    model(**inputs).loss.backward()
    for handle in handles:
        handle.remove()
    for site_name, xi in gates.items():
        torch.testing.assert_close(scores[site_name].double(), xi.grad.abs().double(), rtol=1e-5, atol=1e-8)
    ffn = [s.name for s in scores.layout if s.unit == "neurons"]
    assert ffn and all(bool((gates[n].grad != 0).any()) for n in ffn)


@pytest.mark.parametrize("name", ["llama", "gpt2", "marian", "phi3"])
def test_mid_training_shrink_keeps_the_optimizer_state_of_kept_neurons(name):
    model = tiny_model(name).train()
    inputs = tiny_inputs(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad()
        model(**inputs).loss.backward()
        optimizer.step()
    site = live_sites(model, ("neurons",))[0]
    down = site.out_proj
    conv1d = not isinstance(down, torch.nn.Linear)  # GPT-2's Conv1D: weight [in, out]
    before = optimizer.state[down.weight]["exp_avg"].clone()
    keep = torch.ones(site.info.num_heads)
    keep[::3] = 0.0
    mask = pt.HeadMask.ones(model, units=BOTH)
    mask[site.info.name] = keep
    pt.shrink(model, mask, optimizer=optimizer)
    kept = torch.nonzero(keep).flatten()
    expected = before[kept] if conv1d else before[:, kept]
    assert torch.equal(optimizer.state[down.weight]["exp_avg"], expected)
    for param in model.parameters():
        for value in optimizer.state[param].values():
            if torch.is_tensor(value) and value.dim():
                assert value.shape == param.shape
    optimizer.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert pt.find_neurons(model)[site.info.name].heads == tuple(kept.tolist())


def test_a_head_mask_and_a_neuron_layout_do_not_mix():
    """A heads-only mask attached to a model does not describe its FFN sites; a mask over both does not fit a
    model whose FFN was shrunk since (the widths differ): refused naming the first difference."""
    model = tiny_model("llama")
    heads_only = pt.HeadMask.ones(model)
    assert heads_only.layout.units == ("heads",) and heads_only.num_heads == pt.find_heads(model).total_heads
    both = pt.HeadMask.ones(model, units=BOTH)
    pt.shrink(copy.deepcopy(model), both.copy())  # an all-ones mask of both kinds is a no-op
    pt.shrink(model, _ffn_mask(model, seed=8))
    with pytest.raises(ValueError, match=r"mask: shaped for another model .* first difference"):
        both.attach(model)
