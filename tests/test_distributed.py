"""Pruning under the distributed engines, with real torchrun processes (2 ranks, gloo, CPU).

- DDP through the HF Trainer: a mid-training shrink (`HeadPruningCallback(mode="shrink")`) gives every rank the same
  smaller model, DDP's buckets are rebuilt and the optimizer state sliced, and the final weights equal a single process
  trained on the same global batches; a run killed with SIGKILL after a distributed shrink resumes to the same end;
  `HardConcreteCallback(finalize="shrink")` under DDP; `TrainingArguments(fsdp=...)` on CPU, which the Trainer turns
  into the same DDP run.
- FSDP2 (`fully_shard`) in a plain loop (on CPU the Trainer ignores `fsdp` and trains with DDP): masks, importance,
  pruning curves and Hard-Concrete gates equal to one process, a final shrink + save_pruned from the gathered state;
  the shrinking callbacks accept FSDP2 (the mid-training shrink itself: tests/test_fsdp_shrink.py).
The workers are `tests/dist/ddp_shrink.py` and `tests/dist/fsdp_heads.py`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DIST = Path(__file__).parent / "dist"
ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a rank that crashes in native code prints its Python stack
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(_free_port()), str(script), *args]


# what a rank prints when it dies: Python's faulthandler, a C++ abort, an exception
CRASH_MARKERS = ("Fatal Python error", "terminate called", "what():", "Traceback (most recent call last)")


def _failure_report(stderr: str, cwd: Path) -> str:
    """The first crash a rank printed (with what follows it) and the end of the output; the whole output is kept in
    CWD/torchrun_failure.log, since torchrun's own error summary and the ranks' warnings can push a rank's abort
    message out of any fixed-size tail."""
    log = cwd / "torchrun_failure.log"
    log.write_text(stderr)
    starts = [i for i in (stderr.find(marker) for marker in CRASH_MARKERS) if i >= 0]
    first = stderr[min(starts):min(starts) + 6000] if starts else "(no rank printed a crash)"
    return f"whole output in {log}\n--- first crash ---\n{first}\n--- end ---\n{stderr[-4000:]}"


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, _failure_report(done.stderr, Path(cwd))
    return done


def _result(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"rank{rank}_result.json").read_text())


def _weights(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"rank{rank}_weights.safetensors"))


def _assert_weights_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape, key
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), (key, float((a[key] - b[key]).abs().max()))


@pytest.fixture(scope="module")
def shrink_runs(tmp_path_factory, multi30k_dir):
    """The same 3-epoch run (shrink to 75 % of the heads after epoch 1, to 50 % after epoch 2) on one process and
    under DDP with two ranks."""
    base = tmp_path_factory.mktemp("ddp_shrink")
    single, ddp = base / "single", base / "ddp"
    script = DIST / "ddp_shrink.py"
    _run([sys.executable, str(script), "--out", str(single), "--data", str(multi30k_dir)], base)
    _run(_torchrun(script, "--out", str(ddp), "--data", str(multi30k_dir)), base)
    return base, single, ddp


def test_ddp_mid_training_shrink_equals_one_process(shrink_runs):
    _, single, ddp = shrink_runs
    one, r0, r1 = _result(single), _result(ddp, 0), _result(ddp, 1)
    assert r0["steps"] == r1["steps"] == one["steps"] == 24
    assert r0["mask"] == r1["mask"] == one["mask"]  # every rank shrank the same heads, the ones one process chose
    assert r0["layout"] == r1["layout"] == one["layout"]
    assert sum(len(site["heads"]) for site in r0["layout"]["sites"]) == 12  # 24 heads → 12, physically
    _assert_weights_close(_weights(ddp, 0), _weights(ddp, 1), atol=0)  # the ranks hold the same model
    _assert_weights_close(_weights(ddp, 0), _weights(single), atol=1e-5)  # and it is the single-process model


def test_ddp_run_killed_after_a_shrink_resumes_to_the_same_end(shrink_runs, multi30k_dir):
    base, _, ddp = shrink_runs
    killed = base / "killed"
    # rank 0 sends itself SIGKILL at step 20 (epoch 3, after both shrinks and the epoch-2 checkpoint); torchrun then
    # stops the other rank
    crashed = subprocess.run(_torchrun(DIST / "ddp_shrink.py", "--out", str(killed), "--data", str(multi30k_dir),
                                       "--kill-at-step", "20"), cwd=base, env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert crashed.returncode != 0 and "Signal 9 (SIGKILL)" in crashed.stderr, crashed.stderr[-3000:]
    assert not (killed / "rank0_result.json").exists() and not (killed / "checkpoint-24").exists()
    _run(_torchrun(DIST / "ddp_shrink.py", "--out", str(killed), "--data", str(multi30k_dir), "--resume"), base)
    resumed, full = _result(killed), _result(ddp)
    assert resumed["resumed_from"] is not None and resumed["resumed_from"].endswith("checkpoint-16")
    assert resumed["mask"] == full["mask"] and resumed["layout"] == full["layout"]
    _assert_weights_close(_weights(killed, 0), _weights(killed, 1), atol=0)
    _assert_weights_close(_weights(killed), _weights(ddp), atol=1e-5)


def test_trainer_fsdp_on_cpu_trains_with_ddp_and_shrinks_mid_training(shrink_runs, multi30k_dir):
    """On CPU the Trainer ignores `fsdp=` and wraps the model in DDP; prunetrain sees DDP and shrinks as under it."""
    base, _, ddp = shrink_runs
    out = base / "fsdp-arg"
    _run(_torchrun(DIST / "ddp_shrink.py", "--out", str(out), "--data", str(multi30k_dir), "--fsdp"), base)
    r0, plain = _result(out), _result(ddp)
    assert r0["wrapper"] == plain["wrapper"] == "DistributedDataParallel"
    assert r0["mask"] == plain["mask"] and r0["layout"] == plain["layout"]
    _assert_weights_close(_weights(out, 0), _weights(ddp, 0), atol=0)  # the very same training as without fsdp=


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_mid_training_shrink_of_heads_and_ffn_neurons_equals_one_process(tmp_path, multi30k_dir):
    """FLOP targets met by heads and FFN neurons, shrunk after epochs 1 and 2: under DDP every rank removes the same
    units, the ones one process chose, and ends with the single process's weights."""
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    script = DIST / "ddp_shrink.py"
    _run([sys.executable, str(script), "--out", str(single), "--data", str(multi30k_dir), "--callback",
          "prune-ffn-shrink"], tmp_path)
    _run(_torchrun(script, "--out", str(ddp), "--data", str(multi30k_dir), "--callback", "prune-ffn-shrink"), tmp_path)
    one, r0, r1 = _result(single), _result(ddp, 0), _result(ddp, 1)
    assert r0["mask"] == r1["mask"] == one["mask"] and r0["layout"] == r1["layout"] == one["layout"]
    assert r0["layout"]["units"] == ["heads", "neurons"]
    neurons = sum(len(site["heads"]) for site in r0["layout"]["sites"] if site["kind"].endswith("ffn"))
    assert 0 < neurons < 4 * 64  # the FFNs shrank (2 + 2 layers of 64 neurons)
    _assert_weights_close(_weights(ddp, 0), _weights(ddp, 1), atol=0)
    _assert_weights_close(_weights(ddp, 0), _weights(single), atol=1e-5)


@pytest.mark.parametrize("callback", ["gates-shrink", "gates-ffn-shrink"])
def test_ddp_hard_concrete_finalize_shrink(tmp_path, multi30k_dir, callback):
    """Gates on heads (a budget of 12 heads) or on heads and FFN neurons (30 % of the multiply-adds): every rank
    holds the same gates, removes the same units and ends with the same weights."""
    out = tmp_path / "gates"
    _run(_torchrun(DIST / "ddp_shrink.py", "--out", str(out), "--data", str(multi30k_dir), "--callback",
                   callback), tmp_path)
    r0, r1 = _result(out, 0), _result(out, 1)
    assert r0["log_alpha"] == r1["log_alpha"]  # gate gradients are averaged over ranks before every gate step
    assert r0["mask"] == r1["mask"] and r0["layout"] == r1["layout"]
    kept = {unit: sum(sum(1 for v in keep if v) for name, keep in r0["mask"]["sites"].items()
                      if name.endswith("fc2") == (unit == "neurons")) for unit in ("heads", "neurons")}
    in_layout = {unit: sum(len(site["heads"]) for site in r0["layout"]["sites"]
                           if site["kind"].endswith("ffn") == (unit == "neurons")) for unit in ("heads", "neurons")}
    if callback == "gates-shrink":
        assert kept["heads"] == 12 and in_layout["heads"] == 12  # the budget, shrunk
    else:
        assert r0["layout"]["units"] == ["heads", "neurons"] and kept == in_layout  # the final mask, shrunk
        assert 0 < in_layout["neurons"] < 4 * 64  # the FFNs shrank (2 + 2 layers of 64 neurons)
    _assert_weights_close(_weights(out, 0), _weights(out, 1), atol=0)


def test_fsdp2_masks_importance_gates_curves_and_final_shrink(tmp_path):
    _run(_torchrun(DIST / "fsdp_heads.py", str(tmp_path)), tmp_path)
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["engine"] == "fsdp2" and r0["world"] == 2
    assert r0["mask_effect"] > 1e-3 and r0["mask_max_diff"] < 1e-5  # masks: sharded == one process
    assert r0["importance_batches"] == 4 and r0["importance_max_diff"] < 1e-9  # all-reduced == one process
    assert r1["importance_max_diff"] < 1e-9
    assert r0["curve"] == pytest.approx(r0["curve_single"], abs=1e-5)
    assert r0["log_alpha_moved"] > 1e-3 and r0["log_alpha_max_diff_between_ranks"] == 0.0
    assert 0 < r0["shrunk_heads"] < 16 and r0["shrink_max_diff"] < 1e-5  # saved, loaded, equal to the masked model
    assert r0["accepted"] == {"prune-shrink": "fsdp2", "gates-shrink": "fsdp2"}
