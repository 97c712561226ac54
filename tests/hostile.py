"""What the hostile-input tests share: the command line run in this process, the one-line-error assertion, a
snapshot of a directory tree, a tiny saved Marian translation model with its tokenizer, and child processes stopped
by a signal at a random moment."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def run_main(monkeypatch, capsys, *args, stdin: bytes | None = None, env: dict | None = None):
    """`prunetrain ARGS` in this process: (exit code, stdout, stderr). An uncaught exception fails the test."""
    from prunetrain.cli import main

    monkeypatch.setattr(sys, "argv", ["prunetrain", *map(str, args)])
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    if stdin is not None:
        import io

        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(result, pattern: str):
    code, _, err = result
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("prunetrain: error: ") and re.search(pattern, lines[0]), lines[0]


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (hidden ones included) with its bytes: what must not change."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def save_tiny_translation_model(path: Path, multi30k_dir: Path) -> Path:
    """A tiny saved Marian translation model with its tokenizer (the layout `save_translation_model` writes)."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config, read_parallel, train_tokenizer
    from prunetrain.mt.evaluation.translation import save_translation_model

    tokenizer = train_tokenizer(read_parallel(multi30k_dir, "train", limit=300), vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=16, ffn_dim=32, layers=1, heads=2,
                                        max_position_embeddings=64))
    return save_translation_model(model, tokenizer, path)


def write_small_data(out: Path, multi30k_dir: Path, pairs: int = 8) -> Path:
    """A parallel-text directory with `pairs` pairs per split (fast to translate): the splits the main recipe reads
    (train, valid, test and the 2017 test sets of `eval.more_test_splits`)."""
    from prunetrain.mt.text.data import read_parallel, write_lines

    out.mkdir(parents=True)
    for split in ("train", "valid", "test", "test_2017_flickr", "test_2017_mscoco"):
        chosen = read_parallel(multi30k_dir, split, limit=pairs)
        write_lines(out / f"{split}.de", [s for s, _ in chosen])
        write_lines(out / f"{split}.en", [t for _, t in chosen])
    return out


# Loads prunetrain.utils.signals, write_errors and output_paths from the checkout without importing prunetrain (and torch), so
# that a child is ready in a fraction of a second.
LOAD_MODULES = """
import importlib.util, sys
def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec); sys.modules[name] = module; spec.loader.exec_module(module)
    return module
signals = _load("prunetrain.utils.signals", sys.argv[1] + "/prunetrain/utils/signals.py")
_load("prunetrain.utils.write_errors", sys.argv[1] + "/prunetrain/utils/write_errors.py")
op = _load("prunetrain.utils.output_paths", sys.argv[1] + "/prunetrain/utils/output_paths.py")
"""


def stop_at_random(script: str, args: list, rng: random.Random, max_delay: float) -> int:
    """Run `python -c SCRIPT REPO ARGS...`, wait for its "ready", send SIGTERM or SIGINT after a random delay and
    return its exit status (killed if it has not ended within 60 s: the signal was lost)."""
    child = subprocess.Popen([sys.executable, "-c", script, str(REPO), *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        time.sleep(rng.uniform(0.0, max_delay))
        sig = rng.choice([signal.SIGTERM, signal.SIGINT])
        child.send_signal(sig)
        try:
            return child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"{signal.Signals(sig).name} was lost: the child still ran 60 s later "
                                 f"(stderr: {child.communicate()[1][-2000:]!r})") from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
