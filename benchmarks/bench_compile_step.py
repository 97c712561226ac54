"""The recipe's training step under torch.compile: does fusing what does not shrink with the heads pay on this machine?

The profile (profile_recipe_step.py, benchmarks/README.md k) found 36–51 % of the step outside the matmuls —
element-wise ops (dropout, activations, residual adds, the attention mask and softmax), layer norms, the optimizer,
copies — and that share does not shrink with the heads, which is why a 36-head model steps at ~0.9 of its FLOP-ideal
speed. torch.compile (inductor: C++/OpenMP kernels on a CPU) fuses element-wise chains. This measures, for the recipe's
model (random weights, eager attention, real Multi30k batches of 64 sentences spread over the length range, AdamW with
clipping as the Trainer does) at 144 heads and at the main job's 36-head layout:
- the compile cost: seconds of the first steps (one per batch shape until dynamo has a dynamic-shape graph), beyond
  the plain step's time;
- the steady step: medians over `--repeats` rounds of every batch, plain and compiled arms interleaved;
- the speed-up of compile per size, and the 36-head model's speed against the 144-head one with and without compile,
  beside the FLOP-ideal.
A recipe run recompiles after each shrink (three in the main job), so the compile cost is paid four times.

    python benchmarks/bench_compile_step.py --threads 2 --precision fp32   # results/compile_step_fp32.json
    python benchmarks/bench_compile_step.py --quick
    python benchmarks/bench_compile_step.py --device cuda --precision bf16 --mode reduce-overhead \
        --batch 256 --d-model 512 --ffn-dim 2048                           # the GPU setting's widths, a GPU batch
"""

from __future__ import annotations

import copy
import json
import statistics

import _common as C
import torch
from profile_recipe_step import LAYOUT, recipe_model_and_batches

from prunetrain import HeadMask, find_heads, shrink
from prunetrain.bench import count_flops


class Arm:
    """A model with its own AdamW; `step(batch)` trains one step (clipping at 1.0 as the Trainer does) and returns
    its seconds."""

    def __init__(self, model, bf16: bool, compile_mode: str | None, device: torch.device):
        self.model = model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        self.forward = torch.compile(model, mode=compile_mode) if compile_mode else model
        self.bf16, self.device = bf16, device

    def step(self, batch) -> float:
        start = C.device_clock(self.device)  # from an idle device to an idle device
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.forward(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return C.device_clock(self.device) - start


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], repeats=4)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="fp32")
    p.add_argument("--num-batches", type=int, default=6)
    p.add_argument("--batch", type=int, default=64, help="sentences per batch (the recipe's: 64)")
    p.add_argument("--d-model", type=int, default=256, help="model width (the recipe's: 256; its GPU setting: 512)")
    p.add_argument("--ffn-dim", type=int, default=1024, help="feed-forward width (the recipe's: 1024; GPU: 2048)")
    C.add_device_option(p)
    p.add_argument("--mode", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"), default="default",
                   help="torch.compile mode (reduce-overhead: CUDA graphs, for steps bound by kernel launches)")
    args = p.parse_args()
    C.quiet_transformers()
    env = C.setup(args)
    device = C.chosen_device(args)
    model, batches = recipe_model_and_batches(args.batch, 3 if args.quick else args.num_batches,
                                              d_model=args.d_model, ffn_dim=args.ffn_dim)
    model, batches = model.to(device), [batch.to(device) for batch in batches]
    kept = {s["name"]: s["num_heads"] for s in json.loads(LAYOUT.read_text())["sites"]}
    small = copy.deepcopy(model)
    shrink(small, HeadMask.from_heads(small, {s.name: range(kept[s.name], s.num_heads) for s in find_heads(small)}))
    sizes = {"144": model, "36": small}
    flops = {name: count_flops(lambda m=m: m(**batches[0]).loss.backward()).total for name, m in sizes.items()}
    for m in sizes.values():
        m.zero_grad(set_to_none=True)
    bf16 = args.precision == "bf16"
    arms = {(size, compiled): Arm(copy.deepcopy(m), bf16, args.mode if compiled else None, device)
            for size, m in sizes.items() for compiled in (False, True)}
    first: dict = {}
    for key, arm in arms.items():  # the first pass over the batches: every shape once (compiles, warms up)
        first[key] = [arm.step(batch) for batch in batches]
        print(f"first pass, {key[0]} heads, {'compiled' if key[1] else 'plain'}: {sum(first[key]):.1f} s "
              f"over {len(batches)} batches", flush=True)  # a run cut at a time limit still tells the compile cost
    times = {key: [] for key in arms}
    keys = list(arms)
    for r in range(1 if args.quick else args.repeats):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            times[key] += [arms[key].step(batch) for batch in batches]
    median = {key: statistics.median(values) for key, values in times.items()}
    rows = []
    for (size, compiled), seconds in median.items():
        plain = median[(size, False)]
        rows.append({"heads": size, "compiled": compiled, "step_s": seconds,
                     "compile_s": sum(first[(size, compiled)]) - len(batches) * seconds,
                     "compile_speedup": plain / seconds,
                     "speed_vs_144": median[("144", compiled)] / seconds,
                     "flop_ideal": flops["144"] / flops[size]})
    print(f"\n{'heads':>5} {'compiled':>8} {'step s':>7} {'first pass extra s':>18} {'compile ×':>9} "
          f"{'vs 144':>7} {'ideal':>6}")
    for row in rows:
        print(f"{row['heads']:>5} {str(row['compiled']):>8} {row['step_s']:7.3f} {row['compile_s']:18.1f} "
              f"{row['compile_speedup']:9.3f} {row['speed_vs_144']:7.3f} {row['flop_ideal']:6.3f}")
    where = "" if device.type == "cpu" else f"_{device.type}"
    mode = "" if args.mode == "default" else f"_{args.mode}"
    size = "" if (args.batch, args.d_model, args.ffn_dim) == (64, 256, 1024) else \
        f"_b{args.batch}_d{args.d_model}_ffn{args.ffn_dim}"
    C.write_json(C.output_path(args, f"compile_step_{args.precision}{where}{mode}{size}"), {
        "command": C.command_line(), **env, "threads": torch.get_num_threads(), "precision": args.precision,
        "device": C.device_label(device), "mode": args.mode, "batch": args.batch, "d_model": args.d_model,
        "ffn_dim": args.ffn_dim,
        "batches": len(batches), "quick": args.quick, "rows": rows})


if __name__ == "__main__":
    main()
