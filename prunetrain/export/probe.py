"""A probe input and an output comparison: every export is checked against the model it came from before it is
written (`verify`), so a format that cannot hold a model is refused instead of written wrong."""

from __future__ import annotations

import torch
from torch import nn


def probe_inputs(model: nn.Module, batch: int = 2, length: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token inputs for `model` (decoder inputs too for an encoder-decoder), second row padded."""
    config = model.config
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input != "input_ids":
        raise ValueError(f"model: {type(model).__name__} takes {main_input}, not token ids; exports are checked on "
                         f"token inputs, so only text models can be exported this way (the directory save_pruned "
                         f"writes still loads with from_pretrained(path, trust_remote_code=True)).")
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 4:
        raise ValueError(f"model: its config has no usable vocab_size ({vocab!r}); exports are checked on token inputs.")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, min(vocab, 1000), (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, -2:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, min(vocab, 1000), (batch, length - 1), generator=gen)
    return inputs


def first_output(outputs) -> torch.Tensor:
    """Logits when the model has them, else its first output (e.g. `last_hidden_state`)."""
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs[0]


@torch.no_grad()
def max_difference(a: nn.Module, b: nn.Module, inputs: dict | None = None) -> float:
    """max |a(x) − b(x)| on the probe input (both in eval mode)."""
    inputs = inputs or probe_inputs(a)
    return float((first_output(a.eval()(**inputs)).float() - first_output(b.eval()(**inputs)).float()).abs().max())


def verify(exported: nn.Module, model: nn.Module, fmt: str, tolerance: float) -> float:
    """Raise unless the exported model computes what `model` computes (max |Δ| ≤ `tolerance`)."""
    diff = max_difference(model, exported)
    if not diff <= tolerance:
        raise ValueError(f"format: the {fmt} export differs from the model (max |Δ| {diff:.3g} > {tolerance:g} on a "
                         f"probe input); it is not written.")
    return diff
