"""HeadMask: identity is a no-op (forward and backward), zeroing a head is exactly removing its term, hooks are
reversible, values are validated, and the mask serialises exactly."""

import copy
import math

import pytest
import torch
import transformers as tf

import prunetrain as pt
from prunetrain.zoo import TINY_FAMILIES, random_mask, tiny_inputs, tiny_model


def _loss_and_grads(model, inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_all_ones_mask_is_a_no_op_forward_and_backward(family):
    model = tiny_model(family)
    inputs = tiny_inputs(family)
    logits, grads = _loss_and_grads(model, inputs)
    with pt.HeadMask.ones(model).applied(model):
        logits_masked, grads_masked = _loss_and_grads(model, inputs)
    assert torch.equal(logits, logits_masked)
    assert grads.keys() == grads_masked.keys() and len(grads) > 10
    for name in grads:
        assert torch.equal(grads[name], grads_masked[name]), name


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_zeroing_a_head_equals_zeroing_its_output_projection_columns(family):
    """Σ_h ξ_h Att_h W_o^h with ξ_j = 0 is the model whose W_o^j (head j's out-projection inputs) is zero."""
    model = tiny_model(family)
    inputs = tiny_inputs(family)
    layout = pt.find_heads(model)
    mask = pt.HeadMask.ones(model)
    reference = copy.deepcopy(model)
    sites = {s.info.name: s for s in pt.engine.heads.attention_sites(reference)}
    for index, site in enumerate(layout):
        head = (index * 3) % site.num_heads
        mask.set(site.name, head, 0.0)
        out_proj = sites[site.name].out_proj
        cols = slice(head * site.head_dim, (head + 1) * site.head_dim)
        with torch.no_grad():
            if isinstance(out_proj, torch.nn.Linear):
                out_proj.weight[:, cols] = 0
            else:  # GPT-2 Conv1D, weight [in, out]
                out_proj.weight[cols, :] = 0
    with torch.no_grad(), mask.applied(model):
        masked = model(**inputs).logits
    with torch.no_grad():
        expected = reference(**inputs).logits
        unmasked = model(**inputs).logits
    assert (masked - expected).abs().max() <= 1e-6
    assert (masked - unmasked).abs().max() > 1e-4  # the mask did something


def test_masked_attention_equals_manual_per_head_computation():
    """Marian encoder self-attention computed by hand, head by head: Σ_{h kept} softmax(q_h k_hᵀ/√d) v_h W_o^h + b_o."""
    model = tiny_model("marian")
    attn = model.model.encoder.layers[0].self_attn
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3))
    keep = torch.tensor([1.0, 0.0, 0.5, 1.0])
    d, heads = 8, 4

    def split(t):  # [B, T, H*d] -> [B, H, T, d]
        return t.view(2, 5, heads, d).transpose(1, 2)

    q, k, v = split(attn.q_proj(x)), split(attn.k_proj(x)), split(attn.v_proj(x))
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    per_head = probs @ v  # [B, H, T, d]
    w_o = attn.out_proj.weight.view(32, heads, d)  # [out, H, d]
    manual = sum(keep[h] * per_head[:, h] @ w_o[:, h].T for h in range(heads)) + attn.out_proj.bias

    mask = pt.HeadMask.ones(model)
    mask["model.encoder.layers.0.self_attn"] = keep
    with torch.no_grad(), mask.applied(model):
        out, _ = attn(x)
    assert (out - manual).abs().max() <= 1e-6


@pytest.mark.parametrize("family", ["bert", "llama", "marian"])
def test_masking_works_with_every_attention_backend(family):
    inputs = tiny_inputs(family)
    outputs = {}
    for impl in ("eager", "sdpa", "flex_attention"):
        model = tiny_model(family, attn_implementation=impl)
        mask = random_mask(model, seed=1, empty_site=None)
        with torch.no_grad():
            plain = model(**inputs).logits
            with mask.applied(model):
                outputs[impl] = model(**inputs).logits
        assert (outputs[impl] - plain).abs().max() > 1e-4
    assert (outputs["sdpa"] - outputs["eager"]).abs().max() <= 1e-5
    assert (outputs["flex_attention"] - outputs["eager"]).abs().max() <= 1e-5


def test_attach_detach_restores_the_model_exactly():
    model = tiny_model("bart")
    inputs = tiny_inputs("bart")
    with torch.no_grad():
        before = model(**inputs).logits
    hooks_before = {n: len(m._forward_pre_hooks) for n, m in model.named_modules()}
    mask = random_mask(model, seed=2)
    mask.attach(model)
    assert mask.attached and pt.attached_masks(model) == [mask]
    with torch.no_grad():
        assert not torch.equal(model(**inputs).logits, before)
    with pytest.raises(RuntimeError, match="already attached"):
        mask.attach(model)
    mask.detach()
    assert {n: len(m._forward_pre_hooks) for n, m in model.named_modules()} == hooks_before
    assert pt.attached_masks(model) == []
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


def test_detaching_an_equal_copy_leaves_the_original_attached():
    """Masks compare equal by value; the registry of attached masks must go by identity, or detaching a copy (as the
    curve callback does with the combined training mask) would drop the original and strand its hooks."""
    model = tiny_model("bart")
    mask = random_mask(model, seed=2).attach(model)
    copy_of_it = mask.copy()
    assert copy_of_it == mask
    with copy_of_it.applied(model):
        assert len(pt.attached_masks(model)) == 2
    assert len(pt.attached_masks(model)) == 1 and pt.attached_masks(model)[0] is mask and mask.attached
    pt.shrink(model, mask)  # the original's hooks are owned: shrink accepts the model
    assert pt.attached_masks(model) == [] and pt.find_heads(model).total_heads == mask.num_kept


def test_mask_changes_take_effect_while_attached():
    model = tiny_model("gpt2")
    inputs = tiny_inputs("gpt2")
    mask = pt.HeadMask.ones(model).attach(model)
    with torch.no_grad():
        first = model(**inputs).logits
        mask.set("transformer.h.0.attn", 2, 0.0)
        second = model(**inputs).logits
    mask.detach()
    assert not torch.equal(first, second)


def test_keep_value_gradients_are_dL_dxi():
    """With requires_grad the keep values collect ∂L/∂ξ_h; a central finite difference agrees."""
    model = tiny_model("marian").double()
    inputs = tiny_inputs("marian")
    mask = pt.HeadMask.ones(model).requires_grad_()
    with mask.applied(model):
        model(**inputs).loss.backward()
    site, head = "model.decoder.layers.1.encoder_attn", 2
    grad = mask[site].grad[head].item()
    eps = 1e-4
    losses = []
    for delta in (eps, -eps):
        probe = pt.HeadMask.ones(model)
        values = torch.ones(4)
        values[head] = 1 - eps + delta  # stay inside [0, 1]: evaluate around 1 - eps
        probe[site] = values
        with torch.no_grad(), probe.applied(model):
            losses.append(model(**inputs).loss.item())
    assert grad != 0 and abs((losses[0] - losses[1]) / (2 * eps) - grad) <= 1e-3 * abs(grad) + 1e-6


def test_json_and_state_dict_round_trip_exactly(tmp_path):
    model = tiny_model("t5")
    mask = random_mask(model, seed=4, soft=True)
    path = tmp_path / "mask.json"
    mask.to_json(path)
    assert pt.HeadMask.from_json(path, model) == mask
    assert pt.HeadMask.from_json(mask.to_json(), model) == mask
    other = pt.HeadMask.ones(model)
    other.load_state_dict(mask.state_dict())
    assert other == mask
    assert mask.copy() == mask and mask.copy() is not mask


def test_bad_masks_are_clear_errors():
    model = tiny_model("bert")
    mask = pt.HeadMask.ones(model)
    with pytest.raises(ValueError, match=r"site: unknown site 'encoder.layer.9.attention'; valid sites are: "):
        mask["encoder.layer.9.attention"] = [1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"keep value 1.5 is outside \[0, 1\]"):
        mask["bert.encoder.layer.0.attention"] = [1, 1.5, 1, 1]
    with pytest.raises(ValueError, match=r"keep value -0.1 is outside \[0, 1\]"):
        mask.set("bert.encoder.layer.0.attention", 0, -0.1)
    with pytest.raises(ValueError, match=r"keep value nan is outside \[0, 1\]"):
        mask.set("bert.encoder.layer.0.attention", 0, float("nan"))
    with pytest.raises(ValueError, match="got 3 keep values, but this site has 4 heads"):
        mask["bert.encoder.layer.0.attention"] = [1, 1, 1]
    with pytest.raises(ValueError, match="head: 4 is out of range for site"):
        mask.set("bert.encoder.layer.0.attention", 4, 0.0)
    bigger = tf.BertForMaskedLM(tf.BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                               intermediate_size=64, vocab_size=96))
    with pytest.raises(ValueError, match=r"mask: shaped for another model \(2 sites, 8 heads\) than this one "
                                         r"\(3 sites, 12 heads\)"):
        mask.attach(bigger)
    assert pt.attached_masks(bigger) == []
    with pytest.raises(ValueError, match="mask data: unknown site 'nope'"):
        pt.HeadMask.from_dict({"sites": {"nope": [1.0]}}, model)
    with pytest.raises(ValueError, match="is missing"):
        pt.HeadMask.from_dict({"sites": {"bert.encoder.layer.0.attention": [1, 1, 1, 1]}}, model)


SITE = "bert.encoder.layer.0.attention"


@pytest.mark.parametrize("head, value, message", [
    (True, 0.0, r"head: True is not a head index; use an integer in 0\.\.3\."),
    (1.0, 0.0, r"head: 1\.0 is not a head index"),
    ("1", 0.0, r"head: '1' is not a head index"),
    (1, 1.5, r"keep value 1\.5 is outside \[0, 1\]"),
    (1, "0.5", r"value: '0\.5' is not a keep value; use a number in \[0, 1\]\."),
    (1, True, r"value: True is not a keep value"),
])
def test_set_rejects_bools_non_integers_strings_and_out_of_range_values(head, value, message):
    mask = pt.HeadMask.ones(tiny_model("bert"))
    with pytest.raises(ValueError, match=message):
        mask.set(SITE, head, value)
    assert bool((mask[SITE] == 1).all())  # nothing changed


@pytest.mark.parametrize("values", ["1111", ["1", "1", "0", "1"], [1, None, 1, 1], {"a": 1}])
def test_string_and_non_numeric_keep_values_are_one_line_errors(values):
    mask = pt.HeadMask.ones(tiny_model("bert"))
    with pytest.raises(ValueError, match=r"mask\['bert.encoder.layer.0.attention'\]: keep values must be numbers"):
        mask[SITE] = values


def test_numpy_and_tensor_scalars_are_accepted_by_kind():
    import numpy as np

    mask = pt.HeadMask.ones(tiny_model("bert"))
    mask.set(SITE, np.int64(2), 0.0)
    mask.set(SITE, torch.tensor(3), torch.tensor(0.25))
    assert mask[SITE].tolist() == [1.0, 1.0, 0.0, 0.25]
    with pytest.raises(ValueError, match="head: True is not a head index"):
        mask.set(SITE, torch.tensor(True), 0.0)
    with pytest.raises(ValueError, match=r"head: 1\.0 is not a head index"):
        mask.set(SITE, torch.tensor(1.0), 0.0)


def test_applied_is_a_reentrant_context_manager():
    model = tiny_model("bert")
    inputs = tiny_inputs("bert")
    mask = random_mask(model, seed=1, soft=True, empty_site=None)  # soft: a second hook would scale twice
    with torch.no_grad():
        plain = model(**inputs).logits
        with mask.applied(model) as outer:
            assert outer is mask and mask.attached
            masked = model(**inputs).logits
            with mask.applied(model):  # nested: no second hook (masked once, not twice), outer keeps it
                assert torch.equal(model(**inputs).logits, masked)
            assert mask.attached and torch.equal(model(**inputs).logits, masked)
        assert not mask.attached and pt.attached_masks(model) == []
        assert torch.equal(model(**inputs).logits, plain)
    assert not hasattr(mask, "_pending_model")
    with pytest.raises(RuntimeError, match="already attached"):  # attached elsewhere: applying it here is an error
        with mask.applied(model), mask.applied(tiny_model("bert")):
            pass
    assert not mask.attached
    with pytest.raises(KeyError):  # an exception inside the block still detaches
        with mask.applied(model):
            raise KeyError("boom")
    assert not mask.attached and pt.attached_masks(model) == []
