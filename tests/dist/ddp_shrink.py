"""Mid-training shrink under DDP, compared with one process on the same global batches.

python ddp_shrink.py --out DIR --data DIR/multi30k [--callback prune-shrink|gates-shrink|prune-ffn-shrink|gates-ffn-shrink]
                     [--resume]
                     [--kill-at-step N]  (rank 0 sends itself SIGKILL at step N: a crash at a known point)
                     [--fsdp]  (TrainingArguments(fsdp="full_shard"), which the Trainer ignores on CPU)
                     [--compile BACKEND]  (TrainingArguments(torch_compile=True, torch_compile_backend=BACKEND))
or under `torchrun --nproc_per_node 2` (gloo, CPU). With W ranks each rank takes `16 / W` sequences per step, so one
optimizer step sees the same 16 sequences as the single process (sequential sampling: rank r of step s gets the
r-th slice of the single process's batch s). No dropout. The loss is the sum of the token losses over the step's
label tokens on all ranks (`token_loss`, with the Trainer's `num_items_in_batch`, gathered over ranks), so the DDP
gradient is exactly the single process's: Marian's own loss is a per-rank mean, and the mean of the ranks' means is
not the mean over all tokens.
Each rank writes `rank<r>_result.json` (mask, layout, gate log α) and `rank<r>_weights.safetensors`.
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

from process_group import end_process_group  # tests/dist, the script's own folder
from prunetrain.engine.heads import find_heads, find_sites
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training import (GateTraining, HardConcreteCallback, HeadPruningCallback, Importance, Schedule,
                                 last_complete_checkpoint, restore_layout)

GLOBAL_BATCH = 16


def token_loss(outputs, labels, num_items_in_batch):
    """Σ token cross-entropy / label tokens of the whole step (all ranks): the Trainer's `compute_loss_func`."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
    total = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                              reduction="sum")
    return total / num_items_in_batch


class _KillAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--callback", default="prune-shrink", choices=["prune-shrink", "gates-shrink",
                                                                       "prune-ffn-shrink", "gates-ffn-shrink"])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--fsdp", action="store_true", help="TrainingArguments(fsdp='full_shard'): on CPU the "
                                                            "Trainer trains with DDP instead")
    parser.add_argument("--compile", default=None, help="TrainingArguments(torch_compile=True) with this backend")
    opts = parser.parse_args()
    out = Path(opts.out)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)

    pairs = read_parallel(opts.data, "train", limit=128)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.0,
                                        attn_implementation="eager"))
    dataset = build_dataset(pairs, tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    fixed = [collator([dataset[i] for i in range(j, j + 8)]) for j in (0, 8, 16, 24)]
    if opts.callback == "gates-shrink":
        callback = HardConcreteCallback(target_heads=12, finalize="shrink",
                                        training=GateTraining(gate_lr=0.1, lagrangian_lr=0.1, init_log_alpha=1.0))
    elif opts.callback == "gates-ffn-shrink":  # gates on heads and FFN neurons, 30 % of the multiply-adds removed
        callback = HardConcreteCallback(target_flops=0.3, finalize="shrink",
                                        training=GateTraining(gate_lr=0.1, lagrangian_lr=0.1, init_log_alpha=1.0))
    elif opts.callback == "prune-ffn-shrink":  # heads and FFN neurons to 20 %, then 35 % of the multiply-adds
        callback = HeadPruningCallback(Schedule(at_epochs=[1, 2], prune={1: {"flops": 0.2}, 2: {"flops": 0.35}}),
                                       mode="shrink", importance=Importance(batches=fixed))
    else:
        callback = HeadPruningCallback(Schedule(at_epochs=[1, 2], prune={1: 0.25, 2: 0.5}), mode="shrink",
                                       importance=Importance(batches=fixed))
    args = Seq2SeqTrainingArguments(
        output_dir=str(out), num_train_epochs=3, per_device_train_batch_size=GLOBAL_BATCH // world,
        learning_rate=2e-3, save_strategy="epoch", report_to=[], use_cpu=True, logging_steps=4, seed=0,
        disable_tqdm=True, train_sampling_strategy="sequential", dataloader_num_workers=0,
        ddp_backend="gloo" if world > 1 else None, **({"fsdp": "full_shard"} if opts.fsdp else {}),
        **({"torch_compile": True, "torch_compile_backend": opts.compile} if opts.compile else {}))
    checkpoint = None
    if opts.resume:
        checkpoint = last_complete_checkpoint(out, [callback])  # a checkpoint cut short by the kill is skipped
        restore_layout(model, checkpoint)
    callbacks = [callback] if opts.kill_at_step is None or rank != 0 else [callback, _KillAt(opts.kill_at_step)]
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                             processing_class=tokenizer, callbacks=callbacks,
                             compute_loss_func=token_loss)
    trainer.train(resume_from_checkpoint=checkpoint)
    gated = opts.callback.startswith("gates")
    mask = callback.final_mask if gated else callback.mask
    layout = find_sites(model) if "ffn" in opts.callback else find_heads(model)
    result = {"mask": mask.to_dict(), "layout": layout.to_dict(), "resumed_from": checkpoint,
              "steps": trainer.state.global_step, "wrapper": type(trainer.model_wrapped).__name__}
    if gated:
        result["log_alpha"] = {k: v.tolist() for k, v in callback.gates.state_dict().items()}
    (out / f"rank{rank}_result.json").write_text(json.dumps(result))
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              str(out / f"rank{rank}_weights.safetensors"))


if __name__ == "__main__":
    main()
    end_process_group()
