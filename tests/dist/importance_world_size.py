"""Default importance batches (the Trainer's own training set) under any world size and gradient accumulation.

python importance_world_size.py --out DIR --per-device N --accum K
or under `torchrun --nproc_per_node 2` / accelerate's launcher with 2 processes (gloo, CPU). Every run has the
same global batch (`GLOBAL_BATCH` = per-device batch × ranks × accumulation), sequential sampling and a loss summed
over the step's examples (`example_loss`), so each optimizer step sees the same examples and takes the same gradient;
`HeadPruningCallback` scores heads at step 2 with its default batches and masks half of them.
Rank 0 writes `result.json`: the scores, the mask and the losses.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import transformers

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain.training import HeadPruningCallback, Importance, Schedule

GLOBAL_BATCH = 8


def example_loss(outputs, labels, num_items_in_batch):
    """Σ cross-entropy / examples of the whole optimizer step (all ranks and micro-batches): the Trainer's
    `compute_loss_func`, so every configuration takes exactly the single process's gradient (the model's own loss is
    a per-micro-batch mean, which the Trainer rescales differently under accumulation and DDP)."""
    return torch.nn.functional.cross_entropy(outputs.logits.float(), labels, reduction="sum") / num_items_in_batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-device", type=int, required=True)
    parser.add_argument("--accum", type=int, default=1)
    opts = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    assert opts.per_device * world * opts.accum == GLOBAL_BATCH, (opts.per_device, world, opts.accum)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=2, attn_implementation="eager")
    model = transformers.BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(1, 60, (int(torch.randint(6, 14, (1,), generator=generator)),),
                                        generator=generator).tolist(), "labels": i % 2} for i in range(64)]
    callback = HeadPruningCallback(Schedule(at_epochs=[], at_steps=[2], prune_steps={2: 0.5}),
                                   importance=Importance(num_batches=3))
    args = transformers.TrainingArguments(
        output_dir=opts.out, max_steps=3, per_device_train_batch_size=opts.per_device,
        gradient_accumulation_steps=opts.accum, learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
        logging_steps=1, seed=0, disable_tqdm=True, train_sampling_strategy="sequential", dataloader_num_workers=0,
        ddp_backend="gloo" if world > 1 else None)
    tokenizer_free_collator = transformers.DataCollatorWithPadding(_Pad())
    trainer = transformers.Trainer(model, args, train_dataset=data, data_collator=tokenizer_free_collator,
                                   callbacks=[callback], compute_loss_func=example_loss)
    trainer.train()
    if trainer.is_world_process_zero():
        scores = callback.history[2]["scores"]
        result = {"scores": scores, "mask": callback.mask.to_dict(), "world": world,
                  "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}
        (Path(opts.out) / "result.json").write_text(json.dumps(result))


class _Pad:
    """The least a padding collator needs of a tokenizer: pad `input_ids` with 0 on the right."""

    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def pad(self, features, return_tensors="pt", **kwargs):
        length = max(len(f["input_ids"]) for f in features)
        ids = torch.tensor([f["input_ids"] + [0] * (length - len(f["input_ids"])) for f in features])
        mask = (torch.arange(length)[None] < torch.tensor([len(f["input_ids"]) for f in features])[:, None]).long()
        out = {"input_ids": ids, "attention_mask": mask}
        if "labels" in features[0]:
            out["labels"] = torch.tensor([f["labels"] for f in features])
        return transformers.BatchEncoding(out)


if __name__ == "__main__":
    main()
    end_process_group()
