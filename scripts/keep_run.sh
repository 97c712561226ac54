#!/usr/bin/env bash
# Keep what a study's comparison needs of a finished recipe run in the repository (the run directory and its models
# are git-ignored): results.json, report.md, test_translations.json, final_translations/ (the validation and every
# test set's translations: re-scoring or a paired test needs no model) and the final head layout.
#
#   bash scripts/keep_run.sh RUN_DIR KEEP_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "keep_run.sh: usage: keep_run.sh RUN_DIR KEEP_DIR (got $# arguments)" >&2; exit 2; }
out=$1
keep=$2
[ -f "$out/run_complete.json" ] || { echo "keep_run.sh: RUN_DIR '$out' holds no finished run" >&2; exit 2; }
mkdir -p "$keep"
cp "$out/results.json" "$out/report.md" "$out/test_translations.json" "$keep/"
[ -d "$out/final_translations" ] && cp -r "$out/final_translations" "$keep/"
for model in pruned full; do
  [ -f "$out/$model/prunetrain_layout.json" ] && cp "$out/$model/prunetrain_layout.json" "$keep/layout.json"
done
echo "kept in $keep"
