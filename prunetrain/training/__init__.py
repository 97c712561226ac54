"""Trainer integration: callbacks that decide *when* to score, mask, gate or shrink heads during HF `Trainer` training,
calling the methods that decide *what*, plus the state they keep across checkpoints.

One module per callback (`head_pruning`, `pruning_curve`, `hard_concrete`, `metric_points`, `time_cap`,
`distillation`), their
options grouped in small records (`options`: `Schedule`, `Heads`, `Importance`, `Output`, `CurveSweep`,
`GateTraining`), their shared base (`base`), checkpoint and RNG state (`state`), the distributed engines
(`distributed`) and a Trainer loss (`loss`: `SmoothedCrossEntropy`)."""

from prunetrain.training.distillation import DistillationCallback
from prunetrain.training.hard_concrete import HardConcreteCallback
from prunetrain.training.head_pruning import HeadPruningCallback
from prunetrain.training.loss import SmoothedCrossEntropy
from prunetrain.training.metric_points import MetricPointsCallback
from prunetrain.training.options import CurveSweep, GateTraining, Heads, Importance, Output, Schedule
from prunetrain.training.pruning_curve import PruningCurveCallback
from prunetrain.training.state import last_complete_checkpoint, restore_layout
from prunetrain.training.time_cap import TimeCapCallback

__all__ = ["CurveSweep", "DistillationCallback", "GateTraining", "HardConcreteCallback", "HeadPruningCallback", "Heads", "Importance",
           "MetricPointsCallback", "Output", "PruningCurveCallback", "Schedule", "SmoothedCrossEntropy", "TimeCapCallback",
           "last_complete_checkpoint", "restore_layout"]
