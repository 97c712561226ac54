"""The end every torchrun worker of the tests shares: leave the process group before the interpreter exits.

The HF Trainer (through accelerate) starts the gloo process group and never destroys it. A group left to interpreter
teardown can kill a rank after its work is done: gloo's worker threads still hold objects whose destruction needs
the interpreter, and the rank aborts ("terminate called without an active exception", SIGABRT; seen in CI on a
rank that had written its result). PyTorch's documentation asks every process to call `destroy_process_group()`
near the end of its main; a training script of a user should do the same, and the recipe's ranks do
(`prunetrain.mt.run.ranks`)."""

import torch.distributed as dist


def end_process_group() -> None:
    """Wait for every rank, then destroy the process group; nothing when none was started (one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
