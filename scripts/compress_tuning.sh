#!/usr/bin/env bash
# Choose the compress recipe's settings on validation: the tuning arms of scripts/compress_study.sh (one setting
# changed each, fixed before any ran) beside the recipe as it is (`distill`), at the tuning seeds, one run at a time,
# alone on the machine; then `prunetrain compare --validation-only` over them (no test score read), whose "Selection
# on validation" names the arm with the best mean validation BLEU. The chosen setting then runs at every seed of the
# study, and only that comparison reports test (recipes/wmt-small-deen-compress.md).
#
#   bash scripts/compress_tuning.sh            # seeds 0 1 (SEEDS="0 1 2" for more); ~8 min a run on a 2-core EPYC
#
# A finished arm is kept in recipes/results/wmt-small-deen-compress-study/ARM-sSEED and not run again;
# `touch checkpoints/compress/STOP` stops before the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-0 1}
arms="tune-lr1e-4 tune-lr4e-4 tune-alpha0.9 tune-temp1 tune-hidden1 tune-prune-by-90"
keep=recipes/results/wmt-small-deen-compress-study
for seed in $seeds; do
  [[ "$seed" =~ ^(0|[1-9][0-9]*)$ ]] || { echo "compress_tuning.sh: SEEDS holds '$seed', not a non-negative integer" >&2; exit 2; }
done
for seed in $seeds; do
  for arm in $arms; do
    [ -f "$keep/$arm-s$seed/results.json" ] && continue
    if [ -f checkpoints/compress/STOP ]; then rm checkpoints/compress/STOP; echo "stopped before $arm-s$seed"; exit 0; fi
    bash scripts/compress_study.sh "$arm" "$seed"
  done
done
dirs=() names=()
for arm in distill $arms; do
  for seed in $seeds; do dirs+=("$keep/$arm-s$seed"); names+=("$arm"); done
done
out="$keep/tuning-s${seeds// /-s}"
.venv/bin/prunetrain compare "${dirs[@]}" --names "$(IFS=,; echo "${names[*]}")" --output "$out" --validation-only
