"""Training speed before and after a mid-training shrink under DDP (HF Trainer, torchrun).

    torchrun --nproc_per_node 2 benchmarks/bench_ddp_shrink.py --data ../shared/data/multi30k --out /tmp/ddp_bench

A 6+6-layer Marian (d256, 8 heads) trains 3 epochs on a slice of Multi30k; `HeadPruningCallback(mode="shrink")`
removes `--prune` of the heads at the end of epoch 1, rebuilding DDP's buckets. Rank 0 prints and writes
(`--out/ddp_shrink.json`) the median optimizer-step time of each epoch, so epoch 1 (all heads) compares with epochs
2-3 (pruned). Take the numbers on a quiet machine (FACTS: other load makes CPU timings pathological).
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from prunetrain.engine.heads import find_heads
from prunetrain.mt.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training import HeadPruningCallback


class StepTimes(TrainerCallback):
    """Wall time of every optimizer step, grouped by epoch."""

    def __init__(self):
        self.times: dict[int, list[float]] = {}
        self._start = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        epoch = int(state.epoch - 1e-9) + 1  # the epoch this step belongs to (1-based)
        self.times.setdefault(epoch, []).append(time.perf_counter() - self._start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pairs", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32, help="sequences per rank per step")
    parser.add_argument("--prune", type=float, default=0.5)
    opts = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pairs = read_parallel(opts.data, "train", limit=opts.pairs)
    tokenizer = train_tokenizer(pairs, vocab_size=8000)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=256, ffn_dim=1024, layers=6, heads=8, dropout=0.1,
                                        attn_implementation="eager"))
    dataset = build_dataset(pairs, tokenizer, max_length=64)
    collator = make_collator(tokenizer, model)
    fixed = [collator([dataset[i] for i in range(j, j + 32)]) for j in range(0, 128, 32)]
    timer = StepTimes()
    callbacks = [HeadPruningCallback(at_epochs=[1], prune={1: opts.prune}, mode="shrink", batches=fixed,
                                     tensorboard=False), timer]
    args = Seq2SeqTrainingArguments(output_dir=opts.out, num_train_epochs=3, per_device_train_batch_size=opts.batch,
                                    learning_rate=1e-3, save_strategy="no", report_to=[], use_cpu=True, seed=0,
                                    disable_tqdm=True, logging_steps=50,
                                    ddp_backend="gloo" if world > 1 else None)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                             processing_class=tokenizer, callbacks=callbacks)
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        medians = {epoch: statistics.median(times[1:] or times) for epoch, times in sorted(timer.times.items())}
        result = {"world_size": world, "threads_per_rank": torch.get_num_threads(), "prune": opts.prune,
                  "heads_after": find_heads(model).total_heads, "median_step_seconds": medians,
                  "speedup_after_shrink": medians[1] / statistics.median([medians[e] for e in medians if e > 1])}
        Path(opts.out).mkdir(parents=True, exist_ok=True)
        (Path(opts.out) / "ddp_shrink.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
