"""Distributed head scoring: under `torchrun --nproc_per_node 2` (gloo on CPU) every rank gets identical scores,
equal to a single process scoring the union of both ranks' batches."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prunetrain.importance import HeadScores
from prunetrain.zoo import tiny_model

WORKER = Path(__file__).parent / "dist" / "importance_worker.py"


def _load_worker():
    spec = importlib.util.spec_from_file_location("importance_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_two_ranks_get_identical_scores_equal_to_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(WORKER), str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"torchrun failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"

    worker = _load_worker()
    batches = worker.make_batches()
    model = tiny_model(worker.FAMILY)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, score in worker.scorers().items():
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
