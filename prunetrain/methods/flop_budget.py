"""Costs in multiply-adds, so one budget trades attention heads against FFN neurons.

Per token, a weight matrix W `[out, in]` costs out·in multiply-adds in the forward pass (and twice that in the
backward pass), whatever the sequence length. A unit carries the weight elements that go with it:

- a head of an attention site with `H` query heads of size `d_h`, `H_kv` key/value heads and model width `d`:
  its query rows and output-projection columns, 2·d·d_h, and its share of the key/value rows, 2·d·d_h·H_kv / H
  (under grouped-query attention a key/value head serves H / H_kv query heads);
- a neuron of an FFN: its row of each up projection (gate and up in gated FFNs), d_in each, and its column of the
  down projection, d_out — 2·d for a plain FFN, 3·d for a gated one.

Removing units saves exactly their elements' multiply-adds per token (cross-attention keys and values act on
source tokens: counted as if source and target were equally long). The attention scores (QKᵀ, AV), which grow with
the sequence length, and element-wise work are left out. `model_cost` is the per-token multiply-adds of every weight
matmul of the model (embedding lookups cost nothing; an LM head, tied or not, counts), so a FLOP target — "remove
50 % of the step's weight multiply-adds" — is a count that does not drift between runs or machines.

`select_by_flops` meets such a target with the cheapest mix: units are removed in increasing order of importance
per multiply-add saved (Michel et al.'s I = E|∂L/∂ξ| is a first-order estimate of the loss a unit's removal costs,
in the same units for a head and a neuron, so raw scores — `normalize=None` — are compared).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from prunetrain.engine.heads import UNITS, HeadLayout, live_sites, unwrap_model
from prunetrain.engine.mask import HeadMask
from prunetrain.engine.peft_support import base_layer
from prunetrain.methods.importance import HeadScores
from prunetrain.utils.validate import check_int


def _is_conv1d(module: nn.Module) -> bool:
    return any(c.__name__ == "Conv1D" for c in type(module).__mro__)


def _in_out(module: nn.Module) -> tuple[int, int]:
    """(input features, output features) of an `nn.Linear` or a transformers `Conv1D` (weight `[in, out]`)."""
    weight = base_layer(module).weight
    return (weight.shape[0], weight.shape[1]) if _is_conv1d(base_layer(module)) else (weight.shape[1], weight.shape[0])


def unit_costs(model: nn.Module, units=UNITS) -> dict[str, float]:
    """{site name: per-token multiply-adds one unit of the site carries} for every site of `units` in `model` (see
    the module docstring)."""
    from prunetrain.engine.families.core import _get

    costs = {}
    for site in live_sites(unwrap_model(model), units):
        info = site.info
        if info.unit == "neurons":
            spec = site.adapter.spec_of("", site.module) or site.adapter.specs[0]
            d_in = _in_out(_get(site.module, spec.up[0]))[0]
            costs[info.name] = float(len(spec.up) * spec.fused * d_in + _in_out(site.out_proj)[1])
        else:
            d = _in_out(site.out_proj)[1]
            kv_share = info.num_kv_heads / info.num_heads if info.num_heads else 1.0
            costs[info.name] = float(2 * d * info.head_dim * (1 + kv_share))
    return costs


def model_cost(model: nn.Module) -> float:
    """Per-token multiply-adds of every weight matmul in `model`: the elements of each `nn.Linear` and `Conv1D`
    weight (a LoRA layer counts as its base layer)."""
    seen, total = set(), 0
    for module in unwrap_model(model).modules():
        layer = base_layer(module)
        if (isinstance(layer, nn.Linear) or _is_conv1d(layer)) and id(layer) not in seen:
            seen.add(id(layer))
            total += layer.weight.numel()
    return float(total)


def original_cost(model: nn.Module, layout: HeadLayout, costs: dict[str, float] | None = None) -> float:
    """Per-token weight multiply-adds of `model` before any of its units in `layout` were removed by `shrink`: its
    `model_cost` plus what each site's physically removed units carried.

    Args:
        model: the (possibly shrunk) model.
        layout: the sites whose removed units count (their `original_num_heads` against `num_heads`).
        costs: `unit_costs(model, layout.units)`, when the caller has it.
    """
    costs = unit_costs(model, layout.units) if costs is None else costs
    return model_cost(model) + sum((s.original_num_heads - s.num_heads) * costs[s.name] for s in layout)


def select_by_flops(scores: HeadScores, share: float, model: nn.Module, *, base_mask: HeadMask | None = None,
                    min_per_site: int = 1) -> HeadMask:
    """A mask over the scores' units (heads, neurons or both) that removes `share` of the model's per-token weight
    multiply-adds, choosing the units of lowest importance per multiply-add saved.

    Args:
        scores: importance of every unit (low = pruned first); raw values (`normalize=None`) when heads and
            neurons are ranked together.
        share: the fraction (float in [0, 1]) of the ORIGINAL model's per-token weight multiply-adds removed in the
            end; units removed already (zeros of `base_mask`, or physically by `shrink`) count toward it.
        model: the model the scores were taken on (its weights give each unit's cost).
        base_mask: start from this mask (its removed units stay removed). Not modified.
        min_per_site: units every site keeps (sites already below it lose no more).

    Raises:
        ValueError: a share outside [0, 1], NaN scores, or a share the units in reach cannot meet.
    """
    if isinstance(share, bool) or not isinstance(share, float) or not 0.0 <= share <= 1.0 or math.isnan(share):
        raise ValueError(f"share: {share!r} is not a fraction of the model's multiply-adds; give a float in [0, 1].")
    check_int("min_per_site", min_per_site, 0)
    layout = scores.layout
    if any(bool(torch.isnan(v).any()) for _, v in scores.items()):
        raise ValueError("scores: NaN scores cannot be ranked.")
    mask = HeadMask(layout) if base_mask is None else HeadMask(layout, {n: v.detach() for n, v in base_mask.items()})
    costs = unit_costs(model, layout.units)
    original = original_cost(model, layout, costs)
    physically_removed = original - model_cost(model)
    removed = physically_removed + sum(float((mask[s.name] == 0).sum()) * costs[s.name] for s in layout)
    need = share * original - removed
    if need <= 0:
        return mask
    candidates = []
    for index, site in enumerate(layout.sites):
        alive = (mask[site.name] != 0).tolist()
        values, g = scores[site.name], site.group_size
        for start in range(0, site.num_heads, g):
            group = tuple(h for h in range(start, min(start + g, site.num_heads)) if alive[h])
            if group:
                cost = costs[site.name] * len(group)
                candidates.append((float(sum(float(values[h]) for h in group)) / cost, index, group, cost))
    candidates.sort(key=lambda c: (c[0], c[1], c[2][0]))
    room = {s.name: max(0, int((mask[s.name] != 0).sum()) - min_per_site) for s in layout}
    for _, index, group, cost in candidates:
        name = layout.sites[index].name
        if len(group) > room[name]:
            continue
        for unit in group:
            mask.set(name, unit, 0.0)
        room[name] -= len(group)
        need -= cost
        if need <= 0:
            return mask
    raise ValueError(f"share: {share!r} of the model's {original:.4g} per-token multiply-adds cannot be removed from "
                     f"the {', '.join(layout.units)} in reach with min_per_site={min_per_site} (every unit removed "
                     f"leaves {need:.4g} still to go); lower the share or min_per_site, or add a unit kind.")


__all__ = ["model_cost", "original_cost", "select_by_flops", "unit_costs"]
