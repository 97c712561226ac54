"""Distillation while pruning (`DistillationCallback`): L = (1 − α)·CE + α·T²·KL(teacher ‖ student), real Trainer runs
on a real corpus with real HF models built from configs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel, Trainer, \
    TrainingArguments

import prunetrain as pt
from prunetrain.bench.step_flops import measured_step_flops
from prunetrain.training.distillation import DistillationCallback, distillation_kl
from test_training_flops import _batches, _marian, _pruning, _trainer, tiny_mt  # noqa: F401  (fixture)


def _manual_kl(student, teacher, T):
    p = F.softmax(teacher / T, -1)
    return (p * (F.log_softmax(teacher / T, -1) - F.log_softmax(student / T, -1))).sum() * T * T


def test_kl_counts_the_positions_the_cross_entropy_counts():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, -100, -100, -100]])
    kl, count = distillation_kl(student, teacher, labels, 2.0, "seq2seq")
    keep = labels != -100
    assert count == 5 and torch.allclose(kl, _manual_kl(student[keep], teacher[keep], 2.0))
    kl, count = distillation_kl(student, teacher, labels, 1.0, "causal")  # logits at t predict label t + 1
    keep = labels[:, 1:] != -100
    assert count == 3 and torch.allclose(kl, _manual_kl(student[:, :-1][keep], teacher[:, :-1][keep], 1.0))
    kl, count = distillation_kl(student[:, 0], teacher[:, 0], torch.tensor([1, 0]), 3.0, "classes")
    assert count == 2 and torch.allclose(kl, _manual_kl(student[:, 0], teacher[:, 0], 3.0))
    assert float(distillation_kl(student, student.clone(), labels, 2.0, "seq2seq")[0]) == pytest.approx(0, abs=1e-6)


def test_alpha_zero_is_plain_training_bit_for_bit(tmp_path, tiny_mt):
    plain = _marian(tiny_mt[1])
    _trainer(tmp_path / "plain", tiny_mt, plain, [], epochs=1).train()
    distilled = _marian(tiny_mt[1])
    _trainer(tmp_path / "zero", tiny_mt, distilled, [DistillationCallback(alpha=0.0)], epochs=1).train()
    for (name, a), b in zip(plain.state_dict().items(), distilled.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_trained_loss_is_the_combined_loss(tiny_mt):
    """The loss the wrapped student returns equals (1 − α)·CE + α·T²·KL/tokens computed by hand."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config

    torch.manual_seed(0)
    config = marian_config(tiny_mt[1], d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.0)
    student, teacher = MarianMTModel(config).train(), MarianMTModel(config).eval()
    batch = _batches(tiny_mt, student)[0]
    callback = DistillationCallback(teacher, alpha=0.3, temperature=2.0)
    callback._task = "seq2seq"
    callback._wrap(student)
    combined = student(**batch).loss
    callback._unwrap()
    with torch.no_grad():
        student_logits, teacher_logits = student(**batch).logits, teacher(**batch).logits
    keep = batch["labels"] != -100
    ce = F.cross_entropy(student_logits[keep], batch["labels"][keep])
    kl = _manual_kl(student_logits[keep], teacher_logits[keep], 2.0) / int(keep.sum())
    assert torch.allclose(combined, 0.7 * ce + 0.3 * kl, rtol=1e-5), (combined, ce, kl)
    assert callback.last == pytest.approx({"kl": float(kl), "cross_entropy": float(ce)}, rel=1e-5)


def test_a_trainer_that_takes_the_labels_gets_the_combined_loss_through_loss_func_or_an_error(tmp_path, tiny_mt):
    """With label smoothing the Trainer calls the model without labels and computes the loss itself: through
    `loss_func(LabelSmoother(ε))` it trains on (1 − α)·smoothed CE + α·T²·KL, the same as a model whose own loss
    is that smoothed CE would; without it the first step raises instead of training without distillation."""
    from transformers.trainer_pt_utils import LabelSmoother

    teacher = _marian(tiny_mt[1], seed=1).eval()
    smoothing = LabelSmoother(epsilon=0.1)
    batch = _batches(tiny_mt, _marian(tiny_mt[1]))[0]
    student = _marian(tiny_mt[1]).train()
    callback = DistillationCallback(teacher, alpha=0.4, temperature=2.0)
    callback._task, callback._autocast = "seq2seq", ("cpu", None)
    callback._wrap(student)
    labels = batch["labels"]
    outputs = student(**{k: v for k, v in batch.items() if k != "labels"})
    assert outputs.loss is None and callback._pending is not None
    combined = callback.loss_func(smoothing)(outputs, labels)
    assert callback._pending is None
    with torch.no_grad():
        teacher_logits = teacher(**batch).logits
    keep = labels != -100
    kl = _manual_kl(outputs.logits.detach()[keep], teacher_logits[keep], 2.0) / int(keep.sum())
    expected = 0.6 * smoothing(outputs, labels) + 0.4 * kl
    assert torch.allclose(combined, expected, rtol=1e-5), (combined, expected)
    callback._unwrap()

    trainer = _trainer(tmp_path / "smoothed", tiny_mt, _marian(tiny_mt[1]), [DistillationCallback(teacher, alpha=0.4)],
                       epochs=1, max_steps=2, label_smoothing_factor=0.1)
    with pytest.raises(ValueError, match=r"^DistillationCallback: the Trainer computed the loss outside the model "
                                         r".* give the Trainer compute_loss_func=callback.loss_func\(base\)"):
        trainer.train()
    distill = DistillationCallback(teacher, alpha=0.4)
    trainer = _trainer(tmp_path / "through", tiny_mt, _marian(tiny_mt[1]), [distill], epochs=1, max_steps=2,
                       label_smoothing_factor=0.1, logging_steps=1)
    trainer.compute_loss_func = distill.loss_func(smoothing)
    trainer.train()
    assert [e["distill/kl"] > 0 for e in trainer.state.log_history if "loss" in e] == [True, True]
    assert distill.teacher_flops > 0


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_flop_budget_counts_the_student_alone_with_and_without_label_smoothing(tmp_path, tiny_mt, smoothing):
    """The FLOP meter fits the student's step FLOPs on probes cut from a training batch, and with distillation those
    probes go through the student's wrapped forward. They must measure the student alone: no teacher forward in
    the student's count, no teacher call counted as the teacher's, and with label smoothing (the Trainer computes
    the loss) no probe may leave teacher terms pending, which made the meter give up counting, so that a FLOP
    budget never ended the run. Step for step the student's FLOPs equal an undistilled run's; the budget stops the
    distilled run at the same step; the teacher's FLOPs are its calls in training steps, one per step."""
    from transformers.trainer_pt_utils import LabelSmoother

    from prunetrain.training.metric_points import MetricPointsCallback
    from test_training_flops import _PerStep

    plain_clock = MetricPointsCallback(lambda m: 0.0)
    plain = _PerStep(plain_clock)
    _trainer(tmp_path / "plain", tiny_mt, _marian(tiny_mt[1]), [plain_clock, _pruning(), plain], epochs=1,
             max_steps=8, label_smoothing_factor=smoothing).train()
    budget = (plain.totals[5] + plain.totals[6]) / 2  # reached at step 7
    teacher = _marian(tiny_mt[1], seed=1)
    calls = []
    teacher.register_forward_pre_hook(  # the teacher's calls in the student's forwards (under no_grad), not the
        lambda module, args, kwargs: calls.append(dict(kwargs)) if not torch.is_grad_enabled() else None,
        with_kwargs=True)  # probes of the teacher's own FLOP fit
    clock = MetricPointsCallback(lambda m: 0.0, max_flops=budget)
    distilled = _PerStep(clock)
    distill = DistillationCallback(teacher, alpha=0.5)
    trainer = _trainer(tmp_path / "distilled", tiny_mt, _marian(tiny_mt[1]), [clock, _pruning(), distill, distilled],
                       epochs=1, max_steps=8, label_smoothing_factor=smoothing)
    if smoothing:
        trainer.compute_loss_func = distill.loss_func(LabelSmoother(epsilon=smoothing))
    trainer.train()
    assert clock.meter.counted and clock.budget_reached_at_step == trainer.state.global_step == 7
    assert distilled.totals == plain.totals[:7] and len(clock.meter.fits) == 2  # refitted after the shrink at 6
    assert len(calls) == 7 and distill.teacher_flops == sum(measured_step_flops(teacher, c) for c in calls) > 0


def test_distilling_from_a_snapshot_through_mid_training_shrinks(tmp_path, tiny_mt):
    """teacher=None: a frozen copy of the student at the start; shrinks change the student, never the teacher;
    the two terms join the Trainer's logs."""
    student = _marian(tiny_mt[1])
    start = copy.deepcopy(student.state_dict())
    callback = DistillationCallback(alpha=0.5, temperature=2.0)
    trainer = _trainer(tmp_path, tiny_mt, student, [_pruning(), callback], epochs=1, logging_steps=2,
                       max_steps=8)
    trainer.train()
    assert sum(s.num_heads for s in pt.find_heads(student)) < sum(s.num_heads for s in pt.find_heads(
        callback.teacher))
    for name, value in callback.teacher.state_dict().items():
        assert torch.equal(value, start[name]), name  # frozen: the teacher is the student as it began
    assert not any(p.requires_grad for p in callback.teacher.parameters())
    logged = [h for h in trainer.state.log_history if "distill/kl" in h]
    assert logged and all(h["distill/kl"] >= 0 for h in logged)
    assert "forward" not in vars(student)  # the wrapper is gone after training


def test_causal_lm_and_classifier(tmp_path):
    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=32))
    ids = torch.randint(0, 50, (16, 12))
    rows = [{"input_ids": i, "labels": i} for i in ids]
    args = TrainingArguments(str(tmp_path / "gpt"), max_steps=2, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True)
    callback = DistillationCallback(alpha=0.5)
    Trainer(model=gpt, args=args, train_dataset=rows, callbacks=[callback]).train()
    assert callback.last["kl"] > 0 and callback.teacher_flops > 0
    bert = BertForSequenceClassification(BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                                    num_hidden_layers=2, vocab_size=50, num_labels=3))
    rows = [{"input_ids": i, "labels": torch.tensor(k % 3)} for k, i in enumerate(ids)]
    args = TrainingArguments(str(tmp_path / "bert"), max_steps=2, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True)
    teacher, seen = copy.deepcopy(bert), []
    teacher.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(dict(kwargs)) if not torch.is_grad_enabled() else None,
        with_kwargs=True)  # the run's teacher calls (under no_grad), not the fit's probes
    callback = DistillationCallback(teacher, alpha=0.5)
    trainer = Trainer(model=bert, args=args, train_dataset=rows, callbacks=[callback])
    trainer.train()
    assert trainer.state.global_step == 2 and callback.last["kl"] > 0
    # the pooler and the classifier act once per sequence (FLOPs ∝ batch, not length): counted exactly all the same
    assert len(seen) == 2 and callback.teacher_flops == sum(measured_step_flops(teacher, k) for k in seen) > 0


@pytest.mark.parametrize("kwargs,message", [
    ({"alpha": 1.5}, r"alpha: 1.5 is not allowed; expected a number in \[0, 1\]"),
    ({"alpha": True}, r"alpha: True is not allowed"),
    ({"temperature": 0}, r"temperature: 0 is not allowed; expected a finite number > 0"),
    ({"temperature": float("nan")}, r"temperature: nan is not allowed"),
    ({"teacher": "bert-base"}, r"teacher: 'bert-base' is not a torch module"),
    ({"tensorboard": "no"}, r"tensorboard: 'no'"),
])
def test_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistillationCallback(**kwargs)


def test_the_snapshot_carries_no_hooks_and_masks_are_refused(tiny_mt):
    from prunetrain.training.compute import TrainingFlopMeter
    from prunetrain.training.distillation import frozen_copy

    student = _marian(tiny_mt[1])
    meter = TrainingFlopMeter()
    meter.attach(student)  # a hook on the student: it must not count the teacher's forwards
    teacher = frozen_copy(student)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in teacher.modules())
    meter.detach()
    mask = pt.HeadMask.from_heads(student, {pt.find_heads(student).sites[0].name: [0]})
    mask.attach(student)
    with pytest.raises(ValueError, match="teacher: the student has head masks attached"):
        frozen_copy(student)
    mask.detach()


def test_a_teacher_sharing_the_students_parameters_is_refused(tmp_path, tiny_mt):
    student = _marian(tiny_mt[1])
    trainer = _trainer(tmp_path, tiny_mt, student, [DistillationCallback(student)], epochs=1, max_steps=1)
    with pytest.raises(ValueError, match="teacher: it shares parameters with the student"):
        trainer.train()


def test_teacher_flops_are_counted_apart_exactly(tmp_path, tiny_mt):
    """The teacher's forward FLOPs over a run with a mid-training shrink equal FlopCounterMode's count of every
    teacher forward the run made; distillation.json records them."""
    import json

    from prunetrain.bench.step_flops import measured_step_flops

    teacher = _marian(tiny_mt[1], seed=1)
    seen = []
    teacher.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(dict(kwargs)) if not torch.is_grad_enabled() else None,
        with_kwargs=True)  # the run's teacher calls (under no_grad), not the fit's probes
    callback = DistillationCallback(teacher, alpha=0.5)
    _trainer(tmp_path, tiny_mt, _marian(tiny_mt[1]), [_pruning(), callback], epochs=1, max_steps=8).train()
    expected = sum(measured_step_flops(teacher, kwargs) for kwargs in seen)
    assert len(seen) == 8 and callback.teacher_flops == expected > 0
    record = json.loads((tmp_path / "prunetrain" / "distillation.json").read_text())
    assert record["teacher_forward_flops"] == expected and record["teacher"] == "given"
