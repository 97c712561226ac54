"""find_heads: every attention site of every supported family, with its kind, layer and head geometry."""

import pytest
import torch
import transformers as tf

import prunetrain as pt
from prunetrain.zoo import TINY_FAMILIES, tiny_model

EXPECTED_KINDS = {
    "bert": {"self": 2}, "roberta": {"self": 2}, "gpt2": {"self": 2}, "llama": {"self": 2}, "qwen2": {"self": 2},
    "mistral": {"self": 2}, "marian": {"encoder_self": 2, "decoder_self": 2, "cross": 2},
    "bart": {"encoder_self": 2, "decoder_self": 2, "cross": 2}, "t5": {"encoder_self": 2, "decoder_self": 2, "cross": 2},
}


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_sites_kinds_layers_and_geometry(family):
    model = tiny_model(family)
    layout = pt.find_heads(model)
    counts = {}
    for site in layout:
        counts[site.kind] = counts.get(site.kind, 0) + 1
        assert site.num_heads == 4 and site.original_num_heads == 4 and site.head_dim == 8
        assert site.heads == (0, 1, 2, 3)
        gqa = family in ("llama", "qwen2", "mistral")
        assert site.num_kv_heads == (2 if gqa else 4) and site.group_size == (2 if gqa else 1)
        assert isinstance(model.get_submodule(site.name), torch.nn.Module)  # the name is a real module path
    assert counts == EXPECTED_KINDS[family]
    for kind in counts:  # layers 0 and 1 of each kind, in module order
        assert [s.layer for s in layout if s.kind == kind] == [0, 1]
    assert layout.total_heads == 4 * len(layout)
    assert pt.HeadLayout.from_dict(layout.to_dict()) == layout


def test_cross_sites_are_decoder_encoder_attention():
    layout = pt.find_heads(tiny_model("marian"))
    assert [s.name for s in layout if s.kind == "cross"] == [
        "model.decoder.layers.0.encoder_attn", "model.decoder.layers.1.encoder_attn"]
    assert [s.name for s in layout if s.kind == "encoder_self"][0] == "model.encoder.layers.0.self_attn"
    t5 = pt.find_heads(tiny_model("t5"))
    assert [s.name for s in t5 if s.kind == "cross"][0] == "decoder.block.0.layer.1.EncDecAttention"


def test_same_layout_for_bare_and_headed_models_and_other_sizes():
    cfg = tf.BertConfig(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=32,
                        vocab_size=50)
    layout = pt.find_heads(tf.BertForSequenceClassification(cfg))
    assert len(layout) == 3 and {s.num_heads for s in layout} == {6} and {s.head_dim for s in layout} == {8}
    assert layout.names[0] == "bert.encoder.layer.0.attention"
    assert [s.name for s in pt.find_heads(tf.BertModel(cfg))][0] == "encoder.layer.0.attention"


@pytest.mark.parametrize("family", ["bert", "llama", "marian"])
def test_layout_independent_of_attention_backend(family):
    layouts = {impl: pt.find_heads(tiny_model(family, attn_implementation=impl))
               for impl in ("eager", "sdpa", "flex_attention")}
    assert layouts["eager"] == layouts["sdpa"] == layouts["flex_attention"]


def test_unsupported_model_is_a_clear_error():
    cfg = tf.CTRLConfig(vocab_size=50, n_embd=32, n_layer=1, n_head=4, dff=64)  # no adapter names CTRL
    with pytest.raises(ValueError, match=r"CTRLModel \(model_type='ctrl'\) is not supported; "
                                         r"supported model types: bert, roberta, .*llama.*discover_adapter"):
        pt.find_heads(tf.CTRLModel(cfg))
    with pytest.raises(ValueError, match="Linear .*is not supported"):
        pt.find_heads(torch.nn.Linear(2, 2))


def test_ddp_style_wrapper_is_unwrapped():
    model = tiny_model("bert")

    class Wrapper(torch.nn.Module):  # the shape of DDP / accelerate wrappers: `.module`, no `.config`
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert pt.find_heads(Wrapper(model)) == pt.find_heads(model)


def test_family_knowledge_stays_in_the_adapters():
    """No engine module outside `families/`, and no method or Trainer module, names a model type or adapter in its
    code (a string constant equal to one): what a family needs is an adapter attribute (`time_first`,
    `cache_kwargs`, `shrink_refusal`, ...)."""
    import ast
    from pathlib import Path

    import prunetrain
    from prunetrain.engine.families import supported_model_types

    names = set(supported_model_types()) | set(pt.supported_families()) | {"fairseq"}
    root = Path(prunetrain.__file__).parent
    files = [p for p in (root / "engine").glob("*.py")] + list((root / "methods").glob("*.py")) + list(
        (root / "training").glob("*.py"))
    offenders = []
    for path in files:
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        offenders += [f"{path.relative_to(root)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.lower() in names
                      and id(n) not in docstrings]
    assert len(files) > 10 and not offenders, offenders
