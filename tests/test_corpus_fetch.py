"""Multi30k fetched on a machine without `../shared/data`: a real HTTP server on the loopback address serves gzip
copies of the shared files (made at test time in tmp_path); the real upstream URL is never contacted."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO
from prunetrain.mt.text import corpus
from prunetrain.mt.text.corpus import FILES, SHA256, SPLITS, fetch_multi30k

SMALL = tuple(name for name in FILES if not name.startswith("train."))


def _upstream_name(name: str) -> str:
    split, lang = name.rsplit(".", 1)
    return f"{SPLITS[split]}.{lang}.gz"


@pytest.fixture
def mirror(tmp_path, multi30k_dir):
    """A directory laid out as upstream's repository: data/task1/raw/<upstream name>.gz."""
    root = tmp_path / "mirror"
    raw = root / "data" / "task1" / "raw"
    raw.mkdir(parents=True)
    for name in FILES:
        (raw / _upstream_name(name)).write_bytes(gzip.compress((multi30k_dir / name).read_bytes(), compresslevel=1))
    return root


class Server:
    """`http.server` on 127.0.0.1 (port 0) in a thread, serving `root`; `requests` lists the paths asked for."""

    def __init__(self, root: Path):
        self.requests: list[str] = []
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):  # keep the test output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                     functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/data/task1/raw"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(mirror):
    srv = Server(mirror)
    yield srv, mirror / "data" / "task1" / "raw"
    srv.close()


def _dead_url(tmp_path) -> str:
    """A loopback URL where nothing listens: a server started and closed, so its port is free."""
    srv = Server(tmp_path)
    url = srv.url
    srv.close()
    return url


def _one_line(message: str) -> str:
    assert "\n" not in message, message
    return message


def test_checksums_are_those_of_the_shared_copy(multi30k_dir):
    """The hard-coded table is the one SOURCE.md records, and the shared files have those sums."""
    source = (multi30k_dir / "SOURCE.md").read_text()
    for name, digest in SHA256.items():
        assert f"| `{name}` |" in source and digest in source, name
        assert hashlib.sha256((multi30k_dir / name).read_bytes()).hexdigest() == digest, name
    assert corpus.MULTI30K_COMMIT in source
    assert set(FILES) == set(SHA256)


def test_fetch_writes_verified_files_and_then_uses_the_cache(tmp_path, server, multi30k_dir):
    srv, _ = server
    cache = tmp_path / "cache"
    assert fetch_multi30k(cache, url=srv.url) == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(FILES)  # no temporary file left
    for name in FILES:
        assert (cache / name).read_bytes() == (multi30k_dir / name).read_bytes(), name
    assert sorted(srv.requests) == sorted(f"/data/task1/raw/{_upstream_name(n)}" for n in FILES)
    srv.requests.clear()
    assert fetch_multi30k(cache, url=srv.url) == cache
    assert srv.requests == []  # everything verified from the cache, nothing asked for
    (cache / "valid.en").write_bytes(b"tampered\n")  # a damaged cached file is fetched again
    fetch_multi30k(cache, url=srv.url)
    assert srv.requests == ["/data/task1/raw/val.en.gz"]
    assert (cache / "valid.en").read_bytes() == (multi30k_dir / "valid.en").read_bytes()


@pytest.mark.parametrize("damage", ["changed text", "truncated gzip"])
def test_a_corrupted_download_is_refused_and_not_cached(tmp_path, server, multi30k_dir, damage):
    srv, raw = server
    bad = raw / "test_2016_flickr.en.gz"
    if damage == "changed text":
        text = (multi30k_dir / "test.en").read_bytes().replace(b"dog", b"cat", 1)
        bad.write_bytes(gzip.compress(text))
    else:
        bad.write_bytes(bad.read_bytes()[:-40])
    cache = tmp_path / "cache"
    with pytest.raises(ValueError) as info:
        fetch_multi30k(cache, url=srv.url, files=SMALL)
    message = _one_line(str(info.value))
    assert f"downloading {srv.url}/test_2016_flickr.en.gz failed" in message
    if damage == "changed text":
        assert "sha256" in message and SHA256["test.en"] in message and "not saved" in message
    assert str(cache) in message and "test.en" in message
    assert not (cache / "test.en").exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary file
    for path in cache.iterdir():  # whatever was kept before the failure is verified
        assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[path.name]


def test_offline_says_where_to_put_the_files(tmp_path):
    cache = tmp_path / "cache"
    url = _dead_url(tmp_path / "empty")
    with pytest.raises(ValueError) as info:
        fetch_multi30k(cache, url=url, timeout=10)
    message = _one_line(str(info.value))
    assert message.startswith(f"multi30k: downloading {url}/") and "failed" in message
    assert f"in {str(cache)!r}" in message
    for name in FILES:
        assert name in message
    assert "PRUNETRAIN_DATA" in message and "--data-dir" in message
    assert list(cache.iterdir()) == []


def test_cache_location_and_url_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PRUNETRAIN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert corpus.multi30k_cache_dir() == tmp_path / "xdg" / "prunetrain" / "data" / "multi30k"
    monkeypatch.setenv("PRUNETRAIN_CACHE", str(tmp_path / "mine"))
    assert corpus.multi30k_cache_dir() == tmp_path / "mine" / "data" / "multi30k"
    monkeypatch.delenv("PRUNETRAIN_MULTI30K_URL", raising=False)
    assert corpus.base_url() == ("https://raw.githubusercontent.com/multi30k/dataset/"
                                 "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw")
    monkeypatch.setenv("PRUNETRAIN_MULTI30K_URL", "http://127.0.0.1:9/raw/")
    assert corpus.base_url() == "http://127.0.0.1:9/raw"
    with pytest.raises(ValueError, match=r"files: 'train\.fr' is not a Multi30k file"):
        fetch_multi30k(tmp_path / "c", files=("train.fr",))


def _fresh_checkout(tmp_path) -> Path:
    """The package copied to `tmp_path/checkout`: a checkout with no `../shared/data` beside it."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "prunetrain", checkout / "prunetrain", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (tmp_path / "shared").exists()
    return checkout


def _run_fresh(checkout: Path, tmp_path: Path, url: str, *args, progress: str = "0"):
    """`python -m prunetrain.cli recipe wmt-small-deen ...` run from the copied checkout (as `run_cli`, which pins
    PYTHONPATH to the repository)."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PRUNETRAIN_CACHE=str(tmp_path / "cache"),
               PRUNETRAIN_MULTI30K_URL=url, PRUNETRAIN_DATA="", PRUNETRAIN_PROGRESS=progress)
    return subprocess.run([sys.executable, "-m", "prunetrain.cli", "recipe", "wmt-small-deen", *map(str, args)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)


@pytest.mark.slow
def test_recipe_on_a_fresh_checkout_fetches_its_corpus_or_says_where_to_put_it(tmp_path, server, multi30k_dir):
    """`prunetrain recipe` with no local data: fetched from the (loopback) server into the cache; with the server
    down: one line naming the cache directory and the files, exit code 2, nothing written. The run is the smoke
    preset cut to one epoch on 200 pairs."""
    srv, _ = server
    checkout = _fresh_checkout(tmp_path)
    cache = tmp_path / "cache" / "data" / "multi30k"
    dead = _run_fresh(checkout, tmp_path, _dead_url(tmp_path / "empty"), "--smoke", "--output", tmp_path / "run")
    assert dead.returncode == 2, dead.stderr[-2000:]
    lines = [line for line in dead.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in dead.stderr, dead.stderr
    assert "multi30k: downloading" in lines[0] and repr(str(cache)) in lines[0] and "train.de" in lines[0]
    assert not (tmp_path / "run").exists()

    ok = _run_fresh(checkout, tmp_path, srv.url, "--smoke", "--output", tmp_path / "run",
                    "--set", "train.epochs=1", "--set", "pruning.importance_epochs=[1]",
                    "--set", "pruning.curve_epochs=[1]", "--set", "data.train_limit=200", progress="1")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"Multi30k -> {cache}" in ok.stderr  # the download's progress bar
    for name in FILES:
        assert (cache / name).read_bytes() == (multi30k_dir / name).read_bytes(), name
    assert (tmp_path / "run" / "run_complete.json").is_file()


def test_local_copies_take_precedence_over_the_download(tmp_path, monkeypatch, multi30k_dir):
    """`$PRUNETRAIN_DATA` (even one that points nowhere: the reader then names it) and the shared copy next to the
    repository are used as they are; nothing is fetched (the URL is dead, so a fetch would raise)."""
    monkeypatch.setenv("PRUNETRAIN_MULTI30K_URL", _dead_url(tmp_path / "empty"))
    monkeypatch.setenv("PRUNETRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PRUNETRAIN_DATA", str(tmp_path / "elsewhere"))
    assert corpus.multi30k_dir() == tmp_path / "elsewhere" / "multi30k"
    monkeypatch.delenv("PRUNETRAIN_DATA")
    from prunetrain.mt.text.data import default_data_dir

    if (default_data_dir() / "multi30k").is_dir():
        assert corpus.multi30k_dir() == default_data_dir() / "multi30k"
    assert not (tmp_path / "cache").exists()
