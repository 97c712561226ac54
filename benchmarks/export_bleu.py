"""A pruned translation model through every export format it can be written in, each scored with the same sacreBLEU.

For the model the main recipe saves (`checkpoints/wmt-small-deen/pruned`): the model as prunetrain loads it, then each
format `prunetrain export --check` allows, loaded the way a user without prunetrain would load it —
`AutoModelForSeq2SeqLM.from_pretrained(dir, trust_remote_code=True)` (remote-code), plain `from_pretrained`
(uniform, padded), ONNX Runtime (onnx: `prunetrain.mt.evaluation.translation.translate_onnx`; beam search by ORT's BeamSearch
operator, `prunetrain.export.onnx_beam_op`, and by the Python loop over the KV-cache graph,
`prunetrain.export.onnx_beam`), CTranslate2 (`prunetrain.export.ctranslate2.translate_ctranslate2`) — and decoded
on the same test sentences. Beam 4 and greedy for every format, and beam 4 with `early_stopping=True` (the stopping
rule the BeamSearch operator and CTranslate2 follow) for prunetrain and ONNX Runtime; the table gives BLEU, the number of
hypotheses identical to prunetrain's own decode with the same settings, and sentences per second (one pass, same
threads). `--speed-rounds N` times beam-4 translation with PyTorch and ONNX Runtime interleaved, under both stopping
rules (speed-ups against PyTorch with the same rule).

    python benchmarks/export_bleu.py checkpoints/wmt-small-deen/pruned --data-dir ../shared/data/multi30k
    python benchmarks/export_bleu.py checkpoints/wmt-small-deen-full/full --data-dir ../shared/data/multi30k \
        --out benchmarks/results/export_bleu_full.json                 # the full (unpruned) model
    python benchmarks/export_bleu.py DIR --data-dir ... --limit 50       # a quick check
    python benchmarks/export_bleu.py DIR --data-dir ... --speed-rounds 5 # + beam-4 time, PyTorch vs ORT interleaved
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def beam_speed(model, onnx_dir: Path, tokenizer, sources: list[str], args) -> dict:
    """Beam-4 translation of `sources` with PyTorch and with ONNX Runtime (its BeamSearch operator, and the Python
    loop over the KV-cache graph), interleaved (rotating order) for `args.speed_rounds` rounds after one warm-up;
    each ORT speed-up is the ratio of median times against PyTorch's."""
    from prunetrain.bench import alternate, compare_times
    from prunetrain.export.onnx_beam_op import FILE
    from prunetrain.mt.evaluation.translation import translate, translate_onnx

    config = model.config

    def ort(engine, early_stopping):
        return lambda: translate_onnx(
            onnx_dir, tokenizer, sources, batch_size=args.batch_size, num_beams=4, beam_engine=engine,
            early_stopping=early_stopping, decoder_start_token_id=config.decoder_start_token_id,
            eos_token_id=config.eos_token_id, max_position_embeddings=config.max_position_embeddings,
            threads=args.threads)

    def torch_beam(early_stopping):
        return lambda: translate(model, tokenizer, sources, batch_size=args.batch_size, num_beams=4,
                                 early_stopping=early_stopping)

    # transformers' default stopping rule (early_stopping=False): PyTorch and the loop; early_stopping=True: the
    # operator too (the only rule it reproduces)
    calls = {"pytorch": torch_beam(False), "onnxruntime_loop": ort("loop", False),
             "pytorch_early_stopping": torch_beam(True), "onnxruntime_loop_early_stopping": ort("loop", True)}
    if (onnx_dir / FILE).is_file():
        calls["onnxruntime_operator_early_stopping"] = ort("operator", True)
    timed = alternate(calls, warmup=1, repeats=args.speed_rounds)
    medians = {name: sorted(times)[len(times) // 2] for name, times in timed.times.items()}
    out = {"rounds": args.speed_rounds, "order": timed.order_string(), "times_s": timed.times,
           **{f"{name}_median_s": median for name, median in medians.items()}}
    for name in calls:
        if not name.startswith("pytorch"):
            base = "pytorch_early_stopping" if name.endswith("early_stopping") else "pytorch"
            stats = compare_times(timed.times[base], timed.times[name])
            out[f"{name}_speedup"], out[f"{name}_speedup_min"] = stats["speedup"], stats["speedup_min"]
    return out


def print_table(rows: list[dict], skipped: dict, speed: dict | None, sentences: int, rounds: int) -> None:
    print("\n| format | loaded with | beams | BLEU | chrF | identical to prunetrain | sentences/s |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['loaded_with']} | {r['num_beams']} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
              f"{r['identical_to_prunetrain']}/{r['sentences']} | {r['sentences_per_second']:.1f} |")
    for fmt, why in skipped.items():
        print(f"| {fmt} | not possible: {why} | | | | | |")
    if speed is not None:
        print(f"\nbeam 4, {sentences} sentences, {rounds} interleaved rounds (median s; speed vs PyTorch):")
        for name in ("pytorch", "onnxruntime_loop", "pytorch_early_stopping", "onnxruntime_loop_early_stopping",
                     "onnxruntime_operator_early_stopping"):
            if f"{name}_median_s" in speed:
                ratio = speed.get(f"{name}_speedup", 1.0)
                print(f"  {name:<36} {speed[name + '_median_s']:.2f} s  {ratio:.3f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="a pruned translation model directory (save_pruned + tokenizer)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "export_bleu.json")
    p.add_argument("--speed-rounds", type=int, default=0,
                   help="then time beam-4 translation of the sentences with PyTorch (prunetrain) and ONNX Runtime, "
                        "interleaved for this many rounds after one warm-up (0: no timing)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForSeq2SeqLM

    from prunetrain import find_heads
    from prunetrain.export import check_formats, export
    from prunetrain.mt.text.data import load_tokenizer, read_parallel
    from prunetrain.mt.evaluation.translation import (find_tokenizer_dir, load_translation_model, score_translations,
                                                      translate, translate_onnx)

    pairs = read_parallel(args.data_dir, args.split)
    pairs = pairs[: args.limit] if args.limit else pairs
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    tokenizer = load_tokenizer(find_tokenizer_dir(args.model))
    source = load_translation_model(args.model).eval()
    config = source.config
    rows, reference_hypotheses, speed = [], {}, None

    def score(fmt: str, how: str, beams: int, decode, early_stopping: bool = False) -> None:
        start = time.perf_counter()
        hypotheses = decode()
        seconds = time.perf_counter() - start
        result = score_translations(hypotheses, references)
        if fmt == "prunetrain":
            reference_hypotheses[beams, early_stopping] = hypotheses
        same = sum(a == b for a, b in zip(hypotheses, reference_hypotheses[beams, early_stopping]))
        rows.append({"format": fmt, "loaded_with": how, "num_beams": beams, "early_stopping": early_stopping,
                     "bleu": result["bleu"],
                     "chrf": result["chrf"], "bleu_signature": result["bleu_signature"],
                     "identical_to_prunetrain": same, "sentences": len(hypotheses),
                     "sentences_per_second": len(hypotheses) / seconds})
        print(f"{fmt:<11} beam {beams}: BLEU {result['bleu']:.2f}, {same}/{len(hypotheses)} identical", flush=True)

    def torch_decodes(fmt: str, how: str, model) -> None:
        for beams in (4, 1):
            score(fmt, how, beams, lambda: translate(model, tokenizer, sources, batch_size=args.batch_size,
                                                     num_beams=beams))

    torch_decodes("prunetrain", "prunetrain.load_pruned", source)
    score("prunetrain", "prunetrain.load_pruned, early_stopping=True", 4, lambda: translate(
        source, tokenizer, sources, batch_size=args.batch_size, num_beams=4, early_stopping=True), True)
    formats = check_formats(args.model)
    skipped = {fmt: why for fmt, why in formats.items() if why}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in [f for f, why in formats.items() if not why]:
            out = Path(tmp) / fmt
            export(args.model, out, fmt)
            if fmt == "onnx":
                names = {"operator": "BeamSearch operator, early_stopping=True", "loop": "Python loop"}
                for beams, engine in ((4, "operator"), (4, "loop"), (1, "loop")):
                    if engine == "operator" and not (out / "beam_search_model.onnx").is_file():
                        continue
                    how = "onnxruntime (greedy, KV cache)" if beams == 1 else f"onnxruntime ({names[engine]})"
                    score(fmt, how, beams, lambda: translate_onnx(
                        out, tokenizer, sources, batch_size=args.batch_size,
                        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
                        max_position_embeddings=config.max_position_embeddings, threads=args.threads,
                        num_beams=beams, beam_engine=engine, early_stopping=engine == "operator"),
                          engine == "operator")
                if args.speed_rounds > 0:
                    speed = beam_speed(source, out, tokenizer, sources, args)
                continue
            if fmt == "ctranslate2":  # the engine's own beam search and length rule (docs/export.md): a beam
                # ends when it holds `beam_size` finished hypotheses, transformers' early_stopping=True, so its beam
                # row is compared with prunetrain's decode under that rule
                from prunetrain.export.ctranslate2 import translate_ctranslate2

                for beams in (4, 1):
                    how = "ctranslate2.Translator (float32" + (", its rule: early_stopping=True)" if beams > 1 else ")")
                    score(fmt, how, beams, lambda: translate_ctranslate2(
                        out, sources, num_beams=beams, batch_size=args.batch_size, threads=args.threads), beams > 1)
                continue
            remote = fmt == "remote-code"
            model = AutoModelForSeq2SeqLM.from_pretrained(out, trust_remote_code=remote).eval()
            how = "AutoModelForSeq2SeqLM.from_pretrained(" + ("trust_remote_code=True" if remote else "") + ")"
            torch_decodes(fmt, how, model)
    result = {"model": str(args.model), "heads": find_heads(source).summary(), "split": args.split,
              "sentences": len(pairs), "threads": args.threads, "rows": rows, "formats_not_possible": skipped,
              "beam4_speed": speed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print_table(rows, skipped, speed, len(sources), args.speed_rounds)
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
