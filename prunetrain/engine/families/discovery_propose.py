"""Structural discovery, step 1: propose. One probe forward records the order in which every `nn.Linear` runs;
the modules whose Linear layers run as q, k, v (or one fused qkv) and an output projection taking the concatenated
heads become `Proposal`s, one per attention module class, with the head count and every attribute a shrink must
rewrite (`prunetrain.engine.families.discovery` describes the whole procedure, `discovery_check` proves a proposal,
`discovery_adapter` turns a proven one into an adapter).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch
from torch import nn

from prunetrain.engine.families.core import _get

HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_attn_heads", "heads", "nhead")
HEAD_DIM_ATTRS = ("head_dim", "head_size", "attention_head_size", "d_head", "dim_head", "key_value_proj_dim")
CONFIG_HEAD_COUNTS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
WIDTH_ATTRS = ("all_head_size", "inner_dim", "inner_size")
KV_COUNT_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head")
GROUP_ATTRS = ("num_key_value_groups", "n_rep", "num_queries_per_kv")
FUSED_LAYOUTS = ("blocks", "interleaved")


@dataclass(frozen=True)
class ShrinkAttrs:
    """The integer attributes of a site module that a shrink rewrites (paths relative to the site module).

    Args:
        count_attrs: set to the new head count.
        width_attrs: set to the new heads' width (`heads × head_dim`).
        kv_count_attrs: set to the new key/value head count.
        groups_attr: the query-heads-per-key/value-head attribute, if any.
    """

    count_attrs: tuple[str, ...] = ()
    width_attrs: tuple[str, ...] = ()
    kv_count_attrs: tuple[str, ...] = ()
    groups_attr: str | None = None


@dataclass(frozen=True)
class Proposal:
    """How the sites of one attention module class hold their heads; every path is relative to the site module.
    Built by discovery (`propose`, `Proposal.from_dict`), never by hand.

    Args:
        module_class: the site module's class name.
        head_dim: size of each head.
        projections: q/k/v projections in call order (one: fused).
        out: the output projection (its input is the concatenation of the heads).
        count_from: where the head count was read ("num_heads", "head_dim", "config.num_attention_heads", ...).
        fused_layout: "blocks" (`[q | k | v]`) or "interleaved" (`[H, 3, d]`) for a fused projection, else "".
        attrs: the integer attributes a shrink rewrites (`ShrinkAttrs`).
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
    attrs: ShrinkAttrs = ShrinkAttrs()
    per_head: tuple[tuple[str, int], ...] = ()
    headless: bool = False

    def with_width_attrs(self, width_attrs: tuple[str, ...]) -> "Proposal":
        """The same proposal with other width attributes (the readings `variants` tries)."""
        return dataclasses.replace(self, attrs=dataclasses.replace(self.attrs, width_attrs=width_attrs))

    @property
    def count_attr(self) -> str:
        """Where the head count came from (kept for messages)."""
        return self.count_from

    @property
    def core(self) -> str:
        """Path of the module holding the q/k/v projections ("" when it is the site itself)."""
        return self.projections[0].rpartition(".")[0]

    def to_dict(self) -> dict:
        """One flat record (the attributes' fields beside the others, as pruned directories have always held it)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "attrs"}
        data.update(dataclasses.asdict(self.attrs))
        return {k: [list(x) for x in v] if k == "per_head" else list(v) if isinstance(v, tuple) else v
                for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Proposal":
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        attrs = ShrinkAttrs(**{f.name: data.pop(f.name) for f in dataclasses.fields(ShrinkAttrs) if f.name in data})
        return cls(**{**data, "attrs": attrs,
                      "per_head": tuple((str(path), int(dim)) for path, dim in data.get("per_head", ()))})


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
        attrs=ShrinkAttrs(
            count_attrs=(core + count_from,) if is_attr else (),
            width_attrs=tuple(core + n for n, v in vars(holder).items() if isinstance(v, int) and not isinstance(
                v, bool) and v == width and not n.startswith("_")),
            kv_count_attrs=tuple(core + n for n in KV_COUNT_ATTRS if n in vars(holder)),
            groups_attr=core + groups[0] if groups else None),
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
        if dataclasses.replace(known.with_width_attrs(()), per_head=()) != dataclasses.replace(
                proposal.with_width_attrs(()), per_head=()):
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
    given = proposal.attrs.width_attrs
    widths = list(dict.fromkeys([given, tuple(a for a in given if a.rsplit(".", 1)[-1] in WIDTH_ATTRS)]))
    per_head = list(dict.fromkeys([proposal.per_head, ()]))
    for layout, width, parts, headless in itertools.product(layouts, widths, per_head, (False, True)):
        yield dataclasses.replace(proposal.with_width_attrs(width), fused_layout=layout, per_head=parts,
                                  headless=headless)
