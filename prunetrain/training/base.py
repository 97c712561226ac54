"""What every prunetrain callback shares: output directory, rank-0 files and logs, TensorBoard, checkpoint state, and
the small helpers that turn the Trainer's state into epochs and batches.

Epochs are counted from 1: "epoch 3" is the end of the third training epoch; when a callback acts is decided by
`prunetrain.training.scheduled` (points in fractional epochs or global steps, labelled exactly).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from transformers import TrainerCallback

from prunetrain.engine.heads import KINDS, NEURON_KINDS, HeadLayout, unwrap_model
from prunetrain.engine.mask import HeadMask, attached_masks
from prunetrain.training.distributed import require, training_engine
from prunetrain.training.state import load_callback_state, save_callback_state, save_peft_record
from prunetrain.utils.plots import TensorBoardLog, heatmap_figure
from prunetrain.utils.validate import ALL_BATCHES, check_kinds

logger = logging.getLogger("prunetrain")



# ---------------------------------------------------------------------------------------------------------------------
# configuration checks shared by the callbacks
# ---------------------------------------------------------------------------------------------------------------------
def check_callback_kinds(kinds) -> list[str] | None:
    return check_kinds("kinds", kinds, KINDS)


def training_epochs(args) -> int | None:
    return None if getattr(args, "max_steps", -1) and args.max_steps > 0 else math.ceil(args.num_train_epochs)


def check_epochs_fit(args, last_epoch: int | None, argument: str) -> None:
    """Epochs named in the configuration must lie within training (known once the Trainer is built)."""
    total = training_epochs(args)
    if total is not None and last_epoch is not None and last_epoch > total:
        raise ValueError(f"{argument}: epoch {last_epoch} is beyond training, which runs {total} epochs "
                         f"(num_train_epochs={args.num_train_epochs}).")


def check_model_kinds(kinds, layout: HeadLayout) -> None:
    for kind in kinds or []:
        if kind not in layout.kinds:
            what = "FFN" if kind in NEURON_KINDS else "attention"
            raise ValueError(f"kinds: this model has no {kind!r} {what}; its kinds are {', '.join(layout.kinds)}.")


# ---------------------------------------------------------------------------------------------------------------------
# the base class
# ---------------------------------------------------------------------------------------------------------------------
class PrunetrainCallback(TrainerCallback):
    """Base of the prunetrain callbacks: output directory, TensorBoard, rank-0 logging and checkpoint state.

    Subclasses set `name` and implement `state_dict()` / `load_state_dict()` (JSON-able) and optionally
    `tensor_state()` / `load_tensor_state()`; `on_save` writes them into every Trainer checkpoint and `_restore`
    reads them back when training resumes.

    Args:
        output_dir: where JSON files and TensorBoard logs go (default `<Trainer output_dir>/prunetrain`).
        tensorboard: write TensorBoard scalars and figures (rank 0 only).
    """

    name = "callback"

    def __init__(self, output_dir: str | None = None, tensorboard: bool = True):
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self._out: Path | None = None
        self._tb: TensorBoardLog | None = None
        self._is_main = True

    # files and logs -------------------------------------------------------------------------------------------------
    def _setup(self, args, state, model=None) -> None:
        if model is not None:
            self.check_engine(model)
        self._out = Path(self.output_dir) if self.output_dir else Path(args.output_dir) / "prunetrain"
        self._is_main = state.is_world_process_zero
        if self._is_main:
            self._out.mkdir(parents=True, exist_ok=True)
            if self.tensorboard and self._tb is None:
                self._tb = TensorBoardLog(self._out / "tensorboard")

    @property
    def out_dir(self) -> Path:
        if self._out is None:
            raise RuntimeError(f"{type(self).__name__}: not set up yet (no training has started).")
        return self._out

    def _write_json(self, name: str, data) -> None:
        if self._is_main:
            path = self.out_dir / name
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)

    def _log(self, message: str) -> None:
        if self._is_main:
            logger.warning("prunetrain: %s", message)  # warning level: visible under the Trainer's default logging

    def _tb_scalar(self, tag: str, value: float, step: int) -> None:
        if self._is_main and self._tb is not None:
            self._tb.scalar(tag, value, step)

    def _tb_figure(self, tag: str, fig, step: int) -> None:
        if self._is_main and self._tb is not None:
            self._tb.figure(tag, fig, step)
        else:
            import matplotlib.pyplot as plt

            plt.close(fig)

    def _flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    # distributed engines ----------------------------------------------------------------------------------------
    def engine_requirements(self) -> list[tuple[str, tuple[str, ...]]]:
        """(feature, engines that support it) pairs this callback needs; see `prunetrain.training.distributed`."""
        return [(type(self).__name__, ("single", "ddp", "fsdp2", "deepspeed"))]

    def check_engine(self, model, args=None) -> str:
        """Refuse, with one line, an engine this callback cannot serve. Called when the Trainer is built (from its
        arguments) and again when training starts (from the model the Trainer actually prepared)."""
        engine = training_engine(model, args)
        for feature, allowed in self.engine_requirements():
            require(engine, feature, allowed)
        return engine

    # checkpoint state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def tensor_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            save_peft_record(Path(args.output_dir) / f"checkpoint-{state.global_step}", kwargs.get("model"))
            save_callback_state(Path(args.output_dir) / f"checkpoint-{state.global_step}", self.name,
                                self.state_dict(), self.tensor_state())

    def _restore(self, args, state) -> bool:
        """On resume (global_step > 0), load this callback's state from `checkpoint-<global_step>`."""
        if state.global_step <= 0:
            return False
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        data, tensors = load_callback_state(checkpoint, self.name, type(self).__name__)
        self.load_state_dict(data)
        if tensors is not None:
            self.load_tensor_state(tensors)
        self._log(f"{self.name}: restored pruning state from {checkpoint}")
        return True

    def on_train_end(self, args, state, control, **kwargs):
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ---------------------------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------------------------
def when(state) -> str:
    """"epoch 3", or "step 120 (epoch 0.26)" when training ended part-way through an epoch (max_steps)."""
    epoch = float(state.epoch or 0)
    if abs(epoch - round(epoch)) < 1e-6 and round(epoch) > 0:
        return f"epoch {round(epoch)}"
    return f"step {state.global_step} (epoch {epoch:.2f})"


def first_batches(source: Iterable, count: int | None = ALL_BATCHES) -> list[dict]:
    """The first `count` batches of `source` (every batch for `ALL_BATCHES`), as plain dicts."""
    out = []
    for batch in source:
        out.append({k: v for k, v in batch.items()})
        if count is not None and len(out) >= count:
            break
    return out


def local_share(batches: list, model: nn.Module | None = None) -> list:
    """Under torch.distributed, each rank scores its share of an explicitly given list of batches (the scorers
    all-reduce, so the union is scored exactly once). Under FSDP every rank must run the same number of forward
    passes (each one gathers parameters from all ranks), so the batches must split evenly."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        world = dist.get_world_size()
        if model is not None and len(batches) % world and training_engine(model) == "fsdp2":
            raise ValueError(f"batches: {len(batches)} batches do not split evenly over {world} ranks; under FSDP "
                             f"every rank must run the same number of forward passes, so give a multiple of {world}.")
        return batches[dist.get_rank():: world]
    return batches


def combined_attached(model: nn.Module) -> HeadMask | None:
    """The product of every HeadMask attached to `model` (None if none)."""
    masks = attached_masks(unwrap_model(model))
    if not masks:
        return None
    combined = masks[0].copy()
    for other in masks[1:]:
        for name, values in other.items():
            combined[name] = combined[name] * values.detach()
    return combined


def kept_summary(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {before[k]}→{after.get(k, 0)}" for k in before)


def importance_heatmap(scores, title: str):
    return heatmap_figure(scores.as_matrix(), [f"{s.kind}:{s.layer}" for s in scores.layout], title,
                          colorbar_label="importance")


__all__ = ["PrunetrainCallback"]
