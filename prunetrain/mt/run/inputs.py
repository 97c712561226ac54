"""What a recipe run starts from: its data pairs (`load_pairs`), the tokenized sets and fixed batches the training and
the final evaluation share (`RunInputs`, `prepare_inputs`) and a fresh model of the recipe's size (`build_model`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from prunetrain.mt.config.recipe import Recipe
from prunetrain.utils.device import use_bf16


def load_pairs(recipe, data_dir: str | None):
    """(train, valid, test) pairs from the recipe's data source (`data.dir`, `--data-dir` or `data.hf_dataset`).

    Args:
        recipe: a translation or l0-sweep recipe (its `data` section is read).
        data_dir: a directory instead of `data.dir` (the runners record it in the recipe first, with
            `prunetrain.mt.run.run_record.with_data_dir`, and pass None).
    """
    from prunetrain.mt.text import data as D

    cfg = recipe.data
    if cfg.hf_dataset:
        train = D.load_hf_parallel(cfg.hf_dataset, split="train", src=cfg.src, tgt=cfg.tgt)
        valid = D.load_hf_parallel(cfg.hf_dataset, split="validation", src=cfg.src, tgt=cfg.tgt)
        test = D.load_hf_parallel(cfg.hf_dataset, split=cfg.test_split, src=cfg.src, tgt=cfg.tgt)
    else:
        from prunetrain.mt.text.corpus import multi30k_dir  # shared copy, $PRUNETRAIN_DATA, else fetched into the cache

        directory = Path(data_dir or cfg.dir or multi30k_dir())
        if not directory.is_dir():
            raise ValueError(f"data: {str(directory)!r} is not a directory; give --data-dir with "
                             f"train|valid|test.{{{cfg.src},{cfg.tgt}}} files.")
        limit = cfg.train_limit or None
        train = D.read_parallel(directory, "train", cfg.src, cfg.tgt, limit=limit)
        valid = D.read_parallel(directory, "valid", cfg.src, cfg.tgt)
        test = D.read_parallel(directory, cfg.test_split, cfg.src, cfg.tgt)
    return train, valid, test


@dataclass
class RunInputs:
    """What the training and the final evaluation share: tokenizer, datasets and fixed batches."""

    tokenizer: object
    train_set: object
    importance_batches: list
    curve_pairs: list
    test_pairs: list
    bf16: bool
    precision: dict | None = None  # how the precision was chosen (train.precision=measure: the timings)
    valid_pairs: list | None = None  # scored wherever the test split is (eval.valid); None: not scored
    more_test_pairs: dict = field(default_factory=dict)  # {split: pairs} the final model is also scored on
    test_split: str = "test"

    def final_sets(self) -> dict[str, list]:
        """{split: pairs} the final model is scored on: validation (when scored), the main test split, the others."""
        sets = {"valid": self.valid_pairs} if self.valid_pairs is not None else {}
        return {**sets, self.test_split: self.test_pairs, **self.more_test_pairs}


def prepare_inputs(recipe: Recipe, tokenizer, model, pairs) -> RunInputs:
    """Tokenize the data and collate the fixed importance batches (decoder inputs built as the model does)."""
    from prunetrain.mt.text import data as D

    train_pairs, valid_pairs, test_pairs, more_tests = pairs
    p, ev, max_length = recipe.pruning, recipe.eval, recipe.data.max_length
    importance_set = D.build_dataset(train_pairs[: p.importance_batches * p.importance_batch_size], tokenizer,
                                     max_length=max_length)
    importance_batches = D.collate_batches(importance_set, D.make_collator(tokenizer, model), p.importance_batch_size)
    first = lambda pairs, limit: pairs[:limit] if limit else pairs  # noqa: E731
    return RunInputs(tokenizer=tokenizer, train_set=D.build_dataset(train_pairs, tokenizer, max_length=max_length),
                     importance_batches=importance_batches, curve_pairs=valid_pairs[: p.curve_sentences],
                     test_pairs=first(test_pairs, ev.test_limit),
                     bf16=recipe.train.precision != "measure" and use_bf16(recipe.train.precision),
                     valid_pairs=first(valid_pairs, ev.valid_limit) if ev.valid else None,
                     more_test_pairs={name: first(pairs, ev.test_limit) for name, pairs in more_tests.items()},
                     test_split=recipe.data.test_split)


def build_model(recipe: Recipe, tokenizer):
    """A fresh `MarianMTModel` of the recipe's size (seeded by `train.seed`)."""
    from transformers import MarianMTModel

    from prunetrain.mt.text.data import marian_config

    m = recipe.model
    torch.manual_seed(recipe.train.seed)
    return MarianMTModel(marian_config(tokenizer, d_model=m.d_model, ffn_dim=m.ffn_dim, layers=m.layers,
                                       heads=m.heads, dropout=m.dropout, attn_implementation=m.built_attention))
