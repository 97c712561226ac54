#!/usr/bin/env bash
# Does pruning during training pay? One run of the study in recipes/wmt-small-deen.md ("The payoff study"): every arm
# is the main recipe (`prunetrain recipe wmt-small-deen`, one FLOP budget: train.max_flops) with the settings below.
#
#   bash scripts/payoff_study.sh ARM SEED        e.g. bash scripts/payoff_study.sh off 1
#
# The run directory is checkpoints/STUDY/ARM-sSEED (git-ignored; STUDY below, default study); what the comparison
# needs (results.json, report.md, test_translations.json, final_translations/ with the validation and every test set's
# translations, the final layout) is copied to recipes/results/wmt-small-deen-STUDY/ARM-sSEED when the run is
# complete; the final model stays in the run directory (git-ignored). Run one at a time on a quiet machine (timings
# are recorded).
# Arms:
#   early                the main recipe's schedule, the default since the selection chose it on validation
#                        (2026-11-27): 25/50/62.5/75 % of the heads masked at steps 200/300/400/500, shrinks at
#                        300/500, 36 of 144 heads (the gradual schedule two to five times earlier)
#   small-steps          the default from 2026-11-24 to 2026-11-27 (chosen then on the test set): 12.5 % of the heads
#                        masked every 100 steps from step 300 to 800, shrinks at 400/600/800
#   shrink-each          the small-steps schedule with each step's heads removed at once (shrinks at every pruning
#                        step, 300 to 800): no masked stretch, every step after a pruning step is cheaper
#   gradual              the previous default: 25/50/62.5/75 % masked at steps 400/600/800/1000, shrinks at 600/1000
#   off                  pruning off: the full model
#   scratch              the gradual run's final architecture (same seed), freshly initialised, trained from scratch
#   random-init          36 heads chosen at random at initialisation, trained from scratch
#   prune-then-finetune  the full model until step 1200, then 75 % of the heads pruned by importance at once and
#                        removed; fine-tuned for the rest of the budget
#   l0                   Hard-Concrete gates with a 36-head budget from step 600, shrunk at the end (Voita §6)
#   late                 later (800/1000/1200/1400)
#   per-kind             the gradual schedule with Voita's order: 6 encoder-self, 12 decoder-self, 18 cross heads kept
# The fast model's arms (recipe wmt-small-deen-fast, heads and FFN neurons; fixed before any run with the rule that
# chooses among them in recipes/wmt-small-deen-fast.md; scripts/fast_study.sh runs them):
#   fast-h36-f50-early   75 % of the heads and 50 % of the FFN neurons masked at steps 100/200/300 (heads 25/50/75 %,
#                        neurons 25/50 %), shrinks at 200/300 (the recipe's placeholder default before the selection)
#   fast-h36-f75-early   the same with 75 % of the FFN neurons (25/50/75 % at 100/200/300)
#   fast-f50-early       50 % of the FFN neurons only (25/50 % at 100/200, shrink at 200), every head kept
#   fast-h36-f50         the main recipe's timing: heads 25/50/62.5/75 % at 200/300/400/500, neurons 25/50 % at
#                        200/300, shrinks at 300/500 (chosen by the selection on 2026-11-29: the recipe's default)
#   fast-h36-f75         the same with neurons 25/50/75 % at 200/300/400
#   fast-f50             neurons only, 25/50 % at 200/300, shrink at 300
#   fast-h36-f50-served  fast-h36-f50 in the layout the hardware and CTranslate2 run fastest (added 2026-12-01, after
#                        the proof's arm was fixed; not one of the selection's arms): every FFN width a multiple of
#                        64 (pruning.ffn_multiple_of) and one head count per stack (pruning.same_heads_per_stack)
# Every fast arm states its whole schedule, so that a change of the recipe's default changes none of them.
# SCRATCH_FROM (default gradual) names the arm whose final architecture the scratch arm trains; another arm than
# gradual is kept as scratch-of-ARM-sSEED (SCRATCH_FROM=early: the default's architecture from scratch).
# COOLDOWN=SHARE runs the arm with the learning-rate cooldown over the last SHARE of the FLOP budget (`train.cooldown`;
# the recipe's default since 2026-11-25 is 0.2, so `COOLDOWN=0.2 ... early` is the main recipe as it is); the run
# is kept as ARM-cooldown-sSEED, and with SCRATCH_FROM the architecture comes from SCRATCH_FROM-cooldown-sSEED. Without
# COOLDOWN (or with COOLDOWN=0, 0.0, ...) the arm runs with train.cooldown=0, as every arm before the cooldown existed
# (ARM-sSEED).
# TIME_MINUTES=M defines the run by M minutes of training time instead of the FLOP budget (equal wall-clock:
# train.max_flops=0, train.max_train_minutes=M, test BLEU at the same shares of it, the cooldown over its last share,
# the wall-time guard train.max_minutes at 3·M + 30); kept as ARM[-cooldown]-timeMmin-sSEED, and a scratch arm takes
# its architecture from the same kind of run. Run each alone on the machine: its length is the machine's speed.
# PRECISION=bf16|fp32|measure sets train.precision (default the recipe's auto: bf16 autocast where the hardware has
# it); another than auto is kept as ARM[-cooldown][-timeMmin]-PRECISION-sSEED (an equal-time run on a machine where
# fp32 steps faster than bf16: PRECISION=measure; the run records what it measured and chose).
# MAX_MINUTES=M sets a wall-time guard (train.max_minutes; the recipes have none): a slower machine needs a longer
# one to finish a run, which a guard that fires would cut (a resume may change it).
# RESUME=1 continues an interrupted run of the arm (`prunetrain recipe --resume`; its minutes then count only the
# resumed part).
# REGENERATE=1 trains a kept run again for its model (checkpoints/ is not kept, the repository keeps only results): the
# run is not kept a second time; scripts/same_run.py checks instead that it is the kept run (steps, FLOPs, layout and
# every final translation equal) and the script fails (exit 2) when it is not. REGENERATE=lean does so without the
# measurements the kept run already recorded and that leave training untouched (pruned-BLEU curves, test BLEU during
# training, the benchmark: each restores the training RNG): a starting model's training steps alone took 11.5 of its
# 20.0 min on a 2-core AMD EPYC.
# STUDY=NAME (default study) puts the run in checkpoints/NAME/ and keeps it in recipes/results/wmt-small-deen-NAME/
# (a scratch arm reads its architecture from there too): a new study's runs never meet an earlier one's of the same
# name (scripts/proof_study.sh: STUDY=proof).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/study_args.sh payoff_study.sh "$@"
cooldown=${COOLDOWN:-0}
[[ "$cooldown" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] ||
  fail "COOLDOWN '$cooldown' is not a share of the FLOP budget (a number such as 0.2, or 0 for none)"
suffix=; [[ "$cooldown" =~ ^0*\.?0*$ ]] || suffix=-cooldown  # any way of writing 0 is no cooldown
budget=()
if [ -n "${TIME_MINUTES:-}" ]; then
  [[ "$TIME_MINUTES" =~ ^([1-9][0-9]*)$ ]] || fail "TIME_MINUTES '$TIME_MINUTES' is not a positive whole number of minutes"
  budget=(--set train.max_flops=0 --set "train.max_train_minutes=$TIME_MINUTES" --set 'eval.test_flops=[]'
          --set 'eval.test_times=[0.2, 0.4, 0.6, 0.8, 0.9]' --set "train.max_minutes=$((3 * TIME_MINUTES + 30))")
  suffix="$suffix-time${TIME_MINUTES}min"
fi
precision=${PRECISION:-auto}
case "$precision" in
  auto) ;;
  bf16|fp32|measure) budget+=(--set "train.precision=$precision"); suffix="$suffix-$precision" ;;
  *) fail "PRECISION '$precision' is not one of auto, bf16, fp32, measure" ;;
esac
if [ -n "${MAX_MINUTES:-}" ]; then
  [[ "$MAX_MINUTES" =~ ^([1-9][0-9]*)$ ]] || fail "MAX_MINUTES '$MAX_MINUTES' is not a positive whole number of minutes"
  budget+=(--set "train.max_minutes=$MAX_MINUTES")
fi
case "${RESUME:-0}" in 0|1) ;; *) fail "RESUME '${RESUME}' is not 0 or 1" ;; esac
case "${REGENERATE:-0}" in
  0|1) ;;
  lean) budget+=(--set 'pruning.curve_steps=[]' --set 'eval.test_flops=[]' --set 'eval.test_times=[]'
                 --set eval.bench=false) ;;
  *) fail "REGENERATE '${REGENERATE}' is not 0, 1 or lean" ;;
esac
study=${STUDY:-study}
[[ "$study" =~ ^[a-z0-9][a-z0-9-]*$ ]] || fail "STUDY '$study' is not a name of lower-case letters, digits and -"
kept=recipes/results/wmt-small-deen-$study
off=(--set 'pruning.schedule_steps={}' --set 'pruning.shrink_steps=[]')
small_steps=(--set 'pruning.schedule_steps={300: 0.125, 400: 0.25, 500: 0.375, 600: 0.5, 700: 0.625, 800: 0.75}'
             --set 'pruning.shrink_steps=[400, 600, 800]')
gradual=(--set 'pruning.schedule_steps={400: 0.25, 600: 0.5, 800: 0.625, 1000: 0.75}' --set 'pruning.shrink_steps=[600, 1000]')
recipe=wmt-small-deen
heads_default=(--set 'pruning.schedule_steps={200: 0.25, 300: 0.5, 400: 0.625, 500: 0.75}')
heads_early=(--set 'pruning.schedule_steps={100: 0.25, 200: 0.5, 300: 0.75}')
no_heads=(--set 'pruning.schedule_steps={}')
case "$arm" in  # the fast arms, and the architecture of one trained from scratch, run the fast recipe
  fast-*) recipe=wmt-small-deen-fast ;;
  scratch) [[ "${SCRATCH_FROM:-}" == fast-* ]] && recipe=wmt-small-deen-fast
           off+=(--set 'pruning.ffn_schedule_steps={}') ;;
esac
case "$arm" in
  fast-h36-f50-early) sets=("${heads_early[@]}" --set 'pruning.ffn_schedule_steps={100: 0.25, 200: 0.5}'
                            --set 'pruning.shrink_steps=[200, 300]') ;;
  fast-h36-f75-early) sets=("${heads_early[@]}" --set 'pruning.ffn_schedule_steps={100: 0.25, 200: 0.5, 300: 0.75}'
                            --set 'pruning.shrink_steps=[200, 300]') ;;
  fast-f50-early) sets=("${no_heads[@]}" --set 'pruning.ffn_schedule_steps={100: 0.25, 200: 0.5}'
                        --set 'pruning.shrink_steps=[200]') ;;
  fast-h36-f50) sets=("${heads_default[@]}" --set 'pruning.ffn_schedule_steps={200: 0.25, 300: 0.5}'
                      --set 'pruning.shrink_steps=[300, 500]') ;;
  fast-h36-f50-served) sets=("${heads_default[@]}" --set 'pruning.ffn_schedule_steps={200: 0.25, 300: 0.5}'
                             --set 'pruning.shrink_steps=[300, 500]' --set pruning.ffn_multiple_of=64
                             --set pruning.same_heads_per_stack=true) ;;
  fast-h36-f75) sets=("${heads_default[@]}" --set 'pruning.ffn_schedule_steps={200: 0.25, 300: 0.5, 400: 0.75}'
                      --set 'pruning.shrink_steps=[300, 500]') ;;
  fast-f50) sets=("${no_heads[@]}" --set 'pruning.ffn_schedule_steps={200: 0.25, 300: 0.5}'
                  --set 'pruning.shrink_steps=[300]') ;;
  early) sets=() ;;
  small-steps) sets=("${small_steps[@]}") ;;
  shrink-each) sets=("${small_steps[@]}" --set 'pruning.shrink_steps=[300, 400, 500, 600, 700, 800]') ;;
  gradual) sets=("${gradual[@]}") ;;
  off) sets=("${off[@]}") ;;
  scratch) sets=("${off[@]}" --set
                 "pruning.init_layout=$kept/${SCRATCH_FROM:-gradual}$suffix-s$seed/layout.json") ;;
  random-init) sets=("${off[@]}" --set pruning.init_heads=36) ;;
  prune-then-finetune) sets=(--set 'pruning.schedule_steps={1200: 0.75}' --set 'pruning.shrink_steps=[1200]') ;;
  l0) sets=(--set pruning.method=l0) ;;
  late) sets=(--set 'pruning.schedule_steps={800: 0.25, 1000: 0.5, 1200: 0.625, 1400: 0.75}'
              --set 'pruning.shrink_steps=[1000, 1400]') ;;
  per-kind) sets=("${gradual[@]}" --set pruning.scope=kind
                  --set 'pruning.kept_per_kind={encoder_self: 6, decoder_self: 12, cross: 18}') ;;
  *) echo "payoff_study.sh: unknown arm '$arm'" >&2; exit 2 ;;
esac
name=$arm
[ "$arm" = scratch ] && [ "${SCRATCH_FROM:-gradual}" != gradual ] && name="scratch-of-$SCRATCH_FROM"
sets+=(--set "train.cooldown=$cooldown" "${budget[@]}"); name="$name$suffix"
out="checkpoints/$study/$name-s$seed"
resume=(); [ "${RESUME:-0}" = 1 ] && resume=(--resume)
# eval.print_test=false: the run's log and summary print validation only (its test scores are in its files)
.venv/bin/prunetrain recipe "$recipe" --set "train.seed=$seed" "${sets[@]}" --set eval.print_test=false \
  --output "$out" "${resume[@]}"
if [ "${REGENERATE:-0}" != 0 ]; then
  .venv/bin/python scripts/same_run.py "$out" "$kept/$name-s$seed"
else
  bash scripts/keep_run.sh "$out" "$kept/$name-s$seed"
fi
