"""The default importance sample of a Trainer run, defined by global examples.

Without `Importance(batches=...)` the callbacks score heads on `num_batches` batches drawn from the training set. The
sample must not depend on how a global batch is split: over ranks (torchrun, accelerate) or over micro-batches
(gradient accumulation). So each batch holds the examples of one optimizer step (the global batch: the per-process
batch × ranks × accumulation steps, as the Trainer's dataloader reports it), the examples are drawn from the whole,
unsharded dataset by a generator seeded with the run's seed, and collated by the Trainer's own collator (its random
choices, e.g. MLM masking, under the same seed, outside the training RNG). Rank r scores batches r, r + W, ... and
the scorers all-reduce their sums, so 1 or W ranks and any accumulation score the same batches and rank the heads
the same — equal up to the order of floating-point summation (so up to ties between heads whose scores agree to
rounding). The same sample serves every point of the run, so scores at different points differ by the model only.

A training set that cannot be indexed (an `IterableDataset`) has no such sample: each rank then scores the first
`num_batches` batches of its own dataloader, and a one-line notice says that the heads chosen depend on the world
size and the accumulation.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import IterableDataset

from prunetrain.training.distributed import training_engine, world_size

logger = logging.getLogger("prunetrain")


def global_batch_size(args, train_dataloader) -> int:
    """Examples per optimizer step: the dataloader's batch over every process, times the accumulation steps."""
    total = getattr(train_dataloader, "total_batch_size", None)  # accelerate's prepared dataloaders
    if not isinstance(total, int) or total <= 0:
        total = int(getattr(train_dataloader, "batch_size", None) or args.train_batch_size) * world_size()
    return total * max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))


class ImportanceSample:
    """`num_batches` global batches of the training set, the same whatever the world size and accumulation.

    Args:
        args: the Trainer's `TrainingArguments` (its `seed` and `gradient_accumulation_steps`).
        train_dataloader: the Trainer's training dataloader (its dataset, collator and batch size are used).
        num_batches: how many global batches (`Importance.num_batches`).
        owner: the callback's name, for the notice.
    """

    def __init__(self, args, train_dataloader, num_batches: int, owner: str):
        self.dataloader, self.num_batches, self.owner = train_dataloader, num_batches, owner
        self.seed = int(getattr(args, "seed", 0))
        dataset = getattr(train_dataloader, "dataset", None)
        self.indexable = dataset is not None and not isinstance(dataset, IterableDataset) and hasattr(
            dataset, "__len__") and hasattr(dataset, "__getitem__")
        self.batch_size = global_batch_size(args, train_dataloader) if self.indexable else None
        self._local: list | None = None
        self._even = False  # FSDP: every rank must run the same number of forward passes
        self._noticed = False

    def check_engine(self, model) -> None:
        """Under FSDP every rank runs the same number of forward passes: `num_batches` must split over the ranks.
        Called when training starts, so a run is refused before its first step, not at its first importance point."""
        world = world_size()
        self._even = world > 1 and training_engine(model) == "fsdp2"
        if self.indexable and self._even and self.num_batches % world:
            raise ValueError(f"num_batches: {self.num_batches} importance batches do not split evenly over {world} "
                             f"ranks; under FSDP every rank must run the same number of forward passes, so give a "
                             f"multiple of {world} (Importance(num_batches=...)).")

    def batches(self) -> list:
        """This rank's share of the sample (collated once, on first use)."""
        if self._local is None:
            self._local = self._draw() if self.indexable else None
        if self._local is None:
            return self._fallback()
        return self._local

    def _draw(self) -> list:
        dataset, collate = self.dataloader.dataset, self.dataloader.collate_fn
        generator = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(dataset), generator=generator)[: self.num_batches * self.batch_size].tolist()
        chunks = [order[i: i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        world = world_size()
        if self._even and len(chunks) % world:  # a training set smaller than the sample: whole rounds only
            chunks = chunks[: len(chunks) - len(chunks) % world] or chunks
        rank = torch.distributed.get_rank() if world > 1 else 0
        out = []
        with torch.random.fork_rng(devices=[]):  # a collator's own random choices: seeded, training RNG untouched
            for number, chunk in enumerate(chunks):
                torch.manual_seed(self.seed + number)
                batch = collate([dataset[i] for i in chunk])
                if number % world == rank:
                    out.append({k: v for k, v in batch.items()})
        return out

    def _fallback(self) -> list:
        if not self._noticed and (world_size() == 1 or torch.distributed.get_rank() == 0):
            logger.warning("prunetrain: %s: the training set cannot be indexed, so importance is computed on the "
                           "first %d batches of each rank's dataloader; the heads chosen depend on the world size and "
                           "gradient accumulation (pass Importance(batches=...) for a fixed sample)", self.owner,
                           self.num_batches)
            self._noticed = True
        out = []
        for batch in self.dataloader:
            out.append({k: v for k, v in batch.items()})
            if len(out) >= self.num_batches:
                break
        return out


__all__ = ["ImportanceSample", "global_batch_size"]
