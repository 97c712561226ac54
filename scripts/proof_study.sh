#!/usr/bin/env bash
# Steps 2 and 3 of the proof in recipes/wmt-small-deen.md, once the selection (step 1, scripts/selection_study.sh) has
# chosen the default on validation: the default (DEFAULT, the arm the selection chose), the full model (`off`) and the
# default's final architecture from scratch (`scratch`, SCRATCH_FROM=DEFAULT), all with the cooldown (0.2), five seeds
# (0–4), one run at a time, alone on the machine:
#   1. at equal training FLOPs (the recipe's budget; its precision, bf16 autocast where the hardware has it), then
#   2. at equal wall-clock: TIME_MINUTES (default 20) of training each, PRECISION (default measure: each run times
#      bf16 autocast and fp32 and trains in the faster).
# Runs go to checkpoints/proof/ and are kept in recipes/results/wmt-small-deen-proof/, apart from the payoff study's
# runs of the same names (those lack validation and the 2017 test sets). It continues from what is there, like
# selection_study.sh (scripts/study_runs.sh): `touch checkpoints/proof/STOP` stops it before the next run. When a
# question's fifteen runs are kept, `prunetrain compare` (the default first: per-seed differences default − baseline,
# paired t-test and sign-flip test across seeds, paired bootstrap per seed, every test set) writes
# checkpoints/proof/equal-flops/ or checkpoints/proof/equal-time/.
#
#   DEFAULT=early bash scripts/proof_study.sh    (the selection chose early on 2026-11-27)
#
# The fast model's proof (recipes/wmt-small-deen-fast.md, issue 64) is the same with DEFAULT one of the fast arms
# (the one scripts/fast_study.sh's selection chooses): its runs go to checkpoints/fast-proof/ and are kept in
# recipes/results/wmt-small-deen-fast-proof/ (the full model `off` is the main recipe with pruning off, as before).
#   DEFAULT=fast-h36-f50-early bash scripts/proof_study.sh
# QUESTIONS (default "flops time") names the questions and their order: "time flops" runs the equal-time runs first
# (the fast proof does: its headline is at equal wall-clock, and those runs must share one machine type, so they go
# while the session has the machine of the kept timed runs: the AMD EPYC since 2026-11-30, recipes/wmt-small-deen-fast.md),
# "time" or "flops" one of them alone (the equal-FLOPs runs may run on any machine). Before the fast proof's first
# timed run, the full model's step is timed against the kept runs' EPYC (study_runs.sh same_speed): a machine of
# another speed is refused, exit 2, before anything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "proof_study.sh: $*" >&2; exit 2; }
default=${DEFAULT:-}
study=proof
case "$default" in
  small-steps|shrink-each|gradual|early|late|per-kind) ;;
  fast-h36-f50-early|fast-h36-f75-early|fast-f50-early|fast-h36-f50|fast-h36-f75|fast-f50) study=fast-proof ;;
  *) fail "DEFAULT '$default' is not one of the selection's arms (small-steps, shrink-each, gradual, early, late, per-kind; the fast arms fast-h36-f50-early, fast-h36-f75-early, fast-f50-early, fast-h36-f50, fast-h36-f75, fast-f50): name the arm checkpoints/study/selection-s100/compare.md or checkpoints/fast/selection-s100/compare.md chooses" ;;
esac
minutes=${TIME_MINUTES:-20}
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || fail "TIME_MINUTES '$minutes' is not a positive whole number of minutes"
precision=${PRECISION:-measure}
case "$precision" in auto|bf16|fp32|measure) ;; *) fail "PRECISION '$precision' is not one of auto, bf16, fp32, measure" ;; esac
questions=${QUESTIONS:-flops time}
[[ "$questions" =~ ^(flops|time|flops\ time|time\ flops)$ ]] || \
  fail "QUESTIONS '$questions' is not one of 'flops time', 'time flops', 'flops', 'time'"
seeds="0 1 2 3 4"
source scripts/study_runs.sh "$study"
# the fast proof's timed runs step at the speed of the EPYC that made its kept ones: the full model's bf16 step timed
# there on 2026-11-30, in the session of seed 0's kept timed runs (benchmarks/README.md l5); SPEED_REFERENCE names
# another such measurement, SPEED_REFERENCE= (empty) leaves the speed unchecked (study_runs.sh, same_speed)
if [ "$study" = fast-proof ]; then
  speed_reference=${SPEED_REFERENCE-benchmarks/results/recipe_step_profile_plain_records_epyc.json}
fi

run_question() {  # OUT SUFFIX [VAR=VALUE ...]: the three arms at every seed, then their comparison into OUT
  local out=$1 suffix=$2 seed
  shift 2
  for seed in $seeds; do
    run_arm "$default$suffix" "$default" "$seed" COOLDOWN=0.2 "$@"
    run_arm "off$suffix" off "$seed" COOLDOWN=0.2 "$@"
    run_arm "scratch-of-$default$suffix" scratch "$seed" COOLDOWN=0.2 "$@" SCRATCH_FROM="$default"
  done
  compare_arms "$out" "$seeds" -- "$default$suffix" "off$suffix" "scratch-of-$default$suffix"
}

time=-cooldown-time${minutes}min
[ "$precision" = auto ] || time="$time-$precision"  # as payoff_study.sh names the run
for question in $questions; do
  case "$question" in
    flops) run_question equal-flops -cooldown ;;
    time) run_question equal-time "$time" TIME_MINUTES="$minutes" PRECISION="$precision" ;;
  esac
done
