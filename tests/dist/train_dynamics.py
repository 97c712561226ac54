"""A tiny real Seq2SeqTrainer run that shrinks heads mid-epoch on a fractional-epoch schedule, for the
resume-after-kill test of tests/test_dynamics.py.

python train_dynamics.py --out DIR --data DIR/multi30k [--kill-at-step N] [--resume]
`--kill-at-step N` sends SIGKILL to the process itself at the end of step N (a real kill -9, after the checkpoints
before it are on disk). Writes `result.json` with the final head layout, pruning events and importance points.
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain.engine.heads import find_heads
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training.callbacks import HeadPruningCallback, last_complete_checkpoint, restore_layout
from prunetrain.training.options import Importance, Schedule


class KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    out = Path(opts.out)

    pairs = read_parallel(opts.data, "train", limit=256)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                        attn_implementation="eager"))
    dataset = build_dataset(pairs, tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    fixed = [collator([dataset[i] for i in range(j, j + 16)]) for j in (0, 16)]
    # 256 pairs in batches of 16: 16 steps per epoch; the shrinks fall on steps 8 (epoch 0.5) and 24 (epoch 1.5)
    pruning = HeadPruningCallback(Schedule(at_epochs=[1, 2], prune={0.5: 0.25, 1.5: 0.5}), mode="shrink",
                                  importance=Importance(batches=fixed))
    args = Seq2SeqTrainingArguments(output_dir=str(out), num_train_epochs=3, per_device_train_batch_size=16,
                                    learning_rate=2e-3, save_strategy="steps", save_steps=12, report_to=[],
                                    use_cpu=True, logging_steps=4, seed=0, disable_tqdm=True,
                                    dataloader_num_workers=0)
    checkpoint = None
    if opts.resume:
        checkpoint = last_complete_checkpoint(out, [pruning])
        restore_layout(model, checkpoint)
    callbacks = [pruning] + ([KillAt(opts.kill_at_step)] if opts.kill_at_step else [])
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                             processing_class=tokenizer, callbacks=callbacks)
    resumed_heads = find_heads(model).total_heads
    trainer.train(resume_from_checkpoint=checkpoint)
    result = {"layout": find_heads(model).to_dict(), "resumed_from": checkpoint, "heads_at_resume": resumed_heads,
              "events": [(e["step"], e["heads_after"]) for e in pruning.events],
              "importance_steps": sorted(pruning.history), "mask": pruning.mask.to_dict(),
              "params": {k: v.tolist() for k, v in model.state_dict().items() if "self_attn.q_proj.weight" in k}}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    end_process_group()
