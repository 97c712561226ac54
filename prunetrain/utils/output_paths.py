"""Where prunetrain may write, and what it may replace: the one place every command and saver asks.

Three rules, each refusal one sentence naming the flag:

1. An output is never one of the command's inputs, never inside an input directory and never holds an input, so
   neither writing nor replacing it can touch what the command reads (data, model, tokenizer, mask, input text).
   The one exception is asked for by name (`in_place=`): a command that reads a model completely before writing may
   replace that model's directory (`shrink M --output M --overwrite`).
2. `--overwrite` replaces only an empty directory or one prunetrain recognises as its own output: a recipe run
   directory (`recipe.yaml`) or a saved model directory whose every entry is a file prunetrain or `save_pretrained`
   writes there (`is_replaceable`). A directory holding anything else is never removed.
3. Replacing is crash-safe at any signal. The new directory is built in a hidden staging directory beside the
   destination (`staging_directory`); once it is complete the old directory is renamed aside, the new one renamed
   into place, and the old one removed (`replace_directory`), with SIGINT and SIGTERM held back during those steps.
   A signal at any other moment leaves the old directory whole and removes the staging directory: while one exists,
   SIGTERM raises `Terminated` (as SIGINT raises `KeyboardInterrupt`), so cleanup runs for both. How signals are
   held and raised without being lost, also in a process with worker threads: prunetrain.utils.signals.

Only a SIGKILL (or a power cut) can leave a hidden `.NAME.staging-*` / `.NAME.replaced-*` directory behind; the
destination itself is then still either the old directory, whole, or the new one, whole. The functions hold no
state about ranks: under torchrun call them from the rank that writes (rank 0).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from prunetrain.utils.signals import Terminated, cleanup_on_signal, signals_held, signals_raise

RUN_MARKER = "recipe.yaml"  # prunetrain.mt.run_dir.RUN_MARKER: the first file a recipe run writes
MODEL_FILE_NAMES = frozenset({
    "config.json", "generation_config.json", "prunetrain_layout.json", "modeling_prunetrain.py", "mask.json",
    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "tokenizer", "preprocessor_config.json",
})
MODEL_FILE_PATTERN = re.compile(r"^(model(-\d+-of-\d+)?\.safetensors|[\w.-]+\.(onnx|onnx_data|gguf)|[\w-]+\.model)$")
"""Entries a saved model directory may hold (HF `save_pretrained`, `save_pruned`, tokenizers, ONNX exports)."""


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
def foreign_entry(directory: str | os.PathLike) -> str | None:
    """None if `directory` is empty or recognisably prunetrain's own output (a recipe run directory, or a saved model
    directory holding only model, tokenizer and ONNX files); else the name of an entry prunetrain did not write."""
    directory = Path(directory)
    entries = sorted(os.listdir(directory))
    if not entries or RUN_MARKER in entries:
        return None
    if "config.json" not in entries:
        return entries[0]
    return next((name for name in entries if name not in MODEL_FILE_NAMES and not MODEL_FILE_PATTERN.match(name)),
                None)


def check_output_dir(output: str | os.PathLike, *, overwrite: bool, flag: str = "--output",
                     inputs: Mapping[str, str | os.PathLike | None] | None = None,
                     in_place: str | None = None) -> Path:
    """A directory output: disjoint from the inputs (rule 1); absent, empty, or with `overwrite` a directory
    prunetrain may replace (rule 2). Returns `output` as a Path; nothing is written.

    Args:
        output: the directory to write.
        overwrite: the user asked to replace what is there (`--overwrite`).
        flag: how messages name the output.
        inputs: what the command reads (see `check_disjoint`).
        in_place: the input the output may equal (replacing it still needs `overwrite`).
    """
    output = Path(output)
    check_disjoint(output, inputs or {}, flag=flag, in_place=in_place)
    if output.exists() and not output.is_dir():
        raise ValueError(f"{flag}: {str(output)!r} is a file, not a directory.")
    if not output.is_dir() or not any(output.iterdir()):
        return output
    if not overwrite:
        raise ValueError(f"{flag}: {str(output)!r} already exists and is not empty; pass --overwrite to replace it.")
    foreign = foreign_entry(output)
    if foreign is not None:
        raise ValueError(f"{flag}: {str(output)!r} holds {foreign!r}, which is not part of a model or run directory "
                         f"prunetrain writes; --overwrite replaces only those — move it away or choose another "
                         f"{flag}.")
    return output


def check_output_file(output: str | os.PathLike, *, flag: str = "--output",
                      inputs: Mapping[str, str | os.PathLike | None] | None = None) -> Path:
    """A file output: disjoint from the inputs, not a directory, in a directory that exists (an existing regular
    file is replaced atomically by `write_file`). Returns `output` as a Path; nothing is written."""
    output = Path(output)
    check_disjoint(output, inputs or {}, flag=flag)
    if output.is_dir():
        raise ValueError(f"{flag}: {str(output)!r} is a directory; give a file path.")
    if output.exists() and not output.is_file():
        raise ValueError(f"{flag}: {str(output)!r} is not a regular file (a FIFO or device); give a file path.")
    if not output.parent.is_dir():
        raise ValueError(f"{flag}: the directory {str(output.parent)!r} does not exist; create it first.")
    return output


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


def replace_directory(new: str | os.PathLike, destination: str | os.PathLike) -> Path:
    """Put the complete directory `new` at `destination` (same file system): the old `destination` is renamed aside,
    `new` renamed into place, then the old one removed — SIGINT/SIGTERM held back throughout, so the destination
    is always either the old directory or the new one, whole. The caller has checked that `destination` may be
    replaced (`check_output_dir` or its own `overwrite` rule). Returns `destination` as given."""
    new, target = Path(new), _real(destination)
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
            shutil.rmtree(aside, ignore_errors=True)
    return Path(destination)


def remove_directory(path: str | os.PathLike) -> None:
    """Remove a directory so that it is either whole or gone at any signal: renamed aside first (atomic), then
    deleted with SIGINT/SIGTERM held back."""
    target = _real(path)
    if not target.exists():
        return
    with signals_held():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.replaced-", dir=target.parent))
        os.rename(target, aside / "old")
        shutil.rmtree(aside, ignore_errors=True)


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


__all__ = ["Terminated", "check_disjoint", "check_output_dir", "check_output_file", "foreign_entry",
           "remove_directory", "replace_directory", "signals_held", "signals_raise", "staging_directory",
           "write_file"]
