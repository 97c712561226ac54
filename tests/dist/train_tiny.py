"""A tiny real Seq2SeqTrainer run with prunetrain callbacks, for the resume-after-kill and DDP tests.

python train_tiny.py --out DIR --data DIR/multi30k --callback prune-mask|prune-shrink|prune-mask-shrink|gates|prune-ffn-mask-shrink
                    [--epochs N] [--resume]
(also under `torchrun --nproc_per_node 2`). Each rank writes `rank<r>_result.json` with its final mask.
"""

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain.training.callbacks import (
    HardConcreteCallback, HeadPruningCallback, last_complete_checkpoint, restore_layout)
from prunetrain.training.options import GateTraining, Importance, Schedule
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.engine.heads import find_heads, find_sites


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--callback", required=True, choices=["prune-mask", "prune-shrink", "prune-mask-shrink",
                                                                       "gates", "prune-ffn-mask-shrink"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--clock", action="store_true", help="also the training clock (FLOPs, a FLOP point)")
    opts = parser.parse_args()
    out = Path(opts.out)
    rank = int(os.environ.get("RANK", "0"))

    pairs = read_parallel(opts.data, "train", limit=256)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                        attn_implementation="eager"))
    dataset = build_dataset(pairs, tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    fixed = [collator([dataset[i] for i in range(j, j + 16)]) for j in (0, 16, 32, 48)]
    if opts.callback == "gates":  # heads and FFN neurons gated to remove 30 % of the multiply-adds (a Lagrangian)
        callback = HardConcreteCallback(target_flops=0.3, training=GateTraining(gate_lr=0.2), finalize="mask")
    elif opts.callback == "prune-ffn-mask-shrink":  # heads and FFN neurons: FLOP targets, shrunk at step 32
        callback = HeadPruningCallback(Schedule(at_epochs=[1], prune_steps={16: {"flops": 0.15}, 32: {"flops": 0.3},
                                                                            48: {"flops": 0.4}}, shrink_steps=[32]),
                                       importance=Importance(batches=fixed), mode="mask")
    elif opts.callback == "prune-mask-shrink":  # masks at steps 16 and 32, shrink at 32 (16 steps per epoch), mask at 48
        callback = HeadPruningCallback(Schedule(at_epochs=[1], prune_steps={16: 0.25, 32: 6, 48: 0.5},
                                                shrink_steps=[32]),
                                       importance=Importance(batches=fixed), mode="mask")
    else:
        callback = HeadPruningCallback(Schedule(at_epochs=[1, 2, 3, 4], prune={2: 0.25, 3: 6, 4: 0.5}),
                                       importance=Importance(batches=fixed),
                                       mode="mask" if opts.callback == "prune-mask" else "shrink")
    args = Seq2SeqTrainingArguments(
        output_dir=str(out), num_train_epochs=opts.epochs, per_device_train_batch_size=16, learning_rate=2e-3,
        save_strategy="epoch", report_to=[], use_cpu=True, logging_steps=4, seed=0, disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None, dataloader_num_workers=0,
    )
    callbacks = [callback]
    if opts.clock:
        from prunetrain.training.metric_points import MetricPointsCallback

        callbacks.insert(0, MetricPointsCallback(lambda m: 0.0, at_flops=[2e8, 6e8]))
    checkpoint = None
    if opts.resume:
        checkpoint = last_complete_checkpoint(out, callbacks)  # a checkpoint cut short by the kill is skipped
        restore_layout(model, checkpoint)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                             processing_class=tokenizer, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=checkpoint)
    mask = callback.mask if opts.callback != "gates" else callback.final_mask
    layout = find_sites(model) if "ffn" in opts.callback else find_heads(model)
    result = {"mask": mask.to_dict(), "layout": layout.to_dict(), "resumed_from": checkpoint,
              "weights_sum": float(sum(p.double().abs().sum() for p in model.parameters()))}
    if opts.clock:
        clock = callbacks[0]
        result["flops"] = clock.flops
        result["flop_records"] = [(r["step"], r["flops"], r["flops_target"]) for r in clock.records]
    if opts.callback == "gates":
        result["log_alpha"] = {k: v.tolist() for k, v in callback.gates.state_dict().items()}
    (out / f"rank{rank}_result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    end_process_group()
