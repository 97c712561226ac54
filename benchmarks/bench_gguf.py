"""llama.cpp arm: prompt processing and generation speed of GGUF exports, pruned vs unpruned (issue 28).

Model: a random-initialised Llama (speed does not depend on the weights' values): 16 layers, hidden 1024,
16 query heads on 4 key/value heads (head size 64, GQA groups of 4), FFN 2816, vocab 32000, untied: 245 M
parameters. Arms, each shrunk by prunetrain and written with `prunetrain export --format gguf` (llama.cpp's `deci`
graph, checked in llama.cpp against PyTorch before it is timed): the unpruned model, 50 % of the heads removed
uniformly (2 of 4 groups in every layer), 50 % removed non-uniformly (groups kept per layer vary from 0 to 4, one
head-less layer) and 75 % removed non-uniformly; with FFN neurons (issue 62): half of every FFN's neurons, and half
of the heads with half of the neurons non-uniformly (FFN widths per layer from 1 neuron to 100 %, written as
llama.cpp's per-layer `feed_forward_length`). All run in one process with the same threads; every round runs
each arm once in a rotating order (prompt processing, then generation), and speed-ups are ratios of median times.

`pp`: a `--prompt`-token prompt processed from an empty cache (llama-bench's pp). `tg`: `--new-tokens` tokens decoded
one at a time after that prompt (llama-bench's tg; the tokens are given, so no sampler runs). FLOP-ideal speed-up:
the ratio of matmul FLOPs, counted from the shapes (per token at position t and layer l: 2·(q, k, v, o, FFN weights
at the layer's own FFN width)
+ 4·heads_l·head_dim·(t + 1) for attention scores and values, plus 2·hidden·vocab for the output layer).
`share of ideal` = (speed-up − 1) / (ideal − 1): the fraction of the removable time actually saved.
Goals: generation at 50 % heads reaches ≥ 0.9 of the FLOP-ideal speed-up (issue 28); so does generation of a Llama
with heads and FFN neurons pruned (issue 62).

Take the numbers on a quiet machine (nothing else running):

    python benchmarks/bench_gguf.py --threads 2 --wait-idle 600      # benchmarks/results/gguf.json
    python benchmarks/bench_gguf.py --quick                          # smoke run (tiny model, 2 rounds)
    python benchmarks/bench_gguf.py --arms "full,-50% FFN uniform,-50% heads -50% FFN non-uniform" --out ...
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import _common as C
import torch

from prunetrain.bench import compare_times

FULL = dict(num_hidden_layers=16, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
            num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=2048)
QUICK = dict(num_hidden_layers=4, hidden_size=128, intermediate_size=256, num_attention_heads=8,
             num_key_value_heads=4, head_dim=16, vocab_size=512, max_position_embeddings=256)
# key/value groups kept per layer, as a fraction of the layer's groups (mean 1, 0.5, 0.5, 0.25)
ARMS = {"full": [1.0] * 16, "-50% uniform": [0.5] * 16,
        "-50% non-uniform": [1, 1, 0.75, 0.75, 0.5, 0.75, 0.5, 0.25, 0.5, 0.25, 0.5, 0.25, 0.0, 0.5, 0.25, 0.25],
        "-75% non-uniform": [1, 0.25, 0.25, 0.25, 0.25, 0.0, 0.25, 0.25, 0.25, 0.25, 0.0, 0.25, 0.0, 0.25, 0.25, 0.25]}
# FFN arms: (key/value groups kept per layer, FFN neurons kept per layer) as fractions; 0 neurons means one is kept
ARMS.update({"-50% FFN uniform": ([1.0] * 16, [0.5] * 16),
             "-50% heads -50% FFN non-uniform": (ARMS["-50% non-uniform"],
                                                 [0.75, 0.75, 0.5, 0.5, 0.5, 0.5, 0.25, 0.5, 0.5, 0.25, 0.5, 0.5, 0.0,
                                                  0.5, 0.75, 0.75])})
QUICK_ARMS = {"full": [1.0] * 4, "-50% uniform": [0.5] * 4, "-50% non-uniform": [1, 0.5, 0.0, 0.5],
              "-75% non-uniform": [0.5, 0.25, 0.0, 0.25], "-50% FFN uniform": ([1.0] * 4, [0.5] * 4),
              "-50% heads -50% FFN non-uniform": ([1, 0.5, 0.0, 0.5], [0.75, 0.5, 0.0, 0.75])}


def llama(quick: bool):
    import transformers as tf

    config = tf.LlamaConfig(**(QUICK if quick else FULL), tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).eval()


def arm(model, spec):
    """A shrunk copy keeping round(fraction · groups) key/value groups in layer l (the first ones: which heads go
    does not change the speed) and, for an FFN arm `(groups, neurons)`, round(fraction · width) neurons of layer l's
    FFN (at least one: llama.cpp skips the residual add of a width-0 FFN in a layer that keeps heads)."""
    import copy

    import prunetrain as pt

    heads, neurons = spec if isinstance(spec, tuple) else (spec, None)
    clone = copy.deepcopy(model)
    remove = {}
    for site, fraction in zip(pt.find_heads(clone), heads, strict=True):
        groups = site.num_heads // site.group_size
        remove[site.name] = list(range(round(fraction * groups) * site.group_size, site.num_heads))
    for site, fraction in zip(pt.find_neurons(clone), neurons or (), strict=neurons is not None):
        remove[site.name] = list(range(max(1, round(fraction * site.num_heads)), site.num_heads))
    pt.shrink(clone, pt.HeadMask.from_heads(clone, remove))
    return clone


def matmul_flops(model, positions: range) -> int:
    """Matmul FLOPs of processing the tokens at `positions` (each attending to itself and all before it)."""
    import prunetrain as pt

    config, total = model.config, 0
    d, vocab = config.hidden_size, config.vocab_size
    widths = [site.num_heads for site in pt.find_neurons(model)]
    for site, ff in zip(pt.find_heads(model), widths, strict=True):
        h, kv, hd = site.num_heads, site.num_kv_heads, site.head_dim
        weights = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * ff
        total += sum(2 * weights + 4 * h * hd * (t + 1) for t in positions)
    return total + 2 * d * vocab * len(positions)


def export_arms(model, arms: dict, directory: Path, gguf_type: str, threads: int, prompt_len: int,
                new_tokens: int) -> tuple[dict, dict]:
    """Shrink, export (checked in llama.cpp) and open every arm; returns ({label: Llama}, {label: facts})."""
    import prunetrain as pt
    from prunetrain.export.formats import export
    from prunetrain.export.llama_cpp import open_model

    engines, info = {}, {}
    for label, fractions in arms.items():
        shrunk = arm(model, fractions)
        result = export(shrunk, directory / label.replace(" ", "_").replace("%", "pct"), "gguf", gguf_type=gguf_type)
        path = Path(result["destination"]) / "model.gguf"
        engines[label] = open_model(path, n_ctx=prompt_len + new_tokens + 8, threads=threads, logits_all=False,
                                    n_batch=max(prompt_len, 8))
        info[label] = {"heads": C.find_heads(shrunk).total_heads,
                       "heads_per_layer": [s.num_heads for s in C.find_heads(shrunk)],
                       "ffn_per_layer": [s.num_heads for s in pt.find_neurons(shrunk)],
                       "parameters": sum(t.numel() for t in shrunk.parameters()),
                       "file_bytes": path.stat().st_size, "check_max_rel_diff": result["max_abs_diff"],
                       "flops_pp": matmul_flops(shrunk, range(prompt_len)),
                       "flops_tg": matmul_flops(shrunk, range(prompt_len, prompt_len + new_tokens))}
        print(f"  exported {label}: {info[label]['heads']} heads {info[label]['heads_per_layer']}, FFN widths "
              f"{info[label]['ffn_per_layer']}, "
              f"{info[label]['parameters'] / 1e6:.1f} M parameters, checked in llama.cpp "
              f"(max rel. diff {result['max_abs_diff']:.1e})", flush=True)
    return engines, info


def main() -> None:
    p = C.parser(__doc__.split("\n")[0], repeats=5)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (pp)")
    p.add_argument("--new-tokens", type=int, default=64, help="generated tokens (tg)")
    p.add_argument("--gguf-type", default="f32", choices=["f32", "f16", "q8_0"])
    p.add_argument("--arms", default=None, help="comma-separated arm labels to run (default: all; 'full' is always "
                                                "run, every speed-up is against it)")
    args = p.parse_args()
    machine = C.setup(args)
    C.quiet_transformers()
    import llama_cpp

    from prunetrain.export.llama_cpp import time_generation, time_prompt

    threads = args.threads or torch.get_num_threads()
    prompt_len, new_tokens = (16, 8) if args.quick else (args.prompt, args.new_tokens)
    repeats = 2 if args.quick else args.repeats
    model = llama(args.quick)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, model.config.vocab_size, (prompt_len + new_tokens,), generator=gen).tolist()
    prompt, continuation = tokens[:prompt_len], tokens[prompt_len:]
    keep = tempfile.TemporaryDirectory()
    arms = QUICK_ARMS if args.quick else ARMS
    if args.arms:
        chosen = ["full"] + [a.strip() for a in args.arms.split(",") if a.strip() and a.strip() != "full"]
        unknown = [a for a in chosen if a not in arms]
        if unknown:
            p.error(f"--arms: {unknown[0]!r} is not an arm; choose from {', '.join(arms)}")
        arms = {a: arms[a] for a in chosen}
    engines, info = export_arms(model, arms, Path(keep.name), args.gguf_type, threads, prompt_len, new_tokens)
    times = {label: {"pp": [], "tg": []} for label in arms}
    labels = list(arms)
    for round_ in range(args.warmup + repeats):
        order = labels[round_ % len(labels):] + labels[: round_ % len(labels)]
        for label in order:
            pp = time_prompt(engines[label], prompt)
            tg = time_generation(engines[label], prompt, continuation)
            if round_ >= args.warmup:
                times[label]["pp"].append(pp)
                times[label]["tg"].append(tg)
    rows = []
    for label in labels:
        for task, n in (("pp", prompt_len), ("tg", new_tokens)):
            stats = compare_times(times["full"][task], times[label][task])
            ideal = info["full"][f"flops_{task}"] / info[label][f"flops_{task}"]
            median = statistics.median(times[label][task])
            rows.append({"variant": label, "task": task, "tokens": n, "heads": info[label]["heads"],
                         "tokens_per_s": n / median, "median_s": median, "times_s": times[label][task],
                         "speedup": stats["speedup"], "speedup_min": stats["speedup_min"], "flop_ideal": ideal,
                         "efficiency": stats["speedup"] / ideal,
                         "share_of_ideal": (stats["speedup"] - 1) / (ideal - 1) if ideal > 1.0001 else None})
    print(f"\n## llama.cpp (llama-cpp-python {llama_cpp.__version__}), {args.gguf_type}, {threads} threads, "
          f"pp {prompt_len} tokens, tg {new_tokens} tokens, {repeats} rounds")
    print("| variant | heads | FFN neurons | task | tokens/s | speed-up | best round | FLOP-ideal | speed-up / ideal | "
          "best / ideal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['heads']} | {sum(info[r['variant']]['ffn_per_layer'])} | {r['task']} | "
              f"{r['tokens_per_s']:.1f} | {r['speedup']:.3f} | {r['speedup_min']:.3f} | {r['flop_ideal']:.3f} | "
              f"{r['efficiency']:.2f} | {r['speedup_min'] / r['flop_ideal']:.2f} |")
    goal = [r for r in rows if r["task"] == "tg" and r["variant"].startswith("-50%")]
    for r in goal:
        print(f"goal (tg ≥ 0.9 of FLOP-ideal speed-up), {r['variant']}: "
              f"{C.verdict(r['efficiency'], 0.9)} ({r['efficiency']:.2f}; share of the ideal saving "
              f"{r['share_of_ideal']:.0%})" if r["share_of_ideal"] is not None else "")
    for engine in engines.values():
        engine.close()
    keep.cleanup()
    C.write_json(C.output_path(args, "gguf"), {"command": C.command_line(), "machine": machine,
                                               "llama_cpp_python": llama_cpp.__version__, "threads": threads,
                                               "gguf_type": args.gguf_type, "prompt": prompt_len,
                                               "new_tokens": new_tokens, "arms": info, "rows": rows})


if __name__ == "__main__":
    main()
