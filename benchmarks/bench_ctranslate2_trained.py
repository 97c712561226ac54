"""CTranslate2 with trained models at their natural lengths: the main job's pruned model against the full model,
served as a translator would serve them, beside PyTorch.

`bench_ctranslate2.py` times random-weight models forced to a fixed output length (a compute speed-up). This one
times what a user serves: two *trained* models of the proof study (`--pruned`: the main job's 36-head model,
`checkpoints/proof/early-cooldown-s0/pruned`; `--full`: the full model trained alone with the same recipe,
`checkpoints/proof/off-cooldown-s0/full`), each stopping where it emits end-of-sentence, on the first `--sentences`
Multi30k test sentences. So the two decode different numbers of tokens: besides sentences/s the table gives target
tokens/s (tokens of the outputs, end-of-sentence included, counted with the model's tokenizer) and each output's
BLEU and chrF (sacreBLEU; also what int8 costs).

Engines, all on the same `--threads` cores, batches of `--batch-size` sentences sorted by length (both engines sort):
- `pytorch-fp32`, `pytorch-bf16`: `prunetrain.mt.evaluation.translation.translate` (bf16 autocast only where the CPU has
  native bf16);
- `ct2-<type>`: the export of `prunetrain export --format ctranslate2` (float32, padded per stack) loaded with each
  CPU compute type this CTranslate2 build supports among float32, int8, int8_bfloat16 and bfloat16, one translator
  with `intra_threads = threads`;
- `ct2-float32-inter`: float32 with `inter_threads = threads`, `intra_threads = 1` (batches decoded in parallel, one
  core each: what CTranslate2 recommends for throughput on several cores).
Decoding as in `translate_ctranslate2` and `translate`: `min_decoding_length` 0, length penalty 1, at most 256 new
tokens (PyTorch: ceil(1.5 · source tokens) + 10 per sentence, as the recipe's evaluation decodes). With
`--equal-bounds N` both engines decode by one rule: at most N new tokens for every sentence, and PyTorch's beam
search stops as CTranslate2's does (`early_stopping=True`, log-probabilities renormalised after the pad token is
suppressed, as the export's exactness tests decode); the table then also counts the hypotheses CTranslate2 float32
and PyTorch fp32 share.

**Every timed configuration runs in a process of its own** (one per model, engine and round, all beams inside): in
one process, a second CTranslate2 translator with `intra_threads` > 1 — alive or already deleted — leaves OpenMP
threads behind, the runtime sees more threads than cores and stops spinning, and every intra-threaded translator
of the process then runs ~3× slower (measured 2026-11-28 on the 2-core EPYC: greedy, the full model, 200 sentences:
282 sentences/s for the first translator, 101 for any created after it; 93 with `OMP_WAIT_POLICY=PASSIVE`). A
server holds one translator; `bench_ctranslate2.py` and the recipe's CTranslate2 row hold several.

Rounds are interleaved and rotate their order; medians are reported. Run it alone on the machine:

    python benchmarks/bench_ctranslate2_trained.py --threads 2 --wait-idle 600   # results/ctranslate2_trained.json
    python benchmarks/bench_ctranslate2_trained.py --threads 2 --wait-idle 600 --equal-bounds 70 \
        --out benchmarks/results/ctranslate2_trained_equal_bounds.json
    python benchmarks/bench_ctranslate2_trained.py --quick                       # smoke run (100 sentences, 1 round)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _common as C

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared/data/multi30k"
PRUNED = REPO / "checkpoints/proof/early-cooldown-s0/pruned"
FULL = REPO / "checkpoints/proof/off-cooldown-s0/full"
COMPUTE_TYPES = ("float32", "int8", "int8_bfloat16", "bfloat16")


def time_one(args) -> dict:
    """In this process only: load one model in one engine, warm up on a batch, time every beam size once;
    returns {beams: {"seconds", "texts"}}."""
    import time

    import torch

    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import load_model_tokenizer, load_translation_model, translate

    torch.set_num_threads(args.threads)
    sources = [s for s, _ in read_parallel(DATA, "test")][: args.sentences]
    tokenizer = load_model_tokenizer(args.model)
    if args.engine.startswith("pytorch"):
        model = load_translation_model(args.model, device="cpu").eval()
        bf16 = args.engine.endswith("bf16")

        def run(beams, texts=sources):
            same_rule = {} if args.equal_bounds is None else {"max_new_tokens": args.equal_bounds}
            if same_rule and beams > 1:  # CTranslate2's stopping rule and scores (docs/export.md)
                same_rule.update(early_stopping=True, renormalize_logits=True)
            return translate(model, tokenizer, texts, batch_size=args.batch_size, num_beams=beams, autocast_bf16=bf16,
                             **same_rule)
    else:
        import ctranslate2

        compute_type = args.engine.removeprefix("ct2-").removesuffix("-inter")
        inter = args.threads if args.engine.endswith("-inter") else 1
        translator = ctranslate2.Translator(str(args.ct2), device="cpu", inter_threads=inter,
                                            intra_threads=args.threads // inter, compute_type=compute_type)

        def run(beams, texts=sources):
            tokens = [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in texts]
            results = translator.translate_batch(tokens, beam_size=beams,
                                                 max_decoding_length=args.equal_bounds or 256,
                                                 min_decoding_length=0, max_batch_size=args.batch_size,
                                                 length_penalty=1.0)
            return [t.strip() for t in tokenizer.batch_decode(
                [tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results], skip_special_tokens=True,
                clean_up_tokenization_spaces=False)]
    out = {}
    for beams in args.beams:
        run(beams, sources[: args.batch_size])  # warm-up
        start = time.perf_counter()
        texts = run(beams)
        out[beams] = {"seconds": time.perf_counter() - start, "texts": texts}
    return out


def main():
    p = C.parser(__doc__.splitlines()[0], repeats=3)
    p.add_argument("--pruned", type=Path, default=PRUNED, help=f"the pruned model directory (default {PRUNED})")
    p.add_argument("--full", type=Path, default=FULL, help=f"the full model directory (default {FULL})")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    p.add_argument("--sentences", type=int, default=1000, help="Multi30k test sentences (default: all 1000)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (default 1 4)")
    p.add_argument("--engines", nargs="+", choices=["pytorch", "ct2"], default=["pytorch", "ct2"],
                   help="engines to time (default both)")
    p.add_argument("--equal-bounds", type=int, default=None, metavar="N",
                   help="both engines decode at most N new tokens per sentence and stop beam search by the same rule "
                        "(default: each engine's own bound and rule)")
    p.add_argument("--one", nargs=3, metavar=("ENGINE", "MODEL", "CT2_DIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.equal_bounds is not None and args.equal_bounds < 1:
        p.error(f"--equal-bounds: {args.equal_bounds} is not a number of new tokens; give a whole number ≥ 1.")
    if args.one:  # a child: one configuration, its JSON on stdout
        args.engine, args.model, args.ct2 = args.one[0], Path(args.one[1]), Path(args.one[2])
        C.quiet_transformers()
        print(json.dumps(time_one(args)))
        return
    for name in ("pruned", "full"):
        if not (getattr(args, name) / "config.json").is_file():
            sys.exit(f"--{name}: {str(getattr(args, name))!r} holds no saved model (config.json); train the proof's "
                     f"runs (scripts/proof_study.sh) or give a model directory.")
    import ctranslate2
    import torch

    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.evaluation.translation import score_translations
    from prunetrain.utils.device import bf16_is_fast

    env = C.setup(args)
    threads = args.threads or torch.get_num_threads()
    sentences = 100 if args.quick else args.sentences
    references = [t for _, t in read_parallel(DATA, "test")][:sentences]
    compute_types = [t for t in COMPUTE_TYPES if t in ctranslate2.get_supported_compute_types("cpu")]
    engines = []
    if "pytorch" in args.engines:
        engines += ["pytorch-fp32"] + (["pytorch-bf16"] if bf16_is_fast(torch.device("cpu")) else [])
    if "ct2" in args.engines:
        engines += [f"ct2-{t}" for t in compute_types] + ["ct2-float32-inter"]
    work = Path(tempfile.mkdtemp(prefix="bench-ct2-trained-"))
    models = {}
    for name in ("full", "pruned"):
        export = subprocess.run([sys.executable, "-m", "prunetrain", "export", str(getattr(args, name)),
                                 str(work / name), "--format", "ctranslate2"], capture_output=True, text=True)
        if export.returncode:
            sys.exit(f"--{name}: the CTranslate2 export failed: {export.stderr.strip()[-500:]}")
        models[name] = {"directory": str(getattr(args, name)), "export": json.loads(export.stdout)}
    keys = [(name, engine) for name in models for engine in engines]
    runs = C.rounds_in_fresh_processes(keys, lambda key: [
        sys.executable, __file__, "--one", key[1], str(getattr(args, key[0])), str(work / key[0]),
        "--threads", str(threads), "--batch-size", str(args.batch_size), "--sentences", str(sentences),
        "--beams", *map(str, args.beams),
        *([] if args.equal_bounds is None else ["--equal-bounds", str(args.equal_bounds)])],
        1 if args.quick else args.repeats)
    runs = {key: [{int(b): v for b, v in run.items()} for run in values] for key, values in runs.items()}
    from prunetrain.mt.evaluation.translation import load_model_tokenizer

    tokenizers = {name: load_model_tokenizer(getattr(args, name)) for name in models}
    median = {(name, engine, b): statistics.median(run[b]["seconds"] for run in runs[(name, engine)])
              for name, engine in keys for b in args.beams}
    results = []
    for (name, engine), values in runs.items():
        for beams in args.beams:
            seconds = median[(name, engine, beams)]
            texts = values[0][beams]["texts"]
            target_tokens = sum(len(ids) for ids in tokenizers[name](texts)["input_ids"])
            scores = score_translations(texts, references)
            torch_seconds = median.get((name, "pytorch-fp32", beams))
            torch_texts = runs[(name, "pytorch-fp32")][0][beams]["texts"] if (name, "pytorch-fp32") in runs else None
            results.append({"arm": name, "engine": engine, "beams": beams, "median_s": seconds,
                            "all_seconds": [v[beams]["seconds"] for v in values],
                            "sentences_per_s": sentences / seconds, "target_tokens": target_tokens,
                            "target_tokens_per_s": target_tokens / seconds,
                            "speedup_vs_full_same_engine": median[("full", engine, beams)] / seconds,
                            "vs_pytorch_fp32_same_arm": torch_seconds / seconds if torch_seconds else None,
                            "bleu": scores["bleu"], "chrf": scores["chrf"],
                            "same_as_pytorch_fp32": (None if torch_texts is None else
                                                     sum(a == b for a, b in zip(texts, torch_texts)))})
    print(f"\n{'arm':7} {'engine':18} {'beams':>5} {'sent/s':>7} {'tok/s':>7} {'vs full':>8} {'vs torch':>8} "
          f"{'BLEU':>6} {'chrF':>6} {'=torch':>6}")
    for row in sorted(results, key=lambda r: (r["beams"], r["engine"], r["arm"])):
        print(f"{row['arm']:7} {row['engine']:18} {row['beams']:>5} {row['sentences_per_s']:7.1f} "
              f"{row['target_tokens_per_s']:7.0f} {row['speedup_vs_full_same_engine']:8.2f} "
              f"{row['vs_pytorch_fp32_same_arm'] or float('nan'):8.2f} {row['bleu']:6.2f} {row['chrf']:6.2f} "
              f"{'' if row['same_as_pytorch_fp32'] is None else row['same_as_pytorch_fp32']:>6}")
    C.write_json(C.output_path(args, "ctranslate2_trained"), {
        "command": C.command_line(), **env, "threads": threads, "batch_size": args.batch_size,
        "engines": engines, "sentences": sentences, "equal_bounds": args.equal_bounds,
        "rounds": 1 if args.quick else args.repeats,
        "one_process_per_timing": True, "ctranslate2": ctranslate2.__version__, "torch": torch.__version__,
        "models": models, "results": results})


if __name__ == "__main__":
    main()
