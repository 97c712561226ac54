"""Multi30k fetched from its public source when no local copy exists (a fresh machine without `../shared/data`).

The recipe's corpus is Multi30k, Task 1, German–English, raw text (Elliott et al. 2016). `multi30k_dir()` is the
directory the recipe reads when neither `--data-dir`, `data.dir` nor `$PRUNETRAIN_DATA` is given:

1. `<repo>/../shared/data/multi30k` when it exists (the copy next to the repository);
2. else the user's cache, `$PRUNETRAIN_CACHE/data/multi30k` (default `$XDG_CACHE_HOME/prunetrain/...`, i.e.
   `~/.cache/prunetrain/data/multi30k`), filled on first use by `fetch_multi30k` from the GitHub repository
   `multi30k/dataset` at a fixed commit (`$PRUNETRAIN_MULTI30K_URL` replaces the base URL, e.g. a mirror or a
   test server).

Every file is decompressed, checked against the sha256 recorded when the shared copy was made
(`../shared/data/multi30k/SOURCE.md`) and written atomically (temporary file, then rename), so the cache never holds
a partial or corrupted file. Any failure (offline, HTTP error, bad gzip, checksum mismatch) is one `ValueError`
sentence that names what failed and the exact directory and file names to put there by hand.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import urllib.error
import urllib.request
import zlib
from pathlib import Path

URL_ENV = "PRUNETRAIN_MULTI30K_URL"
DATA_ENV = "PRUNETRAIN_DATA"  # as prunetrain.mt.text.data.DATA_ENV (the shared corpora's parent directory)
CACHE_ENV = "PRUNETRAIN_CACHE"

# The snapshot of github.com/multi30k/dataset the shared copy was made from (../shared/data/multi30k/SOURCE.md).
MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
DEFAULT_BASE_URL = f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1/raw"
LANGUAGES = ("de", "en")

# our split name -> upstream file stem (data/task1/raw/<stem>.<lang>.gz)
SPLITS = {
    "train": "train",
    "valid": "val",
    "test": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr",
    "test_2017_mscoco": "test_2017_mscoco",
}

# sha256 of the decompressed files, copied from the "Files" table of ../shared/data/multi30k/SOURCE.md
# (upstream commit a3d2e0d2; test.de/test.en also match the sums other public mirrors record).
SHA256 = {
    "test.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2017_flickr.de": "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
    "test_2017_flickr.en": "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
    "test_2017_mscoco.de": "58277df3c75f92f7145a11b910b553d1cf82c439249d4dc237c899609eafac22",
    "test_2017_mscoco.en": "43051fdfa86fd5395182e718a94ca67b1b227b9f7c79596ff0f6b813216981d2",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "valid.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "valid.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
}
FILES = tuple(f"{split}.{lang}" for split in SPLITS for lang in LANGUAGES)


def cache_root() -> Path:
    """`$PRUNETRAIN_CACHE`, else `$XDG_CACHE_HOME/prunetrain`, else `~/.cache/prunetrain`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "prunetrain"


def multi30k_cache_dir() -> Path:
    """Where a fetched Multi30k lives: `cache_root()/data/multi30k`."""
    return cache_root() / "data" / "multi30k"


def base_url() -> str:
    """`$PRUNETRAIN_MULTI30K_URL` (without a trailing slash), else the upstream raw-file URL at the fixed commit."""
    return (os.environ.get(URL_ENV) or DEFAULT_BASE_URL).rstrip("/")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cached_ok(path: Path) -> bool:
    return path.is_file() and _sha256(path.read_bytes()) == SHA256[path.name]


def _where_to_put(directory: Path) -> str:
    return (f"put the decompressed Multi30k files {', '.join(FILES)} (Task 1 raw, from github.com/multi30k/dataset "
            f"data/task1/raw, val -> valid, test_2016_flickr -> test) in {str(directory)!r}, or give --data-dir "
            f"or --set data.dir= a directory holding them, or set ${DATA_ENV} to a directory holding multi30k/")


def _download(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (https or a user-given mirror)
        return response.read()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def fetch_multi30k(directory: str | os.PathLike | None = None, *, url: str | None = None,
                   files: tuple[str, ...] = FILES, timeout: float = 60.0) -> Path:
    """Download the Multi30k files missing from `directory`, verify each by sha256 and write it atomically.

    Files already there with the right checksum are kept (no request); a cached file with a wrong checksum is
    fetched again. On any failure nothing unverified is left in `directory`.

    Args:
        directory: the cache directory (default `multi30k_cache_dir()`).
        url: base URL holding `<upstream stem>.<lang>.gz` (default `base_url()`).
        files: the files wanted, by our names (`train.de`, `valid.en`, ...; default all ten).
        timeout: seconds per request.

    Returns:
        `directory`, holding every file of `files`.

    Raises:
        ValueError: one sentence naming what failed and where to put the files by hand.
    """
    from prunetrain.utils.progress import bar

    directory = Path(directory) if directory is not None else multi30k_cache_dir()
    url = (url or base_url()).rstrip("/")
    unknown = [name for name in files if name not in SHA256]
    if unknown:
        raise ValueError(f"files: {unknown[0]!r} is not a Multi30k file; allowed: {', '.join(FILES)}.")
    missing = [name for name in files if not _cached_ok(directory / name)]
    if not missing:
        return directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"multi30k: cannot create the cache directory {str(directory)!r} ({err.strerror}); "
                         f"set ${CACHE_ENV} to a writable directory, or {_where_to_put(directory)}.") from None
    for name in bar(missing, total=len(missing), desc=f"Multi30k -> {directory}", unit="file"):
        split, lang = name.rsplit(".", 1)
        source = f"{url}/{SPLITS[split]}.{lang}.gz"
        try:
            data = gzip.decompress(_download(source, timeout))
        except urllib.error.HTTPError as err:
            reason = f"HTTP {err.code}"
        except (urllib.error.URLError, OSError, EOFError, zlib.error) as err:  # offline, refused, timeout, bad gzip
            reason = str(getattr(err, "reason", None) or err) or type(err).__name__
        else:
            digest = _sha256(data)
            if digest == SHA256[name]:
                _write_atomic(directory / name, data)
                continue
            reason = f"sha256 {digest} instead of {SHA256[name]} (corrupted or changed download; not saved)"
        (directory / name).unlink(missing_ok=True)  # a stale file of that name would be mistaken for the real one
        raise ValueError(f"multi30k: downloading {source} failed: {' '.join(str(reason).split())}; "
                         f"{_where_to_put(directory)}.")
    return directory


def multi30k_dir() -> Path:
    """The Multi30k directory a recipe reads when the user named none (see the module docstring for the order).

    `$PRUNETRAIN_DATA` and the shared copy next to the repository come first and are returned as they are (a
    `$PRUNETRAIN_DATA` that points nowhere is the user's mistake, reported by the reader, never papered over by a
    download); otherwise the cache is filled (`fetch_multi30k`) and returned.
    """
    from prunetrain.mt.text.data import DATA_ENV, default_data_dir

    local = default_data_dir() / "multi30k"
    if os.environ.get(DATA_ENV) or local.is_dir():
        return local
    return fetch_multi30k()


__all__ = ["CACHE_ENV", "DEFAULT_BASE_URL", "FILES", "MULTI30K_COMMIT", "SHA256", "SPLITS", "URL_ENV", "base_url",
           "cache_root", "fetch_multi30k", "multi30k_cache_dir", "multi30k_dir"]
