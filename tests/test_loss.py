"""`SmoothedCrossEntropy`: transformers' `LabelSmoother` loss in one fused kernel — the same value and gradient, the
same training through the recipes' Trainer, bad settings refused."""

from __future__ import annotations

import pytest
import torch
from transformers import MarianMTModel, Seq2SeqTrainer
from transformers.trainer_pt_utils import LabelSmoother

from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.mt.run.training_setup import train_seq2seq, training_args
from prunetrain.training.loss import SmoothedCrossEntropy


def _logits_and_labels(seed: int = 0, vocab: int = 50):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(4, 7, vocab, generator=generator, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, vocab, (4, 7), generator=generator)
    labels[0, 5:] = -100  # padded targets, as the collator marks them
    labels[2, 1:] = -100
    return logits, labels


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("items", ["none", "int", "tensor"])
@pytest.mark.parametrize("shift", [False, True])
def test_value_and_gradient_equal_transformers_label_smoother(epsilon, items, shift):
    logits, labels = _logits_and_labels()
    counted = labels[..., 1:] if shift else labels
    count = {"none": None, "int": int(counted.ne(-100).sum()) + 3,  # a whole step's tokens, more than this batch's
             "tensor": counted.ne(-100).sum() + 3}[items]
    ours = SmoothedCrossEntropy(epsilon, shift_labels=shift)({"logits": logits}, labels, num_items_in_batch=count)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    theirs = LabelSmoother(epsilon=epsilon)({"logits": logits}, labels, shift_labels=shift, num_items_in_batch=count)
    (theirs_grad,) = torch.autograd.grad(theirs, logits)
    # float64 logits; LabelSmoother sums the smoothing term in float32 (its `dtype=torch.float32`): ~1e-7 apart
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0), (ours, theirs)
    assert torch.allclose(ours_grad, theirs_grad, rtol=1e-6, atol=1e-9)  # entries up to 4e-2
    assert ours_grad[2, 1:].abs().max() == 0  # padded positions get no gradient
    if epsilon:  # the smoothing term is there: not the plain cross-entropy
        plain = SmoothedCrossEntropy(0.0)({"logits": logits}, labels)
        assert not torch.allclose(SmoothedCrossEntropy(epsilon)({"logits": logits}, labels), plain)


def test_the_recipes_trainer_trains_with_it_as_with_label_smoother(tmp_path, multi30k_dir):
    """`train_seq2seq` with `label_smoothing_factor` 0.1 hands the Trainer a `SmoothedCrossEntropy`; six steps of
    a Marian model (fp32, dropout on, the same seed) end at the weights a Trainer with transformers' own
    `LabelSmoother` reaches, within float rounding, and the logged losses agree."""
    pairs = read_parallel(multi30k_dir, "train", limit=192)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    dataset = build_dataset(pairs, tokenizer, max_length=24)

    def model():
        torch.manual_seed(0)
        return MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                           attn_implementation="eager"))

    def args(name):
        return training_args(tmp_path / name, max_steps=6, per_device_train_batch_size=32, learning_rate=2e-3,
                             label_smoothing_factor=0.1, save_strategy="no", report_to=[], logging_steps=1, seed=0)

    ours = train_seq2seq(model(), args("ours"), dataset, tokenizer)
    assert isinstance(ours.compute_loss_func, SmoothedCrossEntropy) and ours.compute_loss_func.epsilon == 0.1
    reference = model()
    theirs = Seq2SeqTrainer(model=reference, args=args("theirs"), train_dataset=dataset,
                            data_collator=make_collator(tokenizer, reference), processing_class=tokenizer)
    assert theirs.compute_loss_func is None and isinstance(theirs.label_smoother, LabelSmoother)
    theirs.train()
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (ours, theirs)]
    assert len(losses[0]) == 6 and losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, a), b in zip(ours.model.state_dict().items(), theirs.model.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    untrained = model().state_dict()
    assert any(not torch.equal(untrained[k], v) for k, v in ours.model.state_dict().items())  # it did train


@pytest.mark.parametrize("kwargs, message", [
    ({"epsilon": 1.0}, r"^epsilon: 1\.0 is not allowed; expected a smoothing weight in \[0, 1\)"),
    ({"epsilon": -0.1}, r"^epsilon: -0\.1 is not a fraction in \[0, 1\]"),
    ({"epsilon": "0.1"}, r"^epsilon: '0\.1' is not allowed; expected a finite number\.$"),
    ({"epsilon": True}, r"^epsilon: True is not allowed; expected a finite number\.$"),
    ({"epsilon": float("nan")}, r"^epsilon: nan is not allowed; expected a finite number\.$"),
    ({"epsilon": 0.1, "ignore_index": 1.5}, r"^ignore_index: 1\.5 is not allowed; expected an integer\.$"),
    ({"epsilon": 0.1, "shift_labels": "no"}, r"^shift_labels: 'no' is not allowed; expected True or False"),
])
def test_bad_settings_are_refused_in_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SmoothedCrossEntropy(**kwargs)
