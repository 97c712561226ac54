"""Beam search with ONNX Runtime on `--format onnx` exports gives `generate(num_beams=4)`'s hypotheses (issue 28)."""

import pytest
import torch

import prunetrain as pt
from prunetrain.export.formats import export
from prunetrain.export.onnx_beam import BeamSettings, beam_generate
from prunetrain.zoo import random_mask, tiny_model

SETTINGS = [{}, {"length_penalty": 0.6}, {"length_penalty": 2.0, "early_stopping": "never"},
            {"early_stopping": True}, {"suppress_tokens": [1, 5]}, {"min_new_tokens": 5}, {"num_beams": 3},
            {"bad_words_ids": [[4], [7]]}, {"forced_eos_token_id": 2}, {"length_penalty": -1.0}]


# larger initial weights than HF's: the tiny models' outputs then depend on their inputs (distinct beams per row)
INIT = {"marian": {"init_std": 0.3}, "t5": {"initializer_factor": 8.0}, "gpt2": {"initializer_range": 0.2},
        "llama": {"initializer_range": 0.2}}


@pytest.mark.parametrize("family,empty_site", [("gpt2", 0), ("llama", 0), ("marian", 2), ("t5", 2)])
def test_onnx_beam_search_gives_the_hypotheses_of_generate(family, empty_site, tmp_path):
    model = tiny_model(family, **INIT[family])
    pt.shrink(model, random_mask(model, seed=3, soft=True, empty_site=empty_site))  # a head-less first decoder
    export(model, tmp_path / "onnx", "onnx")                                         # self-attention layer
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 90, (4, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding (decoder-only) / padded source positions (encoder-decoder)
    with torch.no_grad():  # EOS := a token greedy decoding picks often: beams finish early and at many lengths,
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,  # so
                                pad_token_id=1, eos_token_id=None)[:, -10:]  # length penalty and stopping matter
    eos = int(torch.mode(greedy[:, 2:].flatten()).values)
    finished_early = 0
    for case, settings in enumerate(SETTINGS):
        kwargs = {"num_beams": 4, "eos_token_id": eos, **settings}
        with torch.no_grad():
            want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                  use_cache=True, pad_token_id=1, **kwargs)
        got = beam_generate(tmp_path / "onnx", ids, mask, 10, pad_token_id=1, **kwargs)
        assert torch.equal(got, want), (case, settings, got, want)
        finished_early += int((want[:, -1] == 1).sum())  # rows padded after their EOS
    assert finished_early > 0


def _trained_marian(tokenizer, pairs, steps=80):
    """A small Marian trained for a few steps on real sentence pairs (its beams differ from greedy)."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config_small

    torch.manual_seed(0)
    model = MarianMTModel(marian_config_small(tokenizer, d_model=64, ffn_dim=128, layers=2, heads=4, dropout=0.0,
                                              attn_implementation="eager"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        chunk = pairs[(step * 32) % len(pairs):][:32]
        batch = tokenizer([s for s, _ in chunk], text_target=[t for _, t in chunk], padding=True,
                          return_tensors="pt", truncation=True, max_length=48)
        batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.mark.slow
def test_onnx_beam_translates_multi30k_like_pytorch_beam_search(m30k_tokenizer, multi30k_train_slice, multi30k_dir,
                                                                tmp_path):
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import translate, translate_onnx

    model = _trained_marian(m30k_tokenizer, multi30k_train_slice)
    layout = pt.find_heads(model)
    remove = {s.name: list(range(s.num_heads)) if s.kind == "decoder_self" and s.layer == 0 else [0, 2][: i % 3]
              for i, s in enumerate(layout)}  # non-uniform, a head-less first decoder self-attention layer
    pt.shrink(model, pt.HeadMask.from_heads(model, remove))
    export(model, tmp_path / "onnx", "onnx")
    sources = [s for s, _ in read_parallel(multi30k_dir, "test", limit=120)]
    want = translate(model, m30k_tokenizer, sources, batch_size=16, num_beams=4)
    config = model.config
    got = translate_onnx(tmp_path / "onnx", m30k_tokenizer, sources, batch_size=16, num_beams=4,
                         decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
                         max_position_embeddings=config.max_position_embeddings)
    greedy = translate(model, m30k_tokenizer, sources, batch_size=16, num_beams=1)
    assert sum(a != b for a, b in zip(want, greedy)) >= 10  # beam search matters for this model
    assert got == want


def test_onnx_beam_search_refuses_settings_it_does_not_reproduce(tmp_path):
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size: 2 is not supported by the ONNX Runtime beam search"):
        BeamSettings.from_generation_config({"no_repeat_ngram_size": 2})
    with pytest.raises(ValueError, match=r"do_sample: True is not supported by the ONNX Runtime beam search"):
        BeamSettings.from_generation_config({}, do_sample=True)
    with pytest.raises(ValueError, match=r"bad_words_ids: \[4, 5\] is a sequence of several tokens; the ONNX Runtime "
                                         r"beam search bans single tokens only\."):
        BeamSettings.from_generation_config({"bad_words_ids": [[4, 5]]})
    with pytest.raises(ValueError, match=r"num_beams: 0 is not allowed; expected an integer >= 1\."):
        beam_generate(tmp_path, torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), 4,
                      num_beams=0)
