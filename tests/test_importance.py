"""Head importance scorers on real tiny models: Michel gradient importance against finite differences, ablation
against explicitly masked losses, confidence against `output_attentions`, plus HeadScores and argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from prunetrain import HeadMask, attached_masks, find_heads, shrink
from prunetrain.engine.heads import attention_sites
from prunetrain.methods.importance import (
    SCORERS,
    AblationScorer,
    GradientScorer,
    HeadScores,
    Scorer,
    ablation_scores,
    confidence_scores,
    get_scorer,
    head_importance,
    random_scores,
    register_scorer,
)
from prunetrain.zoo import SEQ2SEQ_FAMILIES, TINY_FAMILIES, tiny_inputs, tiny_model

CAUSAL = ("gpt2", "llama", "qwen2", "mistral")
EPS = 2.0 ** -12  # 1 - EPS and 1 - 2 EPS are exact in float32 (HeadMask stores float32 keep values)




def two_batches(family: str) -> list[dict]:
    """Two batches of different sizes, some labels ignored (-100), so token weighting matters."""
    a = tiny_inputs(family, batch=2, length=7, seed=0)
    b = tiny_inputs(family, batch=3, length=6, seed=1)
    b["labels"][1, -2:] = -100
    return [a, b]


def n_tokens(family: str, batch: dict) -> int:
    labels = batch["labels"][:, 1:] if family in CAUSAL else batch["labels"]
    return int((labels != -100).sum())


def model_loss(model, batch):
    return model(**batch).loss


def causal_loss64(model, batch):
    """Token cross-entropy of a causal LM computed in the logits' dtype (HF's own loss upcasts to float32 only, which
    is float32 even for a float64 model), returned as (mean, n) for `loss_fn`."""
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100)
    return loss, int((labels != -100).sum())


def loss_with(model, batch, mask: HeadMask, loss=model_loss) -> float:
    with mask.applied(model), torch.no_grad():
        value = loss(model, batch)
        return float(value[0] if isinstance(value, tuple) else value)


def fd_gradient(model, batch, loss=model_loss) -> dict[str, torch.Tensor]:
    """∂L/∂ξ_h at ξ = 1 by one-sided second-order finite differences, f'(1) ≈ (3f(1) - 4f(1-ε) + f(1-2ε)) / 2ε
    (float64 model; one-sided because keep values live in [0, 1])."""
    layout = find_heads(model)
    f0 = loss_with(model, batch, HeadMask(layout), loss)
    out = {}
    for site in layout:
        grad = torch.zeros(site.num_heads, dtype=torch.float64)
        for h in range(site.num_heads):
            f1, f2 = HeadMask(layout), HeadMask(layout)
            f1.set(site.name, h, 1 - EPS)
            f2.set(site.name, h, 1 - 2 * EPS)
            grad[h] = (3 * f0 - 4 * loss_with(model, batch, f1, loss) + loss_with(model, batch, f2, loss)) / (2 * EPS)
        out[site.name] = grad
    return out


def explicit_gradient(model, batch, loss=model_loss) -> dict[str, torch.Tensor]:
    """∂L/∂ξ_h at ξ = 1 by the chain rule on the unmasked model: with x the input of the output projection (head h
    is its slice x_h), ∂L/∂ξ_h = Σ_{b,t} <x_h, ∂L/∂x_h>. For T5 and Llama, whose RMSNorm computes in float32 even in a
    float64 model, so that finite differences drown in rounding noise."""
    sites = attention_sites(model)
    seen = {}

    def keep(name):
        def hook(module, args):
            args[0].retain_grad()
            seen[name] = args[0]
        return hook

    handles = [s.out_proj.register_forward_pre_hook(keep(s.info.name)) for s in sites]
    try:
        value = loss(model, batch)
        (value[0] if isinstance(value, tuple) else value).backward()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    out = {}
    for s in sites:
        x = seen[s.info.name]
        prod = (x * x.grad).unflatten(-1, (s.info.num_heads, s.info.head_dim))  # [B, T, H, d]
        out[s.info.name] = prod.sum(dim=(0, 1, 3)).detach().double()
    return out


REFERENCE = {"fd": fd_gradient, "explicit": explicit_gradient}


def assert_scores_close(actual: HeadScores, expected: dict[str, torch.Tensor], rtol=1e-4) -> None:
    scale = max(float(v.abs().max()) for v in expected.values())
    assert scale > 0
    for name, want in expected.items():
        torch.testing.assert_close(actual[name], want, rtol=rtol, atol=1e-6 * scale, msg=name)


# --- gradient importance ------------------------------------------------------------------------------------------
CASES = [("marian", "fd"), ("bert", "fd"), ("gpt2", "fd"), ("t5", "explicit"), ("llama", "explicit"),
         ("marian", "explicit")]


@pytest.mark.parametrize("family,method", CASES)
def test_per_batch_importance_equals_a_reference_gradient(family, method):
    """Seq2seq, encoder and decoder-only families (incl. GQA). Decoder-only LMs use a float64 custom loss: HF's
    causal-LM loss runs in float32 even in a float64 model."""
    model = tiny_model(family).double()
    batches = two_batches(family)
    loss = causal_loss64 if family in CAUSAL else model_loss
    loss_fn = causal_loss64 if family in CAUSAL else None
    expected = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in find_heads(model)}
    total = 0
    for batch in batches:
        n = n_tokens(family, batch)
        for name, grad in REFERENCE[method](model, batch, loss).items():
            expected[name] += n * grad.abs()  # |∂S_b/∂ξ| with S_b = n_b L_b the summed token loss
        total += n
    summed = head_importance(model, batches, normalize=None, reduction="sum", loss_fn=loss_fn)
    assert_scores_close(summed, expected)
    mean = head_importance(model, batches, normalize=None, loss_fn=loss_fn)
    assert_scores_close(mean, {k: v / total for k, v in expected.items()})
    assert mean.meta["tokens"] == total and mean.meta["batches"] == 2


@pytest.mark.parametrize("family,method", [("marian", "fd"), ("bert", "fd"), ("gpt2", "fd"), ("llama", "explicit")])
def test_per_example_importance_equals_a_reference_gradient(family, method):
    model = tiny_model(family).double()
    batches = two_batches(family)
    loss = causal_loss64 if family in CAUSAL else model_loss
    loss_fn = causal_loss64 if family in CAUSAL else None
    expected = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in find_heads(model)}
    total = 0
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            example = {k: v[i: i + 1] for k, v in batch.items()}
            n = n_tokens(family, example)
            for name, grad in REFERENCE[method](model, example, loss).items():
                expected[name] += n * grad.abs()
            total += n
    scores = head_importance(model, batches, per="example", normalize=None, loss_fn=loss_fn)
    assert_scores_close(scores, {k: v / total for k, v in expected.items()})
    per_batch = head_importance(model, batches, per="batch", normalize=None, loss_fn=loss_fn)
    assert not per_batch.allclose(scores)  # |Σ_x g_x| < Σ_x |g_x|: the two expectations really differ


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_causal_lm_own_loss_weights_batches_by_shifted_label_tokens(family):
    model = tiny_model(family)
    batches = two_batches(family)
    own = head_importance(model, batches, normalize=None)
    explicit = head_importance(model, batches, normalize=None, loss_fn=causal_loss64)
    assert own.allclose(explicit, rtol=1e-4, atol=0)
    assert own.meta["tokens"] == 2 * 6 + 3 * 5 - 2


def test_layer_normalization_divides_each_site_by_its_l2_norm():
    model = tiny_model("marian")
    batches = two_batches("marian")
    raw = head_importance(model, batches, normalize=None)
    normed = head_importance(model, batches)  # default: "layer", as Michel et al.'s code
    for name, values in raw.items():
        torch.testing.assert_close(normed[name], values / values.norm())
        assert math.isclose(float(normed[name].norm()), 1.0, rel_tol=1e-12)
    assert normed.meta["normalize"] == "layer" and raw.meta["normalize"] is None


def _zero_head(model, family: str, what: str, head: int):
    site = attention_sites(model)[0]
    d = site.info.head_dim
    cols = slice(head * d, (head + 1) * d)
    with torch.no_grad():
        if what == "out":  # o_h W_o^h = 0 exactly, and the gradient reaching head h's slice is g · W_o^h = 0
            site.out_proj.weight[:, cols] = 0
        else:  # value rows and bias: o_h = A_h V_h = 0 exactly
            path = {"marian": "v_proj", "bert": "self.value", "llama": "v_proj"}[family]
            value = site.module.get_submodule(path)
            rows = slice((head // site.info.group_size) * d, (head // site.info.group_size + 1) * d)
            value.weight[rows] = 0
            if value.bias is not None:
                value.bias[rows] = 0
    return site.info


@pytest.mark.parametrize("family,what", [("marian", "out"), ("marian", "value"), ("bert", "out"),
                                         ("bert", "value"), ("llama", "out"), ("llama", "value")])
@pytest.mark.parametrize("per", ["batch", "example"])
def test_head_with_zero_output_has_importance_exactly_zero(family, what, per):
    model = tiny_model(family)
    info = _zero_head(model, family, what, head=1)
    scores = head_importance(model, two_batches(family), per=per, normalize=None)
    zero = [1] if what == "out" or info.group_size == 1 else [0, 1]  # llama: value rows are shared by kv group 0
    values = scores[info.name]
    assert values[zero].eq(0).all(), values
    others = [h for h in range(info.num_heads) if h not in zero]
    assert (values[others] > 0).all(), values


def test_parameters_get_no_grad_and_flags_and_modes_are_restored():
    model = tiny_model("marian")
    model.model.shared.weight.requires_grad_(False)
    model.model.decoder.layers[1].fc1.bias.requires_grad_(False)
    model.train()
    model.model.encoder.layers[0].eval()
    flags = [p.requires_grad for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    for per in ("batch", "example"):
        head_importance(model, two_batches("marian"), per=per)
        assert all(p.grad is None for p in model.parameters())
        assert [p.requires_grad for p in model.parameters()] == flags
        assert [m.training for m in model.modules()] == modes
        assert attached_masks(model) == []
        assert all(not s.out_proj._forward_pre_hooks for s in attention_sites(model))


@pytest.mark.parametrize("per", ["batch", "example"])
def test_state_is_restored_when_the_loss_fails(per):
    model = tiny_model("bert").train()
    flags = [p.requires_grad for p in model.parameters()]

    def failing(model, batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        head_importance(model, two_batches("bert"), loss_fn=failing, per=per)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert model.training and attached_masks(model) == []
    assert all(not s.out_proj._forward_pre_hooks for s in attention_sites(model))


def test_custom_loss_fn_weights():
    model = tiny_model("marian")
    batches = two_batches("marian")
    own = head_importance(model, batches, normalize=None)
    with_counts = head_importance(model, batches, normalize=None,
                                  loss_fn=lambda m, b: (m(**b).loss, n_tokens("marian", b)))
    assert with_counts.allclose(own, rtol=1e-6)
    # a bare scalar weighs every batch 1: the mean over batches of |∂L_b/∂ξ|
    bare = head_importance(model, batches, normalize=None, loss_fn=lambda m, b: m(**b).loss)
    singles = [head_importance(model, [b], normalize=None, reduction="sum") for b in batches]
    for name in bare.values:
        expected = sum(s[name] / n_tokens("marian", b) for s, b in zip(singles, batches)) / 2
        torch.testing.assert_close(bare[name], expected)


def test_heads_removed_by_an_attached_mask_score_zero():
    model = tiny_model("gpt2")
    site = find_heads(model).names[1]
    with HeadMask.from_heads(model, {site: [0, 3]}).applied(model):
        grad = head_importance(model, two_batches("gpt2"), normalize=None)
        ablation = ablation_scores(model, two_batches("gpt2"))
    assert grad[site][[0, 3]].eq(0).all() and (grad[site][[1, 2]] > 0).all()
    assert ablation[site][[0, 3]].eq(0).all() and ablation[site][[1, 2]].ne(0).all()


def test_bf16_autocast_is_applied_and_close_to_fp32():
    model = tiny_model("marian")
    batches = two_batches("marian")
    fp32 = head_importance(model, batches, normalize=None).flat()
    bf16 = head_importance(model, batches, normalize=None, autocast=torch.bfloat16)
    assert not torch.equal(bf16.flat(), fp32)
    assert torch.corrcoef(torch.stack([bf16.flat(), fp32]))[0, 1] > 0.99
    assert bf16.meta["autocast"] == "torch.bfloat16"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_scores_every_head(family):
    model = tiny_model(family, attn_implementation="sdpa")
    scores = head_importance(model, two_batches(family))
    layout = find_heads(model)
    assert scores.layout == layout
    assert all(torch.isfinite(v).all() and (v > 0).all() for _, v in scores.items())
    confidence = confidence_scores(model, two_batches(family))
    assert all(((v > 0) & (v <= 1)).all() for _, v in confidence.items())
    assert model.config._attn_implementation == "sdpa"


def test_shrunk_model_scores_follow_its_layout():
    model = tiny_model("bart")
    name = find_heads(model).names[2]
    shrink(model, HeadMask.from_heads(model, {name: [1, 2]}))
    scores = head_importance(model, two_batches("bart"))
    assert scores[name].shape == (2,)
    matrix = scores.as_matrix()
    row = find_heads(model).names.index(name)
    assert matrix.shape == (len(scores.layout), 4)
    assert torch.isnan(matrix[row, 2:]).all() and not torch.isnan(matrix[row, :2]).any()
    assert not torch.isnan(matrix[:row]).any()


# --- ablation ---------------------------------------------------------------------------------------------------
def test_ablation_equals_the_masked_model_loss_change():
    model = tiny_model("bert")
    batches = two_batches("bert")
    scores = ablation_scores(model, batches)
    layout = find_heads(model)
    total = sum(n_tokens("bert", b) for b in batches)
    for site in layout:
        for h in range(site.num_heads):
            change = 0.0
            for b in batches:
                base = loss_with(model, b, HeadMask(layout))
                change += n_tokens("bert", b) * (loss_with(model, b, HeadMask.from_heads(layout, {site.name: [h]}))
                                                 - base)
            assert math.isclose(float(scores[site.name][h]), change / total, rel_tol=1e-5, abs_tol=1e-9)
    assert scores.flat().abs().max() > 0
    assert AblationScorer()(model, batches) == scores


# --- confidence -------------------------------------------------------------------------------------------------
def _mean_max(attentions, query_mask):
    """[(sum over real queries of max attention weight per head, count)] per layer."""
    keep = query_mask.float()[:, None, :]
    return [((a.amax(-1) * keep).sum((0, 2)).double(), float(keep.sum())) for a in attentions]


@pytest.mark.parametrize("family", ["bert", "marian"])
def test_confidence_equals_mean_max_attention_from_output_attentions(family):
    model = tiny_model(family, attn_implementation="sdpa")
    batches = two_batches(family)
    scores = confidence_scores(model, batches)
    assert model.config._attn_implementation == "sdpa"  # switched to eager only while scoring
    reference = tiny_model(family)  # eager, same weights (same seed)
    sums: dict[str, list] = {}
    layout = find_heads(model)
    for b in batches:
        with torch.no_grad():
            out = reference(**b, output_attentions=True)
        if family in SEQ2SEQ_FAMILIES:
            dec = b["labels"] != -100
            groups = {"encoder_self": _mean_max(out.encoder_attentions, b["attention_mask"]),
                      "decoder_self": _mean_max(out.decoder_attentions, dec),
                      "cross": _mean_max(out.cross_attentions, dec)}
        else:
            groups = {"self": _mean_max(out.attentions, b["attention_mask"])}
        for site in layout:
            total, count = groups[site.kind][site.layer]
            acc = sums.setdefault(site.name, [0, 0.0])
            acc[0], acc[1] = acc[0] + total, acc[1] + count
    for name, (total, count) in sums.items():
        torch.testing.assert_close(scores[name], total / count, rtol=1e-6, atol=1e-9)


def test_confidence_lies_between_one_over_t_and_one():
    for family in ("marian", "llama", "t5"):
        batches = two_batches(family)
        scores = confidence_scores(tiny_model(family), batches)
        longest = max(max(b["input_ids"].shape[1], b["labels"].shape[1]) for b in batches)
        flat = scores.flat()
        assert (flat >= 1 / longest).all() and (flat <= 1).all()
        assert flat.max() < 1  # random weights: no head is fully confident on every token


# --- random and the registry ------------------------------------------------------------------------------------
def test_random_scores_are_seeded():
    model = tiny_model("llama")
    assert random_scores(model, seed=3) == random_scores(find_heads(model), seed=3)
    assert not torch.equal(random_scores(model, seed=3).flat(), random_scores(model, seed=4).flat())
    assert get_scorer("random", seed=3)(model, None) == random_scores(model, seed=3)


def test_scorer_registry_and_protocol():
    assert set(SCORERS) >= {"gradient", "ablation", "confidence", "random"}
    scorer = get_scorer("gradient", per="example", normalize=None)
    assert isinstance(scorer, GradientScorer) and isinstance(scorer, Scorer)
    model, batches = tiny_model("gpt2"), two_batches("gpt2")
    assert scorer(model, batches) == head_importance(model, batches, per="example", normalize=None)

    def by_position(model, batches):  # a user scorer: later heads are less important
        layout = find_heads(model)
        return HeadScores(layout, {s.name: -torch.arange(s.num_heads, dtype=torch.float64) for s in layout})

    register_scorer("by_position", lambda: by_position)
    try:
        assert get_scorer("by_position")(model, batches).ranked()[0][1] == 3
    finally:
        SCORERS.pop("by_position")
    assert get_scorer(by_position) is by_position


# --- HeadScores ---------------------------------------------------------------------------------------------------
def _scores(values_by_site: list[list[float]]) -> HeadScores:
    layout = find_heads(tiny_model("gpt2"))
    return HeadScores(layout, {s.name: v for s, v in zip(layout, values_by_site)})


def test_json_round_trip_is_exact(tmp_path):
    scores = head_importance(tiny_model("t5"), two_batches("t5"))
    odd = HeadScores(scores.layout, {n: v / 3 + 1e-300 for n, v in scores.items()}, "gradient", scores.meta)
    for original in (scores, odd):
        again = HeadScores.from_json(original.to_json())
        assert again == original and again.meta == original.meta and again.layout == original.layout
    path = tmp_path / "scores.json"
    odd.to_json(path)
    assert HeadScores.from_json(path) == odd


def test_ranked_ascending_with_deterministic_ties():
    scores = _scores([[0.5, 0.1, 0.1, 0.9], [0.1, 0.7, 0.0, 0.5]])
    names = scores.layout.names
    assert scores.ranked()[:5] == [(names[1], 2, 0.0), (names[0], 1, 0.1), (names[0], 2, 0.1), (names[1], 0, 0.1),
                                   (names[0], 0, 0.5)]
    assert scores.ranked(descending=True)[0] == (names[0], 3, 0.9)
    assert scores.ranked(descending=True)[2:4] == [(names[0], 0, 0.5), (names[1], 3, 0.5)]


def test_normalized_variants():
    scores = _scores([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    layer = scores.normalized()
    assert layer[scores.layout.names[0]].tolist() == [0.6, 0.8, 0.0, 0.0]
    assert layer[scores.layout.names[1]].tolist() == [0.0] * 4  # an all-zero layer stays zero (norm + 1e-20)
    minmax = scores.normalized("minmax")
    assert minmax.flat().min() == 0 and minmax.flat().max() == 1 and minmax[scores.layout.names[0]][0] == 0.75
    with pytest.raises(ValueError, match="how: 'l1' is not one of 'layer', 'minmax'"):
        scores.normalized("l1")


def test_head_scores_validation():
    layout = find_heads(tiny_model("gpt2"))
    with pytest.raises(ValueError, match="has 4 heads"):
        HeadScores(layout, {s.name: [0.0] * 3 for s in layout})
    with pytest.raises(ValueError, match="is missing"):
        HeadScores(layout, {layout.names[0]: [0.0] * 4})
    with pytest.raises(ValueError, match="unknown site 'nope'"):
        HeadScores(layout, {"nope": [0.0]})
    with pytest.raises(ValueError, match="format 'prunetrain.HeadScores/1'"):
        HeadScores.from_dict({"scores": {}})


# --- argument errors ----------------------------------------------------------------------------------------------
def test_bad_arguments_raise_clear_errors():
    import transformers as tf

    from prunetrain.zoo import tiny_config

    model, batches = tiny_model("bert"), two_batches("bert")
    with pytest.raises(ValueError, match="per: 'token' is not one of 'batch', 'example'"):
        head_importance(model, batches, per="token")
    with pytest.raises(ValueError, match="normalize: 'global' is not one of 'layer', None"):
        head_importance(model, batches, normalize="global")
    with pytest.raises(ValueError, match="reduction: 'max' is not one of 'mean', 'sum'"):
        head_importance(model, batches, reduction="max")
    with pytest.raises(ValueError, match="autocast: expected a torch.dtype"):
        head_importance(model, batches, autocast="bf16")
    with pytest.raises(ValueError, match="sync: True needs an initialised torch.distributed process group"):
        head_importance(model, batches, sync=True)
    with pytest.raises(ValueError, match="batches: got a single batch"):
        head_importance(model, batches[0])
    with pytest.raises(ValueError, match="batches: each batch must be a mapping"):
        head_importance(model, [batches[0]["input_ids"]])
    with pytest.raises(ValueError, match="batches: a batch has no 'labels'"):
        head_importance(model, [{k: v for k, v in batches[0].items() if k != "labels"}])
    with pytest.raises(ValueError, match="batches: no batch was scored"):
        head_importance(model, [])
    with pytest.raises(ValueError, match="max_batches: 0 is not allowed"):
        head_importance(model, batches, max_batches=0)
    with pytest.raises(ValueError, match="loss_fn: must return a scalar tensor"):
        head_importance(model, batches, loss_fn=lambda m, b: 1.0)
    base = tf.BertModel(tiny_config("bert"))
    with pytest.raises(ValueError, match="model: BertModel returned no loss"):
        head_importance(base, batches)
    with pytest.raises(ValueError, match="scorer: 'taylor' is not one of 'gradient', 'ablation'"):
        get_scorer("taylor")
    with pytest.raises(ValueError, match="options for scorer 'random'"):
        get_scorer("random", sed=1)
    with pytest.raises(ValueError, match="options: per can only be given with a scorer name"):
        get_scorer(GradientScorer(), per="batch")
    with pytest.raises(ValueError, match="per: 'x' is not one of"):
        GradientScorer(per="x")
    with pytest.raises(ValueError, match=r"^seed: '1' is not allowed; expected an integer\.$"):
        random_scores(model, seed="1")


def test_max_batches_limits_the_data():
    model, batches = tiny_model("gpt2"), two_batches("gpt2")
    assert head_importance(model, batches, max_batches=1) == head_importance(model, batches[:1])
