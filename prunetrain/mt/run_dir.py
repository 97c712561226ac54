"""Run directories of the recipes: what makes a directory a run, when a run is finished, and when it may be reused.

A run directory holds `recipe.yaml` (`RUN_MARKER`, written when the run starts) and, once every result is written,
`run_complete.json` (`COMPLETE_MARKER`, written last). So a failed or interrupted run never blocks the next one:

- a *finished* run (complete marker) is kept unless `--overwrite` (or continued with `--resume`, a no-op);
- an *unfinished* run with nothing to resume (no `checkpoint-*`, no finished sweep run) is replaced by a re-run;
- an unfinished run with checkpoints is kept for `--resume` (or replaced with `--overwrite`);
- `--resume` refuses a recipe that differs from the stored `recipe.yaml` (naming the keys) and never rewrites it;
- a directory that holds other files (no `recipe.yaml`) is never deleted without `--overwrite`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import yaml

RUN_MARKER = "recipe.yaml"
COMPLETE_MARKER = "run_complete.json"


def is_complete(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a finished run (its `COMPLETE_MARKER` was written)."""
    return (Path(out_dir) / COMPLETE_MARKER).is_file()


def resumable_parts(out_dir: str | Path) -> list[Path]:
    """What an unfinished run leaves that `--resume` can continue from: Trainer checkpoints and finished sweep runs."""
    out_dir = Path(out_dir)
    return sorted(out_dir.glob("checkpoint-*")) + sorted(out_dir.glob("runs/*/result.json"))


def flatten(data: dict, prefix: str = "") -> dict[str, object]:
    """`{"train": {"epochs": 3}}` → `{"train.epochs": 3}` (recipe keys as `--set` spells them)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def recipe_differences(stored: dict, wanted: dict) -> list[str]:
    """Recipe keys (`section.key`) whose values differ between two recipe mappings, sorted."""
    a, b = flatten(stored), flatten(wanted)
    return sorted(key for key in a.keys() | b.keys() if a.get(key, "<absent>") != b.get(key, "<absent>"))


def stored_recipe(out_dir: str | Path, argument: str = "--resume") -> dict:
    """The raw mapping of `out_dir/recipe.yaml` (ValueError naming `argument` and the file if it is not a YAML
    mapping)."""
    path = Path(out_dir) / RUN_MARKER
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{argument}: {str(path)!r} is not valid YAML ({err.__class__.__name__}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"{argument}: {str(path)!r} does not hold a recipe mapping.")
    return data


def prepare_output_dir(out_dir: str | Path, recipe, *, resume: bool, overwrite: bool,
                       progress: Callable[[str], None] = print) -> None:
    """Check that `out_dir` may take a run of `recipe` and make it ready; call it only once everything else is valid.

    Args:
        out_dir: the run directory.
        recipe: the validated recipe (a dataclass with `to_dict`), written to `recipe.yaml` unless resuming.
        resume: continue the unfinished run in `out_dir` (its stored recipe must equal `recipe`).
        overwrite: delete whatever `out_dir` holds first.
        progress: receives one line when an unfinished run is replaced.
    """
    from prunetrain.mt.recipe import recipe_to_yaml

    out_dir = Path(out_dir)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite: choose one (resume continues the run, overwrite deletes it).")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--output: {str(out_dir)!r} is a file, not a run directory.")
    holds_files = out_dir.is_dir() and any(out_dir.iterdir())
    holds_run = (out_dir / RUN_MARKER).is_file()
    if resume:
        if not holds_run:
            raise ValueError(f"--resume: {str(out_dir)!r} holds no run to resume (no {RUN_MARKER}).")
        differing = recipe_differences(stored_recipe(out_dir), recipe.to_dict())
        if differing:
            raise ValueError(f"--resume: the recipe differs from the one {str(out_dir)!r} was started with in "
                             f"{', '.join(differing)}; resume with the same recipe, or use --overwrite or another "
                             f"--output.")
        (out_dir / COMPLETE_MARKER).unlink(missing_ok=True)  # finished again only when the resumed run finishes
        return  # recipe.yaml is the run's record: never rewritten
    if holds_files and not overwrite:
        if not holds_run:
            raise ValueError(f"--output: {str(out_dir)!r} is not empty and holds no prunetrain run; pass --overwrite "
                             f"to delete it or choose another --output.")
        if is_complete(out_dir):
            raise ValueError(f"--output: {str(out_dir)!r} already holds a finished run; pass --overwrite to replace "
                             f"it or choose another --output.")
        parts = resumable_parts(out_dir)
        if parts:
            raise ValueError(f"--output: {str(out_dir)!r} holds an unfinished run with {parts[-1].relative_to(out_dir)}"
                             f"; pass --resume to continue it or --overwrite to replace it.")
        progress(f"output: {out_dir} holds an unfinished run with nothing to resume; replacing it")
        overwrite = True
    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RUN_MARKER).write_text(recipe_to_yaml(recipe), encoding="utf-8")


def mark_complete(out_dir: str | Path, summary: dict | None = None) -> Path:
    """Write `COMPLETE_MARKER` (last, after every result): the run in `out_dir` is finished."""
    path = Path(out_dir) / COMPLETE_MARKER
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               **(summary or {})}, indent=1))
    tmp.replace(path)
    return path
