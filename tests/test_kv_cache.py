"""Cached generation through a self-attention site with no heads left (prunetrain.engine.kv_cache).

The KV cache places new tokens from the cached length of layer 0; a head-less layer caches `[B, 0, T, d]` keys,
which transformers counts as empty. These tests empty exactly that layer and check cached generation of the shrunk
model step by step against the masked model."""

import copy

import pytest
import torch

import prunetrain as pt
from prunetrain.engine.kv_cache import headless_layer_class, track_headless_cache
from prunetrain.zoo import SEQ2SEQ_FAMILIES, tiny_inputs, tiny_model

GENERATING = ("marian", "bart", "t5", "gpt2", "llama", "qwen2", "mistral", "fsmt")
ENCODER_DECODER = (*SEQ2SEQ_FAMILIES, "fsmt")


def _model(family):
    if family != "fsmt":
        return tiny_model(family)
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    torch.manual_seed(0)
    config = FSMTConfig(langs=["de", "en"], src_vocab_size=96, tgt_vocab_size=96, d_model=32, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, dropout=0.0, pad_token_id=1, eos_token_id=2, bos_token_id=0,
                        decoder_start_token_id=2)
    return FSMTForConditionalGeneration(config).eval()


def _first_self_site(model):
    return next(s for s in pt.find_heads(model) if s.kind in ("decoder_self", "self"))


def _mask_emptying_first_self_site(model, seed=3):
    """The first (decoder) self-attention site loses every head; about half the heads elsewhere go too."""
    mask = pt.HeadMask.ones(model)
    gen = torch.Generator().manual_seed(seed)
    first = _first_self_site(model).name
    for site in mask.layout:
        g = site.group_size
        alive = (torch.rand(site.num_heads // g, generator=gen) >= 0.5).repeat_interleave(g).float()
        mask[site.name] = torch.zeros(site.num_heads) if site.name == first else alive
    return mask


def _generate_inputs(family):
    inputs = tiny_inputs("marian" if family == "fsmt" else family, length=6)
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    if family not in ENCODER_DECODER:  # decoder-only models are left-padded for generation
        ids, attention = ids.clone(), attention.clone()
        ids[1] = torch.cat([ids[1, -2:].fill_(1), ids[1, :-2]])
        attention[1] = torch.cat([attention[1, -2:], attention[1, :-2]])
    kwargs = dict(input_ids=ids, attention_mask=attention, max_new_tokens=10, min_new_tokens=10, do_sample=False,
                  output_scores=True, return_dict_in_generate=True)
    if family not in ENCODER_DECODER:
        kwargs["pad_token_id"] = 1
    return kwargs


def _assert_same_generation(expected, got):
    assert torch.equal(expected.sequences, got.sequences)
    for step_expected, step_got in zip(expected.scores, got.scores, strict=True):
        finite = torch.isfinite(step_expected)
        assert torch.equal(finite, torch.isfinite(step_got))
        assert (step_expected[finite] - step_got[finite]).abs().max() <= 1e-4


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("family", GENERATING)
def test_cached_generation_of_a_model_whose_first_self_attention_has_no_heads(family, num_beams):
    model = _model(family)
    mask = _mask_emptying_first_self_site(model)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    assert pt.find_heads(shrunk)[_first_self_site(model).name].num_heads == 0
    kwargs = _generate_inputs(family) | {"num_beams": num_beams}
    with torch.no_grad():
        with mask.applied(model):
            expected = model.generate(**kwargs)  # the full-width cache: no empty layer
        got = shrunk.generate(**kwargs)
        uncached = shrunk.generate(**kwargs, use_cache=False)
    _assert_same_generation(expected, got)
    _assert_same_generation(expected, uncached)
    if num_beams > 1:
        assert torch.allclose(expected.sequences_scores, got.sequences_scores, atol=1e-4)


@pytest.mark.parametrize("family", ["marian", "llama", "gpt2", "fsmt"])
def test_the_cache_counts_the_positions_of_a_head_less_layer(family):
    """After a prefill of T positions the cache reports T; transformers' own layer reports 0 for such keys, which
    is the defect the hook exists for (if transformers ever counts them, the hook becomes a harmless no-op)."""
    from transformers import DynamicCache, EncoderDecoderCache

    model = _model(family)
    first_site = _first_self_site(model)
    pt.shrink(model, pt.HeadMask.from_heads(model, {first_site.name: list(range(first_site.num_heads))}))
    inputs = tiny_inputs("marian" if family == "fsmt" else family, length=6)
    inputs.pop("labels")
    if model.config.is_encoder_decoder:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        inputs["decoder_input_ids"] = torch.full((2, 5), model.config.decoder_start_token_id)
        length = 5
    else:
        cache = DynamicCache()
        length = 6
    with torch.no_grad():
        model(**inputs, past_key_values=cache, use_cache=True)
    self_cache = getattr(cache, "self_attention_cache", cache)
    first = self_cache.layers[0]
    assert first.keys.shape[1] == 0 and first.keys.shape[-2] == length  # a head-less layer 0
    assert type(first) is headless_layer_class()
    assert cache.get_seq_length() == length
    plain = type(self_cache.layers[1])  # an untouched layer keeps transformers' class
    assert plain is not headless_layer_class()
    first.__class__ = plain
    assert first.get_seq_length() == 0  # transformers' count for [B, 0, T, d] keys


def test_save_load_and_deep_copy_keep_cached_generation_exact(tmp_path):
    model = tiny_model("marian")
    mask = _mask_emptying_first_self_site(model)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    pt.save_pruned(shrunk, tmp_path / "pruned")
    loaded = pt.load_pruned(tmp_path / "pruned", attn_implementation="eager")
    copied = copy.deepcopy(shrunk)
    kwargs = _generate_inputs("marian")
    with torch.no_grad():
        with mask.applied(model):
            expected = model.generate(**kwargs)
        for candidate in (loaded, copied):
            _assert_same_generation(expected, candidate.generate(**kwargs))


def test_tracking_is_idempotent_and_only_for_head_less_self_attention():
    model = tiny_model("bart")
    layout = pt.find_heads(model)
    encoder_site = next(s for s in layout if s.kind == "encoder_self").name
    cross_site = next(s for s in layout if s.kind == "cross").name
    first = _first_self_site(model).name
    pt.shrink(model, pt.HeadMask.from_heads(model, {first: [0, 1, 2, 3], encoder_site: [0, 1, 2, 3],
                                                    cross_site: [0, 1, 2, 3]}))
    assert track_headless_cache(model) == [first]
    pt.shrink(model, pt.HeadMask.ones(model))  # a second shrink hooks nothing twice
    hooks = [hook for site in pt.engine.heads.attention_sites(model) for hook in site.module._forward_hooks.values()]
    assert len(hooks) == 1
