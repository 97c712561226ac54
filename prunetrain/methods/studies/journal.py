"""The resumable record of a study's units of work: `Journal` (`<name>.partial.json` while the study runs,
`<name>.json` when it is finished, both tagged with the study's arguments) and the atomic JSON write it uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn

from prunetrain.engine.heads import find_heads
from prunetrain.utils.files import read_json

AfterUnit = Callable[[str, Any], None]
"""`after_unit(unit, value)`: called after each unit of a study is saved."""


class Journal:
    """Units of a study's work saved as they finish (`<out_dir>/<name>.partial.json`), and the finished result
    (`<out_dir>/<name>.json`), both tagged with the study's arguments.

    Args:
        out_dir: the study's directory (None: nothing is saved, nothing resumes).
        name: the file stem.
        args: JSON-able arguments that determine the result; a saved run with other arguments is refused.
    """

    def __init__(self, out_dir: str | Path | None, name: str, args: Mapping[str, Any]):
        self.args = json.loads(json.dumps(dict(args)))
        self.units: dict[str, Any] = {}
        self.finished: dict | None = None
        self.out = Path(out_dir) if out_dir is not None else None
        if self.out is None:
            return
        self.partial = self.out / f"{name}.partial.json"
        self.final = self.out / f"{name}.json"
        for path in (self.final, self.partial):
            if not path.is_file():
                continue
            try:
                data = read_json(path, "out_dir", allow_nan=True)  # a key given twice is refused
            except ValueError as err:
                raise ValueError(f"{err} Delete it to start again.") from None
            self._check_args(path, data.get("args"))
            if path == self.final:
                self.finished = data
                return
            self.units = dict(data.get("units", {}))

    def _check_args(self, path: Path, saved: Any) -> None:
        """A saved argument that is missing counts as None (a journal written before that argument existed)."""
        saved = saved if isinstance(saved, Mapping) else {}
        differ = sorted(k for k in set(saved) | set(self.args) if saved.get(k) != self.args.get(k))
        if not differ:
            return
        named = ", ".join(f"{k} (saved {saved.get(k)!r}, now {self.args.get(k)!r})" for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ValueError(f"out_dir: {str(path)!r} holds a run with other arguments: {named}{more}; give another "
                         f"output directory, or the same arguments to resume it.")

    def done(self, unit: str) -> bool:
        return unit in self.units

    def record(self, unit: str, value: Any) -> None:
        self.units[unit] = value
        if self.out is not None:
            write_json(self.partial, {"args": self.args, "units": self.units})

    def finish(self, result: dict) -> dict:
        result = {**result, "args": self.args}
        if self.out is not None:
            write_json(self.final, result)
            self.partial.unlink(missing_ok=True)
        return result


def write_json(path: Path, data) -> None:
    """Atomic JSON write (a temporary file renamed over `path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def layout_args(model: nn.Module) -> list:
    """The model's head layout as a journal argument: `[[site name, heads], ...]`."""
    return [[site.name, site.num_heads] for site in find_heads(model)]


__all__ = ["AfterUnit", "Journal", "layout_args", "write_json"]
