"""A real Trainer run of a Qwen2-style GQA causal LM that shrinks half of its heads at step 4, for the kill -9 test
of tests/test_seams_trainer.py.

python resume_from_pruned_checkpoint.py --out DIR --data DIR/multi30k [--kill-at-step N] [--resume]
`--kill-at-step N` sends SIGKILL to the process itself at the end of step N. `--resume` loads the model of the
newest complete checkpoint the way a user of the HF stack would, with `AutoModelForCausalLM.from_pretrained(checkpoint,
trust_remote_code=True)` (the checkpoint is a pruned directory), and resumes training from it. Writes `result.json`
with the final layout and weights.
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, DataCollatorForLanguageModeling, Qwen2Config, Qwen2ForCausalLM,
                          Trainer, TrainerCallback, TrainingArguments)

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain import HeadPruningCallback, Importance, Output, Schedule, find_heads, last_complete_checkpoint
from prunetrain.mt.text.data import read_parallel, train_tokenizer


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
    torch.set_num_threads(1)

    pairs = read_parallel(opts.data, "train", limit=128)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    dataset = [{"input_ids": ids} for ids in enc["input_ids"]]
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    batches = [collate(dataset[j:j + 16]) for j in (0, 16)]
    pruning = HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: 0.5}, shrink_steps=[4]),
                                  importance=Importance(batches=batches), output=Output(tensorboard=False))
    checkpoint = None
    if opts.resume:
        checkpoint = last_complete_checkpoint(out, [pruning])
        model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True)
    else:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                             max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                                             tie_word_embeddings=False, attn_implementation="eager"))
    args = TrainingArguments(output_dir=str(out), max_steps=12, per_device_train_batch_size=16, learning_rate=2e-3,
                             save_strategy="steps", save_steps=6, report_to=[], use_cpu=True, logging_steps=3,
                             seed=0, disable_tqdm=True, dataloader_num_workers=0)
    callbacks = [pruning] + ([KillAt(opts.kill_at_step)] if opts.kill_at_step else [])
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                      processing_class=tokenizer, callbacks=callbacks)
    heads_at_start = find_heads(model).total_heads
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(out / "final"))
    result = {"resumed_from": checkpoint, "heads_at_start": heads_at_start, "layout": find_heads(model).to_dict(),
              "model_class": f"{type(model).__module__}.{type(model).__name__}",
              "events": [(e["step"], e["mode"], e["heads_after"]) for e in pruning.events],
              "weights": {k: v.tolist() for k, v in model.state_dict().items()}}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    end_process_group()
