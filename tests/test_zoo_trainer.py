"""`HeadPruningCallback` in shrink mode on real `Trainer` runs of three new architectures: a DistilBERT sentence
classifier, a Qwen3 causal LM (grouped-query attention) and a ViT image classifier (issue 14, item 4).

Each run trains two epochs; the callback scores heads (Michel gradient importance) and physically removes half of
them at the end of epoch 1, and training goes on. Checked: heads were removed, training continued on the shrunk
weights (finite losses after the shrink; the shrunk parameters changed after it), and the final model equals its
recorded layout (a fresh model shrunk to `config.prunetrain_heads` takes its weights and computes the same outputs).
Text comes from Multi30k (real sentences); the images are synthetic with a learnable rule (no image corpus here).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import (DataCollatorForLanguageModeling, DataCollatorWithPadding, Trainer, TrainerCallback,
                          TrainingArguments, default_data_collator)

import prunetrain as pt
from prunetrain.engine.heads import attention_sites
from prunetrain.engine.persist import shrink_to_layout
from prunetrain.mt.text.data import read_parallel, train_tokenizer
from prunetrain.zoo import tiny_config, tiny_model

BATCH = 32


class _AfterShrink(TrainerCallback):
    """Copies the attention output projections at the end of epoch 1 (registered after the pruning callback, so
    after the shrink)."""

    def __init__(self):
        self.weights: dict[str, torch.Tensor] = {}

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if round(state.epoch) == 1:
            self.weights = {s.info.name: s.out_proj.weight.detach().clone() for s in attention_sites(model)}


def _train(model, dataset, collate, tmp_path):
    batches = [collate(dataset[i:i + BATCH]) for i in range(0, 2 * BATCH, BATCH)]
    prune = pt.HeadPruningCallback(at_epochs=[1], prune={1: 0.5}, mode="shrink", batches=batches, tensorboard=False)
    after = _AfterShrink()
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=2, per_device_train_batch_size=BATCH,
                             learning_rate=2e-3, save_strategy="no", report_to=[], use_cpu=True, logging_steps=1,
                             seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=[prune, after])
    heads_before = pt.find_heads(model).total_heads
    trainer.train()
    return trainer, prune, after, heads_before, batches[0]


def _check(model, trainer, prune, after, heads_before, batch):
    layout = pt.find_heads(model)
    # heads were removed, as the callback recorded
    (event,) = prune.events
    assert event["mode"] == "shrink" and event["heads_before"] == heads_before
    assert layout.total_heads == event["heads_after"] == heads_before // 2
    # training went on: finite losses in epoch 2, and the shrunk weights kept learning after the shrink
    late = [log["loss"] for log in trainer.state.log_history if "loss" in log and log["epoch"] > 1]
    assert late and all(math.isfinite(loss) for loss in late)
    shrunk = {s.info.name: s.out_proj.weight for s in attention_sites(model)}
    assert after.weights.keys() == shrunk.keys()
    assert any(w.shape[1] < s.original_num_heads * s.head_dim
               for w, s in zip(shrunk.values(), layout))
    for name, weight in shrunk.items():
        assert after.weights[name].shape == weight.shape
    assert all(not torch.equal(after.weights[n], w.detach()) for n, w in shrunk.items() if w.numel())
    # the final model is its recorded layout: a fresh model shrunk to the record takes the weights exactly
    config = copy.deepcopy(model.config)
    recorded = config.prunetrain_heads
    del config.prunetrain_heads
    fresh = type(model)(config)
    assert shrink_to_layout(fresh, recorded) == layout
    fresh.load_state_dict(model.state_dict())
    model.eval(), fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, model(**batch).logits)


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=64)
    return pairs, train_tokenizer(pairs, vocab_size=300)


def test_distilbert_classifier_shrinks_mid_training(tmp_path, sentences):
    """Language identification (German or English sentence) with DistilBertForSequenceClassification."""
    pairs, tokenizer = sentences
    texts = [s for pair in pairs for s in pair]
    labels = [0, 1] * len(pairs)
    enc = tokenizer(texts, truncation=True, max_length=24)
    dataset = [{"input_ids": ids, "labels": y} for ids, y in zip(enc["input_ids"], labels)]
    config = tiny_config("distilbert", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_labels=2)
    torch.manual_seed(0)
    import transformers

    model = transformers.DistilBertForSequenceClassification(config)
    collate = DataCollatorWithPadding(tokenizer)
    _check(model, *_train(model, dataset, collate, tmp_path))


def test_qwen3_gqa_lm_shrinks_whole_kv_groups_mid_training(tmp_path, sentences):
    """Qwen3ForCausalLM (4 query heads on 2 key/value heads per layer) on English sentences."""
    pairs, tokenizer = sentences
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    dataset = [{"input_ids": ids} for ids in enc["input_ids"]]
    model = tiny_model("qwen3", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).train()
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trained = _train(model, dataset, collate, tmp_path)
    _check(model, *trained)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    for site in pt.find_heads(model):  # whole groups: each kept key/value head still serves its 2 query heads
        assert site.num_heads == group * site.num_kv_heads


def test_vit_image_classifier_shrinks_mid_training(tmp_path):
    """ViTForImageClassification on 16×16 images whose class is the brightest colour channel."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (2 * BATCH,), generator=gen)
    pixels = torch.randn(2 * BATCH, 3, 16, 16, generator=gen) * 0.5
    pixels[torch.arange(2 * BATCH), labels] += 1.0
    dataset = [{"pixel_values": p, "labels": int(y)} for p, y in zip(pixels, labels)]
    model = tiny_model("vit").train()
    _check(model, *_train(model, dataset, default_data_collator, tmp_path))
