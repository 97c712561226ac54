"""What `bench_ddp_shrink.py` and `bench_fsdp_shrink.py` share: training speed and memory per rank before and after
a mid-training shrink of 50 % of the heads, data-parallel (under torchrun) and in one process.

The model is the recipe's 6+6-layer Marian (d256, 8 heads, FFN 1024, vocab 8000; random weights) trained with AdamW
on a copy task (`bench_midtrain_shrink.copy_task_batches`). Every optimizer step sees a global batch of `--batch`
sequences: one process takes them all, W ranks take `--batch / W` each. After `--steps-before` steps the same 4 of
8 heads of every attention site are removed on every rank (`prunetrain.shrink` with the optimizer: under DDP the
reducer is rebuilt, under FSDP2 each affected parameter and its AdamW state are gathered, sliced and sharded again),
then `--steps-after` more steps run.

Reported per arm (the distributed engine, and one process when `--single` names its result):
- step time: the median wall time of an optimizer step before and after the shrink (the first `--warmup` steps of
  each phase left out); with W ranks, the slowest rank's median; the ratio before / after is the speed-up;
- memory per rank: bytes of the parameters, gradients and optimizer state the rank holds (its shards under FSDP2),
  before and after the shrink, and on CUDA the peak allocated memory of each phase.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import _common as C
import torch
import torch.distributed as dist

from bench_midtrain_shrink import copy_task_batches
from prunetrain import find_heads, shrink


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, default=64, help="global batch (sequences per optimizer step)")
    parser.add_argument("--len", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--steps-before", type=int, default=20)
    parser.add_argument("--steps-after", type=int, default=20)
    parser.add_argument("--single", type=Path, default=None,
                        help="the one-process result of the same benchmark (run it first without torchrun), shown "
                             "beside the distributed ratios")


def world() -> tuple[int, int]:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return (dist.get_rank(), size) if size > 1 else (0, 1)


def held_bytes(model, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds (local shards of DTensors)."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    tensors = {}
    for p in model.parameters():
        tensors[id(p)] = local(p)
        if p.grad is not None:
            tensors[id(p.grad)] = local(p.grad)
    for state in optimizer.state.values():
        tensors.update({id(v): local(v) for v in state.values() if torch.is_tensor(v)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _phase(step, count: int, warmup: int, model, optimizer) -> dict:
    """Run `count` steps; median step time after `warmup`, held bytes at the end, CUDA peak of the phase."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(count):
        _sync()
        start = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - start)
    timed = times[warmup:] or times
    return {"median_step_seconds": statistics.median(timed), "step_seconds": times,
            "held_bytes": held_bytes(model, optimizer),
            "cuda_peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None}


def run(engine: str, args, wrap) -> dict:
    """Train, shrink, train on; `wrap(model) -> (model to train, after_shrink callable)` applies the engine.

    Returns the arm's record (rank 0's view, with the slowest rank's step times)."""
    C.quiet_transformers()
    rank, size = world()
    if args.batch % size:
        raise SystemExit(f"--batch: {args.batch} does not split evenly over {size} ranks.")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = C.marian_model("sdpa", dropout=0.0).to(device).train()
    batches = copy_task_batches(4, args.batch, args.len, model.config.vocab_size)
    share = args.batch // size
    mine = [{k: v[rank * share:(rank + 1) * share].to(device) for k, v in b.items()} for b in batches]
    mask = C.removal_mask(model, C.fraction_kept(0.5), seed=1)  # the same on every rank (seeded)
    trained, after_shrink = wrap(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=5e-4)
    counter = iter(range(10**9))

    def step():
        loss = trained(**mine[next(counter) % len(mine)]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    heads_before = find_heads(model).total_heads
    before = _phase(step, args.steps_before, args.warmup, trained, optimizer)
    shrink(model, mask, optimizer=optimizer)
    after_shrink()
    after = _phase(step, args.steps_after, args.warmup, trained, optimizer)
    for phase in (before, after):
        phase["median_step_seconds"] = _slowest(phase["median_step_seconds"], size)
    return {"engine": engine, "world_size": size, "rank": rank, "threads_per_rank": torch.get_num_threads(),
            "device": str(device), "heads": [heads_before, find_heads(model).total_heads],
            "before": before, "after": after,
            "speedup": before["median_step_seconds"] / after["median_step_seconds"],
            "memory_ratio": after["held_bytes"] / before["held_bytes"]}


def _slowest(value: float, size: int) -> float:
    """The largest of the ranks' values (data-parallel steps wait for the slowest rank)."""
    if size == 1:
        return value
    gathered = [None] * size
    dist.all_gather_object(gathered, value)
    return max(gathered)


def table(arms: list[dict]) -> str:
    lines = ["| engine | ranks | heads | step s before → after | speed-up | held MB per rank before → after "
             "| memory after / before |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        b, a = arm["before"], arm["after"]
        lines.append(f"| {arm['engine']} | {arm['world_size']} | {arm['heads'][0]} → {arm['heads'][1]} "
                     f"| {b['median_step_seconds']:.3f} → {a['median_step_seconds']:.3f} | {arm['speedup']:.3f} "
                     f"| {b['held_bytes'] / 2**20:.1f} → {a['held_bytes'] / 2**20:.1f} | {arm['memory_ratio']:.3f} |")
    return "\n".join(lines)


def report(name: str, arm: dict, args, machine: dict, started: float) -> None:
    """Rank 0 prints the table (with the one-process arm from `--single`) and writes the JSON."""
    if arm["rank"] != 0:
        return
    arms = [arm]
    if args.single is not None:
        arms.append(json.loads(args.single.read_text())["arms"][0])
    print("\n" + table(arms), flush=True)
    payload = {"benchmark": name, "command": C.command_line(), "arms": arms,
               "setting": {"batch": args.batch, "len": args.len, "steps_before": args.steps_before,
                           "steps_after": args.steps_after, "warmup": args.warmup,
                           "model": "Marian 6+6, d256, 8 heads, FFN 1024, vocab 8000, sdpa, random weights",
                           "removed": "4 of 8 heads in every site (seeded)", "optimizer": "AdamW lr 5e-4"},
               "wall_seconds": time.time() - started, "machine": {**machine, "loadavg_at_end": C.loadavg()}}
    suffix = f"_w{arm['world_size']}"
    C.write_json(args.out if args.out is not None else C.RESULTS / f"{name}{suffix}.json", payload)


def finish() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
