"""Training that speeds up after pruning: shrink the 6+6 / d256 Marian mid-training and keep training.

1. Train `--steps-before` AdamW steps on a fixed set of `--num-batches` batches (repeated), each `--batch` pairs of
   `--len` tokens: a copy task (target = source) over Zipf-distributed tokens, so the loss has something to learn.
2. Copy the model and its optimizer state: the `unpruned` twin keeps training as it is.
3. `shrink(model, mask, optimizer)` removes 4 of the 8 heads of every attention site (random, seeded): the
   parameters shrink in place and AdamW's exp_avg / exp_avg_sq are sliced with them.
4. Train `--steps-after` more steps on both, interleaved (pruned / unpruned, order rotating every round), the same
   batch and the same dropout seed at the same step.

Reported: training steps/s before vs after the shrink (sequential: the same model before and after) and
pruned vs unpruned twin (interleaved, so machine drift cancels: the headline), against the **ideal saving**
`1 - F_after / F_before`, where F is FlopCounterMode's matmul FLOP count of one training step (forward + backward;
the AdamW update has no matmuls). Target (issue 6): measured saving `1 - t_after / t_before` >= 0.8 × ideal saving.
And the loss curve: the loss keeps going down after the shrink.

    python benchmarks/bench_midtrain_shrink.py            # benchmarks/results/midtrain_shrink.json
    python benchmarks/bench_midtrain_shrink.py --quick
"""

from __future__ import annotations

import copy
import statistics

import _common as C

from prunetrain import find_heads, shrink
from prunetrain.bench import alternate, compare_times, summarize
from prunetrain.bench.flops import count_flops

TARGET = 0.8


def copy_task_batches(num: int, batch: int, length: int, vocab: int, seed: int = 0):
    """`num` batches of a copy task: Zipf(1.1)-distributed source tokens, labels = source."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab - 4 + 1, dtype=torch.float64)
    probs = ranks.pow(-1.1)
    probs /= probs.sum()
    out = []
    for _ in range(num):
        ids = torch.multinomial(probs, batch * length, replacement=True, generator=gen).view(batch, length) + 4
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


class Trainer:
    """One model + AdamW; `step()` trains on the next batch (batch i % num, dropout seed i) and records the loss."""

    def __init__(self, model, optimizer, batches, autocast=None, step_index: int = 0):
        self.model, self.optimizer, self.batches, self.autocast = model, optimizer, batches, autocast
        self.i = step_index
        self.losses: list[tuple[int, float]] = []

    def step(self) -> None:
        import torch

        torch.manual_seed(1000 + self.i)
        data = self.batches[self.i % len(self.batches)]
        if self.autocast is not None:
            with self.autocast():
                loss = self.model(**data).loss
        else:
            loss = self.model(**data).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append((self.i, float(loss.detach())))
        self.i += 1


def window_mean(losses, start: int, width: int) -> float:
    return statistics.mean(v for _, v in losses[start:start + width])


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=14, warmup=2)
    p.add_argument("--steps-before", type=int, default=16, help="training steps before the shrink")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--num-batches", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4)
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import torch

    batch = 16 if args.quick else args.batch
    steps_before = 6 if args.quick else args.steps_before
    repeats = 3 if args.quick else args.repeats  # timed interleaved rounds after the shrink
    warmup = max(args.warmup, 1)
    clock = C.Stopwatch()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.dtype == "bf16" else None

    model = C.marian_model(args.attn).train()
    batches = copy_task_batches(args.num_batches, batch, args.len, model.config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    pruned = Trainer(model, optimizer, batches, autocast)

    # 1. before the shrink: the first step is counted by FlopCounterMode (and is a warm-up step), then timed steps
    flops_before = count_flops(pruned.step).total
    times_before, cpu_before = [], []
    for k in range(1, steps_before):
        alt = alternate({"step": pruned.step}, warmup=0, repeats=1)
        if k >= warmup:
            times_before.append(alt.times["step"][0])
            cpu_before.append(alt.cpu_times["step"][0])
    print(f"before the shrink: {steps_before} steps, median step {statistics.median(times_before):.3f} s, "
          f"loss {pruned.losses[0][1]:.3f} → {pruned.losses[-1][1]:.3f}", flush=True)

    # 2. the unpruned twin continues from the same weights and optimizer state
    twin_model = copy.deepcopy(model)
    twin_opt = torch.optim.AdamW(twin_model.parameters(), lr=args.lr, weight_decay=0.01)
    twin_opt.load_state_dict(optimizer.state_dict())
    twin = Trainer(twin_model, twin_opt, batches, autocast, step_index=pruned.i)

    # 3. shrink mid-training, optimizer state included
    heads_before = find_heads(model).total_heads
    params_before = sum(p.numel() for p in model.parameters())
    mask = C.removal_mask(model, C.fraction_kept(0.5), seed=1)
    shrink(model, mask, optimizer)
    heads_after = find_heads(model).total_heads
    params_after = sum(p.numel() for p in model.parameters())
    shrink_step = pruned.i
    print(f"shrink at step {shrink_step}: heads {heads_before} → {heads_after}, params {params_before:,} → "
          f"{params_after:,}", flush=True)

    # 4. after: first step of each is counted (and warms up), then interleaved rounds
    flops_after = count_flops(pruned.step).total
    flops_twin = count_flops(twin.step).total
    alt = alternate({"pruned": pruned.step, "unpruned": twin.step}, warmup=warmup - 1, repeats=repeats, order="abba")

    ideal_speedup = flops_before / flops_after
    ideal_saving = 1 - flops_after / flops_before
    inter = compare_times(alt.times["unpruned"], alt.times["pruned"])
    inter_saving = 1 - 1 / inter["speedup"]
    inter_saving_pair = 1 - 1 / inter["speedup_pair_median"]
    seq_speedup = statistics.median(times_before) / statistics.median(alt.times["pruned"])
    seq_saving = 1 - 1 / seq_speedup
    cpu_speedup = statistics.median(alt.cpu_times["unpruned"]) / statistics.median(alt.cpu_times["pruned"])

    print(f"\nmatmul FLOPs per training step (forward+backward): {flops_before / 1e9:.1f}G → {flops_after / 1e9:.1f}G "
          f"(twin {flops_twin / 1e9:.1f}G); ideal speedup {ideal_speedup:.3f}, ideal saving {ideal_saving:.1%}")
    print("\n| comparison | step s A → B | steps/s A → B | speedup | time saved | ideal saving | saved / ideal "
          "| target | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    ta, tb = statistics.median(alt.times["unpruned"]), statistics.median(alt.times["pruned"])
    print(f"| unpruned twin vs pruned, interleaved (medians) | {ta:.3f} → {tb:.3f} | {1 / ta:.3f} → {1 / tb:.3f} "
          f"| {inter['speedup']:.3f} | {inter_saving:.1%} | {ideal_saving:.1%} | {inter_saving / ideal_saving:.2f} "
          f"| >= 0.8 | {C.verdict(inter_saving / ideal_saving, TARGET)} |")
    print(f"| same, median of per-pair ratios | | | {inter['speedup_pair_median']:.3f} | {inter_saving_pair:.1%} "
          f"| {ideal_saving:.1%} | {inter_saving_pair / ideal_saving:.2f} | | |")
    t0 = statistics.median(times_before)
    print(f"| before vs after the shrink, sequential (medians) | {t0:.3f} → {tb:.3f} | {1 / t0:.3f} → {1 / tb:.3f} "
          f"| {seq_speedup:.3f} | {seq_saving:.1%} | {ideal_saving:.1%} | {seq_saving / ideal_saving:.2f} | | |")
    print(f"| CPU time, interleaved (medians) | | | {cpu_speedup:.3f} | {1 - 1 / cpu_speedup:.1%} | {ideal_saving:.1%} "
          f"| {(1 - 1 / cpu_speedup) / ideal_saving:.2f} | | |")

    k = args.num_batches
    post = [loss for loss in pruned.losses if loss[0] >= shrink_step]
    twin_losses = twin.losses
    first, last = window_mean(post, 0, k), window_mean(post, len(post) - k, k)
    twin_first, twin_last = window_mean(twin_losses, 0, k), window_mean(twin_losses, len(twin_losses) - k, k)
    pre_last = window_mean(pruned.losses[:shrink_step], shrink_step - k, k)
    keeps_going_down = last < first
    print(f"\nloss (mean over one pass of the {k} batches): before the shrink, last pass {pre_last:.3f}; "
          f"pruned after the shrink: first pass {first:.3f} → last pass {last:.3f} "
          f"({'keeps going down' if keeps_going_down else 'DOES NOT go down'}); "
          f"unpruned twin over the same steps: {twin_first:.3f} → {twin_last:.3f}")
    print("step:     " + " ".join(f"{i:6d}" for i, _ in pruned.losses))
    print("pruned:   " + " ".join(f"{v:6.3f}" for _, v in pruned.losses))
    print("unpruned: " + " " * 7 * shrink_step + " ".join(f"{v:6.3f}" for _, v in twin_losses))

    profiles = C.profile_calls("one training step, unpruned twin vs pruned (after the timed steps)",
                               {"unpruned": twin.step, "pruned": pruned.step})
    payload = {
        "benchmark": "midtrain_shrink",
        "command": C.command_line(),
        "target": "measured time saving per training step >= 0.8 × ideal saving (1 - F_after/F_before, "
                  "FlopCounterMode matmul FLOPs of forward+backward)",
        "setting": {"batch": batch, "len": args.len, "num_batches": args.num_batches, "attn": args.attn,
                    "dtype": args.dtype, "threads": torch.get_num_threads(), "lr": args.lr,
                    "optimizer": "AdamW (weight decay 0.01), grad-norm clip 1.0", "task": "copy, Zipf(1.1) tokens",
                    "weights": "random init", "steps_before": steps_before, "warmup": warmup,
                    "repeats_after": repeats, "removed": "4 of 8 heads in every site (random, seed 1)"},
        "heads": [heads_before, heads_after],
        "params": [params_before, params_after],
        "flops_per_step": {"before": flops_before, "after": flops_after, "unpruned_twin": flops_twin},
        "ideal_speedup": ideal_speedup,
        "ideal_saving": ideal_saving,
        "interleaved": {
            "pruned": {**summarize(alt.times["pruned"]), "times": alt.times["pruned"],
                       "cpu_times": alt.cpu_times["pruned"]},
            "unpruned": {**summarize(alt.times["unpruned"]), "times": alt.times["unpruned"],
                         "cpu_times": alt.cpu_times["unpruned"]},
            **inter,
            "saving": inter_saving,
            "saving_pair_median": inter_saving_pair,
            "saving_over_ideal": inter_saving / ideal_saving,
            "saving_over_ideal_pair": inter_saving_pair / ideal_saving,
            "speedup_cpu_time": cpu_speedup,
            "order": alt.order,
            "order_string": alt.order_string(),
            "verdict": C.verdict(inter_saving / ideal_saving, TARGET),
        },
        "sequential": {"before": {**summarize(times_before), "times": times_before, "cpu_times": cpu_before},
                       "speedup": seq_speedup, "saving": seq_saving, "saving_over_ideal": seq_saving / ideal_saving},
        "shrink_step": shrink_step,
        "losses_pruned": pruned.losses,
        "losses_unpruned_twin": twin_losses,
        "loss_windows": {"before_last_pass": pre_last, "after_first_pass": first, "after_last_pass": last,
                         "twin_first_pass": twin_first, "twin_last_pass": twin_last},
        "loss_keeps_going_down": keeps_going_down,
        "profiles": profiles,
        "wall_seconds": clock(),
        "machine": {**machine, "loadavg_at_end": C.loadavg()},
    }
    C.write_json(C.output_path(args, "midtrain_shrink"), payload)


if __name__ == "__main__":
    main()
