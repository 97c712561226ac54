"""Shape constraints that serving stacks need, applied to a selection (a `HeadMask` plus the scores behind it).

- **whole key/value groups** (grouped-query attention, `site.group_size` g > 1): a group is kept whole or removed
  whole; a partly kept group is kept when at least half of its heads are kept;
- **head counts divisible by a tensor-parallel degree** t: every attention site keeps a number of key/value groups
  (query heads without GQA) that is a multiple of t, so the heads shard evenly over t devices (0 is allowed);
- **FFN widths divisible by a matmul tile** m: every FFN site keeps a multiple of m neurons (0 is allowed, and so is
  its whole original width). Widths that are not a multiple of the hardware's tile cost more than their FLOPs: on
  a 2-core Intel Xeon with AMX in bf16 the fast recipe's final architecture (FFNs of 331–648 neurons) stepped at
  0.94× the full model, and 1.31× / 1.40× with every width rounded to a multiple of 64 / 128, for the same FLOPs
  (benchmarks/README.md l6);
- **the same number of heads in every layer of a kind**: every site of an attention kind keeps the same count,
  so a uniform config (`prunetrain export --format uniform`) can describe the model;
- **the same number of heads in every attention of a stack**: every encoder site keeps the same count, and every
  decoder site (self- and cross-attention together) the same count: the one query-head count per stack that
  CTranslate2 reads (`prunetrain export --format ctranslate2` then runs the model without padding).

Counts move to the nearest allowed value (ties: fewer heads), and within a site the highest-scoring units stay
(a unit is one head, or one key/value group whose score is the sum of its heads' scores, as in `select_heads`).
The amount pruned therefore moves too; the result is a new mask, the input is not modified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prunetrain.engine.mask import HeadMask
from prunetrain.utils.validate import check_int


@dataclass(frozen=True)
class ServingConstraints:
    """Which constraints `apply_constraints` enforces.

    Args:
        same_heads_per_kind: every site of an attention kind keeps the same number of heads.
        same_heads_per_stack: every encoder site keeps the same number of heads, and every decoder site (self- and
            cross-attention together) the same number (CTranslate2's layout); a decoder-only or encoder-only model
            has one stack.
        whole_kv_groups: grouped-query attention keeps or removes whole key/value groups.
        heads_multiple_of: each attention site's key/value-group count (head count without GQA) is a multiple
            of this (a tensor-parallel degree; 1: no constraint).
        neurons_multiple_of: each FFN site keeps a multiple of this many neurons, or its whole original width
            (a matmul tile, e.g. 64; 1: no constraint).
    """

    same_heads_per_kind: bool = False
    same_heads_per_stack: bool = False
    whole_kv_groups: bool = True
    heads_multiple_of: int = 1
    neurons_multiple_of: int = 1

    def __post_init__(self) -> None:
        check_int("heads_multiple_of", self.heads_multiple_of, 1)
        check_int("neurons_multiple_of", self.neurons_multiple_of, 1)
        for name in ("same_heads_per_kind", "same_heads_per_stack", "whole_kv_groups"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: {getattr(self, name)!r} is not allowed; expected True or False.")


def constraints_if_any(**settings) -> "ServingConstraints | None":
    """`ServingConstraints(**settings)`, or None when that is the default (no constraint beyond whole key/value
    groups): what a recipe or the CLI passes on when its settings are left alone."""
    constraints = ServingConstraints(**settings)
    return None if constraints == ServingConstraints() else constraints


def check_constraints(constraints, argument: str = "constraints") -> "ServingConstraints | None":
    """`constraints` must be None or a `ServingConstraints`."""
    if constraints is not None and not isinstance(constraints, ServingConstraints):
        raise TypeError(f"{argument}: {constraints!r} is not a ServingConstraints (from "
                        f"prunetrain.methods.constraints) or None.")
    return constraints


def _unit_scores(scores, site) -> torch.Tensor:
    values = scores[site.name] if scores is not None else torch.zeros(site.num_heads, dtype=torch.float64)
    return values.view(-1, site.group_size).sum(1)


def _kept_units(mask: HeadMask, site) -> torch.Tensor:
    """Per unit: is it kept (at least half of its heads non-zero)?"""
    alive = (mask[site.name] != 0).view(-1, site.group_size).float()
    return alive.mean(1) >= 0.5


def _multiple(site, constraints: ServingConstraints) -> int:
    """The multiple a site's kept units must be: `neurons_multiple_of` for an FFN site, else `heads_multiple_of`."""
    return constraints.neurons_multiple_of if site.unit == "neurons" else constraints.heads_multiple_of


def _whole(site) -> bool:
    """An FFN site still at its original width may keep it whole, a multiple of the tile or not."""
    return site.unit == "neurons" and site.num_heads == site.original_num_heads


def _nearest_allowed(count: float, site, constraints: ServingConstraints, units: int | None = None) -> int:
    """The allowed unit count nearest `count` (ties: fewer) among 0..`units` (default: the site's units)."""
    units = site.num_heads // site.group_size if units is None else units
    multiple, whole = _multiple(site, constraints), site.num_heads if _whole(site) else None
    allowed = [u for u in range(units + 1) if u % multiple == 0 or u == whole]
    return min(allowed, key=lambda u: (abs(u - count), u))


def _keep_top(values: torch.Tensor, site, unit_scores: torch.Tensor, kept: torch.Tensor, n: int) -> torch.Tensor:
    """Keep the `n` best units (kept ones first, then by score, then by position); removed units get 0."""
    order = sorted(range(len(unit_scores)), key=lambda u: (not bool(kept[u]), -float(unit_scores[u]), u))
    keep_units = torch.zeros(len(unit_scores), dtype=torch.bool)
    keep_units[order[:n]] = True
    keep_heads = keep_units.repeat_interleave(site.group_size)
    restored = torch.where(values != 0, values, torch.ones_like(values))  # a unit brought back is kept at 1
    return torch.where(keep_heads, restored, torch.zeros_like(values))


def apply_constraints(mask: HeadMask, scores=None, constraints: ServingConstraints | None = None) -> HeadMask:
    """A copy of `mask` that satisfies `constraints` (see the module docstring).

    Args:
        mask: the selection, e.g. from `select_heads`.
        scores: the `HeadScores` it was made from (decides which units stay when counts change); None: the
            lower position stays.
        constraints: a `ServingConstraints` (None: the defaults, whole key/value groups only).
    """
    if not isinstance(mask, HeadMask):
        raise ValueError(f"mask: expected a prunetrain HeadMask, got {type(mask).__name__}.")
    constraints = constraints or ServingConstraints()
    if not isinstance(constraints, ServingConstraints):
        raise ValueError(f"constraints: expected a ServingConstraints, got {type(constraints).__name__}.")
    out = mask.copy()
    layout = mask.layout
    targets: dict[str, int] = {}
    counts: dict[str, float] = {}
    for site in layout:
        kept = _kept_units(out, site)
        whole = constraints.whole_kv_groups or site.group_size == 1
        counts[site.name] = float(kept.sum()) if whole else float((out[site.name] != 0).sum()) / site.group_size
        targets[site.name] = _nearest_allowed(counts[site.name], site, constraints)
    for sites in _equal_groups(layout, constraints):
        units = min(s.num_heads // s.group_size for s in sites)
        mean = sum(counts[s.name] for s in sites) / len(sites)
        for s in sites:
            targets[s.name] = _nearest_allowed(mean, s, constraints, units)
    for site in layout:
        kept = _kept_units(out, site)
        whole = constraints.whole_kv_groups or site.group_size == 1
        if whole or int(kept.sum()) != targets[site.name]:
            out[site.name] = _keep_top(out[site.name], site, _unit_scores(scores, site), kept, targets[site.name])
    return out


def satisfied(mask: HeadMask, constraints: ServingConstraints) -> list[str]:
    """The constraints `mask` breaks, one short sentence each (empty: all hold)."""
    problems = []
    for site in mask.layout:
        alive = (mask[site.name] != 0).view(-1, site.group_size)
        if constraints.whole_kv_groups and bool((alive.any(1) & ~alive.all(1)).any()):
            problems.append(f"site {site.name!r} keeps part of a key/value group")
        units, multiple = int(alive.any(1).sum()), _multiple(site, constraints)
        if units % multiple and not (units == site.num_heads and _whole(site)):
            what = "neurons" if site.unit == "neurons" else "key/value groups"
            problems.append(f"site {site.name!r} keeps {units} {what}, not a multiple of {multiple}")
    for sites in _equal_groups(mask.layout, constraints):
        kept = sorted({int((mask[s.name] != 0).sum()) for s in sites})
        if len(kept) > 1:
            kinds = " and ".join(sorted({s.kind for s in sites}))
            problems.append(f"{kinds} sites keep different head counts {kept}")
    return problems


STACK_OF_KIND = {"encoder_self": "encoder", "decoder_self": "decoder", "cross": "decoder", "self": "self"}
"""The stack of each attention kind: the decoder's self- and cross-attention share one query-head count in
CTranslate2."""


def _equal_groups(layout, constraints: ServingConstraints) -> list[list]:
    """The groups of sites that must keep equal head counts (a stack's attention sites, else a kind's sites, else
    none). FFN sites are not in a stack's group: CTranslate2 takes a width per layer."""
    key = (STACK_OF_KIND.get if constraints.same_heads_per_stack
           else (lambda kind: kind) if constraints.same_heads_per_kind else None)
    if key is None:
        return []
    groups: dict[str, list] = {}
    for site in layout:
        if key(site.kind) is not None:
            groups.setdefault(key(site.kind), []).append(site)
    return list(groups.values())
