"""A pruned translation model through every export format it can be written in, each scored with the same sacreBLEU.

For the model the main recipe saves (`checkpoints/wmt-small-deen/pruned`): the model as prunetrain loads it, then each
format `prunetrain export --check` allows, loaded the way a user without prunetrain would load it —
`AutoModelForSeq2SeqLM.from_pretrained(dir, trust_remote_code=True)` (remote-code), plain `from_pretrained`
(uniform, padded), ONNX Runtime with the KV-cache graph (onnx: `prunetrain.mt.translation.translate_onnx`, beam
search by `prunetrain.export.onnx_beam`) — and decoded on the same test sentences. Beam 4 and greedy for every
format; the table gives BLEU, the number of hypotheses identical to prunetrain's own decode with the same beams, and
sentences per second (one pass, same threads; ORT vs PyTorch speed at beam 4 is the ratio of the onnx and prunetrain
rows).

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
    """Beam-4 translation of `sources` with PyTorch and with ONNX Runtime, the two interleaved (rotating order) for
    `args.speed_rounds` rounds after one warm-up; the ORT speed-up is the ratio of median times."""
    from prunetrain.bench import alternate, compare_times
    from prunetrain.mt.translation import translate, translate_onnx

    config = model.config
    calls = {"pytorch": lambda: translate(model, tokenizer, sources, batch_size=args.batch_size, num_beams=4),
             "onnxruntime": lambda: translate_onnx(
                 onnx_dir, tokenizer, sources, batch_size=args.batch_size, num_beams=4,
                 decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
                 max_position_embeddings=config.max_position_embeddings, threads=args.threads)}
    timed = alternate(calls, warmup=1, repeats=args.speed_rounds)
    stats = compare_times(timed.times["pytorch"], timed.times["onnxruntime"])
    return {"rounds": args.speed_rounds, "order": timed.order_string(), "times_s": timed.times,
            "pytorch_median_s": sorted(timed.times["pytorch"])[len(timed.times["pytorch"]) // 2],
            "onnxruntime_median_s": sorted(timed.times["onnxruntime"])[len(timed.times["onnxruntime"]) // 2],
            "ort_speedup": stats["speedup"], "ort_speedup_min": stats["speedup_min"]}


def print_table(rows: list[dict], skipped: dict, speed: dict | None, sentences: int, rounds: int) -> None:
    print("\n| format | loaded with | beams | BLEU | chrF | identical to prunetrain | sentences/s |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['loaded_with']} | {r['num_beams']} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
              f"{r['identical_to_prunetrain']}/{r['sentences']} | {r['sentences_per_second']:.1f} |")
    for fmt, why in skipped.items():
        print(f"| {fmt} | not possible: {why} | | | | | |")
    if speed is not None:
        print(f"\nbeam 4, {sentences} sentences, {rounds} interleaved rounds: PyTorch "
              f"{speed['pytorch_median_s']:.2f} s, ONNX Runtime {speed['onnxruntime_median_s']:.2f} s "
              f"(ORT speed-up {speed['ort_speedup']:.3f})")


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
    from prunetrain.mt.data import load_tokenizer, read_parallel
    from prunetrain.mt.translation import (find_tokenizer_dir, load_translation_model, score_translations, translate,
                                           translate_onnx)

    pairs = read_parallel(args.data_dir, args.split)
    pairs = pairs[: args.limit] if args.limit else pairs
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    tokenizer = load_tokenizer(find_tokenizer_dir(args.model))
    source = load_translation_model(args.model).eval()
    config = source.config
    rows, reference_hypotheses, speed = [], {}, None

    def score(fmt: str, how: str, beams: int, decode) -> None:
        start = time.perf_counter()
        hypotheses = decode()
        seconds = time.perf_counter() - start
        result = score_translations(hypotheses, references)
        if fmt == "prunetrain":
            reference_hypotheses[beams] = hypotheses
        same = sum(a == b for a, b in zip(hypotheses, reference_hypotheses[beams]))
        rows.append({"format": fmt, "loaded_with": how, "num_beams": beams, "bleu": result["bleu"],
                     "chrf": result["chrf"], "bleu_signature": result["bleu_signature"],
                     "identical_to_prunetrain": same, "sentences": len(hypotheses),
                     "sentences_per_second": len(hypotheses) / seconds})
        print(f"{fmt:<11} beam {beams}: BLEU {result['bleu']:.2f}, {same}/{len(hypotheses)} identical", flush=True)

    def torch_decodes(fmt: str, how: str, model) -> None:
        for beams in (4, 1):
            score(fmt, how, beams, lambda: translate(model, tokenizer, sources, batch_size=args.batch_size,
                                                     num_beams=beams))

    torch_decodes("prunetrain", "prunetrain.load_pruned", source)
    formats = check_formats(args.model)
    skipped = {fmt: why for fmt, why in formats.items() if why}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in [f for f, why in formats.items() if not why]:
            out = Path(tmp) / fmt
            export(args.model, out, fmt)
            if fmt == "onnx":
                for beams in (4, 1):
                    how = f"onnxruntime ({'beam search' if beams > 1 else 'greedy'}, KV cache)"
                    score(fmt, how, beams, lambda: translate_onnx(
                        out, tokenizer, sources, batch_size=args.batch_size,
                        decoder_start_token_id=config.decoder_start_token_id, eos_token_id=config.eos_token_id,
                        max_position_embeddings=config.max_position_embeddings, threads=args.threads,
                        num_beams=beams))
                if args.speed_rounds > 0:
                    speed = beam_speed(source, out, tokenizer, sources, args)
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
