"""shrink: the physically pruned model computes what the masked model computes, generation included, and training
continues with the pruned weights still learning."""

import copy

import pytest
import torch

import prunetrain as pt
from prunetrain.zoo import SEQ2SEQ_FAMILIES, TINY_FAMILIES, random_mask, tiny_inputs, tiny_model

GENERATING = ("marian", "bart", "t5", "gpt2", "llama")


def _masked_and_shrunk(family, mask_seed, **mask_kwargs):
    model = tiny_model(family)
    mask = random_mask(model, seed=mask_seed, **mask_kwargs)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    return model, mask, shrunk


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_masked_equals_shrunk(family, seed):
    model, mask, shrunk = _masked_and_shrunk(family, seed, soft=seed == 1, empty_site=seed)
    inputs = tiny_inputs(family, seed=seed)
    with torch.no_grad():
        plain = model(**inputs).logits
        with mask.applied(model):
            masked = model(**inputs).logits
        pruned = shrunk(**inputs).logits
    assert (masked - plain).abs().max() > 1e-4
    assert (masked - pruned).abs().max() <= 1e-5
    layout = pt.find_heads(shrunk)
    for site in layout:  # the layout reports what remains, by original head index
        assert site.num_heads == len(mask.kept(site.name)) == len(site.heads)
        assert list(site.heads) == mask.kept(site.name)
    assert layout.sites[seed].num_heads == 0  # a fully pruned site
    assert sum(p.numel() for p in shrunk.parameters()) < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", GENERATING)
def test_identical_greedy_generation(family):
    """Same tokens, and the same step scores (which also shows the mask matters at every step, cache included)."""
    model, mask, shrunk = _masked_and_shrunk(family, 5, empty_site=1)
    inputs = tiny_inputs(family, length=6)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    if family not in SEQ2SEQ_FAMILIES:
        kwargs["pad_token_id"] = 1
    with torch.no_grad():
        with mask.applied(model):
            expected = model.generate(**kwargs)
        plain = model.generate(**kwargs)
        got = shrunk.generate(**kwargs)
    assert torch.equal(expected.sequences, got.sequences)
    assert len(got.scores) == 8
    for step_expected, step_got in zip(expected.scores, got.scores):
        assert torch.equal(torch.isinf(step_expected), torch.isinf(step_got))  # the same tokens forbidden
        assert (_finite(step_expected) - _finite(step_got)).abs().max() <= 1e-5
    assert max((_finite(e) - _finite(p)).abs().max() for e, p in zip(expected.scores, plain.scores)) > 1e-4


def _finite(scores):
    return torch.nan_to_num(scores, neginf=0.0, posinf=0.0)


def test_identical_beam_search_marian():
    model, mask, shrunk = _masked_and_shrunk("marian", 6)
    inputs = tiny_inputs("marian", length=6)
    kwargs = dict(max_new_tokens=8, num_beams=4, do_sample=False)
    with torch.no_grad():
        with mask.applied(model):
            expected = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
        got = shrunk.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
    assert torch.equal(expected, got)


def test_t5_shared_position_bias_with_non_uniform_heads():
    """T5 computes the relative bias in layer 0 and shares it; shrinking layer 0 and layer 1 differently must still
    give each layer the bias rows of its own original heads."""
    model = tiny_model("t5")
    mask = pt.HeadMask.from_heads(model, {
        "encoder.block.0.layer.0.SelfAttention": [0, 1],
        "encoder.block.1.layer.0.SelfAttention": [2, 3],
        "decoder.block.0.layer.0.SelfAttention": [3],
        "decoder.block.1.layer.1.EncDecAttention": [0, 2],
    })
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    assert shrunk.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.shape == (8, 4)
    inputs = tiny_inputs("t5")
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    with torch.no_grad():
        assert (masked - shrunk(**inputs).logits).abs().max() <= 1e-5
    # shrinking again (a second pruning event) keeps the selection consistent
    second = pt.HeadMask.from_heads(shrunk, {"encoder.block.0.layer.0.SelfAttention": [0]})
    combined = mask.copy()
    combined.set("encoder.block.0.layer.0.SelfAttention", 2, 0.0)
    pt.shrink(shrunk, second)
    assert pt.find_heads(shrunk)["encoder.block.0.layer.0.SelfAttention"].heads == (3,)
    with torch.no_grad(), combined.applied(model):
        masked = model(**inputs).logits
    with torch.no_grad():
        assert (masked - shrunk(**inputs).logits).abs().max() <= 1e-5


def test_repeated_shrink_composes():
    model = tiny_model("marian")
    shrunk = copy.deepcopy(model)
    site = "model.decoder.layers.0.self_attn"
    pt.shrink(shrunk, pt.HeadMask.from_heads(shrunk, {site: [1]}))
    pt.shrink(shrunk, pt.HeadMask.from_heads(shrunk, {site: [0]}))  # position 0 of (0, 2, 3) is original head 0
    assert pt.find_heads(shrunk)[site].heads == (2, 3)
    both = pt.HeadMask.from_heads(model, {site: [0, 1]})
    inputs = tiny_inputs("marian")
    with torch.no_grad(), both.applied(model):
        expected = model(**inputs).logits
    with torch.no_grad():
        assert (expected - shrunk(**inputs).logits).abs().max() <= 1e-5


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_shrunk_equals_masked_on_backend(impl):
    model = tiny_model("llama", attn_implementation=impl)
    mask = random_mask(model, seed=3)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    inputs = tiny_inputs("llama")
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    with torch.no_grad():
        assert (masked - shrunk(**inputs).logits).abs().max() <= 1e-5


def test_gqa_mask_must_be_group_aligned_unless_rounding_is_asked():
    model = tiny_model("llama")
    site = "model.layers.0.self_attn"
    mask = pt.HeadMask.from_heads(model, {site: [1]})  # head 1 shares its kv head with head 0
    with pytest.raises(ValueError, match=r"mask: site 'model.layers.0.self_attn' removes only part of key/value "
                                         r"group 0 \(query heads 0..1, keep=\[1.0, 0.0\]\); with grouped-query "
                                         r"attention heads are removed 2 at a time"):
        pt.shrink(copy.deepcopy(model), mask)
    kept = copy.deepcopy(model)
    pt.shrink(kept, mask, gqa_rounding="keep")
    assert pt.find_heads(kept)[site].num_heads == 4
    inputs = tiny_inputs("llama")
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    with torch.no_grad():
        assert (masked - kept(**inputs).logits).abs().max() <= 1e-5  # zeroed head folded to zero
    dropped = copy.deepcopy(model)
    pt.shrink(dropped, mask, gqa_rounding="drop")
    assert pt.find_heads(dropped)[site].heads == (2, 3) and pt.find_heads(dropped)[site].num_kv_heads == 1
    with pytest.raises(ValueError, match="gqa_rounding: 'round' is not one of 'error', 'keep', 'drop'"):
        pt.shrink(copy.deepcopy(model), mask, gqa_rounding="round")


def test_shrink_rejects_a_mask_for_another_model_and_detaches_its_own():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="mask: shaped for another model"):
        pt.shrink(model, pt.HeadMask.ones(tiny_model("roberta")).copy().__class__(pt.find_heads(tiny_model("gpt2"))))
    with pytest.raises(TypeError, match="mask: expected a prunetrain.HeadMask, got dict"):
        pt.shrink(model, {"bert.encoder.layer.0.attention": [0, 1, 1, 1]})
    mask = random_mask(model, seed=0).attach(model)
    other = pt.HeadMask.ones(model).attach(model)
    with pytest.raises(ValueError, match="another HeadMask is attached"):
        pt.shrink(model, mask)
    other.detach()
    pt.shrink(model, mask)
    assert not mask.attached and pt.attached_masks(model) == []


def test_a_mask_attached_to_one_model_does_not_shrink_a_copy_made_before():
    """Issue 63: a mask attached to A used to shrink B (a copy made before attaching) and detach itself from A."""
    model = tiny_model("bert")
    inputs = tiny_inputs("bert")
    copy_before = copy.deepcopy(model)
    original = {k: v.clone() for k, v in copy_before.state_dict().items()}
    mask = random_mask(model, seed=1).attach(model)
    masked = model(**inputs).logits
    with pytest.raises(ValueError, match=r"^mask: it is attached to another model .*mask\.copy\(\)\)\.$"):
        pt.shrink(copy_before, mask)
    assert mask.attached and pt.attached_masks(model) == [mask]  # still on A
    assert torch.equal(model(**inputs).logits, masked)
    assert all(torch.equal(v, original[k]) for k, v in copy_before.state_dict().items())  # B untouched
    pt.shrink(copy_before, mask.copy())  # a detached copy shrinks B to what A computes
    assert torch.allclose(copy_before(**inputs).logits, masked, atol=1e-5)


def test_a_deep_copy_with_copied_mask_hooks_is_refused_by_shrink():

    model = tiny_model("bert")
    inputs = tiny_inputs("bert")
    mask = random_mask(model, seed=1).attach(model)
    twin = copy.deepcopy(model)  # the copy computes the masked model, but no mask is registered with it
    assert torch.equal(twin(**inputs).logits, model(**inputs).logits)
    with pytest.raises(ValueError, match=r"carries a HeadMask hook that no attached mask owns"):
        pt.shrink(twin, random_mask(twin, seed=2))
    pt.shrink(model, mask)  # the original is unaffected


def _train_steps(model, optimizer, batches, mask=None):
    losses = []
    model.train()
    for batch in batches:
        optimizer.zero_grad()
        if mask is None:
            loss = model(**batch).loss
        else:
            with mask.applied(model):
                loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer_name", ["adamw", "sgd"])
def test_mid_training_shrink_keeps_learning_with_sliced_optimizer_state(optimizer_name):
    """Train masked vs shrink-then-train: the kept weights follow the same trajectory, because their gradients
    are the same and the optimizer state of kept heads is the old state, sliced."""
    torch.manual_seed(0)
    make = {"adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01),
            "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}[optimizer_name]
    model = tiny_model("marian").double()
    batches = [tiny_inputs("marian", batch=4, seed=s) for s in range(6)]
    optimizer = make(model.parameters())
    _train_steps(model, optimizer, batches[:3])

    twin = copy.deepcopy(model)
    twin_optimizer = make(twin.parameters())
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # load_state_dict shares tensors
    mask = random_mask(model, seed=7, empty_site=2)

    site = "model.decoder.layers.1.self_attn"
    q_proj = model.model.decoder.layers[1].self_attn.q_proj
    state_key = "exp_avg" if optimizer_name == "adamw" else "momentum_buffer"
    old_state = optimizer.state[q_proj.weight][state_key].clone()
    params_before = list(model.parameters())
    ids_before = [id(p) for p in params_before]

    pt.shrink(model, mask, optimizer=optimizer)

    assert [id(p) for p in model.parameters()] == ids_before  # identities kept, so the optimizer still holds them
    assert all(p is q for p, q in zip(optimizer.param_groups[0]["params"], params_before))
    kept = mask.kept(site)
    assert 0 < len(kept) < 4
    rows = torch.cat([torch.arange(h * 8, h * 8 + 8) for h in kept])
    assert torch.equal(optimizer.state[q_proj.weight][state_key], old_state[rows])
    assert q_proj.weight.shape == (len(kept) * 8, 32)

    before = q_proj.weight.detach().clone()
    losses = _train_steps(model, optimizer, batches[3:])
    assert not torch.equal(before, q_proj.weight.detach())  # the pruned model is still learning
    twin_losses = _train_steps(twin, twin_optimizer, batches[3:], mask=mask)
    assert losses == pytest.approx(twin_losses, rel=1e-9, abs=1e-9)
    twin_q = twin.model.decoder.layers[1].self_attn.q_proj.weight.detach()[rows]
    assert torch.allclose(q_proj.weight.detach(), twin_q, rtol=1e-9, atol=1e-10)


def test_unsupported_optimizer_state_is_a_clear_error():
    model = tiny_model("bert")

    class Factored(torch.optim.Optimizer):  # state not shaped like its parameter (e.g. Adafactor's row statistics)
        def __init__(self, params):
            super().__init__(params, {})
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["row"] = torch.zeros(p.shape[0] + 1)

    with pytest.raises(ValueError, match="optimizer: state 'row' of shape .* does not follow its parameter"):
        pt.shrink(model, random_mask(model, seed=0), optimizer=Factored(model.parameters()))
    with pytest.raises(TypeError, match="optimizer: expected a torch.optim.Optimizer"):
        pt.shrink(model, random_mask(model, seed=0), optimizer=object())


def test_masks_attached_through_a_wrapper_are_seen_by_shrink():
    """DDP / accelerate wrap the model in `.module`; a mask attached through the wrapper belongs to the model."""
    model = tiny_model("bert")

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **kwargs):
            return self.module(**kwargs)

    wrapped = Wrapper(model)
    names = pt.find_heads(model).names
    attached = pt.HeadMask.from_heads(model, {names[0]: [0]}).attach(wrapped)
    assert pt.attached_masks(model) == [attached] == pt.attached_masks(wrapped)
    with pytest.raises(ValueError, match="another HeadMask is attached"):
        pt.shrink(wrapped, pt.HeadMask.from_heads(model, {names[1]: [1]}))
    pt.shrink(wrapped, attached)
    assert pt.attached_masks(model) == [] and pt.find_heads(model).sites[0].num_heads == 3
    with torch.no_grad():
        wrapped(**tiny_inputs("bert"))


def test_a_second_shrink_with_the_same_soft_mask_is_refused_not_scaled_again():
    model = tiny_model("bert")
    inputs = tiny_inputs("bert")
    soft = pt.HeadMask.ones(model)
    soft["bert.encoder.layer.0.attention"] = [1.0, 0.5, 0.25, 1.0]  # scales only: the layout stays the same
    with torch.no_grad(), soft.applied(model):
        masked = model(**inputs).logits
    pt.shrink(model, soft)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"already shrunk with these soft keep values.*would scale those heads a "
                                         r"second time"):
        pt.shrink(model, soft)
    with pytest.raises(ValueError, match="already shrunk with these soft keep values"):
        pt.shrink(model, soft.copy())  # an equal mask, not only the same object
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    with torch.no_grad():
        assert (model(**inputs).logits - masked).abs().max() <= 1e-5  # scaled once
    pt.shrink(model, pt.HeadMask.ones(model))  # an all-ones shrink changes nothing (and forgets nothing)
    with pytest.raises(ValueError, match="already shrunk with these soft keep values"):
        pt.shrink(model, soft)
    other = pt.HeadMask.ones(model)
    other["bert.encoder.layer.1.attention"] = [0.5, 1.0, 1.0, 1.0]  # a different soft mask is a new scaling
    pt.shrink(model, other)


@pytest.mark.parametrize("family", ["gpt2", "opt", "falcon", "fsmt", "phi3", "olmo2"])
def test_sites_whose_forward_cannot_run_switch_class_in_place(family):
    """The one mechanism for sites whose own forward cannot run with the heads shrink leaves: the same module
    object gets a declared subclass (same parameters, hooks and state-dict keys), resolvable by name for pickles."""
    import prunetrain.engine.families.core as core

    model = tiny_model(family)
    site = pt.find_heads(model).sites[0].name
    module = model.get_submodule(site)
    original = type(module)
    keys = list(model.state_dict())
    pt.shrink(model, random_mask(model, seed=0, empty_site=0))
    switched = model.get_submodule(site)
    assert switched is module  # the same object
    assert type(switched) is not original and issubclass(type(switched), original)
    assert type(switched).__module__ == core.__name__ and getattr(core, type(switched).__name__) is type(switched)
    assert list(model.state_dict()) == keys


def test_a_gqa_site_shrunk_to_one_kv_group_then_loses_single_query_heads():
    """With one key/value head left, a GQA site behaves as multi-query: its query heads go one at a time (the kv
    head stays while any query head does), and the result equals the masked original."""
    model = tiny_model("llama")  # 4 query heads on 2 kv heads
    site = "model.layers.0.self_attn"
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, pt.HeadMask.from_heads(shrunk, {site: [2, 3]}))  # the second kv group
    after = pt.find_heads(shrunk)[site]
    assert (after.num_heads, after.num_kv_heads, after.group_size) == (2, 1, 1)
    pt.shrink(shrunk, pt.HeadMask.from_heads(shrunk, {site: [0]}))  # one query head of the remaining group
    final = pt.find_heads(shrunk)[site]
    assert (final.num_heads, final.num_kv_heads, final.heads) == (1, 1, (1,))
    combined = pt.HeadMask.from_heads(model, {site: [0, 2, 3]})
    inputs = tiny_inputs("llama")
    with torch.no_grad(), combined.applied(model):
        expected = model(**inputs).logits
    with torch.no_grad():
        assert (shrunk(**inputs).logits - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["llama-gqa4", "falcon", "phi3", "olmo2"])
def test_a_partial_group_is_allowed_when_it_is_the_only_group_left(family, tmp_path):
    """Keeping part of one kv group and nothing else makes the site multi-query, which is exact; save/load (which
    shrinks a fresh model to the recorded heads in one step) reproduces it."""
    model = tiny_model(family)
    layout = pt.find_heads(model)
    site = layout.sites[0]
    g = site.group_size
    assert g > 1
    remove = [h for h in range(site.num_heads) if h != 1]  # keep only query head 1 of group 0
    mask = pt.HeadMask.from_heads(model, {site.name: remove})
    inputs = tiny_inputs(family)
    with torch.no_grad(), mask.applied(model):
        expected = model(**inputs).logits
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    info = pt.find_heads(shrunk)[site.name]
    assert (info.num_heads, info.num_kv_heads, info.heads, info.group_size) == (1, 1, (1,), 1)
    with torch.no_grad():
        assert (shrunk(**inputs).logits - expected).abs().max() <= 1e-5
    pt.save_pruned(shrunk, tmp_path / "pruned")
    loaded = pt.load_pruned(tmp_path / "pruned", attn_implementation="eager")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, shrunk(**inputs).logits)
