"""Where prunetrain may write, and what it may replace: the one place every command and saver asks.

Three rules, each refusal one sentence naming the flag:

1. An output is never one of the command's inputs, never inside an input directory and never holds an input, so
   neither writing nor replacing it can touch what the command reads (data, model, tokenizer, mask, input text).
   The one exception is asked for by name (`in_place=`): a command that reads a model completely before writing may
   replace that model's directory (`shrink M --output M --overwrite`).
2. `--overwrite` replaces only an empty directory or one prunetrain marked as its own output: every directory
   prunetrain writes carries `.prunetrain-output.json` (`MARKER_FILE`: its kind, the marker's version and, for a
   directory written whole, the entries prunetrain wrote there), written into the staging directory just before
   the swap (`replace_directory(..., kind=...)`) or, for a recipe run, when the run starts. A directory counts as
   prunetrain's by that marker alone, never by the names of its files (a user's directory that happens to hold a
   `recipe.yaml` or a `config.json` is never removed), and a marked directory that also holds an entry the marker
   does not list (the user's file put there since) is not replaced either. A directory without a marker is never
   replaced, also not one written by a prunetrain from before markers (`replace_refusal` tells how to remove it by
   hand): a rule by file names could misfire on a user's files, and these were all from recipe runs and saved
   models that the user can delete or move themselves. Each writer replaces only its own kinds (a model save
   never replaces a recipe run).
3. Replacing is crash-safe at any signal. The new directory is built in a hidden staging directory beside the
   destination (`staging_directory`); once it is complete the old directory is renamed aside, the new one renamed
   into place, and the old one removed (`replace_directory`), with SIGINT and SIGTERM held back during those steps.
   A signal at any other moment leaves the old directory whole and removes the staging directory: while one exists,
   SIGTERM raises `Terminated` (as SIGINT raises `KeyboardInterrupt`), so cleanup runs for both. How signals are
   held and raised without being lost, also in a process with worker threads: prunetrain.utils.signals.

4. One writer at a time: every writer of an output directory holds `output_lock(DEST)` for its whole write (an
   advisory `fcntl.flock` on the hidden file `.NAME.prunetrain-lock` beside DEST). A second prunetrain process
   writing the same DEST fails at once with one line naming DEST; the kernel releases the lock when its holder
   dies, so a killed writer never blocks the next one. Writers check what DEST holds after taking the lock.

Never written or replaced, whatever the flags: "" / "." (the current directory), a directory that holds the
current directory, the home directory or one holding it, and the file-system root (`check_not_protected`); nor an
output that is a symbolic link to nothing (dangling or a loop: `check_not_dangling`). A write the file system
refuses (full, read-only, ...) is one line naming the flag (`prunetrain.utils.write_errors`, in `output_lock`).

Only a SIGKILL (or a power cut) can leave a hidden `.NAME.staging-*`, `.NAME.replaced-*` or `.NAME.removing-*`
directory (or an unlocked `.NAME.prunetrain-lock` file) behind; the destination itself is then still either the old
directory, whole, or the new one, whole — or, killed between the two renames of a swap, absent with the old one
whole in `.NAME.replaced-*/old`. The next writer of NAME repairs this when it takes the lock (`recover_leftovers`):
an old directory set aside by a swap that did not happen is put back, every other leftover is removed. A recipe run
that replaces a run keeps the old one whole beside it (`.NAME.previous-*`, `set_aside`) until the new run is
complete (prunetrain.mt.run.run_dir). The functions hold no state about ranks: under torchrun call them from the
rank that writes (rank 0).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Mapping

from prunetrain.utils.signals import Terminated, cleanup_on_signal, signals_held, signals_raise
from prunetrain.utils.write_errors import write_errors

MARKER_FILE = ".prunetrain-output.json"
"""The file that makes a directory prunetrain's own output (rule 2); hidden, so exports never copy it along."""
MARKER_VERSION = 1
MODEL_KINDS = ("model", "export")  # saved model directories (save_pruned, prune, shrink, ...) and exports
KINDS = (*MODEL_KINDS, "recipe-run", "comparison", "kept-run")
"""What a marked directory holds: a saved model, an export, a recipe run (`prunetrain recipe`, its entries not
listed: a run writes for hours), a comparison (`prunetrain compare`), a run's results kept by scripts/keep_run.sh."""
MAX_MARKER_BYTES = 2**20


# -------------------------------------------------------------------------------------------------------------------
# rule 1: outputs and inputs never overlap
# -------------------------------------------------------------------------------------------------------------------
def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _inside(inner: Path, outer: Path) -> bool:
    return inner != outer and outer in inner.parents


def check_disjoint(output: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None], *,
                   flag: str = "--output", in_place: str | None = None) -> None:
    """Refuse an output that is an input, lies inside an input directory or holds an input (symlinks resolved).

    Args:
        output: the file or directory the command will write.
        inputs: {flag or argument name: path} of everything the command reads (None entries and "-" are skipped).
        flag: how messages name the output.
        in_place: the name of the one input the output may equal (a model directory replaced in place).
    """
    out = _real(output)
    for name, given in inputs.items():
        if given is None or os.fspath(given) == "-":
            continue
        source = _real(given)
        if _same(out, source):
            if name == in_place:
                continue
            raise ValueError(f"{flag}: {str(output)!r} is {name} {str(given)!r}; prunetrain never writes over what "
                             f"it reads — choose another {flag}.")
        if _inside(out, source):
            raise ValueError(f"{flag}: {str(output)!r} lies inside {name} {str(given)!r}; prunetrain never writes "
                             f"into what it reads — choose a {flag} outside it.")
        if _inside(source, out):
            raise ValueError(f"{flag}: {str(output)!r} holds {name} {str(given)!r}; writing or replacing it could "
                             f"destroy that input — choose a {flag} that does not contain it.")


# -------------------------------------------------------------------------------------------------------------------
# rule 2: what --overwrite may replace
# -------------------------------------------------------------------------------------------------------------------
def write_marker(directory: str | os.PathLike, kind: str, *, list_entries: bool = True, **extra) -> Path:
    """Mark `directory` as prunetrain's output of `kind` (`MARKER_FILE`, written atomically): {"kind", "version",
    "entries": the names it holds now (None with `list_entries=False`), **extra}. Call it on a complete directory,
    before it is swapped into place (`replace_directory(..., kind=...)` does)."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}.")
    directory = Path(directory)
    entries = sorted(name for name in os.listdir(directory) if name != MARKER_FILE) if list_entries else None
    record = {"kind": kind, "version": MARKER_VERSION, "entries": entries, **extra}
    return write_file(directory / MARKER_FILE, json.dumps(record, indent=1) + "\n")


def read_marker(directory: str | os.PathLike) -> dict | None:
    """The marker of `directory` ({"kind", "version", "entries", ...}), or None when it has none that prunetrain
    wrote: no `MARKER_FILE`, a link or anything but a regular file there, or content that is not a marker record of
    a known kind and version."""
    path = Path(directory) / MARKER_FILE
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_MARKER_BYTES:
            return None
        record = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("kind") not in KINDS or record.get("version") != MARKER_VERSION:
        return None
    entries = record.get("entries")
    if entries is not None and not (isinstance(entries, list) and all(isinstance(e, str) for e in entries)):
        return None
    return record


def replace_refusal(directory: str | os.PathLike, kinds: tuple[str, ...] = MODEL_KINDS, *, flag: str = "--output",
                    overwrite_flag: str = "--overwrite") -> str | None:
    """None if the non-empty `directory` may be replaced by a writer of `kinds`; else the one-sentence refusal: no
    prunetrain marker (a user's directory, or one from a prunetrain before markers), a marker of another kind, or an
    entry the marker does not list (the user's file put there since)."""
    shown = str(directory)
    marker = read_marker(directory)
    if marker is None:
        return (f"{flag}: {shown!r} is not empty and carries no prunetrain marker ({MARKER_FILE}): prunetrain did not "
                f"write it (or a version from before directories were marked did); {overwrite_flag} replaces only "
                f"directories prunetrain marked as its own — if it is yours to delete, remove it yourself "
                f"(rm -r {shown}), or choose another {flag}.")
    if marker["kind"] not in kinds:
        return (f"{flag}: {shown!r} holds a {marker['kind']} prunetrain wrote, which {overwrite_flag} here does not "
                f"replace (only a {' or '.join(kinds)}); choose another {flag}.")
    foreign = foreign_entry(directory, marker)
    if foreign is not None:
        return (f"{flag}: {shown!r} holds {foreign!r}, which is not part of the {marker['kind']} prunetrain wrote "
                f"there; {overwrite_flag} replaces only what prunetrain wrote — move it away or choose another "
                f"{flag}.")
    return None


def foreign_entry(directory: str | os.PathLike, marker: dict | None = None) -> str | None:
    """The first entry of the marked `directory` that its marker does not list (None when the marker lists none:
    a recipe run's)."""
    marker = marker if marker is not None else read_marker(directory)
    if marker is None or marker.get("entries") is None:
        return None
    listed = set(marker["entries"]) | {MARKER_FILE}
    return next((name for name in sorted(os.listdir(directory)) if name not in listed), None)


def check_not_protected(output: str | os.PathLike, *, flag: str = "--output") -> None:
    """Refuse a directory output that must never be written or replaced: "" or "." (the current directory), a
    directory holding the current directory, the home directory or one holding it, and the file-system root."""
    if not os.fspath(output).strip():
        raise ValueError(f"{flag}: an empty path (it would be the current directory); give the directory to write.")
    out = _real(output)
    where = [("the file-system root", out.parent == out), ("the current directory", _same(out, _real(os.getcwd()))),
             ("a directory that holds the current directory", _inside(_real(os.getcwd()), out)),
             ("the home directory", _same(out, _real(Path.home()))),
             ("a directory that holds the home directory", _inside(_real(Path.home()), out))]
    what = next((name for name, hit in where if hit), None)
    if what is not None:
        raise ValueError(f"{flag}: {str(output)!r} is {what}, which prunetrain never writes or replaces; give a new "
                         f"or empty directory of its own.")


def check_output_dir(output: str | os.PathLike, *, overwrite: bool, flag: str = "--output",
                     inputs: Mapping[str, str | os.PathLike | None] | None = None,
                     in_place: str | None = None, overwrite_flag: str = "--overwrite",
                     kinds: tuple[str, ...] = MODEL_KINDS) -> Path:
    """A directory output: disjoint from the inputs (rule 1), not a protected directory (`check_not_protected`);
    absent, empty, or with `overwrite` a directory prunetrain marked as its own, of one of `kinds` (rule 2).
    Returns `output` as a Path; nothing is written. The command line and the library's savers (`overwrite=True`) share this one rule.

    Args:
        output: the directory to write.
        overwrite: the user asked to replace what is there (`--overwrite`, `overwrite=True`).
        flag: how messages name the output.
        inputs: what the command reads (see `check_disjoint`).
        in_place: the input the output may equal (replacing it still needs `overwrite`).
        overwrite_flag: how messages name the overwrite switch ("--overwrite", "overwrite=True").
        kinds: the kinds of marked directory this writer replaces (`replace_refusal`).
    """
    check_disjoint(output, inputs or {}, flag=flag, in_place=in_place)
    check_not_protected(output, flag=flag)
    check_not_dangling(output, flag=flag)
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(f"{flag}: {str(output)!r} is a file, not a directory.")
    if not output.is_dir() or not any(output.iterdir()):
        return output
    if not overwrite:
        raise ValueError(f"{flag}: {str(output)!r} already exists and is not empty; pass {overwrite_flag} to replace "
                         f"it.")
    refusal = replace_refusal(output, kinds, flag=flag, overwrite_flag=overwrite_flag)
    if refusal is not None:
        raise ValueError(refusal)
    return output


def check_output_file(output: str | os.PathLike, *, flag: str = "--output",
                      inputs: Mapping[str, str | os.PathLike | None] | None = None) -> Path:
    """A file output: disjoint from the inputs, not a directory, in a directory that exists (an existing regular
    file is replaced atomically by `write_file`). Returns `output` as a Path; nothing is written."""
    output = Path(output)
    check_disjoint(output, inputs or {}, flag=flag)
    with write_errors(flag, output):  # a name too long for the file system: one line naming the flag
        check_not_dangling(output, flag=flag)
        if output.is_dir():
            raise ValueError(f"{flag}: {str(output)!r} is a directory; give a file path.")
        if output.exists() and not output.is_file():
            raise ValueError(f"{flag}: {str(output)!r} is not a regular file (a FIFO or device); give a file path.")
        if output.parent.exists() and not output.parent.is_dir():
            raise ValueError(f"{flag}: {str(output.parent)!r} is a file, not a directory; give a path in a "
                             f"directory.")
        if not output.parent.is_dir():
            raise ValueError(f"{flag}: the directory {str(output.parent)!r} does not exist; create it first.")
    return output


def check_not_dangling(output: str | os.PathLike, *, flag: str = "--output") -> None:
    """Refuse an output that is a symbolic link to nothing (dangling, or a loop): writing would replace the link
    itself, not create what it points to."""
    output = Path(output)
    with write_errors(flag, output):  # a name too long for the file system: one line naming the flag
        dangling = output.is_symlink() and not output.exists()
    if dangling:
        raise ValueError(f"{flag}: {str(output)!r} is a symbolic link to nothing (dangling or a loop, -> "
                         f"{os.readlink(output)!r}); remove it or choose another {flag}.")


# -------------------------------------------------------------------------------------------------------------------
# rule 3: crash-safe replacement
# -------------------------------------------------------------------------------------------------------------------
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _removed_when_done(remove_one) -> Iterator[list]:
    """A list for the temporary paths the block makes; each is removed by `remove_one` when the block ends, however
    it ends: at an error, at SIGINT or SIGTERM (`signals_raise`), also at a signal landing just before the `finally`
    (`cleanup_on_signal`), with the signals held during the removal. Whatever was renamed away is no longer there."""
    made: list = []

    def remove() -> None:
        for path in made:
            remove_one(path)

    with signals_raise(), cleanup_on_signal(remove):
        try:
            yield made
        finally:
            with signals_held():
                remove()


def _unlink_if_present(path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def staging_directory(destination: str | os.PathLike) -> Iterator[Path]:
    """An empty hidden directory beside `destination` (same file system, so renames are atomic), removed on exit
    whatever happens — also at SIGINT or SIGTERM (see `signals_raise`). Build the new content in it and finish
    with `replace_directory(staging_or_a_subdirectory, destination)`.

    Args:
        destination: the directory that will be written (its parent is created if missing).
    """
    destination = _real(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with _removed_when_done(lambda path: shutil.rmtree(path, ignore_errors=True)) as made:
        with signals_held():
            made.append(Path(tempfile.mkdtemp(prefix=f".{destination.name}.staging-", dir=destination.parent)))
            made[0].chmod(0o777 & ~_umask())  # mkdtemp makes it private; the result gets the usual permissions
        yield made[0]


def replace_directory(new: str | os.PathLike, destination: str | os.PathLike, *, kind: str | None = None,
                      **marker) -> Path:
    """Put the complete directory `new` at `destination` (same file system): the old `destination` is renamed aside,
    `new` renamed into place, then the old one removed — SIGINT/SIGTERM held back throughout, so the destination
    is always either the old directory or the new one, whole (a SIGKILL between the two renames leaves the old one
    in `.NAME.replaced-*/old`, put back by the next writer: `recover_leftovers`). The caller has checked that
    `destination` may be replaced (`check_output_dir` or its own `overwrite` rule). With `kind`, `new` is first
    marked as prunetrain's output of that kind (`write_marker`, listing its entries; `marker`: further fields).
    Returns `destination` as given."""
    new, target = Path(new), _real(destination)
    if kind is not None:
        write_marker(new, kind, **marker)
    with signals_held():
        aside = None
        if target.exists() or target.is_symlink():
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
            os.rename(target, aside / "old")
        try:
            os.rename(new, target)
        except BaseException:
            if aside is not None:
                os.rename(aside / "old", target)  # put the old one back
                aside.rmdir()
            raise
        if aside is not None:
            _remove_hidden(aside, target)
    return Path(destination)


def _remove_hidden(path: Path, target: Path) -> None:
    """Delete `path` (beside `target`) so that a SIGKILL meanwhile leaves only a `.NAME.removing-*` leftover, which
    the next writer removes: renamed to one first."""
    removing = Path(tempfile.mkdtemp(prefix=f".{target.name}.removing-", dir=target.parent))
    os.rename(path, removing / "gone")
    shutil.rmtree(removing, ignore_errors=True)


def remove_directory(path: str | os.PathLike) -> None:
    """Remove a directory so that it is either whole or gone at any signal: renamed aside first (atomic), then
    deleted with SIGINT/SIGTERM held back."""
    target = _real(path)
    if not target.exists():
        return
    with signals_held():
        _remove_hidden(target, target)


def set_aside(destination: str | os.PathLike) -> Path:
    """Move the directory `destination` whole to a hidden `.NAME.previous-*/old` beside it (one atomic rename) and
    return that `.NAME.previous-*` directory: the old output kept while a new one is written in its place, until
    `drop_set_aside` (the new one is complete) or `put_back` (it failed)."""
    target = _real(destination)
    with signals_held():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.previous-", dir=target.parent))
        os.rename(target, aside / "old")
    return aside


def put_back(aside: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Put the directory `set_aside` kept in `aside` back at `destination`, removing what is there now (the new
    output that did not complete); SIGINT/SIGTERM held back, so `destination` is the new or the old one at any
    signal, and a SIGKILL leaves what `recover_set_aside` repairs."""
    aside, target = Path(aside), _real(destination)
    with signals_held():
        if target.exists() or target.is_symlink():
            _remove_hidden(target, target)
        os.rename(aside / "old", target)
        shutil.rmtree(aside, ignore_errors=True)


def drop_set_aside(aside: str | os.PathLike, destination: str | os.PathLike) -> None:
    """Delete the old output `set_aside` kept (the new one is complete)."""
    with signals_held():
        _remove_hidden(Path(aside), _real(destination))


def set_aside_leftovers(destination: str | os.PathLike) -> list[Path]:
    """The `.NAME.previous-*` directories beside `destination` that hold an old output `set_aside` kept."""
    target = _real(destination)
    if not target.parent.is_dir():
        return []
    return sorted(target.parent / name for name in os.listdir(target.parent)
                  if name.startswith(f".{target.name}.previous-") and (target.parent / name / "old").is_dir())


def recover_set_aside(destination: str | os.PathLike, complete: bool) -> str | None:
    """After a SIGKILL of a writer that kept the old output aside: drop the old one when `destination` holds a
    `complete` new one, else put the old one back (the new one did not finish). Returns a line saying which, or
    None when nothing was kept aside."""
    kept = set_aside_leftovers(destination)
    if not kept:
        return None
    for aside in kept[1:]:  # more than one: only the newest can be the output the last writer replaced
        drop_set_aside(aside, destination)
    if complete:
        drop_set_aside(kept[0], destination)
        return None
    put_back(kept[0], destination)
    return (f"output: {destination}: a replacement that did not finish was stopped; the output it was to replace, "
            f"kept whole beside it, is back in place")


def recover_leftovers(destination: str | os.PathLike) -> None:
    """What a SIGKILL of an earlier writer of `destination` left beside it, repaired (call it holding the lock):
    an old directory a swap had set aside but not yet replaced is put back when `destination` is missing; staging,
    set-aside-and-replaced and half-removed directories are removed. `.NAME.previous-*` is left to its writer
    (`recover_set_aside`)."""
    target = _real(destination)
    if not target.parent.is_dir():
        return
    prefix = f".{target.name}."
    with signals_held():
        for name in sorted(os.listdir(target.parent)):
            rest = name[len(prefix):] if name.startswith(prefix) else ""
            path = target.parent / name
            if rest.startswith("replaced-"):
                old = path / "old"
                if not (target.exists() or target.is_symlink()) and (old.exists() or old.is_symlink()):
                    os.rename(old, target)  # killed between the swap's two renames: the old one, whole
                shutil.rmtree(path, ignore_errors=True)
            elif rest.startswith(("staging-", "removing-")) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


def write_file(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` atomically: a temporary file beside it, renamed over it when complete (the temporary
    file is removed at any error, SIGINT or SIGTERM)."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else data
    with _removed_when_done(_unlink_if_present) as made:
        with signals_held():
            handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            made.append(tmp)
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        with signals_held():
            os.replace(tmp, path)
    return path


# -------------------------------------------------------------------------------------------------------------------
# rule 4: one writer at a time
# -------------------------------------------------------------------------------------------------------------------
LOCK_SUFFIX = ".prunetrain-lock"
_held_locks: dict[Path, list] = {}  # lock file -> [descriptor, depth]: this process's locks (re-entered, not re-taken)
_held_guard = threading.Lock()


class OutputLocked(ValueError):
    """Another process holds the lock of the output directory this one was about to write."""


def lock_file(destination: str | os.PathLike) -> Path:
    """The hidden lock file beside `destination` (`.NAME.prunetrain-lock`): beside it, not in it, because a writer
    replaces the whole directory."""
    target = _real(destination)
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


@contextlib.contextmanager
def output_lock(destination: str | os.PathLike, *, flag: str = "--output") -> Iterator[Path]:
    """Hold the advisory lock of output directory `destination` for the block: a second prunetrain process that
    asks for it meanwhile gets `OutputLocked` at once (one line naming `destination` and `flag`). The kernel drops
    the lock when its holder dies (`fcntl.flock`), so a dead writer never blocks; the lock file is removed when the
    block ends. Re-entrant within a process (a command and the saver it calls take it once). Check what
    `destination` holds after taking the lock: it may have been written while this process waited to start."""
    check_not_protected(destination, flag=flag)  # no lock file beside the current, home or root directory
    check_not_dangling(destination, flag=flag)  # nor beside a dangling link's target (its parents made on the way)
    lock = lock_file(destination)
    with _held_guard:
        held = _held_locks.get(lock)
        if held is not None:
            held[1] += 1
    if held is not None:
        try:
            yield lock
        finally:
            with _held_guard:
                held[1] -= 1
        return
    with write_errors(flag, destination):  # a full or read-only disk: one line naming flag and destination
        lock.parent.mkdir(parents=True, exist_ok=True)
        with signals_held():
            descriptor = _take_lock(lock, destination, flag)
            with _held_guard:
                _held_locks[lock] = [descriptor, 1]
    try:
        with write_errors(flag, destination):
            recover_leftovers(destination)  # what a killed writer left: repaired before anything is checked
    except BaseException:
        with signals_held():
            with _held_guard:
                del _held_locks[lock]
            _unlink_if_present(lock)
            os.close(descriptor)
        raise
    try:
        with write_errors(flag, destination):  # (prunetrain.utils.write_errors)
            yield lock
    finally:
        with signals_held():
            with _held_guard:
                del _held_locks[lock]
            _unlink_if_present(lock)  # while still locked: a process waiting on the old file re-opens the path
            os.close(descriptor)


def _take_lock(lock: Path, destination, flag: str) -> int:
    """Open and flock `lock` without waiting; retried when the file was removed (and maybe re-made) by the
    previous holder between our open and our flock, so that two processes never lock two different files."""
    while True:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as err:
            raise ValueError(f"{flag}: cannot create the lock file {str(lock)!r} beside {str(destination)!r} "
                             f"({err.strerror}); choose a {flag} in a directory you can write.") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise OutputLocked(f"{flag}: another prunetrain process is writing {str(destination)!r} (it holds "
                               f"{str(lock)!r}); wait until it has finished or choose another {flag}.") from None
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            current = None
        mine = os.fstat(descriptor)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            try:
                os.ftruncate(descriptor, 0)
                os.write(descriptor, f"{os.getpid()}\n".encode())
            except OSError:  # a full disk: no lock file is left behind
                _unlink_if_present(lock)
                os.close(descriptor)
                raise
            return descriptor
        os.close(descriptor)


__all__ = ["KINDS", "MARKER_FILE", "MARKER_VERSION", "MODEL_KINDS", "OutputLocked", "Terminated", "check_disjoint",
           "check_not_dangling", "check_not_protected", "check_output_dir", "check_output_file", "drop_set_aside",
           "foreign_entry", "lock_file", "output_lock", "put_back", "read_marker", "recover_leftovers",
           "recover_set_aside", "remove_directory", "replace_directory", "replace_refusal", "set_aside",
           "set_aside_leftovers", "signals_held", "signals_raise", "staging_directory", "write_file", "write_marker"]
