"""The Trainer callbacks in one import (kept for existing code; each lives in its own module):

- `HeadPruningCallback` (`prunetrain.training.head_pruning`): importance at chosen points (fractional epochs or global
  steps), pruning on a schedule, Spearman ρ of importance between consecutive points.
- `PruningCurveCallback` (`prunetrain.training.pruning_curve`): metric vs share of the heads present masked, per point.
- `TimeCapCallback` (`prunetrain.training.time_cap`): a wall-clock guard on a run defined by its steps.
- `MetricPointsCallback` (`prunetrain.training.metric_points`): a metric at chosen steps with the training-step clock
  and the step rate between shrinks.
- `FlopCooldownCallback`, `TrainTimeCooldownCallback` (`prunetrain.training.cooldown`): the learning rate decays to
  zero over the last share of the clock's FLOP or training-time budget (`budget_cooldown` picks the one it has).
- `HardConcreteCallback` (`prunetrain.training.hard_concrete`): Hard-Concrete L0 gates (Voita et al. 2019).
- `PrunetrainCallback` (`prunetrain.training.base`) and the checkpoint helpers (`prunetrain.training.state`).
"""

from prunetrain.training.base import PrunetrainCallback
from prunetrain.training.cooldown import FlopCooldownCallback, TrainTimeCooldownCallback, budget_cooldown
from prunetrain.training.hard_concrete import HardConcreteCallback
from prunetrain.training.head_pruning import HeadPruningCallback
from prunetrain.training.metric_points import MetricPointsCallback
from prunetrain.training.pruning_curve import PruningCurveCallback
from prunetrain.training.state import last_complete_checkpoint, restore_layout
from prunetrain.training.time_cap import TimeCapCallback

__all__ = ["FlopCooldownCallback", "HardConcreteCallback", "HeadPruningCallback", "MetricPointsCallback",
           "PruningCurveCallback", "PrunetrainCallback", "TimeCapCallback", "TrainTimeCooldownCallback",
           "budget_cooldown", "last_complete_checkpoint", "restore_layout"]
