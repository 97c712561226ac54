"""The main recipe's own training steps, step by step: a pruning run against the full model on the same batches.

Two runs of `prunetrain recipe wmt-small-deen`, one after the other in this process, with the same seed, so that
step s of both trains on the same batch: pruning off (the full model), and the recipe's schedule compressed into the
first steps (12.5 % of the heads masked every 10 steps from step 30 to 80, the masked heads removed at 40, 60 and 80:
36 of 144 heads from step 81 on, chosen by importance as the recipe does; `--shrink-each` removes each step's
heads at once, as the study's shrink-each arm). Everything that is not training is off
(test points, curves, importance-only points, the benchmark), and every optimizer step is timed by the recipe's own
training clock (`MetricPointsCallback`: from the Trainer's `on_step_begin` to its `on_step_end` — forward, backward,
optimizer) together with its FLOPs (the clock's meter, from the batch's shape and the model at that step).

What it reports, for each stretch of constant size of the pruning run:
- **paired speed**: the median over the stretch's steps of full-model seconds / pruning-run seconds of the same step
  (the same batch), beside the **FLOP-ideal** (the full model's FLOPs over the pruning run's on those steps) and
  their ratio (**efficiency**); the stretch's first step is left out (it is reported apart);
- **first step after a change**: extra seconds of the first step after a shrink or a mask, against the full model's
  same step (new weight shapes: allocator and kernel set-up);
- **pruning work**: the seconds each pruning step spends after its optimizer step in the pruning callback (importance
  on the recipe's importance batches, the mask, the shrink with its optimizer slicing) — counted by the training
  clock, left out of the step rates.

The two runs are not interleaved (one process trains one recipe at a time): a machine that changes speed between
them shifts every ratio; run it alone on the machine and read the medians.

    python benchmarks/bench_recipe_stretches.py --threads 2 --precision fp32   # results/recipe_stretches_fp32.json
    python benchmarks/bench_recipe_stretches.py --quick                         # the smoke preset: not a result
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as C

PRUNE_STEPS = (30, 40, 50, 60, 70, 80)  # 12.5 % more of the heads masked at each
SCHEDULE = "{" + ", ".join(f"{step}: {0.125 * (k + 1)}" for k, step in enumerate(PRUNE_STEPS)) + "}"
SHRINKS = "[40, 60, 80]"
OFF = ("pruning.schedule_steps={}", "pruning.shrink_steps=[]")
QUIET = ("train.max_flops=0", "train.cooldown=0", "pruning.importance_steps=[]", "pruning.curve_steps=[]",
         "eval.test_flops=[]", "eval.test_steps=[]", "eval.bench=false", "eval.valid=false",
         "eval.more_test_splits=[]")


class StepLog:
    """A Trainer callback, registered last: per optimizer step the training clock's step seconds and FLOPs, the
    model's parameter count, and the wall seconds the callbacks before it spent at the step's end (the pruning work)."""

    def __init__(self, clock):
        from transformers import TrainerCallback

        class _Callback(TrainerCallback):
            def on_step_begin(inner, args, state, control, model=None, **kwargs):
                self._parameters = sum(p.numel() for p in model.parameters())  # the size the step trains

            def on_step_end(inner, args, state, control, **kwargs):
                self.on_step_end(state)

        self.callback, self.clock, self.rows = _Callback(), clock, []
        self._seconds = self._flops = 0.0
        clock_on_step_end = clock.on_step_end

        def timed_on_step_end(*args, **kwargs):  # the clock's on_step_end runs first; what follows is other work
            result = clock_on_step_end(*args, **kwargs)
            self._after_clock = time.perf_counter()
            return result

        clock.on_step_end = timed_on_step_end
        self._after_clock = None

    def on_step_end(self, state) -> None:  # the model's size is taken at the step's begin
        step_seconds = self.clock.step_seconds - self._seconds
        flops = self.clock.flops - self._flops
        self._seconds, self._flops = self.clock.step_seconds, self.clock.flops
        after = time.perf_counter() - self._after_clock if self._after_clock is not None else 0.0
        self.rows.append({"step": int(state.global_step), "step_s": step_seconds, "flops": flops,
                          "parameters": self._parameters, "after_step_s": after})


def run_recipe(out: Path, sets: list[str], smoke: bool) -> list[dict]:
    """One recipe run in this process with a `StepLog` on its Trainer; returns the log's rows."""
    import transformers

    from prunetrain.cli import main as cli_main
    from prunetrain.training.metric_points import MetricPointsCallback

    logs = []
    original_init = transformers.Trainer.__init__

    def init_with_log(trainer, *args, **kwargs):
        original_init(trainer, *args, **kwargs)
        clock = next(c for c in trainer.callback_handler.callbacks if isinstance(c, MetricPointsCallback))
        logs.append(StepLog(clock))
        trainer.add_callback(logs[-1].callback)

    argv = ["prunetrain", "recipe", "wmt-small-deen", "--output", str(out), *(["--smoke"] if smoke else [])]
    for setting in sets:
        argv += ["--set", setting]
    transformers.Trainer.__init__, saved_argv = init_with_log, sys.argv
    sys.argv = argv
    try:
        cli_main()
    except SystemExit as done:
        if done.code:
            raise RuntimeError(f"the recipe run in {out} failed (exit {done.code})") from None
    finally:
        transformers.Trainer.__init__, sys.argv = original_init, saved_argv
    (log,) = logs
    return log.rows


def stretches(full: list[dict], pruned: list[dict]) -> list[dict]:
    """The pruning run's stretches of constant size, each paired step by step with the full model's run."""
    by_step = {row["step"]: row for row in full}
    groups: list[list[dict]] = []
    for row in pruned:
        if not groups or groups[-1][-1]["parameters"] != row["parameters"]:
            groups.append([])
        groups[-1].append(row)
    table = []
    for group in groups:
        steps = [r for r in group[1:] if r["step"] in by_step]  # the first step of a stretch is reported apart
        first = group[0]
        if not steps:
            continue
        speed = statistics.median(by_step[r["step"]]["step_s"] / r["step_s"] for r in steps)
        ideal = sum(by_step[r["step"]]["flops"] for r in steps) / sum(r["flops"] for r in steps)
        table.append({"from_step": first["step"], "to_step": group[-1]["step"], "paired_steps": len(steps),
                      "parameters": first["parameters"], "speed": speed, "flop_ideal": ideal,
                      "efficiency": speed / ideal,
                      "mean_speed": sum(by_step[r["step"]]["step_s"] for r in steps) / sum(r["step_s"] for r in steps),
                      "first_step_extra_s": first["step_s"] - by_step.get(first["step"], first)["step_s"]})
    return table


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], repeats=1, warmup=0)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each run (default 300)")
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="train.precision of both runs (default the recipe's auto)")
    p.add_argument("--shrink-each", action="store_true",
                   help="remove each pruning step's heads at once (no masked stretch), as the study's shrink-each arm")
    args = p.parse_args()
    C.quiet_transformers()
    env = C.setup(args)
    steps = 100 if args.quick else args.steps
    common = [*QUIET, f"train.max_steps={steps}", f"train.precision={args.precision}"]
    with tempfile.TemporaryDirectory() as tmp:
        full = run_recipe(Path(tmp) / "full", [*OFF, *common], args.quick)
        shrinks = f"[{', '.join(map(str, PRUNE_STEPS))}]" if args.shrink_each else SHRINKS
        pruned = run_recipe(Path(tmp) / "pruned", [f"pruning.schedule_steps={SCHEDULE}",
                                                    f"pruning.shrink_steps={shrinks}", *common], args.quick)
    table = stretches(full, pruned)
    by_step = {row["step"]: row for row in full}
    work = [{"step": r["step"], "seconds": r["after_step_s"] - by_step[r["step"]]["after_step_s"]}
            for r in pruned if r["step"] in PRUNE_STEPS]
    print(f"\n{'steps':>9} {'parameters':>11} {'paired':>6} {'speed':>6} {'ideal':>6} {'effic.':>6} "
          f"{'mean':>6} {'1st step +s':>11}")
    for row in table:
        print(f"{row['from_step']:>4}–{row['to_step']:<4} {row['parameters'] / 1e6:10.2f}M {row['paired_steps']:6d} "
              f"{row['speed']:6.3f} {row['flop_ideal']:6.3f} {row['efficiency']:6.3f} {row['mean_speed']:6.3f} "
              f"{row['first_step_extra_s']:11.2f}")
    print("pruning work after the step (s): " + ", ".join(f"step {w['step']}: {w['seconds']:.2f}" for w in work))
    name = f"recipe_stretches_{args.precision}" + ("_shrink_each" if args.shrink_each else "")
    C.write_json(C.output_path(args, name), {
        "command": C.command_line(), **env, "precision": args.precision, "steps": steps, "schedule": SCHEDULE,
        "shrink_steps": shrinks, "quick": args.quick, "stretches": table, "pruning_work": work,
        "full_steps": full, "pruned_steps": pruned})


if __name__ == "__main__":
    main()
