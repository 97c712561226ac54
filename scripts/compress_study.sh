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
# recipes/results/wmt-small-deen-compress-study/ARM-sSEED (scripts/keep_run.sh). STUDY=NAME puts them in
# checkpoints/NAME/ and recipes/results/wmt-small-deen-NAME/ instead (a study of its own: its runs never meet the
# earlier study's of the same name; scripts/seqkd_study.sh: STUDY=seqkd). Run one at a time on a quiet machine.
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
# Sequence-level distillation arms (issue 65; fixed 2026-11-29 before any of them ran, with the rule in
# recipes/wmt-small-deen-compress.md "Sequence-level distillation, planned before its runs"): the recipe as it is
# (learning rate 4e-4, 75 % of the heads, 3.0e13 student FLOPs) with what it trains on changed. The teacher (the
# starting model) translates the training sources once per seed in CTranslate2, kept in
# checkpoints/compress/teacher-translations (or the STUDY's; keyed by teacher, tokenizer, beams and sources: every arm of one seed
# reads the same translations, and a run counts the teacher's seconds and FLOPs all the same):
#   word             the recipe as it is (= tune-lr4e-4): word-level distillation on the references
#   seq              the teacher's beam-4 translations instead of the references, no word-level term (α 0)
#   seq-word         the teacher's translations and the word-level term (α 0.5, T 2): Kim & Rush's Word-KD + Seq-KD
#   both-word        the references and the teacher's translations (twice the pairs), with the word-level term
#   seq-greedy       as seq with the teacher's greedy translations (beam 1: a third of beam 4's generation FLOPs)
#   seq-word-ffn50   seq-word with half of the FFN neurons pruned too (25 % at step 60, 50 % at 120; removed at
#                    60/120): heads and FFN
#   seq-word-ffn75   the same with three quarters of the FFN neurons (75 % at 180, removed there too): a third budget
#                    for the speed/quality frontier (added 2026-11-30 after the frontier's first table, not a
#                    selection arm)
#   scratch          the final architecture of the kept run SCRATCH_FROM (one of the arms above, or one at another
#                    learning rate such as word-lr8e-4; default seq-word), same seed, freshly initialised and trained
#                    on what that arm trains on (the teacher's translations with its beams, or the references) with
#                    its word-level setting, the main recipe's from-scratch optimiser (as scratch-distill), for the
#                    recipe's student FLOPs; kept as scratch-of-SCRATCH_FROM-sSEED
# LEARNING_RATE=X (e.g. 2e-4, 8e-4) runs an arm at another learning rate, kept as ARM-lrX-sSEED (the plan's second
# stage: the chosen arm at 2e-4 and 8e-4).
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
runs=checkpoints/compress kept=recipes/results/wmt-small-deen-compress-study
if [ -n "${STUDY:-}" ]; then
  [[ "$STUDY" =~ ^[a-z0-9][a-z0-9-]*$ ]] || fail "STUDY '$STUDY' is not a study name (lower-case letters, digits, -)"
  runs=checkpoints/$STUDY kept=recipes/results/wmt-small-deen-$STUDY
fi
translations=(--set "distill.translations_dir=$runs/teacher-translations")
sequence_level=(--set distill.targets=teacher "${translations[@]}")
# from_scratch KEPT_RUN, for the from-scratch arms: that kept run's final architecture freshly initialised, distilled
# from the starting model, the main recipe's from-scratch optimiser (peak 7e-4, inverse square root, 400 warm-up
# steps), no pruning
from_scratch() {
  sets=(--set model.init_from= --set "distill.teacher=$start" --set "pruning.init_layout=$kept/$1-s$seed/layout.json"
        --set 'pruning.schedule_steps={}' --set 'pruning.shrink_steps=[]' --set 'pruning.curve_steps=[]'
        --set train.warmup_steps=400 --set train.scheduler=inverse_sqrt)
  learning_rate=0.0007
}
# The sequence-level study's arms (issue 65), named once: the case below, SCRATCH_FROM's pattern and the messages
sequence_arms=(word seq seq-word both-word seq-greedy seq-word-ffn50 seq-word-ffn75)
sequence_pattern=$(IFS='|'; echo "${sequence_arms[*]}")
sequence_list=$(printf '%s, ' "${sequence_arms[@]}"); sequence_list=${sequence_list%, }
# trains_on ARM: what the sequence-level arm ARM trains on (the references or the teacher's translations, with its
# beams) and its word-level setting; a scratch run of ARM trains on the same
trains_on() {
  case "$1" in
    word) ;;
    seq) sets+=("${sequence_level[@]}" --set distill.alpha=0) ;;
    seq-word|seq-word-ffn50|seq-word-ffn75) sets+=("${sequence_level[@]}") ;;
    both-word) sets+=(--set distill.targets=both "${translations[@]}") ;;
    seq-greedy) sets+=("${sequence_level[@]}" --set distill.alpha=0 --set distill.beams=1) ;;
  esac
}
if [[ " ${sequence_arms[*]} " == *" $arm "* ]]; then
  trains_on "$arm"
  learning_rate=0.0004
  case "$arm" in
    seq-word-ffn50) sets+=(--set 'pruning.ffn_schedule_steps={60: 0.25, 120: 0.5}') ;;
    seq-word-ffn75) sets+=(--set 'pruning.ffn_schedule_steps={60: 0.25, 120: 0.5, 180: 0.75}') ;;
  esac
else
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
    scratch) from=${SCRATCH_FROM:-seq-word}
             [[ "$from" =~ ^($sequence_pattern)(-lr[0-9]+(\.[0-9]+)?(e-?[0-9]+)?)?$ ]] ||
               fail "SCRATCH_FROM '$from' is not a kept run of a sequence-level study arm ($sequence_list, each possibly at a learning rate: word-lr8e-4)"
             from_arm=${BASH_REMATCH[1]}
             from_scratch "$from"
             sets+=(--set 'pruning.ffn_schedule_steps={}')
             trains_on "$from_arm" ;;
    scratch-distill) from_scratch distill ;;
    *) fail "unknown arm '$arm' (distill, plain, at-once-distill, at-once, scratch-distill, tune-lr1e-4, tune-lr4e-4, tune-alpha0.9, tune-temp1, tune-hidden1, tune-prune-by-90, $sequence_list, scratch)" ;;
  esac
fi
name=$arm
[ "$arm" = scratch ] && name="scratch-of-$from"
if [ -n "${LEARNING_RATE:-}" ]; then
  [[ "$LEARNING_RATE" =~ ^[0-9]+(\.[0-9]+)?(e-?[0-9]+)?$ ]] && awk -v x="$LEARNING_RATE" 'BEGIN { exit !(x > 0) }' ||
    fail "LEARNING_RATE '$LEARNING_RATE' is not a positive number (such as 2e-4)"
  learning_rate=$LEARNING_RATE
  name="$arm-lr$LEARNING_RATE"
fi
sets+=(--set "train.learning_rate=$learning_rate")
if [ -n "${MAX_MINUTES:-}" ]; then
  [[ "$MAX_MINUTES" =~ ^([1-9][0-9]*)$ ]] || fail "MAX_MINUTES '$MAX_MINUTES' is not a positive whole number of minutes"
  sets+=(--set "train.max_minutes=$MAX_MINUTES")
fi
case "${RESUME:-0}" in 0|1) ;; *) fail "RESUME '${RESUME}' is not 0 or 1" ;; esac
out="$runs/$name-s$seed"
resume=(); [ "${RESUME:-0}" = 1 ] && resume=(--resume)
# eval.print_test=false: the run's log and summary print validation only (its test scores are in its files)
.venv/bin/prunetrain recipe wmt-small-deen-compress --set "train.seed=$seed" "${sets[@]}" --set eval.print_test=false \
  --output "$out" "${resume[@]}"
bash scripts/keep_run.sh "$out" "$kept/$name-s$seed"
