"""The `l0-sweep` recipe kind: Hard-Concrete gate sweeps from a converged translation model (Voita et al. 2019 §6),
validated like the translation recipes (`prunetrain.mt.config.recipe`: unknown keys, types and ranges name the recipe key).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from prunetrain.mt.config.recipe_common import PRECISIONS, DataConfig, _check_header, _check_number
from prunetrain.mt.run.run_checks import check_seed
from prunetrain.utils.validate import check_choice, check_int, check_positive_float


@dataclass
class GateTrainConfig:
    steps: int = 150  # fine-tuning steps per gate run (from the converged model)
    batch_size: int = 64
    learning_rate: float = 1e-4  # model weights (constant); the gates have their own Adam
    gate_lr: float = 0.1
    lagrangian_lr: float = 0.05
    init_log_alpha: float = 3.0
    label_smoothing: float = 0.1
    precision: str = "auto"
    seed: int = 0
    logging_steps: int = 10  # heads alive per kind are traced (JSON, TensorBoard) at this interval

    def __post_init__(self):
        for key, minimum in (("steps", 1), ("batch_size", 1), ("seed", 0), ("logging_steps", 1)):
            check_int(f"train.{key}", getattr(self, key), minimum)
        check_seed("train.seed", self.seed)
        _check_number("train.learning_rate", self.learning_rate, 0.0)  # 0: only the gates learn
        check_positive_float("train.gate_lr", self.gate_lr)
        check_positive_float("train.lagrangian_lr", self.lagrangian_lr)
        _check_number("train.init_log_alpha", self.init_log_alpha, -math.inf)
        _check_number("train.label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        check_choice("train.precision", self.precision, PRECISIONS)


@dataclass
class SweepConfig:
    encoder_lambdas: list[float] = field(default_factory=lambda: [0.0, 0.003, 0.01, 0.03, 0.1])
    all_lambdas: list[float] = field(default_factory=lambda: [0.003, 0.01, 0.03])  # gates on every kind
    budgets: list[float] = field(default_factory=lambda: [0.25])  # Lagrangian head budgets (share of all heads)
    importance_baseline: bool = True  # encoder heads pruned by Michel importance at the same counts (no training)
    scratch: bool = True  # train the pruned head configuration from scratch (Voita Table 2)
    scratch_run: str = "budget"  # which configuration: "budget" (first budget run) or "lambda:<value>"
    scratch_steps: int = 0  # 0: as many steps as the source model was trained for
    scratch_minutes: float = 0.0  # stop the from-scratch training after this long (0: no limit)

    def __post_init__(self):
        for key in ("encoder_lambdas", "all_lambdas"):
            for value in getattr(self, key):
                _check_number(f"sweep.{key}", value, 0.0)
        for value in self.budgets:
            _check_number("sweep.budgets", value, 0.0, 1.0, low_open=True)
        check_int("sweep.scratch_steps", self.scratch_steps, 0)
        _check_number("sweep.scratch_minutes", self.scratch_minutes, 0.0)
        if not self.scratch:
            return
        if self.scratch_run == "budget":
            if not self.budgets:
                raise ValueError("sweep.scratch_run: 'budget' needs at least one entry in sweep.budgets.")
            return
        if not self.scratch_run.startswith("lambda:"):
            raise ValueError(f"sweep.scratch_run: {self.scratch_run!r} is not 'budget' or 'lambda:<value>'.")
        try:
            wanted = float(self.scratch_run.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"sweep.scratch_run: {self.scratch_run!r} does not name a number after 'lambda:'.") \
                from None
        if wanted not in self.all_lambdas:
            raise ValueError(f"sweep.scratch_run: λ {wanted} is not in sweep.all_lambdas {self.all_lambdas}.")


@dataclass
class GateEvalConfig:
    sentences: int = 500  # validation sentences scored after every run
    batch_size: int = 100
    num_beams: int = 1

    def __post_init__(self):
        for key in ("sentences", "batch_size", "num_beams"):
            check_int(f"eval.{key}", getattr(self, key), 1)


@dataclass
class GateSweepRecipe:
    """Hard-Concrete gate sweeps (kind "l0-sweep") on a converged translation model (Voita et al. 2019 §6)."""

    kind: str = "l0-sweep"
    name: str = "custom-l0"
    description: str = ""
    source: str = "checkpoints/wmt-small-deen-full"  # a finished translation run with pruning off (full/, recipe.yaml)
    data: DataConfig = field(default_factory=DataConfig)
    train: GateTrainConfig = field(default_factory=GateTrainConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    eval: GateEvalConfig = field(default_factory=GateEvalConfig)

    def __post_init__(self):
        _check_header(self, "l0-sweep")
        if not self.source.strip():
            raise ValueError("source: an empty string; give a finished translation run directory "
                             "(e.g. source=checkpoints/wmt-small-deen-full).")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


__all__ = ["GateEvalConfig", "GateSweepRecipe", "GateTrainConfig", "SweepConfig"]
