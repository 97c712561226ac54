#!/usr/bin/env bash
# The selection of recipes/wmt-small-deen-fast.md ("The study, planned before its runs"): the six fast arms of
# scripts/payoff_study.sh at seed 100, each for 20 minutes of training (equal wall-clock, the cooldown over its last
# 20 %, the faster precision measured at the start as in the proof's equal-time runs), one after the other, all on one
# machine (scripts/study_runs.sh refuses another). Run it alone on the machine; it continues from what is there, so it can be stopped and
# started again across days:
#
#   bash scripts/fast_study.sh
#
# - an arm already kept in recipes/results/wmt-small-deen-fast/ is skipped, an interrupted one resumed
#   (scripts/study_runs.sh); `touch checkpoints/fast/STOP` stops it before the next run;
# - when every arm is kept, `prunetrain compare --validation-only` ranks them by final validation BLEU into
#   checkpoints/fast/selection-s100/; the rule in the recipe note turns the ranking into the recipe's default. No
#   test score of these runs is read to choose.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=100
source scripts/study_runs.sh fast
arms=(fast-h36-f50-early fast-h36-f75-early fast-f50-early fast-h36-f50 fast-h36-f75 fast-f50)
names=()
for arm in "${arms[@]}"; do
  names+=("$arm-cooldown-time20min-measure")
  run_arm "$arm-cooldown-time20min-measure" "$arm" "$seed" COOLDOWN=0.2 TIME_MINUTES=20 PRECISION=measure
done
compare_arms "selection-s$seed" "$seed" --validation-only -- "${names[@]}"
