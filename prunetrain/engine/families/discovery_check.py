"""The self-check of structural discovery: a proposed adapter is trusted only after it proved exact on a probe input.

`prove(model, inputs, model_type, proposals, heads)` tries the readings of the proposals (`discovery_propose.variants`) on a
perturbed copy of the model (`perturbed_copy`: every parameter that is not a Linear weight moved off its initial
value, so that norm weights at 1 and biases at 0 cannot hide a dependency across heads) and returns the first
adapter for which

- an all-ones mask on the output projections leaves the output bit-identical (it is the heads' concatenation),
- masked == shrunk (max |Δ| ≤ `TOL`) for a random mask (about half of the key/value groups of every site), and
- masked == shrunk with every head of one site removed.

Otherwise it raises one `ValueError` naming the first site that fails on its own and, when it recognises it, why:
a per-head tensor the model builds outside the site for all its heads (ALiBi position biases: Bloom, MPT), a
parameter of the site spanning all heads (a norm across heads: OLMoE), a fused projection laid out neither as
`[q | k | v]` nor per head (CodeGen's model-parallel blocks).

`prove_ffn` runs the same self-check for the FFN neurons `discovery_ffn.propose_ffn` proposes, once the attention is
proven, and gives the adapter its `ffn` or the reason it has none.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

from prunetrain.engine.families.core import _get
from prunetrain.engine.families.discovery_adapter import (DiscoveredAdapter, adapter_from_description,
                                                          config_fingerprint, set_prover)
from prunetrain.engine.families.discovery_ffn import propose_ffn
from prunetrain.engine.families.discovery_propose import Proposal, variants

TOL = 1e-5
PERTURBATION = (0.5, 0.1)
"""Each perturbed parameter p becomes p · (1 + 0.5 ε₁) + 0.1 ε₂ with ε ~ N(0, 1): a norm weight at 1 and a bias at 0
leave their initial values, and nothing changes scale by much."""
MAX_READINGS = 16


def perturbed_copy(model: nn.Module, seed: int = 0) -> nn.Module:
    """A deep copy of `model` whose every floating-point parameter except the Linear weights is perturbed
    (`PERTURBATION`): norm weights and biases, scales, embeddings, Linear biases."""
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    scale, shift = PERTURBATION
    with torch.no_grad():
        for module in twin.modules():
            for name, param in module.named_parameters(recurse=False):
                if (isinstance(module, nn.Linear) and name == "weight") or not param.is_floating_point():
                    continue
                param.mul_(1 + scale * torch.randn(param.shape, generator=gen).to(param))
                param.add_(shift * torch.randn(param.shape, generator=gen).to(param))
    return twin


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


def _masked_vs_shrunk(adapter, model, inputs, keeps) -> str | None:
    """None if masked == shrunk for `keeps`, else what failed."""
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
        return f"the shrunk model's forward raised {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    if shrunk.shape != masked.shape:
        return f"shrunk output shape {tuple(shrunk.shape)} != masked {tuple(masked.shape)}"
    delta = (shrunk - masked).abs().max().item()
    return None if delta <= TOL else f"masked and shrunk outputs differ by max |Δ| = {delta:.3g} (> {TOL})"


def self_check(adapter: DiscoveredAdapter, perturbed: nn.Module, inputs: dict) -> tuple[str, str] | None:
    """None if `adapter` is exact on `perturbed` (module docstring), else (the failing site, what failed)."""
    sites = adapter.sites(perturbed)
    if not sites:
        return "", f"discovery found no attention site in {type(perturbed).__name__}"
    ones = {s.info.name: torch.ones(s.info.num_heads) for s in sites}
    if not torch.equal(_run(perturbed, inputs, ones, sites), _run(perturbed, inputs)):
        return sites[0].info.name, "an all-ones mask on its output projection changed the output, so it is not the " \
                                   "output projection of the heads"
    for empty in (None, sites[0].info.name):
        keeps = _random_keeps(sites, seed=0, empty=empty)
        failure = _masked_vs_shrunk(adapter, perturbed, inputs, keeps)
        if failure is None:
            continue
        culprit = sites[0].info.name  # name the first site that fails on its own
        for site in sites:
            alone = {s.info.name: (keeps[s.info.name] if s is site else torch.ones(s.info.num_heads)) for s in sites}
            if _masked_vs_shrunk(adapter, perturbed, inputs, alone) is not None:
                culprit = site.info.name
                break
        return culprit, ("with every head of one site removed, " if empty else "") + failure
    return None


def _outside_inputs(model: nn.Module, inputs: dict, path: str) -> dict[str, tuple[int, ...]]:
    """{argument: shape} of the tensors a site receives besides its hidden states (first call)."""
    seen: dict[str, tuple[int, ...]] = {}
    module = _get(model, path)

    def hook(mod, args, kwargs):
        if not seen:
            named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
            seen.update({name: tuple(v.shape) for name, v in named[1:] if torch.is_tensor(v)})
            seen["_"] = ()

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        _run(model, inputs)
    finally:
        handle.remove()
    seen.pop("_", None)
    return seen


def reason(adapter: DiscoveredAdapter, perturbed: nn.Module, inputs: dict, culprit: str) -> str | None:
    """Why site `culprit` cannot be shrunk exactly, when the cause is one discovery recognises (module docstring)."""
    site = next(s for s in adapter.sites(perturbed) if s.info.name == culprit)
    p, heads, d = adapter.proposal_of(site.module), site.info.num_heads, site.info.head_dim
    batch = next(v.shape[0] for v in inputs.values() if torch.is_tensor(v))
    for name, shape in _outside_inputs(perturbed, inputs, culprit).items():
        if heads > 1 and any(n in (heads, batch * heads) for n in shape):
            return (f"the model hands the site {name!r} of shape {shape}, a per-head tensor built outside it for all "
                    f"{heads} heads (e.g. ALiBi position biases), which removing heads at the site cannot follow")
    owned = (*p.projections, p.out, *(path for path, _ in p.per_head))
    core = _get(site.module, p.core) if p.core else site.module  # where the heads are computed
    for module_path, module in core.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_path}.{name}" if module_path else name
            if isinstance(module, nn.Linear) or any(full.startswith(o + ".") or full == o for o in owned) \
                    or heads < 2 or param.shape[-1] not in (heads, heads * d):
                continue
            what = "spans all" if param.shape[-1] == heads * d else "holds one value for each of the"
            return (f"its parameter {full!r} of shape {tuple(param.shape)} {what} {heads} heads (e.g. a norm "
                    f"across heads, or position biases shared by the heads), and pruning cannot make the kept heads "
                    f"compute what they computed")
    if len(p.projections) == 1:
        return (f"its fused projection {p.projections[0]!r} is laid out neither as [q | k | v] blocks nor per head as "
                f"[heads, 3, head_dim]")
    for module_path, module in core.named_modules():
        counted = [k for k, v in vars(module).items() if v == heads and not isinstance(v, bool) and not k.startswith(
            "_") and f"{p.core + '.' if p.core else ''}{module_path + '.' if module_path else ''}{k}" not in p.attrs.count_attrs]
        if module_path and counted:
            return (f"its submodule {module_path!r} ({type(module).__name__}) is built for {heads} heads "
                    f"({counted[0]}={heads}), which discovery does not know how to cut with them")
    return None


def prove_ffn(adapter_cls: type, model: nn.Module, perturbed: nn.Module, inputs: dict) -> None:
    """Propose and prove `model`'s FFNs for the discovered adapter class `adapter_cls` (its attention proven):
    sets `ffn_proposals` and `ffn` when they pass the self-check, else `ffn_refusal` (`discovery_ffn`'s docstring)."""
    attention = [site.module for site in adapter_cls().sites(model)]
    try:
        proposals = propose_ffn(model, inputs, attention)
    except ValueError as err:
        adapter_cls.ffn_refusal = str(err).removeprefix("model: ")
        return
    if not proposals:
        adapter_cls.ffn_refusal = ("discovery found no FFN in it (up projections d -> w run right before a down "
                                   "projection w -> d, outside the attention sites)")
        return
    adapter_cls.ffn_proposals = tuple(proposals)
    adapter_cls.ffn, adapter_cls.ffn_refusal = tuple(p.feed_forward() for p in proposals), None
    failure = self_check(adapter_cls().neuron_adapter(), perturbed, inputs)
    if failure is not None:
        site, what = failure
        adapter_cls.ffn_proposals, adapter_cls.ffn = (), None
        adapter_cls.ffn_refusal = (f"discovery found its FFNs ({'; '.join(p.describe() for p in proposals)}) but "
                                   f"the FFN at {site!r} failed the self-check ({what.replace('head', 'neuron')})")


def prove(model: nn.Module, inputs: dict, model_type: str, proposals: list[Proposal], heads: dict[str, int]) -> type:
    """The first reading of `proposals` that passes `self_check` on a perturbed copy of `model`, as an adapter class
    (not registered); `ValueError` naming the failing site, and the reason when recognised, if none does."""
    perturbed = perturbed_copy(model)
    readings = itertools.islice(itertools.product(*(list(variants(p)) for p in proposals)), MAX_READINGS)
    first = None
    for reading in readings:
        cls = adapter_from_description({"model_type": model_type, "proposals": [p.to_dict() for p in reading],
                                        "original_heads": heads})
        cls.proven = frozenset({config_fingerprint(model)})
        failure = self_check(cls(), perturbed, inputs)
        if failure is None:
            prove_ffn(cls, model, perturbed, inputs)  # its FFN neurons too, or the reason they cannot go
            return cls
        first = first or (cls, failure)
    cls, (culprit, failure) = first
    adapter = cls()
    if not culprit:
        raise ValueError(f"model: {failure}.")
    p = adapter.proposal_of(_get(perturbed, culprit))
    where = (f"model: discovered site {culprit!r} ({p.module_class}, heads from {p.count_from!r}, projections "
             f"{list(p.projections)} -> {p.out!r})")
    why = reason(adapter, perturbed, inputs, culprit)
    verdict = (f"cannot be pruned exactly: {why} (its self-check: {failure})" if why
               else f"failed its self-check: {failure}")
    raise ValueError(f"{where} {verdict}. Register an adapter for it by hand (see prunetrain.engine.families.core).")


def prove_again(adapter: DiscoveredAdapter, model: nn.Module) -> None:
    """`self_check` of an adapter proven on another configuration, on a perturbed copy of `model`; `ValueError` naming
    the model type, the failing site and what failed if it is not exact here."""
    from prunetrain.engine.families.discovery_propose import probe_inputs

    model_type = adapter.model_types[0]
    was_training = model.training
    model.eval()
    try:
        perturbed, inputs = perturbed_copy(model), probe_inputs(model)
        failure = self_check(adapter, perturbed, inputs)
        if failure is None and adapter.ffn is not None:  # the FFN neurons it was proven to prune
            failure = self_check(adapter.neuron_adapter(), perturbed, inputs)
    except ValueError as err:
        raise ValueError(f"model: the adapter discovered for model_type {model_type!r} was proven on another "
                         f"configuration and cannot be checked on this one ({err}); unregister "
                         f"{adapter.name!r} and run discover_adapter(model, inputs) on it.") from None
    finally:
        model.train(was_training)
    if failure is not None:
        culprit, what = failure
        raise ValueError(f"model: the adapter discovered for model_type {model_type!r} was proven on another "
                         f"configuration and is not exact on this one: site {culprit!r} failed its self-check "
                         f"({what}). Register an adapter for it by hand (see prunetrain.engine.families.core).")


set_prover(prove_again)
