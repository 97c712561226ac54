#!/usr/bin/env bash
# Step 1 of the proof in recipes/wmt-small-deen.md: the selection runs, on a seed the proof does not use (100), each
# an arm of scripts/payoff_study.sh, one after the other. Run it alone on the machine; it continues from what is
# there, so it can be stopped and started again across days:
#
#   bash scripts/selection_study.sh
#
# - an arm already kept in recipes/results/wmt-small-deen-study/ is skipped; an arm whose run directory exists
#   without a kept result is resumed (RESUME=1) from its last checkpoint (kept, if it had finished; started again,
#   if it stopped before its first checkpoint) (scripts/study_runs.sh);
# - `touch checkpoints/study/STOP` stops it before the next run (the file is removed when seen);
# - MAX_MINUTES (default 150) is every run's wall-time guard (train.max_minutes; a slow machine needs a long one);
# - when every arm is kept, `prunetrain compare --validation-only` ranks them by final validation BLEU into
#   checkpoints/study/selection-s100/ (a new directory each time: an older one is moved aside with its date): the
#   arm it names becomes the default (DEFAULT= of scripts/proof_study.sh). No test score of these runs is read to
#   choose.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=100
source scripts/study_runs.sh study
# ARM COOLDOWN: the six schedules with the cooldown, and the current default without it
arms=("small-steps 0.2" "shrink-each 0.2" "gradual 0.2" "early 0.2" "late 0.2" "per-kind 0.2" "small-steps 0")
names=()
for entry in "${arms[@]}"; do
  read -r arm cooldown <<< "$entry"
  name=$arm
  [ "$cooldown" = 0 ] || name=$arm-cooldown
  names+=("$name")
  run_arm "$name" "$arm" "$seed" COOLDOWN="$cooldown"
done
compare_arms "selection-s$seed" "$seed" --validation-only -- "${names[@]}"
