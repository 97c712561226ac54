# Sourced by the study scripts (payoff_study.sh, compress_study.sh): checks their two arguments, ARM and SEED, and
# sets `arm`, `seed` and `fail` (a one-line error naming the script, exit code 2).
#
#   source scripts/study_args.sh SCRIPT_NAME "$@"
study_script=$1
shift
fail() { echo "$study_script: $*" >&2; exit 2; }
[ $# -eq 2 ] || fail "usage: $study_script ARM SEED (got $# arguments: $*)"
arm=$1
seed=$2
[[ "$seed" =~ ^(0|[1-9][0-9]*)$ ]] || fail "SEED '$seed' is not a non-negative integer (written without leading zeros)"
