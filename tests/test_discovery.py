"""Structural discovery on model classes that no adapter names: CTRL (a transformers model type prunetrain has no
adapter for) and small custom `nn.Module` models with a `config`, with fused projections in two layouts, and one
whose attention normalises across all heads (the self-check must refuse it and name the module)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers as tf
from torch import nn

import prunetrain as pt
from prunetrain.engine.families import discover_adapter, supported_model_types, unregister
from prunetrain.engine.registry import adapter_for
from prunetrain.zoo import random_mask


@pytest.fixture
def registry():
    """Adapters registered by a test are removed after it (the registry is process-wide)."""
    before = set(pt.supported_families())
    yield
    for name in set(pt.supported_families()) - before:
        unregister(name)


def _ctrl():
    torch.manual_seed(0)
    config = tf.CTRLConfig(vocab_size=50, n_embd=32, n_layer=2, n_head=4, dff=64, resid_pdrop=0.0, embd_pdrop=0.0,
                           n_positions=64, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    return tf.CTRLLMHeadModel(config).eval()


def test_ctrl_is_discovered_proven_and_then_pruned_exactly(registry):
    model = _ctrl()
    assert "ctrl" not in supported_model_types()
    with pytest.raises(ValueError, match="is not supported"):
        pt.find_heads(model)
    adapter = discover_adapter(model)
    assert adapter.proposal.projections == ("Wq", "Wk", "Wv") and adapter.proposal.out == "dense"
    layout = pt.find_heads(model)
    assert [s.name for s in layout] == ["transformer.h.0.multi_head_attention", "transformer.h.1.multi_head_attention"]
    assert all(s.num_heads == 4 and s.head_dim == 8 for s in layout)

    ids = torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = random_mask(model, seed=1, soft=True, empty_site=0)
    reference = _ctrl()
    with torch.no_grad(), mask.applied(model):
        masked = model(ids).logits
        expected = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    pt.shrink(model, mask)
    assert pt.find_heads(model).total_heads == mask.num_kept
    with torch.no_grad():
        assert (model(ids).logits - masked).abs().max() <= 1e-5
        assert torch.equal(model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False), expected)
        assert not torch.equal(reference(ids).logits, masked)  # the mask did something


class _Attention(nn.Module):
    """A hand-written attention: fused qkv in `[q | k | v]` blocks or interleaved per head, or separate q/k/v; with
    `norm_all`, queries are layer-normalised over all heads at once (what OLMo 2 does)."""

    def __init__(self, width, heads, layout, norm_all=False):
        super().__init__()
        self.n_heads, self.d, self.layout, self.norm_all = heads, width // heads, layout, norm_all
        if layout == "separate":
            self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        else:
            self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, _ = x.shape
        w = self.n_heads * self.d
        if self.layout == "separate":
            q, k, v = self.query(x), self.key(x), self.value(x)
        elif self.layout == "blocks":
            qkv = self.qkv(x)
            q, k, v = qkv[..., :w], qkv[..., w:2 * w], qkv[..., 2 * w:]
        else:  # interleaved: [B, T, H, 3, d]
            qkv = self.qkv(x).view(b, t, self.n_heads, 3, self.d)
            q, k, v = (qkv[..., i, :].reshape(b, t, w) for i in range(3))
        if self.norm_all:
            q = nn.functional.layer_norm(q, q.shape[-1:])
        q, k, v = (z.view(b, t, -1, self.d).transpose(1, 2) for z in (q, k, v))
        heads = torch.softmax(q @ k.transpose(-1, -2) / self.d ** 0.5, dim=-1) @ v
        return self.proj(heads.transpose(1, 2).reshape(b, t, -1))


class _TinyModel(nn.Module):
    def __init__(self, model_type, layout, norm_all=False, width=32, heads=4, layers=2, vocab=40):
        super().__init__()
        self.config = SimpleNamespace(model_type=model_type, vocab_size=vocab, is_encoder_decoder=False,
                                      norm_all=norm_all, width=width, heads=heads)
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_Attention(width, heads, layout, norm_all) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


@pytest.mark.parametrize("layout", ["separate", "blocks", "interleaved"])
def test_custom_models_with_separate_and_fused_projections_are_discovered(layout, registry):
    torch.manual_seed(0)
    model = _TinyModel(f"tiny-{layout}", layout).eval()
    adapter = discover_adapter(model)
    assert adapter.proposal.fused_layout == ("" if layout == "separate" else layout)
    assert pt.find_heads(model).total_heads == 8
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = random_mask(model, seed=3, soft=True, empty_site=1)
    with torch.no_grad(), mask.applied(model):
        masked = model(ids)
    pt.shrink(model, mask)
    with torch.no_grad():
        assert (model(ids) - masked).abs().max() <= 1e-5


def test_a_norm_across_all_heads_fails_the_self_check_and_names_the_module(registry):
    torch.manual_seed(0)
    model = _TinyModel("tiny-norm-all", "separate", norm_all=True).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"discovered site 'blocks\.0' \(_Attention, heads from 'n_heads', "
                                         r"projections \['query', 'key', 'value'\] -> 'proj'\) failed its "
                                         r"self-check: masked and shrunk outputs differ by max \|Δ\| = "):
        discover_adapter(model)
    assert "tiny-norm-all" not in supported_model_types()  # nothing registered
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # checks ran on copies


def test_an_adapter_is_proven_again_on_a_model_of_another_configuration(registry):
    """Discovered on one configuration, the adapter is re-proven before it touches a model of the same type with
    another one: with a norm across all heads there it is refused, naming the site, and nothing is changed; a model
    of the configuration it was proven on is not checked again."""
    torch.manual_seed(0)
    discover_adapter(_TinyModel("tiny-configs", "separate").eval())
    other = _TinyModel("tiny-configs", "separate", norm_all=True).eval()
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"the adapter discovered for model_type 'tiny-configs' was proven on another "
                                         r"configuration and is not exact on this one: site 'blocks\.0' failed its "
                                         r"self-check \(masked and shrunk outputs differ"):
        pt.find_heads(other)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in before.items())
    with pytest.raises(ValueError, match="not exact on this one"):  # refused every time, not only once
        pt.find_heads(other)
    wider = _TinyModel("tiny-configs", "separate", width=48, heads=6).eval()  # another configuration, still exact
    assert pt.find_heads(wider).total_heads == 12
    assert len(adapter_for(wider).proven) == 2  # proven on both, refused on the third


def test_discovery_refuses_supported_types_and_models_without_sites():
    from prunetrain.zoo import tiny_model

    with pytest.raises(ValueError, match=r"model_type 'llama' already has an adapter"):
        discover_adapter(tiny_model("llama"))
    plain = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    plain.config = SimpleNamespace(model_type="no-attention", vocab_size=10)
    with pytest.raises(ValueError, match="discovery found no module in Sequential whose Linear layers run as q/k/v"):
        discover_adapter(plain, {"input": torch.zeros(1, 3, dtype=torch.long)})


def test_the_documented_hand_written_adapter_works(registry):
    """The example in prunetrain.engine.families.core's docstring, verbatim in substance: CTRL in a few lines."""
    from prunetrain.engine.families import LinearAttentionAdapter, register

    @register
    class CTRLAdapter(LinearAttentionAdapter):
        name = "ctrl"
        model_types = ("ctrl",)
        module_classes = ("MultiHeadAttention",)
        q, k, v, out = "Wq", "Wk", "Wv", "dense"
        head_dim_attr = "head_dim"
        count_attrs = ("num_heads",)

        def original_num_heads(self, model, kind):
            return model.config.n_head

    model = _ctrl()
    ids = torch.randint(3, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = random_mask(model, seed=2, soft=True, empty_site=1)
    with torch.no_grad(), mask.applied(model):
        masked = model(ids).logits
    pt.shrink(model, mask)
    assert pt.find_heads(model).family == "ctrl"
    with torch.no_grad():
        assert (model(ids).logits - masked).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# discovery that cannot be fooled and that travels (issue 24, seam 3)
# ---------------------------------------------------------------------------------------------------------------------
from prunetrain.engine.families.discovery_check import perturbed_copy  # noqa: E402

_TOKENS = dict(vocab_size=96, pad_token_id=1, bos_token_id=0, eos_token_id=2)


def _model(model_type: str):
    """Tiny models of transformers model types no adapter names (configs only, no downloads)."""
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, **_TOKENS)
    build = {
        "cohere": lambda: tf.CohereForCausalLM(tf.CohereConfig(**small, num_key_value_heads=2, use_qk_norm=True)),
        "helium": lambda: tf.HeliumForCausalLM(tf.HeliumConfig(**small, num_key_value_heads=2, head_dim=8)),
        "stablelm": lambda: tf.StableLmForCausalLM(tf.StableLmConfig(**small, num_key_value_heads=2,
                                                                     qk_layernorm=True)),
        "roformer": lambda: tf.RoFormerForMaskedLM(tf.RoFormerConfig(**small, embedding_size=32)),
        "esm": lambda: tf.EsmForMaskedLM(tf.EsmConfig(**{**small, "vocab_size": 33}, mask_token_id=32,
                                                      position_embedding_type="rotary")),
        "xglm": lambda: tf.XGLMForCausalLM(tf.XGLMConfig(d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
                                                         max_position_embeddings=64, **_TOKENS)),
        "gptj": lambda: tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                                         n_positions=64, **_TOKENS)),
        "umt5": lambda: tf.UMT5ForConditionalGeneration(tf.UMT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                                      num_heads=4, decoder_start_token_id=0,
                                                                      **_TOKENS)),
        # 8 heads on CodeGen's 4 model-parallel shards: its fused projection holds two heads' q, then v, then k per
        # shard (with 4 heads, one per shard, it is per head, and transformers ≥ 5.24's CodeGen is then exact)
        "codegen": lambda: tf.CodeGenForCausalLM(tf.CodeGenConfig(n_embd=64, n_layer=2, n_head=8, rotary_dim=4,
                                                                  n_positions=64, **_TOKENS)),
        "bloom": lambda: tf.BloomForCausalLM(tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **_TOKENS)),
        "olmoe": lambda: tf.OlmoeForCausalLM(tf.OlmoeConfig(**small, num_key_value_heads=2, num_experts=4,
                                                            num_experts_per_tok=2)),
    }[model_type]
    torch.manual_seed(0)
    model = build()
    model.config._attn_implementation = "eager"
    return model.eval()


EXACT = ["cohere", "helium", "stablelm", "roformer", "esm", "xglm", "gptj", "umt5"]


@pytest.mark.parametrize("model_type", EXACT)
def test_model_types_no_adapter_names_are_discovered_and_pruned_exactly_after_training(model_type, registry):
    """Discovered on the freshly built model (as a user would), then its norms, scales and biases move as training
    moves them (`perturbed_copy`): masked == shrunk for a soft mask with a site left without heads, and cached
    greedy generation of the decoder-only ones is identical. Covers per-head q/k norms (Cohere: [heads, head_dim]
    weights; StableLM: one LayerNorm per head), head counts only in the config (Cohere, Helium), BERT-style output
    projections in a sibling module (RoFormer, ESM), a width attribute (XGLM's embed_dim) and a per-layer
    position-bias table with a column per head (UMT5)."""
    model = _model(model_type)
    assert model_type not in supported_model_types()
    layout = pt.find_heads(model, discover=True)
    assert layout.total_heads == (24 if model_type == "umt5" else 8) and layout.family == f"discovered:{model_type}"
    trained = perturbed_copy(model, seed=1)
    inputs = {"input_ids": torch.randint(3, 30, (2, 7), generator=torch.Generator().manual_seed(2))}
    if trained.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :5]
    mask = random_mask(trained, seed=3, soft=True, empty_site=0)
    generating = isinstance(trained, tf.GenerationMixin) and not trained.config.is_encoder_decoder
    with torch.no_grad(), mask.applied(trained):
        masked = trained(**inputs).logits
        if generating:
            expected = trained.generate(inputs["input_ids"], max_new_tokens=4, do_sample=False)
    pt.shrink(trained, mask)
    with torch.no_grad():
        assert (trained(**inputs).logits - masked).abs().max() <= 1e-5
        if generating:
            assert torch.equal(trained.generate(inputs["input_ids"], max_new_tokens=4, do_sample=False), expected)
    with torch.no_grad():  # the mask did something
        assert not torch.allclose(perturbed_copy(model, seed=1)(**inputs).logits, masked)


@pytest.mark.parametrize("model_type, reason", [
    ("codegen", r"site 'transformer\.h\.0\.attn' \(CodeGenAttention, heads from 'num_attention_heads', projections "
                r"\['qkv_proj'\] -> 'out_proj'\) cannot be pruned exactly: its fused projection 'qkv_proj' is laid "
                r"out neither as \[q \| k \| v\] blocks nor per head as \[heads, 3, head_dim\]"),
    ("bloom", r"site 'transformer\.h\.0\.self_attention' \(BloomAttention, .*\) cannot be pruned exactly: the model "
              r"hands the site 'alibi' of shape \(8, 1, 7\), a per-head tensor built outside it for all 4 heads "
              r"\(e\.g\. ALiBi position biases\)"),
    ("olmoe", r"site 'model\.layers\.0\.self_attn' \(OlmoeAttention, heads from 'head_dim', .*\) cannot be pruned "
              r"exactly: its parameter 'q_norm\.weight' of shape \(32,\) spans all 4 heads"),
])
def test_model_types_that_cannot_be_pruned_exactly_are_refused_with_the_reason(model_type, reason, registry):
    model = _model(model_type)
    with pytest.raises(ValueError, match=reason):
        pt.find_heads(model, discover=True)
    assert model_type not in supported_model_types()  # nothing registered


class _ScaledHeads(_Attention):
    """Heads scaled by a table read by position (`scale[:heads]`): all ones when built, so removing heads changes
    nothing then; once trained, a shrunk head reads another head's scale."""

    def __init__(self, width, heads):
        super().__init__(width, heads, "separate")
        self.scale = nn.Parameter(torch.ones(2 * heads))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z(x).view(b, t, -1, self.d).transpose(1, 2) for z in (self.query, self.key, self.value))
        heads = torch.softmax(q @ k.transpose(-1, -2) / self.d ** 0.5, dim=-1) @ v
        heads = heads * self.scale[: heads.shape[1], None, None]
        return self.proj(heads.transpose(1, 2).reshape(b, t, -1))


def test_the_self_check_perturbs_parameters_so_identity_initialised_ones_cannot_hide_a_dependency(registry):
    """At initialisation this model passes every masked == shrunk comparison; discovery refuses it because it checks
    on a copy whose non-Linear parameters were moved off their initial values."""
    model = _TinyModel("tiny-scaled", "separate").eval()
    model.blocks = nn.ModuleList(_ScaledHeads(32, 4) for _ in range(2))
    with pytest.raises(ValueError, match=r"discovered site 'blocks\.0' \(_ScaledHeads, heads from 'n_heads', "
                                         r"projections \['query', 'key', 'value'\] -> 'proj'\) .*masked and shrunk "
                                         r"outputs differ by max \|Δ\| = "):
        discover_adapter(model)
    assert "tiny-scaled" not in supported_model_types()


def test_find_heads_discovers_only_when_asked(registry, caplog):
    model = _model("helium")
    with pytest.raises(ValueError, match=r"model_type='helium'\) is not supported; .* Let prunetrain discover one "
                                         r"from the model's structure \(find_heads\(model, discover=True\)"):
        pt.find_heads(model)
    with caplog.at_level("WARNING", logger="prunetrain"):
        layout = pt.find_heads(model, discover=True)
    notices = [r.getMessage() for r in caplog.records if "discovered one" in r.getMessage()]
    assert notices == ["prunetrain: no adapter names model_type 'helium'; discovered one from its structure "
                       "(HeliumAttention: q_proj/k_proj/v_proj -> o_proj, heads from head_dim; FFN neurons: "
                       "HeliumMLP: gate_proj/up_proj -> down_proj (width 64)) and proved it exact on a probe input."]
    assert pt.find_heads(model) == layout  # registered: plain calls (and the callbacks) find the heads now


_FRESH = r"""
import json, sys, torch
import prunetrain as pt
from prunetrain.engine.families import supported_model_types
assert "gptj" not in supported_model_types()
case = torch.load(sys.argv[1], weights_only=True)
out = {}
for name in ("saved", "save_pretrained"):
    model = pt.load_pruned(case[name])
    with torch.no_grad():
        out[name] = torch.equal(model(case["input_ids"]).logits, case["logits"])
    out[name + "_family"] = pt.find_heads(model).family
print("RESULT " + json.dumps(out))
"""


def test_a_discovered_adapter_travels_with_the_pruned_directory(tmp_path, registry):
    """A fresh process that never ran discovery: load_pruned and `prunetrain export` read the description from the
    directory (its FFN neurons too: heads and neurons were shrunk, one FFN emptied); plain transformers loads its
    remote code without prunetrain."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO, run_cli

    model = _model("gptj")
    layout = pt.find_sites(model, discover=True)
    assert [s.kind for s in layout] == ["self", "ffn", "self", "ffn"]
    pt.shrink(model, random_mask(layout, seed=5, soft=True, empty_site=1))  # the first FFN emptied
    assert pt.find_sites(model).neurons_per_kind()["ffn"] < 2 * 128
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = model(ids).logits
    pt.save_pruned(model, tmp_path / "saved")
    model.save_pretrained(tmp_path / "save_pretrained")
    torch.save({"saved": str(tmp_path / "saved"), "save_pretrained": str(tmp_path / "save_pretrained"),
                "input_ids": ids, "logits": logits}, tmp_path / "case.pt")
    run = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "case.pt")], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, run.stderr[-3000:]
    assert json.loads(line.removeprefix("RESULT ")) == {"saved": True, "saved_family": "discovered:gptj",
                                                         "save_pretrained": True,
                                                         "save_pretrained_family": "discovered:gptj"}
    check = run_cli("export", "--check", tmp_path / "saved")
    assert check.returncode == 0 and json.loads(check.stdout)["formats"]["remote-code"] == {"possible": True}
    remote = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "save_pretrained", trust_remote_code=True)
    assert type(remote).__module__.endswith("modeling_prunetrain")  # the directory's own code, no adapter needed
    with torch.no_grad():
        assert torch.equal(remote.eval()(ids).logits, logits)


# ---------------------------------------------------------------------------------------------------------------------
# FFN neurons found and proven beside the heads (issue 62)
# ---------------------------------------------------------------------------------------------------------------------
FFN_SHAPES = {
    "cohere": "CohereMLP: gate_proj/up_proj -> down_proj (width 64)",
    "helium": "HeliumMLP: gate_proj/up_proj -> down_proj (width 64)",
    "stablelm": "StableLmMLP: gate_proj/up_proj -> down_proj (width 64)",
    "roformer": "RoFormerLayer: intermediate.dense -> output.dense (width 64)",  # BERT's sibling modules
    "esm": "EsmLayer: intermediate.dense -> output.dense (width 64)",
    "xglm": "XGLMDecoderLayer: fc1 -> fc2 (width 64)",
    "gptj": "GPTJMLP: fc_in -> fc_out (width 128)",
    "umt5": "UMT5DenseGatedActDense: wi_0/wi_1 -> wo (width 64)",
    "ctrl": "Sequential: 0 -> 2 (width 64)",
}


@pytest.mark.parametrize("model_type", list(FFN_SHAPES))
def test_ffn_neurons_of_discovered_types_are_found_and_pruned_exactly_with_the_heads(model_type, registry):
    """Discovery proposes each model type's FFN (plain, gated, BERT's two sibling modules, a Sequential), proves it,
    and the neurons then shrink exactly with the heads after training moved the norms and biases: masked == shrunk
    with one FFN emptied, and the FFN widths the config gives."""
    model = _ctrl() if model_type == "ctrl" else _model(model_type)
    adapter = discover_adapter(model)
    assert [p.describe() for p in adapter.ffn_proposals] == [FFN_SHAPES[model_type]] and adapter.ffn_refusal is None
    trained = perturbed_copy(model, seed=1)
    layout = pt.find_sites(trained)
    ffn = [s for s in layout if s.unit == "neurons"]
    assert len(ffn) == (4 if model_type == "umt5" else 2)  # umt5: 2 encoder and 2 decoder layers
    empty = next(i for i, s in enumerate(layout) if s.unit == "neurons")
    mask = random_mask(layout, seed=3, soft=True, empty_site=empty)
    inputs = {"input_ids": torch.randint(3, 30, (2, 7), generator=torch.Generator().manual_seed(2))}
    if trained.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :5]
    with torch.no_grad(), mask.applied(trained):
        masked = trained(**inputs).logits
    pt.shrink(trained, mask)
    assert pt.find_sites(trained).total_neurons == mask.num_kept_neurons
    with torch.no_grad():
        assert (trained(**inputs).logits - masked).abs().max() <= 1e-5


class _NormedFFN(nn.Module):
    """An FFN that layer-normalises its hidden features (NormFormer): no neuron can go alone."""

    def __init__(self, width):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(width, 2 * width), nn.LayerNorm(2 * width), nn.Linear(2 * width,
                                                                                                           width)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


class _TinyModelWithFFN(_TinyModel):
    def __init__(self, model_type, normed):
        super().__init__(model_type, "separate")
        self.mlps = nn.ModuleList(_NormedFFN(32) if normed else nn.Sequential(nn.Linear(32, 64), nn.GELU(),
                                                                                nn.Linear(64, 32)) for _ in range(2))

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block, mlp in zip(self.blocks, self.mlps):
            x = x + block(x)
            x = x + mlp(x)
        return self.head(x)


def test_an_ffn_whose_norm_spans_its_neurons_is_refused_and_the_heads_stay_prunable(registry):
    torch.manual_seed(0)
    model = _TinyModelWithFFN("tiny-normed-ffn", normed=True).eval()
    adapter = discover_adapter(model, {"input_ids": torch.randint(0, 40, (2, 7))})
    assert adapter.ffn is None and "failed the self-check" in adapter.ffn_refusal
    assert "_NormedFFN: fc1 -> fc2 (width 64)" in adapter.ffn_refusal
    assert pt.find_heads(model).total_heads == 8
    with pytest.raises(ValueError, match=r"^model: the FFN neurons of _TinyModelWithFFN cannot be pruned: discovery "
                                         r"found its FFNs \(_NormedFFN: fc1 -> fc2 \(width 64\)\) but the FFN at "
                                         r"'mlps\.0\.fc2' failed the self-check"):
        pt.find_neurons(model)


def test_a_sequential_ffn_host_is_named_by_its_attribute_so_other_sequentials_are_not_taken(registry):
    torch.manual_seed(0)
    model = _TinyModelWithFFN("tiny-sequential-ffn", normed=False).eval()
    adapter = discover_adapter(model, {"input_ids": torch.randint(0, 40, (2, 7))})
    [proposal] = adapter.ffn_proposals
    assert proposal.module_class == "Sequential" and proposal.leaf_names == ("0", "1")  # mlps.0, mlps.1
    model.extra = nn.Sequential(nn.Linear(32, 32))  # another Sequential, never called: not an FFN
    assert [s.name for s in pt.find_neurons(model)] == ["mlps.0.2", "mlps.1.2"]
