"""Pruning policies: which heads to remove given their scores (`select_heads`), and Michel et al.'s iterative
pruning (§4: remove a fixed share of the heads, re-estimate importance on the pruned model, repeat).

The amount convention (one for the whole project):

- a float in [0, 1] is a fraction, an int is a count (so `1` is one head and `1.0` is all heads);
- it is the share of ALL heads of the ORIGINAL layout (in scope) that are pruned in the end: heads already removed,
  by zeros in `base_mask` or physically by `shrink` (a site's `original_num_heads - num_heads`), count toward it, and
  only the difference is newly removed (nothing, if the base already removes as many or more);
- a fraction becomes a count by rounding half up: round(0.25 * 18) = 5;
- a mapping {kind: amount} gives each attention kind its own amount (each kind ranked within itself; kinds it does
  not name are not pruned): e.g. Voita et al.'s order, encoder self-attention pruned most and cross attention least,
  `{"encoder_self": 42, "decoder_self": 36, "cross": 30}`. FFN kinds (`encoder_ffn`, `decoder_ffn`, `ffn`) take
  amounts of their neurons the same way (the scores must then cover neurons: `units=("heads", "neurons")`), e.g.
  `{"encoder_self": 0.75, "decoder_self": 0.75, "cross": 0.75, "encoder_ffn": 0.5, "decoder_ffn": 0.5}`;
- a mapping {unit: amount} gives each unit its own amount, ranked within the unit (`scope` and `kinds` apply
  within it): `{"heads": 0.75, "neurons": 0.5}` prunes 75 % of the heads, ranked over all attention sites, and half of
  the FFN neurons, ranked over all FFN sites;
- `{"flops": share}` removes `share` of the model's per-token weight multiply-adds with the cheapest mix of the
  scored units (`prunetrain.methods.flop_budget.select_by_flops`, which needs the model; `select_heads` refuses it);
- one amount over heads AND neurons together with scope "global" is refused: it would count a head like a neuron
  (give per-kind amounts, a FLOP target, or scope "kind"/"layer").

Ties are broken deterministically: among equal scores the head in the earlier site (layout order) goes first, then
the lower head index. With grouped-query attention (Llama-style, `site.group_size` g > 1) heads are selected in
whole key/value groups so that `shrink(..., gqa_rounding="error")` accepts the mask: a group's score is the SUM of
its heads' scores (first-order loss changes of removing several heads add up), and the number of heads removed is
rounded down to whole groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from prunetrain.engine.heads import KINDS, NEURON_KINDS, UNITS, HeadLayout, find_sites, unwrap_model
from prunetrain.methods.importance import HeadScores, Scorer, get_scorer
from prunetrain.engine.mask import HeadMask
from prunetrain.utils.door import AnyFloat, checked
from prunetrain.utils.validate import check_amount, check_kinds

SCOPES = ("global", "layer", "kind")
FLOPS_KEY = "flops"
"""The key of a FLOP-target amount `{"flops": share}` (`prunetrain.methods.flop_budget.select_by_flops`)."""
ALL_KINDS = (*KINDS, *NEURON_KINDS)


@dataclass(frozen=True)
class _Unit:
    """Heads removed together: one head, or the still-kept heads of one key/value group."""

    score: float
    site_index: int
    heads: tuple[int, ...]


def _to_count(amount: int | float, total: int) -> int:
    """Heads to prune in the end out of `total` original heads (fraction: rounded half up)."""
    if isinstance(amount, int):
        return amount
    return int(math.floor(amount * total + 0.5 + 1e-9))


def _check_kinds(kinds, layout: HeadLayout) -> list[str]:
    chosen = check_kinds("kinds", kinds, ALL_KINDS)
    if chosen is None:
        return list(layout.kinds)
    for kind in chosen:
        if kind not in layout.kinds:
            raise ValueError(f"kinds: {kind!r} does not occur in this model, whose kinds are: "
                             f"{', '.join(layout.kinds)}.")
    return chosen


def _units(scores: HeadScores, mask: HeadMask, site_index: int) -> list[_Unit]:
    site = scores.layout.sites[site_index]
    values = scores[site.name]
    alive = (mask[site.name] != 0).tolist()
    g = site.group_size
    units = []
    for start in range(0, site.num_heads, g):
        heads = tuple(h for h in range(start, min(start + g, site.num_heads)) if alive[h])
        if heads:
            units.append(_Unit(float(sum(float(values[h]) for h in heads)), site_index, heads))
    return units


def check_kind_amounts(argument: str, amount: Mapping) -> dict[str, int | float]:
    """A per-kind amount {kind: amount}: known kinds (attention or FFN), at least one, each amount valid
    (`check_amount`); or a per-unit amount {"heads": amount, "neurons": amount}; or a FLOP target {"flops": share},
    alone, with a share in [0, 1]."""
    if not amount:
        raise ValueError(f"{argument}: an empty per-kind amount; name at least one of {', '.join(ALL_KINDS)} (or "
                         f"give {{'{FLOPS_KEY}': share}}).")
    if FLOPS_KEY in amount:
        share = amount[FLOPS_KEY]
        if len(amount) != 1:
            raise ValueError(f"{argument}: {dict(amount)!r} mixes a FLOP target with per-kind amounts; give "
                             f"{{'{FLOPS_KEY}': share}} alone (the cheapest mix of units meets it).")
        if isinstance(share, bool) or not isinstance(share, float) or not 0.0 <= share <= 1.0:
            raise ValueError(f"{argument}[{FLOPS_KEY!r}]: {share!r} is not a share of the model's multiply-adds; "
                             f"give a float in [0, 1] (e.g. 0.5).")
        return {FLOPS_KEY: share}
    if any(key in UNITS for key in amount):
        if not all(key in UNITS for key in amount):
            raise ValueError(f"{argument}: {dict(amount)!r} mixes per-unit amounts ({', '.join(UNITS)}) with per-kind "
                             f"ones; give one or the other.")
        return {unit: check_amount(f"{argument}[{unit!r}]", amount[unit]) for unit in UNITS if unit in amount}
    out = {}
    for kind, value in amount.items():
        if kind not in ALL_KINDS:
            raise ValueError(f"{argument}: {kind!r} is not an attention or FFN kind; per-kind amounts name "
                             f"{', '.join(ALL_KINDS)}.")
        out[kind] = check_amount(f"{argument}[{kind!r}]", value)
    return out


def is_flop_target(amount) -> bool:
    """Whether `amount` is a FLOP target `{"flops": share}`."""
    return isinstance(amount, Mapping) and FLOPS_KEY in amount


@checked(own=("scores", "amount", "min_heads_per_layer"))
def select_heads(
    scores: HeadScores,
    amount: int | float | Mapping[str, int | float],
    *,
    scope: str = "global",
    kinds: str | Iterable[str] | None = None,
    min_heads_per_layer: int = 0,
    base_mask: HeadMask | None = None,
    constraints=None,
) -> HeadMask:
    """A `HeadMask` that removes the lowest-scoring heads (see the module docstring for the amount convention).

    Args:
        scores: the head scores (low = pruned first).
        amount: how much to prune in total: a fraction (float in [0, 1]) or a count (int) of the heads in scope,
            or a mapping {kind: amount} (each kind its own amount, ranked within the kind; `scope` and `kinds`
            must then be left at "global"/None or "kind").
        scope: "global": one ranking over all heads in `kinds`, `amount` of all their heads;
            "kind": `amount` of each kind's heads, ranked within the kind (e.g. 50% of encoder self-attention AND
            50% of cross-attention); "layer": `amount` of each site's heads, ranked within the site.
        kinds: restrict pruning to these attention kinds (None: all kinds of the model); other sites are untouched.
        min_heads_per_layer: every site keeps at least this many heads (sites already below it lose no more).
        base_mask: start from this mask; its removed heads stay removed and count toward `amount`, its other keep
            values are copied. Not modified.
        constraints: a `prunetrain.methods.constraints.ServingConstraints` (same heads per kind, whole key/value
            groups, counts divisible by a tensor-parallel degree) applied to the selection; counts move to the
            nearest allowed value.
    """
    if not isinstance(scores, HeadScores):
        raise ValueError(f"scores: expected a prunetrain HeadScores, got {type(scores).__name__}.")
    per_kind, per_unit, scope, kinds = _amount_parts(amount, scope, kinds)
    if isinstance(min_heads_per_layer, bool) or not isinstance(min_heads_per_layer, int):
        raise ValueError(f"min_heads_per_layer: expected an int, got {min_heads_per_layer!r}.")
    if min_heads_per_layer < 0:
        raise ValueError(f"min_heads_per_layer: {min_heads_per_layer} is negative; it must be >= 0.")
    layout = scores.layout
    chosen_kinds = _check_kinds(kinds, layout)
    _check_units_of(amount, per_unit, scope, chosen_kinds, layout)
    nan_sites = [n for n, v in scores.items() if bool(torch.isnan(v).any())]
    if nan_sites:
        raise ValueError(f"scores: site {nan_sites[0]!r} has NaN scores; heads cannot be ranked.")
    mask = _start_mask(layout, base_mask)
    in_scope = [i for i, s in enumerate(layout.sites) if s.kind in chosen_kinds]
    for unit_scope, unit_amount in ([(in_scope, amount)] if per_unit is None else
                                    [([i for i in in_scope if layout.sites[i].unit == u], a)
                                     for u, a in per_unit.items()]):
        for group in _groups(layout, unit_scope, scope, chosen_kinds):
            group_amount = unit_amount if per_kind is None or per_unit is not None else \
                per_kind[layout.sites[group[0]].kind]
            _prune_group(scores, mask, group, group_amount, min_heads_per_layer, scope)
    if constraints is not None:
        from prunetrain.methods.constraints import apply_constraints

        mask = apply_constraints(mask, scores, constraints)
    return mask


def _amount_parts(amount, scope: str, kinds):
    """(per-kind amounts or None, per-unit amounts or None, scope, kinds) of a checked `amount`: a per-kind amount
    ranks each named kind within itself (scope "kind" over those kinds)."""
    per_kind = per_unit = None
    if isinstance(amount, Mapping):
        per_kind = check_kind_amounts("amount", amount)
        if FLOPS_KEY in per_kind:
            raise ValueError(f"amount: {per_kind!r} is a FLOP target, which needs the model's weights to price each "
                             f"unit; use prunetrain.methods.flop_budget.select_by_flops(scores, share, model).")
        if any(key in UNITS for key in per_kind):
            per_unit = per_kind
        elif scope == "layer" or kinds is not None:
            raise ValueError(f"amount: a per-kind amount {per_kind!r} already says which kinds are pruned and by how "
                             f"much; leave scope='global' or 'kind' and kinds=None.")
        else:
            scope, kinds = "kind", list(per_kind)
    else:
        check_amount("amount", amount)
    if scope not in SCOPES:
        raise ValueError(f"scope: {scope!r} is not one of {', '.join(map(repr, SCOPES))}.")
    return per_kind, per_unit, scope, kinds


def _check_units_of(amount, per_unit, scope: str, chosen_kinds, layout: HeadLayout) -> None:
    """A per-unit amount names units the scores cover; one amount over both units is not ranked globally."""
    if per_unit is not None:
        missing = [unit for unit in per_unit if unit not in layout.units]
        if missing:
            raise ValueError(f"amount: {per_unit!r} prunes {missing[0]}, which the scores do not cover (their units: "
                             f"{', '.join(layout.units)}); score them too (e.g. units=('heads', 'neurons')).")
    elif scope == "global" and len({s.unit for s in layout if s.kind in chosen_kinds}) > 1:
        raise ValueError(f"amount: {amount!r} over heads and FFN neurons together with scope='global' would count a "
                         f"head like a neuron; give per-kind amounts (e.g. {{'encoder_self': 0.75, 'encoder_ffn': "
                         f"0.5}}), a FLOP target {{'{FLOPS_KEY}': share}}, scope='kind' or 'layer', or kinds of one "
                         f"unit.")


def _start_mask(layout: HeadLayout, base_mask: HeadMask | None) -> HeadMask:
    """A copy of `base_mask` over `layout` (checked to fit), or an all-ones mask."""
    if base_mask is None:
        return HeadMask(layout)
    if not isinstance(base_mask, HeadMask):
        raise ValueError(f"base_mask: expected a prunetrain HeadMask or None, got {type(base_mask).__name__}.")
    try:
        base_mask.check_matches(layout.sites)
    except ValueError as err:
        raise ValueError(f"base_mask: does not fit the scores' layout ({err})") from None
    return HeadMask(layout, {n: v.detach() for n, v in base_mask.items()})


def _groups(layout: HeadLayout, sites: list[int], scope: str, kinds: list[str]) -> list[list[int]]:
    """The site indices ranked together: all of them (global), each kind's (kind), each site alone (layer)."""
    if scope == "global":
        return [sites] if sites else []
    if scope == "kind":
        return [g for g in ([i for i in sites if layout.sites[i].kind == k] for k in kinds) if g]
    return [[i] for i in sites]


def _prune_group(scores: HeadScores, mask: HeadMask, group: list[int], amount, min_heads: int, scope: str) -> None:
    sites = [scores.layout.sites[i] for i in group]
    original = sum(s.original_num_heads for s in sites)
    target = _to_count(amount, original)
    where = {"global": "in scope", "kind": f"of kind {sites[0].kind!r}", "layer": f"of site {sites[0].name!r}"}[scope]
    if target > original:
        raise ValueError(f"amount: {amount!r} asks to prune {target} heads, but there are only {original} heads "
                         f"{where}.")
    kept = {s.name: int((mask[s.name] != 0).sum()) for s in sites}
    already = sum(s.original_num_heads - kept[s.name] for s in sites)
    need = target - already
    if need <= 0:
        return
    capacity = {s.name: max(0, kept[s.name] - min_heads) for s in sites}
    if need > sum(capacity.values()):
        raise ValueError(
            f"amount: {amount!r} asks to prune {target} of {original} heads {where} ({already} already pruned), but "
            f"min_heads_per_layer={min_heads} leaves only {sum(capacity.values())} more prunable.")
    units = sorted((u for i in group for u in _units(scores, mask, i)),
                   key=lambda u: (u.score, u.site_index, u.heads[0]))
    removed = 0
    for unit in units:
        name = scores.layout.sites[unit.site_index].name
        size = len(unit.heads)
        if removed + size > need or size > capacity[name]:
            continue
        for h in unit.heads:
            mask.set(name, h, 0.0)
        capacity[name] -= size
        removed += size
        if removed == need:
            break


# ---------------------------------------------------------------------------------------------------------------------
# iterative pruning (Michel et al. 2019, §4)
# ---------------------------------------------------------------------------------------------------------------------
@checked
@dataclass
class PruneStep:
    """One step of `iterative_prune`: the cumulative amount asked for, the scores it was chosen from (estimated on
    the model masked by the previous step), the resulting mask, `num_pruned` (heads of the original layout pruned
    in total, physically removed ones included) and `metric` (from `evaluate`, else None)."""

    index: int
    amount: int | float
    scores: HeadScores
    mask: HeadMask
    num_pruned: int
    metric: AnyFloat | None = None  # a measurement: NaN is recorded as measured


@checked
@dataclass
class PruneResult:
    """Final mask of `iterative_prune` and its per-step history (`initial_metric`: `evaluate` before pruning)."""

    mask: HeadMask
    history: list[PruneStep] = field(default_factory=list)
    initial_metric: AnyFloat | None = None


@checked(own=("batches",))
def iterative_prune(
    model: nn.Module,
    batches: Iterable[Mapping[str, Any]],
    step: int | float = 0.1,
    target: int | float = 0.5,
    scorer: str | Scorer = "gradient",
    *,
    scope: str = "global",
    kinds: str | Iterable[str] | None = None,
    min_heads_per_layer: int = 0,
    base_mask: HeadMask | None = None,
    evaluate: Callable[[nn.Module], float] | None = None,
    scorer_options: Mapping[str, Any] | None = None,
    units=("heads",),
) -> PruneResult:
    """Michel et al. (2019) §4: repeatedly score the heads on the currently masked model and prune `step` more (of
    the ORIGINAL heads: 10% by default) until `target` is pruned; returns the final mask and the per-step history.

    Step k asks `select_heads` for the cumulative amount min(k * step, target) with `base_mask` = the previous
    step's mask, so the amount convention of `select_heads` holds (fractions of all original heads in scope).
    The model is left without any mask attached by this function.

    Args:
        model: the model.
        batches: re-iterable batches (a list or a DataLoader, not a generator): read once per step.
        step: how much more to prune per step; `step` and `target` are both fractions (float) or both counts (int).
        target: how much to prune in the end.
        scorer: a registry name (`gradient`, `ablation`, `confidence`, `random`) or a callable
            `scorer(model, batches)`.
        scope, kinds, min_heads_per_layer, base_mask: as in `select_heads`.
        evaluate: optional `evaluate(model)`, called before pruning and after each step with its mask attached.
        scorer_options: keyword options of a named scorer.
        units: the units pruned ("heads" by default; "neurons" for FFN neurons, whose scorer must score them:
            the "gradient" and "random" scorers take `units`). One amount over both units needs scope "kind" or
            "layer" (see `select_heads`).
    """
    check_amount("step", step)
    check_amount("target", target)
    if type(step) is not type(target):
        raise ValueError(f"step, target: both must be fractions (float) or both counts (int), got "
                        f"{type(step).__name__} {step!r} and {type(target).__name__} {target!r}.")
    if step == 0:
        raise ValueError(f"step: {step!r} would never prune; it must be > 0.")
    if iter(batches) is batches:
        raise ValueError("batches: a one-shot iterator (e.g. a generator) cannot be re-read at every step; pass a "
                        "list or a DataLoader.")
    score = get_scorer(scorer, **dict(scorer_options or {}))
    net = unwrap_model(model)  # masks go on the inner model (DDP / accelerate wrappers are passed on as given)
    layout = find_sites(net, units)
    mask = HeadMask(layout) if base_mask is None else base_mask.copy()
    result = PruneResult(mask=mask)
    if evaluate is not None:
        with mask.applied(net):
            result.initial_metric = float(evaluate(model))
    num_steps = max(1, math.ceil(target / step - 1e-9)) if target > 0 else 0
    for k in range(1, num_steps + 1):
        amount = min(target, k * step) if isinstance(step, int) else min(float(target), round(k * step, 12))
        with mask.applied(net):
            scores = score(model, batches)
        mask = select_heads(scores, amount, scope=scope, kinds=kinds, min_heads_per_layer=min_heads_per_layer,
                            base_mask=mask)
        metric = None
        if evaluate is not None:
            with mask.applied(net):
                metric = float(evaluate(model))
        pruned = sum(s.original_num_heads for s in layout) - mask.num_kept
        result.history.append(PruneStep(k, amount, scores, mask.copy(), pruned, metric))
    result.mask = mask
    return result


__all__ = ["ALL_KINDS", "FLOPS_KEY", "PruneResult", "PruneStep", "SCOPES", "check_kind_amounts", "is_flop_target",
           "iterative_prune", "select_heads"]
