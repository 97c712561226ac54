"""Exports of models whose FFNs were shrunk (FFN neurons pruned with the heads), exact in every engine.

Real parts only: tiny models of real families built from configs, shrunk by the engine over heads and FFN neurons
with non-uniform widths (an FFN with no neuron left, an FFN of one neuron), written by the exporters and run by the
engines themselves: CTranslate2 (a Marian model trained briefly on Multi30k, translating real Multi30k test
sentences), plain transformers `from_pretrained` (padded and uniform directories) and ONNX Runtime (graphs, its
KV-cache graph, the Python beam search over it and the `BeamSearch` operator).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import prunetrain as pt
from conftest import INT8_SATURATES, int8_bound
from prunetrain.export.formats import check_formats, export
from prunetrain.zoo import ARCHITECTURES, random_mask, tiny_inputs, tiny_model

from test_ctranslate2 import (HEADS, MAX_NEW_TOKENS, _beam_tie, _compare, _family_model, _marian, _widened,
                              lang_tokenizer, train_briefly)  # noqa: F401  (lang_tokenizer: a fixture)
from test_onnx_beam import INIT

BOTH = ("heads", "neurons")


def default_widths(widths: list[int]) -> list[int]:
    """The first FFN emptied, the last left with one neuron, about half of each other one."""
    return [0] + [w // 2 for w in widths[1:-1]] + [1]


def ffn_widths(model) -> list[int]:
    return [s.num_heads for s in pt.find_neurons(model)]


def ffn_mask(model, seed: int, widths=None, heads: bool = True):
    """A mask over heads and FFN neurons: random heads (about half; all of them kept without `heads`)
    and in each FFN `widths[i]` neurons kept at random positions (default: `default_widths`)."""
    layout = pt.find_sites(model, BOTH)
    mask = random_mask(layout, seed=seed, empty_site=None) if heads else pt.HeadMask.ones(layout)
    ffn = [s for s in layout if s.unit == "neurons"]
    generator = torch.Generator().manual_seed(seed)
    for site, width in zip(ffn, widths or default_widths([s.num_heads for s in ffn])):
        keep = torch.zeros(site.num_heads)
        keep[torch.randperm(site.num_heads, generator=generator)[:width]] = 1.0
        mask[site.name] = keep
    return mask


def shrunk(family: str, seed: int = 3, widths=None, heads: bool = True, **overrides):
    """A tiny model of `family` (config `overrides`) shrunk by `ffn_mask` (its FFN widths checked)."""
    model = tiny_model(family, **overrides)
    widths = list(widths or default_widths(ffn_widths(model)))
    pt.shrink(model, ffn_mask(model, seed, widths, heads))
    assert ffn_widths(model) == widths
    return model


# ---------------------------------------------------------------------------------------------------------------------
# CTranslate2: each layer's FFN at its own width, one zero neuron where none is left
# ---------------------------------------------------------------------------------------------------------------------
CT2_HEADS = (3, 2, 4, 2, 1, 3)  # heads kept per site in module order (encoder 0, 1; decoder 0 self, cross; 1 ...)
CT2_WIDTHS = (0, 48, 96, 1)  # FFN widths: encoder 0 emptied, encoder 1, decoder 0, decoder 1 with one neuron
CT2_SOURCES = 1000  # the whole Multi30k test set


def _ct2_pruned(model):
    """`model` (a tiny Marian, 128 FFN neurons per layer) with `CT2_HEADS` and `CT2_WIDTHS` kept."""
    mask = ffn_mask(model, seed=5, widths=CT2_WIDTHS, heads=False)
    for site, kept in zip([s for s in mask.layout if s.unit == "heads"], CT2_HEADS):
        mask[site.name] = torch.tensor([1.0] * kept + [0.0] * (HEADS - kept))
    pt.shrink(model, mask)
    assert ffn_widths(model) == list(CT2_WIDTHS) and [s.num_heads for s in pt.find_heads(model)] == list(CT2_HEADS)
    return model


@pytest.fixture(scope="module")
def ct2_export(tmp_path_factory, m30k_tokenizer, multi30k_train_slice):
    """(pruned model, its saved directory, its CTranslate2 directory, the export's summary), written through
    `export(directory, ..., "ctranslate2")` as `prunetrain export` writes it. The model is shrunk first and then
    trained briefly on Multi30k in its pruned shapes (~10 s), so that its translations depend on the source."""
    from prunetrain.mt.evaluation.translation import save_translation_model

    root = tmp_path_factory.mktemp("ct2-ffn")
    model = train_briefly(_ct2_pruned(_marian(m30k_tokenizer)), m30k_tokenizer, multi30k_train_slice)
    source = save_translation_model(model, m30k_tokenizer, root / "model")
    return model, source, root / "ct2", export(source, root / "ct2", "ctranslate2")


@pytest.fixture(scope="module")
def ct2_sources(multi30k_dir) -> list[str]:
    from prunetrain.mt.text.data import read_parallel

    return [s for s, _ in read_parallel(multi30k_dir, "test", limit=CT2_SOURCES)]


def test_ctranslate2_float32_probe_and_the_neurons_reported(ct2_export):
    _, _, directory, summary = ct2_export
    assert summary["max_abs_diff"] <= 1e-4 and summary["max_abs_diff_quantized"] is None
    assert summary["neurons_kept"] == sum(CT2_WIDTHS) == 145 and summary["neurons_executed"] == 146  # one zero neuron
    assert summary["heads_kept"] == sum(CT2_HEADS) and summary["heads_executed"] == 2 * 3 + 4 * 4
    assert summary["neurons"] == "145 neurons (encoder_ffn 48, decoder_ffn 97)"
    info = json.loads((directory / "prunetrain_ctranslate2.json").read_text())
    assert info["ffn_widths"] == {"encoder": [1, 48], "decoder": [96, 1]}
    assert (info["neurons_kept"], info["neurons_executed"]) == (145, 146)


def test_ctranslate2_greedy_translations_identical_to_generate(ct2_export, m30k_tokenizer, ct2_sources):
    from prunetrain.export.ctranslate2 import translate_ctranslate2
    from prunetrain.mt.evaluation.translation import translate

    model, _, directory, _ = ct2_export
    ours = translate(model, m30k_tokenizer, ct2_sources, max_new_tokens=MAX_NEW_TOKENS, batch_size=50)
    theirs = translate_ctranslate2(directory, ct2_sources, max_new_tokens=MAX_NEW_TOKENS, batch_size=50)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(theirs) == CT2_SOURCES and not differ, (len(differ), [(ours[i], theirs[i]) for i in differ[:3]])
    assert len(set(theirs)) > CT2_SOURCES // 4  # the model says different things for different sentences


def test_ctranslate2_beam_translations_identical_up_to_float32_ties(ct2_export, m30k_tokenizer, ct2_sources):
    """Beam 4 with CTranslate2's stopping rule and log-probabilities (`early_stopping=True`,
    `renormalize_logits=True`), as tests/test_ctranslate2.py compares it: a sentence may differ only where the
    replayed search meets a float32 tie (`_beam_tie`)."""
    from prunetrain.export.ctranslate2 import translate_ctranslate2
    from prunetrain.mt.evaluation.translation import translate

    model, _, directory, _ = ct2_export
    ours = translate(model, m30k_tokenizer, ct2_sources, num_beams=4, max_new_tokens=MAX_NEW_TOKENS, batch_size=50,
                     early_stopping=True, renormalize_logits=True)
    theirs = translate_ctranslate2(directory, ct2_sources, num_beams=4, max_new_tokens=MAX_NEW_TOKENS, batch_size=50)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    untied = [(ours[i], theirs[i]) for i in differ if _beam_tie(model, m30k_tokenizer, ct2_sources[i]) is None]
    assert not untied and len(differ) <= 3, (len(differ), untied[:3])
    greedy = translate_ctranslate2(directory, ct2_sources, max_new_tokens=MAX_NEW_TOKENS, batch_size=50)
    assert sum(a != b for a, b in zip(theirs, greedy)) >= 10  # beam search matters for this model


def test_ctranslate2_int8_loads_and_translates_and_leaves_the_model_whole(ct2_export, ct2_sources, tmp_path):
    """int8 (with the zero neuron and the one-neuron FFN quantized) loads, translates, and stays close to the model
    in log-probability (measured 0.01 with this model). CTranslate2 quantizes the tensors it is given in place, so
    the export converts a copy: the model (whose embeddings it would otherwise scale and round) is unchanged."""
    from prunetrain.export.ctranslate2 import export_ctranslate2, translate_ctranslate2

    model, source, directory, _ = ct2_export
    before = {name: value.clone() for name, value in model.state_dict().items()}
    result = export_ctranslate2(model, tmp_path / "int8", source, quantization="int8")
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert result["max_abs_diff"] <= 1e-4 and 0 < result["max_abs_diff_quantized"] < int8_bound(0.5)
    translations = translate_ctranslate2(tmp_path / "int8", ct2_sources[:40], max_new_tokens=MAX_NEW_TOKENS)
    float32 = translate_ctranslate2(directory, ct2_sources[:40], max_new_tokens=MAX_NEW_TOKENS)  # = generate's
    same = sum(a == b for a, b in zip(translations, float32))
    # int8 mostly translates as the model does, where the CPU's int8 products do not saturate (conftest.py)
    assert len(translations) == 40 and (20 <= same or INT8_SATURATES), same


@pytest.mark.parametrize("family", ["bart", "mbart", "m2m_100", "pegasus"])
def test_ctranslate2_other_families_with_pruned_ffns_translate_as_generate(family, lang_tokenizer, ct2_sources,
                                                                           tmp_path):
    """BART, mBART (pre-norm, forced language token), M2M-100 and Pegasus with heads pruned, the first FFN emptied
    and the last left with one neuron: the probe agrees in float32 and greedy translations are `generate`'s."""
    from prunetrain.mt.evaluation.translation import save_translation_model

    model = _widened(_family_model(family, lang_tokenizer))
    pt.shrink(model, ffn_mask(model, seed=3))
    assert ffn_widths(model) == [0, 64, 64, 1]
    source = save_translation_model(model, lang_tokenizer, tmp_path / "model")
    summary = export(source, tmp_path / "ct2", "ctranslate2")
    assert summary["max_abs_diff"] <= 1e-4 and (summary["neurons_kept"], summary["neurons_executed"]) == (129, 130)
    assert not _compare(model, lang_tokenizer, tmp_path / "ct2", ct2_sources[:60], 1)


# ---------------------------------------------------------------------------------------------------------------------
# padded: the original architecture and config, removed FFN neurons as zero weights
# ---------------------------------------------------------------------------------------------------------------------
PLAIN = ("marian", "llama", "gpt2", "t5", "phi3")  # phi3: a fused gate/up projection; gpt2: Conv1D


def model_inputs(family):
    inputs = {k: v for k, v in tiny_inputs(family).items() if k != "labels"}
    if ARCHITECTURES[family].task == "seq2seq":
        inputs["decoder_input_ids"] = tiny_inputs(family)["labels"]
    return inputs


def generate_kwargs(family):
    inputs = tiny_inputs(family)
    return dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6,
                min_new_tokens=6, use_cache=True, do_sample=False, pad_token_id=1)


def _plain(family, directory):
    """The written directory loaded by plain transformers (`AutoModelFor...` of the family's task)."""
    auto = {"seq2seq": "AutoModelForSeq2SeqLM", "causal-lm": "AutoModelForCausalLM"}[ARCHITECTURES[family].task]
    return getattr(transformers, auto).from_pretrained(directory, attn_implementation="eager").eval()


def _assert_same(plain, model, family, tolerance: float):
    inputs = model_inputs(family)
    with torch.no_grad():
        assert (plain(**inputs).logits - model(**inputs).logits).abs().max() <= tolerance
        assert torch.equal(plain.generate(**generate_kwargs(family)), model.generate(**generate_kwargs(family)))


@pytest.mark.parametrize("family", PLAIN)
def test_padded_export_with_pruned_ffns_loads_with_plain_from_pretrained(family, tmp_path):
    model = shrunk(family)
    source = pt.save_pruned(model, tmp_path / "pruned")
    result = export(source, tmp_path / "padded", "padded")
    plain = _plain(family, tmp_path / "padded")
    assert "prunetrain_heads" not in plain.config.to_dict() and "modeling_prunetrain.py" not in result["files"]
    full = tiny_model(family)
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in full.state_dict().items()}  # the original shapes
    _assert_same(plain, model, family, 1e-5)
    neurons = pt.find_neurons(model)
    assert (result["neurons_kept"], result["neurons_executed"]) == \
        (neurons.total_neurons, sum(s.original_num_heads for s in neurons))
    assert result["heads_kept"] == pt.find_heads(model).total_heads
    assert result["heads_executed"] == pt.find_heads(full).total_heads
    assert result["neurons"] == neurons.summary()


def test_padded_ffn_neurons_are_zero_rows_and_columns(tmp_path):
    """In the padded Phi-3 (gate and up fused in one projection, [gate | up]) a removed neuron j is zero in rows j
    and I + j of `gate_up_proj` and in column j of `down_proj`; a kept one holds its weights."""
    model = shrunk("phi3")
    export(model, tmp_path / "padded", "padded")
    plain = _plain("phi3", tmp_path / "padded")
    for layer, site in zip(plain.model.layers, pt.find_neurons(model)):
        width = site.original_num_heads
        removed = sorted(set(range(width)) - set(site.heads))
        gate_up, down = layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight
        assert gate_up.shape[0] == 2 * width and down.shape[1] == width
        assert not gate_up[removed].any() and not gate_up[[width + j for j in removed]].any()
        assert not down[:, removed].any()
        assert all(gate_up[list(site.heads)].abs().sum(1) > 0) and all(gate_up[[width + j for j in site.heads]]
                                                                       .abs().sum(1) > 0)


# ---------------------------------------------------------------------------------------------------------------------
# uniform: FFNs of one width per config key, written with that width; other layouts refused in one sentence
# ---------------------------------------------------------------------------------------------------------------------
UNIFORM = {  # family: (FFN widths kept, the config keys and values the written config must hold)
    "marian": ((24, 24, 40, 40), {"encoder_ffn_dim": 24, "decoder_ffn_dim": 40}),
    "llama": ((21, 21), {"intermediate_size": 21}),
    "gpt2": ((37, 37), {"n_inner": 37}),
    "t5": ((5, 5, 5, 5), {"d_ff": 5}),
    "phi3": ((1, 1), {"intermediate_size": 1}),
}


@pytest.mark.parametrize("family", list(UNIFORM))
def test_uniform_export_writes_the_ffn_width_into_the_config(family, tmp_path):
    widths, keys = UNIFORM[family]
    model = shrunk(family, widths=widths, heads=False)
    result = export(model, tmp_path / "uniform", "uniform")
    assert result["max_abs_diff"] == 0.0
    config = json.loads((tmp_path / "uniform" / "config.json").read_text())
    assert {k: config[k] for k in keys} == keys
    assert not {"auto_map", "prunetrain_heads", "prunetrain_export"} & set(config)
    plain = _plain(family, tmp_path / "uniform")
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in model.state_dict().items()}  # the shrunk shapes, truthfully
    _assert_same(plain, model, family, 0.0)


def test_uniform_export_with_fewer_heads_and_narrower_ffns(tmp_path):
    """Llama with one key/value group kept per layer and 10 FFN neurons everywhere: both in the standard config."""
    model = tiny_model("llama")
    layout = pt.find_sites(model, BOTH)
    mask = pt.HeadMask.ones(layout)
    for site in layout:
        kept = [2, 3] if site.unit == "heads" else [5 + 4 * j for j in range(10)]
        mask[site.name] = torch.tensor([float(i in kept) for i in range(site.num_heads)])
    pt.shrink(model, mask)
    export(model, tmp_path / "uniform", "uniform")
    config = json.loads((tmp_path / "uniform" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (2, 1, 10)
    _assert_same(_plain("llama", tmp_path / "uniform"), model, "llama", 0.0)


DIFFER = r"'uniform' states one FFN width per config key, but "


@pytest.mark.parametrize("family,widths,message", [
    ("marian", (24, 30, 40, 40), DIFFER + r"the FFNs that 'encoder_ffn_dim' sizes keep different numbers of neurons "
                                 r"\('model\.encoder\.layers\.0\.fc2' 24, 'model\.encoder\.layers\.1\.fc2' 30\)"),
    ("t5", (5, 5, 6, 6), DIFFER + r"the FFNs that 'd_ff' sizes keep different numbers of neurons "
                         r"\('encoder\.block\.0\.layer\.1\.DenseReluDense\.wo' 5, "
                         r"'decoder\.block\.0\.layer\.2\.DenseReluDense\.wo' 6\)"),
    ("gpt2", (0, 0), r"'uniform' cannot write FFNs with no neurons \(those 'n_inner' sizes, e\.g\. "
                     r"'transformer\.h\.0\.mlp\.c_proj', keep 0\)"),
    ("llama", (0, 1), DIFFER + r"the FFNs that 'intermediate_size' sizes keep different numbers of neurons "
                      r"\('model\.layers\.0\.mlp\.down_proj' 0, 'model\.layers\.1\.mlp\.down_proj' 1\)"),
])
def test_uniform_refuses_ffn_widths_a_standard_config_cannot_state(family, widths, message, tmp_path):
    model = shrunk(family, widths=widths, heads=False)
    with pytest.raises(ValueError, match=rf"^format: {message}; use 'remote-code' or 'padded'"):
        export(model, tmp_path / "u", "uniform")
    assert list(tmp_path.iterdir()) == []  # nothing half-written
    reasons = check_formats(model)
    assert reasons["padded"] is None and reasons["remote-code"] is None
    assert reasons["uniform"].startswith("'uniform' ") and "FFN" in reasons["uniform"]


def test_cli_export_reports_the_ffn_padding_and_why_not_uniform(tmp_path, monkeypatch, capsys):
    """`prunetrain export --check` names the FFNs 'uniform' cannot state; `--format padded` reports the neurons
    kept and run; `--format uniform` refuses in one line and writes nothing."""
    from hostile import assert_one_line, run_main

    source = pt.save_pruned(shrunk("marian", heads=False), tmp_path / "pruned")
    code, out, err = run_main(monkeypatch, capsys, "export", "--check", source)
    formats = json.loads(out)["formats"]
    assert code == 0 and formats["padded"] == {"possible": True}, err
    assert "keep different numbers of neurons" in formats["uniform"]["why_not"]
    code, out, err = run_main(monkeypatch, capsys, "export", source, tmp_path / "padded", "--format", "padded")
    summary = json.loads(out)
    assert code == 0 and summary["max_abs_diff"] <= 1e-5, err
    assert (summary["neurons_kept"], summary["neurons_executed"]) == (0 + 32 + 32 + 1, 4 * 64)
    assert summary["neurons"] == "65 neurons (encoder_ffn 32, decoder_ffn 33)"
    assert_one_line(run_main(monkeypatch, capsys, "export", source, tmp_path / "u", "--format", "uniform"),
                    r"format: 'uniform' states one FFN width per config key, but the FFNs that 'encoder_ffn_dim' "
                    r"sizes keep different numbers of neurons")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["padded", "pruned"]


# ---------------------------------------------------------------------------------------------------------------------
# ONNX: graphs, the KV-cache graph and both beam searches with pruned FFNs
# ---------------------------------------------------------------------------------------------------------------------
ONNX_FAMILIES = ("marian", "t5", "gpt2", "llama")


@pytest.mark.parametrize("family", ONNX_FAMILIES)
def test_onnx_export_with_pruned_ffns_runs_like_pytorch(family, tmp_path):
    import onnxruntime as ort

    model = shrunk(family)
    result = export(model, tmp_path / "onnx", "onnx")
    assert result["max_abs_diff"] <= 1e-4
    inputs = tiny_inputs(family, batch=3, length=11, seed=5)  # other shapes than the export's probe
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1

    def load(name):
        return ort.InferenceSession(str(tmp_path / "onnx" / name), opts, providers=["CPUExecutionProvider"])

    with torch.no_grad():
        if ARCHITECTURES[family].task == "seq2seq":
            hidden = load("encoder_model.onnx").run(None, {"input_ids": ids, "attention_mask": mask})[0]
            got = load("decoder_model.onnx").run(None, {"decoder_input_ids": inputs["labels"].numpy(),
                                                        "encoder_hidden_states": hidden,
                                                        "encoder_attention_mask": mask})[0]
            want = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                         decoder_input_ids=inputs["labels"]).logits
        else:
            got = load("model.onnx").run(None, {"input_ids": ids, "attention_mask": mask})[0]
            want = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    assert got.shape == tuple(want.shape) and (torch.from_numpy(got) - want).abs().max() <= 1e-4


def _source_ids(rows: int = 4, length: int = 6):
    ids = torch.randint(3, 90, (rows, length), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding (decoder-only) / padded source positions (encoder-decoder)
    return ids, mask


@pytest.mark.parametrize("family", ONNX_FAMILIES)
def test_onnx_greedy_and_beam_search_with_pruned_ffns_give_generates_tokens(family, tmp_path):
    """The KV-cache graph's greedy loop and the ONNX Runtime beam search (`beam_generate`) over a model with an
    emptied FFN and a one-neuron FFN give `generate`'s tokens."""
    from prunetrain.export.onnx import greedy_generate
    from prunetrain.export.onnx_beam import beam_generate

    model = shrunk(family, **INIT[family])
    export(model, tmp_path / "onnx", "onnx")
    ids, mask = _source_ids()
    start = model.generation_config.decoder_start_token_id
    with torch.no_grad():
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                                do_sample=False, num_beams=1, use_cache=True, pad_token_id=1)
    assert torch.equal(greedy_generate(tmp_path / "onnx", ids, mask, 8, decoder_start_token_id=start), greedy)
    eos = int(torch.mode(greedy[:, -6:].flatten()).values)  # a token greedy picks often: beams end at many lengths
    finished_early = 0
    for settings in ({}, {"length_penalty": 0.6}, {"early_stopping": True}):
        kwargs = {"num_beams": 4, "eos_token_id": eos, **settings}
        with torch.no_grad():
            want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                  use_cache=True, pad_token_id=1, **kwargs)
        got = beam_generate(tmp_path / "onnx", ids, mask, 8, pad_token_id=1, **kwargs)
        assert torch.equal(got, want), (settings, got, want)
        finished_early += int((want[:, -1] == 1).sum())  # rows padded after their EOS
    assert finished_early > 0


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_onnx_beam_search_operator_with_pruned_ffns_gives_generates_hypotheses(family, tmp_path):
    """The `BeamSearch` operator over the export's subgraphs (written and checked by the export) on a model with
    an emptied FFN, a one-neuron FFN and pruned heads: `generate(num_beams=4)`'s hypotheses."""
    from prunetrain.export.onnx_beam import BeamSettings
    from prunetrain.export.onnx_beam_op import FILE, OrtBeamSearch

    model = shrunk(family, seed=5, **INIT[family])
    export(model, tmp_path / "onnx", "onnx")
    assert (tmp_path / "onnx" / FILE).is_file()
    runner = OrtBeamSearch(tmp_path / "onnx")
    ids, mask = _source_ids(rows=6, length=7)
    pad = model.config.pad_token_id
    with torch.no_grad():
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                eos_token_id=None, suppress_tokens=[pad])[:, 1:]
    eos = int(torch.mode(greedy[:, 2:].flatten()).values)
    ended = 0
    for settings in ({}, {"length_penalty": 0.6}, {"num_beams": 3}):
        kwargs = {"num_beams": 4, "eos_token_id": eos, "early_stopping": True, "suppress_tokens": [pad], **settings}
        with torch.no_grad():
            want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, **kwargs)
        got = runner.generate(ids, mask, 12, BeamSettings.from_generation_config(model.generation_config, **kwargs))
        for g, w in zip(got, want):
            if (g == eos).any() and (w == eos).any():  # both ended in EOS (not cut at the length limit)
                ended += 1
                assert torch.equal(g[:len(w)], w) and (g[len(w):] == w[-1]).all(), (settings, g, w)
    assert ended >= 6
