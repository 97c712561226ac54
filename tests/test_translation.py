"""translate / evaluate_bleu / evaluate_directory with real Multi30k text, a real tokenizer and real sacreBLEU on
tiny random Marian models built from `marian_config_small` (no mocks)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import MarianMTModel

import prunetrain as pt
from prunetrain.mt.text.data import PAD_ID, marian_config_small, read_parallel
from prunetrain.utils.device import bf16_is_fast
from prunetrain.mt.evaluation.translation import (evaluate_bleu, evaluate_directory, load_translation_model,
                                                  save_translation_model, score_translations, translate, )




def tiny_marian(tokenizer, seed: int = 0, layers: int = 2, **overrides) -> MarianMTModel:
    # init_std 0.3 (HF: 0.02) makes a random model's output depend on its input, so order/batching bugs show
    config = marian_config_small(tokenizer, d_model=32, ffn_dim=64, layers=layers, heads=4, dropout=0.0,
                                 attn_implementation="eager", **{"init_std": 0.3, **overrides})
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    with torch.no_grad():  # random biases, so every bias slice matters (HF initialises them to zero)
        gen = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


@pytest.fixture(scope="module")
def valid_pairs(multi30k_dir):
    return read_parallel(multi30k_dir, "valid", limit=48)


def _alone(model, tokenizer, source: str, max_new_tokens: int) -> str:
    """Reference: plain greedy `generate` on one unpadded sentence."""
    batch = tokenizer([source], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, num_beams=1, do_sample=False,
                             suppress_tokens=[PAD_ID])
    return tokenizer.decode(out[0], skip_special_tokens=True).strip()


def test_batched_sorted_translation_equals_per_sentence_greedy_in_input_order(m30k_tokenizer, valid_pairs):
    model = tiny_marian(m30k_tokenizer).train()
    sources = [s for s, _ in valid_pairs[:20]]
    assert len({len(m30k_tokenizer(s)["input_ids"]) for s in sources}) > 5  # lengths vary: batches get padding
    batched = translate(model, m30k_tokenizer, sources, batch_size=5, max_new_tokens=12)
    assert model.training  # train mode restored
    model.eval()
    alone = [_alone(model, m30k_tokenizer, s, 12) for s in sources]
    assert batched == alone
    assert len(set(batched)) > 10 and all(isinstance(t, str) for t in batched)
    model.train()
    reversed_out = translate(model, m30k_tokenizer, sources[::-1], batch_size=7, max_new_tokens=12)
    assert reversed_out == alone[::-1]
    assert model.training


def test_default_length_bound_is_per_sentence(m30k_tokenizer, valid_pairs):
    """With max_new_tokens=None each sentence gets ceil(1.5 n) + 10 new tokens whatever its batch-mates are."""
    model = tiny_marian(m30k_tokenizer, seed=3).eval()
    sources = [s for s, _ in valid_pairs[:8]]
    batched = translate(model, m30k_tokenizer, sources, batch_size=4)
    assert not model.training
    for source, text in zip(sources, batched):
        n = len(m30k_tokenizer(source)["input_ids"])
        assert text == _alone(model, m30k_tokenizer, source, math.ceil(1.5 * n) + 10)


def test_translate_beam_search_and_bf16_run(m30k_tokenizer, valid_pairs):
    model = tiny_marian(m30k_tokenizer)
    sources = [s for s, _ in valid_pairs[:6]]
    beams = translate(model, m30k_tokenizer, sources, batch_size=4, num_beams=3, max_new_tokens=8)
    bf16 = translate(model, m30k_tokenizer, sources, batch_size=4, max_new_tokens=8, autocast_bf16=True)
    assert len(beams) == len(bf16) == 6
    assert all(isinstance(t, str) for t in beams + bf16)
    assert translate(model, m30k_tokenizer, []) == []
    auto = evaluate_bleu(model, m30k_tokenizer, valid_pairs[:4], max_new_tokens=4, autocast_bf16="auto")
    assert auto["autocast_bf16"] is bf16_is_fast("cpu")  # bf16 only where the CPU has native bf16 matmuls
    with pytest.raises(ValueError, match="autocast_bf16 must be True, False or 'auto'"):
        translate(model, m30k_tokenizer, sources, autocast_bf16="yes")
    with pytest.raises(ValueError, match="batch_size"):
        translate(model, m30k_tokenizer, sources, batch_size=0)


def test_references_against_themselves_score_100_with_signatures(valid_pairs):
    references = [t for _, t in valid_pairs]
    scores = score_translations(references, references)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["num_sentences"] == len(references)
    assert "tok:13a" in scores["bleu_signature"] and "version:" in scores["bleu_signature"]
    assert "nc:6" in scores["chrf_signature"]
    worse = score_translations(references[1:] + references[:1], references)
    assert worse["bleu"] < 20
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(["a", "b"], ["a"])


def test_evaluate_bleu_on_a_random_model_and_under_a_head_mask(m30k_tokenizer, valid_pairs):
    model = tiny_marian(m30k_tokenizer)
    pairs = valid_pairs[:16]
    result = evaluate_bleu(model, m30k_tokenizer, pairs, batch_size=8, max_new_tokens=10, return_hypotheses=True)
    assert math.isfinite(result["bleu"]) and 0 <= result["bleu"] < 5
    assert math.isfinite(result["chrf"])
    assert result["num_sentences"] == 16 and len(result["hypotheses"]) == 16
    assert result["bleu_signature"].startswith("nrefs:1|")

    layout = pt.find_heads(model)
    mask = pt.HeadMask.ones(model)
    for site in layout:  # remove half of the heads of every attention site
        mask[site.name] = [1.0, 0.0] * (site.num_heads // 2)
    with mask.applied(model):
        masked = evaluate_bleu(model, m30k_tokenizer, pairs, batch_size=8, max_new_tokens=10,
                               return_hypotheses=True)
        assert mask.attached
    assert not mask.attached
    assert math.isfinite(masked["bleu"]) and masked["num_sentences"] == 16
    assert masked["hypotheses"] != result["hypotheses"]  # the mask was in effect during generation
    # a shrunk copy translates exactly like the masked model
    pt.shrink(model, mask)
    shrunk = evaluate_bleu(model, m30k_tokenizer, pairs, batch_size=8, max_new_tokens=10, return_hypotheses=True)
    assert shrunk["hypotheses"] == masked["hypotheses"]


def test_evaluate_directory_scores_saved_pruned_and_full_models(m30k_tokenizer, multi30k_dir, tmp_path):
    model = tiny_marian(m30k_tokenizer, seed=5)
    pairs = read_parallel(multi30k_dir, "test", limit=16)
    mask = pt.HeadMask.from_heads(model, {site.name: [0] for site in pt.find_heads(model)})
    pt.shrink(model, mask)
    expected = evaluate_bleu(model, m30k_tokenizer, pairs, max_new_tokens=10, return_hypotheses=True)

    pruned_dir = save_translation_model(model, m30k_tokenizer, tmp_path / "pruned")
    assert (pruned_dir / "prunetrain_layout.json").is_file() and (pruned_dir / "tokenizer.json").is_file()
    scored = evaluate_directory(pruned_dir, multi30k_dir, "test", limit=16, max_new_tokens=10,
                                return_hypotheses=True)
    assert scored["hypotheses"] == expected["hypotheses"]
    assert scored["bleu"] == expected["bleu"] and scored["bleu_signature"] == expected["bleu_signature"]
    assert scored["heads"] == pt.find_heads(model).total_heads == 24 - 6
    assert scored["split"] == "test" and scored["num_sentences"] == 16

    # a plain save_pretrained directory (no layout file) loads with MarianMTModel.from_pretrained
    full = tiny_marian(m30k_tokenizer, seed=6)
    full.save_pretrained(tmp_path / "full" / "model")
    m30k_tokenizer.save_pretrained(tmp_path / "full" / "tokenizer")  # tokenizer next to the model, not in it
    assert isinstance(load_translation_model(tmp_path / "full" / "model"), MarianMTModel)
    # a neighbour's tokenizer is never picked up silently: it has to be named
    with pytest.raises(ValueError, match=r"tokenizer: no tokenizer.json in '.*model' or its tokenizer/ folder"):
        evaluate_directory(tmp_path / "full" / "model", multi30k_dir, "test", limit=8, max_new_tokens=6)
    plain = evaluate_directory(tmp_path / "full" / "model", multi30k_dir, "test", limit=8, max_new_tokens=6,
                               tokenizer_path=tmp_path / "full" / "tokenizer")
    assert plain["heads"] == 24 and math.isfinite(plain["bleu"])

    with pytest.raises(ValueError, match="splits with both"):
        evaluate_directory(pruned_dir, multi30k_dir, "nonexistent_split")
    with pytest.raises(ValueError, match=r"model: '.*' is not a saved model directory \(no config.json\)"):
        evaluate_directory(tmp_path, multi30k_dir, "test")


def test_a_shrunk_model_with_a_headless_decoder_self_attention_translates_like_the_masked_one(m30k_tokenizer):
    """transformers' KV cache counts cached positions from the keys, which a head-less layer leaves empty: the
    shrunk model (whose head-less site keeps count, prunetrain.engine.kv_cache) must translate like the masked one."""
    import copy

    from transformers import MarianMTModel

    import prunetrain as pt
    from prunetrain.mt.text.data import marian_config
    from prunetrain.mt.evaluation.translation import translate

    torch.manual_seed(0)
    model = MarianMTModel(marian_config(m30k_tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4)).eval()
    site = "model.decoder.layers.0.self_attn"
    mask = pt.HeadMask.from_heads(model, {site: [0, 1, 2, 3]})
    sources = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee auf einer Wiese."]
    with mask.applied(model):
        expected = translate(model, m30k_tokenizer, sources, max_new_tokens=12)
    shrunk = copy.deepcopy(model)
    pt.shrink(shrunk, mask)
    assert pt.find_heads(shrunk)[site].num_heads == 0
    assert translate(shrunk, m30k_tokenizer, sources, max_new_tokens=12) == expected
