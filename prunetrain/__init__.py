"""prunetrain: prune attention heads during training of PyTorch / Hugging Face transformer models.

Head engine:
    find_heads(model) -> HeadLayout      every attention site: name, kind, layer, heads, head_dim, kv heads
    HeadMask                              keep value ξ_h per head, applied by hooks on the output projections
    shrink(model, mask, optimizer=None)   physically remove masked heads in place (optimizer state sliced)
    save_pruned / load_pruned             HF files + per-site head layout, no pickles
Michel et al. (2019):  head_importance, HeadScores, select_heads, iterative_prune, pruning_curve
Voita et al. (2019):   HardConcreteGates
Trainer callbacks:     HeadPruningCallback, PruningCurveCallback, HardConcreteCallback
"""

from prunetrain.families import FamilyAdapter, register, supported_families
from prunetrain.heads import KINDS, HeadLayout, HeadSite, find_heads
from prunetrain.mask import HeadMask, attached_masks
from prunetrain.persist import load_pruned, save_pruned
from prunetrain.shrink import shrink
import prunetrain.fairseq_interop  # noqa: E402,F401  registers the FSMT / fairseq adapters (fairseq imported lazily)

__version__ = "0.1.0"

_LAZY = {
    # importance and policies
    "HeadScores": "prunetrain.importance", "head_importance": "prunetrain.importance",
    "ablation_scores": "prunetrain.importance", "confidence_scores": "prunetrain.importance",
    "random_scores": "prunetrain.importance", "get_scorer": "prunetrain.importance",
    "register_scorer": "prunetrain.importance", "Scorer": "prunetrain.importance",
    "SCORERS": "prunetrain.importance", "GradientScorer": "prunetrain.importance",
    "AblationScorer": "prunetrain.importance", "ConfidenceScorer": "prunetrain.importance",
    "RandomScorer": "prunetrain.importance", "PruneResult": "prunetrain.selection", "PruneStep": "prunetrain.selection",
    "select_heads": "prunetrain.selection", "iterative_prune": "prunetrain.selection",
    "pruning_curve": "prunetrain.curve", "Curve": "prunetrain.curve",
    # gates
    "HardConcreteGates": "prunetrain.gates",
    # callbacks (import transformers' Trainer machinery only when asked for)
    "HeadPruningCallback": "prunetrain.callbacks", "PruningCurveCallback": "prunetrain.callbacks",
    "HardConcreteCallback": "prunetrain.callbacks", "restore_layout": "prunetrain.callbacks",
    # benchmarks
    "benchmark": "prunetrain.bench", "BenchResult": "prunetrain.bench",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prunetrain' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "KINDS", "FamilyAdapter", "HeadLayout", "HeadMask", "HeadSite", "attached_masks", "find_heads", "load_pruned",
    "register", "save_pruned", "shrink", "supported_families", *_LAZY,
]
