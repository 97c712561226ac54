"""Copy-on-write for a model's config: prunetrain writes to a config only once the model owns it alone.

Hugging Face models built with `cls(config)` keep the config object they were given, so two models built from one
config share it — and so do the submodules of each (attention modules, rotary embeddings and others keep
`self.config`, or a sub-config such as `config.text_config`). `shrink` records the layout on the config and switches
its class to the pruned form, and attaching a mask switches the class too; written into a shared object, another
model built from the same config would then report the pruned layout (or the masks) and save a directory that no
loader accepts. `own_config(model)` gives the model a deep copy first, and points every submodule that held the old
config (or one of its sub-configs) at the matching copy, so the whole model sees one config consistently.
"""

from __future__ import annotations

import copy
import weakref

from torch import nn

_OWNED: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()
"""model -> the config copy `own_config` gave it (no second copy while the model still holds it)."""


def own_config(model: nn.Module) -> None:
    """Give `model` (already unwrapped) a config of its own before prunetrain writes to it; a no-op when the model
    already holds the copy it was given here, or has no transformers config.

    Every submodule attribute that is the old config or one of the configs nested in it (`text_config`, ...) is
    pointed at its copy, so the model and its attention modules read the same (new) object."""
    from transformers import PreTrainedConfig

    config = getattr(model, "config", None)
    if not isinstance(config, PreTrainedConfig) or _OWNED.get(model) is config:
        return
    memo: dict[int, object] = {}
    fresh = copy.deepcopy(config, memo)
    copies = {key: value for key, value in memo.items() if isinstance(value, PreTrainedConfig)}
    copies[id(config)] = fresh
    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, PreTrainedConfig) and id(value) in copies:
                object.__setattr__(module, name, copies[id(value)])  # a plain attribute (not a parameter/module)
    _OWNED[model] = fresh


__all__ = ["own_config"]
