"""The adapter registry: the one interface between the engine (`heads`, `mask`, `shrink`, ...) and the family
adapters.

Adapters register into it (`register`); the engine asks it for the adapter of a model (`adapter_for`) and, with
`find_heads(model, discover=True)`, for structural discovery (`discover`, served by the discoverer that
`prunetrain.engine.families.discovery` installs with `set_discoverer`). The registry imports no other prunetrain
module, so the arrows inside the engine point one way: `families` → `heads` → `registry` ← `families`. Importing
`prunetrain` registers the built-in adapters (`prunetrain.engine.families`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol
from prunetrain.utils.door import checked

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn


class Adapter(Protocol):
    """What the engine reads from an adapter (`prunetrain.engine.families.core.FamilyAdapter` implements it).

    Attributes:
        name: adapter name (recorded in `HeadLayout.family`).
        model_types: the `config.model_type` values it handles.
        time_first: the output projection's input is `[T, B, H*d]` (fairseq / FSMT), not `[B, T, H*d]`.
        cache_kwargs: keyword names under which the attention module receives its KV cache.
    """

    name: str
    model_types: tuple[str, ...]
    time_first: bool
    cache_kwargs: tuple[str, ...]

    def sites(self, model: "nn.Module") -> list: ...

    def remove_heads(self, site: Any, keep: Any, select: Callable) -> None: ...

    def shrink_refusal(self, site: Any) -> str | None: ...

    def neuron_sites(self, model: "nn.Module") -> list: ...

    def neuron_refusal(self, model: "nn.Module") -> str | None: ...


_ADAPTERS: list[Adapter] = []
_DISCOVERERS: list[Callable[["nn.Module"], None]] = []  # at most one: the structural discovery of `families`


@checked
def register(cls: type) -> type:
    """Class decorator: make a family adapter available to `find_heads`, `HeadMask` and `shrink`.

    Args:
        cls: a `FamilyAdapter` subclass; its `model_types` must not be claimed by an adapter registered before.
    """
    adapter = cls()
    taken = {t: a.name for a in _ADAPTERS for t in a.model_types}
    clash = [t for t in adapter.model_types if t in taken]
    if clash:
        raise ValueError(f"model_types: {clash[0]!r} of adapter {adapter.name!r} is already handled by adapter "
                         f"{taken[clash[0]]!r}; each model_type has one adapter.")
    _ADAPTERS.append(adapter)
    return cls


def unregister(name: str) -> None:
    """Remove the adapter called `name` (e.g. one registered by `discover_adapter` for a test).

    Args:
        name: the adapter's `name`.
    """
    index = next((i for i, a in enumerate(_ADAPTERS) if a.name == name), None)
    if index is None:
        raise ValueError(f"name: no adapter is called {name!r}; registered: {', '.join(supported_families())}.")
    del _ADAPTERS[index]


@checked
def supported_families() -> list[str]:
    """Names of the registered adapters."""
    return [a.name for a in _ADAPTERS]


def supported_model_types() -> list[str]:
    """Every `config.model_type` an adapter handles."""
    return [t for a in _ADAPTERS for t in a.model_types]


def handles(model_type: str) -> bool:
    """Whether a registered adapter handles `model_type`."""
    return any(model_type in a.model_types for a in _ADAPTERS)


def adapter_for(model: "nn.Module") -> Adapter:
    """The adapter for `model`, chosen by `model.config.model_type`; a clear error for anything else.

    Args:
        model: a transformers model (anything with `config.model_type`).
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    for adapter in _ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    raise ValueError(
        f"model: {type(model).__name__} (model_type={model_type!r}) is not supported; supported model types: "
        f"{', '.join(supported_model_types())}. Let prunetrain discover one from the model's structure "
        f"(find_heads(model, discover=True), i.e. prunetrain.engine.families.discovery.discover_adapter) or register "
        f"an adapter (see prunetrain.engine.families.core)."
    )


def set_discoverer(discoverer: Callable[["nn.Module"], None]) -> None:
    """Install the structural discovery `find_heads(model, discover=True)` runs: `discoverer(model)` proves and
    registers an adapter for the model's type (or raises `ValueError` with the reason). A later call replaces it.

    Args:
        discoverer: a callable taking the model.
    """
    _DISCOVERERS[:] = [discoverer]


def discover(model: "nn.Module") -> None:
    """Run the installed discoverer on `model` (`set_discoverer`)."""
    if not _DISCOVERERS:
        raise ValueError(f"discover: no structural discovery is installed for {type(model).__name__}; import "
                         f"prunetrain (it installs prunetrain.engine.families.discovery).")
    _DISCOVERERS[0](model)


__all__ = ["Adapter", "adapter_for", "discover", "handles", "register", "set_discoverer", "supported_families",
           "supported_model_types", "unregister"]
