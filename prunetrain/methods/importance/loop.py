"""The scoring loop every scorer shares: batches moved to the model's device, the loss of a batch and its token
count, frozen parameters in eval mode, optional autocast, and per-head sums that are all-reduced across ranks under
`torch.distributed` (so every rank gets the scores of the union of all ranks' batches)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from prunetrain.engine.heads import HeadLayout, find_sites, unwrap_model
from prunetrain.utils.device import device_of
from prunetrain.utils.progress import bar

LossFn = Callable[[nn.Module, dict], Any]
"""`loss_fn(model, batch) -> loss` or `-> (loss, n)`: a scalar loss that is a mean over `n` items (tokens); `n`
weights the batch in the token-weighted mean (default 1)."""


def batch_to(batch: Mapping, device: torch.device) -> dict:
    """A batch (mapping) with its tensors moved to `device`."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def iter_batches(batches: Iterable, device: torch.device, max_batches: int | None) -> Iterator[dict]:
    """Validate the arguments now; yield each batch (a mapping) with its tensors moved to `device`."""
    if isinstance(batches, Mapping):
        raise ValueError("batches: got a single batch (a mapping); pass an iterable of batches, e.g. [batch] or a "
                        "DataLoader.")
    if max_batches is not None and (not isinstance(max_batches, int) or isinstance(max_batches, bool)
                                    or max_batches < 1):
        raise ValueError(f"max_batches: {max_batches!r} is not allowed; give a positive int or None (all batches).")

    def moved() -> Iterator[dict]:
        total = len(batches) if hasattr(batches, "__len__") else None
        if max_batches is not None and total is not None:
            total = min(total, max_batches)
        for i, batch in enumerate(bar(batches, total=total, desc="importance", unit="batch")):
            if max_batches is not None and i >= max_batches:
                return
            if not isinstance(batch, Mapping):
                raise ValueError(f"batches: each batch must be a mapping of model inputs (a dict, as a DataLoader "
                                f"with a HF collator yields), got {type(batch).__name__}.")
            yield batch_to(batch, device)

    return moved()


def is_causal_lm(model: nn.Module) -> bool:
    """Decoder-only LMs shift labels by one inside their loss (HF `ForCausalLMLoss`)."""
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    name = type(model).__name__
    return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")


def loss_token_count(model: nn.Module, batch: Mapping) -> int:
    """Number of items the model's own (mean) loss averages over: labels != -100 (shifted by one for causal LMs);
    every element for float labels (regression, multi-label)."""
    labels = batch["labels"]
    if labels.is_floating_point():
        return labels.numel()
    if is_causal_lm(unwrap_model(model)):
        labels = labels[..., 1:]
    return int((labels != -100).sum())


def batch_loss(model: nn.Module, batch: dict, loss_fn: LossFn | None) -> tuple[torch.Tensor, float]:
    """`(mean loss, n)`: the model's own loss over its `n` label tokens, or the custom `loss_fn`'s."""
    if loss_fn is not None:
        result = loss_fn(model, batch)
        loss, n = result if isinstance(result, tuple) else (result, 1.0)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError(f"loss_fn: must return a scalar tensor (or (scalar, n)), got {type(loss).__name__}"
                            f"{'' if not torch.is_tensor(loss) else f' of shape {tuple(loss.shape)}'}.")
        return loss.reshape(()), float(n)
    if "labels" not in batch:
        raise ValueError(f"batches: a batch has no 'labels' (keys: {', '.join(batch)}), so the model computes no "
                         f"loss; add labels or pass loss_fn(model, batch) -> scalar.")
    outputs = model(**batch)
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if loss is None:
        raise ValueError(f"model: {type(model).__name__} returned no loss for a batch with labels (a base model "
                         f"without a head?); pass loss_fn(model, batch) -> scalar.")
    return loss, float(loss_token_count(model, batch))


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"autocast: expected a torch.dtype (e.g. torch.bfloat16) or None, got {dtype!r}.")
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and frozen parameters for the duration; every module's `training` flag and every
    parameter's `requires_grad` flag are restored exactly afterwards, also on error."""
    training = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        model.eval()
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        for m, flag in training:
            m.training = flag


def distributed_world(sync: bool | None) -> int:
    """World size to reduce over (1 = no reduction)."""
    if sync is not None and not isinstance(sync, bool):
        raise ValueError(f"sync: expected True, False or None (auto), got {sync!r}.")
    available = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sync and not available:
        raise ValueError("sync: True needs an initialised torch.distributed process group; none is initialised.")
    if sync is False or not available:
        return 1
    return torch.distributed.get_world_size()


class HeadSums:
    """Per-site sums `[num_heads]` and counts (float64, CPU), all-reduced across ranks when distributed."""

    def __init__(self, layout: HeadLayout):
        self.layout = layout
        self.sums = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in layout}
        self.counts = {s.name: 0.0 for s in layout}
        self.batches = 0

    def add(self, name: str, values: torch.Tensor, count: float) -> None:
        self.sums[name] += values.detach().to("cpu", torch.float64)
        self.counts[name] += float(count)

    def all_reduce(self, model: nn.Module) -> int:
        """Sum across ranks (a collective: every rank must call it). Returns the world size."""
        import torch.distributed as dist

        names = self.layout.names
        flat = torch.cat([self.sums[n] for n in names]
                         + [torch.tensor([self.counts[n] for n in names] + [float(self.batches)], dtype=torch.float64)])
        backend = str(dist.get_backend())
        device = device_of(model) if "nccl" in backend and device_of(model).type == "cuda" else torch.device("cpu")
        flat = flat.to(device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.cpu()
        offset = 0
        for n in names:
            k = self.sums[n].numel()
            self.sums[n] = flat[offset: offset + k].clone()
            offset += k
        for n in names:
            self.counts[n] = float(flat[offset])
            offset += 1
        self.batches = int(flat[offset])
        return dist.get_world_size()

    def result(self, reduction: str) -> dict[str, torch.Tensor]:
        if reduction == "sum":
            return {n: v.clone() for n, v in self.sums.items()}
        return {n: v / self.counts[n] if self.counts[n] > 0 else torch.zeros_like(v) for n, v in self.sums.items()}


def finish_scores(acc: HeadSums, model: nn.Module, world: int, reduction: str) -> tuple[dict, int]:
    """All-reduce (if distributed; a rank with no batches still takes part) and turn sums into scores."""
    if world > 1:
        acc.all_reduce(model)
    if acc.batches == 0:
        raise ValueError("batches: no batch was scored (empty iterable, or every batch had 0 loss tokens).")
    return acc.result(reduction), world


def scoring_setup(model: nn.Module, sync: bool | None, autocast, units=("heads",)
                  ) -> tuple[int, nn.Module, torch.device, HeadLayout, HeadSums]:
    """What every scorer starts with: the distributed world size, the inner model (forward it, not a DDP wrapper,
    which would expect parameter gradients), its device, its layout of `units` and empty per-unit sums. The
    autocast argument is validated here, before any work."""
    world = distributed_world(sync)
    net = unwrap_model(model)
    device = device_of(net)
    autocast_context(device, autocast)
    layout = find_sites(net, units)
    return world, net, device, layout, HeadSums(layout)


__all__ = ["HeadSums", "LossFn", "autocast_context", "batch_loss", "batch_to", "distributed_world",
           "finish_scores", "is_causal_lm", "iter_batches", "loss_token_count", "scoring_mode", "scoring_setup"]
