"""Is a regenerated run the run a study kept? (scripts/payoff_study.sh REGENERATE=1, scripts/seqkd_study.sh)

    .venv/bin/python scripts/same_run.py RUN_DIR KEEP_DIR

A study keeps a run's results in the repository but not its model (checkpoints/ is git-ignored and may be gone in a
later session). When a later arm needs that model, the study trains the run again with the same recipe and seed and
uses the new model only if it is the kept one in behaviour: the same number of steps and training FLOPs, the same final
head (and neuron) layout, and word-for-word the same final translations of the validation set and of every test set
the kept run translated. Exit 0 with one line when it is; otherwise exit 2 with one line naming what differs (no
score is printed: the check compares translations, it does not read them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def kept_splits(kept: Path) -> list[str]:
    """The splits whose final translations the run kept in ``kept`` recorded (file names, sorted)."""
    return sorted(path.name for path in (kept / "final_translations").glob("*.json"))


def differences(run: Path, kept: Path, splits: list[str]) -> list[str]:
    """What differs between the finished run in ``run`` and the run kept in ``kept`` (empty: the same run), comparing
    the final translations of ``splits`` (``kept_splits(kept)``)."""
    found = []
    ran, keeps = _json(run / "results.json"), _json(kept / "results.json")
    for key in ("steps", "train_flops", "heads_kept", "parameters_final"):
        if ran.get(key) != keeps.get(key):
            found.append(f"results.json '{key}' is {ran.get(key)!r}, the kept run's is {keeps.get(key)!r}")
    layout = next((run / model / "prunetrain_layout.json" for model in ("pruned", "full")
                   if (run / model / "prunetrain_layout.json").is_file()), None)
    if (kept / "layout.json").is_file() and (layout is None or _json(layout) != _json(kept / "layout.json")):
        found.append("the final layout differs from the kept layout.json")
    if not splits:
        found.append(f"{kept}/final_translations holds no translations to compare")
    for split in splits:
        mine = run / "final_translations" / split
        if not mine.is_file():
            found.append(f"{mine} is missing")
            continue
        new, old = _json(mine)["hypotheses"], _json(kept / "final_translations" / split)["hypotheses"]
        if len(new) != len(old):
            found.append(f"{split}: {len(new)} translations, the kept run has {len(old)}")
        elif new != old:
            found.append(f"{split}: {sum(a != b for a, b in zip(new, old))} of {len(old)} translations differ")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"same_run.py: usage: same_run.py RUN_DIR KEEP_DIR (got {len(argv)} arguments)", file=sys.stderr)
        return 2
    run, kept = Path(argv[0]), Path(argv[1])
    for name, path in (("RUN_DIR", run), ("KEEP_DIR", kept)):
        if not (path / "results.json").is_file():
            print(f"same_run.py: {name} '{path}' holds no results.json", file=sys.stderr)
            return 2
    splits = kept_splits(kept)
    found = differences(run, kept, splits)
    if found:
        print(f"same_run.py: {run} is not the run kept in {kept}: " + "; ".join(found), file=sys.stderr)
        return 2
    print(f"same_run.py: {run} is the run kept in {kept} (steps, FLOPs, layout and {len(splits)} splits' "
          "translations equal)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
