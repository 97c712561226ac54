"""CTranslate2 arm: translation speed of the main job's pruned layout against its full-size architecture, in
CTranslate2 (float32 and int8) and in PyTorch, on the 1000 Multi30k test sentences.

Models: the main job's architecture (Marian 6+6, d_model 256, 8 heads of 32, FFN 1024, a byte-level BPE tokenizer of
8000 trained on Multi30k) with random weights, shrunk to
- `full`: all 144 heads;
- `pruned`: the main job's 36-head layout (recipes/results/wmt-small-deen-study/small-steps-cooldown-s0/layout.json,
  uneven over the layers, so CTranslate2 runs it padded per stack);
- `per-stack`: 36 heads with one count per stack (2 in every encoder layer, 2 in every decoder self- and
  cross-attention: `ServingConstraints(same_heads_per_stack=True)`), which CTranslate2 runs without padding;
- `pruned+ffn50`, `per-stack+ffn50`: the same head layouts with half of every FFN's neurons removed too (CTranslate2
  runs each layer's FFN at its own width: no FFN padding).
With `--layout PATH` (a trained run's layout.json, e.g. the fast recipe's) the arms are instead `run` (its heads,
padded per stack in CTranslate2, and its FFN widths), `run per-stack` (as many heads, one count per stack, the
nearest: what `pruning.same_heads_per_stack` trains) and `run per-stack ffn/M` (the same with every FFN width rounded
to a multiple of `--layout-multiple`, default 64: `pruning.ffn_multiple_of`); results/ctranslate2_layout.json.
`--engines` times only some engines (PyTorch always: the last column compares with it).
Speed does not depend on the weights' values, but a random model's outputs have random lengths, so every arm decodes
exactly `--length` target tokens per sentence (`min_decoding_length = max_decoding_length`; PyTorch:
`min_new_tokens = max_new_tokens`): the arms do the same number of steps and the speed-ups are compute speed-ups.

FLOP-ideal speed-up: matmul FLOPs of PyTorch's `generate` for one batch at the same lengths (`prunetrain.bench.
count_flops`), with the padding counted as executed (the padded arm's FLOPs are those of a model with every
attention of a stack at the stack's largest head count). `share` = (speed-up − 1) / (ideal − 1).
Goals (see docs/export.md): CTranslate2 pruned vs CTranslate2 full ≥ 0.9 of the FLOP-ideal speed-up; pruned in
CTranslate2 ≥ 2.5× its own PyTorch beam-4 throughput.

Engines: `pytorch` (`generate`, fp32), `ct2-float32` and `ct2-int8` (one translator, `intra_threads = threads`),
`ct2-float32-inter` (`inter_threads = threads`, `intra_threads = 1`: batches decoded in parallel, one core each).
**Every timed configuration runs in a process of its own** (one per arm, engine and round, both beam sizes inside):
a second intra-threaded CTranslate2 translator in a process slows every one of them ~3× (benchmarks/README.md j), and
this script held four in one process until 2026-11-28.

Take the numbers alone on the machine (interleaved rounds, same threads for both engines):

    python benchmarks/bench_ctranslate2.py --threads 2 --wait-idle 600     # benchmarks/results/ctranslate2.json
    python benchmarks/bench_ctranslate2.py --quick                          # smoke run (200 sentences, 1 round)

`--profile-pytorch N` instead profiles PyTorch's `generate` on N batches per arm (one call each under torch.profiler,
greedy and beam 4): how its time splits into matmuls and the rest, to show what does not shrink with the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import torch

from prunetrain import find_heads
from prunetrain.bench import count_flops
from prunetrain.export.ctranslate2 import STACKS, stack_heads
from prunetrain.methods.constraints import STACK_OF_KIND

REPO = Path(__file__).resolve().parents[1]
LAYOUT = REPO / "recipes/results/wmt-small-deen-study/small-steps-cooldown-s0/layout.json"
DATA = REPO.parent / "shared/data/multi30k"


def padded_counts(pruned) -> dict:
    """Per attention site of `pruned`, the heads CTranslate2 executes: its stack's count (`stack_heads`: the largest
    kept in the stack, at least one)."""
    executed = stack_heads(pruned)
    return {site.name: executed[STACK_OF_KIND[site.kind]] for site in find_heads(pruned)}


def per_stack_counts(model, kept: dict) -> dict:
    """Per attention site, as many heads in all as `kept` holds, one count per stack (the nearest)."""
    sites = find_heads(model).sites
    per_stack = {stack: round(sum(kept[s.name] for s in sites if STACK_OF_KIND[s.kind] == stack)
                              / sum(1 for s in sites if STACK_OF_KIND[s.kind] == stack)) for stack in STACKS}
    return {site.name: per_stack[STACK_OF_KIND[site.kind]] for site in sites}


def arms(model, layout: Path | None = None, multiple: int = 64) -> dict:
    """name → (shrunk model, FLOP-equivalent model of what CTranslate2 executes); see the module docstring."""
    kept = {s["name"]: s["num_heads"] for s in json.loads((layout or LAYOUT).read_text())["sites"]}

    def keep(heads: dict, width=lambda site: site.num_heads):
        return C.shrunk_to(model, lambda site: heads[site.name] if site.unit == "heads" else width(site))

    def half(site):
        return round(0.5 * site.num_heads)

    stacked = per_stack_counts(model, kept)
    if layout is not None:  # a trained run's heads and FFN widths, and the same in CTranslate2's layout
        def trained(site):
            return kept[site.name]

        def rounded(site):
            return min(C.round_width(kept[site.name], multiple), site.num_heads)

        run = keep(kept, trained)
        return {"full": (model, model), "run": (run, keep(padded_counts(run), trained)),
                "run per-stack": (keep(stacked, trained),) * 2,
                f"run per-stack ffn/{multiple}": (keep(stacked, rounded),) * 2}
    pruned = keep(kept)
    padded = padded_counts(pruned)
    return {"full": (model, model), "pruned": (pruned, keep(padded)), "per-stack": (keep(stacked),) * 2,
            "pruned+ffn50": (keep(kept, half), keep(padded, half)), "per-stack+ffn50": (keep(stacked, half),) * 2}


ENGINES = ("pytorch", "ct2-float32", "ct2-int8", "ct2-float32-inter")


def torch_translate(model, batches, beams: int, length: int) -> None:
    with torch.inference_mode():
        for batch in batches:
            model.generate(**batch, num_beams=beams, do_sample=False, min_new_tokens=length,
                           max_new_tokens=length)


def ct2_translate(translator, token_batches, beams: int, length: int) -> None:
    for tokens in token_batches:
        translator.translate_batch(tokens, beam_size=beams, min_decoding_length=length,
                                   max_decoding_length=length)


def torch_batches(tokenizer, sources: list[str], batch_size: int) -> list:
    return [tokenizer(sources[i:i + batch_size], return_tensors="pt", padding=True)
            for i in range(0, len(sources), batch_size)]


def ct2_batches(tokenizer, sources: list[str], batch_size: int) -> list[list[list[str]]]:
    return [[tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources[i:i + batch_size]]
            for i in range(0, len(sources), batch_size)]


def time_one(args, engine: str, model_dir: Path, ct2_dir: Path) -> dict[int, float]:
    """In this process only: load one arm in one engine, warm up on a batch, time each beam size once;
    {beams: seconds}."""
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import load_model_tokenizer, load_translation_model

    torch.set_num_threads(args.threads)
    sources = [s for s, _ in read_parallel(DATA, "test")][: args.sentences]
    tokenizer = load_model_tokenizer(model_dir)
    if engine == "pytorch":
        encoded = torch_batches(tokenizer, sources, args.batch_size)
        model = load_translation_model(model_dir, device="cpu").eval()

        def run(beams, count=None):
            torch_translate(model, encoded[:count], beams, args.length)
    else:
        import ctranslate2

        tokens = ct2_batches(tokenizer, sources, args.batch_size)
        compute_type = engine.removeprefix("ct2-").removesuffix("-inter")
        inter = args.threads if engine.endswith("-inter") else 1
        translator = ctranslate2.Translator(str(ct2_dir / compute_type), device="cpu", inter_threads=inter,
                                            intra_threads=args.threads // inter, compute_type=compute_type)

        def run(beams, count=None):
            if inter > 1:  # one call with every sentence, so the batches run in parallel
                translator.translate_batch([t for batch in tokens[:count] for t in batch], beam_size=beams,
                                           max_batch_size=args.batch_size, min_decoding_length=args.length,
                                           max_decoding_length=args.length)
            else:
                ct2_translate(translator, tokens[:count], beams, args.length)
    seconds = {}
    for beams in (1, 4):
        run(beams, 1)  # warm-up
        start = time.perf_counter()
        run(beams)
        seconds[beams] = time.perf_counter() - start
    return seconds


def profile_pytorch(args, env: dict, threads: int, models: dict, encoded: list) -> None:
    """One profiled `generate` call per arm and beam size on `--profile-pytorch` batches: matmul time against the
    rest, and each arm's ratio to the full model's, written as JSON."""
    torch.set_num_threads(threads)
    batches = encoded[: args.profile_pytorch]
    out = {}
    for beams in (1, 4):
        calls = {name: (lambda m=model, b=beams: torch_translate(m, batches, b, args.length))
                 for name, (model, _) in models.items()}
        for fn in calls.values():
            fn()  # warm-up
        out[beams] = C.profile_calls(f"PyTorch generate, beam {beams}, {len(batches)} batches of {args.batch_size}",
                                     calls)
        full = out[beams]["full"]
        for name, breakdown in out[beams].items():
            matmul = breakdown["categories"]["matmul"]
            rest = breakdown["wall_s"] - matmul
            full_rest = full["wall_s"] - full["categories"]["matmul"]
            top = ", ".join(f"{o['op']} {o['self_s']:.3f}" for o in breakdown["top_ops"][:6])
            print(f"beam {beams} {name}: wall {breakdown['wall_s']:.3f} s (full / this "
                  f"{full['wall_s'] / breakdown['wall_s']:.2f}), "
                  f"matmul {matmul:.3f} s (full / this {full['categories']['matmul'] / matmul:.2f}), the rest "
                  f"{rest:.3f} s (full / this {full_rest / rest:.2f}, {rest / breakdown['wall_s']:.0%} of the call); "
                  f"top ops: {top}")
    C.write_json(C.output_path(args, "ctranslate2_profile_pytorch"), {
        "command": C.command_line(), **env, "threads": threads, "batch_size": args.batch_size,
        "length": args.length, "batches": len(batches), "torch": torch.__version__,
        "profiles": {str(beams): value for beams, value in out.items()}})


def main():
    p = C.parser(__doc__.splitlines()[0], repeats=5)
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    p.add_argument("--length", type=int, default=20, help="target tokens decoded per sentence (default 20)")
    p.add_argument("--sentences", type=int, default=1000, help="Multi30k test sentences (default: all 1000)")
    p.add_argument("--arms", type=lambda text: text.split(","), default=None,
                   help="comma-separated arms to time (default: all; full is always timed)")
    p.add_argument("--layout", type=Path, default=None,
                   help="a trained run's layout.json: the arms become full, run, run per-stack, run per-stack ffn/M")
    p.add_argument("--layout-multiple", type=int, default=64, help="M of --layout's last arm (default 64)")
    p.add_argument("--engines", type=lambda text: text.split(","), default=list(ENGINES),
                   help=f"comma-separated engines (default: all of {','.join(ENGINES)}; pytorch is always timed)")
    p.add_argument("--one", nargs=3, metavar=("ENGINE", "MODEL", "CT2_DIR"), help=argparse.SUPPRESS)
    p.add_argument("--profile-pytorch", type=int, default=0, metavar="BATCHES",
                   help="profile PyTorch generate on this many batches per arm instead of timing the engines")
    args = p.parse_args()
    if args.layout is not None and not args.layout.is_file():
        p.error(f"--layout {str(args.layout)!r} is not allowed: the path of a run's layout.json")
    if args.layout_multiple < 1:
        p.error(f"--layout-multiple {args.layout_multiple} is not allowed: a positive whole number")
    unknown = [engine for engine in args.engines if engine not in ENGINES]
    if unknown:
        p.error(f"--engines {unknown[0]!r} is not allowed: one of {', '.join(ENGINES)}")
    args.engines = ["pytorch"] + [engine for engine in args.engines if engine != "pytorch"]
    if args.quick:
        args.sentences = 200
    if args.one:  # a child: one configuration, its seconds on stdout
        C.quiet_transformers()
        print(json.dumps(time_one(args, args.one[0], Path(args.one[1]), Path(args.one[2]))))
        return
    import ctranslate2
    from transformers import MarianMTModel

    from prunetrain.export.ctranslate2 import export_ctranslate2, padding_report
    from prunetrain.mt.evaluation.ctranslate2_speed import gemm_backend
    from prunetrain.mt.text.data import marian_config, read_parallel, train_tokenizer
    from prunetrain.mt.evaluation.translation import save_translation_model

    C.quiet_transformers()
    env = C.setup(args)
    threads = args.threads or torch.get_num_threads()
    tokenizer = train_tokenizer(read_parallel(DATA, "train"), vocab_size=8000)
    sources = [s for s, _ in read_parallel(DATA, "test")][: args.sentences]
    torch.manual_seed(0)
    models = arms(MarianMTModel(marian_config(tokenizer, attn_implementation="sdpa")).eval(), args.layout,
                  args.layout_multiple)
    chosen = ["full"] + [name for name in models if name != "full" and (args.arms is None or name in args.arms)]
    models = {name: models[name] for name in chosen}
    encoded = torch_batches(tokenizer, sources, args.batch_size)
    if args.profile_pytorch:
        profile_pytorch(args, env, threads, models, encoded)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-ct2-"))
    rows = {}
    for name, (model, executed) in models.items():
        saved = save_translation_model(model, tokenizer, work / name)
        for quantization in ("float32", "int8"):
            export_ctranslate2(model, work / f"{name}-ct2" / quantization, saved, quantization=quantization)
        for beams in (1, 4):
            flops = count_flops(lambda m=executed, b=beams: torch_translate(m, encoded[:1], b, args.length)).total
            rows[(name, beams)] = {"flops_one_batch": flops, **padding_report(model)}
    del models
    backend = gemm_backend(work / "full-ct2" / "float32")
    print(f"CTranslate2's float32 matrix multiplies: {backend} (CT2_USE_MKL={os.environ.get('CT2_USE_MKL', 'unset')})")
    keys = [(name, engine) for name in chosen for engine in args.engines]
    runs = C.rounds_in_fresh_processes(keys, lambda key: [
        sys.executable, __file__, "--one", key[1], str(work / key[0]), str(work / f"{key[0]}-ct2"),
        "--threads", str(threads), "--batch-size", str(args.batch_size), "--length", str(args.length),
        "--sentences", str(len(sources))], 1 if args.quick else args.repeats)
    times = {(name, engine, beams): [run[str(beams)] for run in runs[(name, engine)]]
             for name, engine in keys for beams in (1, 4)}
    results = []
    for (name, engine, beams), values in times.items():
        seconds = statistics.median(values)
        full_seconds = statistics.median(times[("full", engine, beams)])
        ideal = rows[("full", beams)]["flops_one_batch"] / rows[(name, beams)]["flops_one_batch"]
        speedup = full_seconds / seconds
        results.append({"arm": name, "engine": engine, "beams": beams, "median_s": seconds,
                        "sentences_per_s": len(sources) / seconds,
                        "target_tokens_per_s": len(sources) * args.length / seconds,
                        "speedup_vs_full_same_engine": speedup, "flop_ideal": ideal,
                        "share_of_ideal": (speedup - 1) / (ideal - 1) if ideal > 1 else None,
                        "vs_pytorch_same_arm": statistics.median(times[(name, "pytorch", beams)]) / seconds,
                        "heads_kept": rows[(name, beams)]["heads_kept"],
                        "heads_executed": rows[(name, beams)]["heads_executed"],
                        "neurons_kept": rows[(name, beams)]["neurons_kept"],
                        "neurons_executed": rows[(name, beams)]["neurons_executed"], "all_seconds": values})
    print(f"\n{'arm':26} {'engine':18} {'beams':>5} {'sent/s':>8} {'tok/s':>8} {'vs full':>8} {'ideal':>6} "
          f"{'share':>6} {'vs torch':>8}")
    for row in results:
        share = f"{row['share_of_ideal']:.2f}" if row["share_of_ideal"] is not None else "-"
        print(f"{row['arm']:26} {row['engine']:18} {row['beams']:>5} {row['sentences_per_s']:8.1f} "
              f"{row['target_tokens_per_s']:8.0f} {row['speedup_vs_full_same_engine']:8.2f} {row['flop_ideal']:6.2f} "
              f"{share:>6} {row['vs_pytorch_same_arm']:8.2f}")
    C.write_json(C.output_path(args, "ctranslate2" if args.layout is None else "ctranslate2_layout"), {
        "command": C.command_line(), **env, "threads": threads, "batch_size": args.batch_size,
        "length": args.length, "sentences": len(sources), "rounds": 1 if args.quick else args.repeats,
        "one_process_per_timing": True, "ctranslate2": ctranslate2.__version__, "gemm_backend": backend,
        "torch": torch.__version__, "results": results})


if __name__ == "__main__":
    main()
