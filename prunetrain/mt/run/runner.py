"""The translation recipe pipeline (`prunetrain recipe wmt-small-deen`), one function per step.

data → joint subword vocabulary → Transformer (MarianMTModel from config) → `Seq2SeqTrainer` with
`HeadPruningCallback` (importance at chosen epochs, optional pruning schedule) and `PruningCurveCallback`
(pruned-BLEU curves per epoch, Michel et al. §6) → after training: prune by importance to the recipe's target,
`shrink`, `save_pruned`, BLEU of full and pruned model on the test split, benchmark original vs shrunk, and a run
report (`report.md`, `results.json`, figures, TensorBoard). The run directory is marked complete last
(`prunetrain.mt.run.run_dir`), so a run that fails never blocks the next one.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prunetrain.bench.environment import machine
from prunetrain.engine.heads import find_heads, find_neurons, recorded_units
from prunetrain.mt.config.recipe import Recipe, original_heads_of
from prunetrain.mt.evaluation.eval_sets import (load_test_sets, points_metric, score_final_sets, strip_translations,
                                                write_final_translations, write_test_translations)
from prunetrain.mt.run import ranks
from prunetrain.mt.run.init_architecture import apply_initial_architecture
from prunetrain.mt.run.inputs import RunInputs, build_model, load_pairs, prepare_inputs  # noqa: F401 (the runner's steps)
from prunetrain.mt.run.preflight import (check_flop_budget, check_initial_architecture, check_tokenizer_record,
                                         merged_flop_points)
from prunetrain.mt.run.report import write_report
from prunetrain.mt.run.run_checks import check_points_reachable
from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir, replaced_run_kept
from prunetrain.mt.run.run_record import data_record, recipe_inputs, with_data_dir
from prunetrain.mt.run.run_settings import measured_settings, measures_settings, settings_record
from prunetrain.mt.run.starting import (check_trained_models, distillation_callback, distillation_record,
                                        distilled_loss, load_starting_model, run_tokenizer_dir, sequence_level_pairs)
from prunetrain.mt.run.training_setup import finite_guard, train_seq2seq, training_args
from prunetrain.mt.text.data import load_tokenizer
from prunetrain.training.time_cap import TimeCapCallback
from prunetrain.utils.files import read_json
from prunetrain.utils.output_paths import output_lock


def save_run_tokenizer(tokenizer, out_dir: Path) -> None:
    """The run's joint vocabulary into `out_dir/tokenizer`, with the fingerprint a resume checks
    (`prunetrain.mt.run.preflight.write_tokenizer_record`)."""
    from prunetrain.mt.run.preflight import write_tokenizer_record

    tokenizer.save_pretrained(out_dir / "tokenizer")
    write_tokenizer_record(out_dir)


def beyond_epochs(recipe: Recipe) -> dict[str, list[float]]:
    """Epoch points a run of `train.epochs` epochs cannot reach (none when `train.max_steps` defines the run: the
    callbacks then list what lies beyond the last step when training starts)."""
    p, t = recipe.pruning, recipe.train
    if t.max_steps:
        return {}
    out = {"importance_epochs": [e for e in p.importance_epochs if e > t.epochs],
           "curve_epochs": [e for e in p.curve_epochs if e > t.epochs]}
    return {k: v for k, v in out.items() if v}


def serving_constraints(recipe: Recipe):
    """The `ServingConstraints` of `pruning.ffn_multiple_of` and `pruning.same_heads_per_stack`, None at their
    defaults (no constraint)."""
    from prunetrain.methods.constraints import constraints_if_any

    p = recipe.pruning
    return constraints_if_any(neurons_multiple_of=p.ffn_multiple_of, same_heads_per_stack=p.same_heads_per_stack)


def make_callbacks(recipe: Recipe, inputs: RunInputs, model_config=None) -> tuple[list, TimeCapCallback, object]:
    """The training clock with test BLEU at `eval.test_steps` (first, so it times the steps alone), distillation
    (the `distill` section; `model_config`: the run's model config, which a given teacher must match), importance
    (and scheduled pruning, or Hard-Concrete gates with `pruning.method: l0`) and pruned-BLEU curves at their
    points, and the time cap (a guard). Returns (callbacks, time cap, clock)."""
    from prunetrain.mt.evaluation.metrics import bleu_metric
    from prunetrain.training.callbacks import (HardConcreteCallback, HeadPruningCallback, PruningCurveCallback,
                                               budget_cooldown)
    from prunetrain.training.metric_points import MetricPointsCallback
    from prunetrain.training.options import CurveSweep, GateTraining, Heads, Importance, Schedule
    from prunetrain.training.training_clock import TrainTime

    p, t, ev = recipe.pruning, recipe.train, recipe.eval
    late = beyond_epochs(recipe)  # listed by run_recipe, never silently dropped
    epochs = [e for e in p.importance_epochs if e not in late.get("importance_epochs", [])]
    curve_epochs = [e for e in p.curve_epochs if e not in late.get("curve_epochs", [])]
    if not epochs and not p.importance_steps and not t.max_steps:
        epochs = [float(t.epochs)]
    seconds = 60 * t.max_train_minutes  # a training-time budget (equal wall-clock) instead of a FLOP budget
    clock = MetricPointsCallback(points_metric(recipe, inputs),
                                 at_steps=ev.test_steps, metric_key="bleu", record_end=False,
                                 at_flops=[share * t.max_flops for share in ev.test_flops],
                                 max_flops=t.max_flops or None,
                                 train_time=TrainTime(max_seconds=seconds or None,
                                                      at_seconds=[share * seconds for share in ev.test_times]))
    if not ev.print_test:  # the log shows validation, never a test score
        clock.log_key = "valid_bleu"
    l0 = p.method == "l0"
    prune, prune_steps = (p.schedule or None), (p.schedule_steps or None)
    if p.kept_per_kind:  # each pruning step prunes each kind its share of the kind's final amount
        prune = {e: recipe.kind_amounts(f) for e, f in p.schedule.items()} or None
        prune_steps = {s: recipe.kind_amounts(f) for s, f in p.schedule_steps.items()} or None
    if p.ffn_schedule_steps:  # heads and neurons, each ranked within its unit: {"heads": h, "neurons": f}
        prune_steps = unit_amounts(p.schedule_steps, p.ffn_schedule_steps)
    constraints = serving_constraints(recipe)
    heads = Heads(scope=p.scope, min_heads_per_layer=p.min_heads_per_layer, constraints=constraints)
    importance = Importance(batches=inputs.importance_batches)
    schedule = Schedule(at_epochs=epochs, at_steps=p.importance_steps, prune=None if l0 else prune,
                        prune_steps=None if l0 else prune_steps, shrink_steps=() if l0 else p.shrink_steps)
    distill = distillation_callback(recipe, model_config) if recipe.distill.enabled else None
    # a diverged run stops at once; the teacher is copied before any head is masked
    callbacks = [finite_guard(recipe), clock] + ([distill] if distill else [])
    callbacks.append(HeadPruningCallback(schedule, heads=heads, importance=importance, mode=p.mode))
    if l0:
        gates = GateTraining(gate_lr=p.l0_gate_lr, lagrangian_lr=p.l0_lagrangian_lr,
                             init_log_alpha=p.l0_init_log_alpha, seed=t.seed)
        budget = {"target_flops": p.l0_target_flops} if p.l0_target_flops else {"target_heads": p.l0_target_heads}
        callbacks.append(HardConcreteCallback(**budget, start_step=p.l0_start_step, finalize="shrink",
                                              training=gates, heads=Heads(constraints=constraints)))
    if curve_epochs or p.curve_steps:
        metric = bleu_metric(inputs.tokenizer, inputs.curve_pairs, batch_size=recipe.eval.curve_batch_size,
                             autocast_bf16=inputs.bf16)
        sweep = CurveSweep(fractions=p.curve_fractions, relative=p.curve_relative,
                           order="both" if p.curve_random_baseline else "importance")
        callbacks.append(PruningCurveCallback(Schedule(at_epochs=curve_epochs, at_steps=p.curve_steps),
                                              metric=metric, metric_key="bleu", sweep=sweep, heads=heads,
                                              importance=importance))
    if t.cooldown:  # after the clock (step t counted) and the pruning (a shrink keeps the groups' rates)
        callbacks.append(budget_cooldown(clock, t.cooldown))
    time_cap = TimeCapCallback(t.max_minutes, watch=[c for c in callbacks if hasattr(c, "expect_end")],
                               budget=clock if t.max_flops else None)
    return callbacks + [time_cap, clock.clock_end], time_cap, clock  # the training clock's end marker last


def train(recipe: Recipe, model, inputs: RunInputs, out_dir: Path, callbacks: list, *, resume: bool):
    """Train with `Seq2SeqTrainer` (resuming from the last complete checkpoint); returns the trained model and the
    step of the checkpoint it resumed from (None for a run trained in one go)."""
    from prunetrain.training.callbacks import last_complete_checkpoint, restore_layout
    from prunetrain.training.state import checkpoint_step

    t = recipe.train
    distributed, loss = ranks.trainer_settings(t.label_smoothing)  # torchrun: train.batch_size is the global batch
    loss = distilled_loss(callbacks, loss, t.label_smoothing)
    args = training_args(
        out_dir, **distributed, num_train_epochs=t.epochs, per_device_train_batch_size=t.batch_size,
        max_steps=t.max_steps or -1, learning_rate=t.learning_rate, warmup_steps=t.warmup_steps, lr_scheduler_type=t.scheduler,
        weight_decay=t.weight_decay, label_smoothing_factor=t.label_smoothing, max_grad_norm=t.max_grad_norm,
        bf16=inputs.bf16, seed=t.seed, logging_steps=t.logging_steps, save_strategy="epoch",
        save_total_limit=t.save_total_limit,
    )
    checkpoint = None
    if resume:
        checkpoint = last_complete_checkpoint(out_dir, callbacks)
        if checkpoint is None:
            raise ValueError(f"--resume: {str(out_dir)!r} has no complete checkpoint-* directory (the Trainer's "
                             f"state and every callback's) to resume from.")
    callbacks = [*callbacks, settings_record(recipe, inputs, model, checkpoint)]  # checked, then recorded
    if checkpoint is not None:
        restore_layout(model, checkpoint)
    trained = train_seq2seq(model, args, inputs.train_set, inputs.tokenizer, callbacks, checkpoint, loss).model
    return trained, (None if checkpoint is None else checkpoint_step(checkpoint))


def trained_name(recipe: Recipe, heads: int) -> str:
    """How the model that training produced is called in logs and the report: "full model" only when it still
    has every head."""
    total = original_heads_of(recipe.model)
    return "full model" if heads == total else f"trained model ({heads} of {total} heads, pruned during training)"


def prune_and_evaluate(recipe: Recipe, model, inputs: RunInputs, progress: Callable[[str], None]) -> dict:
    """Make training-time masks physical, score the trained model on the test pairs, and with
    `pruning.final_fraction > 0` prune that share of the heads by importance, shrink a copy and score the masked and
    the shrunk model too (they must agree). With `final_fraction: 0` the trained model is the final one (decoded
    once)."""
    from prunetrain.engine.heads import find_heads
    from prunetrain.engine.mask import HeadMask, attached_masks
    from prunetrain.engine.shrink import shrink
    from prunetrain.methods.importance import head_importance
    from prunetrain.methods.selection import select_heads
    from prunetrain.mt.evaluation.translation import evaluate_bleu

    p, ev = recipe.pruning, recipe.eval
    for mask in attached_masks(model):  # training-time masks become physical first
        shrink(model, mask)
    model.eval()
    heads = find_heads(model).total_heads
    score = dict(batch_size=ev.batch_size, num_beams=ev.num_beams, autocast_bf16=inputs.bf16)
    final_score = dict(score, return_hypotheses=True, sentence_stats=True)  # kept for paired tests between runs
    trained = evaluate_bleu(model, inputs.tokenizer, inputs.test_pairs,
                            **(final_score if p.final_fraction == 0 else score))
    if ev.print_test:
        progress(f"test BLEU {trained_name(recipe, heads)}: {trained['bleu']:.2f} ({trained['bleu_signature']})")
    if p.final_fraction == 0:
        return {"model": model, "pruned": model, "mask": HeadMask.ones(model), "full": trained, "masked": None,
                "shrunk": trained}
    final_mask = select_heads(head_importance(model, inputs.importance_batches), p.final_fraction, scope=p.scope,
                              min_heads_per_layer=p.min_heads_per_layer, constraints=serving_constraints(recipe))
    with final_mask.applied(model):
        masked = evaluate_bleu(model, inputs.tokenizer, inputs.test_pairs, **score)
    pruned = copy.deepcopy(model)
    shrink(pruned, final_mask)
    shrunk = evaluate_bleu(pruned, inputs.tokenizer, inputs.test_pairs, **final_score)
    if ev.print_test:
        progress(f"test BLEU with {p.final_fraction:.0%} of the trained model's heads pruned after training: "
                 f"{shrunk['bleu']:.2f} (masked model: {masked['bleu']:.2f})")
    return {"model": model, "pruned": pruned, "mask": final_mask, "full": trained, "masked": masked, "shrunk": shrunk}


def benchmark(recipe: Recipe, tokenizer, pruned, out_dir: Path, bf16: bool, progress: Callable[[str], None]):
    """The recipe's full-size architecture vs the final model: forward and greedy/beam generation at forced lengths
    (`bench.json`; speed at a forced length does not depend on the weights, so the full-size model is built fresh
    when training pruned it); None without `eval.bench` or when the final model has every head."""
    from prunetrain.engine.heads import find_heads

    if not recipe.eval.bench or find_heads(pruned).total_heads == original_heads_of(recipe.model):
        return None
    from prunetrain.bench import benchmark as run_benchmark

    ev = recipe.eval
    model = build_model(recipe, tokenizer).eval()
    result = run_benchmark(model, pruned, batch_sizes=(ev.batch_size,), seq_lens=(16,), forward=True,
                           generate=("greedy", "beam4"), new_tokens=20, repeats=ev.bench_repeats,
                           dtype="bf16" if bf16 else "fp32", memory=False)
    result.to_json(out_dir / "bench.json")
    progress(result.table())
    return json.loads(result.to_json())


def benchmark_ctranslate2(recipe: Recipe, tokenizer, pruned, sources: list[str], out_dir: Path,
                          progress: Callable[[str], None]) -> dict | None:
    """The same pair in CTranslate2, where translation models are served (`prunetrain.mt.evaluation.ctranslate2_speed`:
    float32, beam `eval.num_beams`, forced lengths, `eval.bench_repeats` interleaved rounds over the test sources),
    written to `bench_ctranslate2.json`; None without `eval.bench`, without pruning or without the `ctranslate2`
    package (one line says how to get the row)."""
    from prunetrain.engine.heads import find_heads
    from prunetrain.utils.extras import packages_missing

    if not recipe.eval.bench or find_heads(pruned).total_heads == original_heads_of(recipe.model):
        return None
    missing = packages_missing("ctranslate2")
    if missing:
        progress(f"no CTranslate2 row in the benchmark: {missing}")
        return None
    from prunetrain.export.padded import padded_model
    from prunetrain.mt.evaluation.ctranslate2_speed import ctranslate2_speed

    ev = recipe.eval
    full = padded_model(pruned).float()  # the full-size architecture with the final model's weights, removed heads
    # zero: the engine checks it against itself like any export, where a random model's pad probability would not pass
    try:
        result = ctranslate2_speed(pruned.float(), full, tokenizer, sources, beams=ev.num_beams,
                                   batch_size=ev.batch_size, repeats=ev.bench_repeats)
    except ValueError as error:  # the engine refused the model: the run's own results stand without the row
        progress(f"no CTranslate2 row in the benchmark: {error}")
        return None
    (out_dir / "bench_ctranslate2.json").write_text(json.dumps(result, indent=1))
    progress(f"CTranslate2 float32, beam {ev.num_beams}, {result['sentences']} test sentences at {result['length']} "
             f"tokens: pruned {result['pruned']['sentences_per_s']:.1f} sentences/s, full-size "
             f"{result['full']['sentences_per_s']:.1f}: {result['speedup']:.2f}× (heads executed "
             f"{result['pruned']['heads_executed']} of {result['full']['heads_executed']}, "
             f"{result['pruned']['heads_kept']} kept; matrix multiplies: {result['gemm_backend']})")
    return result


def run_recipe(recipe: Recipe, out_dir: str | Path, *, data_dir: str | None = None, resume: bool = False,
               overwrite: bool = False, progress: Callable[[str], None] = print) -> dict | None:
    """Run the whole pipeline; returns the results dictionary (also written to `results.json`). Under `torchrun`
    the ranks train together and rank 0 alone writes, evaluates and reports; the other ranks return None
    (`prunetrain.mt.run.ranks`).

    Args:
        recipe: a validated translation recipe (`load_recipe`).
        out_dir: the run directory (see `prunetrain.mt.run.run_dir` for when it may be reused).
        data_dir: a parallel-text directory instead of `data.dir`.
        resume: continue the unfinished run in `out_dir` (same recipe) from its last checkpoint.
        overwrite: delete what `out_dir` holds first.
        progress: receives one line per step.
    """
    out_dir = Path(out_dir)
    started = time.time()
    recipe = with_data_dir(recipe, data_dir)  # --data-dir is data.dir: recipe.yaml and results.json name it
    ranks.check_global_batch(recipe.train.batch_size)  # under torchrun: rank 0 writes, the others wait (mt.ranks)
    ranks.start()
    progress = progress if ranks.is_main() else (lambda message: None)
    with contextlib.ExitStack() as held:  # rank 0 holds the run directory's lock until the run has ended
        ranks.on_main(lambda: held.enter_context(output_lock(out_dir)))
        ranks.on_main(lambda: held.enter_context(replaced_run_kept(out_dir, progress)))  # --overwrite: old run kept
        return _run_locked(recipe, out_dir, resume=resume, overwrite=overwrite, progress=progress, started=started)


def _run_locked(recipe: Recipe, out_dir: Path, *, resume: bool, overwrite: bool, progress: Callable[[str], None],
                started: float) -> dict | None:
    """`run_recipe` once the run directory is locked (by rank 0)."""
    pairs, tokenizer = start_run(recipe, out_dir, resume=resume, overwrite=overwrite, progress=progress)
    pairs, sequence_distillation = ranks.shared(  # rank 0 translates; the others read its translations back
        lambda: sequence_level_pairs(recipe, pairs, tokenizer, out_dir, progress),
        lambda: sequence_level_pairs(recipe, pairs, tokenizer, out_dir, lambda message: None))
    model, inputs, initial = set_up_model(recipe, tokenizer, pairs, out_dir=out_dir, progress=progress)
    callbacks, time_cap, clock = make_callbacks(recipe, inputs, model.config)
    train_start = time.time()
    model, resumed_from = train(recipe, model, inputs, out_dir, callbacks, resume=resume)
    if not ranks.end_training():
        return None  # under torchrun rank 0 alone evaluates, saves and reports
    training = TrainingOutcome((time.time() - train_start) / 60, time_cap, clock, initial, resumed_from)
    report_training(recipe, training, progress)
    final = prune_and_evaluate(recipe, model, inputs, progress)
    final["sets"] = score_final_sets(recipe, final, inputs, progress)
    saved = save_final_models(recipe, final, inputs.tokenizer, out_dir)
    final["mask"].to_json(out_dir / "final_mask.json")
    bench = benchmark(recipe, inputs.tokenizer, final["pruned"], out_dir, inputs.bf16, progress)
    bench_ct2 = benchmark_ctranslate2(recipe, inputs.tokenizer, final["pruned"], [s for s, _ in inputs.test_pairs],
                                      out_dir, progress)
    results = collect_results(recipe, out_dir, training, final, dict(bench=bench, saved=saved), started)
    results["bench_ctranslate2"] = bench_ct2
    if inputs.precision is not None:
        results["precision_measured"] = inputs.precision
    if recipe.distill.enabled:
        results["distillation"] = distillation_record(recipe, out_dir)
    if sequence_distillation is not None:
        results["sequence_distillation"] = sequence_distillation
    write_test_translations(out_dir, final["shrunk"])
    write_final_translations(out_dir, final["sets"])
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    write_report(out_dir, results)
    mark_complete(out_dir, {"results": "results.json", "report": "report.md"})
    progress(f"report: {out_dir / 'report.md'}")
    return results


def start_run(recipe: Recipe, out_dir: Path, *, resume: bool, overwrite: bool, progress: Callable[[str], None]):
    """Read the data, refuse a schedule that can never fire, an initial architecture that does not fit and a FLOP
    budget too small for the schedule, then (rank 0) check and prepare the run directory and save the tokenizer;
    returns the (train, valid, test, {more test split: pairs}) data and the tokenizer. Everything is checked before the output directory is
    touched (a run `--overwrite` would replace stays whole until then), and a resume reads the same data with the
    same tokenizer."""
    read = lambda: (*load_pairs(recipe, None), load_test_sets(recipe))  # noqa: E731
    pairs = ranks.shared(read, read)
    check_points_reachable(recipe, len(pairs[0]) * (2 if recipe.distill.targets == "both" else 1))
    check_initial_architecture(recipe)
    tokenizer = ranks.shared(lambda: _prepare(recipe, out_dir, pairs, resume=resume, overwrite=overwrite,
                                              progress=progress),
                             lambda: load_tokenizer(out_dir / "tokenizer"))
    more = "".join(f", {len(split)} {name}" for name, split in pairs[3].items())
    progress(f"data: {len(pairs[0])} train, {len(pairs[1])} valid, {len(pairs[2])} test{more} pairs")
    return pairs, tokenizer


def _prepare(recipe: Recipe, out_dir: Path, pairs, *, resume: bool, overwrite: bool,
             progress: Callable[[str], None]):
    """Rank 0's part of `start_run`: the tokenizer (trained in memory, or the run's own when resuming, checked
    against its fingerprint), the FLOP budget checked with it, then the run directory prepared; returns the
    tokenizer."""
    from prunetrain.mt.text import data as D

    tok_dir = out_dir / "tokenizer"
    prepare = lambda: prepare_output_dir(  # noqa: E731
        out_dir, recipe, resume=resume, overwrite=overwrite, progress=progress, inputs=recipe_inputs(recipe),
        data=data_record(recipe, pairs))
    if resume and (tok_dir / "tokenizer.json").is_file():
        prepare()  # refuses a finished run, another recipe or other data first
        notice = check_tokenizer_record(out_dir)
        if notice:
            progress(notice)
        return D.load_tokenizer(tok_dir)
    given = run_tokenizer_dir(recipe)  # a trained starting model or teacher brings its own vocabulary
    tokenizer = D.load_tokenizer(given) if given else D.train_tokenizer(pairs[0], vocab_size=recipe.data.vocab_size)
    check_trained_models(recipe, tokenizer)
    check_flop_budget(recipe, tokenizer, pairs[0])
    prepare()
    save_run_tokenizer(tokenizer, out_dir)
    return tokenizer


def set_up_model(recipe: Recipe, tokenizer, pairs, *, out_dir: Path, progress: Callable[[str], None]):
    """The model (with the recipe's initial architecture) and the run's inputs, with one progress line each;
    returns (model, inputs, initial)."""
    model = build_model(recipe, tokenizer)
    if recipe.model.init_from:  # compress a trained model: its weights in the recipe's model
        model = load_starting_model(recipe, model)
        progress(f"starting model: {recipe.model.init_from} (trained weights, every head)")
    initial = apply_initial_architecture(recipe, model)  # the from-scratch baselines start smaller
    if initial:
        progress(f"initial architecture: {initial['heads']} heads {initial['per_kind']} from {initial['from']}, "
                 f"freshly initialised")
    inputs = prepare_inputs(recipe, tokenizer, model, pairs)
    if measures_settings(recipe):
        inputs = measured_settings(recipe, model, inputs, out_dir, progress)
    progress(f"precision: {'bf16 autocast' if inputs.bf16 else 'fp32'} (train.precision={recipe.train.precision}); "
             f"attention: {model.config._attn_implementation} (model.attn_implementation="
             f"{recipe.model.attn_implementation})")
    progress(f"model: {sum(x.numel() for x in model.parameters()) / 1e6:.1f} M parameters, "
             f"{find_heads(model).summary()}")
    for key, points in beyond_epochs(recipe).items():
        progress(f"not reached: pruning.{key} {points} lie beyond train.epochs={recipe.train.epochs}")
    if recipe.pruning.method == "l0" and (recipe.pruning.schedule or recipe.pruning.schedule_steps):
        budget = (f"heads and FFN neurons (budget pruning.l0_target_flops={recipe.pruning.l0_target_flops})"
                  if recipe.pruning.l0_target_flops else
                  f"the heads (budget pruning.l0_target_heads={recipe.pruning.l0_target_heads})")
        progress(f"pruning.method=l0: the Hard-Concrete gates choose {budget}; "
                 f"pruning.schedule/schedule_steps/shrink_steps are not used")
    return model, inputs, initial


@dataclass
class TrainingOutcome:
    """What training leaves for the report: its minutes (of this process: a resumed run's count only the resumed
    part, while the clock's optimizer-step time spans the whole run), the time cap, the clock (BLEU over training,
    FLOPs), the initial architecture the run started from and the checkpoint step it resumed from."""

    minutes: float
    time_cap: TimeCapCallback
    clock: object
    initial: dict | None
    resumed_from_step: int | None


def report_training(recipe: Recipe, training: TrainingOutcome, progress: Callable[[str], None]) -> None:
    """One line for how long training took (and where the time cap stopped it), one when the FLOP budget was not
    reached."""
    time_cap, clock = training.time_cap, training.clock
    progress(f"training took {training.minutes:.1f} min"
             + (f"; the time cap fired at step {time_cap.stopped_at_step} (epoch {time_cap.stopped_at:.2f}) of "
                f"{time_cap.planned_steps} planned" if time_cap.fired else ""))
    for point in merged_flop_points(recipe, clock):
        progress(f"eval.test_flops: the point {point['share']:g} of the budget was crossed by step {point['step']} "
                 f"together with a later point; test BLEU was taken once there and is recorded for the later one")
    if recipe.train.max_train_minutes and clock.budget_reached_at_step is None:
        progress(f"the training-time budget train.max_train_minutes={recipe.train.max_train_minutes:g} was not "
                 f"reached: training ended at step {time_cap.last_step} after {clock.train_seconds / 60:.2f} min of "
                 f"training time (train.epochs={recipe.train.epochs}, train.max_steps={recipe.train.max_steps} or "
                 f"the time cap ended it first)")
    if recipe.train.max_flops and clock.budget_reached_at_step is None:
        progress(f"the FLOP budget train.max_flops={recipe.train.max_flops:.4g} was not reached: training ended at "
                 f"step {time_cap.last_step} after {clock.flops:.4g} FLOPs (train.epochs="
                 f"{recipe.train.epochs}, train.max_steps={recipe.train.max_steps} or the time cap ended it first)")


def collect_results(recipe: Recipe, out_dir: Path, training: TrainingOutcome, final: dict, written: dict,
                    started: float) -> dict:
    """The `results.json` record of a finished run (`written`: the benchmark's result and the saved models)."""
    time_cap, clock = training.time_cap, training.clock
    final_layout = find_heads(final["pruned"])
    final_parameters = sum(x.numel() for x in final["pruned"].parameters())
    return {
        "recipe": recipe.to_dict(), "train_minutes": training.minutes,
        "total_minutes": (time.time() - started) / 60, "resumed_from_step": training.resumed_from_step,
        "train_step_minutes": clock.step_seconds / 60, "steps": int(time_cap.last_step or 0),
        "train_flops": clock.flops if clock.meter.counted else None, "max_flops": recipe.train.max_flops or None,
        "train_seconds": clock.train_seconds, "max_train_seconds": clock.max_train_seconds,
        "flop_budget_reached_at_step": clock.budget_reached_at_step if recipe.train.max_flops else None,
        "budget_reached_at_step": clock.budget_reached_at_step,  # the FLOP or the training-time budget "flop_fits": clock.meter.fits,
        "test_flops_merged": merged_flop_points(recipe, clock) if recipe.train.max_flops else [],
        "initial_architecture": training.initial,
        "stopped_early_at_epoch": time_cap.stopped_at, "time_cap": time_cap.to_dict(),
        "points": points_summary(out_dir, beyond_epochs(recipe)), "heads_original": original_heads_of(recipe.model),
        "heads_trained": final["mask"].num_heads, "heads_total": original_heads_of(recipe.model),
        "heads_kept": final_layout.total_heads, "kept_per_kind": final_layout.heads_per_kind(),
        **ffn_widths(final["pruned"]),
        "parameters_final": final_parameters,
        "trained_name": trained_name(recipe, final["mask"].num_heads),
        "test_full": strip_translations(final["full"]), "test_masked": strip_translations(final["masked"]) if final["masked"] else None,
        "test_pruned": strip_translations(final["shrunk"]), "bench": written["bench"], "saved": written["saved"],
        "final_scores": {name: strip_translations(score) for name, score in final["sets"].items()},
        "valid_split": "valid" if "valid" in final["sets"] else None,
        "test_splits": [name for name in final["sets"] if name != "valid"],
        "bleu_over_training": clock.records + [final_record(final["shrunk"], final_layout.total_heads,
                                                            final_parameters, clock, time_cap,
                                                            final["sets"].get("valid"))],
        "machine": machine(), "step_rate": clock.segments, "pruning_events": _read_json(out_dir / "prunetrain" / "pruning_events.json"),
    }


def save_final_models(recipe: Recipe, final: dict, tokenizer, out_dir: Path) -> dict[str, str]:
    """`full/` when the trained model has every head, `pruned/` when the final model has fewer (a trained model
    already pruned during training is not called full). Returns {name: directory}."""
    from prunetrain.engine.heads import find_heads
    from prunetrain.mt.evaluation.translation import save_translation_model

    saved = {}
    if final["mask"].num_heads == original_heads_of(recipe.model):
        save_translation_model(final["model"], tokenizer, out_dir / "full", overwrite=True)
        saved["full"] = "full"
    if find_heads(final["pruned"]).total_heads < original_heads_of(recipe.model):
        save_translation_model(final["pruned"], tokenizer, out_dir / "pruned", overwrite=True)
        saved["pruned"] = "pruned"
    return saved


def final_record(result: dict, heads: int, parameters: int, clock, time_cap, valid: dict | None = None) -> dict:
    """The last point of the BLEU-over-training curve: the final model's test score (`result`) at the last step,
    with its validation score when the run scores validation (`valid`)."""
    record = {"step": int(time_cap.last_step or 0), "epoch": time_cap.last_epoch, "kind": "final",
              "step_seconds": clock.step_seconds, "wall_seconds": clock.wall_seconds(),
              "flops": clock.flops if clock.meter.counted else None, "bleu": result["bleu"],
              "chrf": result.get("chrf"), "heads": heads, "parameters": parameters,
              "sentences_per_second": result.get("sentences_per_second")}
    if valid is not None:
        record.update(valid_bleu=valid["bleu"], valid_chrf=valid["chrf"])
    return record


def _read_json(path: Path):
    return read_json(path, "run", (dict, list), allow_nan=True) if path.is_file() else []


def points_summary(out_dir: Path, late: dict) -> dict:
    """Planned, done and unreached points of the training-time callbacks (their `schedule_*.json`), and the epoch
    points beyond `train.epochs` that were never handed to them."""
    out = {"beyond_train_epochs": late}
    for path in sorted((out_dir / "prunetrain").glob("schedule_*.json")):
        out[path.stem.removeprefix("schedule_")] = read_json(path, "run", allow_nan=True)
    return out


def unit_amounts(head_steps: dict[int, float], ffn_steps: dict[int, float]) -> dict[int, dict[str, float]]:
    """One cumulative amount per pruning step for heads and FFN neurons, `{"heads": h, "neurons": f}`: at each step
    of either schedule, the last fraction each schedule reached by then (0.0 before its first step)."""
    def reached(table: dict[int, float], step: int) -> float:
        return float(max(((s, f) for s, f in table.items() if s <= step), default=(0, 0.0))[1])
    return {step: {"heads": reached(head_steps, step), "neurons": reached(ffn_steps, step)}
            for step in sorted(set(head_steps) | set(ffn_steps))}


def ffn_widths(model) -> dict:
    """`neurons_kept` and the FFN width of every layer ({site: width}) of the final pruned model when its FFNs
    were pruned; {} otherwise (a heads-only run records what it always did)."""
    if "neurons" not in recorded_units(model):
        return {}
    layout = find_neurons(model)
    return {"neurons_kept": layout.total_neurons, "ffn_widths": {s.name: s.num_heads for s in layout}}
