"""Diverged is not done: `FiniteGuard` stops a Trainer run at the first step whose gradients are not finite.

A NaN or infinite loss makes NaN gradients, and one optimizer step with them makes every weight NaN; the Trainer goes
on regardless (its logged loss even hides NaN: `logging_nan_inf_filter`), saves the NaN model and ends as if all were
well. The guard looks at the gradients after they are complete — accumulated, all-reduced under DDP, clipped — and
before the optimizer uses them (`on_pre_optimizer_step`): if any is NaN or infinite it raises `TrainingDiverged`,
naming the step and the settings likely at fault, so the weights stay those of the last good step, the run is not
marked complete and nothing after it is saved. Under fp16 loss scaling, where infinite gradients are normal (the
scaler skips those steps), it checks the weights after each step instead.

The check is one fused pass over the gradients (`torch._foreach_norm` with ord ∞: a max-abs per tensor, which a NaN
propagates through and no finite value overflows), then one host read of the verdict per step (on a GPU, one
synchronisation per step); under DDP and FSDP the verdict is all-reduced, so every rank stops at the same step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from prunetrain.training.distributed import world_size
from prunetrain.utils.door import checked


class TrainingDiverged(RuntimeError):
    """Training produced a non-finite gradient or weight; the run stopped before using it (see `FiniteGuard`)."""


def all_finite(tensors) -> bool:
    """Whether every element of `tensors` is finite (DTensors: this rank's shard), in one fused pass."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    local = [t.detach() for t in local if t is not None and t.numel()]
    if not local:
        return True
    peaks = torch._foreach_norm(local, float("inf"))
    return bool(torch.isfinite(torch.stack([p.float().cpu() for p in peaks])).all())


@checked(own=("hint",))
class FiniteGuard(TrainerCallback):
    """Stop training with `TrainingDiverged` at the first non-finite gradient (module docstring).

    Args:
        hint: the settings likely at fault, for the message (e.g. "train.lr=5e-4, distill.temperature=1e-300");
            default: the learning rate and the loss scale of the Trainer's arguments.
    """

    def __init__(self, hint: str | None = None):
        if hint is not None and not isinstance(hint, str):
            raise ValueError(f"hint: {hint!r} is not a string.")
        self.hint = hint

    def _stop(self, args, state, what: str) -> None:
        losses = [log["loss"] for log in state.log_history if "loss" in log]
        last = f"; the last logged loss was {losses[-1]:.4g} (NaN and inf are left out of it)" if losses else ""
        hint = self.hint or f"learning_rate={args.learning_rate:g}"
        raise TrainingDiverged(f"training diverged at step {what}{last}. The run is not complete and nothing more was "
                               f"saved; check the settings likely at fault ({hint}).")

    @staticmethod
    def _agreed(good: bool) -> bool:
        """`good` on every rank (one all-reduce when distributed)."""
        if world_size() <= 1:
            return good
        flag = torch.tensor([0.0 if good else 1.0])
        if dist.get_backend() == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag)
        return float(flag) == 0.0

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if args.fp16 or model is None:  # fp16 loss scaling: infinite gradients are skipped steps (on_step_end)
            return
        if not self._agreed(all_finite([p.grad for p in model.parameters() if p.grad is not None])):
            self._stop(args, state, f"{state.global_step + 1}: its gradients hold NaN or inf (the weights are kept "
                                    f"as they were after step {state.global_step})")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if args.fp16 and model is not None and not self._agreed(all_finite(list(model.parameters()))):
            self._stop(args, state, f"{state.global_step}: the weights hold NaN or inf after it")


__all__ = ["FiniteGuard", "TrainingDiverged", "all_finite"]
