"""Michel et al. (2019) gradient importance (`head_importance`), with ξ_h the keep value of head h (`HeadMask`):

    I_h = E_x | ∂L(x) / ∂ξ_h |     evaluated at ξ = 1   (eq. 2).

What `head_importance` computes exactly, for units u that are batches (`per="batch"`) or examples
(`per="example"`), S_u the summed token loss of unit u and n_u its number of loss tokens:

    I_h = Σ_u |∂S_u/∂ξ_h| / Σ_u n_u   =   Σ_u n_u |∂L_u/∂ξ_h| / Σ_u n_u,     L_u = S_u / n_u,

i.e. the token-weighted mean over units of |∂L_u/∂ξ_h|, L_u the unit's mean token loss. The ξ carry gradients on
the heads' outputs: one per head for the whole batch (`per="batch"`, a `HeadMask`) or one per example and head
(`per="example"`, hooks on the output projections), read after one backward per batch.

FFN neurons (`units=("heads", "neurons")`): ξ_j is neuron j's keep value on the down projection's input, and
I_j = E_x |∂L(x)/∂ξ_j| comes from the same backward pass as the heads' (one set of keep values, one hook each).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from prunetrain.engine.heads import HeadLayout, live_sites
from prunetrain.engine.mask import HeadMask
from prunetrain.methods.importance.loop import (LossFn, autocast_context, batch_loss, finish_scores, iter_batches,
                                                scoring_mode, scoring_setup)
from prunetrain.methods.importance.scores import HeadScores
from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_choice

PER = ("batch", "example")
NORMALIZE = ("layer", None)
REDUCTION = ("mean", "sum")


def _batch_size(batch: Mapping) -> int | None:
    ids = batch.get("input_ids")
    return int(ids.shape[0]) if torch.is_tensor(ids) and ids.dim() >= 1 else None


class _ExampleGate:
    """Forward pre-hook on an output projection: multiply head h of example b by its own leaf ξ[b, h] = 1.

    Example b's loss depends only on ξ[b, :], so one backward of the batch loss gives every example's ∂L/∂ξ_h.
    """

    def __init__(self, num_heads: int, head_dim: int):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.gate: torch.Tensor | None = None
        self.batch_size: int | None = None  # from the batch's input_ids, to catch time-first activations

    def __call__(self, module: nn.Module, args: tuple):
        (x, *rest) = args  # x: [B, T, H * d]
        if self.batch_size is not None and (x.dim() != 3 or x.shape[0] != self.batch_size):
            raise RuntimeError(f"per='example': this model's heads come out as {tuple(x.shape)}, not batch-first "
                               f"[{self.batch_size}, time, heads*dim] (e.g. FSMT/fairseq are time-first); use "
                               f"per='batch'.")
        if self.gate is None:
            self.gate = torch.ones(x.shape[0], self.num_heads, device=x.device, dtype=torch.float32,
                                   requires_grad=True)
        if x.dim() != 3 or x.shape[0] != self.gate.shape[0]:
            raise RuntimeError(f"per='example': expected the heads' output as [batch, time, heads*dim] with batch "
                               f"{self.gate.shape[0]}, got shape {tuple(x.shape)}.")
        gate = self.gate.to(x.dtype)[:, None, :, None]  # [B, 1, H, 1]
        return ((x.unflatten(-1, (self.num_heads, self.head_dim)) * gate).flatten(-2), *rest)


class _BatchGates:
    """per="batch": one keep value ξ_h per head (a `HeadMask` with gradients), shared by the batch's examples."""

    def __init__(self, net: nn.Module, layout: HeadLayout):
        self.layout = layout
        self.mask = HeadMask(layout).requires_grad_()
        self.mask.attach(net)

    def start(self, batch: Mapping) -> None:
        self.mask.zero_grad()

    def abs_grad(self, name: str) -> torch.Tensor:
        grad = self.mask[name].grad
        return grad.abs() if grad is not None else torch.zeros(self.layout[name].num_heads)

    def close(self) -> None:
        self.mask.detach()
        self.mask.requires_grad_(False)


class _ExampleGates:
    """per="example": one ξ[b, h] per example and head (`_ExampleGate` hooks), so one backward gives every example's
    gradient; `abs_grad` sums |∂L/∂ξ[b, h]| over the examples b."""

    def __init__(self, net: nn.Module, layout: HeadLayout):
        sites = live_sites(net, layout.units)
        if sites and sites[0].adapter.time_first:
            raise ValueError(f"per: 'example' needs batch-first attention outputs; {sites[0].adapter.name} "
                             f"models are time-first, so use per='batch'.")
        self.layout = layout
        self.gates = {s.info.name: _ExampleGate(s.info.num_heads, s.info.head_dim) for s in sites}
        self.handles = [s.out_proj.register_forward_pre_hook(self.gates[s.info.name]) for s in sites]

    def start(self, batch: Mapping) -> None:
        size = _batch_size(batch)
        for gate in self.gates.values():
            gate.gate, gate.batch_size = None, size

    def abs_grad(self, name: str) -> torch.Tensor:
        gate = self.gates[name].gate
        grad = gate.grad if gate is not None else None
        return grad.abs().sum(0) if grad is not None else torch.zeros(self.layout[name].num_heads)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        for gate in self.gates.values():
            gate.gate = None


@contextlib.contextmanager
def _unit_gates(per: str, net: nn.Module, layout: HeadLayout) -> Iterator["_BatchGates | _ExampleGates"]:
    """The ξ whose gradients `head_importance` reads, attached for the duration (removed also on error)."""
    gates = _BatchGates(net, layout) if per == "batch" else _ExampleGates(net, layout)
    try:
        yield gates
    finally:
        gates.close()


@checked(own=("batches", "loss_fn", "autocast"))
def head_importance(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    *,
    loss_fn: LossFn | None = None,
    per: str = "batch",
    normalize: str | None = "layer",
    reduction: str = "mean",
    autocast: torch.dtype | None = None,
    max_batches: int | None = None,
    sync: bool | None = None,
    units=("heads",),
) -> HeadScores:
    """Michel et al. (2019) head importance I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1 (eq. 2; see the module docstring
    for the exact token-weighted expectation).

    One forward and one backward per batch; model parameters get no gradients (they are frozen for the duration,
    and `requires_grad` flags and train/eval mode are restored exactly afterwards, also on error). Runs in eval mode
    (no dropout). Masks already attached to the model stay in effect (a removed head scores 0).

    Args:
        model: the model (a DDP-style `.module` wrapper is unwrapped; an FSDP2 model is scored as it is).
        batches: an iterable of batches (mappings of model inputs), e.g. a list or a DataLoader.
        loss_fn: None → the model's own loss (batches need `labels`; seq2seq and MLM average token cross-entropy
            over labels != -100, so padding must be -100 as HF collators produce; causal LMs shift labels by one).
            Otherwise `loss_fn(model, batch) -> loss | (loss, n)` with `loss` a mean over `n` items (default 1).
        per: "batch" (default; the authors' code: |∂L_b/∂ξ| of each batch's loss) or "example" (the paper: one
            |∂L_x/∂ξ| per example, obtained exactly from the same single backward by giving each example its own
            ξ[b, h]; cost ≈ per="batch").
        normalize: "layer" (default, as the authors' code): divide each site's importance by its L2 norm;
            None: raw values.
        reduction: "mean" (default): divide by the total token count Σ n_u; "sum": Σ_u |∂S_u/∂ξ_h| undivided.
        autocast: a dtype (e.g. torch.bfloat16) to run forward under `torch.autocast`, or None.
        max_batches: score at most this many batches (None: all).
        sync: None (default): all-reduce sums and counts when torch.distributed is initialised with >1 rank (every
            rank must call this function); False: local only; True: require a process group.
        units: "heads" (default), "neurons" or both: the sites scored (neurons: FFN neurons, I_j of their keep
            values on the down projections' input, in the same backward pass).

    Returns:
        `HeadScores` (method "gradient"); `meta` records the options, tokens, batches and world size.
    """
    check_choice("per", per, PER)
    check_choice("normalize", normalize, NORMALIZE)
    check_choice("reduction", reduction, REDUCTION)
    world, net, device, layout, acc = scoring_setup(model, sync, autocast, units)
    with scoring_mode(net), _unit_gates(per, net, layout) as gates:
        for batch in iter_batches(batches, device, max_batches):
            gates.start(batch)
            with autocast_context(device, autocast):
                loss, n = batch_loss(net, batch, loss_fn)
            if n <= 0:
                continue
            loss.backward()
            for site in layout:  # Σ_u |∂S_u/∂ξ_h| = n · Σ_u |∂L/∂ξ_u,h| (L the batch's mean loss)
                acc.add(site.name, n * gates.abs_grad(site.name), n)
            acc.batches += 1
    values, world = finish_scores(acc, net, world, reduction)
    meta = {"per": per, "normalize": None, "reduction": reduction, "tokens": acc.counts[layout.names[0]]
            if layout.names else 0.0, "batches": acc.batches, "world_size": world,
            "loss": "model" if loss_fn is None else "custom", "autocast": str(autocast) if autocast else None}
    scores = HeadScores(layout, values, "gradient", meta)
    return scores.normalized("layer") if normalize == "layer" else scores


__all__ = ["NORMALIZE", "PER", "REDUCTION", "head_importance"]
