"""Shared fixtures.

`data_dir`: the shared corpora (`<repo>/../shared/data`, or `$PRUNETRAIN_DATA`), read in place, never copied.
It skips (with a loud reason) only when the default location truly does not exist outside CI; a
`$PRUNETRAIN_DATA` that points nowhere, a missing corpus under an existing data directory, or absent data
under CI (`CI=true`) fail instead of skipping.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_ENV = "PRUNETRAIN_DATA"


def _child_threads_per_worker() -> None:
    """Under pytest-xdist the workers share the cores. A child process a test starts (a CLI run, torchrun, an export
    in isolation) would otherwise start torch with one OpenMP thread per core, and two such children on two cores
    spend most of their time in OpenMP barriers (measured on 2 cores: the cooldown recipe test 18 s with one thread
    per child, 145 s without; its run takes 20 s alone). So every child inherits OMP_NUM_THREADS = cores // workers,
    unless the caller set it. A test that needs another count sets it in the child explicitly."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


_child_threads_per_worker()


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test, in this process and in every Python child it starts, however
    the suite was started. A non-interactive shell starts a background command (`pytest ... &`, nohup) with SIGINT
    ignored (POSIX), a child inherits an ignored disposition, and Python then leaves it ignored; a test that sends
    SIGINT and expects it to act sets the default itself. What was there is put back."""
    found = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, found)


def _data_location() -> tuple[Path, bool]:
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser(), True
    return REPO.parent / "shared" / "data", False


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path, from_env = _data_location()
    if not path.is_dir():
        reason = (f"SHARED DATA ABSENT: {path} does not exist, so the tests that read real corpora cannot run. "
                  f"Put the shared corpora at <repo>/../shared/data or set {DATA_ENV}=/path/to/data.")
        if from_env or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason + (f" ({DATA_ENV} is set but points nowhere.)" if from_env else " (CI=true)"))
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def multi30k_dir(data_dir: Path) -> Path:
    path = data_dir / "multi30k"
    missing = [f"{split}.{lang}" for split in ("train", "valid", "test") for lang in ("de", "en")
               if not (path / f"{split}.{lang}").is_file()]
    if missing:
        pytest.fail(f"{data_dir} exists but multi30k is incomplete: missing {', '.join(missing)} in {path}.")
    return path


@pytest.fixture(scope="session")
def multi30k_train_slice(multi30k_dir):
    """The first 2000 Multi30k training pairs."""
    from prunetrain.mt.text.data import read_parallel

    return read_parallel(multi30k_dir, "train", limit=2000)


@pytest.fixture(scope="session")
def m30k_tokenizer(multi30k_train_slice, tmp_path_factory):
    """A joint byte-level BPE tokenizer (vocab 2000) trained on 2000 Multi30k pairs, saved and reloaded."""
    from prunetrain.mt.text.data import load_tokenizer, train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(multi30k_train_slice, vocab_size=2000, path=path)
    return load_tokenizer(path)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tests run tiny models: one thread is faster (no OpenMP barriers) and keeps a shared 2-core machine usable."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _int8_saturates() -> bool:
    """Whether this x86 CPU multiplies int8 without VNNI (AVX2 only: no `avx512_vnni` / `avx_vnni`).

    There u8 × s8 products go through `vpmaddubsw`, whose int16 pair sums saturate (oneDNN documents it for
    non-VNNI CPUs), and CTranslate2 has no int16 type (it falls back to int8). Measured on a 2-core AVX2-only
    "AMD EPYC" (2026-12-02): tests/test_export_readonly.py's int8 exports 0.115 |Δ log p| where VNNI CPUs give
    about 1e-3, and tests/test_export_ffn.py's trained model 0.69 with 1 of 40 greedy translations equal to
    float32's (repeated tokens), where VNNI CPUs give 0.01 and most equal."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return " avx2" in flags and not any(f" {vnni}" in flags for vnni in ("avx512_vnni", "avx_vnni"))


INT8_SATURATES = _int8_saturates()


def int8_bound(bound: float) -> float:
    """A bound on an int8 CTranslate2 model's |Δ log p| against float32: as given with VNNI, 2.5× where int8
    saturates (`INT8_SATURATES`); a rescaled or wrong model is off by whole units either way."""
    return bound * 2.5 if INT8_SATURATES else bound


def run_cli(*args, cwd=None, timeout=900, env=None):
    """`python -m prunetrain.cli ...` in a subprocess (the real entry point: exit codes, stdout JSON, stderr)."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "prunetrain.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)


def run_cli_once(tmp_path_factory, name: str, *args):
    """`run_cli(*args, "--output", <dir>)` once for the whole test run, also when pytest-xdist spreads the suite over
    worker processes (they share the parent of their base temporary directories): the first worker to ask runs it
    under a file lock and records the outcome; the others wait for it and read the same directory and outcome.
    Returns (output directory, completed process)."""
    import json
    import subprocess

    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's directory, above every worker's own
    out, record = shared / f"once-{name}" / "run", shared / f"once-{name}.json"
    with FileLock(str(shared / f"once-{name}.lock")):
        if not record.is_file():
            done = run_cli(*args, "--output", out)
            record.write_text(json.dumps({"returncode": done.returncode, "stdout": done.stdout,
                                          "stderr": done.stderr}))
    outcome = json.loads(record.read_text())
    return out, subprocess.CompletedProcess(args, outcome["returncode"], outcome["stdout"], outcome["stderr"])


@pytest.fixture(scope="session")
def smoke_recipe_run(tmp_path_factory, multi30k_dir):
    """`prunetrain recipe wmt-small-deen --smoke` run once per test run: (run directory, completed process)."""
    return run_cli_once(tmp_path_factory, "smoke-recipe", "recipe", "wmt-small-deen", "--smoke", "--data-dir",
                        multi30k_dir)


@pytest.fixture(scope="session")
def full_smoke_run(multi30k_dir, tmp_path_factory):
    """The smoke preset with pruning off, run once per test run (a trained full model in `full/`): the source of the
    l0 sweep and the starting model of the compress recipe. Returns (run directory, completed process)."""
    return run_cli_once(tmp_path_factory, "smoke-full", "recipe", "wmt-small-deen", "--smoke", "--set",
                        "pruning.schedule_steps={}", "--set", "pruning.shrink_steps=[]", "--data-dir", multi30k_dir)


def pytest_terminal_summary(terminalreporter):
    """Where the suite's time went: tests marked `slow` (end-to-end runs) against the others, so the README can say
    how long `-m "not slow"` takes (setup, call and teardown of every test that ran, module fixtures included)."""
    spent = {"slow": 0.0, "others": 0.0}
    for reports in terminalreporter.stats.values():
        for report in reports:
            duration = getattr(report, "duration", None)
            keywords = getattr(report, "keywords", None)
            if duration is None or keywords is None or getattr(report, "when", None) is None:
                continue
            spent["slow" if "slow" in keywords else "others"] += duration
    if spent["slow"] or spent["others"]:
        terminalreporter.write_line(f"time in tests marked slow: {spent['slow'] / 60:.1f} min; in the others "
                                    f"(-m 'not slow'): {spent['others'] / 60:.1f} min")
