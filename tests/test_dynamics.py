"""Training dynamics on real (tiny) Trainer runs: points in fractional epochs and steps, exact labels (global step and
fractional epoch) when a run ends part-way through an epoch, unreachable points listed up front and at the end, curves
relative to the heads still present after a mid-training shrink, Spearman ρ between consecutive importance points,
schedule validation before training starts, and resume after a real kill -9 on the shrunk model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

import prunetrain as pt
from conftest import run_cli
from prunetrain.methods.curve import loss_metric
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training.callbacks import HeadPruningCallback, PruningCurveCallback
from prunetrain.training.time_cap import TimeCapCallback
from prunetrain.utils.plots import read_scalars

SCRIPT = Path(__file__).parent / "dist" / "train_dynamics.py"


@pytest.fixture(scope="module")
def tiny_mt(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=256)
    return pairs, train_tokenizer(pairs, vocab_size=300)


def _trainer(out, tiny_mt, callbacks, model, **settings):
    """256 pairs in batches of 32: 8 optimizer steps per epoch."""
    pairs, tokenizer = tiny_mt
    args = Seq2SeqTrainingArguments(**({"output_dir": str(out), "num_train_epochs": 3,
                                        "per_device_train_batch_size": 32, "learning_rate": 2e-3,
                                        "save_strategy": "no", "report_to": [], "use_cpu": True, "seed": 0,
                                        "disable_tqdm": True} | settings))
    return Seq2SeqTrainer(model=model, args=args, train_dataset=build_dataset(pairs, tokenizer, max_length=24),
                          data_collator=make_collator(tokenizer, model), processing_class=tokenizer,
                          callbacks=callbacks)


def _model(tiny_mt):
    torch.manual_seed(0)
    return MarianMTModel(marian_config(tiny_mt[1], d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                       attn_implementation="eager"))


def _batches(tiny_mt, model):
    pairs, tokenizer = tiny_mt
    dataset = build_dataset(pairs[:32], tokenizer, max_length=24)
    collate = make_collator(tokenizer, model)
    return [collate([dataset[i] for i in range(j, j + 16)]) for j in (0, 16)]


def test_max_steps_mid_epoch_records_the_exact_end_point_and_lists_the_unreached(tmp_path, tiny_mt):
    model = _model(tiny_mt)
    batches = _batches(tiny_mt, model)
    pruning = HeadPruningCallback(at_epochs=[0.5, 1, 2, 3], prune={0.5: 0.25}, mode="shrink", batches=batches)
    curve = PruningCurveCallback(at_epochs=[1], at_steps=[10], metric=loss_metric(batches), metric_key="loss",
                                 fractions=[0, 0.5], importance_batches=batches)
    trainer = _trainer(tmp_path, tiny_mt, [pruning, curve], model, max_steps=12)  # ends at epoch 1.5
    trainer.train()
    out = tmp_path / "prunetrain"
    # importance at steps 4 (epoch 0.5, with the shrink), 8 (epoch 1) and the end point 12 (epoch 1.5), not "epoch 2"
    points = json.loads((out / "importance_points.json").read_text())
    assert [(p["step"], p["epoch"], p["kind"]) for p in points] == [(4, 0.5, "scheduled"), (8, 1.0, "scheduled"),
                                                                   (12, 1.5, "end")]
    assert points[-1]["label"] == "step 12 (epoch 1.50)"
    assert sorted(p.name for p in out.glob("importance_*epoch*.json")) == [
        "importance_step12_epoch1.50.json", "importance_step4_epoch0.50.json", "importance_step8_epoch1.00.json"]
    assert json.loads((out / "importance_step12_epoch1.50.json").read_text())["meta"]["point"]["kind"] == "end"
    # epochs 2 and 3 lie beyond max_steps: listed when training starts and again at the end, never relabelled
    schedule = json.loads((out / "schedule_head-pruning.json").read_text())
    assert [(p["given"], p["step"]) for p in schedule["unreachable_up_front"]] == [("epoch 2", 16), ("epoch 3", 24)]
    assert [p["given"] for p in schedule["unreached"]] == ["epoch 2", "epoch 3"] and schedule["last_step"] == 12
    # the shrink happened at step 4, mid-epoch; the Spearman ρ compares the 18 heads present at both later points
    events = json.loads((out / "pruning_events.json").read_text())
    assert [(e["step"], e["epoch"], e["heads_after"]) for e in events] == [(4, 0.5, 18)]
    stability = json.loads((out / "importance_stability.json").read_text())
    assert [(s["from_step"], s["to_step"], s["heads_compared"]) for s in stability] == [(4, 8, 18), (8, 12, 18)]
    assert all(-1 <= s["spearman"] <= 1 for s in stability)
    assert [step for step, _ in read_scalars(out / "tensorboard")["prunetrain/importance_spearman_vs_previous"]] \
        == [8, 12]
    # curves at step 8 (epoch 1), step 10 (given as a step) and the end (step 12), each keyed by its step; after the
    # shrink their fractions are of the 18 heads present (50 % leaves 9), not of the 24 the model was built with
    curves = json.loads((out / "curves.json").read_text())
    assert [(c["step"], c["epoch"], c["kind"]) for c in curves.values()] == [(8, 1.0, "scheduled"),
                                                                            (10, 1.25, "scheduled"), (12, 1.5, "end")]
    for entry in curves.values():
        assert entry["fractions_of"] == "heads present" and entry["heads_present"] == 18
        assert [p["heads_kept"] for p in entry["curves"]["importance"]["points"]] == [18, 9]


def test_time_cap_mid_epoch_lists_expected_unreached_points_and_records_the_cut(tmp_path, tiny_mt):
    model = _model(tiny_mt)
    pruning = HeadPruningCallback(at_epochs=[1, 2], batches=_batches(tiny_mt, model))
    # a cap this small fires after the first step, whatever the machine: the run is cut at step 1 (epoch 0.125)
    cap = TimeCapCallback(1e-9, watch=[pruning], measure_steps=1)
    _trainer(tmp_path, tiny_mt, [pruning, cap], model, num_train_epochs=2).train()
    assert cap.fired and cap.to_dict()["stopped_at_step"] == 1 and cap.to_dict()["planned_steps"] == 16
    schedule = json.loads((tmp_path / "prunetrain" / "schedule_head-pruning.json").read_text())
    assert schedule["time_cap_expected_end_step"] == 1
    assert [p["given"] for p in schedule["time_cap_expected_unreachable"]] == ["epoch 1", "epoch 2"]
    assert [p["given"] for p in schedule["unreached"]] == ["epoch 1", "epoch 2"]
    assert [(d["step"], d["epoch"], d["kind"]) for d in schedule["done"]] == [(1, 0.125, "end")]
    assert [p.name for p in (tmp_path / "prunetrain").glob("importance_*epoch*.json")] == [
        "importance_step1_epoch0.12.json"]


def test_schedule_errors_come_before_training_starts(tmp_path, tiny_mt):
    with pytest.raises(ValueError, match=r"^prune \(epochs\): \[1.5, 0.5\] is out of order"):
        HeadPruningCallback(prune={1.5: 0.25, 0.5: 0.5})
    with pytest.raises(ValueError, match=r"^at_steps: \[20, 10\] is out of order"):
        HeadPruningCallback(at_steps=[20, 10])
    with pytest.raises(ValueError, match=r"^at_epochs: -0.5 is not valid; epoch points are numbers > 0"):
        PruningCurveCallback(at_epochs=[-0.5], metric=lambda m: 0.0)
    # 6 sites of 4 heads with min_heads_per_layer=1: at most 18 of 24 (75 %) can go; refused when the Trainer is built
    with pytest.raises(ValueError, match=r"^prune\[0.5\]: 0.8 cannot be reached with min_heads_per_layer=1"):
        _trainer(tmp_path / "a", tiny_mt, [HeadPruningCallback(prune={0.5: 0.8})], _model(tiny_mt))
    assert not (tmp_path / "a" / "prunetrain").exists()  # nothing of ours was written
    # epoch and step schedules together must stay cumulative in step order: epoch 1 is step 8, before step 12
    model = _model(tiny_mt)
    bad = HeadPruningCallback(prune={1: 0.5}, prune_steps={12: 0.25}, batches=_batches(tiny_mt, model))
    trainer = _trainer(tmp_path / "b", tiny_mt, [bad], model)
    with pytest.raises(ValueError, match=r"^prune/prune_steps: 0.25 at step 12 is less than the 0.5 pruned at step 8"):
        trainer.train()
    assert trainer.state.global_step == 0
    # the recipe: step schedules within train.max_steps; with max_steps the run is defined by steps, and epoch
    # points beyond it are listed by the callbacks when training starts instead of refused
    from prunetrain.mt.config.recipe import load_recipe

    with pytest.raises(ValueError, match=r"^pruning.schedule_steps: step 600 is after the last training step "
                                         r"\(train.max_steps=500\)"):
        load_recipe("wmt-small-deen", ["train.max_steps=500", "pruning.schedule_steps={200: 0.25, 600: 0.5}",
                                       "pruning.shrink_steps=[]"])
    with pytest.raises(ValueError, match=r"^pruning.schedule: epoch 13 is after the last training epoch"):
        load_recipe("wmt-small-deen", ["train.max_steps=0", "pruning.schedule={0.5: 0.25, 13: 0.5}"])
    # a shrink follows a pruning step of the step schedule; test BLEU points lie within the run
    with pytest.raises(ValueError, match=r"^pruning.shrink_steps: 350 is not a step of pruning.schedule_steps "
                                         r"\[200, 300, 400, 500\]; a shrink follows a pruning step"):
        load_recipe("wmt-small-deen", ["pruning.shrink_steps=[300, 350]"])
    with pytest.raises(ValueError, match=r"^pruning.shrink_steps: \[300, 500\] needs pruning.mode=mask"):
        load_recipe("wmt-small-deen", ["pruning.mode=shrink"])
    with pytest.raises(ValueError, match=r"^eval.test_steps: step 1650 is after the last training step "
                                         r"\(train.max_steps=1600\)"):
        load_recipe("wmt-small-deen", ["train.max_steps=1600", "eval.test_steps=[300, 1650]"])
    with pytest.raises(ValueError, match=r"^pruning.method: 'magic' is not one of 'importance', 'l0'"):
        load_recipe("wmt-small-deen", ["pruning.method=magic"])
    with pytest.raises(ValueError, match=r"^pruning.l0_start_step: 1800 is not before the last training step"):
        load_recipe("wmt-small-deen", ["pruning.method=l0", "pruning.l0_start_step=1800", "train.max_steps=1800"])
    with pytest.raises(ValueError, match=r"^pruning.l0_target_heads: 200 is more than the model's 144 heads"):
        load_recipe("wmt-small-deen", ["pruning.method=l0", "pruning.l0_target_heads=200"])
    recipe = load_recipe("wmt-small-deen", ["train.max_steps=500", "pruning.schedule={0.5: 0.25, 13: 0.5}",
                                            "pruning.schedule_steps={}", "pruning.shrink_steps=[]",
                                            "eval.test_steps=[]"])
    assert recipe.pruning.schedule == {0.5: 0.25, 13.0: 0.5} and recipe.train.max_steps == 500
    # the recipe refuses the same mistakes, as one line on stderr with exit code 2
    result = run_cli("recipe", "wmt-small-deen", "--set", "pruning.schedule={2: 0.25, 1: 0.5}", "--show")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "pruning.schedule (epochs): [2.0, 1.0] is out of order" \
        in result.stderr


@pytest.mark.slow
def test_mid_epoch_shrink_resumes_after_kill_9_on_the_shrunk_model(tmp_path, multi30k_dir):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep
               + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    command = [sys.executable, str(SCRIPT), "--data", str(multi30k_dir)]

    def run(*extra):
        return subprocess.run(command + list(extra), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    full, killed = tmp_path / "full", tmp_path / "killed"
    done = run("--out", str(full))
    assert done.returncode == 0, done.stderr[-3000:]
    # SIGKILL at step 30: after both shrinks (steps 8 and 24, epochs 0.5 and 1.5) and checkpoint-24
    crashed = run("--out", str(killed), "--kill-at-step", "30")
    assert crashed.returncode == -9 and not (killed / "result.json").exists()
    resumed = run("--out", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((full / "result.json").read_text())
    b = json.loads((killed / "result.json").read_text())
    assert b["resumed_from"].endswith("checkpoint-24") and b["heads_at_resume"] == 12  # restored shrunk
    assert a["events"] == b["events"] == [[8, 18], [24, 12]]  # no point fired twice
    assert a["importance_steps"] == b["importance_steps"] == [8, 16, 24, 32]
    assert a["layout"] == b["layout"] and a["mask"] == b["mask"]
    assert pt.HeadLayout.from_dict(b["layout"]).total_heads == 12
