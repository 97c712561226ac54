"""prunetrain: prune attention heads and FFN neurons during training of PyTorch / Hugging Face transformer models.

Engine (one for both units: heads and FFN neurons):
    find_heads(model) -> HeadLayout      every attention site: name, kind, layer, heads, head_dim, kv heads
    find_neurons(model), find_sites(model, units=("heads", "neurons"))   FFN sites (neurons), or both kinds
    HeadMask                              keep value ξ per unit, applied by hooks on the output projections
    shrink(model, mask, optimizer=None)   physically remove masked units in place (optimizer state sliced)
    save_pruned / load_pruned             HF files + per-site layout, no pickles
Michel et al. (2019):  head_importance, HeadScores, select_heads, iterative_prune, pruning_curve (Ranking,
                       HeadScope)
Voita et al. (2019):   HardConcreteGates
Trainer callbacks:     HeadPruningCallback, PruningCurveCallback, HardConcreteCallback, MetricPointsCallback,
                       FlopCooldownCallback, TrainTimeCooldownCallback (TrainTime), DistillationCallback; their
                       options: Schedule (when), Heads (which), Importance (how), Output (where), CurveSweep,
                       GateTraining; SmoothedCrossEntropy (a Trainer's label-smoothed loss in one kernel);
                       FiniteGuard (stops a run at its first non-finite gradient: TrainingDiverged)
"""

from prunetrain.engine.families import FamilyAdapter, FeedForward, register, supported_families
from prunetrain.engine.heads import KINDS, NEURON_KINDS, UNITS, HeadLayout, HeadSite, find_heads, find_neurons, find_sites
from prunetrain.engine.mask import HeadMask, attached_masks
from prunetrain.engine.persist import load_pruned, save_pruned
from prunetrain.engine.shrink import shrink

__version__ = "0.1.0"

_LAZY = {
    # importance and policies
    "HeadScores": "prunetrain.methods.importance", "head_importance": "prunetrain.methods.importance",
    "ablation_scores": "prunetrain.methods.importance", "confidence_scores": "prunetrain.methods.importance",
    "random_scores": "prunetrain.methods.importance", "get_scorer": "prunetrain.methods.importance",
    "register_scorer": "prunetrain.methods.importance", "Scorer": "prunetrain.methods.importance",
    "SCORERS": "prunetrain.methods.importance", "GradientScorer": "prunetrain.methods.importance",
    "AblationScorer": "prunetrain.methods.importance", "ConfidenceScorer": "prunetrain.methods.importance",
    "RandomScorer": "prunetrain.methods.importance", "PruneResult": "prunetrain.methods.selection", "PruneStep": "prunetrain.methods.selection",
    "select_heads": "prunetrain.methods.selection", "iterative_prune": "prunetrain.methods.selection",
    "pruning_curve": "prunetrain.methods.curve", "Curve": "prunetrain.methods.curve",
    "Ranking": "prunetrain.methods.curve", "HeadScope": "prunetrain.methods.curve",
    # gates
    "HardConcreteGates": "prunetrain.methods.gates",
    # callbacks (import transformers' Trainer machinery only when asked for)
    "HeadPruningCallback": "prunetrain.training.head_pruning", "PruningCurveCallback": "prunetrain.training.pruning_curve",
    "HardConcreteCallback": "prunetrain.training.hard_concrete", "restore_layout": "prunetrain.training.state",
    "last_complete_checkpoint": "prunetrain.training.state",
    "MetricPointsCallback": "prunetrain.training.metric_points",
    "FlopCooldownCallback": "prunetrain.training.cooldown",
    "TrainTimeCooldownCallback": "prunetrain.training.cooldown", "TrainTime": "prunetrain.training.training_clock",
    "DistillationCallback": "prunetrain.training.distillation",
    "SmoothedCrossEntropy": "prunetrain.training.loss",
    "FiniteGuard": "prunetrain.training.finite", "TrainingDiverged": "prunetrain.training.finite",
    "Schedule": "prunetrain.training.options", "Heads": "prunetrain.training.options",
    "Importance": "prunetrain.training.options", "Output": "prunetrain.training.options",
    "CurveSweep": "prunetrain.training.options", "GateTraining": "prunetrain.training.options",
    # benchmarks
    "benchmark": "prunetrain.bench", "BenchResult": "prunetrain.bench", "BenchConfig": "prunetrain.bench",
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
    "KINDS", "NEURON_KINDS", "UNITS", "FamilyAdapter", "FeedForward", "HeadLayout", "HeadMask", "HeadSite",
    "attached_masks", "find_heads", "find_neurons", "find_sites", "load_pruned",
    "register", "save_pruned", "shrink", "supported_families", *_LAZY,
]
