"""HeadMask: a keep value ξ_h per unit per site, applied on the input of each site's output projection.

Michel et al. (2019) write multi-head attention with a mask variable per head,

    MHAtt(x, q) = Σ_h ξ_h · Att_h(x, q) W_o^h,

so multiplying head h's slice of the concatenated head outputs (the input of the output projection,
`[..., num_heads * head_dim]`, head-major) by ξ_h is exactly that. It works for every attention backend (eager,
sdpa, flex) because it acts after attention. With `requires_grad_()` the keep values are leaf tensors and
∂L/∂ξ_h is their gradient (the basis of head importance).

FFN neurons are units of the same kind (`prunetrain.engine.heads`): a neuron's keep value multiplies its input
feature of the FFN's down projection, `FFN(x) = Σ_j ξ_j · act(x·w_j) d_j`, with the same hook. A mask describes the
units of its layout: `HeadMask.ones(model)` heads only, `HeadMask.ones(model, units=("heads", "neurons"))` both.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import warnings
import weakref
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch
from torch import nn

from prunetrain.engine.heads import (AttentionSite, HeadLayout, all_sites, find_sites, layout_naming, live_sites,
                                     unwrap_model)
from prunetrain.engine.peft_support import PlacedHook, module_slots, out_of_place, place_hook
from prunetrain.engine.remote_code import adopt_loaded_masks, set_mask_recorder, unwatch_config, watch_config
from prunetrain.utils.door import checked


def scale_heads(x: torch.Tensor, values: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Multiply head h's slice of the concatenated head outputs x `[..., H * d]` by values[h]."""
    values = values.to(device=x.device, dtype=x.dtype)
    if head_dim == 1:  # FFN neurons: one feature each
        return x * values
    return (x.unflatten(-1, (-1, head_dim)) * values[:, None]).flatten(-2)  # [..., H, d] -> [..., H * d]


class _HeadScale(PlacedHook):
    """Forward pre-hook: multiply head h's slice of the output projection's input by keep[h] (placed so that it
    survives a peft merge: `prunetrain.engine.peft_support.place_hook`)."""

    def __init__(self, keep: torch.Tensor, head_dim: int):
        self.keep = keep
        self.head_dim = head_dim

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        return scale_heads(x, self.keep, self.head_dim)


@checked(own=("values",))
class HeadMask:
    """A keep value per head for every attention site of one model layout.

    1 keeps a head, 0 removes it, values in between scale its output. Build one with `HeadMask.ones(model)`
    (or from a layout), change values with `mask[site_name] = ...` / `mask.set(site, head, value)`, then
    `attach(model)` (or `with mask.applied(model): ...`). `detach()` removes every hook it added.
    """

    def __init__(self, layout: HeadLayout, values: Mapping[str, Iterable[float] | torch.Tensor] | None = None):
        self.layout = layout
        self._values: dict[str, torch.Tensor] = {
            s.name: torch.ones(s.num_heads, dtype=torch.float32) for s in layout
        }
        self._handles: list = []
        self._placed: list = []  # (hook, module) per registered hook, to see a projection replaced since
        self._model_ref: nn.Module | None = None
        self._owner: object | None = None
        for name, keep in (values or {}).items():
            self[name] = keep

    # construction -----------------------------------------------------------------------------------------------
    @classmethod
    def ones(cls, model_or_layout: nn.Module | HeadLayout, units=("heads",)) -> "HeadMask":
        """A mask keeping every unit: of a layout, or of a model's sites of `units` ("heads", "neurons" or both;
        ignored for a layout, which says its own)."""
        return cls(_layout_of(model_or_layout, units))

    @classmethod
    def from_heads(cls, model_or_layout, remove: Mapping[str, Iterable[int]]) -> "HeadMask":
        """A mask that removes the given units (current positions within each site) and keeps all others; for a
        model, its layout covers the units the named sites hold (heads, and neurons if an FFN site is named)."""
        if isinstance(model_or_layout, nn.Module):
            model_or_layout = layout_naming(model_or_layout, list(remove))
        mask = cls.ones(model_or_layout)
        for name, heads in remove.items():
            for head in heads:
                mask.set(name, head, 0.0)
        return mask

    # values -----------------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        self._check_site(name)
        return self._values[name]

    def __setitem__(self, name: str, keep) -> None:
        self._check_site(name)
        expected = self.layout[name].num_heads
        tensor = _keep_tensor(f"mask[{name!r}]", keep)
        if tensor.numel() != expected:
            raise ValueError(f"mask[{name!r}]: got {tensor.numel()} keep values, but this site has {expected} heads.")
        _check_range(f"mask[{name!r}]", tensor)
        self._values[name].data.copy_(tensor)

    def set(self, name: str, head: int, value: float) -> None:
        """Set the keep value of one head.

        Args:
            name: site name.
            head: position of the head within the site (an integer; bools are refused).
            value: keep value in [0, 1] (a real number; strings and bools are refused).
        """
        self._check_site(name)
        n = self.layout[name].num_heads
        head, value = _scalar(head), _scalar(value)
        if isinstance(head, bool) or not isinstance(head, numbers.Integral):
            raise ValueError(f"head: {head!r} is not a head index; use an integer in 0..{n - 1}.")
        if not 0 <= head < n:
            raise ValueError(f"head: {head} is out of range for site {name!r}, which has heads 0..{n - 1}.")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"value: {value!r} is not a keep value; use a number in [0, 1].")
        _check_range(f"value for {name!r} head {head}", torch.tensor([float(value)]))
        with torch.no_grad():
            self._values[name][int(head)] = float(value)

    def items(self):
        return self._values.items()

    def values(self) -> list[torch.Tensor]:
        return list(self._values.values())

    def requires_grad_(self, flag: bool = True) -> "HeadMask":
        """Make the keep values leaf tensors that collect ∂L/∂ξ (used by head importance)."""
        for tensor in self._values.values():
            tensor.requires_grad_(flag)
        return self

    def zero_grad(self) -> None:
        for tensor in self._values.values():
            tensor.grad = None

    def kept(self, name: str) -> list[int]:
        """Positions of heads with a non-zero keep value at `name`."""
        return torch.nonzero(self[name] != 0).flatten().tolist()

    def _kept_of(self, unit: str | None) -> int:
        return sum(int((self._values[s.name] != 0).sum()) for s in self.layout if unit is None or s.unit == unit)

    @property
    def num_kept(self) -> int:
        """Heads with a non-zero keep value (FFN neurons: `num_kept_neurons`; both: `num_kept_units`)."""
        return self._kept_of("heads")

    @property
    def num_heads(self) -> int:
        """Heads the mask describes."""
        return self.layout.total_heads

    @property
    def num_kept_neurons(self) -> int:
        """FFN neurons with a non-zero keep value."""
        return self._kept_of("neurons")

    @property
    def num_neurons(self) -> int:
        """FFN neurons the mask describes."""
        return self.layout.total_neurons

    @property
    def num_kept_units(self) -> int:
        """Units (heads and neurons) with a non-zero keep value."""
        return self._kept_of(None)

    @property
    def num_units(self) -> int:
        """Units (heads and neurons) the mask describes."""
        return self.num_heads + self.num_neurons

    def kept_per_kind(self) -> dict[str, int]:
        out = {k: 0 for k in self.layout.kinds}
        for site in self.layout:
            out[site.kind] += int((self._values[site.name] != 0).sum())
        return out

    def is_binary(self) -> bool:
        return all(bool(((v == 0) | (v == 1)).all()) for v in self._values.values())

    def copy(self) -> "HeadMask":
        return HeadMask(self.layout, {k: v.detach() for k, v in self._values.items()})

    def restricted(self, units) -> "HeadMask":
        """A detached copy holding the keep values of the sites of `units` only ("heads", "neurons" or both)."""
        layout = self.layout.restricted(units)
        return HeadMask(layout, {s.name: self._values[s.name].detach() for s in layout})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadMask):
            return NotImplemented
        return self.layout.names == other.layout.names and all(
            torch.equal(self._values[k].detach(), other._values[k].detach()) for k in self._values
        )

    def __repr__(self) -> str:
        neurons = f", {self.num_kept_neurons}/{self.num_neurons} neurons" if "neurons" in self.layout.units else ""
        return f"HeadMask({self.num_kept}/{self.num_heads} heads{neurons} kept, attached={self.attached})"

    # hooks ------------------------------------------------------------------------------------------------------
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self, model: nn.Module, owner: object | None = None) -> "HeadMask":
        """Register one forward pre-hook per site on `model`'s output projections. Returns self.

        Args:
            model: the model (DDP / accelerate wrappers are unwrapped).
            owner: who keeps this mask on the model (a pruning callback). A mask attached while another owner's
                mask is attached warns (`UserWarning`): both apply, so two pruning callbacks on one model would
                each remove heads. Temporary masks (importance probes, curves) pass no owner.

        While attached, every save of the model (`save_pretrained`, `Trainer.save_model`, Trainer checkpoints)
        records the mask (`saved_mask_record`), so the directory loads as the masked model, or not at all with plain
        transformers (`prunetrain.engine.remote_code`).
        """
        if self.attached:
            raise RuntimeError("HeadMask.attach: this mask is already attached; call detach() first.")
        model = unwrap_model(model)  # record it under the model itself, not a DDP / accelerate wrapper
        sites = live_sites(model, self.layout.units)
        self.check_matches(sites)
        others = [m for m in _attached_masks(model) if owner is not None and m._owner not in (None, owner)
                  and not isinstance(owner, SavedMask)]  # masks loaded together are one model's
        if others:
            other = others[0]._owner
            other = ((f"the mask saved with the model (by {other.name})" if other.name else "the mask saved with "
                      "the model") if isinstance(other, SavedMask) else f"another {type(other).__name__}")
            warnings.warn(f"model: {type(owner).__name__} attaches a HeadMask while {other} keeps one attached; "
                          f"both apply (their product), so heads are pruned by each. Use one pruning callback per "
                          f"model.", UserWarning, stacklevel=2)
        self._owner = owner
        self._register(sites, module_slots(model))
        self._model_ref = model
        _attached_masks(model).append(self)
        _watch(model)  # every save of the model now records this mask (prunetrain.engine.remote_code)
        return self

    def _register(self, sites: list[AttentionSite], slots: dict) -> None:
        for site in sites:
            if site.info.name not in self._values:
                continue  # a site of a unit this mask does not describe
            hook = _HeadScale(self._values[site.info.name], site.info.head_dim)
            for placed, module, handle in place_hook(hook, site.out_proj, slots):
                self._handles.append(handle)
                self._placed.append((placed, module))

    def detach(self) -> None:
        """Remove every hook this mask added; the model is exactly as before `attach`."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._placed = [], []
        model, self._model_ref = self._model_ref, None
        if model is not None:
            masks = _attached_masks(model)
            masks[:] = [m for m in masks if m is not self]  # by identity: an equal copy may be attached too
            _unwatch(model)

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator["HeadMask"]:
        """Context manager: `with mask.applied(model): ...` attaches the mask and detaches it on exit.

        Re-entrant: inside a block that already applies this mask to the same model, a nested `applied` changes
        nothing and the outer block detaches. (A mask that `shrink` consumed inside the block is already detached.)

        Args:
            model: the model to attach to (DDP / accelerate wrappers are unwrapped).
        """
        already = self.attached and self._model_ref is unwrap_model(model)
        if not already:
            self.attach(model)
        try:
            yield self
        finally:
            if not already and self.attached:
                self.detach()

    def check_matches(self, model_or_sites) -> None:
        """Raise `ValueError` unless this mask was built for the same sites and head counts as the model."""
        if isinstance(model_or_sites, nn.Module):
            sites = [s.info for s in live_sites(model_or_sites, self.layout.units)]
        else:
            sites = [s.info if isinstance(s, AttentionSite) else s for s in model_or_sites]
        mine = [(s.name, s.num_heads) for s in self.layout]
        theirs = [(s.name, s.num_heads) for s in sites]
        if mine != theirs:
            diff = next(((a, b) for a, b in zip(mine, theirs) if a != b), None)
            detail = (f"first difference: mask has {diff[0]}, model has {diff[1]}" if diff
                      else f"mask has {len(mine)} sites, model has {len(theirs)}")
            raise ValueError(
                f"mask: shaped for another model ({len(mine)} sites, {sum(n for _, n in mine)} heads) than this one "
                f"({len(theirs)} sites, {sum(n for _, n in theirs)} heads); {detail}."
            )

    # serialisation ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": "prunetrain.HeadMask/1",
            "sites": {name: [float(x) for x in v.detach().tolist()] for name, v in self._values.items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: Mapping, model_or_layout) -> "HeadMask":
        """Rebuild a mask from `to_dict()` output for a model (or layout); every site must be named."""
        layout = _layout_of(model_or_layout)
        sites = data.get("sites") if isinstance(data, Mapping) else None
        if not isinstance(sites, Mapping):
            raise ValueError("mask data: expected a mapping with a 'sites' entry (site name -> keep list).")
        unknown = [name for name in sites if name not in layout]
        if unknown:
            raise ValueError(f"mask data: unknown site {unknown[0]!r}; valid sites: {', '.join(layout.names[:4])}, ...")
        missing = [name for name in layout.names if name not in sites]
        if missing:
            raise ValueError(f"mask data: site {missing[0]!r} of this model is missing ({len(missing)} missing).")
        return cls(layout, sites)

    @classmethod
    def from_json(cls, text_or_path: str | Path, model_or_layout, argument: str = "mask") -> "HeadMask":
        """A mask from JSON text or a JSON file (strict JSON: a damaged or deeply nested file is one ValueError
        naming `argument` and the file)."""
        from prunetrain.utils.files import parse_json, read_json

        text = str(text_or_path)
        if text.lstrip().startswith("{"):
            return cls.from_dict(parse_json(text, argument), model_or_layout)
        return cls.from_dict(read_json(Path(text_or_path), argument), model_or_layout)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: v.detach().clone() for name, v in self._values.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        if set(state) != set(self._values):
            extra = sorted(set(state) - set(self._values))
            missing = sorted(set(self._values) - set(state))
            raise ValueError(f"state: site names differ from this mask (unknown {extra[:2]}, missing {missing[:2]}).")
        for name, tensor in state.items():
            self[name] = tensor

    def _check_site(self, name: str) -> None:
        if name not in self.layout:
            raise ValueError(f"site: unknown site {name!r}; valid sites are: {', '.join(map(repr, self.layout.names[:4]))}"
                             f"{', ...' if len(self.layout) > 4 else ''}.")


def _scalar(x):
    """A 0-dim tensor as the Python number it holds (`.item()`: a bool tensor gives a bool); anything else as is."""
    return x.item() if torch.is_tensor(x) and x.dim() == 0 else x


def _keep_tensor(what: str, keep) -> torch.Tensor:
    """Keep values as a flat float32 tensor, from the same values `set()` takes: a flat list (or 1-d tensor) of real
    numbers, or one number. Bools (True is not a keep value of 1), strings, nested lists and anything else are a
    ValueError."""
    def refuse():
        shown = repr(keep)
        return ValueError(f"{what}: keep values must be numbers in [0, 1], one per head in a flat list (no bools), "
                          f"got {shown if len(shown) <= 80 else shown[:77] + '...'}.")

    if isinstance(keep, (list, tuple)):
        items = [_scalar(x) for x in keep]
        if not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in items):
            raise refuse()
        return torch.tensor([float(x) for x in items], dtype=torch.float32)
    if isinstance(keep, numbers.Real) and not isinstance(keep, bool):
        return torch.tensor([float(keep)], dtype=torch.float32)
    if isinstance(keep, (str, bytes, bool, Mapping)):
        raise refuse()
    try:
        tensor = torch.as_tensor(keep)
    except (TypeError, ValueError, RuntimeError):
        raise refuse() from None
    if tensor.dtype == torch.bool or tensor.is_complex() or tensor.dim() > 1:
        raise refuse()
    return tensor.detach().to(torch.float32).clone().reshape(-1)


def _check_range(what: str, tensor: torch.Tensor) -> None:
    bad = tensor[~((tensor >= 0) & (tensor <= 1))]
    if bad.numel():
        raise ValueError(f"{what}: keep value {float(bad[0]):.6g} is outside [0, 1].")


def _layout_of(model_or_layout, units=("heads",)) -> HeadLayout:
    if isinstance(model_or_layout, HeadLayout):
        return model_or_layout
    return find_sites(model_or_layout, units)


_ATTACHED: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()


def _attached_masks(model: nn.Module) -> list:
    model = unwrap_model(model)
    if LOADED_HOOKS_ATTR in vars(model):  # masks the modeling file of a pruned directory attached while loading
        _adopt_loaded_hooks(model)
    masks = _ATTACHED.setdefault(model, [])
    if any(out_of_place(getattr(mask, "_placed", [])) for mask in masks):
        _move_onto_replaced_projections(model, masks)
    return masks


def _move_onto_replaced_projections(model: nn.Module, masks: list) -> None:
    """Output projections replaced since the masks were attached (peft's `get_peft_model` wraps them): the masks'
    hooks are registered again on the projections now in place, in the same order, so each mask covers the new
    layers' whole input (adapter included)."""
    sites, slots = all_sites(model), module_slots(model)
    for mask in masks:
        for handle in mask._handles:
            handle.remove()
        mask._handles, mask._placed = [], []
        mask._register(sites, slots)


def stray_mask_hooks(model: nn.Module) -> list[str]:
    """Sites whose output projection carries a HeadMask hook that no mask attached to `model` owns — what
    `copy.deepcopy` of a model with an attached mask leaves on the copy (the hooks are copied, the registration
    is not)."""
    model = unwrap_model(model)
    owned = {handle.id for mask in attached_masks(model) for handle in mask._handles}
    return [site.info.name for site in all_sites(model)
            if any(isinstance(hook, _HeadScale) and key not in owned
                   for key, hook in site.out_proj._forward_pre_hooks.items())]


@checked
def attached_masks(model: nn.Module) -> list[HeadMask]:
    """The HeadMasks currently attached to `model` (or to the model inside a DDP / accelerate wrapper)."""
    return list(_attached_masks(model))



# ---------------------------------------------------------------------------------------------------------------------
# masks saved with a model: every save records the attached masks and gates; loading attaches them again
# ---------------------------------------------------------------------------------------------------------------------
LOADED_HOOKS_ATTR = "_prunetrain_saved_masks"
"""Attribute the standalone modeling file sets on a model it loaded with saved masks (its own hooks, their values
and owners); prunetrain turns them into `HeadMask`s owned by `SavedMask` the first time it looks at the model."""

_SCALERS: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()


class SavedMask:
    """Owner of a mask that came with a model's weights (`load_pruned`, `restore_layout`, or the modeling file of a
    pruned directory). `name` is the owner that had attached it when the model was saved (a callback's `name`, or
    None): a callback resuming from a checkpoint restores its own mask or gates and takes that one back
    (`release_saved_masks`); any other saved mask stays, as part of the model."""

    def __init__(self, name: str | None):
        self.name = name

    def __repr__(self) -> str:
        return f"SavedMask({self.name!r})"


def owner_label(owner: object) -> str | None:
    """How a save records who attached a mask: a callback's `name` (or its class name), a string as is, None."""
    if owner is None or isinstance(owner, str):
        return owner
    if isinstance(owner, SavedMask):
        return owner.name
    name = getattr(owner, "name", None)
    return name if isinstance(name, str) else type(owner).__name__


def register_scaler(model: nn.Module, scaler) -> None:
    """Record that `scaler` scales `model`'s heads with hooks of its own (Hard-Concrete gates): every save of the
    model records `scaler.saved_keep()` ({site: keep value per head}: the model as it evaluates) as a mask, owned
    by `scaler.owner`. `unregister_scaler` undoes it."""
    model = unwrap_model(model)
    _SCALERS.setdefault(model, []).append(scaler)
    _watch(model)


def unregister_scaler(model: nn.Module, scaler) -> None:
    model = unwrap_model(model)
    _SCALERS[model] = [s for s in _SCALERS.get(model, []) if s is not scaler]
    _unwatch(model)


def _watch(model: nn.Module) -> None:
    watch_config(model)


def _unwatch(model: nn.Module) -> None:
    if not _ATTACHED.get(model) and not _SCALERS.get(model):
        unwatch_config(model)


def model_of_config(config) -> nn.Module | None:
    """The model with masks or gates attached whose config is `config` (the config object a save writes)."""
    for registry in (_ATTACHED, _SCALERS):
        for model, items in list(registry.items()):
            if items and getattr(model, "config", None) is config:
                return model
    return None


def _record_for_config(config) -> tuple[nn.Module, list[dict]] | None:
    model = model_of_config(config)
    return None if model is None else (model, saved_mask_record(model))


def saved_mask_record(model: nn.Module) -> list[dict]:
    """What a save of `model` records of the masks and gates attached to it: one entry per mask that removes or
    scales a head, in the order their hooks run, `{"owner": label, "sites": {site: {"out_proj": module path,
    "head_dim": d, "keep": [keep value per head]}}}` (sites whose heads are all kept left out); [] if none.

    Keep values are written as the float32 numbers the hooks multiply by, so a loaded model computes bit-identically.
    Gates are recorded as the model evaluates (their deterministic test-time values)."""
    model = unwrap_model(model)
    items = [(mask._owner, mask.state_dict()) for mask in _attached_masks(model)]
    items += [(scaler.owner, scaler.saved_keep()) for scaler in _SCALERS.get(model, [])]
    if not items:
        return []
    sites = {site.info.name: site for site in all_sites(model)}
    paths = {id(module): name for name, module in model.named_modules()}
    record = []
    for owner, values in items:
        changed = {name: keep.detach().float().cpu() for name, keep in values.items() if bool((keep != 1).any())}
        if changed:
            record.append({"owner": owner_label(owner), "sites": {
                name: {"out_proj": paths[id(sites[name].out_proj)], "head_dim": sites[name].info.head_dim,
                       "keep": [float(x) for x in keep.tolist()]} for name, keep in changed.items()}})
    return record


def attach_saved_masks(model: nn.Module, record: list[dict]) -> list[HeadMask]:
    """Attach the masks a save recorded (`saved_mask_record`) to `model`, each a `HeadMask` owned by `SavedMask`
    of its recorded owner, in the recorded order; returns them. A record that does not fit the model is a
    ValueError from `HeadMask` (naming the site)."""
    model = unwrap_model(model)
    masks = []
    for entry in record:
        mask = HeadMask.ones(layout_naming(model, list(entry["sites"])))
        for name, site in entry["sites"].items():
            mask[name] = site["keep"]
        masks.append(mask)
    for entry, mask in zip(record, masks):  # all checked before the first is attached
        mask.attach(model, owner=SavedMask(entry.get("owner")))
    return masks


def release_saved_masks(model: nn.Module, owner: object) -> int:
    """Detach the masks saved with `model` that `owner` had attached (a callback resuming from a checkpoint: its
    restored state holds that mask, or the gates it was recorded from). Returns how many were detached."""
    label = owner_label(owner)
    saved = [m for m in _attached_masks(model) if isinstance(m._owner, SavedMask) and m._owner.name == label]
    for mask in saved:
        mask.detach()
    return len(saved)


def _adopt_loaded_hooks(model: nn.Module) -> None:
    """The modeling file's own hooks (a model loaded with `trust_remote_code=True`) become `HeadMask`s owned by
    `SavedMask`, which prunetrain saves, shrinks, releases and refuses like any other (same values, same
    arithmetic: the model computes exactly as before)."""
    loaded = vars(model).pop(LOADED_HOOKS_ATTR, None) or []
    for entry in loaded:
        for handle in entry["handles"]:
            handle.remove()
    adopt_loaded_masks(model)
    attach_saved_masks(model, [{"owner": entry["owner"], "sites": {name: {"keep": keep}
                                                                  for name, keep in entry["sites"].items()}}
                               for entry in loaded])


set_mask_recorder(_record_for_config)  # every save of a config finds the masks attached to its model
