"""Self-contained pruned directories: `modeling_prunetrain.py` + `auto_map`, loadable without prunetrain.

`remote_spec(model)` records what makes a shrunk model differ from the architecture its config describes, driven by
the model itself, not by family names: the parameters whose shape differs from a freshly built model, the integer
attributes of the attention sites that differ, sites switched to the head-less forward, the shared-position-bias
selection (T5) and the head-less KV-cache layers. `write_remote_code(directory, model)` adds that record, the
`auto_map` and a guard to `config.json` and copies the modeling file (`modeling_prunetrain.py`, torch + transformers
only) next to it. Anything the record cannot reproduce (an unknown hook or module class) is refused, never dropped.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, attention_sites, unwrap_model

MODELING_FILE = "modeling_prunetrain.py"
SPEC_KEY = "prunetrain_export"
GUARD_FIELD = "vocab_size"
GUARD_FIELDS = (GUARD_FIELD, "hidden_size", "text_config", "src_vocab_size", "d_model")
"""Top-level config fields that can carry the guard, first present wins (vision configs have no `vocab_size`;
two-tower configs such as CLIP's hold only their towers' sub-configs). Strict config validation rejects the message
in any of them, so a plain `from_pretrained` fails loudly."""
GUARD_MESSAGE = ("this model was pruned by prunetrain and has a different number of attention heads per layer; load "
                 "it with from_pretrained(path, trust_remote_code=True) or prunetrain.load_pruned(path)")
GUARD_MESSAGE_PRUNETRAIN_ONLY = ("this model was pruned by prunetrain and has a different number of attention heads "
                                 "per layer, in attention code only prunetrain has; load it with "
                                 "prunetrain.load_pruned(path)")
_TEMPLATE = Path(__file__).with_name(MODELING_FILE)
_SKIP_ATTRS = {"training"}


def fresh_model(model: nn.Module, device: str = "meta") -> nn.Module:
    """The original (unpruned) architecture of `model`, built from its config without the recorded layout."""
    config = copy.deepcopy(model.config)
    for key in (LAYOUT_CONFIG_KEY, SPEC_KEY, "auto_map"):
        if hasattr(config, key):
            delattr(config, key)
    with torch.device(device):
        return type(model)._from_config(config) if hasattr(type(model), "_from_config") else type(model)(config)


def _hook_owner(hook) -> object:
    return getattr(hook, "__self__", None) or hook


def _is_prunetrain(obj: object) -> bool:
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "")
    return str(module).startswith("prunetrain")


def remote_spec(model: nn.Module) -> dict:
    """What `modeling_prunetrain.apply_layout` needs to rebuild `model`'s shape from the original architecture.

    Args:
        model: a (shrunk) transformers model supported by prunetrain.

    Returns:
        `{"params": {name: shape}, "attrs": {module: {attr: value}}, "classes": {site: {...}},
        "bias_select": {site: {"kept", "full_heads"}}, "headless_cache": {site: [cache kwargs]}}` (empty
        sections omitted); an empty dict when the model has the original shapes.

    Raises:
        ValueError: a hook or module class prunetrain put on the model that the modeling file cannot reproduce.
    """
    model = unwrap_model(model)
    reference = dict(fresh_model(model).named_modules())
    sites = {s.info.name: s for s in attention_sites(model)}
    spec: dict = {"params": {}, "attrs": {}, "classes": {}, "bias_select": {}, "headless_cache": {}}
    for path, module in model.named_modules():
        ref = reference.get(path)
        if ref is None:
            raise ValueError(f"model: module {path!r} is not in the architecture its config describes; it cannot be "
                             f"written as remote code.")
        for name, param in list(module._parameters.items()) + list(module._buffers.items()):
            ref_param = ref._parameters.get(name, ref._buffers.get(name))
            if param is not None and ref_param is not None and param.shape != ref_param.shape:
                spec["params"][f"{path}.{name}" if path else name] = list(param.shape)
        site_root = next((s for s in sites if path == s or path.startswith(s + ".")), None)
        if site_root is not None:
            changed = {k: v for k, v in vars(module).items()
                       if not k.startswith("_") and k not in _SKIP_ATTRS and isinstance(v, (int, float, str))
                       and not isinstance(v, bool) and vars(ref).get(k) != v}
            if changed:
                spec["attrs"][path] = changed
        if type(module) is not type(ref):
            if getattr(getattr(type(module), "forward", None), "__name__", "") != "headless_forward":
                raise ValueError(f"model: module {path!r} runs {type(module).__name__}, prunetrain's own form of "
                                 f"{type(ref).__name__}, which the standalone modeling file cannot rebuild; write "
                                 f"it as 'padded', or load it with prunetrain.load_pruned.")
            spec["classes"][path] = {k: v for k, v in vars(type(module)).items() if k.startswith("_pt_")}
        for hook in [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]:
            owner = _hook_owner(hook)
            if not _is_prunetrain(owner):
                continue
            if type(owner).__name__ == "_CacheMarker" or getattr(hook, "__name__", "") == "_mark_cache_layer":
                kwargs = getattr(owner, "cache_kwargs", None) or sites[path].adapter.cache_kwargs
                spec["headless_cache"][path] = list(kwargs)
            elif type(owner).__name__ == "T5BiasSelection" and path in sites:
                spec["bias_select"][path] = {"kept": owner.kept.tolist(), "full_heads": owner.full_heads}
            elif type(owner).__name__ == "T5BiasSelection":
                continue  # its hook on the shared bias table; installed again with the site's hooks
            elif type(owner).__name__ == "_HeadScale":
                continue  # an attached HeadMask: save_pruned refuses one that is not all ones
            else:
                raise ValueError(f"model: module {path!r} carries a prunetrain hook "
                                 f"({getattr(hook, '__qualname__', type(owner).__name__)}) that the standalone "
                                 f"modeling file cannot reproduce.")
    for key, value in spec["classes"].items():
        spec["classes"][key] = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
    return {k: v for k, v in spec.items() if v}


def auto_classes(model: nn.Module) -> dict[str, str]:
    """{auto class name: transformers class name} for every auto class that maps this model_type to the model's
    class, plus `AutoModel` for its base model class."""
    import transformers

    model_type = model.config.model_type
    own = type(model).__name__
    found: dict[str, str] = {}
    for name in dir(transformers):
        if not name.startswith("AutoModel"):
            continue
        mapping = getattr(getattr(transformers, name), "_model_mapping", None)
        names = getattr(mapping, "_model_mapping", None)
        if not isinstance(names, dict):
            continue
        target = names.get(model_type)
        if isinstance(target, (list, tuple)):
            target = target[0] if target else None
        if target == own or (name == "AutoModel" and isinstance(target, str) and hasattr(transformers, target)):
            found[name] = target
    return found


def _class_source(model: nn.Module, autos: dict[str, str]) -> str:
    """The classes `auto_map` names. They keep the transformers class names: transformers keys some checkpoint
    conversions by class name (e.g. GPT-NeoX's `embed_out` → `lm_head`)."""
    config_cls = type(model.config).__name__
    lines = [f"class {config_cls}(PrunedConfigMixin, transformers.{config_cls}):", "    pass", "", ""]
    for cls_name in sorted(set(autos.values()) | {type(model).__name__}):
        lines += [f"class {cls_name}(PrunedModelMixin, transformers.{cls_name}):",
                  f"    config_class = {config_cls}", "", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_remote_code(directory: str | Path, model: nn.Module) -> bool:
    """Make a `save_pretrained` directory of a shrunk model loadable with `trust_remote_code=True` (in place).

    Adds `modeling_prunetrain.py`, and in `config.json` the record (`prunetrain_export`), `auto_map` and the
    guard that stops a plain `from_pretrained` (see the modeling file's docstring).

    Args:
        directory: the directory `model.save_pretrained` wrote.
        model: the model that was saved.

    Returns:
        True when the directory got its modeling file; False when the model has its original shapes (nothing to
        add) or its shrunk attention needs prunetrain's own code (then only the guard is added, and
        `prunetrain.load_pruned` is the way to load it).
    """
    import transformers

    model = unwrap_model(model)
    try:
        spec, refusal = remote_spec(model), None
    except ValueError as err:  # e.g. a family whose shrunk attention runs prunetrain's own forward
        spec, refusal = {"standalone": False}, str(err)
    if not spec:
        return False
    directory = Path(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    guard = next((field for field in GUARD_FIELDS if field in config), None)
    if guard is None:
        raise ValueError(f"model: its config has none of the top-level fields {', '.join(GUARD_FIELDS)}, so "
                         f"prunetrain cannot stop a plain from_pretrained from loading the pruned weights into "
                         f"full-size attention.")
    if not hasattr(transformers, type(model.config).__name__) or not hasattr(transformers, type(model).__name__):
        spec, refusal = {"standalone": False}, f"{type(model).__name__} is not a class of the transformers package"
    spec["guard"] = {guard: config[guard]}
    spec["classes_of"] = {"config": type(model.config).__name__, "model": type(model).__name__}
    config[SPEC_KEY] = spec
    if refusal is not None:  # a prunetrain-only directory; a plain from_pretrained must still refuse it
        config[guard] = GUARD_MESSAGE_PRUNETRAIN_ONLY
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return False
    autos = auto_classes(model)
    config[guard] = GUARD_MESSAGE
    module = MODELING_FILE.removesuffix(".py")
    config["auto_map"] = {"AutoConfig": f"{module}.{type(model.config).__name__}",
                          **{auto: f"{module}.{cls}" for auto, cls in sorted(autos.items())}}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / MODELING_FILE).write_text(_TEMPLATE.read_text() + "\n\n" + _class_source(model, autos))
    return True


def plain_config_dict(config: dict) -> dict:
    """A pruned directory's config.json as the original architecture's config: guard restored, remote-code keys
    removed (for `load_pruned` and the plain formats)."""
    config = dict(config)
    spec = config.pop(SPEC_KEY, None) or {}
    config.update(spec.get("guard") or {})
    config.pop("auto_map", None)
    original = (spec.get("classes_of") or {}).get("model")
    if original:
        config["architectures"] = [original]
    return config


def is_guarded(config: dict) -> bool:
    return SPEC_KEY in config
