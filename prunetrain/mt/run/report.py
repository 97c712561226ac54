"""`report.md` for a recipe run: final BLEU of the model training produced (and of a model pruned after it), test BLEU
over training time, the step rate between shrinks, pruning events per kind, pruned-BLEU curves and importance per
point, Spearman ρ between points, and the measured speed-up (all read from the run's JSON files)."""

from __future__ import annotations

from pathlib import Path

from prunetrain.methods.importance import HeadScores
from prunetrain.mt.config.recipe import settings_changed
from prunetrain.utils.files import read_json
from prunetrain.utils.plots import heatmap_figure, save_figure


def _importance_figures(run: Path) -> list[tuple[str, str]]:
    """(label, figure) per importance point, in step order (from `importance_points.json`)."""
    index = run / "prunetrain" / "importance_points.json"
    if not index.is_file():
        return []
    out = []
    for point in read_json(index, "run", list, allow_nan=True):  # a key given twice is refused
        scores = HeadScores.from_json(run / "prunetrain" / point["file"])
        figure = run / "figures" / Path(point["file"]).with_suffix(".png").name
        labels = [f"{s.kind}:{s.layer}" for s in scores.layout]
        save_figure(heatmap_figure(scores.as_matrix(), labels, f"head importance (layer-normalised), "
                                   f"{point['label']}", colorbar_label="importance"), figure)
        kind = " — end of training, part-way through an epoch" if point.get("kind") == "end" else ""
        out.append((point["label"] + kind, str(figure.relative_to(run))))
    return out


def _curve_table(run: Path) -> list[str]:
    path = run / "prunetrain" / "curves.json"
    if not path.is_file():
        return ["(no curves were computed)"]
    curves = read_json(path, "run", allow_nan=True)
    fractions = sorted({p["fraction"] for e in curves.values() for c in e["curves"].values() for p in c["points"]}
                       | {f for e in curves.values() for f in e.get("skipped_fractions", [])})
    lines = ["| step | epoch | heads present | order | " + " | ".join(f"{round(100 * f)}%" for f in fractions) +
             " | s/point |", "|---|---|---|---|" + "---|" * (len(fractions) + 1)]
    for _, entry in sorted(curves.items(), key=lambda kv: int(kv[0])):
        for order, curve in entry["curves"].items():
            points = curve["points"]
            by_fraction = {p["fraction"]: p for p in points}
            seconds = sum(p["seconds"] for p in points) / max(1, len(points))
            cells = [f"{by_fraction[f]['value']:.1f}" if f in by_fraction else "out of reach" for f in fractions]
            end = " (end)" if entry.get("kind") == "end" else ""
            lines.append(f"| {entry['step']}{end} | {entry['epoch']:.2f} | {entry.get('heads_present', '')} | {order} | "
                         + " | ".join(cells) + f" | {seconds:.1f} |")
    if len(lines) > 2:
        lines += ["", "Fractions are of the heads still present at each point (earlier training-time pruning "
                  "excluded)." if any(e.get("fractions_of") == "heads present" for e in curves.values()) else
                  "Fractions are of the original heads."]
    return lines if len(lines) > 2 else ["(no curves were computed)"]


def _distillation_lines(results: dict) -> list[str]:
    """Where the run started (a trained model: `model.init_from`) and what it distilled from, with the teacher's
    forward FLOPs beside the training FLOPs they are not part of."""
    recipe, lines = results["recipe"], []
    start = recipe.get("model", {}).get("init_from")
    if start:
        lines += [f"Started from the trained model `{start}` (every weight and its tokenizer), not from a fresh "
                  f"initialisation.", ""]
    distill = results.get("distillation")
    if not distill:
        return lines
    beta = distill["hidden_weight"]
    loss = "L = (1 − α)·CE + α·T²·KL(teacher ‖ student)" + (" + β·Σ_l MSE(hidden states)" if beta else "")
    settings = f"α {distill['alpha']:g}, T {distill['temperature']:g}" + (f", β {beta:g}" if beta else "")
    teacher, student = distill.get("teacher_forward_flops"), results.get("train_flops")
    if teacher is None:
        flops = "The teacher's FLOPs could not be counted from the batches' shapes."
    else:
        flops = f"The teacher's forward FLOPs: {teacher:.4g}, not part of the training FLOPs the budget counts"
        flops += (f" (the student's: {student:.4g}; together {student + teacher:.4g})." if student else ".")
    return lines + ["## Distillation", "", f"{loss}, {settings}; the teacher: {distill['teacher']}. {flops}", ""]


def _sequence_distillation_lines(results: dict) -> list[str]:
    """What the run trained on when the teacher's translations were its targets, and the teacher's cost beside the
    training FLOPs (`prunetrain.mt.text.sequence_distillation`)."""
    made = results.get("sequence_distillation")
    if not made:
        return []
    trained_on = {"teacher": "the teacher's translations of the training sources",
                  "both": "the references and the teacher's translations of the training sources"}[made["targets"]]
    flops, student = made.get("generation_flops_estimate"), results.get("train_flops")
    cost = f"{made['seconds'] / 60:.1f} minutes of the teacher's translating ({made['engine']}, beam {made['num_beams']})"
    if flops is not None:
        cost += f", about {flops:.3g} FLOPs (an estimate: each beam priced as a forward of its output)"
        cost += f"; the student's training FLOPs: {student:.4g}" if student else ""
    empty = f" {made['empty']} of its {made['sentences']} translations are empty." if made["empty"] else ""
    if made.get("max_length_ratio"):
        empty += (f" {made['left_out_by_length_ratio']} of them were left out for a length out of proportion to their "
                  f"source's (more than {made['max_length_ratio']:g} times its words or fewer than 1/"
                  f"{made['max_length_ratio']:g}: `distill.max_length_ratio`).")
    return ["## Sequence-level distillation", "",
            f"Trained on {trained_on} (Kim & Rush 2016); the teacher: `{made['teacher']}`. {cost}; not part of the "
            f"training budget.{empty} Translations kept in `{made['directory']}` (key {made['key']}).", ""]


def _definition(results: dict, cap: dict) -> str:
    """What defines the run's length: its FLOP budget (`train.max_flops`, and the step that reached it) when it has
    one, else its planned steps."""
    budget = results.get("max_flops")
    seconds = results.get("max_train_seconds")
    if seconds and not budget:
        reached = results.get("budget_reached_at_step")
        where = (f"reached at step {reached}" if reached is not None else
                 f"not reached: training ended at step {results.get('steps')}")
        return (f"The run is defined by its training-time budget ({seconds / 60:g} min of training time, {where}; "
                f"{results.get('train_seconds', 0) / 60:.2f} min counted)")
    if not budget:
        return f"The run is defined by its {cap.get('planned_steps')} steps"
    reached = results.get("flop_budget_reached_at_step")
    where = (f"reached at step {reached}" if reached is not None else
             f"not reached: training ended at step {results.get('steps')} of the {cap.get('planned_steps')} planned")
    return f"The run is defined by its FLOP budget (train.max_flops={budget:.4g} training FLOPs, {where})"


def _points_lines(results: dict) -> list[str]:
    """Planned points, the ones not reached, the time cap, and importance stability between points."""
    lines = []
    cap = results.get("time_cap") or {}
    if cap.get("fired"):
        lines.append(f"**The time cap ({cap['max_minutes']:g} min) fired** at step {cap['stopped_at_step']} (epoch "
                     f"{cap['stopped_at_epoch']:.2f}) of {cap['planned_steps']} planned: this run is shorter than its "
                     f"definition and depends on the machine.")
    elif cap:
        lines.append(f"{_definition(results, cap)}; the time cap ({cap.get('max_minutes', 0):g} min, 0 = none) did "
                     f"not fire.")
    for point in results.get("test_flops_merged") or []:
        lines.append(f"eval.test_flops {point['share']:g} was crossed by step {point['step']} together with a later "
                     f"point: its test BLEU is the later point's.")
    points = results.get("points") or {}
    for key, values in (points.get("beyond_train_epochs") or {}).items():
        lines.append(f"Not reached: pruning.{key} {values} lie beyond train.epochs.")
    for name, plan in points.items():
        if name == "beyond_train_epochs":
            continue
        unreached = plan.get("unreached") or []
        if unreached:
            lines.append(f"Not reached ({name}): " + ", ".join(f"{p['given']} (step {p['step']})" for p in unreached)
                         + f"; training ended at step {plan.get('last_step')}.")
        if plan.get("time_cap_expected_unreachable"):
            lines.append(f"Expected out of reach under the time cap ({name}, listed while training ran): " +
                         ", ".join(p["given"] for p in plan["time_cap_expected_unreachable"]) + ".")
    return lines


def _stability_table(run: Path) -> list[str]:
    path = run / "prunetrain" / "importance_stability.json"
    if not path.is_file():
        return []
    rows = read_json(path, "run", list, allow_nan=True)
    lines = ["## When do the important heads settle? (Spearman ρ of importance between consecutive points)", "",
             "| from | to | heads compared | Spearman ρ |", "|---|---|---|---|"]
    for r in rows:
        rho = "n/a" if r["spearman"] is None else f"{r['spearman']:.3f}"
        lines.append(f"| step {r['from_step']} (epoch {r['from_epoch']:.2f}) | step {r['to_step']} (epoch "
                     f"{r['to_epoch']:.2f}) | {r['heads_compared']} | {rho} |")
    return lines + [""]


def _changed_settings_lines(recipe: dict, shown: int = 8) -> list[str]:
    """A line under the description (which is the recipe's as written) naming the settings this run changed."""
    changed = settings_changed(recipe)
    if not changed:
        return []
    names = ", ".join(f"`{name}`" for name in changed[:shown])
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    return [f"The description above is the recipe as written; this run changed {len(changed)} of its settings "
            f"({names}{more}): `recipe.yaml` in the run directory holds every value it ran with.", ""]


def write_report(run: str | Path, results: dict) -> Path:
    run = Path(run)
    recipe = results["recipe"]
    full, masked, pruned = results["test_full"], results["test_masked"], results["test_pruned"]
    lines = [
        f"# Run report: {recipe['name']}",
        "",
        recipe.get("description", "").strip(),
        "",
        *_changed_settings_lines(recipe),
        f"Model as run: {recipe['model']['layers']}+{recipe['model']['layers']} layers, {recipe['model']['heads']} "
        f"heads per attention, d_model {recipe['model']['d_model']}, FFN {recipe['model']['ffn_dim']}; " +
        _planned_length(recipe['train']) + f" planned, precision {recipe['train']['precision']}.",
        "",
        "## Final results (test split)",
        "",
        *_final_table(results),
        "",
        f"Heads kept per kind: {results['kept_per_kind']}. Decoding: beam {full['num_beams']}, batch "
        f"{full['batch_size']}, bf16 autocast {full['autocast_bf16']}. Sentences/s is each test decode's own "
        f"throughput (outputs of different lengths, one pass each): the A/B speed comparison is the benchmark below.",
        f"BLEU signature: `{full['bleu_signature']}`; chrF signature: `{full['chrf_signature']}`.",
        "",
        *_ffn_lines(results),
        *_final_sets_table(results),
        f"Training: {results['train_minutes']:.1f} min"
        + (f", {results['train_flops']:.4g} training FLOPs over {results['steps']} steps"
           if results.get("train_flops") else "") + f"; whole run {results['total_minutes']:.1f} min"
        + (f" (stopped by the time limit at epoch {results['stopped_early_at_epoch']:.2f})"
           if results.get("stopped_early_at_epoch") else "")
        + (f" — resumed from the checkpoint at step {results['resumed_from_step']}: these minutes count only the "
           f"resumed part; the optimizer-step time ({results['train_step_minutes']:.1f} min) spans the whole run"
           if results.get("resumed_from_step") is not None else "") + ".",
        "",
        *_points_lines(results),
        "",
        *_distillation_lines(results),
        *_sequence_distillation_lines(results),
        *_training_time_lines(run, results),
        "## Pruned-BLEU curves per point (validation subset, greedy; Michel et al. 2019 §6)",
        "",
        *_curve_table(run),
        "",
        "![curves](prunetrain/curves.png)" if (run / "prunetrain" / "curves.png").is_file() else "",
        "",
        *_stability_table(run),
        "## Head importance per point",
        "",
    ]
    for text, figure in _importance_figures(run):
        lines += [f"{text}:", "", f"![importance {text}]({figure})", ""]
    bench = results.get("bench")
    if bench:
        lines += ["## Speed: original vs shrunk", "", _bench_table(bench), ""]  # a Markdown table, rendered as one
    lines += _ctranslate2_lines(results.get("bench_ctranslate2"))
    lines += ["TensorBoard: `tensorboard --logdir " + str(run) + "`", ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path


def _planned_length(train: dict) -> str:
    """How long the run was planned: a FLOP budget, a number of steps, or epochs."""
    parts = [f"{train['max_flops']:.4g} training FLOPs"] if train.get("max_flops") else []
    parts += [f"{train['max_train_minutes']:g} min of training time (optimizer steps, pruning work and data "
              f"loading; measurements and checkpoints not counted)"] if train.get("max_train_minutes") else []
    parts += [f"{train['max_steps']} optimizer steps"] if train.get("max_steps") else []
    planned = " or ".join(parts) or f"{train['epochs']} epochs"
    if train.get("cooldown"):
        budget = "training time" if train.get("max_train_minutes") else "FLOPs"
        planned += f" (the learning rate decays to zero over the last {100 * train['cooldown']:g} % of the {budget})"
    return planned


def _final_table(results: dict) -> list[str]:
    """One row for the model training produced (called "full" only when it has every head), and when heads were
    pruned after training, the masked and the shrunk model."""
    full, masked, pruned = results["test_full"], results.get("test_masked"), results["test_pruned"]
    trained_heads = results.get("heads_trained", results["heads_total"])
    name = results.get("trained_name") or "full model"
    lines = ["| model | heads | BLEU | chrF | sentences/s |", "|---|---|---|---|---|",
             f"| {name} | {trained_heads} | {full['bleu']:.2f} | {full['chrf']:.2f} | "
             f"{full['sentences_per_second']:.1f} |"]
    if masked:
        lines += [f"| masked after training ({trained_heads - results['heads_kept']} more heads zeroed) | "
                  f"{results['heads_kept']} | {masked['bleu']:.2f} | {masked['chrf']:.2f} | "
                  f"{masked['sentences_per_second']:.1f} |",
                  f"| shrunk (heads removed) | {results['heads_kept']} | {pruned['bleu']:.2f} | {pruned['chrf']:.2f} "
                  f"| {pruned['sentences_per_second']:.1f} |"]
    return lines


def _ffn_lines(results: dict) -> list[str]:
    """The FFN widths of the final model, layer by layer, when training pruned FFN neurons too."""
    widths = results.get("ffn_widths")
    if not widths:
        return []
    lines = [f"FFN neurons kept: {results['neurons_kept']} in all.", "", "| FFN (down projection) | neurons |",
             "|---|---|"]
    return lines + [f"| `{name}` | {width} |" for name, width in widths.items()] + [""]


def _final_sets_table(results: dict) -> list[str]:
    """The final model on every evaluation set (`final_scores`: validation, on which settings are chosen, then the
    test sets, on which they are reported); nothing for a run that scored the main test set alone."""
    scores = results.get("final_scores") or {}
    if len(scores) < 2:
        return []
    lines = ["## The final model on every evaluation set", "", "| set | role | sentences | BLEU | chrF |",
             "|---|---|---|---|---|"]
    for name, score in scores.items():
        role = "validation (choices are made here)" if name == results.get("valid_split") else "test"
        lines.append(f"| {name} | {role} | {score['num_sentences']} | {score['bleu']:.2f} | {score['chrf']:.2f} |")
    return lines + [""]


def _stretch_lines(segments: list[dict]) -> list[str]:
    """The step rate of every stretch between shrinks, and its FLOP rate against the first stretch's: a stretch that
    computes for fewer heads at the full model's FLOPs per second would show 1.00 there (its FLOP-ideal speed-up);
    what it shows below 1.00 is work that did not shrink with the heads (benchmarks/README.md k). Step times only:
    pruning work and evaluations are outside them; the first stretch holds the run's first, slower step."""
    def flop_rate(g):
        return g["flops"] / g["seconds"] if g.get("flops") and g.get("seconds") else None

    first = flop_rate(segments[0])
    lines = ["## Training speed between shrinks", "",
             f"FLOP rate: training FLOPs per second of step time, against steps {segments[0]['from_step']}–"
             f"{segments[0]['to_step']}. A smaller model that kept the full model's FLOP rate would step faster by "
             "the ratio of the FLOPs per step (its FLOP-ideal); the rate that falls below it is work that does not "
             "shrink with the heads.", "",
             "| steps | heads | parameters | steps/s | FLOPs per step | FLOP rate | vs the first |",
             "|---|---|---|---|---|---|---|"]
    for g in segments:
        rate = "" if not g.get("steps_per_second") else f"{g['steps_per_second']:.3f}"
        per_step = "" if g.get("flops") is None else f"{g['flops'] / g['steps']:.4g}"
        flops_per_second = flop_rate(g)
        relative = "" if flops_per_second is None or not first else f"{flops_per_second / first:.2f}"
        lines.append(f"| {g['from_step']}–{g['to_step']} | {g['heads']} | {g['parameters'] / 1e6:.2f} M | {rate} | "
                     f"{per_step} | {'' if flops_per_second is None else f'{flops_per_second:.3g}/s'} | {relative} |")
    return lines + [""]


def _training_time_lines(run: Path, results: dict) -> list[str]:
    """BLEU over training (test split, at eval.test_steps and the end) against training-step time, the step rate of
    every stretch between shrinks, and the heads per kind after each pruning event; figures beside them."""
    records = results.get("bleu_over_training") or []
    segments = results.get("step_rate") or []
    events = results.get("pruning_events") or []
    lines = []
    if records:
        valid = any(r.get("valid_bleu") is not None for r in records)
        lines += ["## Test BLEU over training", "",
                  "Training time counts the optimizer steps only (forward, backward, update); evaluations, importance "
                  "passes and checkpoints are outside it (wall time beside it).", "",
                  "| step | epoch | heads | parameters | training FLOPs | " + ("validation BLEU | " if valid else "")
                  + ("test BLEU" if valid else "BLEU") + " | training min | wall min |",
                  "|---|---|---|---|---|---|---|---|" + ("---|" if valid else "")]
        for r in records:
            epoch = "" if r.get("epoch") is None else f"{r['epoch']:.2f}"
            flops = "" if r.get("flops") is None else f"{r['flops']:.4g}"
            on_valid = "" if r.get("valid_bleu") is None else f"{r['valid_bleu']:.2f}"
            lines.append(f"| {r['step']}{' (final)' if r.get('kind') == 'final' else ''} | {epoch} | {r['heads']} | "
                         f"{r['parameters'] / 1e6:.2f} M | {flops} | " + (f"{on_valid} | " if valid else "")
                         + f"{r['bleu']:.2f} | {r['step_seconds'] / 60:.1f} | {r['wall_seconds'] / 60:.1f} |")
        lines.append("")
    if segments:
        lines += _stretch_lines(segments)
    if events:
        kinds = list(events[0]["per_kind_before"])
        lines += ["## Pruning during training", "", "| step | epoch | action | heads | " + " | ".join(kinds) + " |",
                  "|---|---|---|---|" + "---|" * len(kinds)]
        for e in events:
            action = "shrink (masked heads removed)" if e["mode"] == "shrink" and e.get("amount") is None else (
                f"prune to {e['amount']} [{e['mode']}]")
            lines.append(f"| {e['step']} | {e['epoch']:.2f} | {action} | {e['heads_before']} → {e['heads_after']} | "
                         + " | ".join(str(e["per_kind_after"].get(k, 0)) for k in kinds) + " |")
        lines.append("")
    figure = training_figure(run, results)
    if figure:
        lines += [f"![BLEU over training time and heads per kind]({figure})", ""]
    return lines


def training_figure(run: Path, results: dict, others: dict | None = None) -> str | None:
    """BLEU against training FLOPs and against training-step minutes (this run and `others`: {label: results}) and
    heads per kind against steps; written to `figures/training.png`, returned relative to `run` (None without BLEU records)."""
    from prunetrain.utils.plots import pyplot

    runs = {results.get("trained_name") or "this run": results, **(others or {})}
    if not any(r.get("bleu_over_training") for r in runs.values()):
        return None
    plt = pyplot()
    fig, (by_flops, left, right) = plt.subplots(1, 3, figsize=(16, 4))
    for name, r in runs.items():
        records = [x for x in r.get("bleu_over_training") or [] if x.get("flops") is not None]
        by_flops.plot([x["flops"] / 1e14 for x in records], [x["bleu"] for x in records], marker="o", label=name)
    by_flops.set_xlabel("training FLOPs (×10¹⁴, matmul, forward + backward)")
    by_flops.set_ylabel("test BLEU")
    by_flops.legend(fontsize=7)
    by_flops.grid(alpha=0.3)
    for name, r in runs.items():
        records = r.get("bleu_over_training") or []
        left.plot([x["step_seconds"] / 60 for x in records], [x["bleu"] for x in records], marker="o", label=name)
    left.set_xlabel("training time (min of optimizer steps)")
    left.set_ylabel("test BLEU")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    for name, r in runs.items():
        heads = _heads_per_kind_trace(r)
        for kind, trace in heads.items():
            right.step([s for s, _ in trace], [n for _, n in trace], where="post", label=f"{kind} ({name})"
                       if len(runs) > 1 else kind)
    right.set_xlabel("global step")
    right.set_ylabel("heads")
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    path = run / "figures" / "training.png"
    save_figure(fig, path)
    return str(path.relative_to(run))


def _heads_per_kind_trace(results: dict) -> dict[str, list[tuple[int, int]]]:
    """(step, heads) per kind from step 0 to the last step, from the pruning events (final layout at the end)."""
    per_kind = results.get("kept_per_kind") or {}
    events = results.get("pruning_events") or []
    start = events[0]["per_kind_before"] if events else per_kind
    last = int(results.get("steps") or 0)
    trace = {k: [(0, v)] for k, v in start.items()}
    for e in events:
        for k, v in e["per_kind_after"].items():
            trace.setdefault(k, [(0, v)]).append((e["step"], v))
    for k, v in per_kind.items():
        trace.setdefault(k, [(0, v)]).append((max(last, trace[k][-1][0]), v))
    return trace


def _ctranslate2_lines(ct2: dict | None) -> list[str]:
    """The benchmark's CTranslate2 row (`prunetrain.mt.evaluation.ctranslate2_speed`): where to serve the model."""
    if not ct2:
        return []
    full, pruned = ct2["full"], ct2["pruned"]
    return ["## Speed where translation is served: CTranslate2", "",
            "| model | heads kept | heads executed (padded per stack) | sentences/s | speed-up |", "|---|---|---|---|---|",
            f"| full-size architecture | {full['heads_kept']} | {full['heads_executed']} | "
            f"{full['sentences_per_s']:.1f} | 1.00 |",
            f"| final model | {pruned['heads_kept']} | {pruned['heads_executed']} | {pruned['sentences_per_s']:.1f} | "
            f"{ct2['speedup']:.2f} |", "",
            f"{ct2['engine']}, {ct2['compute_type']}{_backend(ct2)}, beam {ct2['beams']}, {ct2['sentences']} test "
            f"sentences in batches of {ct2['batch_size']}, every output forced to {ct2['length']} tokens, "
            f"{ct2['threads']} threads, "
            f"median of {ct2['rounds']} interleaved rounds. Serve the model with `prunetrain export pruned DIR "
            f"--format ctranslate2` (docs/export.md).", ""]


def _backend(ct2: dict) -> str:
    """The row's matrix-multiply library (MKL, DNNL, ...) for its note, "" for rows that did not record it (before
    2026-12-01)."""
    backend = ct2.get("gemm_backend")
    return f" (matrix multiplies: {backend}; `CT2_USE_MKL=0` chooses oneDNN on Intel CPUs)" if backend else ""


def _bench_table(bench: dict) -> str:
    from prunetrain.bench import BenchResult

    return BenchResult.from_dict(bench).table()
