#!/usr/bin/env bash
# Compress a trained model: does distillation from the unpruned model pay while it is pruned? One run of the study
# in recipes/wmt-small-deen-compress.md; every arm is `prunetrain recipe wmt-small-deen-compress` (one budget of
# student FLOPs: train.max_flops, the teacher's forward FLOPs counted apart) with the settings below.
#
#   bash scripts/compress_study.sh ARM SEED        e.g. bash scripts/compress_study.sh distill 0
#
# The starting model of seed S is the proof's full model of seed S, the main recipe with pruning off and the
# cooldown (`COOLDOWN=0.2 STUDY=proof bash scripts/payoff_study.sh off S`, as scripts/proof_study.sh runs it →
# checkpoints/proof/off-cooldown-sS); START=DIR names another (the payoff study's: checkpoints/study/off-cooldown-sS).
# The run directory is checkpoints/compress/ARM-sSEED (git-ignored); what the comparison needs is kept in
# recipes/results/wmt-small-deen-compress-study/ARM-sSEED (scripts/keep_run.sh). Run one at a time on a quiet machine.
# Each run prints validation only (eval.print_test=false): settings are chosen on validation.
# Arms:
#   distill          the recipe as the study ran it: 75 % of the heads pruned by importance in 12.5 % steps
#                    (30..180), with distillation from a frozen copy of the starting model (α 0.5, T 2), learning
#                    rate 2e-4. Every arm but scratch-distill and tune-lr* runs at 2e-4, the recipe's learning rate
#                    until validation chose 4e-4 (2026-11-28; the recipe's default since, = tune-lr4e-4), so that
#                    each arm stays the run that is kept
#   plain            the same without distillation (α 0)
#   at-once-distill  75 % of the heads pruned at once at step 30 and removed, then fine-tuned, with distillation
#   at-once          the same without distillation
#   scratch-distill  the distill arm's final architecture (same seed) freshly initialised and trained from scratch
#                    with distillation from the same teacher, for the same student FLOPs and with the main recipe's
#                    from-scratch optimiser settings (peak 7e-4, inverse square root, 400 warm-up steps)
# Tuning arms, the recipe with one setting changed (fixed 2026-11-28, before any of them ran; compared with `distill`
# on validation only, scripts/compress_tuning.sh):
#   tune-lr1e-4, tune-lr4e-4   learning rate 1e-4 / 4e-4 (the recipe: 2e-4)
#   tune-alpha0.9              distillation weight α 0.9 (0.5)
#   tune-temp1                 temperature T 1 (2)
#   tune-hidden1               CoFi's per-layer hidden-state matching added, β 1 (0)
#   tune-prune-by-90           the same 75 % pruned in three steps by step 90 (30, 60, 90; removed at 60 and 90)
#                              instead of six by step 180, leaving twice the steps to recover
# MAX_MINUTES=M sets the wall-time guard train.max_minutes (a slower machine needs more); RESUME=1 continues an
# interrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_args.sh compress_study.sh "$@"
start=${START:-checkpoints/proof/off-cooldown-s$seed}
[ -d "$start" ] || fail "START '$start' is not a directory; train the starting model first (COOLDOWN=0.2 STUDY=proof bash scripts/payoff_study.sh off $seed, as scripts/proof_study.sh does) or give START=DIR"
sets=(--set "model.init_from=$start")
learning_rate=0.0002  # the study's: see the arms above
at_once=(--set 'pruning.schedule_steps={30: 0.75}' --set 'pruning.shrink_steps=[30]')
case "$arm" in
  distill) ;;
  plain) sets+=(--set distill.alpha=0) ;;
  at-once-distill) sets+=("${at_once[@]}") ;;
  at-once) sets+=("${at_once[@]}" --set distill.alpha=0) ;;
  tune-lr1e-4) learning_rate=0.0001 ;;
  tune-lr4e-4) learning_rate=0.0004 ;;
  tune-alpha0.9) sets+=(--set distill.alpha=0.9) ;;
  tune-temp1) sets+=(--set distill.temperature=1.0) ;;
  tune-hidden1) sets+=(--set distill.hidden_weight=1.0) ;;
  tune-prune-by-90) sets+=(--set 'pruning.schedule_steps={30: 0.25, 60: 0.5, 90: 0.75}'
                           --set 'pruning.shrink_steps=[60, 90]' --set 'pruning.curve_steps=[30, 90]') ;;
  scratch-distill) sets=(--set model.init_from= --set "distill.teacher=$start"
                         --set "pruning.init_layout=recipes/results/wmt-small-deen-compress-study/distill-s$seed/layout.json"
                         --set 'pruning.schedule_steps={}' --set 'pruning.shrink_steps=[]' --set 'pruning.curve_steps=[]'
                         --set train.warmup_steps=400 --set train.scheduler=inverse_sqrt)
                   learning_rate=0.0007 ;;
  *) fail "unknown arm '$arm' (distill, plain, at-once-distill, at-once, scratch-distill, tune-lr1e-4, tune-lr4e-4, tune-alpha0.9, tune-temp1, tune-hidden1, tune-prune-by-90)" ;;
esac
sets+=(--set "train.learning_rate=$learning_rate")
if [ -n "${MAX_MINUTES:-}" ]; then
  [[ "$MAX_MINUTES" =~ ^([1-9][0-9]*)$ ]] || fail "MAX_MINUTES '$MAX_MINUTES' is not a positive whole number of minutes"
  sets+=(--set "train.max_minutes=$MAX_MINUTES")
fi
case "${RESUME:-0}" in 0|1) ;; *) fail "RESUME '${RESUME}' is not 0 or 1" ;; esac
out="checkpoints/compress/$arm-s$seed"
resume=(); [ "${RESUME:-0}" = 1 ] && resume=(--resume)
# eval.print_test=false: the run's log and summary print validation only (its test scores are in its files)
.venv/bin/prunetrain recipe wmt-small-deen-compress --set "train.seed=$seed" "${sets[@]}" --set eval.print_test=false \
  --output "$out" "${resume[@]}"
bash scripts/keep_run.sh "$out" "recipes/results/wmt-small-deen-compress-study/$arm-s$seed"
