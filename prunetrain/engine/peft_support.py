"""PEFT (LoRA) models: the head engine on a `peft` model, exactly as on the model it wraps.

A `PeftModel` (or peft's tuner, e.g. `LoraModel`) is unwrapped to the transformers model inside it
(`peft_inner`), so sites, masks and pruned directories are named as in the base architecture
(`model.encoder.layers.0.self_attn`, never `base_model.model.…`). peft replaces a targeted `nn.Linear` by a tuner
layer that holds the original as `base_layer` and the adapter beside it; what prunetrain does to a projection is done
to the whole layer:

- `shrink` slices the base weight and, with it, the adapter (`AdapterSlicer`): removing output rows (q/k/v heads)
  removes the same rows of every adapter's `lora_B` (and its bias, and a DoRA magnitude vector, whose norm is per
  row, so this stays exact); removing input columns (the output projection) removes the same columns of every
  `lora_A`. The adapters' optimizer state is sliced like any other parameter's. Whatever cannot be sliced exactly is
  refused before any edit (`shrink_refusal`): other peft layer types, LoRA variants other than DoRA, DoRA on an
  output projection (its norm spans every head's columns).
- Masks and gates sit on the tuner layer (so the adapter sees the masked input too) and on its base layer, which
  acts only once the tuner layer is gone (`merge_and_unload()` / `unload()` put the base layer back in its place):
  the masks survive merging (`place_hook`). A projection replaced after a mask was attached (e.g. `get_peft_model`
  on a masked model) is refused at the next forward instead of silently masking only part of the layer.
- Saves write the base architecture: the modules are read through the tuner layers (`base_view`) and an unmerged
  model is saved as `merge_and_unload()` would give it (`merged_state_dict`), with peft's own merge.

peft is never imported here: its classes are recognised by name, so prunetrain works without peft installed.
"""

from __future__ import annotations

import copy
from typing import Iterator

import torch
from torch import nn

PROMPT_LEARNING_MESSAGE = ("model: this PeftModel uses peft's {kind} (prompt learning), which adds key/value prefixes "
                           "or virtual tokens built for the original head counts; shrink is refused for it. Masks and "
                           "importance work; use LoRA to shrink.")


def _peft_classes(obj: object) -> set[str]:
    """Names of the peft classes in `obj`'s class hierarchy (empty for anything not from peft)."""
    return {c.__name__ for c in type(obj).__mro__ if c.__module__.startswith("peft.")}


def is_peft_wrapper(model: object) -> bool:
    """Whether `model` is a `PeftModel` (any task subclass, or `PeftMixedModel`) or a peft tuner (`LoraModel`, ...)."""
    return bool(_peft_classes(model) & {"PeftModel", "PeftMixedModel", "BaseTuner"})


PROMPT_LEARNING_ATTR = "_prunetrain_prompt_learning"
"""Set on the base model of a prompt-learning PeftModel when prunetrain unwraps it: the base model itself does not
show that a wrapper feeds it prefixes, and a shrink of it must be refused however it is reached."""


def peft_inner(model: nn.Module) -> nn.Module:
    """The transformers model a peft wrapper holds (`model` itself for anything else)."""
    while is_peft_wrapper(model):
        kind = prompt_learning_kind(model)
        if "BaseTuner" in _peft_classes(model):
            model = model.model
        else:
            model = model.get_base_model()
        if kind is not None:
            vars(model)[PROMPT_LEARNING_ATTR] = kind
    return model


def prompt_learning_kind(model: nn.Module) -> str | None:
    """The peft type of a prompt-learning `PeftModel` (prefix tuning, prompt tuning, ...), else None."""
    if "PeftModel" not in _peft_classes(model):
        return None
    config = getattr(model, "active_peft_config", None)
    if getattr(config, "is_prompt_learning", False):
        return str(getattr(config.peft_type, "value", config.peft_type))
    return None


def refuse_prompt_learning(model: nn.Module) -> None:
    """`shrink` of a prompt-learning `PeftModel` is refused (its prefixes are built for the original head counts)."""
    kind = prompt_learning_kind(model)
    if kind is not None:
        raise ValueError(PROMPT_LEARNING_MESSAGE.format(kind=kind))


def is_tuner_layer(module: nn.Module) -> bool:
    """Whether `module` is a peft tuner layer wrapping a base layer (`lora.Linear`, ...)."""
    return "BaseTunerLayer" in _peft_classes(module) and hasattr(module, "base_layer")


def is_peft_module(module: nn.Module) -> bool:
    """A tuner layer or one of peft's auxiliary wrappers (`ModulesToSaveWrapper`, ...): modules a merge replaces."""
    return is_tuner_layer(module) or "AuxiliaryTrainingWrapper" in _peft_classes(module)


def base_layer(module: nn.Module) -> nn.Module:
    """The innermost base layer of a tuner layer (the module itself for anything else)."""
    while is_tuner_layer(module):
        module = module.base_layer
    return module


def has_tuner_layers(model: nn.Module) -> bool:
    return any(is_peft_module(m) for m in model.modules())


# ---------------------------------------------------------------------------------------------------------------------
# the base architecture's view of a peft-wrapped model
# ---------------------------------------------------------------------------------------------------------------------
def _plain_form(module: nn.Module) -> nn.Module:
    """What a merge puts in a peft module's place, for its shapes: the base layer (the trained copy of a
    modules-to-save wrapper has the same shapes)."""
    if is_tuner_layer(module):
        return base_layer(module)
    original = getattr(module, "original_module", None)
    return original if isinstance(original, nn.Module) else module


def base_view(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`model.named_modules()` as the base architecture names them: a peft module at path P is its base layer at P
    (its own children, the adapters, are left out). Without peft layers: `named_modules()` itself."""
    skip: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(p + ".") for p in skip):
            continue
        if is_peft_module(module):
            skip.append(path)
            inner = _plain_form(module)
            yield path, inner
            for sub, child in inner.named_modules():
                if sub:
                    yield f"{path}.{sub}", child
            continue
        yield path, module


def _merged_module(module: nn.Module) -> nn.Module:
    """A copy of peft module `module` merged as `merge_and_unload()` merges it (peft's own code), hooks left out."""
    hooks = {id(h): h for m in module.modules() for d in (m._forward_pre_hooks, m._forward_hooks)
             for h in d.values()}
    twin = copy.deepcopy(module, memo=dict(hooks))  # prunetrain's hooks refer to the model: not copied
    if hasattr(twin, "unload_and_optionally_merge_module"):
        return twin.unload_and_optionally_merge_module(merge=True, safe_merge=False, adapter_names=None)
    twin.merge()
    return twin.get_base_layer()


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict `model` would have after `merge_and_unload()`, named as the base architecture, computed on
    copies of its peft modules one at a time (the model itself is left as it is)."""
    state = model.state_dict()
    wrappers = [(path, module) for path, module in base_view_wrappers(model)]
    out = {k: v for k, v in state.items() if not any(k.startswith(p + ".") for p, _ in wrappers)}
    for path, module in wrappers:
        with torch.no_grad():
            merged = _merged_module(module)
        out.update({f"{path}.{k}": v for k, v in merged.state_dict().items()})
    return out


def base_view_wrappers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost peft modules of `model` with their paths."""
    found: list[tuple[str, nn.Module]] = []
    for path, module in model.named_modules():
        if is_peft_module(module) and not any(path.startswith(p + ".") for p, _ in found):
            found.append((path, module))
    return found


# ---------------------------------------------------------------------------------------------------------------------
# shrink: slicing the adapters with their base layer
# ---------------------------------------------------------------------------------------------------------------------
def _adapter_parts(layer: nn.Module) -> list[str]:
    return [name for name in getattr(layer, "lora_A", {})]


def _variant_name(layer: nn.Module, adapter: str) -> str | None:
    variant = (getattr(layer, "lora_variant", None) or {}).get(adapter)
    return None if variant is None else type(variant).__name__


def _layer_refusal(layer: nn.Module, input_sliced: bool) -> str | None:
    """Why the tuner layer `layer` cannot be sliced by head exactly (None: it can)."""
    kind = type(layer).__name__
    linear = isinstance(base_layer(layer), nn.Linear) or type(base_layer(layer)).__name__ == "Conv1D"
    if "LoraLayer" not in _peft_classes(layer) or not linear:
        method = type(layer).__module__.split(".")[2] if type(layer).__module__.count(".") >= 2 else "peft"
        return f"its projection is wrapped by peft's {method} layer {kind}, which prunetrain cannot slice by head"
    if any(getattr(layer, "lora_embedding_A", {})):
        return f"its projection carries an embedding LoRA ({kind}), which prunetrain cannot slice by head"
    for adapter in _adapter_parts(layer):
        variant = _variant_name(layer, adapter)
        if variant == "DoraLinearVariant" and input_sliced:
            return (f"its output projection has a DoRA adapter {adapter!r} (use_dora=True), whose weight norm spans "
                    f"every head's columns, so removing heads changes the kept ones")
        if variant not in (None, "DoraLinearVariant"):
            return f"its projection has a LoRA variant peft calls {variant} (adapter {adapter!r}), which prunetrain " \
                   f"cannot slice by head"
    return None


def shrink_refusal(site) -> str | None:
    """Why `shrink` cannot remove heads of `site` exactly because of peft layers on its projections (None: it can
    or there are none)."""
    kind = vars(site.root).get(PROMPT_LEARNING_ATTR)
    if kind is not None:
        return (f"the model is wrapped by a PeftModel with peft's {kind} (prompt learning), whose prefixes or virtual "
                f"tokens are built for the original head counts.")
    layers = [m for m in site.module.modules() if is_peft_module(m)]
    if is_peft_module(site.out_proj) and all(m is not site.out_proj for m in layers):
        layers.append(site.out_proj)
    for layer in layers:
        if not is_tuner_layer(layer):
            return f"its module {type(layer).__name__} is a peft wrapper prunetrain cannot slice by head"
        reason = _layer_refusal(layer, input_sliced=layer is site.out_proj)
        if reason:
            return reason + "; merge_and_unload() first, then shrink."
    return None


def _out_axis(layer: nn.Module) -> int:
    """The weight axis of the base layer's output features: 0 for nn.Linear `[out, in]`, 1 for Conv1D `[in, out]`."""
    return 0 if isinstance(base_layer(layer), nn.Linear) else 1


class AdapterSlicer:
    """The `select` / `scale` editor `shrink` hands the family adapters, wrapping another (the optimizer slicer or
    the FSDP2 editor): a slice or scale of a tuner layer's base weight or bias is applied to its adapters too, each
    through the wrapped editor (so their gradients and optimizer state follow)."""

    def __init__(self, model: nn.Module, editor):
        self.editor = editor
        self.optimizer = getattr(editor, "optimizer", None)
        self._owner: dict[int, tuple[nn.Module, str]] = {}
        for module in model.modules():
            if is_tuner_layer(module) and "LoraLayer" in _peft_classes(module):
                base = base_layer(module)
                for role in ("weight", "bias"):
                    param = getattr(base, role, None)
                    if isinstance(param, nn.Parameter):
                        self._owner[id(param)] = (module, role)

    def __call__(self, param: nn.Parameter, dim: int, index: torch.Tensor) -> None:
        self.editor(param, dim, index)
        owner = self._owner.get(id(param))
        if owner is None:
            return
        layer, role = owner
        if role == "bias":
            return  # the adapters follow the weight's rows (sliced with the same rows just before)
        if dim == _out_axis(layer):
            self._slice_outputs(layer, index)
        else:
            self._slice_inputs(layer, index)
        self._set_features(layer)

    def _slice_outputs(self, layer: nn.Module, index: torch.Tensor) -> None:
        for adapter in _adapter_parts(layer):
            lora_b = layer.lora_B[adapter]
            self.editor(lora_b.weight, 0, index)
            if getattr(lora_b, "bias", None) is not None:
                self.editor(lora_b.bias, 0, index)
            lora_b.out_features = len(index)
            magnitude = getattr(layer, "lora_magnitude_vector", {})
            if adapter in magnitude:
                self.editor(magnitude[adapter].weight, 0, index)

    def _slice_inputs(self, layer: nn.Module, index: torch.Tensor) -> None:
        for adapter in _adapter_parts(layer):
            if _variant_name(layer, adapter) is not None:
                raise ValueError(f"model: a {_variant_name(layer, adapter)} adapter cannot lose input features "
                                 f"exactly (shrink_refusal should have refused this site).")
            lora_a = layer.lora_A[adapter]
            self.editor(lora_a.weight, 1, index)
            lora_a.in_features = len(index)

    @staticmethod
    def _set_features(layer: nn.Module) -> None:
        """The tuner layer's and its base layer's feature counts, from the sliced base weight."""
        base = base_layer(layer)
        axis = _out_axis(layer)
        out_features, in_features = base.weight.shape[axis], base.weight.shape[1 - axis]
        if isinstance(base, nn.Linear):
            base.in_features, base.out_features = in_features, out_features
        else:  # transformers' Conv1D
            base.nx, base.nf = in_features, out_features
        for module in {layer, getattr(layer, "base_layer", layer)}:
            if is_tuner_layer(module):
                module.in_features, module.out_features = in_features, out_features

    def scale(self, param: nn.Parameter, dim: int, factors: torch.Tensor) -> None:
        """Scale `param` along `dim`; a tuner layer's base weight scaled along its inputs (a soft keep value folded
        into an output projection) scales every `lora_A`'s columns the same way."""
        self.editor.scale(param, dim, factors)
        owner = self._owner.get(id(param))
        if owner is not None and owner[1] == "weight" and dim != _out_axis(owner[0]):
            for adapter in _adapter_parts(owner[0]):
                self.editor.scale(owner[0].lora_A[adapter].weight, 1, factors)

    def flush(self) -> None:
        self.editor.flush()


def adapter_aware(model: nn.Module, editor):
    """`editor` itself for a model without LoRA layers, else an `AdapterSlicer` around it."""
    return AdapterSlicer(model, editor) if has_tuner_layers(model) else editor


def weight_axis_of_inputs(out_proj: nn.Module) -> int:
    """The weight axis along which `out_proj` (an output projection, maybe inside a tuner layer) holds its input
    features: 1 for nn.Linear, 0 for transformers' Conv1D."""
    return 1 if isinstance(base_layer(out_proj), nn.Linear) else 0


# ---------------------------------------------------------------------------------------------------------------------
# hooks that survive merging: on the tuner layer, and on its base layer once the tuner layer is gone
# ---------------------------------------------------------------------------------------------------------------------
class PlacedHook:
    """Base of the forward pre-hooks that scale heads at an output projection (`HeadMask`, gates).

    `place_hook` records the projection's slot (parent module, attribute name). The hook acts while its module is in
    that slot. On the base layer of a tuner layer it stays idle while the tuner layer holding it is in the slot (the
    tuner layer's own hook scales the whole input, adapter included) and acts once a merge put it back in the slot.
    A module that is no longer in its slot otherwise (replaced after the hook was registered) is an error: scaling
    only part of the new layer's input would silently compute another model."""

    slot: tuple[nn.Module, str] | None = None
    token: object | None = None
    inner = False

    def scale(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, module: nn.Module, args: tuple):
        if self.slot is not None and not self._acts(module):
            return None
        (x, *rest) = args
        return (self.scale(x), *rest)

    def _acts(self, module: nn.Module) -> bool:
        parent, name = self.slot
        holder = parent._modules.get(name)
        if holder is module:
            return True
        if self.inner and holder is not None and any(getattr(h, "token", None) is self.token
                                                     for h in holder._forward_pre_hooks.values()):
            return False
        raise RuntimeError(
            f"model: the output projection {name!r} of {type(parent).__name__} was replaced (e.g. wrapped by peft's "
            f"get_peft_model) after prunetrain's mask or gates were attached, so they would scale only part of the "
            f"new layer's input; attach them after wrapping the model (prunetrain.attached_masks(model) moves the "
            f"attached HeadMasks onto the new layer).")


def module_slots(root: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """{id(module): (parent, attribute name)} for every submodule of `root` (the first slot of a shared one)."""
    slots: dict[int, tuple[nn.Module, str]] = {}
    for parent in root.modules():
        for name, child in parent._modules.items():
            if child is not None:
                slots.setdefault(id(child), (parent, name))
    return slots


def place_hook(hook: PlacedHook, out_proj: nn.Module, slots: dict[int, tuple[nn.Module, str]]) -> list[tuple]:
    """Register `hook` on the output projection `out_proj` and, when it is a tuner layer, a twin on its base layer
    that takes over after a merge. Returns (hook, module, handle) for each."""
    hook.slot, hook.token, hook.inner = slots.get(id(out_proj)), object(), False
    placed = [(hook, out_proj, out_proj.register_forward_pre_hook(hook))]
    if is_tuner_layer(out_proj) and hook.slot is not None:
        twin = copy.copy(hook)
        twin.inner = True
        inner = base_layer(out_proj)
        placed.append((twin, inner, inner.register_forward_pre_hook(twin)))
    return placed


def out_of_place(placed: list[tuple[PlacedHook, nn.Module]]) -> bool:
    """Whether, of (hook, module) pairs `place_hook` registered, a group (a hook and its twin) no longer holds the
    slot of its projection: the projection was replaced (wrapped by a tuner layer, or wrapped again after a merge)."""
    groups: dict[int, tuple[tuple[nn.Module, str], set[int]]] = {}
    for hook, module in placed:
        if hook.slot is not None:
            groups.setdefault(id(hook.token), (hook.slot, set()))[1].add(id(module))
    return any(id(parent._modules.get(name)) not in modules for (parent, name), modules in groups.values())


def merged_weights(model: nn.Module) -> dict:
    """`save_pretrained` keyword arguments that save `model` as `merge_and_unload()` would leave it: `state_dict`
    (`merged_state_dict`) for a model holding peft layers, nothing otherwise."""
    return {"state_dict": merged_state_dict(model)} if has_tuner_layers(model) else {}


def peft_shrink_refusal(model: nn.Module, sites: list) -> str | None:
    """Why shrinking `model` (a peft model, `sites` its attention sites) would be refused because of peft, checked
    before training so that a run is refused at its start, not at its first shrink (None: it would not)."""
    kind = prompt_learning_kind(model)
    if kind is not None:
        return PROMPT_LEARNING_MESSAGE.format(kind=kind).removeprefix("model: ")
    for site in sites:
        reason = shrink_refusal(site)
        if reason:
            return f"site {site.info.name!r} cannot be shrunk: {reason}"
    return None
