"""Beam search inside ONNX Runtime (its `BeamSearch` operator over the export's subgraphs,
`prunetrain.export.onnx_beam_op`) gives the hypotheses of `generate(num_beams=4)` on a pruned translation model
with per-layer head counts and a head-less decoder layer (issue 39)."""

import pytest
import torch

import prunetrain as pt
from prunetrain.export.formats import export
from prunetrain.export.onnx_beam import BeamSettings
from prunetrain.export.onnx_beam_op import FILE, OrtBeamSearch

from test_onnx_beam import _trained_marian


def _pruned(model):
    """Non-uniform: a head-less first decoder self-attention layer, 2-4 heads elsewhere."""
    layout = pt.find_heads(model)
    remove = {s.name: list(range(s.num_heads)) if s.kind == "decoder_self" and s.layer == 0 else [0, 2][: i % 3]
              for i, s in enumerate(layout)}
    pt.shrink(model, pt.HeadMask.from_heads(model, remove))
    return model


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_the_operator_gives_generates_hypotheses_on_shrunk_tiny_models(family, tmp_path):
    from test_onnx_beam import INIT

    from prunetrain.zoo import random_mask, tiny_model

    model = tiny_model(family, **INIT[family])
    pt.shrink(model, random_mask(model, seed=5, soft=True, empty_site=0))  # a head-less encoder layer
    assert any(s.num_heads == 0 for s in pt.find_heads(model))
    export(model, tmp_path / "onnx", "onnx")
    runner = OrtBeamSearch(tmp_path / "onnx")
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 90, (6, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padded source positions
    pad = model.config.pad_token_id
    with torch.no_grad():  # EOS := a token greedy decoding picks often, so hypotheses end at many lengths
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                eos_token_id=None, suppress_tokens=[pad])[:, 1:]
    eos = int(torch.mode(greedy[:, 2:].flatten()).values)
    ended = 0
    for settings in ({}, {"length_penalty": 0.6}, {"num_beams": 3}, {"min_new_tokens": 3}):
        kwargs = {"num_beams": 4, "eos_token_id": eos, "early_stopping": True, "suppress_tokens": [pad], **settings}
        with torch.no_grad():
            want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, **kwargs)
        got = runner.generate(ids, mask, 12, BeamSettings.from_generation_config(model.generation_config, **kwargs))
        for g, w in zip(got, want):
            if (g == eos).any() and (w == eos).any():  # both ended in EOS (not cut at the length limit)
                ended += 1
                assert torch.equal(g[:len(w)], w) and (g[len(w):] == w[-1]).all(), (settings, g, w)
    assert ended >= 8


@pytest.mark.slow
def test_the_beam_search_operator_translates_multi30k_as_generate(m30k_tokenizer, multi30k_train_slice, multi30k_dir,
                                                                  tmp_path):
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import _sorted_batches, translate, translate_onnx

    model = _pruned(_trained_marian(m30k_tokenizer, multi30k_train_slice, steps=200))
    export(model, tmp_path / "onnx", "onnx")
    assert (tmp_path / "onnx" / FILE).is_file()
    sources = [s for s, _ in read_parallel(multi30k_dir, "test")]
    c = model.config
    runner = OrtBeamSearch(tmp_path / "onnx")
    encoded = m30k_tokenizer(sources, return_attention_mask=False)["input_ids"]
    kwargs = dict(num_beams=4, early_stopping=True, suppress_tokens=[c.pad_token_id])
    settings = BeamSettings.from_generation_config(model.generation_config, **kwargs)
    ended = same = cut_differ = 0
    for rows, batch, caps in _sorted_batches(m30k_tokenizer, encoded, 16, c.max_position_embeddings, None):
        with torch.no_grad():
            want = model.generate(**batch, max_new_tokens=max(caps), do_sample=False, **kwargs)
        got = runner.generate(batch["input_ids"], batch["attention_mask"], max(caps), settings)
        width = max(got.shape[1], want.shape[1])
        got, want = (torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1) for t in (got, want))
        for g, w in zip(got, want):
            if (w == c.eos_token_id).any() and (g == c.eos_token_id).any():  # both ended in EOS: the same
                ended += 1
                same += int(torch.equal(g, w))
            else:  # a hypothesis at the length limit (no EOS): the operator divides its score by its length
                cut_differ += int(not torch.equal(g, w))  # with the decoder start token, generate by one less
    assert ended >= 500 and same == ended, (ended, same)
    assert cut_differ <= 60, cut_differ
    # translate_onnx ("auto": the operator with early_stopping=True) decodes a batch in which the operator took a
    # hypothesis without EOS again with the loop: all 1000 as PyTorch beam search
    want = translate(model, m30k_tokenizer, sources, batch_size=16, num_beams=4, early_stopping=True)
    got = translate_onnx(tmp_path / "onnx", m30k_tokenizer, sources, batch_size=16, num_beams=4, early_stopping=True,
                         decoder_start_token_id=c.decoder_start_token_id, eos_token_id=c.eos_token_id,
                         max_position_embeddings=c.max_position_embeddings)
    assert got == want
    greedy = translate(model, m30k_tokenizer, sources, batch_size=16, num_beams=1)
    assert sum(a != b for a, b in zip(want, greedy)) >= 50  # beam search matters for this model


def test_a_beam_search_graph_that_differs_from_pytorch_is_not_written(tmp_path, monkeypatch):
    import prunetrain.export.onnx_beam_op as op
    from prunetrain.zoo import tiny_model

    def differs(model, directory):
        raise ValueError("format: ONNX Runtime's decoder subgraph of beam_search_model.onnx differs from PyTorch's")

    monkeypatch.setattr(op, "check_beam_search", differs)
    with pytest.warns(UserWarning, match=r"beam_search_model.onnx not written \(MarianMTModel: format: ONNX "
                                         r"Runtime's decoder subgraph .* differs from PyTorch's\); beam search runs "
                                         r"with prunetrain.export.onnx_beam's loop"):
        result = export(tiny_model("marian"), tmp_path / "onnx", "onnx")
    assert FILE not in result["files"] and "decoder_with_past_model.onnx" in result["files"]
    assert not (tmp_path / "onnx" / FILE).exists()


def test_the_operator_refuses_settings_it_does_not_take_and_an_export_without_it(tmp_path):
    from prunetrain.export.onnx_beam_op import cache_order, check_beam_search
    from prunetrain.mt.evaluation.translation import translate_onnx
    from prunetrain.zoo import tiny_model

    model = tiny_model("marian")
    export(model, tmp_path / "onnx", "onnx")
    runner = OrtBeamSearch(tmp_path / "onnx")
    ids = torch.ones(1, 3, dtype=torch.long)
    for kwargs, message in [({"forced_eos_token_id": 2}, r"forced_eos_token_id: 2 is not taken by ONNX Runtime's "
                                                         r"BeamSearch operator; .*beam_generate \(the Python loop\)"),
                            ({"early_stopping": "never"}, r"early_stopping: 'never' is not taken"),
                            ({"early_stopping": False}, r"early_stopping: False is not taken by ONNX Runtime's "
                                                        r"BeamSearch operator, only True: its stop check"),
                            ({"eos_token_id": [2, 3], "early_stopping": True},
                             r"eos_token_id: \[2, 3\] is not one token")]:
        with pytest.raises(ValueError, match=message):
            runner.generate_or_none(ids, ids, 4, num_beams=2, **kwargs)
    with pytest.raises(ValueError, match=r"beam_engine: 'fast' is not allowed; expected 'auto', 'operator' or "
                                         r"'loop'\."):
        translate_onnx(tmp_path / "onnx", None, ["a"], num_beams=2, decoder_start_token_id=0, eos_token_id=1,
                       beam_engine="fast")
    # asking for the operator with transformers' default stopping rule is refused before any batch is decoded
    with pytest.raises(ValueError, match=r"^early_stopping: False is not taken by beam_engine 'operator' .*; use "
                                         r"early_stopping=True or beam_engine 'loop'\.$"):
        translate_onnx(tmp_path / "onnx", None, ["a"], num_beams=2, decoder_start_token_id=0, eos_token_id=1,
                       beam_engine="operator")
    # the file is checked against the model it came from: another model's weights are refused
    other = tiny_model("marian")
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)
    with pytest.raises(ValueError, match=r"format: ONNX Runtime's encoder subgraph of beam_search_model.onnx differs "
                                         r"from PyTorch's \(max \|Δ\| .*the export is not written\."):
        check_beam_search(other, tmp_path / "onnx")
    assert check_beam_search(model, tmp_path / "onnx") <= 1e-4
    # no decoder self-attention head left: no operator file (the loop still decodes the export), and asking for it
    # is refused in one line
    remove = {s.name: list(range(s.num_heads)) for s in pt.find_heads(model) if s.kind == "decoder_self"}
    pt.shrink(model, pt.HeadMask.from_heads(model, remove))
    with pytest.raises(ValueError, match=r"needs a decoder self-attention layer with at least one head"):
        cache_order(model)
    export(model, tmp_path / "headless", "onnx")
    assert not (tmp_path / "headless" / FILE).exists()
    assert (tmp_path / "headless" / "decoder_with_past_model.onnx").is_file()
    with pytest.raises(ValueError, match=rf"beam_engine: 'operator' needs {FILE} in .*headless"):
        translate_onnx(tmp_path / "headless", None, ["a"], num_beams=2, decoder_start_token_id=0, eos_token_id=1,
                       beam_engine="operator")
