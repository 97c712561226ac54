"""`TrainingFlopMeter`: the matmul FLOPs a training run spends, step by step, from the real shape of every batch.

Compute that does not drift: two runs on different machines, or one machine on a busy and a quiet day, spend the
same FLOPs on the same steps. The meter watches the model's training forwards inside a window the Trainer callback
opens at `on_step_begin` and closes at `on_step_end` (so evaluations, importance passes and probes outside it are
not training compute), records each forward's batch shape (all micro-batches of a gradient-accumulation step), and
prices them with the exact per-size polynomial of `prunetrain.bench.step_flops` (forward + backward). When the
model's size changes — a mid-training shrink — the polynomial is fitted again before the next step is priced, so
every step counts the model as it was at that step.

Under DDP (or FSDP) every rank prices its own batches and the step's counts are summed over the ranks (one
all-reduce of a scalar per step), so `total` is the whole job's training compute and is the same number on every
rank — a FLOP budget stops all ranks at the same step.
"""

from __future__ import annotations

import inspect
import logging

import torch
import torch.distributed as dist
from torch import nn

from prunetrain.bench.step_flops import StepFlopModel, batch_shape

logger = logging.getLogger("prunetrain")

__all__ = ["TrainingFlopMeter"]


def _sum_over_ranks(flops: int, model: nn.Module) -> int:
    """The step's FLOPs summed over the ranks of a distributed run (this rank's count in a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flops
    device = next(model.parameters()).device if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor([flops], dtype=torch.int64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return int(total.item())


def _parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class TrainingFlopMeter:
    """Cumulative training FLOPs of one model (see the module docstring).

    Use: `attach(model)` once, then `open()` before and `close(model)` after each optimizer step; `close` returns
    that step's FLOPs (None when the model's FLOPs cannot be counted from shapes, reported once) and adds them to
    `total`.
    """

    def __init__(self):
        self.total = 0
        self.counted = True  # False once a model's FLOPs turned out not countable from shapes
        self.failure = ""  # why not
        self.fits: list[dict] = []  # every fitted size: {"parameters", "coefficients", "from_step"}
        self._fit: StepFlopModel | None = None
        self._handle = None
        self._open = False
        self._shapes: list = []
        self._example: dict | None = None
        self._signature = None

    def attach(self, model: nn.Module) -> None:
        """Watch `model`'s forwards (the unwrapped model: its hooks fire under DDP/FSDP wrappers too)."""
        self.detach()
        self._signature = inspect.signature(model.forward)
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _record(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not (self._open and module.training and torch.is_grad_enabled()):
            return
        inputs = dict(kwargs)
        if args:  # positional inputs, named as the forward names them
            inputs = dict(self._signature.bind_partial(*args, **kwargs).arguments)
        self._shapes.append(batch_shape(module, inputs))
        self._example = inputs

    def open(self) -> None:
        self._open, self._shapes = True, []

    def close(self, model: nn.Module, step: int) -> int | None:
        """End the step's window; its FLOPs at the model's current size (None if not countable)."""
        self._open = False
        shapes, self._shapes = self._shapes, []
        if not self.counted or not shapes:
            return None if not self.counted else 0
        fit = self._model_fit(model, step)
        if fit is None:
            return None
        flops = _sum_over_ranks(sum(fit(shape) for shape in shapes), model)
        self.total += flops
        return flops

    def _model_fit(self, model: nn.Module, step: int) -> StepFlopModel | None:
        if self._fit is None or self._fit.parameters != _parameter_count(model):
            was_training = model.training
            try:
                self._fit = StepFlopModel.fit(model, self._example)
            except ValueError as err:
                self.counted, self.failure = False, str(err)
                logger.warning("prunetrain: training FLOPs are not counted: %s", err)
                return None
            finally:
                model.train(was_training)
            self.fits.append({"from_step": step, **self._fit.to_dict()})
        return self._fit

    def state_dict(self) -> dict:
        return {"total": self.total, "counted": self.counted, "failure": self.failure, "fits": self.fits}

    def load_state_dict(self, state: dict) -> None:
        self.total = int(state.get("total", 0))
        self.counted = bool(state.get("counted", True))
        self.failure = str(state.get("failure", ""))  # a resumed run refuses a FLOP budget with the same reason
        self.fits = list(state.get("fits", []))
