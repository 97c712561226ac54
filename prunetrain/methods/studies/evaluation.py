"""How the studies evaluate a model: the metric (masked or not) without gradients, in eval mode."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from prunetrain.engine.mask import HeadMask
from prunetrain.methods.curve import metric_value

Metric = Callable[[nn.Module], Any]
"""`metric(model) -> float | dict` (a dict holds the value under the study's `key`)."""


def evaluate(model: nn.Module, metric: Metric, mask: HeadMask | None = None) -> Any:
    """What the metric returns for the model (masked with `mask`), without gradients."""
    with torch.no_grad(), (mask.applied(model) if mask is not None else contextlib.nullcontext()):
        return metric(model)


def measure(model: nn.Module, metric: Metric, key: str, mask: HeadMask | None = None) -> float:
    """The metric's value under `key` for the model (masked with `mask`), without gradients."""
    return metric_value(evaluate(model, metric, mask), key)[0]


def eval_mode(model: nn.Module) -> bool:
    """Put the model in eval mode; returns whether it was training (for `model.train(was_training)`)."""
    was_training = model.training
    model.eval()
    return was_training


__all__ = ["Metric", "eval_mode", "evaluate", "measure"]
