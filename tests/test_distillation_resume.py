"""Distillation across a checkpoint and hidden-state matching (`DistillationCallback`): a snapshot teacher saved
with every checkpoint and restored, so a resumed run equals an uninterrupted one bit for bit on CPU; a given teacher
checked against the recorded architecture; the CoFi-style hidden-state term against a hand computation."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import prunetrain as pt
from prunetrain.training.distillation import DistillationCallback, hidden_state_mse
from prunetrain.training.state import restore_layout
from test_training_flops import _batches, _marian, _pruning, _trainer, tiny_mt  # noqa: F401  (fixture)

STEPS, SAVE_EVERY = 10, 4  # pruning masks at steps 3 and 6 and shrinks at 6: checkpoint-4 is masked, -8 shrunk


def _run(tmp_path, tiny_mt, make_callback, resume=None, bf16=False):
    student = _marian(tiny_mt[1])
    if resume:
        restore_layout(student, resume)
    callback = make_callback()
    trainer = _trainer(tmp_path, tiny_mt, student, [_pruning(), callback], epochs=1, max_steps=STEPS,
                       save_strategy="steps", save_steps=SAVE_EVERY, logging_steps=1, bf16=bf16)
    trainer.train(resume_from_checkpoint=resume)
    losses = {e["step"]: (e["loss"], e["distill/kl"]) for e in trainer.state.log_history if "loss" in e}
    return student, callback, losses


def _same_weights(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("hidden_weight, bf16", [(0.0, False), (0.5, False), (0.0, True)])
def test_a_snapshot_teacher_is_saved_and_a_resumed_run_equals_the_uninterrupted_one(tmp_path, tiny_mt,
                                                                                     hidden_weight, bf16):
    """Resumed from a masked checkpoint (step 4) and a shrunk one (step 8), the run's losses, KL terms and final
    weights are those of the uninterrupted run, and the teacher is the unpruned student as it began. Under bf16
    autocast too: the copy taken at the start and the one restored from a checkpoint run in the same precision."""
    start = copy.deepcopy(_marian(tiny_mt[1]).state_dict())

    def make():
        return DistillationCallback(alpha=0.5, temperature=2.0, hidden_weight=hidden_weight)

    whole, whole_callback, whole_losses = _run(tmp_path, tiny_mt, make, bf16=bf16)
    assert (tmp_path / "checkpoint-8" / "prunetrain-distillation.safetensors").is_file()
    for step in (8, 4):  # the later first: resuming from step 4 writes checkpoint-8 again
        resumed, callback, losses = _run(tmp_path, tiny_mt, make, resume=str(tmp_path / f"checkpoint-{step}"),
                                         bf16=bf16)
        assert sorted(losses) == list(range(1, STEPS + 1))  # the checkpoint's log history, then the resumed steps
        assert losses == whole_losses, step
        _same_weights(whole.state_dict(), resumed.state_dict())
        _same_weights(start, callback.teacher.state_dict())  # the unpruned student, not the shrunk one
        assert not any(p.requires_grad for p in callback.teacher.parameters()) and not callback.teacher.training
        assert callback.teacher_flops == whole_callback.teacher_flops
    assert sum(s.num_heads for s in pt.find_heads(resumed)) < sum(s.num_heads for s in pt.find_heads(callback.teacher))


def test_a_given_teacher_resumes_and_one_of_another_architecture_is_refused(tmp_path, tiny_mt):
    teacher = _marian(tiny_mt[1], seed=1)
    whole, _, whole_losses = _run(tmp_path, tiny_mt, lambda: DistillationCallback(teacher, alpha=0.5))
    assert not (tmp_path / "checkpoint-8" / "prunetrain-distillation.safetensors").exists()  # not saved: given again
    resumed, _, losses = _run(tmp_path, tiny_mt, lambda: DistillationCallback(teacher, alpha=0.5),
                              resume=str(tmp_path / "checkpoint-8"))
    assert sorted(losses) == list(range(1, STEPS + 1)) and losses == whole_losses
    _same_weights(whole.state_dict(), resumed.state_dict())

    other = copy.deepcopy(teacher)
    pt.shrink(other, pt.HeadMask.from_heads(other, {"model.encoder.layers.0.self_attn": [1]}))
    with pytest.raises(ValueError, match=r"^teacher: it is not the architecture of the teacher the checkpoint was "
                                         r"trained with \(tensor 'model\.encoder\.layers\.0\.self_attn\.k_proj\.bias' "
                                         r"is \(24,\), recorded \(32,\)\); give the same teacher model to resume\.$"):
        _run(tmp_path, tiny_mt, lambda: DistillationCallback(other, alpha=0.5), resume=str(tmp_path / "checkpoint-8"))
    with pytest.raises(ValueError, match=r"^teacher: '.*checkpoint-8' holds no teacher weights \(the run that wrote "
                                         r"it distilled from a given teacher, which checkpoints do not hold\); give "
                                         r"that teacher model \(teacher=\.\.\.\) to resume\.$"):
        _run(tmp_path, tiny_mt, lambda: DistillationCallback(alpha=0.5), resume=str(tmp_path / "checkpoint-8"))
    with pytest.raises(ValueError, match=r"^hidden_weight: the checkpoint was trained with hidden_weight=0\.0, not "
                                         r"1\.0; resume with the settings it was trained with\.$"):
        _run(tmp_path, tiny_mt, lambda: DistillationCallback(teacher, alpha=0.5, hidden_weight=1.0),
             resume=str(tmp_path / "checkpoint-8"))


def _hand_mse(student, teacher, mask):
    keep = mask.bool()
    return ((student - teacher)[keep] ** 2).sum() / (int(keep.sum()) * student.shape[-1])


@pytest.mark.parametrize("layers", [None, (1,)])
def test_the_hidden_state_term_of_a_seq2seq_model_is_the_hand_computed_one(tiny_mt, layers):
    """β·Σ_l MSE over the encoder's blocks (source tokens) and the decoder's (target tokens), added to the
    combined loss the wrapped student returns."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config

    torch.manual_seed(0)
    config = marian_config(tiny_mt[1], d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.0)
    student, teacher = MarianMTModel(config).train(), MarianMTModel(config).eval()
    batch = _batches(tiny_mt, student)[0]
    assert (batch["attention_mask"] == 0).any() and (batch["labels"] == -100).any()  # padding to leave out
    callback = DistillationCallback(teacher, alpha=0.3, temperature=2.0, hidden_weight=0.7, hidden_layers=layers)
    callback._task = "seq2seq"
    plain = DistillationCallback(teacher, alpha=0.3, temperature=2.0)
    plain._task = "seq2seq"
    losses = []
    for distil in (callback, plain):
        distil._wrap(student)
        losses.append(student(**batch).loss)
        distil._unwrap()
    with torch.no_grad():
        s, t = (m(**batch, output_hidden_states=True) for m in (student, teacher))
    expected = torch.zeros(())
    for layer in (0, 1) if layers is None else layers:
        expected += _hand_mse(s.encoder_hidden_states[layer + 1], t.encoder_hidden_states[layer + 1],
                              batch["attention_mask"])
        expected += _hand_mse(s.decoder_hidden_states[layer + 1], t.decoder_hidden_states[layer + 1],
                              batch["labels"] != -100)
    assert float(expected) > 0
    assert torch.allclose(losses[0] - losses[1], 0.7 * expected, rtol=1e-5), (losses, expected)
    assert callback.last["hidden"] == pytest.approx(float(expected), rel=1e-5)
    assert torch.allclose(hidden_state_mse(s, t, batch, "seq2seq", layers), expected)


def test_the_hidden_state_term_of_a_classifier_counts_the_unpadded_tokens():
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3,
                        vocab_size=50, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    student, teacher = BertForSequenceClassification(config), BertForSequenceClassification(config)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = {"input_ids": torch.randint(1, 50, (2, 5)), "attention_mask": mask, "labels": torch.tensor([0, 1])}
    s, t = (m(**batch, output_hidden_states=True) for m in (student, teacher))
    expected = sum(_hand_mse(s.hidden_states[k + 1], t.hidden_states[k + 1], mask) for k in (0, 2))
    assert torch.allclose(hidden_state_mse(s, t, batch, "classes", (0, 2)), expected)
    unmasked = sum(((s.hidden_states[k + 1] - t.hidden_states[k + 1]) ** 2).mean() for k in (0, 2))
    assert not torch.allclose(expected, unmasked)  # the padding is left out, so the test can tell
    with pytest.raises(ValueError, match=r"^hidden_layers: layer 3 is not allowed; the model's hidden_states come "
                                         r"from 3 blocks \(0 to 2\)\.$"):
        hidden_state_mse(s, t, batch, "classes", (3,))


@pytest.mark.parametrize("kwargs,message", [
    ({"hidden_weight": -1}, r"^hidden_weight: -1 is not allowed; expected a finite number >= 0\.$"),
    ({"hidden_weight": "1"}, r"^hidden_weight: '1' is not allowed"),
    ({"hidden_layers": [1, 1]}, r"^hidden_layers: \[1, 1\] names a layer twice; name each layer once\.$"),
    ({"hidden_layers": [-1]}, r"^hidden_layers: -1 is not allowed; expected integers >= 0\.$"),
    ({"hidden_layers": "0"}, r"^hidden_layers: '0' is not a list of integers >= 0\.$"),
])
def test_hidden_state_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistillationCallback(**kwargs)


def test_a_snapshot_of_a_model_pruned_before_training_is_rebuilt_exactly_and_the_rng_left_alone(tiny_mt):
    from prunetrain.training.distillation_teacher import rebuild_snapshot, snapshot_record, snapshot_tensors

    model = _marian(tiny_mt[1]).eval()
    pt.shrink(model, pt.HeadMask.from_heads(model, {"model.decoder.layers.1.encoder_attn": [0, 3]}))
    record, tensors = snapshot_record(model), snapshot_tensors(model)
    student = _marian(tiny_mt[1])
    torch.manual_seed(5)
    rebuilt = rebuild_snapshot(student, record, tensors, "checkpoint-9").eval()
    drawn = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(drawn, torch.rand(3))  # building the model drew no number from the training stream
    _same_weights(model.state_dict(), rebuilt.state_dict())
    assert rebuilt.config._attn_implementation == "eager"
    batch = _batches(tiny_mt, model)[0]
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, rebuilt(**batch).logits)

    adapters = {**tensors, "teacher.model.encoder.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)}
    with pytest.raises(ValueError, match=r"^teacher: the teacher saved in 'checkpoint-9' cannot be rebuilt as "
                                         r"MarianMTModel from its config \(it has no tensor "
                                         r"'model\.encoder\.layers\.0\.self_attn\.q_proj\.lora_A\.weight'\); give the "
                                         r"teacher model \(teacher=\.\.\.\) to resume\.$"):
        rebuild_snapshot(_marian(tiny_mt[1]), record, adapters, "checkpoint-9")
