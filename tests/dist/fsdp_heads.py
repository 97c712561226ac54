"""prunetrain under FSDP2 (`fully_shard`), in a plain training loop, compared with one process.

torchrun --nproc_per_node 2 fsdp_heads.py OUT_DIR   (gloo, CPU)

A tiny Llama (GQA: 4 query / 2 key-value heads per layer) is sharded with `fully_shard` per decoder layer and at the
root; an unsharded copy with the same weights is the single-process reference, built in every rank. Each check
writes its numbers into `rank<r>.json`; the pytest side (`tests/test_distributed.py`) asserts on them:

- masks: the masked sharded model's logits equal the masked reference's;
- importance: Michel scores (mask-gradient sums all-reduced) of each rank's half of the batches equal the reference's
  scores of all batches;
- pruning curve: the loss curve over fractions equals the reference's;
- Hard-Concrete gates: trained through `HardConcreteCallback.on_optimizer_step` (gate gradients averaged over ranks)
  beside the sharded model; log α are gathered from every rank to show they are identical;
- final shrink: `gathered_copy` gathers the full state on rank 0, which shrinks it, saves it with `save_pruned`,
  loads it back, and compares its logits with the masked sharded model's;
- the shrinking callbacks (`HeadPruningCallback(mode="shrink")`, `HardConcreteCallback(finalize="shrink")`) accept
  the sharded model (their mid-training shrink runs in `fsdp_shrink.py`).
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import prunetrain as pt
from prunetrain.methods.curve import loss_metric, pruning_curve
from prunetrain.methods.importance import head_importance
from prunetrain.training import GateTraining, HardConcreteCallback, HeadPruningCallback, Output
from prunetrain.training.distributed import gathered_copy, training_engine
from prunetrain.zoo import random_mask, tiny_inputs, tiny_model

FAMILY = "llama"


def batches(count=4):
    return [tiny_inputs(FAMILY, batch=2, length=7, seed=10 + i) for i in range(count)]


def logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    result: dict = {"world": world}
    model = tiny_model(FAMILY)
    reference = copy.deepcopy(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    result["engine"] = training_engine(model)
    data = batches()
    mine = data[rank::world]  # each rank holds an equal share: FSDP needs the same number of forwards per rank

    # masks
    mask = random_mask(model, seed=1, empty_site=None)
    with mask.applied(model):
        sharded = logits(model, data[0])
    with mask.applied(reference):
        single = logits(reference, data[0])
    result["mask_max_diff"] = float((sharded - single).abs().max())
    result["mask_effect"] = float((sharded - logits(model, data[0])).abs().max())  # the mask really changes the output

    # importance (all-reduced) vs one process on all batches
    scores = head_importance(model, mine)
    expected = head_importance(reference, data, sync=False)
    result["importance_max_diff"] = max(float((scores[n] - expected[n]).abs().max()) for n in scores.layout.names)
    result["importance_batches"] = scores.meta["batches"]

    # pruning curve: loss with 0 / 50 % of the heads masked, importance order
    curve = pruning_curve(model, loss_metric(data[:2]), fractions=[0.0, 0.5], batches=mine, key="loss")
    curve_single = pruning_curve(reference, loss_metric(data[:2]), fractions=[0.0, 0.5], scores=expected, key="loss")
    result["curve"] = curve.values
    result["curve_single"] = curve_single.values

    # Hard-Concrete gates trained beside the sharded model (the callback's own gradient path)
    gates = HardConcreteCallback(lam=0.05, training=GateTraining(gate_lr=0.2, init_log_alpha=0.5),
                                 output=Output(tensorboard=False))
    gates.on_init_end(None, None, None, model=model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    torch.manual_seed(100 + rank)  # gate samples differ per rank, as in real data-parallel training
    for step in range(3):
        loss = model(**mine[step % len(mine)]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        gates.on_optimizer_step(None, None, None)
    model.eval()
    log_alpha = torch.cat([p.detach().flatten() for p in gates.gates.parameters()])
    gathered = [torch.zeros_like(log_alpha) for _ in range(world)]
    dist.all_gather(gathered, log_alpha)
    result["log_alpha_max_diff_between_ranks"] = max(float((g - gathered[0]).abs().max()) for g in gathered)
    result["log_alpha_moved"] = float((log_alpha - 0.5).abs().max())
    gates.gates.detach()
    final = gates.gates.to_mask(keep=6)

    # final shrink from the gathered full state, save_pruned, load_pruned
    with final.applied(model):
        masked = logits(model, data[1])
    plain = gathered_copy(model)
    if plain is not None:
        pt.shrink(plain, final, gqa_rounding="keep")  # GQA: a half-kept key/value group stays, its zeroed heads zero
        path = pt.save_pruned(plain, out / "pruned", overwrite=True)
        loaded = pt.load_pruned(path)
        result["shrunk_heads"] = pt.find_heads(loaded).total_heads
        result["shrink_max_diff"] = float((logits(loaded, data[1]) - masked).abs().max())

    # the shrinking callbacks accept FSDP2 (their mid-training shrink: tests/test_fsdp_shrink.py)
    result["accepted"] = {name: callback.check_engine(model) for name, callback in (
        ("prune-shrink", HeadPruningCallback(mode="shrink")),
        ("gates-shrink", HardConcreteCallback(lam=0.1, finalize="shrink")))}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
