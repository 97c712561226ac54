"""What the shared zoo suite (tests/test_zoo.py) does not reach in the encoder, encoder–decoder and vision families:
ALBERT's shared attention module, DeBERTa's relative-position projections, ModernBERT's fused projection beyond its
sliding window, Whisper's head-less decoder and cross-attention sites (cached generation, remote-code export),
head-less cross attention in the other encoder–decoders, and CLIP/SigLIP towers with different head counts.

Every model is a real transformers model from a tiny random config (prunetrain.zoo); no downloads.
"""

from __future__ import annotations

import copy

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.heads import attention_sites
from prunetrain.zoo import architecture, random_mask, tiny_inputs, tiny_model

TOL = 1e-5


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.logits_per_image


def _masked_and_shrunk(model, inputs, mask):
    with mask.applied(model):
        masked = _logits(model, inputs)
    assert not torch.equal(masked, _logits(model, inputs))  # the mask does something
    pt.shrink(model, mask)
    return masked, _logits(model, inputs)


# ---------------------------------------------------------------------------------------------------------------------
# ALBERT: one attention module shared by every layer of a group
# ---------------------------------------------------------------------------------------------------------------------
def test_albert_site_is_the_shared_module_and_its_mask_acts_in_every_layer():
    model = tiny_model("albert", num_hidden_layers=3, num_hidden_groups=1)  # the released layout: one shared module
    inputs = tiny_inputs("albert")
    layout = pt.find_heads(model)
    assert len(layout) == 1 and layout.total_heads == 4 and layout.sites[0].layer == 0
    (site,) = attention_sites(model)
    calls = []
    handle = site.out_proj.register_forward_pre_hook(lambda module, args: calls.append(1))
    _logits(model, inputs)
    handle.remove()
    assert len(calls) == 3  # the one site runs in each of the 3 layers

    # Michel importance of a shared head is |Σ over the layers that run it of ∂L/∂ξ|: gate each call separately
    gates = [torch.ones(4, requires_grad=True) for _ in range(3)]
    calls.clear()

    def gate(module, args):
        xi = gates[len(calls)]
        calls.append(1)
        return (args[0] * xi.repeat_interleave(site.info.head_dim),)

    handle = site.out_proj.register_forward_pre_hook(gate)
    model(**inputs).loss.backward()
    handle.remove()
    scores = pt.head_importance(model, [inputs], normalize=None)
    reference = sum(g.grad for g in gates).abs()
    torch.testing.assert_close(scores[site.info.name].float(), reference, rtol=1e-5, atol=1e-8)
    assert not torch.allclose(reference, gates[-1].grad.abs())  # not just the last layer's share

    mask = pt.HeadMask.from_heads(model, {site.info.name: [0, 2]})
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    module = site.module
    assert module.query.out_features == module.dense.in_features == 2 * site.info.head_dim
    assert pt.find_heads(model).sites[0].heads == (1, 3)


def test_albert_groups_are_separate_sites():
    model = tiny_model("albert")  # 4 layers in 2 groups
    assert [s.layer for s in pt.find_heads(model)] == [0, 1]
    inputs = tiny_inputs("albert")
    mask = random_mask(model, seed=2, empty_site=1)
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    assert pt.find_heads(model).sites[1].num_heads == 0


# ---------------------------------------------------------------------------------------------------------------------
# DeBERTa-v2/v3: relative-position projections share the head structure
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pos_att_type", [["c2p"], ["p2c"], ["p2c", "c2p"]])
def test_deberta_position_projections_are_sliced_with_the_heads(pos_att_type):
    model = tiny_model("deberta-v2", pos_att_type=pos_att_type)
    inputs = tiny_inputs("deberta-v2")
    mask = random_mask(model, seed=1, soft=True, empty_site=None)
    mask[pt.find_heads(model).names[0]] = torch.tensor([0.0, 0.7, 0.0, 1.0])
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    for site in attention_sites(model):
        attention = site.module.self
        width = site.info.num_heads * site.info.head_dim
        projections = [getattr(attention, n) for n in ("pos_key_proj", "pos_query_proj") if hasattr(attention, n)]
        assert len(projections) == len(pos_att_type)
        assert all(p.out_features == p.weight.shape[0] == width for p in projections)


def test_deberta_v3_shares_position_projections_with_key_and_query(tmp_path):
    import transformers

    model = tiny_model("deberta-v3")
    assert not any(hasattr(s.module.self, "pos_key_proj") for s in attention_sites(model))
    inputs = tiny_inputs("deberta-v3", length=12)  # longer than the position buckets' exact range
    mask = random_mask(model, seed=3, empty_site=1)
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    # a head-less site: the inner attention returns no heads, the site's `output.dense` adds its bias
    assert type(attention_sites(model)[1].module.self).__name__ == "HeadlessDisentangledSelfAttention"
    pt.save_pruned(model, tmp_path / "deberta")
    remote = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "deberta", trust_remote_code=True,
                                                               attn_implementation="eager").eval()
    assert torch.equal(_logits(remote, inputs), shrunk)


# ---------------------------------------------------------------------------------------------------------------------
# ModernBERT: fused Wqkv, sliding-window layers
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_modernbert_fused_projection_beyond_the_sliding_window(attn_implementation):
    model = tiny_model("modernbert", attn_implementation)
    assert [layer.attn.sliding_window for layer in model.model.layers] == [None, 3]
    inputs = tiny_inputs("modernbert", length=12)  # the window (±2) covers only part of the sequence
    mask = pt.HeadMask.from_heads(model, {s.name: heads for s, heads in zip(pt.find_heads(model), ([1], [0, 3]))})
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    assert [layer.attn.Wqkv.out_features for layer in model.model.layers] == [3 * 3 * 8, 3 * 2 * 8]


# ---------------------------------------------------------------------------------------------------------------------
# encoder–decoders: head-less decoder self-attention and cross-attention sites in cached generation
# ---------------------------------------------------------------------------------------------------------------------
def _headless_decoder_mask(model):
    """Random heads, plus no heads left in the first decoder self-attention and in the last cross attention."""
    layout = pt.find_heads(model)
    mask = random_mask(model, seed=6, empty_site=None)
    first_self = next(s for s in layout if s.kind == "decoder_self")
    last_cross = [s for s in layout if s.kind == "cross"][-1]
    for site in (first_self, last_cross):
        mask[site.name] = torch.zeros(site.num_heads)
    return mask, first_self.name, last_cross.name


def _model_inputs(name):
    return {k: v for k, v in tiny_inputs(name, length=6).items() if k != "labels"}


@pytest.mark.parametrize("name", ["mbart", "m2m-100", "pegasus", "mt5", "whisper"])
def test_headless_decoder_and_cross_sites_generate_like_the_masked_model(name):
    model = tiny_model(name)
    mask, first_self, last_cross = _headless_decoder_mask(model)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    layout = pt.find_heads(shrunk)
    assert layout[first_self].num_heads == layout[last_cross].num_heads == 0
    inputs = tiny_inputs(name)
    with mask.applied(model):
        masked = _logits(model, inputs)
    assert (masked - _logits(shrunk, inputs)).abs().max().item() <= TOL
    for options in (dict(num_beams=1), dict(num_beams=3, num_return_sequences=2)):
        kwargs = dict(_model_inputs(name), max_new_tokens=6, min_new_tokens=6, do_sample=False, **options)
        with torch.no_grad():
            with mask.applied(model):
                expected = model.generate(**kwargs)
            assert torch.equal(shrunk.generate(**kwargs), expected), options


def test_whisper_headless_sites_switch_class_and_survive_the_remote_code_export(tmp_path):
    import transformers

    model = tiny_model("whisper")
    mask, first_self, last_cross = _headless_decoder_mask(model)
    pt.shrink(model, mask)
    modules = dict(model.named_modules())
    assert type(modules[first_self]).__name__ == "HeadlessWhisperAttention"
    assert type(modules[last_cross]).__name__ == "HeadlessWhisperCrossAttention"
    pt.save_pruned(model, tmp_path / "whisper")
    remote = transformers.AutoModelForSpeechSeq2Seq.from_pretrained(tmp_path / "whisper", trust_remote_code=True,
                                                                    attn_implementation="eager").eval()
    inputs = tiny_inputs("whisper")
    assert torch.equal(_logits(remote, inputs), _logits(model, inputs))
    kwargs = dict(_model_inputs("whisper"), max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=2)
    with torch.no_grad():
        assert torch.equal(remote.generate(**kwargs), model.generate(**kwargs))


# ---------------------------------------------------------------------------------------------------------------------
# CLIP / SigLIP: two towers with their own head counts; single towers
# ---------------------------------------------------------------------------------------------------------------------
def _two_tower_model(name, text_heads=2):
    import transformers

    config = architecture(name).make_config()
    config.text_config.num_attention_heads = text_heads  # text: 2 heads of 16; vision: 4 heads of 8
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, architecture(name).model_class)(config).eval()


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_two_towers_keep_their_own_head_counts(name):
    model = _two_tower_model(name)
    layout = pt.find_heads(model)
    towers = {s.name.split(".")[0] for s in layout}
    assert towers == {"text_model", "vision_model"}
    for site in layout:
        text = site.name.startswith("text_model")
        assert (site.original_num_heads, site.head_dim) == ((2, 16) if text else (4, 8))
    before = {k: v.clone() for k, v in model.state_dict().items() if ".head." in k}
    inputs = tiny_inputs(name)
    mask = random_mask(model, seed=1, empty_site=len(layout) - 1)
    mask[layout.names[0]] = torch.tensor([0.0, 1.0])
    masked, shrunk = _masked_and_shrunk(model, inputs, mask)
    assert (masked - shrunk).abs().max().item() <= TOL
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # SigLIP's pooling head is not a site
    assert (name == "siglip") == bool(before)


@pytest.mark.parametrize("cls, inputs", [
    ("CLIPVisionModel", lambda: {"pixel_values": tiny_inputs("clip")["pixel_values"]}),
    ("SiglipTextModel", lambda: {"input_ids": tiny_inputs("siglip")["input_ids"]}),
])
def test_single_towers_are_supported(cls, inputs):
    import transformers

    clip = cls.startswith("CLIP")
    full_config = architecture("clip" if clip else "siglip").make_config()
    config = full_config.vision_config if clip else full_config.text_config
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config).eval()
    assert model.config.model_type == ("clip_vision_model" if clip else "siglip_text_model")
    layout = pt.find_heads(model)
    assert len(layout) == 2 and layout.total_heads == 8
    batch = inputs()
    mask = random_mask(model, seed=5, empty_site=0)
    with torch.no_grad(), mask.applied(model):
        masked = model(**batch).pooler_output
    pt.shrink(model, mask)
    with torch.no_grad():
        assert (masked - model(**batch).pooler_output).abs().max().item() <= TOL
