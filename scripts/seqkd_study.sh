#!/usr/bin/env bash
# The selection of recipes/wmt-small-deen-compress.md ("Sequence-level distillation, planned before its runs"):
# seeds 0 and 1, validation only. For each seed, the starting model (the main recipe with pruning off and the
# cooldown, a study of its own: checkpoints/compress-start/off-cooldown-sSEED, kept in
# recipes/results/wmt-small-deen-compress-start/), then the six arms of scripts/compress_study.sh from it in the study
# seqkd (checkpoints/seqkd/, kept in recipes/results/wmt-small-deen-seqkd/), one after the other; then
# `prunetrain compare --validation-only` over the twelve runs (checkpoints/seqkd/selection-s0-s1). Run it alone on the
# machine; it continues from what is there (scripts/study_runs.sh: kept runs skipped, an interrupted one resumed,
# `touch checkpoints/seqkd/STOP` or `touch checkpoints/compress-start/STOP` stops it before the next run):
#
#   bash scripts/seqkd_study.sh
#
# No test score of these runs is read to choose; the rule in the recipe note turns the ranking into the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=(0 1)
arms=(word seq seq-word both-word seq-greedy seq-word-ffn50)
for seed in "${seeds[@]}"; do
  pending=0
  for arm in "${arms[@]}"; do
    [ -f "recipes/results/wmt-small-deen-seqkd/$arm-s$seed/results.json" ] || pending=1
  done
  [ "$pending" = 1 ] || { echo "seqkd: every arm of seed $seed is kept already"; continue; }
  source scripts/study_runs.sh compress-start
  run_arm off-cooldown off "$seed" COOLDOWN=0.2
  start=checkpoints/compress-start/off-cooldown-s$seed
  if [ ! -f "$start/full/config.json" ]; then  # kept, but its model is gone (checkpoints/ is not kept)
    echo "seqkd_study.sh: the starting model of seed $seed ($start/full) is gone though its results are kept; the seed's remaining arms must start from the model its kept arms started from, so move recipes/results/wmt-small-deen-compress-start/off-cooldown-s$seed and recipes/results/wmt-small-deen-seqkd/*-s$seed aside to run the seed again" >&2
    exit 2
  fi
  source scripts/study_runs.sh seqkd compress_study.sh
  for arm in "${arms[@]}"; do
    run_arm "$arm" "$arm" "$seed" START="$start"
  done
done
source scripts/study_runs.sh seqkd compress_study.sh
compare_arms "selection-s0-s1" "${seeds[*]}" --validation-only -- "${arms[@]}"
