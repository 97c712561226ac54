"""Translation speed of a pruned model against its full-size architecture *in CTranslate2*, the engine translation
models are served with (the recipes' benchmark row when `ctranslate2` is installed).

Both models are exported with `prunetrain.export.ctranslate2.export_ctranslate2` (float32, padded per stack, checked
in the engine), then decode the same source sentences at beam `beams` with every output forced to exactly `length`
target tokens (`min_decoding_length = max_decoding_length`): the two do the same number of decoding steps whatever
their weights, so the ratio is the compute speed-up (a full-size model built fresh has random weights, and its free
outputs would have other lengths). Rounds are interleaved and rotate their order; the medians are compared:

    speed-up = median seconds (full) / median seconds (pruned),  sentences/s = sentences / median seconds.

Each timing runs in a fresh Python process that loads one translator (warmed up on one batch): in one process a
second CTranslate2 translator with `intra_threads` > 1 — alive or deleted — leaves OpenMP threads behind, the
runtime sees more threads than cores and stops spinning, and every intra-threaded translator of that process, and
PyTorch beside it, runs ~3× slower (benchmarks/README.md j). A server holds one translator; so does each timing.

Which matrix-multiply library CTranslate2 runs is part of the result (`gemm_backend`): its pip wheels use Intel MKL
on Intel CPUs and oneDNN (DNNL) elsewhere, and `CT2_USE_MKL=0` in the environment makes it use oneDNN on Intel too.
The choice can matter more than the model: on a 2-core Intel Xeon with AMX, MKL decoded the recipe's full model at
61 sentences/s at beam 4 and oneDNN at 126, and the fast recipe's final model gained 1.32× over the full one with
MKL against 1.88× with oneDNN (benchmarks/README.md j4).

The FLOP-ideal is not computed here (CTranslate2 executes the padding; `benchmarks/bench_ctranslate2.py` measures it
against the FLOPs of what the engine runs).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["ctranslate2_speed", "gemm_backend"]


def ctranslate2_speed(pruned, full, tokenizer, sources: list[str], *, beams: int = 4, length: int = 20,
                      batch_size: int = 50, repeats: int = 3, threads: int | None = None) -> dict:
    """Median decoding time of `full` and `pruned` in CTranslate2 float32 (see the module docstring).

    Args:
        pruned, full: translation models of one family (`full` with every head), on the CPU.
        tokenizer: their tokenizer (saved beside each export).
        sources: the sentences to translate.
        beams: beam size (1: greedy).
        length: target tokens every output is forced to.
        batch_size: sentences per `translate_batch` call.
        repeats: timed rounds (each timing in a fresh process, after a one-batch warm-up).
        threads: CTranslate2's intra-op threads (default: torch's thread count).

    Returns:
        {"engine", "compute_type", "gemm_backend", "beams", "length", "batch_size", "sentences", "rounds",
         "threads", "full": {"median_s", "sentences_per_s", "heads_executed", "heads_kept"}, "pruned": {...},
         "speedup"}.
    """
    import ctranslate2
    import torch

    from prunetrain.export.ctranslate2 import export_ctranslate2, padding_report
    from prunetrain.mt.evaluation.translation import save_translation_model

    threads = threads or torch.get_num_threads()
    batches = [[tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources[i:i + batch_size]]
               for i in range(0, len(sources), batch_size)]
    record = {}
    with tempfile.TemporaryDirectory(prefix="prunetrain-ct2-") as work:
        tokens_file = Path(work) / "batches.json"
        tokens_file.write_text(json.dumps(batches))
        for name, model in (("full", full), ("pruned", pruned)):
            saved = save_translation_model(model, tokenizer, Path(work) / f"{name}-model")
            export_ctranslate2(model, Path(work) / name, saved)
            padding = padding_report(model)
            record[name] = {"heads_kept": padding["heads_kept"], "heads_executed": padding["heads_executed"]}
        backend = gemm_backend(Path(work) / "full")
        times = {name: [] for name in record}
        names = list(record)
        for round_ in range(repeats):
            for name in names[round_ % 2:] + names[:round_ % 2]:
                times[name].append(_time_in_fresh_process(Path(work) / name, tokens_file, beams, length, threads))
    for name, values in times.items():
        seconds = statistics.median(values)
        record[name].update(median_s=seconds, sentences_per_s=len(sources) / seconds, seconds=values)
    return {"engine": f"ctranslate2 {ctranslate2.__version__}", "compute_type": "float32", "gemm_backend": backend,
            "beams": beams, "length": length, "batch_size": batch_size, "sentences": len(sources), "rounds": repeats,
            "threads": threads, **record, "speedup": record["full"]["median_s"] / record["pruned"]["median_s"]}


def gemm_backend(directory: Path) -> str | None:
    """The float32 matrix-multiply library CTranslate2 uses in this environment ("MKL", "DNNL", ...), as it reports
    it on loading the exported model in `directory` in a new process (`CT2_VERBOSE=1`, its "SGEMM backend" line;
    `CT2_USE_MKL` in the environment chooses it on Intel CPUs); None when it does not say."""
    done = subprocess.run([sys.executable, "-c", "import ctranslate2, sys; ctranslate2.Translator(sys.argv[1], "
                           "device='cpu', intra_threads=1)", str(directory)],
                          capture_output=True, text=True, env={**os.environ, "CT2_VERBOSE": "1"})
    found = re.search(r"SGEMM backend: (\w+)", done.stderr)
    return found.group(1) if found else None


def _time_in_fresh_process(directory: Path, tokens_file: Path, beams: int, length: int, threads: int,
                           compute_type: str = "float32") -> float:
    """Seconds to decode every batch of `tokens_file` with the CTranslate2 model in `directory`, timed in a new
    Python process that holds this one translator (see the module docstring); `length` 0 decodes freely (each
    output ends at its end-of-sentence token, at most 256 tokens, as `translate_ctranslate2` decodes)."""
    done = subprocess.run([sys.executable, "-m", "prunetrain.mt.evaluation.ctranslate2_speed", str(directory),
                           str(tokens_file), str(beams), str(length), str(threads), compute_type],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ctranslate2_speed: timing {directory.name} in CTranslate2 failed: "
                           f"{done.stderr.strip()[-500:]}")
    return float(done.stdout.split()[-1])


def _time_one_translator(directory: str, tokens_file: str, beams: int, length: int, threads: int,
                         compute_type: str = "float32") -> float:
    """In this process: load one translator, decode the first batch once (warm-up), then time every batch."""
    import ctranslate2

    batches = json.loads(Path(tokens_file).read_text())
    translator = ctranslate2.Translator(directory, device="cpu", inter_threads=1, intra_threads=threads,
                                        compute_type=compute_type)
    lengths = dict(min_decoding_length=length, max_decoding_length=length) if length else \
        dict(min_decoding_length=0, max_decoding_length=256)

    def run(selected):
        for batch in selected:
            translator.translate_batch(batch, beam_size=beams, **lengths)
    run(batches[:1])
    start = time.perf_counter()
    run(batches)
    return time.perf_counter() - start


if __name__ == "__main__":  # a timing process: DIRECTORY TOKENS_FILE BEAMS LENGTH THREADS [COMPUTE_TYPE] → seconds
    directory, tokens_file, beams, length, threads = sys.argv[1:6]
    compute_type = sys.argv[6] if len(sys.argv) > 6 else "float32"
    print(_time_one_translator(directory, tokens_file, int(beams), int(length), int(threads), compute_type))
