"""GGUF export for llama.cpp (issue 28): per-layer heads, checked in llama.cpp itself (llama-cpp-python)."""

import json
import os

import numpy as np
import pytest
import torch

import prunetrain as pt
from prunetrain.export.formats import check_formats, export
from prunetrain.zoo import tiny_model

pytestmark = pytest.mark.llama  # CI runs these again with the llama extra installed

LLAMA_REASON = ("LLAMA.CPP NOT INSTALLED: the GGUF tests did not run. bash scripts/install.sh --with-llama builds it "
                "(CPU, a few minutes). Set PRUNETRAIN_REQUIRE_LLAMA=1 to make this a failure.")


def _require_llama():
    if os.environ.get("PRUNETRAIN_REQUIRE_LLAMA", "").lower() in ("1", "true", "yes"):
        import gguf  # noqa: F401  (an ImportError fails the test loudly)
        import llama_cpp  # noqa: F401
        return
    pytest.importorskip("gguf", reason=LLAMA_REASON)
    pytest.importorskip("llama_cpp", reason=LLAMA_REASON)


@pytest.fixture(autouse=True)
def llama_installed():
    _require_llama()


# 4 layers, 8 query heads on 4 key/value heads (groups of 2), head size 8: whole groups go
SHAPE = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=128)
# key/value groups kept per layer (of 4): non-uniform, layer 2 head-less
KEPT_GROUPS = {0.0: (4, 4, 4, 4), 0.5: (3, 2, 0, 3), 0.75: (2, 1, 0, 1)}


def decoder(family, vocab_size=None, **overrides):
    """A tiny 4-layer decoder of `family` whose logits are spread out (no near-ties for greedy decoding)."""
    extra = {"layer_types": ["full_attention"] * 4} if family == "qwen2" else {}
    if family != "qwen2":
        extra["head_dim"] = 8
    if vocab_size is not None:
        extra["vocab_size"] = vocab_size
    model = tiny_model(family, **SHAPE, **extra, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


def prune_groups(model, kept):
    """Shrink `model` keeping the first `kept[l]` key/value groups of layer l."""
    layout = pt.find_heads(model)
    remove = {}
    for site, groups in zip(layout, kept):
        g = site.group_size
        remove[site.name] = list(range(groups * g, site.num_heads))
    pt.shrink(model, pt.HeadMask.from_heads(model, remove))
    return model


def llama_logits_and_greedy(path, tokens, prompt, new_tokens):
    from prunetrain.export.llama_cpp import greedy, open_model, prompt_logits

    llm = open_model(path, n_ctx=128)
    try:
        return prompt_logits(llm, tokens), greedy(llm, prompt, new_tokens)
    finally:
        llm.close()


def llama_cpp_and_model(model, path):
    """(llama.cpp's logits, the model's) on 40 tokens, and both greedy continuations of 24 tokens after 6."""
    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(3, 96, (40,), generator=gen).tolist()
    got, generated = llama_logits_and_greedy(path, tokens, tokens[:6], 24)
    model.generation_config.eos_token_id = None  # llama.cpp's sampler does not stop at EOS either
    with torch.no_grad():
        want = model(input_ids=torch.tensor([tokens])).logits[0].numpy()
        want_tokens = model.generate(torch.tensor([tokens[:6]]), max_new_tokens=24, do_sample=False, num_beams=1,
                                     pad_token_id=1)[0, 6:].tolist()
    return got, want, generated, want_tokens


@pytest.mark.parametrize("family,fraction", [("llama", 0.0), ("llama", 0.5), ("llama", 0.75), ("qwen2", 0.5),
                                             ("mistral", 0.75)])
def test_gguf_in_llama_cpp_equals_the_shrunk_model(family, fraction, tmp_path):
    model = prune_groups(decoder(family), KEPT_GROUPS[fraction])
    heads = [s.num_heads for s in pt.find_heads(model)]
    assert sum(heads) == round(32 * (1 - fraction))
    result = export(model, tmp_path / "gguf", "gguf")
    assert result["files"] == ["model.gguf"] and result["gguf_type"] == "f32"
    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(3, 96, (40,), generator=gen).tolist()
    got, generated = llama_logits_and_greedy(tmp_path / "gguf" / "model.gguf", tokens, tokens[:6], 32)
    model.generation_config.eos_token_id = None  # llama.cpp's sampler does not stop at EOS either
    with torch.no_grad():
        want = model(input_ids=torch.tensor([tokens])).logits[0].numpy()
        want_tokens = model.generate(torch.tensor([tokens[:6]]), max_new_tokens=32, do_sample=False, num_beams=1,
                                     pad_token_id=1)[0, 6:].tolist()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # f32: only the summation order differs
    assert generated == want_tokens


def test_gguf_records_the_per_layer_head_counts(tmp_path):
    import gguf

    model = prune_groups(decoder("llama"), KEPT_GROUPS[0.75])
    export(model, tmp_path / "gguf", "gguf")
    reader = gguf.GGUFReader(str(tmp_path / "gguf" / "model.gguf"))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "deci"
    assert field("deci.attention.head_count") == [4, 2, 0, 2]
    assert field("deci.attention.head_count_kv") == [2, 1, 0, 1]
    names = {t.name for t in reader.tensors}
    assert "blk.1.attn_q.weight" in names and not {n for n in names if n.startswith("blk.2.attn")}
    assert {t.name: tuple(t.shape) for t in reader.tensors}["blk.1.attn_q.weight"] == (64, 16)


def test_gguf_writes_a_sliding_window_as_the_context_length(tmp_path):
    import gguf

    model = prune_groups(decoder("mistral", sliding_window=32), KEPT_GROUPS[0.5])  # positions: 128, window: 32
    export(model, tmp_path / "gguf", "gguf")  # checked in llama.cpp on a 24-token probe (inside the window)
    reader = gguf.GGUFReader(str(tmp_path / "gguf" / "model.gguf"))
    assert reader.fields["deci.context_length"].contents() == 32


@pytest.mark.parametrize("gguf_type,matrix", [("f16", "F16"), ("q8_0", "Q8_0")])
def test_gguf_f16_and_q8_0_stay_within_their_stated_tolerance(gguf_type, matrix, tmp_path):
    import gguf

    from prunetrain.export.gguf import TOLERANCE

    model = prune_groups(decoder("qwen2"), KEPT_GROUPS[0.5])
    result = export(model, tmp_path / "gguf", "gguf", gguf_type=gguf_type)
    assert 0 < result["max_abs_diff"] <= TOLERANCE[gguf_type]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "gguf" / "model.gguf")).tensors}
    assert types["blk.0.attn_q.weight"] == matrix and types["blk.0.attn_q.bias"] == "F32"
    assert types["blk.0.attn_norm.weight"] == "F32"


def test_gguf_carries_a_byte_level_bpe_tokenizer_that_tokenizes_like_the_source(multi30k_dir, tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    from prunetrain.export.llama_cpp import open_model, tokenize

    english = (multi30k_dir / "train.en").read_text(encoding="utf-8").splitlines()[:3000]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(english, vocab_size=600, min_frequency=2, special_tokens=["<s>", "<pad>", "</s>"])
    source = pt.save_pruned(prune_groups(decoder("llama", vocab_size=bpe.get_vocab_size()), KEPT_GROUPS[0.5]),
                            tmp_path / "pruned")
    bpe.save(str(source / "tokenizer.json"))
    assert check_formats(source)["gguf"] is None
    export(source, tmp_path / "gguf", "gguf")
    sentences = (multi30k_dir / "test.en").read_text(encoding="utf-8").splitlines()[:200]
    llm = open_model(tmp_path / "gguf" / "model.gguf", logits_all=False)
    try:
        assert llm.n_vocab() == bpe.get_vocab_size()
        for sentence in sentences:
            assert tokenize(llm, sentence) == bpe.encode(sentence).ids, sentence
    finally:
        llm.close()


# FFN neurons kept per layer (of 128) beside the key/value groups kept (of 4), and the widths written for llama.cpp
FFN_LAYOUTS = {
    # layer 1 keeps heads but no neuron: one zero neuron; layer 2 has neither: width 0; layer 3 keeps one neuron
    "middle": dict(groups=(3, 2, 0, 1), neurons=(37, 0, 0, 1), written=[37, 1, 0, 1]),
    # layer 2 keeps heads but no neuron; the last layer has neither heads nor neurons: one zero neuron, because
    # llama.cpp's skip of a width-0 layer would also skip the last layer's selection of the output rows
    "last": dict(groups=(2, 0, 4, 0), neurons=(1, 90, 0, 0), written=[1, 90, 1, 1]),
}


def prune_heads_and_neurons(model, groups, neurons, seed=0):
    """Shrink `model` keeping the first `groups[l]` key/value groups and `neurons[l]` FFN neurons (drawn at
    random) of layer l."""
    mask = pt.HeadMask.ones(model, units=("heads", "neurons"))
    gen = torch.Generator().manual_seed(seed)
    attention = [s for s in mask.layout if s.unit == "heads"]
    ffns = [s for s in mask.layout if s.unit == "neurons"]
    for site, kept in zip(attention, groups):
        keep = torch.zeros(site.num_heads)
        keep[: kept * site.group_size] = 1.0
        mask[site.name] = keep
    for site, kept in zip(ffns, neurons):
        keep = torch.zeros(site.num_heads)
        keep[torch.randperm(site.num_heads, generator=gen)[:kept]] = 1.0
        mask[site.name] = keep
    layout = pt.shrink(model, mask)
    assert [s.num_heads for s in layout if s.unit == "neurons"] == list(neurons)
    return model


def ffn_pruned_decoder(family, layout, mlp_bias=False):
    """A tiny 4-layer decoder of `family` shrunk to `FFN_LAYOUTS[layout]` (with random FFN biases: `mlp_bias`)."""
    model = decoder(family, **({"mlp_bias": True} if mlp_bias else {}))
    if mlp_bias:
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                    proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.5)
    spec = FFN_LAYOUTS[layout]
    return prune_heads_and_neurons(model, spec["groups"], spec["neurons"])


@pytest.mark.parametrize("family,layout,mlp_bias", [("llama", "middle", False), ("llama", "last", False),
                                                     ("qwen2", "middle", False), ("llama", "middle", True)])
def test_gguf_with_per_layer_ffn_widths_equals_the_shrunk_model(family, layout, mlp_bias, tmp_path):
    import gguf

    model = ffn_pruned_decoder(family, layout, mlp_bias)
    written = list(FFN_LAYOUTS[layout]["written"])
    if mlp_bias:  # an FFN that adds its down projection's bias keeps one zero neuron to add it
        written = [max(width, 1) for width in written]
    result = export(model, tmp_path / "gguf", "gguf")
    assert result["files"] == ["model.gguf"] and result["gguf_type"] == "f32"
    path = tmp_path / "gguf" / "model.gguf"
    assert gguf.GGUFReader(str(path)).fields["deci.feed_forward_length"].contents() == written
    got, want, generated, want_tokens = llama_cpp_and_model(model, path)
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()  # f32: only the summation order differs
    assert generated == want_tokens


def test_gguf_records_the_per_layer_ffn_widths_and_their_padding(tmp_path):
    import gguf

    from prunetrain.export.gguf import write_gguf

    info = write_gguf(ffn_pruned_decoder("llama", "middle"), tmp_path / "model.gguf")
    assert (info["neurons_kept"], info["neurons_executed"]) == (38, 39)  # layer 1's zero neuron
    assert (info["heads_kept"], info["heads_executed"]) == (12, 12)
    reader = gguf.GGUFReader(str(tmp_path / "model.gguf"))
    assert reader.fields["deci.feed_forward_length"].contents() == [37, 1, 0, 1]
    assert reader.fields["deci.attention.head_count"].contents() == [6, 4, 0, 2]
    tensors = {t.name: t for t in reader.tensors}
    assert not [name for name in tensors if name.startswith("blk.2.")]  # neither attention nor FFN nor norms
    assert "blk.1.ffn_norm.weight" in tensors and "blk.3.ffn_norm.weight" in tensors
    shapes = {name: tuple(int(n) for n in t.shape) for name, t in tensors.items()}  # GGUF order: columns first
    assert shapes["blk.0.ffn_gate.weight"] == (64, 37) and shapes["blk.0.ffn_down.weight"] == (37, 64)
    assert shapes["blk.3.ffn_up.weight"] == (64, 1) and shapes["blk.3.ffn_down.weight"] == (1, 64)
    for short in ("gate", "up", "down"):  # the zero neuron of layer 1
        assert shapes[f"blk.1.ffn_{short}.weight"] == ((1, 64) if short == "down" else (64, 1))
        assert not np.asarray(tensors[f"blk.1.ffn_{short}.weight"].data).any()
    whole = write_gguf(decoder("llama"), tmp_path / "whole.gguf")
    assert (whole["neurons_kept"], whole["neurons_executed"]) == (512, 512)
    assert gguf.GGUFReader(str(tmp_path / "whole.gguf")).fields["deci.feed_forward_length"].contents() == [128] * 4


@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_gguf_with_per_layer_ffn_widths_stays_within_the_stated_tolerance(gguf_type, tmp_path):
    from prunetrain.export.gguf import TOLERANCE

    result = export(ffn_pruned_decoder("llama", "middle"), tmp_path / "gguf", "gguf", gguf_type=gguf_type)
    assert 0 < result["max_abs_diff"] <= TOLERANCE[gguf_type]


def _refused(model, match, tmp_path, **kwargs):
    with pytest.raises(ValueError, match=match):
        export(model, tmp_path / "gguf", "gguf", **kwargs)
    assert not (tmp_path / "gguf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".gguf")]


def test_gguf_refuses_what_llama_cpp_cannot_compute_exactly(tmp_path):
    _refused(tiny_model("gpt2"), r"format: 'gguf' writes causal language models of the Llama family \(llama, "
                                 r"mistral, qwen2\) .*; GPT2LMHeadModel \('gpt2'\) is not one\.", tmp_path)
    _refused(prune_groups(decoder("llama"), (0, 2, 2, 2)),
             r"format: 'gguf' cannot write a model whose first layer has no heads: llama\.cpp derives the head "
             r"size from layer 0's head count", tmp_path)
    biased = prune_groups(decoder("llama", attention_bias=True), KEPT_GROUPS[0.5])
    _refused(biased, r"format: 'gguf' cannot write layer 2: it has no heads but its output projection adds a bias",
             tmp_path)
    scaled = decoder("llama", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    _refused(scaled, r"format: 'gguf' writes the default rotary embedding over the whole head; this model's "
                     r"rope_parameters are \{'rope_type': 'linear'", tmp_path)
    _refused(decoder("llama", hidden_act="gelu"), r"format: 'gguf' needs the SiLU-gated feed-forward llama\.cpp "
                                                  r"runs; this model's hidden_act is 'gelu'\.", tmp_path)
    with pytest.raises(ValueError, match=r"gguf_type: 'q4' is not one of 'f32', 'f16', 'q8_0'\."):
        export(decoder("llama"), tmp_path / "gguf", "gguf", gguf_type="q4")
    with pytest.raises(ValueError, match=r"gguf_type: 'f16' is only for format 'gguf', not 'padded'\."):
        export(decoder("llama"), tmp_path / "p", "padded", gguf_type="f16")


def test_gguf_refuses_a_tokenizer_llama_cpp_would_split_differently(m30k_tokenizer, tmp_path):
    source = pt.save_pruned(decoder("llama", vocab_size=len(m30k_tokenizer)), tmp_path / "pruned")
    m30k_tokenizer.save_pretrained(source)  # a prefix space and an NFC normaliser: llama.cpp's gpt2 splits differ
    reason = check_formats(source)["gguf"]
    assert reason.startswith(f"{str(source / 'tokenizer.json')!r} cannot be written for llama.cpp (its "
                             f"pre-tokenizer is not GPT-2's byte-level split (ByteLevel, use_regex, no prefix space))")
    with pytest.raises(ValueError, match=r"tokenizer: .* cannot be written for llama\.cpp \(its pre-tokenizer is "
                                         r"not GPT-2's byte-level split"):
        export(source, tmp_path / "gguf", "gguf")
    assert not (tmp_path / "gguf").exists()


def test_gguf_refuses_a_sentencepiece_tokenizer(multi30k_dir, tmp_path):
    import sentencepiece as spm

    source = pt.save_pruned(prune_groups(decoder("llama"), KEPT_GROUPS[0.5]), tmp_path / "pruned")
    spm.SentencePieceTrainer.train(input=str(multi30k_dir / "train.en"), model_prefix=str(source / "tokenizer"),
                                   vocab_size=96, input_sentence_size=2000, minloglevel=2)
    with pytest.raises(ValueError, match=r"tokenizer: '.*tokenizer\.model' is not a tokenizer\.json; GGUF export "
                                         r"writes byte-level BPE tokenizers \(tokenizer\.json\) only"):
        export(source, tmp_path / "gguf", "gguf")
    assert "is not a byte-level BPE tokenizer.json" in check_formats(source)["gguf"]
    assert not (tmp_path / "gguf").exists()


def test_cli_exports_gguf_and_lists_it_in_check(tmp_path, capsys, monkeypatch):
    from test_export import _cli_in_process

    source = pt.save_pruned(prune_groups(decoder("mistral"), KEPT_GROUPS[0.75]), tmp_path / "pruned")
    code, out, err = _cli_in_process(capsys, monkeypatch, "--check", source)
    assert code == 0, err
    assert json.loads(out)["formats"]["gguf"] == {"possible": True}
    code, out, err = _cli_in_process(capsys, monkeypatch, source, tmp_path / "g", "--format", "gguf",
                                     "--gguf-type", "f16")
    assert code == 0 and err == "", err
    summary = json.loads(out)
    assert summary["gguf_type"] == "f16" and "model.gguf" in summary["files"]
    for args, message in [((source, tmp_path / "x", "--format", "padded", "--gguf-type", "f16"),
                           "prunetrain: error: --gguf-type: 'f16' is only for --format gguf, not 'padded'."),
                          ((source, tmp_path / "y", "--format", "gguf", "--gguf-type", "q2"),
                           "prunetrain: error: --gguf-type: 'q2' is not one of 'f32', 'f16', 'q8_0'.")]:
        code, out, err = _cli_in_process(capsys, monkeypatch, *args)
        assert code == 2 and err.strip() == message and out == "", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g", "pruned"]
