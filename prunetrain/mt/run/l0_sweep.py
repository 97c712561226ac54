"""Hard-Concrete gate sweeps from a converged translation model (Voita et al. 2019 §6), the `l0-sweep` recipe kind.

Every run starts from the same converged model (a finished `wmt-small-deen` run) and fine-tunes it with one gate per
head and the objective L = L_xent + λ Σ_i (1 − P(g_i = 0)) (Voita eq. 6; `HardConcreteCallback`), then the
deterministic gates become a mask, the model is shrunk to it and scored (sacreBLEU on validation sentences):

- encoder-only gating with the decoder frozen (§6.2): BLEU against retained encoder heads over a sweep of λ
  (Fig. 7 shape), with Michel et al.'s importance pruning at the same head counts as a reference line;
- gates on every attention kind (§6.3): heads kept per kind and BLEU "from trained" (Table 2 shape), heads alive per
  kind as pruning grows (Fig. 9 shape) and per decoder layer (Fig. 10 shape);
- the same budget reached by a Lagrangian head budget (`target_heads`) instead of a λ, compared at equal heads;
- the pruned head configuration trained from scratch (Table 2, "from scratch").

Outputs in the run directory: `sweep.json`, `results.md`, `fig7_encoder_sweep.png`, `fig9_heads_per_kind.png`,
`fig10_decoder_layers.png`, TensorBoard events (`tensorboard/` for the sweep, `runs/<label>/` per run) and per run
`final_mask.json`, `gates_history.json`, `gates_trace.json` and `result.json` (so `--resume` skips finished runs).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from prunetrain.engine.heads import KINDS, find_heads
from prunetrain.engine.mask import HeadMask
from prunetrain.mt.config.recipe import GateSweepRecipe
from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir
from prunetrain.mt.run.training_setup import TimeLimitCallback, train_seq2seq, training_args
from prunetrain.utils.files import read_json
from prunetrain.utils.plots import TensorBoardLog, pyplot

ENCODER_ONLY = "encoder-only"
ALL_KINDS = "all-kinds"
BUDGET = "budget"


# ---------------------------------------------------------------------------------------------------------------------
# the source run
# ---------------------------------------------------------------------------------------------------------------------
def source_model_dir(source: str | Path) -> Path:
    """The converged model of a finished translation run (`<run>/full`), or `source` itself if it is a model dir."""
    source = Path(source)
    for candidate in (source / "full", source):
        if (candidate / "config.json").is_file():
            return candidate
    raise ValueError(f"source: {str(source)!r} holds no trained model (no full/config.json or config.json); run "
                     f"the full model first (`prunetrain recipe wmt-small-deen --set 'pruning.schedule_steps={{}}' "
                     f"--set 'pruning.shrink_steps=[]' --output checkpoints/wmt-small-deen-full`) or pass "
                     f"--set source=<run directory>.")


def _newest_trainer_state(source: str | Path) -> dict | None:
    states = [read_json(p, "source", allow_nan=True) for p in Path(source).glob("checkpoint-*/trainer_state.json")]
    return max(states, key=lambda s: s.get("global_step", 0)) if states else None


def source_train_steps(source: str | Path) -> int | None:
    """Optimizer steps the source model was trained for (the newest `checkpoint-N/trainer_state.json`)."""
    state = _newest_trainer_state(source)
    return int(state["global_step"]) if state else None


def source_recipe(source: str | Path):
    """The translation recipe the source run was made with (its `recipe.yaml`), or None."""
    from prunetrain.mt.config.recipe import recipe_from_dict
    from prunetrain.mt.run.run_dir import RUN_MARKER, stored_recipe

    if not (Path(source) / RUN_MARKER).is_file():
        return None
    return recipe_from_dict(stored_recipe(source, argument="source"))


# ---------------------------------------------------------------------------------------------------------------------
# one gate run
# ---------------------------------------------------------------------------------------------------------------------
def kept_per_layer(mask: HeadMask) -> dict[str, list[int]]:
    """Heads kept per attention kind, layer by layer (Voita Fig. 10 reads the decoder rows)."""
    out: dict[str, list[int]] = {}
    for site in mask.layout:
        kept = int((mask[site.name] > 0).sum())
        out.setdefault(site.kind, []).append(kept)
    return out


def _training_args(out: Path, *, steps: int, batch_size: int, learning_rate: float, label_smoothing: float,
                   seed: int, bf16: bool, logging_steps: int, warmup_steps: int = 0, scheduler: str = "constant"):
    return training_args(out / "trainer", max_steps=steps, per_device_train_batch_size=batch_size,
                         learning_rate=learning_rate, lr_scheduler_type=scheduler, warmup_steps=warmup_steps,
                         label_smoothing_factor=label_smoothing, bf16=bf16, seed=seed, logging_steps=logging_steps,
                         save_strategy="no", max_grad_norm=1.0)


def gate_run(model: nn.Module, tokenizer, train_set, valid_pairs, out: Path, *, label: str, group: str,
             lam: float | None = None, target_heads: float | None = None, kinds=None, freeze=None,
             recipe: GateSweepRecipe, bf16: bool) -> dict:
    """Fine-tune `model` (modified in place) with Hard-Concrete gates, shrink it to the deterministic gates and score
    it. Returns the run record (also written to `out/result.json`)."""
    from prunetrain.engine.shrink import shrink
    from prunetrain.mt.evaluation.translation import evaluate_bleu
    from prunetrain.training.callbacks import HardConcreteCallback
    from prunetrain.training.options import GateTraining, Heads, Output

    t, ev = recipe.train, recipe.eval
    started = time.time()
    training = GateTraining(gate_lr=t.gate_lr, lagrangian_lr=t.lagrangian_lr, init_log_alpha=t.init_log_alpha,
                            seed=t.seed)
    callback = HardConcreteCallback(lam, target_heads=target_heads, heads=Heads(kinds=kinds), freeze=freeze,
                                    finalize="none", training=training, output=Output(output_dir=str(out)))
    args = _training_args(out, steps=t.steps, batch_size=t.batch_size, learning_rate=t.learning_rate,
                          label_smoothing=t.label_smoothing, seed=t.seed, bf16=bf16, logging_steps=t.logging_steps)
    model.train()
    train_seq2seq(model, args, train_set, tokenizer, [callback])
    train_minutes = (time.time() - started) / 60
    mask = callback.final_mask
    for param in model.parameters():
        param.requires_grad_(True)
    model.eval()
    shrink(model, mask)
    scored = evaluate_bleu(model, tokenizer, valid_pairs, batch_size=ev.batch_size, num_beams=ev.num_beams,
                           autocast_bf16=bf16)
    record = {
        "label": label, "group": group, "lam": lam, "target_heads": target_heads,
        "kinds": list(callback.gates.kinds), "freeze": freeze, "steps": t.steps,
        "heads_kept": mask.num_kept, "heads_total": mask.num_heads, "kept_per_kind": mask.kept_per_kind(),
        "kept_per_layer": kept_per_layer(mask),
        "survivors": {site.name: [site.heads[i] for i in range(site.num_heads) if float(mask[site.name][i]) > 0]
                      for site in mask.layout},
        "bleu": scored["bleu"], "chrf": scored["chrf"], "bleu_signature": scored["bleu_signature"],
        "expected_l0_final": callback.history[-1]["expected_l0"] if callback.history else None,
        "trace": callback.trace, "train_minutes": train_minutes, "minutes": (time.time() - started) / 60,
    }
    if callback.lagrangian is not None:
        record["lambda_1"] = float(callback.lagrangian.lambda_1.detach())
        record["lambda_2"] = float(callback.lagrangian.lambda_2.detach())
    (out / "result.json").write_text(json.dumps(record, indent=1))
    return record


# ---------------------------------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------------------------------
def _label(group: str, value: float) -> str:
    return f"{group}_{'lam' if group != BUDGET else 'keep'}{value:g}"


def run_gate_sweep(recipe: GateSweepRecipe, out_dir: str | Path, *, data_dir: str | None = None, resume: bool = False,
                   overwrite: bool = False, progress: Callable[[str], None] = print) -> dict:
    """Run the whole sweep described by `recipe` into `out_dir`; returns the `sweep.json` content."""
    out_dir = Path(out_dir)
    sweep = start_sweep(recipe, out_dir, data_dir=data_dir, resume=resume, overwrite=overwrite, progress=progress)
    recipe = sweep.recipe
    tb = TensorBoardLog(out_dir / "tensorboard")
    runs, resumed = gate_runs(sweep, out_dir, tb, resume=resume, progress=progress)
    baseline = []
    encoder_counts = sorted({r["kept_per_kind"]["encoder_self"] for r in runs if r["group"] == ENCODER_ONLY})
    if recipe.sweep.importance_baseline and encoder_counts:
        baseline = importance_baseline(sweep.reference, sweep.tokenizer, sweep.train_set, sweep.valid_pairs,
                                       encoder_counts, recipe, sweep.bf16)
        progress("importance baseline (encoder heads pruned by Michel importance, no fine-tuning): " +
                 ", ".join(f"{b['encoder_heads']} heads {b['bleu']:.2f}" for b in baseline))
    scratch = None
    if recipe.sweep.scratch and any(r["group"] in (ALL_KINDS, BUDGET) for r in runs):
        scratch = scratch_run(recipe, runs, sweep.model_dir, sweep.tokenizer, sweep.train_set, sweep.valid_pairs,
                              out_dir, sweep.bf16, resume=resume, progress=progress)
    layout, full = sweep.layout, sweep.full
    result = {"recipe": recipe.to_dict(), "source": str(sweep.model_dir), "heads_total": layout.total_heads,
              "heads_per_kind": layout.heads_per_kind(), "validation_sentences": len(sweep.valid_pairs),
              "full_bleu": full["bleu"], "full_chrf": full["chrf"], "bleu_signature": full["bleu_signature"],
              "runs": runs, "importance_baseline": baseline, "scratch": scratch,
              "budget_comparison": budget_comparison(runs), "minutes": (time.time() - sweep.started) / 60,
              "resumed_runs": resumed,
              "run_minutes": sum(r["minutes"] for r in runs) + (scratch["minutes"] if scratch else 0.0)}
    write_figures(result, out_dir, tb)
    tb.close()
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=1))
    (out_dir / "results.md").write_text(results_markdown(result))
    mark_complete(out_dir, {"results": "sweep.json", "report": "results.md"})
    progress(f"sweep done in {result['minutes']:.1f} min: {out_dir / 'results.md'}")
    return result


@dataclass
class SweepInputs:
    """What every run of a sweep shares: the recipe (with `--data-dir` recorded), the source model and its
    tokenizer, the data, the precision, and the source model's layout and validation score."""

    recipe: GateSweepRecipe
    model_dir: Path
    tokenizer: object
    train_set: object
    valid_pairs: list
    bf16: bool
    reference: nn.Module
    layout: object
    full: dict
    started: float


def start_sweep(recipe: GateSweepRecipe, out_dir: Path, *, data_dir: str | None, resume: bool, overwrite: bool,
                progress: Callable[[str], None]) -> SweepInputs:
    """Check the source model and the data before the output directory is touched, prepare it, then load what the
    runs share and score the source model on the validation sentences (one progress line)."""
    from prunetrain.engine.model_dir import check_model_dir
    from prunetrain.mt.evaluation.translation import evaluate_bleu, load_model_tokenizer, load_translation_model
    from prunetrain.mt.run.run_record import data_record, recipe_inputs, with_data_dir
    from prunetrain.mt.run.runner import load_pairs
    from prunetrain.mt.text import data as D
    from prunetrain.utils.device import use_bf16

    recipe = with_data_dir(recipe, data_dir)  # --data-dir is data.dir: recipe.yaml names what is read
    model_dir = check_model_dir(source_model_dir(recipe.source), "source")
    tokenizer = load_model_tokenizer(model_dir)
    pairs = load_pairs(recipe, None)  # everything checked before the output is touched
    train_pairs, valid_pairs, _ = pairs
    prepare_output_dir(out_dir, recipe, resume=resume, overwrite=overwrite, progress=progress,
                       inputs=recipe_inputs(recipe), data=data_record(recipe, pairs))
    started = time.time()
    train_set = D.build_dataset(train_pairs, tokenizer, max_length=recipe.data.max_length)
    valid_pairs = valid_pairs[: recipe.eval.sentences]
    bf16 = use_bf16(recipe.train.precision)
    ev = recipe.eval
    reference = load_translation_model(model_dir)
    layout = find_heads(reference)
    full = evaluate_bleu(reference, tokenizer, valid_pairs, batch_size=ev.batch_size, num_beams=ev.num_beams,
                         autocast_bf16=bf16)
    progress(f"source {model_dir}: {layout.summary()}; validation BLEU {full['bleu']:.2f} "
             f"({len(valid_pairs)} sentences)")
    return SweepInputs(recipe, model_dir, tokenizer, train_set, valid_pairs, bf16, reference, layout, full, started)


def sweep_plan(recipe: GateSweepRecipe) -> list[tuple[str, float, dict]]:
    """(group, λ or budget, keyword arguments of `gate_run`) of every run, in order: the encoder-only λ sweep with
    the decoder frozen, the λ sweep over all kinds, the head budgets."""
    plan = [(ENCODER_ONLY, lam, dict(lam=lam, kinds=["encoder_self"], freeze="decoder"))
            for lam in recipe.sweep.encoder_lambdas]
    plan += [(ALL_KINDS, lam, dict(lam=lam)) for lam in recipe.sweep.all_lambdas]
    plan += [(BUDGET, share, dict(target_heads=share)) for share in recipe.sweep.budgets]
    return plan


def gate_runs(sweep: SweepInputs, out_dir: Path, tb: TensorBoardLog, *, resume: bool,
              progress: Callable[[str], None]) -> tuple[list[dict], int]:
    """Every run of `sweep_plan` (one progress line each; with `resume`, a run whose `result.json` exists is read
    back, not run again); returns (run records, how many were read back)."""
    from prunetrain.mt.evaluation.translation import load_translation_model

    plan = sweep_plan(sweep.recipe)
    runs, resumed = [], 0
    for index, (group, value, kwargs) in enumerate(plan):
        label = _label(group, value)
        run_out = out_dir / "runs" / label
        if resume and (run_out / "result.json").is_file():
            record = read_json(run_out / "result.json", "--resume", allow_nan=True)
            resumed += 1
            progress(f"[{index + 1}/{len(plan)}] {label}: done before ({record['heads_kept']} heads)")
        else:
            model = load_translation_model(sweep.model_dir)
            record = gate_run(model, sweep.tokenizer, sweep.train_set, sweep.valid_pairs, run_out, label=label,
                              group=group, recipe=sweep.recipe, bf16=sweep.bf16, **kwargs)
            del model
            progress(f"[{index + 1}/{len(plan)}] {label}: {record['heads_kept']}/{record['heads_total']} heads "
                     f"({_kinds_text(record['kept_per_kind'])}), BLEU {record['bleu']:.2f}, "
                     f"{record['minutes']:.1f} min")
        runs.append(record)
        _log_run(tb, record)
    return runs, resumed


def _kinds_text(per_kind: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in per_kind.items())


def _log_run(tb: TensorBoardLog, record: dict) -> None:
    """Sweep-level TensorBoard scalars: x axis = heads kept (encoder heads for the encoder-only sweep)."""
    group = record["group"]
    x = record["kept_per_kind"]["encoder_self"] if group == ENCODER_ONLY else record["heads_kept"]
    tb.scalar(f"sweep/{group}/bleu", record["bleu"], x)
    for kind, count in record["kept_per_kind"].items():
        tb.scalar(f"sweep/{group}/heads/{kind}", count, x)
    tb.flush()


def importance_baseline(model: nn.Module, tokenizer, train_set, valid_pairs, encoder_counts, recipe, bf16) -> list:
    """Michel et al.'s alternative at the same encoder head counts: remove the encoder heads of lowest importance
    I_h = E|∂L/∂ξ_h| from the source model (no fine-tuning) and score it."""
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.mt.evaluation.translation import evaluate_bleu
    from prunetrain.mt.text import data as D

    size = recipe.train.batch_size
    batches = D.collate_batches(train_set, D.make_collator(tokenizer, model), size, limit=8 * size)
    scores = head_importance(model, batches)
    total = find_heads(model).heads_per_kind()["encoder_self"]
    out = []
    for count in encoder_counts:
        mask = select_heads(scores, total - count, kinds=["encoder_self"], min_heads_per_layer=0)
        with mask.applied(model):
            scored = evaluate_bleu(model, tokenizer, valid_pairs, batch_size=recipe.eval.batch_size,
                                   num_beams=recipe.eval.num_beams, autocast_bf16=bf16)
        out.append({"encoder_heads": count, "bleu": scored["bleu"], "chrf": scored["chrf"]})
    return out


def scratch_run(recipe: GateSweepRecipe, runs: list, model_dir: Path, tokenizer, train_set, valid_pairs, out_dir: Path,
                bf16: bool, *, resume: bool, progress: Callable[[str], None]) -> dict:
    """Voita Table 2 "from scratch": a freshly initialised model with the chosen run's head configuration, trained
    with the source recipe's optimiser settings for as many steps as the source model (or `sweep.scratch_steps`)."""
    from transformers import AutoConfig, MarianMTModel

    from prunetrain.engine.persist import shrink_to_layout
    from prunetrain.mt.evaluation.translation import evaluate_bleu

    sweep = recipe.sweep
    if sweep.scratch_run == "budget":
        chosen = next(r for r in runs if r["group"] == BUDGET)
    else:
        wanted = float(sweep.scratch_run.split(":", 1)[1])
        chosen = next(r for r in runs if r["group"] == ALL_KINDS and r["lam"] == wanted)
    out = out_dir / "runs" / f"scratch_{chosen['label']}"
    if resume and (out / "result.json").is_file():
        return read_json(out / "result.json", "--resume", allow_nan=True)
    source_steps = source_train_steps(Path(model_dir).parent)
    steps = sweep.scratch_steps or source_steps
    if not steps:
        raise ValueError(f"sweep.scratch_steps: 0 asks for the source's step count, but {str(model_dir.parent)!r} "
                         f"has no checkpoint-*/trainer_state.json; set sweep.scratch_steps.")
    parent = source_recipe(Path(model_dir).parent)
    pt = parent.train if parent is not None else None
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    config.prunetrain_heads = None  # a fresh, unpruned architecture first; then the chosen heads are removed
    torch.manual_seed(recipe.train.seed)
    model = MarianMTModel(config)
    shrink_to_layout(model, chosen["survivors"])
    started = time.time()
    limit = TimeLimitCallback(sweep.scratch_minutes)
    args = _training_args(out, steps=steps, batch_size=pt.batch_size if pt else recipe.train.batch_size,
                          learning_rate=pt.learning_rate if pt else 1e-3,
                          label_smoothing=pt.label_smoothing if pt else recipe.train.label_smoothing,
                          seed=recipe.train.seed, bf16=bf16, logging_steps=50,
                          warmup_steps=pt.warmup_steps if pt else 300,
                          scheduler=pt.scheduler if pt else "inverse_sqrt")
    trainer = train_seq2seq(model, args, train_set, tokenizer, [limit])
    model.eval()
    scored = evaluate_bleu(model, tokenizer, valid_pairs, batch_size=recipe.eval.batch_size,
                           num_beams=recipe.eval.num_beams, autocast_bf16=bf16)
    record = {"from_run": chosen["label"], "heads_kept": chosen["heads_kept"], "kept_per_kind": chosen["kept_per_kind"],
              "steps_planned": steps, "steps_done": trainer.state.global_step, "source_steps": source_steps,
              "stopped_by_time_limit": limit.stopped_at is not None, "bleu": scored["bleu"], "chrf": scored["chrf"],
              "bleu_from_trained": chosen["bleu"], "minutes": (time.time() - started) / 60,
              "source_curve": source_curve(Path(model_dir).parent)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(record, indent=1))
    progress(f"from scratch ({chosen['label']} heads, {record['steps_done']} steps): BLEU {record['bleu']:.2f} vs "
             f"{chosen['bleu']:.2f} from trained")
    return record


def source_curve(source: Path) -> list:
    """The source run's own validation BLEU with no head pruned at each curve epoch (from its `curves.json`), with
    the optimizer step that epoch ended at — the from-scratch run's equal-steps reference."""
    path = source / "prunetrain" / "curves.json"
    if not path.is_file():
        return []
    out = []
    for _, entry in sorted(read_json(path, "source", allow_nan=True).items(), key=lambda item: int(item[0])):
        points = entry.get("curves", {}).get("importance", {}).get("points", [])  # keyed by global step
        full = next((p for p in points if p["fraction"] == 0.0), None)
        if full is not None:
            out.append({"epoch": entry["epoch"], "step": entry["step"],
                        "bleu": full["value"], "num_sentences": full["details"].get("num_sentences")})
    return out


def budget_comparison(runs: list) -> list:
    """Each Lagrangian budget run against the λ sweep (all kinds) at equal heads: the λ run with the closest head count
    and the λ sweep's BLEU linearly interpolated at the budget run's head count (None outside the swept range)."""
    sweep = sorted((r["heads_kept"], r["bleu"], r["label"]) for r in runs if r["group"] == ALL_KINDS)
    out = []
    for run in (r for r in runs if r["group"] == BUDGET):
        heads = run["heads_kept"]
        entry = {"budget_run": run["label"], "target_share": run["target_heads"], "heads_kept": heads,
                 "bleu_budget": run["bleu"], "closest_lambda_run": None, "bleu_lambda_interpolated": None}
        if sweep:
            closest = min(sweep, key=lambda item: abs(item[0] - heads))
            entry["closest_lambda_run"] = {"label": closest[2], "heads_kept": closest[0], "bleu": closest[1]}
            for (h0, b0, _), (h1, b1, _) in zip(sweep, sweep[1:]):
                if h0 <= heads <= h1:
                    entry["bleu_lambda_interpolated"] = b0 if h1 == h0 else b0 + (b1 - b0) * (heads - h0) / (h1 - h0)
                    break
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# figures and the results note
# ---------------------------------------------------------------------------------------------------------------------
def write_figures(result: dict, out_dir: Path, tb: TensorBoardLog | None = None) -> list[Path]:
    """Fig. 7 (BLEU vs encoder heads), Fig. 9 (heads per kind as pruning grows), Fig. 10 (decoder layers)."""
    plt = pyplot()
    runs = result["runs"]
    paths = []
    encoder = sorted((r["kept_per_kind"]["encoder_self"], r["bleu"]) for r in runs if r["group"] == ENCODER_ONLY)
    if encoder:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        ax.plot(*zip(*encoder), marker="o", label="Hard-Concrete gates (λ sweep, decoder frozen)")
        if result["importance_baseline"]:
            base = sorted((b["encoder_heads"], b["bleu"]) for b in result["importance_baseline"])
            ax.plot(*zip(*base), marker="s", linestyle="--", label="importance pruning, no fine-tuning")
        ax.axhline(result["full_bleu"], color="grey", linewidth=0.8, label="full model")
        _finish(ax, "encoder heads retained", "BLEU (validation)",
                "BLEU vs retained encoder heads (Voita et al. Fig. 7 shape)")
        paths.append(_emit_figure(fig, out_dir / "fig7_encoder_sweep.png", tb, "sweep/fig7"))
    gated = [r for r in runs if r["group"] in (ALL_KINDS, BUDGET)]
    if gated:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        points = []
        for r in gated:
            points += [(sum(t["open_per_kind"].values()), t["open_per_kind"]) for t in r["trace"]]
            points.append((r["heads_kept"], r["kept_per_kind"]))
        points.sort(key=lambda item: -item[0])
        for kind in (k for k in KINDS if k in result["heads_per_kind"]):
            ax.plot([p[0] for p in points], [p[1].get(kind, 0) for p in points], marker=".", linestyle="none",
                    label=kind)
        finals = sorted(((r["heads_kept"], r["kept_per_kind"]) for r in gated), key=lambda item: -item[0])
        for kind in (k for k in KINDS if k in result["heads_per_kind"]):
            ax.plot([f[0] for f in finals], [f[1].get(kind, 0) for f in finals], color="black", linewidth=0.5)
        ax.invert_xaxis()
        _finish(ax, "heads retained (all kinds)", "heads retained of the kind",
                "Heads alive per kind as pruning grows (Voita et al. Fig. 9 shape)")
        paths.append(_emit_figure(fig, out_dir / "fig9_heads_per_kind.png", tb, "sweep/fig9"))
        decoder_kinds = [k for k in ("decoder_self", "cross") if k in result["heads_per_kind"]]
        if decoder_kinds:
            fig, axes = plt.subplots(1, len(decoder_kinds), figsize=(4.2 * len(decoder_kinds), 3.6), squeeze=False)
            for ax, kind in zip(axes[0], decoder_kinds):
                for r in sorted(gated, key=lambda item: -item["heads_kept"]):
                    counts = r["kept_per_layer"].get(kind, [])
                    ax.plot(range(1, len(counts) + 1), counts, marker="o", markersize=3,
                            label=f"{r['label']} ({r['heads_kept']} heads)")
                _finish(ax, "decoder layer", "heads retained", kind, legend=False)
            axes[0][-1].legend(fontsize=6)
            fig.suptitle("Decoder heads retained per layer (Voita et al. Fig. 10 shape)", fontsize=9)
            fig.tight_layout()
            paths.append(_emit_figure(fig, out_dir / "fig10_decoder_layers.png", tb, "sweep/fig10"))
    return paths


def _emit_figure(fig, path: Path, tb: TensorBoardLog | None, tag: str) -> Path:
    """Save `fig` as PNG and, with `tb`, log it as a TensorBoard image; closes the figure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    if tb is not None:
        tb.figure(tag, fig, 0)  # closes the figure
    else:
        pyplot().close(fig)
    return path


def _finish(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)
    ax.figure.tight_layout()


def _time_text(result: dict) -> str:
    text = f"This invocation took {result['minutes']:.1f} min"
    if result.get("resumed_runs"):
        text += (f" ({result['resumed_runs']} gate runs were done before and skipped; every gate run and the "
                 f"from-scratch run together took {result['run_minutes']:.1f} min when they ran)")
    return text + "."


def results_markdown(result: dict) -> str:
    """The run's results note: the three sweeps as tables (numbers straight from `sweep.json`)."""
    kinds = [k for k in KINDS if k in result["heads_per_kind"]]
    lines = [f"# Hard-Concrete gate sweep ({result['recipe']['name']})", "",
             f"Source: `{result['source']}` ({result['heads_total']} heads: {_kinds_text(result['heads_per_kind'])}); "
             f"validation BLEU of the source model {result['full_bleu']:.2f} on {result['validation_sentences']} "
             f"sentences ({result['bleu_signature']}). {result['recipe']['train']['steps']} fine-tuning steps per "
             f"run. {_time_text(result)}", ""]
    encoder = [r for r in result["runs"] if r["group"] == ENCODER_ONLY]
    if encoder:
        base = {b["encoder_heads"]: b["bleu"] for b in result["importance_baseline"]}
        lines += ["## Encoder-only gates, decoder frozen (Voita §6.2, Fig. 7)", "",
                  "| λ | encoder heads kept | BLEU | importance pruning, same count |", "|---|---|---|---|"]
        for r in sorted(encoder, key=lambda item: item["lam"]):
            n = r["kept_per_kind"]["encoder_self"]
            ref = f"{base[n]:.2f}" if n in base else "–"
            lines.append(f"| {r['lam']:g} | {n} | {r['bleu']:.2f} | {ref} |")
        lines += ["", "![Fig. 7](fig7_encoder_sweep.png)", ""]
    gated = [r for r in result["runs"] if r["group"] in (ALL_KINDS, BUDGET)]
    if gated:
        lines += ["## Gates on all attention kinds (Voita §6.3, Table 2)", "",
                  "| run | " + " | ".join(kinds) + " | total | BLEU from trained |",
                  "|---|" + "---|" * (len(kinds) + 2)]
        for r in sorted(gated, key=lambda item: -item["heads_kept"]):
            lines.append(f"| {r['label']} | " + " | ".join(str(r["kept_per_kind"].get(k, 0)) for k in kinds) +
                         f" | {r['heads_kept']} | {r['bleu']:.2f} |")
        scratch = result.get("scratch")
        if scratch:
            lines += ["", f"From scratch: the head configuration of `{scratch['from_run']}` ({scratch['heads_kept']} "
                          f"heads) trained from a fresh initialisation for {scratch['steps_done']} steps (source model: "
                          f"{scratch['source_steps']} steps) reaches BLEU {scratch['bleu']:.2f}, against "
                          f"{scratch['bleu_from_trained']:.2f} when pruned from the trained model."]
            if scratch.get("source_curve"):
                lines += ["", "The source model itself (all heads) at its curve epochs, same validation sentences and "
                              "greedy decoding: " + ", ".join(f"epoch {c['epoch']:.2f} (step {c['step']}) {c['bleu']:.2f}"
                                                              for c in scratch["source_curve"]) + "."]
        lines += ["", "![Fig. 9](fig9_heads_per_kind.png)", "", "![Fig. 10](fig10_decoder_layers.png)", ""]
    if result["budget_comparison"]:
        lines += ["## The same budget two ways: Lagrangian head budget vs λ sweep", "",
                  "| budget run | heads | BLEU | closest λ run (heads, BLEU) | λ sweep interpolated at equal heads |",
                  "|---|---|---|---|---|"]
        for c in result["budget_comparison"]:
            close = c["closest_lambda_run"]
            close_text = f"{close['label']} ({close['heads_kept']}, {close['bleu']:.2f})" if close else "–"
            interp = c["bleu_lambda_interpolated"]
            lines.append(f"| {c['budget_run']} | {c['heads_kept']} | {c['bleu_budget']:.2f} | {close_text} | "
                         f"{'–' if interp is None else f'{interp:.2f}'} |")
        lines.append("")
    return "\n".join(lines)
