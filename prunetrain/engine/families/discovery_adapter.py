"""Structural discovery, step 3: the adapter built from proven proposals (`DiscoveredAdapter`) and rebuilt from the
description a pruned directory records (`adapter_from_description`; see `prunetrain.engine.families.discovery`).
"""

from __future__ import annotations

import json
import re

import torch
from torch import nn

from prunetrain.engine.families.core import (LinearAttentionAdapter, _get, _layer_index, _set,
                                             class_names, define_headless, head_rows, select_linear_in,
                                             select_linear_out, switch_class)
from prunetrain.engine.families.discovery_ffn import FfnProposal
from prunetrain.engine.families.discovery_propose import Proposal, _has
from prunetrain.engine.heads import AttentionSite, HeadSite


UNPROVEN_KEYS = ("_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "auto_map",
                 "model_type", "_commit_hash")
"""Config entries that cannot change how attention computes (names, versions, storage dtype); `config_fingerprint`
leaves them out, and every `prunetrain*` entry (the layout a shrink records)."""


def config_fingerprint(model: nn.Module) -> str:
    """The model's configuration as one JSON string (without `UNPROVEN_KEYS`): a discovered adapter is proven per
    fingerprint, since the same model type may compute differently under another configuration (CodeGen's fused
    projection is laid out per head only when its head count equals its 4 model-parallel shards)."""
    config = getattr(model, "config", None)
    values = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config)) if config is not None else {}
    kept = {k: v for k, v in values.items() if k not in UNPROVEN_KEYS and not str(k).startswith("prunetrain")}
    return json.dumps(kept, sort_keys=True, default=repr)


_prover: list = []  # the self-check `ensure_proven` runs (`discovery_check.prove_again`, installed by `set_prover`)


def set_prover(prove_again) -> None:
    """Install the self-check a discovered adapter runs on a model of a configuration it was not proven on
    (`discovery_check` installs it; this module does not import it, so the engine has no import circle)."""
    _prover[:] = [prove_again]


class DiscoveredAdapter(LinearAttentionAdapter):
    """An adapter built from proposals (subclassed per model type by `adapter_from_description`).

    `proven` holds the configurations (`config_fingerprint`) it passed its self-check on; `sites` proves it again
    (`discovery_check.prove_again`) on a model of any other configuration before it touches it, and refuses the model
    if it fails. None (a pruned directory written before configurations were recorded): not checked."""

    proposals: dict[str, Proposal] = {}
    proposal: Proposal | None = None  # the first (usually only) one
    original: dict[str, int] = {}  # site path -> heads when discovered
    proven: frozenset[str] | None = frozenset()
    ffn_proposals: tuple = ()  # `discovery_ffn.FfnProposal`s proven beside the attention (their `ffn`)

    def description(self) -> dict:
        """Everything that rebuilds this adapter (JSON): recorded in pruned directories."""
        proven = None if self.proven is None else sorted(self.proven)
        return {"model_type": self.model_types[0], "proposals": [p.to_dict() for p in self.proposals.values()],
                "original_heads": dict(self.original), "proven_configs": proven,
                "ffn": [p.to_dict() for p in self.ffn_proposals], "ffn_refusal": self.ffn_refusal}

    def proposal_of(self, module: nn.Module) -> Proposal:
        return next(self.proposals[c] for c in class_names(module) if c in self.proposals)

    def ensure_proven(self, model: nn.Module) -> None:
        """Prove this adapter on `model`'s configuration unless it was proven on it (class docstring)."""
        if self.proven is None:
            return
        key = config_fingerprint(model)
        if key in self.proven:
            return
        if not _prover:
            raise ValueError(f"model: the adapter discovered for model_type {self.model_types[0]!r} was proven on "
                             f"another configuration; import prunetrain.engine.families.discovery to check it here.")
        cls = type(self)
        cls.proven = cls.proven | {key}  # the check's own calls of `sites` (on a copy of `model`) must not recurse
        try:
            _prover[0](self, model)
        except BaseException:
            cls.proven = cls.proven - {key}
            raise

    def neuron_sites(self, model: nn.Module) -> list[AttentionSite]:
        self.ensure_proven(model)
        return super().neuron_sites(model)

    def sites(self, model: nn.Module) -> list[AttentionSite]:
        self.ensure_proven(model)
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
        for attr in p.attrs.count_attrs:
            _set(module, attr, len(keep))
        for attr in p.attrs.width_attrs:
            _set(module, attr, len(keep) * d)
        for attr in p.attrs.kv_count_attrs:
            _set(module, attr, len(kv))
        if p.attrs.groups_attr is not None and len(kv):
            _set(module, p.attrs.groups_attr, len(keep) // len(kv))
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
    ffn = tuple(FfnProposal.from_dict(p) for p in description.get("ffn") or ())
    refusal = description.get("ffn_refusal") or (None if ffn else "the adapter discovered for it records no FFN "
                                                 "(discovered before prunetrain discovered FFNs: run discovery again)")
    return type(f"Discovered_{model_type}", (DiscoveredAdapter,), {
        "ffn_proposals": ffn, "ffn": tuple(p.feed_forward() for p in ffn) or None, "ffn_refusal": refusal,
        "name": f"discovered:{model_type}", "model_types": (model_type,), "proposals": proposals,
        "proposal": next(iter(proposals.values())), "module_classes": tuple(proposals),
        "original": dict(description.get("original_heads", {})),
        "proven": (frozenset(description["proven_configs"]) if description.get("proven_configs") is not None
                   else None),
    })
