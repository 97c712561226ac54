#!/usr/bin/env bash
# The selection of recipes/wmt-small-deen-compress.md ("Sequence-level distillation, planned before its runs"):
# seeds 0 and 1, validation only. For each seed, the starting model (the main recipe with pruning off and the
# cooldown, a study of its own: checkpoints/compress-start/off-cooldown-sSEED, kept in
# recipes/results/wmt-small-deen-compress-start/), then the six arms of scripts/compress_study.sh from it in the study
# seqkd (checkpoints/seqkd/, kept in recipes/results/wmt-small-deen-seqkd/), one after the other; then
# `prunetrain compare --validation-only` over the twelve runs (checkpoints/seqkd/selection-s0-s1). Run it alone on the
# machine; it continues from what is there (scripts/study_runs.sh: kept runs skipped, an interrupted one resumed,
# `touch checkpoints/seqkd/STOP` or `touch checkpoints/compress-start/STOP` stops it before the next run). A seed's
# starting model that is kept but gone (checkpoints/ is not kept across machines) is trained again and used only when
# scripts/same_run.py finds it is the kept run (the same steps, FLOPs, layout and final translations):
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
  kept_start=recipes/results/wmt-small-deen-compress-start/off-cooldown-s$seed
  refuse="the seed's remaining arms must start from the model its kept arms started from, so move $kept_start and recipes/results/wmt-small-deen-seqkd/*-s$seed aside to run the seed again"
  if [ ! -f "$start/full/config.json" ]; then  # kept, but its model is gone (checkpoints/ is not kept): train it again
    for stop_file in checkpoints/compress-start/STOP checkpoints/seqkd/STOP; do
      [ -e "$stop_file" ] && { rm -f "$stop_file"; echo "seqkd: stopped before regenerating $start ($stop_file was there)"; exit 0; }
    done
    # first without the measurements the kept run recorded (REGENERATE=lean: its steps and final scores), then, if
    # that is not the kept run, with every one of them (REGENERATE=1, as the kept run was made); each is used only if
    # it is the kept run (payoff_study.sh: scripts/same_run.py)
    ways=(lean 1)
    compgen -G "$start.lean-*" > /dev/null && ways=(1)  # lean was tried already: it is set aside
    regenerated=0
    for way in "${ways[@]}"; do
      resume=0
      compgen -G "$start/checkpoint-*" > /dev/null && resume=1
      echo "seqkd: the starting model of seed $seed is gone; training it again (REGENERATE=$way, resume=$resume) from $(date -u +%FT%TZ)"
      if COOLDOWN=0.2 STUDY=compress-start MAX_MINUTES="${MAX_MINUTES:-150}" RESUME=$resume REGENERATE=$way \
           bash scripts/payoff_study.sh off "$seed"; then
        regenerated=1
        break
      fi
      [ -f "$start/run_complete.json" ] ||
        { echo "seqkd_study.sh: training $start again did not finish; run the study again to resume it" >&2; exit 1; }
      if [ "$way" = lean ]; then mv "$start" "$start.lean-$(date -u +%Y%m%dT%H%M%S)"; fi
    done
    if [ "$regenerated" = 0 ]; then
      echo "seqkd_study.sh: $start, trained again, is not the starting model kept in $kept_start; $refuse" >&2
      exit 2
    fi
  elif ! .venv/bin/python scripts/same_run.py "$start" "$kept_start"; then
    echo "seqkd_study.sh: $start is not the starting model kept in $kept_start; $refuse" >&2
    exit 2
  fi
  source scripts/study_runs.sh seqkd compress_study.sh
  for arm in "${arms[@]}"; do
    run_arm "$arm" "$arm" "$seed" START="$start"
  done
done
source scripts/study_runs.sh seqkd compress_study.sh
compare_arms "selection-s0-s1" "${seeds[*]}" --validation-only -- "${arms[@]}"
