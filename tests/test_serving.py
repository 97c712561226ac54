"""The uniform route to serving stacks (issue 28): the Trainer callbacks end in a layout a standard config describes
(`constraints=ServingConstraints(...)`), and the uniform export writes `head_dim` where the config class reads it, so
the model loads in stock transformers."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import prunetrain as pt
from prunetrain.export.formats import export
from prunetrain.methods.constraints import ServingConstraints
from prunetrain.mt.text.data import read_parallel, train_tokenizer
from prunetrain.zoo import tiny_model

BATCH = 16
UNIFORM = ServingConstraints(same_heads_per_kind=True)
# Qwen2: 4 layers, 8 query heads on 4 key/value heads, head size 8 taken from hidden_size / heads (no head_dim field)
QWEN2 = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=4,
             layer_types=["full_attention"] * 4)


def test_uniform_export_writes_head_dim_into_a_qwen2_config_without_one(tmp_path):
    model = tiny_model("qwen2", **QWEN2)
    assert model.config.head_dim is None if hasattr(model.config, "head_dim") else True
    pt.shrink(model, pt.HeadMask.from_heads(model, {s.name: [0, 1, 2, 3] for s in pt.find_heads(model)}))
    result = export(model, tmp_path / "uniform", "uniform")
    assert result["max_abs_diff"] == 0.0
    config = json.loads((tmp_path / "uniform" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 8)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "uniform", attn_implementation="eager")
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.fixture(scope="module")
def english(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=64)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=20)
    return tokenizer, [{"input_ids": ids} for ids in enc["input_ids"]]


def _train(callback, english, tmp_path, epochs=2):
    tokenizer, dataset = english
    model = tiny_model("qwen2", **QWEN2, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).train()
    args = TrainingArguments(output_dir=str(tmp_path / "run"), num_train_epochs=epochs,
                             per_device_train_batch_size=BATCH, learning_rate=2e-3, save_strategy="no", report_to=[],
                             use_cpu=True, seed=0, disable_tqdm=True)
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=[callback]).train()
    return model.eval()


def _loads_in_stock_transformers(model, tmp_path):
    export(model, tmp_path / "uniform", "uniform")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "uniform", attn_implementation="eager")
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, model(input_ids=ids).logits)


def test_head_pruning_callback_with_constraints_ends_uniform_and_exports(english, tmp_path):
    batches = [DataCollatorForLanguageModeling(english[0], mlm=False)(english[1][:BATCH])]
    kwargs = dict(at_epochs=[1], prune={1: 0.4}, mode="shrink", batches=batches, tensorboard=False)
    free = _train(pt.HeadPruningCallback(**kwargs), english, tmp_path / "free")
    assert len({s.num_heads for s in pt.find_heads(free)}) > 1  # importance alone gives a non-uniform layout
    callback = pt.HeadPruningCallback(**kwargs, constraints=UNIFORM)
    model = _train(callback, english, tmp_path)
    heads = {s.num_heads for s in pt.find_heads(model)}
    assert len(heads) == 1 and heads != {8}
    (event,) = callback.events
    assert event["heads_after"] == 4 * heads.pop()
    _loads_in_stock_transformers(model, tmp_path)


def test_hard_concrete_callback_with_constraints_ends_uniform_and_exports(english, tmp_path):
    callback = pt.HardConcreteCallback(target_heads=12, gate_lr=0.2, lagrangian_lr=0.2, init_log_alpha=0.5,
                                       finalize="shrink", tensorboard=False, constraints=UNIFORM)
    model = _train(callback, english, tmp_path, epochs=1)
    heads = {s.num_heads for s in pt.find_heads(model)}
    assert len(heads) == 1 and heads != {8}
    _loads_in_stock_transformers(model, tmp_path)


def test_callbacks_refuse_constraints_that_are_not_serving_constraints():
    message = (r"constraints: \{'same_heads_per_kind': True\} is not a ServingConstraints \(from "
               r"prunetrain\.methods\.constraints\) or None\.")
    with pytest.raises(TypeError, match=message):
        pt.HeadPruningCallback(constraints={"same_heads_per_kind": True})
    with pytest.raises(TypeError, match=message):
        pt.HardConcreteCallback(lam=0.1, constraints={"same_heads_per_kind": True})
