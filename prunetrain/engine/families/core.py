"""Family adapters: the one place that knows Hugging Face module names.

An adapter answers two questions for one model family:

1. `sites(model)`: which modules are multi-head attention sites, their kind and layer, and which module's input is
   the concatenation of the heads (the output projection).
2. `remove_heads(site, keep, select)`: how to slice the weights so that only the heads in `keep` remain.

What else a family needs to say is an adapter attribute, never a check on the family's name elsewhere:
`time_first` (attention outputs are `[T, B, H*d]`: per-example importance refuses them), `cache_kwargs` (the
keyword under which the attention module receives its KV cache), `shrink_refusal(site)` (why `shrink` cannot be
exact for a site, e.g. a norm over all heads; masks and importance still work).

**Sites with no heads left: one mechanism, a class switch.** When a family's own `forward` cannot run with the
head count `shrink` leaves (GPT-2's `split(0)`, OPT's `view(B, -1, 0, d)`, Falcon's `H // H_kv`, FSMT's reshape with
the input width), the adapter switches the module's class in place to a subclass declared with `define_subclass`
and applied with `switch_class`: same object, same parameters, hooks and state-dict keys, only `forward` differs.
`headless_forward` is the shared forward of a site with zero heads (the output projection of an empty input, so the
residual path and the projection's bias remain, and empty keys/values written to the cache so cached generation
keeps counting positions). The KV cache's head-less layer (`prunetrain.engine.kv_cache`) uses the same mechanism.
Declared subclasses are attributes of this module (built on first use), so pickles of shrunk models resolve them.

**Registering your own adapter** takes a few lines. For a family whose attention module holds four `nn.Linear`
projections (the common layout), name the module class, the projections and the head-count attributes; e.g. CTRL
(tests/test_discovery.py runs exactly this)::

    from prunetrain.engine.families import LinearAttentionAdapter, register

    @register
    class CTRLAdapter(LinearAttentionAdapter):
        name = "ctrl"
        model_types = ("ctrl",)                        # config.model_type values it handles
        module_classes = ("MultiHeadAttention",)       # attention module classes (subclasses match too)
        q, k, v, out = "Wq", "Wk", "Wv", "dense"       # attribute paths inside the attention module
        head_dim_attr = "head_dim"
        count_attrs = ("num_heads",)                   # set to the new head count after shrink

        def original_num_heads(self, model, kind):
            return model.config.n_head

`prunetrain.engine.families.discovery.discover_adapter(model)` proposes such an adapter from the model's structure
and proves it on a probe input before it is used (see its docstring).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, AttentionSite, HeadSite
from prunetrain.engine.peft_support import base_layer
from prunetrain.engine.registry import (adapter_for, register, supported_families,  # noqa: F401  (the registry's
                                        supported_model_types, unregister)  # interface, importable from here too)
from prunetrain.utils.door import checked

Select = Callable[[nn.Parameter, int, torch.Tensor], None]
"""`select(param, dim, index)`: keep `index` along `dim` of `param`, in place (and in the optimizer state)."""

CROSS_ATTENTION_NAMES = {"encoder_attn", "EncDecAttention", "crossattention"}

CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")
"""The keywords under which transformers hands an attention module its KV cache: `cache` from transformers 5.24
(`past_key_values` is deprecated there), `past_key_values` / `past_key_value` before."""


def cache_argument(kwargs: dict, names: tuple[str, ...]):
    """The KV cache among an attention module's keyword arguments: the first of `names` (the family's keywords)
    or of `CACHE_KWARGS` that is given, else None."""
    return next((kwargs[k] for k in (*names, *CACHE_KWARGS) if kwargs.get(k) is not None), None)


def head_rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Row indices of the given heads in a head-major `[num_heads * head_dim]` axis."""
    return (heads[:, None] * head_dim + torch.arange(head_dim, device=heads.device)).reshape(-1)


def _get(module: nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _set(module: nn.Module, path: str, value) -> None:
    *parents, last = path.split(".")
    for part in parents:
        module = getattr(module, part)
    setattr(module, last, value)


def _layer_index(path: str) -> int:
    numbers = re.findall(r"\.(\d+)(?:\.|$)", path)
    return int(numbers[0]) if numbers else 0  # the block index: first number in the path


def class_names(module: nn.Module) -> set[str]:
    """Names of the module's class and its bases (a switched class still matches its family's names)."""
    return {c.__name__ for c in type(module).__mro__}


def select_linear_out(linear: nn.Linear, rows: torch.Tensor, select: Select) -> None:
    """Keep output features `rows` of an `nn.Linear` (weight rows and bias)."""
    select(linear.weight, 0, rows)
    if linear.bias is not None:
        select(linear.bias, 0, rows)
    linear.out_features = len(rows)


def select_linear_in(linear: nn.Linear, cols: torch.Tensor, select: Select) -> None:
    """Keep input features `cols` of an `nn.Linear` (weight columns; the bias is untouched)."""
    select(linear.weight, 1, cols)
    linear.in_features = len(cols)


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' `Conv1D` (GPT-2): a linear layer with weight `[in, out]` and sizes in `nx` / `nf`."""
    return "Conv1D" in class_names(module)


def select_out_features(module: nn.Module, rows: torch.Tensor, select: Select) -> None:
    """Keep output features `rows` of an `nn.Linear` or a transformers `Conv1D` (weight and bias; a peft layer
    around one by its base layer's kind)."""
    if not _is_conv1d(base_layer(module)):
        select_linear_out(module, rows, select)
        return
    select(module.weight, 1, rows)
    if module.bias is not None:
        select(module.bias, 0, rows)
    module.nf = len(rows)


def select_in_features(module: nn.Module, cols: torch.Tensor, select: Select) -> None:
    """Keep input features `cols` of an `nn.Linear` or a transformers `Conv1D` (weight only; a peft layer around one
    by its base layer's kind)."""
    if not _is_conv1d(base_layer(module)):
        select_linear_in(module, cols, select)
        return
    select(module.weight, 0, cols)
    module.nx = len(cols)


# ---------------------------------------------------------------------------------------------------------------------
# the one mechanism for sites whose own forward cannot run with the heads shrink leaves: a class switch
# ---------------------------------------------------------------------------------------------------------------------
_SUBCLASSES: dict[str, tuple[Callable[[], type], dict]] = {}
_BUILT: dict[str, type] = {}


def define_subclass(name: str, base: Callable[[], type], **namespace) -> str:
    """Declare `name`, a subclass of `base()` whose class attributes/methods are `namespace` (built on first use).

    Args:
        name: class name, unique; the class is reachable as `prunetrain.engine.families.core.<name>` (pickles).
        base: returns the base class (a callable, so that declaring does not import transformers).
        namespace: attributes of the subclass, typically `forward`.

    Returns:
        `name`, for `switch_class`.
    """
    if name in _SUBCLASSES and _SUBCLASSES[name][1] != namespace:
        raise ValueError(f"name: subclass {name!r} is already declared differently.")
    _SUBCLASSES[name] = (base, namespace)
    return name


def declared_subclass(name: str) -> type:
    """The class declared as `name` with `define_subclass`."""
    if name not in _BUILT:
        base, namespace = _SUBCLASSES[name]
        _BUILT[name] = type(name, (base(),), {"__module__": __name__, "__qualname__": name, **namespace})
    return _BUILT[name]


def lazy_subclass(module: str, name: str) -> type:
    """`declared_subclass(name)` for a module's `__getattr__`: when the base class lives in an optional package that
    is not installed, a `MissingExtraError` (an AttributeError, so `hasattr(module, name)` is False) saying what to
    install, instead of the ModuleNotFoundError escaping from attribute access."""
    from prunetrain.utils.extras import lazy_name

    with lazy_name(module, name):
        return declared_subclass(name)


def switch_class(obj: object, name: str) -> None:
    """Switch `obj`'s class in place to the declared subclass `name` (a no-op if it already is one).

    Args:
        obj: a module (or cache layer) whose class is the declared subclass's base.
        name: a name given to `define_subclass`.
    """
    cls = declared_subclass(name)
    if isinstance(obj, cls):
        return
    if not issubclass(cls, type(obj)):
        raise TypeError(f"obj: {type(obj).__name__} is not the base of {name} ({cls.__mro__[1].__name__}).")
    obj.__class__ = cls


def __getattr__(name: str):
    if name in _SUBCLASSES:
        return lazy_subclass(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def headless_forward(self, hidden_states, *args, **kwargs):
    """Forward of an attention site with no heads: `out_proj` of an empty `[..., 0]` input (its bias, and hooks on
    it, still run), plus empty `[B, 0, T, d]` keys/values written to a self-attention KV cache so that cached
    generation keeps counting positions. Class attributes of the switched class say where things are:
    `_pt_out` (output projection path), `_pt_cache_kwargs`, `_pt_time_first`, `_pt_head_dim` (attribute name)."""
    lead = hidden_states.shape[:-1]
    cache = cache_argument(kwargs, self._pt_cache_kwargs)
    index = getattr(self, "layer_idx", None)
    if cache is not None and index is not None and not getattr(self, "_pt_cross", False):
        cache = getattr(cache, "self_attention_cache", cache)
        b, t = (hidden_states.shape[1], hidden_states.shape[0]) if self._pt_time_first else hidden_states.shape[:2]
        kv = hidden_states.new_zeros(b, 0, t, int(_get(self, self._pt_head_dim)))
        cache.update(kv, kv, index)
    if self._pt_out is None:  # the output projection lies outside this module: its caller applies it
        return hidden_states.new_zeros(*lead, 0), None
    proj = _get(self, self._pt_out)
    if isinstance(base_layer(proj), nn.Linear):  # a peft tuner layer around an nn.Linear runs as one
        out = proj(hidden_states.new_zeros(*lead, 0))
    else:  # transformers' Conv1D (weight [in, out]) cannot flatten a 0-wide input: bias + [N, 0] @ [0, E]
        out = proj.bias.expand(*lead, proj.bias.shape[-1])  # = bias + [..., 0] @ [0, E]; traces with dynamic shapes
    if self._pt_post is not None:
        out = _get(self, self._pt_post)(out)
    return out if getattr(self, "_pt_tensor_only", False) else (out, None)


def define_headless(name: str, base: Callable[[], type], out: str | None, head_dim: str,
                    cache_kwargs=CACHE_KWARGS, time_first: bool = False, post: str | None = None,
                    head_dim_value: int | None = None) -> str:
    """Declare the head-less form of an attention class (its forward is `headless_forward`).

    Args:
        name: class name (see `define_subclass`).
        base: returns the attention class.
        out: path of the output projection inside the module; None when it lies outside (the module then
            returns the empty concatenation of heads `[..., 0]` for its caller's projection).
        head_dim: attribute holding head_dim (for the empty cache entries).
        cache_kwargs: keywords under which the module receives its KV cache.
        time_first: inputs are `[T, B, E]`.
        post: a submodule applied to the output as the family's own forward does (e.g. GPT-2's `resid_dropout`).
        head_dim_value: head_dim itself, kept as the class attribute `head_dim` names, for a module that holds no
            head_dim attribute (structural discovery).
    """
    extra = {} if head_dim_value is None else {head_dim: int(head_dim_value)}
    return define_subclass(name, base, forward=headless_forward, _pt_out=out, _pt_head_dim=head_dim,
                           _pt_cache_kwargs=tuple(cache_kwargs), _pt_time_first=time_first, _pt_post=post, **extra)


# ---------------------------------------------------------------------------------------------------------------------
# FFN neurons: where a family keeps them, and how a site of them is sliced
# ---------------------------------------------------------------------------------------------------------------------
@checked
class FeedForward:
    """Where one family keeps its FFN neurons: the module classes holding an FFN, the up projections whose output
    features are the neurons, and the down projection whose input features are the neurons.

    Neuron j of an FFN of width I is row j of every up projection (rows j, I + j, ... of one that fuses `fused`
    blocks, e.g. Phi-3's `gate_up_proj` = [gate | up]) and input column j of the down projection. Every activation
    between them acts element-wise (ReLU, GELU, SiLU, and the gate's product in gated FFNs), so removing neuron j
    removes exactly its contribution `act(x·w_j) · d_j` — the computation a keep value ξ_j = 0 on the down
    projection's input gives.

    Args:
        classes: module class names holding the FFN (subclasses match too).
        up: paths, inside such a module, of the up (and gate) projections.
        down: path of the down projection.
        fused: blocks of width I in each up projection's output (2 for a fused gate/up projection).
        width: where the original width I is in the config: one key, or {kind: key}; the first key found among
            them is read from the config of the module's tower (`text_config` for `text_model.*`, ...).
        default_width: the width when the config leaves the key None: a callable of the config (GPT-2: 4 × n_embd).
        width_attrs: integer attributes of the module set to the new width after a shrink (e.g. Llama's
            `intermediate_size`), so the module describes itself truly.
        leaf_names: only modules whose attribute name is one of these (None: any).
        empty_class: the declared subclass (see `define_headless`) the module switches to at width 0, for a family
            whose own forward cannot run with no neuron (GPT-2's `Conv1D` cannot flatten a 0-wide input).
    """

    def __init__(self, classes: tuple[str, ...], up: tuple[str, ...], down: str, *, fused: int = 1,
                 width: str | tuple[str, ...] | dict[str, str | tuple[str, ...]] = ("intermediate_size",),
                 default_width: Callable | None = None, width_attrs: tuple[str, ...] = (),
                 leaf_names: tuple[str, ...] | None = None, empty_class: str | None = None):
        self.classes, self.up, self.down, self.fused = tuple(classes), tuple(up), down, fused
        self.width, self.default_width, self.width_attrs = width, default_width, tuple(width_attrs)
        self.leaf_names, self.empty_class = leaf_names, empty_class

    def is_host(self, path: str, module: nn.Module) -> bool:
        if not class_names(module) & set(self.classes):
            return False
        return self.leaf_names is None or path.rsplit(".", 1)[-1] in self.leaf_names

    def original_width(self, model: nn.Module, path: str, kind: str) -> int:
        """The FFN width the config builds at `path` (before any shrink)."""
        config = tower_config(model.config, path)
        keys = self.width.get(kind, self.width.get("*")) if isinstance(self.width, dict) else self.width
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        for key in keys:
            value = getattr(config, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        if self.default_width is not None:
            return int(self.default_width(config))
        raise ValueError(f"model: the config of {type(model).__name__} holds none of {', '.join(keys)}, so the "
                         f"original width of the FFN at {path!r} is unknown.")


ENCODER_DECODER_FFN_WIDTH = {"encoder_ffn": "encoder_ffn_dim", "decoder_ffn": "decoder_ffn_dim"}
"""The config keys of BART-style encoder–decoder models that size their encoder's and decoder's FFNs."""


def tower_config(config, path: str):
    """The config that sizes the module at `path`: a two-tower model's `text_config` / `vision_config` (CLIP,
    SigLIP) for modules under `text_model` / `vision_model`, else `config` itself."""
    first = path.split(".", 1)[0]
    for prefix, key in (("text_model", "text_config"), ("vision_model", "vision_config")):
        if first == prefix and getattr(config, key, None) is not None:
            return getattr(config, key)
    return config


def ffn_kind(model: nn.Module, path: str) -> str:
    """`encoder_ffn` / `decoder_ffn` in an encoder–decoder model (by the stack the path is in), else `ffn`."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder_ffn" if "encoder" in path.split(".") else "decoder_ffn"
    return "ffn"


class NeuronAdapter:
    """The adapter of one family's FFN sites: what `shrink` calls to slice a site of neurons (`remove_heads`, as
    for heads: the engine treats a neuron as a unit of width 1 whose output projection is the down projection).

    A family may have several FFN layouts (T5's plain and gated FFN): one `FeedForward` each; a site is sliced
    by the one whose classes its module matches."""

    def __init__(self, family: "FamilyAdapter", specs: tuple[FeedForward, ...]):
        self.family, self.specs = family, specs
        self.name, self.model_types = family.name, family.model_types
        self.time_first, self.cache_kwargs = family.time_first, ()

    def spec_of(self, path: str, module: nn.Module) -> FeedForward | None:
        return next((spec for spec in self.specs if spec.is_host(path, module)), None)

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        found = []
        for path, module in model.named_modules():
            spec = self.spec_of(path, module)
            if spec is None:
                continue
            down = _get(module, spec.down)
            name = f"{path}.{spec.down}" if path else spec.down
            layer = base_layer(down)
            width = int(layer.weight.shape[0 if _is_conv1d(layer) else 1])
            kind = ffn_kind(model, path)
            info = HeadSite(name=name, kind=kind, layer=_layer_index(path), num_heads=width, head_dim=1,
                            num_kv_heads=width, heads=FamilyAdapter.original_heads(model, name, width),
                            original_num_heads=spec.original_width(model, path, kind))
            found.append(AttentionSite(info=info, module=module, out_proj=down, adapter=self, root=model))
        return found

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:
        """Keep neurons `keep` (current positions, sorted): up/gate rows (each fused block), down columns."""
        module = site.module
        spec = next(spec for spec in self.specs if class_names(module) & set(spec.classes))
        width = site.info.num_heads
        rows = torch.cat([keep + block * width for block in range(spec.fused)])
        for path in spec.up:
            select_out_features(_get(module, path), rows, select)
        select_in_features(site.out_proj, keep, select)
        for attr in spec.width_attrs:
            _set(module, attr, len(keep))
        if len(keep) == 0 and spec.empty_class is not None:
            switch_class(module, spec.empty_class)

    def shrink_refusal(self, site: AttentionSite) -> str | None:
        return None


# ---------------------------------------------------------------------------------------------------------------------
# adapters
# ---------------------------------------------------------------------------------------------------------------------
class FamilyAdapter:
    """Base class. Subclasses set `name` and `model_types` and implement `sites` and `remove_heads`.

    Attributes:
        name: adapter name (recorded in `HeadLayout.family`).
        model_types: the `config.model_type` values it handles.
        time_first: the output projection's input is `[T, B, H*d]` (fairseq / FSMT), not `[B, T, H*d]`.
        cache_kwargs: keyword names under which the attention module receives its KV cache.
    """

    name: str = ""
    model_types: tuple[str, ...] = ()
    time_first: bool = False
    cache_kwargs: tuple[str, ...] = CACHE_KWARGS
    ffn: FeedForward | tuple[FeedForward, ...] | None = None
    """Where the family's FFN neurons are, one `FeedForward` per FFN layout (None: its FFN is not prunable;
    `ffn_refusal` says why)."""
    ffn_refusal: str | None = None
    """Why the family's FFN neurons cannot be pruned, one sentence (e.g. a mixture of experts)."""
    moe_model_types: tuple[str, ...] = ()
    """The model types of the family whose FFNs are mixtures of experts (their neurons are refused)."""

    def sites(self, model: nn.Module) -> list[AttentionSite]:  # pragma: no cover - abstract
        raise NotImplementedError

    def neuron_refusal(self, model: nn.Module) -> str | None:
        """Why `model`'s FFN neurons cannot be pruned (None: they can)."""
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type in self.moe_model_types:
            return (f"its FFNs ({model_type}) are mixtures of experts, whose experts' weights are fused into shared "
                    f"tensors routed per token; prunetrain prunes dense FFNs only")
        if self.ffn is not None:
            return None
        return self.ffn_refusal or (f"prunetrain has no FFN description for the {self.name!r} family (give its "
                                    f"adapter an `ffn = FeedForward(...)`; see prunetrain.engine.families.core)")

    def neuron_sites(self, model: nn.Module) -> list[AttentionSite]:
        """Live handles on every FFN site of `model` (units: neurons); a ValueError with the reason for a family
        whose FFN cannot be pruned, or a supported one in which no FFN is found (renamed modules)."""
        refusal = self.neuron_refusal(model)
        if refusal is not None:
            raise ValueError(f"model: the FFN neurons of {type(model).__name__} cannot be pruned: "
                             f"{refusal.rstrip('.')}. Prune its heads only.")
        sites = self.neuron_adapter().sites(model)
        if not sites:
            classes = sorted({c for spec in self.neuron_adapter().specs for c in spec.classes})
            raise ValueError(f"model: {type(model).__name__} is handled by adapter {self.name!r}, but none of its "
                             f"modules matches the adapter's FFN classes ({', '.join(classes)}); the installed "
                             f"transformers has probably renamed them (nothing would be pruned).")
        return sites

    def neuron_adapter(self) -> NeuronAdapter:
        """The adapter of this family's FFN sites (one per family adapter, made on first use)."""
        made = self.__dict__.get("_neuron_adapter")
        if made is None:
            specs = self.ffn if isinstance(self.ffn, tuple) else (self.ffn,)
            made = self.__dict__["_neuron_adapter"] = NeuronAdapter(self, specs)
        return made

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:  # pragma: no cover
        """Slice `site`'s weights so that only query heads `keep` (current positions, sorted) remain."""
        raise NotImplementedError

    def shrink_refusal(self, site: AttentionSite) -> str | None:
        """Why `shrink` cannot be exact for `site` (None: it can). Masks and importance work either way."""
        return None

    # helpers shared by the adapters
    @staticmethod
    def kind_of(model: nn.Module, path: str) -> str:
        leaf = path.rsplit(".", 1)[-1]
        if leaf in CROSS_ATTENTION_NAMES:
            return "cross"
        if getattr(model.config, "is_encoder_decoder", False):
            parts = path.split(".")
            return "encoder_self" if "encoder" in parts else "decoder_self"
        return "self"

    @staticmethod
    def original_heads(model: nn.Module, path: str, num_heads: int) -> tuple[int, ...]:
        recorded = (getattr(model.config, LAYOUT_CONFIG_KEY, None) or {}).get(path)
        return tuple(recorded) if recorded is not None else tuple(range(num_heads))


class LinearAttentionAdapter(FamilyAdapter):
    """Families whose attention is four `nn.Linear` projections q, k, v and out (head-major, `view(..., -1, d)`).

    Subclasses give the attention module classes, the attribute paths of the projections relative to the attention
    module, where head_dim lives, and which head-count attributes to update after a shrink.

    Grouped-query attention: query head h reads key/value head h // group (HF `repeat_kv`), so heads go in whole
    groups. A site with a single key/value head (multi-query attention, or a GQA site shrunk to one group) can lose
    single query heads: it reports `group_size` 1, keeps its key/value head while any query head remains, and the
    number of query heads per key/value head (`groups_attr`) is updated. (`shrink` also lets a mask remove part of a
    group when that group is the only one left: the site becomes multi-query.)
    """

    module_classes: tuple[str, ...] = ()
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    out: str = "out_proj"
    head_dim_attr: str = "head_dim"
    count_attrs: tuple[str, ...] = ()  # set to the new number of query heads
    width_attrs: tuple[str, ...] = ()  # set to the new num_heads * head_dim
    kv_count_attrs: tuple[str, ...] = ()  # set to the new number of key/value heads
    groups_attr: str | None = None  # query heads per key/value head (HF `num_key_value_groups`), if the module has it
    leaf_names: tuple[str, ...] | None = None  # only modules whose attribute name is one of these (None: any)
    headless_class: str | None = None  # declared subclass a site switches to when it loses every head

    def original_num_heads(self, model: nn.Module, kind: str) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_site(self, path: str, module: nn.Module) -> bool:
        if not class_names(module) & set(self.module_classes):
            return False
        return self.leaf_names is None or path.rsplit(".", 1)[-1] in self.leaf_names

    def head_dim(self, module: nn.Module) -> int:
        return int(_get(module, self.head_dim_attr))

    def head_counts(self, module: nn.Module, head_dim: int) -> tuple[int, int]:
        """(query heads, key/value heads) the module holds now."""
        return _get(module, self.out).weight.shape[1] // head_dim, _get(module, self.k).weight.shape[0] // head_dim

    def group_size(self, module: nn.Module, num_heads: int, num_kv: int) -> int:
        if self.groups_attr is None or num_kv <= 1:
            return 1
        return int(_get(module, self.groups_attr))

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        found = []
        for path, module in model.named_modules():
            if not self.is_site(path, module):
                continue
            head_dim = self.head_dim(module)
            num_heads, num_kv = self.head_counts(module, head_dim)
            kind = self.kind_of(model, path)
            info = HeadSite(
                name=path,
                kind=kind,
                layer=_layer_index(path),
                num_heads=num_heads,
                head_dim=head_dim,
                num_kv_heads=num_kv,
                heads=self.original_heads(model, path, num_heads),
                original_num_heads=self.original_num_heads(model, kind),
                group_size=self.group_size(module, num_heads, num_kv),
            )
            found.append(AttentionSite(info=info, module=module, out_proj=_get(module, self.out), adapter=self,
                                       root=model))
        return found

    def kv_heads_kept(self, site: AttentionSite, keep: torch.Tensor) -> torch.Tensor:
        """Positions of the key/value heads that stay when query heads `keep` stay."""
        info = site.info
        if info.num_kv_heads == info.num_heads:
            return keep
        return torch.unique(keep // (info.num_heads // info.num_kv_heads))  # the groups the kept heads read

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select: Select) -> None:
        d = site.info.head_dim
        kv = self.kv_heads_kept(site, keep)
        q_rows, kv_rows = head_rows(keep, d), head_rows(kv, d)
        module = site.module
        select_linear_out(_get(module, self.q), q_rows, select)
        select_linear_out(_get(module, self.k), kv_rows, select)
        select_linear_out(_get(module, self.v), kv_rows, select)
        select_linear_in(_get(module, self.out), q_rows, select)
        self.set_counts(site, len(keep), len(kv))

    def set_counts(self, site: AttentionSite, heads: int, kv_heads: int) -> None:
        """Update the module's head-count attributes (and switch to the head-less class at zero heads)."""
        module, d = site.module, site.info.head_dim
        for attr in self.count_attrs:
            _set(module, attr, heads)
        for attr in self.width_attrs:
            _set(module, attr, heads * d)
        for attr in self.kv_count_attrs:
            _set(module, attr, kv_heads)
        if self.groups_attr is not None and kv_heads:
            _set(module, self.groups_attr, heads // kv_heads)  # unchanged for whole groups; all heads on one kv head
        if heads == 0 and self.headless_class is not None:
            switch_class(module, self.headless_class)
