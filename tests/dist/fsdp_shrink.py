"""Mid-training shrink under FSDP2 (`fully_shard`), compared with one process on the same global batches.

python fsdp_shrink.py --out DIR --data DIR/multi30k
                      [--callback prune-shrink|gates-shrink|prune-shrink-distill|prune-ffn-shrink]
                      [--resume]
                      [--kill-at-step N]  (rank 0 sends itself SIGKILL at step N: a crash at a known point)
or under `torchrun --nproc_per_node 2` (gloo, CPU), where every encoder/decoder layer and the root are
`fully_shard`-ed. On CPU the HF Trainer does not shard (it trains with DDP), so this worker is the training loop: it
drives the callbacks through transformers' own `CallbackHandler` with the Trainer's events in the Trainer's order
and the keyword arguments the Trainer passes (model, optimizer, train_dataloader, ...).

Each of the 24 steps (3 epochs of 8) sees the same 16 sequences in one process and, split 8 + 8, on two ranks. No
dropout. The loss is Σ token cross-entropy over the step's label tokens on all ranks, divided by their count
(gathered): each rank backpropagates its share × W, since FSDP averages gradients over the W ranks. The callback
masks at step 4, masks more and shrinks at steps 8 and 14 (`shrink_steps`), so training crosses two shrinks; or
Hard-Concrete gates with a 12-head budget are trained and shrunk at the end (`finalize="shrink"`); or the
prune-shrink schedule while distilling from a snapshot of the model taken when training begins (`DistillationCallback(
teacher=None)`; the loss computed here through its `loss_func`, normalised over every rank's tokens); or heads and
FFN neurons pruned to FLOP targets (15 %, 25 %, 35 % of the weight multiply-adds) at the same steps, with the same
two shrinks (`prune-ffn-shrink`). A checkpoint is
written at every epoch end (full model and optimizer state through torch.distributed.checkpoint's state-dict API,
the config with the head layout, `trainer_state.json`, then the callbacks' state).

Each rank writes `rank<r>_result.json` (global loss per step, mask, layout, bytes of parameters + optimizer state
held by the rank after every step) and rank 0 `rank0_weights.safetensors` (the full, gathered weights).
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import MarianMTModel, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from prunetrain.engine.heads import find_heads, find_sites
from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer
from prunetrain.training import (DistillationCallback, GateTraining, HardConcreteCallback, HeadPruningCallback,
                                 Importance, Output, Schedule, last_complete_checkpoint, restore_layout)
from prunetrain.training.distributed import any_rank

GLOBAL_BATCH, STEPS_PER_EPOCH, EPOCHS = 16, 8, 3


def build(data: str, world: int, rank: int):
    """Tokenizer, model and this rank's batches (rank r of step s: the r-th slice of the global batch s)."""
    pairs = read_parallel(data, "train", limit=GLOBAL_BATCH * STEPS_PER_EPOCH)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.0,
                                        attn_implementation="eager"))
    dataset = build_dataset(pairs, tokenizer, max_length=24)
    collator = make_collator(tokenizer, model)
    share = GLOBAL_BATCH // world
    batches = [collator([dataset[s * GLOBAL_BATCH + rank * share + i] for i in range(share)])
               for s in range(STEPS_PER_EPOCH)]
    fixed = [collator([dataset[i] for i in range(j, j + 8)]) for j in (0, 8, 16, 24)]  # importance batches
    return tokenizer, model, batches, fixed


def make_callback(kind: str, fixed: list):
    if kind == "gates-shrink":
        return HardConcreteCallback(target_heads=12, finalize="shrink", output=Output(tensorboard=False),
                                    training=GateTraining(gate_lr=0.1, lagrangian_lr=0.1, init_log_alpha=1.0))
    if kind == "prune-ffn-shrink":
        return HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: {"flops": 0.15}, 8: {"flops": 0.25},
                                                                       14: {"flops": 0.35}}, shrink_steps=[8, 14]),
                                   importance=Importance(batches=fixed), output=Output(tensorboard=False))
    return HeadPruningCallback(Schedule(at_epochs=[], prune_steps={4: 0.25, 8: 0.375, 14: 0.5}, shrink_steps=[8, 14]),
                               importance=Importance(batches=fixed), output=Output(tensorboard=False))


def shard(model) -> None:
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer)
    fully_shard(model)


def local_bytes(model, optimizer) -> int:
    """Bytes of the parameters and optimizer state this rank holds (its shards under FSDP2)."""
    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t
    tensors = {id(p): local(p) for p in model.parameters()}
    for state in optimizer.state.values():
        tensors.update({id(v): local(v) for v in state.values() if torch.is_tensor(v)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def token_sum_loss(outputs, labels, num_items_in_batch):
    """Σ token cross-entropy over this rank's label tokens / every rank's label tokens."""
    return torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1).float(), labels.flatten(),
                                             ignore_index=-100, reduction="sum") / num_items_in_batch


def step_loss(model, batch, world: int, distillation=None):
    """(loss to backpropagate on this rank, the step's global mean token loss; with `distillation` the combined
    loss (1 − α)·CE + α·T²·KL, both terms over every rank's label tokens)."""
    outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
    labels = batch["labels"]
    items = (labels != -100).sum().float()
    if world > 1:
        dist.all_reduce(items)
    compute = token_sum_loss if distillation is None else distillation.loss_func(token_sum_loss)
    loss = compute(outputs, labels, num_items_in_batch=items)
    value = loss.detach().clone()
    if world > 1:
        dist.all_reduce(value)
    return loss * world, float(value)


def save_checkpoint(out: Path, model, optimizer, args, state, handler, control, rank: int, world: int) -> None:
    checkpoint = out / f"checkpoint-{state.global_step}"
    if world > 1:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))  # a collective: every rank
    else:
        model_state, optimizer_state = model.state_dict(), optimizer.state_dict()
    if rank == 0:
        checkpoint.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model_state, "optimizer": optimizer_state}, checkpoint / "state.pt")
        model.config.save_pretrained(checkpoint)  # the head layout, for restore_layout
        state.save_to_json(str(checkpoint / "trainer_state.json"))
    handler.on_save(args, state, control)  # the callbacks' state, written last (rank 0)
    if world > 1:
        dist.barrier()


def resume(checkpoint: str, model, optimizer, world: int) -> TrainerState:
    saved = torch.load(Path(checkpoint) / "state.pt", weights_only=True)  # every rank reads the full state (tensors only)
    if world > 1:
        set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    return TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--callback", default="prune-shrink",
                        choices=["prune-shrink", "gates-shrink", "prune-shrink-distill", "prune-ffn-shrink"])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-step", type=int, default=None)
    opts = parser.parse_args()
    out = Path(opts.out)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.set_num_threads(1)
    tokenizer, model, batches, fixed = build(opts.data, world, rank)
    callback = make_callback(opts.callback, fixed)
    distillation = DistillationCallback(teacher=None, alpha=0.5, temperature=2.0, tensorboard=False) \
        if opts.callback == "prune-shrink-distill" else None
    callbacks = [c for c in (distillation, callback) if c is not None]
    checkpoint = last_complete_checkpoint(out, callbacks) if opts.resume else None
    if checkpoint is not None:
        restore_layout(model, checkpoint)  # the checkpoint's (shrunk) shape, before sharding
    if world > 1:
        shard(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    args = TrainingArguments(output_dir=str(out), num_train_epochs=EPOCHS, per_device_train_batch_size=GLOBAL_BATCH
                             // world, use_cpu=True, report_to=[], save_strategy="epoch", seed=0)
    state = TrainerState(max_steps=STEPS_PER_EPOCH * EPOCHS, num_train_epochs=EPOCHS,
                         is_world_process_zero=rank == 0, is_local_process_zero=rank == 0)
    handler = CallbackHandler(callbacks, model, tokenizer, optimizer, None)
    handler.train_dataloader = batches
    control = handler.on_init_end(args, state, TrainerControl())
    if checkpoint is not None:
        state = resume(checkpoint, model, optimizer, world)
        state.is_world_process_zero = state.is_local_process_zero = rank == 0  # saved by rank 0: set per rank
    losses: dict[int, float] = {}
    memory: dict[int, int] = {state.global_step: local_bytes(model, optimizer)}
    control = handler.on_train_begin(args, state, control)
    while state.global_step < state.max_steps:
        control = handler.on_step_begin(args, state, control)
        loss, losses[state.global_step + 1] = step_loss(model, batches[state.global_step % STEPS_PER_EPOCH], world,
                                                        distillation)
        loss.backward()
        del loss  # a live graph would keep each parameter's gradient accumulator with its pre-shrink shape
        control = handler.on_pre_optimizer_step(args, state, control)
        optimizer.step()
        control = handler.on_optimizer_step(args, state, control)
        optimizer.zero_grad(set_to_none=True)
        state.global_step += 1
        state.epoch = state.global_step / STEPS_PER_EPOCH
        control = handler.on_step_end(args, state, control)
        memory[state.global_step] = local_bytes(model, optimizer)
        if state.global_step % STEPS_PER_EPOCH == 0:
            control = handler.on_epoch_end(args, state, control)
            save_checkpoint(out, model, optimizer, args, state, handler, control, rank, world)
        if opts.kill_at_step == state.global_step and rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    handler.on_train_end(args, state, control)
    memory_end = local_bytes(model, optimizer)  # after a shrink at the end (finalize="shrink")
    mask = callback.final_mask if opts.callback == "gates-shrink" else callback.mask
    agreed = [any_rank(rank == 0), any_rank(False)]  # the time cap's rule: one rank's decision is every rank's
    layout = find_sites(model) if opts.callback == "prune-ffn-shrink" else find_heads(model)
    result = {"agreed": agreed, "mask": mask.to_dict(), "layout": layout.to_dict(), "world": world,
              "resumed_from": checkpoint, "steps": state.global_step, "losses": losses, "memory": memory,
              "memory_end": memory_end}
    if distillation is not None:  # what each rank distilled from: a whole replica, not shards
        teacher = list(distillation.teacher.parameters())
        result["teacher"] = {"class": type(distillation.teacher).__name__,
                             "sharded": any(isinstance(p, DTensor) for p in teacher),
                             "parameters": sum(p.numel() for p in teacher), "flops": distillation.teacher_flops,
                             "frozen": not any(p.requires_grad for p in teacher),
                             "layout": find_heads(distillation.teacher).to_dict()}
    if opts.callback == "gates-shrink":
        result["log_alpha"] = {k: v.tolist() for k, v in callback.gates.state_dict().items()}
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) \
        if world > 1 else model.state_dict()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}_result.json").write_text(json.dumps(result))
    if rank == 0:
        save_file({k: v.detach().clone().contiguous() for k, v in weights.items()},
                  str(out / "rank0_weights.safetensors"))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
