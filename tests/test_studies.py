"""Michel et al. studies as library functions on a tiny real model, with a loss-based metric (higher is better:
the negative loss), checked against independent masking; resume after an interruption gives the full result."""

import json
import math

import pytest
import torch

import prunetrain as pt
from prunetrain.methods import studies
from prunetrain.methods.curve import loss_metric
from prunetrain.utils.plots import read_image_tags, read_scalars
from prunetrain.zoo import tiny_inputs, tiny_model


class Interrupted(Exception):
    pass


def _stop_after(n):
    """An `after_unit` hook that interrupts the study after n units (each saved before the hook runs)."""
    seen = []

    def hook(unit, value):
        seen.append(unit)
        if len(seen) >= n:
            raise Interrupted(unit)

    return hook


def _without_time(result):
    result = {k: v for k, v in result.items() if k != "seconds"}
    return json.loads(json.dumps(result))


@pytest.fixture(scope="module")
def model_and_metric():
    model = tiny_model("marian")
    batches = [tiny_inputs("marian", batch=4, seed=s) for s in range(2)]
    base = loss_metric(batches)

    def neg_loss(m):  # higher is better, like BLEU
        return {"score": -base(m)["loss"]}

    return model, neg_loss, batches


def _masked(model, metric, remove):
    with torch.no_grad(), pt.HeadMask.from_heads(model, remove).applied(model):
        return metric(model)["score"]


def test_ablate_each_head_matches_masks_writes_figure_and_tensorboard(tmp_path, model_and_metric):
    model, metric, _ = model_and_metric
    result = studies.ablate_each_head(model, metric, key="score", threshold=5e-5, out_dir=tmp_path)
    assert len(result["heads"]) == 24
    row = result["heads"][13]
    expected = _masked(model, metric, {row["site"]: [row["head"]]})
    assert row["value"] == pytest.approx(expected, abs=1e-9)
    assert row["delta"] == pytest.approx(expected - result["base"], abs=1e-9)
    deltas = [r["delta"] for r in result["heads"]]
    summary = result["summary"]
    assert summary["num_changed"] == sum(abs(d) > 5e-5 for d in deltas) and 0 < summary["num_changed"] < 24
    assert summary["num_improving"] == sum(d > 0 for d in deltas)
    assert summary["num_worse"] + summary["num_improving_beyond_threshold"] == summary["num_changed"]
    assert (tmp_path / "ablation_hist.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "ablation.json").read_text())["summary"]["num_heads"] == 24
    assert not (tmp_path / "ablation.partial.json").exists()
    table = (tmp_path / "ablation.md").read_text()  # Table 1: a layer × head grid per kind, Δ in each cell
    grid_rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    assert len(grid_rows) == 6  # 2 layers × 3 kinds
    kind = row["kind"]
    section = table.split(f"**{kind}**")[1].splitlines()
    cells = next(line for line in section if line.startswith(f"| {row['layer']} |")).strip("| ").split(" | ")[1:]
    shown = cells[row["head"]].strip("*")
    assert shown == f"{row['delta']:+.2f}" and (cells[row["head"]].startswith("**") == (abs(row["delta"]) > 5e-5))
    logged = read_scalars(tmp_path / "tensorboard")["ablate/delta"]
    assert [v for _, v in sorted(logged)] == pytest.approx(deltas, abs=1e-5)
    assert read_image_tags(tmp_path / "tensorboard") == {"ablate/ablation_hist": 1}
    assert pt.attached_masks(model) == []


def test_interrupted_ablation_resumes_to_the_full_result_and_refuses_other_arguments(tmp_path, model_and_metric):
    model, metric, _ = model_and_metric
    full = studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path / "full", args={"data": "x"})
    with pytest.raises(Interrupted):
        studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path / "cut", args={"data": "x"},
                                 after_unit=_stop_after(7))
    partial = json.loads((tmp_path / "cut" / "ablation.partial.json").read_text())
    assert len(partial["units"]) == 7 and not (tmp_path / "cut" / "ablation.json").exists()
    # a journal written before an argument existed reads it as None (no test for a metric without statistics)
    assert partial["args"].pop("bootstrap_samples", "missing") is None
    (tmp_path / "cut" / "ablation.partial.json").write_text(json.dumps(partial))
    with pytest.raises(ValueError, match=r"other arguments: data \(saved 'x', now 'y'\)"):
        studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path / "cut", args={"data": "y"})
    evaluated = []
    resumed = studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path / "cut", args={"data": "x"},
                                       after_unit=lambda unit, value: evaluated.append(unit))
    assert len(evaluated) == 25 - 7  # the saved units are not evaluated again
    assert _without_time(resumed) == _without_time(full)
    again = studies.ablate_each_head(model, metric, key="score", out_dir=tmp_path / "cut", args={"data": "x"},
                                     after_unit=lambda unit, value: evaluated.append(unit))
    assert again == resumed and len(evaluated) == 18  # finished: returned from the file, no work


def test_keep_one_head_per_layer_tries_each_or_reuses_an_ablation(tmp_path, model_and_metric):
    model, metric, _ = model_and_metric
    result = studies.keep_one_head_per_layer(model, metric, key="score", out_dir=tmp_path / "tried")
    assert len(result["layers"]) == 6 and result["summary"]["head_choice"] == "tried each"
    first = result["layers"][0]
    values = [_masked(model, metric, {first["site"]: [h for h in range(4) if h != k]}) for k in range(4)]
    assert first["kept_head"] == max(range(4), key=lambda h: values[h])
    assert first["value"] == pytest.approx(max(values), abs=1e-9)
    assert "| kept head |" in (tmp_path / "tried" / "one_head_per_layer.md").read_text()
    assert (tmp_path / "tried" / "one_head_per_layer.png").read_bytes()[:4] == b"\x89PNG"

    ablation = studies.ablate_each_head(model, metric, key="score")
    count = []
    reused = studies.keep_one_head_per_layer(model, metric, key="score", ablation=ablation,
                                             out_dir=tmp_path / "reused", after_unit=lambda u, v: count.append(u))
    assert len(count) == 1 + 6  # the base and one evaluation per site
    for row in reused["layers"]:
        deltas = {r["head"]: r["delta"] for r in ablation["heads"] if r["site"] == row["site"]}
        assert row["kept_head"] == min(deltas, key=deltas.get)  # the head whose removal hurts most
        assert row["value"] == pytest.approx(
            _masked(model, metric, {row["site"]: [h for h in range(4) if h != row["kept_head"]]}), abs=1e-9)
    with pytest.raises(ValueError, match="ablation: holds no delta for every head of site"):
        studies.keep_one_head_per_layer(model, metric, key="score", ablation={"heads": ablation["heads"][:5]})


def test_pearson_spearman_and_cross_dataset_of_ablation_deltas(tmp_path, model_and_metric):
    assert studies.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert studies.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)  # 1 - 6·4/(5·24)
    assert studies.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, abs=1e-6)  # ties: average ranks
    assert studies.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(0.9819805, abs=1e-6)  # by hand: 3 / sqrt(2·4.667)
    assert studies.spearman([1, 2, 3], [1, 2, 4]) == pytest.approx(1.0)  # monotone, not linear
    assert math.isnan(studies.pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="need two sequences of the same length"):
        studies.pearson([1, 2], [1])
    model, metric, batches = model_and_metric
    other_loss = loss_metric(batches[1:])

    def other(m):
        return {"score": -other_loss(m)["loss"]}

    result = studies.cross_dataset(model, [metric, other], key="score", names=("both", "second"), out_dir=tmp_path)
    a = studies.ablate_each_head(model, metric, key="score")
    b = studies.ablate_each_head(model, other, key="score")
    da, db = [r["delta"] for r in a["heads"]], [r["delta"] for r in b["heads"]]
    assert [h["delta_a"] for h in result["heads"]] == pytest.approx(da, abs=1e-9)
    count = []
    reused = studies.cross_dataset(model, [metric, other], key="score", names=("both", "second"), ablation=a,
                                   after_unit=lambda u, v: count.append(u))
    assert len(count) == 25 and all(u.startswith("b:") for u in count)  # the first set's values come from `a`
    assert _without_time(reused) == _without_time({**result, "args": reused["args"]})
    assert [h["delta_b"] for h in result["heads"]] == pytest.approx(db, abs=1e-9)
    assert result["pearson"] == pytest.approx(studies.pearson(da, db)) and -1 <= result["spearman"] <= 1
    assert studies.cross_dataset(model, [metric, metric], key="score")["pearson"] == pytest.approx(1.0)
    constant = studies.cross_dataset(model, [lambda m: 1.0, metric], key="score")  # every Δ is 0 on the first set
    assert constant["pearson"] is None and constant["spearman"] is None  # undefined, not NaN in the JSON
    assert (tmp_path / "cross_dataset.png").read_bytes()[:4] == b"\x89PNG"
    assert set(read_scalars(tmp_path / "tensorboard")) == {"cross-dataset/pearson", "cross-dataset/spearman"}


def test_within_threshold():
    assert studies.within([0, 0.1, 0.2, 0.3], [10, 9.8, 9.4, 9.9], 10, 0.5) == 0.1  # stops at the first drop
    assert studies.within([0, 0.5], [10, 10], 10, 0.5) == 0.5
    assert studies.within([0, 0.5], [2, 2.2], 2, 0.1, higher_is_better=False) == 0.0


def test_pruning_curves_importance_random_spread_and_resume(tmp_path, model_and_metric):
    model, metric, batches = model_and_metric
    kwargs = dict(key="score", fractions=[0, 0.25, 0.5], random_seeds=[0, 1], threshold=1e-4)
    result = studies.pruning_curves_study(model, metric, batches, out_dir=tmp_path / "full", **kwargs)
    curves = result["curves"]
    assert set(curves) == {"importance", "random_seed0", "random_seed1"}
    assert [p["heads_kept"] for p in curves["importance"]["points"]] == [24, 18, 12]
    assert curves["importance"]["iterative"] is True
    r0, r1 = ([p["value"] for p in curves[f"random_seed{s}"]["points"]] for s in (0, 1))
    assert result["random"]["mean"] == pytest.approx([(x + y) / 2 for x, y in zip(r0, r1)])
    assert result["random"]["min"] == [min(x, y) for x, y in zip(r0, r1)]
    base = curves["importance"]["points"][0]["value"]
    assert base == r0[0] == result["summary"]["base"]
    assert result["summary"]["importance_within_threshold"] == studies.within(
        [0, 0.25, 0.5], [p["value"] for p in curves["importance"]["points"]], base, 1e-4)
    assert (tmp_path / "full" / "pruning_curves.png").is_file()
    assert set(read_scalars(tmp_path / "full" / "tensorboard")) == {"curves/importance", "curves/random_seed0",
                                                                   "curves/random_seed1"}
    with pytest.raises(Interrupted):  # stops in the middle of the first random curve
        studies.pruning_curves_study(model, metric, batches, out_dir=tmp_path / "cut", after_unit=_stop_after(5),
                                     **kwargs)
    resumed = studies.pruning_curves_study(model, metric, batches, out_dir=tmp_path / "cut", **kwargs)
    assert _without_time(resumed) == _without_time(result)


def test_per_kind_curves_prune_only_one_kind(tmp_path, model_and_metric):
    model, metric, batches = model_and_metric
    result = studies.per_kind_curves(model, metric, batches, key="score", fractions=[0, 0.5], out_dir=tmp_path)
    curves = result["curves"]
    assert set(curves) == {"encoder_self", "decoder_self", "cross"}
    assert [p["kept_per_kind"]["cross"] for p in curves["cross"]["points"]] == [8, 4]
    assert [p["kept_per_kind"]["encoder_self"] for p in curves["cross"]["points"]] == [8, 8]
    assert result["summary"]["most_sensitive"] in curves
    assert (tmp_path / "per_kind_curves.png").is_file()
    with pytest.raises(ValueError, match="per-kind curves need an encoder-decoder model"):
        studies.per_kind_curves(tiny_model("bert"), metric, batches, fractions=[0, 0.5])


def test_speed_study_benchmarks_each_shrunk_fraction(tmp_path, model_and_metric):
    model, _, batches = model_and_metric
    result = studies.speed_study(model, batches, fractions=[0, 0.5], batch_sizes=[2], seq_lens=[8], repeats=2,
                                 memory=False, out_dir=tmp_path)
    assert result["fractions"] == [0.5] and len(result["points"]) == 1
    point = result["points"][0]
    assert point["heads_kept"] == 12 and point["rows"][0]["heads_b"] == 12 and point["rows"][0]["heads_a"] == 24
    assert result["table"][0]["flop_ideal_speedup"] > 1  # fewer heads: fewer matmul FLOPs
    assert result["paper"]["speedup"] == 1.175
    assert "| 50 % | 12 |" in (tmp_path / "speed.md").read_text()
    assert (tmp_path / "speed.png").is_file() and read_image_tags(tmp_path / "tensorboard") == {"speed/speed": 1}
    assert pt.find_heads(model).total_heads == 24  # the full model is left as it was


# ---------------------------------------------------------------------------------------------------------------------
# significance: every masked evaluation tested against the base by a paired bootstrap over the examples
# ---------------------------------------------------------------------------------------------------------------------
def _per_example_metric(batches):
    """Negative mean per-example loss, returned with per-example statistics (one row each) and carrying
    `score_from_stats`: a metric the studies can test for significance, like `bleu_metric(sentence_stats=True)`."""
    count = sum(len(b["labels"]) for b in batches)

    def metric(model):
        rows = []
        with torch.no_grad():
            for batch in batches:
                logits = model(**batch).logits
                per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"],
                                                              reduction="none")
                rows += [[-float(x)] for x in per_token.mean(1)]
        return {"score": sum(r[0] for r in rows) / count, "sentence_stats": rows}

    metric.score_from_stats = lambda sums: float(sums[0]) / count
    return metric


def test_studies_test_each_change_for_significance_like_the_paper(tmp_path, model_and_metric):
    from prunetrain.methods.significance import paired_bootstrap

    model, _, _ = model_and_metric
    batches = [tiny_inputs("marian", batch=8, seed=s) for s in range(3)]
    metric = _per_example_metric(batches)
    alpha, samples = 0.05, 200
    result = studies.ablate_each_head(model, metric, key="score", threshold=1.0, out_dir=tmp_path / "ablate",
                                      bootstrap_samples=samples, alpha=alpha)
    base_rows = metric(model)["sentence_stats"]
    rows = result["heads"]
    for row in rows[::7]:  # p-values against the test computed here from the masked model's own statistics
        with pt.HeadMask.from_heads(model, {row["site"]: [row["head"]]}).applied(model):
            masked = metric(model)["sentence_stats"]
        assert row["p_value"] == paired_bootstrap(base_rows, masked, metric.score_from_stats, samples=samples)
    summary = result["summary"]
    significant = [r for r in rows if r["p_value"] < alpha]
    assert summary["significance"] == {"test": "paired bootstrap (Koehn 2004), two-sided", "samples": samples,
                                       "alpha": alpha}
    assert summary["num_significant"] == len(significant) and 0 < len(significant) < len(rows)
    assert summary["num_significant_worse"] + summary["num_significant_improving"] == len(significant)
    # Table 1 marks exactly the significant cells with a dagger
    table = (tmp_path / "ablate" / "ablation.md").read_text()
    assert table.count("†") == len(significant) + 1  # and once in the legend
    assert f"{len(significant)} of 24 heads" in table
    # an interrupted run resumes to the same p-values (the base statistics were saved with the base unit)
    with pytest.raises(Interrupted):
        studies.ablate_each_head(model, metric, key="score", threshold=1.0, out_dir=tmp_path / "cut",
                                 bootstrap_samples=samples, alpha=alpha, after_unit=_stop_after(5))
    resumed = studies.ablate_each_head(model, metric, key="score", threshold=1.0, out_dir=tmp_path / "cut",
                                       bootstrap_samples=samples, alpha=alpha)
    assert _without_time(resumed) == _without_time(result)
    with pytest.raises(ValueError, match=r"other arguments: bootstrap_samples \(saved 200, now 100\)"):
        studies.ablate_each_head(model, metric, key="score", threshold=1.0, out_dir=tmp_path / "cut",
                                 bootstrap_samples=100, alpha=alpha)

    # §3.3: each site's change is tested too
    one = studies.keep_one_head_per_layer(model, metric, key="score", ablation=result, bootstrap_samples=samples,
                                          alpha=alpha, out_dir=tmp_path / "one")
    row = one["layers"][2]
    with pt.HeadMask.from_heads(model, {row["site"]: [h for h in range(4) if h != row["kept_head"]]}).applied(model):
        masked = metric(model)["sentence_stats"]
    assert row["p_value"] == paired_bootstrap(base_rows, masked, metric.score_from_stats, samples=samples)
    assert one["summary"]["num_significant"] == sum(r["p_value"] < alpha for r in one["layers"])
    assert "| p (paired bootstrap) |" in (tmp_path / "one" / "one_head_per_layer.md").read_text()

    # §3.4: both datasets tested; the first reused from the ablation with its p-values; correlations over the
    # heads significant on either
    other = _per_example_metric([tiny_inputs("marian", batch=8, seed=s) for s in range(3, 5)])
    cross = studies.cross_dataset(model, [metric, other], key="score", ablation=result, bootstrap_samples=samples,
                                  alpha=alpha)
    assert [h["p_a"] for h in cross["heads"]] == [r["p_value"] for r in rows]
    b = studies.ablate_each_head(model, other, key="score", bootstrap_samples=samples, alpha=alpha)
    assert [h["p_b"] for h in cross["heads"]] == [r["p_value"] for r in b["heads"]]
    sig = cross["significance"]
    either = [h for h in cross["heads"] if h["p_a"] < alpha or h["p_b"] < alpha]
    assert sig["num_significant_either"] == len(either) > 2
    assert sig["pearson_significant_either"] == pytest.approx(
        studies.pearson([h["delta_a"] for h in either], [h["delta_b"] for h in either]))
    with pytest.raises(ValueError, match=r"ablation: it was made without a significance test and this study "
                                         r"tests with 200 resamples"):
        studies.cross_dataset(model, [metric, other], key="score", bootstrap_samples=samples,
                              ablation=studies.ablate_each_head(model, metric, key="score", bootstrap_samples=0))
    # no test: no p-values, and a metric without statistics is never tested
    plain = studies.ablate_each_head(model, metric, key="score", bootstrap_samples=0)
    assert plain["summary"]["significance"] is None and {r["p_value"] for r in plain["heads"]} == {None}
    with pytest.raises(ValueError, match=r"bootstrap_samples: -1 is not allowed; expected an integer >= 0"):
        studies.ablate_each_head(model, metric, key="score", bootstrap_samples=-1)
    with pytest.raises(ValueError, match=r"alpha: 1.5 is not allowed; expected a significance level in \(0, 1\)"):
        studies.ablate_each_head(model, metric, key="score", alpha=1.5)
