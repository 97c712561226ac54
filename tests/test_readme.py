"""The README's Python examples run as written, on tiny models from `prunetrain.zoo` and real Multi30k text.

Each ```python block is executed with a prepared namespace holding the names the README leaves to the reader
(`model`, `batch`, `opt` for the head engine; `model`, `args`, `train`, `collator`, `tok`, `dev_pairs` and
`Seq2SeqTrainer` for the Trainer example), and what it did is checked afterwards.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import prunetrain as pt

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the examples moved to the docs' pages


def python_blocks() -> list[str]:
    """The blocks marked `<!-- docs-test: test_readme -->` (left to this file by tests/test_docs.py)."""
    return [b for page in PAGES for b in re.findall(r"<!-- docs-test: test_readme -->\n```python\n(.*?)```",
                                                    page.read_text(encoding="utf-8"), flags=re.S)]


def block(containing: str) -> str:
    found = [b for b in python_blocks() if containing in b]
    assert len(found) == 1, f"expected one README python block with {containing!r}, found {len(found)}"
    return found[0]


def test_every_python_block_is_exercised():
    blocks = python_blocks()
    assert len(blocks) == 4, "a new block marked docs-test: test_readme needs a namespace and checks here"
    assert all(any(key in b for key in ("Seq2SeqTrainer(", "pt.find_heads(", "pt.find_sites(")) for b in blocks)


def test_the_head_engine_example(tmp_path, monkeypatch):
    from prunetrain.zoo import tiny_inputs, tiny_model

    monkeypatch.chdir(tmp_path)  # the example saves to out/pruned
    model = tiny_model("marian")
    batch = tiny_inputs("marian")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    opt.step()
    before = pt.find_heads(model).total_heads
    namespace = {"model": model, "batch": batch, "opt": opt}
    exec(compile(block("pt.find_heads("), "README.md", "exec"), namespace)
    loaded = namespace["model"]
    assert loaded is not model and pt.find_heads(loaded).total_heads == before - 1
    assert pt.find_heads(loaded)["model.decoder.layers.0.encoder_attn"].heads == (0, 1, 2)
    assert torch.isfinite(namespace["loss"])
    assert (tmp_path / "out" / "pruned" / "prunetrain_layout.json").is_file()
    # the loaded model is the shrunk one: the same tensors, the same outputs (up to the attention kernel's rounding)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert model.state_dict().keys() == loaded.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch).logits, loaded(**batch).logits, rtol=0, atol=1e-6)


def test_the_ffn_example():
    from prunetrain.zoo import tiny_inputs, tiny_model

    model = tiny_model("marian")
    batch = tiny_inputs("marian")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    opt.step()
    heads, neurons = pt.find_heads(model).total_heads, pt.find_neurons(model).total_neurons
    namespace = {"model": model, "batch": batch, "opt": opt}
    exec(compile(block("pt.find_sites("), "README.md", "exec"), namespace)
    assert namespace["sites"].units == ("heads", "neurons")
    assert pt.find_heads(model).total_heads == heads // 2 and pt.find_neurons(model).total_neurons == neurons // 2
    assert all(opt.state[p]["exp_avg"].shape == p.shape for p in model.parameters() if p in opt.state)
    assert namespace["callback"]._flop_target  # the FLOP target is read as one


def _trainer_namespace(tmp_path, multi30k_dir, eval_name: str, eval_split: str, **schedule) -> dict:
    """The names the README's Trainer examples leave to the reader: a tiny Marian model, 32 real training pairs, its
    tokenizer and collator, training arguments (`schedule`: epochs or max_steps) and 4 evaluation pairs."""
    from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer

    pairs = read_parallel(multi30k_dir, "train", limit=32)
    tok = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tok, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.0))
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, use_cpu=True,
                                    report_to=[], save_strategy="no", disable_tqdm=True, logging_strategy="no",
                                    **schedule)
    return {"Seq2SeqTrainer": Seq2SeqTrainer, "model": model, "args": args,
            "train": build_dataset(pairs, tok, max_length=24), "collator": make_collator(tok, model),
            "tok": tok, eval_name: read_parallel(multi30k_dir, eval_split, limit=4)}


def _deprecations(caught) -> list[str]:
    """prunetrain's own deprecation warnings among `caught` (the old keyword form of the callbacks)."""
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
            and "stop working in prunetrain 0.2" in str(w.message)]


@pytest.mark.slow
def test_the_trainer_example(tmp_path, multi30k_dir):
    namespace = _trainer_namespace(tmp_path, multi30k_dir, "dev_pairs", "valid", num_train_epochs=10)
    model = namespace["model"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(block("PruningCurveCallback(Schedule"), "README.md", "exec"), namespace)
    assert not _deprecations(caught), "the README shows the deprecated keyword form"
    out = tmp_path / "run" / "prunetrain"
    # 32 pairs in batches of 16: 2 steps per epoch; files and curves are keyed by global step, labelled with the epoch
    assert {p.name for p in out.glob("importance_step*.json")} >= {f"importance_step{2 * e}_epoch{e}.00.json"
                                                                   for e in (1, 2, 5)}
    curves = json.loads((out / "curves.json").read_text())
    assert [(c["step"], c["epoch"]) for c in curves.values()] == [(2, 1.0), (4, 2.0), (10, 5.0), (20, 10.0)]
    # the schedule {5: 0.2, 8: 0.4} masked 40 % of the 24 heads by the end
    assert pt.HeadMask.from_json(out / "final_mask.json", model).num_kept == 24 - 10


@pytest.mark.slow
def test_the_mask_then_shrink_example(tmp_path, multi30k_dir):
    """The README's schedule as written (masks at 450 and 950, shrinks at 700 and 1200) on a tiny model."""
    namespace = _trainer_namespace(tmp_path, multi30k_dir, "test_pairs", "test", max_steps=1250)
    model = namespace["model"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(block("MetricPointsCallback("), "README.md", "exec"), namespace)
    assert not _deprecations(caught), "the README shows the deprecated keyword form"
    clock, pruning = namespace["clock"], namespace["pruning"]
    assert [(e["step"], e["mode"], e["heads_after"]) for e in pruning.events] == [
        (450, "mask", 18), (700, "mask", 12), (700, "shrink", 12), (950, "mask", 9), (1200, "mask", 6),
        (1200, "shrink", 6)]
    assert pt.find_heads(model).total_heads == 6
    assert [(r["step"], r["heads"]) for r in clock.records] == [(600, 18), (1200, 9)]
    assert [(g["from_step"], g["to_step"], g["heads"]) for g in clock.segments] == [
        (1, 700, 24), (701, 1200, 12), (1201, 1250, 6)]
