"""A real Trainer run of a Qwen2-style GQA causal LM whose checkpoint-6 is saved with a mask attached, for the kill -9
test of tests/test_seams_masks_trainer.py.

python resume_masked_checkpoint.py --method mask|gates --out DIR --data DIR/multi30k [--kill-at-step N]
                                   [--resume remote|layout]
`--method mask`: `HeadPruningCallback` masks half of the heads at step 4 and shrinks them at step 10 (a prune to the
same amount, then the shrink). `--method gates`: `HardConcreteCallback(target_heads=4, finalize="mask")`, one
key/value group's gate shut before the first step. `--kill-at-step N` sends SIGKILL to the process itself at the end
of step N. `--resume remote` loads the newest complete checkpoint with `AutoModelForCausalLM.from_pretrained(checkpoint,
trust_remote_code=True)`, `--resume layout` builds the model afresh and calls `restore_layout(model, checkpoint)`;
the logits are recorded right after loading (remote) and when training restarts. Writes `result.json`: the logits at
every checkpoint, the final layout, weights, attached masks, gates and pruning events.
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
from prunetrain import (HardConcreteCallback, HeadPruningCallback, attached_masks, find_heads,
                        last_complete_checkpoint, restore_layout)
from prunetrain.engine.mask import owner_label
from prunetrain.mt.text.data import read_parallel, train_tokenizer


class KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class CloseOneGroup(TrainerCallback):
    def __init__(self, gates_callback):
        self.gates_callback = gates_callback

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            gates = self.gates_callback.gates
            with torch.no_grad():
                gates.site_log_alpha(gates.site_names[0])[0] = -5.0


def logits(model, probe) -> list:
    training = model.training
    model.eval()
    with torch.no_grad():
        out = model(**probe).logits.tolist()
    model.train(training)
    return out


class Logits(TrainerCallback):
    """The model's logits at every checkpoint, and when training (re)starts, after every callback before this one
    restored its state (the Trainer has loaded the checkpoint's weights by then)."""

    def __init__(self, probe):
        self.probe, self.at, self.at_start = probe, {}, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.at_start = logits(model, self.probe)

    def on_save(self, args, state, control, model=None, **kwargs):
        self.at[str(state.global_step)] = logits(model, self.probe)


def fresh_model(tokenizer):
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                                        tie_word_embeddings=False, attn_implementation="eager"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", choices=["mask", "gates"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--resume", choices=["remote", "layout"])
    opts = parser.parse_args()
    out = Path(opts.out)
    torch.set_num_threads(1)

    pairs = read_parallel(opts.data, "train", limit=128)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    enc = tokenizer([t for _, t in pairs], truncation=True, max_length=24)
    dataset = [{"input_ids": ids} for ids in enc["input_ids"]]
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    probe = {k: v for k, v in collate(dataset[:8]).items() if k != "labels"}
    if opts.method == "mask":
        batches = [collate(dataset[j:j + 16]) for j in (0, 16)]
        pruning = HeadPruningCallback(at_epochs=[], prune_steps={4: 0.5, 10: 0.5}, shrink_steps=[10], batches=batches)
        extra = []
    else:
        pruning = HardConcreteCallback(target_heads=4, finalize="mask")
        extra = [CloseOneGroup(pruning)]
    checkpoint, loaded_logits = None, None
    if opts.resume:
        checkpoint = last_complete_checkpoint(out, [pruning])
        if opts.resume == "remote":
            model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True)
            loaded_logits = logits(model, probe)
        else:
            model = fresh_model(tokenizer)
            restore_layout(model, checkpoint)
    else:
        model = fresh_model(tokenizer)
    args = TrainingArguments(output_dir=str(out), max_steps=12, per_device_train_batch_size=16, learning_rate=2e-3,
                             save_strategy="steps", save_steps=6, report_to=[], use_cpu=True, logging_steps=3,
                             seed=0, disable_tqdm=True, dataloader_num_workers=0)
    saves = Logits(probe)
    callbacks = [pruning, *extra, saves] + ([KillAt(opts.kill_at_step)] if opts.kill_at_step else [])
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate,
                      processing_class=tokenizer, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(out / "final"))
    gates = getattr(pruning, "gates", None)
    result = {"resumed_from": checkpoint, "loaded_logits": loaded_logits, "logits_at": saves.at,
              "logits_at_start": saves.at_start,
              "layout": find_heads(model).to_dict(), "model_class": f"{type(model).__module__}.{type(model).__name__}",
              "events": [(e["step"], e["mode"], e["heads_after"]) for e in getattr(pruning, "events", [])],
              "masks": [(owner_label(m._owner), {k: v.tolist() for k, v in m.state_dict().items()})
                        for m in attached_masks(model)],
              "gates": {k: v.tolist() for k, v in gates.state_dict().items()} if gates is not None else None,
              "weights": {k: v.tolist() for k, v in model.state_dict().items()}}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    end_process_group()
