"""The zoo's registry: an `Architecture` per tiny model, `register_architecture`, and the helpers that build a
tiny model, its inputs and a random mask from an entry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

VOCAB = 96
TASKS = ("causal-lm", "seq2seq", "masked-lm", "classification", "image-classification", "speech-seq2seq",
         "contrastive")


@dataclass(frozen=True)
class Architecture:
    """One tiny architecture of the zoo.

    Args:
        name: zoo key (e.g. "qwen3"); usually the config's model_type.
        model_type: `config.model_type` of the built model.
        make_config: `(**overrides) -> PretrainedConfig`, tiny and without dropout.
        model_class: the transformers class built from the config (e.g. "Qwen3ForCausalLM").
        task: one of `TASKS`; decides the default inputs and whether `generate` is checked.
        pattern: the attention pattern it exercises (a short phrase for the table of docs/engine.md).
        shrink: False if `shrink` is refused for this architecture (masks and importance still work); `note` says why.
        note: a short remark for the table of docs/engine.md.
        make_inputs: `(batch, length, seed) -> inputs` (with labels) when the task's default does not fit.
        backends: the attention implementations the architecture supports (the suite checks each).
    """

    name: str
    model_type: str
    make_config: Callable[..., object]
    model_class: str
    task: str
    pattern: str
    shrink: bool = True
    note: str = ""
    make_inputs: Callable[[int, int, int], dict] | None = None
    backends: tuple[str, ...] = ("eager", "sdpa")

    @property
    def generative(self) -> bool:
        return self.task in ("causal-lm", "seq2seq", "speech-seq2seq")


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> Architecture:
    """Add an architecture to the zoo (and so to the exactness suite and the table of docs/engine.md)."""
    if arch.task not in TASKS:
        raise ValueError(f"task: {arch.task!r} is not one of {', '.join(TASKS)}.")
    if arch.name in ARCHITECTURES:
        raise ValueError(f"name: {arch.name!r} is already in the zoo.")
    ARCHITECTURES[arch.name] = arch
    return arch


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"family: {name!r} is not one of {', '.join(ARCHITECTURES)}.") from None


def tiny_config(family: str, attn_implementation: str = "eager", **overrides):
    """The tiny config of a zoo architecture, with `overrides` set on it."""
    cfg = architecture(family).make_config()
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg._attn_implementation = attn_implementation
    return cfg


def tiny_model(family: str, attn_implementation: str = "eager", seed: int = 0, **overrides) -> nn.Module:
    """A tiny model of a zoo architecture, random weights (and random biases) from `seed`, in eval mode."""
    import transformers as tf

    cfg = tiny_config(family, attn_implementation, **overrides)
    cls = getattr(tf, architecture(family).model_class)
    torch.manual_seed(seed)
    model = cls(cfg)
    _randomise_biases(model, seed)
    return model.eval()


def _randomise_biases(model: nn.Module, seed: int) -> None:
    """HF initialises biases to zero; random biases make tests sensitive to every bias slice."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") and param.dim() == 1:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def tiny_inputs(family: str, batch: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs with padding in the second row (attention masks exercised), and labels/decoder inputs for seq2seq."""
    arch = architecture(family)
    if arch.make_inputs is not None:
        return arch.make_inputs(batch, length, seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, -2:] = 0
        ids[1, -2:] = 0 if arch.model_type in ("t5", "mt5") else 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if arch.task == "seq2seq":
        inputs["labels"] = torch.randint(3, VOCAB, (batch, length - 2), generator=gen)
    else:
        inputs["labels"] = ids.clone()
    return inputs


def random_mask(model_or_layout, seed: int = 0, remove: float = 0.5, soft: bool = False, empty_site: int | None = 0):
    """A reproducible random HeadMask: about `remove` of the heads (whole key/value groups under GQA) set to 0.

    `empty_site`: index of a site whose heads are all removed (None: none). `soft`: kept heads get values in
    (0, 1] instead of 1, to exercise scaling.
    """
    from prunetrain.engine.mask import HeadMask

    mask = HeadMask.ones(model_or_layout)
    gen = torch.Generator().manual_seed(seed)
    for index, site in enumerate(mask.layout):
        g = site.group_size
        groups = site.num_heads // g
        alive = (torch.rand(groups, generator=gen) >= remove).repeat_interleave(g).float()
        if empty_site is not None and index == empty_site:
            alive.zero_()
        values = alive * (torch.rand(site.num_heads, generator=gen) * 0.9 + 0.1 if soft else 1.0)
        mask[site.name] = values
    return mask


def support_table() -> str:
    """The table of supported architectures (docs/engine.md), generated from the zoo."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")  # a pipe, even inside `code`, would split a Markdown table cell

    rows = ["| architecture | model_type | attention pattern | shrink | note |", "|---|---|---|---|---|"]
    for arch in ARCHITECTURES.values():
        rows.append(f"| {arch.name} | `{arch.model_type}` | {cell(arch.pattern)} | "
                    f"{'yes' if arch.shrink else 'refused'} | {cell(arch.note)} |")
    return "\n".join(rows)
