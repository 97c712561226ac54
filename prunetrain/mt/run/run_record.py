"""Run records that cannot lie: the recipe records the data directory the run reads, and the run directory records
what it read, so a resume trains on the same data or is refused.

- `with_data_dir(recipe, data_dir)`: `--data-dir` is an override of `data.dir` (so `recipe.yaml` and `results.json`
  name the directory that was read); a different `data.dir` given as well is refused.
- `data_record(recipe, pairs)`: where the data came from (the resolved directory or dataset) and, per split, the
  number of pairs and a sha256 of exactly the text read (after `data.train_limit`), written as `data_record.json`
  when a run starts; `check_data_record` refuses a resume whose data differs from it, naming the split.
- `recipe_inputs(recipe)`: what a run reads (data directory, `pruning.init_layout`, a sweep's `source`), so the run
  directory is never one of them, inside one, or holding one (`prunetrain.utils.output_paths`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

DATA_RECORD = "data_record.json"
SPLITS = ("train", "valid", "test")


def data_dir_of(recipe) -> Path | None:
    """The directory a recipe's data is read from: `data.dir`, else where `prunetrain.mt.text.corpus.multi30k_dir`
    finds Multi30k (`$PRUNETRAIN_DATA` or the shared copy, else the download cache; nothing is fetched here);
    None for a Hugging Face dataset."""
    from prunetrain.mt.text.corpus import multi30k_cache_dir
    from prunetrain.mt.text.data import DATA_ENV, default_data_dir

    if recipe.data.hf_dataset:
        return None
    if recipe.data.dir:
        return Path(recipe.data.dir)
    local = default_data_dir() / "multi30k"
    return local if os.environ.get(DATA_ENV) or local.is_dir() else multi30k_cache_dir()


def local_train_pairs(recipe) -> int | None:
    """How many training pairs a run of `recipe` will read, counted from the local files without reading them
    as text (None when the data is remote or missing: the run reports that itself)."""
    directory = data_dir_of(recipe)
    path = directory / f"train.{recipe.data.src}" if directory is not None else None
    if path is None or not path.is_file():
        return None
    data = path.read_bytes()
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return min(lines, recipe.data.train_limit) if recipe.data.train_limit else lines


def with_data_dir(recipe, data_dir: str | os.PathLike | None):
    """`recipe` with `data.dir` set to `data_dir` (the CLI's `--data-dir`), so the run records what it reads.

    Raises:
        ValueError: the recipe names another `data.dir` (two directories for one run).
    """
    if data_dir is None:
        return recipe
    given = recipe.data.dir
    if given and os.path.realpath(given) != os.path.realpath(os.fspath(data_dir)):
        raise ValueError(f"--data-dir: {str(data_dir)!r} differs from the recipe's data.dir {given!r}; give the "
                         f"data directory once (--data-dir or --set data.dir=...).")
    return dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, dir=os.fspath(data_dir)))


def recipe_inputs(recipe) -> dict[str, Path | None]:
    """{recipe key: path} of everything a recipe's run reads from disk."""
    inputs: dict[str, Path | None] = {"data.dir": data_dir_of(recipe)}
    init_layout = getattr(getattr(recipe, "pruning", None), "init_layout", "")
    if init_layout:
        inputs["pruning.init_layout"] = Path(init_layout)
    for key in ("model.init_from", "distill.teacher"):  # a trained model the run starts from or distils from
        section, name = key.split(".")
        path = getattr(getattr(recipe, section, None), name, "")
        if path:
            inputs[key] = Path(path)
    if getattr(recipe, "source", ""):
        inputs["source"] = Path(recipe.source)
    return inputs


def _digest(pairs) -> str:
    sha = hashlib.sha256()
    for source, target in pairs:
        sha.update(source.encode("utf-8"))
        sha.update(b"\t")
        sha.update(target.encode("utf-8"))
        sha.update(b"\n")
    return sha.hexdigest()


def data_record(recipe, pairs) -> dict:
    """What a run reads: the data source and, per split, the pairs read and the sha256 of their text.

    Args:
        recipe: the recipe (its `data` section, with `data.dir` as the run reads it).
        pairs: (train, valid, test) pairs, as the run read them, optionally followed by {split: pairs} of the
            more test sets (`eval.more_test_splits`).
    """
    d = recipe.data
    where = data_dir_of(recipe)
    source = {"hf_dataset": d.hf_dataset} if where is None else {"dir": str(where.resolve())}
    splits = dict(zip(SPLITS, pairs[:3]), **(pairs[3] if len(pairs) > 3 else {}))
    return {**source, "src": d.src, "tgt": d.tgt, "test_split": d.test_split, "train_limit": d.train_limit,
            "splits": {name: {"pairs": len(split), "sha256": _digest(split)} for name, split in splits.items()}}


def write_data_record(out_dir: str | os.PathLike, record: dict) -> None:
    from prunetrain.utils.output_paths import write_file

    write_file(Path(out_dir) / DATA_RECORD, json.dumps(record, indent=1))


def check_data_record(out_dir: str | os.PathLike, record: dict) -> str | None:
    """Refuse a resume whose data differs from what the run started with (ValueError naming the split); returns a
    warning line when the run directory has no record (a run started before records existed), else None."""
    from prunetrain.utils.files import read_json

    path = Path(out_dir) / DATA_RECORD
    if not path.exists():
        return f"--resume: {str(out_dir)!r} has no {DATA_RECORD} (an older run); its data cannot be checked"
    stored = read_json(path, "--resume")
    stored_splits = stored.get("splits") if isinstance(stored.get("splits"), dict) else {}
    for name, now in record["splits"].items():
        before = stored_splits.get(name)
        if before != now:
            what = ("not read when the run started" if before is None else
                    f"{before.get('pairs')} pairs then, {now['pairs']} now" if isinstance(before, dict)
                    and before.get("pairs") != now["pairs"] else "the same number of pairs but other text")
            source = record.get("dir") or record.get("hf_dataset")
            raise ValueError(f"--resume: the {name} data read now ({source}) differs from what the run in "
                             f"{str(out_dir)!r} started with ({what}, recorded in {DATA_RECORD}); resume with the "
                             f"same data, or use --overwrite or another --output.")
    return None


__all__ = ["DATA_RECORD", "check_data_record", "data_dir_of", "data_record", "local_train_pairs", "recipe_inputs", "with_data_dir",
           "write_data_record"]
