"""The recipes under `torchrun`: one run directory, written by rank 0 alone; one JSON summary.

`torchrun --nproc_per_node N -m prunetrain recipe NAME ...` starts N copies of the command. They share the run:

- the process group is started first (`start`: accelerate's `PartialState`, the group the Trainer then uses), so
  the ranks can wait for each other before anything is written;
- rank 0 checks and prepares the output directory and trains the tokenizer (saved under `<output>/tokenizer`); the
  other ranks wait at a barrier, then load that tokenizer (`on_main`, `shared`). A refusal on rank 0 (e.g. an output
  directory holding another run) reaches every rank as the same one-line error, so none waits forever;
- training is the Trainer's data-parallel training (DDP; FSDP2 where accelerate shards, i.e. on GPUs) with the
  recipe's `train.batch_size` as the *global* batch: accelerate splits each batch over the ranks
  (`split_batches`), so every optimizer step sees the sentences one process sees at that step, and the loss is
  normalised by the label tokens of the whole step on all ranks (`trainer_settings`);
- after training every rank leaves the process group (`end_training`); rank 0 evaluates, saves, benchmarks and
  writes the report as one process would, the others return None and print nothing.

Dropout draws its masks per rank, so with dropout a data-parallel run is a different random run of the same recipe;
with `model.dropout=0` it ends with the heads and the BLEU of the single-process run (tests/test_recipe_torchrun.py).
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def launched_world_size() -> int:
    """The number of processes torchrun (or accelerate launch) started for this command (1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def start() -> int:
    """Join the launcher's process group (once) when there is more than one process; returns the world size."""
    world = launched_world_size()
    if world > 1 and not dist.is_initialized():
        from accelerate import PartialState

        PartialState(cpu=not torch.cuda.is_available())  # gloo on CPUs, NCCL on GPUs: what the Trainer would use
    return world


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0, or the only process."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def on_main(action: Callable[[], T]) -> T | None:
    """Run `action` on rank 0 while the other ranks wait; returns its result on rank 0 and None elsewhere.

    An error raised on rank 0 is raised on every rank with the same message (ValueError, TypeError, KeyError and
    OSError keep their type, anything else is a RuntimeError naming it), so a refusal ends every process the same way
    instead of leaving the others at the barrier.
    """
    if world_size() == 1:
        return action()
    result, error = None, None
    if is_main():
        try:
            result = action()
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
    message = [None if error is None else (type(error).__name__, str(error))]
    dist.broadcast_object_list(message, src=0)
    if error is not None:
        raise error
    if message[0] is not None:
        kind, text = message[0]
        known = {"ValueError": ValueError, "TypeError": TypeError, "KeyError": KeyError, "OSError": OSError}
        raise known[kind](text) if kind in known else RuntimeError(f"rank 0 failed with {kind}: {text}")
    return result


def shared(make_on_main: Callable[[], T], load_elsewhere: Callable[[], T]) -> T:
    """`make_on_main()` on rank 0 (e.g. train and save the tokenizer); once it is done, `load_elsewhere()` on the
    other ranks (load what rank 0 saved). In one process: `make_on_main()`."""
    made = on_main(make_on_main)
    return made if is_main() else load_elsewhere()


def check_global_batch(batch_size: int, argument: str = "train.batch_size") -> None:
    """The global batch must split evenly over the ranks (each rank trains on `batch_size / world` sentences)."""
    world = launched_world_size()
    if batch_size % world:
        raise ValueError(f"{argument}: {batch_size} sentences per step do not split evenly over the {world} "
                         f"processes torchrun started; give a multiple of {world}.")


def trainer_settings(label_smoothing: float) -> tuple[dict, Callable | None]:
    """(extra TrainingArguments, compute_loss_func) for a data-parallel recipe run; ({}, None) in one process.

    - `accelerator_config={"split_batches": True}`: `per_device_train_batch_size` is the global batch and each of
      the W ranks gets 1/W of every batch, so the sampler (length-grouped or random) orders the data exactly as in
      one process and step s sees the same sentences;
    - the loss is `SmoothedCrossEntropy` (transformers' `LabelSmoother` in one kernel; ε = `label_smoothing`, 0
      gives the plain token cross-entropy)
      normalised by the label tokens of the whole step on all ranks (the Trainer's `num_items_in_batch`, gathered);
      the Trainer multiplies it by W and DDP averages over W, so the gradient is the one-process gradient. (Without
      it a model's own loss is a per-rank mean, and the mean of the ranks' means is not the mean over all tokens.)
    """
    if launched_world_size() == 1:
        return {}, None
    from prunetrain.training.loss import SmoothedCrossEntropy

    return {"accelerator_config": {"split_batches": True}}, SmoothedCrossEntropy(label_smoothing)


def end_training() -> bool:
    """After training: every rank leaves the process group; True on the rank that goes on (rank 0) to evaluate,
    save and report as one process (nothing after training is a collective)."""
    if world_size() == 1:
        return True
    main = is_main()
    dist.barrier()
    dist.destroy_process_group()
    return main


__all__ = ["barrier", "check_global_batch", "end_training", "is_main", "launched_world_size", "on_main", "shared",
           "start", "trainer_settings", "world_size"]
