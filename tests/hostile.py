"""What the hostile-input tests share: the command line run in this process, the one-line-error assertion, a
snapshot of a directory tree, and a tiny saved Marian translation model with its tokenizer."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch


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

    from prunetrain.mt.data import marian_config, read_parallel, train_tokenizer
    from prunetrain.mt.translation import save_translation_model

    tokenizer = train_tokenizer(read_parallel(multi30k_dir, "train", limit=300), vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=16, ffn_dim=32, layers=1, heads=2,
                                        max_position_embeddings=64))
    return save_translation_model(model, tokenizer, path)


def write_small_data(out: Path, multi30k_dir: Path, pairs: int = 8) -> Path:
    """A parallel-text directory with `pairs` pairs per split (fast to translate)."""
    from prunetrain.mt.data import read_parallel, write_lines

    out.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        chosen = read_parallel(multi30k_dir, split, limit=pairs)
        write_lines(out / f"{split}.de", [s for s, _ in chosen])
        write_lines(out / f"{split}.en", [t for _, t in chosen])
    return out
