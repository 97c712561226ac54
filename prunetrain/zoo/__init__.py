"""Tiny models of every supported architecture, built from configs (no downloads): for tests, examples, benchmarks.

Each architecture is an `Architecture` entry in `ARCHITECTURES` (registered with `register_architecture`); the
exactness suite (`tests/test_zoo.py`) runs over all of them and the table of supported architectures (docs/engine.md) is
generated from them (`support_table`). Entries live beside this file by group (`classic`, and one module per group
of families); importing `prunetrain.zoo` registers them all.
"""

from __future__ import annotations

from prunetrain.zoo.architectures import (  # noqa: F401 (the zoo's names)
    ARCHITECTURES, TASKS, VOCAB, Architecture, architecture, random_mask, register_architecture, support_table,
    tiny_config, tiny_inputs, tiny_model)

from prunetrain.zoo import classic  # noqa: E402,F401,I001  (registers the first families)

TINY_FAMILIES = ("bert", "roberta", "marian", "bart", "t5", "gpt2", "llama", "qwen2", "mistral")
"""The architectures of the first families (kept for the older tests; the zoo suite runs over `ARCHITECTURES`)."""
SEQ2SEQ_FAMILIES = tuple(n for n in TINY_FAMILIES if ARCHITECTURES[n].task == "seq2seq")

from prunetrain.zoo import decoders, encoders, seq2seq, vision  # noqa: E402,F401  (register the other groups)
