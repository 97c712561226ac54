"""A write that fails for a reason outside prunetrain (a full disk, a read-only file system, no permission, a quota
or file-size limit) is reported as one sentence naming the output's flag, its path and the reason in words — not as
raw `OSError` text, nor as safetensors' `SafetensorError` or torch's `PytorchStreamWriter` message.

`write_errors(flag, path)` wraps the writing of one output (every `output_lock` holder, `emit`'s JSON file, a
translation file): a write failure of that output raised inside it becomes an `OutputWriteError` (a `ValueError`,
so the command line prints it as one line with exit code 2). Only the outermost block maps, so the message names
what the user gave (`--output DIR`), not the staging directory a saver inside it was writing. Any `OSError` naming
the output (or a file beside it, or a directory on its way: a name too long, a part of the path that is a file) is
mapped too; one whose file name lies elsewhere (an input that cannot be read) passes through unchanged. What the
failed write had begun is removed by the writers themselves (staging directories, temporary and lock files:
`prunetrain.utils.output_paths`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Iterator

REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file would exceed the file-size limit",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted",
    errno.EIO: "an input/output error on the device",
}
"""The errors a write can meet that say nothing about prunetrain's input: {errno: the reason in words}."""
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
OS_ERROR_CODE = re.compile(r"os error (\d+)")
TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "file write failed", "unexpected pos")


class OutputWriteError(ValueError):
    """An output could not be written for a reason of the file system (full, read-only, no permission, ...)."""


_state = threading.local()


def _real(path) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fsdecode(path))))


def _concerns(filename, output: Path) -> bool:
    """`filename` (from an OSError; None: unknown) is the output, inside it, one of the hidden files written beside
    it (staging, lock, temporary file) or a directory made on the way to it."""
    if filename is None:
        return True
    name = _real(filename)
    beside = name.parent == output.parent and name.name.startswith(f".{output.name}.")
    return name == output or output in name.parents or name in output.parents or beside or any(
        p.parent == output.parent and p.name.startswith(f".{output.name}.") for p in name.parents)


def _torch_reason(path: Path) -> int | None:
    """The errno a torch write failure most likely had (its message carries none), from the file system of
    `path`: read-only or (nearly) full; None when neither."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fs = os.statvfs(probe)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return errno.EROFS
    return errno.ENOSPC if fs.f_bavail * fs.f_frsize < 1 << 20 else None


def _os_error(err: OSError, output: Path) -> tuple[int, str] | None:
    """(errno, reason) of an OSError met while writing `output`: any error naming the output (or a file beside it,
    or a directory on its way), and the write errors of `REASONS` that name no file (a `write()` call)."""
    named = [name for name in (err.filename, err.filename2) if name is not None]
    if not named:
        return (err.errno, REASONS[err.errno]) if err.errno in REASONS else None
    if not any(_concerns(name, output) for name in named) or err.errno is None:
        return None
    ancestor = any(_real(name) in output.parents for name in named)
    if err.errno == errno.ENOTDIR or err.errno == errno.EEXIST and ancestor:
        return err.errno, "a part of its path is a file, not a directory"
    return err.errno, REASONS.get(err.errno) or (err.strerror or os.strerror(err.errno)).lower()


def write_failure(err: BaseException, path: str | os.PathLike) -> tuple[int, str] | None:
    """(errno, the reason in words) of a failed write of the output `path`, None when `err` is something else."""
    output = _real(path)
    if isinstance(err, shutil.Error):  # copytree's list of (source, destination, reason) for every failed file
        failed = [entry for entry in (err.args[0] if err.args and isinstance(err.args[0], list) else [])
                  if isinstance(entry, tuple) and len(entry) == 3 and _concerns(entry[1], output)]
        codes = [int(m.group(1)) for *_, why in failed if (m := re.search(r"\[Errno (\d+)\]", str(why)))]
        return next(((code, REASONS[code]) for code in codes if code in REASONS), None)
    if isinstance(err, OSError):
        return _os_error(err, output)
    text = str(err)
    code = None
    if type(err).__name__ == "SafetensorError" and "serializ" in text:
        found = OS_ERROR_CODE.search(text)
        code = int(found.group(1)) if found else None
    elif isinstance(err, RuntimeError) and any(marker in text for marker in TORCH_WRITE_FAILED):
        code = _torch_reason(output)
    return (code, REASONS[code]) if code in REASONS else None


def write_error_message(flag: str, path: str | os.PathLike, code: int, reason: str) -> str:
    """One sentence: the flag, the path, the reason and what to do."""
    advice = (f"raise the file-size limit (ulimit -f) or choose another {flag}" if code == errno.EFBIG else
              f"free some space or choose another {flag}" if code in FULL else
              f"choose a {flag} on a file system you can write to" if code in (errno.EROFS, errno.EACCES, errno.EPERM)
              else f"choose another {flag}")
    return f"{flag}: cannot write {str(path)!r}: {reason}; {advice}."


@contextlib.contextmanager
def write_errors(flag: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn a failed write of the output `path` inside the block into an `OutputWriteError` naming `flag` (only in
    the outermost such block of this thread; inner ones let the error through to it)."""
    if getattr(_state, "active", False):
        yield
        return
    _state.active = True
    try:
        yield
    except Exception as err:
        failure = write_failure(err, path)
        if failure is None:
            raise
        raise OutputWriteError(write_error_message(flag, path, *failure)) from None
    finally:
        _state.active = False


__all__ = ["OutputWriteError", "REASONS", "write_error_message", "write_errors", "write_failure"]
