"""Serving shape constraints on a selection: whole key/value groups, counts divisible by a tensor-parallel degree,
the same number of heads in every layer of a kind (issue 15 item 5)."""

import pytest
import torch

import prunetrain as pt
from prunetrain.methods.constraints import ServingConstraints, apply_constraints, satisfied
from prunetrain.methods.importance import HeadScores
from prunetrain.methods.selection import select_heads
from prunetrain.zoo import tiny_model


def _scores(model, seed=0, units=("heads",)):
    layout = pt.find_sites(model, units)
    gen = torch.Generator().manual_seed(seed)
    return HeadScores(layout, {s.name: torch.rand(s.num_heads, generator=gen) for s in layout})


@pytest.mark.parametrize("family,overrides", [("marian", {}), ("llama", {"num_hidden_layers": 4}),
                                              ("llama", {"num_hidden_layers": 3, "num_attention_heads": 8,
                                                         "num_key_value_heads": 4, "hidden_size": 64})])
@pytest.mark.parametrize("constraints", [ServingConstraints(same_heads_per_kind=True),
                                         ServingConstraints(heads_multiple_of=2),
                                         ServingConstraints(same_heads_per_kind=True, heads_multiple_of=2)])
def test_select_heads_with_constraints_satisfies_them(family, overrides, constraints):
    model = tiny_model(family, **overrides)
    scores = _scores(model)
    plain = select_heads(scores, 0.4)
    mask = select_heads(scores, 0.4, constraints=constraints)
    assert satisfied(mask, constraints) == []
    assert satisfied(plain, constraints) != []  # the case is not trivially satisfied
    pt.shrink(model, mask)  # group-aligned: shrink with gqa_rounding="error" accepts it
    if constraints.same_heads_per_kind:
        layout = pt.find_heads(model)
        for kind in layout.kinds:
            assert len({s.num_heads for s in layout if s.kind == kind}) == 1


def test_constraints_keep_the_highest_scoring_heads_and_leave_the_input_alone():
    model = tiny_model("bert")
    layout = pt.find_heads(model)
    scores = HeadScores(layout, {layout.names[0]: torch.tensor([0.9, 0.1, 0.8, 0.7]),
                                 layout.names[1]: torch.tensor([0.5, 0.6, 0.4, 0.3])})
    mask = pt.HeadMask.from_heads(model, {layout.names[0]: [1], layout.names[1]: [0, 2, 3]})  # keeps 3 and 1
    out = apply_constraints(mask, scores, ServingConstraints(same_heads_per_kind=True))
    # mean of 3 and 1 kept heads: 2 per site; site 0 drops its lowest-scoring kept head (3: 0.7), site 1 gets back
    # its highest-scoring removed head (0: 0.5)
    assert sorted(out.kept(layout.names[0])) == [0, 2]
    assert sorted(out.kept(layout.names[1])) == [0, 1]
    assert mask.kept(layout.names[0]) == [0, 2, 3]  # input untouched


def test_partly_kept_groups_are_rounded_to_whole_groups():
    model = tiny_model("llama", num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    site = pt.find_heads(model).names[0]
    mask = pt.HeadMask.from_heads(model, {site: [0, 1, 2, 4]})  # group 0 keeps 1 of 4, group 1 keeps 3 of 4
    out = apply_constraints(mask, None, ServingConstraints())
    assert out.kept(site) == [4, 5, 6, 7]
    assert satisfied(out, ServingConstraints()) == [] and satisfied(mask, ServingConstraints()) != []


@pytest.mark.parametrize("kwargs, pattern", [
    ({"heads_multiple_of": 0}, r"heads_multiple_of: 0 is not allowed; expected an integer >= 1"),
    ({"heads_multiple_of": True}, r"heads_multiple_of: True is not allowed"),
    ({"same_heads_per_kind": "yes"}, r"same_heads_per_kind: 'yes' is not allowed; expected True or False"),
])
def test_bad_constraints_are_one_sentence(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ServingConstraints(**kwargs)


def _kept(mask, unit):
    return {s.name: int((mask[s.name] != 0).sum()) for s in mask.layout if s.unit == unit}


def test_ffn_widths_move_to_the_nearest_multiple_and_the_best_neurons_stay():
    model = tiny_model("marian")  # 4 FFNs of 64 neurons, 4 heads per attention
    scores = _scores(model, units=("heads", "neurons"))
    constraints = ServingConstraints(neurons_multiple_of=8)
    plain = select_heads(scores, {"heads": 0.5, "neurons": 0.6})
    mask = select_heads(scores, {"heads": 0.5, "neurons": 0.6}, constraints=constraints)
    before, after = _kept(plain, "neurons"), _kept(mask, "neurons")
    assert any(width % 8 for width in before.values())  # the case is not trivially satisfied
    assert satisfied(plain, constraints) != [] and satisfied(mask, constraints) == []
    for name, width in before.items():
        assert after[name] % 8 == 0 and abs(after[name] - width) <= 4  # the nearest multiple
        kept_before, kept_after = set(plain.kept(name)), set(mask.kept(name))
        ranked = sorted(range(64), key=lambda n: -float(scores[name][n]))
        # rounded down: the lowest-scoring kept neurons go; rounded up: the best removed ones come back
        removed_best_first = [n for n in ranked if n not in kept_before]
        expected = (kept_before - set(sorted(kept_before, key=ranked.index)[after[name]:]) if after[name] <= width
                    else kept_before | set(removed_best_first[:after[name] - width]))
        assert kept_after == expected
    assert _kept(mask, "heads") == _kept(plain, "heads")  # the heads are not touched
    pt.shrink(model, mask)
    assert all(s.num_heads % 8 == 0 for s in pt.find_sites(model, ("neurons",)))


def test_each_multiple_applies_to_its_own_unit_and_a_whole_width_may_stay():
    model = tiny_model("marian")
    layout = pt.find_sites(model, ("heads", "neurons"))
    ffn = [s.name for s in layout if s.unit == "neurons"]
    mask = pt.HeadMask(layout)
    mask[ffn[0]] = [1.0] * 37 + [0.0] * 27  # 37 neurons: odd
    heads_only = apply_constraints(mask, None, ServingConstraints(heads_multiple_of=2))
    assert _kept(heads_only, "neurons")[ffn[0]] == 37  # a tensor-parallel degree leaves FFN widths alone
    out = apply_constraints(mask, None, ServingConstraints(neurons_multiple_of=48))
    # 37 → 48 (nearer than 0); a site never pruned keeps its whole 64 though 48 does not divide it
    assert _kept(out, "neurons") == {name: 48 if name == ffn[0] else 64 for name in ffn}
    assert _kept(out, "heads") == _kept(mask, "heads")
    assert satisfied(out, ServingConstraints(neurons_multiple_of=48)) == []


def test_one_head_count_per_stack_leaves_each_ffn_its_own_width():
    model = tiny_model("marian")
    layout = pt.find_sites(model, ("heads", "neurons"))
    mask = pt.HeadMask(layout)
    widths = [16, 24, 40, 56]
    for site, width in zip([s for s in layout if s.unit == "neurons"], widths):
        mask[site.name] = [1.0] * width + [0.0] * (64 - width)
    out = apply_constraints(mask, None, ServingConstraints(same_heads_per_stack=True))
    assert list(_kept(out, "neurons").values()) == widths  # CTranslate2 takes a width per layer


def test_a_bad_ffn_multiple_is_one_sentence():
    with pytest.raises(ValueError, match=r"neurons_multiple_of: 0 is not allowed; expected an integer >= 1"):
        ServingConstraints(neurons_multiple_of=0)
