"""Attention sites: where the heads of a model live, and what each one looks like.

`find_heads(model)` returns a `HeadLayout`, a pure-data description of every multi-head attention site (its stable
name, kind, layer, head counts, head_dim and, after `shrink`, which of the original heads it still holds).
The module-level knowledge of each model family (which Linear is the query projection, ...) lives in
`prunetrain.engine.families`; everything else in prunetrain works from the layout and `AttentionSite` handles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterator

from torch import nn

from prunetrain.engine import registry
from prunetrain.engine.peft_support import is_peft_wrapper, peft_inner

KINDS = ("encoder_self", "decoder_self", "cross", "self")
"""Attention kinds: encoder self-attention, decoder self-attention, decoder→encoder (cross) attention, and `self`
for the self-attention of encoder-only and decoder-only models."""

LAYOUT_CONFIG_KEY = "prunetrain_heads"
"""Config attribute that records, per site, the original indices of the heads a shrunk model still holds."""


@dataclass(frozen=True)
class HeadSite:
    """One multi-head attention site.

    name:        stable name (the attention module's path in the model); unchanged by `shrink`.
    kind:        one of `KINDS`.
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


@dataclass(frozen=True)
class HeadLayout:
    """Every attention site of a model, in module order."""

    family: str
    sites: tuple[HeadSite, ...]
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
        """The attention kinds present, in `KINDS` order."""
        present = {s.kind for s in self.sites}
        return [k for k in KINDS if k in present]

    @property
    def total_heads(self) -> int:
        return sum(s.num_heads for s in self.sites)

    def heads_per_kind(self) -> dict[str, int]:
        out = {k: 0 for k in self.kinds}
        for s in self.sites:
            out[s.kind] += s.num_heads
        return out

    def to_dict(self) -> dict:
        return {"family": self.family, "sites": [asdict(s) for s in self.sites]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "HeadLayout":
        sites = tuple(HeadSite(**{**s, "heads": tuple(s["heads"])}) for s in data["sites"])
        return cls(family=data["family"], sites=sites)

    def summary(self) -> str:
        """One line: total heads and heads per kind, e.g. `96 heads (encoder_self 32, decoder_self 32, cross 32)`."""
        per_kind = ", ".join(f"{k} {n}" for k, n in self.heads_per_kind().items())
        return f"{self.total_heads} heads ({per_kind})"


@dataclass
class AttentionSite:
    """A live handle on one site: the pure-data `HeadSite` plus the modules the engine touches.

    out_proj: the module whose *input* is the concatenation of the heads, `[..., num_heads * head_dim]`, head-major.
              HeadMask hooks it; shrink removes its input columns.
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


def _nonempty(model: nn.Module, adapter, sites: list[AttentionSite]) -> list[AttentionSite]:
    """A supported model in which the adapter finds no site means its modules were renamed: fail loudly."""
    if not sites:
        raise ValueError(
            f"model: {type(model).__name__} (model_type={model.config.model_type!r}) is handled by adapter "
            f"{adapter.name!r}, but none of its modules matches the adapter's attention classes; the installed "
            f"transformers has probably renamed them, so the adapter must be updated (nothing would be pruned).")
    return sites


def find_heads(model: nn.Module, discover: bool = False) -> HeadLayout:
    """Every multi-head attention site of a transformers model, as a `HeadLayout`.

    The supported model types are `prunetrain.supported_model_types()` (the README lists them, generated from
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
    model = unwrap_model(model)
    if discover and not registry.handles(getattr(getattr(model, "config", None), "model_type", None)):
        registry.discover(model)  # proves and registers an adapter, or says why not
    adapter = registry.adapter_for(model)
    return HeadLayout(family=adapter.name, sites=tuple(s.info for s in _nonempty(model, adapter, adapter.sites(model))))


def layout_record(model: nn.Module) -> dict:
    """`find_heads(model).to_dict()`, plus under "discovered" the description of a discovered adapter (so a pruned
    directory brings it along to a fresh process: `prunetrain.engine.families.discovery.register_description`)."""
    model = unwrap_model(model)
    record = find_heads(model).to_dict()
    describe = getattr(registry.adapter_for(model), "description", None)
    if callable(describe):
        record["discovered"] = describe()
    return record
