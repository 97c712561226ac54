"""`train.precision: measure`: the faster of bf16 autocast and fp32 on this machine, timed on a copy of the model
(`prunetrain.bench.precision.time_precisions`), recorded, and kept on resume. Real Marian models, real batches."""

from __future__ import annotations

import json

import pytest
import torch

from prunetrain.bench.precision import time_precisions
from prunetrain.utils.device import bf16_is_fast
from test_training_flops import _batches, _marian, tiny_mt  # noqa: F401  (fixture)


def test_timing_leaves_the_model_and_the_random_streams_as_they_were(tiny_mt):
    model = _marian(tiny_mt[1])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    record = time_precisions(model, _batches(tiny_mt, model)[:2], rounds=1)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    if bf16_is_fast(torch.device("cpu")):  # both timed, the faster chosen
        assert set(record["candidates"]) == {"bf16", "fp32"} and record["steps_per_precision"] == 2
        assert record["chosen"] == min(record["candidates"], key=record["candidates"].get)
    else:  # emulated bf16 is never timed (it is ~100x slower)
        assert record["candidates"] == {} and record["chosen"] == "fp32" and "not native" in record["why"]


def test_a_resumed_run_keeps_the_precision_it_started_with(tmp_path, tiny_mt):
    from prunetrain.mt.recipe import load_recipe
    from prunetrain.mt.runner import PRECISION_RECORD, RunInputs, measured_precision

    recipe = load_recipe("wmt-small-deen", ["train.precision=measure"])
    model = _marian(tiny_mt[1])
    inputs = RunInputs(tokenizer=tiny_mt[1], train_set=None, importance_batches=[], curve_pairs=[], test_pairs=[],
                       bf16=False)
    lines = []
    for chosen in ("bf16", "fp32"):
        (tmp_path / PRECISION_RECORD).write_text(json.dumps({"chosen": chosen, "candidates": {}}))
        resumed = measured_precision(recipe, model, inputs, tmp_path, lines.append)  # train_set None: not timed
        assert resumed.bf16 == (chosen == "bf16") and resumed.precision["chosen"] == chosen
    assert lines[-1] == "precision: fp32, as measured when the run started (precision_record.json)"
    (tmp_path / PRECISION_RECORD).write_text(json.dumps({"chosen": "fp16"}))
    with pytest.raises(ValueError, match=r"--resume: .*precision_record.json' names no precision"):
        measured_precision(recipe, model, inputs, tmp_path, lines.append)


def test_the_recipe_measures_and_records_its_precision(tmp_path, multi30k_dir):
    from conftest import run_cli
    from test_payoff_study import SMOKE

    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen", *SMOKE, "--set", "train.precision=measure", "--data-dir", multi30k_dir,
                   "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "precision_record.json").read_text())
    results = json.loads((out / "results.json").read_text())
    assert results["precision_measured"] == record and record["chosen"] in ("bf16", "fp32")
    assert f"training in {record['chosen']}" in done.stderr or "not native" in done.stderr
    assert f"precision: {'bf16 autocast' if record['chosen'] == 'bf16' else 'fp32'}" in done.stderr


def test_measure_is_refused_where_it_cannot_work():
    from prunetrain.mt.recipe import load_recipe

    with pytest.raises(ValueError, match=r"train.precision: 'fp16' is not one of 'auto', 'bf16', 'fp32', 'measure'"):
        load_recipe("wmt-small-deen", ["train.precision=fp16"])
