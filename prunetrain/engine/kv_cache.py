"""Cached generation through a self-attention site with no heads left.

A shrunk self-attention site with zero heads still writes its keys and values to the KV cache, as
`[batch, 0 heads, positions, head_dim]` tensors. transformers' `DynamicLayer.get_seq_length` treats any cache
layer whose keys have `numel() == 0` as empty and reports 0 cached positions, and the model reads the cache length
from layer 0 to place new tokens (position ids, `cache_position`, the causal mask). So a model whose *first*
self-attention layer lost every head would generate with every new token at position 0.

`track_headless_cache(model)` fixes this where the cache is filled: a forward hook on each head-less self-attention
site turns that site's cache layer into a `HeadlessDynamicLayer`, which counts positions from the keys' position
axis (its length is right even when the head axis is 0). No other layer, and no other cache, is touched; cached
generation is then token-for-token what the masked model generates (tests/test_kv_cache.py).
`shrink` calls it, so every shrunk or loaded model (`load_pruned` shrinks) has it.
"""

from __future__ import annotations

from torch import nn

SELF_KINDS = ("self", "decoder_self")


def _dynamic_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


def _filled(self) -> bool:
    return self.is_initialized and self.keys is not None and self.keys.dim() == 4


def _get_seq_length(self) -> int:
    return self.keys.shape[-2] if _filled(self) else 0


def _batch_repeat_interleave(self, repeats: int) -> None:
    if _filled(self):
        self.keys = self.keys.repeat_interleave(repeats, dim=0)
        self.values = self.values.repeat_interleave(repeats, dim=0)


def _batch_select_indices(self, indices) -> None:
    if _filled(self):
        self.keys = self.keys[indices, ...]
        self.values = self.values[indices, ...]


def _declare():
    from prunetrain.engine.families.core import define_subclass

    return define_subclass(
        "HeadlessDynamicLayer", _dynamic_layer_class, get_seq_length=_get_seq_length,
        batch_repeat_interleave=_batch_repeat_interleave, batch_select_indices=_batch_select_indices,
        __doc__="Cache layer of a self-attention site with no heads: keys/values are `[B, 0, T, d]`, so the length "
                "is `keys.shape[-2]`, not 'empty because numel() == 0'.")


def headless_layer_class() -> type:
    """`HeadlessDynamicLayer`: a `DynamicLayer` whose length is the keys' position axis even with 0 heads (a class
    declared with `prunetrain.engine.families.core.define_subclass`, built on first use so that importing prunetrain
    does not import transformers; cache layers are switched to it in place, the engine's one mechanism)."""
    from prunetrain.engine.families.core import declared_subclass

    return declared_subclass(_declare())


class _CacheMarker:
    """Forward hook of a head-less self-attention site: make its cache layer count positions correctly.

    `cache_kwargs`: the keywords under which this family passes the cache (the adapter's `cache_kwargs`)."""

    def __init__(self, cache_kwargs: tuple[str, ...]):
        self.cache_kwargs = tuple(cache_kwargs)

    def __call__(self, module: nn.Module, args, kwargs, output) -> None:
        from prunetrain.engine.families.core import cache_argument, switch_class

        cache = cache_argument(kwargs, self.cache_kwargs)
        index = getattr(module, "layer_idx", None)
        if cache is None or index is None:
            return
        cache = getattr(cache, "self_attention_cache", cache)  # an EncoderDecoderCache's self-attention part
        layers = getattr(cache, "layers", None)
        if layers is None or index >= len(layers):
            return
        if type(layers[index]) is _dynamic_layer_class():
            switch_class(layers[index], _declare())


def track_headless_cache(model: nn.Module) -> list[str]:
    """Hook every self-attention site of `model` that has no heads (idempotent); returns their names.

    Args:
        model: a (shrunk) model supported by `find_heads`.
    """
    from prunetrain.engine.heads import attention_sites

    hooked = []
    for site in attention_sites(model):
        if site.info.num_heads != 0 or site.info.kind not in SELF_KINDS:
            continue
        module = site.module
        if not any(isinstance(hook, _CacheMarker) for hook in module._forward_hooks.values()):
            module.register_forward_hook(_CacheMarker(site.adapter.cache_kwargs), with_kwargs=True)
        hooked.append(site.info.name)
    return hooked
