"""The speed/quality frontier of translation models as they are served: each model in CTranslate2 (float32 and int8)
at beam `beams`, its test BLEU and chrF beside its throughput.

For every model (a model directory, or a run directory: its `pruned/`, else its `full/`):
- it is exported once (`prunetrain.export.ctranslate2.export_ctranslate2`: float32, checked exact in the engine);
  int8 is CTranslate2's `compute_type="int8"` on that export (weights quantized when loaded);
- every test set is translated in the engine at beam `beams` (`translate_ctranslate2`, free decoding) and scored
  with sacreBLEU (`score_translations`): the BLEU of the model *as served*, int8 included;
- throughput: the first test set's sources decoded freely at beam `beams` by one translator in a fresh Python
  process (`ctranslate2_speed._time_in_fresh_process`: a second intra-threaded translator in a process slows every
  one ~3×), `repeats` rounds over all (model, compute type) entries in rotating order, median seconds;
  sentences/s = sentences / median seconds; speed-up = the reference entry's median / this entry's (the reference
  is the first model in float32).

Free decoding is what a user gets: a model that says less is faster. Run it alone on the machine.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

COMPUTE_TYPES = ("float32", "int8")


def served_model_dir(path: str | Path) -> Path:
    """The model a frontier entry serves: `path` itself when it holds `config.json`, else its `pruned/`, else its
    `full/` (a finished run directory)."""
    path = Path(path)
    for candidate in (path, path / "pruned", path / "full"):
        if (candidate / "config.json").is_file():
            return candidate
    raise ValueError(f"models: {str(path)!r} holds no model (no config.json, pruned/config.json or "
                     f"full/config.json); give a model directory or a finished run directory.")


def frontier(models: dict[str, str | Path], test_sets: dict[str, list[tuple[str, str]]], *, beams: int = 4,
             compute_types: tuple[str, ...] = COMPUTE_TYPES, repeats: int = 3, batch_size: int = 32,
             threads: int | None = None, progress=print) -> dict:
    """BLEU/chrF on every test set and CTranslate2 throughput for every (model, compute type) (module docstring).

    Args:
        models: {name: model or run directory}; the first is the reference of the speed-ups.
        test_sets: {split: (source, reference) pairs}; the first one is also the timing set.
        beams: beam size; compute_types: CTranslate2 compute types ("float32", "int8", ...).
        repeats: timed rounds; batch_size: sentences per `translate_batch` call; threads: intra-op threads
            (default: torch's thread count).

    Returns:
        {"settings": {...}, "rows": [{"name", "model_dir", "compute_type", "heads_kept", "heads_executed",
        "parameters", "scores": {split: {"bleu", "chrf"}}, "median_s", "seconds", "sentences_per_s", "speedup"}]}.
    """
    import ctranslate2
    import torch

    from prunetrain.export.ctranslate2 import export_ctranslate2, padding_report, translate_ctranslate2
    from prunetrain.mt.evaluation.ctranslate2_speed import _time_in_fresh_process, gemm_backend
    from prunetrain.mt.evaluation.translation import find_tokenizer_dir, load_translation_model, score_translations
    from prunetrain.mt.text.data import load_tokenizer

    if not models or not test_sets:
        raise ValueError("frontier: give at least one model and one test set.")
    threads = threads or torch.get_num_threads()
    timing_split = next(iter(test_sets))
    rows = []
    with tempfile.TemporaryDirectory(prefix="prunetrain-frontier-") as work:
        sources = [s for s, _ in test_sets[timing_split]]
        for index, (name, path) in enumerate(models.items()):
            model_dir = served_model_dir(path)
            model = load_translation_model(model_dir)
            tokenizer_dir = find_tokenizer_dir(model_dir)
            export = Path(work) / f"model-{index}"
            export_ctranslate2(model, export, tokenizer_dir)
            padding = padding_report(model)
            tokenizer = load_tokenizer(tokenizer_dir)  # each model's own: a model trained apart has its own
            tokens_file = Path(work) / f"batches-{index}.json"
            tokens_file.write_text(json.dumps([
                [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources[i:i + batch_size]]
                for i in range(0, len(sources), batch_size)]))
            for compute_type in compute_types:
                scores = {}
                for split, pairs in test_sets.items():
                    hypotheses = translate_ctranslate2(export, [s for s, _ in pairs], num_beams=beams,
                                                       batch_size=batch_size, threads=threads,
                                                       compute_type=compute_type)
                    scored = score_translations(hypotheses, [t for _, t in pairs])
                    scores[split] = {"bleu": scored["bleu"], "chrf": scored["chrf"]}
                rows.append({"name": name, "model_dir": str(model_dir), "compute_type": compute_type,
                             "export": str(export), "tokens": str(tokens_file),
                             "heads_kept": padding["heads_kept"], "heads_executed": padding["heads_executed"],
                             "neurons_kept": padding["neurons_kept"], "neurons_executed": padding["neurons_executed"],
                             "parameters": sum(p.numel() for p in model.parameters()), "scores": scores,
                             "seconds": []})
                progress(f"frontier: {name} {compute_type}: {timing_split} BLEU {scores[timing_split]['bleu']:.2f}")
        backend = gemm_backend(Path(rows[0]["export"]))
        for round_ in range(repeats):
            shift = round_ % len(rows)
            for row in rows[shift:] + rows[:shift]:
                row["seconds"].append(_time_in_fresh_process(Path(row["export"]), Path(row["tokens"]), beams, 0,
                                                             threads, row["compute_type"]))
            progress(f"frontier: timing round {round_ + 1} of {repeats} done")
    sentences = len(test_sets[timing_split])
    for row in rows:
        del row["export"], row["tokens"]
        row["median_s"] = statistics.median(row["seconds"])
        row["sentences_per_s"] = sentences / row["median_s"]
    for row in rows:
        row["speedup"] = rows[0]["median_s"] / row["median_s"]
    return {"settings": {"engine": f"ctranslate2 {ctranslate2.__version__}", "gemm_backend": backend,
                         "beams": beams, "threads": threads, "batch_size": batch_size, "rounds": repeats,
                         "timing_split": timing_split,
                         "timing_sentences": sentences, "decoding": "free (each output to its end, at most 256)",
                         "test_sets": {split: len(pairs) for split, pairs in test_sets.items()}},
            "rows": rows}


def frontier_table(result: dict) -> str:
    """A markdown table of `frontier`'s rows: BLEU (chrF) per test set, sentences/s and speed-up."""
    splits = list(result["settings"]["test_sets"])
    head = ["model", "compute type", "heads (executed)", "FFN neurons", *[f"{s} BLEU (chrF)" for s in splits], "sentences/s",
            "speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["rows"]:
        cells = [row["name"], row["compute_type"], f"{row['heads_kept']} ({row['heads_executed']})",
                 str(row["neurons_kept"]),
                 *[f"{row['scores'][s]['bleu']:.2f} ({row['scores'][s]['chrf']:.2f})" for s in splits],
                 f"{row['sentences_per_s']:.1f}", f"{row['speedup']:.2f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def frontier_figure(result: dict, path: str | Path) -> Path:
    """BLEU on the first test set against sentences/s, one point per (model, compute type): float32 filled, int8
    (and other types) hollow, each labelled."""
    from prunetrain.utils.plots import pyplot, save_figure

    plt = pyplot()
    split = result["settings"]["timing_split"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for row in result["rows"]:
        x, y = row["sentences_per_s"], row["scores"][split]["bleu"]
        filled = row["compute_type"] == "float32"
        axes.scatter([x], [y], s=40, facecolors="C0" if filled else "none", edgecolors="C0")
        axes.annotate(f"{row['name']} {row['compute_type']}", (x, y), textcoords="offset points", xytext=(4, 4),
                      fontsize=7)
    settings = result["settings"]
    axes.set_xlabel(f"sentences/s (CTranslate2, beam {settings['beams']}, {settings['threads']} threads, one "
                    f"translator)")
    axes.set_ylabel(f"BLEU ({split})")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return save_figure(figure, path)


__all__ = ["COMPUTE_TYPES", "frontier", "frontier_figure", "frontier_table", "served_model_dir"]
