"""Room in torch.compile's recompile limit for the layer shapes a shrink creates.

Dynamo keeps one compiled graph per set of guards, per code object, and guards parameter shapes
(`force_parameter_static_shapes`). Every layer of a stack runs the same code (its class's `forward`, and transformers'
`GradientCheckpointingLayer.__call__` for every encoder and decoder layer alike), so a full model needs one graph per
layer class, while a model shrunk unevenly needs one per distinct *layer layout* — its parameters' shapes, which
follow the heads each of its attention sites keeps — and each layout is compiled about twice (static sizes, then
dynamic ones). Wherever the layers are compiled as their own frames (regional compilation, `layer.compile()`; or a
graph break between layers, as the recipe's model has under CUDA with torch 2.11), dynamo's `recompile_limit` (8 per
code object by default) is soon reached: it then stops compiling and runs the remaining layers eagerly, with a log
warning only. Measured on an NVIDIA H200 (benchmarks/README.md k3): the main job's 36-head model compiled with
`mode="reduce-overhead"` stepped at 0.80× the compiled full model; with the limit raised, at 1.32× (its FLOP-ideal:
1.37×).

`make_room_for_layouts(model, layout)` (called by every `shrink`) counts the distinct layer layouts this process has
shrunk models to and raises the limit (and the accumulated limit) to the value it had before plus `GRAPHS_PER_LAYOUT`
per layout, never lowering it. Graphs of earlier layouts stay in dynamo's cache after a further shrink (their guards
just fail), so the count is of every layout seen, not only the current model's.
"""

from __future__ import annotations

import logging

from torch import nn

from prunetrain.engine.heads import HeadLayout

logger = logging.getLogger("prunetrain")

GRAPHS_PER_LAYOUT = 4
"""Graphs one layer layout may need: static sizes, dynamic sizes, and room for a specialisation (a size of 1, say)."""

_LIMITS = ("recompile_limit", "accumulated_recompile_limit")
_seen_layouts: set[tuple] = set()
_base_limits: dict[str, int] = {}


def layer_layouts(model: nn.Module, layout: HeadLayout) -> set[tuple]:
    """The distinct layer layouts of `model`: (layer class, ((parameter name, shape), ...)) — what dynamo's guards
    on a layer's parameters see. A site's layer is the module at its path up to the first numeric part
    (`model.decoder.layers.3`; T5's `decoder.block.3`, whose sub-layers hold the self- and cross-attention), else its
    parent: the outermost repeated block, whose count of distinct layouts bounds that of any module inside it."""
    paths = set()
    for site in layout:
        parts = site.name.split(".")
        numeric = [i for i, part in enumerate(parts) if part.isdigit()]
        paths.add(".".join(parts[: numeric[0] + 1 if numeric else len(parts) - 1]))
    modules = dict(model.named_modules())
    return {(type(modules[path]).__qualname__,
             tuple((name, tuple(param.shape)) for name, param in modules[path].named_parameters()))
            for path in paths if path in modules}


def _dynamo_config():
    try:
        import torch._dynamo.config as config
    except ImportError:  # a torch without dynamo compiles nothing
        return None
    return config


def make_room_for_layouts(model: nn.Module, layout: HeadLayout) -> None:
    """Raise dynamo's recompile limits so every layer layout seen so far can keep its compiled graphs (module
    docstring); a limit the user set higher is left alone."""
    config = _dynamo_config()
    if config is None:
        return
    before = len(_seen_layouts)
    _seen_layouts.update(layer_layouts(model, layout))
    if len(_seen_layouts) == before:
        return
    for name in _LIMITS:
        legacy = "cache_size_limit" if name == "recompile_limit" else None  # its name before torch 2.6
        attr = name if hasattr(config, name) else legacy
        if attr is None or not hasattr(config, attr):
            continue
        base = _base_limits.setdefault(attr, int(getattr(config, attr)))
        wanted = base + GRAPHS_PER_LAYOUT * len(_seen_layouts)
        if getattr(config, attr) < wanted:
            logger.info("prunetrain: torch._dynamo.config.%s raised from %d to %d, room for the %d layer layouts "
                        "shrunk models in this process have (one compiled graph each, per size regime).",
                        attr, getattr(config, attr), wanted, len(_seen_layouts))
            setattr(config, attr, wanted)
