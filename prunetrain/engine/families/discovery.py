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
   FFN neurons are discovered and proven the same way once the attention is (`discovery_ffn`): an FFN the proof
   accepts makes the model's neurons prunable (`find_sites`), else the adapter says why they are not.
3. **Register** (default): `find_heads`, `HeadMask`, `shrink`, importance and the callbacks then work on the model.
   The adapter is pure data (`DiscoveredAdapter.description()`): a pruned directory records it, and `load_pruned`
   (so `prunetrain export`) registers it again in a fresh process.

The steps live in `discovery_propose` (1), `discovery_check` (2) and `discovery_adapter` (3); this module is the entry
point and installs `find_heads(model, discover=True)` in the registry (`prunetrain.engine.registry`).

Where the proposal does not fit, write an adapter by hand in a few lines (see `prunetrain.engine.families.core`).
"""

from __future__ import annotations

import logging

from torch import nn

from prunetrain.engine.families.core import register
from prunetrain.engine.families.discovery_adapter import DiscoveredAdapter, adapter_from_description
from prunetrain.engine.families.discovery_check import prove
from prunetrain.engine.families.discovery_propose import (CONFIG_HEAD_COUNTS, FUSED_LAYOUTS, GROUP_ATTRS,
                                                          HEAD_COUNT_ATTRS, HEAD_DIM_ATTRS, KV_COUNT_ATTRS, PROBE_BATCH,
                                                          PROBE_LENGTH, WIDTH_ATTRS, Proposal, ShrinkAttrs,
                                                          probe_inputs, propose, variants)
from prunetrain.engine.registry import handles, set_discoverer


def register_description(description: dict) -> None:
    """Register the adapter a pruned directory recorded (`load_pruned`), unless its model type has one already."""
    if not handles(description["model_type"]):
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
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not model_type:
        raise ValueError(f"model: {type(model).__name__} has no config.model_type to register an adapter under.")
    if register_it and handles(model_type):
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


def _discover_for_find_heads(model: nn.Module) -> None:
    """`find_heads(model, discover=True)`: discover and register an adapter, with one log line saying what was
    found (installed as the registry's discoverer below)."""
    adapter = discover_adapter(model)
    shapes = "; ".join(f"{p.module_class}: {'/'.join(p.projections)} -> {p.out}, heads from {p.count_from}"
                       for p in adapter.proposals.values())
    ffn = ("; FFN neurons: " + "; ".join(p.describe() for p in adapter.ffn_proposals) if adapter.ffn_proposals
           else f"; FFN neurons not prunable: {adapter.ffn_refusal}")
    logging.getLogger("prunetrain").warning(
        "prunetrain: no adapter names model_type %r; discovered one from its structure (%s%s) and proved it exact on "
        "a probe input.", model.config.model_type, shapes, ffn)


set_discoverer(_discover_for_find_heads)


__all__ = ["CONFIG_HEAD_COUNTS", "DiscoveredAdapter", "FUSED_LAYOUTS", "GROUP_ATTRS", "HEAD_COUNT_ATTRS",
           "HEAD_DIM_ATTRS", "KV_COUNT_ATTRS", "PROBE_BATCH", "PROBE_LENGTH", "Proposal", "ShrinkAttrs", "WIDTH_ATTRS",
           "adapter_from_description", "discover_adapter", "probe_inputs", "propose", "register_description",
           "variants"]
