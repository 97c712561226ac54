"""Distributed head scoring: under `torchrun --nproc_per_node 2` (gloo on CPU) every rank gets identical scores,
equal to a single process scoring the union of both ranks' batches.

This file is both the pytest test and the worker torchrun runs (`python -m torch.distributed.run ... this_file.py
OUT_DIR`): each rank scores its own shard of `make_batches()` (rank r takes batches r, r + world, ...) and writes
`<scorer>.rank<r>.json` (synchronised scores) and `local.rank<r>.json` (the same rank's scores without
synchronisation, to show that the all-reduce matters) to OUT_DIR.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from prunetrain.methods.importance import HeadScores, ablation_scores, confidence_scores, head_importance
from prunetrain.zoo import tiny_inputs, tiny_model

FAMILY = "marian"


def make_batches() -> list[dict]:
    """Five batches of different sizes (uneven shards: rank 0 gets 3, rank 1 gets 2), some labels ignored."""
    batches = []
    for i, (size, length) in enumerate([(2, 7), (3, 6), (1, 8), (4, 5), (2, 9)]):
        batch = tiny_inputs(FAMILY, batch=size, length=length, seed=i)
        batch["labels"][0, -1] = -100
        batches.append(batch)
    return batches


def scorers() -> dict:
    """name -> scorer(model, batches), shared by the ranks and the single-process reference."""
    return {
        "gradient": lambda m, b: head_importance(m, b),
        "gradient_example_raw": lambda m, b: head_importance(m, b, per="example", normalize=None),
        "ablation": lambda m, b: ablation_scores(m, b),
        "confidence": lambda m, b: confidence_scores(m, b),
    }


def _worker(out: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = tiny_model(FAMILY)
    ddp = DistributedDataParallel(model)  # a DDP-wrapped model is accepted (scored through .module)
    shard = make_batches()[rank::world]
    for name, score in scorers().items():
        score(ddp if name == "gradient" else model, shard).to_json(out / f"{name}.rank{rank}.json")
    head_importance(model, shard, sync=False).to_json(out / f"local.rank{rank}.json")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_get_identical_scores_equal_to_one_process(tmp_path):
    from test_distributed import _run, _torchrun  # the shared launcher: faulthandler in every rank, a free port

    _run(_torchrun(Path(__file__), str(tmp_path)), tmp_path)

    batches = make_batches()
    model = tiny_model(FAMILY)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, score in scorers().items():
            rank0 = HeadScores.from_json(tmp_path / f"{name}.rank0.json")
            rank1 = HeadScores.from_json(tmp_path / f"{name}.rank1.json")
            assert rank0 == rank1, name  # bit-identical on every rank
            single = score(model, batches)
            assert rank0.meta["world_size"] == 2 and single.meta["world_size"] == 1
            assert rank0.meta["batches"] == single.meta["batches"] == len(batches)
            assert rank0.allclose(single, rtol=1e-5, atol=1e-9), name
        local0 = HeadScores.from_json(tmp_path / "local.rank0.json")
        local1 = HeadScores.from_json(tmp_path / "local.rank1.json")
        synced = HeadScores.from_json(tmp_path / "gradient.rank0.json")
        assert local0.meta["batches"] == 3 and local1.meta["batches"] == 2
        assert not local0.allclose(synced, rtol=1e-3) and not local1.allclose(synced, rtol=1e-3)
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":  # the torchrun worker
    _worker(Path(sys.argv[1]))
