"""Reading the files a user hands over, defensively: regular files only, strict JSON, one sentence per mistake.

`read_json` refuses what `json.loads` lets through or turns into a traceback: a FIFO or device where a file should be
(reading it would hang), bytes that are not UTF-8, `NaN`/`Infinity` (not JSON), duplicate keys (the last one would
win silently), nesting deep enough to exhaust the recursion limit, and a top-level value of the wrong type.
`dumps_strict` writes standard JSON only and names the first value that is not (a NaN score, say).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 256 * 2**20  # a JSON file prunetrain reads (config, layout, mask, results) is far smaller


def check_regular_file(path: str | os.PathLike, argument: str) -> Path:
    """`path` exists and is a regular file (symlinks followed), not a directory, FIFO, socket or device."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{argument}: {str(path)!r} is not a file (it does not exist).") from None
    except OSError as err:
        raise ValueError(f"{argument}: {str(path)!r} cannot be read ({err.strerror}).") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{argument}: {str(path)!r} is a directory, not a file.")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{argument}: {str(path)!r} is {kind}, not a regular file.")
    return path


def _no_constant(name: str):
    raise ValueError(name)


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise KeyError(key)
        out[key] = value
    return out


def utf8_text(text: str | bytes, where: str) -> str:
    """`text` as str: bytes are decoded as UTF-8; ValueError naming `where` and the first bad byte's offset."""
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{where} is not valid UTF-8 (byte offset {err.start}).") from None
    return text


def parse_json(text: str | bytes, where: str, expected: type | tuple[type, ...] = dict,
               allow_nan: bool = False) -> Any:
    """Strict JSON from `text`; ValueError naming `where` for anything that is not standard JSON of the `expected`
    top-level type. `allow_nan=True` reads `NaN`/`Infinity` (files Python's `json.dumps` wrote with its defaults,
    such as a training state holding a diverged metric); duplicate keys are refused either way."""
    text = utf8_text(text, where)
    try:
        data = json.loads(text, parse_constant=None if allow_nan else _no_constant,
                          object_pairs_hook=_pairs_without_duplicates)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where} is not valid JSON ({err.msg}, line {err.lineno} column {err.colno}).") from None
    except RecursionError:
        raise ValueError(f"{where} nests too deeply to be read (brackets inside brackets thousands of levels "
                         f"deep).") from None
    except KeyError as err:
        raise ValueError(f"{where} names the key {err.args[0]!r} twice; each key may appear once.") from None
    except ValueError as err:  # parse_constant
        raise ValueError(f"{where} holds {err.args[0]}, which is not a JSON number.") from None
    expected_types = expected if isinstance(expected, tuple) else (expected,)
    if not isinstance(data, expected_types):
        names = " or ".join({dict: "an object", list: "a list"}.get(t, t.__name__) for t in expected_types)
        raise ValueError(f"{where} holds JSON {type(data).__name__}, not {names}.")
    return data


def read_json(path: str | os.PathLike, argument: str, expected: type | tuple[type, ...] = dict,
              max_bytes: int = MAX_JSON_BYTES, allow_nan: bool = False) -> Any:
    """The strict JSON content of the regular file `path` (see `parse_json`); errors name `argument` and the file."""
    path = check_regular_file(path, argument)
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{argument}: {str(path)!r} is {size} bytes, more than the {max_bytes} a JSON file of this "
                         f"kind may have.")
    return parse_json(path.read_bytes(), f"{argument}: {str(path)!r}", expected, allow_nan)


def first_non_finite(value: Any, where: str = "") -> str | None:
    """The path (`a.b[3]`) of the first float in `value` that is NaN or infinite, else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "the value")
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_non_finite(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_non_finite(item, f"{where}[{index}]")
            if found:
                return found
    return None


def dumps_strict(value: Any, what: str, **kwargs) -> str:
    """`json.dumps` that writes standard JSON only: a NaN or infinite number is a ValueError naming its key
    (`what` says what was being written), never a `NaN` token other tools cannot read."""
    bad = first_non_finite(value)
    if bad is not None:
        raise ValueError(f"{what}: {bad} is not a finite number (NaN or infinite); the result is not written. "
                         f"Check the model's weights and the data.")
    return json.dumps(value, allow_nan=False, **kwargs)


__all__ = ["MAX_JSON_BYTES", "check_regular_file", "dumps_strict", "first_non_finite", "parse_json", "read_json", "utf8_text"]
