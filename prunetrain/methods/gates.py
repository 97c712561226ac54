"""Hard-Concrete head gates (Louizos et al. 2018) as used by Voita et al. (2019, §6) to prune heads.

Each gated head i has a gate g_i = min(1, max(0, s̄_i)) with

    s_i = σ((log u − log(1 − u) + log α_i) / β),   u ~ U(0, 1),   s̄_i = s_i (r − l) + l,

temperature β = 2/3 and stretch interval (l, r) = (−0.1, 1.1) (Louizos et al. 2018, §4). The gate is exactly 0 or 1
with non-zero probability:

    P(g_i = 0) = σ(β log(−l / r) − log α_i)                    (Louizos eq. 12)
    P(g_i = 1) = σ(log α_i − β log((1 − l) / (r − 1)))

and Voita's training objective is L = L_xent + λ Σ_i (1 − P(g_i = 0)) (the expected number of open gates, "L0").
At evaluation the gates are deterministic: a head is kept when P(g_i = 1) > P(g_i = 0) (Voita et al. 2019, footnote
on test time); with the constants above that is exactly log α_i > 0.

The gate multiplies the head's output where `HeadMask` does (the input of the attention output projection).

FFN neurons are gated the same way (as CoFi, Xia et al. 2022, gates FFN dimensions): a neuron's gate multiplies its
activation at the input of the FFN's down projection, where `HeadMask` masks a neuron. Heads and neurons are then
compared by what they cost (`prunetrain.methods.flop_budget`): `expected_cost()` is the expected per-token weight
multiply-adds of the gated units, Σ_i c_i (1 − P(g_i = 0)) with c_i the multiply-adds gate i carries, the term
CoFi's Lagrangian drives to a target model size (a unit's multiply-adds per token equal its weight parameters, so
a budget in FLOPs is one in weight parameters of the linear layers too), and `to_flop_mask(model, share)` removes
at least `share` of the model's multiply-adds, the gates of lowest log α first.

Grouped-query attention: the g query heads that read one key/value head can only be removed together, so they share
one gate (`HeadSite.group_size`; multi-query sites, whose heads go one at a time, keep a gate per head). The L0 term
counts heads, Σ_i g_i (1 − P(g_i = 0)), so λ and a head budget mean the same as without groups, and every mask the
gates give (deterministic or budgeted) removes whole groups: it can be shrunk exactly.
"""

from __future__ import annotations

import math
import re
import weakref
from typing import Iterable

import torch
from torch import nn

from prunetrain.engine.heads import (KINDS, NEURON_KINDS, UNITS, HeadLayout, check_units, find_sites, live_sites,
                                     unwrap_model)
from prunetrain.engine.mask import HeadMask, register_scaler, scale_heads, unregister_scaler
from prunetrain.engine.peft_support import PlacedHook, module_slots, place_hook
from prunetrain.utils.device import device_of
from prunetrain.utils.door import checked
from prunetrain.utils.validate import check_kinds

BETA = 2.0 / 3.0
"""Hard-Concrete temperature β (Louizos et al. 2018)."""
LIMIT_L = -0.1
"""Left end l of the stretch interval (Louizos et al. 2018)."""
LIMIT_R = 1.1
"""Right end r of the stretch interval (Louizos et al. 2018)."""
_EPS = 1e-6


def _key(site_name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", site_name)


@checked
class HardConcreteGates(nn.Module):
    """One Hard-Concrete gate per head of the gated sites (`kinds`), one per key/value group under grouped-query
    attention, and one per FFN neuron when the layout describes neurons (`find_sites(model, ("heads", "neurons"))`
    and FFN kinds among `kinds`), with learnable log α (`site_log_alpha(name)`: one value per gate).

    - `attach(model)`: hooks that multiply each gated head by its gate. In training mode a fresh gate sample is
      drawn for every forward pass of the model (reparameterised, so ∂L/∂ log α flows); in eval mode the gates are
      the deterministic 0/1 values.
    - `expected_l0()`: the expected number of open units Σ_i g_i (1 − P(g_i = 0)) (g_i: heads behind gate i, 1
      for a neuron), differentiable; `penalty(λ)` = λ · expected_l0(). `expected_cost()`: the same sum weighted by
      each unit's multiply-adds (`unit_costs`).
    - `to_mask()`: the deterministic gates as a `HeadMask` (sites that are not gated keep every unit);
      `to_mask(keep)` keeps exactly `keep` heads, in whole groups (`check_budget` says beforehand whether that is
      possible); `to_flop_mask(model, share)` removes at least `share` of the model's weight multiply-adds.
    """

    def __init__(self, layout: HeadLayout, kinds: Iterable[str] | None = None, init_log_alpha: float = 2.0,
                 init_noise: float = 0.01, seed: int = 0, unit_costs: dict[str, float] | None = None):
        super().__init__()
        kinds = check_kinds("kinds", kinds, KINDS + NEURON_KINDS) or list(layout.kinds)
        missing = [k for k in kinds if k not in layout.kinds]
        if missing:
            kind = missing[0]
            what = (f"{kind!r} FFN neurons in this layout (a layout of heads and neurons: find_sites)"
                    if kind in NEURON_KINDS else f"{kind!r} attention")
            raise ValueError(f"kinds: this model has no {what}; its kinds are {', '.join(layout.kinds)}.")
        self.layout = layout
        self.kinds = tuple(k for k in KINDS + NEURON_KINDS if k in kinds)
        self.unit_costs = dict(unit_costs or {})  # {site: multiply-adds per unit} (`flop_budget.unit_costs`)
        self.site_names = [s.name for s in layout if s.kind in self.kinds]
        self.heads_per_gate = {s.name: max(1, s.group_size) for s in layout if s.kind in self.kinds}
        gen = torch.Generator().manual_seed(seed)
        self.log_alpha = nn.ParameterDict({
            _key(s.name): nn.Parameter(init_log_alpha + init_noise * torch.randn(s.num_heads // self.heads_per_gate[
                s.name], generator=gen))
            for s in layout if s.kind in self.kinds
        })
        self._current: dict[str, torch.Tensor] = {}
        self._handles: list = []
        self._model_refs: list = []  # a weak reference to the model attached to (not a submodule, not copied)
        self.owner: str | None = None  # who attached the gates (a callback's name): every save records it

    # distribution -----------------------------------------------------------------------------------------------
    def site_log_alpha(self, name: str) -> torch.Tensor:
        """log α of the gates of site `name` (one per head, or per key/value group under grouped-query attention)."""
        return self.log_alpha[_key(name)]

    def unit_log_alpha(self, name: str) -> torch.Tensor:
        """log α per unit of site `name` (query head or neuron; a group's heads share their gate's value)."""
        return self.site_log_alpha(name).repeat_interleave(self.heads_per_gate[name])

    head_log_alpha = unit_log_alpha

    def open_heads(self, name: str) -> int:
        """Units (heads or neurons) of site `name` whose deterministic gate is open."""
        return int(self.deterministic(name).sum()) * self.heads_per_gate[name]

    def prob_closed(self, name: str) -> torch.Tensor:
        """P(g = 0) per head of site `name` (Louizos eq. 12)."""
        return torch.sigmoid(BETA * math.log(-LIMIT_L / LIMIT_R) - self.site_log_alpha(name))

    def prob_open(self, name: str) -> torch.Tensor:
        """P(g = 1) per head of site `name`."""
        return torch.sigmoid(self.site_log_alpha(name) - BETA * math.log((1 - LIMIT_L) / (LIMIT_R - 1)))

    def expected_l0(self) -> torch.Tensor:
        """Σ_i g_i (1 − P(g_i = 0)): the expected number of units whose gate is not zero (g_i = units behind gate i:
        1, or the key/value group size), differentiable in log α (Voita et al. 2019, eq. 6, counted in heads; with
        neurons gated too, heads and neurons are summed as units — `expected_cost` weighs them)."""
        return sum(self.heads_per_gate[name] * (1 - self.prob_closed(name)).sum() for name in self.site_names)

    def expected_cost(self) -> torch.Tensor:
        """Σ_i c_i (1 − P(g_i = 0)): the expected per-token weight multiply-adds of the gated units, c_i the
        multiply-adds of the units behind gate i (`unit_costs`), differentiable in log α (CoFi's expected model size,
        Xia et al. 2022, eq. 4, in multiply-adds)."""
        missing = [n for n in self.site_names if n not in self.unit_costs]
        if missing:
            raise ValueError(f"unit_costs: no cost for site {missing[0]!r}; build the gates with "
                             f"gates_for(model, ...) or give unit_costs=flop_budget.unit_costs(model).")
        return sum(self.unit_costs[name] * self.heads_per_gate[name] * (1 - self.prob_closed(name)).sum()
                   for name in self.site_names)

    @property
    def gated_units(self) -> tuple[str, ...]:
        """The units the gates cover: "heads", "neurons" or both."""
        return tuple(u for u in UNITS if self.sites_of(u))

    def gated_count(self, unit: str = "heads") -> int:
        """The number of gated units of `unit` ("heads" or "neurons")."""
        return sum(self.layout[n].num_heads for n in self.sites_of(unit))

    def penalty(self, lam: float) -> torch.Tensor:
        """Voita et al. (2019) eq. (6) regulariser λ Σ_i (1 − P(g_i = 0))."""
        return lam * self.expected_l0()

    def sample(self, name: str) -> torch.Tensor:
        """A reparameterised sample of the gates of site `name` (training)."""
        log_alpha = self.site_log_alpha(name)
        u = torch.rand_like(log_alpha).clamp(_EPS, 1 - _EPS)
        s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / BETA)
        return (s * (LIMIT_R - LIMIT_L) + LIMIT_L).clamp(0.0, 1.0)

    def deterministic(self, name: str) -> torch.Tensor:
        """Test-time gates: 1 where P(g = 1) > P(g = 0), else 0."""
        return (self.prob_open(name) > self.prob_closed(name)).to(self.site_log_alpha(name).dtype)

    def gate_values(self, training: bool) -> dict[str, torch.Tensor]:
        """The gate value of every gated head (a group's heads share their gate's value), sampled or deterministic."""
        return {name: (self.sample(name) if training else self.deterministic(name)).repeat_interleave(
            self.heads_per_gate[name]) for name in self.site_names}

    # export -----------------------------------------------------------------------------------------------------
    def to_mask(self, keep: int | None = None) -> HeadMask:
        """The gates as a binary HeadMask over the whole layout (heads of sites that are not gated are kept).

        Args:
            keep: None: the deterministic test-time gates (log α > 0). An int: exactly `keep` gated heads, those of
                the gates with the largest log α (a head budget met exactly, also while some gates are still
                undecided, when the expected L0 is on budget but log α > 0 would keep more or fewer heads); under
                grouped-query attention in whole key/value groups, so `keep` must be reachable (`check_budget`).
        """
        mask = HeadMask.ones(self.layout)
        with torch.no_grad():
            if keep is None:
                for name in self.site_names:
                    mask[name] = self.deterministic(name).detach().cpu().repeat_interleave(self.heads_per_gate[name])
                return mask
            if "neurons" in self.gated_units:
                raise ValueError("keep: a head budget cannot rank gated FFN neurons against heads; give the budget "
                                 "in multiply-adds (to_flop_mask).")
            self.check_budget(keep)
            kept = self._best_gates(keep)
            for name in self.site_names:
                gates = torch.tensor([1.0 if (name, i) in kept else 0.0 for i in range(len(self.site_log_alpha(name)))])
                mask[name] = gates.repeat_interleave(self.heads_per_gate[name])
        return mask

    def to_flop_mask(self, model: nn.Module, share: float) -> HeadMask:
        """The gates as a binary HeadMask that removes at least `share` of `model`'s per-token weight multiply-adds
        (`flop_budget.select_by_flops`; units removed by an earlier shrink count toward it), the gated units of lowest
        log α first, a key/value group as one; ungated units are kept. Over the budget by less than one gate's cost.

        Args:
            model: the gated model (its weights give each unit's cost).
            share: a float in [0, 1].

        Raises:
            ValueError: a share the gated units cannot meet (removing all of them leaves some to go).
        """
        from prunetrain.methods.flop_budget import select_by_flops, unit_costs
        from prunetrain.methods.importance import HeadScores

        costs = unit_costs(model, self.layout.units)
        gated = HeadLayout(self.layout.family, tuple(self.layout[n] for n in self.site_names), self.layout.units)
        with torch.no_grad():  # a unit's score is log α × its cost: select_by_flops ranks score per multiply-add
            scores = HeadScores(gated, {n: self.unit_log_alpha(n).detach().cpu().double() * costs[n]
                                        for n in self.site_names}, method="hard-concrete")
        chosen = select_by_flops(scores, share, model, min_per_site=0)
        mask = HeadMask.ones(self.layout)
        for name in self.site_names:
            mask[name] = chosen[name]
        return mask

    def check_budget(self, keep: int, argument: str = "keep") -> None:
        """Refuse a head budget the gates cannot meet exactly: not a count in [0, gated heads], or (grouped-query
        attention) no set of whole key/value groups holds exactly `keep` heads; the message names the nearest
        budgets that can be met.

        Args:
            keep: the number of gated heads to keep.
            argument: how the message names the budget (the callback passes "target_heads").
        """
        total = sum(self.layout[n].num_heads for n in self.site_names)
        if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= total:
            raise ValueError(f"{argument}: {keep!r} is not allowed; expected an int in [0, {total}] (gated heads).")
        reachable = 1  # bit j set: some set of gates holds exactly j heads (subset sums of the gate sizes)
        for name in self.site_names:
            for _ in range(len(self.site_log_alpha(name))):
                reachable |= reachable << self.heads_per_gate[name]
        if not reachable >> keep & 1:
            below = next(j for j in range(keep, -1, -1) if reachable >> j & 1)
            above = next((j for j in range(keep, total + 1) if reachable >> j & 1), None)
            sizes = sorted({self.heads_per_gate[n] for n in self.site_names})
            raise ValueError(f"{argument}: {keep} heads cannot be kept exactly: grouped-query attention removes heads "
                             f"in whole key/value groups (of {', '.join(map(str, sizes))} heads here), so the "
                             f"nearest budgets are {below}" + (f" and {above}." if above is not None else "."))

    def _best_gates(self, keep: int) -> set[tuple[str, int]]:
        """The gates (site, index) holding exactly `keep` heads with the largest Σ log α: the top `keep / g` gates
        when every gate holds g heads (ties: site order, then index), else a 0/1 knapsack on the gate sizes."""
        ranked = sorted(((float(v), name, i) for name in self.site_names
                         for i, v in enumerate(self.site_log_alpha(name).detach().cpu().tolist())),
                        key=lambda item: (-item[0], item[1], item[2]))
        sizes = [self.heads_per_gate[name] for _, name, _ in ranked]
        if len(set(sizes)) <= 1:
            return {(name, i) for _, name, i in ranked[:keep // max(sizes, default=1)]}
        best = [0.0] + [-math.inf] * keep  # best[j]: the largest Σ log α of gates holding j heads
        taken: list[list[bool]] = []
        for (value, _, _), size in zip(ranked, sizes):
            row = [False] * (keep + 1)
            for j in range(keep, size - 1, -1):
                if best[j - size] + value > best[j]:
                    best[j], row[j] = best[j - size] + value, True
            taken.append(row)
        kept, j = set(), keep
        for (_, name, i), size, row in zip(reversed(ranked), reversed(sizes), reversed(taken)):
            if row[j]:
                kept.add((name, i))
                j -= size
        return kept

    def open_per_kind(self) -> dict[str, int]:
        """Heads whose deterministic gate is open, per gated kind."""
        out = {k: 0 for k in self.kinds}
        with torch.no_grad():
            for site in self.layout:
                if site.name in self.site_names:
                    out[site.kind] += self.open_heads(site.name)
        return out

    def sites_of(self, unit: str = "heads") -> list[str]:
        """The gated sites of `unit` ("heads" or "neurons"), in layout order."""
        return [n for n in self.site_names if self.layout[n].unit == unit]

    def prob_open_matrix(self, unit: str = "heads") -> torch.Tensor:
        """1 − P(g = 0) as a [gated sites of `unit`, max units] matrix (NaN where a site has fewer units), for
        heatmaps."""
        names = self.sites_of(unit)
        width = max((self.layout[n].num_heads for n in names), default=0)
        out = torch.full((len(names), width), float("nan"))
        with torch.no_grad():
            for row, name in enumerate(names):
                values = (1 - self.prob_closed(name).detach().float().cpu()).repeat_interleave(self.heads_per_gate[name])
                out[row, : len(values)] = values
        return out

    # hooks ------------------------------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, model: nn.Module) -> "HardConcreteGates":
        """Gate `model`'s heads: resample at every model forward in training mode, deterministic in eval mode."""
        if self.attached:
            raise RuntimeError("HardConcreteGates.attach: already attached; call detach() first.")
        model = unwrap_model(model)
        sites = {s.info.name: s for s in live_sites(model, self.layout.units)}
        HeadMask(self.layout).check_matches(list(sites.values()))
        self._handles.append(model.register_forward_pre_hook(self._resample))
        slots = module_slots(model)
        for name in self.site_names:
            hook = _GateHook(self, name, sites[name].info.head_dim)
            self._handles += [handle for _, _, handle in place_hook(hook, sites[name].out_proj, slots)]
        self._model_refs = [weakref.ref(model)]
        register_scaler(model, self)  # every save of the model records the gates as it evaluates (`saved_keep`)
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._current = {}
        for ref in self._model_refs:
            if ref() is not None:
                unregister_scaler(ref(), self)
        self._model_refs = []

    def saved_keep(self) -> dict[str, torch.Tensor]:
        """The gates as a save records them: the deterministic test-time value of every gated head (the model as
        it evaluates, `model.eval()`), as float32 on the CPU. Sampled training-time gates are noise; the gates'
        parameters and their optimizer travel in the callback's checkpoint state."""
        with torch.no_grad():
            return {name: self.deterministic(name).detach().float().cpu().repeat_interleave(self.heads_per_gate[name])
                    for name in self.site_names}

    def _resample(self, model: nn.Module, args) -> None:
        self._current = self.gate_values(training=model.training)

    def current(self, name: str) -> torch.Tensor:
        if name not in self._current:  # a site module called outside the model's forward
            values = self.sample(name) if self.training else self.deterministic(name)
            self._current[name] = values.repeat_interleave(self.heads_per_gate[name])
        return self._current[name]


class _GateHook(PlacedHook):
    """Forward pre-hook on an output projection: multiply head h's slice by the current gate value (placed so that
    it survives a peft merge: `prunetrain.engine.peft_support.place_hook`)."""

    def __init__(self, gates: HardConcreteGates, name: str, head_dim: int):
        self.gates, self.name, self.head_dim = gates, name, head_dim

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        return scale_heads(x, self.gates.current(self.name), self.head_dim)


def gates_for(model: nn.Module, kinds: Iterable[str] | None = None, units=("heads",), **kwargs) -> HardConcreteGates:
    """`HardConcreteGates` for `model`'s layout of `units`, on the model's device, with each unit's multiply-adds
    (`flop_budget.unit_costs`, for `expected_cost`).

    Args:
        model: the model (a `.module` wrapper is unwrapped).
        kinds: the attention and FFN kinds to gate (None: every kind of `units`).
        units: "heads" (default), "neurons" (FFN neurons) or both.
        **kwargs: `HardConcreteGates` options (init_log_alpha, init_noise, seed).
    """
    from prunetrain.methods.flop_budget import unit_costs

    model = unwrap_model(model)
    units = check_units(units)
    gates = HardConcreteGates(find_sites(model, units), kinds=kinds, unit_costs=unit_costs(model, units), **kwargs)
    return gates.to(device_of(model))


class LagrangianBudget(nn.Module):
    """The head-budget term λ1 (E/N − t) + λ2 (E/N − t)² with E the expected L0 (`expected_l0`), N the number of
    gated heads and t the target share; the multipliers λ1, λ2 are trained by gradient *ascent* (Wang et al. 2020,
    "Structured pruning of large language models", eq. 7), so the term pushes E/N toward t.
    """

    def __init__(self):
        super().__init__()
        self.lambda_1 = nn.Parameter(torch.zeros(()))
        self.lambda_2 = nn.Parameter(torch.zeros(()))

    def forward(self, expected_fraction: torch.Tensor, target_fraction: float) -> torch.Tensor:
        gap = expected_fraction - target_fraction
        return self.lambda_1 * gap + self.lambda_2 * gap * gap
