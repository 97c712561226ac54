# Sourced by the scripts that run a study's arms one after the other (selection_study.sh, proof_study.sh), each run
# through scripts/payoff_study.sh, so that they can be stopped and started again across days:
#
#   source scripts/study_runs.sh STUDY [SCRIPT]   runs in checkpoints/STUDY/, kept in recipes/results/wmt-small-deen-STUDY/,
#                                                 each made by scripts/SCRIPT (default payoff_study.sh; or compress_study.sh)
#   run_arm NAME ARM SEED [VAR=VALUE ...]         NAME as SCRIPT names the run (ARM[-cooldown][-timeMmin]...);
#                                                 the VARs (COOLDOWN, TIME_MINUTES, START, ...) go to SCRIPT
#   compare_arms OUT "SEED ..." [options] -- NAME...
#                                                 `prunetrain compare` over the kept runs NAME-sSEED (every name with
#                                                 every seed, in that order; the first name is the reference) into
#                                                 checkpoints/STUDY/OUT (an older one is moved aside with its date)
#   compare_runs OUT NAMES [options] -- DIR...    `prunetrain compare` over the runs kept in DIR... (NAMES: one per
#                                                 DIR, comma-separated) into OUT (an older one moved aside likewise)
#   stop_before WHAT [FILE...]                    exits (0) when a stop file (default: the study's, see also_stop) is
#                                                 there, removing every FILE and saying that it stopped before WHAT
#   resume_of DIR                                 1 when the run directory DIR holds a checkpoint to resume from, else 0
#
# run_arm skips a run kept already, keeps one that finished but was not kept, resumes (RESUME=1) one that holds a
# checkpoint, starts one that stopped before its first checkpoint again (the recipe replaces it), and exits (0) before
# starting a run when checkpoints/STUDY/STOP is there (the file is removed when seen). MAX_MINUTES (default 150) is
# every run's wall-time guard. A timed run (TIME_MINUTES) shares its study's machine: run_arm refuses (exit 2) to
# start one on another machine than the kept timed runs' (`results.json` `machine`: CPU model, cores, native bf16/AMX,
# GPU; and, since 2026-12-01, the CPU's family, model and stepping), and, where the caller set speed_reference (a
# `benchmarks/profile_recipe_step.py` JSON made on the kept runs' machine), to start the first timed run of an
# invocation on a machine whose full-model bf16 step differs from it by more than SPEED_TOLERANCE (default 1.25×;
# scripts/same_speed.py; SPEED_MEASURED=FILE uses a measurement made already). The study's FLOP-budget runs may come
# from any machine (a run trained again on another CPU type is the kept run bit for bit: scripts/same_run.py).
study=$1
arm_script=${2:-payoff_study.sh}
kept=recipes/results/wmt-small-deen-$study
# the stop files: the study's, and those of other studies the caller runs in turn (an array also_stop set before
# sourcing, e.g. seqkd_study.sh's starting models): any of them stops before the next run, and one stop uses up all
stops=("checkpoints/$study/STOP" ${also_stop[@]+"${also_stop[@]}"})

run_arm() {
  local name=$1 arm=$2 seed=$3
  shift 3
  if [ -f "$kept/$name-s$seed/results.json" ]; then
    echo "$study: $name-s$seed is kept already"
    return
  fi
  stop_before "$name-s$seed"
  if [[ " $* " == *" TIME_MINUTES="* ]]; then same_machine; same_speed; fi
  local out=checkpoints/$study/$name-s$seed
  if [ -f "$out/run_complete.json" ]; then  # finished, but not kept
    bash scripts/keep_run.sh "$out" "$kept/$name-s$seed"
    return
  fi
  local resume
  resume=$(resume_of "$out")
  echo "$study: $name-s$seed (resume=$resume) from $(date -u +%FT%TZ)"
  env "$@" STUDY="$study" MAX_MINUTES="${MAX_MINUTES:-150}" RESUME=$resume bash "scripts/$arm_script" "$arm" "$seed"
}

stop_before() {
  local what=$1 file
  shift
  local files=("$@")
  [ $# -gt 0 ] || files=("${stops[@]}")
  for file in "${files[@]}"; do
    if [ -e "$file" ]; then
      rm -f "${files[@]}"  # every stop file of the study is used up by one stop
      echo "$study: stopped before $what ($file was there)"
      exit 0
    fi
  done
}

resume_of() {
  if compgen -G "$1/checkpoint-*" > /dev/null; then echo 1; else echo 0; fi
}

same_machine() {
  .venv/bin/python - "$kept" <<'PY' || exit 2
import json, sys
from pathlib import Path
from prunetrain.bench.environment import machine
here = machine()
for results in sorted(Path(sys.argv[1]).glob("*/results.json")):
    run = json.loads(results.read_text())
    if not run.get("max_train_seconds"):  # a FLOP-budget run: its result does not depend on the machine
        continue
    there = run.get("machine")  # an older record lacks the CPU's generation: what it names must match
    if there is not None and any(there[key] != here.get(key) for key in there):
        sys.exit(f"{results.parent} ran on {there}, this machine is {here}: a study's timed runs share one machine; "
                 f"finish it on that machine or move {sys.argv[1]} aside to start it again here.")
PY
}

same_speed() {  # once per invocation, before its first timed run: this machine's step against the study's reference
  [ -n "${speed_reference:-}" ] && [ -z "${speed_checked:-}" ] || return 0
  local measured=${SPEED_MEASURED:-}
  if [ -z "$measured" ]; then
    mkdir -p "checkpoints/$study"
    measured=checkpoints/$study/speed-$(date -u +%Y%m%dT%H%M%S).json
    echo "$study: timing the full model's bf16 step against $speed_reference (about a minute)"
    .venv/bin/python benchmarks/profile_recipe_step.py --threads 2 --precisions bf16 --arms 144 \
      --variants fused+fused --repeats 3 --out "$measured" > /dev/null || exit 2
  fi
  .venv/bin/python scripts/same_speed.py "$speed_reference" "$measured" --tolerance "${SPEED_TOLERANCE:-1.25}" \
    || exit 2
  speed_checked=1
}

compare_arms() {
  local out=checkpoints/$study/$1 seeds=$2
  shift 2
  local options=()
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  local dirs=() names=() name seed
  for name in "$@"; do
    for seed in $seeds; do dirs+=("$kept/$name-s$seed"); names+=("$name"); done
  done
  compare_runs "$out" "$(IFS=,; echo "${names[*]}")" "${options[@]}" -- "${dirs[@]}"
}

compare_runs() {
  local out=$1 names=$2
  shift 2
  local options=()
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  [ -e "$out" ] && mv "$out" "$out-$(date -u +%Y%m%dT%H%M%S)"
  .venv/bin/prunetrain compare "$@" --names "$names" "${options[@]}" --output "$out"
}
