"""Pruning policies: select_heads (amount convention, scopes, min heads, ties, GQA groups, errors) and Michel et al.'s
iterative pruning on real tiny models."""

from __future__ import annotations

import pytest
import torch

from prunetrain import HeadMask, attached_masks, find_heads, shrink
from prunetrain.methods.importance import HeadScores, head_importance, random_scores
from prunetrain.methods.selection import iterative_prune, select_heads
from prunetrain.zoo import tiny_inputs, tiny_model




def zeros(mask: HeadMask) -> set[tuple[str, int]]:
    return {(name, h) for name, v in mask.items() for h in torch.nonzero(v == 0).flatten().tolist()}


def marian_scores(seed: int = 0) -> HeadScores:
    return random_scores(find_heads(tiny_model("marian")), seed=seed)  # 6 sites x 4 heads, distinct values


def test_fraction_removes_the_lowest_share_of_all_heads():
    scores = marian_scores()
    mask = select_heads(scores, 0.25)
    lowest = {(name, h) for name, h, _ in scores.ranked()[:6]}  # round(0.25 * 24) = 6
    assert zeros(mask) == lowest
    assert mask.is_binary() and mask.num_kept == 18


def test_int_is_a_count_and_float_a_fraction():
    scores = marian_scores()
    assert zeros(select_heads(scores, 5)) == {(n, h) for n, h, _ in scores.ranked()[:5]}
    assert select_heads(scores, 1).num_kept == 23
    assert select_heads(scores, 1.0).num_kept == 0
    assert select_heads(scores, 0).num_kept == 24 and select_heads(scores, 0.0).num_kept == 24
    assert select_heads(scores, 0.1).num_kept == 24 - 2  # 2.4 -> 2
    assert select_heads(scores, 0.0625).num_kept == 24 - 2  # 1.5 rounds half up -> 2


def test_base_mask_removals_stay_and_count_toward_the_amount():
    scores = marian_scores()
    highest = scores.ranked(descending=True)[:3]
    base = HeadMask(scores.layout)
    for name, h, _ in highest:
        base.set(name, h, 0.0)
    soft_name, soft_head, _ = scores.ranked(descending=True)[3]
    base.set(soft_name, soft_head, 0.5)  # a soft keep value is copied, not rounded
    before = base.copy()
    mask = select_heads(scores, 0.5, base_mask=base)
    assert base == before  # not modified
    assert zeros(base) <= zeros(mask)
    assert len(zeros(mask)) == 12  # 50% of all 24 heads in the end: 3 kept from the base + 9 new
    new = zeros(mask) - zeros(base)
    rest = [(n, h) for n, h, _ in scores.ranked() if (n, h) not in zeros(base)]
    assert new == set(rest[:9])
    assert float(mask[soft_name][soft_head]) == 0.5
    # a base that already prunes more than asked is returned unchanged
    assert select_heads(scores, 2, base_mask=base) == base


def test_physically_removed_heads_count_toward_the_amount():
    model = tiny_model("marian")
    name = find_heads(model).names[0]
    shrink(model, HeadMask.from_heads(model, {name: [0, 3]}))
    layout = find_heads(model)
    assert layout.total_heads == 22
    mask = select_heads(random_scores(layout, seed=1), 0.5)
    assert mask.num_kept == 12  # 12 of the original 24 heads remain: 2 shrunk away + 10 masked


def test_min_heads_per_layer_is_respected():
    layout = find_heads(tiny_model("marian"))
    # the first two sites hold the 8 lowest scores
    values = {s.name: torch.arange(4, dtype=torch.float64) + 10 * i for i, s in enumerate(layout)}
    values[layout.names[1]] -= 10
    scores = HeadScores(layout, values)
    free = select_heads(scores, 8)
    assert {n for n, _ in zeros(free)} == set(layout.names[:2])
    mask = select_heads(scores, 8, min_heads_per_layer=2)
    kept = {s.name: len(mask.kept(s.name)) for s in layout}
    assert all(k >= 2 for k in kept.values())
    assert kept[layout.names[0]] == 2 and kept[layout.names[1]] == 2 and len(zeros(mask)) == 8
    assert zeros(mask) >= {(layout.names[2], 0), (layout.names[2], 1)}  # the next-lowest heads fill the amount


def test_ties_are_broken_by_site_order_then_head_index():
    layout = find_heads(tiny_model("gpt2"))
    flat = HeadScores(layout, {s.name: torch.zeros(4, dtype=torch.float64) for s in layout})
    mask = select_heads(flat, 5)
    assert zeros(mask) == {(layout.names[0], h) for h in range(4)} | {(layout.names[1], 0)}
    assert select_heads(flat, 5) == mask
    tied = HeadScores(layout, {layout.names[0]: [0.3, 0.1, 0.2, 0.1], layout.names[1]: [0.1, 0.0, 0.5, 0.6]})
    assert zeros(select_heads(tied, 3)) == {(layout.names[1], 1), (layout.names[0], 1), (layout.names[0], 3)}


def test_scope_layer_and_kind():
    scores = marian_scores()
    per_site = select_heads(scores, 0.5, scope="layer")
    for site in scores.layout:
        removed = [h for n, h in zeros(per_site) if n == site.name]
        lowest = torch.argsort(scores[site.name])[:2].tolist()
        assert sorted(removed) == sorted(lowest)
    per_kind = select_heads(scores, 0.25, scope="kind")
    for kind in ("encoder_self", "decoder_self", "cross"):
        names = [s.name for s in scores.layout if s.kind == kind]
        removed = {(n, h) for n, h in zeros(per_kind) if n in names}
        ranked = [(n, h) for n, h, _ in scores.ranked() if n in names]
        assert removed == set(ranked[:2])  # round(0.25 * 8) per kind
    assert select_heads(scores, 1, scope="layer").num_kept == 24 - 6  # an int is a count per site


def test_kinds_restrict_what_is_pruned():
    scores = marian_scores()
    mask = select_heads(scores, 0.5, kinds=["cross"])
    cross = [s.name for s in scores.layout if s.kind == "cross"]
    assert {n for n, _ in zeros(mask)} <= set(cross) and len(zeros(mask)) == 4  # 50% of the 8 cross heads
    assert zeros(select_heads(scores, 0.5, kinds="cross")) == zeros(mask)


def test_gqa_selects_whole_groups_by_summed_score_and_shrinks():
    model = tiny_model("llama")
    layout = find_heads(model)  # 2 sites, 4 query heads on 2 kv heads (groups {0,1}, {2,3})
    a, b = layout.names
    # the single lowest head (a, 0) sits in the group with the highest sum
    scores = HeadScores(layout, {a: [0.0, 10.0, 3.0, 3.0], b: [4.0, 4.0, 5.0, 5.0]})
    mask = select_heads(scores, 2)
    assert zeros(mask) == {(a, 2), (a, 3)}
    assert zeros(select_heads(scores, 3)) == {(a, 2), (a, 3)}  # rounded down to whole groups
    assert zeros(select_heads(scores, 0.5)) == {(a, 2), (a, 3), (b, 0), (b, 1)}
    batch = tiny_inputs("llama")
    real = head_importance(model, [batch])
    grouped = select_heads(real, 0.5, min_heads_per_layer=1)
    for site in layout:
        keep = grouped[site.name].view(-1, site.group_size)
        assert ((keep == 0).all(1) | (keep != 0).all(1)).all()
    with torch.no_grad(), grouped.applied(model):
        expected = model(**batch).logits
    shrink(model, grouped, gqa_rounding="error")
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, expected, rtol=1e-5, atol=1e-5)


def test_bad_arguments_raise_clear_errors():
    scores = marian_scores()
    with pytest.raises(ValueError, match=r"amount: 1.5 is not a fraction in \[0, 1\]"):
        select_heads(scores, 1.5)
    with pytest.raises(ValueError, match="amount: nan is not a fraction in"):
        select_heads(scores, float("nan"))
    with pytest.raises(ValueError, match="amount: -1 is negative; a count of heads is an int >= 0"):
        select_heads(scores, -1)
    with pytest.raises(ValueError, match="amount: '0.5' is not an amount; use a fraction"):
        select_heads(scores, "0.5")
    with pytest.raises(ValueError, match="amount: True is not an amount"):
        select_heads(scores, True)
    with pytest.raises(ValueError, match="amount: 25 asks to prune 25 heads, but there are only 24 heads in scope"):
        select_heads(scores, 25)
    with pytest.raises(ValueError, match="amount: 5 asks to prune 5 heads, but there are only 4 heads of site"):
        select_heads(scores, 5, scope="layer")
    with pytest.raises(ValueError, match="scope: 'site' is not one of 'global', 'layer', 'kind'"):
        select_heads(scores, 0.5, scope="site")
    with pytest.raises(ValueError, match="kinds: 'decoder' is not an attention kind; allowed: encoder_self"):
        select_heads(scores, 0.5, kinds=["decoder"])
    with pytest.raises(ValueError, match="kinds: 'self' does not occur in this model, whose kinds are: encoder_self"):
        select_heads(scores, 0.5, kinds="self")
    with pytest.raises(ValueError, match="kinds: an empty selection"):
        select_heads(scores, 0.5, kinds=[])
    with pytest.raises(ValueError, match="min_heads_per_layer: -1 is negative"):
        select_heads(scores, 0.5, min_heads_per_layer=-1)
    with pytest.raises(ValueError, match="min_heads_per_layer: expected an int, got 1.5"):
        select_heads(scores, 0.5, min_heads_per_layer=1.5)
    with pytest.raises(ValueError, match=r"amount: 0.9 asks to prune 22 of 24 heads in scope \(0 already pruned\), "
                                         r"but min_heads_per_layer=1 leaves only 18 more prunable"):
        select_heads(scores, 0.9, min_heads_per_layer=1)
    nan = HeadScores(scores.layout, {n: v.clone() for n, v in scores.items()})
    nan.values[scores.layout.names[2]][1] = float("nan")
    with pytest.raises(ValueError, match="scores: site .* has NaN scores"):
        select_heads(nan, 0.5)
    with pytest.raises(ValueError, match="base_mask: does not fit the scores' layout"):
        select_heads(scores, 0.5, base_mask=HeadMask.ones(tiny_model("gpt2")))
    with pytest.raises(ValueError, match="scores: expected a prunetrain HeadScores"):
        select_heads({"a": [1.0]}, 0.5)


# --- iterative pruning --------------------------------------------------------------------------------------------
def test_iterative_prune_reestimates_on_the_masked_model():
    model = tiny_model("marian")
    batches = [tiny_inputs("marian", seed=0), tiny_inputs("marian", batch=3, length=6, seed=1)]
    seen = []

    def evaluate(m):
        seen.append(sum(m2.num_heads - m2.num_kept for m2 in attached_masks(m)))
        with torch.no_grad():
            return float(m(**batches[0]).loss)

    result = iterative_prune(model, batches, step=0.25, target=0.5, scorer="gradient", evaluate=evaluate,
                             scorer_options={"normalize": None})
    assert [s.num_pruned for s in result.history] == [6, 12]
    assert [s.amount for s in result.history] == [0.25, 0.5]
    first, second = result.history
    assert zeros(first.mask) < zeros(second.mask) and result.mask == second.mask
    assert zeros(first.mask) == {(n, h) for n, h, _ in first.scores.ranked()[:6]}
    # step 2 scored the model masked by step 1: removed heads have exactly zero importance, and the scores differ
    # from a fresh estimate on the unmasked model
    assert all(float(second.scores[n][h]) == 0.0 for n, h in zeros(first.mask))
    fresh = head_importance(model, batches, normalize=None)
    assert not second.scores.allclose(fresh)
    assert second.scores.allclose(_masked_scores(model, batches, first.mask))
    assert seen == [0, 6, 12] and result.initial_metric is not None
    assert result.history[1].metric != result.initial_metric
    assert attached_masks(model) == []


def _masked_scores(model, batches, mask):
    with mask.applied(model):
        return head_importance(model, batches, normalize=None)


def test_iterative_prune_with_counts_gqa_and_a_custom_scorer():
    model = tiny_model("llama")
    calls = []

    def scorer(m, batches):
        calls.append(sum(m2.num_heads - m2.num_kept for m2 in attached_masks(m)))
        return random_scores(m, seed=0)

    result = iterative_prune(model, [tiny_inputs("llama")], step=2, target=5, scorer=scorer)
    assert calls == [0, 2, 4]
    assert [s.num_pruned for s in result.history] == [2, 4, 4]  # 5 rounds down to whole kv groups of 2
    shrink(model, result.mask, gqa_rounding="error")
    assert find_heads(model).total_heads == 4


def test_iterative_prune_argument_errors():
    model = tiny_model("gpt2")
    batches = [tiny_inputs("gpt2")]
    with pytest.raises(ValueError, match="batches: a one-shot iterator"):
        iterative_prune(model, (b for b in batches))
    with pytest.raises(ValueError, match="step, target: both must be fractions"):
        iterative_prune(model, batches, step=1, target=0.5)
    with pytest.raises(ValueError, match="step: 0.0 would never prune"):
        iterative_prune(model, batches, step=0.0)
    with pytest.raises(ValueError, match="target: 1.2 is not a fraction in"):
        iterative_prune(model, batches, target=1.2)
    with pytest.raises(ValueError, match="scorer: 'fisher' is not one of"):
        iterative_prune(model, batches, scorer="fisher")
    assert attached_masks(model) == []
