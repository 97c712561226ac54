"""`report.md` for a recipe run: per-epoch pruned-BLEU curves, importance heatmaps, final BLEU of the full and the
pruned model, and the measured speedup (all read from the run directory's JSON files)."""

from __future__ import annotations

import json
from pathlib import Path

from prunetrain.methods.importance import HeadScores
from prunetrain.utils.plots import heatmap_figure, save_figure


def _importance_figures(run: Path) -> list[tuple[int, str]]:
    out = []
    for path in sorted((run / "prunetrain").glob("importance_epoch*.json"),
                       key=lambda p: int(p.stem.removeprefix("importance_epoch"))):
        epoch = int(path.stem.removeprefix("importance_epoch"))
        scores = HeadScores.from_json(path)
        figure = run / "figures" / f"importance_epoch{epoch}.png"
        labels = [f"{s.kind}:{s.layer}" for s in scores.layout]
        save_figure(heatmap_figure(scores.as_matrix(), labels, f"head importance (layer-normalised), epoch {epoch}",
                                   colorbar_label="importance"), figure)
        out.append((epoch, str(figure.relative_to(run))))
    return out


def _curve_table(run: Path) -> list[str]:
    path = run / "prunetrain" / "curves.json"
    if not path.is_file():
        return ["(no curves were computed)"]
    curves = json.loads(path.read_text())
    fractions = None
    lines = []
    for epoch, by_order in sorted(curves.items(), key=lambda kv: int(kv[0])):
        for order, curve in by_order.items():
            points = curve["points"]
            if fractions is None:
                fractions = [p["fraction"] for p in points]
                lines.append("| epoch | order | " + " | ".join(f"{round(100 * f)}%" for f in fractions) +
                             " | s/point |")
                lines.append("|---|---|" + "---|" * (len(fractions) + 1))
            seconds = sum(p["seconds"] for p in points) / max(1, len(points))
            lines.append(f"| {epoch} | {order} | " + " | ".join(f"{p['value']:.1f}" for p in points) +
                         f" | {seconds:.1f} |")
    return lines


def write_report(run: str | Path, results: dict) -> Path:
    run = Path(run)
    recipe = results["recipe"]
    full, masked, pruned = results["test_full"], results["test_masked"], results["test_pruned"]
    lines = [
        f"# Run report: {recipe['name']}",
        "",
        recipe.get("description", "").strip(),
        "",
        f"Model as run: {recipe['model']['layers']}+{recipe['model']['layers']} layers, {recipe['model']['heads']} "
        f"heads per attention, d_model {recipe['model']['d_model']}, FFN {recipe['model']['ffn_dim']}; "
        f"{recipe['train']['epochs']} epochs planned, precision {recipe['train']['precision']}.",
        "",
        "## Final results (test split)",
        "",
        "| model | heads | BLEU | chrF | sentences/s |",
        "|---|---|---|---|---|",
        f"| full | {results['heads_total']} | {full['bleu']:.2f} | {full['chrf']:.2f} | "
        f"{full['sentences_per_second']:.1f} |",
        f"| masked ({results['heads_total'] - results['heads_kept']} heads zeroed) | {results['heads_kept']} | "
        f"{masked['bleu']:.2f} | {masked['chrf']:.2f} | {masked['sentences_per_second']:.1f} |",
        f"| shrunk (heads removed) | {results['heads_kept']} | {pruned['bleu']:.2f} | {pruned['chrf']:.2f} | "
        f"{pruned['sentences_per_second']:.1f} |",
        "",
        f"Heads kept per kind: {results['kept_per_kind']}. Decoding: beam {full['num_beams']}, batch "
        f"{full['batch_size']}, bf16 autocast {full['autocast_bf16']}. Sentences/s is each test decode's own "
        f"throughput (outputs of different lengths, one pass each): the A/B speed comparison is the benchmark below.",
        f"BLEU signature: `{full['bleu_signature']}`; chrF signature: `{full['chrf_signature']}`.",
        "",
        f"Training: {results['train_minutes']:.1f} min; whole run {results['total_minutes']:.1f} min"
        + (f" (stopped by the time limit at epoch {results['stopped_early_at_epoch']:.2f})"
           if results.get("stopped_early_at_epoch") else "") + ".",
        "",
        "## Pruned-BLEU curves per epoch (validation subset, greedy; Michel et al. 2019 §6)",
        "",
        *_curve_table(run),
        "",
        "![curves](prunetrain/curves.png)" if (run / "prunetrain" / "curves.png").is_file() else "",
        "",
        "## Head importance per epoch",
        "",
    ]
    for epoch, figure in _importance_figures(run):
        lines += [f"Epoch {epoch}:", "", f"![importance epoch {epoch}]({figure})", ""]
    bench = results.get("bench")
    if bench:
        lines += ["## Speed: original vs shrunk", "", "```", _bench_table(bench), "```", ""]
    lines += ["TensorBoard: `tensorboard --logdir " + str(run) + "`", ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path


def _bench_table(bench: dict) -> str:
    from prunetrain.bench import BenchResult

    return BenchResult.from_dict(bench).table()
