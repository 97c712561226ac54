"""Structural discovery: an adapter for a model type that no adapter names, proposed from the model's structure and
proven on a probe input before it is trusted.

`discover_adapter(model, inputs)` (or `find_heads(model, discover=True)`):

1. **Propose.** One probe forward (inputs built from the config when none are given: `probe_inputs`) records the
   order in which every `nn.Linear` runs. A module whose own Linear children run as q, k, v and then an output
   projection (or one fused qkv projection and the output projection) is a site; so is the parent of a module whose
   children run as q, k, v only, when the next Linear to run is a sibling's taking the concatenated heads (BERT's
   `attention.self` + `attention.output.dense`: RoFormer, ESM, ...). The head count comes from the module
   (`num_heads`, `num_attention_heads`, ...), else from its `head_dim` (heads = width / head_dim), else from the
   config (`num_attention_heads`, ... : Cohere, Helium). Projections with `H·d` outputs are queries and with
   `H_kv·d` keys/values (grouped-query attention); a fused projection (`3·H·d`) is tried as `[q | k | v]` blocks
   and as per-head `[H, 3, d]`. Parameters of the site whose first dimension is the head count (per-head q/k norms,
   Cohere) and ModuleLists with one module per head (StableLM's per-head LayerNorms) are sliced with the heads;
   integer attributes equal to the heads' width (`all_head_size`, `embed_dim`, ...) are updated.
2. **Prove** (`prunetrain.engine.families.discovery_check`): on a copy of the model whose every parameter that is
   not a Linear weight (norm weights and biases, scales, embeddings, biases) is perturbed first — so a module at its
   initial values (norm weights 1) cannot hide a dependency across heads — an all-ones mask must leave the output
   bit-identical and masked == shrunk (max |Δ| ≤ 1e-5) for a random mask and with every head of one site removed.
   A failure is a `ValueError` naming the module and the reason when one is recognised (a per-head tensor built
   outside the site, e.g. ALiBi; a parameter spanning all heads, e.g. a norm across heads; a fused projection in
   neither layout); nothing is registered then.
3. **Register** (default): `find_heads`, `HeadMask`, `shrink`, importance and the callbacks then work on the model.
   The adapter is pure data (`DiscoveredAdapter.description()`): a pruned directory records it, and `load_pruned`
   (so `prunetrain export`) registers it again in a fresh process.

Where the proposal does not fit, write an adapter by hand in a few lines (see `prunetrain.engine.families.core`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from dataclasses import dataclass

import torch
from torch import nn

from prunetrain.engine.families.core import (_ADAPTERS, LinearAttentionAdapter, _get, _layer_index, _set,
                                             class_names, define_headless, head_rows, register, select_linear_in,
                                             select_linear_out, switch_class)
from prunetrain.engine.heads import AttentionSite, HeadSite

HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_attn_heads", "heads", "nhead")
HEAD_DIM_ATTRS = ("head_dim", "head_size", "attention_head_size", "d_head", "dim_head", "key_value_proj_dim")
CONFIG_HEAD_COUNTS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
WIDTH_ATTRS = ("all_head_size", "inner_dim", "inner_size")
KV_COUNT_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head")
GROUP_ATTRS = ("num_key_value_groups", "n_rep", "num_queries_per_kv")
FUSED_LAYOUTS = ("blocks", "interleaved")
logger = logging.getLogger("prunetrain")


@dataclass(frozen=True)
class Proposal:
    """How the sites of one attention module class hold their heads; every path is relative to the site module.

    Args:
        module_class: the site module's class name.
        head_dim: size of each head.
        projections: q/k/v projections in call order (one: fused).
        out: the output projection (its input is the concatenation of the heads).
        count_from: where the head count was read ("num_heads", "head_dim", "config.num_attention_heads", ...).
        fused_layout: "blocks" (`[q | k | v]`) or "interleaved" (`[H, 3, d]`) for a fused projection, else "".
        count_attrs: integer attributes set to the new head count after a shrink.
        width_attrs: integer attributes set to the new heads' width (`heads × head_dim`).
        kv_count_attrs: integer attributes set to the new key/value head count.
        groups_attr: the query-heads-per-key/value-head attribute, if any.
        per_head: (path, dim) of parameters with one slice per head along `dim` and of ModuleLists with one entry
            per head (dim 0), sliced with the heads.
        headless: a site left with no heads switches to the head-less forward (`core.headless_forward`) of the
            module holding the q/k/v projections (the site, or for a BERT layout its `self` child).
    """

    module_class: str
    head_dim: int
    projections: tuple[str, ...]
    out: str
    count_from: str
    fused_layout: str = ""
    count_attrs: tuple[str, ...] = ()
    width_attrs: tuple[str, ...] = ()
    kv_count_attrs: tuple[str, ...] = ()
    groups_attr: str | None = None
    per_head: tuple[tuple[str, int], ...] = ()
    headless: bool = False

    @property
    def count_attr(self) -> str:
        """Where the head count came from (kept for messages)."""
        return self.count_from

    @property
    def core(self) -> str:
        """Path of the module holding the q/k/v projections ("" when it is the site itself)."""
        return self.projections[0].rpartition(".")[0]

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        return {k: [list(x) for x in v] if k == "per_head" else list(v) if isinstance(v, tuple) else v
                for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Proposal":
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**{**data, "per_head": tuple((str(path), int(dim)) for path, dim in data.get("per_head", ()))})


# ---------------------------------------------------------------------------------------------------------------------
# probe inputs and the probe forward
# ---------------------------------------------------------------------------------------------------------------------
PROBE_BATCH, PROBE_LENGTH = 2, 7  # a length unlike any head count or batch × heads, so per-head tensors stand out


def probe_inputs(model: nn.Module) -> dict:
    """Inputs for one forward of `model`, built from its config: token ids (and decoder ids for an encoder-decoder)
    or images (`pixel_values` of the configured size); `ValueError` naming what is missing otherwise."""
    config = model.config
    gen = torch.Generator().manual_seed(0)
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = getattr(config, "image_size", None)
        size = size if isinstance(size, int) else (size or [None])[0]
        channels = getattr(config, "num_channels", 3)
        if not size:
            raise ValueError(f"inputs: {type(model).__name__} has no config.image_size; pass inputs=... (a dict "
                             f"model(**inputs) accepts).")
        return {"pixel_values": torch.randn(PROBE_BATCH, channels, size, size, generator=gen)}
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    if main != "input_ids" or not isinstance(vocab, int) or vocab < 4:
        raise ValueError(f"inputs: {type(model).__name__} takes {main!r} and its config gives no vocab_size to make "
                         f"token ids from; pass inputs=... (a dict model(**inputs) accepts).")
    inputs = {"input_ids": torch.randint(3, vocab, (PROBE_BATCH, PROBE_LENGTH), generator=gen)}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, vocab, (PROBE_BATCH, PROBE_LENGTH - 2), generator=gen)
    return inputs


def _call_trace(model: nn.Module, inputs: dict) -> list[tuple[str, str]]:
    """("linear", path) when a Linear runs and ("end", path) when a module with Linear children returns, in order."""
    trace: list[tuple[str, str]] = []
    handles = []
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_pre_hook(lambda m, a, p=path: trace.append(("linear", p))))
        elif any(isinstance(c, nn.Linear) for c in module.children()):
            handles.append(module.register_forward_hook(lambda m, a, o, p=path: trace.append(("end", p))))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return trace


def _children_called(trace, path: str) -> list[str]:
    """Names of `path`'s direct Linear children in the order they first ran."""
    prefix, out = path + "." if path else "", []
    for event, p in trace:
        if event == "linear" and p.startswith(prefix) and "." not in p[len(prefix):] and p[len(prefix):] not in out:
            out.append(p[len(prefix):])
    return out


def _next_linear_after(trace, path: str, parent: str, width: int, modules: dict) -> str | None:
    """The first Linear under `parent` (not under `path`) that runs after `path` returns and takes `width` inputs."""
    ends = [i for i, (event, p) in enumerate(trace) if event == "end" and p == path]
    for event, p in trace[ends[0] + 1:] if ends else []:
        if event == "linear" and p.startswith(parent + ".") and not p.startswith(path + "."):
            return p if modules[p].in_features == width else None
    return None


# ---------------------------------------------------------------------------------------------------------------------
# proposing
# ---------------------------------------------------------------------------------------------------------------------
def _has(module: nn.Module, path: str) -> bool:
    try:
        _get(module, path)
    except AttributeError:
        return False
    return True


def _int_attr(module: nn.Module, names) -> tuple[str, int] | None:
    for name in names:
        value = module.__dict__.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _head_count(model: nn.Module, holder: nn.Module, width: int, path: str) -> tuple[int, str, bool] | None:
    """(heads, where from, whether that is an attribute to update) for a site whose heads are `width` wide."""
    found = _int_attr(holder, HEAD_COUNT_ATTRS)
    if found and width % found[1] == 0:
        return found[1], found[0], True
    dim = _int_attr(holder, HEAD_DIM_ATTRS)
    if dim and width % dim[1] == 0:
        return width // dim[1], dim[0], False
    config = getattr(holder, "config", None) or model.config
    side = "encoder" if ".encoder." in f".{path}." else "decoder"
    for name in (f"{side}_attention_heads", *CONFIG_HEAD_COUNTS):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0 and width % value == 0:
            return value, f"config.{name}", False
    return None


def _per_head_parts(site: nn.Module, skip: tuple[str, ...], heads: set[int]) -> tuple[tuple[str, int], ...]:
    """(path, dim) relative to `site` of ModuleLists with one entry per head and of parameters with a head count
    as first (else last) dimension, outside the projections `skip` (not Linear weights)."""
    found, lists = [], []
    for path, module in site.named_modules():
        if any(path == s or path.startswith(s + ".") for s in (*skip, *lists)):
            continue
        if isinstance(module, nn.ModuleList) and len(module) in heads and path:
            found.append((path, 0))
            lists.append(path)
            continue
        for name, param in module.named_parameters(recurse=False):
            full = f"{path}.{name}" if path else name
            if param.dim() >= 1 and param.shape[0] in heads:
                found.append((full, 0))
            elif param.dim() >= 2 and param.shape[-1] in heads and not isinstance(module, nn.Linear):
                found.append((full, param.dim() - 1))
    return tuple(found)


def _structure(model, path, module, trace, modules) -> tuple[str, str, tuple[str, ...], str] | None:
    """(site path, core prefix, projections, out) relative to the site, or None if `module` is no attention."""
    called = [c for c in _children_called(trace, path) if isinstance(getattr(module, c), nn.Linear)]
    if len(called) in (2, 4):  # [fused, out] or [q, k, v, out] inside the module
        return path, "", tuple(called[:-1]), called[-1]
    if len(called) in (1, 3) and "." in path:  # q/k/v here, the output projection in a sibling (BERT)
        first = getattr(module, called[0])
        width = first.out_features // 3 if len(called) == 1 else first.out_features
        parent, leaf = path.rsplit(".", 1)
        out = _next_linear_after(trace, path, parent, width, modules)
        if out is not None:
            return parent, leaf + ".", tuple(leaf + "." + c for c in called), out[len(parent) + 1:]
    return None


def _propose_one(model, path, module, trace, modules) -> tuple[str, Proposal, int] | None:
    """(site path, proposal, heads) for one candidate module."""
    structure = _structure(model, path, module, trace, modules)
    if structure is None:
        return None
    site_path, core, projections, out = structure
    site = modules[site_path]
    width = _get(site, out).in_features
    holder = _get(site, core[:-1]) if core else site
    counted = _head_count(model, holder, width, path)
    if counted is None:
        return None
    heads, count_from, is_attr = counted
    d = width // heads
    outs = [_get(site, p).out_features for p in projections]
    if len(outs) == 1 and outs[0] != 3 * width or len(outs) == 3 and (outs[0] != width or any(o % d for o in outs)):
        return None
    kv = heads if len(outs) == 1 else min(outs) // d
    groups = _int_attr(holder, GROUP_ATTRS)
    proposal = Proposal(
        module_class=type(site).__name__, head_dim=d, projections=projections, out=out, count_from=count_from,
        fused_layout="blocks" if len(outs) == 1 else "",
        count_attrs=(core + count_from,) if is_attr else (),
        width_attrs=tuple(core + n for n, v in vars(holder).items() if isinstance(v, int) and not isinstance(
            v, bool) and v == width and not n.startswith("_")),
        kv_count_attrs=tuple(core + n for n in KV_COUNT_ATTRS if n in vars(holder)),
        groups_attr=core + groups[0] if groups else None,
        per_head=_per_head_parts(site, (*projections, out), {heads, kv}))
    return site_path, proposal, heads


def propose(model: nn.Module, inputs: dict) -> tuple[list[Proposal], dict[str, int]]:
    """Candidate attention sites of `model` (module docstring, step 1): one `Proposal` per site module class, and
    the head count of every site.

    Args:
        model: the model (in eval mode).
        inputs: probe inputs, `model(**inputs)` must run.
    """
    trace = _call_trace(model, inputs)
    modules = dict(model.named_modules())
    by_class: dict[str, Proposal] = {}
    heads: dict[str, int] = {}
    for path, module in modules.items():
        if not path or isinstance(module, nn.Linear) or not any(isinstance(c, nn.Linear) for c in module.children()):
            continue
        found = _propose_one(model, path, module, trace, modules)
        if found is None or found[0] in heads:
            continue
        site_path, proposal, count = found
        known = by_class.setdefault(proposal.module_class, proposal)
        if dataclasses.replace(known, per_head=(), width_attrs=()) != dataclasses.replace(proposal, per_head=(),
                                                                                           width_attrs=()):
            raise ValueError(f"model: discovery found modules of class {proposal.module_class} laid out differently "
                             f"({site_path!r}: projections {list(proposal.projections)} -> {proposal.out!r}); "
                             f"register an adapter by hand (see prunetrain.engine.families.core).")
        heads[site_path] = count
    return list(by_class.values()), heads


def variants(proposal: Proposal):
    """The readings of a proposal the self-check tries, most likely first: fused layout × the width attributes
    (every int attribute equal to the heads' width, or only the well-known names) × per-head parts (or none) × the
    module's own forward at zero heads (or the head-less forward)."""
    layouts = FUSED_LAYOUTS if proposal.fused_layout else ("",)
    widths = list(dict.fromkeys([proposal.width_attrs,
                                 tuple(a for a in proposal.width_attrs if a.rsplit(".", 1)[-1] in WIDTH_ATTRS)]))
    per_head = list(dict.fromkeys([proposal.per_head, ()]))
    for layout, width, parts, headless in itertools.product(layouts, widths, per_head, (False, True)):
        yield dataclasses.replace(proposal, fused_layout=layout, width_attrs=width, per_head=parts, headless=headless)


# ---------------------------------------------------------------------------------------------------------------------
# the adapter
# ---------------------------------------------------------------------------------------------------------------------
class DiscoveredAdapter(LinearAttentionAdapter):
    """An adapter built from proposals (subclassed per model type by `adapter_from_description`)."""

    proposals: dict[str, Proposal] = {}
    proposal: Proposal | None = None  # the first (usually only) one
    original: dict[str, int] = {}  # site path -> heads when discovered

    def description(self) -> dict:
        """Everything that rebuilds this adapter (JSON): recorded in pruned directories."""
        return {"model_type": self.model_types[0], "proposals": [p.to_dict() for p in self.proposals.values()],
                "original_heads": dict(self.original)}

    def proposal_of(self, module: nn.Module) -> Proposal:
        return next(self.proposals[c] for c in class_names(module) if c in self.proposals)

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        found = []
        for path, module in model.named_modules():
            if not class_names(module) & set(self.proposals):
                continue
            p = self.proposal_of(module)
            heads, kv = self.head_counts_of(module, p)
            info = HeadSite(name=path, kind=self.kind_of(model, path), layer=_layer_index(path), num_heads=heads,
                            head_dim=p.head_dim, num_kv_heads=kv, heads=self.original_heads(model, path, heads),
                            original_num_heads=self.original.get(path, heads),
                            group_size=heads // kv if kv > 1 else 1)
            found.append(AttentionSite(info=info, module=module, out_proj=_get(module, p.out), adapter=self,
                                       root=model))
        return found

    @staticmethod
    def head_counts_of(module: nn.Module, p: Proposal) -> tuple[int, int]:
        heads = _get(module, p.out).in_features // p.head_dim
        if len(p.projections) == 1:
            return heads, heads
        return heads, min(_get(module, name).out_features for name in p.projections) // p.head_dim

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        p, module, info = self.proposal_of(site.module), site.module, site.info
        d, kv = p.head_dim, self.kv_heads_kept(site, keep)
        q_rows = head_rows(keep, d)
        if len(p.projections) == 1:
            width = info.num_heads * d
            rows = (torch.cat([q_rows, q_rows + width, q_rows + 2 * width]) if p.fused_layout == "blocks"
                    else head_rows(keep, 3 * d))
            select_linear_out(_get(module, p.projections[0]), rows, select)
        else:
            for name in p.projections:
                proj = _get(module, name)
                select_linear_out(proj, q_rows if proj.out_features == info.num_heads * d else head_rows(kv, d),
                                  select)
        select_linear_in(_get(module, p.out), q_rows, select)
        for path, dim in p.per_head:
            if _has(module, path):  # e.g. a position-bias table only the first layer holds
                self._select_per_head(module, path, dim, keep if self._per_head_size(module, path, dim) ==
                                      info.num_heads else kv, select)
        for attr in p.count_attrs:
            _set(module, attr, len(keep))
        for attr in p.width_attrs:
            _set(module, attr, len(keep) * d)
        for attr in p.kv_count_attrs:
            _set(module, attr, len(kv))
        if p.groups_attr is not None and len(kv):
            _set(module, p.groups_attr, len(keep) // len(kv))
        if p.headless and len(keep) == 0:
            target = _get(module, p.core) if p.core else module
            switch_class(target, self.headless_class_of(target, p))

    def headless_class_of(self, target: nn.Module, p: Proposal) -> str:
        """Declare (once) the head-less form of `target`'s class: `core.headless_forward`, with the output projection
        inside it (a site holding its projections) or applied by its caller (the BERT layout)."""
        base = type(target)
        name = re.sub(r"\W", "_", f"Headless{base.__name__}_{self.model_types[0]}")
        out = None if p.core else p.out
        return define_headless(name, lambda: base, out, "_pt_discovered_head_dim", cache_kwargs=self.cache_kwargs,
                               head_dim_value=p.head_dim)

    @staticmethod
    def _per_head_size(module: nn.Module, path: str, dim: int) -> int:
        part = _get(module, path)
        return len(part) if isinstance(part, nn.ModuleList) else part.shape[dim]

    @staticmethod
    def _select_per_head(module: nn.Module, path: str, dim: int, index: torch.Tensor, select) -> None:
        part = _get(module, path)
        if isinstance(part, nn.ModuleList):
            _set(module, path, nn.ModuleList([part[i] for i in index.tolist()]))
        else:
            select(part, dim, index)


def adapter_from_description(description: dict) -> type[DiscoveredAdapter]:
    """The adapter class a `DiscoveredAdapter.description()` describes (not registered)."""
    model_type = description["model_type"]
    proposals = {p["module_class"]: Proposal.from_dict(p) for p in description["proposals"]}
    return type(f"Discovered_{model_type}", (DiscoveredAdapter,), {
        "name": f"discovered:{model_type}", "model_types": (model_type,), "proposals": proposals,
        "proposal": next(iter(proposals.values())), "module_classes": tuple(proposals),
        "original": dict(description.get("original_heads", {})),
    })


def register_description(description: dict) -> None:
    """Register the adapter a pruned directory recorded (`load_pruned`), unless its model type has one already."""
    if not any(description["model_type"] in a.model_types for a in _ADAPTERS):
        register(adapter_from_description(description))


def discover_adapter(model: nn.Module, inputs: dict | None = None, register_it: bool = True) -> type:
    """Propose, prove and (by default) register an adapter for `model`'s `config.model_type`.

    Args:
        model: a model whose `model_type` no adapter handles (it must have a `config` with `model_type`).
        inputs: probe inputs (`model(**inputs)` must run); default: built from the config (`probe_inputs`).
        register_it: register the proven adapter, so that `find_heads`, `HeadMask` and `shrink` accept the model.

    Returns:
        The adapter class (a `DiscoveredAdapter` subclass).

    Raises:
        ValueError: no candidate site, or a failed self-check (naming the module and, when recognised, the reason).
    """
    from prunetrain.engine.families.discovery_check import prove

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not model_type:
        raise ValueError(f"model: {type(model).__name__} has no config.model_type to register an adapter under.")
    if register_it and any(model_type in a.model_types for a in _ADAPTERS):
        raise ValueError(f"model: model_type {model_type!r} already has an adapter; discovery is for model types "
                         f"without one (pass register_it=False to only check).")
    inputs = probe_inputs(model) if inputs is None else inputs
    was_training = model.training
    model.eval()
    try:
        proposals, heads = propose(model, inputs)
        if not proposals:
            raise ValueError(f"model: discovery found no module in {type(model).__name__} whose Linear layers run as "
                             f"q/k/v (or one fused qkv) and an output projection taking the concatenated heads, with "
                             f"a head count ({', '.join(HEAD_COUNT_ATTRS)}, a head_dim or the config's "
                             f"num_attention_heads); it cannot be pruned by discovery.")
        cls = prove(model, inputs, model_type, proposals, heads)
    finally:
        model.train(was_training)
    if register_it:
        register(cls)
    return cls
