"""The records prunetrain keeps on a pruned model's config (the layout, the export spec, folded soft values), held in
a form whose deep copy costs one C-level copy per list, not one Python call per element.

transformers deep-copies a model's config on hot paths: every forward of an encoder–decoder model builds
`DynamicCache(config=...)`, whose `config.get_text_config(decoder=True)` deep-copies the config and calls
`to_dict()` (another deep copy of its `__dict__`). A shrunk model's layout record names every kept unit by its
original index — in the fast recipe 36 heads and 6 144 FFN neurons, recorded twice (`prunetrain_heads` and the
export spec's `layout`) — and `copy.deepcopy` visits each int on its own. Measured (benchmarks/README.md l5): on a
lent H200 that cost the shrunk FFN models 23–36 ms of host time per training step (the fast recipe's architecture
1.08× the full model's speed at batch 4096 instead of 1.40×); on the 2-core EPYC, 6 ms per forward (3 % of its step).

A list or dict whose items are all atoms (int, float, str, bool, None: immutable) has a deep copy equal to its
shallow copy, so `AtomList` / `AtomDict` return that from `__deepcopy__`: the same copy, made at C speed (and an
`AtomTuple` returns itself, as the deep copy of a tuple of atoms is). They are a `list`, a `dict` and a `tuple` to
every other reader (equality, `isinstance`, JSON).
"""

from __future__ import annotations

from typing import Any

ATOMS = (int, float, str, bool, type(None))


class AtomList(list):
    """A list of atoms (module docstring): its deep copy is a shallow copy."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> "AtomList":
        return AtomList(self)


class AtomDict(dict):
    """A dict of atom keys and atom values (module docstring): its deep copy is a shallow copy."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> "AtomDict":
        return AtomDict(self)


class AtomTuple(tuple):
    """A tuple of atoms (module docstring): its deep copy is itself, as `copy.deepcopy` finds after visiting every
    item of a plain one."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> "AtomTuple":
        return self


_CHEAP = {list: AtomList, AtomList: AtomList, dict: AtomDict, AtomDict: AtomDict, tuple: AtomTuple,
          AtomTuple: AtomTuple}
_PLAIN = {AtomList: list, AtomDict: dict, AtomTuple: tuple}


def cheap_to_copy(value: Any) -> Any:
    """`value` (a JSON-like record of dicts, lists, tuples and atoms) rebuilt with every plain list, dict or tuple
    whose items are all atoms in its cheap-to-copy form (`AtomList`, `AtomDict`, `AtomTuple`); any other object as
    it is. Equal to `value`."""
    kind = type(value)
    if kind not in _CHEAP:
        return value
    if _CHEAP[kind] is AtomDict:
        items = {key: cheap_to_copy(item) for key, item in value.items()}
        atoms = all(isinstance(key, ATOMS) and isinstance(item, ATOMS) for key, item in items.items())
    else:
        items = [cheap_to_copy(item) for item in value]
        atoms = all(isinstance(item, ATOMS) for item in items)
    return _CHEAP[kind](items) if atoms else _PLAIN.get(kind, kind)(items)


RECORD_PREFIX = "prunetrain_"
"""Every config key prunetrain records starts with it (`prunetrain_heads`, `prunetrain_export`, `prunetrain_folded`)."""


def make_records_cheap_to_copy(config: Any) -> None:
    """Hold every prunetrain record on `config` (keys starting with `RECORD_PREFIX`) in the cheap-to-copy form
    (`cheap_to_copy`); called wherever a record is written (`shrink`, `mark_pruned`)."""
    state = getattr(config, "__dict__", None)  # a config object without one holds no records of ours
    for key in [key for key in state or () if key.startswith(RECORD_PREFIX)]:
        state[key] = cheap_to_copy(state[key])


__all__ = ["RECORD_PREFIX", "AtomDict", "AtomList", "AtomTuple", "cheap_to_copy", "make_records_cheap_to_copy"]
