"""Prunable sites: where the heads and FFN neurons of a model live, and what each site looks like.

Two kinds of unit share one description. A **head** lives in a multi-head attention site; a **neuron** lives in a
feed-forward (FFN) site: one row of the up projection(s) (and of the gate, in gated FFNs) and the matching input
column of the down projection. A neuron is a unit of width 1 whose "output projection" is the down projection, so
one mask hook (on the input of the output projection), one shrink (rows of the projections before it, columns of
the one after it, the optimizer state with them) and one persisted record serve both.

`find_heads(model)` returns a `HeadLayout` of the attention sites (its stable name, kind, layer, head counts,
head_dim and, after `shrink`, which of the original heads it still holds); `find_neurons(model)` one of the FFN
sites; `find_sites(model, units=("heads", "neurons"))` one of both, in module order. The module-level knowledge of
each model family (which Linear is the query projection, which the FFN's down projection, ...) lives in
`prunetrain.engine.families`; everything else in prunetrain works from the layout and `AttentionSite` handles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterator

from torch import nn

from prunetrain.engine import registry
from prunetrain.engine.peft_support import is_peft_wrapper, peft_inner
from prunetrain.utils.door import checked

KINDS = ("encoder_self", "decoder_self", "cross", "self")
"""Attention kinds: encoder self-attention, decoder self-attention, decoder→encoder (cross) attention, and `self`
for the self-attention of encoder-only and decoder-only models."""

NEURON_KINDS = ("encoder_ffn", "decoder_ffn", "ffn")
"""FFN kinds: the feed-forward block of an encoder layer, of a decoder layer, and `ffn` for the single stack of
encoder-only and decoder-only models."""

UNITS = ("heads", "neurons")
"""The kinds of prunable unit: attention heads (sites of a kind in `KINDS`) and FFN neurons (`NEURON_KINDS`)."""

LAYOUT_CONFIG_KEY = "prunetrain_heads"
"""Config attribute that records, per site, the original indices of the units a shrunk model still holds (heads of
an attention site, neurons of an FFN site: one record for both)."""


def unit_of(kind: str) -> str:
    """The unit a site of `kind` holds: "neurons" for an FFN kind, else "heads"."""
    return "neurons" if kind in NEURON_KINDS else "heads"


def check_units(units, argument: str = "units") -> tuple[str, ...]:
    """`units` as a tuple in `UNITS` order: a non-empty list, tuple or set of names from `UNITS`, or one name."""
    if isinstance(units, str):
        units = (units,)
    if not isinstance(units, (list, tuple, set, frozenset)) or not units or \
            not all(isinstance(u, str) and u in UNITS for u in units):
        raise ValueError(f"{argument}: {units!r} is not a non-empty selection of {', '.join(map(repr, UNITS))}.")
    return tuple(u for u in UNITS if u in units)


@checked
@dataclass(frozen=True)
class HeadSite:
    """One prunable site: a multi-head attention site, or an FFN site whose units are neurons.

    An FFN site describes its neurons in the same fields: `num_heads` neurons of `head_dim` 1, `num_kv_heads` equal
    to `num_heads`, `heads` the original indices of the neurons held now, `group_size` 1 (`unit` says which).

    name:        stable name (the attention module's path in the model; for an FFN site, the path of its down
                 projection, whose input features are the neurons); unchanged by `shrink`.
    kind:        one of `KINDS` (attention) or `NEURON_KINDS` (FFN).
    layer:       layer index within its stack (encoder, decoder or the single stack).
    num_heads:   number of query heads the site holds now.
    head_dim:    size of each head.
    num_kv_heads: number of key/value heads (equal to num_heads unless the model uses grouped-query attention).
    heads:       original indices of the query heads held now (range(num_heads) before any shrink).
    original_num_heads: number of query heads the site had when the model was built.
    group_size:  query heads that share a key/value head and so are removed together: num_heads / num_kv_heads under
                 grouped-query attention, 1 without it, and 1 with a single key/value head (multi-query attention,
                 or a GQA site shrunk to one group), whose query heads can go one by one.
    """

    name: str
    kind: str
    layer: int
    num_heads: int
    head_dim: int
    num_kv_heads: int
    heads: tuple[int, ...]
    original_num_heads: int
    group_size: int = 1

    @property
    def unit(self) -> str:
        """"heads" (an attention site) or "neurons" (an FFN site)."""
        return unit_of(self.kind)


@checked
@dataclass(frozen=True)
class HeadLayout:
    """Every prunable site of a model for the units it describes (`units`: attention heads by default, FFN neurons
    too with `find_sites`), in module order."""

    family: str
    sites: tuple[HeadSite, ...]
    units: tuple[str, ...] = ("heads",)
    _index: dict = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {s.name: s for s in self.sites})

    def __iter__(self) -> Iterator[HeadSite]:
        return iter(self.sites)

    def __len__(self) -> int:
        return len(self.sites)

    def __getitem__(self, name: str) -> HeadSite:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown site {name!r}; this model has {len(self.sites)} sites: "
                           f"{_preview(list(self._index))}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sites]

    @property
    def kinds(self) -> list[str]:
        """The kinds present, attention kinds in `KINDS` order, then FFN kinds in `NEURON_KINDS` order."""
        present = {s.kind for s in self.sites}
        return [k for k in (*KINDS, *NEURON_KINDS) if k in present]

    @property
    def total_heads(self) -> int:
        """Heads held by the attention sites (FFN neurons are `total_neurons`)."""
        return sum(s.num_heads for s in self.sites if s.unit == "heads")

    @property
    def total_neurons(self) -> int:
        """Neurons held by the FFN sites."""
        return sum(s.num_heads for s in self.sites if s.unit == "neurons")

    def heads_per_kind(self) -> dict[str, int]:
        """{attention kind: heads held}."""
        return self._per_kind("heads")

    def neurons_per_kind(self) -> dict[str, int]:
        """{FFN kind: neurons held}."""
        return self._per_kind("neurons")

    def _per_kind(self, unit: str) -> dict[str, int]:
        out = {k: 0 for k in self.kinds if unit_of(k) == unit}
        for s in self.sites:
            if s.unit == unit:
                out[s.kind] += s.num_heads
        return out

    def restricted(self, units) -> "HeadLayout":
        """The layout of the sites of `units` only (a selection of `UNITS`)."""
        units = check_units(units)
        return HeadLayout(self.family, tuple(s for s in self.sites if s.unit in units), units)

    def to_dict(self) -> dict:
        data = {"family": self.family, "sites": [asdict(s) for s in self.sites]}
        if self.units != ("heads",):  # a heads-only layout keeps the format it always had
            data["units"] = list(self.units)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "HeadLayout":
        sites = tuple(HeadSite(**{**s, "heads": tuple(s["heads"])}) for s in data["sites"])
        return cls(family=data["family"], sites=sites, units=check_units(data.get("units", ("heads",)), "layout units"))

    def summary(self) -> str:
        """One line: total heads and heads per kind, e.g. `96 heads (encoder_self 32, decoder_self 32, cross 32)`,
        then the neurons per FFN kind when the layout describes them."""
        parts = []
        for unit, per_kind, total in (("heads", self.heads_per_kind(), self.total_heads),
                                      ("neurons", self.neurons_per_kind(), self.total_neurons)):
            if unit in self.units:
                parts.append(f"{total} {unit} ({', '.join(f'{k} {n}' for k, n in per_kind.items())})")
        return "; ".join(parts)


@dataclass
class AttentionSite:
    """A live handle on one site (attention or FFN): the pure-data `HeadSite` plus the modules the engine touches.

    module:   the attention module (for an FFN site, the module holding the FFN's projections).
    out_proj: the module whose *input* is the concatenation of the units, `[..., num_heads * head_dim]`, head-major
              (for an FFN site the down projection, whose input features are the neurons). HeadMask hooks it;
              shrink removes its input columns.
    adapter:  what slices the site (`remove_heads`); for an FFN site the family's neuron adapter.
    root:     the model the site belongs to (for adapters that replace a module).
    """

    info: HeadSite
    module: nn.Module
    out_proj: nn.Module
    adapter: registry.Adapter
    root: nn.Module  # the model the site belongs to


def _preview(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP / FSDP / accelerate wrappers (anything with `.module` and no `.config`) and
    peft's `PeftModel` (its base model, so sites are named as in the base architecture:
    `prunetrain.engine.peft_support`)."""
    while (not hasattr(model, "config") and isinstance(getattr(model, "module", None), nn.Module)) \
            or is_peft_wrapper(model):
        model = peft_inner(model) if is_peft_wrapper(model) else model.module
    return model


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Live handles on every attention site of `model` (raises `ValueError` for an unsupported model)."""
    model = unwrap_model(model)
    adapter = registry.adapter_for(model)
    return _nonempty(model, adapter, adapter.sites(model))


def live_sites(model: nn.Module, units=("heads",)) -> list[AttentionSite]:
    """Live handles on every site of `units` in `model`, in module order (raises `ValueError` for an unsupported
    model, and for neurons of a family whose FFN prunetrain cannot prune, with the reason)."""
    units = check_units(units)
    model = unwrap_model(model)
    adapter = registry.adapter_for(model)
    sites = _nonempty(model, adapter, adapter.sites(model)) if "heads" in units else []
    if "neurons" in units:
        sites = _in_module_order(model, sites + adapter.neuron_sites(model))
    return sites


def _in_module_order(model: nn.Module, sites: list[AttentionSite]) -> list[AttentionSite]:
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    return sorted(sites, key=lambda s: order.get(s.info.name, len(order)))


def supported_units(model: nn.Module) -> tuple[str, ...]:
    """The units prunetrain can prune in `model`: ("heads", "neurons"), or ("heads",) for a family whose FFN it
    does not prune (mixtures of experts, a discovered adapter without an FFN description)."""
    adapter = registry.adapter_for(unwrap_model(model))
    return UNITS if getattr(adapter, "neuron_refusal", lambda m: "no FFN")(unwrap_model(model)) is None else ("heads",)


def all_sites(model: nn.Module) -> list[AttentionSite]:
    """Live handles on every site of every unit `model` supports (`supported_units`): what the engine walks when
    it must see any site a mask, a save or a record may name."""
    return live_sites(model, supported_units(model))


def _nonempty(model: nn.Module, adapter, sites: list[AttentionSite]) -> list[AttentionSite]:
    """A supported model in which the adapter finds no site means its modules were renamed: fail loudly."""
    if not sites:
        raise ValueError(
            f"model: {type(model).__name__} (model_type={model.config.model_type!r}) is handled by adapter "
            f"{adapter.name!r}, but none of its modules matches the adapter's attention classes; the installed "
            f"transformers has probably renamed them, so the adapter must be updated (nothing would be pruned).")
    return sites


@checked
def find_heads(model: nn.Module, discover: bool = False) -> HeadLayout:
    """Every multi-head attention site of a transformers model, as a `HeadLayout`.

    The supported model types are `prunetrain.supported_families()` (docs/engine.md lists them, generated from
    `prunetrain.zoo`). The result does not depend on the attention backend (eager, sdpa, flex).

    Args:
        model: a transformers model (or a DDP / accelerate wrapper around one).
        discover: for a model type no adapter names, propose one from the model's structure, prove it exact on a
            probe input built from the config and register it (one line is logged;
            `prunetrain.engine.families.discovery`). Off by default: discovery runs the model several times on a
            copy of it (twice its memory) and registers an adapter for the whole process, which a query should not
            do unasked; once registered, every later call (and every callback) finds the model's heads.

    Raises:
        ValueError: for an unsupported `model_type` (without `discover`, or when discovery refuses the model, with
            the reason), or a supported one in which no attention site is found.
    """
    return find_sites(model, ("heads",), discover=discover)


@checked
def find_neurons(model: nn.Module) -> HeadLayout:
    """Every FFN site of a transformers model, as a `HeadLayout` of neurons (see `find_sites`).

    Raises:
        ValueError: for an unsupported model, or a family whose FFN prunetrain does not prune (mixtures of
            experts), with the reason.
    """
    return find_sites(model, ("neurons",))


@checked
def find_sites(model: nn.Module, units=("heads", "neurons"), discover: bool = False) -> HeadLayout:
    """Every prunable site of `units` in a transformers model, in module order, as one `HeadLayout`.

    Args:
        model: a transformers model (or a DDP / accelerate / peft wrapper around one).
        units: "heads", "neurons" or both (the default).
        discover: as in `find_heads`.

    Raises:
        ValueError: for an unsupported model, or neurons of a family whose FFN prunetrain does not prune.
    """
    units = check_units(units)
    model = unwrap_model(model)
    if discover and not registry.handles(getattr(getattr(model, "config", None), "model_type", None)):
        registry.discover(model)  # proves and registers an adapter, or says why not
    adapter = registry.adapter_for(model)
    return HeadLayout(family=adapter.name, sites=tuple(s.info for s in live_sites(model, units)), units=units)


def layout_naming(model: nn.Module, names) -> HeadLayout:
    """The layout of the units that `names` (site names) belong to: heads, plus neurons when one of them is an FFN
    site (a name the model does not have is left for the caller to refuse)."""
    model = unwrap_model(model)
    full = {s.info.name: s.info.unit for s in all_sites(model)}
    needed = {full[name] for name in names if name in full} | {"heads"}
    return find_sites(model, tuple(needed))


def recorded_units(model: nn.Module) -> tuple[str, ...]:
    """The units a save of `model` describes in its layout: heads, and neurons once an FFN site was shrunk."""
    model = unwrap_model(model)
    recorded = getattr(getattr(model, "config", None), LAYOUT_CONFIG_KEY, None) or {}
    if "neurons" in supported_units(model):
        ffn = {s.info.name for s in registry.adapter_for(model).neuron_sites(model)}
        if any(name in ffn for name in recorded):
            return UNITS
    return ("heads",)


def layout_record(model: nn.Module) -> dict:
    """The layout a save records (`find_sites(model, recorded_units(model)).to_dict()`), plus under "discovered"
    the description of a discovered adapter (so a pruned directory brings it along to a fresh process:
    `prunetrain.engine.families.discovery.register_description`)."""
    model = unwrap_model(model)
    record = find_sites(model, recorded_units(model)).to_dict()
    describe = getattr(registry.adapter_for(model), "description", None)
    if callable(describe):
        record["discovered"] = describe()
    return record
