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
        self.config = SimpleNamespace(model_type=model_type, vocab_size=vocab, is_encoder_decoder=False)
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


def test_discovery_refuses_supported_types_and_models_without_sites():
    from prunetrain.zoo import tiny_model

    with pytest.raises(ValueError, match=r"model_type 'llama' already has an adapter"):
        discover_adapter(tiny_model("llama"))
    plain = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    plain.config = SimpleNamespace(model_type="no-attention", vocab_size=10)
    with pytest.raises(ValueError, match="discovery found no module in Sequential with a head count"):
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
