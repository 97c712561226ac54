"""`train.precision: measure` and `model.attn_implementation: measure`: the fastest precision (bf16 autocast or
fp32) and attention kernel (eager or sdpa) on this machine, timed on a copy of the model
(`prunetrain.bench.precision.time_training`), recorded, and kept on resume. Real Marian models, real batches."""

from __future__ import annotations

import json

import pytest
import torch

from prunetrain.bench.precision import time_training
from prunetrain.utils.device import bf16_is_fast
from test_training_flops import _batches, _marian, tiny_mt  # noqa: F401  (fixture)

NATIVE = ["bf16", "fp32"] if bf16_is_fast(torch.device("cpu")) else ["fp32"]


def test_timing_leaves_the_model_and_the_random_streams_as_they_were(tiny_mt):
    model = _marian(tiny_mt[1])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    record = time_training(model, _batches(tiny_mt, model)[:2], attentions=["eager", "sdpa"], rounds=1)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.config._attn_implementation == "eager"
    # every native precision with every attention timed (emulated bf16 never: it is ~100x slower), the fastest chosen
    assert set(record["candidates"]) == {f"{p} {a}" for p in NATIVE for a in ("eager", "sdpa")}
    assert record["steps_per_candidate"] == 2
    fastest = min(record["candidates"], key=record["candidates"].get)
    assert fastest == f"{record['chosen']} {record['attention']}"


def test_with_one_candidate_nothing_is_timed(tiny_mt):
    model = _marian(tiny_mt[1])
    batches = _batches(tiny_mt, model)[:1]
    record = time_training(model, batches, precisions=["fp32"])
    assert record["candidates"] == {} and (record["chosen"], record["attention"]) == ("fp32", "eager")
    assert record["why"] == "one precision and one attention implementation: nothing to time"
    if NATIVE == ["fp32"]:  # bf16 asked for where it is emulated: fp32, and why
        record = time_training(model, batches, precisions=["bf16"])
        assert record["chosen"] == "fp32" and "not native" in record["why"]
    record = time_training(model, batches, precisions=["fp32"], attentions=["sdpa", "eager"], rounds=1)
    assert set(record["candidates"]) == {"fp32 sdpa", "fp32 eager"} and record["chosen"] == "fp32"


def test_a_resumed_run_keeps_the_precision_and_attention_it_started_with(tmp_path, tiny_mt):
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_settings import PRECISION_RECORD, measured_settings
    from prunetrain.mt.run.runner import RunInputs

    recipe = load_recipe("wmt-small-deen", ["train.precision=measure", "model.attn_implementation=measure"])
    model = _marian(tiny_mt[1])
    inputs = RunInputs(tokenizer=tiny_mt[1], train_set=None, importance_batches=[], curve_pairs=[], test_pairs=[],
                       bf16=False)
    lines = []
    for chosen, attention in (("bf16", "sdpa"), ("fp32", "eager")):
        (tmp_path / PRECISION_RECORD).write_text(json.dumps({"chosen": chosen, "attention": attention,
                                                             "candidates": {}}))
        resumed = measured_settings(recipe, model, inputs, tmp_path, lines.append)  # train_set None: not timed
        assert resumed.bf16 == (chosen == "bf16") and resumed.precision["chosen"] == chosen
        assert model.config._attn_implementation == attention
    assert lines[-1] == ("precision: fp32, attention: eager, as measured when the run started "
                         "(precision_record.json)")
    model.set_attn_implementation("sdpa")
    (tmp_path / PRECISION_RECORD).write_text(json.dumps({"chosen": "fp32", "candidates": {}}))  # before attention
    measured_settings(recipe, model, inputs, tmp_path, lines.append)
    assert model.config._attn_implementation == "eager"  # the attention such a run was built with
    for record, message in (({"chosen": "fp16"}, r"names no precision"),
                            ({"chosen": "fp32", "attention": "flash"}, r"names the attention 'flash', not one of "
                                                                       r"'eager', 'sdpa'")):
        (tmp_path / PRECISION_RECORD).write_text(json.dumps(record))
        with pytest.raises(ValueError, match=r"^--resume: .*precision_record.json' " + message):
            measured_settings(recipe, model, inputs, tmp_path, lines.append)


def test_the_recipe_measures_and_records_its_precision_and_attention(tmp_path, multi30k_dir):
    from conftest import run_cli
    from test_payoff_study import SMOKE

    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen", *SMOKE, "--set", "train.precision=measure",
                   "--set", "model.attn_implementation=measure", "--data-dir", multi30k_dir, "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "precision_record.json").read_text())
    results = json.loads((out / "results.json").read_text())
    assert results["precision_measured"] == record and record["chosen"] in NATIVE
    assert set(record["candidates"]) == {f"{p} {a}" for p in NATIVE for a in ("eager", "sdpa")}
    assert f"training in {record['chosen']} with {record['attention']} attention" in done.stderr
    assert (f"precision: {'bf16 autocast' if record['chosen'] == 'bf16' else 'fp32'} (train.precision=measure); "
            f"attention: {record['attention']} (model.attn_implementation=measure)") in done.stderr


def test_measure_is_refused_where_it_cannot_work():
    from prunetrain.mt.config.recipe import load_recipe

    with pytest.raises(ValueError, match=r"train.precision: 'fp16' is not one of 'auto', 'bf16', 'fp32', 'measure'"):
        load_recipe("wmt-small-deen", ["train.precision=fp16"])
    with pytest.raises(ValueError, match=r"model.attn_implementation: 'fastest' is not one of 'eager', 'sdpa', "
                                         r"'flex_attention', 'flash_attention_2', 'measure'"):
        load_recipe("wmt-small-deen", ["model.attn_implementation=fastest"])
    assert load_recipe("wmt-small-deen", ["model.attn_implementation=measure"]).model.built_attention == "eager"
