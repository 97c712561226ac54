"""Hard-Concrete gate overhead on a training step (issue 6 target 3: gates add ≤ 5 %).

6+6/d256 Marian (random weights), fp32, batch of random tokens; arms interleaved: `plain` vs `gates`
(HardConcreteGates attached to an identical copy: one gate sample per forward, 18 output-projection hooks, and the
gate parameters' gradients). Prints a table and writes JSON.

python benchmarks/bench_gates.py --threads 1 --batch 32 --repeats 12 --out benchmarks/results/gates_t1.json
"""

import argparse
import copy
import json
import statistics
from pathlib import Path

import torch

from prunetrain.bench import alternate, compare_times
from prunetrain.mt.text.data import marian_config
from prunetrain.methods.gates import gates_for


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/gates.json")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    from transformers import MarianMTModel

    torch.manual_seed(0)
    plain = MarianMTModel(marian_config(8000, attn_implementation="sdpa")).train()
    gated = copy.deepcopy(plain)
    gates = gates_for(gated).attach(gated)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 8000, (opts.batch, opts.length), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    opt_gated = torch.optim.AdamW(list(gated.parameters()) + list(gates.parameters()), lr=1e-4)

    def step(model, optimizer, extra=None):
        def run():
            optimizer.zero_grad(set_to_none=True)
            loss = model(**batch).loss
            if extra is not None:
                loss = loss + extra()
            loss.backward()
            optimizer.step()
        return run

    result = alternate({"plain": step(plain, opt_plain), "gates": step(gated, opt_gated, lambda: gates.penalty(0.01))},
                       warmup=opts.warmup, repeats=opts.repeats)
    times = result.times
    cmp = compare_times(times["plain"], times["gates"])
    overhead = 1 / cmp["speedup"] - 1
    pair_overhead = 1 / cmp["speedup_pair_median"] - 1
    report = {"threads": torch.get_num_threads(), "batch": opts.batch, "length": opts.length,
              "repeats": opts.repeats, "order": result.order_string(), "times": times,
              "overhead_medians": overhead, "overhead_pair_median": pair_overhead, "target": 0.05,
              "met": overhead <= 0.05}
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(report, indent=1))
    print("| arm | median step s | overhead (medians) | overhead (pair median) | target ≤ 5 % |")
    print("|---|---|---|---|---|")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"| plain | {med['plain']:.3f} | | | |")
    print(f"| gates | {med['gates']:.3f} | {100 * overhead:+.1f} % | {100 * pair_overhead:+.1f} % | "
          f"{'met' if overhead <= 0.05 else 'missed'} |")


if __name__ == "__main__":
    main()
