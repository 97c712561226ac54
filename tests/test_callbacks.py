"""Trainer callbacks on real (tiny) Trainer runs: pruning events, curves that leave training untouched, Hard-Concrete
gates trained through the documented gradient path, resume after a real kill, DDP with torchrun, TensorBoard."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import (BertConfig, BertForSequenceClassification, MarianMTModel, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments, Trainer, TrainerCallback, TrainingArguments)

import prunetrain as pt
from prunetrain.methods.curve import accuracy_metric
from prunetrain.mt.evaluation.metrics import bleu_metric
from prunetrain.training.callbacks import HardConcreteCallback, HeadPruningCallback, PruningCurveCallback
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.utils.plots import read_image_tags, read_scalars
from test_distributed import _run as run_ranks, _torchrun

TINY_SCRIPT = Path(__file__).parent / "dist" / "train_tiny.py"


@pytest.fixture(scope="module")
def tiny_mt(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=256)
    valid = read_parallel(multi30k_dir, "valid", limit=8)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    return pairs, valid, tokenizer


def _marian(tokenizer, seed=0):
    torch.manual_seed(seed)
    return MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                       attn_implementation="eager"))


def _seq2seq_trainer(tmp_path, tiny_mt, callbacks, epochs=2, model=None):
    pairs, _, tokenizer = tiny_mt
    model = model or _marian(tokenizer)
    dataset = build_dataset(pairs, tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), num_train_epochs=epochs, per_device_train_batch_size=32,
                                    learning_rate=2e-3, save_strategy="no", report_to=[], use_cpu=True,
                                    logging_steps=4, seed=0, disable_tqdm=True)
    return Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                          processing_class=tokenizer, callbacks=callbacks)


class _DeepSpeedEngine(torch.nn.Module):
    """Stands in for a DeepSpeed engine only by its class name, which is all the engine check reads."""


_DeepSpeedEngine.__name__ = "DeepSpeedEngine"


class _Snapshot(TrainerCallback):
    """Copies some tensors of the model at the end of epoch `epoch` (after the callbacks before it have run)."""

    def __init__(self, pick, epoch):
        self.pick, self.epoch, self.weights = pick, epoch, {}

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if round(state.epoch) == self.epoch:
            self.weights = {k: v.detach().clone() for k, v in self.pick(model).items()}


def _fixed_batches(tiny_mt, model, count=2):
    pairs, _, tokenizer = tiny_mt
    dataset = build_dataset(pairs[: 16 * count], tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    return [collator([dataset[i] for i in range(j, j + 16)]) for j in range(0, 16 * count, 16)]


def test_mask_mode_prunes_on_schedule_and_logs_to_tensorboard(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    callback = HeadPruningCallback(at_epochs=[1, 2], prune={1: 0.25, 2: 12}, batches=_fixed_batches(tiny_mt, model))
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback], model=model)
    trainer.train()
    assert callback.mask.num_kept == 12 and callback.mask.attached
    events = json.loads((tmp_path / "prunetrain" / "pruning_events.json").read_text())
    # 256 pairs in batches of 32: 8 steps per epoch; epoch 1 ends at step 8, epoch 2 at step 16
    assert [(e["step"], e["epoch"], e["heads_before"], e["heads_after"]) for e in events] == [(8, 1.0, 24, 18),
                                                                                            (16, 2.0, 18, 12)]
    assert sum(events[1]["per_kind_after"].values()) == 12
    assert (tmp_path / "prunetrain" / "importance_step8_epoch1.00.json").is_file()
    scalars = read_scalars(tmp_path / "prunetrain" / "tensorboard")
    assert scalars["prunetrain/heads_alive"] == [(8, 18.0), (16, 12.0)]
    assert scalars["prunetrain/sparsity"][-1] == (16, 0.5)
    stability = json.loads((tmp_path / "prunetrain" / "importance_stability.json").read_text())
    assert [(s["from_step"], s["to_step"], s["heads_compared"]) for s in stability] == [(8, 16, 18)]
    assert -1 <= stability[0]["spearman"] <= 1
    assert [s for s, _ in scalars["prunetrain/importance_spearman_vs_previous"]] == [16]
    assert read_image_tags(tmp_path / "prunetrain" / "tensorboard") == {"prunetrain/importance": 2}
    final = pt.HeadMask.from_json(tmp_path / "prunetrain" / "final_mask.json", model)
    assert final == callback.mask
    # the mask is really in effect: a masked head's q rows get no gradient through the loss, a kept head's do
    model.zero_grad()
    model(**_fixed_batches(tiny_mt, model, count=1)[0]).loss.backward()
    head_dim = 32 // 4
    for site in pt.find_heads(model):
        if site.kind != "encoder_self":
            continue
        layer = int(site.layer)
        grad = model.model.encoder.layers[layer].self_attn.q_proj.weight.grad.view(4, head_dim, -1)
        for head, keep in enumerate(callback.mask[site.name].tolist()):
            assert (grad[head].abs().sum() > 0) == bool(keep), (site.name, head)


def test_shrink_mode_removes_heads_mid_training_and_keeps_learning(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    callback = HeadPruningCallback(at_epochs=[1], prune={1: 0.5}, mode="shrink", batches=_fixed_batches(tiny_mt, model))
    snapshot = _Snapshot(lambda m: {"q": m.model.encoder.layers[0].self_attn.q_proj.weight}, epoch=1)
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback, snapshot], epochs=3, model=model)
    params_before = sum(p.numel() for p in model.parameters())
    trainer.train()
    assert pt.find_heads(model).total_heads == 12
    assert sum(p.numel() for p in model.parameters()) < params_before
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    steps_per_epoch = 8
    assert losses[-1] < losses[steps_per_epoch // 4]  # still learning after the shrink at the end of epoch 1
    # the shrunk weights are the optimizer's (same objects), their Adam state has their new shape, and they moved
    # after the shrink
    q = model.model.encoder.layers[0].self_attn.q_proj.weight
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    assert any(p is q for group in optimizer.param_groups for p in group["params"])
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert optimizer.state[p]["exp_avg"].shape == p.shape
    assert snapshot.weights["q"].shape == q.shape and not torch.equal(snapshot.weights["q"], q.detach())


def test_masks_first_then_a_mid_training_shrink_timed_by_the_training_clock(tmp_path, tiny_mt):
    """prune_steps {4: 0.25, 8: 0.5} as masks, the masked heads removed at step 8 (optimizer state sliced), training
    going on with 12 heads; the clock (registered first) evaluates before the pruning of its step, counts heads as the
    masks leave them, and splits the step rate at the shrink. Its metric leaves training bit-identical."""
    from prunetrain.training.metric_points import MetricPointsCallback

    def run(directory, with_clock):
        model = _marian(tiny_mt[2])
        pruning = HeadPruningCallback(at_epochs=[], prune_steps={4: 0.25, 8: 0.5}, shrink_steps=[8],
                                      batches=_fixed_batches(tiny_mt, model))
        clock = MetricPointsCallback(lambda m: {"value": float(torch.rand(1)), "present": pt.find_heads(m).total_heads,
                                                "training": m.training}, at_steps=[4, 12])  # draws from the RNG
        trainer = _seq2seq_trainer(directory, tiny_mt, ([clock] if with_clock else []) + [pruning], model=model)
        params_before = sum(p.numel() for p in model.parameters())
        trainer.train()
        return model, trainer, pruning, clock, params_before

    model, trainer, pruning, clock, params_before = run(tmp_path / "a", True)
    assert [(e["step"], e["mode"], e["heads_before"], e["heads_after"]) for e in pruning.events] == [
        (4, "mask", 24, 18), (8, "mask", 18, 12), (8, "shrink", 24, 12)]
    assert pt.find_heads(model).total_heads == 12 and not pt.attached_masks(model)
    assert sum(p.numel() for p in model.parameters()) < params_before
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert optimizer.state[p]["exp_avg"].shape == p.shape
    records = clock.records
    assert [(r["step"], r["heads"], r["present"], r["training"]) for r in records] == [
        (4, 24, 24, False), (12, 12, 12, False)]
    assert records[0]["parameters"] == params_before > records[1]["parameters"]
    assert all(isinstance(r["step_seconds"], float) and isinstance(r["wall_seconds"], float) for r in records)
    assert [(g["from_step"], g["to_step"], g["steps"], g["heads"]) for g in clock.segments] == [
        (1, 8, 8, 24), (9, 16, 8, 12)]
    assert [g["parameters"] for g in clock.segments] == [records[0]["parameters"], records[1]["parameters"]]
    saved = json.loads((tmp_path / "a" / "prunetrain" / "metric_points.json").read_text())
    assert [r["step"] for r in saved["records"]] == [4, 12]
    plain, *_ = run(tmp_path / "b", False)
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"^shrink_steps: 6 is not a step of prune_steps \[4, 8\]"):
        HeadPruningCallback(prune_steps={4: 0.25, 8: 0.5}, shrink_steps=[6])
    with pytest.raises(ValueError, match=r"^shrink_steps: \[8\] needs mode='mask'"):
        HeadPruningCallback(prune_steps={4: 0.25, 8: 0.5}, shrink_steps=[8], mode="shrink")


def test_curve_callback_leaves_training_bit_identical(tmp_path, tiny_mt):
    """Same seed with and without the curve callback: the final weights must be identical (RNG, masks and mode
    restored; nothing of the curve leaks into training)."""
    _, valid, tokenizer = tiny_mt
    plain = _seq2seq_trainer(tmp_path / "plain", tiny_mt, [])
    plain.train()
    model = _marian(tokenizer)
    curve = PruningCurveCallback(at_epochs=[1, 2], fractions=[0, 0.5], metric=bleu_metric(tokenizer, valid, batch_size=8),
                                 metric_key="bleu", importance_batches=_fixed_batches(tiny_mt, model), order="both", random_seeds=[3])
    with_curve = _seq2seq_trainer(tmp_path / "curve", tiny_mt, [curve], model=model)
    with_curve.train()
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), with_curve.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert pt.attached_masks(with_curve.model) == []
    curves = json.loads((tmp_path / "curve" / "prunetrain" / "curves.json").read_text())
    assert set(curves) == {"8", "16"} and set(curves["16"]["curves"]) == {"importance", "random_seed3"}
    assert (curves["16"]["step"], curves["16"]["epoch"], curves["16"]["label"]) == (16, 2.0, "step 16 (epoch 2.00)")
    points = curves["16"]["curves"]["importance"]["points"]
    assert [p["fraction"] for p in points] == [0.0, 0.5] and [p["heads_kept"] for p in points] == [24, 12]
    assert all(0 <= p["value"] <= 100 for p in points)
    assert (tmp_path / "curve" / "prunetrain" / "curves.png").is_file()
    tags = read_image_tags(tmp_path / "curve" / "prunetrain" / "tensorboard")
    assert tags == {"prunetrain/pruning_curves": 2}
    scalars = read_scalars(tmp_path / "curve" / "prunetrain" / "tensorboard")
    assert [step for step, _ in scalars["prunetrain/curve_bleu/pruned_50pct"]] == [8, 16]


def test_encoder_classifier_with_trainer(tmp_path, multi30k_dir):
    """Language identification (German or English sentence) with a tiny BERT classifier: real text, real labels."""
    pairs = read_parallel(multi30k_dir, "train", limit=96)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    labels = [0] * len(pairs) + [1] * len(pairs)
    enc = tokenizer(texts, truncation=True, max_length=24)
    dataset = [{"input_ids": ids, "labels": y} for ids, y in zip(enc["input_ids"], labels)]
    from transformers import DataCollatorWithPadding

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64, num_labels=2,
                                                     pad_token_id=tokenizer.pad_token_id))
    collate = DataCollatorWithPadding(tokenizer)
    batches = [collate(dataset[i:i + 16]) for i in (0, 100)]
    prune = HeadPruningCallback(at_epochs=[1, 2], prune={2: 0.5}, batches=batches)
    curve = PruningCurveCallback(at_epochs=[2], fractions=[0, 0.5, 0.75], metric=accuracy_metric(batches),
                                 metric_key="accuracy",
                                 importance_batches=batches)
    gates = HardConcreteCallback(lam=0.01, output_dir=str(tmp_path / "gates"))
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=16,
                             learning_rate=2e-3, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                             disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, processing_class=tokenizer,
            callbacks=[prune, curve, gates]).train()
    assert prune.mask.num_kept == 4
    curves = json.loads((tmp_path / "prunetrain" / "curves.json").read_text())
    (entry,) = curves.values()
    assert entry["epoch"] == 2.0 and entry["fractions_of"] == "heads present" and entry["heads_present"] == 4
    # after prune={2: 0.5} the curve spans the 4 heads still present: 0 %, 50 % (2 left) and 75 % (1 left)
    assert [p["heads_kept"] for p in entry["curves"]["importance"]["points"]] == [4, 2, 1]
    assert gates.final_mask is not None and len(gates.history) == 2


def test_hard_concrete_gradient_path_equals_explicit_penalty_in_the_loss(tiny_mt):
    """The callback adds ∇[λ Σ (1 − P(g = 0))] to the gate gradients at the optimizer step; that must equal
    back-propagating L_xent + λ·L0 through one loss."""
    _, _, tokenizer = tiny_mt
    batch = _fixed_batches(tiny_mt, _marian(tokenizer), count=1)[0]
    results = []
    for path in ("callback", "explicit"):
        model = _marian(tokenizer)
        callback = HardConcreteCallback(lam=0.3, gate_lr=0.05)
        callback.on_init_end(TrainingArguments(output_dir="unused", report_to=[], use_cpu=True), None, None,
                             model=model)
        model.train()
        torch.manual_seed(7)  # the same gate samples and dropout in both paths
        loss = model(**batch).loss
        if path == "callback":
            loss.backward()
            callback.on_optimizer_step(None, None, None)
        else:
            (loss + callback.gates.penalty(0.3)).backward()
            callback._gate_optimizer.step()
        results.append({k: v.detach().clone() for k, v in callback.gates.state_dict().items()})
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        assert torch.allclose(results[0][key], results[1][key], atol=1e-7), key
    assert any(not torch.allclose(v, torch.full_like(v, 3.0), atol=1e-2) for v in results[0].values())


def test_hard_concrete_budget_reaches_the_target(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    callback = HardConcreteCallback(target_heads=8, gate_lr=0.1, lagrangian_lr=0.1, finalize="shrink",
                                    init_log_alpha=1.0)
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=4, model=model)
    trainer.train()
    history = json.loads((tmp_path / "prunetrain" / "gates_history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert history[-1]["lambda_1"] > 0  # the multiplier grew while the budget was exceeded
    # the expected L0 starts near all 24 heads open and ends on the budget of 8
    assert history[0]["expected_l0"] > 16 and abs(history[-1]["expected_l0"] - 8) < 1.5
    assert callback.final_mask.num_kept == 8  # the budget is met exactly by the final mask
    assert pt.find_heads(model).total_heads == 8
    assert read_image_tags(tmp_path / "prunetrain" / "tensorboard")["prunetrain/gate_p_open"] == 4


def test_hard_concrete_gates_join_training_at_start_step(tmp_path, tiny_mt):
    """Before `start_step` the model trains without gates (bit-identical to a run without the callback) and the gates
    do not move; after it they train to the budget and the final mask meets it."""
    class Watch(TrainerCallback):
        def __init__(self, gates_of):
            self.gates_of, self.seen = gates_of, {}

        def on_step_end(self, args, state, control, **kwargs):
            gates = self.gates_of()
            self.seen[state.global_step] = (gates.attached, torch.cat([p.detach().flatten().clone()
                                                                        for p in gates.parameters()]))

    model, plain = _marian(tiny_mt[2]), _marian(tiny_mt[2])
    callback = HardConcreteCallback(target_heads=8, gate_lr=0.1, lagrangian_lr=0.1, start_step=8, finalize="none")
    watch = Watch(lambda: callback.gates)
    snapshot, plain_snapshot = (_Snapshot(lambda m: dict(m.named_parameters()), epoch=1) for _ in range(2))
    _seq2seq_trainer(tmp_path / "a", tiny_mt, [callback, watch, snapshot], epochs=3, model=model).train()
    _seq2seq_trainer(tmp_path / "b", tiny_mt, [plain_snapshot], epochs=3, model=plain).train()
    # epoch 1 = steps 1..8: the same weights as without gates; the gates attach at the end of step 8
    for name, weight in plain_snapshot.weights.items():
        assert torch.equal(snapshot.weights[name], weight), name
    assert [step for step, (attached, _) in sorted(watch.seen.items()) if attached] == list(range(8, 25))
    start = watch.seen[1][1]  # log α as initialised (3 plus seeded noise)
    assert all(torch.equal(values, start) for step, (_, values) in watch.seen.items() if step <= 8)
    assert not torch.equal(watch.seen[24][1], start)  # they trained after joining
    history = json.loads((tmp_path / "a" / "prunetrain" / "gates_history.json").read_text())
    # no gate record before the gates exist in training; they join at the end of step 8, which ends epoch 1
    assert [h["step"] for h in history] == [8, 16, 24]
    assert callback.final_mask.num_kept == 8
    with pytest.raises(ValueError, match=r"^start_step: -1 is not allowed; expected an integer >= 0"):
        HardConcreteCallback(target_heads=8, start_step=-1)


def test_voita_encoder_only_gating_with_frozen_decoder(tmp_path, tiny_mt):
    model = _marian(tiny_mt[2])
    decoder_before = copy.deepcopy(model.model.decoder.layers[0].self_attn.q_proj.weight.detach())
    encoder_before = copy.deepcopy(model.model.encoder.layers[0].self_attn.q_proj.weight.detach())
    callback = HardConcreteCallback(lam=0.05, kinds=["encoder_self"], freeze="decoder")
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    trainer = _seq2seq_trainer(tmp_path, tiny_mt, [callback], epochs=1, model=model)
    assert not model.model.decoder.layers[0].self_attn.q_proj.weight.requires_grad  # frozen once the Trainer is built
    trainer.train()
    assert torch.equal(decoder_before, model.model.decoder.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(encoder_before, model.model.encoder.layers[0].self_attn.q_proj.weight)
    assert set(callback.final_mask.kept_per_kind()) == {"encoder_self", "decoder_self", "cross"}
    assert callback.final_mask.kept_per_kind()["cross"] == 8  # not gated
    # freeze and unfreeze are symmetric: after training every parameter is trainable again, as before
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags and callback._frozen == []


def test_restore_layout_shrinks_a_fresh_or_partly_shrunk_model_to_the_recorded_heads(tmp_path, tiny_mt):
    from prunetrain.engine.heads import LAYOUT_CONFIG_KEY
    from prunetrain.training import restore_layout

    model = _marian(tiny_mt[2])
    site = pt.find_heads(model).names[0]
    (tmp_path / "config.json").write_text(json.dumps({LAYOUT_CONFIG_KEY: {site: [1, 3]}}))
    pt.shrink(model, pt.HeadMask.from_heads(model, {site: [0]}))  # part of the way already
    layout = restore_layout(model, tmp_path)
    assert layout[site].heads == (1, 3) and layout.total_heads == 22
    assert restore_layout(model, tmp_path)[site].heads == (1, 3)  # nothing left to do
    (tmp_path / "config.json").write_text(json.dumps({LAYOUT_CONFIG_KEY: {site: [0, 1]}}))
    with pytest.raises(ValueError, match=r"keeps heads \[0\] that the model no longer has"):
        restore_layout(model, tmp_path)


def test_bad_configuration_is_rejected_with_the_argument_named(tmp_path, tiny_mt):
    with pytest.raises(ValueError, match=r"at_epochs: 0 is not valid"):
        HeadPruningCallback(at_epochs=[0])
    with pytest.raises(ValueError, match=r"prune\[5\]: 1.5 is not a fraction in \[0, 1\]"):
        HeadPruningCallback(prune={5: 1.5})
    with pytest.raises(ValueError, match=r"prune\[3\]: -2 is negative"):
        HeadPruningCallback(prune={3: -2})
    with pytest.raises(ValueError, match=r"prune\[8\]: 0.2 is less than the 0.4 pruned before"):
        HeadPruningCallback(prune={5: 0.4, 8: 0.2})
    with pytest.raises(ValueError, match=r"mode: 'cut' is not one of 'mask', 'shrink'"):
        HeadPruningCallback(mode="cut")
    with pytest.raises(ValueError, match=r"kinds: 'decoder' is not an attention kind"):
        HeadPruningCallback(kinds=["decoder"])
    metric = bleu_metric(tiny_mt[2], [("a", "b")])
    with pytest.raises(ValueError, match=r"fractions: 1.2 is not a fraction in \[0, 1\]"):
        PruningCurveCallback(fractions=[0, 1.2], metric=metric)
    with pytest.raises(ValueError, match=r"metric: 'bleu' is not a callable model -> float \| dict"):
        PruningCurveCallback(metric="bleu")
    with pytest.raises(ValueError, match=r"order: 'sorted' is not one of 'importance', 'random', 'both'"):
        PruningCurveCallback(metric=metric, order="sorted")
    with pytest.raises(ValueError, match=r"lam: -1 is not allowed; expected a finite number >= 0"):
        HardConcreteCallback(lam=-1)
    with pytest.raises(ValueError, match=r"lam, target_heads, target_flops: give exactly one"):
        HardConcreteCallback(lam=0.1, target_heads=4)
    with pytest.raises(ValueError, match=r"target_heads: 1.5 is not a share in \(0, 1\]"):
        HardConcreteCallback(target_heads=1.5)
    # checks that need the model and the training arguments run when the Trainer is built
    with pytest.raises(ValueError, match=r"at_epochs/prune: epoch 5 is beyond training, which runs 2 epochs"):
        _seq2seq_trainer(tmp_path, tiny_mt, [HeadPruningCallback(at_epochs=[1, 5])])
    with pytest.raises(ValueError, match=r"prune\[1\]: 30 heads is more than the 24 heads in scope"):
        _seq2seq_trainer(tmp_path, tiny_mt, [HeadPruningCallback(prune={1: 30})])
    with pytest.raises(ValueError, match=r"kinds: this model has no 'self' attention"):
        _seq2seq_trainer(tmp_path, tiny_mt, [HardConcreteCallback(lam=0.1, kinds=["self"])])
    # tiny_mt has 6 sites of 4 heads: min_heads_per_layer=1 keeps 6, so at most 18 of 24 (75 %) can go
    with pytest.raises(ValueError, match=r"fractions: 0.8 cannot be reached with min_heads_per_layer=1 on this model"):
        _seq2seq_trainer(tmp_path, tiny_mt, [PruningCurveCallback(fractions=[0, 0.8], metric=metric,
                                                                   min_heads_per_layer=1)])
    _seq2seq_trainer(tmp_path, tiny_mt, [PruningCurveCallback(fractions=[0, 0.75], metric=metric,
                                                              min_heads_per_layer=1)])
    # engines prunetrain cannot serve are refused by name when the Trainer is built
    with pytest.raises(ValueError, match=r"HeadPruningCallback: not supported under deepspeed_zero3; ZeRO-3 \(or a "
                                         r"DeepSpeed config whose ZeRO stage cannot be read\) partitions every "
                                         r"parameter"):
        HeadPruningCallback().on_init_end(TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True),
                                          None, None, model=_DeepSpeedEngine())


# ---------------------------------------------------------------------------------------------------------------------
# subprocess runs: resume after a real kill, and DDP with torchrun
# ---------------------------------------------------------------------------------------------------------------------
def _run(args, cwd, env=None):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["prune-mask", "prune-shrink", "prune-mask-shrink", "gates", "prune-ffn-mask-shrink"])
def test_killed_and_resumed_run_ends_with_the_same_masks(tmp_path, multi30k_dir, mode):
    full, killed = tmp_path / "full", tmp_path / "killed"
    command = [sys.executable, str(TINY_SCRIPT), "--data", str(multi30k_dir), "--callback", mode]
    command += ["--clock"] if mode == "prune-mask-shrink" else []  # the training clock's FLOPs survive the kill too
    done = _run(command + ["--out", str(full)], tmp_path, _env())
    assert done.returncode == 0, done.stderr[-3000:]
    # start again and kill -9 the process once the epoch-2 checkpoint (with our state) is on disk
    process = subprocess.Popen(command + ["--out", str(killed)], cwd=tmp_path, env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = killed / "checkpoint-32" / f"prunetrain-{'hard-concrete' if mode == 'gates' else 'head-pruning'}.json"
    deadline = time.time() + 600
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), process.stderr.read()[-3000:] if process.poll() is not None else "timed out"
    process.send_signal(signal.SIGKILL)  # at once: tiny epochs take well under a second
    process.wait()
    assert not (killed / "rank0_result.json").exists()  # it really died before the end
    resumed = _run(command + ["--out", str(killed), "--resume"], tmp_path, _env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((full / "rank0_result.json").read_text())
    b = json.loads((killed / "rank0_result.json").read_text())
    assert b["resumed_from"] is not None
    assert a["mask"] == b["mask"] and a["layout"] == b["layout"]
    if mode == "prune-mask-shrink":  # killed on the model shrunk at step 32, resumed on it: 18 heads present, 12 kept
        assert sum(len(s["heads"]) for s in b["layout"]["sites"]) == 18
        assert sum(sum(v) for v in b["mask"]["sites"].values()) == 12
        assert a["flops"] == b["flops"] > 0 and a["flop_records"] == b["flop_records"]
        assert [target for _, _, target in b["flop_records"]] == [2e8, 6e8]
    if mode == "prune-ffn-mask-shrink":  # heads and FFN neurons shrunk at step 32, resumed on the shrunk model
        assert {"heads", "neurons"} == set(b["layout"]["units"])
        assert a["weights_sum"] == b["weights_sum"]  # the same training to the last bit
    if mode == "gates":  # gates on heads and neurons, their Lagrangian and both optimizers resumed
        assert any(name.endswith("fc2") for name in a["mask"]["sites"])
        for key in a["log_alpha"]:
            assert torch.allclose(torch.tensor(a["log_alpha"][key]), torch.tensor(b["log_alpha"][key]), atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["prune-mask", "gates"])
def test_ddp_ranks_hold_identical_masks_and_only_rank0_writes(tmp_path, multi30k_dir, mode):
    out = tmp_path / "ddp"
    done = run_ranks(_torchrun(TINY_SCRIPT, "--data", str(multi30k_dir), "--callback", mode, "--out", str(out),
                               "--epochs", "2" if mode == "gates" else "4"), tmp_path)
    r0 = json.loads((out / "rank0_result.json").read_text())
    r1 = json.loads((out / "rank1_result.json").read_text())
    assert r0["mask"] == r1["mask"]
    if mode == "gates":
        assert r0["log_alpha"] == r1["log_alpha"]
    else:
        assert sum(sum(1 for v in keep if v) for keep in r0["mask"]["sites"].values()) == 12
    event_files = list((out / "prunetrain" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1  # rank 0 only
    # one log line per event, from rank 0 only
    if mode == "gates":
        assert done.stderr.count("prunetrain: epoch ") == 2 and done.stderr.count("prunetrain: final gates") == 1
    else:
        assert done.stderr.count("pruned heads") == 3
