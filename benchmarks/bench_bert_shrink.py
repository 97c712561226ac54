"""BERT-base-shaped encoder: forward speed after shrinking 25 / 50 / 75 % of the heads, and one non-uniform pattern.

BertModel from BertConfig() defaults (12 layers × 12 heads, hidden 768, FFN 3072; random weights), batch 32 × 128,
fp32, torch's default thread count, `sdpa` and `eager` attention. All five models of one attention backend (the
original and four shrunk copies) are interleaved in every round, with the order rotating from round to round.

Target (issue 6): measured speedup >= 0.95 × FLOP-ideal speedup at 50 % of the heads removed.

    python benchmarks/bench_bert_shrink.py                 # the result in benchmarks/results/bert_shrink.json
    python benchmarks/bench_bert_shrink.py --quick         # smoke run (batch 8, 2 rounds)
"""

from __future__ import annotations

import _common as C

from prunetrain.bench import benchmark, make_inputs

NONUNIFORM_KEPT = [10, 9, 8, 7, 6, 6, 6, 6, 5, 4, 3, 2]  # 72 of 144 heads, like the uniform 50 %
TARGET = 0.95
CLI_NAMES = {"25": "-25%", "50": "-50%", "75": "-75%", "nonuniform": "-50% non-uniform"}


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=3)
    p.add_argument("--attn", nargs="+", default=["sdpa", "eager"], choices=["sdpa", "eager"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--variants", nargs="+", default=list(CLI_NAMES), choices=list(CLI_NAMES),
                   help="shrunk models to compare (default: all)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled original vs -50%% calls")
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import torch
    import transformers as tf

    batch = 8 if args.quick else args.batch
    repeats = 2 if args.quick else args.repeats
    results = {}
    profiles = {}
    clock = C.Stopwatch()
    for attn in args.attn:
        config = tf.BertConfig()
        config._attn_implementation = attn
        torch.manual_seed(0)
        original = tf.BertModel(config).eval()
        patterns = {
            "-25%": (C.fraction_kept(0.25), 1),
            "-50%": (C.fraction_kept(0.50), 2),
            "-75%": (C.fraction_kept(0.75), 3),
            "-50% non-uniform": (lambda site: NONUNIFORM_KEPT[site.layer], 4),
        }
        variants = {CLI_NAMES[n]: C.shrunk_copy(original, *patterns[CLI_NAMES[n]]) for n in args.variants}
        print(f"\n## {attn}: batch {batch} × {args.seq}, fp32, {torch.get_num_threads()} threads", flush=True)
        result = benchmark(original, variants, batch_sizes=(batch,), seq_lens=(args.seq,), dtype="fp32",
                           warmup=args.warmup, repeats=repeats, progress=lambda m: print("  ...", m, flush=True))
        result.meta["attn_implementation"] = attn
        print(result.table(), flush=True)
        results[attn] = result
        if not args.no_profile and "-50%" in variants:
            inputs = make_inputs(original, batch, args.seq)

            def forward(model):
                def run():
                    with torch.inference_mode():
                        model(**inputs)
                return run

            profiles[attn] = C.profile_calls(f"{attn}, original vs -50%", {
                "original": forward(original), "-50%": forward(variants["-50%"])})
        del original, variants

    summary = []
    for attn, result in results.items():
        for row in result.rows:
            summary.append({
                "attn": attn, "variant": row["variant"], "speedup": row["speedup"],
                "speedup_pair_median": row["speedup_pair_median"], "flop_ideal_speedup": row["flop_ideal_speedup"],
                "efficiency": row["efficiency"], "efficiency_pair": row["efficiency_pair"],
            })
    print("\n## summary (target at -50%: speedup >= 0.95 × FLOP-ideal)")
    print("| attention | variant | speedup (medians) | speedup (pair median) | FLOP-ideal | efficiency | verdict |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        check = C.verdict(s["efficiency"], TARGET) if s["variant"] == "-50%" else ""
        print(f"| {s['attn']} | {s['variant']} | {s['speedup']:.3f} | {s['speedup_pair_median']:.3f} "
              f"| {s['flop_ideal_speedup']:.3f} | {s['efficiency']:.3f} | {check} |")
    payload = {
        "benchmark": "bert_shrink",
        "command": C.command_line(),
        "target": "speedup >= 0.95 × FLOP-ideal at -50%",
        "nonuniform_kept_heads_per_layer": NONUNIFORM_KEPT,
        "weights": "random (BertConfig defaults); speed does not depend on weight values",
        "wall_seconds": clock(),
        "machine": {**machine, "loadavg_at_end": C.loadavg()},
        "summary": summary,
        "results": {attn: r.to_dict() for attn, r in results.items()},
        "profiles": profiles,
    }
    C.write_json(C.output_path(args, "bert_shrink"), payload)


if __name__ == "__main__":
    main()
