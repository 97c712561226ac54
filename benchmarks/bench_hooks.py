"""Overhead of an attached all-ones HeadMask on a training step of the 6+6 / d256 Marian.

One training step = forward with labels + backward + AdamW step + zero_grad, on a fixed batch of `--batch`
sentence pairs of `--len` source and target tokens (128 × 32 = 4096 target tokens by default, the FACTS setting).
Arms, interleaved with the order rotating every round:

- `plain`:  the model without hooks;
- `ones`:   an identical copy with `HeadMask.ones(model)` attached (one forward pre-hook per attention site that
            multiplies the heads by their keep value);
- `ones+grad` (with `--grad-mask`): the same with `mask.requires_grad_()` (the keep values collect ∂L/∂ξ, as
            head-importance scoring does).
- `hard-concrete` (with `--gates`): `prunetrain.methods.gates.HardConcreteGates` attached (Voita et al. 2019): a gate
            sample per head at every forward, log α in the optimizer, loss + λ·expected L0 (λ = 0.01).
- `guard` (with `--guard`): the plain step with `FiniteGuard`'s check before the optimizer step
            (`prunetrain.training.finite.all_finite` over every gradient), what a recipe step pays to stop at the
            first NaN.

Each arm has its own AdamW; since the mask is all ones, the mask arms compute the same numbers as `plain` (the
gate arm samples gates < 1, so its losses differ; its work is what is compared).
Target (issue 6): overhead of `ones` <= 3 %. The gate arm is reported for information.

    python benchmarks/bench_hooks.py                 # benchmarks/results/hooks.json
    python benchmarks/bench_hooks.py --quick
"""

from __future__ import annotations

import copy
import statistics

import _common as C

from prunetrain import HeadMask
from prunetrain.bench import alternate, compare_times, summarize
from prunetrain.bench.flops import count_flops

TARGET = 0.03


def make_batch(model, batch: int, length: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    return {
        "input_ids": torch.randint(4, vocab, (batch, length), generator=gen),
        "attention_mask": torch.ones(batch, length, dtype=torch.long),
        "labels": torch.randint(4, vocab, (batch, length), generator=gen),
    }


def isolated_hook_cost(model, batch: int, length: int, requires_grad: bool, rounds: int = 30) -> dict:
    """The work the hooks add to one training step, measured alone: for every site, the hook's forward
    (unflatten, multiply by the keep values, flatten) and the backward of that multiply, on a tensor of the
    site's real input shape; minus the same with an identity view instead of the hook. Min over `rounds` (robust
    on a shared machine, where the in-situ A/B is noisier than the effect)."""
    import time

    import torch

    from prunetrain import find_heads
    from prunetrain.engine.mask import _HeadScale  # the hook HeadMask.attach registers

    sites = list(find_heads(model))
    xs = [torch.randn(batch, length, s.num_heads * s.head_dim, requires_grad=True) for s in sites]
    keeps = [torch.ones(s.num_heads, requires_grad=requires_grad) for s in sites]
    hooks = [_HeadScale(k, s.head_dim) for k, s in zip(keeps, sites)]
    grads = [torch.randn_like(x) for x in xs]

    def run(with_hook: bool) -> float:
        start = time.process_time()
        for x, g, hook in zip(xs, grads, hooks):
            y = hook(None, (x,))[0] if with_hook else x.view(x.shape)
            inputs = [x, hook.keep] if (with_hook and requires_grad) else [x]
            torch.autograd.grad(y, inputs, g)
        return time.process_time() - start

    for _ in range(3):
        run(True), run(False)
    hooked, plain = [], []
    for _ in range(rounds):
        hooked.append(run(True))
        plain.append(run(False))
    return {"sites": len(sites), "hooked_s": min(hooked), "identity_s": min(plain),
            "added_s": min(hooked) - min(plain), "clock": "process CPU time, min over rounds"}


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=12, warmup=2)
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--grad-mask", action="store_true", help="add the arm with requires_grad keep values")
    p.add_argument("--gates", action="store_true", help="add the Hard-Concrete gate arm")
    p.add_argument("--guard", action="store_true", help="add the arm with FiniteGuard's gradient check")
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import torch

    batch = 16 if args.quick else args.batch
    repeats = 3 if args.quick else args.repeats
    clock = C.Stopwatch()
    base = C.marian_model(args.attn).train()
    data = make_batch(base, batch, args.len)
    arms = {"plain": base, "ones": copy.deepcopy(base)}
    masks = {"ones": HeadMask.ones(arms["ones"]).attach(arms["ones"])}
    if args.grad_mask:
        arms["ones+grad"] = copy.deepcopy(base)
        masks["ones+grad"] = HeadMask.ones(arms["ones+grad"]).requires_grad_().attach(arms["ones+grad"])
    gates = None
    if args.gates:
        from prunetrain.methods.gates import gates_for

        arms["hard-concrete"] = copy.deepcopy(base)
        gates = gates_for(arms["hard-concrete"]).train().attach(arms["hard-concrete"])
    if args.guard:
        from prunetrain.training.finite import all_finite

        arms["guard"] = copy.deepcopy(base)
    optimizers = {k: torch.optim.AdamW(list(m.parameters()) + (list(gates.parameters()) if k == "hard-concrete"
                                                                 else []), lr=1e-4) for k, m in arms.items()}
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.dtype == "bf16" else None
    losses = {k: [] for k in arms}

    def step_fn(name):
        model, opt = arms[name], optimizers[name]
        mask = masks.get(name)

        def step():
            torch.manual_seed(len(losses[name]))  # the same dropout masks in every arm at its i-th step
            if autocast is not None:
                with autocast():
                    loss = model(**data).loss
            else:
                loss = model(**data).loss
            if name == "hard-concrete":
                loss = loss + gates.penalty(0.01)
            loss.backward()
            if name == "guard" and not all_finite([p.grad for p in model.parameters() if p.grad is not None]):
                raise RuntimeError("the guard found a non-finite gradient")
            opt.step()
            opt.zero_grad(set_to_none=True)
            if mask is not None:
                mask.zero_grad()
            losses[name].append(float(loss.detach()))
        return step

    fns = {k: step_fn(k) for k in arms}
    flops = {k: count_flops(fn).total for k, fn in fns.items()}  # also the first warm-up step of each arm
    print(f"training step of {batch}×{args.len} tokens, {args.attn}, {args.dtype}, {torch.get_num_threads()} threads; "
          f"matmul FLOPs per step: " + ", ".join(f"{k} {v / 1e9:.1f}G" for k, v in flops.items()), flush=True)
    alt = alternate(fns, warmup=max(args.warmup - 1, 0), repeats=repeats, order="abba")

    rows = []
    plain = summarize(alt.times["plain"])
    print("\n| arm | median step s (IQR) | overhead vs plain (medians) | overhead (pair median, IQR) "
          "| CPU-time overhead | target | verdict |")
    print("|---|---|---|---|---|---|---|")
    print(f"| plain | {plain['median']:.3f} ({plain['iqr']:.3f}) | – | – | – | | |")
    for name in arms:
        if name == "plain":
            continue
        s = summarize(alt.times[name])
        cmp = compare_times(alt.times["plain"], alt.times[name])  # speedup < 1 means slower
        overhead = 1 / cmp["speedup"] - 1
        pair_overhead = 1 / cmp["speedup_pair_median"] - 1
        pair_q = (1 / cmp["speedup_pair_q3"] - 1, 1 / cmp["speedup_pair_q1"] - 1)
        cpu_overhead = statistics.median(alt.cpu_times[name]) / statistics.median(alt.cpu_times["plain"]) - 1
        target = TARGET if name == "ones" else None
        verdict = C.verdict(overhead, TARGET, higher_is_better=False) if target else "(info)"
        print(f"| {name} | {s['median']:.3f} ({s['iqr']:.3f}) | {overhead:+.2%} | {pair_overhead:+.2%} "
              f"({pair_q[0]:+.2%} … {pair_q[1]:+.2%}) | {cpu_overhead:+.2%} | {'<= 3%' if target else ''} "
              f"| {verdict} |")
        rows.append({"arm": name, "step_s": s, "times": alt.times[name], "cpu_times": alt.cpu_times[name],
                     "overhead": overhead, "overhead_pair_median": pair_overhead,
                     "overhead_pair_iqr": list(pair_q), "overhead_cpu_time": cpu_overhead,
                     "target": target, "verdict": verdict})
    isolated = {"ones": isolated_hook_cost(base, batch, args.len, requires_grad=False)}
    if args.grad_mask:
        isolated["ones+grad"] = isolated_hook_cost(base, batch, args.len, requires_grad=True)
    plain_cpu = statistics.median(alt.cpu_times["plain"])
    print(f"\nhook work measured alone (forward + backward of the {isolated['ones']['sites']} hooks, process CPU time, "
          f"min of 30): " + "; ".join(f"{k}: +{v['added_s'] * 1e3:.1f} ms per step = {v['added_s'] / plain_cpu:+.2%} of "
                                      f"the plain step's median CPU time {plain_cpu:.3f} s" for k, v in isolated.items()))
    for row in rows:
        if row["arm"] in isolated:
            row["isolated_hook_cost_s"] = isolated[row["arm"]]["added_s"]
            row["isolated_overhead"] = isolated[row["arm"]]["added_s"] / plain_cpu
    profiles = C.profile_calls("one training step per arm", fns)
    same = all(abs(losses[k][-1] - losses["plain"][-1]) < 1e-4 * abs(losses["plain"][-1])
               for k in arms if k != "hard-concrete")  # the guard arm computes the plain step's numbers too
    print(f"\nlast loss per arm: " + ", ".join(f"{k} {v[-1]:.5f}" for k, v in losses.items())
          + (" (mask arms identical to plain: the all-ones mask changes nothing)" if same else " (DIFFER)"))
    payload = {
        "benchmark": "hooks",
        "command": C.command_line(),
        "target": "overhead of an attached all-ones HeadMask on a training step <= 3%",
        "setting": {"batch": batch, "len": args.len, "attn": args.attn, "dtype": args.dtype,
                    "threads": torch.get_num_threads(), "warmup": args.warmup, "repeats": repeats,
                    "optimizer": "AdamW lr 1e-4", "weights": "random"},
        "flops_per_step": flops,
        "plain": {"step_s": plain, "times": alt.times["plain"], "cpu_times": alt.cpu_times["plain"]},
        "arms": rows,
        "order": alt.order,
        "order_string": alt.order_string(),
        "warmup_order": [list(arms)] + alt.warmup_order,
        "profiles": profiles,
        "isolated_hook_cost": isolated,
        "losses": losses,
        "losses_identical": same,
        "wall_seconds": clock(),
        "machine": {**machine, "loadavg_at_end": C.loadavg()},
    }
    C.write_json(C.output_path(args, "hooks"), payload)


if __name__ == "__main__":
    main()
