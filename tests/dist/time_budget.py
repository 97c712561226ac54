"""A training-time budget with its cooldown under DDP (torchrun, 2 ranks, gloo): the ranks' clocks differ (rank 1
loads its data slower, rank 0 alone measures at every third step), yet every rank must see the same clock, train
with the same learning rates and stop at the same step.

python time_budget.py --out DIR --data DIR/multi30k (under `torchrun --nproc_per_node 2`); each rank writes
`rank<r>_result.json` with its clock and learning rate after every step.

Each rank's clock reads a fake time source (tests/fake_time.py) that advances only by this script's sleeps, so the
test checks the accounting exactly: the machine's speed and the ranks' waits for each other add nothing.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training.cooldown import TrainTimeCooldownCallback
from prunetrain.training.metric_points import MetricPointsCallback
from prunetrain.training.training_clock import TrainTime, measuring

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the fake time source
from fake_time import FakeTime, install  # noqa: E402

SLEEP = 0.0625  # a binary fraction: sums of sleeps are exact, so the test compares clocks with ==
FAKE = install(FakeTime())


class SlowCollator:
    def __init__(self, collate, seconds):
        self.collate, self.seconds = collate, seconds

    def __call__(self, features):
        FAKE.sleep(self.seconds)
        return self.collate(features)


class Watch(TrainerCallback):
    """After the clock: the budget set once the first step is counted (the first step plus 12 sleeps), a
    measurement on rank 0 alone at every third step, and each step's clock and learning rate (after the cooldown:
    registered last but for the clock's end)."""

    def __init__(self, clock, rank):
        self.clock, self.rank, self.rows, self.budget = clock, rank, [], None

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.budget is None:
            self.budget = self.clock.train_seconds + 12 * SLEEP
            self.clock.train_time = TrainTime(max_seconds=self.budget)
        if self.rank == 0 and state.global_step % 3 == 0:
            with measuring():
                FAKE.sleep(2 * SLEEP)
        self.rows.append({"step": state.global_step, "seconds": self.clock.train_seconds,
                          "lr": optimizer.param_groups[0]["lr"]})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    opts = parser.parse_args()
    out, rank = Path(opts.out), int(os.environ.get("RANK", "0"))
    pairs = read_parallel(opts.data, "train", limit=256)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                        attn_implementation="eager"))
    args = Seq2SeqTrainingArguments(
        output_dir=str(out), num_train_epochs=6, per_device_train_batch_size=16, learning_rate=2e-3,
        warmup_steps=3, lr_scheduler_type="inverse_sqrt", save_strategy="no", report_to=[], use_cpu=True,
        logging_steps=4, seed=0, disable_tqdm=True, ddp_backend="gloo", dataloader_num_workers=0)
    clock = MetricPointsCallback(lambda m: 0.0, record_end=False, train_time=TrainTime(max_seconds=1e9))
    watch = Watch(clock, rank)
    callbacks = [clock, TrainTimeCooldownCallback(clock, 0.5), watch, clock.clock_end]
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=build_dataset(pairs, tokenizer, max_length=24),
                             data_collator=SlowCollator(make_collator(tokenizer, model), SLEEP * (1 + rank)),
                             processing_class=tokenizer, callbacks=callbacks)
    trainer.train()
    result = {"rows": watch.rows, "budget": watch.budget, "stopped_at": clock.budget_reached_at_step,
              "global_step": trainer.state.global_step, "measured": clock.clock.measured_seconds}
    (out / f"rank{rank}_result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    end_process_group()
