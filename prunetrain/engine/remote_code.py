"""Self-contained pruned directories: `modeling_prunetrain.py` + `auto_map`, loadable without prunetrain.

`remote_spec(model)` records what makes a shrunk model differ from the architecture its config describes, driven by
the model itself, not by family names: the parameters whose shape differs from a freshly built model, the integer
attributes of the attention sites that differ, sites switched to the head-less forward, the shared-position-bias
selection (T5) and the head-less KV-cache layers. Anything the record cannot reproduce (an unknown hook or module
class) is refused, never dropped.

**Every save of a shrunk model is a pruned directory.** `shrink` calls `mark_pruned(model)`, which records that spec
(and the head layout) on `model.config` and switches the config's class in place to a subclass of its own class
(same name, so transformers' auto mappings still know it) whose `to_json_file` writes the guarded `config.json`, the
modeling file and `prunetrain_layout.json`. transformers writes a model's config through `to_json_file` in every save
it has (`save_pretrained`, `Trainer.save_model`, every Trainer checkpoint, `push_to_hub`), so each of them writes a
complete pruned directory, before the weights (and before any upload).

**Every save of a masked model is a pruned directory too.** While a `HeadMask` (or Hard-Concrete gates) is attached,
the config has that class as well (`watch_config`), and each save records, under `masks`, every attached mask that
removes or scales a head, as the float32 keep values its hooks multiply by (gates: their deterministic test-time
values, the model as it evaluates). The weights stay whole (the Trainer saves what it trains, and resuming needs
it); the modeling file, `load_pruned` and `restore_layout` attach the masks again, so the directory loads as the
masked model, bit for bit. A callback that resumes from the checkpoint takes back the mask it had attached
(`prunetrain.engine.mask.release_saved_masks`).

The guard: `model_type` becomes `<model_type>-pruned-by-prunetrain` (no transformers class claims it, so
`AutoConfig`/`AutoModel*` need `trust_remote_code=True`, and `AutoTokenizer` falls back to the tokenizer's own files)
and the model width field (`hidden_size`, `d_model`, ...) holds a message that a plain `XxxForYyy.from_pretrained`
(with or without `ignore_mismatched_sizes`) fails on; the real values are under `prunetrain_export["guard"]`, which
the modeling file's config class and `prunetrain.load_pruned` restore. Base-class validation (`PretrainedConfig`,
which the Trainer uses to read a checkpoint's config on resume) never reads the width field.

A model whose shrunk attention runs prunetrain's own code (Phi-3, OLMo 2, FSMT) cannot be rebuilt by a modeling file:
its directory's `modeling_prunetrain.py` holds only a config class that refuses in one sentence naming
`prunetrain.load_pruned` (`refusing_source`), so `from_pretrained(path, trust_remote_code=True)` says how to load it
instead of transformers' "update Transformers" for an unknown `model_type`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from prunetrain.engine.config_records import make_records_cheap_to_copy
from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, all_sites, layout_record, unwrap_model
from prunetrain.engine.peft_support import base_view
from prunetrain.engine.own_config import own_config

MODELING_FILE = "modeling_prunetrain.py"
LAYOUT_FILE = "prunetrain_layout.json"
SPEC_KEY = "prunetrain_export"
MODEL_TYPE_SUFFIX = "-pruned-by-prunetrain"
GUARD_FIELDS = ("hidden_size", "d_model", "n_embd", "dim", "d_embed", "embed_dim", "text_config")
"""Top-level config fields that can carry the guard message, first present wins: the model width, which every
config class types strictly and `PretrainedConfig` itself never reads (two-tower configs such as CLIP's hold only
their towers' sub-configs: `text_config`). `vocab_size` is not one: the base class's token-id check reads it, so a
message there breaks `AutoTokenizer` and the Trainer's resume."""
GUARD_MESSAGE = ("this model was pruned by prunetrain and has a different number of attention heads per layer; load "
                 "it with from_pretrained(path, trust_remote_code=True) or prunetrain.load_pruned(path)")
GUARD_MESSAGE_MASKED = ("this model has attention heads masked by prunetrain (its weights still hold the heads the "
                        "mask removes or scales); load it with from_pretrained(path, trust_remote_code=True) or "
                        "prunetrain.load_pruned(path)")
SHAPE_KEYS = ("params", "attrs", "classes", "bias_select", "headless_cache", "refusal")
"""Sections of the record that say the model's shapes (or code) differ from its architecture's: a shrunk model."""
GUARD_MESSAGE_PRUNETRAIN_ONLY = ("this model was pruned by prunetrain and has a different number of attention heads "
                                 "per layer, in attention code only prunetrain has; load it with "
                                 "prunetrain.load_pruned(path)")
PORTABLE_ATTENTION = ("eager", "sdpa")
_TEMPLATE = Path(__file__).with_name(MODELING_FILE)
_SKIP_ATTRS = {"training"}


def plain_model_class(cls: type) -> type:
    """The transformers class behind `cls`: prunetrain's loading subclass and FSDP2's wrapper class are skipped."""
    for candidate in cls.__mro__:
        if "_prunetrain_loader" not in vars(candidate) and candidate.__module__.startswith("transformers."):
            return candidate
    return cls


def plain_config(config):
    """A deep copy of `config` as its own transformers class, without prunetrain's records (layout, export spec,
    `auto_map`): the config of the original architecture."""
    config = copy.deepcopy(config)
    config.__class__ = original_config_class(type(config))
    for key in (LAYOUT_CONFIG_KEY, SPEC_KEY, "auto_map"):
        if key in vars(config):
            delattr(config, key)
    return config


def fresh_model(model: nn.Module, device: str = "meta") -> nn.Module:
    """The original (unpruned) architecture of `model`, built from its config without the recorded layout."""
    config = plain_config(model.config)
    cls = plain_model_class(type(model))
    with torch.device(device):
        return cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)


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
    every = all_sites(model)
    sites = {s.info.name: s for s in every}
    paths = {id(module): name for name, module in model.named_modules()}
    roots = {paths[id(s.module)] for s in every}  # the modules holding a site (an FFN site's is not its name)
    spec: dict = {"params": {}, "attrs": {}, "classes": {}, "bias_select": {}, "headless_cache": {}}
    for path, module in base_view(model):  # peft tuner layers read as the base layers a merge leaves
        ref = reference.get(path)
        if ref is None:
            raise ValueError(f"model: module {path!r} is not in the architecture its config describes; it cannot be "
                             f"written as remote code.")
        for name, param in list(module._parameters.items()) + list(module._buffers.items()):
            ref_param = ref._parameters.get(name, ref._buffers.get(name))
            if param is not None and ref_param is not None and param.shape != ref_param.shape:
                spec["params"][f"{path}.{name}" if path else name] = list(param.shape)
        site_root = next((s for s in roots if path == s or path.startswith(s + ".")), None)
        if site_root is not None:
            changed = {k: v for k, v in vars(module).items()
                       if not k.startswith("_") and k not in _SKIP_ATTRS and isinstance(v, (int, float, str))
                       and not isinstance(v, bool) and vars(ref).get(k) != v}
            if changed:
                spec["attrs"][path] = changed
        if path and type(module) is not type(ref):  # the root may be a loading or FSDP2 subclass
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
                continue  # an attached HeadMask: every save records it apart (`saved_mask_record`)
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


def _class_source(config_class: str, model_class: str, autos: dict[str, str]) -> str:
    """The classes `auto_map` names. They keep the transformers class names: transformers keys some checkpoint
    conversions by class name (e.g. GPT-NeoX's `embed_out` → `lm_head`)."""
    lines = [f"class {config_class}(PrunedConfigMixin, transformers.{config_class}):", "    pass", "", ""]
    for cls_name in sorted(set(autos.values()) | {model_class}):
        lines += [f"class {cls_name}(PrunedModelMixin, transformers.{cls_name}):",
                  f"    config_class = {config_class}", "", ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# every save of a shrunk model writes a pruned directory
# ---------------------------------------------------------------------------------------------------------------------
class PrunedConfigWriter:
    """Mixin of a shrunk model's config class (`mark_pruned`): `to_json_file` writes the guarded config and, for a
    `config.json`, the modeling file and `prunetrain_layout.json` beside it. A copy whose record was deleted (the
    plain exports delete `prunetrain_export`) writes as its own class does."""

    def to_json_file(self, json_file_path, use_diff: bool = True) -> None:
        super().to_json_file(json_file_path, use_diff=use_diff)
        model, masks = _live_masks(self)
        if getattr(self, SPEC_KEY, None) or masks:
            write_pruned_files(Path(json_file_path), self, model, masks)

    def __reduce_ex__(self, protocol):  # pickles and deep copies rebuild the same pruned class
        return _pruned_config, (original_config_class(type(self)), dict(vars(self)))


_PRUNED_CONFIG_CLASSES: dict[type, type] = {}


def pruned_config_class(cls: type) -> type:
    """The pruned form of config class `cls`: same name, module and fields, plus `PrunedConfigWriter`."""
    if issubclass(cls, PrunedConfigWriter):
        return cls
    if cls not in _PRUNED_CONFIG_CLASSES:
        _PRUNED_CONFIG_CLASSES[cls] = type(cls.__name__, (PrunedConfigWriter, cls),
                                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return _PRUNED_CONFIG_CLASSES[cls]


def original_config_class(cls: type) -> type:
    """The config class a pruned config class was made from (`cls` itself for any other)."""
    return next(c for c in cls.__mro__ if not issubclass(c, PrunedConfigWriter))


def _pruned_config(cls: type, state: dict):
    config = cls.__new__(cls)
    config.__dict__.update(state)
    config.__class__ = pruned_config_class(cls)
    return config


_MASK_RECORDERS: list = []


def set_mask_recorder(recorder) -> None:
    """Install `recorder(config) -> (model, record) | None`: the model whose masks or gates are attached and whose
    config is `config`, with what a save records of them (`prunetrain.engine.mask` installs it when imported; a
    process that never imported it has no masks to record)."""
    _MASK_RECORDERS[:] = [recorder]


def _live_masks(config) -> tuple[nn.Module | None, list]:
    found = next((r for r in (recorder(config) for recorder in _MASK_RECORDERS) if r is not None), None)
    return found if found is not None else (None, [])


def watch_config(model: nn.Module) -> None:
    """A mask or gates were attached to `model` (`prunetrain.engine.mask`): its config's class becomes the pruned
    form, whose every save records them (`PrunedConfigWriter`). Configs that are not transformers configs are left."""
    from transformers import PreTrainedConfig

    own_config(unwrap_model(model))  # copy-on-write: another model built from the same config keeps it unchanged
    config = getattr(unwrap_model(model), "config", None)
    if isinstance(config, PreTrainedConfig):
        config.__class__ = pruned_config_class(type(config))


def unwatch_config(model: nn.Module) -> None:
    """The last mask or gates were detached from `model`: an unshrunk model's config is its own class again."""
    config = getattr(unwrap_model(model), "config", None)
    if isinstance(config, PrunedConfigWriter) and not getattr(config, SPEC_KEY, None):
        config.__class__ = original_config_class(type(config))


def adopt_loaded_masks(model: nn.Module) -> None:
    """The masks the modeling file attached while loading `model` are now prunetrain's `HeadMask`s: its config's
    record no longer lists them (every save records the attached masks as they are then)."""
    config = getattr(unwrap_model(model), "config", None)
    spec = getattr(config, SPEC_KEY, None)
    if isinstance(spec, dict):
        spec.pop("masks", None)
    watch_config(model)


def _model_record(net: nn.Module) -> dict:
    """The classes, auto classes and head layout every pruned directory records (`standalone: False` with the
    reason when the classes are not transformers')."""
    import transformers

    config_class, model_class = original_config_class(type(net.config)).__name__, plain_model_class(type(net)).__name__
    spec: dict = {}
    if not hasattr(transformers, config_class) or not hasattr(transformers, model_class):
        spec = {"standalone": False, "refusal": f"{model_class} is not a class of the transformers package"}
    spec["classes_of"] = {"config": config_class, "model": model_class}
    if spec.get("standalone", True):
        spec["auto_classes"] = auto_classes(net)
    spec["layout"] = layout_record(net)
    return spec


def mark_pruned(model: nn.Module) -> None:
    """Record on `model.config` what every save of `model` needs to write a pruned directory (called by `shrink`).

    The record (`config.prunetrain_export`) is the `remote_spec` (or, where the standalone modeling file cannot
    rebuild the model, the reason), the auto classes and the head layout; the config's class becomes `pruned_config_class` of its own. A model with
    its original shapes is left (or made again) plain. Models whose config is not a transformers config (fairseq,
    hand-written modules) are left alone: nothing saves them as a model directory.

    Args:
        model: the model that was just shrunk (a DDP/FSDP-style `.module` wrapper is unwrapped).
    """
    import transformers

    net = unwrap_model(model)
    config = getattr(net, "config", None)
    if not isinstance(config, transformers.PreTrainedConfig):
        return
    try:
        spec = remote_spec(net)
    except ValueError as err:  # e.g. a family whose shrunk attention runs prunetrain's own forward
        spec = {"standalone": False, "refusal": str(err)}
    except Exception as err:  # the architecture would not build from its config: the directory needs prunetrain
        spec = {"standalone": False, "refusal": f"{type(err).__name__}: {str(err)[:200]}"}
    if not spec:
        vars(config).pop(SPEC_KEY, None)
        if _live_masks(config)[0] is None:  # attached masks or gates keep the pruned class (every save records them)
            config.__class__ = original_config_class(type(config))
        return
    record = _model_record(net)
    spec = record if not record.get("standalone", True) else {**record, **spec}
    if not spec.get("standalone", True):
        spec.pop("auto_classes", None)
    config.__class__ = pruned_config_class(type(config))
    setattr(config, SPEC_KEY, spec)
    make_records_cheap_to_copy(config)  # transformers deep-copies configs on every forward (engine.config_records)


def write_pruned_files(config_path: Path, config, model: nn.Module | None = None, masks: list | None = None) -> None:
    """Guard the `config.json` that `config` just wrote at `config_path`, and write the modeling file (unless the
    model needs prunetrain's own code) and `prunetrain_layout.json` beside it (see the module docstring).

    Args:
        config_path: the file `config` was just written to.
        config: a config with a shrink record (`mark_pruned`), or of a model with masks or gates attached.
        model: the model whose masks or gates are attached (None: the record on the config is written as it is).
        masks: their record (`prunetrain.engine.mask.saved_mask_record`), written under `masks`.
    """
    data = json.loads(config_path.read_text(encoding="utf-8"))
    data.update((data.get(SPEC_KEY) or {}).get("guard") or {})  # a config read from a pruned directory: real values
    spec = copy.deepcopy(getattr(config, SPEC_KEY, None) or {})
    for key in ("guard", "guarded"):
        spec.pop(key, None)
    if model is not None:
        spec.pop("masks", None)
        if masks:
            spec["masks"] = masks
        if "classes_of" not in spec:  # masked, never shrunk: the model as it is
            spec.update(_model_record(model))
    guard = next((field for field in GUARD_FIELDS if field in data), None)
    if guard is None:
        raise ValueError(f"model: its config has none of the top-level fields {', '.join(GUARD_FIELDS)}, so "
                         f"prunetrain cannot stop a plain from_pretrained from loading the pruned weights into "
                         f"full-size attention.")
    standalone = spec.get("standalone", True)
    spec["guard"] = {guard: data[guard], "model_type": data["model_type"]}
    shrunk = any(key in spec for key in SHAPE_KEYS)
    message = GUARD_MESSAGE_PRUNETRAIN_ONLY if not standalone else GUARD_MESSAGE if shrunk else GUARD_MESSAGE_MASKED
    spec["guarded"] = {guard: message, "model_type": data["model_type"] + MODEL_TYPE_SUFFIX}
    data.update(spec["guarded"])
    data[SPEC_KEY] = spec
    attn = running_attention(config)
    if attn is not None:  # loads compute as the saved model ran (kernels differ in the last bits), unless asked
        data["attn_implementation"] = attn
    data.pop("auto_map", None)
    directory = config_path.parent
    module, classes = MODELING_FILE.removesuffix(".py"), spec["classes_of"]
    if standalone:
        data["auto_map"] = {"AutoConfig": f"{module}.{classes['config']}",
                            **{auto: f"{module}.{cls}" for auto, cls in sorted(spec["auto_classes"].items())}}
        if config_path.name == "config.json":
            source = _class_source(classes["config"], classes["model"], spec["auto_classes"])
            (directory / MODELING_FILE).write_text(_TEMPLATE.read_text() + "\n\n" + source)
    else:  # `from_pretrained(path, trust_remote_code=True)` finds a config class that says how to load it
        data["auto_map"] = {"AutoConfig": f"{module}.{classes['config']}"}
        if config_path.name == "config.json":
            (directory / MODELING_FILE).write_text(refusing_source(classes["config"], message))
    if config_path.name == "config.json":
        layout = {**spec["layout"], "attn_implementation": attn}
        (directory / LAYOUT_FILE).write_text(json.dumps(layout, indent=1))
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


REFUSING_SOURCE = '''"""Written by prunetrain beside a pruned model whose attention runs code only prunetrain has,
so no modeling file can rebuild it with transformers alone: `AutoConfig` / `AutoModel*.from_pretrained(path,
trust_remote_code=True)` find this config class, which refuses in one sentence naming the loader that rebuilds the
model exactly."""

import transformers

MESSAGE = {message!r}


class {name}(getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig):
    """Refuses to load (`MESSAGE`)."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        raise ValueError(MESSAGE)

    @classmethod
    def from_dict(cls, *args, **kwargs):
        raise ValueError(MESSAGE)
'''


def refusing_source(config_class: str, message: str) -> str:
    """The `modeling_prunetrain.py` of a directory whose model needs prunetrain's code: a config class named
    `config_class` whose loading raises `ValueError(message)` (`trust_remote_code=True` then says how to load it
    instead of transformers' "update Transformers" for an unknown `model_type`)."""
    return REFUSING_SOURCE.format(name=config_class, message=message)


def running_attention(config) -> str | None:
    """The attention implementation a model with `config` runs, when it is one every machine has ("eager", "sdpa"):
    recorded in a pruned directory so that loading it computes bit-identically by default (sdpa and eager differ in
    the last bits, ~1e-6 on a T5's logits)."""
    attn = getattr(config, "_attn_implementation", None)
    return attn if attn in PORTABLE_ATTENTION else None


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
