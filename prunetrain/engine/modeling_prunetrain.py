"""Modeling code for a model whose attention heads were pruned by prunetrain (needs only torch and transformers).

This file is copied, unchanged except for the class declarations at its end, into every directory that
`prunetrain.save_pruned` writes for a shrunk model, and registered in `config.json` under `auto_map`. Load the
directory with `AutoModelFor....from_pretrained(path, trust_remote_code=True)`; prunetrain need not be installed.

How it works: the model class is the original transformers class; after it is built from the (original) config,
`apply_layout` reshapes every attention site to the heads recorded under `config.prunetrain_export` before the
weights are loaded, so the weights fit exactly:

- `params`: parameters whose shape differs from the original architecture (q/k/v rows and output-projection
  columns of the removed heads are gone) get an empty tensor of the recorded shape (the checkpoint fills it);
- `attrs`: integer attributes of the attention modules that depend on the head count (e.g. `num_heads`);
- `classes`: a site with no heads left runs `headless_forward` (the output projection of an empty input: its bias
  and the residual path remain; empty keys/values still go to the KV cache so positions keep counting); so does
  an FFN with no neuron left whose own forward cannot run empty (GPT-2's MLP: the down projection's bias);
- `bias_select`: a shrunk site of a model with one position bias shared by all layers (T5: one row per original
  head) picks its own heads from the full bias and hands the full bias on;
- `headless_cache`: head-less self-attention sites whose KV-cache layer must count positions from the keys'
  position axis (`[batch, 0 heads, positions, head_dim]` is not "empty");
- `masks`: the head masks that were attached when the model was saved (a Trainer checkpoint taken between a
  prune and its shrink, a model whose gates became a mask). The weights hold every head; each mask multiplies
  head h's slice of its output projection's input by its keep value, with the same float32 values and the same
  arithmetic as prunetrain's hooks, so the loaded model computes bit-identically to the saved one.

The config also carries a guard: `model_type` is `<type>-pruned-by-prunetrain` (no transformers class claims it, so
`AutoConfig`/`AutoModel*` ask for `trust_remote_code=True`) and the strictly typed model width (`hidden_size`, else
`d_model`, ...) holds a message (the real values are under `prunetrain_export["guard"]`), so loading the directory
without this file (`XxxForYyy.from_pretrained`, with or without `ignore_mismatched_sizes`) fails with that message
instead of loading a silently different model. The config classes below restore both, and guard them again when
the config is saved.
"""

from __future__ import annotations

import json
import os

import torch
import transformers
from torch import nn

SPEC_KEY = "prunetrain_export"
LAYOUT_FILE = "prunetrain_layout.json"


def _get(root: nn.Module, path: str):
    for part in path.split(".") if path else ():
        root = getattr(root, part)
    return root


def _locate(model: nn.Module, path: str, modules: dict) -> str:
    """The recorded path inside `model`; paths are recorded on the head model, so a base model drops the prefix."""
    if path in modules:
        return path
    prefix = getattr(model, "base_model_prefix", "") + "."
    if path.startswith(prefix) and path[len(prefix):] in modules:
        return path[len(prefix):]
    raise ValueError(f"prunetrain_export: module {path!r} is not in {type(model).__name__}.")


class BiasSelection:
    """Hooks of a shrunk site that share one position bias with full head count (`[1, H, q, k]`) across layers."""

    def __init__(self, kept: list[int], full_heads: int):
        self.kept = list(kept)  # a tensor is made where it is used (models are built on the meta device)
        self.full_heads = full_heads
        self._full = None

    def install(self, module: nn.Module) -> None:
        module.register_forward_pre_hook(self.pre_forward, with_kwargs=True)
        module.register_forward_hook(self.post_forward)
        if getattr(module, "has_relative_attention_bias", False):
            module.relative_attention_bias.register_forward_hook(self.bias_table)

    def _index(self, like: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.kept, dtype=torch.long, device=like.device)

    def pre_forward(self, module, args, kwargs):
        self._full = None
        bias = kwargs.get("position_bias")
        if bias is not None and bias.shape[1] == self.full_heads:
            self._full = bias
            kwargs["position_bias"] = bias.index_select(1, self._index(bias))
        return args, kwargs

    def bias_table(self, embedding, inputs, values):  # values: [q, k, H]
        self._full = values.permute([2, 0, 1]).unsqueeze(0)
        return values.index_select(-1, self._index(values))

    def post_forward(self, module, args, output):
        attn_output, bias, *rest = output
        if self._full is not None:
            bias, self._full = self._full, None
        elif bias is not None and bias.shape[1] != self.full_heads:
            bias = bias.new_zeros((bias.shape[0], self.full_heads, *bias.shape[2:]))
        return (attn_output, bias, *rest)


def _cache_argument(kwargs, names):
    """The KV cache among an attention module's keyword arguments: the first of `names` or of `cache` (its name from
    transformers 5.24), `past_key_values`, `past_key_value` that is given."""
    return next((kwargs[k] for k in (*names, "cache", "past_key_values", "past_key_value") if kwargs.get(k) is not None),
                None)


def headless_forward(self, hidden_states, *args, **kwargs):
    """Forward of an attention site with no heads: the output projection of an empty `[..., 0]` input."""
    lead = hidden_states.shape[:-1]
    cache = _cache_argument(kwargs, self._pt_cache_kwargs)
    index = getattr(self, "layer_idx", None)
    if cache is not None and index is not None and not getattr(self, "_pt_cross", False):
        cache = getattr(cache, "self_attention_cache", cache)
        b, t = (hidden_states.shape[1], hidden_states.shape[0]) if self._pt_time_first else hidden_states.shape[:2]
        kv = hidden_states.new_zeros(b, 0, t, int(_get(self, self._pt_head_dim)))
        cache.update(kv, kv, index)
    if self._pt_out is None:  # the output projection lies outside this module: its caller applies it
        return hidden_states.new_zeros(*lead, 0), None
    proj = _get(self, self._pt_out)
    if isinstance(proj, nn.Linear):
        out = proj(hidden_states.new_zeros(*lead, 0))
    else:  # transformers' Conv1D (weight [in, out])
        out = proj.bias.expand(*lead, proj.bias.shape[-1])  # = bias + [..., 0] @ [0, E]; traces with dynamic shapes
    if self._pt_post is not None:
        out = _get(self, self._pt_post)(out)
    return out if getattr(self, "_pt_tensor_only", False) else (out, None)


_HEADLESS: dict = {}


def _headless_class(base: type, spec: dict) -> type:
    key = (base, tuple(sorted((k, repr(v)) for k, v in spec.items())))
    if key not in _HEADLESS:
        namespace = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
        _HEADLESS[key] = type(f"Headless{base.__name__}", (base,), {"forward": headless_forward, **namespace})
    return _HEADLESS[key]


_CACHE_LAYER: list = []


def _headless_cache_layer() -> type:
    """A `DynamicLayer` whose length is the keys' position axis even with 0 heads."""
    if not _CACHE_LAYER:
        from transformers.cache_utils import DynamicLayer

        class HeadlessDynamicLayer(DynamicLayer):
            def _filled(self) -> bool:
                return self.is_initialized and self.keys is not None and self.keys.dim() == 4

            def get_seq_length(self) -> int:
                return self.keys.shape[-2] if self._filled() else 0

            def batch_repeat_interleave(self, repeats: int) -> None:
                if self._filled():
                    self.keys = self.keys.repeat_interleave(repeats, dim=0)
                    self.values = self.values.repeat_interleave(repeats, dim=0)

            def batch_select_indices(self, indices) -> None:
                if self._filled():
                    self.keys = self.keys[indices, ...]
                    self.values = self.values[indices, ...]

        _CACHE_LAYER.append((DynamicLayer, HeadlessDynamicLayer))
    return _CACHE_LAYER[0]


def _mark_cache_layer(kwarg_names):
    def hook(module, args, kwargs, output):
        cache = _cache_argument(kwargs, kwarg_names)
        index = getattr(module, "layer_idx", None)
        if cache is None or index is None:
            return
        cache = getattr(cache, "self_attention_cache", cache)
        layers = getattr(cache, "layers", None)
        if layers is None or index >= len(layers):
            return
        dynamic, headless = _headless_cache_layer()
        if type(layers[index]) is dynamic:
            layers[index].__class__ = headless
    return hook


class SavedHeadScale:
    """Forward pre-hook of a saved mask: head h's slice of the output projection's input `[..., H * d]` times
    keep[h]."""

    def __init__(self, keep: list, head_dim: int):
        self.keep = [float(x) for x in keep]  # a tensor is made where it is used (models are built on the meta device)
        self.head_dim = int(head_dim)
        self._values = None

    def __call__(self, module, args):
        x, *rest = args
        if self._values is None:
            self._values = torch.tensor(self.keep, dtype=torch.float32, device="cpu")
        values = self._values.to(device=x.device, dtype=x.dtype)
        return ((x.unflatten(-1, (-1, self.head_dim)) * values[:, None]).flatten(-2), *rest)


def _attach_masks(model: nn.Module, masks: list, modules: dict) -> None:
    """Install the saved masks as hooks, in the order they ran, and note them on the model (`_prunetrain_saved_masks`:
    prunetrain, when it is there, turns them into its own masks)."""
    saved = []
    for entry in masks:
        sites, handles = {}, []
        for site, record in entry["sites"].items():
            out_proj = modules[_locate(model, record["out_proj"], modules)]
            handles.append(out_proj.register_forward_pre_hook(SavedHeadScale(record["keep"], record["head_dim"])))
            sites[_locate(model, site, modules)] = list(record["keep"])
        saved.append({"owner": entry.get("owner"), "sites": sites, "handles": handles})
    if saved:
        model._prunetrain_saved_masks = saved


def apply_layout(model: nn.Module, spec: dict) -> None:
    """Reshape `model` (built from the original config) to the recorded pruned layout, before weights load."""
    modules = dict(model.named_modules())
    for name, shape in spec.get("params", {}).items():
        owner, leaf = name.rsplit(".", 1)
        module = modules[_locate(model, owner, modules)]
        old = getattr(module, leaf)
        setattr(module, leaf, nn.Parameter(torch.empty(shape, dtype=old.dtype, device=old.device),
                                           requires_grad=old.requires_grad))
    for path, attrs in spec.get("attrs", {}).items():
        module = modules[_locate(model, path, modules)]
        for key, value in attrs.items():
            owner, _, leaf = key.rpartition(".")
            setattr(_get(module, owner), leaf, value)
    for path, cls_spec in spec.get("classes", {}).items():
        module = modules[_locate(model, path, modules)]
        module.__class__ = _headless_class(type(module), cls_spec)
    for path, bias in spec.get("bias_select", {}).items():
        BiasSelection(bias["kept"], bias["full_heads"]).install(modules[_locate(model, path, modules)])
    for path, kwarg_names in spec.get("headless_cache", {}).items():
        module = modules[_locate(model, path, modules)]
        module.register_forward_hook(_mark_cache_layer(tuple(kwarg_names)), with_kwargs=True)
    _attach_masks(model, spec.get("masks", []), modules)


def _unguarded(config_dict: dict) -> dict:
    config_dict = dict(config_dict)
    config_dict.update((config_dict.get(SPEC_KEY) or {}).get("guard") or {})
    return config_dict


class PrunedConfigMixin:
    """Restores the real values of the config fields the guard replaced in config.json (the model type and the
    model width), and guards them again whenever the config is written (a save of the loaded model)."""

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        return _unguarded(config_dict), kwargs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        return super().from_dict(_unguarded(config_dict), **kwargs)

    def to_json_file(self, json_file_path, use_diff=True):
        super().to_json_file(json_file_path, use_diff=use_diff)
        with open(json_file_path, encoding="utf-8") as handle:
            data = json.load(handle)
        spec = data.get(SPEC_KEY) or {}
        data.update(spec.get("guarded") or {})
        if getattr(self, "_attn_implementation", None) in ("eager", "sdpa"):  # loads compute as this model runs
            data["attn_implementation"] = self._attn_implementation
        with open(json_file_path, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        if os.path.basename(json_file_path) == "config.json" and "layout" in spec:  # prunetrain.load_pruned reads it
            layout = {**spec["layout"], "attn_implementation": data.get("attn_implementation")}
            with open(os.path.join(os.path.dirname(json_file_path), LAYOUT_FILE), "w", encoding="utf-8") as handle:
                handle.write(json.dumps(layout, indent=1))


class PrunedModelMixin:
    """Builds the original architecture, then reshapes it to the recorded heads (`apply_layout`)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        apply_layout(self, getattr(config, SPEC_KEY))

    @classmethod
    def is_custom_code(cls) -> bool:
        """The transformers class plus a reshape: it shares that class's checkpoint conversions (e.g. GPT-NeoX's
        `embed_out` → `lm_head`) and weight initialisation."""
        return False


# ---- generated by prunetrain.save_pruned for this model: the classes `auto_map` names ----
