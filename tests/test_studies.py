"""Michel et al. studies as library functions on a tiny real model, with a loss-based metric."""

import json

import pytest
import torch

import prunetrain as pt
from prunetrain.methods import studies
from prunetrain.methods.curve import loss_metric
from prunetrain.zoo import tiny_inputs, tiny_model


@pytest.fixture(scope="module")
def model_and_metric():
    model = tiny_model("marian")
    batches = [tiny_inputs("marian", batch=4, seed=s) for s in range(2)]
    base = loss_metric(batches)

    def neg_loss(m):  # higher is better, like BLEU
        return {"score": -base(m)["loss"]}

    return model, neg_loss, batches


def test_ablate_each_head_matches_independent_masks(tmp_path, model_and_metric):
    model, metric, _ = model_and_metric
    result = studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path)
    assert len(result["heads"]) == 24
    row = result["heads"][13]
    mask = pt.HeadMask.from_heads(model, {row["site"]: [row["head"]]})
    with torch.no_grad(), mask.applied(model):
        expected = metric(model)["score"]
    assert row["value"] == pytest.approx(expected, abs=1e-9)
    assert row["delta"] == pytest.approx(expected - result["base"], abs=1e-9)
    assert (tmp_path / "ablation_hist.png").is_file()
    assert json.loads((tmp_path / "ablation.json").read_text())["summary"]["num_heads"] == 24
    assert pt.attached_masks(model) == []


def test_keep_one_head_per_layer_keeps_the_best_head(tmp_path, model_and_metric):
    model, metric, _ = model_and_metric
    result = studies.keep_one_head_per_layer(model, metric, key="score", out_dir=tmp_path)
    assert len(result["layers"]) == 6
    first = result["layers"][0]
    values = []
    for head in range(4):
        mask = pt.HeadMask.from_heads(model, {first["site"]: [h for h in range(4) if h != head]})
        with torch.no_grad(), mask.applied(model):
            values.append(metric(model)["score"])
    assert first["kept_head"] == max(range(4), key=lambda h: values[h])
    assert first["value"] == pytest.approx(max(values), abs=1e-9)
    assert "| kept head |" in (tmp_path / "one_head_per_layer.md").read_text()


def test_spearman_and_cross_dataset(tmp_path, model_and_metric):
    assert studies.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert studies.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert studies.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6·4/(5·24)
    assert studies.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, abs=1e-6)  # ties: average ranks
    with pytest.raises(ValueError, match="need two sequences of the same length"):
        studies.spearman([1, 2], [1])
    model, _, batches = model_and_metric
    a = pt.head_importance(model, batches[:1])
    b = pt.head_importance(model, batches[1:])
    result = studies.cross_dataset(a, b, names=("first", "second"), out_dir=tmp_path)
    assert -1 <= result["spearman"] <= 1 and result["num_heads"] == 24
    assert studies.cross_dataset(a, a)["spearman"] == pytest.approx(1.0)
    assert (tmp_path / "cross_dataset.png").is_file()


def test_pruning_curves_study_importance_random_and_by_kind(tmp_path, model_and_metric):
    model, metric, batches = model_and_metric
    result = studies.pruning_curves_study(model, metric, batches, key="score", fractions=[0, 0.25, 0.5],
                                          random_seeds=[0, 1], out_dir=tmp_path)
    curves = result["curves"]
    assert set(curves) == {"importance", "random_seed0", "random_seed1", "kind_encoder_self", "kind_decoder_self",
                           "kind_cross"}
    assert [p["heads_kept"] for p in curves["importance"]["points"]] == [24, 18, 12]
    assert [p["kept_per_kind"]["cross"] for p in curves["kind_cross"]["points"]] == [8, 6, 4]
    assert [p["kept_per_kind"]["encoder_self"] for p in curves["kind_cross"]["points"]] == [8, 8, 8]
    assert curves["importance"]["points"][0]["value"] == curves["random_seed0"]["points"][0]["value"]
    assert (tmp_path / "pruning_curves.png").is_file() and (tmp_path / "pruning_curves_by_kind.png").is_file()
