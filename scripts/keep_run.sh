#!/usr/bin/env bash
# Keep what a study's comparison needs of a finished recipe run in the repository (the run directory and its models
# are git-ignored): results.json, report.md, test_translations.json, final_translations/ (the validation and every
# test set's translations: re-scoring or a paired test needs no model) and the final head layout.
#
#   bash scripts/keep_run.sh RUN_DIR KEEP_DIR
#
# KEEP_DIR is marked as prunetrain's (.prunetrain-output.json, kind "kept-run") with the identity of the run it
# keeps: the sha256 of the run's results.json (a run's results.json records its own timings, so two runs never share
# one). An existing non-empty KEEP_DIR is replaced only when it keeps the same run (its marker's identity, or for a
# directory kept before markers its results.json, equals RUN_DIR's) and holds nothing keep_run.sh did not write;
# anything else (another run's kept results, a user's files) is refused in one line (exit 2) and left as it is. The
# new KEEP_DIR is built in a hidden directory beside it and swapped in when complete: the old one stays whole until
# then.
set -euo pipefail
fail() { echo "keep_run.sh: $*" >&2; exit 2; }
[ $# -eq 2 ] || fail "usage: keep_run.sh RUN_DIR KEEP_DIR (got $# arguments)"
out=$1
keep=${2%/}
marker=.prunetrain-output.json
[ -f "$out/run_complete.json" ] || fail "RUN_DIR '$out' holds no finished run"
[ -f "$out/results.json" ] || fail "RUN_DIR '$out' holds no results.json"
identity=$(sha256sum "$out/results.json" | cut -d' ' -f1)
written=(results.json report.md test_translations.json final_translations layout.json "$marker")
parent=$(dirname "$keep")
name=$(basename "$keep")
for leftover in "$parent/.$name".replaced-*/old; do  # a keep killed between its two renames: the old one, whole
  if [ -d "$leftover" ] && [ ! -e "$keep" ]; then mv "$leftover" "$keep"; fi
done
rm -rf "$parent/.$name".replaced-* "$parent/.$name".staging-*  # what a killed keep left
if [ -e "$keep" ] && [ ! -d "$keep" ]; then fail "KEEP_DIR '$keep' is a file, not a directory"; fi
if [ -d "$keep" ] && [ -n "$(ls -A "$keep")" ]; then
  if [ -f "$keep/$marker" ] && [ ! -L "$keep/$marker" ]; then
    grep -q '"kind": "kept-run"' "$keep/$marker" ||
      fail "KEEP_DIR '$keep' holds another kind of prunetrain output ($marker), not a kept run; choose another KEEP_DIR"
    kept=$(sed -n 's/.*"results_sha256": "\([0-9a-f]*\)".*/\1/p' "$keep/$marker")
  elif [ -f "$keep/results.json" ]; then  # kept before markers: the results.json it keeps is the run's identity
    kept=$(sha256sum "$keep/results.json" | cut -d' ' -f1)
  else
    fail "KEEP_DIR '$keep' is not empty and holds no kept run (no $marker, no results.json); remove it yourself if it is yours to delete, or choose another KEEP_DIR"
  fi
  [ "$kept" = "$identity" ] ||
    fail "KEEP_DIR '$keep' keeps another run (its results.json is not $out/results.json); remove it yourself if it is to be replaced, or choose another KEEP_DIR"
  while IFS= read -r entry; do
    [[ " ${written[*]} " == *" $entry "* ]] ||
      fail "KEEP_DIR '$keep' holds '$entry', which keep_run.sh did not write; move it away or choose another KEEP_DIR"
  done < <(ls -A "$keep")
fi
mkdir -p "$parent"
new=$(mktemp -d "$parent/.$name.staging-XXXXXX")
old=
trap 'rm -rf "$new" ${old:+"$old"}' EXIT
chmod "$(printf '%o' $((0777 & ~0$(umask))))" "$new"  # mktemp's directory is private; the kept one is not
cp "$out/results.json" "$out/report.md" "$out/test_translations.json" "$new/"
[ -d "$out/final_translations" ] && cp -r "$out/final_translations" "$new/"
for model in pruned full; do
  [ -f "$out/$model/prunetrain_layout.json" ] && cp "$out/$model/prunetrain_layout.json" "$new/layout.json"
done
source=$(cd "$out" && pwd -P | sed 's/[\\"]/\\&/g')
entries=$(cd "$new" && ls -A | sed 's/.*/"&"/' | paste -sd, - | sed 's/,/, /g')
printf '{"kind": "kept-run", "version": 1, "entries": [%s], "source": "%s", "results_sha256": "%s"}\n' \
  "$entries" "$source" "$identity" > "$new/$marker"
if [ -e "$keep" ]; then  # swapped in whole: the old one renamed aside, the new one into place, the old one removed
  old=$(mktemp -d "$parent/.$name.replaced-XXXXXX")
  mv "$keep" "$old/old"
fi
mv "$new" "$keep"
echo "kept in $keep"
