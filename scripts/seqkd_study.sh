#!/usr/bin/env bash
# The sequence-level distillation study of recipes/wmt-small-deen-compress.md ("Sequence-level distillation, planned
# before its runs"), in its three stages. Every arm of a seed starts from that seed's starting model (the main recipe
# with pruning off and the cooldown, a study of its own: checkpoints/compress-start/off-cooldown-sSEED, kept in
# recipes/results/wmt-small-deen-compress-start/); the arms are scripts/compress_study.sh's, in the study seqkd
# (checkpoints/seqkd/, kept in recipes/results/wmt-small-deen-seqkd/), one after the other:
#
#   bash scripts/seqkd_study.sh                    the selection: the six arms at seeds 0 and 1, then
#                                                  `prunetrain compare --validation-only` (checkpoints/seqkd/selection-s0-s1)
#   bash scripts/seqkd_study.sh rates ARM          the second stage: the chosen ARM at learning rates 2e-4 and 8e-4,
#                                                  seeds 0 and 1, then `compare --validation-only` with ARM at the
#                                                  recipe's 4e-4 (checkpoints/seqkd/rates-ARM-s0-s1)
#   bash scripts/seqkd_study.sh seeds ARM [RATE]   the chosen setting (ARM, at RATE when the second stage chose
#                                                  another rate) and its final architecture trained from scratch on
#                                                  what it trains on (compress_study.sh scratch), seeds 0-4, then
#                                                  `prunetrain compare` with the starting models on the test sets
#                                                  (checkpoints/seqkd/final-NAME-s0-s4; NAME is ARM or ARM-lrRATE)
#
# Run it alone on the machine; it continues from what is there (scripts/study_runs.sh: kept runs skipped, an
# interrupted one resumed, `touch checkpoints/seqkd/STOP` or `touch checkpoints/compress-start/STOP` stops it before
# the next run). A seed's starting model that is kept but gone (checkpoints/ is not kept across machines) is trained
# again and used only when scripts/same_run.py finds it is the kept run (the same steps, FLOPs, layout and final
# translations). The first two stages read no test score: the rule in the recipe note turns their rankings into
# the choice, which is recorded there before the third stage runs.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "seqkd_study.sh: $*" >&2; exit 2; }
arms=(word seq seq-word both-word seq-greedy seq-word-ffn50)
starts=recipes/results/wmt-small-deen-compress-start runs=recipes/results/wmt-small-deen-seqkd
also_stop=(checkpoints/compress-start/STOP checkpoints/seqkd/STOP)  # either stops the study (scripts/study_runs.sh)

# pending SEED NAME...: whether any of the runs NAME-sSEED is not kept yet
pending() {
  local seed=$1 name
  shift
  for name in "$@"; do
    [ -f "$runs/$name-s$seed/results.json" ] || return 0
  done
  return 1
}

# starting_model SEED: checkpoints/compress-start/off-cooldown-sSEED, trained (and kept) when it is not kept yet,
# checked against the kept run when it is there, trained again and checked when it is kept but gone
starting_model() {
  local seed=$1
  source scripts/study_runs.sh compress-start
  run_arm off-cooldown off "$seed" COOLDOWN=0.2
  start=checkpoints/compress-start/off-cooldown-s$seed
  local kept_start=$starts/off-cooldown-s$seed
  local refuse="the seed's remaining arms must start from the model its kept arms started from, so move $kept_start and $runs/*-s$seed aside to run the seed again"
  if [ -f "$start/full/config.json" ]; then
    .venv/bin/python scripts/same_run.py "$start" "$kept_start" ||
      fail "$start is not the starting model kept in $kept_start; $refuse"
    return
  fi
  stop_before "regenerating $start"
  # first without the measurements the kept run recorded (REGENERATE=lean: its steps and final scores), then, if
  # that is not the kept run, with every one of them (REGENERATE=1, as the kept run was made); each is used only if
  # it is the kept run (payoff_study.sh: scripts/same_run.py)
  local ways=(lean 1) way resume
  compgen -G "$start.lean-*" > /dev/null && ways=(1)  # lean was tried already: it is set aside
  for way in "${ways[@]}"; do
    resume=$(resume_of "$start")
    echo "seqkd: the starting model of seed $seed is gone; training it again (REGENERATE=$way, resume=$resume) from $(date -u +%FT%TZ)"
    if COOLDOWN=0.2 STUDY=compress-start MAX_MINUTES="${MAX_MINUTES:-150}" RESUME=$resume REGENERATE=$way \
         bash scripts/payoff_study.sh off "$seed"; then
      return
    fi
    [ -f "$start/run_complete.json" ] ||
      { echo "seqkd_study.sh: training $start again did not finish; run the study again to resume it" >&2; exit 1; }
    if [ "$way" = lean ]; then mv "$start" "$start.lean-$(date -u +%Y%m%dT%H%M%S)"; fi
  done
  fail "$start, trained again, is not the starting model kept in $kept_start; $refuse"
}

chosen_arm() {  # the stage's ARM argument: one of the six
  [[ " ${arms[*]} " == *" ${1:-} "* ]] || fail "ARM '${1:-}' is not one of the study's arms (${arms[*]})"
}

stage=${1:-selection}
case "$stage" in
  selection)
    [ $# -le 1 ] || fail "the selection takes no arguments after 'selection' (got: ${*:2})"
    for seed in 0 1; do
      pending "$seed" "${arms[@]}" || { echo "seqkd: every arm of seed $seed is kept already"; continue; }
      starting_model "$seed"
      source scripts/study_runs.sh seqkd compress_study.sh
      for arm in "${arms[@]}"; do
        run_arm "$arm" "$arm" "$seed" START="$start"
      done
    done
    source scripts/study_runs.sh seqkd compress_study.sh
    compare_arms "selection-s0-s1" "0 1" --validation-only -- "${arms[@]}" ;;
  rates)
    [ $# -eq 2 ] || fail "the second stage takes one ARM: bash scripts/seqkd_study.sh rates ARM"
    arm=$2
    chosen_arm "$arm"
    for seed in 0 1; do
      pending "$seed" "$arm" "$arm-lr2e-4" "$arm-lr8e-4" || { echo "seqkd: every rate of $arm at seed $seed is kept already"; continue; }
      starting_model "$seed"
      source scripts/study_runs.sh seqkd compress_study.sh
      run_arm "$arm" "$arm" "$seed" START="$start"
      for rate in 2e-4 8e-4; do
        run_arm "$arm-lr$rate" "$arm" "$seed" START="$start" LEARNING_RATE="$rate"
      done
    done
    source scripts/study_runs.sh seqkd compress_study.sh
    compare_arms "rates-$arm-s0-s1" "0 1" --validation-only -- "$arm" "$arm-lr2e-4" "$arm-lr8e-4" ;;
  seeds)
    [ $# -eq 2 ] || [ $# -eq 3 ] || fail "the five seeds take ARM and maybe RATE: bash scripts/seqkd_study.sh seeds ARM [RATE]"
    arm=$2 rate=${3:-} name=$2 at_rate=()
    chosen_arm "$arm"
    if [ -n "$rate" ]; then
      [[ "$rate" == 2e-4 || "$rate" == 8e-4 ]] || fail "RATE '$rate' is not a rate of the second stage (2e-4, 8e-4; none for the recipe's 4e-4)"
      name="$arm-lr$rate" at_rate=(LEARNING_RATE="$rate")
    fi
    seeds="0 1 2 3 4"
    for seed in $seeds; do
      pending "$seed" "$name" "scratch-of-$name" || { echo "seqkd: $name and its scratch run of seed $seed are kept already"; continue; }
      starting_model "$seed"
      source scripts/study_runs.sh seqkd compress_study.sh
      run_arm "$name" "$arm" "$seed" START="$start" "${at_rate[@]}"
      run_arm "scratch-of-$name" scratch "$seed" START="$start" SCRATCH_FROM="$name"
    done
    source scripts/study_runs.sh seqkd compress_study.sh
    dirs=() names=()
    for run in "$name" "scratch-of-$name" start; do
      for seed in $seeds; do
        if [ "$run" = start ]; then dirs+=("$starts/off-cooldown-s$seed"); else dirs+=("$runs/$run-s$seed"); fi
        names+=("$run")
      done
    done
    compare_runs "checkpoints/seqkd/final-$name-s0-s4" "$(IFS=,; echo "${names[*]}")" -- "${dirs[@]}" ;;
  *) fail "unknown stage '$stage' (selection, rates, seeds)" ;;
esac
