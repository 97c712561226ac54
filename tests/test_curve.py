"""`pruning_curve`'s option objects (`Ranking`: how heads are ordered; `HeadScope`: which may go) on a tiny real
Marian model: the same curves as the former keyword form, which still works for one release with a
DeprecationWarning; bad combinations are refused in one sentence."""

import warnings

import pytest

import prunetrain as pt
from prunetrain.methods.curve import HeadScope, Ranking, loss_metric, pruning_curve
from prunetrain.zoo import tiny_inputs, tiny_model


@pytest.fixture(scope="module")
def setup():
    model = tiny_model("marian")
    batches = [tiny_inputs("marian", batch=3, seed=s) for s in range(2)]
    return model, batches, loss_metric(batches)


def _points(curve):
    """The curve without its timings (the only part that differs between two identical runs)."""
    data = curve.to_dict()
    for point in data["points"]:
        point.pop("seconds")
    return data


def _old_form(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pruning_curve(*args, **kwargs)


def test_option_objects_give_the_curves_of_the_keyword_form(setup):
    model, batches, metric = setup
    base = pt.HeadMask.ones(model)
    base.set(pt.find_heads(model).sites[0].name, 1, 0.0)
    cases = [  # (new form, old form)
        (dict(ranking=Ranking(batches=batches), heads=HeadScope(scope="kind", kinds=["cross"])),
         dict(batches=batches, scope="kind", kinds=["cross"])),
        (dict(ranking=Ranking(batches=batches, iterative=True)), dict(batches=batches, iterative=True)),
        (dict(ranking=Ranking("random", seed=3), heads=HeadScope(min_heads_per_layer=1)),
         dict(order="random", seed=3, min_heads_per_layer=1)),
        (dict(ranking=Ranking(batches=batches, scorer="ablation"), heads=HeadScope(scope="layer", base_mask=base)),
         dict(batches=batches, scorer="ablation", scope="layer", base_mask=base)),
    ]
    for new, old in cases:
        a = pruning_curve(model, metric, fractions=[0, 0.25, 0.5], key="loss", **new)
        b = _old_form(model, metric, fractions=[0, 0.25, 0.5], key="loss", **old)
        assert _points(a) == _points(b), new
    # and the options change the result: the scope masks only cross attention, the random order differs
    scoped = pruning_curve(model, metric, fractions=[0.5], key="loss",
                           ranking=Ranking(batches=batches), heads=HeadScope(scope="kind", kinds=["cross"]))
    full = pt.HeadMask.ones(model).kept_per_kind()
    assert scoped.points[0].kept_per_kind == {**full, "cross": full["cross"] // 2}
    assert scoped.meta == {"scope": "kind", "seed": None}


def test_the_keyword_form_warns_once_naming_the_replacement(setup):
    model, batches, metric = setup
    with pytest.warns(DeprecationWarning) as caught:
        pruning_curve(model, metric, fractions=[0.5], order="random", seed=1, kinds="cross", key="loss")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message == ("pruning_curve: the keyword arguments order, seed, kinds are deprecated and stop working in "
                       "prunetrain 0.2; pass ranking=Ranking(...) and heads=HeadScope(...) instead.")
    assert caught[0].filename == __file__  # attributed to the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruning_curve(model, metric, fractions=[0.5], ranking=Ranking("random", seed=1), heads=HeadScope(kinds="cross"),
                      key="loss")


def test_bad_options_are_refused_in_one_sentence(setup):
    model, batches, metric = setup
    with pytest.raises(ValueError, match=r"^ranking: give either ranking=Ranking\(\.\.\.\) or the deprecated keyword "
                                         r"arguments batches, not both\.$"):
        pruning_curve(model, metric, ranking=Ranking(batches=batches), batches=batches)
    with pytest.raises(ValueError, match=r"^heads: give either heads=HeadScope\(\.\.\.\) or the deprecated keyword "
                                         r"arguments scope, not both\.$"):
        pruning_curve(model, metric, heads=HeadScope(), scope="layer")
    with pytest.raises(TypeError, match=r"^ranking: expected a prunetrain\.methods\.curve\.Ranking, got str\.$"):
        pruning_curve(model, metric, ranking="random")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'ordr'"):
        pruning_curve(model, metric, ordr="random")
    with pytest.raises(ValueError, match=r"^order: 'best' is not one of 'importance', 'random'\.$"):
        Ranking("best")
    with pytest.raises(ValueError, match=r"^iterative: re-estimating importance has no meaning for order='random'"):
        Ranking("random", iterative=True)
    with pytest.raises(ValueError, match=r"^batches: iterative curves re-estimate importance and need batches\.$"):
        pruning_curve(model, metric, fractions=[0, 0.5], ranking=Ranking(iterative=True))
    model.train()
    with pytest.raises(ValueError, match=r"^scores: give importance scores, or batches"):
        pruning_curve(model, metric, ranking=Ranking())
    assert model.training and not pt.attached_masks(model)  # the model is left as it was
    model.eval()
