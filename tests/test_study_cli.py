"""`prunetrain study ablate|one-head|cross-dataset|curves|per-kind|speed` (Michel et al. 2019 §3-5) through the real
entry point, on a tiny translation model that has memorized six Multi30k pairs (so BLEU is high and removing heads
changes it), with values checked against an independent in-process evaluation of the same masks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import run_cli

STUDY_NAMES = ("ablate", "one-head", "cross-dataset", "curves", "per-kind", "speed")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADS = 4
SITES = 6  # 2 encoder self + 2 decoder self + 2 cross


@pytest.fixture(scope="module")
def memorized(tmp_path_factory, multi30k_dir):
    """(model directory, data directory): a 2+2-layer, 4-head Marian model trained to reproduce six pairs, and a
    parallel-text directory whose train/valid/test splits are those six pairs (written at test time)."""
    from transformers import MarianMTModel

    from prunetrain.mt.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer, \
        write_lines
    from prunetrain.mt.translation import save_translation_model

    pairs = read_parallel(multi30k_dir, "train", limit=300)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    memo = pairs[:6]
    root = tmp_path_factory.mktemp("study-cli")
    data = root / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        write_lines(data / f"{split}.de", [s for s, _ in memo])
        write_lines(data / f"{split}.en", [t for _, t in memo])
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=HEADS, dropout=0.0))
    dataset = build_dataset(memo, tokenizer, max_length=40)
    batch = make_collator(tokenizer, model)([dataset[i] for i in range(len(dataset))])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(120):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    save_translation_model(model, tokenizer, root / "model")
    return root / "model", data


def _bleu_with_mask(model_dir: Path, data: Path, drop: dict[str, list[int]]) -> float:
    """BLEU on the six valid pairs with the heads in `drop` masked, computed here (not by the study code)."""
    from prunetrain.engine.mask import HeadMask
    from prunetrain.mt.data import read_parallel
    from prunetrain.engine.model_dir import load_model_dir
    from prunetrain.mt.translation import evaluate_bleu, load_model_tokenizer

    model = load_model_dir(model_dir).eval()
    tokenizer = load_model_tokenizer(model_dir, None)
    pairs = read_parallel(data, "valid")
    with torch.no_grad(), HeadMask.from_heads(model, drop).applied(model):
        return evaluate_bleu(model, tokenizer, pairs, batch_size=100, num_beams=1)["bleu"]


