"""Structural discovery: an adapter for a model type that no adapter names, proposed from the model's structure and
proven on a probe input before it is trusted.

`discover_adapter(model, inputs)`:

1. **Propose.** A module is a candidate site when it has a head-count attribute (`num_heads`, `num_attention_heads`,
   `n_head`, `n_heads`, ...) and owns `nn.Linear` children. One probe forward records the order in which those
   children run: the last one is the output projection (its input is the concatenated heads, so
   `head_dim = in_features / num_heads`); the others are the q/k/v projections (outputs `H·d` for queries and
   `H_kv·d` for keys/values, grouped-query attention included) or one fused projection (`3·H·d`, tried as
   `[q | k | v]` blocks and as per-head interleaved `[H, 3, d]`).
2. **Prove.** On a copy of the model and the probe input: an all-ones mask must leave the output bit-identical; a
   random mask (about half the heads, whole key/value groups) must give masked == shrunk (max |Δ| ≤ 1e-5), and so
   must a mask that removes every head of one site. A failure is a `ValueError` naming the module and what did not
   match; nothing is registered then.
3. **Register** (default): `find_heads`, `HeadMask`, `shrink`, importance and the callbacks then work on the model.

The proposal is the common Linear layout's adapter (`LinearAttentionAdapter`); where it does not fit, write one by
hand in a few lines (see `prunetrain.engine.families.core`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from prunetrain.engine.families.core import (_ADAPTERS, LinearAttentionAdapter, _get, head_rows, register,
                                             select_linear_in, select_linear_out)
from prunetrain.engine.heads import AttentionSite

HEAD_COUNT_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_attn_heads", "heads", "nhead")
HEAD_DIM_ATTRS = ("head_dim", "head_size", "attention_head_size", "d_head", "dim_head", "key_value_proj_dim")
WIDTH_ATTRS = ("all_head_size", "inner_dim", "inner_size")
KV_COUNT_ATTRS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_kv_head")
GROUP_ATTRS = ("num_key_value_groups", "n_rep", "num_queries_per_kv")
TOL = 1e-5


@dataclass(frozen=True)
class Proposal:
    """One group of candidate sites (all modules of one class): where the adapter will look.

    Args:
        module_class: the attention module's class name.
        paths: module paths of the candidate sites.
        count_attr: the head-count attribute.
        head_dim: size of each head (out projection in-features / heads).
        projections: child names of the q/k/v projections in call order (one name: fused).
        out: child name of the output projection.
        fused_layout: "blocks" (`[q | k | v]`) or "interleaved" (`[H, 3, d]`) for a fused projection, else "".
    """

    module_class: str
    paths: tuple[str, ...]
    count_attr: str
    head_dim: int
    projections: tuple[str, ...]
    out: str
    fused_layout: str = ""


def _int_attr(module: nn.Module, names) -> tuple[str, int] | None:
    for name in names:
        value = module.__dict__.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _call_order(model: nn.Module, inputs: dict, candidates: dict[str, nn.Module]) -> dict[str, list[str]]:
    """Per candidate module: the names of its Linear children in the order the probe forward runs them."""
    order: dict[str, list[str]] = {path: [] for path in candidates}
    handles = []
    for path, module in candidates.items():
        for child_name, child in module.named_children():
            if isinstance(child, nn.Linear):
                def hook(mod, args, path=path, child_name=child_name):
                    if child_name not in order[path]:
                        order[path].append(child_name)
                handles.append(child.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return order


def propose(model: nn.Module, inputs: dict) -> list[Proposal]:
    """Candidate attention sites of `model`, grouped by module class (see the module docstring, step 1).

    Args:
        model: the model (in eval mode).
        inputs: probe inputs, `model(**inputs)` must run.
    """
    candidates = {path: m for path, m in model.named_modules()
                  if path and _int_attr(m, HEAD_COUNT_ATTRS)
                  and sum(isinstance(c, nn.Linear) for c in m.children()) >= 2}
    order = _call_order(model, inputs, candidates)
    groups: dict[tuple, list[str]] = {}
    for path, module in candidates.items():
        called = order[path]
        if len(called) < 2:
            continue
        count_attr, heads = _int_attr(module, HEAD_COUNT_ATTRS)
        out = called[-1]
        width = getattr(module, out).in_features
        if width % heads:
            continue
        d = width // heads
        projections = tuple(c for c in called[:-1] if getattr(module, c).out_features % d == 0)
        if len(projections) == 1 and getattr(module, projections[0]).out_features != 3 * width:
            continue
        if len(projections) not in (1, 3):
            continue
        key = (type(module).__name__, count_attr, d, projections, out)
        groups.setdefault(key, []).append(path)
    return [Proposal(module_class=k[0], paths=tuple(p), count_attr=k[1], head_dim=k[2], projections=k[3], out=k[4],
                     fused_layout="blocks" if len(k[3]) == 1 else "")
            for k, p in groups.items()]


class DiscoveredAdapter(LinearAttentionAdapter):
    """An adapter built from a `Proposal` (subclassed per model type by `discover_adapter`)."""

    proposal: Proposal

    _original: int = 0

    def original_num_heads(self, model, kind):
        return self._original

    def head_dim(self, module):
        return self.proposal.head_dim

    def head_counts(self, module, d):
        p = self.proposal
        heads = getattr(module, p.out).in_features // d
        if len(p.projections) == 1:
            return heads, heads
        kv = min(getattr(module, name).out_features for name in p.projections) // d
        return heads, kv

    def group_size(self, module, num_heads, num_kv):
        return num_heads // num_kv if num_kv > 1 else 1

    def remove_heads(self, site: AttentionSite, keep: torch.Tensor, select) -> None:
        p, d, module = self.proposal, site.info.head_dim, site.module
        q_rows = head_rows(keep, d)
        kv = self.kv_heads_kept(site, keep)
        if len(p.projections) == 1:
            width = site.info.num_heads * d
            rows = (torch.cat([q_rows, q_rows + width, q_rows + 2 * width]) if p.fused_layout == "blocks"
                    else head_rows(keep, 3 * d))
            select_linear_out(getattr(module, p.projections[0]), rows, select)
        else:
            for name in p.projections:
                proj = getattr(module, name)
                select_linear_out(proj, q_rows if proj.out_features == site.info.num_heads * d else head_rows(kv, d),
                                  select)
        select_linear_in(getattr(module, p.out), q_rows, select)
        self.set_counts(site, len(keep), len(kv))


def _adapter_class(model_type: str, proposal: Proposal, module: nn.Module) -> type[DiscoveredAdapter]:
    heads = int(getattr(module, proposal.count_attr))
    width = heads * proposal.head_dim
    width_attrs = tuple(n for n in WIDTH_ATTRS if module.__dict__.get(n) == width)
    kv_counts = tuple(n for n in KV_COUNT_ATTRS if n in module.__dict__)
    groups = _int_attr(module, GROUP_ATTRS)
    return type(f"Discovered_{model_type}", (DiscoveredAdapter,), {
        "name": f"discovered:{model_type}", "model_types": (model_type,), "proposal": proposal,
        "module_classes": (proposal.module_class,), "out": proposal.out, "count_attrs": (proposal.count_attr,),
        "width_attrs": width_attrs, "kv_count_attrs": kv_counts, "groups_attr": groups[0] if groups else None,
        "_original": heads,
    })


def _select(param: nn.Parameter, dim: int, index: torch.Tensor) -> None:
    param.data = param.data.index_select(dim, index.to(param.device)).contiguous()


def _output(out) -> torch.Tensor:
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0] if isinstance(out, (tuple, list)) else out


def _run(model, inputs, keeps=None, sites=None) -> torch.Tensor:
    from prunetrain.engine.mask import scale_heads

    handles = []
    for site in (sites or []) if keeps is not None else []:
        keep, d = keeps[site.info.name], site.info.head_dim
        handles.append(site.out_proj.register_forward_pre_hook(
            lambda m, args, keep=keep, d=d: (scale_heads(args[0], keep, d), *args[1:])))
    try:
        with torch.no_grad():
            return _output(model(**inputs))
    finally:
        for handle in handles:
            handle.remove()


def _random_keeps(sites, seed: int, empty: str | None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    keeps = {}
    for site in sites:
        g = site.info.group_size
        groups = site.info.num_heads // g
        alive = torch.rand(groups, generator=gen) >= 0.5
        if not alive.any():
            alive[0] = True
        if alive.all() and groups > 1:
            alive[-1] = False
        keep = alive.repeat_interleave(g).float()
        keeps[site.info.name] = torch.zeros_like(keep) if site.info.name == empty else keep
    return keeps


def _masked_vs_shrunk(adapter, model, inputs, keeps) -> tuple[str | None, float]:
    """(None, max |Δ|) if masked == shrunk for `keeps`, else (what failed, Δ)."""
    twin = copy.deepcopy(model)
    sites = adapter.sites(twin)
    masked = _run(twin, inputs, keeps, sites)
    try:
        for site in sites:
            keep = torch.nonzero(keeps[site.info.name]).flatten()
            if len(keep) < site.info.num_heads:
                adapter.remove_heads(site, keep, _select)
        shrunk = _run(twin, inputs)
    except Exception as err:  # the shrunk module's own forward could not run: report it, with its message
        return f"the shrunk model's forward raised {type(err).__name__}: {str(err).splitlines()[0][:200]}", float("nan")
    if shrunk.shape != masked.shape:
        return f"shrunk output shape {tuple(shrunk.shape)} != masked {tuple(masked.shape)}", float("nan")
    delta = (shrunk - masked).abs().max().item()
    return (None if delta <= TOL else f"masked and shrunk outputs differ by max |Δ| = {delta:.3g} (> {TOL})"), delta


def self_check(adapter: DiscoveredAdapter, model: nn.Module, inputs: dict) -> None:
    """Prove a proposed adapter on a probe input (module docstring, step 2); `ValueError` naming the module if not.

    Args:
        adapter: the proposed adapter (not yet registered).
        model: the model (left unchanged: the checks run on copies).
        inputs: probe inputs.
    """
    sites = adapter.sites(model)
    if not sites:
        raise ValueError(f"model: discovery found no attention site in {type(model).__name__}.")
    plain = _run(model, inputs)
    ones = {s.info.name: torch.ones(s.info.num_heads) for s in sites}
    if not torch.equal(_run(model, inputs, ones, sites), plain):
        raise ValueError(f"model: discovered site {sites[0].info.name!r} ({adapter.proposal.module_class}): an "
                         f"all-ones mask on {adapter.proposal.out!r} changed the output, so it is not the output "
                         f"projection of the heads.")
    for empty in (None, sites[0].info.name):
        keeps = _random_keeps(sites, seed=0, empty=empty)
        failure, _ = _masked_vs_shrunk(adapter, model, inputs, keeps)
        if failure is None:
            continue
        culprit = sites[0].info.name  # name the first site that fails on its own
        for site in sites:
            alone = {s.info.name: (keeps[s.info.name] if s is site else torch.ones(s.info.num_heads)) for s in sites}
            if _masked_vs_shrunk(adapter, model, inputs, alone)[0] is not None:
                culprit = site.info.name
                break
        what = "with every head of one site removed, " if empty else ""
        raise ValueError(f"model: discovered site {culprit!r} ({adapter.proposal.module_class}, heads from "
                         f"{adapter.proposal.count_attr!r}, projections {list(adapter.proposal.projections)} -> "
                         f"{adapter.proposal.out!r}) failed its self-check: {what}{failure}. Register an adapter "
                         f"for it by hand (see prunetrain.engine.families.core).")


def _probe_inputs(model: nn.Module) -> dict:
    vocab = getattr(model.config, "vocab_size", None)
    if not vocab:
        raise ValueError(f"inputs: {type(model).__name__} has no config.vocab_size, so no probe input can be made; "
                         f"pass inputs=... (a dict model(**inputs) accepts).")
    gen = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(min(3, vocab - 1), vocab, (2, 8), generator=gen)}


def discover_adapter(model: nn.Module, inputs: dict | None = None, register_it: bool = True) -> type:
    """Propose, prove and (by default) register an adapter for `model`'s `config.model_type`.

    Args:
        model: a model whose `model_type` no adapter handles (it must have a `config` with `model_type`).
        inputs: probe inputs (`model(**inputs)` must run); default: random `input_ids` of shape [2, 8].
        register_it: register the proven adapter, so that `find_heads`, `HeadMask` and `shrink` accept the model.

    Returns:
        The adapter class (a `DiscoveredAdapter` subclass).

    Raises:
        ValueError: no candidate site, candidates of several kinds, or a failed self-check (naming the module).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not model_type:
        raise ValueError(f"model: {type(model).__name__} has no config.model_type to register an adapter under.")
    if register_it and any(model_type in a.model_types for a in _ADAPTERS):
        raise ValueError(f"model: model_type {model_type!r} already has an adapter; discovery is for model types "
                         f"without one (pass register_it=False to only check).")
    inputs = _probe_inputs(model) if inputs is None else inputs
    was_training = model.training
    model.eval()
    try:
        proposals = propose(model, inputs)
        if not proposals:
            raise ValueError(f"model: discovery found no module in {type(model).__name__} with a head count "
                             f"({', '.join(HEAD_COUNT_ATTRS)}) and q/k/v/output Linear layers it runs.")
        if len(proposals) > 1:
            raise ValueError(f"model: discovery found attention sites of {len(proposals)} kinds "
                             f"({', '.join(p.module_class for p in proposals)}); register an adapter by hand.")
        proposal = proposals[0]
        layouts = ("blocks", "interleaved") if proposal.fused_layout else ("",)
        for attempt, layout in enumerate(layouts):
            proposal = Proposal(**{**proposal.__dict__, "fused_layout": layout})
            cls = _adapter_class(model_type, proposal, _get(model, proposal.paths[0]))
            try:
                self_check(cls(), model, inputs)
                break
            except ValueError:
                if attempt == len(layouts) - 1:
                    raise
    finally:
        model.train(was_training)
    if register_it:
        register(cls)
    return cls
