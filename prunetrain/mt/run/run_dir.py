"""Run directories of the recipes: what makes a directory a run, when a run is finished, and when it may be reused.

A run directory holds prunetrain's marker (`.prunetrain-output.json`, kind "recipe-run": what makes it a run
prunetrain may replace, `prunetrain.utils.output_paths`), `recipe.yaml` (`RUN_MARKER`, written when the run starts)
and, once every result is written, `run_complete.json` (`COMPLETE_MARKER`, written last). So a failed or
interrupted run never blocks the next one, and nothing finished is lost:

- a *finished* run (complete marker) is kept unless `--overwrite`; `--resume` refuses it (there is nothing to
  resume, and its results stay as they were written);
- an *unfinished* run with nothing to resume (no `checkpoint-*`, no finished sweep run) is replaced by a re-run;
- an unfinished run with checkpoints is kept for `--resume` (or replaced with `--overwrite`);
- `--overwrite` replaces a run only once the new one is complete: everything the run reads is checked first (the
  recipe, the data, the starting model's and the teacher's weights loaded and finite: `prunetrain.mt.run.runner`),
  then the old run is moved whole beside the directory (`.NAME.previous-*`) and the new run written in its place;
  the old one is deleted when the new one writes `run_complete.json` (`mark_complete`) and put back when the new
  one ends without finishing (`replaced_run_kept`: an error, a refusal, SIGINT). After a SIGKILL (or a SIGTERM,
  which ends a run at once) the next run on that directory puts it back, or deletes it if the new run had finished
  (`prepare_output_dir`): an `--overwrite` run that never finished never costs the run it was to replace (a
  `--resume` then finds the old run, not the unfinished new one);
- `--resume` refuses a recipe that differs from the stored `recipe.yaml` (naming the keys; keys added to recipes
  since the run started count with their defaults, and the time-cap guard `train.max_minutes` may change: a slower
  machine may need a longer one) and data that differ from the stored `data_record.json`
  (`prunetrain.mt.run.run_record`), and never rewrites either; it continues a run of a prunetrain from before
  markers (and marks it: its stored recipe is this one);
- a directory without the marker is never deleted, not even with `--overwrite` (a user's directory holding a
  `recipe.yaml` included), and the run directory is never one of the run's inputs, inside one or holding one
  (`prunetrain.utils.output_paths`);
- replacing an unfinished run removes the old directory so that it is whole or gone at any signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Mapping

RUN_MARKER = "recipe.yaml"
COMPLETE_MARKER = "run_complete.json"
RUN_KIND = "recipe-run"  # the kind of prunetrain.utils.output_paths' marker a run directory carries
_kept_aside: dict[str, Path] = {}  # run directory (resolved) -> the run --overwrite replaces, kept until complete


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


# keys a resume may change: guards about the machine, not the run (the time cap stops a run gracefully and the
# report says so; a slower machine may need a longer one to finish a run another machine started)
RESUME_MAY_CHANGE = frozenset({"train.max_minutes"})


def recipe_differences(stored: dict, wanted: dict) -> list[str]:
    """Recipe keys (`section.key`) whose values differ between two recipe mappings, sorted."""
    a, b = flatten(stored), flatten(wanted)
    return sorted(key for key in a.keys() | b.keys() if a.get(key, "<absent>") != b.get(key, "<absent>"))


def _with_defaults(stored: dict) -> dict:
    """A stored recipe mapping with the keys added since it was written filled in with their defaults (which is
    what the run was trained with); as stored when it no longer validates (a key since removed or renamed)."""
    from prunetrain.mt.config.recipe import recipe_from_dict

    try:
        return recipe_from_dict(stored).to_dict()
    except (ValueError, TypeError):
        return stored


def stored_recipe(out_dir: str | Path, argument: str = "--resume") -> dict:
    """The raw mapping of `out_dir/recipe.yaml` (ValueError naming `argument` and the file if it is not a YAML
    mapping)."""
    from prunetrain.mt.config.recipe_yaml import load_recipe_mapping
    from prunetrain.utils.files import check_regular_file

    path = check_regular_file(Path(out_dir) / RUN_MARKER, argument)
    return load_recipe_mapping(path.read_bytes(), f"{argument}: {str(path)!r}")


def prepare_output_dir(out_dir: str | Path, recipe, *, resume: bool, overwrite: bool,
                       progress: Callable[[str], None] = print, inputs: Mapping[str, object] | None = None,
                       data: dict | None = None) -> None:
    """Check that `out_dir` may take a run of `recipe` and make it ready; call it only once everything else is valid.

    Args:
        out_dir: the run directory.
        recipe: the validated recipe (a dataclass with `to_dict`), written to `recipe.yaml` unless resuming.
        resume: continue the unfinished run in `out_dir` (its stored recipe, and data, must equal these).
        overwrite: replace the run `out_dir` holds.
        progress: receives one line when an unfinished run is replaced or a resume cannot check its data.
        inputs: {recipe key: path} the run reads (`prunetrain.mt.run.run_record.recipe_inputs`); `out_dir` must not
            be one of them, lie inside one or hold one.
        data: what the run reads (`prunetrain.mt.run.run_record.data_record`), written to `data_record.json` (or, when
            resuming, compared with it).
    """
    from prunetrain.mt.config.recipe import recipe_to_yaml
    from prunetrain.mt.run.run_record import check_data_record, write_data_record
    from prunetrain.utils.output_paths import (MARKER_FILE, check_disjoint, read_marker, recover_set_aside,
                                               remove_directory, replace_refusal, set_aside, write_file, write_marker)

    out_dir = Path(out_dir)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite: choose one (resume continues the run, overwrite deletes it).")
    check_disjoint(out_dir, inputs or {}, flag="--output")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--output: {str(out_dir)!r} is a file, not a run directory.")
    notice = recover_set_aside(out_dir, complete=is_complete(out_dir))  # a replacement killed before it finished
    if notice:
        progress(notice)
    holds_files = out_dir.is_dir() and any(out_dir.iterdir())
    holds_run = (out_dir / RUN_MARKER).is_file()
    if resume:
        _check_resume(out_dir, recipe, holds_run)
        warning = check_data_record(out_dir, data) if data is not None else None
        if warning:
            progress(warning)
        if read_marker(out_dir) is None:  # a run from before markers, its stored recipe this one: marked now
            write_marker(out_dir, RUN_KIND, list_entries=False)
        return  # recipe.yaml and data_record.json are the run's record: never rewritten
    if holds_files and read_marker(out_dir) is None:
        raise ValueError(f"--output: {str(out_dir)!r} is not empty and holds no prunetrain run (no {MARKER_FILE}: "
                         f"prunetrain did not write it, or a version from before run directories were marked did); "
                         f"choose another --output, or remove it yourself if it is yours to delete (--overwrite "
                         f"replaces only run directories prunetrain marked).")
    if holds_files:
        refusal = replace_refusal(out_dir, (RUN_KIND,))
        if refusal is not None:
            raise ValueError(refusal)
    if holds_files and not overwrite:
        if is_complete(out_dir):
            raise ValueError(f"--output: {str(out_dir)!r} already holds a finished run; pass --overwrite to replace "
                             f"it or choose another --output.")
        parts = resumable_parts(out_dir)
        if parts:
            raise ValueError(f"--output: {str(out_dir)!r} holds an unfinished run with {parts[-1].relative_to(out_dir)}"
                             f"; pass --resume to continue it or --overwrite to replace it.")
        progress(f"output: {out_dir} holds an unfinished run with nothing to resume; replacing it")
        remove_directory(out_dir)  # whole or gone at any signal
    elif holds_files:  # --overwrite: the old run kept whole beside it until the new one is complete
        aside = set_aside(out_dir)
        _kept_aside[_key(out_dir)] = aside
        progress(f"output: the run in {out_dir} is kept whole in {aside / 'old'} until the new run is complete")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_marker(out_dir, RUN_KIND, list_entries=False)  # what makes it a run prunetrain may replace
    write_file(out_dir / RUN_MARKER, recipe_to_yaml(recipe))
    if data is not None:
        write_data_record(out_dir, data)


def _key(out_dir: str | Path) -> str:
    return os.path.realpath(os.path.abspath(out_dir))


@contextlib.contextmanager
def replaced_run_kept(out_dir: str | Path, progress: Callable[[str], None] = print):
    """Around a whole run (rank 0, holding the run directory's lock): the run an `--overwrite` set aside is put back
    when the new run ends without `mark_complete` (an error, a refusal, SIGINT), the unfinished new one removed."""
    from prunetrain.utils.output_paths import put_back

    key = _key(out_dir)
    try:
        yield
    finally:
        aside = _kept_aside.pop(key, None)
        if aside is not None:  # mark_complete did not drop it: the new run did not finish
            put_back(aside, out_dir)
            progress(f"output: the new run did not finish; the run it was to replace is back in {out_dir}")


def _check_resume(out_dir: Path, recipe, holds_run: bool) -> None:
    """`--resume` continues an unfinished run of the same recipe, nothing else."""
    if not holds_run:
        raise ValueError(f"--resume: {str(out_dir)!r} holds no run to resume (no {RUN_MARKER}).")
    differing = [key for key in recipe_differences(_with_defaults(stored_recipe(out_dir)), recipe.to_dict())
                 if key not in RESUME_MAY_CHANGE]
    if differing:
        raise ValueError(f"--resume: the recipe differs from the one {str(out_dir)!r} was started with in "
                         f"{', '.join(differing)}; resume with the same recipe, or use --overwrite or another "
                         f"--output.")
    if is_complete(out_dir):
        raise ValueError(f"--resume: {str(out_dir)!r} holds a finished run ({COMPLETE_MARKER}); there is nothing to "
                         f"resume and its results stay as written. Pass --overwrite to run it again, or choose "
                         f"another --output.")


def mark_complete(out_dir: str | Path, summary: dict | None = None) -> Path:
    """Write `COMPLETE_MARKER` (last, after every result): the run in `out_dir` is finished; the run it replaces
    (`--overwrite`), kept until now, is deleted."""
    from prunetrain.utils.output_paths import drop_set_aside, write_file

    written = write_file(Path(out_dir) / COMPLETE_MARKER,
                         json.dumps({"finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     **(summary or {})}, indent=1))
    aside = _kept_aside.pop(_key(out_dir), None)
    if aside is not None:
        drop_set_aside(aside, out_dir)
    return written
