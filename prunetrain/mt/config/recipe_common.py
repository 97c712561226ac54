"""What every recipe kind shares (`recipe` and `recipe_l0` both read it): the allowed values, the range checks that
name the recipe key, the `data:` section and the recipe header's check."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prunetrain.utils.validate import check_choice, check_fraction, check_int

KINDS = ("encoder_self", "decoder_self", "cross")  # the attention kinds of the recipes' Marian model
PRECISIONS = ("auto", "bf16", "fp32")
TRAIN_PRECISIONS = PRECISIONS + ("measure",)  # measure: the faster of bf16 and fp32 on this machine, timed first
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
MEASURED_ATTENTIONS = ("eager", "sdpa")  # model.attn_implementation=measure: the faster of these, timed first
SCOPES = ("global", "layer", "kind")
MODES = ("mask", "shrink")
METHODS = ("importance", "l0")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_number(key: str, value: float, low: float, high: float | None = None, *, low_open: bool = False,
                  high_open: bool = False) -> None:
    """A finite number in [low, high] (open ends where asked), else one sentence naming the recipe key."""
    too_low = value <= low if low_open else value < low
    too_high = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or too_low or too_high:
        interval = (("(" if low_open else "[") + f"{low:g}, " +
                    ("inf)" if high is None else f"{high:g}" + (")" if high_open else "]")))
        raise ValueError(f"{key}: {value!r} is not allowed; expected a finite number in {interval}.")


def _check_fractions(key: str, values) -> None:
    for value in values:
        check_fraction(key, value)


def _check_counts(key: str, values, minimum: int = 1) -> None:
    for value in values:
        check_int(key, value, minimum)


def _check_scheduler(key: str, value: str) -> None:
    from transformers.trainer_utils import SchedulerType

    check_choice(key, value, [s.value for s in SchedulerType])


def _pruned_heads(fraction: float, total: int) -> int:
    """Heads a fraction prunes out of `total` (rounded half up, as `prunetrain.methods.selection.select_heads`)."""
    return int(math.floor(fraction * total + 0.5 + 1e-9))


@dataclass
class DataConfig:
    dir: str = ""  # parallel-text directory (train|valid|test.{src,tgt}); "" = <shared data>/multi30k
    hf_dataset: str = ""  # a Hugging Face dataset name instead of `dir` (needs network)
    src: str = "de"
    tgt: str = "en"
    train_limit: int = 0  # use only the first N training pairs (0: all)
    test_split: str = "test"
    vocab_size: int = 8000  # joint subword vocabulary (byte-level BPE) trained on the training split
    max_length: int = 128  # tokens per sentence (longer ones are truncated)

    def __post_init__(self):
        for key in ("src", "tgt", "test_split"):
            if not getattr(self, key).strip():
                raise ValueError(f"data.{key}: an empty string; give a name (e.g. data.src=de).")
        if self.src == self.tgt:
            raise ValueError(f"data.tgt: {self.tgt!r} is also data.src; source and target languages must differ.")
        if self.dir and self.hf_dataset:
            raise ValueError("data.hf_dataset: set either data.dir or data.hf_dataset, not both.")
        check_int("data.train_limit", self.train_limit, 0)
        check_int("data.vocab_size", self.vocab_size, 300)  # byte-level BPE: 256 bytes + 3 special tokens + merges
        check_int("data.max_length", self.max_length, 2)


def _check_header(recipe, kind: str) -> None:
    if recipe.kind != kind:
        raise ValueError(f"kind: {recipe.kind!r} does not match this recipe class (kind {kind!r}).")
    if not isinstance(recipe.name, str) or not _NAME.fullmatch(recipe.name):
        raise ValueError(f"name: {recipe.name!r} is not allowed; use letters, digits, '.', '_' and '-' (it names "
                         f"the run directory checkpoints/<name>).")
