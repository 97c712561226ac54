"""The other scorers: ablation (the loss change of removing each head alone), Voita et al.'s (2019) confidence
(the mean maximum attention weight) and seeded random scores (the baseline)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from prunetrain.engine.heads import HeadLayout, attention_sites, find_heads
from prunetrain.engine.mask import HeadMask
from prunetrain.methods.importance.loop import (HeadSums, LossFn, autocast_context, batch_loss, finish_scores,
                                                iter_batches, scoring_mode, scoring_setup)
from prunetrain.methods.importance.scores import HeadScores
from prunetrain.utils.door import checked


# ---------------------------------------------------------------------------------------------------------------------
# ablation: the real loss change of removing each head alone
# ---------------------------------------------------------------------------------------------------------------------
@checked(own=("batches", "loss_fn", "autocast"))
def ablation_scores(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    loss_fn: LossFn | None = None,
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
) -> HeadScores:
    """Score_h = token-weighted mean over batches of L(model with head h alone removed) − L(model).

    Negative: removing the head lowers the loss. Costs 1 + H forward passes per batch (H = all heads), no backward.
    Masks already attached to the model stay in effect. Eval mode, no gradients.

    Args:
        model: the model.
        batches: an iterable of batches with labels (or use `loss_fn`).
        loss_fn: as in `head_importance`.
        autocast: a dtype to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: distributed reduction, as in `head_importance`.
    """
    world, net, device, layout, acc = scoring_setup(model, sync, autocast)
    probe = HeadMask(layout)
    with scoring_mode(net), torch.no_grad():
        probe.attach(net)
        try:
            for batch in iter_batches(batches, device, max_batches):
                with autocast_context(device, autocast):
                    base, n = batch_loss(net, batch, loss_fn)
                if n <= 0:
                    continue
                for s in layout:
                    deltas = torch.zeros(s.num_heads, dtype=torch.float64)
                    for h in range(s.num_heads):
                        probe.set(s.name, h, 0.0)
                        try:
                            with autocast_context(device, autocast):
                                loss, _ = batch_loss(net, batch, loss_fn)
                        finally:
                            probe.set(s.name, h, 1.0)
                        deltas[h] = float(loss) - float(base)
                    acc.add(s.name, n * deltas, n)
                acc.batches += 1
        finally:
            probe.detach()
    values, world = finish_scores(acc, net, world, "mean")
    meta = {"batches": acc.batches, "world_size": world, "loss": "model" if loss_fn is None else "custom",
            "autocast": str(autocast) if autocast else None}
    return HeadScores(layout, values, "ablation", meta)


# ---------------------------------------------------------------------------------------------------------------------
# confidence (Voita et al. 2019)
# ---------------------------------------------------------------------------------------------------------------------
def _query_masks(batch: Mapping) -> dict[str, torch.Tensor | None]:
    """Which query positions are real tokens: encoder/self-attention from `attention_mask`; decoder self and cross
    attention from `decoder_attention_mask`, else from `labels != -100` when the decoder inputs come from labels."""
    encoder = batch.get("attention_mask")
    decoder = batch.get("decoder_attention_mask")
    if decoder is None and "decoder_input_ids" not in batch and torch.is_tensor(batch.get("labels")):
        labels = batch["labels"]
        decoder = labels != -100 if labels.dim() == 2 and not labels.is_floating_point() else None
    return {"encoder_self": encoder, "self": encoder, "decoder_self": decoder, "cross": decoder}


class _ConfidenceHook:
    """Forward hook on an attention module: Σ over real query tokens of max_k attention weight, per head."""

    def __init__(self, name: str, kind: str, acc: HeadSums):
        self.name, self.kind, self.acc = name, kind, acc
        self.query_masks: dict = {}

    def __call__(self, module: nn.Module, args, output):
        weights = output[-1] if isinstance(output, tuple) else None
        if not torch.is_tensor(weights) or weights.dim() != 4:
            raise RuntimeError(f"confidence: site {self.name!r} returned no attention weights [batch, heads, query, "
                               f"key]; this scorer needs the eager attention implementation.")
        top = weights.detach().float().amax(dim=-1)  # [B, H, Tq]
        mask = self.query_masks.get(self.kind)
        if mask is not None and tuple(mask.shape) == (top.shape[0], top.shape[2]):
            keep = mask.to(top.device, top.dtype)[:, None, :]  # [B, 1, Tq]
            total, count = (top * keep).sum(dim=(0, 2)), float(keep.sum())
        else:
            total, count = top.sum(dim=(0, 2)), float(top.shape[0] * top.shape[2])
        self.acc.add(self.name, total, count)


@contextlib.contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """Temporarily switch a transformers model to eager attention (the only one that returns attention weights)."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", "eager")
    if current == "eager":
        yield
        return
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"model: uses {current!r} attention and cannot be switched to 'eager', which the "
                         f"confidence scorer needs for attention weights.")
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


@checked(own=("batches", "autocast"))
def confidence_scores(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
) -> HeadScores:
    """Voita et al. (2019) confidence: the mean over real (non-padding) query tokens of the head's maximum attention
    weight. In [1/T, 1] for T keys; a head that always attends to one token scores 1. Runs the model in eval mode with
    eager attention (switched temporarily), without labels and without gradients.

    Args:
        model: the model.
        batches: an iterable of batches (labels not needed).
        autocast: a dtype to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: distributed reduction, as in `head_importance`.
    """
    world, net, device, layout, acc = scoring_setup(model, sync, autocast)
    sites = attention_sites(net)
    hooks = {s.info.name: _ConfidenceHook(s.info.name, s.info.kind, acc) for s in sites}
    with scoring_mode(net), torch.no_grad(), _eager_attention(net):
        handles = [s.module.register_forward_hook(hooks[s.info.name]) for s in sites]
        try:
            for batch in iter_batches(batches, device, max_batches):
                masks = _query_masks(batch)
                for hook in hooks.values():
                    hook.query_masks = masks
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                if "labels" in batch and getattr(net.config, "is_encoder_decoder", False) \
                        and "decoder_input_ids" not in batch:
                    inputs["labels"] = batch["labels"]  # seq2seq models build decoder inputs from labels
                with autocast_context(device, autocast):
                    net(**inputs)
                acc.batches += 1
        finally:
            for handle in handles:
                handle.remove()
    values, world = finish_scores(acc, net, world, "mean")
    return HeadScores(layout, values, "confidence", {"batches": acc.batches, "world_size": world})


# ---------------------------------------------------------------------------------------------------------------------
# random baseline
# ---------------------------------------------------------------------------------------------------------------------
@checked
def random_scores(model_or_layout: nn.Module | HeadLayout, *, seed: int = 0) -> HeadScores:
    """Uniform [0, 1) scores from a seeded generator: the same seed and layout always give the same scores.

    Args:
        model_or_layout: a model or its `HeadLayout`.
        seed: the generator's seed.
    """
    layout = model_or_layout if isinstance(model_or_layout, HeadLayout) else find_heads(model_or_layout)
    gen = torch.Generator().manual_seed(seed)
    values = {s.name: torch.rand(s.num_heads, generator=gen, dtype=torch.float64) for s in layout}
    return HeadScores(layout, values, "random", {"seed": seed})



__all__ = ["ablation_scores", "confidence_scores", "random_scores"]
