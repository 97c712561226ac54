"""Translation-model generation speed after removing 50 % of the heads: greedy and beam 4, tokens/s.

MarianMTModel shaped like the paper's small setting (6+6 layers, d_model 256, 8 heads, FFN 1024, vocab 8000) with
**random weights**: speed does not depend on the weights' values, but a random model would stop at an arbitrary
length, so every call generates exactly `--new-tokens` tokens (min_new_tokens = max_new_tokens). Batch 50 source
sentences of `--src-len` tokens (no padding). 4 of the 8 heads are removed in each of the 18 attention sites
(encoder self, decoder self, cross). Also measured: one teacher-forced forward pass of the same batch.

Target (issue 6): generation speedup >= 0.8 × FLOP-ideal speedup.

    python benchmarks/bench_mt_generate.py            # benchmarks/results/mt_generate.json
    python benchmarks/bench_mt_generate.py --quick
"""

from __future__ import annotations

import _common as C

from contextlib import nullcontext

from prunetrain.bench import benchmark, make_inputs

TARGET = 0.8


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=8)
    p.add_argument("--attn", nargs="+", default=["sdpa", "eager"], choices=["sdpa", "eager"])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=26)
    p.add_argument("--no-profile", action="store_true", help="skip the profiled original vs -50%% calls")
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import torch

    batch = 10 if args.quick else args.batch
    repeats = 2 if args.quick else args.repeats
    clock = C.Stopwatch()
    results = {}
    profiles = {}
    for attn in args.attn:
        original = C.marian_model(attn).eval()
        pruned = C.shrunk_copy(original, C.fraction_kept(0.5), seed=1)
        for dtype in args.dtypes:
            key = f"{attn}/{dtype}"
            print(f"\n## {key}: batch {batch}, source {args.src_len} tokens, {args.new_tokens} new tokens, "
                  f"{torch.get_num_threads()} threads", flush=True)
            result = benchmark(original, {"-50%": pruned}, batch_sizes=(batch,), seq_lens=(args.src_len,),
                               tgt_len=args.new_tokens, dtype=dtype, generate=("greedy", "beam4"),
                               new_tokens=args.new_tokens, warmup=args.warmup, repeats=repeats,
                               progress=lambda m: print("  ...", m, flush=True))
            result.meta["attn_implementation"] = attn
            print(result.table(), flush=True)
            results[key] = result
            if not args.no_profile:
                inputs = make_inputs(original, batch, args.src_len, for_generate=True)
                for mode in ("greedy", "beam4"):
                    kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                  num_beams=1 if mode == "greedy" else 4, do_sample=False)

                    def gen(model, kwargs=kwargs):
                        def run():
                            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
                            with torch.inference_mode(), ctx:
                                model.generate(**inputs, **kwargs)
                        return run

                    profiles[f"{key}/{mode}"] = C.profile_calls(f"{key} {mode}, original vs -50%", {
                        "original": gen(original), "-50%": gen(pruned)})

    summary = []
    for key, result in results.items():
        for row in result.rows:
            summary.append({"setting": key, "task": row["task"], "speedup": row["speedup"],
                            "speedup_pair_median": row["speedup_pair_median"],
                            "flop_ideal_speedup": row["flop_ideal_speedup"], "efficiency": row["efficiency"],
                            "tokens_per_s_a": row["a"]["tokens_per_s"], "tokens_per_s_b": row["b"]["tokens_per_s"],
                            "speedup_cpu_time": row["speedup_cpu_time"]})
    print("\n## summary (target for generation: speedup >= 0.8 × FLOP-ideal)")
    print("| attention/dtype | task | tok/s original → -50% | speedup (medians) | pair median | FLOP-ideal "
          "| efficiency | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        check = C.verdict(s["efficiency"], TARGET) if s["task"] != "forward" else ""
        print(f"| {s['setting']} | {s['task']} | {s['tokens_per_s_a']:.0f} → {s['tokens_per_s_b']:.0f} "
              f"| {s['speedup']:.3f} | {s['speedup_pair_median']:.3f} | {s['flop_ideal_speedup']:.3f} "
              f"| {s['efficiency']:.3f} | {check} |")
    payload = {
        "benchmark": "mt_generate",
        "command": C.command_line(),
        "target": "generation speedup >= 0.8 × FLOP-ideal",
        "weights": "random; generation length forced with min_new_tokens = max_new_tokens",
        "wall_seconds": clock(),
        "machine": {**machine, "loadavg_at_end": C.loadavg()},
        "summary": summary,
        "results": {k: r.to_dict() for k, r in results.items()},
        "profiles": profiles,
    }
    C.write_json(C.output_path(args, "mt_generate"), payload)


if __name__ == "__main__":
    main()
