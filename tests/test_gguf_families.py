"""GGUF export of Qwen3, Gemma 2/3, Phi-3, OLMo 2 and Granite through their own llama.cpp architectures (issue 63,
item 9): heads and FFN neurons pruned per layer, padded with zero heads and zero neurons, checked in llama.cpp."""

import json

import numpy as np
import pytest
import torch
from test_gguf import _require_llama, llama_cpp_and_model, prune_heads_and_neurons

import prunetrain as pt
from prunetrain.export.formats import export
from prunetrain.zoo import tiny_model

pytestmark = pytest.mark.llama  # CI runs these again with the llama extra installed


@pytest.fixture(autouse=True)
def llama_installed():
    _require_llama()


# 4 layers, 8 query heads on 4 key/value heads (groups of 2), head size 8
SHAPE = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 8,
         "num_key_value_heads": 4, "max_position_embeddings": 128}
GROUPS = (3, 1, 0, 2)  # key/value groups kept per layer (of 4): 6, 2, 0 and 4 query heads, layer 2 head-less
NEURONS = (37, 128, 5, 64)  # FFN neurons kept per layer (of 128)
# llama.cpp's architecture, and the query / key-value heads every layer runs there: the most any layer keeps (3
# groups of 2), or the config's 8 on 4 where llama.cpp sizes the attention by the width (Phi-3, OLMo 2)
EXPECTED = {"qwen3": ("qwen3", 6, 3), "phi3": ("phi3", 8, 4), "olmo2": ("olmo2", 8, 4), "granite": ("granite", 6, 3),
            "gemma2": ("gemma2", 6, 3), "gemma3_text": ("gemma3", 6, 3)}


def family_decoder(family, **overrides):
    """A tiny 4-layer decoder of `family` (Gemma: alternating sliding-window layers of window 4), shrunk to
    `GROUPS` and `NEURONS`, its logits spread out (no near-ties for greedy decoding)."""
    extra = {}
    if family == "qwen3":
        extra = {"layer_types": ["full_attention"] * 4, "head_dim": 8}
    if family.startswith("gemma"):
        extra = {"layer_types": ["sliding_attention", "full_attention"] * 2, "head_dim": 8,
                 "tie_word_embeddings": True}
    model = tiny_model(family, **SHAPE, **{**extra, **overrides})
    if not model.config.tie_word_embeddings:
        with torch.no_grad():
            model.lm_head.weight.mul_(30.0)
    return prune_heads_and_neurons(model, GROUPS, NEURONS)


@pytest.mark.parametrize("family,overrides", [("qwen3", {}), ("phi3", {}), ("granite", {}), ("olmo2", {}),
                                               ("granite", {"attention_bias": True, "mlp_bias": True})])
def test_gguf_of_a_newer_family_in_llama_cpp_equals_the_shrunk_model(family, overrides, tmp_path):
    import gguf

    model = family_decoder(family, **overrides)  # Granite's biases: random, the head-less layer's output bias too
    arch, heads, kv_heads = EXPECTED[family]
    result = export(model, tmp_path / "gguf", "gguf")
    assert (result["heads_kept"], result["heads_executed"]) == (12, 4 * heads)  # zero heads pad every layer
    assert (result["neurons_kept"], result["neurons_executed"]) == (234, 4 * 128)
    path = tmp_path / "gguf" / "model.gguf"
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == arch
    assert reader.fields[f"{arch}.attention.head_count"].contents() == heads
    assert reader.fields[f"{arch}.attention.head_count_kv"].contents() == kv_heads
    got, want, generated, want_tokens = llama_cpp_and_model(model, path)
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # f32: only the summation order differs
    assert generated == want_tokens


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gguf_of_gemma_is_refused_in_f32_and_runs_in_f16(family, tmp_path):
    from prunetrain.export.gguf import TOLERANCE, write_gguf

    model = family_decoder(family)
    with pytest.raises(ValueError, match=r"format: 'gguf' cannot write Gemma exactly in f32: llama\.cpp's CPU GELU "
                                         r"rounds its input to f16"):
        export(model, tmp_path / "gguf", "gguf")
    assert not (tmp_path / "gguf").exists()
    result = export(model, tmp_path / "gguf", "gguf", gguf_type="f16")
    assert 0 < result["max_abs_diff"] <= TOLERANCE["f16"]
    assert (result["heads_kept"], result["heads_executed"]) == (12, 4 * EXPECTED[family][1])
    # the f32 file computes the model but for llama.cpp's f16 GELU table (a wrong tensor would be off by O(1))
    write_gguf(model, tmp_path / "f32.gguf")
    got, want, generated, want_tokens = llama_cpp_and_model(model, tmp_path / "f32.gguf")
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()
    assert generated == want_tokens


def test_gguf_refuses_what_the_newer_architectures_do_not_read(tmp_path):
    def refused(model, match):
        with pytest.raises(ValueError, match=match):
            export(model, tmp_path / "gguf", "gguf")
        assert not (tmp_path / "gguf").exists()

    refused(family_decoder("qwen3", attention_bias=True),
            r"format: 'gguf' cannot write layer 0: its o_proj has a non-zero bias, which llama\.cpp's qwen3 does not "
            r"read\.")
    refused(family_decoder("gemma2", tie_word_embeddings=False),
            r"format: 'gguf' cannot write a Gemma 2 model whose output projection is not the token embedding")
    refused(family_decoder("granite", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
            r"format: 'gguf' writes the default rotary embedding over the whole head; this model's rope_parameters")


def test_cli_check_shows_the_padding_of_a_gguf_export(tmp_path, capsys, monkeypatch):
    from test_export import _cli_in_process

    source = pt.save_pruned(family_decoder("qwen3"), tmp_path / "pruned")
    code, out, err = _cli_in_process(capsys, monkeypatch, "--check", source)
    assert code == 0, err
    assert json.loads(out)["formats"]["gguf"] == {
        "possible": True, "padding": {"architecture": "qwen3", "gguf_types": ["f32", "f16", "q8_0"], "heads_kept": 12,
                                      "heads_executed": 24, "neurons_kept": 234, "neurons_executed": 512}}
